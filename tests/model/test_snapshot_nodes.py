"""`Snapshot.with_node_changes` (what the view applies after node watch events: a Pod, a
claim or a slice changed what one node has) equals `Snapshot.build` of the same objects: the
counts, the free buckets, and in device mode every decision; the carried device-mode memo
keeps only the entries of nodes that did not change."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import event, given
from hypothesis import strategies as st

from model.decide import Request, decide
from model.hold import Hold
from model.snapshot import Snapshot
from model.types import Node, Taint
from tests.support.dra_worlds import CLASS, device_class, dra_node, recorded
from tests.support.world import H, L, NS, dev, gpu_class, node, world

NODES = ("n1", "n2", "n3", "n4")

_node_change = st.tuples(
    st.sampled_from(NODES),
    st.sampled_from(["gone", "plain", "cordoned", "foreign", "bigger", "notready", "unlabelled",
                     "tainted", "zone-b", "only-l40s"]),
)


def _variant(name: str, kind: str) -> Node | None:
    base = node(name, 4, 2)
    match kind:
        case "gone":
            return None
        case "cordoned":
            return node(name, 4, 2, cordoned=True)
        case "foreign":
            return replace(base, foreign=((H, 2),))
        case "bigger":
            return node(name, 8, 0)
        case "notready":
            return replace(base, ready=False)
        case "unlabelled":
            return replace(base, labels=())
        case "tainted":
            return replace(base, taints=(Taint("example.com/x", "", "NoExecute"),
                                         Taint("example.com/y", "", "PreferNoSchedule")))
        case "zone-b":
            return node(name, 4, 2, zone="b")
        case "only-l40s":
            return node(name, 0, 3)
    return base


def _counted(s: Snapshot):
    return ({(n, r): (s.used(n, r), s.reserved(n, r), s.free(n, r), s.foreign(n, r))
             for n in NODES for r in (H, L)},
            {r: dict(s.free_buckets(r)) for r in (H, L)},
            {(ns, r): s.tenant_usage(ns, r) for ns in (NS, "other") for r in (H, L)},
            s.cordoned_nodes(), s.unplaceable_nodes(), dict(s.nodes),
            {r: s.advertising_nodes(r) for r in (H, L)},
            {c: s.serving_nodes(c) for c in ("h100", "l40s", "zone-a")},
            (s._st.alloc, s._st.labels, s._st.foreign, s._st.tainted))


@given(st.lists(_node_change, max_size=6), st.booleans())
def test_node_changes_count_what_a_fresh_build_counts(changes, reserve):
    classes = [gpu_class(), gpu_class("l40s", L), gpu_class("zone-a", H, selector={"zone": "a"})]
    start_nodes = [node("n1", 4, 2, zone="a"), replace(node("n2", 4, 2), taints=(Taint("example.com/z"),)),
                   replace(node("n3", 2), foreign=((H, 1),))]
    devices = [dev("a", "n1"), dev("b", "n2"), dev("c", "n3", cls="l40s"), dev("d")]
    holds = [Hold("r1", NS, "n2", ((H, 1),), ((H, 1),))] if reserve else []
    base = world(start_nodes, devices, classes, reservations=holds)
    base.free("n1", H)  # build the index: the step carries it over
    for c in classes:   # and the nodes serving each class (carried, not worked out again)
        base.serving_nodes(c.name)
    last: dict[str, Node | None] = {}
    for name, kind in changes:
        last[name] = _variant(name, kind)
    puts = [n for n in last.values() if n is not None]
    gone = [name for name, n in last.items() if n is None]
    step = base.with_node_changes(puts, gone)
    fleet = {n.name: n for n in start_nodes}
    fleet.update({n.name: n for n in puts})
    for name in gone:
        fleet.pop(name, None)
    fresh = world(list(fleet.values()), devices, classes, reservations=holds)
    assert _counted(step) == _counted(fresh)
    # and a later device step on the carried index still counts as a fresh one
    moved = step.with_devices([dev("d", "n4" if "n4" in fleet else "n1")])
    again = world(list(fleet.values()), list(moved.devices.values()), classes, reservations=holds)
    assert _counted(moved) == _counted(again)
    event(f"{len(puts)} put, {len(gone)} gone")


def test_an_unchanged_node_is_no_change():
    base = world([node("n1", 4)], [dev("a", "n1")])
    assert base.with_node_changes([node("n1", 4)]) is base


_dra_change = st.tuples(st.sampled_from(["b0", "b1", "b2"]),
                        st.sets(st.integers(0, 7), max_size=6))


@given(st.lists(_dra_change, min_size=1, max_size=4), st.integers(1, 4))
def test_device_mode_decisions_after_node_changes_are_a_fresh_builds(changes, size):
    """HGX boards whose taken devices change (a claim allocated or released): the decision
    on the carried snapshot (its memo warm for the unchanged boards) is the fresh one's."""
    boards = [dra_node("b0", taken=(0,)), dra_node("b1"), dra_node("b2", taken=(1, 2))]
    held = [recorded("t1", "h0", "b1", 3)]
    new = [replace(dev(f"new-{i}", cls=CLASS), namespace="t1") for i in range(size)]
    base = Snapshot.build(nodes=boards, classes=[device_class()], devices=[*held, *new])
    request = Request("r", "t1", "vm", tuple(d.name for d in new))
    decide(base, request)  # warm the memo and the index on the start
    last = {}
    for name, taken in changes:
        last[name] = dra_node(name, taken=tuple(sorted(taken)))
    step = base.with_node_changes(last.values())
    fleet = {n.name: n for n in boards}
    fleet.update(last)
    fresh = Snapshot.build(nodes=fleet.values(), classes=[device_class()], devices=[*held, *new])
    got, want = decide(step, request), decide(fresh, request)
    assert got == want
    event(f"{got.result.value} on {got.node}")
