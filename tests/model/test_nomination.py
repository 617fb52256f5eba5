"""The nomination (docs/contract.md §3c P4; `model.nomination`, `model.nominate`, `model.plan`'s
`Nominate`): the GPUNomination object parsed and built, the decision loop nominating a set
refused for room (or reusing its own live nomination), the hold (P6: another request never
lands on nominated room while it lives, in count and device mode), the preemptor landing on
its nominated room once the victims are gone, and an expired nomination holding nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from model.decide import Request
from model.nominate import NominationSettings, Preempting, nominate, nomination_of
from model.nomination import (Nomination, RoomMove, Victim, hold_id, nomination_body, nomination_holds,
                              nomination_name, parse_nomination)
from model.parse import ParseError
from model.plan import Answer, Nominate, Place, plan_batch
from model.preemption import PreemptionPlan, plan_preemption, release_sets
from model.reasons import Code
from model.snapshot import Snapshot
from model.types import Result
from tests.model.test_preemption import NOW, asking, count_world, dra_world, vm_set
from tests.support.dra_worlds import CLASS, DRIVER, dra_node, ref
from tests.support.world import H, node

PRE = Preempting(NOW)


def members(snap: Snapshot, req: Request):
    return [snap.device(req.namespace, n) for n in req.devices]


def batch(snap: Snapshot, *reqs: Request, preempting: Preempting | None = PRE):
    actions, _ = plan_batch(snap, (), [(r.namespace, r.id, members(snap, r)) for r in reqs], preempting)
    return actions


def without(snap: Snapshot, plan_or_nom) -> Snapshot:
    """`snap` once the victims stopped (their sets released as P3 releases them)."""
    sets = [s for s in _running(snap) if (s.namespace, s.vmi) in {(v.namespace, v.vmi) for v in plan_or_nom.victims}]
    return release_sets(snap, sets)


def _running(snap):
    from model.preemption import running_sets
    return running_sets(snap)


# --- the object -----------------------------------------------------------------------------


def sample() -> Nomination:
    return Nomination("p", "vm-9", 1000, "n1", ((H, 4),), (ref("n1", 0), ref("n1", 1)),
                      (Victim("t", "a", "adm-a", "uid-a", 100, NOW - timedelta(hours=1)),
                       Victim("t", "b", None, None, 0, NOW - timedelta(hours=2))),
                      NOW, NOW + timedelta(minutes=2), 30)


def test_the_object_round_trips_and_is_named_after_its_preemptor():
    n = sample()
    body = nomination_body(n, "cozy-system")
    assert body["metadata"] == {"name": "p.vm-9", "namespace": "cozy-system",
                                "labels": {"gpu.cozystack.io/preemptor-namespace": "p"}}
    assert body["kind"] == "GPUNomination" and body["apiVersion"] == "gpu.cozystack.io/v1alpha1"
    assert body["spec"]["victims"][1] == {"namespace": "t", "vmi": "b", "priority": 0,
                                          "started": "2026-12-06T10:00:00Z"}
    assert parse_nomination(body) == n
    assert nomination_name("p", "vm-9") == n.name == "p.vm-9"
    long = nomination_name("p" * 63, "v" * 253)
    assert len(long) <= 253 and long == nomination_name("p" * 63, "v" * 253)


@pytest.mark.parametrize("path, value, field", [
    (("spec", "node"), None, "spec.node"),
    (("spec", "preemptor"), "x", "spec.preemptor"),
    (("spec", "expires"), "yesterday", "spec.expires"),
    (("spec", "units"), [{"resource": H, "count": 0}], "spec.units[0].count"),
    (("spec", "devices"), [{"driver": DRIVER, "pool": "n1"}], "spec.devices[0].device"),
    (("spec", "victims"), [{"namespace": "t", "vmi": "a", "started": "2026-12-06T10:00:00"}],
     "spec.victims[0].started"),
])
def test_a_malformed_object_is_refused_naming_the_field(path, value, field):
    body = nomination_body(sample(), "cozy-system")
    body[path[0]][path[1]] = value
    with pytest.raises(ParseError) as err:
        parse_nomination(body)
    assert err.value.field == field and "GPUNomination cozy-system/p.vm-9" in str(err.value)


def with_moves() -> Nomination:
    """`sample` with a D-move off n1 (count mode) and, device mode, a move and a re-point."""
    return replace(sample(), moves=(
        RoomMove("t", "g1", "h100", H, "n1", "n2"),
        RoomMove("u", "g2", CLASS, "gpu.nvidia.com/vfio", "n1", "n3", ref("n1", 3), ref("n3", 7)),
        RoomMove("u", "g3", CLASS, "gpu.nvidia.com/vfio", "n1", "n1", ref("n1", 2), ref("n1", 5))))


def test_the_moves_round_trip_and_an_object_without_them_has_none():
    n = with_moves()
    body = nomination_body(n, "cozy-system")
    assert body["spec"]["moves"][0] == {"namespace": "t", "name": "g1", "class": "h100", "resource": H,
                                        "fromNode": "n1", "toNode": "n2"}
    assert body["spec"]["moves"][2]["toDevice"] == {"driver": DRIVER, "pool": "n1", "device": "gpu-vfio-5"}
    assert parse_nomination(body) == n
    # an object written before moves existed (no spec.moves) has none; none written for none
    old = nomination_body(sample(), "cozy-system")
    assert "moves" not in old["spec"]
    assert parse_nomination(old).moves == () and parse_nomination(old) == sample()


@pytest.mark.parametrize("move, field", [
    ({"namespace": "t", "name": "g", "class": "h100", "resource": H, "fromNode": "n1"}, "spec.moves[0].toNode"),
    ({"namespace": "t", "name": "g", "class": "h100", "resource": H, "fromNode": "n1", "toNode": "n2",
      "toDevice": {"driver": DRIVER, "pool": "n2"}}, "spec.moves[0].toDevice.device"),
])
def test_a_malformed_move_is_refused_naming_the_field(move, field):
    body = nomination_body(sample(), "cozy-system")
    body["spec"]["moves"] = [move]
    with pytest.raises(ParseError) as err:
        parse_nomination(body)
    assert err.value.field == field


def test_a_nominations_moves_hold_their_targets_until_the_devices_are_there():
    n = with_moves()
    main, *moved = n.holds()
    # the re-point's device is held on the nominated node with the room
    assert main.node == "n1" and main.device_names == {"gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-5"}
    assert [(h.node, h.needs, h.device_names) for h in moved] == [
        ("n2", ((H, 1),), frozenset()), ("n3", (("gpu.nvidia.com/vfio", 1),), frozenset({"gpu-vfio-7"}))]
    assert {h.request_id for h in n.holds()} == {hold_id("p", "vm-9")}
    # once the view shows g1 Bound on n2, its hold there takes nothing
    from model.types import DeviceStatus, GPUDevice, Phase
    view = {("t", "g1"): GPUDevice("t", "g1", "h100", status=DeviceStatus(Phase.BOUND, "n2", NOW)),
            ("u", "g2"): GPUDevice("u", "g2", CLASS, status=DeviceStatus(Phase.BOUND, "n1", NOW,
                                                                         device=ref("n1", 3)))}
    held = nomination_holds([n], NOW, lambda ns: {k[1]: d for k, d in view.items() if k[0] == ns})
    assert held == n.holds(view.get)
    assert held[1].empty and not held[2].empty and held[2].device_names == {"gpu-vfio-7"}
    assert n.holds(lambda k: None)[2].empty  # a device gone lands nowhere: nothing held for it


def test_the_hold_is_the_room_and_named_for_the_preemptor():
    h = sample().hold()
    assert h.request_id == hold_id("p", "vm-9") and h.node == "n1" and h.needs == ((H, 4),)
    assert h.budget_needs == () and h.device_names == {"gpu-vfio-0", "gpu-vfio-1"}


# --- count mode -----------------------------------------------------------------------------


def full_count_world(*extra):
    """n1 (4 GPUs) full of spot VMs a (2) and b (2), priority 100, run an hour; n2 (4) full
    of c (4) of priority 1000 (never a victim of 1000)."""
    return count_world([node("n1", 4), node("n2", 4)], vm_set("a", "n1", 2, value=100),
                       vm_set("b", "n1", 2, value=100), vm_set("c", "n2", 4, value=1000), *extra)


def test_a_set_refused_for_room_is_nominated_with_P3s_victims():
    devices, req = asking("vm-9", 4)
    snap = full_count_world(devices)
    [action] = batch(snap, req)
    assert isinstance(action, Nominate) and action.nominated.fresh
    n = action.nominated.nomination
    plan = plan_preemption(snap, req, NOW)
    assert isinstance(plan, PreemptionPlan)
    assert (n.namespace, n.vmi, n.priority, n.node) == ("p", "vm-9", 1000, "n1")
    assert [v.vmi for v in n.victims] == [v.vmi for v in plan.victims] == ["a", "b"]
    assert n.units == ((H, 4),) and n.devices == ()
    assert n.expires == NOW + timedelta(minutes=2) and n.retry_after == 30
    assert [v.admission for v in n.victims] == ["adm-a", "adm-b"]
    reason = action.nominated.reason
    assert reason.code is Code.PREEMPTION_NOMINATED and reason.victims == ("t/a", "t/b")
    assert action.nominated.decision.result is Result.REFUSED


def test_without_preempting_the_refusal_stands():
    devices, req = asking("vm-9", 4)
    [action] = batch(full_count_world(devices), req, preempting=None)
    assert isinstance(action, Answer) and action.decision.result is Result.REFUSED
    off = Preempting(NOW, NominationSettings(enabled=False))
    [action] = batch(full_count_world(devices), req, preempting=off)
    assert isinstance(action, Answer)


def test_no_plan_no_nomination_equal_priority_never_preempts():
    devices, req = asking("vm-9", 4, value=100)
    [action] = batch(full_count_world(devices), req)
    assert isinstance(action, Answer) and action.decision.result is Result.REFUSED


def test_a_live_nomination_is_reused_never_doubled():
    devices, req = asking("vm-9", 4)
    snap = full_count_world(devices)
    [first] = batch(snap, req)
    made = first.nominated.nomination
    later = Preempting(NOW + timedelta(seconds=30))
    again = replace(req, id="rp2")
    devices2 = [replace(d, status=replace(d.status, bind_request=replace(d.status.bind_request, id="rp2")))
                for d in devices]
    snap2 = full_count_world(devices2).with_nominations([made])
    [action] = batch(snap2, again, preempting=later)
    assert isinstance(action, Nominate) and not action.nominated.fresh
    assert action.nominated.nomination == made


def test_P6_another_request_never_lands_on_nominated_room():
    devices, req = asking("vm-9", 4)
    snap = full_count_world(devices)
    [action] = batch(snap, req)
    n = action.nominated.nomination
    # the victims stopped: n1 is empty; another VMI asking 2 (priority 5000) finds no room
    other_devices, other = asking("vm-x", 2, ns="q", value=5000)
    other_devices = [replace(d, status=replace(d.status, bind_request=replace(d.status.bind_request, id="rq")))
                     for d in other_devices]
    other = replace(other, id="rq")
    gone = without(snap, n).with_devices(other_devices).with_nominations([n])
    [decided] = batch(gone, other, preempting=Preempting(NOW + timedelta(seconds=5)))
    assert not isinstance(decided, Place)


def test_P6_a_fresh_nomination_holds_its_room_for_the_rest_of_its_batch():
    # n1: 4 GPUs, spot VM a takes 2, 2 are free; vm-9 (4) nominates a; vm-x (2, priority 0,
    # cannot preempt) decided after it in the same batch does not take the 2 free ones
    devices, req = asking("vm-9", 4)
    other_devices, other = asking("vm-x", 2, ns="q", value=0)
    other_devices = [replace(d, status=replace(d.status, bind_request=replace(d.status.bind_request, id="rq")))
                     for d in other_devices]
    other = replace(other, id="rq")
    snap = count_world([node("n1", 4)], vm_set("a", "n1", 2, value=100), devices, other_devices)
    first, second = batch(snap, req, other)
    assert isinstance(first, Nominate) and [v.vmi for v in first.nominated.nomination.victims] == ["a"]
    assert isinstance(second, Answer) and second.decision.result is Result.REFUSED
    # the same request alone (no nomination) takes them
    [alone] = batch(snap, other)
    assert isinstance(alone, Place) and alone.decision.node == "n1"


def test_the_preemptor_lands_on_its_nominated_node_once_the_victims_are_gone():
    devices, req = asking("vm-9", 4)
    snap = full_count_world(devices)
    [action] = batch(snap, req)
    n = action.nominated.nomination
    # a free node n3 appears too: B4 alone could choose either, the nomination chooses n1
    gone = without(snap, n).with_nominations([n])
    gone = gone.with_nodes([*gone.nodes.values(), node("n0", 4)])
    [placed] = batch(gone, req, preempting=Preempting(NOW + timedelta(seconds=40)))
    assert isinstance(placed, Place) and placed.decision.node == "n1"
    # while the victims still run it is refused again, with the same nomination
    [still] = batch(snap.with_nominations([n]), req, preempting=Preempting(NOW + timedelta(seconds=40)))
    assert isinstance(still, Nominate) and still.nominated.nomination == n


def test_an_expired_nomination_holds_nothing():
    devices, req = asking("vm-9", 4)
    snap = full_count_world(devices)
    [action] = batch(snap, req)
    n = action.nominated.nomination
    later = NOW + timedelta(minutes=3)
    assert nomination_holds([n], later) == ()
    assert nomination_holds([n], NOW + timedelta(minutes=1)) == (n.hold(),)
    other_devices, other = asking("vm-x", 4, ns="q", value=0)
    gone = without(snap, n).with_devices(other_devices).with_nominations([n])
    [decided] = batch(gone, other, preempting=Preempting(later))
    assert isinstance(decided, Place) and decided.decision.node == "n1"
    [held] = batch(gone, other, preempting=Preempting(NOW + timedelta(seconds=1)))
    assert not isinstance(held, Place)


def test_an_admitted_preemptor_s_nomination_holds_nothing():
    n = sample()
    landed = vm_set("vm-9", "n1", 4, ns="p", value=1000)
    snap = count_world([node("n1", 4)], landed)
    assert nomination_holds([n], NOW, snap.devices_in) == ()
    assert nomination_holds([n], NOW, count_world([node("n1", 4)]).devices_in) == (n.hold(),)


# --- device mode ----------------------------------------------------------------------------


def full_dra_world(*extra):
    """n1 (8 HGX GPUs, partition groups {0-3}, {4-7}) full: a (0-3, priority 100) and b (4-7,
    priority 500)."""
    return dra_world([dra_node("n1")], vm_set("a", "n1", 4, cls=CLASS, indices=(0, 1, 2, 3), value=100),
                     vm_set("b", "n1", 4, cls=CLASS, indices=(4, 5, 6, 7), value=500), *extra)


def test_device_mode_nominates_the_exact_devices_and_holds_them_from_others():
    devices, req = asking("vm-9", 4, cls=CLASS)
    snap = full_dra_world(devices)
    [action] = batch(snap, req)
    assert isinstance(action, Nominate)
    n = action.nominated.nomination
    assert [v.vmi for v in n.victims] == ["a"] and n.node == "n1"
    assert sorted(d.device for d in n.devices) == [f"gpu-vfio-{i}" for i in range(4)]
    # victims gone: another set of 4 (any priority) is refused; the preemptor takes exactly those
    other_devices, other = asking("vm-x", 4, ns="q", cls=CLASS, value=5000)
    other_devices = [replace(d, status=replace(d.status, bind_request=replace(d.status.bind_request, id="rq")))
                     for d in other_devices]
    other = replace(other, id="rq")
    gone = without(snap, n).with_devices(other_devices).with_nominations([n])
    soon = Preempting(NOW + timedelta(seconds=5))
    [decided] = batch(gone, other, preempting=soon)
    assert not isinstance(decided, Place)
    [placed] = batch(gone, req, preempting=soon)
    assert isinstance(placed, Place) and placed.decision.node == "n1"
    assert sorted(r.device for _, r in placed.decision.placements[0].devices) == sorted(d.device for d in n.devices)
    # expired: the other set takes them
    [taken] = batch(gone, other, preempting=Preempting(NOW + timedelta(minutes=5)))
    assert isinstance(taken, Place) and taken.decision.node == "n1"


def _w1(snap: Snapshot, ns: str, vmi: str, cls: str, n: int, at):
    from model.admission import check
    from model.housekeeping import VMIs
    from model.parse import VMIAsk
    return check(snap, ns, vmi, VMIAsk((), ((cls, n),)), VMIs(), at, timedelta(seconds=30))


@pytest.mark.parametrize("mode", ["count", "device"])
def test_P6_W1_counts_nominated_room_as_taken_for_all_but_its_preemptor(mode):
    """W1 holds a live nomination's room as the binder's planner does: once the victims are
    gone another set (of any priority) is refused there for room at W1 (it waits in line, or
    is nominated, without a bind request), the preemptor passes W1 on that node, and an expired
    nomination holds nothing. Before, W1 passed the other set on the nominated room and the
    binder refused it (a 403 the client did not retry)."""
    from model.admission import AdmissionPlan, Refusal
    from model.reasons import CannotPlace

    cls = CLASS if mode == "device" else "h100"
    devices, req = asking("vm-9", 4, cls=cls)
    snap = full_dra_world(devices) if mode == "device" else full_count_world(devices)
    [action] = batch(snap, req)
    n = action.nominated.nomination
    gone = without(snap, n).with_nominations([n])
    soon = NOW + timedelta(seconds=5)
    other = _w1(gone, "q", "vm-x", cls, 4 if mode == "device" else 2, soon)
    assert isinstance(other, Refusal) and isinstance(other.reason, CannotPlace), other
    own = _w1(gone, "p", "vm-9", cls, 4, soon)
    assert isinstance(own, AdmissionPlan) and own.node == "n1"
    late = _w1(gone, "q", "vm-x", cls, 4 if mode == "device" else 2, NOW + timedelta(minutes=5))
    assert isinstance(late, AdmissionPlan) and late.node == "n1"   # expired: the room is anyone's
    assert isinstance(_w1(without(snap, n), "q", "vm-x", cls, 2, soon), AdmissionPlan)  # no nomination


def test_nominate_directly_needs_a_refusal_for_room():
    devices, req = asking("vm-9", 1)
    snap = count_world([node("n1", 4)], devices)
    from model.decide import decide
    assert nominate(snap, req, decide(snap, req), PRE) is None


def test_nomination_of_caps_retry_after_by_the_ttl():
    devices, req = asking("vm-9", 4)
    plan = plan_preemption(full_count_world(devices), req, NOW)
    short = NominationSettings(ttl=timedelta(seconds=10), retry_after=30)
    n = nomination_of(plan, NOW, short)
    assert n.retry_after == 10 and n.expires == NOW + timedelta(seconds=10)


# --- the leader's sweep ---------------------------------------------------------------------


def test_sweep_stops_only_running_victims_of_live_nominations_and_drops_the_done():
    from model.nomination import sweep
    live = sample()
    old = replace(sample(), vmi="vm-old", expires=NOW - timedelta(seconds=1))
    vmis = {("t", "a"): ("uid-a", "adm-a"), ("t", "b"): ("uid-b", "adm-b")}
    plan = sweep([old, live], NOW, lambda ns, n: vmis.get((ns, n)), lambda ns: {})
    # a is the recorded incarnation (uid and admission); b has no admission recorded: by name
    assert [(s.victim.vmi, s.uid) for s in plan.stops] == [("a", "uid-a"), ("b", "uid-b")]
    assert [(d.nomination.vmi, d.why) for d in plan.drops] == [("vm-old", "expired")]
    assert plan.waiting == ((live, 2),)
    # a recreated a (another uid) is never stopped; an expired nomination stops nobody
    vmis[("t", "a")] = ("uid-a2", "adm-a")
    plan = sweep([live], NOW, lambda ns, n: vmis.get((ns, n)), lambda ns: {})
    assert [s.victim.vmi for s in plan.stops] == ["b"]
    assert sweep([live], NOW + timedelta(minutes=5), lambda ns, n: vmis.get((ns, n)), lambda ns: {}).stops == ()
    # the preemptor admitted on its node: dropped, nobody stopped
    landed = {d.name: d for d in vm_set("vm-9", "n1", 4, ns="p", value=1000)}
    plan = sweep([live], NOW, lambda ns, n: vmis.get((ns, n)), lambda ns: landed if ns == "p" else {})
    assert plan.stops == () and [(d.nomination.vmi, d.why) for d in plan.drops] == [("vm-9", "admitted")]


# --- W1: a set that would be nominated goes on to the binder ----------------------------------


def test_w1_lets_a_set_refused_for_room_go_on_when_it_would_be_nominated():
    from model.nominate import w1_nominee
    from model.priority import Priority
    from model.reasons import NoFreeUnit, NotEntitled
    snap = full_count_world()
    room = NoFreeUnit("h100", H)
    templates = [(f"vm-9-h100-{i}", "h100") for i in range(4)]
    high, equal = Priority(1000), Priority(100)
    assert w1_nominee(snap, "p", "vm-9", room, (), templates, high, NOW) == "n1"
    from model.reasons import NoRoomForSet
    assert w1_nominee(snap, "p", "vm-9", NoRoomForSet(), (), templates, high, NOW) == "n1"
    assert w1_nominee(snap, "p", "vm-9", room, (), templates, equal, NOW) is None  # never equal
    from model.priority import PreemptionPolicy
    never = Priority(1000, PreemptionPolicy.NEVER)
    assert w1_nominee(snap, "p", "vm-9", room, (), templates, never, NOW) is None
    assert w1_nominee(snap, "p", "vm-9", NotEntitled("p", "h100"), (), templates, high, NOW) is None
    off = NominationSettings(enabled=False)
    assert w1_nominee(snap, "p", "vm-9", room, (), templates, high, NOW, off) is None
    # its live nomination: its node, whatever the plan would say now
    n = replace(sample(), namespace="p", vmi="vm-9", node="n2")
    assert w1_nominee(snap.with_nominations([n]), "p", "vm-9", room, (), templates, equal, NOW) == "n2"


# --- a victim that will not die within the nomination's life ---------------------------------


def test_victims_being_deleted_are_not_named_again_when_their_nomination_expired():
    """P2/P4 (docs/contract.md §3c, "A victim that will not die"): a VMI being deleted
    already is no victim. While the nomination lives it is reused as before; once it expired
    (its victims stuck, a finalizer) the preemptor is not re-nominated on the same victims:
    refused plainly when nothing else makes room, else planned on other victims only."""
    from model.decide import decide
    devices, req = asking("vm-9", 4)
    snap = full_count_world(devices)
    made = nomination_of(plan_preemption(snap, req, NOW), NOW, NominationSettings(ttl=timedelta(seconds=60)))
    assert [v.vmi for v in made.victims] == ["a", "b"]
    stuck = snap.with_stopping({("t", "a"), ("t", "b")})
    assert stuck.stopping == {("t", "a"), ("t", "b")} and snap.stopping == frozenset()
    # alive: reused, whatever its victims do
    live = stuck.with_nominations([made])
    got = nominate(live, req, decide(live, req), PRE)
    assert got is not None and got.nomination == made and not got.fresh
    # expired (and then dropped): no new nomination on the same victims
    later = Preempting(NOW + timedelta(seconds=61))
    for s in (stuck.with_nominations([made]), stuck):
        assert nominate(s, req, decide(s, req), later) is None
    assert nominate(snap, req, decide(snap, req), later) is not None  # not stuck: planned again
    # another node whose lower-priority set alone makes room: planned there, the stuck kept out
    other = count_world([node("n1", 4), node("n2", 4), node("n3", 4)], vm_set("a", "n1", 2, value=100),
                        vm_set("b", "n1", 2, value=100), vm_set("c", "n2", 4, value=1000),
                        vm_set("d", "n3", 4, value=500), devices).with_stopping({("t", "a"), ("t", "b")})
    again = nominate(other, req, decide(other, req), later)
    assert again is not None and again.fresh and [v.vmi for v in again.nomination.victims] == ["d"]


# --- the same batch: the line's gate and the nominations (P4, P5, P6) -----------------------


def _asking_as(vmi: str, gpus: int, rid: str, *, ns: str, value: int):
    devices, req = asking(vmi, gpus, ns=ns, value=value)
    devices = [replace(d, status=replace(d.status, bind_request=replace(d.status.bind_request, id=rid)))
               for d in devices]
    return devices, replace(req, id=rid)


def _waiting(vmi: str, gpus: int, value: int):
    from model.line import Identity, Shape, entry
    from model.priority import Priority
    return entry(Identity("w", vmi), Shape((), (("h100", gpus),)), Priority(value), NOW - timedelta(minutes=1))


def test_P6_the_line_s_gate_counts_a_nomination_made_earlier_in_its_batch():
    # n1: 2 free; n2: 4, spot VM v (2) runs, 2 free. vm-9 (4, priority 1000) nominates v on n2;
    # p (2, priority 0) is planned on n1. A set waiting in line (2, priority 500) could start on
    # n1 now, and nowhere once p takes n1: n2's free units are nominated for vm-9. So the line
    # holds p back (P5), as it would had the nomination been made in an earlier batch.
    from model.line import Line
    from model.line_plan import gate_batch
    s_devices, s_req = asking("vm-9", 4)
    p_devices, p_req = _asking_as("p", 2, "rq", ns="q", value=0)
    snap = count_world([node("n1", 2), node("n2", 4)], vm_set("v", "n2", 2, value=100), s_devices, p_devices)
    actions, _ = plan_batch(snap, (), [(r.namespace, r.id, members(snap, r)) for r in (s_req, p_req)], PRE)
    assert isinstance(actions[0], Nominate) and actions[0].nominated.nomination.node == "n2"
    assert isinstance(actions[1], Place) and actions[1].decision.node == "n1"
    line = Line([_waiting("w", 2, 500)])
    g = gate_batch(line, snap, (), actions, NOW)
    assert isinstance(g.actions[1], Answer), "placed on room a higher-priority waiting set needs"
    assert g.actions[1].decision.reason.code is Code.BEHIND_IN_LINE
    # the batch's snapshot (what the coordinator reserves against) keeps the nomination's hold
    assert g.snapshot.reserved("n2", H) == 4
    # the same nomination made in an earlier batch: the same verdict
    earlier = snap.with_nominations([actions[0].nominated.nomination])
    [alone], _ = plan_batch(earlier, (), [("q", "rq", members(earlier, p_req))], PRE)
    assert isinstance(alone, Place)
    assert isinstance(gate_batch(line, earlier, nomination_holds(earlier.nominations, NOW), [alone], NOW).actions[0],
                      Answer)


def test_P6_a_nomination_decided_against_a_placement_the_line_held_back_is_decided_again():
    # n1: 2 free; n2: 2, spot VM v runs. p (2, priority 0) is planned on n1; vm-9 (2, priority
    # 1000), decided after it, finds no room and nominates v. The line then holds p back
    # (a set waiting at 500 needs n1): n1 is free after all, so vm-9 needs no victim. Its
    # nomination must not be written: it is decided again, as a refusal would be.
    from model.line import Line
    from model.line_plan import gate_batch
    p_devices, p_req = _asking_as("p", 2, "rq", ns="q", value=0)
    s_devices, s_req = asking("vm-9", 2)
    snap = count_world([node("n1", 2), node("n2", 2)], vm_set("v", "n2", 2, value=100), s_devices, p_devices)
    actions, _ = plan_batch(snap, (), [(r.namespace, r.id, members(snap, r)) for r in (p_req, s_req)], PRE)
    assert isinstance(actions[0], Place) and actions[0].decision.node == "n1"
    assert isinstance(actions[1], Nominate) and [v.vmi for v in actions[1].nominated.nomination.victims] == ["v"]
    g = gate_batch(Line([_waiting("w", 2, 500)]), snap, (), actions, NOW)
    assert isinstance(g.actions[0], Answer) and g.actions[0].decision.reason.code is Code.BEHIND_IN_LINE
    assert ("p", "rp") in g.again
    # decided again without p's hold, vm-9 starts on n1 and stops nobody
    [again], _ = plan_batch(snap, (), [("p", "rp", members(snap, s_req))], PRE)
    assert isinstance(again, Place) and again.decision.node == "n1"


def test_P6_live_nominations_hold_their_room_whether_or_not_this_replica_preempts():
    # a nomination read from the API (made by an earlier leader) binds a replica that does
    # not nominate itself: its room goes to nobody else while it lives
    devices, req = asking("vm-9", 4)
    snap = full_count_world(devices)
    [action] = batch(snap, req)
    n = action.nominated.nomination
    other_devices, other = _asking_as("vm-x", 2, "rq", ns="q", value=5000)
    gone = without(snap, n).with_devices(other_devices).with_nominations([n])
    soon = NOW + timedelta(seconds=5)
    off = Preempting(soon, NominationSettings(enabled=False))
    for decided in (batch(gone, other, preempting=None)[0], batch(gone, other, preempting=off)[0]):
        assert not isinstance(decided, Place), "placed on nominated room"
    [timed], _ = plan_batch(gone, (), [("q", "rq", members(gone, other))], now=soon)
    assert not isinstance(timed, Place)
    # expired: it holds nothing
    [late], _ = plan_batch(gone, (), [("q", "rq", members(gone, other))], now=NOW + timedelta(minutes=5))
    assert isinstance(late, Place) and late.decision.node == "n1"
    # the preemptor itself, with preemption off here, still lands on its room
    [mine] = batch(gone.with_nodes([*gone.nodes.values(), node("n0", 4)]), req, preempting=off)
    assert isinstance(mine, Place) and mine.decision.node == "n1"


def test_P6_a_preemptor_stopped_as_a_victim_of_another_nomination_holds_nothing_any_more():
    # vm-9 was nominated on n1 and landed there (its nomination done, not yet deleted); then
    # vm-z (priority 5000) nominates vm-9 as its victim, and vm-9 is stopped. vm-9's own
    # nomination must not come back to hold the room it lands no more (promised twice: vm-z
    # could not start until it expired): it is spent, and the sweep deletes it
    from model.nomination import Drop, spent, sweep
    first = sample()  # vm-9 of p on n1, 4 units, priority 1000
    second = Nomination("z", "vm-z", 5000, "n1", ((H, 4),), (),
                        (Victim("p", "vm-9", "adm-p", None, 1000, NOW + timedelta(seconds=10)),),
                        NOW + timedelta(seconds=20), NOW + timedelta(minutes=2), 30)
    empty = count_world([node("n1", 4)])  # vm-9 stopped: its devices are gone
    assert spent(first, [first, second], NOW) and not spent(second, [first, second], NOW)
    # a nomination made after (for a VMI of the name created again once stopped) is not spent
    later = replace(first, created=NOW + timedelta(seconds=30), expires=NOW + timedelta(minutes=3))
    assert not spent(later, [later, second], NOW + timedelta(seconds=30))
    assert nomination_holds([first, second], NOW, empty.devices_in) == (second.hold(),)
    assert not spent(first, [first, second], NOW + timedelta(minutes=3))  # second expired
    plan = sweep([first, second], NOW, lambda ns, name: None, empty.devices_in)
    assert plan.drops == (Drop(first, "preempted"),) and [n.name for n, _ in plan.waiting] == ["z.vm-z"]
    # vm-9 started again (its VM) and refused for room: a fresh nomination, not the spent one
    devices, req = asking("vm-9", 4)
    snap = count_world([node("n1", 4)], vm_set("a", "n1", 4, value=100), devices).with_nominations(
        [first, second])
    [action] = batch(snap, req)
    assert not isinstance(action, Nominate) or action.nominated.nomination != first


def test_a_preemptor_admitted_on_another_node_drops_its_nomination_and_its_hold():
    """Found by bench contention: a preemptor whose room came free elsewhere first started
    there, and its nomination held the nominated node's devices for nobody until it expired."""
    from model.nomination import sweep
    live = sample()
    assert live.node == "n1"
    elsewhere = {d.name: d for d in vm_set("vm-9", "n2", 4, ns="p", value=1000)}
    devices_in = lambda ns: elsewhere if ns == "p" else {}  # noqa: E731
    vmis = {("t", "a"): ("uid-a", "adm-a"), ("t", "b"): ("uid-b", "adm-b")}
    plan = sweep([live], NOW, lambda ns, n: vmis.get((ns, n)), devices_in)
    assert plan.stops == () and [(d.nomination.vmi, d.why) for d in plan.drops] == [("vm-9", "admitted")]
    assert nomination_holds([live], NOW, devices_in) == ()


def test_a_nomination_records_its_plans_moves_and_holds_their_target_for_the_rest_of_the_batch():
    from tests.model.test_preemption import idle
    devices, req = asking("vm-9", 4)
    other, req2 = asking("vm-x", 1, ns="q", value=5000)
    req2 = replace(req2, id="rq")
    other = [replace(d, status=replace(d.status, bind_request=replace(d.status.bind_request, id="rq")))
             for d in other]
    snap = count_world([node("n1", 5), node("n2", 2)], vm_set("a", "n1", 2), vm_set("c", "n1", 1),
                       idle("g", "n1"), vm_set("hi", "n2", 1, value=5000), devices, other)
    first, second = batch(snap, req, req2)
    assert isinstance(first, Nominate)
    n = first.nominated.nomination
    assert [v.vmi for v in n.victims] == ["a"]
    assert [(m.name, m.from_node, m.to_node) for m in n.moves] == [("g", "n1", "n2")]
    assert n == nomination_of(plan_preemption(snap, req, NOW), NOW)
    # n2's one free unit is the move's: the 1-GPU set of a higher priority is not placed there
    assert not (isinstance(second, Place) and second.decision.node == "n2"), second
