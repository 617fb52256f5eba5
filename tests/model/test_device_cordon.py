"""B5 in device mode (docs/contract.md §2 B5(a)/(b), §3b DR2-DR4): a set kept on its cordoned node
is kept as it is only when its records still hold there (as B6 checks them); a recorded
device now NoExecute-tainted, recorded by another device, or vanished from the node's slices
gets the set re-pointed within the node when a group is free there (a status write, no
move), else the set is treated like any other (moved, or refused naming the node's missing
group). A claim allocating a recorded device reads as the set's own claim (DR2, DR5), so
foreign claims only matter here on the devices the set would be re-pointed to.

HGX H100 pairs (partition2, by gpuModuleID): {0,3} {1,2} {4,6} {5,7}."""

from __future__ import annotations

from datetime import datetime, timezone

from model.decide import Placement, Request, Rule, apply_decision, decide
from model.device.dra import DeviceRef
from model.plan import changes, placement_hold
from model.reasons import Cordoned, KeptCordoned, NodeProblems, NoDeviceGroup, RequestRef
from model.snapshot import Snapshot
from model.types import DeviceStatus, GPUDevice, OnCordon, Phase, Result
from tests.support.dra_worlds import CLASS, PARTITION_ATTRIBUTE, device_class, dra_node, recorded, ref, tainted

NOW = datetime(2026, 12, 4, tzinfo=timezone.utc)
R1 = RequestRef("t", "vm", "r1")
REQ = Request("r1", "t", "vm", ("a", "b"))
STAY = device_class(on_cordon=OnCordon.STAY)
MOVE = device_class()


def snap_of(nodes, devices, cls=STAY) -> Snapshot:
    return Snapshot.build(nodes=nodes, classes=[cls], devices=devices)


def pair(node: str = "n1", a: int = 3, b: int = 0) -> list[GPUDevice]:
    """a and b Bound on `node` recording GPUs `a` and `b` (default: the pair {0,3})."""
    return [recorded("t", "a", node, a), recorded("t", "b", node, b)]


def devices_of(d) -> dict[str, str]:
    return {key[1]: r.device for key, r in d.placements[0].devices}


# --- B5(b) Stay ---------------------------------------------------------------------------------

def test_B5b_device_mode_records_intact_kept_with_the_same_devices():
    snap = snap_of([dra_node("n1", unschedulable=True), dra_node("n2")], pair())
    d = decide(snap, REQ)
    assert (d.result, d.rule, d.node) == (Result.SUCCEEDED, Rule.B5B, "n1")
    assert d.placements == (Placement("n1", (), (), ()),)
    assert d.outcome == KeptCordoned(R1, "n1", "B5b", (CLASS,))
    assert not changes(d.placements[0], snap)  # the planner's Answer: only the result is written
    after = apply_decision(snap, REQ, d, now=NOW)
    assert [after.device("t", n).status.device for n in "ab"] == [ref("n1", 3), ref("n1", 0)]


def test_B5b_device_mode_a_recorded_device_now_tainted_is_re_pointed_on_the_node():
    # GPU 0 (b's record) is NoExecute-tainted; GPU 3 (a's) lost its partner: the set takes the
    # tightest free pair of n1 ({1,2}: its quad {0-3} is already broken)
    snap = snap_of([tainted(dra_node("n1", unschedulable=True), 0), dra_node("n2")], pair())
    d = decide(snap, REQ)
    assert (d.result, d.rule, d.node, d.placements[0].moves) == (Result.SUCCEEDED, Rule.B5B, "n1", ())
    assert devices_of(d) == {"a": "gpu-vfio-1", "b": "gpu-vfio-2"}
    assert d.outcome == KeptCordoned(R1, "n1", "B5b", (CLASS,), (("a", "gpu-vfio-1"), ("b", "gpu-vfio-2")))
    assert d.message == ("t/vm request r1: kept on cordoned node n1 (B5b: class h100x is onCordon "
                         "Stay); devices a=gpu-vfio-1, b=gpu-vfio-2; the VMI waits for the cordon to lift")
    # the planner lands it as a status write: named devices, no units, nothing landing
    assert changes(d.placements[0], snap)
    hold = placement_hold(REQ, d.placements[0], snap)
    assert (hold.node, hold.needs, hold.budget_needs, hold.landing) == ("n1", (), (), ())
    assert hold.device_names == {"gpu-vfio-1", "gpu-vfio-2"}
    after = apply_decision(snap, REQ, d, now=NOW)
    assert [after.device("t", n).status.device for n in "ab"] == [ref("n1", 1), ref("n1", 2)]
    again = decide(after, Request("r2", "t", "vm", ("a", "b")))
    assert (again.rule, again.placements) == (Rule.B5B, (Placement("n1", (), (), ()),))


def test_B5b_device_mode_a_device_another_records_is_re_pointed_around_it():
    other = recorded("u", "x", "n1", 0)  # a second record of GPU 0 (e.g. a stale write)
    snap = snap_of([dra_node("n1", unschedulable=True), dra_node("n2")], [*pair(), other])
    d = decide(snap, REQ)
    assert (d.rule, d.node, d.placements[0].moves) == (Rule.B5B, "n1", ())
    assert devices_of(d) == {"a": "gpu-vfio-1", "b": "gpu-vfio-2"}


def test_B5b_device_mode_a_recorded_device_gone_from_the_slices_is_re_pointed_keeping_the_rest():
    gone = [recorded("t", "a", "n1", 3), GPUDevice("t", "b", CLASS, status=DeviceStatus(
        Phase.BOUND, "n1", None, device=DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-99")))]
    snap = snap_of([dra_node("n1", unschedulable=True), dra_node("n2")], gone)
    d = decide(snap, REQ)
    assert (d.rule, d.node, d.placements[0].moves) == (Rule.B5B, "n1", ())
    assert devices_of(d) == {"a": "gpu-vfio-3", "b": "gpu-vfio-0"}  # a keeps its record


def test_B5b_device_mode_no_group_left_on_the_node_moves_or_refuses_saying_why():
    # GPU 0 (b's record) tainted, foreign claims on 1, 4, 5: n1's free devices 2, 3 (a's), 6, 7
    # form no pair
    n1 = tainted(dra_node("n1", unschedulable=True, taken=(1, 4, 5)), 0)
    d = decide(snap_of([n1], pair()), REQ)
    assert d.result is Result.REFUSED
    # free for the set: 2, 3, 6, 7; the largest group of one partition2 value: 1
    no_pair = NoDeviceGroup(CLASS, PARTITION_ATTRIBUTE.replace("{size}", "2"), 2, 4, 1)
    assert d.reason.reasons[0].nodes == (NodeProblems("n1", (Cordoned(), no_pair)),)
    # with room elsewhere: placed anew there (two moves), as any set
    d = decide(snap_of([n1, dra_node("n2")], pair()), REQ)
    assert (d.result, d.rule, d.node, len(d.placements[0].moves)) == (Result.SUCCEEDED, Rule.B1, "n2", 2)


# --- B5(a) Move, no room elsewhere ----------------------------------------------------------------

def test_B5a_device_mode_records_intact_kept_with_the_same_devices():
    snap = snap_of([dra_node("n1", unschedulable=True), dra_node("n2", taken=(0, 1, 4, 5))], pair(), MOVE)
    d = decide(snap, REQ)
    assert (d.result, d.rule, d.node, d.placements) == (Result.SUCCEEDED, Rule.B5A, "n1",
                                                        (Placement("n1", (), (), ()),))
    assert d.outcome == KeptCordoned(R1, "n1", "B5a")


def test_B5a_device_mode_a_recorded_device_now_tainted_is_re_pointed_on_the_node():
    full = dra_node("n2", taken=(0, 1, 4, 5))  # no pair free: no room elsewhere
    snap = snap_of([tainted(dra_node("n1", unschedulable=True), 0), full], pair(), MOVE)
    d = decide(snap, REQ)
    assert (d.result, d.rule, d.node, d.placements[0].moves) == (Result.SUCCEEDED, Rule.B5A, "n1", ())
    assert devices_of(d) == {"a": "gpu-vfio-1", "b": "gpu-vfio-2"}
    assert d.outcome == KeptCordoned(R1, "n1", "B5a", (), (("a", "gpu-vfio-1"), ("b", "gpu-vfio-2")))
    # room elsewhere: moved there (B5(a) does not apply), as before
    d = decide(snap_of([tainted(dra_node("n1", unschedulable=True), 0), dra_node("n2")], pair(), MOVE), REQ)
    assert (d.rule, d.node) == (Rule.B1, "n2")


def test_B5a_device_mode_no_group_left_on_the_node_is_refused_naming_it():
    n1 = tainted(dra_node("n1", unschedulable=True, taken=(1, 4, 5)), 0)
    d = decide(snap_of([n1, dra_node("n2", taken=(0, 1, 4, 5))], pair(), MOVE), REQ)
    assert d.result is Result.REFUSED
    no_pair = NoDeviceGroup(CLASS, PARTITION_ATTRIBUTE.replace("{size}", "2"), 2, 4, 1)
    assert d.reason.reasons[0].nodes[0] == NodeProblems("n1", (Cordoned(), no_pair))
