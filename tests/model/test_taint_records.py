"""HL1 on records (docs/contract.md §3b DR2/DR4, HL1; docs/device-mode.md "A held device
on a tainted GPU"): an idle held record on a device now under a NoSchedule/NoExecute taint
(a DeviceTaintRule's or its ResourceSlice's) is never answered "already placed" there (B6),
nor admitted as it is by W4's short cut when the set is kept for a stopped VM (H4): it is
re-pointed within its node to a group the class's constraint allows, or the set is moved,
at its next placement; a running VMI's record is named but left alone; `explain` names the
taint (`RecordTainted`), and the coordinator's log line is made from `off_taint`.

HGX H100 pairs (partition2, by gpuModuleID): {0,3} {1,2} {4,6} {5,7}."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from model.admission import AdmissionPlan, already_admitted
from model.decide import Request, Rule, apply_decision, decide
from model.device.dra import DeviceTaint
from model.device.records import foreign_claimed_records
from model.device.taint_rules import TaintRule
from model.device.tainted_records import OffTaint, off_taint, record_taint, tainted_records
from model.explain import explain
from model.parse import VMIAsk
from model.reasons import NoDeviceGroup, RecordTainted, TaintedDevices
from model.snapshot import Snapshot
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node, recorded, ref

NOW = datetime(2026, 12, 6, 15, tzinfo=timezone.utc)
XID = TaintRule("xid-79", DeviceTaint("example.com/xid", "79", "NoSchedule")).taint
EVICT = DeviceTaint("gpu.nvidia.com/gpu-lost", "", "NoExecute")


def as_index_builds(node, taints: dict[int, DeviceTaint], recorded_at: tuple[int, ...] = ()):
    """`node` with `taints` on its GPUs as the DRA index builds it (a DeviceTaintRule's taint
    carries its rule's name): the tainted devices are taken, and counted as foreign unless a
    record names them."""
    names = {f"gpu-vfio-{i}": t for i, t in taints.items()}
    n = replace(node, class_devices=tuple(
        (c, tuple(replace(d, taints=(names[d.ref.device],)) if d.ref.device in names else d for d in devs))
        for c, devs in node.class_devices))
    taken = n.taken_devices | set(names)
    foreign = len(taken - {f"gpu-vfio-{i}" for i in recorded_at})
    return replace(n, taken_devices=frozenset(taken), foreign=((RES, foreign),) if foreign else ())


def pair(node: str = "n1", a: int = 3, b: int = 0, **kw) -> list[GPUDevice]:
    """a and b Bound on `node` recording GPUs `a` and `b` (default: the pair {0,3})."""
    return [recorded("t", "a", node, a, **kw), recorded("t", "b", node, b, **kw)]


def snap_of(nodes, devices) -> Snapshot:
    return Snapshot.build(nodes=nodes, classes=[device_class()], devices=devices)


def records(d) -> dict[str, str]:
    return {key[1]: r.device for key, r in d.placements[0].devices}


# --- an idle held record (B6, B1, DR4) ---------------------------------------------------------

def test_HL1_an_idle_held_record_on_a_gpu_a_rule_taints_is_re_pointed_within_its_node():
    # b's GPU 0 is tainted by DeviceTaintRule xid-79: the pair {0,3} no longer holds; n1 keeps
    # the set (no move, though n2 is empty) on its tightest free pair, never GPU 0
    n1 = as_index_builds(dra_node("n1"), {0: XID}, recorded_at=(0,))
    snap = snap_of([n1, dra_node("n2")], pair())
    d = decide(snap, Request("r1", "t", "vm", ("a", "b")))
    assert (d.result, d.rule, d.node, d.placements[0].moves) == (Result.SUCCEEDED, Rule.B1, "n1", ())
    assert "already placed" not in d.message
    assert records(d) == {"a": "gpu-vfio-1", "b": "gpu-vfio-2"}
    after = apply_decision(snap, Request("r1", "t", "vm", ("a", "b")), d, now=NOW)
    assert [after.device("t", n).status.device for n in "ab"] == [ref("n1", 1), ref("n1", 2)]
    again = decide(after, Request("r2", "t", "vm", ("a", "b")))
    assert again.rule is Rule.B6  # the new records hold


def test_HL1_the_untainted_record_is_kept_when_its_group_allows():
    # one device of a one-device set: GPU 4 tainted NoExecute (a ResourceSlice's taint), the
    # record moves to the device a one-device set takes on n1, the same node
    n1 = as_index_builds(dra_node("n1"), {4: EVICT}, recorded_at=(4,))
    snap = snap_of([n1], [recorded("t", "a", "n1", 4)])
    d = decide(snap, Request("r1", "t", "vm", ("a",)))
    assert (d.result, d.node, d.placements[0].moves) == (Result.SUCCEEDED, "n1", ())
    assert records(d)["a"] != "gpu-vfio-4"


def test_HL1_no_valid_group_left_on_its_node_moves_the_set_or_refuses_naming_the_taint():
    # b's GPU 0 tainted, foreign claims on 1, 4, 5: n1's free 2, 3 (a's), 6, 7 form no pair
    n1 = as_index_builds(dra_node("n1", taken=(1, 4, 5)), {0: XID}, recorded_at=(0,))
    d = decide(snap_of([n1, dra_node("n2")], pair()), Request("r1", "t", "vm", ("a", "b")))
    assert (d.result, d.rule, d.node, len(d.placements[0].moves)) == (Result.SUCCEEDED, Rule.B1, "n2", 2)
    d = decide(snap_of([n1], pair()), Request("r1", "t", "vm", ("a", "b")))
    assert d.result is Result.REFUSED
    [group] = [r for r in d.reason.reasons[0].nodes[0].problems if isinstance(r, NoDeviceGroup)]
    assert group.tainted == (TaintedDevices(("gpu-vfio-0",), "example.com/xid", "NoSchedule", "xid-79",
                                            (("b", "gpu-vfio-0"),)),)
    assert "gpu-vfio-0 of held device b tainted example.com/xid:NoSchedule by DeviceTaintRule xid-79" \
        in d.message


def test_HL1_a_taint_of_another_effect_keeps_the_record_already_placed():
    # Kubernetes keeps its allocator off NoSchedule/NoExecute only: any other effect is no taint here
    soft = DeviceTaint("example.com/maintenance", "", "PreferNoSchedule")
    n1 = dra_node("n1")
    n1 = replace(n1, class_devices=tuple((c, tuple(replace(d, taints=(soft,)) if d.ref.device == "gpu-vfio-0"
                                                   else d for d in devs)) for c, devs in n1.class_devices))
    snap = snap_of([n1], pair())
    d = decide(snap, Request("r1", "t", "vm", ("a", "b")))
    assert (d.rule, d.node) == (Rule.B6, "n1")
    assert tainted_records(snap, [snap.device("t", n) for n in "ab"]) == ()


# --- a set kept for a stopped VM (H4, W4) -------------------------------------------------------

def kept_pair(node: str = "n1") -> list[GPUDevice]:
    """a and b, kept for VM vm1 (its VMI gone): Bound on `node` recording the pair {0,3},
    attached with `keptUntil`, their request Succeeded there."""
    att = Attachment("vm1", NOW - timedelta(minutes=5), "adm-1", "vmi-u1", "vm-uid", NOW + timedelta(hours=1))
    br = BindRequest("adm-1", "vm1", ("a", "b"), result=Result.SUCCEEDED, node=node)
    return [GPUDevice("t", name, CLASS, status=DeviceStatus(Phase.BOUND, node, NOW - timedelta(hours=1),
                                                            att, br, ref(node, i)))
            for name, i in (("a", 3), ("b", 0))]


PLAN = AdmissionPlan("t", "vm1", ("a", "b"), (), "n1")


def test_HL1_W4_a_kept_set_on_a_tainted_gpu_is_not_admitted_as_it_is_but_decided_again():
    clean = snap_of([dra_node("n1")], kept_pair())
    assert already_admitted(clean, PLAN, NOW) == "n1"          # W4 as before: no taint
    n1 = as_index_builds(dra_node("n1"), {0: XID}, recorded_at=(0,))
    snap = snap_of([n1, dra_node("n2")], kept_pair())
    assert already_admitted(snap, PLAN, NOW) is None           # the binder decides it again
    d = decide(snap, Request("adm-2", "t", "vm1", ("a", "b")))
    assert (d.result, d.node, d.placements[0].moves) == (Result.SUCCEEDED, "n1", ())
    assert records(d) == {"a": "gpu-vfio-1", "b": "gpu-vfio-2"}
    # with a NoExecute taint alike
    n1 = as_index_builds(dra_node("n1"), {3: EVICT}, recorded_at=(3,))
    assert already_admitted(snap_of([n1], kept_pair()), PLAN, NOW) is None


def test_HL1_count_mode_W4_is_unchanged():
    from model.types import GPUClass, Node
    h100 = "nvidia.com/H100"
    att = Attachment("vm1", NOW, "adm-1", "vmi-u1", "vm-uid", NOW + timedelta(hours=1))
    br = BindRequest("adm-1", "vm1", ("a",), result=Result.SUCCEEDED, node="n1")
    dev = GPUDevice("t", "a", "h100", status=DeviceStatus(Phase.BOUND, "n1", NOW, att, br))
    snap = Snapshot.build(nodes=[Node("n1", (("kubevirt.io/schedulable", "true"),), allocatable=((h100, 2),))],
                          classes=[GPUClass("h100", h100)], devices=[dev])
    assert already_admitted(snap, AdmissionPlan("t", "vm1", ("a",), (), "n1"), NOW) == "n1"
    assert tainted_records(snap, [dev]) == ()


# --- what is named: records, running VMIs, the log's off_taint ---------------------------------

def test_HL1_tainted_records_name_the_member_node_device_taint_and_rule_and_whether_it_runs():
    n1 = as_index_builds(dra_node("n1"), {0: XID, 4: EVICT}, recorded_at=(0, 4))
    running = GPUDevice("t", "c", CLASS, status=DeviceStatus(
        Phase.BOUND, "n1", NOW, Attachment("vm-run", NOW), device=ref("n1", 4)))
    snap = snap_of([n1], [*pair(), running])
    members = [snap.device("t", n) for n in "abc"]
    assert tainted_records(snap, members) == (
        RecordTainted("b", "n1", "gpu-vfio-0", "example.com/xid", "NoSchedule", "xid-79"),
        RecordTainted("c", "n1", "gpu-vfio-4", "gpu.nvidia.com/gpu-lost", "NoExecute", "", running=True))
    # a VMI known gone: not running; a record its node no longer publishes is HL3's, not here
    assert tainted_records(snap, members[2:], live=set())[0].running is False
    assert record_taint(None, CLASS, ref("n1", 0)) is None
    assert record_taint(snap.nodes["n1"], CLASS, ref("n2", 0)) is None


def test_HL1_off_taint_names_each_record_a_placement_takes_off_a_tainted_gpu():
    n1 = as_index_builds(dra_node("n1"), {0: XID}, recorded_at=(0,))
    snap = snap_of([n1, dra_node("n2")], pair())
    req = Request("r1", "t", "vm", ("a", "b"))
    d = decide(snap, req)
    members = [snap.device("t", n) for n in "ab"]
    [o] = off_taint(snap, members, d.node, dict(d.placements[0].devices))
    assert o == OffTaint(RecordTainted("b", "n1", "gpu-vfio-0", "example.com/xid", "NoSchedule", "xid-79"),
                         "n1", "gpu-vfio-2")
    assert o.repoint
    moved = off_taint(snap, members, "n2", {("t", "b"): ref("n2", 1)})
    assert [(m.record.device, m.to_node, m.to_device, m.repoint) for m in moved] == [("b", "n2", "gpu-vfio-1", False)]
    clean = snap_of([dra_node("n1")], pair())
    assert off_taint(clean, [clean.device("t", n) for n in "ab"], "n1", {}) == ()


def test_HL1_explain_names_the_taint_on_a_held_record():
    from model.housekeeping import VMIs
    n1 = as_index_builds(dra_node("n1"), {0: XID}, recorded_at=(0,))
    snap = snap_of([n1], pair())
    e = explain(snap, "t", "vm", VMIAsk(("a", "b"), ()), live_vmis=VMIs(), now=NOW, grace=timedelta(minutes=2))
    assert e.admitted and e.node == "n1"
    assert e.tainted == (RecordTainted("b", "n1", "gpu-vfio-0", "example.com/xid", "NoSchedule", "xid-79"),)
    assert e.tainted[0].render() == (
        "held device b records gpu-vfio-0 on n1, tainted example.com/xid:NoSchedule by DeviceTaintRule "
        "xid-79: its next placement re-points it within n1 or moves the set")
    clean = snap_of([dra_node("n1")], pair())
    assert explain(clean, "t", "vm", VMIAsk(("a", "b"), ()), live_vmis=VMIs(), now=NOW,
                   grace=timedelta(minutes=2)).tainted == ()


def test_HL1_explain_of_a_kept_vms_next_vmi_on_a_tainted_gpu_is_admitted_re_pointed_not_a_conflict():
    from model.housekeeping import VMIs
    n1 = as_index_builds(dra_node("n1"), {0: XID}, recorded_at=(0,))
    snap = snap_of([n1, dra_node("n2")], kept_pair())
    e = explain(snap, "t", "vm1", VMIAsk(("a", "b"), ()), live_vmis=VMIs(), now=NOW,
                grace=timedelta(minutes=2))
    assert (e.admitted, e.node, e.moves, e.reason) == (True, "n1", (), None)
    assert [t.device for t in e.tainted] == ["b"]


# --- a kept set whose GPU a foreign claim took (H4, W4, DR5) -----------------------------------

def test_W4_a_kept_set_whose_gpu_a_foreign_claim_now_allocates_is_decided_again_and_re_pointed():
    # vm1's pair {0,3} kept on n1; while it was stopped kube-scheduler gave GPU 0 to a claim
    # the binder did not make. W4 must not admit the set as it is (its claim could never be
    # allocated); the binder re-points it on n1, off GPU 0.
    n1 = dra_node("n1", taken=(0,))
    n1 = replace(n1, foreign_claimed=frozenset({"gpu-vfio-0"}))
    snap = snap_of([n1], kept_pair())
    assert foreign_claimed_records(snap, [snap.device("t", n) for n in "ab"]) == (("b", "gpu-vfio-0"),)
    assert already_admitted(snap, PLAN, NOW) is None
    d = decide(snap, Request("r1", "t", "vm1", ("a", "b")))
    assert (d.result, d.node, d.placements[0].moves) == (Result.SUCCEEDED, "n1", ())
    assert "gpu-vfio-0" not in records(d).values()


def test_W4_the_sets_own_claim_on_its_record_keeps_the_short_cut():
    # GPU 0 taken by the set's own claim (in taken_devices, not foreign_claimed): admitted as it is
    n1 = replace(dra_node("n1"), taken_devices=frozenset({"gpu-vfio-0", "gpu-vfio-3"}))
    snap = snap_of([n1], kept_pair())
    assert foreign_claimed_records(snap, [snap.device("t", n) for n in "ab"]) == ()
    assert already_admitted(snap, PLAN, NOW) == "n1"


def test_W4_explain_of_a_kept_vms_next_vmi_whose_gpu_a_foreign_claim_took_is_admitted_on_its_node():
    from model.housekeeping import VMIs
    n1 = replace(dra_node("n1", taken=(0,)), foreign_claimed=frozenset({"gpu-vfio-0"}))
    e = explain(snap_of([n1, dra_node("n2")], kept_pair()), "t", "vm1", VMIAsk(("a", "b"), ()),
                live_vmis=VMIs(), now=NOW, grace=timedelta(minutes=2))
    assert (e.admitted, e.node, e.moves, e.reason) == (True, "n1", (), None)
