"""The VirtualMachine path (issue 24): what Cozystack's users create. A VM whose template
carries our annotations; virt-controller creates the VMI from it, so our webhook is called
by virt-controller, a refusal comes back to virt-controller (its FailedCreate back-off),
and every stop/start or restart deletes and re-creates the VMI of the VM's name.

Against the real virt-controller, virt-api, kube-scheduler and KWOK (marker kubevirt), with
KubeVirt's own examples/vm-cirros.yaml as the VM."""

from __future__ import annotations

import copy
import json
import os
import time
from datetime import datetime

import anyio
import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from model.types import ADMISSION_ANNOTATION, GROUP, VERSION
from model.vm import CONDITION
from tests.e2e.conftest import FIXTURES, unique
from tests.e2e.helpers import eventually
from tests.support.kubevirt_vmis import bound_launcher, gpu_requests, kubevirt, pool, system  # noqa: F401 (fixtures)
from tests.support.tools import run_tool

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
KV, V1 = "kubevirt.io", "v1"
BASE_VM = yaml.safe_load((FIXTURES / "vm-cirros.yaml").read_text())


def vm_body(name: str, *, templates: str | None = None, devices: str | None = None,
            run: str = "Always") -> dict:
    """KubeVirt's own vm-cirros example, named `name`, with `run` as its runStrategy and our
    annotations on its template."""
    v = copy.deepcopy(BASE_VM)
    v["metadata"] = {"name": name, "labels": {"kubevirt.io/vm": name}}
    v["spec"]["runStrategy"] = run
    ann = {}
    if templates:
        ann["gpu.cozystack.io/templates"] = templates
    if devices:
        ann["gpu.cozystack.io/devices"] = devices
    v["spec"]["template"]["metadata"]["annotations"] = ann
    return v


async def create_vm(fleet, ns: str, body: dict) -> dict:
    return await fleet.custom.create_namespaced_custom_object(KV, V1, ns, "virtualmachines", body)


async def get_vm(fleet, ns: str, name: str) -> dict:
    return await fleet.custom.get_namespaced_custom_object(KV, V1, ns, "virtualmachines", name)


async def set_run(fleet, ns: str, name: str, run: str) -> None:
    await fleet.custom.patch_namespaced_custom_object(
        KV, V1, ns, "virtualmachines", name, {"spec": {"runStrategy": run}},
        _content_type="application/merge-patch+json")


async def get_vmi(fleet, ns: str, name: str) -> dict | None:
    try:
        return await fleet.custom.get_namespaced_custom_object(KV, V1, ns, "virtualmachineinstances", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def condition(vm: dict, kind: str = CONDITION) -> dict | None:
    return next((c for c in (vm.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


async def events(fleet, ns: str, name: str, reason: str) -> list[dict]:
    """Events of `reason` about object `name` in `ns` (oldest first)."""
    got = await fleet.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
    return sorted((e.to_dict() for e in got.items if e.reason == reason),
                  key=lambda e: e["metadata"]["creation_timestamp"])


async def started(fleet, ns: str, name: str, *, uid: str | None = None, timeout: float = 60,
                  as_handler: bool = False) -> dict:
    """The VM's VMI once it exists, was admitted and is not incarnation `uid`. With
    `as_handler`, a start failure virt-controller recorded for the incarnation before is
    cleared meanwhile (see `clear_start_failure`)."""
    async def probe():
        if as_handler:
            await clear_start_failure(fleet, ns, name)
        v = await get_vmi(fleet, ns, name)
        # admitted: the webhook's admission id (the pin may be gone already, see below)
        if v and v["metadata"]["uid"] != uid and not v["metadata"].get("deletionTimestamp") and \
                (v["metadata"].get("annotations") or {}).get(ADMISSION_ANNOTATION):
            return v
        return None
    try:
        return await eventually(probe, timeout=timeout, what=f"VM {ns}/{name} started (VMI admitted)")
    except AssertionError as exc:
        vm = await get_vm(fleet, ns, name)
        raise AssertionError(f"{exc}; VM status: {json.dumps(vm.get('status'))[:1500]}") from None


async def waiting(fleet, ns: str, name: str, *, timeout: float = 30) -> dict:
    """The VM once it shows GPUSetReady=False (the binder's reason)."""
    async def probe():
        vm = await get_vm(fleet, ns, name)
        c = condition(vm)
        return vm if c and c["status"] == "False" else None
    return await eventually(probe, timeout=timeout, what=f"VM {ns}/{name} GPUSetReady=False")


async def test_vm_start_admits_its_vmi_and_the_launcher_gets_its_gpus_on_the_pin(system, kubevirt, fleet,
                                                                                  control_plane):
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 4}})
    await create_vm(fleet, tenant, vm_body("vm-a", templates=f"{cls}=3"))
    made = await started(fleet, tenant, "vm-a")
    assert [g["deviceName"] for g in made["spec"]["domain"]["devices"]["gpus"]] == [res] * 3
    pod = await bound_launcher(fleet, tenant, made)
    assert pod["spec"]["nodeName"] == nodes["n"] and gpu_requests(pod, res) == 3
    # explain resolves NAMESPACE/NAME to the VMI when both exist, and says so
    # (explained as a re-creation: its running launcher Pod's 3 GPUs count as foreign then)
    out = run_tool(control_plane, "explain", f"{tenant}/vm-a")
    assert out.returncode in (0, 1), out.stderr
    assert out.stdout.startswith(f"VirtualMachine {tenant}/vm-a has a VMI of that name"), out.stdout
    assert f"\nVMI {tenant}/vm-a: 3 devices (vm-a-{cls}-0, vm-a-{cls}-1, vm-a-{cls}-2)" in out.stdout
    # a stopped VM (no VMI) is explained from its template: 2 do not fit in the 1 left
    await create_vm(fleet, tenant, vm_body("vm-b", templates=f"{cls}=2", run="Halted"))
    out = run_tool(control_plane, "explain", f"{tenant}/vm-b", "--json")
    assert out.returncode == 1, out.stderr
    got = json.loads(out.stdout)
    assert got["resolved"].startswith(f"VirtualMachine {tenant}/vm-b has no VMI"), got
    assert (got["vmi"], got["admitted"]) == ("vm-b", False)
    assert got["devices"] == [f"vm-b-{cls}-0", f"vm-b-{cls}-1"]
    assert condition(await get_vm(fleet, tenant, "vm-b")) is None  # halted: not waiting


async def clear_start_failure(fleet, ns: str, name: str) -> None:
    """What virt-handler's report of a Running VMI does to the VM (the harness has none, so
    every VMI deleted before it ran counts as a failed start, and virt-controller backs the
    next start off by 10 s and more): `status.startFailure` cleared, under a resourceVersion
    test. The status write re-queues the VM in virt-controller."""
    vm = await get_vm(fleet, ns, name)
    if not (vm.get("status") or {}).get("startFailure"):
        return
    try:
        await fleet.custom.patch_namespaced_custom_object_status(
            KV, V1, ns, "virtualmachines", name,
            [{"op": "test", "path": "/metadata/resourceVersion", "value": vm["metadata"]["resourceVersion"]},
             {"op": "remove", "path": "/status/startFailure"}],
            _content_type="application/json-patch+json")
    except ApiException as exc:
        if exc.status not in (409, 422):  # raced with virt-controller: the next poll retries
            raise


async def restart(fleet, ns: str, name: str, uid: str) -> None:
    """Delete the VM's VMI (virt-controller re-creates it, runStrategy Always), finishing the
    deletion as virt-handler would once the launcher Pod is gone."""
    await fleet.custom.delete_namespaced_custom_object(KV, V1, ns, "virtualmachineinstances", name)
    await finish_deletion(fleet, ns, name, uid)


async def finish_deletion(fleet, ns: str, name: str, uid: str) -> None:
    """Wait until VMI incarnation `uid` is gone, dropping virt-handler's finalizer once its
    launcher Pod is gone (as virt-handler would)."""
    async def gone():
        v = await get_vmi(fleet, ns, name)
        if v is None or v["metadata"]["uid"] != uid:
            return True
        pods = (await fleet.core.list_namespaced_pod(ns, label_selector=f"kubevirt.io/created-by={uid}")).items
        fin = v["metadata"].get("finalizers") or []
        if not pods and "kubevirt.io/foregroundDeleteVirtualMachine" in fin:
            try:
                await patch_finalizers(fleet, ns, name, uid, fin)
            except ApiException as exc:
                if exc.status in (404, 422):  # gone meanwhile (or a new incarnation): done
                    return True
                raise
        return False
    await eventually(gone, timeout=60, what=f"VMI {ns}/{name} {uid} deleted")


async def patch_finalizers(fleet, ns: str, name: str, uid: str, fin: list[str]) -> None:
    """Drop virt-handler's finalizer from VMI incarnation `uid` (JSON Patch testing the uid)."""
    await fleet.custom.patch_namespaced_custom_object(
        KV, V1, ns, "virtualmachineinstances", name,
        [{"op": "test", "path": "/metadata/uid", "value": uid},
         {"op": "replace", "path": "/metadata/finalizers",
          "value": [f for f in fin if f != "kubevirt.io/foregroundDeleteVirtualMachine"]}],
        _content_type="application/json-patch+json")


async def room_given(fleet, ns: str, name: str, t_room: float, timeout: float = 30) -> float:
    """Seconds from `t_room` (monotonic) until the VM's VMI is admitted."""
    await started(fleet, ns, name, timeout=timeout)
    return time.monotonic() - t_room


async def test_vm_launcher_is_not_counted_twice_a_second_vm_that_fits_exactly_starts(system, kubevirt, fleet):
    """A VM's launcher Pod is excused by the binder's own records (its VMI's attachments),
    so a second VM whose set fits exactly what is left starts."""
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 4}})
    await create_vm(fleet, tenant, vm_body("first", templates=f"{cls}=2"))
    made = await started(fleet, tenant, "first")
    await bound_launcher(fleet, tenant, made)
    await create_vm(fleet, tenant, vm_body("second", templates=f"{cls}=2"))
    second = await started(fleet, tenant, "second", timeout=20)
    pod = await bound_launcher(fleet, tenant, second)
    assert pod["spec"]["nodeName"] == nodes["n"] and gpu_requests(pod, res) == 2


async def test_W7_vm_started_vmi_keeps_its_pin(system, kubevirt, fleet):
    """virt-controller (LiveUpdate rollout, KubeVirt's default) syncs the VM template's
    nodeSelector onto the running VMI: with none in the template it would remove the binder's
    pin right after admission; W7's policy denies that patch, so once virt-controller has
    synced the VM the pin is still there (invariant 5: every admitted VMI is pinned to its
    node). Without the policy this failed (the removal races with the read: seen both ways)."""
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"n": {"units": 4}})
    await create_vm(fleet, tenant, vm_body("pinned", templates=f"{cls}=1"))
    made = await started(fleet, tenant, "pinned")
    await bound_launcher(fleet, tenant, made)

    async def synced():  # virt-controller's VM sync has run with the VMI (status.created)
        vm = await get_vm(fleet, tenant, "pinned")
        return vm if (vm.get("status") or {}).get("created") else None
    await eventually(synced, timeout=20, what="virt-controller synced VM pinned")
    vmi = await get_vmi(fleet, tenant, "pinned")
    assert (vmi["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname") == nodes["n"], \
        f"the pin of VMI pinned was removed: spec.nodeSelector={vmi['spec'].get('nodeSelector')}"


ROUNDS = int(os.environ.get("GPU_BINDER_VM_ROUNDS", "6"))
"""Restart rounds of the stop/start/restart test: 6 in make test, 50 in the long form
(`GPU_BINDER_VM_ROUNDS=50 ... pytest tests/e2e/test_vm_path.py -k room_appears`, see
docs/virtualmachines.md)."""
WAIT = float(os.environ.get("GPU_BINDER_VM_WAIT", "65"))
"""Seconds the waiting VMs wait at least (65: past virt-controller's 41-s back-off step; set
it to some minutes to see the webhook calls per minute of a long wait)."""


def backoff_calls(seconds: float) -> int:
    """How many times virt-controller's VM controller runs a VM whose sync keeps failing
    within `seconds` of the first failure, re-queued only by its work queue's limiter
    (client-go's DefaultTypedControllerRateLimiter: 5 ms * 2^failures, capped at 1000 s;
    kubevirt v1.8.3 pkg/virt-controller/watch/vm/vm.go:152-153, 347-351): the runs at
    5 ms * (2^k - 1) for k = 0, 1, ... (an upper bound: each run takes time too)."""
    n, t, delay = 0, 0.0, 0.005
    while t <= seconds:
        n, t, delay = n + 1, t + min(delay, 1000.0), delay * 2
    return n


def replica_lines(system, event: str, **fields: str) -> list[dict]:
    """The JSON log lines of the binder's replicas whose `event` is `event` and whose fields
    equal `fields`, oldest first."""
    out = []
    for r in system.replicas:
        for line in r.log_path.read_text(errors="replace").splitlines():
            if f'"{event}"' not in line:
                continue
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("event") == event and all(j.get(k) == v for k, v in fields.items()):
                out.append(j)
    return sorted(out, key=lambda j: j["timestamp"])


def our_writes(system, ns: str, name: str) -> list[str]:
    """The statuses ("True"/"False"/None: removed) of the GPUSetReady writes the binder's
    replicas logged for VM ns/name, oldest first (k8s.vm_waiting's "VM condition written")."""
    return [j.get("status") for j in replica_lines(system, "VM condition written", vm=f"{ns}/{name}")]


def webhook_calls(system, ns: str, name: str) -> list[datetime]:
    """When the webhook denied a CREATE of VMI ns/name (its "VMI denied" lines: one per call
    virt-controller made; the GPUSetRefused Events undercount them, a tenant's Event budget
    being a burst of 10, then 1 a second)."""
    return [datetime.fromisoformat(j["timestamp"].replace("Z", "+00:00"))
            for j in replica_lines(system, "VMI denied", namespace=ns, vmi=name)]


CHECKS = [0]
"""How many times `check_invariants` ran (printed by the restart test)."""


async def check_invariants(fleet, namespaces: list[str], allocatable: dict[str, int]) -> None:
    """§7 on the cluster as it is: no node's Bound devices exceed its allocatable (1); no
    device attached to a VMI that is not its own set's (5); every admitted VMI's launcher
    Pod, once bound, runs where all its devices are Bound (5)."""
    per_node: dict[str, int] = {}
    for ns in namespaces:
        devs = (await fleet.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpudevices"))["items"]
        by_vmi: dict[str, set[str]] = {}
        for d in devs:
            st = d.get("status") or {}
            if st.get("phase") == "Bound":
                per_node[st["nodeName"]] = per_node.get(st["nodeName"], 0) + 1
            att = st.get("attachedTo")
            if att:
                by_vmi.setdefault(att["vmi"], set()).add(st.get("nodeName") if st.get("phase") == "Bound" else None)
        for name, where in by_vmi.items():
            vmi = await get_vmi(fleet, ns, name)
            if vmi is None or vmi["metadata"].get("deletionTimestamp"):
                continue
            pods = (await fleet.core.list_namespaced_pod(
                ns, label_selector=f"kubevirt.io/created-by={vmi['metadata']['uid']}")).items
            for p in pods:
                if p.spec.node_name and p.metadata.deletion_timestamp is None:
                    assert where == {p.spec.node_name}, (ns, name, where, p.spec.node_name)
    for node, n in per_node.items():
        assert n <= allocatable.get(node, 0), (node, n, allocatable)
    CHECKS[0] += 1


async def test_vm_waits_says_why_and_starts_by_itself_when_room_appears(system, kubevirt, fleet, control_plane):
    """Three VMs wait (no room: another VM holds it; a cordon; the budget), a fourth waits
    behind the first for the same room, while a tenant restarts a VM with a held device
    ROUNDS times and a second tenant creates and deletes VMs (invariants checked after every
    round). The webhook calls per waiting VM are virt-controller's back-off, none driven by
    the binder (see the assertions). Then room appears for each: it starts by itself within
    10 s, oldest first (the younger VM is never told of the older one's room)."""
    res, cls, nodes, tenant = await pool(fleet, kubevirt, {"full": {"units": 2}})
    bres, bcls, bnodes, btenant = await pool(fleet, kubevirt, {"wide": {"units": 4}})
    await fleet.core.create_namespaced_resource_quota(btenant, {
        "metadata": {"name": "gpu-budget"}, "spec": {"hard": {f"requests.{bres}": "1"}}})
    await create_vm(fleet, tenant, vm_body("blocker", templates=f"{cls}=2"))
    await started(fleet, tenant, "blocker")
    # the waiters: two for the room the blocker holds, one each for the cordon and the budget
    await create_vm(fleet, tenant, vm_body("w1-old", templates=f"{cls}=2"))
    await waiting(fleet, tenant, "w1-old")
    await create_vm(fleet, tenant, vm_body("w2-young", templates=f"{cls}=2"))
    cres, ccls, cnodes, ctenant = await pool(fleet, kubevirt, {"c": {"units": 2}})
    cnode = cnodes["c"]
    await fleet.cordon(cnode)
    await create_vm(fleet, ctenant, vm_body("w3-cordon", templates=f"{ccls}=1"))
    await create_vm(fleet, btenant, vm_body("w4-budget", templates=f"{bcls}=2"))
    waiters = {(tenant, "w1-old"), (tenant, "w2-young"), (ctenant, "w3-cordon"), (btenant, "w4-budget")}
    t_wait = time.monotonic()
    for ns, name in waiters:
        vm = await waiting(fleet, ns, name)
        c = condition(vm)
        assert c["reason"] and c["message"], c
    assert condition(await get_vm(fleet, btenant, "w4-budget"))["reason"] == "BudgetExhausted"
    # what the user sees: kubectl get vm / describe vm say why, in the binder's words
    got = control_plane.kubectl("get", "vm", "w1-old", "-n", tenant, "-o",
                                f"jsonpath={{.status.conditions[?(@.type==\"{CONDITION}\")].message}}").stdout
    assert got == condition(await get_vm(fleet, tenant, "w1-old"))["message"]
    described = control_plane.kubectl("describe", "vm", "w4-budget", "-n", btenant).stdout
    assert CONDITION in described and "GPUSetWaiting" in described and "budget" in described, described

    # meanwhile: a VM with a held device restarted ROUNDS times, a second tenant's churn
    rres, rcls, rnodes, rtenant = await pool(fleet, kubevirt, {"a": {"units": 4}, "b": {"units": 4}})
    other = unique("t2")
    await fleet.tenant(other)
    await fleet.device(rtenant, "h0", rcls)
    allocatable = {n: 4 for n in rnodes.values()}
    await create_vm(fleet, rtenant, vm_body("keeper", devices="h0", templates=f"{rcls}=1"))
    first = await started(fleet, rtenant, "keeper")
    home = (await fleet.get_device(rtenant, "h0"))["status"]["nodeName"]
    await bound_launcher(fleet, rtenant, first)
    # stop: template devices go, the held device stays Bound on its node, unattached (H2)
    await set_run(fleet, rtenant, "keeper", "Halted")
    await finish_deletion(fleet, rtenant, "keeper", first["metadata"]["uid"])

    async def released():
        h0 = (await fleet.get_device(rtenant, "h0"))["status"]
        devs = (await fleet.custom.list_namespaced_custom_object(GROUP, VERSION, rtenant, "gpudevices"))["items"]
        return (await get_vmi(fleet, rtenant, "keeper") is None and "attachedTo" not in h0
                and [d["metadata"]["name"] for d in devs] == ["h0"]) and h0
    h0 = await eventually(released, timeout=60, what="keeper stopped, its template released (H2)")
    assert (h0["phase"], h0["nodeName"]) == ("Bound", home)
    stop = True

    async def churn():
        i = 0
        while stop:
            name = f"c-{i}"
            await create_vm(fleet, other, vm_body(name, templates=f"{rcls}=1"))
            try:
                await started(fleet, other, name, timeout=30)
            finally:
                await fleet.custom.delete_namespaced_custom_object(KV, V1, other, "virtualmachines", name)
            i += 1
    async with anyio.create_task_group() as tg:
        tg.start_soon(churn)
        await set_run(fleet, rtenant, "keeper", "Always")  # start: on the held device's node
        made = await started(fleet, rtenant, "keeper", as_handler=True)
        uid = made["metadata"]["uid"]
        await bound_launcher(fleet, rtenant, made)
        t_restarts = time.monotonic()
        for r in range(ROUNDS):  # restart: virt-controller re-creates the VMI of the same name
            await check_invariants(fleet, [rtenant, other], allocatable)
            await restart(fleet, rtenant, "keeper", uid)
            made = await started(fleet, rtenant, "keeper", uid=uid, as_handler=True)
            uid = made["metadata"]["uid"]
            h0 = (await fleet.get_device(rtenant, "h0"))["status"]
            assert (h0["phase"], h0["nodeName"], h0["attachedTo"]["vmi"]) == ("Bound", home, "keeper"), (r, h0)
            await bound_launcher(fleet, rtenant, made)
            await check_invariants(fleet, [rtenant, other], allocatable)
        t_rounds = time.monotonic() - t_restarts
        # the waiters have waited long enough for virt-controller's back-off to be long
        while time.monotonic() - t_wait < WAIT:
            await check_invariants(fleet, [rtenant, other], allocatable)
            await anyio.sleep(1)  # paces the invariant check only; nothing waits on it
        stop = False
    print(f"{ROUNDS} restart rounds in {t_rounds:.0f} s, {CHECKS[0]} invariant checks, all held")
    # The webhook calls of each waiting VM are virt-controller's own back-off and nothing we
    # drive: the binder wrote each waiting VM once (GPUSetReady=False; each write re-queues
    # the VM in virt-controller, so costs one call), nudged none, and the calls are at most
    # the limiter's schedule for the time waited + 1 for virt-controller's own first status
    # write + 1 per write of ours; after the first minute at most 1 a minute (its back-off is
    # 41 s and more by then). The first minute's 13-14 calls are the limiter's 5 ms * 2^n
    # (docs/virtualmachines.md); the issue's "<= 6 a minute" holds from the second minute on.
    per_minute = {}
    for ns, name in waiters:
        calls = webhook_calls(system, ns, name)
        minutes = [int((t - calls[0]).total_seconds() // 60) + 1 for t in calls]
        per_minute[name] = {m: minutes.count(m) for m in range(1, max(minutes) + 1)}
        span = (calls[-1] - calls[0]).total_seconds()
        writes = our_writes(system, ns, name)
        assert writes == ["False"], (name, writes)
        bound = backoff_calls(span) + 1 + len(writes)
        assert len(calls) <= bound, (name, len(calls), bound, span, per_minute[name])
        assert all(n <= 1 for m, n in per_minute[name].items() if m > 1), (name, per_minute[name])
        assert await events(fleet, ns, name, "GPUSetRefused")  # what kubectl shows
    print(f"webhook calls per waiting VM per minute of its wait ({time.monotonic() - t_wait:.0f} s): "
          f"{per_minute}")

    # room appears for each, and each starts by itself within 10 s
    delays = {}
    t_room = time.monotonic()
    await set_run(fleet, tenant, "blocker", "Halted")
    async with anyio.create_task_group() as tg:
        async def one(name: str, t0: float) -> None:
            ns = {"w3-cordon": ctenant, "w4-budget": btenant}.get(name, tenant)
            delays[name] = await room_given(fleet, ns, name, t0)
        tg.start_soon(one, "w1-old", t_room)
        await fleet.cordon(cnode, False)
        tg.start_soon(one, "w3-cordon", time.monotonic())
        await fleet.core.patch_namespaced_resource_quota("gpu-budget", btenant, {
            "spec": {"hard": {f"requests.{bres}": "2"}}})
        tg.start_soon(one, "w4-budget", time.monotonic())
    print(f"start delays after room appeared (s): {delays}")
    assert all(d <= 10 for d in delays.values()), delays
    # oldest first: the younger VM waiting for the same room still waits, says why, and was
    # never told there was room (it would have been the room of the older VM, still starting)
    assert await get_vmi(fleet, tenant, "w2-young") is None
    young = condition(await get_vm(fleet, tenant, "w2-young"))
    assert young and young["status"] == "False", young
    assert not await events(fleet, tenant, "w2-young", "GPUSetRoomAvailable")
    assert "True" not in our_writes(system, tenant, "w2-young")
    # the condition clears once the VM runs (virt-controller keeps only the VMI's conditions)
    async def cleared():
        for ns, n in waiters - {(tenant, "w2-young")}:
            if condition(await get_vm(fleet, ns, n)) is not None:
                return False
        return True
    await eventually(cleared, timeout=20, what="GPUSetReady gone from the started VMs")
    # the Event follows the True write (best effort, after it): the VM may start and lose its
    # condition before the Event is stored, so wait for it rather than read it once
    for ns, name in waiters - {(tenant, "w2-young")}:
        async def told(ns=ns, name=name):
            return await events(fleet, ns, name, "GPUSetRoomAvailable")
        await eventually(told, timeout=20, what=f"a GPUSetRoomAvailable Event on VM {ns}/{name}")
