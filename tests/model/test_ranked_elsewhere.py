"""B4/DR4 from the snapshot's ranking (`SetDevices.ranked_elsewhere`, `NodeMemo.ranked`): a
new one-class set's candidate nodes, walked tightest group first, are exactly what the walk
over every eligible node gives (`SetDevices.elsewhere`), on random HGX fleets (taken devices,
records, cordons, labels, taints, foreign units), for every limit, and after the snapshot
changed under a warm ranking (devices recorded and removed, device holds, node changes)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import event, given, settings
from hypothesis import strategies as st

from model.decide import Request, _Set, decide
from model.hold import Hold
from model.snapshot import Snapshot
from model.types import GPUDevice, Taint
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


def _both(snap: Snapshot, request: Request, limit: int):
    members = [snap.device("t1", n) for n in request.devices]
    s = _Set(snap, request, members, [CLASS])
    fast = s.dev.ranked_elsewhere(s.eligible_node, limit)
    slow = s.dev.elsewhere(s.eligible_elsewhere, limit)
    return fast, slow


@PROPS
@given(st.lists(_board, min_size=1, max_size=7), st.integers(1, 8), st.integers(1, 5),
       st.sampled_from([None, "b"]))
def test_the_ranking_walk_gives_the_walk_over_every_node(boards, size, limit, zone):
    nodes, held = _fleet(boards)
    new = _new(size)
    snap = Snapshot.build(nodes=nodes, classes=[device_class()], devices=[*held, *new])
    selector = (("zone", zone),) if zone else ()
    request = Request("r", "t1", "vm", tuple(d.name for d in new), node_selector=selector)
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
    new = _new(size)
    snap = Snapshot.build(nodes=nodes, classes=[device_class()], devices=[*held, *new])
    request = Request("r", "t1", "vm", tuple(d.name for d in new))
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
