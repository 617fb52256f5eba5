"""Defragmentation on the real API server (docs/contract.md §3a, issue 21 item 2): two controller
replicas with `--defrag-interval=1`, VMIs through the webhook.

A 4-GPU VMI is refused for fragmentation (two 4-unit nodes, 2 free on each: one holds two
idle held devices, the other a running VM's two devices). The idle devices' class is first
`Stay`, so no round may move them (D1); once it is `Move`, one round moves both to the
running VM's node — without touching the running VM's devices — and the same VMI is then
admitted on the freed node. Each move is a `GPUDeviceMoved` Event on the device (D4) and is
counted in `gpu_binder_defrag_moves_total`: the counters are read before and after the
test's own steps (deltas over both replicas), never as totals since the replicas started.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas
from tests.e2e.helpers import counter_total, eventually, leader_index, make_pool, scrape
from tests.support.vmis import VMI_GROUP, VMI_VERSION, VMIS, annotated, create, devices, fixture

pytestmark = pytest.mark.anyio

GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two controller replicas with a defragmentation round every second."""
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   FAST_CONTROLLER_ARGS + ("--defrag-interval=1",
                                                           "--defrag-max-moves=4"))


def _nodes(ds: list[dict]) -> dict[str, str | None]:
    return {d["metadata"]["name"]: (d.get("status") or {}).get("nodeName") for d in ds}


async def test_D1_D2_D4_a_4_gpu_vmi_refused_for_fragmentation_is_admitted_after_a_round(
        system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 4, "b": 4}, seen_by=system)
    stay = f"{cls}-idle"
    await fleet.gpu_class(stay, res, on_cordon="Stay")  # same resource, not movable (yet)
    for name in ("idle-0", "idle-1"):
        await fleet.device(tenant, name, stay)
    # the running VM: two template devices on b
    run = annotated(fixture("vmi-fedora.yaml"), "running", templates=f"{cls}=2")
    run["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes["b"]}
    ok, msg = await create(fleet, tenant, run)
    assert ok, msg
    # the idle devices: placed on a by a VMI that is then deleted (H2 releases them)
    warm = annotated(fixture("vmi-fedora.yaml"), "warm", devices="idle-0,idle-1")
    warm["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes["a"]}
    ok, msg = await create(fleet, tenant, warm)
    assert ok, msg
    await fleet.custom.delete_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS,
                                                       "warm")

    async def released():
        ds = await devices(fleet, tenant)
        idle = [d for d in ds if d["metadata"]["name"].startswith("idle-")]
        return all(not (d.get("status") or {}).get("attachedTo") for d in idle) and ds
    ds = await eventually(released, what="H2 release of the warm-up VMI's devices")
    running = {n: node for n, node in _nodes(ds).items() if n.startswith("running-")}
    assert set(running.values()) == {nodes["b"]} and len(running) == 2
    assert {_nodes(ds)["idle-0"], _nodes(ds)["idle-1"]} == {nodes["a"]}

    big = annotated(fixture("vmi-fedora.yaml"), "big", templates=f"{cls}=4")
    ok, msg = await create(fleet, tenant, big)
    assert not ok and "cannot be placed" in msg, msg  # 2 free on each node: fragmented
    # rounds run every second, but a Stay class never moves (D1)
    moves0 = await counter_total(system, MOVES)
    rounds0 = await counter_total(system, ROUNDS)
    await eventually(lambda: _counted(system, ROUNDS, rounds0 + 2), what="two more rounds run")
    assert {_nodes(await devices(fleet, tenant))[n] for n in ("idle-0", "idle-1")} == {nodes["a"]}
    assert _moved_in(system, tenant) == []  # those rounds moved nothing of this tenant's

    await fleet.custom.patch_cluster_custom_object(
        GROUP, VERSION, "gpuclasses", stay, {"spec": {"onCordon": "Move"}},
        _content_type="application/merge-patch+json")

    async def moved():
        got = _nodes(await devices(fleet, tenant))
        return got if {got["idle-0"], got["idle-1"]} == {nodes["b"]} else None
    after = await eventually(moved, what="the idle devices moved to b by a round")
    assert {n: after[n] for n in running} == running  # no running VM's device moved
    ok, spec = await create(fleet, tenant, big)
    assert ok, spec
    assert json.loads(spec)["nodeSelector"]["kubernetes.io/hostname"] == nodes["a"]
    final = _nodes(await devices(fleet, tenant))
    assert {n: final[n] for n in running} == running
    assert sorted(n for n, node in final.items() if node == nodes["a"]) == [
        f"big-{cls}-{i}" for i in range(4)]

    moves = _moved_in(system, tenant)
    assert sorted(e["involvedObject"]["name"] for e in moves) == ["idle-0", "idle-1"]
    assert all(f"from {nodes['a']} to {nodes['b']}" in e["message"] for e in moves)
    # the counter is cluster-wide: the same rounds may also move idle devices earlier tests on
    # this session's cluster left behind, so it grows by this test's two moves at least (the
    # Events above say exactly which of this tenant's devices moved)
    await eventually(lambda: _counted(system, MOVES, moves0 + 2), what="the two moves counted")
    got = await scrape(system, await leader_index(system))
    assert ("gpu_binder_largest_placeable_set", (("class", cls),)) in got  # set by the rounds


MOVES, ROUNDS = "gpu_binder_defrag_moves_total", "gpu_binder_defrag_rounds_total"


def _moved_in(system, namespace: str) -> list[dict]:
    """The GPUDeviceMoved Events (D4) on devices of `namespace`."""
    events = json.loads(system.cp.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    return [e for e in events["items"] if e["reason"] == "GPUDeviceMoved"]


async def _counted(system, name: str, at_least: float) -> bool:
    return await counter_total(system, name) >= at_least
