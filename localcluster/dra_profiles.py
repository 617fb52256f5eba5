"""Hardware profiles for the local cluster's DRA world (DESIGN.md §3b): the DeviceClass and the
ResourceSlices NVIDIA's DRA driver for GPUs would publish for a node, so device mode is tested
against slices of the real shape without GPUs (no driver runs here: nothing is prepared).

Where each name and shape comes from (NVIDIA/k8s-dra-driver-gpu, read 2026-12-04):
- DeviceClass `vfio.gpu.nvidia.com` and its selector:
  `deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-vfio-gpu.yaml`.
- A passthrough GPU's device name `gpu-vfio-<index>` (`VfioDeviceInfo.CanonicalName`) and its
  attributes `type` (`vfio`), `uuid`, `deviceID`, `vendorID`, `numa` (int), `productName`,
  `iommuFDEnabled` (bool), the standard `resource.kubernetes.io/pciBusID` and
  `resource.kubernetes.io/pcieRoot`, capacity `addressableMemory`
  (`cmd/gpu-kubelet-plugin/deviceinfo.go`, `VfioDeviceInfo.GetDevice`), behind the driver's
  `PassthroughSupport` gate.
- `gpuModuleID` and `partition1/2/4/8` (the Fabric Manager partition of that size holding the
  GPU, numbered as Fabric Manager numbers an 8-GPU HGX board's shared-NVSwitch partitions:
  8 → 0, 4 → 1-2, 2 → 3-6, 1 → 7-14, grouped by module id, not PCI order): the driver's
  `FabricManagerPartitioning` gate on its main branch (../shared/NOTES.md; not in the
  snapshot read above, so their exact spelling is to be checked when that gate is released).
The PCI bus ids, module-id order and serials below are made up but shaped as on an HGX H100
board: module ids do not follow PCI order, which is what makes PCI-order picking wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "vfio.gpu.nvidia.com"
DEVICE_CLASS_SELECTOR = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vfio'"
PARTITION_ATTRIBUTE = f"{DRIVER}/partition{{size}}"
"""The `spec.topology.matchAttribute` an HGX class uses (DR3)."""

_FM_FIRST_ID = {8: 0, 4: 1, 2: 3, 1: 7}


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU of a profile: PCI `bus` id, NUMA node, PCIe root, and the module id (HGX only)."""

    bus: str
    numa: int
    pcie_root: str
    module_id: int | None = None


@dataclass(frozen=True, slots=True)
class Profile:
    """A named node hardware profile: its product name, device id, memory, and GPUs in PCI
    order (the driver's index order)."""

    name: str
    product: str
    device_id: str
    memory: str
    gpus: tuple[GPU, ...]


HGX_H100_8 = Profile(
    name="hgx-h100-8", product="NVIDIA H100 80GB HBM3", device_id="0x2330", memory="80Gi",
    gpus=tuple(GPU(bus, numa, root, module) for bus, numa, root, module in [
        ("0000:18:00.0", 0, "pci0000:15", 2), ("0000:2a:00.0", 0, "pci0000:27", 4),
        ("0000:3a:00.0", 0, "pci0000:37", 3), ("0000:5d:00.0", 0, "pci0000:5a", 1),
        ("0000:9a:00.0", 1, "pci0000:97", 7), ("0000:ab:00.0", 1, "pci0000:a8", 5),
        ("0000:ba:00.0", 1, "pci0000:b7", 8), ("0000:db:00.0", 1, "pci0000:d8", 6)]))
"""An 8-GPU HGX H100 board in shared-NVSwitch mode (Fabric Manager partitions by module id)."""

L40S_4 = Profile(
    name="l40s-4", product="NVIDIA L40S", device_id="0x26b9", memory="48Gi",
    gpus=(GPU("0000:17:00.0", 0, "pci0000:16"), GPU("0000:31:00.0", 0, "pci0000:16"),
          GPU("0000:b1:00.0", 1, "pci0000:b0"), GPU("0000:ca:00.0", 1, "pci0000:b0")))
"""Four PCIe L40S cards, two per PCIe root, one root per NUMA node; no NVLink partitions."""

PROFILES = {p.name: p for p in (HGX_H100_8, L40S_4)}


def partition_ids(module_id: int) -> dict[int, int]:
    """The Fabric Manager partition of each size (1, 2, 4, 8) holding the GPU with 1-based
    `module_id` on an 8-GPU board. Raises ValueError outside 1..8."""
    if not 1 <= module_id <= 8:
        raise ValueError(f"an 8-GPU board has module ids 1-8, got {module_id}")
    return {size: _FM_FIRST_ID[size] + (module_id - 1) // size for size in (1, 2, 4, 8)}


def device_class() -> dict[str, Any]:
    """The DeviceClass NVIDIA's chart installs for passthrough GPUs."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": DEVICE_CLASS_SELECTOR}}]}}


def gpu_uuid(node: str, index: int) -> str:
    """A stable, fleet-unique GPU uuid for `node`'s GPU `index` (the `uuid` a claim pins)."""
    digest = sum((i + 1) * ord(c) for i, c in enumerate(node)) & 0xFFFFFFFF
    return f"GPU-{digest:08x}-{len(node):04x}-{index:04x}-0000-{index:012x}"


def resource_slice(node: str, profile: Profile, generation: int = 1) -> dict[str, Any]:
    """The one ResourceSlice of `node`'s pool (named after the node, as the driver names it)
    for `profile`, at pool `generation`."""
    devices = []
    for index, g in enumerate(profile.gpus):
        attributes: dict[str, dict[str, Any]] = {
            "type": {"string": "vfio"},
            "uuid": {"string": gpu_uuid(node, index)},
            "deviceID": {"string": profile.device_id},
            "vendorID": {"string": "0x10de"},
            "numa": {"int": g.numa},
            "productName": {"string": profile.product},
            "iommuFDEnabled": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": g.bus},
            "resource.kubernetes.io/pcieRoot": {"string": g.pcie_root},
        }
        if g.module_id is not None:
            attributes["gpuModuleID"] = {"int": g.module_id}
            for size, pid in partition_ids(g.module_id).items():
                attributes[f"partition{size}"] = {"int": pid}
        devices.append({"name": f"gpu-vfio-{index}", "attributes": attributes,
                        "capacity": {"addressableMemory": {"value": profile.memory}}})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}}
