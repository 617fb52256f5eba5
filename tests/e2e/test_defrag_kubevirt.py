"""Defragmentation with KubeVirt in the loop (docs/contract.md §3a; issue 21 item 2): virt-api,
virt-controller, kube-scheduler and KWOK beside two controller replicas running a round
every second.

Two 4-GPU KWOK nodes: b runs a VM whose launcher Pod kube-scheduler bound there with its two
GPUs; a holds two idle held devices (placed by an earlier request, then released). A 4-GPU
VMI is refused for fragmentation while the idle devices' class is `Stay` (D1: rounds never
move it); once it is `Move`, a round moves them to b, and the same VMI is admitted pinned to
a and its launcher Pod bound there with all four GPUs — the running VM's devices and its
launcher Pod stay on b throughout. `gpu_binder_defrag_moves_total` (summed over both
replicas) grows by at least those two moves, and the tenant's GPUDeviceMoved Events name
exactly them.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas
from tests.e2e.helpers import counter_total, eventually, request, results
from tests.support.kubevirt_vmis import bound_launcher, create, gpu_requests, pin, pool, vmi

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"
MOVES = "gpu_binder_defrag_moves_total"


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas with a defragmentation round every second; a bind timeout of 15 s as
    test_kubevirt's (virt-api's webhooks share two cores with everything else)."""
    args = tuple(a for a in FAST_CONTROLLER_ARGS
                 if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + ("--bind-timeout=15", "--attachment-grace=30",
                                           "--defrag-interval=1", "--defrag-max-moves=4"))


@pytest.fixture(scope="module")
def kubevirt(system, kubevirt_shared):
    """The session's KubeVirt, as in test_kubevirt."""
    return kubevirt_shared


async def _nodes(fleet, ns: str) -> dict[str, str | None]:
    got = await fleet.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpudevices")
    return {d["metadata"]["name"]: (d.get("status") or {}).get("nodeName") for d in got["items"]}


async def test_D1_D2_refused_4_gpu_vmi_admitted_after_a_round_launcher_pods_where_pinned(
        system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"a": {"units": 4}, "b": {"units": 4}})
    stay = f"{cls}-idle"
    await fleet.gpu_class(stay, res, on_cordon="Stay")
    running_vmi = vmi("running", cls, 2)
    running_vmi["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes["b"]}
    made, msg = await create(fleet, tenant, running_vmi)
    assert made is not None, msg
    running_pod = await bound_launcher(fleet, tenant, made)
    assert running_pod["spec"]["nodeName"] == nodes["b"] and gpu_requests(running_pod, res) == 2
    # two held devices placed on a by an earlier request, then released (idle)
    for name in ("idle-0", "idle-1"):
        await fleet.device(tenant, name, stay)
    await request(fleet, tenant, "earlier", "gone-vm", ["idle-0", "idle-1"],
                  node_selector={"kubernetes.io/hostname": nodes["a"]})
    got = await eventually(lambda: results(fleet, tenant, ["idle-0", "idle-1"]),
                           what="the earlier request answered")
    assert {(s["bindRequest"]["result"], s["nodeName"]) for s in got} == {("Succeeded", nodes["a"])}
    for name in ("idle-0", "idle-1"):  # as housekeeping clears a gone VMI's attachment (H2)
        await fleet.set_status(tenant, name, {"attachedTo": None, "bindRequest": None})
    before = await _nodes(fleet, tenant)
    running = {n: v for n, v in before.items() if n.startswith("running-")}
    assert set(running.values()) == {nodes["b"]} and len(running) == 2

    made, msg = await create(fleet, tenant, vmi("big", cls, 4))
    assert made is None and "cannot be placed" in msg, msg   # 2 free on each node
    moves0 = await counter_total(system, MOVES)
    await fleet.custom.patch_cluster_custom_object(
        GROUP, VERSION, "gpuclasses", stay, {"spec": {"onCordon": "Move"}},
        _content_type="application/merge-patch+json")

    async def moved():
        got = await _nodes(fleet, tenant)
        return got if {got["idle-0"], got["idle-1"]} == {nodes["b"]} else None
    after = await eventually(moved, timeout=30, what="a round moved the idle devices to b")
    assert {n: after[n] for n in running} == running

    async def counted() -> bool:
        return await counter_total(system, MOVES) >= moves0 + 2
    await eventually(counted, what="the two moves counted")

    made, msg = await create(fleet, tenant, vmi("big", cls, 4))
    assert made is not None, msg
    assert pin(made) == nodes["a"]
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == nodes["a"] and gpu_requests(pod, res) == 4
    final = await _nodes(fleet, tenant)
    assert {n: final[n] for n in running} == running  # no running VM's device moved
    # the moves counter is cluster-wide (earlier tests' idle devices may be moved by the same
    # rounds): this tenant's own moves are told exactly by their Events (D4)
    events = json.loads(system.cp.kubectl("get", "events", "-n", tenant, "-o", "json").stdout)
    moved = sorted(e["involvedObject"]["name"] for e in events["items"]
                   if e["reason"] == "GPUDeviceMoved")
    assert moved == ["idle-0", "idle-1"]
    again = await bound_launcher(fleet, tenant, {"metadata": {"uid": running_pod["metadata"]
                                                              ["labels"]["kubevirt.io/created-by"],
                                                              "name": "running"}})
    assert again["spec"]["nodeName"] == nodes["b"]
