"""The local cluster's DRA hardware profiles (docs/contract.md §3b): their slices parse as the binder
reads them, NVIDIA's DeviceClass selector matches every GPU, and the Fabric Manager partitions
follow module ids, not PCI order (so picking the lowest PCI indices, as a device plugin does,
breaks a partition while DR3/DR4's choice does not)."""

from __future__ import annotations

import pytest

import uuid

from localcluster.dra_profiles import (DEVICE_CLASS_SELECTOR, HGX_H100_8, L40S_4, NUMA_ATTRIBUTE,
                                       PARTITION_ATTRIBUTE, device_class, gpu_uuid, partition_ids,
                                       resource_slice, vfio_uuid)
from model.device.cel import Selector
from model.device.dra import parse_resource_slice, pool_devices
from model.device.match import MatchAttribute
from model.device.topology import GroupChoice, choose_devices


def test_partition_ids_follow_fabric_manager_numbering():
    assert [partition_ids(m) for m in (1, 2, 5, 8)] == [
        {1: 7, 2: 3, 4: 1, 8: 0}, {1: 8, 2: 3, 4: 1, 8: 0},
        {1: 11, 2: 5, 4: 2, 8: 0}, {1: 14, 2: 6, 4: 2, 8: 0}]
    with pytest.raises(ValueError, match="module ids 1-8"):
        partition_ids(9)


def test_DR1_hgx_slice_parses_and_every_gpu_matches_nvidias_device_class():
    devices = pool_devices([parse_resource_slice(resource_slice("gpu-node-01", HGX_H100_8))])["gpu-node-01"]
    assert [d.ref.device for d in devices] == [f"gpu-vfio-{i}" for i in range(8)]
    selector = Selector.compile(DEVICE_CLASS_SELECTOR)
    assert all(selector.match(d.cel_view()).matched for d in devices)
    assert device_class()["spec"]["selectors"][0]["cel"]["expression"] == DEVICE_CLASS_SELECTOR
    uuids = [dict(d.attributes)["gpu.nvidia.com/uuid"] for d in devices]
    assert len(set(uuids)) == 8 and uuids[0] == gpu_uuid(HGX_H100_8, 0)


def test_DR5_a_passthrough_uuid_is_the_drivers_v5_uuid_of_the_pci_address_so_nodes_repeat_it():
    # the driver: uuid.NewSHA1(uuid.NameSpaceDNS, address): unique per node, not per fleet
    assert vfio_uuid("0000:18:00.0") == str(uuid.uuid5(uuid.NAMESPACE_DNS, "0000:18:00.0"))
    assert uuid.UUID(vfio_uuid("0000:18:00.0")).version == 5
    one, two = (parse_resource_slice(resource_slice(n, HGX_H100_8)) for n in ("n1", "n2"))
    assert ([dict(d.attributes)["gpu.nvidia.com/uuid"] for d in one.devices]
            == [dict(d.attributes)["gpu.nvidia.com/uuid"] for d in two.devices])


def test_attribute_names_and_shapes_are_the_drivers():
    (device, *_) = resource_slice("n", HGX_H100_8)["spec"]["devices"]
    assert {k: next(iter(v)) for k, v in device["attributes"].items()} == {
        "type": "string", "uuid": "string", "deviceID": "string", "vendorID": "string",
        "productName": "string", "iommuFDEnabled": "bool",
        "resource.kubernetes.io/pciBusID": "string", "resource.kubernetes.io/pcieRoot": "string",
        NUMA_ATTRIBUTE: "int", "gpuModuleID": "int", "partition1": "int", "partition2": "int",
        "partition4": "int", "partition8": "int"}
    assert device["attributes"]["productName"] == {"string": "GH100 [H100 SXM5 80GB]"}
    assert device["attributes"]["deviceID"] == {"string": "0x2330"}
    assert list(device["capacity"]) == ["addressableMemory"]


def test_DR3_pci_order_breaks_a_partition_and_the_topology_choice_does_not():
    devices = [d.as_device() for d in pool_devices(
        [parse_resource_slice(resource_slice("n", HGX_H100_8))])["n"]]
    lowest_two = devices[:2]
    assert len({d.attribute("gpu.nvidia.com/partition2") for d in lowest_two}) == 2
    choice = choose_devices(devices, [d.name for d in devices], 2, MatchAttribute(PARTITION_ATTRIBUTE))
    assert isinstance(choice, GroupChoice)
    modules = sorted(next(d for d in devices if d.name == n).attribute("gpu.nvidia.com/gpuModuleID")
                     for n in choice.devices)
    assert modules == [1, 2] and choice.devices == ("gpu-vfio-0", "gpu-vfio-3")


def test_l40s_has_no_partitions_and_two_pcie_roots():
    s = parse_resource_slice(resource_slice("pcie-01", L40S_4))
    roots = {dict(d.attributes)["resource.kubernetes.io/pcieRoot"] for d in s.devices}
    assert roots == {"pci0000:16", "pci0000:b0"}
    assert not any(k.startswith("gpu.nvidia.com/partition") for d in s.devices for k, _ in d.attributes)
