"""Table tests of `model.decide`, one per rule of docs/contract.md §3 (B1–B6) and per B5 case, with
the decision's outcome asserted as a typed value (`model.reasons`: codes and data; the wording
is `tests/model/test_reasons.py`'s). The model builders are `tests.support.world`'s."""

from __future__ import annotations

from datetime import timedelta

import pytest

from model.decide import MESSAGE_NODES, Move, Placement, Request, apply_decision, decide
from model.requests import find_requests
from model.hold import Hold
from model.reasons import (AlreadyPlaced, BudgetExhausted, ClassesNotServed, ClassNotFound, Code,
                           Cordoned, DeviceAt, DeviceNotFound, KeptCordoned, LostCapacity, NodeGone,
                           NodeProblems, NoEligibleNode, NoNodeServes, NoRoom, NotEntitled, Placed,
                           RequestRef, SelectorMismatch, SetRefused)
from model.snapshot import Snapshot
from model.types import Budget, LabelSelector, Namespace, Result
from tests.support.world import H, L, NOW, NS, dev, gpu_class, node, world


def req(*names: str, rid: str = "r1", ns: str = NS, selector: dict | None = None) -> Request:
    return Request(rid, ns, "vm-1", names, tuple(sorted((selector or {}).items())))


R1 = RequestRef(NS, "vm-1", "r1")


def refused(devices, *reasons, request=R1) -> SetRefused:
    """The binder's refusal of `req(...)` (rid r1): devices as (name, node | None | "?"
    for not found), then the reasons."""
    return SetRefused(tuple(DeviceAt(n, found=False) if at == "?" else DeviceAt(n, at)
                            for n, at in devices), reasons, request)


def nodes(*lines) -> NoEligibleNode:
    """NoEligibleNode of (node, problem, ...) lines, every node shown."""
    return NoEligibleNode(tuple(NodeProblems(n, tuple(ps)) for n, *ps in lines))


def placement_of(snap: Snapshot) -> dict:
    return {k: d.bound_node for k, d in snap.devices.items()}


# --- B1 gather-or-refuse ------------------------------------------------------------------


def test_B1_gathers_held_and_pending_devices_onto_one_node():
    s = world([node("node-1", 1), node("node-2", 4)], [dev("gpu-a", "node-1"), dev("gpu-b")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.result, d.rule, d.node) == (Result.SUCCEEDED, "B1", "node-2")
    assert d.placements == (Placement(
        "node-2",
        (Move((NS, "gpu-a"), "node-1", "node-2"), Move((NS, "gpu-b"), None, "node-2")),
        ((H, 2),), ((H, 1),)),)
    assert d.outcome == Placed(R1, "node-2", ("gpu-b",), (("gpu-a", "node-1"),)) and d.reason is None
    after = apply_decision(s, req("gpu-a", "gpu-b"), d, now=NOW)
    assert {k: v for k, v in placement_of(after).items()} == {(NS, "gpu-a"): "node-2", (NS, "gpu-b"): "node-2"}
    assert all(x.status.bind_request.result is Result.SUCCEEDED for x in after.devices.values())
    assert after.used("node-2", H) == 2 and after.used("node-1", H) == 0


def test_B1_refusal_names_every_device_and_why_each_candidate_node_failed():
    classes = [gpu_class(selector={"gpu": "h100"})]
    s = world([node("node-1", 4, cordoned=True, gpu="h100"), node("node-2", 2, gpu="h100"), node("node-3", 4)],
              [dev("gpu-a", "node-1"), dev("gpu-b"), dev("other", "node-2", ns="tenant-b")], classes)
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.result, d.rule, d.node, d.placements) == (Result.REFUSED, "refused", None, ())
    assert d.reason == refused([("gpu-a", "node-1"), ("gpu-b", None)], nodes(
        ("node-1", Cordoned()), ("node-2", NoRoom(H, needs=2, free=1)),
        ("node-3", ClassesNotServed(("h100",)))))
    assert d.reason.code is Code.NO_ELIGIBLE_NODE


def test_B1_refused_changes_no_placement_only_results():
    s = world([node("node-1", 1)], [dev("gpu-a", "node-1"), dev("gpu-b")])
    r = req("gpu-a", "gpu-b")
    d = decide(s, r)
    assert d.result is Result.REFUSED
    assert d.reason == refused([("gpu-a", "node-1"), ("gpu-b", None)],
                               nodes(("node-1", NoRoom(H, needs=1, free=0))))
    after = apply_decision(s, r, d, now=NOW)
    assert placement_of(after) == placement_of(s)
    for x in after.devices.values():
        assert x.status.bind_request.result is Result.REFUSED
        assert x.status.bind_request.message == d.message and x.status.bind_request.node is None


def test_B1_budget_exhausted_refuses_whole_request():
    s = world([node("node-1", 8)], [dev("held-1", "node-1"), dev("held-2", "node-1"), dev("gpu-a")],
              budgets=[Budget(NS, H, 3), Budget(NS, H, 2)])
    d = decide(s, req("gpu-a"))
    assert d.reason == refused([("gpu-a", None)], BudgetExhausted(NS, H, bound=2, budget=2, adds=1))


def test_B1_budget_counts_reservations_but_moves_add_nothing():
    s = world([node("node-1", 8, cordoned=True), node("node-2", 8)],
              [dev("held-1", "node-1"), dev("gpu-a")], budgets=[Budget(NS, H, 2)],
              reservations=[Hold("other", NS, "node-2", ((H, 1),), ((H, 1),))])
    assert decide(s, req("gpu-a")).result is Result.REFUSED
    moved = decide(s, req("held-1"))  # over nothing: a move does not add usage
    assert (moved.result, moved.node) == (Result.SUCCEEDED, "node-2")


def test_B1_not_entitled_refuses_whole_request():
    classes = [gpu_class(), gpu_class("l40s", L, tenants=LabelSelector((("tier", "gold"),)))]
    s = world([node("node-1", 4, 4)], [dev("gpu-a"), dev("gpu-b", cls="l40s")], classes,
              namespaces=[Namespace(NS, (("tier", "silver"),))])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert d.reason == refused([("gpu-a", None), ("gpu-b", None)], NotEntitled(NS, "l40s"))


def test_B1_missing_device_and_missing_class_refuse():
    s = world([node("node-1", 4)], [dev("gpu-a", cls="a100")])
    d = decide(s, req("gpu-a", "gpu-x"))
    assert d.reason == refused([("gpu-a", None), ("gpu-x", "?")], DeviceNotFound("gpu-x"),
                               ClassNotFound("a100"))


def test_B1_refusal_message_is_bounded_on_a_large_fleet():
    nodes = [node(f"node-{i:04d}", 1) for i in range(5000)]
    s = world(nodes, [dev("gpu-a"), dev("gpu-b")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert d.result is Result.REFUSED
    [per_node] = d.reason.reasons
    assert len(per_node.nodes) == MESSAGE_NODES and per_node.more == 4990
    assert per_node.nodes[0] == NodeProblems("node-0000", (NoRoom(H, needs=2, free=1),))
    assert len(d.message) < 2000


def test_B1_no_node_serves_class():
    s = world([node("node-1", 0, 4)], [dev("gpu-a")])
    assert decide(s, req("gpu-a")).reason == refused([("gpu-a", None)], NoNodeServes(("h100",)))


# --- B2 single decision loop (the model's part: the ledger it judges against) -------------


def test_B2_two_requests_racing_for_one_unit_cannot_both_win():
    s = world([node("node-1", 1)], [dev("gpu-a"), dev("gpu-b")])
    first = decide(s, req("gpu-a", rid="r1"))
    s = apply_decision(s, req("gpu-a", rid="r1"), first, now=NOW)
    second = decide(s, req("gpu-b", rid="r2"))
    assert (first.result, second.result) == (Result.SUCCEEDED, Result.REFUSED)


def test_B2_a_reservation_in_flight_holds_the_unit_and_the_budget_slot():
    s = world([node("node-1", 2)], [dev("gpu-a"), dev("gpu-b")], budgets=[Budget(NS, H, 1)])
    first = decide(s, req("gpu-a", rid="r1"))
    p = first.placements[0]
    held = s.with_reservation(Hold("r1", NS, p.node, p.needs, p.budget_needs))
    assert decide(held, req("gpu-b", rid="r2")).reason.reasons == (
        BudgetExhausted(NS, H, bound=0, budget=1, adds=1, reserved=1),)
    assert decide(held.without_reservation("r1"), req("gpu-b", rid="r2")).result is Result.SUCCEEDED


def test_decide_rejects_a_limit_below_one():
    with pytest.raises(ValueError):
        decide(world([node("node-1", 1)], [dev("gpu-a")]), req("gpu-a"), limit=0)


# --- B3 eligible node ---------------------------------------------------------------------


@pytest.mark.parametrize("bad, why", [
    (node("node-1", 4, cordoned=True, zone="a"), nodes(("node-1", Cordoned()))),
    (node("node-1", 4, zone="b"), nodes(("node-1", SelectorMismatch((("zone", "a"),))))),
    (node("node-1", 1, zone="a"), nodes(("node-1", NoRoom(H, needs=2, free=1)))),
    # does not advertise H100: not a candidate at all
    (node("node-1", 0, 4, zone="a"), NoNodeServes(("h100",))),
])
def test_B3_ineligible_node_is_not_chosen(bad, why):
    s = world([bad], [dev("gpu-a"), dev("gpu-b")])
    d = decide(s, req("gpu-a", "gpu-b", selector={"zone": "a"}))
    assert d.result is Result.REFUSED
    assert d.reason.reasons == (why,)


def test_B3_counts_reservations_in_flight():
    s = world([node("node-1", 2), node("node-2", 4)], [dev("gpu-a"), dev("gpu-b")],
              reservations=[Hold("other", "tenant-b", "node-2", ((H, 3),))])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert d.node == "node-1" and [p.node for p in d.placements] == ["node-1"]
    # the request's own reservation is not held against it
    own = s.with_reservation(Hold("r1", NS, "node-1", ((H, 2),), ((H, 2),)))
    assert decide(own, req("gpu-a", "gpu-b")).node == "node-1"


def test_B3_node_class_selector_decides_serving():
    classes = [gpu_class(selector={"gpu": "h100"})]
    s = world([node("node-1", 4), node("node-2", 4, gpu="h100")], [dev("gpu-a")], classes)
    assert decide(s, req("gpu-a")).node == "node-2"


# --- B4 choice ------------------------------------------------------------------------------


def test_B4_fewest_moves_first():
    s = world([node("node-1", 8), node("node-2", 2), node("node-3", 3)],
              [dev("gpu-a", "node-3"), dev("gpu-b", "node-3"), dev("gpu-c", "node-1")])
    d = decide(s, req("gpu-a", "gpu-b", "gpu-c"))
    assert [p.node for p in d.placements] == ["node-3", "node-1"]
    assert d.placements[0].moves == (Move((NS, "gpu-c"), "node-1", "node-3"),)
    assert d.placements[0].needs == ((H, 1),) and d.placements[0].budget_needs == ()


def test_B4_tightest_fit_then_name():
    s = world([node("node-d", 8), node("node-c", 3), node("node-b", 2), node("node-a", 2), node("node-e", 1)],
              [dev("gpu-a"), dev("gpu-b")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert [p.node for p in d.placements] == ["node-a", "node-b", "node-c", "node-d"]
    assert decide(s, req("gpu-a", "gpu-b"), limit=2).placements[1].node == "node-b"


def test_B4_tightest_fit_sums_the_sets_resources():
    classes = [gpu_class(), gpu_class("l40s", L)]
    s = world([node("node-1", 2, 8), node("node-2", 4, 1), node("node-3", 3, 3)],
              [dev("gpu-a"), dev("gpu-b", cls="l40s")], classes)
    assert [p.node for p in decide(s, req("gpu-a", "gpu-b")).placements] == ["node-2", "node-3", "node-1"]


# --- B5 cordon exceptions ----------------------------------------------------------------


def test_B5a_move_cordon_only_problem_no_room_elsewhere_succeeds_in_place():
    s = world([node("node-1", 2, cordoned=True), node("node-2", 1)],
              [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.result, d.rule, d.node) == (Result.SUCCEEDED, "B5a", "node-1")
    assert d.placements == (Placement("node-1", (), (), ()),)
    assert d.outcome == KeptCordoned(R1, "node-1", "B5a")
    assert placement_of(apply_decision(s, req("gpu-a", "gpu-b"), d, now=NOW)) == placement_of(s)


def test_B5a_move_cordon_with_room_elsewhere_moves():
    s = world([node("node-1", 2, cordoned=True), node("node-2", 2)],
              [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.result, d.rule, d.node) == (Result.SUCCEEDED, "B1", "node-2")
    assert len(d.placements[0].moves) == 2


def test_B5a_move_cordon_plus_lost_capacity_is_treated_normally():
    s = world([node("node-1", 1, cordoned=True), node("node-2", 1)],
              [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert d.reason == refused([("gpu-a", "node-1"), ("gpu-b", "node-1")], nodes(
        ("node-1", Cordoned(), LostCapacity(H, bound=2, foreign=0, allocatable=1)),
        ("node-2", NoRoom(H, needs=2, free=1))))


def test_B5a_move_cordon_plus_no_longer_serving_is_treated_normally():
    classes = [gpu_class(selector={"gpu": "h100"})]
    s = world([node("node-1", 2, cordoned=True), node("node-2", 2, gpu="h100")],
              [dev("gpu-a", "node-1")], classes)
    assert decide(s, req("gpu-a")).node == "node-2"
    s2 = world([node("node-1", 2, cordoned=True)], [dev("gpu-a", "node-1")], classes)
    assert decide(s2, req("gpu-a")).reason.reasons == (
        nodes(("node-1", Cordoned(), ClassesNotServed(("h100",)))),)


def test_B5_pending_template_member_disables_the_exception():
    s = world([node("node-1", 2, cordoned=True)], [dev("gpu-a", "node-1"), dev("tpl-1")])
    assert decide(s, req("gpu-a", "tpl-1")).result is Result.REFUSED


def test_B5b_stay_succeeds_in_place_even_with_room_elsewhere():
    classes = [gpu_class(), gpu_class("h100-stay", stay=True)]
    s = world([node("node-1", 2, cordoned=True), node("node-2", 8)],
              [dev("gpu-a", "node-1"), dev("gpu-b", "node-1", cls="h100-stay")], classes)
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.result, d.rule, d.node, d.placements) == (Result.SUCCEEDED, "B5b", "node-1", (Placement("node-1", (), (), ()),))
    assert d.outcome == KeptCordoned(R1, "node-1", "B5b", ("h100-stay",))


def test_B5b_stay_with_lost_capacity_is_treated_normally():
    classes = [gpu_class(stay=True)]
    s = world([node("node-1", 1, cordoned=True), node("node-2", 2)],
              [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")], classes)
    assert (decide(s, req("gpu-a", "gpu-b")).rule, decide(s, req("gpu-a", "gpu-b")).node) == ("B1", "node-2")
    s2 = world([node("node-1", 1, cordoned=True)], [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")], classes)
    assert decide(s2, req("gpu-a", "gpu-b")).result is Result.REFUSED


def test_B5b_stay_with_node_gone_is_treated_normally():
    classes = [gpu_class(stay=True)]
    s = world([node("node-2", 2)], [dev("gpu-a", "node-1")], classes)
    d = decide(s, req("gpu-a"))
    assert (d.rule, d.node, d.placements[0].moves) == ("B1", "node-2", (Move((NS, "gpu-a"), "node-1", "node-2"),))
    gone = decide(world([], [dev("gpu-a", "node-1")], classes), req("gpu-a"))
    assert gone.reason == refused([("gpu-a", "node-1")], nodes(("node-1", NodeGone())))


def test_B5b_stay_node_no_longer_serving_is_treated_normally():
    classes = [gpu_class(stay=True, selector={"gpu": "h100"})]
    s = world([node("node-1", 2, cordoned=True), node("node-2", 2, gpu="h100")], [dev("gpu-a", "node-1")], classes)
    assert (decide(s, req("gpu-a")).rule, decide(s, req("gpu-a")).node) == ("B1", "node-2")


def test_B5b_stay_node_not_matching_request_selector_is_treated_normally():
    classes = [gpu_class(stay=True)]
    s = world([node("node-1", 2, cordoned=True, zone="a"), node("node-2", 2, zone="b")],
              [dev("gpu-a", "node-1")], classes)
    assert decide(s, req("gpu-a", selector={"zone": "b"})).node == "node-2"


# --- B6 already placed ---------------------------------------------------------------------


def test_B6_already_placed_succeeds_with_no_write_to_placement():
    s = world([node("node-1", 2), node("node-2", 8)], [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.result, d.rule, d.node, d.placements) == (Result.SUCCEEDED, "B6", "node-1", (Placement("node-1", (), (), ()),))
    assert d.outcome == AlreadyPlaced(R1, "node-1")
    assert placement_of(apply_decision(s, req("gpu-a", "gpu-b"), d, now=NOW)) == placement_of(s)


def test_B6_not_on_lost_capacity():
    s = world([node("node-1", 1), node("node-2", 8)], [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.rule, d.node) == ("B1", "node-2")


# --- requests -------------------------------------------------------------------------------


def test_find_requests_complete_partial_and_done():
    t0 = NOW
    devices = [
        dev("a1", rid="ra", devices=("a1", "a2"), at=t0 + timedelta(seconds=5)),
        dev("a2", rid="ra", devices=("a1", "a2"), at=t0 + timedelta(seconds=5)),
        dev("b1", rid="rb", devices=("b1",), at=t0),
        dev("c1", rid="rc", devices=("c1", "c2")),  # c2 lacks the id: partial
        dev("c2"),
        dev("d1", rid="rd", devices=("d1",), result=Result.SUCCEEDED),  # done
        dev("e1", rid="re", devices=("e1", "e1")),  # duplicate listing: partial
        dev("f1", rid="rf", devices=("f1",), ns="tenant-b"),
    ]
    complete, partial = find_requests(devices)
    assert [(r.id, r.devices) for r in complete] == [("rb", ("b1",)), ("ra", ("a1", "a2")), ("rf", ("f1",))]
    assert complete[0].requested_at == t0 and complete[2].namespace == "tenant-b"
    assert partial == ["rc", "re"]
