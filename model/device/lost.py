"""HL3, nothing lost silently (docs/device-mode.md, "Nothing lost silently"): when a device
of a device-mode class is *lost*, and the words that say so.

A device of a device-mode class is lost for one of two reasons (`LossReason`):

- `left-slices`: a GPUDevice records it (`status.device`, on its `status.nodeName`) but its
  node no longer publishes it for the class: its ResourceSlice was deleted or rewritten
  without it, its pool's newer generation lacks it, it no longer matches the DeviceClass's
  or the class's selectors, or the node itself is gone (the model sees the slices through
  the class's selectors, `Node.devices_of`, so these read alike);
- `attribute-lost`: the node publishes it for the class, but without the class's topology
  attribute (`spec.topology.matchAttribute`, for no size: `MatchAttribute.carried_by`), so
  it is in no group and never free (NVIDIA dra-driver-nvidia-gpu#1331: a GPU left bound to
  vfio-pci across a restart of the driver's plugin is republished without `gpuModuleID` and
  `partitionN`). A class without a constraint never loses a device so.

A record on a lost device is kept (the binder never deletes or re-points a record because
its device vanished): when the device returns, nothing moved; the set's next placement
(B6 finds its records do not hold) chooses again. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from model.device.dra import DeviceRef
from model.device.match import MatchAttribute
from model.device.ports import DeviceKey, NodeView


class LossReason(StrEnum):
    """Why a device is lost (module docstring); the value is the metric's `reason` label."""

    LEFT_SLICES = "left-slices"
    ATTRIBUTE_LOST = "attribute-lost"


def record_loss(node: NodeView | None, class_name: str, match: MatchAttribute | None,
                ref: DeviceRef) -> LossReason | None:
    """Why the device `ref` a GPUDevice of device-mode class `class_name` records on `node`
    (a `model.types.Node`, None when gone) is lost, None when it is not: `LEFT_SLICES` when
    the node does not publish a device of that name and ref for the class, `ATTRIBUTE_LOST`
    when it does without the class's topology attribute `match`."""
    if node is None:
        return LossReason.LEFT_SLICES
    devices = node.devices_of(class_name)
    published = devices.by_name(ref.device) if devices else None
    if published is None or published.ref != ref:
        return LossReason.LEFT_SLICES
    if ref.device in devices.without_attribute(match):
        return LossReason.ATTRIBUTE_LOST
    return None


@dataclass(frozen=True, slots=True)
class LostDevice:
    """One lost device of class `class_name` on `node`: its name `device` (`ref` as recorded,
    or as published when no GPUDevice records it), why (`reason`), the GPUDevices recording
    it (`records`, sorted; empty for a published device nobody records that lost its
    attribute) and the class's matchAttribute (`attribute`, its text; None without one)."""

    class_name: str
    node: str
    device: str
    ref: DeviceRef
    reason: LossReason
    records: tuple[DeviceKey, ...] = ()
    attribute: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """(node, device, reason): one loss whatever the class (a device of two classes over
        one DeviceClass is one loss to tell)."""
        return (self.node, self.device, self.reason.value)

    def what(self) -> str:
        """Why, in words: "left the ResourceSlices (…)" or "published without …"."""
        if self.reason is LossReason.LEFT_SLICES:
            return ("no longer published for the class (its ResourceSlice was deleted or "
                    "rewritten without it, it no longer matches the class's selectors, or its "
                    "node is gone)")
        return (f"published without {self.attribute}, so in no group of the class (a GPU "
                "left bound to vfio-pci across a restart of NVIDIA's DRA plugin is "
                "republished so: dra-driver-nvidia-gpu#1331)")

    def render(self) -> str:
        """E.g. "device gpu-vfio-3 of node hgx-node-01 (class hgx-h100) is lost: published
        without gpu.nvidia.com/partition{size}, …; recorded by tenant-a/train-0, kept until
        it returns or the set is placed again"."""
        head = f"device {self.device} of node {self.node} (class {self.class_name}) is lost: {self.what()}"
        if not self.records:
            return head + "; no GPUDevice records it, it is not counted free"
        who = ", ".join(f"{ns}/{name}" for ns, name in self.records)
        return (f"{head}; recorded by {who}, kept until it returns (nothing moves) or the set "
                "is placed again")


__all__ = ["LossReason", "LostDevice", "record_loss"]
