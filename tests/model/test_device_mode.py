"""Device mode in the pure model (DESIGN.md §3b DR2-DR4, DR6): what is free on a node by
name (DR2), the group check and its refusal naming the sizes that exist (DR3), the DR4 order,
B6 with records, re-pointing within a node, the class problem and mixed-mode refusals (DR1),
apply_decision recording `status.device`; property tests over HGX fleets (8 GPUs, partitions
from gpuModuleID as `localcluster.dra_profiles` publishes them)."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, note, settings
from hypothesis import strategies as st

from model.check import check_set
from model.dra import DeviceRef
from model.decide import Request, Rule, apply_decision, decide
from model.hold import Hold, outstanding
from model.reasons import ClassProblem, Code, MixedModes, NoDeviceGroup
from model.snapshot import Order, Snapshot
from model.topology import resolve_attribute
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
        attribute = resolve_attribute(snap.classes[c].match_attribute, len(ms))
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

def test_D1_device_mode_classes_are_left_out_of_defragmentation_moves():
    """Two nodes each with 4 idle held devices (one per partition of 4 would free a node):
    count mode would move them together; device mode leaves them (D1, for now)."""
    from model.defrag import movable, plan_round
    devices = [recorded("t", f"a{i}", "n1", i) for i in range(4)] + \
              [recorded("t", f"b{i}", "n2", i) for i in range(4, 8)]
    snap = snap_of([dra_node("n1"), dra_node("n2")], devices)
    assert not any(movable(d, snap) for d in devices)
    assert plan_round(snap).moves == ()
    count = GPUClass("h100", "nvidia.com/H100")
    assert movable(GPUDevice("t", "c", "h100", status=DeviceStatus(Phase.BOUND, "n1")),
                   Snapshot.build(classes=[count]))


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
