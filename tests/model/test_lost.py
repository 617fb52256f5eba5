"""HL3, nothing lost silently (docs/device-mode.md, "Nothing lost silently"; `model.lost`,
`model.device.lost`): every device of a device-mode class in one state, totals that add up on random fleets, a lost device
never free, and a record on a lost device kept (no decision, defragmentation round or
housekeeping plan deletes or re-points it because its device vanished)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from model.decide import Request, Rule, decide
from model.defrag import plan_round
from model.device.dra import DeviceRef, SliceDevice
from model.device.lost import LossReason, LostDevice, record_loss
from model.device.match import MatchAttribute
from model.hold import Hold
from model.housekeeping import VMIs, plan
from model.lost import State, classify, lost_devices, lost_members, walk
from model.snapshot import Snapshot
from model.types import Attachment, DeviceStatus, GPUClass, GPUDevice, Node, Phase, Result
from tests.support.dra_worlds import (CLASS, PARTITION_ATTRIBUTE, RES, device_class, dra_node,
                                      recorded, ref, slice_devices, tainted)

NOW = datetime(2026, 12, 6, 10, tzinfo=timezone.utc)
PCIE = "resource.kubernetes.io/pcieRoot"


def bare(node: Node, *indices: int) -> Node:
    """`node` with its GPUs `indices` republished without gpuModuleID and partitionN
    (dra-driver-nvidia-gpu#1331)."""
    names = {f"gpu-vfio-{i}" for i in indices}

    def strip(d: SliceDevice) -> SliceDevice:
        if d.ref.device not in names:
            return d
        return replace(d, attributes=tuple((k, v) for k, v in d.attributes
                                           if "partition" not in k and "gpuModuleID" not in k))
    return replace(node, class_devices=tuple((c, tuple(strip(d) for d in devs))
                                             for c, devs in node.class_devices))


def gone(node: Node, *indices: int) -> Node:
    """`node` whose slice no longer lists its GPUs `indices` (allocatable follows, as the
    DRA index counts it)."""
    names = {f"gpu-vfio-{i}" for i in indices}
    devs = tuple(d for d in slice_devices(node.name) if d.ref.device not in names)
    return replace(node, allocatable=((RES, len(devs)),),
                   class_devices=tuple((c, devs) for c, _ in node.class_devices))


def attached(d: GPUDevice, vmi: str) -> GPUDevice:
    return replace(d, status=replace(d.status, attached_to=Attachment(vmi, NOW)))


# --- the states, by example -----------------------------------------------------------------


def test_HL3_each_state_and_the_sum_on_one_node():
    n1 = tainted(bare(dra_node("n1", taken=(6,)), 3), 5)
    devices = [attached(recorded("t", "run-0", "n1", 0), "vm"),       # used: its VMI lives
               recorded("t", "idle-0", "n1", 1),                      # held
               recorded("t", "lost-0", "n1", 3),                      # lost: attribute-lost
               recorded("t", "gone-0", "n1", 9)]                      # lost: left the slices
    hold = Hold("r1", "t", "n1", devices=((("t", "new"), ref("n1", 7)),))
    snap = Snapshot.build(nodes=[n1], classes=[device_class()], devices=devices,
                          reservations=[hold])
    states = {ident[2]: s for ident, s, _ in walk(snap, {("t", "vm")})}
    assert states == {"gpu-vfio-0": State.USED, "gpu-vfio-1": State.HELD, "gpu-vfio-2": State.FREE,
                      "gpu-vfio-3": State.LOST, "gpu-vfio-4": State.FREE,
                      "gpu-vfio-5": State.TAINTED, "gpu-vfio-6": State.USED,
                      "gpu-vfio-7": State.USED, "gpu-vfio-9": State.LOST}
    (c,) = classify(snap, {("t", "vm")}).classes
    assert (c.published, c.unpublished, c.free, c.used, c.held, c.tainted) == (8, 1, 2, 3, 1, 1)
    assert c.lost_of(LossReason.LEFT_SLICES) == 1 and c.lost_of(LossReason.ATTRIBUTE_LOST) == 1
    assert c.adds_up
    assert c.render() == ("8 published + 1 recorded unpublished = 2 free + 3 used + 1 held + "
                          "2 lost (left-slices 1, attribute-lost 1) + 1 tainted")
    lost = classify(snap, {("t", "vm")}).lost
    assert [(x.device, x.reason, x.records) for x in lost] == [
        ("gpu-vfio-3", LossReason.ATTRIBUTE_LOST, (("t", "lost-0"),)),
        ("gpu-vfio-9", LossReason.LEFT_SLICES, (("t", "gone-0"),))]
    # the run's VMI gone: its device is held (kept or idle), not used
    assert dict((i[2], s) for i, s, _ in walk(snap, set()))["gpu-vfio-0"] is State.HELD


def test_HL3_an_unrecorded_device_without_its_attribute_is_lost_never_free():
    snap = Snapshot.build(nodes=[bare(dra_node("n1"), 2)], classes=[device_class()])
    assert "gpu-vfio-2" not in snap.free_devices("n1", CLASS)
    assert len(snap.free_devices("n1", CLASS)) == 7
    (loss,) = classify(snap).lost
    assert loss.records == () and loss.reason is LossReason.ATTRIBUTE_LOST
    assert loss.render().endswith("no GPUDevice records it, it is not counted free")


def test_HL3_a_class_without_a_constraint_loses_no_device_to_attributes():
    snap = Snapshot.build(nodes=[bare(dra_node("n1"), 2)], classes=[device_class(match_attribute=None)])
    assert len(snap.free_devices("n1", CLASS)) == 8 and classify(snap).lost == ()


def test_HL3_a_device_with_one_partition_size_left_is_not_lost():
    n1 = dra_node("n1")
    keep1 = replace(n1, class_devices=tuple(
        (c, tuple(replace(d, attributes=tuple((k, v) for k, v in d.attributes
                                              if not k.endswith(("partition2", "partition4", "partition8"))))
                  for d in devs)) for c, devs in n1.class_devices))
    assert classify(Snapshot.build(nodes=[keep1], classes=[device_class()])).lost == ()


def test_HL3_unsized_attribute_missing_is_lost():
    match = MatchAttribute(PCIE)
    assert match.carried_by(((PCIE, "pci0000:16"),))
    assert not match.carried_by((("gpu.nvidia.com/uuid", "x"),))
    sized = MatchAttribute(PARTITION_ATTRIBUTE)
    assert sized.carried_by((("gpu.nvidia.com/partition1", 3),))
    assert not sized.carried_by((("gpu.nvidia.com/partition", 3), ("gpu.nvidia.com/partitionx", 1)))


def test_HL3_a_record_on_a_gone_node_is_lost_left_slices():
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[device_class()],
                          devices=[recorded("t", "d0", "n2", 0)])
    assert record_loss(snap.nodes.get("n2"), CLASS, None, ref("n2", 0)) is LossReason.LEFT_SLICES
    (c,) = classify(snap).classes
    assert (c.published, c.unpublished, c.free, c.lost) == (8, 1, 8, 1) and c.adds_up


def test_HL3_render_words():
    left = LostDevice(CLASS, "n1", "gpu-vfio-3", ref("n1", 3), LossReason.LEFT_SLICES,
                      (("t", "d0"),), PARTITION_ATTRIBUTE)
    assert left.render() == (
        "device gpu-vfio-3 of node n1 (class h100x) is lost: no longer published for the class "
        "(its ResourceSlice was deleted or rewritten without it, it no longer matches the "
        "class's selectors, or its node is gone); recorded by t/d0, kept until it returns "
        "(nothing moves) or the set is placed again")
    attr = replace(left, reason=LossReason.ATTRIBUTE_LOST)
    assert attr.render().startswith(
        "device gpu-vfio-3 of node n1 (class h100x) is lost: published without "
        "gpu.nvidia.com/partition{size}, so in no group of the class (a GPU left bound to "
        "vfio-pci across a restart of NVIDIA's DRA plugin is republished so: "
        "dra-driver-nvidia-gpu#1331)")
    assert attr.key == ("n1", "gpu-vfio-3", "attribute-lost")


def test_HL3_lost_members_names_the_sets_lost_devices():
    snap = Snapshot.build(nodes=[bare(gone(dra_node("n1"), 1), 0)], classes=[device_class()],
                          devices=[recorded("t", "a", "n1", 0), recorded("t", "b", "n1", 1),
                                   recorded("t", "c", "n1", 2)])
    members = [snap.device("t", n) for n in ("a", "b", "c")]
    assert [(x.device, x.reason) for x in lost_members(snap, members)] == [
        ("gpu-vfio-0", LossReason.ATTRIBUTE_LOST), ("gpu-vfio-1", LossReason.LEFT_SLICES)]


# --- the record is kept -----------------------------------------------------------------------


def _idle_pair(node: Node) -> Snapshot:
    """Two idle held devices of one set recording partition {0,1} of n1 (gpu-vfio 3 and 0 are
    modules 1 and 2 of `hgx-h100-8`: the first pair), another node empty."""
    devices = [recorded("t", "a", "n1", 3), recorded("t", "b", "n1", 0)]
    return Snapshot.build(nodes=[node, dra_node("n2")], classes=[device_class()], devices=devices)


def test_HL3_the_device_returns_and_nothing_moves():
    back = _idle_pair(dra_node("n1"))
    d = decide(back, Request("r1", "t", "vmi", ("a", "b")))
    assert d.result is Result.SUCCEEDED and d.rule is Rule.B6 and d.node == "n1"


def test_HL3_defragmentation_never_moves_nor_re_points_a_record_on_a_lost_device():
    for lost_node in (gone(dra_node("n1"), 3), bare(dra_node("n1"), 3)):
        snap = _idle_pair(lost_node)
        moves = plan_round(snap, max_moves=8).moves
        assert not any(m.device == ("t", "a") for m in moves), moves


def test_HL3_housekeeping_plans_nothing_for_a_record_because_its_device_vanished():
    for lost_node in (gone(dra_node("n1"), 3), bare(dra_node("n1"), 3)):
        snap = _idle_pair(lost_node)
        actions = plan(list(snap.devices.values()), VMIs.of_keys(set()), NOW,
                       timedelta(minutes=2))
        assert actions == []


def test_HL3_the_sets_next_placement_chooses_again_on_its_node():
    snap = _idle_pair(bare(dra_node("n1"), 3))
    d = decide(snap, Request("r1", "t", "vmi", ("a", "b")))
    assert d.result is Result.SUCCEEDED and d.node == "n1" and d.rule is not Rule.B6
    p = d.placements[0]
    assert p.node == "n1" and ("t", "a") in dict(p.devices) and dict(p.devices)[("t", "a")] != ref("n1", 3)


# --- the totals add up on random fleets -------------------------------------------------------


@st.composite
def fleets(draw):
    """Up to three HGX nodes (one maybe gone: records name it) with random taints, bare
    devices (#1331), devices left out of the slice and foreign claims; GPUDevices recording
    random GPUs (some attached to live or dead VMIs, two now and then recording one); holds
    in flight; one or two classes (pcieRoot-free: partition{size} or none)."""
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        name = f"n{i}"
        n = dra_node(name, taken=tuple(draw(st.sets(st.integers(0, 7), max_size=2))))
        left = draw(st.sets(st.integers(0, 7), max_size=2))
        if left:
            n = replace(gone(n, *left), taken_devices=n.taken_devices)
        if (t := draw(st.sets(st.integers(0, 7), max_size=2))):
            n = tainted(n, *t, effect=draw(st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])))
        if (b := draw(st.sets(st.integers(0, 7), max_size=2))):
            n = bare(n, *b)
        nodes.append(n)
    names = [n.name for n in nodes] + ["gone"]
    classes = [device_class()]
    if draw(st.booleans()):
        classes.append(device_class("free-form", match_attribute=None))
        nodes = [replace(n, class_devices=n.class_devices + (("free-form", n.devices_of(CLASS)),))
                 for n in nodes]
    devices = []
    for k in range(draw(st.integers(0, 10))):
        node = draw(st.sampled_from(names))
        d = recorded(draw(st.sampled_from(["t", "u"])), f"d{k}", node, draw(st.integers(0, 8)),
                     class_name=draw(st.sampled_from([c.name for c in classes])))
        if draw(st.booleans()):
            d = attached(d, draw(st.sampled_from(["live", "dead"])))
        devices.append(d)
    holds = [Hold(f"r{k}", "t", node, devices=((("t", f"h{k}"), ref(node, i)),))
             for k, (node, i) in enumerate(draw(st.lists(st.tuples(st.sampled_from(names[:-1]),
                                                                   st.integers(0, 7)), max_size=2)))]
    return Snapshot.build(nodes=nodes, classes=classes, devices=devices, reservations=holds)


@settings(max_examples=300, deadline=None, print_blob=True)
@given(fleets())
def test_HL3_property_the_totals_add_up_and_free_is_free_devices(snap):
    live = {("t", "live"), ("u", "live")}
    fleet = classify(snap, live)
    states = {ident: s for ident, s, _ in walk(snap, live)}
    for c in fleet.classes:
        assert c.adds_up, c
        published = sum(len(n.devices_of(c.class_name)) for n in snap.nodes.values())
        assert c.published == published
        mine = {i: s for i, s in states.items() if i[0] == c.class_name}
        assert len(mine) == c.published + c.unpublished  # each device in exactly one state
        for node in snap.nodes:
            free = {i[2] for i, s in mine.items() if i[1] == node and s is State.FREE}
            assert free == snap.free_devices(node, c.class_name)  # free is exactly DR2's free
    for loss in fleet.lost:
        assert loss.device not in snap.free_devices(loss.node, loss.class_name)  # never free
        assert states[(loss.class_name, loss.node, loss.device)] is State.LOST
        if loss.reason is LossReason.LEFT_SLICES:
            assert loss.records
    assert lost_devices(snap) == fleet.lost  # the leader's cheap path says the same
    lost = {(x.node, x.device) for x in fleet.lost}
    for count in (1, 2, 4):  # a new set is never placed on a lost device
        new = [GPUDevice("t", f"new-{i}", CLASS) for i in range(count)]
        d = decide(snap.with_devices(new), Request("rn", "t", "vmn", tuple(x.name for x in new)))
        for p in d.placements:
            assert not {(p.node, r.device) for _, r in p.devices} & lost


def test_HL3_count_mode_has_no_device_states():
    snap = Snapshot.build(nodes=[Node("n1", allocatable=(("nvidia.com/H100", 8),))],
                          classes=[GPUClass("h100", "nvidia.com/H100")])
    assert classify(snap).classes == () and list(walk(snap)) == []


def test_HL3_status_of_a_pending_device_is_not_a_record():
    d = GPUDevice("t", "p", CLASS, status=DeviceStatus(Phase.PENDING, None, None,
                                                       device=DeviceRef("x", "y", "z")))
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[device_class()], devices=[d])
    (c,) = classify(snap).classes
    assert (c.unpublished, c.free) == (0, 8)


def test_HL3_defragmentation_would_gain_by_moving_the_lost_record_and_still_does_not():
    """n1's largest set is capped by its free units (4 used by Pods outside the binder, 1 by
    t/a, whose GPU lost its partitions): moving t/a to n2's last free GPU would grow the
    class's largest set from 2 to 4, and an intact record is so moved; a lost one is not."""
    n1 = replace(dra_node("n1"), foreign=((RES, 4),))
    n2 = dra_node("n2", taken=(0, 1, 2, 3, 4, 5, 6))
    intact = Snapshot.build(nodes=[n1, n2], classes=[device_class()],
                            devices=[recorded("t", "a", "n1", 3)])
    assert [m.device for m in plan_round(intact, max_moves=8).moves] == [("t", "a")]
    for lost_n1 in (bare(n1, 3), replace(gone(n1, 3), foreign=((RES, 4),))):
        snap = Snapshot.build(nodes=[lost_n1, n2], classes=[device_class()],
                              devices=[recorded("t", "a", "n1", 3)])
        assert plan_round(snap, max_moves=8).moves == ()


def test_HL3_slice_attributes_of_the_wrong_type_are_left_out_never_fatal():
    from model.device.dra import parse_resource_slice

    raw = {"metadata": {"name": "s"}, "spec": {
        "driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1", "generation": 1},
        "devices": [
            {"name": "a", "attributes": {"partition1": {"int": "1"}, "uuid": {"string": "u"}}},
            {"name": "b", "attributes": {"partition1": {"int": True}, "x": "not a mapping",
                                         "y": {"string": 3}, "z": {"int": [1]}}},
            {"name": "c", "attributes": ["not", "a", "mapping"]},
            {"name": "d"}]}}
    a, b, c, d = parse_resource_slice(raw).devices
    assert (a.attributes, a.malformed) == ((("gpu.nvidia.com/uuid", "u"),), ("partition1",))
    assert (b.attributes, b.malformed) == ((), ("partition1", "x", "y", "z"))
    assert (c.attributes, c.malformed) == ((), ("attributes",))
    assert (d.attributes, d.malformed) == ((), ())
    match = MatchAttribute(PARTITION_ATTRIBUTE)
    assert not any(match.carried_by(x.attributes) for x in (a, b, c, d))
