"""The VMI admission webhook, called by the real API server (issue 6, W1-W6)."""

from __future__ import annotations

import json
import signal
from datetime import datetime, timezone

import anyio
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import FIXTURES
from tests.e2e.helpers import (eventually, housekeeping_rounds, leader_index, make_pool,
                               quiet_after, scrape)
from tests.support.vmis import (VMI_GROUP, VMI_VERSION, VMIS, annotated, client_ssl, create,
                                create_denied, devices, fixture, review)

pytestmark = pytest.mark.anyio
P40 = "nvidia.com/GP102GL_Tesla_P40"


async def a_request_waits(fleet, ns: str) -> bool:
    """Some device of `ns` carries a bind request without a result: an admission is
    waiting for the binder."""
    return any((br := (d.get("status") or {}).get("bindRequest")) and not br.get("result")
               for d in await devices(fleet, ns))


@pytest.mark.parametrize("name", ["vmi-gpu.yaml", "vmi-dra-pgpu.yaml"])  # vmi-fedora: see test_controlplane
def test_W1_fixtures_without_gpu_annotations_pass_unchanged(system, make_tenant, name):
    t = make_tenant()
    original = fixture(name)
    system.cp.kubectl("create", "-n", t.namespace, "-f", str(FIXTURES / name))
    got = yaml.safe_load(system.cp.kubectl("get", "vmi", original["metadata"]["name"], "-n",
                                           t.namespace, "-o", "yaml").stdout)
    assert got["spec"] == original["spec"]


async def test_W3_vmi_gpu_fixture_with_templates_is_admitted_pinned_and_bound(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(
        fleet, {"small": 1, "big": 4}, resource=P40,
        prefix="held", seen_by=system)
    vmi = annotated(fixture("vmi-gpu.yaml"), "vmi-gpu", templates=f"{cls}=2")
    out = system.cp.kubectl("create", "-n", tenant, "-f", "-", input=yaml.safe_dump(vmi))
    assert out.stdout.strip() == "virtualmachineinstance.kubevirt.io/vmi-gpu created"
    got = yaml.safe_load(system.cp.kubectl("get", "vmi", "vmi-gpu", "-n", tenant, "-o",
                                           "yaml").stdout)
    assert got["spec"]["nodeSelector"] == {"kubernetes.io/hostname": nodes["big"]}
    assert got["spec"]["domain"]["devices"]["gpus"] == [
        {"name": f"vmi-gpu-{cls}-0", "deviceName": P40},
        {"name": f"vmi-gpu-{cls}-1", "deviceName": P40}]   # the fixture's own P40 entry replaced
    devs = await devices(fleet, tenant)
    assert sorted(d["metadata"]["name"] for d in devs) == [f"vmi-gpu-{cls}-0", f"vmi-gpu-{cls}-1"]
    assert {(d["status"]["phase"], d["status"]["nodeName"], d["status"]["attachedTo"]["vmi"])
            for d in devs} == {("Bound", nodes["big"], "vmi-gpu")}
    # the replica that admitted it timed its phases (issue 40, k8s/webhook/phases.py)
    timed = {(s.labels["mode"], s.labels["phase"])
             for i, r in enumerate(system.replicas) if r.alive
             for f in text_string_to_metric_families(system.metrics(i)) for s in f.samples
             if s.name == "gpu_binder_admission_phase_seconds_count" and s.value > 0}
    assert {("count", p) for p in ("live-read", "template-create", "attach", "wait-result",
                                   "total")} <= timed


async def test_B1_held_devices_on_two_nodes_are_gathered_and_vmi_pinned(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(
        fleet, {"a": 2, "b": 2}, devices=2,
        prefix="held", seen_by=system)
    # place held-0 on a and held-1 on b through two single-device VMIs, then delete them
    for i, node_key in ((0, "a"), (1, "b")):
        vmi = annotated(fixture("vmi-fedora.yaml"), f"warm-{i}", devices=f"held-{i}")
        vmi["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes[node_key]}
        ok, msg = await create(fleet, tenant, vmi)
        assert ok, msg
        await fleet.custom.delete_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS,
                                                           f"warm-{i}")

    async def released():
        ds = await devices(fleet, tenant)
        return all("attachedTo" not in d["status"] for d in ds) and ds
    ds = await eventually(released, what="H2 release of the warm-up VMIs")
    assert sorted(d["status"]["nodeName"] for d in ds) == sorted([nodes["a"], nodes["b"]])
    ok, spec = await create(fleet, tenant, annotated(fixture("vmi-fedora.yaml"), "both",
                                                     devices="held-0,held-1"))
    assert ok, spec
    pinned = json.loads(spec)["nodeSelector"]["kubernetes.io/hostname"]
    ds = await devices(fleet, tenant)
    assert {d["status"]["nodeName"] for d in ds} == {pinned}


async def test_W5_set_that_fits_nowhere_is_denied_and_leaves_nothing(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(
        fleet, {"a": 1, "b": 1}, devices=1,
        prefix="held", seen_by=system)
    code, reason, msg = await create_denied(fleet, tenant, annotated(
        fixture("vmi-fedora.yaml"), "too-big", devices="held-0", templates=f"{cls}=1"))
    assert (code, reason) == (403, "Forbidden")      # a policy refusal
    assert "cannot be placed" in msg and f"needs 2 × {res}, has 1 free" in msg
    ds = await devices(fleet, tenant)
    assert [d["metadata"]["name"] for d in ds] == ["held-0"]
    assert ds[0].get("status", {}).get("attachedTo") is None
    events = system.cp.kubectl("get", "events", "-n", tenant, "-o",
                               "jsonpath={.items[*].reason}").stdout
    assert events == "GPUSetRefused"


async def test_W2_server_dry_run_writes_nothing(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(
        fleet, {"a": 2}, devices=1,
        prefix="held", seen_by=system)
    vmi = annotated(fixture("vmi-fedora.yaml"), "dry", devices="held-0", templates=f"{cls}=1")
    out = system.cp.kubectl("create", "--dry-run=server", "-n", tenant, "-f", "-",
                            input=yaml.safe_dump(vmi))
    assert "created (server dry run)" in out.stdout
    ds = await devices(fleet, tenant)
    assert [(d["metadata"]["name"], d.get("status")) for d in ds] == [("held-0", None)]


async def _race(fleet, tenant, vmis: list[dict]) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = [None] * len(vmis)  # type: ignore[list-item]

    async def one(i: int) -> None:
        out[i] = await create(fleet, tenant, vmis[i])
    async with anyio.create_task_group() as tg:
        for i in range(len(vmis)):
            tg.start_soon(one, i)
    return out


async def test_B2_twenty_vmis_for_ten_units_exactly_ten_admitted(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(
        fleet, {"a": 4, "b": 3, "c": 3},
        prefix="held", seen_by=system)
    vmis = [annotated(fixture("vmi-fedora.yaml"), f"vm-{i}", templates=f"{cls}=1")
            for i in range(20)]
    got = await _race(fleet, tenant, vmis)
    assert sum(ok for ok, _ in got) == 10, [m for ok, m in got if not ok][:3]
    bound: dict[str, int] = {}
    for d in await devices(fleet, tenant):
        if d["status"].get("phase") == "Bound":
            bound[d["status"]["nodeName"]] = bound.get(d["status"]["nodeName"], 0) + 1
    assert bound == {nodes["a"]: 4, nodes["b"]: 3, nodes["c"]: 3}


async def test_W3_five_vmis_racing_for_one_held_device_exactly_one_admitted(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(
        fleet, {"a": 2}, devices=1,
        prefix="held", seen_by=system)
    vmis = [annotated(fixture("vmi-fedora.yaml"), f"vm-{i}", devices="held-0")
            for i in range(5)]
    got = await _race(fleet, tenant, vmis)
    assert sum(ok for ok, _ in got) == 1, got
    winner = next(v["metadata"]["name"] for v, (ok, _) in zip(vmis, got) if ok)
    d = (await devices(fleet, tenant))[0]
    assert d["status"]["attachedTo"]["vmi"] == winner


async def test_B2_budget_two_five_vmis_exactly_two_admitted(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(
        fleet, {"a": 8}, budget=2,
        prefix="held", seen_by=system)
    vmis = [annotated(fixture("vmi-fedora.yaml"), f"vm-{i}", templates=f"{cls}=1")
            for i in range(5)]
    got = await _race(fleet, tenant, vmis)
    assert sum(ok for ok, _ in got) == 2
    bound = [d for d in await devices(fleet, tenant) if d["status"].get("phase") == "Bound"]
    assert len(bound) == 2


async def test_W4_repeated_review_for_admitted_vmi_admits_without_new_request(system, fleet):
    import aiohttp

    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 2}, prefix="held", seen_by=system)
    vmi = annotated(fixture("vmi-fedora.yaml"), "again", templates=f"{cls}=1")
    url = f"https://127.0.0.1:{system.webhook_port}/mutate-vmi"
    # the first review's answer is lost (the VMI is never stored); the client retries
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=review("uid-w4-first", vmi, tenant),
                             ssl=client_ssl(system)) as resp:
            first = await resp.json()
    assert first["response"]["allowed"] is True, first
    before = (await devices(fleet, tenant))[0]["status"]["bindRequest"]
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=review("uid-w4", vmi, tenant),
                             ssl=client_ssl(system)) as resp:
            body = await resp.json()
    assert body["response"]["uid"] == "uid-w4" and body["response"]["allowed"] is True
    assert body["response"]["patchType"] == "JSONPatch"
    after = (await devices(fleet, tenant))[0]["status"]["bindRequest"]
    assert after["id"] == before["id"] and after["result"] == "Succeeded"


async def test_leader_killed_while_webhook_waits_admits_or_denies_and_cleans_up(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 8}, prefix="held", seen_by=system)
    vmis = [annotated(fixture("vmi-fedora.yaml"), f"vm-{i}", templates=f"{cls}=1")
            for i in range(6)]
    old = system.leader()
    idx = int(old.split("-")[1])
    results: list = []

    async def go() -> None:
        results.extend(await _race(fleet, tenant, vmis))
    async with anyio.create_task_group() as tg:
        tg.start_soon(go)
        await eventually(lambda: a_request_waits(fleet, tenant), timeout=10, interval=0.01,
                         what="an admission waiting for the binder")
        system.kill_replica(idx, signal.SIGKILL)
    for ok, msg in results:
        assert ok or "not bound within" in msg or "cannot be placed" in msg or "starting" in msg \
            or "failed calling webhook" in msg, msg
    admitted = {v["metadata"]["name"] for v, (ok, _) in zip(vmis, results) if ok}

    async def tidy():
        ds = await devices(fleet, tenant)
        stray = [d["metadata"]["name"] for d in ds
                 if (d.get("status") or {}).get("attachedTo", {}).get("vmi")
                 not in admitted | {None}]
        return "tidy" if not stray else None
    try:
        await eventually(tidy, timeout=30,
                         what="no device attached to a VMI that does not exist")
    finally:
        system.start_replica(idx)
        system.wait_ready(idx)


async def test_W5_replica_stopped_while_admitting_denies_and_cleans_up(system, fleet):
    """No leader (killed), so the admission waits; SIGTERM to the replica serving it must
    answer with a denial and clear what it wrote, not drop the connection."""
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 2}, prefix="held", seen_by=system)
    leader = int(system.leader().split("-")[1])
    other = 1 - leader
    system.kill_replica(leader, signal.SIGKILL)
    result: list = []

    async def go() -> None:
        result.append(await create_denied(fleet, tenant, annotated(
            fixture("vmi-fedora.yaml"), "stopping", templates=f"{cls}=1")))
    async with anyio.create_task_group() as tg:
        tg.start_soon(go)
        await eventually(lambda: a_request_waits(fleet, tenant), timeout=10, interval=0.05,
                         what="the webhook waiting for a binder")
        system.kill_replica(other, signal.SIGTERM)
    try:
        code, reason, msg = result[0]
        assert (code, reason) == (503, "ServiceUnavailable"), (code, reason, msg)  # retryable
        assert "shut down while admitting; retry" in msg, msg
        assert await devices(fleet, tenant) == []  # the template it created is gone
    finally:
        for i in (0, 1):
            if not system.replicas[i].alive:
                system.start_replica(i)
        for i in (0, 1):
            system.wait_ready(i)


async def test_W6_unknown_gpu_annotation_is_denied_with_the_known_ones_named(system, fleet):
    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 1}, prefix="held", seen_by=system)
    vmi = annotated(fixture("vmi-fedora.yaml"), "typo")
    vmi["metadata"]["annotations"] = {"gpu.cozystack.io/template": f"{cls}=1"}
    code, reason, msg = await create_denied(fleet, tenant, vmi)
    assert (code, reason) == (422, "Invalid")        # invalid input, not a policy refusal
    assert "unknown annotation gpu.cozystack.io/template: gpu-binder reads " \
           "gpu.cozystack.io/devices" in msg


async def test_W3_B1_a_device_costs_one_webhook_write_and_one_binder_write(system, fleet):
    """docs/contract.md §3 "Writes" and W3 (2), (3): the webhook writes `attachedTo` and `bindRequest`
    in one optimistic write per device, the binder node, placement and result in one: a held
    device changes twice per admission, a template device is created and changes twice
    (counted from the watch: every write that changes an object is one event). The
    housekeeping write that links the set to the VMI's uid once the VMI exists (H2) comes
    after the admission and is counted apart: one per VMI, on the set's first device."""
    from kubernetes_asyncio import watch

    res, cls, nodes, tenant, held = await make_pool(fleet, {"n": 4}, devices=1, seen_by=system)
    listed = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1",
                                                              tenant, "gpudevices")
    events: list[tuple[str, str]] = []
    linked: list[str] = []

    async def collect() -> None:
        w = watch.Watch()
        async with w.stream(fleet.custom.list_namespaced_custom_object, "gpu.cozystack.io",
                            "v1alpha1", tenant, "gpudevices",
                            resource_version=listed["metadata"]["resourceVersion"]) as stream:
            async for ev in stream:
                raw = ev["raw_object"]
                if ((raw.get("status") or {}).get("attachedTo") or {}).get("uid"):
                    linked.append(raw["metadata"]["name"])
                else:
                    events.append((ev["type"], raw["metadata"]["name"]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        ok, msg = await create(fleet, tenant, annotated(fixture("vmi-fedora.yaml"), "one",
                                                        devices=held[0], templates=f"{cls}=1"))
        assert ok, msg
        await housekeeping_rounds(system, 2)  # H2 has judged the set (and writes nothing)
        rvs = [int(d["metadata"]["resourceVersion"]) for d in await devices(fleet, tenant)]
        await quiet_after(system, {"gpudevices": max(rvs)})  # the binder has nothing left
        await fleet.device(tenant, "marker", cls)  # a watch delivers in order: once the
        await eventually(lambda: ("ADDED", "marker") in events, timeout=10,  # marker is in,
                         what="the marker's watch event")  # every earlier write is too
        tg.cancel_scope.cancel()
    events.remove(("ADDED", "marker"))
    template = f"one-{cls}-0"
    print(f"writes per device: {events}; uid links: {linked}")
    assert sorted(events) == sorted([("MODIFIED", held[0])] * 2 + [("ADDED", template)]
                                    + [("MODIFIED", template)] * 2), events
    assert linked == [], linked  # no uid link: the admission annotation names the incarnation


def _hold_lease(system, holder: str, seconds: int) -> None:
    """Set the binder's Lease to `holder` for `seconds` (renewed now); holder "" frees it
    (a replica takes it at its next attempt, as after a leader's release)."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "leaseDurationSeconds": seconds, "renewTime": now}
    system.cp.kubectl("patch", "lease", "gpu-binder", "-n", "cozy-system", "--type=merge",
                      "-p", json.dumps({"spec": spec}))


async def _no_leader(system) -> bool:
    """No replica leads (every one's gpu_binder_leader is 0)."""
    for i in range(len(system.replicas)):
        if (await scrape(system, i)).get(("gpu_binder_leader", ())) != 0:
            return False
    return True


async def test_a_binder_refusal_answers_from_its_code_ledgers_refused_503_budget_403(system,
                                                                                      fleet):
    """Issue 30: a refusal's status follows its typed reason code, whichever path found it,
    through the real kube-apiserver: a budget refusal (W1, on the cache) is 403 Forbidden;
    a `ledgers_refused` the binder writes (`status.bindRequest.code`) is 503
    ServiceUnavailable, so the tenant's client may retry (a retry decides again).

    How the `ledgers_refused` is provoked, honestly: the node actors live inside the
    controller processes, so a test cannot make one refuse its prepare on cue (the model
    and the ledger read the same cache, so they disagree only for the length of a race).
    Instead the test plays a leader that refused by the ledgers and lost its Lease after
    writing the first of the set's members, the case B7 finishes: it takes the Lease (no
    replica leads, the webhook still serves), lets the webhook write the request on both
    held devices, writes the rendered ledger refusal with code `ledgers_refused` on the
    *second* member only, and frees the Lease. The new leader's coordinator finishes the
    refusal on the first member (`model.plan.Finish`: message and code, through the status
    pipeline and the status writer). The webhook answers from the first Refused member in
    the set's order, the one only the binder wrote: without the code written there the
    answer would be the old 403 (and without any answer a timeout, whose message differs).
    """
    from model.reasons import (BudgetExhausted, DeviceAt, LedgersRefused, NodeRefusal, NoRoom,
                               RequestRef, SetRefused, Short)

    res, cls, nodes, tenant, _ = await make_pool(fleet, {"a": 4}, budget=2, devices=2,
                                                 prefix="held", seen_by=system)
    # a policy refusal, found by W1 on the cache: 403
    code, reason, msg = await create_denied(fleet, tenant, annotated(
        fixture("vmi-fedora.yaml"), "greedy", templates=f"{cls}=3"))
    assert (code, reason) == (403, "Forbidden")
    assert BudgetExhausted(tenant, res, bound=0, budget=2, adds=3).render() in msg

    # a retryable refusal, found by the binder's node ledgers: 503
    await anyio.to_thread.run_sync(_hold_lease, system, "e2e-no-leader", 60)
    try:
        await eventually(lambda: _no_leader(system), timeout=15, interval=0.1,
                         what="no replica leading")
        vmi = annotated(fixture("vmi-fedora.yaml"), "vm-ledgers", devices="held-0,held-1")
        denied: list = []

        async def create_it() -> None:
            denied.append(await create_denied(fleet, tenant, vmi))

        async def requested() -> str | None:
            brs = [(d.get("status") or {}).get("bindRequest") or {}
                   for d in await devices(fleet, tenant)]
            ids = {br.get("id") for br in brs}
            return ids.pop() if len(brs) == 2 and len(ids) == 1 and None not in ids else None

        async with anyio.create_task_group() as tg:
            tg.start_soon(create_it)
            rid = await eventually(requested, timeout=5, interval=0.02,
                                   what="the webhook's request on both held devices")
            written = SetRefused((DeviceAt("held-0"), DeviceAt("held-1")), (LedgersRefused((
                NodeRefusal(nodes["a"], Short((NoRoom(res, needs=2, free=1),))),)),),
                RequestRef(tenant, "vm-ledgers", rid)).render()
            await fleet.set_status(tenant, "held-1", {"bindRequest": {
                "result": "Refused", "message": written, "code": "ledgers_refused"}},
                field_manager="gpu-binder")
            await anyio.to_thread.run_sync(_hold_lease, system, "", 1)
        code, reason, msg = denied[0]
        assert (code, reason) == (503, "ServiceUnavailable"), msg
        assert msg.endswith(written)
    finally:
        if await anyio.to_thread.run_sync(system.leader) == "e2e-no-leader":  # failed early
            await anyio.to_thread.run_sync(_hold_lease, system, "", 1)
        await leader_index(system)
