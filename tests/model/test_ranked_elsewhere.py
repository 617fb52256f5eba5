"""B4/DR4 from the snapshot's ranking (`SetDevices.ranked_elsewhere`, `NodeMemo.ranked`): a
new one-class set's candidate nodes, walked tightest group first, are exactly what the walk
over every eligible node gives (`SetDevices.elsewhere`), on random HGX fleets (taken devices,
records, cordons, labels, taints, foreign units), for every limit, and after the snapshot
changed under a warm ranking (devices recorded and removed, device holds, node changes)."""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import patch

from hypothesis import event, given, settings
from hypothesis import strategies as st

from model.decide import Request, _Set, decide
from model.device import choice
from model.hold import Hold
from model.snapshot import Snapshot
from model.types import DeviceStatus, GPUDevice, Phase, Taint
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node, recorded, ref

PROPS = settings(max_examples=200, deadline=None)

_board = st.fixed_dictionaries({
    "taken": st.sets(st.integers(0, 7), max_size=7),
    "records": st.sets(st.integers(0, 7), max_size=4),
    "kind": st.sampled_from(["plain", "plain", "plain", "cordoned", "zone-b", "tainted", "foreign"]),
})


def _fleet(boards: list[dict]) -> tuple[list, list[GPUDevice]]:
    nodes, held = [], []
    for i, b in enumerate(boards):
        name = f"b{i}"
        n = dra_node(name, taken=tuple(sorted(b["taken"] - b["records"])))
        match b["kind"]:
            case "cordoned":
                n = replace(n, unschedulable=True)
            case "zone-b":
                n = replace(n, labels=tuple(sorted({**dict(n.labels), "zone": "b"}.items())))
            case "tainted":
                n = replace(n, taints=(Taint("gpu", "broken", "NoSchedule"),))
            case "foreign":
                n = replace(n, foreign=((RES, 6),))
        nodes.append(n)
        held += [recorded("t1", f"h{i}-{g}", name, g) for g in sorted(b["records"] - b["taken"])]
    return nodes, held


def _new(size: int) -> list[GPUDevice]:
    return [GPUDevice("t1", f"new-{i}", CLASS) for i in range(size)]


def _with_new_set(nodes: list, devices: list[GPUDevice], size: int,
                  zone: str | None = None) -> tuple[Snapshot, Request]:
    """A snapshot of `nodes` and `devices` plus a new set of `size` devices, and that set's
    request (node selector `zone=<zone>` when given)."""
    new = _new(size)
    snap = Snapshot.build(nodes=nodes, classes=[device_class()], devices=[*devices, *new])
    selector = (("zone", zone),) if zone else ()
    return snap, Request("r", "t1", "vm", tuple(d.name for d in new), node_selector=selector)


def _both(snap: Snapshot, request: Request, limit: int):
    members = [snap.device("t1", n) for n in request.devices]
    s = _Set(snap, request, members, [CLASS])
    fast = s.dev.ranked_elsewhere(s.eligible_node, s.tightest, limit)
    slow = s.dev.elsewhere(s.eligible_elsewhere, limit)
    return fast, slow


@PROPS
@given(st.lists(_board, min_size=1, max_size=7), st.integers(1, 8), st.integers(1, 5),
       st.sampled_from([None, "b"]))
def test_the_ranking_walk_gives_the_walk_over_every_node(boards, size, limit, zone):
    nodes, held = _fleet(boards)
    snap, request = _with_new_set(nodes, held, size, zone)
    fast, slow = _both(snap, request, limit)
    assert fast is not None
    assert fast == slow
    fast_again, _ = _both(snap, request, limit)  # from the ranking now kept on the memo
    assert fast_again == slow
    event(f"{len(slow)} candidates")


_change = st.one_of(
    st.tuples(st.just("record"), st.integers(0, 6), st.integers(0, 7)),
    st.tuples(st.just("unrecord"), st.integers(0, 6), st.integers(0, 7)),
    st.tuples(st.just("hold"), st.integers(0, 6), st.integers(0, 7)),
    st.tuples(st.just("node"), st.integers(0, 6), st.integers(0, 7)),
)


@PROPS
@given(st.lists(_board, min_size=2, max_size=7), st.integers(1, 4),
       st.lists(_change, min_size=1, max_size=6), st.integers(1, 4))
def test_a_warm_ranking_follows_the_snapshot_it_is_carried_to(boards, size, changes, limit):
    nodes, held = _fleet(boards)
    snap, request = _with_new_set(nodes, held, size)
    decide(snap, request)  # warm the ranking on the start
    for i, (kind, b, g) in enumerate(changes):
        name = f"b{b % len(nodes)}"
        if kind == "record":
            snap = snap.with_device(recorded("t2", f"x{i}", name, g))
        elif kind == "unrecord":
            gone = [k for k, d in snap.devices.items() if d.bound_node == name]
            snap = snap.without_devices(gone[:1])
        elif kind == "hold":
            snap = snap.with_reservation(Hold(f"other-{i}", "t2", name, ((RES, 1),), ((RES, 1),), (),
                                              ((("t2", f"y{i}"), ref(name, g)),)))
        else:
            snap = snap.with_node_changes([dra_node(name, taken=(g,))])
        fast, slow = _both(snap, request, limit)
        assert fast == slow, (kind, name, g)
    fresh = Snapshot.build(nodes=snap.nodes.values(), classes=[device_class()],
                           devices=snap.devices.values(), reservations=snap.reservations)
    assert decide(snap, request) == decide(fresh, request)


@PROPS
@given(st.lists(_board, min_size=2, max_size=6), st.integers(0, 5), st.integers(1, 3), st.integers(1, 4))
def test_a_set_with_a_bound_member_leaves_the_shared_ranking_as_a_new_sets(boards, at, size, limit):
    """A set one of whose members is Bound on a board (its own record kept there) asks first;
    a new set then reads the snapshot's ranking: it must be a new set's, not the first one's."""
    nodes, held = _fleet(boards)
    board = f"b{at % len(nodes)}"
    mixed = [recorded("t1", "mine", board, 7), GPUDevice("t1", "more", CLASS)]
    new = _new(size)
    snap = Snapshot.build(nodes=nodes, classes=[device_class()], devices=[*held, *mixed, *new])
    decide(snap, Request("m", "t1", "vm-m", ("mine", "more")))
    request = Request("r", "t1", "vm", tuple(d.name for d in new))
    fast, slow = _both(snap, request, limit)
    assert fast == slow
    fresh = Snapshot.build(nodes=nodes, classes=[device_class()], devices=[*held, *mixed, *new])
    _both(fresh, request, limit)  # its ranking made by the new set alone
    assert {k: r.keys for k, r in snap.memo.ranked.items()} == {k: r.keys for k, r in fresh.memo.ranked.items()}


def test_the_ranking_a_set_with_a_bound_member_would_make_is_not_shared():
    """The case hypothesis found hard: the set holding a record on b0 scores b0 with its own
    record kept ((2, 6), 0, -1); a new set scores it ((1, 5), 0, 0)."""
    nodes = [dra_node("b0"), dra_node("b1", taken=(0, 1, 2, 3, 4, 5))]
    mixed = [recorded("t1", "mine", "b0", 7), GPUDevice("t1", "more", CLASS)]
    new = _new(2)
    snap = Snapshot.build(nodes=nodes, classes=[device_class()], devices=[*mixed, *new])
    decide(snap, Request("m", "t1", "vm-m", ("mine", "more")))
    _both(snap, Request("r", "t1", "vm", tuple(d.name for d in new)), 3)
    assert snap.memo.ranked[(CLASS, 2)].keys == [(((1, 5), 0, 0), "b0")]


# -- one fit, many leftovers: the walk within a fit group (issue 40) ---------------------

_SHAPES = ((), (), (), (0,), (0,), (0, 1), (0, 1, 2, 3))
"""GPUs a foreign claim takes on a board (each counted in `foreign`): few shapes, so many
boards share one group fit."""

_crowded_board = st.fixed_dictionaries({
    "shape": st.sampled_from(range(len(_SHAPES))),
    "units": st.integers(0, 7),  # units of the resource foreign Pods use beyond the shape's
    "kind": st.sampled_from(["plain"] * 6 + ["cordoned", "zone-b", "tainted"]),
})


def _crowd(boards: list[dict]) -> list:
    """Boards of few shapes (most share their group fit with many others) whose leftovers
    differ: foreign units that take no device."""
    nodes = []
    for i, b in enumerate(boards):
        taken = _SHAPES[b["shape"]]
        n = dra_node(f"b{i}", taken=taken)
        units = min(len(taken) + b["units"], 8)
        n = replace(n, foreign=((RES, units),) if units else ())
        match b["kind"]:
            case "cordoned":
                n = replace(n, unschedulable=True)
            case "zone-b":
                n = replace(n, labels=tuple(sorted({**dict(n.labels), "zone": "b"}.items())))
            case "tainted":
                n = replace(n, taints=(Taint("gpu", "broken", "NoSchedule"),))
        nodes.append(n)
    return nodes


def _asking(s: _Set) -> tuple[list[str], object]:
    asked: list[str] = []

    def eligible_node(name: str) -> int | None:
        asked.append(name)
        return s.eligible_node(name)
    return asked, eligible_node


_scan = st.sampled_from([0, 1, choice._SCAN])
"""How far a group's walk in leftover order looks before it asks the members instead: 0
always asks them, 1 often gives up midway (fleets here are too small for the real figure
to give up often)."""


@PROPS
@given(st.lists(_crowded_board, min_size=1, max_size=40), st.integers(1, 3), st.integers(1, 6),
       st.sampled_from([None, "b"]), _scan)
def test_within_one_fit_the_walk_gives_the_walk_over_every_node(boards, size, limit, zone, scan):
    """Many boards in one group fit, their leftovers apart: the ranking walk, which takes a
    large group in leftover order and stops inside it (or gives up and asks the group's
    members), gives the full walk's list."""
    with patch.object(choice, "_SCAN", scan):
        _within_one_fit(boards, size, limit, zone)


def _within_one_fit(boards, size, limit, zone):
    snap, request = _with_new_set(_crowd(boards), [], size, zone)
    fast, slow = _both(snap, request, limit)
    assert fast == slow
    members = [snap.device("t1", n) for n in request.devices]
    s = _Set(snap, request, members, [CLASS])
    asked, eligible_node = _asking(s)
    assert s.dev.ranked_elsewhere(eligible_node, s.tightest, limit) == slow
    assert len(asked) == len(set(asked)), "a node asked twice"
    event(f"asked {'fewer than' if len(asked) < len(boards) else 'all'} boards")


_count_change = st.one_of(
    st.tuples(st.just("count hold"), st.integers(0, 39), st.integers(1, 4)),
    st.tuples(st.just("bound, no record"), st.integers(0, 39), st.integers(1, 4)),
    st.tuples(st.just("hold gone"), st.integers(0, 39), st.integers(0, 9)),
    st.tuples(st.just("device hold"), st.integers(0, 39), st.integers(0, 7)),
    st.tuples(st.just("foreign"), st.integers(0, 39), st.integers(0, 8)),
)


@PROPS
@given(st.lists(_crowded_board, min_size=2, max_size=40), st.integers(1, 2),
       st.lists(_count_change, min_size=1, max_size=8), st.integers(1, 5), _scan)
def test_a_warm_ranking_follows_leftovers_that_change_without_its_nodes(boards, size, changes, limit, scan):
    """Free units that change while a node's ranking entry stays (a hold naming no device,
    a Bound device recording none: `touched_nodes` leaves the node's memo), and ones that
    drop it (a device hold, a node change): the walk still gives the full walk's list."""
    with patch.object(choice, "_SCAN", scan):
        _follows_leftovers(boards, size, changes, limit)


def _follows_leftovers(boards, size, changes, limit):
    nodes = _crowd(boards)
    snap, request = _with_new_set(nodes, [], size)
    decide(snap, request)  # warm the ranking on the start
    for i, (kind, b, k) in enumerate(changes):
        node = nodes[b % len(nodes)]
        name = node.name
        if kind == "count hold":
            snap = snap.with_reservation(Hold(f"c{i}", "t2", name, ((RES, k),), ((RES, k),)))
        elif kind == "bound, no record":
            snap = snap.with_devices([GPUDevice("t2", f"u{i}-{j}", CLASS, status=DeviceStatus(Phase.BOUND, name))
                                      for j in range(k)])
        elif kind == "hold gone":
            if snap.reservations:
                snap = snap.without_reservation(snap.reservations[k % len(snap.reservations)].request_id)
        elif kind == "device hold":
            snap = snap.with_reservation(Hold(f"d{i}", "t2", name, ((RES, 1),), ((RES, 1),), (),
                                              ((("t2", f"y{i}"), ref(name, k)),)))
        else:
            snap = snap.with_node_changes([replace(snap.nodes[name], foreign=((RES, k),) if k else ())])
        fast, slow = _both(snap, request, limit)
        assert fast == slow, (kind, name, k)
    fresh = Snapshot.build(nodes=snap.nodes.values(), classes=[device_class()],
                           devices=snap.devices.values(), reservations=snap.reservations)
    assert decide(snap, request) == decide(fresh, request)


def test_a_fresh_fleet_asks_only_the_nodes_it_keeps():
    """Issue 40: on a fresh fleet every board is in one group fit; the walk used to ask each
    one before it could stop. Now it takes them in leftover order (foreign units set them
    apart here) and asks the first `limit`."""
    nodes = [replace(dra_node(f"b{i:02}"), foreign=((RES, i % 3),) if i % 3 else ()) for i in range(60)]
    new = _new(1)
    snap = Snapshot.build(nodes=nodes, classes=[device_class()], devices=new)
    request = Request("r", "t1", "vm", ("new-0",))
    s = _Set(snap, request, [snap.device("t1", "new-0")], [CLASS])
    asked, eligible_node = _asking(s)
    found = s.dev.ranked_elsewhere(eligible_node, s.tightest, 4)
    assert found == [(5, "b02"), (5, "b05"), (5, "b08"), (5, "b11")]
    assert found == s.dev.elsewhere(s.eligible_elsewhere, 4)
    assert asked == ["b02", "b05", "b08", "b11"]


def test_a_small_group_far_down_the_leftovers_is_asked_in_the_rankings_order():
    """The tightest group (two boards with a GPU taken: its buddy is a whole partition2's
    last) has the larger leftover; the fresh boards before it in leftover order are too many
    to look past, so the walk asks the group's two members instead."""
    fresh = [replace(dra_node(f"f{i:02}"), foreign=((RES, 4),)) for i in range(30)]  # leftover 3
    broken = [dra_node(f"t{i}", taken=(0,)) for i in range(2)]  # leftover 6
    new = _new(1)
    snap = Snapshot.build(nodes=[*fresh, *broken], classes=[device_class()], devices=new)
    request = Request("r", "t1", "vm", ("new-0",))
    s = _Set(snap, request, [snap.device("t1", "new-0")], [CLASS])
    asked, eligible_node = _asking(s)
    found = s.dev.ranked_elsewhere(eligible_node, s.tightest, 1)
    assert found == [(6, "t0")]
    assert found == s.dev.elsewhere(s.eligible_elsewhere, 1)
    assert asked == ["t0", "t1"]
