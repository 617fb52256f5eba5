"""The device-mode world (docs/contract.md §3b) on a local control plane: an HGX fleet of KWOK nodes,
each publishing one pool of `localcluster.dra_profiles` slices as NVIDIA's DRA driver would
(driver `gpu.nvidia.com`, DeviceClass `vfio.gpu.nvidia.com`), optionally some PCIe L40S nodes,
and the device-mode GPUClasses over them (DR1, DR3). Used by `gpu-binder cluster up --dra`,
`gpu-binder demo --dra` and the device-mode e2e tests, so they all build the same world.

The DeviceClass and kube-controller-manager's resourceclaim-controller are the cluster's
(`LocalCluster(dra=True)`); this module only adds nodes, slices and classes through the API as
an admin would. No DRA driver runs: nothing is prepared, there are no GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from localcluster.dra_profiles import (DEVICE_CLASS, DRIVER, HGX_H100_8, L40S_4, PARTITION_ATTRIBUTE,
                                       PCIE_ROOT_ATTRIBUTE, Profile, resource_slice)
from localcluster.fleet import Fleet
from model.types import dra_resource_name

DEVICE_BUDGET_KEY = dra_resource_name(DEVICE_CLASS)
"""The ResourceQuota key of a device-mode class over `vfio.gpu.nvidia.com` (DR1: Kubernetes'
own DRA quota key, `<dc>.deviceclass.resource.k8s.io/devices`): one budget per DeviceClass,
shared by every GPUClass over it."""


@dataclass(frozen=True, slots=True)
class DeviceModeClass:
    """A device-mode GPUClass of the world: its `name`, the profile whose GPUs it takes (by
    `productName`, its own CEL selector) and its `spec.topology.matchAttribute`."""

    name: str
    profile: Profile
    match_attribute: str

    @property
    def selector(self) -> str:
        """The class's own CEL selector: the profile's `productName`."""
        return f"device.attributes['{DRIVER}'].productName == '{self.profile.product}'"

    def spec(self) -> dict:
        """The GPUClass `spec` (DR1: `deviceClassName`, `selectors`, `topology.matchAttribute`)."""
        return {"deviceClassName": DEVICE_CLASS, "selectors": [{"cel": {"expression": self.selector}}],
                "topology": {"matchAttribute": self.match_attribute}}


HGX_CLASS = DeviceModeClass("hgx-h100", HGX_H100_8, PARTITION_ATTRIBUTE)
"""Whole Fabric Manager partitions of an HGX H100 board: sets of 1, 2, 4 or 8 (DR3)."""
L40S_CLASS = DeviceModeClass("l40s", L40S_4, PCIE_ROOT_ATTRIBUTE)
"""PCIe L40S cards sharing one PCIe root: sets of 1 or 2 on the l40s-4 profile (DR3)."""
CLASSES = (HGX_CLASS, L40S_CLASS)


def node_names(hgx: int, l40s: int = 0) -> list[tuple[str, Profile]]:
    """(node name, profile) of a fleet of `hgx` HGX nodes `hgx-node-NN` and `l40s` PCIe nodes
    `l40s-node-NN`."""
    return ([(f"hgx-node-{i:02d}", HGX_H100_8) for i in range(hgx)]
            + [(f"l40s-node-{i:02d}", L40S_4) for i in range(l40s)])


async def dra_node(fleet: Fleet, name: str, profile: Profile, *,
                   device_taints: dict[int, list[dict]] | None = None, **node_args) -> None:
    """A KWOK node (no GPU extended resource: its GPUs are DRA devices) and the one
    ResourceSlice of its pool for `profile`, with `device_taints` by GPU index
    (`resource_slice`); `node_args` go to `Fleet.node` (labels, taints, cordoned, ready,
    kwok: True unless given ...)."""
    labels = {"gpu-profile": profile.name, **(node_args.pop("labels", None) or {})}
    await fleet.node(name, {}, labels=labels, **{"kwok": True, **node_args})
    await fleet.custom.create_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", resource_slice(name, profile, taints=device_taints))


async def build_world(fleet: Fleet, hgx: int, l40s: int = 0,
                      classes: tuple[DeviceModeClass, ...] = CLASSES) -> list[str]:
    """The device-mode GPUClasses `classes` and `hgx` + `l40s` nodes publishing their slices
    (`node_names`); returns the node names. The DeviceClass must exist (LocalCluster(dra=True))."""
    for cls in classes:
        await fleet.gpu_class(cls.name, device_mode=cls.spec())
    nodes = node_names(hgx, l40s)
    for name, profile in nodes:
        await dra_node(fleet, name, profile)
    return [n for n, _ in nodes]


def describe(hgx: int, l40s: int) -> str:
    """One line naming what `build_world` made."""
    classes = ", ".join(f"{c.name} (matchAttribute {c.match_attribute})" for c in CLASSES)
    return (f"DRA: DeviceClass {DEVICE_CLASS}, {hgx} × {HGX_H100_8.name} and {l40s} × "
            f"{L40S_4.name} KWOK nodes publishing ResourceSlices, device-mode GPUClasses "
            f"{classes}; tenant budget key {DEVICE_BUDGET_KEY}")


def group_formed(devices, match_attribute: str) -> str | None:
    """The group `devices` (`model.device.dra.SliceDevice`s of one node) form under `match_attribute`
    ({size} replaced by their number, DR3), as `<attribute>=<value>`, or None when they do not
    all carry one value of it (no group: a set no partition holds)."""
    name = match_attribute.replace("{size}", str(len(devices)))
    qualified = name if "/" in name else f"{DRIVER}/{name}"
    values = {dict(d.attributes).get(qualified) for d in devices}
    if not devices or len(values) != 1 or None in values:
        return None
    return f"{name}={values.pop()}"


def module_ids(devices) -> list[int]:
    """The `gpuModuleID`s of `devices` (sorted; devices without one are left out)."""
    return sorted(m for m in (dict(d.attributes).get(f"{DRIVER}/gpuModuleID") for d in devices)
                  if m is not None)
