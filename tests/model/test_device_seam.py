"""The device-mode seam (DR1-DR4, `model.device`): the factory picks count mode's null object
unless some class is of device mode, the null object answers as count mode does, the
matchAttribute is one value, and a node's devices keep their layouts with them (a `Board`),
not in a module-level cache (the DRA index's sharing: tests/k8s/test_dra_index.py)."""

from __future__ import annotations

import pytest

from model.device.choice import NO_DEVICES
from model.device.dra import DeviceRef, DeviceSet, SliceDevice
from model.device.match import MatchAttribute
from model.device.seam import COUNT_MODE, DeviceMode, mode_of
from model.device.topology import Device
from model.snapshot import Snapshot
from model.types import GPUClass, GPUDevice, Node, dra_resource_name

HGX = GPUClass("hgx", dra_resource_name("gpu.nvidia.com"), device_class_name="gpu.nvidia.com",
               match_attribute="gpu.nvidia.com/partition{size}")
COUNT = GPUClass("a100", "nvidia.com/A100")


def test_the_factory_gives_count_modes_null_object_without_a_device_mode_class():
    assert mode_of([COUNT]) is COUNT_MODE
    mode = mode_of([COUNT, HGX])
    assert isinstance(mode, DeviceMode) and mode.device_classes == {"hgx"}
    assert mode.matches == {"hgx": MatchAttribute("gpu.nvidia.com/partition{size}")}
    assert Snapshot.build(classes=[COUNT]).mode is COUNT_MODE


def test_the_null_object_answers_as_count_mode():
    snap = Snapshot.build(nodes=[Node("n1", allocatable=(("nvidia.com/A100", 2),))], classes=[COUNT])
    members = [GPUDevice("t", "a", "a100")]
    assert snap.mode.for_set(snap, "r1", members, ["a100"]) is NO_DEVICES
    assert NO_DEVICES.records_hold("n1") and NO_DEVICES.assign("n1") == () and NO_DEVICES.fit("n1") == ()
    assert NO_DEVICES.elsewhere(lambda limit: [(0, "n1")], 1) == [(0, "n1")]
    assert NO_DEVICES.problems("n1", [], False) == []
    assert snap.mode.movable(members[0]) and snap.mode.serves(snap.nodes["n1"], "a100")
    assert not snap.mode.size_nowhere(snap, {"a100": 3}) and list(snap.mode.defrag_steps()) == []
    # a count-mode set in a world with device-mode classes has no device questions either
    mixed = mode_of([COUNT, HGX])
    assert mixed.for_set(snap, "r1", members, ["a100"]) is NO_DEVICES


def test_a_match_attribute_is_sized_or_not_resolves_and_names_its_groups():
    sized = MatchAttribute.of("gpu.nvidia.com/partition{size}")
    assert sized is not None and sized.sized and sized.resolve(4) == "gpu.nvidia.com/partition4"
    assert sized.noun == "partition" and sized.module_attribute == "gpu.nvidia.com/gpuModuleID"
    devices = [Device.of("g0", {"gpu.nvidia.com/partition1": 0, "gpu.nvidia.com/partition8": 0})]
    assert sized.sizes_present(devices) == (1, 8)
    root = MatchAttribute("resource.kubernetes.io/pcieRoot")
    assert not root.sized and root.resolve(3) == str(root) and root.sizes_present(devices) == ()
    assert root.noun == "pcieRoot" and MatchAttribute.of(None) is None
    assert MatchAttribute.of(root) is root
    with pytest.raises(ValueError):
        sized.resolve(0)


def test_a_node_made_from_a_plain_tuple_keeps_a_device_set_with_its_board():
    devices = (SliceDevice(DeviceRef("d", "p", "g0"), "n", (("d/partition1", 0),)),)
    node = Node("n", class_devices=(("hgx", devices),))
    got = node.devices_of("hgx")
    assert isinstance(got, DeviceSet) and got == devices and node == Node("n", class_devices=(("hgx", devices),))
    assert got.board.names == {"g0"} and got.by_name("g0") is devices[0]
    assert Node("n").devices_of("hgx") == ()
