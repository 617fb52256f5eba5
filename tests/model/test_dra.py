"""ResourceSlices, claim allocations and CEL selectors read into pure values (docs/contract.md §3b:
DR1 capacity from the current pool generation and the class's selectors, DR2 what is used:
allocations and device taints)."""

from __future__ import annotations

import pytest

from model.claim import parse_claim
from model.device.cel import Match, Selector, SelectorError, matches_all
from model.device.dra import DeviceRef, SliceError, parse_resource_slice, pool_devices

DRIVER = "gpu.nvidia.com"
VFIO_CLASS = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vfio'"


def slice_obj(name="node-1-gpus", node="node-1", pool="node-1", generation=1, count=1, devices=None):
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                 "devices": devices if devices is not None else [
                     gpu(0), gpu(1, taints=[{"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"}])]},
    }


def gpu(i, kind="vfio", taints=None):
    return {"name": f"gpu-{i}", "attributes": {
        "type": {"string": kind}, "uuid": {"string": f"GPU-{i:04d}"}, "numa": {"int": i // 4},
        "partition2": {"int": 3 + i // 2},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "driverVersion": {"version": "580.1.0"}}, "taints": taints or []}


def test_DR1_attributes_are_qualified_by_the_driver_and_standard_ones_kept():
    s = parse_resource_slice(slice_obj())
    first = s.devices[0]
    assert first.ref == DeviceRef(DRIVER, "node-1", "gpu-0")
    assert dict(first.attributes) == {
        "gpu.nvidia.com/type": "vfio", "gpu.nvidia.com/uuid": "GPU-0000",
        "gpu.nvidia.com/numa": 0, "gpu.nvidia.com/partition2": 3,
        "gpu.nvidia.com/driverVersion": "580.1.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00"}
    assert first.cel_view()["attributes"]["resource.kubernetes.io"] == {"pcieRoot": "pci0000:00"}
    assert first.as_device().attribute("gpu.nvidia.com/partition2") == 3


def test_DR2_a_NoSchedule_device_taint_makes_the_device_unusable():
    s = parse_resource_slice(slice_obj())
    assert [d.tainted for d in s.devices] == [False, True]
    none = parse_resource_slice(slice_obj(devices=[gpu(0, taints=[{"key": "k", "effect": "None"}])]))
    assert none.devices[0].tainted is False


def test_DR1_only_the_current_pool_generation_counts():
    old = parse_resource_slice(slice_obj(name="old", generation=1, devices=[gpu(0), gpu(1)]))
    new = parse_resource_slice(slice_obj(name="new", generation=2, devices=[gpu(1), gpu(2)]))
    other = parse_resource_slice(slice_obj(name="n2", node="node-2", pool="node-2", devices=[gpu(0)]))
    by_node = pool_devices([old, new, other])
    assert [d.ref.device for d in by_node["node-1"]] == ["gpu-1", "gpu-2"]
    assert [d.ref.device for d in by_node["node-2"]] == ["gpu-0"]
    assert DeviceRef(DRIVER, "node-1", "gpu-0") not in {
        d.ref for devices in by_node.values() for d in devices}, "vanished with generation 1"
    assert set(by_node) == {"node-1", "node-2"}


def test_DR1_a_pool_short_of_its_announced_slices_counts_as_far_as_it_is_published():
    first = parse_resource_slice(slice_obj(name="a", count=2, devices=[gpu(0)]))
    assert [d.ref.device for d in pool_devices([first])["node-1"]] == ["gpu-0"]


def test_slices_that_are_not_node_local_are_skipped():
    shared = slice_obj(node=None)
    shared["spec"].pop("nodeName")
    shared["spec"]["allNodes"] = True
    assert pool_devices([parse_resource_slice(shared)]) == {}


@pytest.mark.parametrize("mutate, message", [
    (lambda o: o["spec"].pop("driver"), "spec.driver is missing"),
    (lambda o: o["spec"]["pool"].pop("name"), "spec.pool.name is missing"),
    (lambda o: o["spec"]["pool"].update(generation=-1), "generation -1"),
    (lambda o: o["spec"]["pool"].update(resourceSliceCount=0), "resourceSliceCount 0"),
    (lambda o: o["spec"]["devices"][0].pop("name"), "a device has no name"),
])
def test_malformed_slices_are_a_clear_error_naming_the_slice(mutate, message):
    obj = slice_obj()
    mutate(obj)
    with pytest.raises(SliceError, match=f"ResourceSlice node-1-gpus: .*{message}"):
        parse_resource_slice(obj)


def test_DR2_a_claims_allocation_lists_its_devices():
    claim = {"metadata": {"name": "vm-a"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu-0", "driver": DRIVER, "pool": "node-1", "device": "gpu-3"},
        {"request": "gpu-1", "driver": DRIVER, "pool": "node-1", "device": "gpu-2"}]}}}}
    assert parse_claim(claim).allocated == (DeviceRef(DRIVER, "node-1", "gpu-3"),
                                            DeviceRef(DRIVER, "node-1", "gpu-2"))
    assert parse_claim({"metadata": {"name": "pending"}}).allocated == ()
    broken = {"metadata": {"name": "x"}, "status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": DRIVER}]}}}}
    assert parse_claim(broken).allocated == ()
    assert parse_claim(broken).problem.startswith("ResourceClaim x: an allocation result lacks")


def test_DR1_cel_selectors_match_like_a_DeviceClass():
    devices = parse_resource_slice(slice_obj(devices=[gpu(0), gpu(1, kind="gpu")])).devices
    vfio = Selector.compile(VFIO_CLASS)
    numa0 = Selector.compile(f"device.attributes['{DRIVER}'].numa == 0")
    assert [vfio.match(d.cel_view()) for d in devices] == [Match(True), Match(False)]
    assert matches_all((vfio, numa0), devices[0].cel_view()) == Match(True)
    assert matches_all((vfio, numa0), devices[1].cel_view()).matched is False


def test_DR1_a_selector_reading_a_missing_attribute_does_not_match_and_says_why():
    verdict = Selector.compile(f"device.attributes['{DRIVER}'].missing == 'x'").match(
        parse_resource_slice(slice_obj()).devices[0].cel_view())
    assert verdict.matched is False and "missing" in (verdict.error or "")
    not_bool = Selector.compile("device.driver").match({"driver": DRIVER, "attributes": {}})
    assert not_bool.matched is False and "not a bool" in (not_bool.error or "")


@pytest.mark.parametrize("expression", ["device.driver ==", "semver('1.0.0') == device.driver"])
def test_DR1_a_selector_that_does_not_compile_is_a_clear_error(expression):
    with pytest.raises(SelectorError, match="does not compile"):
        Selector.compile(expression)
