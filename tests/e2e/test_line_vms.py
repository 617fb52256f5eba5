"""P5 with KubeVirt VirtualMachines (docs/contract.md §3c P5): VMs the webhook refuses for room
wait in the leader's line (handed over by the waiting-VM loop), the line is published in the
GPUClass's `status.line` and read by `gpu-binder explain` and `top`, and when room frees the
VM ahead in line is nudged, not an older VM of lower priority whose start would take the room
the one ahead needs. Bare VMIs too (`--line-bare-vmis`, on by default): one the webhook
refuses for room (503 with Retry-After) waits in the same line while its client retries, so a
later, smaller set of the same priority cannot take the room it waits for, and its own retry
is admitted. Its place is kept `--line-retry-grace` without a retry (60 s for this module's
replicas: the test's client retries only at the steps it names, not every Retry-After).

Against the real virt-controller, virt-api, kube-scheduler and KWOK (marker kubevirt)."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.client import ApiException

from model.types import GROUP, VERSION
from tests.e2e.conftest import unique
from tests.e2e.helpers import eventually
from tests.e2e.test_accounting_attacks import attacker
from tests.e2e.test_priority import priority_class
from tests.e2e.test_vm_path import condition, create_vm, get_vm, get_vmi, set_run, started, vm_body, waiting
from tests.support.kubevirt_vmis import VMI_GROUP, VMI_VERSION, VMIS, pin, vmi
from tests.support.kubevirt_vmis import kubevirt, pool  # noqa: F401 (fixtures)
from tests.support.tools import run_tool

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """`tests.support.kubevirt_vmis.system`'s replicas (bare VMIs refused at W1 wait in the
    line by default), a bare VMI's place kept 60 s without a retry (`--line-retry-grace`)."""
    from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas

    args = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + ("--bind-timeout=15", "--attachment-grace=30", "--line-retry-grace=60"))


async def test_P5_vms_refused_at_W1_wait_in_the_published_line_and_the_one_ahead_gets_the_room(
        system, kubevirt, fleet, control_plane):
    on_demand = unique("on-demand")
    await priority_class(fleet, system, on_demand, 100_000)
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 2}})
    await create_vm(fleet, tenant, vm_body("holder", templates=f"{cls}=2"))
    await started(fleet, tenant, "holder")
    await create_vm(fleet, tenant, vm_body("small", templates=f"{cls}=1"))  # waits first
    await waiting(fleet, tenant, "small")
    big = vm_body("big", templates=f"{cls}=2")
    big["spec"]["template"]["spec"]["priorityClassName"] = on_demand
    await create_vm(fleet, tenant, big)
    await waiting(fleet, tenant, "big")

    async def published():
        got = await fleet.custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", cls)
        line = (got.get("status") or {}).get("line")
        return line if line and [e["name"] for e in line.get("entries", [])] == ["big", "small"] else None
    line = await eventually(published, timeout=60, what=f"GPUClass {cls} status.line: big, then small")
    head = line["entries"][0]
    assert line["length"] == 2 and (head["kind"], head["priority"], head["priorityClassName"], head["gpus"]) == (
        "VirtualMachine", 100_000, on_demand, 2)

    explained = run_tool(control_plane, "explain", f"{tenant}/small")
    assert f"position 2 of 2 in the line of class {cls}, behind {tenant}/big" in explained.stdout, explained
    shown = run_tool(control_plane, "top")
    assert f"{tenant}/big" in shown.stdout and f"LINE {cls}: 2 waiting" in shown.stdout, shown

    # room for the big VM frees: it is nudged and starts; the older small VM, behind it in the
    # line, is not told of that room (its start would leave the big VM without it)
    await set_run(fleet, tenant, "holder", "Halted")
    await started(fleet, tenant, "big", timeout=120)
    assert await get_vmi(fleet, tenant, "small") is None
    small = condition(await get_vm(fleet, tenant, "small"))
    assert small is not None and small["status"] == "False", small

    async def only_small():
        got = await fleet.custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", cls)
        line = (got.get("status") or {}).get("line")
        return line if line and [e["name"] for e in line["entries"]] == ["small"] else None
    await eventually(only_small, timeout=60, what="the big VM out of the published line")


async def test_P5_a_bare_vmi_refused_for_room_at_W1_waits_and_a_later_smaller_one_cannot_take_its_room(
        system, kubevirt, fleet, control_plane, tmp_path, tenant_client):
    spot = unique("spot")
    await priority_class(fleet, system, spot, 100)
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 2}})
    api = await attacker(fleet, control_plane, tmp_path, tenant, tenant_client)  # the tenant's own client

    async def create(name: str, count: int) -> tuple[int, str]:
        body = vmi(name, cls, count)
        body["spec"]["priorityClassName"] = spot
        try:
            made = await api.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS, body)
            return 201, pin(made)
        except ApiException as exc:
            return exc.status, json.loads(exc.body).get("message", "") if exc.body else str(exc)

    status, where = await create("holder", 2)
    assert (status, where) == (201, nodes["n"]), where
    status, message = await create("big", 2)                 # no room: W1 refuses it, and it waits
    assert status == 503 and "the set waits in the line for room" in message, message  # retry

    async def published():
        got = await fleet.custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", cls)
        line = (got.get("status") or {}).get("line")
        return line if line and [e["name"] for e in line.get("entries", [])] == ["big"] else None
    line = await eventually(published, timeout=60, what=f"GPUClass {cls} status.line: the bare VMI big")
    assert (line["entries"][0]["kind"], line["entries"][0]["priority"]) == ("VirtualMachineInstance", 100)
    status, message = await create("big", 2)                 # its client retries: the place is kept
    assert status == 503, message

    # the room big waits for frees; a later, smaller set of the same priority may not take it
    await api.delete_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS, "holder")

    async def small_behind():
        got, message = await create("small", 1)
        assert got != 201, "the small set took the room the bare VMI big waits for"
        # W1's own 503 (it waits too) while the holder's room is not free yet
        return message if got == 503 and "waits ahead" in message else None
    message = await eventually(small_behind, timeout=60, interval=1.0, what="small refused behind big")
    assert f"{tenant}/big" in message and "line" in message, message

    # big's retry (its client kept retrying) is admitted on the freed room; small still waits
    async def big_admitted():
        got, where = await create("big", 2)
        return where if got == 201 else None
    assert await eventually(big_admitted, timeout=60, interval=2.0, what="big admitted") == nodes["n"]
    got, message = await create("small", 1)
    assert got in (403, 503), message
