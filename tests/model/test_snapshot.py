"""`model.snapshot`: counting, entitlement, reservations, the copy-on-write index, and
`check_order`/`check_set` (W1), with refusal reasons asserted as typed values (their
wording is `tests/model/test_reasons.py`'s)."""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from model.check import check_set
from model.hold import Hold
from model.reasons import (BudgetExhausted, ClassNotFound, DeviceAt, DeviceListedTwice, DeviceNotFound,
                           NodeProblems, NoDevices, NoEligibleNode, NoFreeUnit, NoRoom, NotEntitled,
                           SetRefused, WrongNamespace)
from model.snapshot import Order, Reserving, Snapshot, Verdict
from model.types import Budget, LabelSelector, Namespace, SelectorRequirement
from tests.support.world import H, L, NS, dev, gpu_class, node, world


def test_counting_used_reserved_free_and_lost_capacity():
    s = world([node("node-1", 2), node("node-2", 4)],
              [dev("a", "node-1"), dev("b", "node-1"), dev("c", "node-1"), dev("d"), dev("x", "node-2", cls="nope")],
              reservations=[Hold("r9", NS, "node-2", ((H, 3),), ((H, 2),))])
    assert (s.used("node-1", H), s.free("node-1", H), s.lost_capacity("node-1", H)) == (3, -1, True)
    assert (s.used("node-2", H), s.reserved("node-2", H), s.free("node-2", H)) == (0, 3, 1)
    assert s.free("gone", H) == 0 and s.allocatable("node-2", L) == 0
    assert s.tenant_usage(NS, H) == 5
    assert s.free_buckets(H) == {-1: ("node-1",), 1: ("node-2",)}


def test_budget_smallest_quota_and_reservations_count_once_per_request():
    s = world([node("n1", 4), node("n2", 4)], [], budgets=[Budget(NS, H, 5), Budget(NS, H, 3)],
              reservations=[Hold("r1", NS, "n1", ((H, 2),), ((H, 2),)),
                            Hold("r1", NS, "n2", ((H, 2),), ((H, 2),))])
    assert s.budget_of(NS, H) == 3 and s.budget_of(NS, L) is None and s.budget_of("other", H) is None
    assert s.tenant_usage(NS, H) == 2
    assert s.reserved("n1", H) == 2 and s.reserved("n2", H) == 2
    assert s.without_reservation("r1").tenant_usage(NS, H) == 0
    assert s.without_reservation("nope") is s
    again = s.with_reservation(Hold("r1", NS, "n1", ((H, 1),), ((H, 1),)))
    assert again.reserved("n1", H) == 1 and len(again.reservations) == 2


def test_entitlement_and_serving():
    gold = LabelSelector((("tier", "gold"),), (SelectorRequirement("env", "NotIn", ("dev",)),))
    classes = [gpu_class("h100", selector={"gpu": "h100"}, tenants=gold), gpu_class("open")]
    s = world([node("n1", 1, gpu="h100"), node("n2", 1), node("n3", 0, 1, gpu="h100")], [], classes,
              namespaces=[Namespace("gold", (("tier", "gold"),)), Namespace("golddev", (("tier", "gold"), ("env", "dev")))])
    assert s.entitled("gold", "h100") and not s.entitled("golddev", "h100")
    assert not s.entitled("unknown-ns", "h100") and s.entitled("unknown-ns", "open")
    assert not s.entitled("gold", "missing")
    assert s.serves("n1", "h100") and not s.serves("n2", "h100") and not s.serves("n3", "h100")
    assert s.serves("n2", "open") and not s.serves("gone", "open")


def test_index_is_copy_on_write():
    base = world([node("n1", 2), node("n2", 2)], [dev("a")])
    assert base.free("n1", H) == 2  # builds the index
    moved = base.with_device(dev("a", "n1"))
    assert (moved.used("n1", H), moved.free_buckets(H)) == (1, {1: ("n1",), 2: ("n2",)})
    assert (base.used("n1", H), base.free_buckets(H)) == (0, {2: ("n1", "n2")})
    assert base.device(NS, "a").bound_node is None and moved.devices[(NS, "a")].bound_node == "n1"
    gone = moved.without_device(NS, "a")
    assert gone.free_buckets(H) == {2: ("n1", "n2")} and (NS, "a") not in gone.devices
    assert len(moved.devices) == 1 and list(moved.devices) == [(NS, "a")]


# --- W1 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("order, verdict", [
    (Order(NS, "h100", "gpu-x"), Verdict(False, DeviceNotFound("gpu-x"))),
    (Order(NS, "a100"), Verdict(False, ClassNotFound("a100"))),
    (Order(NS, "l40s"), Verdict(False, NotEntitled(NS, "l40s"))),
    (Order(NS, "h100"), Verdict(False, BudgetExhausted(NS, H, bound=2, budget=2, adds=1))),
    (Order(NS, "", "held"), Verdict(True, node="n1")),      # Bound in place: no budget needed
    (Order(NS, "h100", "stray"), Verdict(True, node="n2")),  # Bound on a node that lost capacity: moves
])
def test_W1_check_order(order, verdict):
    classes = [gpu_class(), gpu_class("l40s", L, tenants=LabelSelector((("tier", "gold"),)))]
    s = world([node("n1", 1, 4, cordoned=True), node("n2", 3), node("n3", 1, cordoned=True)],
              [dev("held", "n1"), dev("stray", "n3"), dev("spare", "n3", ns="tenant-b")], classes,
              budgets=[Budget(NS, H, 2)])
    assert s.check_order(order) == verdict


def test_W1_check_order_no_room():
    s = world([node("n1", 1, cordoned=True), node("n2", 1)], [dev("x", "n2", ns="other")])
    assert s.check_order(Order(NS, "h100")) == Verdict(False, NoFreeUnit("h100", H))


def test_W1_check_set_adds_each_admitted_device_before_the_next():
    s = world([node("n1", 2), node("n2", 1)], [dev("held", "n2")], budgets=[Budget(NS, H, 3)])
    assert check_set(s, NS, [Order(NS, "h100"), Order(NS, "h100")]) == Verdict(True, node="n1")
    assert check_set(s, NS, [Order(NS, "h100")] * 3) == Verdict(  # the set's numbers (as B1)
        False, BudgetExhausted(NS, H, bound=1, budget=3, adds=3))


def test_W1_check_set_requires_one_node_for_the_whole_set():
    s = world([node("n1", 1), node("n2", 1)], [])
    v = check_set(s, NS, [Order(NS, "h100"), Order(NS, "h100")])
    short = (NoRoom(H, needs=2, free=1),)
    assert v == Verdict(False, SetRefused(  # the binder's refusal, without the request
        (DeviceAt("new h100 #1"), DeviceAt("new h100 #2")),
        (NoEligibleNode((NodeProblems("n1", short), NodeProblems("n2", short))),)))


def test_W1_check_set_held_on_cordoned_node_follows_B5():
    s = world([node("n1", 2, cordoned=True)], [dev("a", "n1"), dev("b", "n1")])
    assert check_set(s, NS, [Order(NS, "", "a"), Order(NS, "", "b")]) == Verdict(True, node="n1")
    assert check_set(s, NS, [Order(NS, "", "a"), Order(NS, "h100")]).admitted is False


def test_W1_check_set_rejects_duplicates_and_foreign_orders():
    s = world([node("n1", 2)], [dev("a")])
    assert check_set(s, NS, [Order(NS, "", "a"), Order(NS, "", "a")]) == Verdict(False, DeviceListedTwice("a"))
    assert check_set(s, NS, [Order("other", "h100")]) == Verdict(False, WrongNamespace("other", NS))
    assert check_set(s, NS, []) == Verdict(False, NoDevices(asked=True))


def test_snapshot_views_are_read_only():
    s = world([node("n1", 1)], [dev("a")])
    with pytest.raises(TypeError):
        s.nodes["n2"] = node("n2")  # type: ignore[index]
    with pytest.raises(TypeError):
        s.devices_in(NS)["b"] = dev("b")  # type: ignore[index]
    assert isinstance(Snapshot.build(), Snapshot) and len(Snapshot.build().devices) == 0


def test_with_nodes_replaces_the_fleet_and_keeps_the_rest():
    s = world([node("n1", 2), node("n2", 2)], [dev("a", "n1")], budgets=[Budget(NS, H, 1)],
              reservations=[Hold("r", NS, "n2", ((H, 1),))])
    assert s.free("n2", H) == 1
    t = s.with_nodes([node("n1", 1, cordoned=True), node("n3", 4)])
    assert set(t.nodes) == {"n1", "n3"} and t.cordoned_nodes() == {"n1"}
    assert (t.free("n1", H), t.free("n2", H), t.budget_of(NS, H), t.reserved("n2", H)) == (0, -1, 1, 1)
    assert t.free_buckets(H) == {4: ("n3",)}
    assert t.device(NS, "a") is s.device(NS, "a")


# --- reservations added one by one or together equal a fresh count --------------------------

_reservations = st.lists(st.builds(
    Hold,
    st.sampled_from(["r1", "r2", "r3", "r4"]),
    st.sampled_from([NS, "other"]),
    st.sampled_from(["n1", "n2", "n3"]),
    st.lists(st.tuples(st.sampled_from([H, L]), st.integers(0, 3)), max_size=2).map(tuple),
    st.lists(st.tuples(st.sampled_from([H, L]), st.integers(0, 3)), max_size=2).map(tuple),
), max_size=6)


def _counted(s: Snapshot):
    nodes, resources = ("n1", "n2", "n3"), (H, L)
    return ({(n, r): (s.reserved(n, r), s.free(n, r)) for n in nodes for r in resources},
            {(ns, r): s.tenant_usage(ns, r) for ns in (NS, "other") for r in resources},
            {r: dict(s.free_buckets(r)) for r in resources}, s.reservations)


@given(_reservations, _reservations)
def test_with_reservation_s_counts_equal_a_fresh_index(first, then):
    """`with_reservation` one by one and `with_reservations` at once (each on a snapshot
    whose index is built) count what an index built from scratch counts."""
    base = world([node("n1", 4, 2), node("n2", 4, 2), node("n3", 1, 1)], [dev("a", "n1")])
    start = base.with_reservations(first)
    start.free("n1", H)  # build the index: later snapshots derive it
    one_by_one = start
    for r in then:
        one_by_one = one_by_one.with_reservation(r)
    together = start.with_reservations(then)
    fresh = world([node("n1", 4, 2), node("n2", 4, 2), node("n3", 1, 1)], [dev("a", "n1")],
                  reservations=list(one_by_one.reservations))
    assert _counted(one_by_one) == _counted(fresh)
    assert _counted(together) == _counted(fresh)


def test_bound_node_follows_the_status_the_value_was_made_with() -> None:
    from dataclasses import replace

    from model.types import DeviceStatus, GPUDevice, Phase

    pending = GPUDevice("t", "d", "h100", status=DeviceStatus(node_name="n1"))
    assert pending.bound_node is None  # a nodeName without phase Bound places nothing
    bound = replace(pending, status=DeviceStatus(Phase.BOUND, "n2"))
    assert bound.bound_node == "n2"
    assert replace(bound, status=DeviceStatus()).bound_node is None
    assert bound == GPUDevice("t", "d", "h100", status=DeviceStatus(Phase.BOUND, "n2"))


_device_changes = st.lists(st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from([None, "n1", "n2", "gone"]),  # Pending, Bound on a node, or removed
    st.sampled_from(["h100", "l40s"]),
), max_size=8)


@given(_device_changes)
def test_with_changes_counts_equal_with_devices_then_without_devices(changes):
    """`with_changes(puts, gone)` (the view's one step per batch of watch events) gives the
    devices and counts of `with_devices(puts).without_devices(gone)` and of a fresh index."""
    nodes = [node("n1", 4, 2), node("n2", 4, 2)]
    classes = [gpu_class(), gpu_class("l40s", L)]
    base = world(nodes, [dev("a", "n1"), dev("b"), dev("c", "n2", cls="l40s")], classes)
    base.free("n1", H)  # build the index: the step derives it
    last = {}
    for name, where, cls in changes:
        last[name] = (where, cls)
    puts = [dev(n, w, cls=c) for n, (w, c) in last.items() if w != "gone"]
    gone = [(NS, n) for n, (w, _) in last.items() if w == "gone"]
    step = base.with_changes(puts, gone)
    two = base.with_devices(puts).without_devices(gone)
    fresh = world(nodes, list(two.devices.values()), classes)
    assert dict(step.devices) == dict(two.devices)
    assert _counted(step) == _counted(two) == _counted(fresh)
    noop = not puts and not any(k in base.devices for k in gone)
    event("changes: none that apply" if noop else f"changes: {len(puts)} put, {len(gone)} gone")
    if noop:
        assert step is base


@given(_reservations, _reservations)
def test_reserving_adds_as_with_reservation_and_leaves_the_start_alone(first, then):
    """`Reserving.add` (the planner's in-place working copy) counts what `with_reservation`
    one by one counts, after each hold, and never changes the snapshot it started from."""
    base = world([node("n1", 4, 2), node("n2", 4, 2), node("n3", 1, 1)], [dev("a", "n1")])
    start = base.with_reservations(first)
    before = _counted(start)
    work = Reserving(start)
    expected = start
    for r in then:
        work.add(r)
        expected = expected.with_reservation(r)
        assert _counted(work.snapshot) == _counted(expected)
    assert _counted(start) == before
