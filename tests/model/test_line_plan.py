"""The waiting line applied to a planned batch (docs/contract.md §3c P5, `model.line_plan`):
a placement the line holds back becomes a typed refusal and its set waits; backfill keeps
the candidates the line allows; a later refusal for room decided against a held-back
placement is decided again; equal priorities never block each other in a cycle; who enters,
who leaves, who expires."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from model.decide import Request, decide
from model.line import DEFAULT_RESERVE_AFTER, DEFAULT_RETRY_GRACE, Identity, Line, Shape, entry, reservation
from model.line_plan import (LINE_CODES, VM_TTL, first_allowed, gate, gate_batch, identity_of, joins_line,
                             leaves, line_entry, tidy)
from model.plan import Answer, Place, plan_batch
from model.priority import Priority
from model.reasons import Code
from model.snapshot import Snapshot
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result
from tests.support.world import gpu_class, node

T0 = datetime(2026, 12, 4, 10, tzinfo=timezone.utc)
ON_DEMAND = Priority(1000, class_name="on-demand")
SPOT = Priority(0, class_name="spot")


def asking(vmi: str, n: int, *, ns: str = "t", priority: Priority = SPOT, rid: str | None = None,
           owner: str | None = None) -> list[GPUDevice]:
    """`n` new (template) devices of VMI `ns/vmi`, carrying request `rid` (default "r-<vmi>")."""
    rid = rid or f"r-{vmi}"
    names = tuple(f"{vmi}-h100-{i}" for i in range(n))
    br = BindRequest(rid, vmi, names, T0, priority=priority)
    att = Attachment(vmi, T0, rid, owner=owner)
    return [GPUDevice(ns, name, "h100", template_for=vmi,
                      status=DeviceStatus(attached_to=att, bind_request=br)) for name in names]


def fleet(*nodes, devices=()) -> Snapshot:
    return Snapshot.build(nodes=list(nodes), classes=[gpu_class()], devices=list(devices))


def waiting(vmi: str, n: int, *, at: int = 0, priority: Priority = SPOT, ns: str = "t",
            uid: str | None = None):
    return entry(Identity(ns, vmi, uid), Shape((), (("h100", n),)), priority, T0 + timedelta(minutes=at))


def batch_of(snap: Snapshot, *vmis: str):
    out = []
    for vmi in vmis:
        members = tuple(d for d in snap.devices.values() if d.template_for == vmi)
        out.append(("t", f"r-{vmi}", members))
    return out


def test_P5_a_small_set_is_refused_behind_a_waiting_larger_set_of_higher_priority():
    snap = fleet(node("n1", h=8), devices=asking("small", 1))
    line = Line([waiting("big", 8, priority=ON_DEMAND)])
    actions, _ = plan_batch(snap, (), batch_of(snap, "small"))
    assert isinstance(actions[0], Place)
    g = gate_batch(line, snap, (), actions, T0 + timedelta(minutes=1))
    (a,) = g.actions
    assert isinstance(a, Answer) and a.decision.result is Result.REFUSED
    assert a.decision.reason.code is Code.BEHIND_IN_LINE and a.decision.reason.code in LINE_CODES
    assert joins_line(a)
    assert [e.identity.vmi for e in g.line] == ["big", "small"]  # the small set now waits too
    assert g.snapshot.reserved("n1", "nvidia.com/H100") == 0  # its hold is not counted
    assert g.again == frozenset()


def test_P5_backfill_on_room_the_set_ahead_cannot_use_now():
    snap = fleet(node("n1", h=8), node("n2", h=2), devices=asking("small", 1))
    line = Line([waiting("big", 9, priority=ON_DEMAND)])  # fits nowhere now
    actions, _ = plan_batch(snap, (), batch_of(snap, "small"))
    g = gate_batch(line, snap, (), actions, T0)
    assert g.actions == tuple(actions) and g.line == line


def test_P5_a_place_starts_at_the_first_candidate_the_line_allows():
    # n1 (4 free) is where the waiting 4-GPU set fits and nowhere else; n2 has 3 free
    snap = fleet(node("n1", h=4), node("n2", h=3), devices=asking("small", 1))
    line = Line([waiting("big", 4)])
    req = Request("r-small", "t", "small", ("small-h100-0",))
    d = decide(snap, req, limit=None)
    n1_first = replace(d, placements=tuple(sorted(d.placements, key=lambda p: p.node != "n1")),
                       node="n1")
    actions, _ = plan_batch(snap, (), batch_of(snap, "small"))
    place = replace(actions[0], decision=n1_first)
    g = gate(line, snap, place)
    assert isinstance(g, Place) and [p.node for p in g.decision.placements] == ["n2"]
    assert g.decision.node == "n2" and g.hold.node == "n2"
    assert g.decision.outcome.node == "n2"


def test_P5_a_refusal_decided_against_a_held_back_placement_is_decided_again():
    snap = fleet(node("n1", h=4), devices=asking("small", 1) + asking("other", 4))
    line = Line([waiting("big", 4, priority=ON_DEMAND)])
    actions, _ = plan_batch(snap, (), batch_of(snap, "small", "other"))
    assert isinstance(actions[0], Place) and isinstance(actions[1], Answer)
    g = gate_batch(line, snap, (), actions, T0)
    assert g.actions[0].decision.reason.code is Code.BEHIND_IN_LINE
    assert g.again == frozenset({("t", "r-other")})
    assert [e.identity.vmi for e in g.line] == ["big", "small"]  # "other" not yet: decided again


def test_P5_two_equal_priority_sets_never_block_each_other():
    snap = fleet(node("n1", h=4), devices=asking("a", 4) + asking("b", 4))
    line = Line([waiting("a", 4, at=0), waiting("b", 4, at=1)])
    (pa,), _ = plan_batch(snap, (), batch_of(snap, "a"))
    (pb,), _ = plan_batch(snap, (), batch_of(snap, "b"))
    assert isinstance(gate(line, snap, pa), Place)  # the one refused first goes
    blocked = gate(line, snap, pb)
    assert isinstance(blocked, Answer) and blocked.decision.reason.code is Code.BEHIND_IN_LINE
    # whoever comes first in a batch, the head is placed and never held back by the other
    for order in (("a", "b"), ("b", "a")):
        actions, _ = plan_batch(snap, (), batch_of(snap, *order))
        g = gate_batch(line, snap, (), actions, T0)
        placed = [a.request.vmi for a in g.actions if isinstance(a, Place)]
        if order[0] == "a":
            assert placed == ["a"] and g.again == frozenset()
        else:  # b held back behind a; a, refused against b's hold, is decided again (and placed)
            assert placed == [] and g.again == frozenset({("t", "r-a")})


def test_P5_a_reserved_node_refuses_with_node_reserved():
    snap = fleet(node("n1", h=4), devices=asking("small", 1)
                 + [GPUDevice("o", f"x{i}", "h100", status=DeviceStatus(phase=Phase.BOUND, node_name="n1"))
                    for i in range(2)])
    big = waiting("big", 4, priority=ON_DEMAND)
    line = Line([big])
    now = T0 + DEFAULT_RESERVE_AFTER + timedelta(seconds=1)
    res = reservation(line, snap, now)
    assert res == {big.identity: "n1"}
    actions, _ = plan_batch(snap, (), batch_of(snap, "small"))
    g = gate_batch(line, snap, (), actions, now, reservations=res)
    assert g.actions[0].decision.reason.code is Code.NODE_RESERVED


def test_P5_who_enters_leaves_and_expires():
    snap = fleet(node("n1", h=1), devices=asking("vm-set", 2, owner="uid-1") + asking("bare", 2))
    actions, _ = plan_batch(snap, (), batch_of(snap, "vm-set", "bare"))
    assert all(joins_line(a) for a in actions)  # no room: both wait
    g = gate_batch(Line(), snap, (), actions, T0)
    by = {e.identity.vmi: e for e in g.line}
    assert by["vm-set"].identity == Identity("t", "vm-set", "uid-1") and by["bare"].identity.vm_uid is None
    assert by["vm-set"].priority == SPOT and by["vm-set"].shape == Shape((), (("h100", 2),))
    req = Request("r-bare", "t", "bare", ("bare-h100-0", "bare-h100-1"))
    assert identity_of(snap, req) == Identity("t", "bare")
    assert line_entry(snap, req, T0).first_refused == T0
    # a bare VMI's entry expires after the ttl, a VM's only after VM_TTL
    later = tidy(g.line, T0 + DEFAULT_RETRY_GRACE + timedelta(seconds=1))
    assert [e.identity.vmi for e in later] == ["vm-set"]
    assert tidy(later, T0 + VM_TTL) is later
    assert len(tidy(later, T0 + VM_TTL + timedelta(seconds=1))) == 0
    left_line, left = leaves(g.line, snap, req)
    assert left is by["bare"] and [e.identity.vmi for e in left_line] == ["vm-set"]
    assert leaves(left_line, snap, req) == (left_line, None)
    # refused again: the first-refused time (the place) stays
    again = gate_batch(g.line, snap, (), actions, T0 + timedelta(minutes=1)).line
    assert {e.identity.vmi: e.first_refused for e in again} == {"vm-set": T0, "bare": T0}


def test_P5_policy_refusals_do_not_wait():
    snap = fleet(node("n1", h=4), devices=asking("x", 1))
    req_actions, _ = plan_batch(snap, (), [("t", "r-x", tuple(snap.devices.values())[:0])])
    assert not joins_line(req_actions[0])  # a Skip


def test_P5_a_fallback_takes_only_a_candidate_the_line_allows():
    snap = fleet(node("n1", h=4), node("n2", h=3), devices=asking("small", 1))
    req = Request("r-small", "t", "small", ("small-h100-0",), priority=SPOT)
    d = decide(snap, req, limit=None)
    by_node = {p.node: p for p in d.placements}
    line = Line([waiting("big", 4)])  # fits n1 only
    assert first_allowed(line, snap, req, [by_node["n1"], by_node["n2"]]) is by_node["n2"]
    assert first_allowed(line, snap, req, [by_node["n1"]]) is None
    assert first_allowed(Line(), snap, req, [by_node["n1"]]) is by_node["n1"]


def test_P5_a_request_holding_room_in_flight_keeps_it_whoever_entered_the_line_since():
    """A placement decided (and let through) earlier whose writes stalled is decided again
    with its own hold in flight: a set refused meanwhile for that very room does not take it."""
    from model.hold import Hold

    snap = fleet(node("n1", h=1), devices=asking("first", 1))
    line = Line([waiting("later", 1)])  # refused while "first"'s unit was held
    actions, _ = plan_batch(snap, [Hold("r-first", "t", "n1", (("nvidia.com/H100", 1),))], batch_of(snap, "first"))
    assert isinstance(actions[0], Place)
    held = [Hold("r-first", "t", "n1", (("nvidia.com/H100", 1),))]
    assert gate_batch(line, snap, held, actions, T0).actions == tuple(actions)
    assert isinstance(gate_batch(line, snap, (), actions, T0).actions[0], Answer)  # not in flight: behind


def test_P5_a_bare_vmi_keeps_its_place_only_while_its_client_retries_within_the_grace():
    """`line.retryGrace` (default 10 s, five periods of the 503's 2 s Retry-After): a bare
    VMI's entry not attempted again for longer leaves at the next `tidy` (its client stopped:
    kubectl after its retries, or one that never retries); each attempt (`Line.refused`)
    restarts the grace and keeps its first refusal, so its place; a VM's entry is not
    touched (VM_TTL). Before: kept two minutes after the last attempt."""
    from model.line import DEFAULT_RETRY_GRACE, RETRY_AFTER, RETRY_PERIODS, LineSettings
    assert DEFAULT_RETRY_GRACE == timedelta(seconds=RETRY_PERIODS * RETRY_AFTER) == timedelta(seconds=10)
    assert LineSettings().retry_grace == DEFAULT_RETRY_GRACE
    bare, other = waiting("bare", 2), waiting("other", 1)
    other = replace(other, first_refused=T0 + timedelta(seconds=1), last_seen=T0 + timedelta(seconds=1))
    vm = replace(waiting("vm", 2), identity=Identity("t", "vm", "uid-1"))
    line = Line([bare, other, vm])
    assert tidy(line, T0 + timedelta(seconds=10)) is line                     # at the grace: kept
    assert [e.identity.vmi for e in tidy(line, T0 + timedelta(seconds=10.5))] == ["vm", "other"]
    assert [e.identity.vmi for e in tidy(line, T0 + timedelta(seconds=12))] == ["vm"]
    # retried every Retry-After for a minute: kept all along, first refusal and place unchanged
    now = T0
    for _ in range(30):
        now += timedelta(seconds=RETRY_AFTER)
        line = tidy(line.refused(entry(bare.identity, bare.shape, bare.priority, now), now), now)
        assert line.entries[0].identity.vmi == "bare" and line.entries[0].first_refused == T0
    assert [e.identity.vmi for e in line] == ["bare", "vm"]                   # other stopped: gone
    assert [e.identity.vmi for e in tidy(line, now + timedelta(seconds=11))] == ["vm"]
    # the operator's setting
    wide = LineSettings(retry_grace=timedelta(seconds=30))
    assert len(tidy(line, now + timedelta(seconds=25), wide)) == 2


def test_P5_attacker_a_flood_of_bare_entries_keeps_the_namespace_s_bound():
    """A tenant creating bare VMIs refused for room as fast as it can: each refusal tries to
    enter (`Line.refused` with `line.maxPerNamespace`); the tenant holds its first 100 places,
    a later one never pushes out another of its own, and another tenant's entry enters."""
    from model.line import DEFAULT_PER_NAMESPACE
    line = Line()
    for i in range(DEFAULT_PER_NAMESPACE + 50):
        e = waiting(f"flood-{i}", 1, at=i)
        line = line.refused(e, e.first_refused, DEFAULT_PER_NAMESPACE)
    assert len(line) == DEFAULT_PER_NAMESPACE
    assert {e.identity.vmi for e in line} == {f"flood-{i}" for i in range(DEFAULT_PER_NAMESPACE)}
    u = waiting("u-set", 1, ns="u", at=500)
    line = line.refused(u, u.first_refused, DEFAULT_PER_NAMESPACE)
    assert len(line) == DEFAULT_PER_NAMESPACE + 1 and line.find(u.identity) is not None
    # and when the flood stops retrying, all its places go within the grace
    assert [e.identity.vmi for e in tidy(line, u.first_refused + timedelta(seconds=10))] == ["u-set"]


def test_P5_a_bare_vmi_refused_once_holds_back_nobody_until_its_client_retries():
    """A bare VMI's first refusal for room gives it its first-refused time but no real place:
    a create never retried (tests/e2e/test_vm_keep_devices.py's probes, 2 s before another
    set of the tenant) must not hold that set back. Its W1 refusal told twice in one review
    (on the cache, after the live read: less than `SAME_ATTEMPT` apart) is one attempt; its
    client's retry after the Retry-After makes the place real, ahead by its first refusal. A
    VM's entry (KubeVirt retries) is real at once. Before: every entry held back at once. A
    refusal whose attempt is unknown is no retry, however late it comes."""
    from model.line import RETRY_AFTER
    assert RETRY_AFTER == 2
    # as w1_entry / line_entry make a bare VMI's
    late = replace(waiting("late", 8), retried=False, attempt="review-1")
    line = Line().refused(late, T0).refused(late, T0 + timedelta(milliseconds=5))  # one review, told twice
    assert not line.entries[0].retried
    unknown = replace(late, attempt="")
    assert not Line().refused(unknown, T0).refused(unknown, T0 + timedelta(minutes=1)).entries[0].retried
    snap = fleet(node("n1", h=8), devices=asking("after", 1))
    actions, _ = plan_batch(snap, (), batch_of(snap, "after"))
    now = T0 + timedelta(seconds=1.5)
    assert isinstance(gate_batch(line, snap, (), actions, now).actions[0], Place)   # not held back
    retried = line.refused(replace(late, attempt="review-2"),                        # its client retried
                           T0 + timedelta(seconds=RETRY_AFTER))
    assert retried.entries[0].retried and retried.entries[0].first_refused == T0
    (a,) = gate_batch(retried, snap, (), actions, T0 + timedelta(seconds=RETRY_AFTER)).actions
    assert isinstance(a, Answer) and a.decision.reason.code is Code.BEHIND_IN_LINE   # now it is
    # the binder's refusal of a bare VMI makes an unconfirmed entry, a VM's a real one
    busy = GPUDevice("o", "busy-0", "h100", status=DeviceStatus(Phase.BOUND, "n1", T0, None, None))
    full = fleet(node("n1", h=1), devices=[busy, *asking("bare", 1), *asking("vm", 1, owner="uid")])
    planned, _ = plan_batch(full, (), batch_of(full, "bare", "vm"))
    assert all(joins_line(x) for x in planned)
    refused = gate_batch(Line(), full, (), planned, T0).line
    assert {e.identity.vmi: e.retried for e in refused} == {"bare": False, "vm": True}


def test_P5_retried_means_another_create_attempt_not_a_later_refusal_of_the_same_one():
    """`Entry.attempt` decides what a retry is: the same attempt refused again seconds later
    (a follower's request decided in a later batch, W1 judged twice on a loaded machine) is
    not its client's retry, and holds back nobody; another attempt (a new review uid or bind
    request id) is, however soon it comes. (tests/e2e/test_vm_keep_devices.py, fresh clone:
    a never-retried probe held the tenant's next VMI back, `behind_in_line`, when its two
    refusals came more than a second apart and a time rule judged them two attempts.)"""
    late = replace(waiting("late", 8), retried=False, attempt="review-1")
    slow = Line().refused(late, T0).refused(late, T0 + timedelta(seconds=5))
    assert not slow.entries[0].retried and slow.entries[0].attempt == "review-1"
    snap = fleet(node("n1", h=8), devices=asking("after", 1))
    actions, _ = plan_batch(snap, (), batch_of(snap, "after"))
    assert isinstance(gate_batch(slow, snap, (), actions, T0 + timedelta(seconds=5)).actions[0], Place)
    again = slow.refused(replace(late, attempt="review-2"), T0 + timedelta(seconds=5.1))
    assert again.entries[0].retried and again.entries[0].first_refused == T0
    assert again.entries[0].attempt == "review-2"
    (a,) = gate_batch(again, snap, (), actions, T0 + timedelta(seconds=5.1)).actions
    assert isinstance(a, Answer) and a.decision.reason.code is Code.BEHIND_IN_LINE
    # the binder's entry carries its request's id
    devs = asking("bare", 1)
    req = Request("r-bare-7", "t", "bare", tuple(d.name for d in devs))
    assert line_entry(fleet(node("n1", h=8), devices=devs), req, T0).attempt == "r-bare-7"
