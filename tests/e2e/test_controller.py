"""The controller on a real API server (issue 5): B1-B8 through informers and the status
writer, leader election, cordon/allocatable changes, housekeeping H1-H3, API server restart."""

from __future__ import annotations

import signal
import time

import anyio
import pytest

from model.reasons import (BudgetExhausted, Code, Cordoned, DeviceAt, NodeProblems, NoEligibleNode,
                           NoRoom, RequestRef, SetRefused)
from tests.e2e.helpers import eventually, housekeeping_rounds, make_pool, request, results, stamp

pytestmark = pytest.mark.anyio


async def test_B1_request_written_on_devices_is_placed_and_only_binder_owns_fields(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 1, "b": 3}, devices=3)
    await request(fleet, tenant, "r1", "vm-1", devs)
    got = await eventually(lambda: results(fleet, tenant, devs), what="results")
    assert {s["bindRequest"]["result"] for s in got} == {"Succeeded"}
    assert {s["nodeName"] for s in got} == {nodes["b"]}        # only b has room for 3
    assert {s["phase"] for s in got} == {"Bound"}
    raw = await fleet.get_device(tenant, devs[0])
    owners: dict[str, set[str]] = {}
    for entry in raw["metadata"]["managedFields"]:
        fields = entry.get("fieldsV1", {}).get("f:status", {})
        for f in ("f:phase", "f:nodeName", "f:boundAt"):
            if f in fields:
                owners.setdefault(f, set()).add(entry["manager"])
        for f in ("f:result", "f:message", "f:node"):
            if f in fields.get("f:bindRequest", {}):
                owners.setdefault(f, set()).add(entry["manager"])
    assert owners == {f: {"gpu-binder-binder"} for f in
                      ("f:phase", "f:nodeName", "f:boundAt", "f:result", "f:message", "f:node")}


async def test_B1_set_that_fits_nowhere_is_refused_with_reasons_and_nothing_moves(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 1, "b": 1}, devices=2)
    await request(fleet, tenant, "r1", "vm-1", devs)
    got = await eventually(lambda: results(fleet, tenant, devs), what="results")
    assert {s["bindRequest"]["result"] for s in got} == {"Refused"}
    assert all(s.get("phase", "Pending") == "Pending" and "nodeName" not in s for s in got)
    msg = got[0]["bindRequest"]["message"]
    assert msg == SetRefused((DeviceAt("gpu-0"), DeviceAt("gpu-1")), (NoEligibleNode(tuple(
        NodeProblems(n, (NoRoom(res, needs=2, free=1),)) for n in sorted(nodes.values()))),),
        RequestRef(tenant, "vm-1", "r1")).render()
    assert {s["bindRequest"]["code"] for s in got} == {Code.NO_ELIGIBLE_NODE.value}


async def test_B2_budget_checked_in_binder_two_requests_race_for_last_slot(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 4}, budget=1, devices=2)
    await request(fleet, tenant, "r1", "vm-1", devs[:1])
    await request(fleet, tenant, "r2", "vm-2", devs[1:])
    got = await eventually(lambda: results(fleet, tenant, devs), what="results")
    outcomes = sorted(s["bindRequest"]["result"] for s in got)
    assert outcomes == ["Refused", "Succeeded"]
    refused = next(s for s in got if s["bindRequest"]["result"] == "Refused")["bindRequest"]
    # the winner is Bound, or still being bound when the loser is decided (one batch)
    assert refused["message"] in {SetRefused(
        tuple(DeviceAt(d) for d in refused["devices"]), (budget,),
        RequestRef(tenant, refused["vmi"], refused["id"])).render() for budget in (
            BudgetExhausted(tenant, res, bound=1, budget=1, adds=1),
            BudgetExhausted(tenant, res, bound=0, budget=1, adds=1, reserved=1))}
    assert refused["code"] == Code.BUDGET_EXHAUSTED.value  # typed beside the message: 403


async def test_cordon_by_real_kubectl_and_lowered_allocatable_reach_the_binder(
        system, fleet, control_plane):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 2, "b": 4}, devices=3)
    control_plane.kubectl("cordon", nodes["b"])
    await fleet.set_allocatable(nodes["a"], {res: 1})
    await request(fleet, tenant, "r1", "vm-1", devs[:2])
    got = await eventually(lambda: results(fleet, tenant, devs[:2]), what="results")
    msg = got[0]["bindRequest"]["message"]
    assert {s["bindRequest"]["result"] for s in got} == {"Refused"}
    assert msg == SetRefused((DeviceAt(devs[0]), DeviceAt(devs[1])), (NoEligibleNode((
        NodeProblems(nodes["a"], (NoRoom(res, needs=2, free=1),)),  # room first, then cordoned
        NodeProblems(nodes["b"], (Cordoned(),)))),), RequestRef(tenant, "vm-1", "r1")).render()
    control_plane.kubectl("uncordon", nodes["b"])
    await eventually(lambda: _schedulable(fleet, nodes["b"]), what="uncordon visible")
    await request(fleet, tenant, "r2", "vm-2", devs[:2])
    got = await eventually(lambda: _result_of(fleet, tenant, devs[:2], "r2"), what="r2 result")
    assert [s["bindRequest"]["result"] for s in got] == ["Succeeded"] * 2, got[0]["bindRequest"]
    assert {s["nodeName"] for s in got} == {nodes["b"]}


async def _schedulable(fleet, node):
    n = await fleet.core.read_node(node)
    return not n.spec.unschedulable


async def _result_of(fleet, ns, devs, rid):
    got = await results(fleet, ns, devs)
    return got if got and all(s["bindRequest"]["id"] == rid for s in got) else []


async def test_exactly_one_replica_leads(system):
    leader = system.leader()
    assert leader in {"replica-0", "replica-1"}
    flags = []
    for i in range(2):
        text = system.metrics(i)
        flags.append(next(line for line in text.splitlines()
                          if line.startswith("gpu_binder_leader ")).split()[1])
    assert sorted(flags) == ["0.0", "1.0"]


async def test_B7_recovered_after_leader_kill_on_the_recorded_node(system, fleet):
    """The state a leader killed between the first and last placement write leaves behind
    (decision recorded on every member, one member Bound) is finished by the successor on the
    recorded node even though another node would now be a tighter fit."""
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 3, "b": 2}, devices=2)
    old = system.leader()
    idx = int(old.split("-")[1])
    system.kill_replica(idx, signal.SIGKILL)
    br = {"id": "r-b7", "vmi": "vm-1", "devices": devs, "requestedAt": stamp(),
          "node": nodes["a"]}
    for d in devs:  # fresh attachments: housekeeping (H1) must not clear them meanwhile
        await fleet.set_status(tenant, d, {"attachedTo": {"vmi": "vm-1", "since": stamp()},
                                           "bindRequest": br}, "gpu-binder-binder")
    await fleet.set_status(tenant, devs[0], {"phase": "Bound", "nodeName": nodes["a"],
                                             "boundAt": stamp()},
                           "gpu-binder-binder")
    started = time.monotonic()
    got = await eventually(lambda: results(fleet, tenant, devs), timeout=30, what="B7 results")
    took = time.monotonic() - started
    assert system.leader() not in (None, old)
    assert {s["bindRequest"]["result"] for s in got} == {"Succeeded"}
    assert {s["nodeName"] for s in got} == {nodes["a"]}
    print(f"successor finished the request {took:.1f} s after the kill (lease 4 s)")
    assert took < 4 + 6
    system.start_replica(idx)
    system.wait_ready(idx)


async def test_H1_attachment_of_vmi_that_never_appears_is_cleared_and_templates_deleted(
        system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 2}, devices=1)
    await fleet.custom.create_namespaced_custom_object(
        "gpu.cozystack.io", "v1alpha1", tenant, "gpudevices", {
            "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": "ghost-t-0",
                         "labels": {"gpu.cozystack.io/template-for": "ghost"}},
            "spec": {"class": cls}})
    await request(fleet, tenant, "r1", "ghost", devs + ["ghost-t-0"])
    await eventually(lambda: results(fleet, tenant, devs), what="bound")

    async def cleared():
        held = (await fleet.get_device(tenant, devs[0])).get("status") or {}
        listing = await fleet.custom.list_namespaced_custom_object(
            "gpu.cozystack.io", "v1alpha1", tenant, "gpudevices")
        names = [i["metadata"]["name"] for i in listing["items"]]
        return ("attachedTo" not in held and "bindRequest" not in held
                and names == devs) and held
    held = await eventually(cleared, timeout=30, what="H1 clean-up")
    assert held["phase"] == "Bound"  # a held device keeps its node


async def test_H3_hand_edit_of_settings_configmap_is_repaired(system, control_plane):
    control_plane.kubectl("patch", "configmap", "gpu-settings", "-n", "cozy-system",
                          "--type=merge", "-p",
                          '{"data":{"rawResourceNames":"denied","extra":"x"}}')

    async def repaired():
        out = control_plane.kubectl("get", "configmap", "gpu-settings", "-n", "cozy-system",
                                    "-o", "jsonpath={.data}").stdout
        return "extra" not in out and '"rawResourceNames":"allowed"' in out and out
    out = await eventually(repaired, timeout=20, what="H3 repair")
    assert ".example.com/gpu" in out


async def test_H2_deleting_an_admitted_vmi_releases_devices_at_once(system, fleet,
                                                                     control_plane):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 2}, devices=2)
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "vm-h2"}, "spec": {"domain": {"devices": {}}}}
    await fleet.custom.create_namespaced_custom_object("kubevirt.io", "v1", tenant,
                                                       "virtualmachineinstances", vmi)
    await request(fleet, tenant, "r1", "vm-h2", devs)
    await eventually(lambda: results(fleet, tenant, devs), what="bound")
    await housekeeping_rounds(system, 2)  # a whole round has seen the VMI alive
    control_plane.kubectl("delete", "vmi", "vm-h2", "-n", tenant)
    started = time.monotonic()

    async def released():
        st = [(await fleet.get_device(tenant, d)).get("status") or {} for d in devs]
        return all("attachedTo" not in s for s in st) and st
    st = await eventually(released, timeout=15, what="H2 release")
    assert time.monotonic() - started < 8  # well before the 8 s grace would have done it
    assert [s["phase"] for s in st] == ["Bound", "Bound"]  # held devices keep their node


async def _stream(fleet, tenant, devs, prefix):
    """One single-device request per device, written back to back."""
    for i, d in enumerate(devs):
        await request(fleet, tenant, f"{prefix}-{i}", f"vm-{i}", [d])


async def answered(fleet, tenant: str, devs: list[str]) -> bool:
    """Some device of `devs` has a bind request with a result."""
    for d in devs:
        br = ((await fleet.get_device(tenant, d)).get("status") or {}).get("bindRequest") or {}
        if br.get("result"):
            return True
    return False


async def _live_vmis(fleet, tenant, n):
    """VMIs vm-0 … vm-<n-1> (no GPU annotation: admitted as they are), so housekeeping sees
    the requests' VMIs alive (H1 would clear them after the 8 s grace otherwise)."""
    for i in range(n):
        vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
               "metadata": {"name": f"vm-{i}"}, "spec": {"domain": {"devices": {}}}}
        await fleet.custom.create_namespaced_custom_object("kubevirt.io", "v1", tenant,
                                                           "virtualmachineinstances", vmi)


def _check_invariants(statuses: list[dict], capacity: dict[str, int], budget: int | None):
    """Invariants 1, 3 and 4 of docs/contract.md §7 over single-device requests."""
    per_node: dict[str, int] = {}
    bound = 0
    for s in statuses:
        br = s["bindRequest"]
        if br["result"] == "Succeeded":
            assert s["phase"] == "Bound" and s["nodeName"] == br["node"]
        else:
            assert s.get("phase", "Pending") == "Pending"
        if s.get("phase") == "Bound":
            per_node[s["nodeName"]] = per_node.get(s["nodeName"], 0) + 1
            bound += 1
    for node, n in per_node.items():
        assert n <= capacity[node], (node, n)
    if budget is not None:
        assert bound <= budget


async def test_leader_killed_during_a_stream_of_requests_every_request_answered(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 5, "b": 5, "c": 5},
                                                    budget=12, devices=20)
    await _live_vmis(fleet, tenant, 20)  # a slow failover must not race H1's grace
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stream, fleet, tenant, devs, "s")
        await eventually(lambda: answered(fleet, tenant, devs), timeout=20, interval=0.02,
                         what="the first answer of the stream")  # the leader is at work
        old = system.leader()
        system.kill_replica(int(old.split("-")[1]), signal.SIGKILL)
    got = await eventually(lambda: results(fleet, tenant, devs), timeout=40,
                           what="every request answered")

    async def successor():
        return system.leader() not in (None, old)
    await eventually(successor, timeout=15, what="a new leader")
    _check_invariants(got, {nodes[k]: 5 for k in nodes}, budget=12)
    assert sum(s["bindRequest"]["result"] == "Succeeded" for s in got) == 12
    i = int(old.split("-")[1])
    system.start_replica(i)
    system.wait_ready(i)


async def test_kube_apiserver_killed_and_restarted_during_a_stream_loses_no_request(
        system, fleet, control_plane):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 8, "b": 8}, devices=16)
    await _live_vmis(fleet, tenant, 8)  # a slow restart must not race H1's grace
    await _stream(fleet, tenant, devs[:8], "x")
    control_plane.restart_apiserver()
    await _stream(fleet, tenant, devs[8:], "y")
    try:
        got = await eventually(lambda: results(fleet, tenant, devs), timeout=60,
                               what="every request answered after the restart")
    except AssertionError as exc:  # say what the replicas were doing
        tails = "\n".join(f"--- replica {i}:\n{system.log_tail(i, 60)}" for i in range(2))
        raise AssertionError(f"{exc}\n{tails}") from None
    assert [s["bindRequest"]["result"] for s in got] == ["Succeeded"] * 16
    _check_invariants(got, {nodes["a"]: 8, nodes["b"]: 8}, None)


async def test_metrics_count_decisions_by_rule_and_refusal_reason(system, fleet):
    res, cls, nodes, tenant, devs = await make_pool(fleet, {"a": 1}, budget=1, devices=3)

    def scrape() -> str:
        return "\n".join(system.metrics(i) for i in range(len(system.replicas)))

    def value(text: str, prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(prefix))
    admitted = 'gpu_binder_decisions_total{reason="",result="Succeeded",rule="B1"}'
    over = 'gpu_binder_decisions_total{reason="%s",result="Refused"' % Code.BUDGET_EXHAUSTED.value
    before = scrape()   # the counters are the process's: earlier tests' decisions are in them
    await request(fleet, tenant, "ok", "vm-1", devs[:1])
    await eventually(lambda: results(fleet, tenant, devs[:1]), what="first result")
    await request(fleet, tenant, "over", "vm-2", devs[1:2])
    await eventually(lambda: results(fleet, tenant, devs[1:2]), what="second result")
    # the decisions were made by whichever replica led at the time (the short test Lease may
    # change hands between them on a busy machine): the counters of both replicas together,
    # each decision counted once, by rule and reason
    text = scrape()
    decisions = [x for x in text.splitlines() if x.startswith("gpu_binder_decisions_total")]
    assert value(text, admitted) - value(before, admitted) == 1, decisions
    assert value(text, over) - value(before, over) == 1, decisions
    count = "gpu_binder_decision_seconds_count"
    assert value(text, count) - value(before, count) >= 2
    assert value(text, "gpu_binder_leader ") == 1.0   # one replica leads


async def test_sigterm_exits_cleanly_within_seconds_and_releases_the_lease(system):
    old = system.leader()
    idx = int(old.split("-")[1])
    started = time.monotonic()
    code = system.kill_replica(idx, signal.SIGTERM)
    took = time.monotonic() - started
    assert code == 0, system.log_tail(idx)
    assert took < 5, f"SIGTERM took {took:.1f} s"
    # the Lease was released (holder cleared), so the other replica takes over at once
    # instead of waiting for the 4 s lease duration to run out
    async def successor():
        return system.leader() not in (None, "", old)
    await eventually(successor, timeout=3.5, interval=0.1, what="successor before expiry")
    assert '"lease released"' in system.log_tail(idx, 10) or "lease released" in system.log_tail(idx, 10)
    system.start_replica(idx)
    system.wait_ready(idx)
