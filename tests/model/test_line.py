"""The waiting line (docs/contract.md §3c P5, `model.line`): which refusals wait (one case per
code), the line as a value (order, refused twice, leaving, expiry), who may start
(`may_place`: behind, backfill, budget, the cap, reservations), where a long-waiting head
reserves (`reservation`), what explain shows; then property tests on random fleets and
lines in count mode and device mode (P6's invariant, the head that fits, the order, no cycle
between equal priorities)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from model import reasons as r
from model.check import check_set
from model.decide import Placement, Request, assess, decide
from model.device.dra import DeviceRef
from model.explain import explain
from model.line import _carried_out  # the placement carried out, as may_place sees it
from model.line import (ALLOWED, DEFAULT_RESERVE_AFTER, DEFAULT_RETRY_GRACE, MAX_AHEAD_SHOWN, MAX_DECIDED,
                        RESERVING, ROOM_CODES,
                        Allowed, Behind, Entry, Identity, Line, LineSettings, Reserved, Shape,
                        entry, entry_request, fits_on, line_place, may_place, placeable,
                        request_priority, reservation, shape_of, shape_of_ask, soonest,
                        waits_for_room)
from model.parse import VMIAsk
from model.priority import Priority
from model.reasons import Code, Reason
from model.snapshot import Order, Snapshot
from model.types import BindRequest, Budget, DeviceStatus, GPUDevice, Result
from tests.support.dra_worlds import CLASS as DCLASS, device_class, dra_node, recorded
from tests.support.world import H, L, dev, gpu_class, node, world

T0 = datetime(2026, 12, 4, 10, tzinfo=timezone.utc)
PROPS = settings(max_examples=300, deadline=None, print_blob=True, derandomize=True)
"""Seeded (derandomized): every run draws the same examples."""

ON_DEMAND = Priority(1000, class_name="on-demand")
SPOT = Priority(0, class_name="spot")


def waiting(vmi: str, n: int = 1, cls: str = "h100", *, ns: str = "t1", at: int = 0,
            priority: Priority = SPOT, uid: str | None = None, held=()) -> Entry:
    """An entry of VMI `ns/vmi` asking `n` new devices of `cls` (and `held`), first
    refused `at` minutes after T0."""
    t = T0 + timedelta(minutes=at)
    return entry(Identity(ns, vmi, uid), Shape(tuple(held), ((cls, n),) if n else ()), priority, t)


def line_of(*entries: Entry) -> Line:
    return Line(entries)


def fresh(snap: Snapshot, vmi: str, n: int = 1, cls: str = "h100", ns: str = "t2",
          priority: Priority = SPOT) -> tuple[Snapshot, Request, Placement]:
    """A new set of `n` devices of `cls` for `ns/vmi` (not in the line) with its first placement."""
    snap, req = entry_request(snap, waiting(vmi, n, cls, ns=ns, priority=priority))
    d = decide(snap, req, limit=None)
    assert d.result is Result.SUCCEEDED, d.message
    return snap, req, d.placements[0]


def placement_on(snap: Snapshot, req: Request, node_name: str) -> Placement:
    d = decide(snap, req, limit=None)
    (p,) = [p for p in d.placements if p.node == node_name]
    return p


# --- which refusals wait (one case per code) ----------------------------------------------------


class _Stub(Reason):
    """A reason of any code, without data: the codes whose rule reads no data."""

    __slots__ = ("_code",)

    def __init__(self, code: Code) -> None:
        self._code = code

    @property
    def code(self) -> Code:  # type: ignore[override]
        return self._code


_SAMPLES = {
    Code.NO_DEVICE_GROUP: r.NoDeviceGroup("h100x", "gpu.nvidia.com/partition4", 4, 5, 3),
    Code.SET_NEEDS: r.SetNeeds("h100", H, 2, 1),
    Code.NO_ELIGIBLE_NODE: r.NoEligibleNode((r.NodeProblems("n1", (r.NoRoom(H, 2, 1),)),)),
    Code.BINDER_REFUSED: r.BinderRefused("t1", "vm", "refused", Code.NO_ELIGIBLE_NODE),
}
WAITS = ROOM_CODES | set(_SAMPLES)
"""The codes that wait (`_SAMPLES`' with the data shown); every other code does not."""


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.value)
def test_P5_which_codes_wait_for_room(code):
    reason = _SAMPLES.get(code, _Stub(code))
    assert waits_for_room(reason) is (code in WAITS)


def test_P5_the_codes_that_wait_are_room_not_policy():
    assert ROOM_CODES == {Code.NO_ROOM, Code.LOST_CAPACITY, Code.NO_FREE_UNIT, Code.NO_ROOM_FOR_SET,
                          Code.LEDGERS_REFUSED}
    for never in (Code.BUDGET_EXHAUSTED, Code.BUDGET_IN_FLIGHT, Code.NOT_ENTITLED, Code.CLASS_PROBLEM,
                  Code.CLASS_NOT_FOUND, Code.NO_NODE_SERVES, Code.CORDONED, Code.TENANT_BUSY,
                  Code.KEPT_FOR_VM, Code.BEHIND_IN_LINE, Code.NODE_RESERVED):
        assert never not in WAITS


def test_P5_codes_that_wait_by_their_data():
    # DR3: a size no device carries never comes from room
    assert not waits_for_room(r.NoDeviceGroup("h100x", "gpu.nvidia.com/partition3", 3, 8, 0, True, (1, 2, 4, 8)))
    # W1: no node serving the class has that many at all; no node serving it is eligible
    assert not waits_for_room(r.SetNeeds("h100", H, 8, 4, largest=4, members=8))
    assert not waits_for_room(r.SetNeeds("h100", H, 2, None))
    # a node failing on room only makes the set wait; cordons, selectors, taints do not
    room, cordon = r.NodeProblems("n1", (r.NoRoom(H, 2, 1),)), r.NodeProblems("n2", (r.Cordoned(),))
    both = r.NodeProblems("n3", (r.Cordoned(), r.NoRoom(H, 2, 0)))
    assert waits_for_room(r.NoEligibleNode((cordon, room)))
    assert not waits_for_room(r.NoEligibleNode((cordon, both)))
    assert not waits_for_room(r.NoEligibleNode((r.NodeProblems("n4", (r.SelectorMismatch((("a", "b"),)),)),)))
    # the binder's refusal read back: by the code written beside it
    assert waits_for_room(r.BinderRefused("t1", "vm", "m", Code.LEDGERS_REFUSED))
    assert not waits_for_room(r.BinderRefused("t1", "vm", "m", Code.BUDGET_EXHAUSTED))
    assert not waits_for_room(r.BinderRefused("t1", "vm", "m"))  # an older replica's: no code
    # composites: every reason waits (H4's kept sets only inform)
    kept = r.KeptForVM("n1", H, 2, "t1", "vm", "2026-12-04T10:00:00Z")
    assert waits_for_room(r.CannotPlace("t1", "vm", (r.SetNeeds("h100", H, 2, 1), kept)))
    assert not waits_for_room(r.CannotPlace("t1", "vm", (kept,)))
    assert not waits_for_room(r.CannotPlace("t1", "vm", (r.NotEntitled("t1", "h100"),)))
    assert not waits_for_room(r.SetRefused((), (r.BudgetExhausted("t1", H, 4, 4, 1),)))
    assert waits_for_room(r.SetRefused((), (r.NoEligibleNode((room,)),)))


def test_P5_the_binders_and_W1s_own_refusals():
    full = world([node("n1", h=2), node("n2", h=1, cordoned=True)],
                 [dev("x", on="n1", ns="o"), dev("y", on="n1", ns="o")])
    req = Request("r1", "tenant-a", "vm", ("a",))
    missing = decide(full, req)
    assert missing.result is Result.REFUSED and not waits_for_room(missing.outcome)  # a not found
    snap = full.with_device(dev("a"))
    d = decide(snap, req)
    assert d.result is Result.REFUSED and waits_for_room(d.outcome)  # n1 full (n2 cordoned)
    cordoned = world([node("n2", h=1, cordoned=True)], [dev("a")])
    assert not waits_for_room(decide(cordoned, req).outcome)  # a cordon alone: no room frees it
    unserved = world([node("n3", l=2)], [dev("a")])
    assert decide(unserved, req).reason.code is Code.NO_NODE_SERVES
    assert not waits_for_room(decide(unserved, req).outcome)
    over = Snapshot.build(nodes=[node("n1", h=4)], classes=[gpu_class()], devices=[dev("a")],
                          budgets=[Budget("tenant-a", H, 0)])
    assert not waits_for_room(decide(over, req).outcome)
    placed = decide(world([node("n1", h=4)], [dev("a")]), req)
    assert placed.result is Result.SUCCEEDED and not waits_for_room(placed.outcome)
    # W1: room, and a size no HGX node has (DR3)
    v = check_set(full, "t1", [Order("t1", "h100")])
    assert not v.admitted and waits_for_room(v.reason)
    hgx = Snapshot.build(nodes=[dra_node("n1")], classes=[device_class()])
    v = check_set(hgx, "t1", [Order("t1", DCLASS)] * 3)
    assert not v.admitted and not waits_for_room(v.reason)


# --- the line as a value -------------------------------------------------------------------


def test_P5_order_is_priority_then_first_refused_then_identity():
    a = waiting("a", at=5)
    b = waiting("b", at=1)
    c = waiting("c", at=9, priority=ON_DEMAND)
    d = waiting("d", at=1, ns="t0")
    line = line_of(a, b, c, d)
    assert [e.identity.vmi for e in line] == ["c", "d", "b", "a"]
    assert [e.identity.vmi for e in line.of_class("h100")] == ["c", "d", "b", "a"]
    assert line.position(Identity("t1", "a"), "h100") == 4
    assert line.position(Identity("t1", "zz"), "h100") is None


def test_P5_refused_again_keeps_first_refused_and_position_and_refreshes_last_seen():
    line = Line().refused(waiting("a", at=0), T0).refused(waiting("b", at=1), T0 + timedelta(minutes=1))
    later = T0 + timedelta(minutes=7)
    again = line.refused(waiting("a", 2, at=7), later)  # a new shape: kept, with the old time
    (a, b) = again.entries
    assert a.identity.vmi == "a" and a.first_refused == T0 and a.last_seen == later
    assert a.shape.templates == (("h100", 2),) and b.identity.vmi == "b"
    assert line.entries[0].shape.templates == (("h100", 1),)  # the old value is unchanged


def test_P5_a_priority_change_moves_the_entry_and_a_vm_uid_learnt_is_kept():
    line = line_of(waiting("a", at=0), waiting("b", at=1))
    up = line.refused(waiting("b", at=5, priority=ON_DEMAND, uid="u-b"), T0 + timedelta(minutes=5))
    assert [e.identity.vmi for e in up] == ["b", "a"]
    assert up.entries[0].first_refused == T0 + timedelta(minutes=1)
    assert up.entries[0].identity.vm_uid == "u-b"
    assert up.refused(waiting("b", at=9, priority=ON_DEMAND), T0 + timedelta(minutes=9)) \
        .entries[0].identity.vm_uid == "u-b"


def test_P5_another_vm_of_the_same_name_is_another_set():
    line = line_of(waiting("a", at=0, uid="u1"), waiting("b", at=1))
    now = T0 + timedelta(minutes=3)
    line2 = line.refused(waiting("a", at=3, uid="u2"), now)
    assert [e.identity.vmi for e in line2] == ["b", "a"]
    assert line2.find(Identity("t1", "a", "u2")).first_refused == now
    assert line2.find(Identity("t1", "a", "u1")) is None
    assert line2.gone(Identity("t1", "a", "u1")) is line2  # a stale gone of the old VM


def test_P5_started_and_gone_leave_and_nothing_else_changes():
    line = line_of(waiting("a", at=0), waiting("b", at=1), waiting("c", at=2))
    assert [e.identity.vmi for e in line.started(Identity("t1", "b"))] == ["a", "c"]
    assert [e.identity.vmi for e in line.gone(Identity("t1", "a", "any"))] == ["b", "c"]
    assert line.started(Identity("t1", "nobody")) is line
    assert len(line) == 3


def test_P5_expire_drops_bare_vmis_silent_past_the_ttl_never_a_vms():
    line = line_of(waiting("bare", at=0), waiting("vm", at=0, uid="u"), waiting("recent", at=3))
    now = T0 + DEFAULT_RETRY_GRACE + timedelta(minutes=1)
    left = line.expire(now, DEFAULT_RETRY_GRACE)
    assert [e.identity.vmi for e in left] == ["vm", "recent"]
    assert line.expire(T0 + DEFAULT_RETRY_GRACE, DEFAULT_RETRY_GRACE) is line  # at the ttl exactly: stays
    refreshed = line.refused(waiting("bare"), now - timedelta(seconds=1))
    assert [e.identity.vmi for e in refreshed.expire(now, DEFAULT_RETRY_GRACE)] == ["bare", "vm", "recent"]


def test_P5_one_entry_per_vmi_and_a_class_line_per_class():
    with pytest.raises(ValueError):
        line_of(waiting("a"), waiting("a", at=3))
    mixed = entry(Identity("t1", "m"), Shape((("gpu-x", "l40s"),), (("h100", 2),)), SPOT, T0)
    line = line_of(waiting("a", at=1), mixed, waiting("l", cls="l40s", at=2))
    assert line.classes == ("h100", "l40s")
    assert [e.identity.vmi for e in line.of_class("l40s")] == ["m", "l"]
    assert [e.identity.vmi for e in line.heads()] == ["m"]
    assert mixed.shape.classes == ("l40s", "h100")
    with pytest.raises(ValueError):
        LineSettings(max_decided=0)


def test_P5_shapes_from_a_request_and_from_an_ask():
    snap = world([node("n1", h=4)], [dev("held", on="n1", ns="t1"),
                                    GPUDevice("t1", "vm-h100-0", "h100", template_for="vm"),
                                    GPUDevice("t1", "new h100 #1", "h100")])
    shape = shape_of(snap, Request("r", "t1", "vm", ("held", "vm-h100-0", "new h100 #1", "gone")))
    assert shape == Shape((("held", "h100"),), (("h100", 2),))
    assert shape_of_ask(snap, "t1", VMIAsk(("held", "gone"), (("h100", 3),))) == \
        Shape((("held", "h100"),), (("h100", 3),))


# --- who may start -------------------------------------------------------------------------


def fleet() -> Snapshot:
    """n1: 4 H100 free; n2: 2 free of 4 (o's two); n3: L40S only."""
    return world([node("n1", h=4), node("n2", h=4), node("n3", l=2)],
                 [dev("o1", on="n2", ns="o"), dev("o2", on="n2", ns="o")],
                 [gpu_class(), gpu_class("l40s", L)])


def test_P5_empty_line_allows_at_once():
    snap, req, p = fresh(fleet(), "r")
    assert may_place(Line(), snap, req, p) is ALLOWED


def test_P5_the_cost_nothing_for_an_empty_line_and_at_most_the_cap_for_a_long_one(monkeypatch):
    import model.line as ml
    judged = []
    real_fits, real_placeable = ml.fits_on, ml.placeable
    monkeypatch.setattr(ml, "fits_on", lambda *a: judged.append(a[1]) or real_fits(*a))
    monkeypatch.setattr(ml, "placeable", lambda *a: judged.append(a[1]) or real_placeable(*a))
    snap, req, p = fresh(fleet(), "small")
    assert may_place(Line(), snap, req, p) is ALLOWED and judged == []
    # 40 sets ahead too large for n1 or n2, 20 of another class: only count checks
    line = Line([waiting(f"huge{i}", 5, at=i) for i in range(40)]
                + [waiting(f"l{i}", 1, "l40s", at=i) for i in range(20)])
    assert may_place(line, snap, req, placement_on(snap, req, "n1")) is ALLOWED and judged == []
    # 40 sets ahead that could use n1 and fit elsewhere too: judged up to the cap, then refused
    roomy = fleet().with_nodes([node("n1", h=4), node("n2", h=4), node("n4", h=8)])
    snap, req, _ = fresh(roomy, "small")
    line = Line([waiting(f"one{i}", 1, at=i) for i in range(40)])
    v = may_place(line, snap, req, placement_on(snap, req, "n1"))
    assert isinstance(v, Behind) and v.unchecked and v.position == MAX_DECIDED + 1
    assert len({e.identity for e in judged}) == MAX_DECIDED


def test_P5_a_later_set_may_not_take_the_room_the_head_needs():
    big = waiting("big", 4, at=0)  # fits only n1
    snap, req, _ = fresh(fleet(), "small")
    v = may_place(line_of(big), snap, req, placement_on(snap, req, "n1"))
    assert isinstance(v, Behind) and v.entry == big and (v.position, v.node) == (1, "n1")
    assert v.reason().code is Code.BEHIND_IN_LINE and v.reason().category is r.Category.UNAVAILABLE
    assert v.reason().render().startswith("t1/big (priority 0 spot, waiting since 2026-12-04T10:00:00Z) "
                                          "waits ahead at position 1 in the line of class h100")
    # backfill: n2 is room the head cannot use
    assert may_place(line_of(big), snap, req, placement_on(snap, req, "n2")) is ALLOWED


def test_P5_backfill_on_a_node_the_head_could_use_when_it_still_fits_elsewhere():
    snap = fleet().with_nodes([node("n1", h=4), node("n2", h=4), node("n3", l=2), node("n4", h=4)])
    big = waiting("big", 4, at=0)  # fits n1 and n4
    snap, req, _ = fresh(snap, "small")
    assert may_place(line_of(big), snap, req, placement_on(snap, req, "n1")) is ALLOWED


def test_P5_only_sets_ahead_in_the_same_class_hold_a_set_back():
    snap, req, _ = fresh(fleet(), "small", priority=ON_DEMAND)
    p1 = placement_on(snap, req, "n1")
    big = line_of(waiting("big", 4, at=0))
    assert may_place(big, snap, req, p1, priority=ON_DEMAND) is ALLOWED  # higher priority
    assert isinstance(may_place(big, snap, req, p1), Behind)  # no bindRequest: priority 0
    assert may_place(line_of(waiting("l", 2, "l40s")), snap, req, p1) is ALLOWED  # another class
    snap, req, _ = fresh(fleet(), "small")
    later = line_of(waiting("big", 4, at=0, priority=SPOT))
    in_line = later.refused(waiting("small", 1, ns="t2", at=-1), T0)  # small refused first
    assert may_place(in_line, snap, req, placement_on(snap, req, "n1")) is ALLOWED
    assert isinstance(may_place(later, snap, req, placement_on(snap, req, "n1")), Behind)
    assert request_priority(snap, req) == Priority()


def test_P5_the_sets_priority_is_the_one_its_members_record():
    """P1: the binder reads the priority the webhook recorded in `bindRequest`, no other."""
    br = BindRequest("r9", "vm", ("m",), priority=ON_DEMAND)
    snap = fleet().with_device(GPUDevice("t2", "m", "h100", status=DeviceStatus(bind_request=br)))
    req = Request("r9", "t2", "vm", ("m",))
    assert request_priority(snap, req) == ON_DEMAND
    big = line_of(waiting("big", 4, at=0))
    assert may_place(big, snap, req, placement_on(snap, req, "n1")) is ALLOWED
    assert request_priority(snap, replace(req, id="other")) == Priority()


def test_P5_a_set_that_waits_itself_is_not_behind_itself():
    big = waiting("big", 4, at=0)
    snap, req = entry_request(fleet(), big)
    d = decide(snap, req)
    assert may_place(line_of(big), snap, req, d.placements[0]) is ALLOWED


def test_P5_a_tenants_earlier_set_goes_first_when_the_later_one_would_take_its_budget():
    base = fleet()
    snap = Snapshot.build(nodes=list(base.nodes.values()), classes=list(base.classes.values()),
                          devices=list(base.devices.values()), budgets=[Budget("t1", H, 2)])
    early = waiting("early", 2, at=0)  # t1: fits n1 or n2, within its budget of 2
    snap, req, _ = fresh(snap, "late", ns="t1")
    v = may_place(line_of(early), snap, req, placement_on(snap, req, "n2"))
    assert isinstance(v, Behind) and v.entry == early
    snap2, req2, _ = fresh(snap, "other", ns="t2")  # another tenant: backfill as usual
    assert may_place(line_of(early), snap2, req2, placement_on(snap2, req2, "n2")) is ALLOWED


def test_P5_the_cap_errs_on_the_side_of_the_sets_ahead():
    snap = fleet().with_nodes([node("n1", h=4), node("n2", h=4), node("n4", h=4)])
    a, b = waiting("a", 1, at=0), waiting("b", 1, at=1)  # both could use n1, and fit elsewhere
    snap, req, _ = fresh(snap, "small")
    p1 = placement_on(snap, req, "n1")
    assert may_place(line_of(a, b), snap, req, p1) is ALLOWED
    v = may_place(line_of(a, b), snap, req, p1, settings=LineSettings(max_decided=1))
    assert isinstance(v, Behind) and v.unchecked and v.entry == b and v.position == 2
    assert v.reason().render().startswith("more sets waiting ahead in the line of class h100")


def test_P5_a_set_kept_where_it_is_takes_nothing():
    big = waiting("big", 4, at=0)
    snap = fleet().with_device(dev("k", on="n1", ns="t2"))
    req = Request("r", "t2", "k-vm", ("k",))
    d = decide(snap, req)
    assert d.placements[0].moves == () and d.placements[0].needs == ()
    assert may_place(line_of(big), snap, req, d.placements[0],
                     reservations={big.identity: "n1"}) is ALLOWED


def test_P5_a_reserved_node_takes_no_set_behind_its_holder():
    big = waiting("big", 4, at=0)
    line = line_of(big)
    res = {big.identity: "n2"}
    snap, req, _ = fresh(fleet(), "small")
    v = may_place(line, snap, req, placement_on(snap, req, "n2"), reservations=res)
    assert isinstance(v, Reserved) and (v.node, v.holder, v.class_name) == ("n2", big, "h100")
    assert v.reason().code is Code.NODE_RESERVED
    assert may_place(line, snap, req, placement_on(snap, req, "n1"), reservations={big.identity: "n2",
                                                                                   **{}}) != v
    # the holder itself, and a set of higher priority, may
    snap_b, req_b = entry_request(fleet().with_devices([]), big)
    assert may_place(line, snap_b, req_b, decide(snap_b, req_b).placements[0], reservations=res) is ALLOWED
    snap_h, req_h, _ = fresh(fleet(), "urgent", priority=ON_DEMAND)
    assert may_place(line, snap_h, req_h, placement_on(snap_h, req_h, "n2"),
                     reservations=res, priority=ON_DEMAND) is ALLOWED


def test_P5_device_mode_backfill_must_not_break_the_only_free_group():
    # n1: GPUs 0, 1, 2 taken by a foreign claim: one quad of partition4 free, and GPU 3 alone
    snap = Snapshot.build(nodes=[dra_node("n1", taken=(0, 1, 2))], classes=[device_class()])
    quad = waiting("quad", 4, DCLASS, at=0)
    assert fits_on(snap, quad, "n1")
    snap, req, p = fresh(snap, "one", 1, DCLASS)
    assert may_place(line_of(quad), snap, req, p) is ALLOWED  # the tightest group: the lone GPU
    (key, chosen) = p.devices[0]
    others = [f"gpu-vfio-{i}" for i in range(3, 8) if f"gpu-vfio-{i}" != chosen.device]
    for name in others:
        q = replace(p, devices=((key, DeviceRef(chosen.driver, chosen.pool, name)),))
        assert isinstance(may_place(line_of(quad), snap, req, q), Behind), name


# --- reservations --------------------------------------------------------------------------


def test_P5_a_head_waiting_past_reserve_after_reserves_where_the_fewest_units_are_missing():
    # n1: 1 free of 4 (3 missing for a set of 4); n2: 3 free of 4 (1 missing)
    snap = world([node("n1", h=4), node("n2", h=4)],
                 [dev(f"x{i}", on="n1", ns="o") for i in range(3)] + [dev("y", on="n2", ns="o")])
    big = waiting("big", 4, at=0)
    line = line_of(big, waiting("next", 4, at=1))
    assert reservation(line, snap, T0 + DEFAULT_RESERVE_AFTER) == {}
    later = T0 + DEFAULT_RESERVE_AFTER + timedelta(seconds=1)
    assert reservation(line, snap, later) == {big.identity: "n2"}
    assert soonest(snap, big) == soonest(snap, big, frozenset({"zz"}))
    assert soonest(snap, big).missing == 1
    assert soonest(snap, big, frozenset({"n2"})).node == "n1"


def test_P5_soonest_ties_go_to_fewest_moves_then_the_smallest_node_then_the_name():
    snap = world([node("a", h=8), node("b", h=4), node("c", h=4)], [])
    e = waiting("e", 2, at=0)
    assert soonest(snap, e).node == "b"  # smaller than a, name before c
    held = entry(Identity("t1", "h"), Shape((("hd", "h100"),), (("h100", 1),)), SPOT, T0)
    snap = snap.with_device(dev("hd", on="c", ns="t1"))
    assert soonest(snap, held).node == "c"  # its member is there: fewer moves


def test_P5_soonest_counts_only_units_the_binders_sets_could_free():
    # n1: 4 allocatable, 3 used by Pods outside the binder: a set of 2 never fits by stops
    n1 = replace(node("n1", h=4), foreign=((H, 3),))
    snap = world([n1, node("n2", h=4)], [dev(f"x{i}", on="n2", ns="o") for i in range(4)])
    e = waiting("e", 2, at=0)
    assert soonest(snap, e).node == "n2" and soonest(snap, e).missing == 2
    assert soonest(snap, e, frozenset({"n2"})) is None
    over = Snapshot.build(nodes=[node("n1", h=4)], classes=[gpu_class()], budgets=[Budget("t1", H, 1)])
    assert soonest(over, e) is None  # over budget: room would not help


def test_P5_two_heads_never_reserve_one_node():
    snap = world([node("n1", h=4), node("n2", h=4)], [dev("x", on="n1", ns="o")],
                 [gpu_class(), gpu_class("h100b", H)])
    a = waiting("a", 4, at=0)
    b = waiting("b", 4, "h100b", at=1)
    res = reservation(line_of(a, b), snap, T0 + timedelta(hours=1))
    assert res == {a.identity: "n2", b.identity: "n1"}


def test_P5_the_set_next_behind_a_reserving_head_reserves_the_next_soonest_node():
    # n1: 1 free of 4 (3 missing); n2: 3 free (1 missing); n3: 2 free (2 missing). Three sets
    # of 4 waited past reserveAfter: the head takes n2, the next n3 (n2 taken), the third none
    snap = world([node("n1", h=4), node("n2", h=4), node("n3", h=4)],
                 [dev(f"x{i}", on="n1", ns="o") for i in range(3)] + [dev("y", on="n2", ns="o")]
                 + [dev(f"z{i}", on="n3", ns="o") for i in range(2)])
    a, b, c = waiting("a", 4, at=0), waiting("b", 4, at=1), waiting("c", 4, at=2)
    line = line_of(a, b, c)
    later = T0 + timedelta(hours=1)
    assert reservation(line, snap, later) == {a.identity: "n2", b.identity: "n3"}
    assert RESERVING == 2 and LineSettings().reserving == RESERVING
    assert reservation(line, snap, later, LineSettings(reserving=1)) == {a.identity: "n2"}  # before
    assert reservation(line, snap, later, LineSettings(reserving=3)) == {
        a.identity: "n2", b.identity: "n3", c.identity: "n1"}
    # the second reserves only once it waited past reserveAfter itself
    assert reservation(line, snap, T0 + DEFAULT_RESERVE_AFTER + timedelta(seconds=30)) == {a.identity: "n2"}
    # b's node takes no set behind b, but a (ahead of b) may start there
    small, req, _ = fresh(snap, "small", 1)
    res = reservation(line, snap, later)
    v = may_place(line, small, req, placement_on(small, req, "n3"), reservations=res)
    assert isinstance(v, Reserved) and v.holder == b
    snap_a, req_a = entry_request(snap.with_changes((), [("o", "z0"), ("o", "z1")]), a)
    assert may_place(line, snap_a, req_a, placement_on(snap_a, req_a, "n3"), reservations=res) is ALLOWED
    # once the head starts, b keeps n3 (kept) and c, now second, reserves where it would start soonest
    after = line.started(a.identity)
    assert reservation(after, snap, later, kept=res) == {b.identity: "n3", c.identity: "n2"}


def test_P5_fronts_are_the_first_retried_entries_of_each_class_line():
    a, b = waiting("a", 4, at=0), waiting("b", 4, at=1)
    quiet = replace(waiting("q", 4, at=2), retried=False)
    c, other = waiting("c", 4, at=3), waiting("o", 1, "l40s", at=4)
    line = line_of(a, b, quiet, c, other)
    assert [e.identity.vmi for e in line.fronts(1)] == ["a", "o"]
    assert [e.identity.vmi for e in line.fronts(2)] == ["a", "b", "o"]
    assert [e.identity.vmi for e in line.fronts(3)] == ["a", "b", "c", "o"]  # q not retried: passed over
    with pytest.raises(ValueError):
        line.fronts(0)
    with pytest.raises(ValueError):
        LineSettings(reserving=0)


def test_P5_a_reservation_stays_on_its_node_until_its_holder_starts():
    # big reserved n2 (1 missing); then n1's sets end first: a fresh choice would move it to
    # n1 and open n2, where room had been gathering, to backfill (bench contention)
    snap = world([node("n1", h=4), node("n2", h=4)],
                 [dev(f"x{i}", on="n1", ns="o") for i in range(3)] + [dev("y", on="n2", ns="o")])
    big = waiting("big", 4, at=0)
    line = line_of(big, waiting("next", 4, at=1))
    later = T0 + DEFAULT_RESERVE_AFTER + timedelta(seconds=1)
    first = reservation(line, snap, later)
    assert first == {big.identity: "n2"}
    freed = snap.with_changes((), [("o", f"x{i}") for i in range(3)])  # n1: 4 free, 0 missing
    assert reservation(line, freed, later) == {big.identity: "n1"}  # chosen afresh: it moves
    assert reservation(line, freed, later, kept=first) == first  # kept: it stays
    # the holder started: its reservation goes with it, and the next head chooses afresh
    after = line.started(big.identity)
    assert reservation(after, freed, later + timedelta(minutes=1), kept=first) == {
        Identity("t1", "next"): "n1"}


def test_P5_a_holder_keeps_its_node_when_a_higher_priority_set_comes_ahead_of_it():
    snap = world([node("n1", h=4), node("n2", h=4)],
                 [dev(f"x{i}", on="n1", ns="o") for i in range(3)] + [dev("y", on="n2", ns="o")])
    big = waiting("big", 4, at=0)
    later = T0 + DEFAULT_RESERVE_AFTER + timedelta(seconds=1)
    first = reservation(line_of(big), snap, later)
    assert first == {big.identity: "n2"}
    top = waiting("top", 1, at=5, priority=ON_DEMAND)  # heads the line now, waited 0 s
    line = line_of(big, top)
    assert line.heads() == (top,)
    head_only = LineSettings(reserving=1)
    assert reservation(line, snap, later, head_only) == {}  # chosen afresh: big is no head, top too young
    assert reservation(line, snap, later) == first  # big is second at the front (RESERVING)
    assert reservation(line, snap, later, kept=first) == first
    # a set ahead of the holder that waited long enough reserves too, another node
    much_later = T0 + timedelta(minutes=5) + DEFAULT_RESERVE_AFTER + timedelta(seconds=1)
    assert reservation(line, snap, much_later, kept=first) == {top.identity: "n1", big.identity: "n2"}


def test_P5_a_kept_reservation_is_chosen_again_when_its_node_can_no_longer_take_the_set():
    snap = world([node("n1", h=4), node("n2", h=4)], [dev("y", on="n2", ns="o")])
    big = waiting("big", 4, at=0)
    later = T0 + DEFAULT_RESERVE_AFTER + timedelta(seconds=1)
    kept = {big.identity: "n2"}
    assert reservation(line_of(big), snap, later, kept=kept) == kept
    cordoned = snap.with_nodes([node("n1", h=4), node("n2", h=4, cordoned=True)])
    assert reservation(line_of(big), cordoned, later, kept=kept) == {big.identity: "n1"}
    gone = snap.with_nodes([node("n1", h=4)])
    assert reservation(line_of(big), gone, later, kept=kept) == {big.identity: "n1"}
    # another VM under the same name is another set: it does not inherit the reservation
    other = waiting("big", 4, at=0, uid="u-2")
    assert reservation(line_of(other), snap, later, kept={Identity("t1", "big", "u-1"): "n2"}) == {
        other.identity: "n1"}


# --- what explain shows ----------------------------------------------------------------------


def test_P5_explain_shows_the_place_in_line_what_is_ahead_and_the_reservation():
    line = line_of(*[waiting(f"w{i}", at=i) for i in range(12)], waiting("me", 2, at=20, ns="t2"),
                   waiting("top", at=30, priority=ON_DEMAND))
    place = line_place(line, Identity("t2", "me"), {Identity("t2", "me"): "n4"})
    assert place.lines[0].position == 14 and place.lines[0].length == 14
    assert len(place.lines[0].ahead) == MAX_AHEAD_SHOWN and place.lines[0].more == 3
    assert place.lines[0].ahead[0].vmi == "top" and place.reserved == "n4"
    text = place.render()
    assert text.startswith("t2/me (priority 0 spot, waiting since 2026-12-04T10:20:00Z) waits for room: "
                           "position 14 of 14 in the line of class h100, behind t1/top (priority 1000 "
                           "on-demand, waiting since 2026-12-04T10:30:00Z), t1/w0 (priority 0 spot")
    assert text.endswith("and 3 more; node n4 is reserved for it")
    assert line_place(line, Identity("t1", "top")).render().endswith("of class h100 (the head)")
    assert line_place(line, Identity("t1", "nobody")) is None


def test_P5_explain_carries_the_line_only_when_given_one():
    snap = fleet()
    e = waiting("vm-1", 4, ns="tenant-a", at=0)
    ask = VMIAsk((), (("h100", 4),))
    kw = dict(live_vmis=set(), now=T0, grace=timedelta(minutes=1))
    assert explain(snap, "tenant-a", "vm-1", ask, **kw).line is None
    got = explain(snap, "tenant-a", "vm-1", ask, line=line_of(e), **kw).line
    assert got == line_place(line_of(e), e.identity)


# --- properties ----------------------------------------------------------------------------


@st.composite
def count_worlds(draw):
    """1-4 nodes (H100 0-6, L40S 0-2, some cordoned), running sets of tenant o, budgets of
    t1/t2 sometimes; a line of 0-6 entries of t1/t2 (h100 or l40s, 1-4 devices, priority 0
    or 10, first refused 0-5 minutes after T0, ties included)."""
    nodes, running = [], []
    for i in range(draw(st.integers(1, 4))):
        h, l_ = draw(st.integers(0, 6)), draw(st.integers(0, 3))
        nodes.append(node(f"n{i}", h=h, l=l_, cordoned=draw(st.integers(0, 7)) == 0))
        running += [dev(f"h{i}-{k}", on=f"n{i}", ns="o") for k in range(draw(st.integers(0, h // 2 + 1)))]
        running += [dev(f"l{i}-{k}", on=f"n{i}", ns="o", cls="l40s") for k in range(draw(st.integers(0, l_)))]
    budgets = [Budget(ns, H, draw(st.integers(1, 6))) for ns in ("t1", "t2") if draw(st.booleans())]
    snap = Snapshot.build(nodes=nodes, classes=[gpu_class(), gpu_class("l40s", L)], devices=running,
                          budgets=budgets)
    entries = []
    for i in range(draw(st.integers(0, 7))):
        entries.append(waiting(f"w{i}", draw(st.integers(1, 4)), draw(st.sampled_from(["h100", "h100", "l40s"])),
                               ns=draw(st.sampled_from(["t1", "t2"])), at=draw(st.integers(0, 5)),
                               priority=draw(st.sampled_from([SPOT, Priority(10)]))))
    return snap, Line(entries)


@st.composite
def one_tenant_worlds(draw):
    """`count_worlds` where every waiting set is tenant t1's, under a budget of H100 that
    is often the tightest limit: the rule that a tenant's earlier set goes first."""
    snap, line = draw(count_worlds())
    snap = Snapshot.build(nodes=list(snap.nodes.values()), classes=list(snap.classes.values()),
                          devices=list(snap.devices.values()), budgets=[Budget("t1", H, draw(st.integers(1, 5)))])
    return snap, Line(replace(e, identity=Identity("t1", e.identity.vmi)) for e in line)


@st.composite
def device_worlds(draw):
    """1-3 HGX nodes (8 GPUs, partitions 1/2/4/8) with random GPUs taken by foreign claims
    and running sets of tenant o; a line of 0-5 entries of 1, 2, 4 or 8 GPUs."""
    nodes, running = [], []
    for i in range(draw(st.integers(1, 3))):
        used = draw(st.sets(st.integers(0, 7), max_size=6))
        taken = tuple(sorted(g for g in used if draw(st.booleans())))
        nodes.append(dra_node(f"n{i}", taken=taken))
        running += [recorded("o", f"r{i}-{g}", f"n{i}", g) for g in sorted(used - set(taken))]
    snap = Snapshot.build(nodes=nodes, classes=[device_class()], devices=running)
    entries = [waiting(f"w{i}", draw(st.sampled_from([1, 2, 4, 8])), DCLASS,
                       ns=draw(st.sampled_from(["t1", "t2"])), at=draw(st.integers(0, 5)),
                       priority=draw(st.sampled_from([SPOT, Priority(10)])))
               for i in range(draw(st.integers(0, 5)))]
    return snap, Line(entries)


def _the_set(draw, line: Line, cls_choices, sizes) -> Entry:
    """The set about to start: one of the line's entries, or a new one."""
    if line and draw(st.booleans()):
        return draw(st.sampled_from(line.entries))
    return waiting("new", draw(st.sampled_from(sizes)), draw(st.sampled_from(cls_choices)),
                   ns=draw(st.sampled_from(["t1", "t2"])), at=99,
                   priority=draw(st.sampled_from([SPOT, Priority(10)])))


def _ahead_of(line: Line, me: Entry, in_line: bool) -> list[Entry]:
    """Brute force: the entries ahead of `me` in the lines of its classes."""
    key = me.order_key if in_line else (-me.priority.value, datetime.max.replace(tzinfo=timezone.utc))
    return [e for e in line if e.identity.key != me.identity.key
            and set(e.shape.classes) & set(me.shape.classes) and e.order_key[:len(key)] < key]


def _check_p6(snap: Snapshot, line: Line, me: Entry) -> None:
    """(a) P6: `may_place` allowing `me` on a node means no entry ahead that could be placed
    now becomes unplaceable by the placement; (e) an entry refused earlier at equal priority
    is never behind a later one."""
    in_line = line.find(me.identity) is not None
    snap_me, req = entry_request(snap, me)
    d = decide(snap_me, req, limit=None)
    if d.result is not Result.SUCCEEDED:
        return
    ahead = _ahead_of(line, me, in_line)
    for p in d.placements[:3]:
        v = may_place(line, snap_me, req, p, priority=me.priority)
        note(f"{me.identity.vmi} on {p.node}: {v}")
        if isinstance(v, Behind):
            assert v.entry in ahead
            if in_line and v.entry.priority == me.priority:
                assert v.entry.first_refused <= me.first_refused  # (e) never the later one
            continue
        assert isinstance(v, Allowed)
        after = _carried_out(snap_me, req, p)
        for e in ahead:
            if placeable(snap_me, e):
                assert placeable(after, e), f"{e.identity.vmi} lost its room to {me.identity.vmi} on {p.node}"


def _check_head(snap: Snapshot, line: Line) -> None:
    """(b) the head that fits is never behind anyone (nothing reserved)."""
    for h in line.heads():
        if any(line.of_class(c)[0] is not h for c in h.shape.classes):
            continue  # heads one class, not another
        snap_h, req = entry_request(snap, h)
        d = decide(snap_h, req, limit=None)
        if d.result is Result.SUCCEEDED:
            for p in d.placements:
                assert may_place(line, snap_h, req, p) is ALLOWED


@PROPS
@given(count_worlds(), st.data())
def test_P5_P6_property_count_mode(world_line, data):
    snap, line = world_line
    me = _the_set(data.draw, line, ["h100", "l40s"], [1, 2, 3])
    _check_p6(snap, line, me)
    _check_head(snap, line)


@PROPS
@given(one_tenant_worlds(), st.data())
def test_P5_P6_property_one_tenant_under_budget(world_line, data):
    snap, line = world_line
    me = _the_set(data.draw, line, ["h100"], [1, 2, 3])
    _check_p6(snap, line, replace(me, identity=Identity("t1", me.identity.vmi, me.identity.vm_uid)))


@PROPS
@given(count_worlds(), st.integers(0, 30))
def test_P5_reservations_are_distinct_nodes_where_room_alone_is_missing(world_line, minutes):
    """The sets at the front of each line (`Line.fronts`) past `reserveAfter` reserve
    distinct nodes, each one where the set fails on room only (or fits); the same inputs
    give the same reservations."""
    snap, line = world_line
    now = T0 + timedelta(minutes=minutes)
    res = reservation(line, snap, now, LineSettings(reserve_after=timedelta(minutes=3)))
    assert res == reservation(line, snap, now, LineSettings(reserve_after=timedelta(minutes=3)))
    assert len(set(res.values())) == len(res)
    fronts = {h.identity: h for h in line.fronts(RESERVING)}
    for ident, at in res.items():
        h = fronts[ident]
        assert now - h.first_refused > timedelta(minutes=3)
        snap_h, req = entry_request(snap, h)
        problems = assess(snap_h, req, (at,), with_decision=False).nodes[at]
        assert all(waits_for_room(p) for p in problems), problems


@PROPS
@given(count_worlds(), st.integers(0, 30), st.data())
def test_P5_kept_reservations_stay_until_the_holder_starts(world_line, minutes, data):
    """With the reservations of the last batch kept (`kept`, any entries and nodes, stale
    ones included): distinct nodes; each holder waited past `reserveAfter` and is a head or
    kept that very node; each node one the holder fails on for room only (or fits); and a
    kept node still good for its holder (room-only there) stays with it unless an entry
    ahead of it holds that node now."""
    snap, line = world_line
    now = T0 + timedelta(minutes=minutes)
    ls = LineSettings(reserve_after=timedelta(minutes=3))
    names = sorted(snap.nodes) + ["gone"]
    idents = [e.identity for e in line] + [Identity("t9", "left")]
    kept = data.draw(st.dictionaries(st.sampled_from(idents), st.sampled_from(names), max_size=4))
    res = reservation(line, snap, now, ls, kept)
    assert res == reservation(line, snap, now, ls, kept)
    assert len(set(res.values())) == len(res)
    fronts = {h.identity for h in line.fronts(RESERVING)}
    by_key = {e.identity: e for e in line}

    def room_only(e: Entry, at: str) -> bool:
        snap_e, req = entry_request(snap, e)
        a = assess(snap_e, req, (at,), with_decision=False)
        return not a.set_problems and at in a.nodes and all(waits_for_room(p) for p in a.nodes[at])

    for ident, at in res.items():
        e = by_key[ident]
        assert e.retried and now - e.first_refused > timedelta(minutes=3)
        assert ident in fronts or kept.get(ident) == at
        assert room_only(e, at), (ident, at)
    for ident, at in kept.items():
        e = by_key.get(ident)
        if e is None or now - e.first_refused <= timedelta(minutes=3) or at not in snap.nodes:
            continue
        if not room_only(e, at) or soonest(snap, e, frozenset(snap.nodes) - {at}) is None:
            continue
        ahead = [x for x, n in res.items() if n == at and by_key[x].order_key < e.order_key]
        assert res.get(ident) == at or ahead, (ident, at, res)


@PROPS
@given(device_worlds(), st.data())
def test_P5_P6_property_device_mode(world_line, data):
    snap, line = world_line
    me = _the_set(data.draw, line, [DCLASS], [1, 2, 4])
    _check_p6(snap, line, me)
    _check_head(snap, line)


identities = st.sampled_from([("t1", "a", None), ("t1", "b", "u-b"), ("t2", "a", None), ("t2", "c", "u-c")])
ops = st.lists(st.tuples(st.sampled_from(["refused", "refused", "started", "gone", "expire"]), identities,
                         st.sampled_from([0, 10, 1000]), st.integers(0, 30)), max_size=25)


@PROPS
@given(ops)
def test_P5_order_is_a_strict_total_order_and_refused_twice_keeps_the_place(plan):
    """(c) after any sequence of changes the line is ordered strictly by (priority desc,
    first refused asc, identity), and each class line is its sub-sequence; (d) a second
    refusal at the same priority keeps the position and the first-refused time."""
    line, now = Line(), T0
    for op, (ns, vmi, uid), prio, minutes in plan:
        now = now + timedelta(minutes=minutes % 4)
        ident = Identity(ns, vmi, uid)
        if op == "refused":
            e = entry(ident, Shape((), (("h100" if vmi != "c" else "l40s", 1),)), Priority(prio), now)
            old = line.find(ident)
            new = line.refused(e, now)
            if old is not None and old.priority == e.priority:  # (d)
                assert new.entries.index(new.find(ident)) == line.entries.index(old)
                assert new.find(ident).first_refused == old.first_refused
            line = new
        elif op == "started":
            line = line.started(ident)
        elif op == "gone":
            line = line.gone(ident)
        else:
            line = line.expire(now, timedelta(minutes=5))
        keys = [e.order_key for e in line]
        assert all(a < b for a, b in zip(keys, keys[1:]))  # (c) strict
        for a, b in zip(line.entries, line.entries[1:]):
            assert a.priority.value > b.priority.value or (
                a.priority.value == b.priority.value and a.first_refused <= b.first_refused)
        for c in line.classes:
            assert list(line.of_class(c)) == [e for e in line if c in e.shape.classes]
