"""The real consumers in the loop (issue 12): KubeVirt's virt-api and virt-controller turn an
admitted VMI into a virt-launcher Pod, kube-scheduler binds it, KWOK keeps the nodes Ready.
Each test checks that what gpu-binder admits actually gets its GPUs on the pinned node (B3,
capacity §2, W1 against KubeVirt's permittedHostDevices)."""

from __future__ import annotations

import anyio
import pytest
from kubernetes_asyncio.client import ApiException

from model.reasons import (ClassNotPermitted, GpuEntryNotPermitted, NodeProblems, NoRoom,
                           NotKubevirtSchedulable, NotReady, SelectorMismatch, TooManySelectorEntries)
from tests.e2e.conftest import unique
from tests.e2e.helpers import eventually
from tests.support.kubevirt_vmis import (  # noqa: F401 (system, kubevirt: fixtures)
    VMI_GROUP, VMI_VERSION, VMIS, bound_launcher, create, gpu_requests, kubevirt, pin,
    pool, system, vmi)

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
GPU_TAINT = {"key": "gpu.example.com/reserved", "value": "team-x", "effect": "NoSchedule"}


async def test_B3_fifty_vmi_race_every_admitted_vmi_gets_a_launcher_pod_bound_on_its_pin(system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {f"n{i}": {"units": 4} for i in range(5)})
    asks = {f"race-{i:02d}": 1 + i % 3 for i in range(50)}  # 100 GPUs asked, 20 exist
    got: dict[str, tuple[dict | None, str]] = {}

    async def one(name: str) -> None:
        # 50 at once is beyond one tenant's fair share of the webhook: the client retries a
        # 429 tenant_busy as told ("retry after 1 s"), as kubectl's retry of a 429 would.
        for _ in range(60):
            got[name] = await create(fleet, tenant, vmi(name, cls, asks[name]))
            if got[name][0] is not None or "too many requests" not in got[name][1]:
                return
            await anyio.sleep(1)
    async with anyio.create_task_group() as tg:
        for name in asks:
            tg.start_soon(one, name)
    admitted = {n: v for n, (v, _) in got.items() if v is not None}
    denied = {n: m for n, (v, m) in got.items() if v is None}
    assert sum(asks[n] for n in admitted) <= 20
    assert len(admitted) >= 7, denied  # 20 units, at most 3 per VMI: 7 VMIs at least fit
    for n, m in denied.items():
        assert "cannot be placed" in m or "refused" in m, (n, m)
    per_node: dict[str, int] = {}
    for n, made in admitted.items():
        pod = await bound_launcher(fleet, tenant, made)
        assert pod["spec"]["nodeName"] == pin(made), n          # kube-scheduler agrees with the pin
        assert gpu_requests(pod, res) == asks[n], n             # with every GPU of the set
        per_node[pin(made)] = per_node.get(pin(made), 0) + asks[n]
    assert all(v <= 4 for v in per_node.values()), per_node
    pods = (await fleet.core.list_namespaced_pod(tenant)).items
    assert len(pods) == len(admitted) and all(p.spec.node_name for p in pods)  # none Pending
    for n in denied:  # a denied VMI does not exist, so it has no launcher Pod
        with pytest.raises(ApiException):
            await fleet.custom.get_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS, n)


async def test_B3_untolerated_taint_node_is_skipped_a_tolerating_vmi_lands_there(system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {
        "tainted": {"units": 2, "taints": [GPU_TAINT]}, "plain": {"units": 4}})
    made, msg = await create(fleet, tenant, vmi("plain-vm", cls, 1))
    assert made is not None, msg
    assert pin(made) == nodes["plain"]  # the tighter tainted node would win B4 without its taint
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == nodes["plain"]
    tol = [{"key": GPU_TAINT["key"], "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}]
    made, msg = await create(fleet, tenant, vmi("tolerating-vm", cls, 2, tolerations=tol))
    assert made is not None, msg
    assert pin(made) == nodes["tainted"]
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == nodes["tainted"] and gpu_requests(pod, res) == 2


async def test_B3_not_ready_node_is_not_chosen_and_the_denial_says_why(system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"down": {"units": 4, "kwok": False, "ready": False}})
    made, msg = await create(fleet, tenant, vmi("vm", cls, 1))
    assert made is None
    assert str(NodeProblems(nodes["down"], (NotReady(),))) in msg, msg
    devs = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant, "gpudevices")
    assert devs["items"] == []  # W1 denied before any write


async def test_B3_node_without_kubevirt_schedulable_label_is_not_chosen(system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"bare": {"units": 4, "kubevirt": False},
                                                            "kv": {"units": 1}})
    made, msg = await create(fleet, tenant, vmi("vm", cls, 2))
    assert made is None
    lacks = NotKubevirtSchedulable("kubevirt.io/schedulable")
    assert str(NodeProblems(nodes["bare"], (lacks,))) in msg, msg
    made, msg = await create(fleet, tenant, vmi("vm-1", cls, 1))
    assert made is not None, msg
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == nodes["kv"] == pin(made)


async def test_capacity_foreign_gpu_pod_is_counted_and_never_double_booked(system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 2}})
    system_ns = unique("gpu-system")
    await fleet.core.create_namespace({"metadata": {"name": system_ns}})
    await fleet.core.create_namespaced_pod(system_ns, {
        "metadata": {"name": "gpu-burner"},
        "spec": {"nodeName": nodes["n"], "containers": [{
            "name": "burn", "image": "example.invalid/burn",
            "resources": {"limits": {res: "1"}}}]}})  # requests default to limits

    async def counted():
        made, msg = await create(fleet, tenant, vmi(unique("probe"), cls, 2))
        assert made is None, "a 2-GPU VMI was admitted next to a foreign 1-GPU Pod on a 2-GPU node"
        line = str(NodeProblems(nodes["n"], (NoRoom(res, needs=2, free=1, foreign=1),)))
        return msg if line in msg else None
    await eventually(counted, timeout=20, what="the foreign Pod counted")
    made, msg = await create(fleet, tenant, vmi("fits", cls, 1))
    assert made is not None, msg
    pod = await bound_launcher(fleet, tenant, made)  # not Pending "Insufficient"
    assert pod["spec"]["nodeName"] == nodes["n"] and gpu_requests(pod, res) == 1
    # the launcher Pod's GPU is the VMI's Bound device, not foreign: nothing is left, and the
    # refusal counts 1 bound + 1 foreign
    made, msg = await create(fleet, tenant, vmi("more", cls, 1))
    full = NodeProblems(nodes["n"], (NoRoom(res, needs=1, free=0, foreign=1),))
    assert made is None and str(full) in msg, msg


async def test_W1_class_kubevirt_does_not_permit_is_denied_before_any_write(system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 4}}, permit=False)
    made, msg = await create(fleet, tenant, vmi("vm", cls, 1))
    assert made is None
    assert msg.endswith(ClassNotPermitted(cls, res).render()), msg
    devs = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant, "gpudevices")
    assert devs["items"] == []
    got = await fleet.custom.get_cluster_custom_object("gpu.cozystack.io", "v1alpha1", "gpuclasses", cls)
    (cond,) = [c for c in got["status"]["conditions"] if c["type"] == "KubeVirtPermitted"]
    assert (cond["status"], cond["reason"]) == ("False", "NotPermitted")
    kubevirt.set_permitted(kubevirt.permitted + (res,))  # the operator permits it: admitted, runs

    async def admitted():
        made, _ = await create(fleet, tenant, vmi(unique("vm"), cls, 1))
        return made
    made = await eventually(admitted, timeout=30, what="admission once permitted")
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == nodes["n"] == pin(made)


async def test_W1_vmi_keeping_its_own_gpu_entry_kubevirt_does_not_permit_is_denied(system, kubevirt, fleet):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 4}})
    body = vmi("keeps-p40", cls, 1)
    own = f"{unique('own')}.example.com/gpu"  # no GPUClass names it (the example's own P40 may be one)
    body["spec"]["domain"]["devices"]["gpus"] = [{"name": "gpu1", "deviceName": own}]
    made, msg = await create(fleet, tenant, body)
    assert made is None
    assert msg.endswith(GpuEntryNotPermitted("gpu1", own).render()), msg
    devs = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant, "gpudevices")
    assert devs["items"] == []


async def test_B3_node_of_another_architecture_is_not_chosen_though_it_fits_tighter(system, kubevirt, fleet):
    """virt-controller selects `kubernetes.io/arch` = the VMI's architecture (KubeVirt's
    default, the CR's status.defaultArchitecture, here amd64): an arm64 node is never the
    pin, though B4's tightest fit would pick it, so the launcher Pod is bound where pinned."""
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {
        "arm": {"units": 2, "labels": {"kubernetes.io/arch": "arm64"}}, "x86": {"units": 4}})
    made, msg = await create(fleet, tenant, vmi("vm", cls, 1))
    assert made is not None, msg
    assert pin(made) == nodes["x86"]
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == nodes["x86"] and gpu_requests(pod, res) == 1
    made, msg = await create(fleet, tenant, vmi("vm-4", cls, 4))  # 3 left on x86, 2 on arm
    assert made is None
    wrong_arch = SelectorMismatch((("kubernetes.io/arch", "amd64"),))
    assert str(NodeProblems(nodes["arm"], (wrong_arch,))) in msg, msg


async def test_W1_node_selector_too_large_for_the_bind_request_is_denied_before_any_write(system, kubevirt, fleet):
    """A tenant's VMI whose 64 own nodeSelector entries, with KubeVirt's kubernetes.io/arch,
    are more than `bindRequest.nodeSelector` may carry: denied with that reason (not a
    misleading write failure half-way), no GPUDevice written."""
    own = {f"example.com/k{i}": "v" for i in range(64)}
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 2, "labels": own}})
    body = vmi("vm", cls, 1)
    body["spec"]["nodeSelector"] = own  # the node matches all of it: only the bound refuses
    made, msg = await create(fleet, tenant, body)
    assert made is None
    assert msg.endswith(TooManySelectorEntries(65, 64).render()), msg
    devs = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant, "gpudevices")
    assert devs["items"] == []
