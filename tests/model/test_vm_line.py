"""The VM nudge knows the waiting line (docs/contract.md §3c P5, `model.vm_line`): a waiting
VirtualMachine is not told `GPUSetReady=True` for room a set ahead of it in the line can use
(it would only be refused `behind_in_line` on its retry); the set ahead is nudged instead; a
VM that is itself the head, or that takes room nobody ahead can use (backfill), still is."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import partial

from model.housekeeping import VMIs
from model.line import Identity, Line, Shape, entry
from model.priority import Priority, PriorityClassInfo
from model.reasons import Code
from model.snapshot import Snapshot
from model.types import GPUClass, Node
from model.vm import plan_waiting
from model.vm_line import vm_held_back

NOW = datetime(2026, 12, 2, 5, 0, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)
H100 = "nvidia.com/H100"
KV = (("kubevirt.io/schedulable", "true"),)
ON_DEMAND = Priority(1000, class_name="on-demand")


def snap(free: int = 2) -> Snapshot:
    return Snapshot.build(nodes=[Node("n1", KV, allocatable=((H100, free),))],
                          classes=[GPUClass("h100", H100)],
                          priority_classes=[PriorityClassInfo("on-demand", 1000)])


def vm(name: str, count: int, since: str, *, priority_class: str | None = None) -> dict:
    spec: dict = {"tolerations": [], "domain": {"devices": {}}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"name": name, "namespace": "t1", "uid": f"uid-{name}",
                         "creationTimestamp": "2026-12-02T04:00:00Z"},
            "spec": {"runStrategy": "Always", "template": {
                "metadata": {"annotations": {"gpu.cozystack.io/templates": f"h100={count}"}},
                "spec": spec}},
            "status": {"conditions": [{"type": "GPUSetReady", "status": "False", "reason": "SetNeeds",
                                       "message": "m", "lastTransitionTime": since}]}}


def in_line(name: str, count: int, priority: Priority, minute: int, ns: str = "t1"):
    return entry(Identity(ns, name, f"uid-{name}"), Shape((), (("h100", count),)), priority,
                 NOW - timedelta(minutes=60 - minute))


def test_P5_a_vm_is_not_nudged_for_room_a_set_ahead_in_line_can_use_and_that_set_is():
    old_small = vm("small", 1, "2026-12-02T04:00:00Z")                   # waiting longer
    big = vm("big", 2, "2026-12-02T04:30:00Z", priority_class="on-demand")
    line = Line([in_line("big", 2, ON_DEMAND, 30), in_line("small", 1, Priority(), 0)])
    today = plan_waiting(snap(free=2), [old_small, big], vmis=VMIs(), now=NOW, grace=GRACE)
    assert [(w.key[1], w.nudge) for w in today] == [("small", True), ("big", False)]  # without the line
    plan = plan_waiting(snap(free=2), [old_small, big], vmis=VMIs(), now=NOW, grace=GRACE,
                        held_back=partial(vm_held_back, line, {}))
    assert [(w.key[1], w.nudge) for w in plan] == [("small", False), ("big", True)]
    small = plan[0].condition
    assert (small.status, small.reason) == ("False", "BehindInLine")
    assert "t1/big (priority 1000 on-demand" in small.message and "node n1" in small.message


def test_P5_backfill_and_the_head_itself_are_still_nudged():
    big = vm("big", 2, "2026-12-02T04:30:00Z")
    small = vm("small", 1, "2026-12-02T04:00:00Z")
    line = Line([in_line("big", 2, ON_DEMAND, 30), in_line("small", 1, Priority(), 0)])
    plan = plan_waiting(snap(free=3), [small, big], vmis=VMIs(), now=NOW, grace=GRACE,
                        held_back=partial(vm_held_back, line, {}))
    assert [(w.key[1], w.nudge) for w in plan] == [("small", True), ("big", True)]  # room for both
    assert vm_held_back(Line(), {}, snap(free=2), small, "n1") is None              # nobody waits


def test_P5_a_node_reserved_for_the_head_is_not_given_to_a_vm_behind_it():
    small = vm("small", 1, "2026-12-02T04:00:00Z")
    line = Line([in_line("big", 4, ON_DEMAND, 30), in_line("small", 1, Priority(), 0)])
    why = vm_held_back(line, {Identity("t1", "big", "uid-big"): "n1"}, snap(free=2), small, "n1")
    assert why is not None and why.code is Code.NODE_RESERVED


def test_P5_a_vm_not_in_line_is_judged_at_its_templates_priority():
    """A VM the coordinator has not refused yet has no entry: its template's PriorityClass
    places it (P1); a set of lower priority waiting does not hold it back."""
    line = Line([in_line("spot", 2, Priority(), 0, ns="t2")])
    fresh = vm("fresh", 2, "2026-12-02T04:50:00Z", priority_class="on-demand")
    assert vm_held_back(line, {}, snap(free=2), fresh, "n1") is None
    assert vm_held_back(line, {}, snap(free=2), vm("plain", 2, "2026-12-02T04:50:00Z"), "n1") is not None


# --- VMs refused at W1 wait in the line too (model.vm_line.vm_entries, model.line_plan.refresh) ---

def test_P5_a_vm_refused_for_room_at_W1_is_an_entry_a_vm_refused_for_budget_or_running_is_not():
    """W1 refuses a VM's VMI for room before the coordinator sees it: the waiting-VM loop,
    which judges every waiting VM, makes its line entry (its VM uid, shape, template priority,
    first refused when its GPUSetReady turned False); a VM refused for anything else does not
    wait; a VM whose VMI runs or that does not want one leaves the line."""
    from model.line_plan import refresh
    from model.vm_line import vm_entries
    big = vm("big", 4, "2026-12-02T04:30:00Z", priority_class="on-demand")     # no node has 4 free
    small = vm("small", 1, "2026-12-02T04:00:00Z")
    halted = vm("halted", 1, "2026-12-02T04:00:00Z")
    halted["spec"]["runStrategy"] = "Halted"
    running = vm("running", 1, "2026-12-02T04:00:00Z")
    vms = [big, small, halted, running]
    vmis = VMIs.of_keys([("t1", "running")])
    full = Snapshot.build(nodes=[Node("n1", KV, allocatable=((H100, 4),))], classes=[GPUClass("h100", H100)],
                          priority_classes=[PriorityClassInfo("on-demand", 1000)],
                          devices=[_bound(f"o-{i}") for i in range(3)])
    plan = plan_waiting(full, vms, vmis=vmis, now=NOW, grace=GRACE)
    entries, gone = vm_entries(full, vms, plan, vmis=vmis, now=NOW)
    assert [(e.identity.vmi, e.identity.vm_uid, e.priority.value, e.shape.templates) for e in entries] == [
        ("big", "uid-big", 1000, (("h100", 4),))]                 # small fits (1 free): nudged, not sent
    assert entries[0].first_refused == datetime(2026, 12, 2, 4, 30, tzinfo=timezone.utc)
    assert sorted(i.vmi for i in gone) == ["halted", "running"]
    from model.vm_line import refused_since
    failed = {"status": {"conditions": [{"type": "Failure", "status": "True", "reason": "FailedCreate",
                                         "lastTransitionTime": "2026-12-02T04:10:00Z"}]}}
    assert refused_since(failed) == datetime(2026, 12, 2, 4, 10, tzinfo=timezone.utc)
    assert refused_since({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}}) is None
    line = refresh(Line([in_line("running", 1, Priority(), 0)]), entries, gone, NOW)
    assert [e.identity.vmi for e in line] == ["big"]
    # a VM deleted (or re-created under its name: another uid) while it waited leaves too
    ghost, recreated = in_line("deleted", 1, Priority(), 1), in_line("small", 1, Priority(), 2)
    recreated = recreated.__class__(Identity("t1", "small", "old-uid"), recreated.shape, recreated.priority,
                                    recreated.first_refused, recreated.last_seen)
    _, gone = vm_entries(full, vms, plan, vmis=vmis, now=NOW, line=Line([ghost, recreated, entries[0]]))
    assert sorted((i.vmi, i.vm_uid) for i in gone) == [
        ("deleted", "uid-deleted"), ("halted", "uid-halted"), ("running", "uid-running"), ("small", "old-uid")]
    again = refresh(line, [entries[0]], (), NOW + timedelta(minutes=5))         # refused again: place kept
    assert again.entries[0].first_refused == entries[0].first_refused
    assert again.entries[0].last_seen == NOW + timedelta(minutes=5)


def _bound(name: str):
    from model.types import DeviceStatus, GPUDevice, Phase
    return GPUDevice("o", name, "h100", status=DeviceStatus(phase=Phase.BOUND, node_name="n1"))
