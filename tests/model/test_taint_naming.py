"""HL1 in the pure model (DR2): which tainted devices a node's room refusal names
(`model.device.choice.tainted_devices`): only those a taint alone keeps from the set (not
another set's record, another request's hold or an administrator's claim), grouped by the
rule and taint that put them there; and a node without a tainted device costs nothing more
than two lengths compared (its reasons come back as the very list)."""

from __future__ import annotations

from dataclasses import replace

from model.decide import Request, decide
from model.device.choice import tainted_devices
from model.device.dra import DeviceTaint
from model.device.taint_rules import TaintRule
from model.hold import Hold
from model.reasons import NoDeviceGroup, NoRoom, TaintedDevices
from model.snapshot import Snapshot
from model.types import GPUDevice, Result
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node, recorded, ref

XID = TaintRule("xid", DeviceTaint("example.com/xid", "79", "NoSchedule")).taint
SLICE = DeviceTaint("gpu.nvidia.com/xid", "48", "NoExecute")


def as_index_builds(node, taints: dict[int, DeviceTaint], recorded_at: tuple[int, ...] = ()):
    """`node` with `taints` on its GPUs as the DRA index builds it: the tainted devices are
    taken, and counted as foreign unless a record names them."""
    names = {f"gpu-vfio-{i}": t for i, t in taints.items()}
    n = replace(node, class_devices=tuple(
        (c, tuple(replace(d, taints=(names[d.ref.device],)) if d.ref.device in names else d for d in devs))
        for c, devs in node.class_devices))
    taken = n.taken_devices | set(names)
    foreign = len(taken - {f"gpu-vfio-{i}" for i in recorded_at})
    return replace(n, taken_devices=frozenset(taken), foreign=((RES, foreign),))


def test_the_rule_a_taint_came_from_is_carried_but_is_no_part_of_the_taint():
    assert XID.rule == "xid" and XID == DeviceTaint("example.com/xid", "79", "NoSchedule")
    assert hash(XID) == hash(DeviceTaint("example.com/xid", "79", "NoSchedule"))
    assert TaintRule("xid", XID) == TaintRule("xid", DeviceTaint("example.com/xid", "79", "NoSchedule"))


def test_only_devices_a_taint_alone_keeps_from_the_set_are_named():
    node = replace(dra_node("n1", taken=(5,)), foreign_claimed=frozenset({"gpu-vfio-5"}))
    node = as_index_builds(node, {1: XID, 2: XID, 3: XID, 4: SLICE, 5: XID}, recorded_at=(2, 3))
    other = recorded("u", "x", "n1", 2)          # another tenant's record: used anyway
    mine = recorded("t", "b", "n1", 3)           # the set's own: named, with the member
    hold = Hold("r-other", "u", "n1", devices=((("u", "y"), ref("n1", 1)),))  # another's hold
    snap = Snapshot.build(nodes=[node], classes=[device_class()], devices=[other, mine],
                          reservations=[hold])
    found = tainted_devices(snap, snap.nodes["n1"], CLASS, "r1", frozenset({("t", "b")}), [mine])
    assert found == (TaintedDevices(("gpu-vfio-4",), "gpu.nvidia.com/xid", "NoExecute", ""),
                     TaintedDevices(("gpu-vfio-3",), "example.com/xid", "NoSchedule", "xid",
                                    (("b", "gpu-vfio-3"),)))
    assert [t.rule for t in found] == ["", "xid"]  # GPU 5's claim and 1's hold, 2's record: not named
    # no taint on the class's devices: nothing, at once
    clean = Snapshot.build(nodes=[dra_node("n1")], classes=[device_class()])
    assert tainted_devices(clean, clean.nodes["n1"], CLASS, "r1", frozenset(), []) == ()


def test_a_refusal_on_an_untainted_fleet_is_the_very_list_it_was():
    from model.decide import _Set  # the set's per-node reasons, as decide asks them
    snap = Snapshot.build(nodes=[dra_node("n1", taken=tuple(range(7)))], classes=[device_class()],
                          devices=[GPUDevice("t", "a", CLASS), GPUDevice("t", "b", CLASS)])
    s = _Set(snap, Request("r1", "t", "vm", ("a", "b")), [snap.device("t", "a"), snap.device("t", "b")], [CLASS])
    out = [NoRoom(RES, 2, 1, 7)]
    assert s.dev._name_taints("n1", out) is out


def test_a_tainted_node_names_the_taint_in_its_room_refusal_and_not_as_pods():
    node = as_index_builds(dra_node("n1", taken=(0, 1, 2, 3, 4, 5)), {6: XID, 7: XID})
    snap = Snapshot.build(nodes=[node], classes=[device_class()],
                          devices=[GPUDevice("t", "a", CLASS), GPUDevice("t", "b", CLASS)])
    d = decide(snap, Request("r1", "t", "vm", ("a", "b")))
    assert d.result is Result.REFUSED
    ((room,),) = [p.problems for p in d.reason.reasons[0].nodes]
    assert (room.free, room.foreign) == (0, 6)
    assert room.tainted == (TaintedDevices(("gpu-vfio-6", "gpu-vfio-7"), "example.com/xid", "NoSchedule", "xid"),)
    # an idle held pair whose GPU 7 is tainted: no group left, the held device named
    node = as_index_builds(dra_node("n1", taken=(0, 1, 2, 3, 4, 5)), {7: XID}, recorded_at=(6, 7))
    snap = Snapshot.build(nodes=[node], classes=[device_class()],
                          devices=[recorded("t", "a", "n1", 6), recorded("t", "b", "n1", 7)])
    d = decide(snap, Request("r1", "t", "vm", ("a", "b")))
    ((group,),) = [p.problems for p in d.reason.reasons[0].nodes]
    assert isinstance(group, NoDeviceGroup)
    assert group.tainted == (TaintedDevices(("gpu-vfio-7",), "example.com/xid", "NoSchedule", "xid",
                                            (("b", "gpu-vfio-7"),)),)
