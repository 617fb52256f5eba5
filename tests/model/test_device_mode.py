"""Device mode in the pure model (docs/contract.md §3b DR2-DR4, DR6): what is free on a node by
name (DR2), the group check and its refusal naming the sizes that exist (DR3), the DR4 order,
B6 with records, re-pointing within a node, the class problem and mixed-mode refusals (DR1),
apply_decision recording `status.device`; property tests over HGX fleets (8 GPUs, partitions
from gpuModuleID as `localcluster.dra_profiles` publishes them)."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from model.check import check_set
from model.device.dra import DeviceRef
from model.decide import Request, Rule, apply_decision, decide
from model.hold import Hold, outstanding
from model.reasons import CannotPlace, ClassProblem, Code, MixedModes, NoDeviceGroup
from model.snapshot import Order, Snapshot
from model.device.topology import resolve_attribute
from model.types import DeviceStatus, GPUClass, GPUDevice, Phase, Result
from tests.support.dra_worlds import CLASS, PARTITION_ATTRIBUTE, RES, device_class, dra_node, recorded, ref

NOW = datetime(2026, 12, 4, tzinfo=timezone.utc)
PROPS = settings(max_examples=150, deadline=None, print_blob=True)


def pending(*names: str, ns: str = "t", cls: str = CLASS) -> list[GPUDevice]:
    return [GPUDevice(ns, n, cls) for n in names]


def snap_of(nodes, devices=(), classes=None, reservations=()) -> Snapshot:
    return Snapshot.build(nodes=nodes, classes=classes or [device_class()], devices=devices,
                          reservations=reservations)


def names(*indices: int) -> frozenset[str]:
    return frozenset(f"gpu-vfio-{i}" for i in indices)


# --- DR2: free devices by name -----------------------------------------------------------------

def test_DR2_free_devices_leave_out_claims_taints_other_records_and_other_holds():
    node = dra_node("n1", taken=(1,))
    other = recorded("u", "x", "n1", 2)
    mine = recorded("t", "a", "n1", 3)
    hold = Hold("r-other", "u", "n1", devices=((("u", "y"), ref("n1", 4)),))
    own_hold = Hold("r1", "t", "n1", devices=((("t", "b"), ref("n1", 5)),))
    snap = snap_of([node], [other, mine], reservations=[hold, own_hold])
    assert snap.free_devices("n1", CLASS, "r1", {("t", "a")}) == names(0, 3, 5, 6, 7)
    assert snap.free_devices("n1", CLASS, "r2") == names(0, 6, 7)  # a's record is not r2's
    assert snap.recorded_devices("n1") == {"gpu-vfio-2": (("u", "x"),), "gpu-vfio-3": (("t", "a"),)}
    assert snap.free_devices("gone", CLASS) == frozenset()


def test_DR2_a_device_its_own_member_records_is_free_for_it_though_its_claim_allocates_it():
    snap = snap_of([dra_node("n1", taken=(3,))], [recorded("t", "a", "n1", 3)])
    assert "gpu-vfio-3" in snap.free_devices("n1", CLASS, "r1", {("t", "a")})
    assert "gpu-vfio-3" not in snap.free_devices("n1", CLASS, "r2", {("t", "b")})


def test_DR2_a_recorded_device_another_claim_allocates_is_not_free_for_its_set_which_is_re_pointed():
    """An administrator's claim (not the binder's) allocates GPU 3, which idle held a records:
    a is not free to use it (its own claim would be; this one is not), and a's next request is
    re-pointed to another GPU of n1, never GPU 3."""
    from dataclasses import replace as _replace
    node = _replace(dra_node("n1", taken=(3,)), foreign_claimed=names(3))
    snap = snap_of([node], [recorded("t", "a", "n1", 3)])
    assert "gpu-vfio-3" not in snap.free_devices("n1", CLASS, "r1", {("t", "a")})
    d = decide(snap, Request("r1", "t", "vm", ("a",)))
    assert (d.result, d.node) == (Result.SUCCEEDED, "n1")
    ((key, ref_),) = d.placements[0].devices
    assert key == ("t", "a") and ref_.device != "gpu-vfio-3"


def test_DR2_records_follow_with_devices_and_without_devices():
    snap = snap_of([dra_node("n1")], [recorded("t", "a", "n1", 0)])
    assert snap.free_devices("n1", CLASS) == names(1, 2, 3, 4, 5, 6, 7)
    moved = snap.with_device(recorded("t", "a", "n1", 6))
    assert moved.free_devices("n1", CLASS) == names(0, 1, 2, 3, 4, 5, 7)
    assert snap.without_device("t", "a").free_devices("n1", CLASS) == names(*range(8))
    assert snap.free_devices("n1", CLASS) == names(1, 2, 3, 4, 5, 6, 7)  # unchanged


def test_DR2_a_hold_keeps_a_device_until_the_member_records_it_on_the_node():
    hold = Hold("r1", "t", "n1", ((RES, 1),), ((RES, 1),), ((("t", "a"), RES),),
                ((("t", "a"), ref("n1", 2)), (("t", "b"), ref("n1", 3))))
    b_bound = recorded("t", "b", "n1", 0)  # Bound here, recording another device: re-pointed
    seen = {("t", "a"): GPUDevice("t", "a", CLASS), ("t", "b"): b_bound}
    assert outstanding(hold, seen.get) is hold
    seen[("t", "a")] = recorded("t", "a", "n1", 2)
    left = outstanding(hold, seen.get)
    assert left.needs == () and left.devices == ((("t", "b"), ref("n1", 3)),) and not left.empty
    seen[("t", "b")] = recorded("t", "b", "n1", 3)
    assert outstanding(hold, seen.get).empty


# --- DR3, DR4: the group check, the refusal, the order ------------------------------------------

def test_DR3_five_free_but_no_partition_of_four_refused_there_placed_on_the_other_node():
    # n1: GPUs 1, 5, 6 taken by foreign claims: 5 free, quad {0-3} has 3, quad {4-7} has 2
    snap = snap_of([dra_node("n1", taken=(1, 5, 6)), dra_node("n2", taken=(0, 1, 2, 3, 4))],
                   pending("a", "b", "c", "d"))
    d = decide(snap, Request("r1", "t", "vm", ("a", "b", "c", "d")))
    assert d.result is Result.REFUSED
    (n1, n2) = d.reason.reasons[0].nodes
    assert n1.problems == (NoDeviceGroup(CLASS, "gpu.nvidia.com/partition4", 4, 5, 3),)
    assert n1.render() == ("n1: no 4 free h100x devices share gpu.nvidia.com/partition4: "
                           "5 free, the largest group has 3")
    snap = snap.with_nodes([dra_node("n1", taken=(1, 5, 6)), dra_node("n2", taken=(0,))])
    d = decide(snap, Request("r1", "t", "vm", ("a", "b", "c", "d")))
    assert (d.result, d.node) == (Result.SUCCEEDED, "n2")
    assert sorted(r.device for _, r in d.placements[0].devices) == sorted(names(4, 5, 6, 7))


def test_DR3_W1_a_set_of_three_on_HGX_is_refused_naming_the_sizes_that_exist():
    snap = snap_of([dra_node("n1")])
    v = check_set(snap, "t", [Order("t", CLASS)] * 3)
    assert not v.admitted and v.reason.code is Code.NO_ELIGIBLE_NODE
    assert v.reason.render().endswith(
        "n1: no h100x device carries gpu.nvidia.com/partition3 (sizes that exist: 1, 2, 4, 8)")
    assert check_set(snap, "t", [Order("t", CLASS)] * 4).admitted


def test_DR3_W1_a_set_of_three_is_refused_naming_the_sizes_even_where_fewer_units_are_free():
    # newcomer: with 1 GPU free per board the refusal said "needs 3, has 1 free" (room)
    # although no room would ever make a partition of 3
    snap = snap_of([dra_node("n1", taken=(0, 1, 2, 3, 4, 5, 6)), dra_node("n2", taken=(0, 1, 2, 3, 4))])
    v = check_set(snap, "t", [Order("t", CLASS)] * 3)
    assert not v.admitted and v.reason.code is Code.NO_ELIGIBLE_NODE
    text = v.reason.render()
    for n in ("n1", "n2"):
        assert f"{n}: no h100x device carries gpu.nvidia.com/partition3 (sizes that exist: " \
               f"1, 2, 4, 8)" in text
    assert "has 1 free" not in text and "has 3 free" not in text
    # the binder's own per-node reasons agree (its refusal and explain read them)
    d = decide(snap.with_devices(pending("a", "b", "c")), Request("r1", "t", "vm", ("a", "b", "c")))
    assert d.result is Result.REFUSED
    for nr in d.reason.reasons[0].nodes:
        assert nr.problems == (NoDeviceGroup(CLASS, "gpu.nvidia.com/partition3", 3, 0, 0, True,
                                             (1, 2, 4, 8)),)
    # a size that exists and no room: still the room's reason
    v = check_set(snap, "t", [Order("t", CLASS)] * 4)
    assert not v.admitted and "sizes that exist" not in v.reason.render()
    assert "n2: needs 4 × vfio.gpu.nvidia.com devices, has 3 free" in v.reason.render()


def test_B3_a_node_not_serving_the_class_is_refused_for_that_alone_not_its_other_classes_units():
    # newcomer: "l40s-node-00: does not serve class hgx-h100, needs 8 × … devices, has 4 free"
    # (its L40S count under the same DeviceClass's quota key)
    other = device_class("l40s", match_attribute=None)
    snap = snap_of([dra_node("n1", taken=(0,)), dra_node("n2", classes=("l40s",), taken=(0, 1, 2, 3))],
                   classes=[device_class(), other])
    d = decide(snap.with_devices(pending(*"abcdefgh")), Request("r1", "t", "vm", tuple("abcdefgh")))
    assert d.result is Result.REFUSED
    by_node = {nr.node: nr.render() for nr in d.reason.reasons[0].nodes}
    assert by_node["n2"] == "n2: does not serve class h100x"
    assert by_node["n1"].startswith("n1: needs 8 × ") and "has 7 free" in by_node["n1"]


def test_W1_a_class_with_neither_mode_is_refused_for_its_problem_not_as_unpermitted():
    # newcomer: "KubeVirt does not permit resource  (…)" with an empty name, before the problem
    from datetime import datetime, timedelta, timezone

    from model.admission import Refusal, check
    from model.parse import VMIAsk

    problem = "sets neither spec.resourceName nor spec.deviceClassName: exactly one is required (DR1)"
    neither = GPUClass(CLASS, "", problem=problem)   # as model.parse reads such a class
    snap = snap_of([dra_node("n1")], classes=[neither])
    got = check(snap, "t", "vm", VMIAsk((), ((CLASS, 1),)), set(),
                datetime(2030, 1, 1, tzinfo=timezone.utc), timedelta(minutes=2),
                permitted=frozenset({"nvidia.com/L40S"}))
    assert got == Refusal(CannotPlace("t", "vm", (ClassProblem(CLASS, problem),)))
    assert "does not permit" not in got.reason.render()


def test_W1_a_class_with_a_problem_is_refused_per_order():
    bad = device_class(problem="neither resourceName nor deviceClassName is set")
    v = check_set(snap_of([dra_node("n1")], classes=[bad]), "t", [Order("t", CLASS)])
    assert not v.admitted and v.reason == ClassProblem(CLASS, "neither resourceName nor deviceClassName is set")


def test_DR4_the_tightest_group_wins_over_the_tightest_node():
    # a: free {1,2,5,7}: the whole pair {1,2} in a quad with 2 free → (0, 2)
    # b: free {5,6,7}: the whole pair {5,7} breaks a quad with 3 free → (1, 1): fewer free
    # units (count mode's B4 would pick b), but a's pair leaves no block broken further.
    snap = snap_of([dra_node("a", taken=(0, 3, 4, 6)), dra_node("b", taken=(0, 1, 2, 3, 4))],
                   pending("x", "y"))
    d = decide(snap, Request("r1", "t", "vm", ("x", "y")), limit=None)
    assert [p.node for p in d.placements] == ["a", "b"]
    assert [r.device for _, r in d.placements[0].devices] == ["gpu-vfio-1", "gpu-vfio-2"]


def test_DR4_fewest_moves_first_a_held_member_gathers_its_partner_into_its_pair():
    # gpu-a holds GPU 3 (module 1) on n1; its pair partner is GPU 0 (module 2)
    snap = snap_of([dra_node("n1"), dra_node("n2")], [recorded("t", "gpu-a", "n1", 3),
                                                       *pending("new")])
    d = decide(snap, Request("r1", "t", "vm", ("gpu-a", "new")))
    assert d.node == "n1" and len(d.placements[0].moves) == 1
    assert d.placements[0].devices == ((("t", "gpu-a"), ref("n1", 3)), (("t", "new"), ref("n1", 0)))
    assert d.message == "placed t/vm request r1 on n1: bind new; devices gpu-a=gpu-vfio-3, new=gpu-vfio-0"


def test_B6_device_mode_holds_only_with_records_that_exist_and_form_a_group():
    pair = [recorded("t", "a", "n1", 3), recorded("t", "b", "n1", 0)]
    snap = snap_of([dra_node("n1")], pair)
    d = decide(snap, Request("r1", "t", "vm", ("a", "b")))
    assert d.rule is Rule.B6 and d.placements[0].devices == ()
    # not a partition of two: re-pointed on the same node (a status write, no move, DR4)
    split = [recorded("t", "a", "n1", 3), recorded("t", "b", "n1", 1)]
    d = decide(snap_of([dra_node("n1")], split), Request("r1", "t", "vm", ("a", "b")))
    assert (d.rule, d.node, d.placements[0].moves) == (Rule.B1, "n1", ())
    devices = dict(d.placements[0].devices)
    pair_of = {devices[("t", "a")].device, devices[("t", "b")].device}
    assert pair_of in ({"gpu-vfio-3", "gpu-vfio-0"}, {"gpu-vfio-2", "gpu-vfio-1"})
    # a recorded device that vanished from the slices: a new choice
    gone = [recorded("t", "a", "n1", 3), GPUDevice("t", "b", CLASS, status=DeviceStatus(
        Phase.BOUND, "n1", None, device=DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-99")))]
    d = decide(snap_of([dra_node("n1")], gone), Request("r1", "t", "vm", ("a", "b")))
    assert d.rule is Rule.B1 and dict(d.placements[0].devices)[("t", "a")] == ref("n1", 3)


def test_DR1_a_class_with_a_problem_refuses_its_sets():
    bad = device_class(problem="DeviceClass vfio.gpu.nvidia.com not found")
    d = decide(snap_of([dra_node("n1")], pending("a"), [bad]), Request("r1", "t", "vm", ("a",)))
    assert d.reason.reasons == (ClassProblem(CLASS, "DeviceClass vfio.gpu.nvidia.com not found"),)
    assert d.reason.code is Code.CLASS_PROBLEM


def test_DR1_W1_a_set_mixing_modes_is_refused_with_its_own_reason():
    count = GPUClass("l40s", "nvidia.com/L40S")
    classes = [device_class(), count]
    snap = snap_of([dra_node("n1")], pending("a") + pending("b", cls="l40s"), classes)
    d = decide(snap, Request("r1", "t", "vm", ("a", "b")))
    assert d.reason.reasons == (MixedModes((CLASS,), ("l40s",)),)
    v = check_set(snap, "t", [Order("t", CLASS), Order("t", "l40s")])
    assert not v.admitted and v.reason.code is Code.MIXED_MODES
    assert v.reason.render().startswith("KubeVirt refuses a VMI mixing DRA GPUs and device-plugin GPUs")


def test_DR4_apply_decision_records_the_chosen_devices():
    snap = snap_of([dra_node("n1")], pending("a", "b"))
    req = Request("r1", "t", "vm", ("a", "b"))
    d = decide(snap, req)
    after = apply_decision(snap, req, d, now=NOW)
    assert {after.device("t", n).status.device for n in "ab"} == {r for _, r in d.placements[0].devices}
    assert decide(after, Request("r2", "t", "vm", ("a", "b"))).rule is Rule.B6


# --- properties -----------------------------------------------------------------------------------

def _group_ok(snap: Snapshot, node: str, members: list[GPUDevice]) -> bool:
    by_class: dict[str, list[GPUDevice]] = {}
    for m in members:
        by_class.setdefault(m.class_name, []).append(m)
    for c, ms in by_class.items():
        attribute = resolve_attribute(snap.mode.matches[c], len(ms))
        devs = {d.ref: d for d in snap.nodes[node].devices_of(c)}
        values = {devs[m.status.device].as_device().attribute(attribute) for m in ms}
        if None in values or len(values) != 1:
            return False
    return True


@st.composite
def fleets(draw):
    n_nodes = draw(st.integers(1, 3))
    nodes = [dra_node(f"n{i}", taken=tuple(draw(st.sets(st.integers(0, 7), max_size=3))))
             for i in range(n_nodes)]
    sizes = draw(st.lists(st.sampled_from([1, 1, 2, 2, 4, 8, 3]), min_size=1, max_size=8))
    return nodes, sizes


@PROPS
@given(fleets(), st.data())
def test_DR6_property_admitted_sets_satisfy_their_constraint_and_no_device_is_on_two_records(fleet, data):
    nodes, sizes = fleet
    snap = snap_of(nodes)
    held: list[str] = []  # devices of earlier sets, some reused as held members
    for i, size in enumerate(sizes):
        reuse = data.draw(st.lists(st.sampled_from(held), unique=True, max_size=min(size, len(held))),
                          label="held") if held else []
        new = [f"d{i}-{j}" for j in range(size - len(reuse))]
        snap = snap.with_devices(pending(*new))
        req = Request(f"r{i}", "t", f"vm{i}", tuple(reuse + new))
        d = decide(snap, req)
        note(f"{req.devices}: {d.message}")
        snap = apply_decision(snap, req, d, now=NOW)
        held += new
        if d.result is Result.SUCCEEDED:
            members = [snap.device("t", n) for n in req.devices]
            assert all(m.bound_node == d.node and m.status.device is not None for m in members)
            assert _group_ok(snap, d.node, members)
        assert size != 3 or d.result is Result.REFUSED
        records: dict[tuple[str, str], tuple[str, str]] = {}
        for key, dev in snap.devices.items():
            if dev.status.device is not None:
                where = (dev.bound_node, dev.status.device.device)
                assert where not in records, f"{where} recorded by {records[where]} and {key}"
                assert dev.status.device.device not in snap.nodes[dev.bound_node].taken_devices
                records[where] = key


@PROPS
@given(st.sets(st.integers(0, 7), max_size=6), st.sampled_from([1, 2, 4]))
def test_DR4_property_buddy_never_breaks_a_whole_block_when_another_placement_keeps_it(taken, size):
    """The chosen group's enclosing block (the partition of twice its size) is whole-free
    before the placement only when every group with room sits in a whole-free block."""
    node = dra_node("n1", taken=tuple(taken))
    snap = snap_of([node], pending(*(f"d{i}" for i in range(size))))
    d = decide(snap, Request("r1", "t", "vm", tuple(f"d{i}" for i in range(size))))
    if d.result is Result.REFUSED:
        return
    devs = {x.ref.device: x.as_device() for x in node.devices_of(CLASS)}
    free = set(devs) - {f"gpu-vfio-{i}" for i in taken}
    attr, up = f"gpu.nvidia.com/partition{size}", f"gpu.nvidia.com/partition{size * 2}"

    def whole(block_value) -> bool:
        return all(n in free for n, x in devs.items() if x.attribute(up) == block_value)

    chosen = [r.device for _, r in d.placements[0].devices]
    groups = {}
    for n, x in devs.items():
        groups.setdefault(x.attribute(attr), []).append(n)
    fitting = [g for g in groups.values() if all(n in free for n in g)]
    if whole(devs[chosen[0]].attribute(up)):
        assert all(whole(devs[g[0]].attribute(up)) for g in fitting)


@PROPS
@given(st.sets(st.integers(0, 7), max_size=8), st.integers(1, 8))
def test_DR3_property_refusal_exactly_when_no_group_has_room(taken, size):
    node = dra_node("n1", taken=tuple(taken))
    snap = snap_of([node], pending(*(f"d{i}" for i in range(size))))
    d = decide(snap, Request("r1", "t", "vm", tuple(f"d{i}" for i in range(size))))
    free = {f"gpu-vfio-{i}" for i in range(8)} - {f"gpu-vfio-{i}" for i in taken}
    attr = f"gpu.nvidia.com/partition{size}"
    groups: dict = {}
    for x in node.devices_of(CLASS):
        v = x.as_device().attribute(attr)
        if v is not None:
            groups.setdefault(v, []).append(x.ref.device)
    room = any(all(n in free for n in g) for g in groups.values())
    assert (d.result is Result.SUCCEEDED) == room


# --- D1, explain ------------------------------------------------------------------------------------

def test_D1_D3_two_nodes_half_held_one_is_cleared_onto_the_other_for_a_set_of_eight():
    """Two HGX nodes, each with 4 idle held devices (largest set 4 on both): the round moves
    n1's four to n2's free devices, recording each, and an 8-set fits on n1 after it."""
    from model.defrag import apply_moves, largest_sets, movable, plan_round
    devices = [recorded("t", f"a{i}", "n1", i) for i in range(4)] + \
              [recorded("t", f"b{i}", "n2", i) for i in range(4, 8)]
    snap = snap_of([dra_node("n1"), dra_node("n2")], devices)
    assert all(movable(d, snap) for d in devices)
    plan = plan_round(snap)
    assert [(m.device[1], m.from_node, m.to_node) for m in plan.moves] == \
        [(f"a{i}", "n1", "n2") for i in range(4)]
    assert sorted(m.to_device.device for m in plan.moves) == sorted(names(0, 1, 2, 3))
    assert [m.from_device for m in plan.moves] == [ref("n1", i) for i in range(4)]
    assert [(x.size, x.nodes) for x in plan.before] == [(4, 2)]
    assert [(x.size, x.nodes) for x in plan.after] == [(8, 1)]
    after = apply_moves(snap, plan.moves, now=NOW)
    assert largest_sets(after) == plan.after
    assert all(after.device("t", f"a{i}").status.device.pool == "n2" for i in range(4))
    after = after.with_devices(pending(*[f"p{i}" for i in range(8)]))
    d = decide(after, Request("r8", "t", "vm8", tuple(f"p{i}" for i in range(8))))
    assert (d.result, d.node) == (Result.SUCCEEDED, "n1")
    assert "moved t/a0 (h100x) from n1 (gpu-vfio-0) to n2 (gpu-vfio-" in plan.moves[0].render()


def test_DR4_D3_an_idle_held_device_is_re_pointed_within_its_node_to_make_a_partition_whole():
    """One node, idle held devices on gpu-vfio-0 (module 2, partition of 4 {1-4}) and
    gpu-vfio-4 (module 7, {5-8}): no partition of 4 is free. One re-point (a status write:
    same node, another device) frees {1-4}; nothing moves off the node."""
    from model.defrag import apply_moves, largest_sets, plan_round
    devices = [recorded("t", "a", "n1", 0), recorded("t", "b", "n1", 4)]
    snap = snap_of([dra_node("n1")], devices)
    plan = plan_round(snap)
    assert [(x.size, x.nodes) for x in plan.before] == [(2, 1)]
    assert [(x.size, x.nodes) for x in plan.after] == [(4, 1)]
    (m,) = plan.moves
    assert m.repoint and (m.from_node, m.to_node) == ("n1", "n1")
    assert m.from_device in (ref("n1", 0), ref("n1", 4))
    after = apply_moves(snap, plan.moves)
    moved = after.device(*m.device)
    assert (moved.bound_node, moved.status.device) == ("n1", m.to_device)
    assert moved.status.bound_at == snap.device(*m.device).status.bound_at  # not a move
    assert largest_sets(after) == plan.after
    assert "re-pointed t/" in m.render() and " on n1 from gpu-vfio-" in m.render()
    after = after.with_devices(pending("p0", "p1", "p2", "p3"))
    d = decide(after, Request("r4", "t", "vm4", ("p0", "p1", "p2", "p3")))
    assert (d.result, d.node) == (Result.SUCCEEDED, "n1")


def test_D1_device_mode_attached_template_stay_tainted_claimed_and_vanished_never_move():
    """D1 in device mode: attached, template, `Stay` and record-less devices are not movable;
    a device whose recorded GPU vanished from the slice (lost capacity) is neither moved nor
    re-pointed; a re-point never lands on a claimed or tainted GPU (DR2)."""
    from model.defrag import movable, plan_round
    from model.types import Attachment, OnCordon
    from tests.support.dra_worlds import tainted
    stay = device_class("stay", on_cordon=OnCordon.STAY)
    att = GPUDevice("t", "att", CLASS, status=DeviceStatus(
        Phase.BOUND, "n1", None, Attachment("vm", NOW), device=ref("n1", 0)))
    tmpl = recorded("t", "tmpl", "n1", 4, template_for="vm")
    st_dev = recorded("t", "st", "n1", 1, class_name="stay")
    bare = GPUDevice("t", "bare", CLASS, status=DeviceStatus(Phase.BOUND, "n1", None))
    snap = snap_of([dra_node("n1", classes=(CLASS, "stay"))], [att, tmpl, st_dev, bare],
                   classes=[device_class(), stay])
    assert not any(movable(d, snap) for d in (att, tmpl, st_dev, bare))
    assert plan_round(snap).moves == ()
    # a record of a GPU the slice no longer lists: kept as it is
    n1 = dra_node("n1")
    gone = replace_devices(n1, drop=("gpu-vfio-0",))
    snap = snap_of([gone], [recorded("t", "a", "n1", 0), recorded("t", "b", "n1", 4)])
    assert all(m.device[1] != "a" for m in plan_round(snap).moves)
    # the free GPUs a re-point could take are claimed or tainted: b stays on gpu-vfio-4
    n1 = tainted(dra_node("n1", taken=(1, 2, 3)), 5, 6, 7)
    snap = snap_of([n1], [recorded("t", "a", "n1", 0), recorded("t", "b", "n1", 4)])
    for m in plan_round(snap).moves:
        assert m.to_device.device not in names(1, 2, 3, 5, 6, 7)


def replace_devices(node, drop=()):
    from dataclasses import replace as _replace
    return _replace(node, class_devices=tuple(
        (c, tuple(d for d in devs if d.ref.device not in drop)) for c, devs in node.class_devices))


@st.composite
def device_fleets(draw):
    """Up to 4 HGX nodes (some GPUs claimed, tainted, one node maybe cordoned), idle held,
    attached and template devices recording random free GPUs, a hold in flight naming one."""
    from model.types import Attachment
    from tests.support.dra_worlds import tainted
    n_nodes = draw(st.integers(1, 4))
    nodes = []
    for i in range(n_nodes):
        nd = dra_node(f"n{i}", taken=tuple(draw(st.sets(st.integers(0, 7), max_size=2))),
                      unschedulable=draw(st.integers(0, 6)) == 0)
        bad = draw(st.sets(st.integers(0, 7), max_size=1))
        nodes.append(tainted(nd, *bad) if bad else nd)
    devices, holds = [], []
    for nd in nodes:
        free = sorted(set(range(8)) - {int(x.rsplit("-", 1)[1]) for x in nd.taken_devices})
        for j in draw(st.lists(st.sampled_from(free), unique=True, max_size=7)) if free else []:
            kind = draw(st.sampled_from(["idle", "idle", "idle", "attached", "template"]))
            ns = draw(st.sampled_from(["t", "u"]))
            name = f"{nd.name}-{j}"
            if kind == "attached":
                devices.append(GPUDevice(ns, name, CLASS, status=DeviceStatus(
                    Phase.BOUND, nd.name, NOW, Attachment("vm", NOW), device=ref(nd.name, j))))
            else:
                devices.append(recorded(ns, name, nd.name, j,
                                        template_for="vm" if kind == "template" else None))
    if draw(st.booleans()):
        nd = draw(st.sampled_from(nodes))
        used = {d.status.device.device for d in devices if d.bound_node == nd.name}
        left = sorted(names(*range(8)) - used - nd.taken_devices)
        if left:
            g = draw(st.sampled_from(left))
            holds.append(Hold("h0", "t", nd.name, ((RES, 1),), (), (),
                              ((("t", "pending-x"), DeviceRef("gpu.nvidia.com", nd.name, g)),)))
    return snap_of(nodes, devices, reservations=holds)


@settings(max_examples=200, deadline=None)
@given(device_fleets(), st.integers(1, 5))
def test_D1_D2_D3_D5_DR6_property_a_device_mode_round_is_safe_and_never_shrinks(snap, max_moves):
    """A round in device mode: at most `max_moves` moves of movable devices, each once; a
    move goes to an eligible node with a free unit; every step records a device free for
    it (never claimed, tainted, held in flight or on another record, DR2/DR6); the plan's
    figures are those of the snapshot after it (D3: none lower, one higher when it moves);
    no tenant's usage changes (D5)."""
    from model.defrag import apply_moves, eligible_nodes, largest_sets, movable, plan_round
    plan = plan_round(snap, max_moves=max_moves)
    assert len(plan.moves) <= max_moves
    assert plan.before == largest_sets(snap)
    assert len({m.device for m in plan.moves}) == len(plan.moves)
    work = snap
    for m in plan.moves:
        d = work.device(*m.device)
        assert movable(snap.device(*m.device), snap)
        assert (d.bound_node, d.status.device) == (m.from_node, m.from_device)
        if not m.repoint:
            assert m.to_node in eligible_nodes(snap, d.class_name) and m.to_node != m.from_node
            assert work.free(m.to_node, m.resource) >= 1
        assert m.to_device.pool == m.to_node
        assert m.to_device.device in work.free_devices(m.to_node, CLASS, None, (d.key,))
        work = apply_moves(work, [m])
    assert plan.after == largest_sets(work)
    for b, a in zip(plan.before, plan.after):
        assert a.rank >= b.rank
    if plan.moves:
        assert any(a.rank > b.rank for b, a in zip(plan.before, plan.after))
    event(f"moves: {len(plan.moves)}, re-points: {sum(m.repoint for m in plan.moves)}")
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for key, dev in work.devices.items():
        if dev.status.device is not None:
            where = (dev.bound_node, dev.status.device.device)
            assert where not in seen, (where, seen[where], key)
            seen[where] = key
    for ns in ("t", "u"):
        assert work.tenant_usage(ns, RES) == snap.tenant_usage(ns, RES)


def test_explain_renders_device_mode_reasons_through_the_typed_reasons():
    """explain's verdict on the fragmented node is the typed NoDeviceGroup, and no
    'smallest change' is offered there: freeing units elsewhere makes no group."""
    from datetime import timedelta
    from model.explain import explain
    from model.parse import VMIAsk
    snap = snap_of([dra_node("n1", taken=(1, 5, 6))])
    e = explain(snap, "t", "vm", VMIAsk((), ((CLASS, 4),)), live_vmis=set(), now=NOW,
                grace=timedelta(minutes=2))
    assert not e.admitted and e.reason.code is Code.NO_ELIGIBLE_NODE
    (verdict,) = e.nodes
    assert [r.code for r in verdict.reasons] == [Code.NO_DEVICE_GROUP]
    assert e.message.endswith("n1: no 4 free h100x devices share gpu.nvidia.com/partition4: "
                              "5 free, the largest group has 3")
    assert e.shortfalls == ()


def test_B7_recovery_in_device_mode_lands_the_rest_in_the_recorded_members_group():
    from model.plan import Recover, plan_one
    from model.types import BindRequest
    br = BindRequest("r1", "vm", ("a", "b"), node="n1")
    a = GPUDevice("t", "a", CLASS, status=DeviceStatus(
        Phase.BOUND, "n1", NOW, bind_request=BindRequest("r1", "vm", ("a", "b"), None, (),
                                                          Result.SUCCEEDED, "placed", "n1"),
        device=ref("n1", 3)))
    b = GPUDevice("t", "b", CLASS, status=DeviceStatus(bind_request=br))
    snap = snap_of([dra_node("n1")], [a, b])
    action = plan_one(snap, "t", "r1", [a, b])
    assert isinstance(action, Recover) and action.node == "n1"
    assert action.hold.devices == ((("t", "b"), ref("n1", 0)),)  # a's partner in pair {0,3}
