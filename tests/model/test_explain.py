"""`model.explain`: explain, what-if and top give the binder's own verdicts (B1–B6, W1).

Table tests with reasons asserted as typed values (`model.reasons`; their wording is
`tests/model/test_reasons.py`'s), and hypothesis properties tying every
answer to `decide`/`check`: explain's node is the node `decide` places the set on, its
per-node reasons are the ones a refusal writes, what-if outcomes are the decisions of the
same requests, and top's largest set is exactly the largest request that `decide` places.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, assume, event, given, settings, strategies as st

from model.admission import Refusal, check
from model.decide import Request, decide
from model.explain import (EXPLAIN_REQUEST_ID, NodeVerdict, explain, largest_placeable,
                           set_request, top)
from model.parse import VMIAsk
from model.reasons import (BudgetExhausted, CannotPlace, ClassesNotServed, Code, Cordoned, DeviceAt,
                           DeviceAttached, NodeProblems, NoRoom, NotEntitled, RequestRef,
                           SelectorMismatch)
from model.snapshot import Snapshot
from model.types import Budget, DeviceStatus, GPUDevice, LabelSelector, Namespace, Result
from model.what_if import held_sets, what_if
from tests.support.world import (CLASSES, H, L, LIVE, NOW, NS, attached, dev, gpu_class, node,
                                 template, what_if_cluster)

GRACE = timedelta(minutes=2)


def ex(snap: Snapshot, held=(), templates=(), vmi="vm-1", live=(), selector=()):
    return explain(snap, NS, vmi, VMIAsk(tuple(held), tuple(templates)), live_vmis=set(live),
                   now=NOW, grace=GRACE, node_selector=tuple(selector))


# --- explain -------------------------------------------------------------------------------


def test_B4_explain_names_the_chosen_node_and_the_moves():
    snap = Snapshot.build(nodes=[node("n1", h=3), node("n2", h=4), node("n3", h=1)],
                          classes=[gpu_class()], devices=[dev("gpu-a", on="n1")])
    e = ex(snap, held=["gpu-a"], templates=[("h100", 2)])
    assert e.admitted and e.message is None
    assert e.node == "n1" and e.rule == "B1"
    assert [(m.device, m.from_node, m.to_node) for m in e.moves] == [
        ((NS, "vm-1-h100-0"), None, "n1"), ((NS, "vm-1-h100-1"), None, "n1")]
    assert e.nodes == (NodeVerdict("n1", (), 1, True),
                       NodeVerdict("n2", (), 0, False),
                       NodeVerdict("n3", (NoRoom(H, needs=3, free=1),), 0, False))
    assert e.shortfalls == ()


def test_B3_explain_gives_every_node_its_reason():
    snap = Snapshot.build(
        nodes=[node("n1", h=4, cordoned=True), node("n2", l=2), node("n3", h=1),
               node("n4", h=4, zone="b")],
        classes=[gpu_class()], devices=[])
    e = ex(snap, templates=[("h100", 2)], selector=[("zone", "a")])
    assert not e.admitted and e.node is None
    by = {v.node: v.reasons for v in e.nodes}
    zone = SelectorMismatch((("zone", "a"),))
    assert by == {
        "n1": (Cordoned(), zone),
        "n2": (ClassesNotServed(("h100",)), zone),
        "n3": (zone, NoRoom(H, needs=2, free=1)),
        "n4": (zone,),
    }
    # W1 judges the VMI's nodeSelector too (B3): its refusal is the binder's, per node
    assert isinstance(e.reason, CannotPlace) and e.reason.code is Code.NO_ELIGIBLE_NODE
    assert e.reason.reasons[0].code is Code.NO_ELIGIBLE_NODE


def test_W1_explain_says_budget_and_by_how_much():
    snap = Snapshot.build(nodes=[node("n1", h=4)], classes=[gpu_class()],
                          devices=[dev("gpu-a", on="n1")], budgets=[Budget(NS, H, 2)])
    e = ex(snap, templates=[("h100", 3)])
    assert not e.admitted
    budget = BudgetExhausted(NS, H, bound=1, budget=2, adds=3)
    assert e.reason == CannotPlace(NS, "vm-1", (budget,))  # W1 says what B1 says
    assert e.set_problems == (budget,)
    assert e.budget_short == ((H, 2),)


def test_W1_explain_names_attachment_to_another_vmi():
    snap = Snapshot.build(nodes=[node("n1", h=4)], classes=[gpu_class()],
                          devices=[attached(dev("gpu-a", on="n1"), "other")])
    e = ex(snap, held=["gpu-a"], live=[(NS, "other")])
    assert not e.admitted
    assert e.reason == DeviceAttached("gpu-a", "other")
    assert e.set_problems == (DeviceAttached("gpu-a", "other"),)
    assert e.nodes == (NodeVerdict("n1", (), 1, False),)  # the node itself would do
    assert e.node is None and e.moves == ()


def test_W1_explain_names_entitlement():
    cls = gpu_class(tenants=LabelSelector((("tier", "gold"),)))
    snap = Snapshot.build(nodes=[node("n1", h=4)], classes=[cls],
                          namespaces=[Namespace(NS, (("tier", "free"),))])
    e = ex(snap, templates=[("h100", 1)])
    assert e.reason == CannotPlace(NS, "vm-1", (NotEntitled(NS, "h100"),))
    assert e.set_problems == (NotEntitled(NS, "h100"),)


def test_B1_explain_smallest_change_moves_idle_held_devices():
    # n1: 4 H100, 3 Bound: 2 idle of tenant-b, 1 attached to a live VMI; n2: 1 free
    idle1 = dev("b-1", on="n1", ns="tenant-b")
    idle2 = dev("b-2", on="n1", ns="tenant-b")
    busy = attached(dev("c-1", on="n1", ns="tenant-c"), "vm-c")
    snap = Snapshot.build(nodes=[node("n1", h=4), node("n2", h=2), node("n3", h=1)],
                          classes=[gpu_class()],
                          devices=[idle1, idle2, busy, dev("x", on="n2", ns="tenant-d")])
    e = ex(snap, templates=[("h100", 3)], live=[("tenant-c", "vm-c")])
    assert not e.admitted
    assert [s.node for s in e.shortfalls] == ["n1", "n2", "n3"]
    first = e.shortfalls[0]
    assert first.missing == ((H, 2),)
    assert first.idle == ((("tenant-b", "b-1"), "n2"), (("tenant-b", "b-2"), "n3"))
    assert first.short == () and not first.uncordon
    n2 = e.shortfalls[1]  # the only device there is idle, but 1 unit is still missing
    assert n2.missing == ((H, 2),) and n2.idle == ((("tenant-d", "x"), "n1"),)
    assert n2.short == ((H, 1),)


def test_H1_explain_names_devices_awaiting_a_vmi_not_seen_and_never_calls_them_idle():
    """A replica killed mid-admission (or a create the API server failed after the binder
    bound the set) leaves devices attached to a VMI that does not exist. Until H1's grace
    runs out they take capacity: explain names the VMI and when housekeeping frees them,
    and does not offer to move them (the defragmentation never moves attached devices)."""
    from cli.tools import render_explain

    gone_a = attached(dev("w-1", on="n1", ns="tenant-b"), "vm-gone")
    gone_b = attached(template("vm-gone-h100-0", "vm-gone", "n1", ns="tenant-b"), "vm-gone")
    snap = Snapshot.build(nodes=[node("n1", h=4), node("n2", h=1)], classes=[gpu_class()],
                          devices=[gone_a, gone_b])
    e = ex(snap, templates=[("h100", 3)])
    assert not e.admitted
    n1 = next(s for s in e.shortfalls if s.node == "n1")
    since = NOW - timedelta(hours=1)          # `attached` attaches an hour before NOW
    assert (n1.missing, n1.idle, n1.short) == (((H, 1),), (), ((H, 1),))
    assert n1.awaiting == ((("tenant-b", "vm-gone"), 2, since + GRACE),)
    text = render_explain(e)
    assert ("    (2 devices there attached to VMI tenant-b/vm-gone, not seen yet: an admission "
            "in progress or a failed create; housekeeping frees them at 2026-01-02T02:06:05Z "
            "unless it appears)") in text.splitlines(), text
    assert "move idle" not in text
    # the VMI appears: its devices are attached to a live VMI, no longer awaiting
    seen = ex(snap, templates=[("h100", 3)], live=[("tenant-b", "vm-gone")])
    assert all(s.awaiting == () for s in seen.shortfalls)


def test_B5_explain_cordoned_node_counts_as_a_further_change():
    snap = Snapshot.build(nodes=[node("n1", h=4, cordoned=True), node("n2", h=1)],
                          classes=[gpu_class()], devices=[])
    e = ex(snap, templates=[("h100", 2)])
    assert [(s.node, s.missing, s.short, s.uncordon) for s in e.shortfalls] == [
        ("n1", (), (), True), ("n2", ((H, 1),), ((H, 1),), False)]
    snap = Snapshot.build(nodes=[node("n1", h=4, cordoned=True)], classes=[gpu_class()])
    e = ex(snap, templates=[("h100", 2)])
    assert [(s.node, s.missing, s.uncordon) for s in e.shortfalls] == [("n1", (), True)]
    assert e.nodes == (NodeVerdict("n1", (Cordoned(),)),)


# --- what-if -------------------------------------------------------------------------------


def test_B5_what_if_cordon_moves_stays_and_refuses():
    w = what_if(what_if_cluster(), "cordon", ["n1"], live_vmis=LIVE, now=NOW)
    got = [(o.set.namespace, o.set.vmi, o.action, o.rule, o.node, o.stranded) for o in w.outcomes]
    assert got == [
        (NS, "vm-a", "move", "B1", "n2", False),     # 2 H100 fit n2
        ("tenant-b", None, "move", "B1", "n3", False),  # n2 is then full: n3
        ("tenant-s", "vm-s", "stay", "B5b", "n1", True),  # Stay class: waits for the cordon
    ]
    assert [(m.device, m.from_node, m.to_node) for m in w.outcomes[0].moves] == [
        ((NS, "a-1"), "n1", "n2"), ((NS, "vm-a-h100-0"), None, "n2")]
    assert w.stranded == (("tenant-s", "vm-s"),) and w.evicted == ()


def test_B5_what_if_drain_reports_evicted_and_refused():
    snap = what_if_cluster().with_nodes([node("n1", h=4, l=1), node("n2", h=1)])
    w = what_if(snap, "drain", ["n1"], live_vmis=LIVE, now=NOW)
    got = [(o.set.vmi, o.action, o.rule) for o in w.outcomes]
    assert got == [("vm-a", "refused", "refused"), (None, "move", "B1"), ("vm-s", "stay", "B5b")]
    refused = w.outcomes[0].reason
    assert refused is not None and refused.request == RequestRef(NS, "vm-a", EXPLAIN_REQUEST_ID)
    assert refused.devices == (DeviceAt("a-1", "n1"), DeviceAt("vm-a-h100-0"))
    [per_node] = refused.reasons
    assert per_node.nodes[:2] == (NodeProblems("n1", (Cordoned(),)),
                                  NodeProblems("n2", (NoRoom(H, needs=2, free=1),)))
    assert w.outcomes[0].message == refused.render()
    assert w.stranded == ((NS, "vm-a"), ("tenant-s", "vm-s"))
    assert w.evicted == ((NS, "vm-a"), ("tenant-s", "vm-s"))


def test_B5a_what_if_cordon_only_problem_and_no_room_stays():
    snap = Snapshot.build(nodes=[node("n1", h=2), node("n2", h=1)], classes=[gpu_class()],
                          devices=[attached(dev("a", on="n1"), "vm"),
                                   attached(dev("b", on="n1"), "vm")])
    w = what_if(snap, "cordon", ["n1"], live_vmis={(NS, "vm")}, now=NOW)
    assert [(o.action, o.rule, o.node, o.stranded) for o in w.outcomes] == [
        ("stay", "B5a", "n1", True)]


def test_what_if_unknown_node_is_an_error():
    import pytest
    with pytest.raises(ValueError, match="no such node: 'nx'"):
        what_if(what_if_cluster(), "cordon", ["nx"], live_vmis=set(), now=NOW)
    with pytest.raises(ValueError, match="no such node: ''"):   # an empty name shows as one
        what_if(what_if_cluster(), "cordon", [""], live_vmis=set(), now=NOW)
    with pytest.raises(ValueError, match="mode"):
        what_if(what_if_cluster(), "reboot", ["n1"], live_vmis=set(), now=NOW)


def test_held_sets_group_by_vmi_and_idle_by_tenant_and_node():
    sets = held_sets(what_if_cluster(), ["n1"], LIVE)
    assert [(s.namespace, s.vmi, s.node, s.held, s.templates, s.running) for s in sets] == [
        (NS, "vm-a", "n1", ("a-1",), (("h100", 1),), True),
        ("tenant-b", None, "n1", ("i-1",), (), False),
        ("tenant-s", "vm-s", "n1", ("s-1",), (), True)]


# --- top -----------------------------------------------------------------------------------


def test_top_counts_bound_attached_idle_free_and_largest():
    snap = what_if_cluster().with_devices([dev("p", on="n2", ns="tenant-b")])
    t = top(snap, LIVE)
    h100 = t.classes[0]
    assert (h100.class_name, h100.bound, h100.attached, h100.awaiting, h100.idle, h100.free,
            h100.largest) == ("h100", 4, 2, 0, 2, 1 + 1 + 1, 1)
    assert [(n.node, n.allocatable, n.bound, n.attached, n.idle, n.free, n.largest)
            for n in h100.nodes] == [("n1", 4, 3, 2, 1, 1, 1), ("n2", 2, 1, 0, 1, 1, 1),
                                     ("n3", 1, 0, 0, 0, 1, 1)]
    snap2 = snap.with_nodes([node("n1", h=4, l=1), node("n2", h=2, cordoned=True),
                             node("n3", h=1)])
    h100 = top(snap2, LIVE).classes[0]
    assert h100.free == 2 and [n.largest for n in h100.nodes] == [1, 0, 1]
    assert [(x.namespace, x.resource, x.used, x.hard) for x in t.tenants] == [
        (NS, H, 2, None), ("tenant-b", H, 2, None), ("tenant-s", L, 1, None)]


def test_top_counts_a_device_attached_to_a_vmi_not_seen_as_awaiting_not_idle():
    """A crashed replica's or a failed create's attachment: Bound, attached to a VMI that
    does not exist (yet). It takes capacity until H1's grace runs out; `top` shows it as
    awaiting its VMI, not as idle (which would invite a defragmentation or a reuse)."""
    pending = attached(dev("w-1", on="n2", ns="tenant-b"), "vm-gone")
    t = top(what_if_cluster().with_devices([pending]), LIVE)
    h100 = t.classes[0]
    assert (h100.bound, h100.attached, h100.awaiting, h100.idle) == (4, 2, 1, 1)
    assert [(n.node, n.bound, n.attached, n.awaiting, n.idle) for n in h100.nodes] == [
        ("n1", 3, 2, 0, 1), ("n2", 1, 0, 1, 0), ("n3", 0, 0, 0, 0)]
    # once its VMI is seen, it is attached
    seen = top(what_if_cluster().with_devices([pending]), LIVE | {("tenant-b", "vm-gone")})
    assert (seen.classes[0].attached, seen.classes[0].awaiting) == (3, 0)


def test_top_tenant_budgets():
    snap = Snapshot.build(nodes=[node("n1", h=4)], classes=[gpu_class()],
                          devices=[dev("a", on="n1")], budgets=[Budget(NS, H, 3), Budget("t2", H, 1)])
    assert [(x.namespace, x.used, x.hard) for x in top(snap, set()).tenants] == [
        ("t2", 0, 1), (NS, 1, 3)]


# --- properties: the same verdicts as decide/check ----------------------------------------




@st.composite
def clusters(draw):
    n = draw(st.integers(1, 5))
    nodes = [node(f"n{i}", h=draw(st.integers(0, 4)), l=draw(st.integers(0, 2)),
                  cordoned=draw(st.booleans()), zone=draw(st.sampled_from("ab")))
             for i in range(n)]
    devices = []
    for i in range(draw(st.integers(0, 8))):
        ns = draw(st.sampled_from([NS, "tenant-b"]))
        on = draw(st.sampled_from([None] + [x.name for x in nodes]))
        d = dev(f"d{i}", on=on, cls=draw(st.sampled_from(["h100", "l40s", "stay"])), ns=ns)
        if draw(st.booleans()):
            d = attached(d, draw(st.sampled_from(["vm-x", "vm-y"])))
        devices.append(d)
    budgets = [Budget(NS, H, draw(st.integers(0, 6)))] if draw(st.booleans()) else []
    return Snapshot.build(nodes=nodes, classes=CLASSES, devices=devices, budgets=budgets)


@st.composite
def fragmented(draw):
    """Uncordoned H100 nodes, each with one free unit, the rest taken by idle devices
    (attached to no VMI): a set of 2+ fits on a node once some of them move."""
    nodes = [node(f"n{i}", h=draw(st.integers(2, 4))) for i in range(draw(st.integers(2, 4)))]
    devices = []
    for x in nodes:
        for j in range(dict(x.allocatable)[H] - 1):
            devices.append(dev(f"{x.name}-i{j}", on=x.name, ns=draw(st.sampled_from([NS, "tenant-b"]))))
    return Snapshot.build(nodes=nodes, classes=CLASSES, devices=devices)


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(clusters(), st.lists(st.integers(0, 7), max_size=3, unique=True),
       st.lists(st.tuples(st.sampled_from(["h100", "l40s"]), st.integers(1, 3)), max_size=2,
                unique_by=lambda t: t[0]),
       st.sampled_from([(), (("zone", "a"),)]), st.sets(st.sampled_from(["vm-x", "vm-y"])))
def test_W1_B1_explain_agrees_with_check_and_decide(snap, held, templates, selector, live):
    names = [f"d{i}" for i in held if snap.device(NS, f"d{i}") is not None]
    ask = VMIAsk(tuple(names), tuple(templates))
    assume(ask.total > 0)
    live_vmis = {(NS, v) for v in live} | {("tenant-b", v) for v in live}
    e = explain(snap, NS, "vm-1", ask, live_vmis=live_vmis, now=NOW, grace=GRACE,
                node_selector=selector)
    w1 = check(snap, NS, "vm-1", ask, live_vmis, NOW, GRACE, node_selector=selector)
    whole, request = set_request(snap, NS, "vm-1", ask, selector)
    d = decide(whole, request, limit=None)
    event("admitted" if e.admitted else "refused by W1 check" if isinstance(w1, Refusal)
          else "refused by decide")
    assert e.admitted == (not isinstance(w1, Refusal) and d.result is Result.SUCCEEDED)
    if isinstance(w1, Refusal):
        assert e.reason == w1.reason
    elif d.result is Result.REFUSED:
        assert e.reason == d.reason
    if e.admitted:
        assert e.node == d.node and e.moves == d.placements[0].moves
        if d.rule == "B1":  # the eligible nodes are exactly those placements
            assert {v.node for v in e.nodes if v.fits} == {p.node for p in d.placements}
            assert [v.node for v in e.nodes if v.chosen] == [d.node]
    else:
        assert e.node is None and not any(v.chosen for v in e.nodes)
        event(f"refused, set problems: {bool(e.set_problems)}")
        if not e.set_problems:  # a room refusal: every node shown has the binder's reasons
            assert not any(v.fits for v in e.nodes)
            assert d.reason is not None
            [per_node] = d.reason.reasons
            if per_node.code is Code.NO_ELIGIBLE_NODE:
                by = {v.node: v.reasons for v in e.nodes}
                for line in per_node.nodes:
                    assert line.problems == by[line.node]


@PROPS
@given(clusters(), st.sampled_from(["h100", "l40s", "stay"]))
def test_B3_largest_placeable_is_the_largest_set_decide_places(snap, class_name):
    per_node = largest_placeable(snap, class_name)
    best = max(per_node.values(), default=0)

    def places(n: int) -> bool:
        devs = [GPUDevice("probe-ns", f"p{i}", class_name) for i in range(n)]
        s = snap.with_devices(devs)
        return decide(s, Request(EXPLAIN_REQUEST_ID, "probe-ns", "vm", tuple(
            d.name for d in devs))).result is Result.SUCCEEDED

    event(f"largest placeable {class_name} set: {'some' if best else 'none'}")
    if best:
        assert places(best)
    assert not places(best + 1)


@PROPS
@given(clusters(), st.lists(st.sampled_from(["n0", "n1", "n2", "n3", "n4"]), min_size=1,
                            max_size=2), st.sampled_from(["cordon", "drain"]))
def test_B5_what_if_outcomes_are_decide_on_the_cordoned_cluster(snap, nodes, mode):
    nodes = [n for n in nodes if n in snap.nodes]
    assume(nodes)
    live = {(NS, "vm-x"), ("tenant-b", "vm-y")}
    w = what_if(snap, mode, nodes, live_vmis=live, now=NOW)
    sets = held_sets(snap, nodes, live)
    assert [o.set for o in w.outcomes] == sets
    event(f"held sets on the nodes: {bool(sets)}")
    for o in w.outcomes:
        event(f"a set's outcome: {o.action}")
        assert o.action in ("stay", "move", "refused")
        if o.action == "refused":
            assert o.node is None and o.reason is not None and o.reason.request is not None
        elif o.action == "stay":
            assert o.node in nodes and o.moves == () and o.rule in ("B5a", "B5b")
        else:
            assert o.node not in nodes and o.rule == "B1"
    # the first set is judged on the cordoned cluster as it is: decide's own answer
    if sets:
        first = sets[0]
        cordoned = snap.with_nodes(
            n if n.name not in nodes else type(n)(n.name, n.labels, n.allocatable, True)
            for n in snap.nodes.values())
        if first.vmi is not None:
            cordoned = cordoned.without_devices(
                [d.key for d in cordoned.devices_in(first.namespace).values()
                 if d.template_for == first.vmi])
        whole, request = set_request(cordoned, first.namespace,
                                     first.vmi or f"(idle on {first.node})",
                                     VMIAsk(first.held, first.templates))
        d = decide(whole, request, limit=1)
        assert (w.outcomes[0].rule, w.outcomes[0].node) == (d.rule, d.node)


@PROPS
@given(st.tuples(clusters(), st.integers(1, 4)) | st.tuples(fragmented(), st.integers(2, 4)),
       st.sets(st.sampled_from(["vm-x", "vm-y"])))
def test_B1_explain_smallest_change_made_makes_the_set_fit_there(fleet, live):
    """Carrying out the first shortfall that needs no added capacity and no uncordon —
    moving the idle held devices it names to the nodes it names, releasing those with no
    room elsewhere — makes `decide` place the set on that node."""
    from dataclasses import replace as dc_replace

    snap, n = fleet
    live_vmis = {(NS, v) for v in live} | {("tenant-b", v) for v in live}
    ask = VMIAsk((), (("h100", n),))
    e = explain(snap, NS, "vm-1", ask, live_vmis=live_vmis, now=NOW, grace=GRACE)
    doable = [s for s in e.shortfalls if not s.short and not s.uncordon]
    event(f"a shortfall doable by moves alone: {bool(doable) and not e.set_problems}")
    if e.set_problems or not doable:
        return
    s = doable[0]
    moved = snap.with_devices(
        dc_replace(d, status=dc_replace(d.status, node_name=to))
        for (ns, name), to in s.idle if to is not None for d in [snap.device(ns, name)])
    moved = moved.without_devices([key for key, to in s.idle if to is None])  # released
    whole, request = set_request(moved, NS, "vm-1", ask)
    d = decide(whole, request, limit=None)
    assert d.result is Result.SUCCEEDED
    assert s.node in {p.node for p in d.placements}


def test_B3_what_if_keeps_the_vmis_own_node_selector():
    from model.types import BindRequest
    a = attached(dev("a", on="n1"), "vm")
    a = GPUDevice(a.namespace, a.name, a.class_name, None, DeviceStatus(
        a.status.phase, a.status.node_name, a.status.bound_at, a.status.attached_to,
        BindRequest("r1", "vm", ("a",), NOW, (("zone", "a"),), Result.SUCCEEDED, "ok", "n1")))
    snap = Snapshot.build(nodes=[node("n1", h=1, zone="a"), node("n2", h=1, zone="b"),
                                 node("n3", h=1, zone="a")],
                          classes=[gpu_class()], devices=[a])
    [hs] = held_sets(snap, ["n1"], {(NS, "vm")})
    assert hs.node_selector == (("zone", "a"),)
    w = what_if(snap, "cordon", ["n1"], live_vmis={(NS, "vm")}, now=NOW)
    assert [(o.action, o.node) for o in w.outcomes] == [("move", "n3")]  # not n2: zone b
