"""Why one node cannot take the whole set (docs/contract.md §3 B3): the node itself (gone,
cordoned, not Ready, not schedulable for KubeVirt, taints), the set's match (classes not
served, nodeSelector), its capacity (`NoRoom`, `LostCapacity`: `CAPACITY_CODES`) and, in
device mode, its groups of devices (`NoDeviceGroup`, DR3), both naming the device taints
(and the DeviceTaintRules) that keep devices from the set (`TaintedDevices`, HL1); and a set's
record on a tainted device (`RecordTainted`, HL1, what `explain` names). `model.decide` and
`model.types.Node.placement_reasons` build them; `NoEligibleNode` (`model.reasons.sets`)
lists them per node.

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from model.reasons.codes import Code, Reason, plural, resource_label


def _pods_outside(foreign: int) -> str:
    """How a message adds the units used by Pods outside the binder (none: nothing)."""
    return f" ({foreign} used by Pods outside the binder)" if foreign else ""


# --- one node for the whole set (B3) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeGone(Reason):
    """The node does not exist (any more)."""
    code: ClassVar[Code] = Code.NODE_GONE

    def render(self) -> str:
        return "gone"


@dataclass(frozen=True, slots=True)
class Cordoned(Reason):
    """`spec.unschedulable`."""
    code: ClassVar[Code] = Code.CORDONED

    def render(self) -> str:
        return "cordoned"


@dataclass(frozen=True, slots=True)
class NotReady(Reason):
    """The node's Ready condition is not True."""
    code: ClassVar[Code] = Code.NOT_READY

    def render(self) -> str:
        return "not Ready"


@dataclass(frozen=True, slots=True)
class NotKubevirtSchedulable(Reason):
    """The node lacks `label`=true (KubeVirt's `kubevirt.io/schedulable`)."""
    code: ClassVar[Code] = Code.NOT_KUBEVIRT_SCHEDULABLE
    label: str

    def render(self) -> str:
        return f"lacks label {self.label}=true"


@dataclass(frozen=True, slots=True)
class TaintsNotTolerated(Reason):
    """NoSchedule/NoExecute `taints` (as `key=value:Effect`) the VMI does not tolerate."""
    code: ClassVar[Code] = Code.TAINTS_NOT_TOLERATED
    taints: tuple[str, ...]

    def render(self) -> str:
        return (f"{'taint' if len(self.taints) == 1 else 'taints'} "
                f"{', '.join(self.taints)} not tolerated")


@dataclass(frozen=True, slots=True)
class ClassesNotServed(Reason):
    """The node does not serve these classes of the set."""
    code: ClassVar[Code] = Code.CLASSES_NOT_SERVED
    classes: tuple[str, ...]

    def render(self) -> str:
        return "does not serve " + plural("class", self.classes)


@dataclass(frozen=True, slots=True)
class SelectorMismatch(Reason):
    """The entries of the VMI's nodeSelector the node's labels lack."""
    code: ClassVar[Code] = Code.SELECTOR_MISMATCH
    missing: tuple[tuple[str, str], ...]

    def render(self) -> str:
        return "does not match node selector " + ",".join(f"{k}={v}" for k, v in self.missing)


@dataclass(frozen=True, slots=True)
class LostCapacity(Reason):
    """More of `resource` used on the node than allocatable: `bound` devices, `foreign`
    units of Pods outside the binder, `allocatable`."""
    code: ClassVar[Code] = Code.LOST_CAPACITY
    resource: str
    bound: int
    foreign: int
    allocatable: int

    def render(self) -> str:
        return (f"lost capacity of {resource_label(self.resource)}: {self.bound} bound"
                f"{_pods_outside(self.foreign)} of {self.allocatable}")


@dataclass(frozen=True, slots=True)
class TaintedDevices:
    """Device mode (DR2, HL1): devices of the node that would be free for the set but for
    one NoSchedule/NoExecute device taint: their names (`devices`), the taint's `key` and
    `effect`, and `rule`, what puts it there: a DeviceTaintRule's name (also as
    "DeviceTaintRule:<name>"), "ConfigMap:<name>" for gpu-binder's own suspect mark where
    DeviceTaintRules are not served (HL2), "" for the ResourceSlice's own taint. `held`: (GPUDevice, device) of the set's own members
    whose recorded device is among them (an idle held device on a tainted GPU). Not a
    reason of its own (no code): `NoRoom` and `NoDeviceGroup` carry it, so a refusal names
    the rule and the taint key that excluded the devices."""
    devices: tuple[str, ...]
    key: str
    effect: str
    rule: str = ""
    held: tuple[tuple[str, str], ...] = ()

    def render(self) -> str:
        held = dict((device, name) for name, device in self.held)
        shown = [f"{d} of held device {held[d]}" if d in held else d
                 for d in self.devices[:_NAMED_MAX]]
        more = f" and {len(self.devices) - _NAMED_MAX} more" if len(self.devices) > _NAMED_MAX else ""
        return f"{', '.join(shown)}{more} tainted {self.key}:{self.effect} {taint_source(self.rule)}"


def taint_source(rule: str) -> str:
    """What put a device taint there, in words, from a `TaintedDevices.rule`-style `rule`:
    "by its ResourceSlice" (""), "by DeviceTaintRule <name>" (a name, or
    "DeviceTaintRule:<name>"), "by gpu-binder's suspect mark <name> (…)" ("ConfigMap:<name>")."""
    kind, _, name = rule.partition(":")
    if not rule:
        return "by its ResourceSlice"
    if name and kind == "ConfigMap":
        return f"by gpu-binder's suspect mark {name} (a ConfigMap entry kube-scheduler cannot see)"
    return f"by DeviceTaintRule {name if name and kind == 'DeviceTaintRule' else rule}"


@dataclass(frozen=True, slots=True)
class RecordTainted(Reason):
    """HL1 (DR2): GPUDevice `device` of the set, Bound on `node`, records device `recorded`
    there, which carries the NoSchedule/NoExecute device taint `key`/`effect` put there by
    `rule` (as `TaintedDevices.rule`: a DeviceTaintRule, gpu-binder's ConfigMap mark, ""
    the ResourceSlice). `running`: attached to a live VMI (its record is left alone: a
    NoExecute taint is kube-controller-manager's to evict). Not a refusal: `explain` names it
    (`Explanation.tainted`) and the binder logs the re-point it leads to; an idle record on a
    tainted device is re-pointed within its node, or the set moved, at its next placement
    (never answered "already placed" there, W4 nor B6)."""
    code: ClassVar[Code] = Code.RECORD_TAINTED
    device: str
    node: str
    recorded: str
    key: str
    effect: str
    rule: str = ""
    running: bool = False

    def render(self) -> str:
        said = (f"{'device' if self.running else 'held device'} {self.device} records {self.recorded} on {self.node}, tainted "
                f"{self.key}:{self.effect} {taint_source(self.rule)}")
        if self.running:
            return (f"{said}: its running VMI keeps it (a NoExecute taint has kube-controller-manager "
                    f"evict the launcher Pod)")
        return f"{said}: its next placement re-points it within {self.node} or moves the set"


_NAMED_MAX = 4
"""Most device names one `TaintedDevices` spells out."""


def _in_parens(*parts: str) -> str:
    """" (a; b)" of the non-empty `parts`, "" when none."""
    kept = [p for p in parts if p]
    return f" ({'; '.join(kept)})" if kept else ""


@dataclass(frozen=True, slots=True)
class NoRoom(Reason):
    """The set `needs` units of `resource` on the node, which has `free` (of which none is
    taken by its `foreign` units, counted in the used ones). Device mode: `tainted`, the
    devices only a device taint keeps from the set, each with its DeviceTaintRule and taint
    key (HL1; counted as used, not in `foreign`)."""
    code: ClassVar[Code] = Code.NO_ROOM
    resource: str
    needs: int
    free: int
    foreign: int = 0
    # explains the reason, is no part of it: equal with or without the taints named
    tainted: tuple[TaintedDevices, ...] = field(default=(), compare=False)

    def render(self) -> str:
        outside = f"{self.foreign} used by Pods outside the binder" if self.foreign else ""
        return (f"needs {self.needs} × {resource_label(self.resource)}, has {self.free} free"
                f"{_in_parens(outside, *(t.render() for t in self.tainted))}")


@dataclass(frozen=True, slots=True)
class NoDeviceGroup(Reason):
    """Device mode (DR3): the node has the units but no group of free devices of class
    `class_name` sharing `attribute` (the class's matchAttribute with `{size}` = `count`):
    `free` devices of the class are free here, the largest group has `largest` of them.
    `missing`: no device of the node carries the attribute at all; `sizes` then the sizes of
    the sized attribute that do exist on the node (empty for an unsized one). `tainted`: the
    devices only a device taint keeps from the set, each with its DeviceTaintRule and taint
    key (HL1)."""
    code: ClassVar[Code] = Code.NO_DEVICE_GROUP
    class_name: str
    attribute: str | None
    count: int
    free: int
    largest: int
    missing: bool = False
    sizes: tuple[int, ...] = ()
    # explains the reason, is no part of it: equal with or without the taints named
    tainted: tuple[TaintedDevices, ...] = field(default=(), compare=False)

    def render(self) -> str:
        if self.missing:
            sizes = f" (sizes that exist: {', '.join(map(str, self.sizes))})" if self.sizes else ""
            return f"no {self.class_name} device carries {self.attribute}{sizes}"
        if self.attribute is None:
            return (f"needs {self.count} free {self.class_name} devices, has {self.free}"
                    f"{_in_parens(*(t.render() for t in self.tainted))}")
        return (f"no {self.count} free {self.class_name} devices share {self.attribute}: "
                f"{self.free} free, the largest group has {self.largest}"
                f"{_in_parens(*(t.render() for t in self.tainted))}")


CAPACITY_CODES = frozenset({Code.NO_ROOM, Code.LOST_CAPACITY})
"""Node problems about capacity (the others are about the node itself or the set's match).
`NoDeviceGroup` (DR3) is not among them: freeing units elsewhere does not make a group, so
explain's smallest change leaves such nodes out."""
