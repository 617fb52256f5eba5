"""Hardware profiles for the local cluster's DRA world (docs/contract.md §3b): the DeviceClass and the
ResourceSlices NVIDIA's DRA driver for GPUs would publish for a node, so device mode is tested
against slices of the real shape without GPUs (no driver runs here: nothing is prepared).

Where each name and shape comes from. The driver moved from NVIDIA/k8s-dra-driver-gpu to
kubernetes-sigs/dra-driver-nvidia-gpu (module `sigs.k8s.io/dra-driver-nvidia-gpu`); read at
its main branch, commit 95932046683719c43b6a0dd9613c2e5aad5d6703 (2026-08-07), unless a tag is
named. Paths are in that repository.
- Driver `gpu.nvidia.com`, one pool per node named after the node (the kubelet plugin
  helper; `site/content/docs/guides/gpu-allocation/kubevirt-vfio-gpu-passthrough.md` shows
  POOL = node name). Our slice name `<node>-gpu.nvidia.com` is fixed; the helper generates one.
- DeviceClass `vfio.gpu.nvidia.com` and its CEL selector `device.driver == 'gpu.nvidia.com' &&
  device.attributes['gpu.nvidia.com'].type == 'vfio'`, verbatim:
  `deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-vfio-gpu.yaml` (the same at
  tag v0.4.0 of NVIDIA/k8s-dra-driver-gpu, 6910a2be).
- A passthrough GPU (`VfioDeviceInfo.GetDevice`, `cmd/gpu-kubelet-plugin/deviceinfo.go`;
  values from `getVfioDeviceInfo`, `cmd/gpu-kubelet-plugin/nvlib.go`), behind the driver's
  `PassthroughSupport` gate (`pkg/featuregates/featuregates.go`, alpha since v0.3):
  device name `gpu-vfio-<index>` (`CanonicalName`); attributes `type` = `vfio`;
  `uuid` = a version-5 UUID of the PCI address (`uuid.NewSHA1(uuid.NameSpaceDNS, address)`),
  so it is unique per node but NOT across nodes: every board of the same layout repeats it (a
  claim pinned by `uuid` needs the node pin too; `vfio_uuid`); `deviceID` and `vendorID`
  as `0x%04x`; `productName` = the PCI ids database's name of the device id (go-nvlib's
  `nvpci` `DeviceName`: `GH100 [H100 SXM5 80GB]`, `AD102GL [L40S]`, not NVML's name);
  `iommuFDEnabled` (bool); the standard `resource.kubernetes.io/pciBusID` (extended BDF,
  `0000:18:00.0`) and `resource.kubernetes.io/pcieRoot` (`pci<domain>:<bus>`), named by
  `k8s.io/dynamic-resource-allocation/deviceattribute` (`attribute.go`:
  `StandardDeviceAttributePCIBusID`, `StandardDeviceAttributePCIeRoot`); capacity
  `addressableMemory` (the 64-bit BARs' total; our figures are illustrative).
- NUMA: the driver's `addNumaNodeAttribute` publishes `resource.kubernetes.io/numaNode`
  (`standardNumaNodeAttribute`, KEP-6072; int, or a one-element int list under the driver's
  `DRAListTypeAttributes` gate), since commit 3b59d66e "Align NUMA attribute with KEP-6072".
  Released v0.4.x (tag v0.4.1, 764900e7) still published the driver-domain `numa` (int)
  instead; we follow main, where the partition attributes are (NUMA_ATTRIBUTE).
- `gpuModuleID` (int, 1-based, from NVML; taken from the parent GPU for a vfio device) and
  `partition1`/`partition2`/`partition4`/`partition8` (int: the id of the Fabric Manager
  partition of that size holding the GPU, as Fabric Manager reports it; int attributes):
  `GpuInfo.addFabricManagerAttributes` (`cmd/gpu-kubelet-plugin/deviceinfo.go`) and
  `Manager.GetPartitionsBySizeByModuleID` (`pkg/fabricmanager/manager.go`), behind the alpha
  `FabricManagerPartitioning` gate (v0.5, main only, commit 62ee668a "Support FabricManager GPU
  partitions for VFIO devices"). The ids are whatever Fabric Manager reports (the driver's own
  test set, `designDocPartitions` in `pkg/fabricmanager/manager_test.go` at commit 3be1f670,
  numbers them otherwise); ours number an 8-GPU HGX board's shared-NVSwitch partitions as
  the HGX H100 defaults of NVIDIA's Fabric Manager user guide
  (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/, shared NVSwitch
  virtualization model): 8 → 0, 4 → 1-2, 2 → 3-6, 1 → 7-14, grouped by module id, not PCI
  order; only equality matters to `matchAttribute`. A GPU already bound to vfio-pci when the
  plugin starts has no module id and so no partition attributes
  (`attachFabricManagerPartitions`, `cmd/gpu-kubelet-plugin/device_state.go`). The driver's
  own example constraint is `matchAttribute: gpu.nvidia.com/partition2`
  (`demo/specs/fabric-manager-partitioning/resourceClaimTemplates.yaml`).
The PCI bus ids and the module-id order below are made up but shaped as on an HGX H100 board:
module ids do not follow PCI order, which is what makes PCI-order picking wrong.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Mapping

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "vfio.gpu.nvidia.com"
DEVICE_CLASS_SELECTOR = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vfio'"
PARTITION_ATTRIBUTE = f"{DRIVER}/partition{{size}}"
"""The `spec.topology.matchAttribute` an HGX class uses (DR3)."""
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
"""The standard attribute a PCIe-card class may match instead (DR3)."""
NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
"""The NUMA node, as the driver's main branch names it (KEP-6072; v0.4.x: `gpu.nvidia.com/numa`)."""

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
    """`productName` of a passthrough GPU: the PCI ids database's name of `device_id`."""
    device_id: str
    memory: str
    gpus: tuple[GPU, ...]


HGX_H100_8 = Profile(
    name="hgx-h100-8", product="GH100 [H100 SXM5 80GB]", device_id="0x2330", memory="80Gi",
    gpus=tuple(GPU(bus, numa, root, module) for bus, numa, root, module in [
        ("0000:18:00.0", 0, "pci0000:15", 2), ("0000:2a:00.0", 0, "pci0000:27", 4),
        ("0000:3a:00.0", 0, "pci0000:37", 3), ("0000:5d:00.0", 0, "pci0000:5a", 1),
        ("0000:9a:00.0", 1, "pci0000:97", 7), ("0000:ab:00.0", 1, "pci0000:a8", 5),
        ("0000:ba:00.0", 1, "pci0000:b7", 8), ("0000:db:00.0", 1, "pci0000:d8", 6)]))
"""An 8-GPU HGX H100 board in shared-NVSwitch mode (Fabric Manager partitions by module id)."""

L40S_4 = Profile(
    name="l40s-4", product="AD102GL [L40S]", device_id="0x26b9", memory="48Gi",
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


def vfio_uuid(pci_bus_id: str) -> str:
    """The `uuid` the driver publishes for a passthrough GPU at `pci_bus_id`: a version-5 UUID
    of the address in the DNS namespace (Go's `uuid.NewSHA1(uuid.NameSpaceDNS, address)`).
    The same address on another node gives the same uuid."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, pci_bus_id))


def module_index(profile: Profile, module_id: int) -> int:
    """The index (PCI order, the `gpu-vfio-<index>` name) of the GPU with `module_id`.
    Raises ValueError when the profile has no such module."""
    for index, g in enumerate(profile.gpus):
        if g.module_id == module_id:
            return index
    raise ValueError(f"{profile.name} has no GPU module {module_id}")


def gpu_uuid(profile: Profile, index: int) -> str:
    """The `uuid` of GPU `index` (PCI order) of a node of `profile` (equal on every such node)."""
    return vfio_uuid(profile.gpus[index].bus)


def resource_slice(node: str, profile: Profile, generation: int = 1,
                   taints: Mapping[int, list[dict[str, str]]] | None = None) -> dict[str, Any]:
    """The one ResourceSlice of `node`'s pool (named after the node, as the driver names it)
    for `profile`, at pool `generation`; `taints` maps a GPU's index (PCI order) to its device
    taints (`{key, value, effect}`, resource.k8s.io/v1 `Device.taints`, as an admin's or a
    health check's would be; DR2)."""
    devices = []
    for index, g in enumerate(profile.gpus):
        attributes: dict[str, dict[str, Any]] = {
            "type": {"string": "vfio"},
            "uuid": {"string": vfio_uuid(g.bus)},
            "deviceID": {"string": profile.device_id},
            "vendorID": {"string": "0x10de"},
            "productName": {"string": profile.product},
            "iommuFDEnabled": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": g.bus},
            PCIE_ROOT_ATTRIBUTE: {"string": g.pcie_root},
            NUMA_ATTRIBUTE: {"int": g.numa},
        }
        if g.module_id is not None:
            attributes["gpuModuleID"] = {"int": g.module_id}
            for size, pid in partition_ids(g.module_id).items():
                attributes[f"partition{size}"] = {"int": pid}
        device = {"name": f"gpu-vfio-{index}", "attributes": attributes,
                  "capacity": {"addressableMemory": {"value": profile.memory}}}
        if taints and taints.get(index):
            device["taints"] = [dict(t) for t in taints[index]]
        devices.append(device)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}}
