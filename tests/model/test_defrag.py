"""`model.defrag`: a defragmentation round (docs/contract.md §3a, D1–D5).

Table tests of the plan a fragmented fleet gets, and hypothesis properties over random
fleets: a round never moves an attached, template, requested or `Stay` device (D1), never
puts a node over allocatable counting reservations in flight and moves only to eligible
nodes (D2), never shrinks any class's largest placeable set and grows some class's when it
moves anything (D3), makes at most `max_moves` moves, and leaves every tenant's Bound count
— what budgets cap — as it was (D5). The largest placeable set is the one `top` reports.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from model.decide import Request, decide
from model.defrag import (DefragMove, Largest, apply_moves, eligible_nodes, largest_sets, movable,
                          plan_round)
from model.explain import largest_placeable
from model.hold import Hold
from model.snapshot import Snapshot
from model.types import (Budget, DeviceStatus, GPUDevice, Node, Phase, Result,
                         Taint)
from tests.support.world import CLASSES, H, L, NOW, NS, attached, dev, gpu_class, node

def template(name: str, on: str, vmi: str = "vm-t") -> GPUDevice:
    return GPUDevice(NS, name, "h100", template_for=vmi,
                     status=DeviceStatus(Phase.BOUND, on, NOW))


def fragmented() -> Snapshot:
    """Two 4-unit nodes with 3 units taken each: on n1 one running VM's device and two idle
    held devices, on n2 two running and one idle: one unit free on each, no 2-set fits."""
    devices = [attached(dev("run-1", on="n1")), dev("idle-1", on="n1"), dev("idle-2", on="n1"),
               attached(dev("run-2", on="n2")), attached(dev("run-3", on="n2")),
               dev("idle-3", on="n2")]
    return Snapshot.build(nodes=[node("n1", h=4), node("n2", h=4)], classes=CLASSES,
                          devices=devices)


def test_D3_round_frees_a_node_for_the_larger_set_and_moves_no_running_vm():
    snap = fragmented()
    plan = plan_round(snap, max_moves=4)
    assert [x for x in plan.before if x.class_name == "h100"] == [Largest("h100", H, 1, 2)]
    # clearing either node by one move gives it 2 free units (the other is then full): the
    # same gain with as few moves, so the node name decides (n1); n1's second idle device
    # has nowhere to go then.
    assert plan.moves == (DefragMove((NS, "idle-1"), "h100", H, "n1", "n2", "n1", "h100", 1, 2),)
    assert [x for x in plan.after if x.class_name == "h100"] == [Largest("h100", H, 2, 1)]
    assert plan.grown()[0] == ("h100", 1, 2)
    assert "moved tenant-a/idle-1 (h100) from n1 to n2, freeing n1 so the largest placeable " \
           "h100 set grows from 1 to 2" in plan.moves[0].render()


def test_D3_four_set_fits_after_two_moves_and_decide_agrees():
    devices = [dev("i1", on="n1"), dev("i2", on="n1"), attached(dev("r1", on="n2")),
               attached(dev("r2", on="n2"))]
    snap = Snapshot.build(nodes=[node("n1", h=4), node("n2", h=4)], classes=CLASSES,
                          devices=devices)
    probe = Snapshot.build(nodes=snap.nodes.values(), classes=CLASSES,
                           devices=list(devices) + [dev(f"t{i}") for i in range(4)])
    request = Request("r", NS, "vm-4", tuple(f"t{i}" for i in range(4)))
    assert decide(probe, request).result is Result.REFUSED
    plan = plan_round(snap, max_moves=2)
    assert [(m.device[1], m.from_node, m.to_node) for m in plan.moves] == [("i1", "n1", "n2"),
                                                                          ("i2", "n1", "n2")]
    after = apply_moves(probe, plan.moves)
    assert decide(after, request).result is Result.SUCCEEDED
    assert decide(after, request).node == "n1"
    # with one move allowed, nothing helps on its own... n1 gets 3 free, n2 1: size 3 > 2
    one = plan_round(snap, max_moves=1)
    assert len(one.moves) == 1 and one.after[0].size == 3


def test_D1_attached_template_requested_and_stay_devices_never_move():
    devices = [attached(dev("a", on="n1")), template("t", on="n1"),
               dev("r", on="n1", rid="req", result=Result.SUCCEEDED),
               dev("s", on="n1", cls="stay")]
    snap = Snapshot.build(nodes=[node("n1", h=4), node("n2", h=4)], classes=CLASSES,
                          devices=devices)
    assert not any(movable(d, snap) for d in snap.devices.values())
    assert plan_round(snap).moves == ()


def test_D2_a_reservation_in_flight_takes_the_target_unit():
    devices = [dev("i1", on="n1"), attached(dev("r1", on="n2")), attached(dev("r2", on="n2")),
               attached(dev("r3", on="n2"))]
    base = Snapshot.build(nodes=[node("n1", h=4), node("n2", h=4)], classes=CLASSES,
                          devices=devices)
    assert plan_round(base).moves[0].to_node == "n2"
    held = base.with_reservation(Hold("other", NS, "n2", ((H, 1),), (), ()))
    assert plan_round(held).moves == ()  # n2 has no free unit counting the hold


def test_D2_never_to_a_cordoned_tainted_or_unlabelled_node():
    devices = [dev("i1", on="n1"), attached(dev("x", on="n1"))]
    nodes = [node("n1", h=4), node("n2", h=4, cordoned=True),
             Node("n3", (("kubevirt.io/schedulable", "true"),), ((H, 4),),
                  taints=(Taint("gpu", "", "NoSchedule"),)),
             Node("n4", (), ((H, 4),))]
    snap = Snapshot.build(nodes=nodes, classes=CLASSES, devices=devices)
    assert eligible_nodes(snap, "h100") == {"n1"}
    assert plan_round(snap).moves == ()


def test_max_moves_must_be_positive():
    with pytest.raises(ValueError, match="max_moves must be at least 1"):
        plan_round(fragmented(), max_moves=0)


def test_keep_leaves_devices_of_a_set_being_explained_in_place():
    plan = plan_round(fragmented(), keep={(NS, "idle-3")})
    assert all(m.device != (NS, "idle-3") for m in plan.moves)


# --- properties ------------------------------------------------------------------------------


@st.composite
def fleets(draw):
    n = draw(st.integers(1, 5))
    nodes = []
    for i in range(n):
        nd = node(f"n{i}", h=draw(st.integers(0, 5)), l=draw(st.integers(0, 3)),
                  cordoned=draw(st.integers(0, 5)) == 0)
        if draw(st.integers(0, 6)) == 0:
            nd = Node(nd.name, nd.labels, nd.allocatable, nd.unschedulable,
                      taints=(Taint("t", "", "NoSchedule"),))
        nodes.append(nd)
    names = [x.name for x in nodes]
    devices = []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["idle", "idle", "idle", "attached", "template", "request",
                                     "pending"]))
        cls = draw(st.sampled_from(["h100", "h100", "l40s", "stay"]))
        ns = draw(st.sampled_from([NS, "tenant-b"]))
        on = None if kind == "pending" else draw(st.sampled_from(names))
        if kind == "template":
            d = GPUDevice(ns, f"d{i}", cls, template_for="vm-t",
                          status=DeviceStatus(Phase.BOUND, on, NOW))
        elif kind == "request":
            d = dev(f"d{i}", on=on, cls=cls, ns=ns, rid=f"r{i}")
        else:
            d = dev(f"d{i}", on=on, cls=cls, ns=ns)
            if kind == "attached":
                d = attached(d)
        devices.append(d)
    holds = []
    for j in range(draw(st.integers(0, 2))):
        holds.append(Hold(f"h{j}", NS, draw(st.sampled_from(names)),
                          ((draw(st.sampled_from([H, L])), draw(st.integers(1, 2))),), (), ()))
    budgets = [Budget(NS, H, draw(st.integers(0, 8)))] if draw(st.booleans()) else []
    return Snapshot.build(nodes=nodes, classes=CLASSES, devices=devices, budgets=budgets,
                          reservations=holds)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.integers(1, 5))
def test_D1_D2_D3_D5_a_round_is_safe_and_never_shrinks_a_class(snap, max_moves):
    plan = plan_round(snap, max_moves=max_moves)
    assert len(plan.moves) <= max_moves
    assert plan.before == largest_sets(snap)
    moved = [m.device for m in plan.moves]
    assert len(moved) == len(set(moved))  # each device moves once
    work = snap
    for m in plan.moves:
        d = work.device(*m.device)
        orig = snap.device(*m.device)  # D1, spelled out (not through `movable`)
        assert orig.status.attached_to is None and orig.status.bind_request is None
        assert orig.template_for is None and orig.class_name != "stay" and not orig.deleting
        assert orig.bound_node is not None
        assert d.bound_node == m.from_node != m.to_node
        assert m.to_node in eligible_nodes(snap, d.class_name)  # D2: eligible for its class
        assert work.free(m.to_node, m.resource) >= 1  # D2: counting reservations in flight
        work = apply_moves(work, [m])
    after = work
    assert plan.after == largest_sets(after)
    for b, a in zip(plan.before, plan.after):  # D3: nothing shrinks
        assert a.rank >= b.rank, (b, a)
    event("a round moved devices" if plan.moves else "a round moved nothing")
    if plan.moves:  # D3: only if it helps
        assert any(a.rank > b.rank for b, a in zip(plan.before, plan.after))
    for res in (H, L):  # capacity: a move never takes a node over allocatable
        for n in snap.nodes:
            if snap.free(n, res) >= 0:
                assert after.free(n, res) >= 0
    for ns in (NS, "tenant-b"):  # D5: no budget figure moves
        for res in (H, L):
            assert after.tenant_usage(ns, res) == snap.tenant_usage(ns, res)
    for d in snap.devices.values():  # D1: nothing else moved
        if d.key not in moved:
            assert after.device(*d.key).bound_node == d.bound_node


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_largest_set_is_what_top_reports(snap):
    for x in largest_sets(snap):
        per_node = largest_placeable(snap, x.class_name)
        top = max(per_node.values(), default=0)
        assert x.size == top
        assert x.nodes == (sum(1 for v in per_node.values() if v == top) if top else 0)


# --- explain (D4) ------------------------------------------------------------------------------


def test_D4_explain_says_a_refused_set_would_fit_after_a_defragmentation():
    from model.explain import explain
    from model.parse import VMIAsk

    devices = [dev("i1", on="n1", ns="tenant-b"), dev("i2", on="n1", ns="tenant-b"),
               attached(dev("r1", on="n2")), attached(dev("r2", on="n2"))]
    snap = Snapshot.build(nodes=[node("n1", h=4), node("n2", h=4)], classes=CLASSES,
                          devices=devices)
    e = explain(snap, NS, "vm-4", VMIAsk((), (("h100", 4),)), live_vmis={(NS, "vm-x")},
                now=NOW, grace=timedelta(minutes=2))
    assert not e.admitted
    assert e.after_defrag is not None and e.after_defrag.node == "n1"
    assert [(m.device, m.to_node) for m in e.after_defrag.plan.moves] == [
        (("tenant-b", "i1"), "n2"), (("tenant-b", "i2"), "n2")]
    # one move allowed: the round frees 3 units on n1, not 4: no claim that it would fit
    e1 = explain(snap, NS, "vm-4", VMIAsk((), (("h100", 4),)), live_vmis={(NS, "vm-x")},
                 now=NOW, grace=timedelta(minutes=2), defrag_max_moves=1)
    assert not e1.admitted and e1.after_defrag is None
    # a set that fits now says nothing about defragmentation
    e2 = explain(snap, NS, "vm-2", VMIAsk((), (("h100", 2),)), live_vmis={(NS, "vm-x")},
                 now=NOW, grace=timedelta(minutes=2))
    assert e2.admitted and e2.after_defrag is None
