"""Whole-set preemption, the pure plan (docs/contract.md §3c P2, P3; `model.preemption`): the
running sets of a snapshot, who may yield (P2), P3's order rule by rule, the typed reasons of
no plan, device mode's groups (DR3) and claims, and property tests over small random fleets in
both modes: `plan_preemption` equals a brute-force search over every subset of eligible
victims on every node minimising the same ordered key, and the snapshot without the plan's
victims places the set on the plan's node with the plan's devices."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from itertools import combinations, product

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from model.decide import Request, decide, decide_on
from model.defrag import device_target, eligible_nodes, movable
from model.nomination import RoomMove
from model.hold import Hold
from model.preemption import (NoPlan, PreemptionPlan, PreemptionSettings, RunningSet, may_yield,
                              plan_preemption, release_sets, request_priority, running_sets)
from model.priority import ClassPreemption, PreemptionPolicy, Priority
from model.reasons import Code
from model.snapshot import Snapshot
from model.types import (Attachment, BindRequest, Budget, DeviceStatus, GPUClass, GPUDevice, Node,
                         Phase, Result)
from tests.support.dra_worlds import CLASS, device_class, dra_node, ref
from tests.support.world import H, gpu_class, node

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
PROPS = settings(max_examples=200, derandomize=True, deadline=None, print_blob=True)


def prio(value: int, policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER) -> Priority:
    return Priority(value, policy, f"p{value}")


def vm_set(vmi: str, on: str, gpus: int, *, ns: str = "t", value: int = 0, age: timedelta = HOUR,
           cls: str = "h100", held: int = 0, admission: str | None = None, kept: bool = False,
           indices: tuple[int, ...] = ()) -> list[GPUDevice]:
    """A running set of VMI `vmi`: `gpus` template devices and `held` held devices Bound on
    `on`, attached since NOW - `age` (kept for its VM when `kept`), bindRequest Succeeded of
    priority `value`; device mode: member i records GPU `indices[i]`."""
    admission = admission or f"adm-{vmi}"
    t_names = [f"{vmi}-{cls}-{i}" for i in range(gpus)]
    h_names = [f"{vmi}-held-{i}" for i in range(held)]
    br = BindRequest(f"r-{vmi}", vmi, tuple(t_names + h_names), NOW - age, result=Result.SUCCEEDED,
                     node=on, priority=prio(value))
    att = Attachment(vmi, NOW - age, admission, kept_until=NOW + HOUR if kept else None)
    out = []
    for i, name in enumerate(t_names + h_names):
        record = ref(on, indices[i]) if indices else None
        out.append(GPUDevice(ns, name, cls, template_for=vmi if name in t_names else None,
                             status=DeviceStatus(Phase.BOUND, on, NOW - age - HOUR, att, br, record)))
    return out


def asking(vmi: str, gpus: int, *, ns: str = "p", value: int = 1000, cls: str = "h100",
           policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER,
           held_on: tuple[str, int | None] | None = None) -> tuple[list[GPUDevice], Request]:
    """A preemptor: VMI `vmi` asking `gpus` devices of `cls` at priority `value`: new ones,
    but with `held_on` (node, GPU index or None) the first is a held device Bound there."""
    names = tuple(f"{vmi}-{cls}-{i}" for i in range(gpus))
    br = BindRequest("rp", vmi, names, NOW, priority=prio(value, policy))
    att = Attachment(vmi, NOW, "adm-p")
    devices = [GPUDevice(ns, n, cls, template_for=vmi, status=DeviceStatus(attached_to=att, bind_request=br))
               for n in names]
    if held_on is not None:
        on, index = held_on
        devices[0] = GPUDevice(ns, names[0], cls, status=DeviceStatus(
            Phase.BOUND, on, NOW - HOUR, att, br, ref(on, index) if index is not None else None))
    return devices, Request("rp", ns, vmi, names, (), NOW)


NEVER_CLASS = replace(gpu_class("h100n"), preemption=ClassPreemption.NEVER)


def count_world(nodes, *sets, classes=None, budgets=(), reservations=()) -> Snapshot:
    return Snapshot.build(nodes=nodes, classes=classes or [gpu_class(), NEVER_CLASS],
                          devices=[d for s in sets for d in s], budgets=budgets, reservations=reservations)


def victims_of(plan) -> list[str]:
    assert isinstance(plan, PreemptionPlan), plan
    return [v.vmi for v in plan.victims]


# --- running sets -----------------------------------------------------------------------------


def test_running_sets_group_one_incarnation_with_templates_held_priority_and_start():
    a = vm_set("a", "n1", 2, held=1, value=5, age=2 * HOUR)
    # a held device of set a attached later (W4's take-over re-keys it): the latest `since` is the start
    a[2] = replace(a[2], status=replace(a[2].status, attached_to=replace(a[2].status.attached_to,
                                                                         since=NOW - HOUR)))
    b = vm_set("b", "n2", 1, kept=True)
    sets = running_sets(count_world([node("n1", 8), node("n2", 8)], a, b))
    assert [(s.vmi, s.node, s.templates, s.held, s.priority.value, s.started, s.kept, s.gpus)
            for s in sets] == [
        ("a", "n1", ("a-h100-0", "a-h100-1"), ("a-held-0",), 5, NOW - HOUR, False, 3),
        ("b", "n2", ("b-h100-0",), (), 0, NOW - HOUR, True, 1)]
    assert sets[0].key == ("t", "a", "adm-a") and sets[0].classes == ("h100",)


def test_running_sets_never_count_a_partial_set():
    a = vm_set("a", "n1", 2)
    a[1] = replace(a[1], status=replace(a[1].status, phase=Phase.PENDING, node_name=None))  # being placed
    b = vm_set("b", "n1", 2)
    b[0] = replace(b[0], status=replace(b[0].status, bind_request=replace(b[0].status.bind_request, result=None)))
    c = vm_set("c", "n1", 2)
    c[0] = replace(c[0], status=replace(c[0].status, node_name="n2"))  # half moved
    d = vm_set("d", "n1", 1)
    assert [s.vmi for s in running_sets(count_world([node("n1", 8), node("n2", 8)], a, b, c, d))] == ["d"]


def test_request_priority_is_the_recorded_one():
    devices, req = asking("p", 2, value=77)
    assert request_priority(count_world([node("n1", 8)], devices), req).value == 77
    assert request_priority(count_world([node("n1", 8)]), req).value == 0


# --- P2 who may yield -------------------------------------------------------------------------


def test_P2_only_strictly_lower_priority_yields():
    devices, req = asking("p", 4, value=100)
    snap = count_world([node("n1", 4)], vm_set("eq", "n1", 4, value=100), devices)
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, NoPlan) and plan.reason.code is Code.NO_ELIGIBLE_VICTIM
    assert plan.message == "no running set has a priority below 100"
    snap = count_world([node("n1", 4)], vm_set("low", "n1", 4, value=99), devices)
    assert victims_of(plan_preemption(snap, req, NOW)) == ["low"]


def test_P2_min_runtime():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4)], vm_set("young", "n1", 4, age=timedelta(minutes=9)), devices)
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, NoPlan) and plan.reason.code is Code.NO_ELIGIBLE_VICTIM
    assert plan.message == "no running set may yield to priority 1000: 1 of lower priority (1 ran less than 10m0s)"
    assert victims_of(plan_preemption(snap, req, NOW + timedelta(minutes=1))) == ["young"]
    short = PreemptionSettings(min_runtime=timedelta(minutes=5))
    assert victims_of(plan_preemption(snap, req, NOW, short)) == ["young"]


def test_P2_min_runtime_is_not_negative():
    with pytest.raises(ValueError):
        PreemptionSettings(min_runtime=timedelta(seconds=-1))
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4)], vm_set("now", "n1", 4, age=timedelta(0)), devices)
    assert victims_of(plan_preemption(snap, req, NOW, PreemptionSettings(timedelta(0)))) == ["now"]


def test_the_preemptors_own_holds_are_not_counted_against_it():
    devices, req = asking("p", 4)
    own = Hold("rp", "p", "n1", (("nvidia.com/H100", 4),))
    snap = count_world([node("n1", 4)], vm_set("low", "n1", 4), devices, reservations=[own])
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n1" and victims_of(plan) == ["low"]


def test_P2_a_class_with_preemption_never_protects_its_sets():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 8)], vm_set("safe", "n1", 4, cls="h100n"), vm_set("spot", "n1", 4), devices)
    assert victims_of(plan_preemption(snap, req, NOW)) == ["spot"]
    snap = count_world([node("n1", 4)], vm_set("safe", "n1", 4, cls="h100n"), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.message == ("no running set may yield to priority 1000: 1 of lower priority "
                            "(1 of a class with preemption Never)")


def test_P2_a_preemptor_whose_policy_is_never_gets_no_plan():
    devices, req = asking("p", 4, policy=PreemptionPolicy.NEVER)
    snap = count_world([node("n1", 4)], vm_set("low", "n1", 4), devices)
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, NoPlan) and plan.reason.code is Code.PREEMPTOR_NEVER
    assert not may_yield(snap, running_sets(snap)[0], prio(1000, PreemptionPolicy.NEVER), NOW)


def test_P2_a_set_kept_for_a_stopped_vm_yields_like_a_running_one():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4)], vm_set("kept", "n1", 4, kept=True), devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["kept"] and plan.victims[0].kept


def test_P2_a_victims_held_devices_stay_bound_and_take_their_units():
    # stopping `h` frees only its 2 templates; its 2 held devices stay the tenant's on n1
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4)], vm_set("h", "n1", 2, held=2), devices)
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, NoPlan) and plan.reason.code is Code.NOTHING_FREES_ENOUGH
    assert plan.message == "stopping the 1 set that may yield, on 1 node, makes room for the set on none"
    after = release_sets(snap, running_sets(snap))
    held = after.device("t", "h-held-0")
    assert held.bound_node == "n1" and held.status.attached_to is None
    assert after.device("t", "h-h100-0") is None and after.free("n1", H) == 2
    snap = count_world([node("n1", 6)], vm_set("h", "n1", 2, held=2), vm_set("x", "n1", 2), devices)
    assert victims_of(plan_preemption(snap, req, NOW)) == ["h", "x"]


def test_P2_budgets_are_not_changed_and_a_budget_refusal_is_not_for_room():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4)], vm_set("low", "n1", 4), devices, budgets=[Budget("p", H, 2)])
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, NoPlan) and plan.reason.code is Code.NOT_REFUSED_FOR_ROOM
    assert plan.message == "the set is refused for budget_exhausted, not for room: preemption would not help"


def test_a_set_that_fits_now_needs_no_plan():
    devices, req = asking("p", 2)
    snap = count_world([node("n1", 4)], vm_set("low", "n1", 2), devices)
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, NoPlan) and plan.reason.code is Code.FITS_WITHOUT_PREEMPTION
    assert plan.message == "the set fits on n1 without preemption"


def test_a_node_the_set_may_not_use_is_no_candidate():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4, cordoned=True), node("n2", 4)],
                       vm_set("a", "n1", 4, value=0), vm_set("b", "n2", 4, value=500), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n2" and victims_of(plan) == ["b"]


# --- P3 the order -----------------------------------------------------------------------------


def test_P3_lowest_highest_victim_priority_first():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4), node("n2", 4)],
                       vm_set("mid", "n1", 4, value=50),
                       vm_set("low1", "n2", 2, value=10), vm_set("low2", "n2", 2, value=10), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n2" and victims_of(plan) == ["low1", "low2"]  # two at 10 before one at 50


def test_P3_fewest_victims_before_fewest_gpus():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 8), node("n2", 4)],
                       vm_set("big", "n1", 8),
                       vm_set("s1", "n2", 2), vm_set("s2", "n2", 2), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n1" and victims_of(plan) == ["big"]  # 1 victim of 8 GPUs before 2 of 4


def test_P3_fewest_victim_gpus():
    devices, req = asking("p", 2)
    snap = count_world([node("n1", 4), node("n2", 2)],
                       vm_set("four", "n1", 4), vm_set("two", "n2", 2), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n2" and victims_of(plan) == ["two"]


def test_P3_fewest_victim_gpus_counts_held_devices():
    devices, req = asking("p", 2)
    snap = count_world([node("n1", 4), node("n2", 3)],
                       vm_set("bigheld", "n2", 2, held=1), vm_set("four", "n1", 2), vm_set("x", "n1", 2, value=5),
                       devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["four"]  # 2 GPUs before 3 (2 templates + 1 held)


def test_P3_most_recently_started_victims():
    devices, req = asking("p", 2)
    snap = count_world([node("n1", 2), node("n2", 2)],
                       vm_set("old", "n1", 2, age=5 * HOUR), vm_set("new", "n2", 2, age=HOUR), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n2" and victims_of(plan) == ["new"]


def test_P3_most_recently_started_compares_newest_first():
    devices, req = asking("p", 4)
    # n1: started 1h and 9h ago; n2: 2h and 3h ago. Newest first: (1h, 9h) beats (2h, 3h)
    snap = count_world([node("n1", 4), node("n2", 4)],
                       vm_set("a1", "n1", 2, age=HOUR), vm_set("a9", "n1", 2, age=9 * HOUR),
                       vm_set("b2", "n2", 2, age=2 * HOUR), vm_set("b3", "n2", 2, age=3 * HOUR), devices)
    assert plan_preemption(snap, req, NOW).node == "n1"


def test_P3_then_B4_tightest_fit_then_name():
    devices, req = asking("p", 2)
    same = dict(age=HOUR)
    snap = count_world([node("n1", 4), node("n2", 3), node("n3", 3)],
                       vm_set("a", "n1", 2, **same), vm_set("a2", "n1", 2, value=900, **same),
                       vm_set("b", "n2", 2, **same), vm_set("b2", "n2", 1, value=900, **same),
                       vm_set("c", "n3", 2, **same), vm_set("c2", "n3", 1, value=900, **same), devices)
    plan = plan_preemption(snap, req, NOW)
    # after stopping the 2-GPU set each node has exactly 2 free: a tie on fit; n1 by name
    assert plan.node == "n1" and victims_of(plan) == ["a"]
    snap = count_world([node("n1", 4), node("n2", 3)],
                       vm_set("a", "n1", 2, **same), vm_set("a2", "n1", 1, value=900, **same),
                       vm_set("b", "n2", 2, **same), vm_set("b2", "n2", 1, value=900, **same), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n2"  # n1 would keep 1 unit left over, n2 none: the tightest fit


def test_P3_the_plan_is_what_the_decision_places_and_names_both_priorities():
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 4)], vm_set("low", "n1", 4, value=7), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.placement.node == "n1" and len(plan.placement.moves) == 4
    assert [e.render() for e in plan.events()] == ["preempts t/low (priority 7) for p/p (priority 1000) on n1"]
    after = decide(release_sets(snap, plan.victims), req)
    assert after.node == "n1" and after.placements[0] == plan.placement


def test_decide_on_agrees_with_decide_and_names_only_its_node():
    devices, req = asking("p", 2)
    snap = count_world([node("n1", 1), node("n2", 2), node("n3", 3)], devices)
    d, rank = decide_on(snap, req, "n2")
    assert d.node == "n2" and d.placements[0] == decide(snap, req).placements[0] and rank[-1] == "n2"
    d, rank = decide_on(snap, req, "n1")
    assert rank is None and d.message.endswith("n1: needs 2 × nvidia.com/H100, has 1 free")


@pytest.mark.parametrize("device_mode", [False, True])
def test_decide_on_ranks_the_nodes_as_decide_orders_its_candidates(device_mode):
    cls = CLASS if device_mode else "h100"
    devices, req = asking("p", 2, cls=cls, held_on=("n3", 7 if device_mode else None))
    fill = {"n1": 5, "n2": 3, "n3": 5, "n4": 3, "n5": 0}  # GPUs taken by a running set per node
    sets = [vm_set(f"v-{n}", n, k, cls=cls, indices=tuple(range(k)) if device_mode else ())
            for n, k in fill.items() if k]
    nodes = [dra_node(n) if device_mode else node(n, 8) for n in fill]
    snap = (dra_world if device_mode else count_world)(nodes, *sets, devices)
    ranked = sorted((decide_on(snap, req, n)[1], n) for n in fill)
    assert [n for _, n in ranked] == [p.node for p in decide(snap, req, limit=None).placements]
    assert ranked[0][1] == "n3"  # fewest moves first


# --- device mode (DR3): the freed devices must make one group ---------------------------------


def dra_world(nodes, *sets, classes=None) -> Snapshot:
    return Snapshot.build(nodes=nodes, classes=classes or [device_class(), replace(
        device_class("h100xn"), preemption=ClassPreemption.NEVER)], devices=[d for s in sets for d in s])


def test_DR3_the_freed_devices_must_make_a_group():
    # partition4 groups: GPUs {0,1,2,3} and {4,5,6,7}. Stopping `split` frees 0,1,4,5: four
    # devices but no group of four; no single victim frees a whole group
    devices, req = asking("p", 4, cls=CLASS)
    snap = dra_world([dra_node("n1")],
                     vm_set("split", "n1", 4, cls=CLASS, indices=(0, 1, 4, 5), value=1, age=HOUR),
                     vm_set("lowA", "n1", 2, cls=CLASS, indices=(2, 3), value=1, age=2 * HOUR),
                     vm_set("lowB", "n1", 2, cls=CLASS, indices=(6, 7), value=1, age=3 * HOUR), devices)
    plan = plan_preemption(snap, req, NOW)
    # no single victim frees a group; pairs: split+lowA frees {0..5} ⊇ group A; split+lowB frees
    # group B; lowA+lowB frees 2,3,6,7: none. Both pairs have 6 GPUs; split+lowA started later
    assert victims_of(plan) == ["lowA", "split"]
    assert sorted(r.device for _, r in plan.devices) == ["gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-2", "gpu-vfio-3"]
    after = decide(release_sets(snap, plan.victims), req)
    assert after.node == "n1" and after.placements[0].devices == plan.devices


def test_DR3_a_victims_claim_no_longer_takes_its_devices():
    # the binder's own claim of the victim allocates its devices (Node.taken_devices, not foreign)
    devices, req = asking("p", 4, cls=CLASS)
    n1 = replace(dra_node("n1"), taken_devices=frozenset(f"gpu-vfio-{i}" for i in range(8)))
    snap = dra_world([n1], vm_set("a", "n1", 4, cls=CLASS, indices=(0, 1, 2, 3)),
                     vm_set("b", "n1", 4, cls=CLASS, indices=(4, 5, 6, 7), value=5), devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["a"] and plan.node == "n1"
    assert release_sets(snap, plan.victims).nodes["n1"].taken_devices == frozenset(
        f"gpu-vfio-{i}" for i in range(4, 8))


def test_DR3_another_claim_on_a_victims_device_is_not_released():
    devices, req = asking("p", 4, cls=CLASS)
    n1 = replace(dra_node("n1"), taken_devices=frozenset({"gpu-vfio-0"}), foreign_claimed=frozenset({"gpu-vfio-0"}))
    snap = dra_world([n1], vm_set("a", "n1", 4, cls=CLASS, indices=(0, 1, 2, 3)),
                     vm_set("b", "n1", 3, cls=CLASS, indices=(5, 6, 7)), devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["b"]  # group A keeps gpu-vfio-0 taken by another's claim


# --- D-moves of idle held devices (P3 with D1-D5) ----------------------------------------------


def idle(name: str, on: str, *, ns: str = "t", cls: str = "h100", index: int | None = None) -> list[GPUDevice]:
    """An idle held device (D1: Bound, no attachment, no request) on `on`; device mode: it
    records GPU `index`."""
    return [GPUDevice(ns, name, cls, status=DeviceStatus(
        Phase.BOUND, on, NOW - 2 * HOUR, device=ref(on, index) if index is not None else None))]


def moves_of(plan) -> list[tuple]:
    assert isinstance(plan, PreemptionPlan), plan
    return [(m.name, m.from_node, m.to_node, m.to_device.device if m.to_device else None) for m in plan.moves]


def test_P3_count_mode_one_move_saves_a_victim():
    # n1 (5): a (2) + c (1) + an idle held device + 1 free; the set needs 4. Without moves both
    # a and c must stop; moving the idle device to n2's free unit, a alone
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 5), node("n2", 2)], vm_set("a", "n1", 2), vm_set("c", "n1", 1),
                       idle("g", "n1"), vm_set("hi", "n2", 1, value=5000), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n1" and victims_of(plan) == ["a"] and moves_of(plan) == [("g", "n1", "n2", None)]
    assert [m.render(f"{req.namespace}/{req.vmi}") for m in plan.moves] == [
        "preemption: moved t/g (h100) from n1 to n2 to make room on n1 for p/p"]
    after = decide(release_sets(snap, plan.victims).with_devices(
        [replace(snap.device("t", "g"), status=replace(snap.device("t", "g").status, node_name="n2"))]), req)
    assert after.node == "n1" and after.placements[0] == plan.placement
    # with n2 full, no move: both stop
    snap = count_world([node("n1", 5), node("n2", 1)], vm_set("a", "n1", 2), vm_set("c", "n1", 1),
                       idle("g", "n1"), vm_set("hi", "n2", 1, value=5000), devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["a", "c"] and plan.moves == ()


def test_P3_a_move_that_does_not_help_is_not_in_the_plan():
    # stopping a alone makes the room: the idle device stays although n2 has room for it
    devices, req = asking("p", 4)
    snap = count_world([node("n1", 5), node("n2", 2)], vm_set("a", "n1", 3), idle("g", "n1"),
                       vm_set("hi", "n2", 1, value=5000), devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["a"] and plan.moves == ()


def test_P3_a_move_only_to_a_node_its_class_may_use():
    # the idle device's class serves pool=a only; the one free unit elsewhere is on n2 (pool=b)
    devices, req = asking("p", 4)
    pool_a = gpu_class("h100a", selector={"pool": "a"})
    snap = count_world([node("n1", 5, pool="a"), node("n2", 2, pool="b")], vm_set("a", "n1", 2),
                       vm_set("c", "n1", 1), idle("g", "n1", cls="h100a"), vm_set("hi", "n2", 1, value=5000),
                       devices, classes=[gpu_class(), NEVER_CLASS, pool_a])
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["a", "c"] and plan.moves == ()
    # a Stay class never moves (D1)
    stay = gpu_class("h100a", stay=True)
    snap = count_world([node("n1", 5), node("n2", 2)], vm_set("a", "n1", 2), vm_set("c", "n1", 1),
                       idle("g", "n1", cls="h100a"), vm_set("hi", "n2", 1, value=5000), devices,
                       classes=[gpu_class(), NEVER_CLASS, stay])
    assert plan_preemption(snap, req, NOW).moves == ()


def test_P3_a_node_that_moves_alone_make_room_on_is_no_candidate():
    # the set needs 2; n1 (3): two idle devices and a. Moving both idle devices (to n2 and n3,
    # one free unit each) makes the room with no victim: that is defragmentation's (D3), not
    # a preemption, so a (whose 1 GPU and one move would also do) is not stopped for it
    devices, req = asking("p", 2)
    nodes = [node("n1", 3), node("n2", 3), node("n3", 3)]
    others = (vm_set("hi2", "n2", 2, value=5000), vm_set("hi3", "n3", 2, value=5000))
    snap = count_world(nodes, idle("g1", "n1"), idle("g2", "n1"), vm_set("a", "n1", 1), *others, devices)
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, NoPlan) and plan.reason.code is Code.NOTHING_FREES_ENOUGH
    # one idle device only: moving it and stopping a make the room
    snap = count_world(nodes, idle("g1", "n1"), vm_set("a", "n1", 2), *others, devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["a"] and plan.moves == ()  # a's 2 GPUs alone: no move needed
    snap = count_world(nodes, idle("g1", "n1"), vm_set("a", "n1", 1), vm_set("b", "n1", 1), *others, devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["a"] and moves_of(plan) == [("g1", "n1", "n2", None)]


def test_P3_device_mode_one_move_saves_a_victim():
    # partition4 groups {0-3} {4-7}. n1: a on 0-2, an idle held device on 3, hi on 4-7: no
    # group without moving the idle device; n2: c on 0-1, d on 2-3 (two victims make a group);
    # n3 has GPU 7 free. Moving the idle device to n3, stopping a alone makes n1's group
    devices, req = asking("p", 4, cls=CLASS)
    hi = dict(cls=CLASS, value=5000)
    snap = dra_world([dra_node("n1"), dra_node("n2"), dra_node("n3")],
                     vm_set("a", "n1", 3, cls=CLASS, indices=(0, 1, 2)), idle("g", "n1", cls=CLASS, index=3),
                     vm_set("hi1", "n1", 4, indices=(4, 5, 6, 7), **hi),
                     vm_set("c", "n2", 2, cls=CLASS, indices=(0, 1)), vm_set("d", "n2", 2, cls=CLASS, indices=(2, 3)),
                     vm_set("hi2", "n2", 4, indices=(4, 5, 6, 7), **hi),
                     vm_set("hi3", "n3", 7, indices=tuple(range(7)), **hi), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n1" and victims_of(plan) == ["a"]
    assert moves_of(plan) == [("g", "n1", "n3", "gpu-vfio-7")] and plan.moves[0].from_device == ref("n1", 3)
    assert sorted(r.device for _, r in plan.devices) == [f"gpu-vfio-{i}" for i in range(4)]
    # without n3's free GPU: c and d stop on n2
    snap = dra_world([dra_node("n1"), dra_node("n2")],
                     vm_set("a", "n1", 3, cls=CLASS, indices=(0, 1, 2)), idle("g", "n1", cls=CLASS, index=3),
                     vm_set("hi1", "n1", 4, indices=(4, 5, 6, 7), **hi),
                     vm_set("c", "n2", 2, cls=CLASS, indices=(0, 1)), vm_set("d", "n2", 2, cls=CLASS, indices=(2, 3)),
                     vm_set("hi2", "n2", 4, indices=(4, 5, 6, 7), **hi), devices)
    plan = plan_preemption(snap, req, NOW)
    assert plan.node == "n2" and victims_of(plan) == ["c", "d"] and plan.moves == ()


def test_P3_device_mode_a_re_point_on_the_node_saves_a_victim():
    # n1: a on 0-2, the idle device records 3, b on 4, GPU 5 free, hi on 6-7: re-pointing the
    # idle device to GPU 5 frees group {0-3} once a stops (else a and b stop: no group either)
    devices, req = asking("p", 4, cls=CLASS)
    snap = dra_world([dra_node("n1")],
                     vm_set("a", "n1", 3, cls=CLASS, indices=(0, 1, 2)), idle("g", "n1", cls=CLASS, index=3),
                     vm_set("b", "n1", 1, cls=CLASS, indices=(4,)),
                     vm_set("hi", "n1", 2, cls=CLASS, value=5000, indices=(6, 7)), devices)
    plan = plan_preemption(snap, req, NOW)
    assert victims_of(plan) == ["a"] and moves_of(plan) == [("g", "n1", "n1", "gpu-vfio-5")]
    assert plan.moves[0].repoint
    assert plan.moves[0].render("p/p") == ("preemption: re-pointed t/g (h100x) on n1 from gpu-vfio-3 to "
                                           "gpu-vfio-5 to make room on n1 for p/p")


# --- property tests: the plan equals brute force ----------------------------------------------


def _eligible(snap: Snapshot, s: RunningSet, p: Priority, now: datetime) -> bool:
    """P2 from its text, not from `may_yield`."""
    return (s.priority.value < p.value and now - s.started >= timedelta(minutes=10)
            and all(snap.classes[c].preemption is ClassPreemption.LOWER_PRIORITY for c in s.classes))


def brute_targets(snap: Snapshot, node_name: str, choice) -> tuple[RoomMove, ...] | None:
    """The moves of `choice` ((idle device, "move" or "repoint"), by device key) as P3's text
    with D2 places them, each in turn: off the node to the eligible node (`eligible_nodes`)
    with the fewest free units left (then name) with a unit free and, device mode, a device
    free for it (the one a one-device set takes, `device_target`); a re-point records the
    device a one-device set takes on its own node. None when one has nowhere to go."""
    used: dict = {}
    taken: dict = {}
    out = []
    for d, kind in choice:
        cls = d.class_name
        res = snap.classes[cls].resource_name
        devices = cls in snap.mode.device_classes
        if kind == "repoint":
            to_node, to = node_name, device_target(snap, node_name, cls, taken.get(node_name, ()))
            if to is None:
                return None
        else:
            options = []
            for n in eligible_nodes(snap, cls):
                left = snap.free(n, res) - used.get((n, res), 0)
                if n == node_name or left < 1:
                    continue
                to = device_target(snap, n, cls, taken.get(n, ())) if devices else None
                if devices and to is None:
                    continue
                options.append((left, n, to))
            if not options:
                return None
            _, to_node, to = min(options, key=lambda o: o[:2])
            used[(to_node, res)] = used.get((to_node, res), 0) + 1
        if to is not None:
            taken.setdefault(to_node, set()).add(to.device)
        out.append(RoomMove(d.namespace, d.name, cls, res, node_name, to_node, d.status.device, to))
    return tuple(out)


def brute_moves(snap: Snapshot, node_name: str):
    """Every choice of moves of the idle held devices of `node_name` (D1, `movable`): each
    stays, moves off or (device mode) is re-pointed; fewest moves first."""
    idle_here = sorted((d for d in snap.devices.values() if d.bound_node == node_name and movable(d, snap)),
                       key=lambda d: d.key)
    kinds = [("stay", "move", "repoint") if d.class_name in snap.mode.device_classes else ("stay", "move")
             for d in idle_here]
    out = []
    for pick in product(*kinds):
        choice = tuple((d, k) for d, k in zip(idle_here, pick) if k != "stay")
        moves = brute_targets(snap, node_name, choice)
        if moves is not None:
            out.append(moves)
    return sorted(out, key=len)


def brute_force(snap: Snapshot, req: Request, now: datetime):
    """Every non-empty subset of the eligible victims of every node, with every choice of
    moves of the node's idle held devices, judged by the binder's decision on the snapshot
    without them and after the moves; the minimum of P3's key written from its text. A node
    where moves alone make room is no candidate (a plan stops someone)."""
    p = request_priority(snap, req)
    if not p.may_preempt or decide(snap, req).result is Result.SUCCEEDED:
        return None
    eligible = [s for s in running_sets(snap) if _eligible(snap, s, p, now)]
    best = None
    for node_name in sorted({s.node for s in eligible}):
        mine = [s for s in eligible if s.node == node_name]
        choices = brute_moves(snap, node_name)
        if any(decide_on(moved(snap, ms), req, node_name)[1] is not None for ms in choices if ms):
            continue  # moves alone make the room: defragmentation's, not a preemption
        for k in range(1, len(mine) + 1):
            for subset in combinations(mine, k):
                for ms in choices:
                    released = moved(release_sets(snap, subset), ms)
                    whole = decide(released, req, limit=None)
                    placed_here = [pl for pl in whole.placements if pl.node == node_name]
                    d, rank = decide_on(released, req, node_name)
                    assert (rank is not None) == bool(placed_here)  # the restriction agrees with decide
                    if rank is None:
                        continue
                    assert d.placements[0] == placed_here[0]
                    newest_first = sorted((s.started for s in subset), reverse=True)
                    key = (max(s.priority.value for s in subset), k, sum(s.gpus for s in subset),
                           tuple((NOW - t) for t in newest_first),  # later start: smaller age: better
                           len(ms), rank, tuple(sorted((s.namespace, s.vmi, s.admission or "") for s in subset)),
                           tuple(sorted((m.namespace, m.name, m.to_node, m.to_device.device if m.to_device else "")
                                        for m in ms)))
                    if best is None or key < best[0]:
                        best = (key, node_name, subset, d.placements[0], ms)
    return best


def moved(snap: Snapshot, moves) -> Snapshot:
    """`snap` with each move made: Bound on its target, recording its target device."""
    return snap.with_devices([replace(d, status=replace(d.status, node_name=m.to_node,
                                                        device=m.to_device or d.status.device))
                              for m in moves if (d := snap.device(*m.key)) is not None])


VALUES = st.sampled_from([0, 0, 10, 10, 100, 1000])
AGES = st.sampled_from([timedelta(minutes=m) for m in (9, 10, 30, 60, 60, 120, 120)])


@st.composite
def fleets(draw, device_mode: bool, moves: bool = False):
    """2-4 nodes (count mode: 2-6 units each; device mode: HGX boards of 8, 2-3 nodes), up to
    8 running sets filling them (random priority, start, class Never or
    LowerPriority, held devices, kept; device mode: random GPUs of the board, their claims
    sometimes allocating them), a preemptor larger than the most any node has free (of
    random priority, sometimes Never; sometimes one of its members a held device Bound where a
    unit is free), one node sometimes cordoned.
    With `moves`: idle held devices on most nodes and more room left free (P3's D-moves)."""
    n_nodes = draw(st.integers(2, 3) if device_mode else st.sampled_from([2, 2, 3, 4]))
    names = [f"n{i}" for i in range(1, n_nodes + 1)]
    cordoned = draw(st.none() | st.sampled_from(names))
    if device_mode:
        caps = {n: 8 for n in names}
        classes = [CLASS, "h100xn"]
    else:
        caps = {n: draw(st.integers(2, 6)) for n in names}
        classes = ["h100", "h100n"]
    free = {n: list(range(caps[n])) for n in names}
    sets = []
    claims: dict[str, set[str]] = {n: set() for n in names}
    limit = 8
    idle_devices = []
    for on in names:  # sometimes an idle held device or two first (D1: movable, P3's D-moves)
        for _ in range(draw(st.sampled_from([1, 1, 2] if moves else [0, 0, 0, 1, 1, 2]))):
            if not free[on]:
                break
            x = draw(st.sampled_from(free[on])) if device_mode else free[on][0]
            free[on].remove(x)
            idle_devices += idle(f"g{len(idle_devices)}-{on}", on, ns=draw(st.sampled_from(["t", "u", "p"])),
                                 cls=draw(st.sampled_from(classes[:1] * 3 + classes[1:])),
                                 index=x if device_mode else None)
    for on in names:  # fill each node, sometimes leaving a unit or two free
        while free[on] and len(sets) < limit and not draw(st.integers(0, 3 if moves else 9)) == 0:
            size = min(len(free[on]), draw(st.sampled_from([1, 1, 2, 2, 4] if device_mode else [1, 1, 2, 3])))
            held = draw(st.integers(0, min(2, size - 1))) if size > 1 else 0
            picked = draw(st.permutations(free[on]))[:size] if device_mode else free[on][:size]
            for x in picked:
                free[on].remove(x)
            if device_mode and draw(st.booleans()):
                claims[on] |= {f"gpu-vfio-{x}" for x in picked}
            i = len(sets)
            sets.append(vm_set(f"v{i}", on, size - held, held=held, ns=draw(st.sampled_from(["t", "u"])),
                               value=draw(VALUES), age=draw(AGES),
                               cls=draw(st.sampled_from(classes[:1] * 3 + classes[1:])),
                               kept=draw(st.booleans()), indices=tuple(picked) if device_mode else ()))
    most = max(len(free[n]) for n in names if n != cordoned)
    if device_mode:
        size = draw(st.sampled_from([s for s in (2, 4, 4, 8) if s > most] or [8]))
    else:
        top = max(caps[n] for n in names if n != cordoned)
        size = draw(st.sampled_from([top, top, min(most + 1, top)]))
    policy = draw(st.sampled_from([PreemptionPolicy.PREEMPT_LOWER] * 9 + [PreemptionPolicy.NEVER]))
    spare = [n for n in names if free[n]]
    held_on = None
    if spare and draw(st.integers(0, 2)) == 0:  # one member held, Bound where a unit is free
        on = draw(st.sampled_from(spare))
        held_on = (on, free[on].pop(0) if device_mode else None)
    devices, req = asking("p", size, value=draw(st.sampled_from([10, 100, 1000])), policy=policy,
                          cls=classes[0], held_on=held_on)
    if device_mode:
        nodes = [replace(dra_node(n, classes=(CLASS, "h100xn")), unschedulable=n == cordoned,
                         taken_devices=frozenset(claims[n])) for n in names]
        snap = dra_world(nodes, *sets, idle_devices, devices)
    else:
        nodes = [node(n, caps[n], cordoned=n == cordoned) for n in names]
        snap = count_world(nodes, *sets, idle_devices, devices)
    return snap, req


def check_against_brute_force(snap: Snapshot, req: Request) -> None:
    plan = plan_preemption(snap, req, NOW)
    best = brute_force(snap, req, NOW)
    note(f"plan={plan}")
    if best is None:
        assert isinstance(plan, NoPlan)
        event(f"no plan: {plan.reason.code.value}")
        return
    assert isinstance(plan, PreemptionPlan), (plan, best)
    event(f"plan of {len(plan.victims)} victims")
    key, node_name, subset, placement, moves = best
    event(f"plan of {len(plan.moves)} moves")
    assert plan.node == node_name
    assert [v.key for v in plan.victims] == sorted(v.key for v in subset)
    assert plan.moves == moves
    assert plan.placement == placement
    # every victim is eligible, none of priority >= the preemptor's
    p = request_priority(snap, req)
    assert all(_eligible(snap, v, p, NOW) and v.priority.value < p.value for v in plan.victims)
    assert all(v.node == plan.node for v in plan.victims)
    # deciding the preemptor without the victims, after the moves, places it on the plan's
    # node, plan's devices
    after = decide(moved(release_sets(snap, plan.victims), plan.moves), req)
    assert after.result is Result.SUCCEEDED and after.node == plan.node
    assert after.placements[0].devices == plan.devices and after.placements[0] == plan.placement


@PROPS
@given(fleets(device_mode=False))
def test_P3_count_mode_plan_equals_brute_force(world):
    check_against_brute_force(*world)


@PROPS
@given(fleets(device_mode=True))
def test_P3_device_mode_plan_equals_brute_force(world):
    check_against_brute_force(*world)


@PROPS
@given(fleets(device_mode=False, moves=True))
def test_P3_count_mode_plan_with_moves_equals_brute_force(world):
    check_against_brute_force(*world)


@PROPS
@given(fleets(device_mode=True, moves=True))
def test_P3_device_mode_plan_with_moves_equals_brute_force(world):
    check_against_brute_force(*world)


# --- P2 and P5: a plan that ripens reserves its node ------------------------------------------


def test_P2_P5_a_head_whose_victims_are_only_too_young_reserves_their_node_so_nothing_backfills():
    """bench contention's on-demand p99: an 8-GPU on-demand set waited on n1 for its young
    spot victims; a 1-GPU spot set backfilled n1's last GPU meanwhile and, young in turn, put
    the start off by a whole minRuntime. The head now reserves n1 at once (not after
    line.reserveAfter): the backfill is refused `node_reserved`; the reservation is no plan,
    nothing is stopped before the victims come of age, and then P3 nominates them."""
    from model.line import Allowed, Identity, Line, LineSettings, Shape, entry, may_place, reservation
    from model.line_plan import ripening_reservations
    from model.nominate import NominationSettings, ripening_node

    young = vm_set("young", "n1", 7, age=timedelta(minutes=3))
    old = vm_set("old", "n2", 8, age=timedelta(minutes=3))
    snap = count_world([node("n1", 8), node("n2", 8)], young, old)
    settings = NominationSettings()  # minRuntime 10 minutes
    head = entry(Identity("p", "big"), Shape((), (("h100", 8),)), prio(1000), NOW)
    line = Line([head])
    assert reservation(line, snap, NOW, LineSettings()) == {}  # not waited long: none of its own
    templates = [(f"big-h100-{i}", "h100") for i in range(8)]
    assert ripening_node(snap, "p", "big", [], templates, prio(1000), NOW, settings) == "n1"
    reserved = ripening_reservations(line, snap, NOW, settings, {})
    assert reserved == {head.identity: "n1"}  # n1: one young set of 7 frees it (n2: 8 as young)
    devices, req = asking("small", 1, ns="t", value=0)
    small = count_world([node("n1", 8), node("n2", 8)], young, old, devices)
    d = decide(small, req)
    assert d.result is Result.SUCCEEDED and d.node == "n1"
    verdict = may_place(line, small, req, d.placements[0], reservations=reserved)
    assert verdict.reason().code is Code.NODE_RESERVED
    assert isinstance(may_place(line, small, req, d.placements[0], reservations={}), Allowed)  # was: backfill
    # nothing ripens for a preemptor that may not preempt, or with nominating off
    never = entry(Identity("p", "big"), Shape((), (("h100", 8),)), prio(1000, PreemptionPolicy.NEVER), NOW)
    assert ripening_reservations(Line([never]), snap, NOW, settings, {}) == {}
    assert ripening_reservations(line, snap, NOW, replace(settings, enabled=False), {}) == {}
    # a node another head holds already is left to it
    other = Identity("q", "first")
    assert ripening_reservations(line, snap, NOW, settings, {other: "n1"}) == {other: "n1"}
