"""H4 in device mode (docs/contract.md §5 H4, §3b DR5): a VirtualMachine whose device-mode class sets
`keepSetFor` keeps its claim's exact devices across stop and start, against the real
kube-scheduler (DRA allocator), kube-controller-manager's resourceclaim-controller,
virt-controller, virt-api and KWOK, with the session's KubeVirt and this module's replicas.

While the VM has no VMI its GPUDevices stay Bound on their node with their recorded
`status.device`, kept (`attachedTo.keptUntil`), and its claim `<vm>-gpus` stays, pinned to
the same uuids (kube-controller-manager deallocates it while no Pod reserves it; the binder
refuses everyone else the kept devices, and tenants cannot claim the managed DeviceClass);
the next VMI (same name) is admitted on the same node, its claim confirmed in place (same
uuids in its selectors, same devices in its allocation) and its launcher Pod bound on the
pin.
Another tenant is told the devices are kept and until when, the tenant's budget counts
them; a deleted VM frees devices and claim at once (the claim of a released keep does not
wait for H1/H2's grace), and another tenant's VMI then gets those devices allocated.

`GPU_BINDER_KEEP_DEVICE_CYCLES` sets the number of stop/start cycles (default 5) and
`GPU_BINDER_KEEP_DEVICE_REPORT` a JSON file for `bench/keep.py --mode device`: per cycle the
seconds from the start request to the VMI admitted and to its launcher Pod bound, from the
stop request to the set kept, and the node, allocated devices and pinned uuids (this test
asserts no timing)."""

from __future__ import annotations

import json
import os
import time

import pytest

from localcluster.dra_world import DEVICE_BUDGET_KEY
from model.types import GROUP, VERSION
from tests.e2e.conftest import unique
from tests.e2e.helpers import class_rv, eventually, replicas_saw
from tests.e2e.test_device_mode import check_admitted_set, world
from tests.e2e.test_dra_kubevirt import RESOURCE
from tests.e2e.test_vm_keep import (admitted_once_seen_free, devices, kept, next_admitted_vmi,
                                    released, shows_kept, stop)
from tests.e2e.test_vm_path import KV, V1, create_vm, set_run, vm_body
from tests.support.kubevirt_vmis import (  # noqa: F401 (system, kubevirt: fixtures)
    create, kubevirt, launcher_pod, pin, system, vmi)

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
CYCLES = int(os.environ.get("GPU_BINDER_KEEP_DEVICE_CYCLES", "5"))


@pytest.fixture(scope="module")
def dra(system, kubevirt):
    """This module's replicas with device mode's cluster side (as test_device_mode's)."""
    system.start_dra()
    return system


async def claim_of(fleet, ns: str, name: str) -> dict | None:
    got = await fleet.custom.list_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims")
    return next((c for c in got["items"] if c["metadata"]["name"] == name), None)


def allocated(claim: dict) -> list[tuple[str, str]]:
    """(pool, device) of each result of the claim's allocation, sorted."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return sorted((r["pool"], r["device"]) for r in results)


def pinned_uuids(claim: dict) -> list[str]:
    """The CEL selectors of the claim's requests, in request order (each pins one uuid)."""
    return [r["exactly"]["selectors"][0]["cel"]["expression"] for r in claim["spec"]["devices"]["requests"]]


def uuid_of(selector: str) -> str:
    """The uuid a pinning selector (`model.claim.uuid_selector`) names."""
    return selector.rpartition('== "')[2].rstrip('"')


def placed(made: dict, claim: dict) -> dict:
    """What the report records of one start: the VMI's node, its claim's allocated devices
    ([pool, device], sorted) and the uuids its claim pins (in request order)."""
    return {"node": pin(made), "allocated": [list(a) for a in allocated(claim)],
            "uuids": [uuid_of(s) for s in pinned_uuids(claim)]}


async def launcher_bound(fleet, ns: str, made: dict) -> None:
    """Wait until the launcher Pod of the VMI `made` is bound (polled every 0.05 s)."""
    async def bound():
        pod = await launcher_pod(fleet, ns, made["metadata"]["uid"])
        return bool(pod and pod["spec"].get("node_name"))
    await eventually(bound, timeout=60, interval=0.05, what=f"launcher Pod of {made['metadata']['name']} bound")


async def start(fleet, ns: str, name: str, uid: str) -> dict:
    """Start the VM; its next VMI (not incarnation `uid`) once admitted."""
    await set_run(fleet, ns, name, "Always")
    return await next_admitted_vmi(fleet, ns, name, uid)


async def test_H4_device_mode_vm_keeps_its_claim_and_exact_devices_across_5_stops_while_another_tenant_fills(
        dra, fleet):
    cls, nodes, tenant, _ = await world(fleet, dra, {"a": {}, "b": {}})
    await fleet.custom.patch_cluster_custom_object(
        GROUP, VERSION, "gpuclasses", cls, {"spec": {"keepSetFor": "10m"}},
        _content_type="application/merge-patch+json")
    await replicas_saw(dra, {"gpuclasses": await class_rv(fleet, cls)}, what="keepSetFor")
    # the keeper's tenant may hold 2 devices: the kept set counts, and its restarts need no room
    await fleet.core.patch_namespaced_resource_quota(
        "gpu-budget", tenant, {"spec": {"hard": {DEVICE_BUDGET_KEY: "2"}}})
    other = unique("t2")
    await fleet.tenant(other, budgets={DEVICE_BUDGET_KEY: 32})
    await create_vm(fleet, tenant, vm_body("keeper", templates=f"{cls}=2"))
    made = await start(fleet, tenant, "keeper", "")
    home = pin(made)
    names = [f"keeper-{cls}-0", f"keeper-{cls}-1"]
    record = await check_admitted_set(fleet, tenant, made, 2)
    claim_name = made["spec"]["resourceClaims"][0]["resourceClaimName"]
    first = await claim_of(fleet, tenant, claim_name)
    at_first = placed(made, first)
    uuids, alloc = pinned_uuids(first), allocated(first)
    assert alloc == [(home, d) for d in record], alloc
    # the other tenant fills the fleet: 8 on the other node, then 4 and 2 beside the keeper
    for size in (8, 4, 2):
        got, msg = await create(fleet, other, vmi(f"fill-{size}", cls, size))
        assert got is not None, (size, msg)
    timing: list[tuple[float, float]] = []
    kept_after: list[float] = []
    cycles: list[dict] = []
    refusals = 0
    for cycle in range(CYCLES):
        t_stop = time.monotonic()
        await stop(fleet, tenant, "keeper", made)
        until = await kept(fleet, tenant, names, home)
        kept_after.append(time.monotonic() - t_stop)
        await shows_kept(fleet, tenant, "keeper", home, names, until)
        st = {n: d["status"] for n, d in (await devices(fleet, tenant)).items()}
        assert sorted(st[n]["device"]["device"] for n in names) == record, (cycle, st)
        # the claim stays, pinned to the same uuids (resourceclaim-controller deallocates it
        # once no Pod reserves it; the binder's kept record and the claims policy keep the
        # devices from everyone else meanwhile)
        held = await claim_of(fleet, tenant, claim_name)
        assert held is not None and pinned_uuids(held) == uuids, (cycle, held)
        assert allocated(held) in ([], alloc), (cycle, held)
        # another tenant's VMI is refused, and told the devices are kept and until when
        got, msg = await create(fleet, other, vmi(f"late-{cycle}", cls, 2))
        assert got is None, f"cycle {cycle}: another tenant took devices kept for keeper"
        want = f"kept for VirtualMachine {tenant}/keeper until {until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        assert want in msg, msg
        refusals += 1
        if cycle == 0:  # the tenant itself: its budget counts the kept devices (2 of 2)
            got, msg = await create(fleet, tenant, vmi("extra", cls, 1))
            assert got is None and "budget" in msg, msg
        t0 = time.monotonic()
        made = await start(fleet, tenant, "keeper", made["metadata"]["uid"])
        t1 = time.monotonic()
        await launcher_bound(fleet, tenant, made)
        timing.append((t1 - t0, time.monotonic() - t0))
        assert pin(made) == home
        assert made["spec"]["resourceClaims"][0]["resourceClaimName"] == claim_name
        assert await check_admitted_set(fleet, tenant, made, 2) == record, cycle
        now = await claim_of(fleet, tenant, claim_name)
        cycles.append(placed(made, now))
        assert pinned_uuids(now) == uuids and allocated(now) == alloc, (cycle, now)
        st = {n: d["status"] for n, d in (await devices(fleet, tenant)).items()}
        assert sorted(st) == names and all("keptUntil" not in st[n]["attachedTo"] for n in names), st
    # deleted: devices and claim freed at once; the other tenant's VMI gets those devices
    await stop(fleet, tenant, "keeper", made)
    await kept(fleet, tenant, names, home)
    t0 = time.monotonic()
    await fleet.custom.delete_namespaced_custom_object(KV, V1, tenant, "virtualmachines", "keeper")
    await released(fleet, tenant, names, timeout=30)

    async def claim_gone():
        return await claim_of(fleet, tenant, claim_name) is None
    await eventually(claim_gone, timeout=15, interval=0.1, what=f"claim {claim_name} deleted")
    t_free = time.monotonic() - t0
    assert t_free <= 5, t_free  # at once, not after the claim's H1/H2 grace (30 s here)
    got = await admitted_once_seen_free(fleet, other, vmi("after", cls, 2))
    assert pin(got) == home
    assert await check_admitted_set(fleet, other, got, 2) == record
    t_taken = time.monotonic() - t0
    spent = sorted(b for _, b in timing)
    print(f"{CYCLES} device-mode stop/start cycles on {home}, devices {record} every time; start "
          f"request -> launcher bound s: min {spent[0]:.2f} median "
          f"{spent[len(spent) // 2]:.2f} max {spent[-1]:.2f}; deleted VM's devices and claim freed "
          f"{t_free:.2f} s, another tenant's launcher bound on them {t_taken:.2f} s after the "
          f"delete; load {os.getloadavg()}")
    report = os.environ.get("GPU_BINDER_KEEP_DEVICE_REPORT")
    if report:  # bench/keep.py --mode device's figures
        with open(report, "w") as f:
            json.dump({"cycles": CYCLES, "node": home, "first": at_first,
                       "per_cycle": cycles, "start_to_admitted": [a for a, _ in timing],
                       "start_to_launcher_bound": [b for _, b in timing],
                       "stop_to_kept": kept_after, "other_tenant_refusals": refusals}, f)
