"""P4 end to end with real VirtualMachines (docs/contract.md §3c, issue 39 item 5), in count
mode and in device mode (HGX boards, DRA), against the real virt-controller, virt-api,
kube-scheduler and KWOK (marker kubevirt), with the session's KubeVirt and this module's two
controller replicas (`--preemption-min-runtime=0`).

One fleet per mode, two nodes of 8 GPUs full of spot VMs (PriorityClass 100, pinned:
node a 4+2+2, node b 4+4). An on-demand (1000) 8-GPU VM starts by stopping exactly the
victims its GPUNomination names (node b's two VMs: the fewest, P3), and no other VMI; while
their VMIs stop its VM says `GPUSetReady` False `PreemptionNominated`, waiting for 2
lower-priority VMs; its launcher Pod is bound on the nominated node (device mode: its
ResourceClaim allocated with exactly the nominated devices). The victims' VMs (runStrategy
Always) recreate their VMIs, which wait: `GPUSetReady` False `Preempted`, naming the
preemptor and both priorities, and an Event `GPUSetPreempted` on the VM saying what follows;
deleting the preemptor's VM gives the room back and they run again. In count mode one
victim's runStrategy is RerunOnFailure: it stays stopped, as a user's stop would leave it,
and its Event says so. Then, on the full fleet, a VM whose PriorityClass (2000) says
`preemptionPolicy: Never` and a VM of the spots' own priority wait and stop nobody.

The harness has no virt-handler: the test finishes a deleted VMI's deletion (its finalizer)
and clears a VM's start failure as virt-handler's reports would (`tests.e2e.test_vm_path`).
"""

from __future__ import annotations

import os
import time

import pytest

from localcluster.dra_world import DEVICE_BUDGET_KEY
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas, unique
from tests.e2e.helpers import eventually
from tests.e2e.test_device_mode import check_admitted_set, world as device_world
from tests.e2e.test_dra_kubevirt import RESOURCE
from tests.e2e.test_preemption import nominations, priority_class
from tests.e2e.test_vm_path import (KV, V1, clear_start_failure, condition, create_vm, events,
                                    finish_deletion, get_vm, get_vmi, started, vm_body, waiting)
from tests.support.kubevirt_vmis import bound_launcher, gpu_requests, pin, pool

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
HOST = "kubernetes.io/hostname"
# node a: s1 (4), s2 (2), s3 (2); node b: s4 (4), s5 (4). P3 stops node b's two (fewest victims)
SPOTS = {"s1": ("a", 4), "s2": ("a", 2), "s3": ("a", 2), "s4": ("b", 4), "s5": ("b", 4)}
VICTIMS = ("s4", "s5")


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas as conftest's `system` with room for KubeVirt's webhooks on two busy
    cores (bind timeout 15 s, attachment grace 16 s) and P2's minimum runtime 0 (a set may
    yield at once)."""
    args = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + ("--bind-timeout=15", "--attachment-grace=16",
                                           "--preemption-min-runtime=0"))


@pytest.fixture(scope="module")
def kubevirt(system, kubevirt_shared):
    return kubevirt_shared


@pytest.fixture(scope="module")
def dra(system, kubevirt):
    """This module's replicas with device mode's cluster side (started for the device-mode
    test only, which runs last)."""
    system.start_dra()
    return system


def vm_of(name: str, cls: str, count: int, priority_class_name: str, *, node: str | None = None,
          run: str = "Always") -> dict:
    """KubeVirt's vm-cirros asking for `count` template devices of `cls`, of PriorityClass
    `priority_class_name`, pinned to `node` when given."""
    v = vm_body(name, templates=f"{cls}={count}", run=run)
    spec = v["spec"]["template"]["spec"]
    spec["priorityClassName"] = priority_class_name
    if node:
        spec["nodeSelector"] = {HOST: node}
    return v


async def priorities(fleet, system) -> tuple[str, str, str]:
    """PriorityClasses spot (100), on-demand (1000) and never (2000, preemptionPolicy Never)."""
    names = unique("spot"), unique("on-demand"), unique("never")
    for name, value, policy in zip(names, (100, 1000, 2000), ("PreemptLowerPriority",) * 2 + ("Never",)):
        await priority_class(fleet, system, name, value, policy)
    return names


async def running(fleet, ns: str, name: str, *, uid: str | None = None, timeout: float = 90) -> dict:
    """VM `ns/name`'s VMI (not incarnation `uid`) once admitted and its launcher Pod bound."""
    made = await started(fleet, ns, name, uid=uid, timeout=timeout, as_handler=True)
    await bound_launcher(fleet, ns, made)
    return made


async def shows(fleet, ns: str, name: str, reason: str, text: str, *, timeout: float = 90) -> dict:
    """The VM's GPUSetReady condition once False with `reason` and `text` in its message
    (clearing the VM's start failure meanwhile, as virt-handler's report would)."""
    async def probe():
        await clear_start_failure(fleet, ns, name)
        c = condition(await get_vm(fleet, ns, name))
        return c if c and c["status"] == "False" and c["reason"] == reason and text in c["message"] else None
    try:
        return await eventually(probe, timeout=timeout, what=f"VM {ns}/{name} GPUSetReady {reason}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; VM status: {(await get_vm(fleet, ns, name)).get('status')}") from None


async def mine(fleet, ns: str, vm: str) -> list[dict]:
    """The GPUNominations whose preemptor is VMI `ns/vm`."""
    return [n for n in await nominations(fleet)
            if (n["spec"]["preemptor"]["namespace"], n["spec"]["preemptor"]["vmi"]) == (ns, vm)]


async def preemption_round_trip(fleet, cls: str, nodes: dict[str, str], spot_ns: str, od_ns: str,
                                classes: tuple[str, str, str], *, manual: str | None = None,
                                check_devices: bool = False) -> None:
    """The module's scenario on a fleet of `nodes` (short a, b: 8 GPUs each) for class `cls`
    (module docstring). `manual`: the victim whose runStrategy is RerunOnFailure (it stays
    stopped); `check_devices`: device mode's checks of the preemptor's claim."""
    spot, od, never = classes
    t0 = time.monotonic()
    for name, (short, count) in SPOTS.items():
        run = "RerunOnFailure" if name == manual else "Always"
        await create_vm(fleet, spot_ns, vm_of(name, cls, count, spot, node=nodes[short], run=run))
    uids = {}
    for name, (short, _) in SPOTS.items():
        made = await running(fleet, spot_ns, name)
        assert pin(made) == nodes[short]
        uids[name] = made["metadata"]["uid"]
    t_full = time.monotonic()

    # -- an on-demand 8-GPU VM: nominated on b, the two victims there stopped, nothing else
    await create_vm(fleet, od_ns, vm_of("od", cls, 8, od))

    async def nominated():
        got = await mine(fleet, od_ns, "od")
        return got[0] if got else None
    nom = (await eventually(nominated, timeout=60, what="the on-demand VM's GPUNomination"))["spec"]
    assert nom["node"] == nodes["b"] and nom["preemptor"]["priority"] == 1000, nom
    assert sorted((v["namespace"], v["vmi"], v["priority"]) for v in nom["victims"]) == [
        (spot_ns, v, 100) for v in VICTIMS], nom
    # the victims' VMIs stop (their deletion waits for virt-handler's part, the test's here):
    # meanwhile the preemptor's VM says it waits for the 2 of them
    await shows(fleet, od_ns, "od", "PreemptionNominated",
                       f"waiting for 2 lower-priority VMs to stop on {nodes['b']} to make room for "
                       f"this set (priority 1000): {spot_ns}/s4, {spot_ns}/s5; its room is held for it until")
    (told,) = await eventually(lambda: events(fleet, od_ns, "od", "GPUSetPreempting"), timeout=30,
                               what="the preemptor's GPUSetPreempting Event")
    assert told["message"].startswith(f"waiting for 2 lower-priority VMs to stop on {nodes['b']}"), told
    for name in VICTIMS:
        await finish_deletion(fleet, spot_ns, name, uids[name])
    for name in SPOTS:
        if name not in VICTIMS:
            v = await get_vmi(fleet, spot_ns, name)
            assert v is not None and v["metadata"]["uid"] == uids[name], name
            assert not v["metadata"].get("deletionTimestamp"), name
    # the preemptor starts on the nominated node
    made = await running(fleet, od_ns, "od")
    assert pin(made) == nodes["b"]
    pod = await bound_launcher(fleet, od_ns, made)
    assert pod["spec"]["nodeName"] == nodes["b"]
    if check_devices:
        record = await check_admitted_set(fleet, od_ns, made, 8)
        claim = await fleet.custom.get_namespaced_custom_object(
            RESOURCE, "v1", od_ns, "resourceclaims", made["spec"]["resourceClaims"][0]["resourceClaimName"])
        got = sorted((r["driver"], r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"])
        assert got == sorted((d["driver"], d["pool"], d["device"]) for d in nom["devices"]), (got, nom["devices"])
        assert sorted(d for _, _, d in got) == record
    else:
        assert gpu_requests(pod, made["spec"]["domain"]["devices"]["gpus"][0]["deviceName"]) == 8

    async def no_nomination():
        return not await mine(fleet, od_ns, "od")
    await eventually(no_nomination, timeout=30, what="the nomination deleted once the preemptor ran")
    t_preempted = time.monotonic()

    # -- the victims: each one's VM is told; one that restarts waits, naming who took its room
    for name in VICTIMS:
        (ev,) = [e for e in await events(fleet, spot_ns, name, "GPUSetPreempted")
                 if e["involved_object"]["kind"] == "VirtualMachine"]
        assert (f"preempts {spot_ns}/{name} (priority 100) for {od_ns}/od (priority 1000) on {nodes['b']}"
                in ev["message"]), ev["message"]
        if name == manual:
            assert ev["message"].endswith("stopped as a user's stop would stop it: its VirtualMachine "
                                          "(runStrategy RerunOnFailure) stays stopped until its owner starts it")
            continue
        assert ev["message"].endswith("(runStrategy Always) starts it again, and it waits for room"), ev["message"]
        await shows(fleet, spot_ns, name, "Preempted",
                    f"stopped by gpu-binder on {nodes['b']} to make room for {od_ns}/od (priority 1000), "
                    "of higher priority than this VM (priority 100); it starts again when room for its "
                    "GPU set returns")

    # -- room returns: the preemptor's VM deleted, the victims that wait run again on b
    od_uid = made["metadata"]["uid"]
    await fleet.custom.delete_namespaced_custom_object(KV, V1, od_ns, "virtualmachines", "od")
    await finish_deletion(fleet, od_ns, "od", od_uid)
    for name in VICTIMS:
        if name == manual:
            continue
        again = await running(fleet, spot_ns, name, uid=uids[name])
        assert pin(again) == nodes["b"]
        uids[name] = again["metadata"]["uid"]
    if manual is not None:  # stays stopped: no VMI, and virt-controller made none
        assert await get_vmi(fleet, spot_ns, manual) is None
        assert (await get_vm(fleet, spot_ns, manual))["spec"]["runStrategy"] == "RerunOnFailure"
    t_back = time.monotonic()

    # -- on the full fleet: a Never VM of higher priority and an equal-priority VM wait, stop nobody
    await create_vm(fleet, od_ns, vm_of("nv", cls, 8, never))
    await create_vm(fleet, od_ns, vm_of("eq", cls, 8, spot))
    for name in ("nv", "eq"):
        await waiting(fleet, od_ns, name, timeout=60)  # refused (the nomination is written before)
        assert not await mine(fleet, od_ns, name), name
        assert condition(await get_vm(fleet, od_ns, name))["reason"] != "PreemptionNominated"
    for name in SPOTS:
        if name == manual:
            continue
        v = await get_vmi(fleet, spot_ns, name)
        assert v is not None and v["metadata"]["uid"] == uids[name] and not v["metadata"].get("deletionTimestamp"), name
    print(f"fleet full {t_full - t0:.1f} s, preemptor running {t_preempted - t_full:.1f} s, victims back "
          f"{t_back - t_preempted:.1f} s, Never/equal {time.monotonic() - t_back:.1f} s; load {os.getloadavg()}")


async def test_P4_count_mode_an_on_demand_vm_stops_exactly_its_victims_which_wait_and_start_again(
        system, kubevirt, fleet):
    classes = await priorities(fleet, system)
    _, cls, nodes, spot_ns = await pool(fleet, kubevirt, {"a": {"units": 8}, "b": {"units": 8}})
    od_ns = unique("od")
    await fleet.tenant(od_ns)
    await preemption_round_trip(fleet, cls, nodes, spot_ns, od_ns, classes, manual="s5")


async def test_P4_device_mode_an_on_demand_vm_gets_exactly_the_nominated_devices(dra, fleet):
    classes = await priorities(fleet, dra)
    cls, nodes, spot_ns, _ = await device_world(fleet, dra, {"a": {}, "b": {}})
    od_ns = unique("od")
    await fleet.tenant(od_ns, budgets={DEVICE_BUDGET_KEY: 32})
    await preemption_round_trip(fleet, cls, nodes, spot_ns, od_ns, classes, check_devices=True)
