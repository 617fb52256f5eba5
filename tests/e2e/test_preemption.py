"""P4 against the real control plane (docs/contract.md §3c): two controller replicas with the
shipped RBAC (`--preemption-min-runtime=0`), bare VMIs (no KubeVirt needed), PriorityClasses
spot (100) and on-demand (1000). A node full of a spot tenant's admitted VMIs; an on-demand
VMI create is answered 503 with Retry-After; the GPUNomination names exactly P3's victims; the
victims' VMIs are deleted and nothing else; the retried create is admitted on the nominated
node and the nomination is gone. An equal-priority VMI never preempts; a preemptor whose
PriorityClass says `preemptionPolicy: Never` is refused plainly.

Needs P1's priority resolution at admission (the webhook records `bindRequest.priority` from
the VMI's `spec.priorityClassName`, and `VMIAdmission._priority` returns it)."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.client import ApiException, SchedulingV1Api

from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas, unique
from tests.e2e.helpers import eventually, make_pool, replicas_saw

pytestmark = pytest.mark.anyio
GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"
VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"
SYSTEM_NS = "cozy-system"


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas whose running sets may yield at once (P2's min runtime 0)."""
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   FAST_CONTROLLER_ARGS + ("--preemption-min-runtime=0",))


def vmi_body(name: str, cls: str, count: int, priority_class: str) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "annotations": {"gpu.cozystack.io/templates": f"{cls}={count}"}},
            "spec": {"domain": {"devices": {}}, "priorityClassName": priority_class}}


async def priority_class(fleet, system, name: str, value: int, policy: str = "PreemptLowerPriority") -> None:
    made = await SchedulingV1Api(fleet.core.api_client).create_priority_class({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
        "value": value, "preemptionPolicy": policy, "description": "gpu-binder e2e (P4)"})
    await replicas_saw(system, {"priorityclasses": made.metadata.resource_version}, what=name)


async def create(fleet, ns: str, body: dict) -> tuple[int, str, dict]:
    """(201, "", {}) when admitted, else (status, message, headers) as the client is told."""
    try:
        await fleet.custom.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS, body)
        return 201, "", {}
    except ApiException as exc:
        message = json.loads(exc.body).get("message", "") if exc.body else str(exc)
        return exc.status, message, dict(exc.headers or {})


async def vmi(fleet, ns: str, name: str) -> dict | None:
    try:
        return await fleet.custom.get_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def nominations(fleet) -> list[dict]:
    got = await fleet.custom.list_namespaced_custom_object(GROUP, VERSION, SYSTEM_NS, "gpunominations")
    return got["items"]


async def world(fleet, system):
    """Node a (4) full of spot VMIs s1, s2 (2 each), node b (2) holding spot s3; the
    PriorityClasses; an on-demand tenant. (cls, nodes, spot tenant, od tenant, classes)."""
    spot, od, never = unique("spot"), unique("on-demand"), unique("on-demand-never")
    await priority_class(fleet, system, spot, 100)
    await priority_class(fleet, system, od, 1000)
    await priority_class(fleet, system, never, 2000, "Never")
    _, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 4, "b": 2}, seen_by=system)
    other = unique("t")
    await fleet.tenant(other)
    for name in ("s1", "s2", "s3"):
        status, message, _ = await create(fleet, tenant, vmi_body(name, cls, 2, spot))
        assert status == 201, message
    placed = {n: (await vmi(fleet, tenant, n))["spec"]["nodeSelector"]["kubernetes.io/hostname"]
              for n in ("s1", "s2", "s3")}
    assert sorted(placed.values()) == sorted([nodes["a"], nodes["a"], nodes["b"]]), placed
    return cls, nodes, tenant, other, (spot, od, never), placed


async def test_P4_an_on_demand_set_preempts_exactly_P3s_victims_and_starts_on_their_room(system, fleet):
    cls, nodes, spot_ns, od_ns, (spot, od, _), placed = await world(fleet, system)
    on_a = sorted(n for n, node in placed.items() if node == nodes["a"])
    status, message, headers = await create(fleet, od_ns, vmi_body("od", cls, 4, od))
    assert status == 503, message
    assert "stopping 2 lower-priority VMs" in message and {int(headers.get("Retry-After", 0))} <= set(range(1, 31))
    mine = [n for n in await nominations(fleet) if n["spec"]["preemptor"]["namespace"] == od_ns]
    assert len(mine) == 1
    spec = mine[0]["spec"]
    assert spec["node"] == nodes["a"] and spec["preemptor"] == {"namespace": od_ns, "vmi": "od", "priority": 1000}
    assert sorted(v["vmi"] for v in spec["victims"]) == on_a
    # the victims' VMIs are deleted, and nothing else
    for name in on_a:
        await eventually(lambda name=name: _gone(fleet, spot_ns, name), timeout=30, what=f"victim {name} deleted")
    others = [n for n in placed if n not in on_a]
    for name in others:
        assert await vmi(fleet, spot_ns, name) is not None
    # the retried create is admitted on the nominated node
    async def admitted() -> bool:
        got, _, _ = await create(fleet, od_ns, vmi_body("od", cls, 4, od))
        return got == 201
    await eventually(admitted, timeout=60, interval=2.0, what="the on-demand VMI admitted")
    got = await vmi(fleet, od_ns, "od")
    assert got["spec"]["nodeSelector"]["kubernetes.io/hostname"] == nodes["a"]
    # its nomination is gone
    async def no_nomination() -> bool:
        return not [n for n in await nominations(fleet) if n["spec"]["preemptor"]["namespace"] == od_ns]
    await eventually(no_nomination, timeout=30, what="the nomination deleted")


async def _gone(fleet, ns: str, name: str) -> bool:
    return await vmi(fleet, ns, name) is None


async def test_P4_an_equal_priority_set_never_preempts_and_a_Never_one_is_refused_plainly(system, fleet):
    cls, nodes, spot_ns, od_ns, (spot, _, never), placed = await world(fleet, system)
    # no nomination: refused for room, each waits in the line (P5: 503, Retry-After 2 s)
    status, message, headers = await create(fleet, od_ns, vmi_body("eq", cls, 4, spot))
    assert status == 503 and "the set waits in the line for room" in message, message
    assert headers.get("Retry-After") == "2", headers
    status, message, _ = await create(fleet, od_ns, vmi_body("nv", cls, 4, never))
    assert status == 503 and "the set waits in the line for room" in message, message
    assert not [n for n in await nominations(fleet) if n["spec"]["preemptor"]["namespace"] == od_ns]
    for name in placed:
        assert await vmi(fleet, spot_ns, name) is not None
