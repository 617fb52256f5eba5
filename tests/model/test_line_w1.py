"""P5 for a bare VMI refused at W1 (docs/contract.md §3c P5, `model.line_plan.w1_entry`) and
the line's bound per namespace (`line.maxPerNamespace`: `LineSettings.per_namespace`,
`Line.refused(limit)`, `Line.capped`, `refresh(limit)`, `gate_batch`).

W1 refuses a set for room before any bindRequest is written, so before the coordinator sees
it: the webhook hands the leader's line the entry `w1_entry` makes, only for a refusal for
room (never budget, entitlement, a class problem, bad input or a size no node has) of a VMI
with no VirtualMachine owner. A hostile tenant can make any number of sets refused for room:
its namespace keeps at most `per_namespace` entries, its first in line order, and other
tenants' places are untouched."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from model.admission import AdmissionPlan, Refusal, check
from model.housekeeping import VMIs
from model.line import DEFAULT_PER_NAMESPACE, Identity, Line, LineSettings, Shape, entry
from model.line_plan import gate_batch, refresh, w1_entry
from model.parse import VMIAsk
from model.plan import Answer, plan_batch
from model.priority import Priority
from model.reasons import Code
from model.types import Budget
from tests.support.world import H, dev, gpu_class, node, world

T0 = datetime(2026, 12, 6, 10, tzinfo=timezone.utc)
ON_DEMAND = Priority(1000, class_name="on-demand")
SPOT = Priority(0, class_name="spot")
GRACE = timedelta(minutes=2)


def waiting(vmi: str, ns: str = "t1", *, at: int = 0, priority: Priority = SPOT, n: int = 1):
    return entry(Identity(ns, vmi), Shape((), (("h100", n),)), priority, T0 + timedelta(seconds=at))


def w1(snap, vmi: str, n: int, ns: str = "t1") -> Refusal | AdmissionPlan:
    """W1's judgement (`model.admission.check`) of bare VMI `ns/vmi` asking `n` new h100."""
    return check(snap, ns, vmi, VMIAsk((), (("h100", n),)), VMIs(), T0, GRACE)


def full_node(units: int = 8, busy: int = 1, **kw):
    """Node n1 with `units` H100, `busy` of them Bound to tenant o's devices."""
    return world([node("n1", h=units)], [dev(f"busy-{i}", "n1", ns="o") for i in range(busy)], **kw)


# --- which W1 refusals make an entry -------------------------------------------------------------


def test_P5_a_bare_vmi_W1_refuses_for_room_makes_its_entry_with_its_priority_and_first_refusal():
    snap = full_node(8, busy=1)
    refusal = w1(snap, "big", 8)
    assert isinstance(refusal, Refusal)
    got = w1_entry(snap, "t1", "big", VMIAsk((), (("h100", 8),)), refusal.reason, ON_DEMAND, T0)
    assert got is not None
    assert got.identity == Identity("t1", "big") and got.identity.vm_uid is None
    assert got.shape.templates == (("h100", 8),) and got.shape.classes == ("h100",)
    assert (got.priority, got.first_refused, got.last_seen) == (ON_DEMAND, T0, T0)


def test_P5_a_vm_s_vmi_makes_none_at_W1_the_waiting_vm_loop_places_it():
    snap = full_node(8, busy=1)
    refusal = w1(snap, "big", 8)
    assert isinstance(refusal, Refusal)
    assert w1_entry(snap, "t1", "big", VMIAsk((), (("h100", 8),)), refusal.reason, ON_DEMAND, T0,
                    owner="vm-uid") is None


@pytest.mark.parametrize("why", ["budget", "size no node has", "class not found", "held device missing"])
def test_P5_a_W1_refusal_for_anything_but_room_makes_no_entry(why):
    ask = VMIAsk((), (("h100", 2),))
    if why == "budget":
        snap = full_node(8, busy=0, budgets=[Budget("t1", H, 1)])
    elif why == "size no node has":
        snap, ask = full_node(8, busy=0), VMIAsk((), (("h100", 9),))
    elif why == "class not found":
        snap, ask = full_node(8, busy=0), VMIAsk((), (("a100", 1),))
    else:
        snap, ask = full_node(8, busy=8), VMIAsk(("gone",), ())
    refusal = check(snap, "t1", "x", ask, VMIs(), T0, GRACE)
    assert isinstance(refusal, Refusal), why
    assert w1_entry(snap, "t1", "x", ask, refusal.reason, ON_DEMAND, T0) is None, (why, refusal.code)


# --- the bound per namespace ---------------------------------------------------------------------


def test_P5_the_per_namespace_bound_is_a_setting_of_at_least_1_with_a_sane_default():
    assert LineSettings().per_namespace == DEFAULT_PER_NAMESPACE == 100
    assert LineSettings(per_namespace=1).per_namespace == 1
    with pytest.raises(ValueError, match="line.maxPerNamespace must be at least 1, got 0"):
        LineSettings(per_namespace=0)


def test_P5_a_tenant_past_its_bound_gets_no_new_place_and_the_line_is_unchanged():
    line = Line([waiting("a", at=0), waiting("b", at=1), waiting("o", ns="t2", at=2)])
    more = line.refused(waiting("c", at=3), T0 + timedelta(seconds=3), limit=2)
    assert more is line  # t1 has its 2: the third waits nowhere
    # a refusal again of one already there keeps its place (and refreshes it)
    again = line.refused(waiting("a", at=9), T0 + timedelta(seconds=9), limit=2)
    assert [e.identity.vmi for e in again] == ["a", "b", "o"]
    assert again.find(Identity("t1", "a")).first_refused == T0
    assert again.find(Identity("t1", "a")).last_seen == T0 + timedelta(seconds=9)
    # another tenant is not bounded by t1's entries
    other = line.refused(waiting("p", ns="t2", at=4), T0 + timedelta(seconds=4), limit=2)
    assert [e.identity.vmi for e in other] == ["a", "b", "o", "p"]


def test_P5_a_tenant_s_set_ahead_of_its_others_takes_the_place_of_its_last():
    line = Line([waiting("a", at=0), waiting("b", at=1), waiting("o", ns="t2", at=2)])
    got = line.refused(waiting("vip", at=5, priority=ON_DEMAND), T0 + timedelta(seconds=5), limit=2)
    assert [e.identity.vmi for e in got] == ["vip", "a", "o"]  # t1 keeps its first 2 in line order


def test_P5_capped_keeps_each_namespace_s_first_entries_in_line_order():
    line = Line([waiting(f"v{i}", at=i) for i in range(5)] + [waiting(f"w{i}", ns="t2", at=i) for i in range(3)])
    assert line.capped(5) is line
    got = line.capped(2)
    assert [e.identity.key for e in got] == [("t1", "v0"), ("t2", "w0"), ("t1", "v1"), ("t2", "w1")]
    assert [e.identity.vmi for e in line.capped(2, ["t2"])] == ["v0", "w0", "v1", "w1", "v2", "v3", "v4"]
    with pytest.raises(ValueError):
        line.capped(0)


def test_P5_refresh_bounds_the_namespaces_it_adds_to():
    line = Line([waiting("a", at=0), waiting("o", ns="t2", at=0), waiting("p", ns="t2", at=1)])
    vms = [entry(Identity("t1", f"vm{i}", f"uid-{i}"), Shape((), (("h100", 1),)), SPOT,
                 T0 + timedelta(seconds=10 + i)) for i in range(3)]
    got = refresh(line, vms, (), T0 + timedelta(seconds=20), limit=2)
    assert [e.identity.vmi for e in got] == ["a", "o", "p", "vm0"]  # t2 (not added to) untouched
    assert refresh(line, vms, (), T0 + timedelta(seconds=20)).entries[-1].identity.vmi == "vm2"  # no limit


def test_P5_the_binder_s_refusals_for_room_are_bounded_per_namespace_too():
    """The set refused for room by the binder (a follower's webhook sends a bare VMI refused
    at W1 on to the binder) enters only while its namespace is under the bound."""
    snap = world([node("n1", h=2)], [dev("busy-0", "n1", ns="o"), dev("busy-1", "n1", ns="o"),
                                     dev("x-0", None, ns="t1", rid="r-x")])
    line = Line([waiting("a", at=0), waiting("b", at=1)])
    fresh = [("t1", "r-x", [snap.device("t1", "x-0")])]
    actions, _ = plan_batch(snap, [], fresh)
    assert isinstance(actions[0], Answer)
    now = T0 + timedelta(seconds=30)
    assert gate_batch(line, snap, [], actions, now, settings=LineSettings(per_namespace=2)).line == line
    grown = gate_batch(line, snap, [], actions, now, settings=LineSettings(per_namespace=3)).line
    assert len(grown) == 3


def test_P5_a_set_larger_than_every_node_that_could_take_it_never_waits_though_W1_words_it_per_node():
    """Two nodes of 1 H100 each, a set of 2: W1 words its refusal per node ("needs 2, has 1
    free", which `waits_for_room` reads as room) but no node could ever take it, so it gets no
    place (its answer stays W1's 403: retrying would never help). With one unit free on a
    2-unit node it waits. Before: it entered the line."""
    snap = world([node("a", h=1), node("b", h=1)])
    refusal = w1(snap, "two", 2)
    assert isinstance(refusal, Refusal) and "has 1 free" in refusal.reason.render()
    assert w1_entry(snap, "t1", "two", VMIAsk((), (("h100", 2),)), refusal.reason, SPOT, T0) is None
    snap = world([node("a", h=2), node("b", h=1)], [dev("busy-0", "a", ns="o")])
    refusal = w1(snap, "two", 2)
    assert isinstance(refusal, Refusal)
    assert w1_entry(snap, "t1", "two", VMIAsk((), (("h100", 2),)), refusal.reason, SPOT, T0) is not None
