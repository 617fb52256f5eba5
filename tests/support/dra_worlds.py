"""Device-mode worlds for the model's and the actors' tests (docs/contract.md §3b): HGX H100 nodes
whose devices are read from the ResourceSlices `localcluster.dra_profiles` publishes (8 GPUs,
`partition1/2/4/8` from `gpuModuleID`, module ids not in PCI order), a device-mode class
constrained by `gpu.nvidia.com/partition{size}`, and devices recording their exact device."""

from __future__ import annotations

from dataclasses import replace

from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, L40S_4, PARTITION_ATTRIBUTE, Profile, resource_slice
from model.device.dra import DeviceRef, DeviceTaint, SliceDevice, parse_resource_slice
from model.types import (KUBEVIRT_SCHEDULABLE_LABEL, DeviceStatus, GPUClass, GPUDevice, Node, Phase,
                         dra_resource_name)

DRIVER = "gpu.nvidia.com"
RES = dra_resource_name(DEVICE_CLASS)
"""The count (and quota) key of the device-mode classes here (DR1)."""
CLASS = "h100x"
"""The HGX device-mode class of these worlds."""


def device_class(name: str = CLASS, match_attribute: str | None = PARTITION_ATTRIBUTE,
                 **kw) -> GPUClass:
    """A device-mode GPUClass on NVIDIA's `vfio.gpu.nvidia.com` DeviceClass."""
    return GPUClass(name, RES, device_class_name=DEVICE_CLASS, match_attribute=match_attribute, **kw)


def slice_devices(node: str, profile: Profile = HGX_H100_8) -> tuple[SliceDevice, ...]:
    """The devices of `node`'s ResourceSlice for `profile`, as the model reads them."""
    return tuple(sorted(parse_resource_slice(resource_slice(node, profile)).devices,
                        key=lambda d: d.ref))


def ref(node: str, index: int) -> DeviceRef:
    """The DeviceRef of GPU `index` (PCI order) of `node`'s pool."""
    return DeviceRef(DRIVER, node, f"gpu-vfio-{index}")


def dra_node(name: str, *, classes: tuple[str, ...] = (CLASS,), taken: tuple[int, ...] = (),
             profile: Profile = HGX_H100_8, **kw) -> Node:
    """A placeable node with one pool of `profile`; `taken`: GPU indices a foreign claim
    allocates (in `taken_devices` and counted in `foreign`, as the cache fills them)."""
    devices = slice_devices(name, profile)
    labels = dict(kw.pop("labels", {}))
    labels.setdefault(KUBEVIRT_SCHEDULABLE_LABEL, "true")
    names = frozenset(f"gpu-vfio-{i}" for i in taken)
    return Node(name, labels=tuple(sorted(labels.items())), allocatable=((RES, len(devices)),),
                foreign=((RES, len(names)),) if names else (),
                class_devices=tuple((c, devices) for c in sorted(classes)),
                taken_devices=names, **kw)


def tainted(node: Node, *indices: int, effect: str = "NoExecute") -> Node:
    """`node` with a device taint of `effect` on its GPUs `indices` (NoSchedule/NoExecute:
    used, DR2)."""
    hard = (DeviceTaint("example.com/broken", "", effect),)
    names = {f"gpu-vfio-{i}" for i in indices}
    return replace(node, class_devices=tuple(
        (c, tuple(replace(d, taints=hard) if d.ref.device in names else d for d in devs))
        for c, devs in node.class_devices))


def recorded(namespace: str, name: str, node: str, index: int, class_name: str = CLASS,
             **kw) -> GPUDevice:
    """A held device Bound on `node` recording its GPU `index` (`status.device`)."""
    return GPUDevice(namespace, name, class_name,
                     status=DeviceStatus(Phase.BOUND, node, None, device=ref(node, index)), **kw)


__all__ = ["CLASS", "DEVICE_CLASS", "DRIVER", "HGX_H100_8", "L40S_4", "PARTITION_ATTRIBUTE", "RES",
           "device_class", "dra_node", "recorded", "ref", "slice_devices", "tainted"]
