"""The webhook's own checks of a VMI's set (docs/contract.md §4 W1, `model.admission`): its
annotations, nodeSelector and tolerations, its held and template devices (being deleted,
attached, named as held, a name taken, kept for a VirtualMachine, H4), KubeVirt's permitted
host devices, the room the set needs on one node; the tenant's fair share at this replica
(`TenantBusy`, `BudgetInFlight`); and `CannotPlace`, W1's denial carrying them.
`W1_DEVICE_CODES`: those about one device that the binder never sees.

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Category, Code, Reason, resource_label


# --- the webhook's own checks (W1) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnknownAnnotation(Reason):
    """`gpu.cozystack.io/` annotations other than the two a VMI may carry (`devices`,
    `templates`: their keys). `reserved`: those of `keys` that gpu-binder writes itself
    (`gpu.cozystack.io/admission`, set at admission), named as such rather than unknown."""
    code: ClassVar[Code] = Code.UNKNOWN_ANNOTATION
    keys: tuple[str, ...]
    devices: str
    templates: str
    reserved: tuple[str, ...] = ()

    def render(self) -> str:
        parts = []
        unknown = [k for k in self.keys if k not in self.reserved]
        if unknown:
            parts.append(f"unknown annotation {', '.join(unknown)}: gpu-binder reads "
                         f"{self.devices} (held devices, \"gpu-a,gpu-b\") and "
                         f"{self.templates} (new devices, \"h100=2,l40s=1\")")
        if self.reserved:
            parts.append(f"annotation {', '.join(self.reserved)} is written by gpu-binder "
                         "when it admits a VMI; a VMI may not carry it when created")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class TooManySelectorEntries(Reason):
    """The launcher's nodeSelector has `count` entries, more than the request carries."""
    code: ClassVar[Code] = Code.TOO_MANY_SELECTOR_ENTRIES
    count: int
    limit: int

    def render(self) -> str:
        return (f"the VMI's nodeSelector has {self.count} entries (with KubeVirt's "
                f"own); gpu-binder carries at most {self.limit}")


@dataclass(frozen=True, slots=True)
class SelectorEntryTooLong(Reason):
    """A nodeSelector entry (`key`, cut to 80 characters) longer than a label allows."""
    code: ClassVar[Code] = Code.SELECTOR_ENTRY_TOO_LONG
    key: str
    max_key: int
    max_value: int

    def render(self) -> str:
        return (f"the VMI's nodeSelector entry {self.key[:80]!r} is longer than a label allows "
                f"(key {self.max_key}, value {self.max_value} characters)")


@dataclass(frozen=True, slots=True)
class TooManyTolerations(Reason):
    """The VMI has `count` tolerations, more than the request carries."""
    code: ClassVar[Code] = Code.TOO_MANY_TOLERATIONS
    count: int
    limit: int

    def render(self) -> str:
        return f"the VMI has {self.count} tolerations; gpu-binder carries at most {self.limit}"


@dataclass(frozen=True, slots=True)
class TolerationTooLong(Reason):
    """A toleration (of `key`, cut to 80 characters) longer than a taint allows."""
    code: ClassVar[Code] = Code.TOLERATION_TOO_LONG
    key: str
    max_key: int
    max_value: int

    def render(self) -> str:
        return (f"the VMI's toleration of {self.key[:80]!r} is longer than a taint allows "
                f"(key {self.max_key}, value {self.max_value} characters)")


@dataclass(frozen=True, slots=True)
class HeldDeviceNotFound(Reason):
    """A device named in `gpu.cozystack.io/devices` does not exist in `namespace`."""
    code: ClassVar[Code] = Code.HELD_DEVICE_NOT_FOUND
    device: str
    namespace: str

    def render(self) -> str:
        return f"GPU device {self.device} not found in namespace {self.namespace}"


@dataclass(frozen=True, slots=True)
class DeviceBeingDeleted(Reason):
    """A held device named by the VMI is being deleted."""
    code: ClassVar[Code] = Code.DEVICE_BEING_DELETED
    device: str

    def render(self) -> str:
        return f"GPU device {self.device} is being deleted"


@dataclass(frozen=True, slots=True)
class TemplateBeingDeleted(Reason):
    """A template device of this VMI (an earlier incarnation's) is still being deleted."""
    code: ClassVar[Code] = Code.TEMPLATE_BEING_DELETED
    device: str

    def render(self) -> str:
        return f"GPU device {self.device} is being deleted; retry"


@dataclass(frozen=True, slots=True)
class TemplateNamedAsHeld(Reason):
    """A template device of VMI `owner` named in `gpu.cozystack.io/devices`."""
    code: ClassVar[Code] = Code.TEMPLATE_NAMED_AS_HELD
    device: str
    owner: str

    def render(self) -> str:
        return (f"GPU device {self.device} is a template device of VMI {self.owner}; "
                "only held devices can be named in gpu.cozystack.io/devices")


@dataclass(frozen=True, slots=True)
class DeviceAttached(Reason):
    """The device is attached to another VMI that still holds it."""
    code: ClassVar[Code] = Code.DEVICE_ATTACHED
    device: str
    vmi: str

    def render(self) -> str:
        return f"GPU device {self.device} is attached to VMI {self.vmi}"


@dataclass(frozen=True, slots=True)
class NameTaken(Reason):
    """The deterministic name of a template device is taken by another device."""
    code: ClassVar[Code] = Code.NAME_TAKEN
    device: str
    class_name: str
    vmi: str

    def render(self) -> str:
        return (f"GPU device {self.device} exists and is not a {self.class_name} template "
                f"device of VMI {self.vmi}; delete it or rename the VMI")


@dataclass(frozen=True, slots=True)
class ClassNotPermitted(Reason):
    """KubeVirt's `permittedHostDevices` lacks the class's resource."""
    code: ClassVar[Code] = Code.CLASS_NOT_PERMITTED
    class_name: str
    resource: str

    def render(self) -> str:
        return (f"GPU class {self.class_name}: KubeVirt does not permit resource {self.resource} "
                "(not in the KubeVirt CR's spec.configuration.permittedHostDevices), so it "
                "would not start this VMI; ask the operator to permit it")


@dataclass(frozen=True, slots=True)
class GpuEntryNotPermitted(Reason):
    """The VMI's own `gpus` entry `entry` names `resource`, which KubeVirt does not permit."""
    code: ClassVar[Code] = Code.GPU_ENTRY_NOT_PERMITTED
    entry: object
    resource: str

    def render(self) -> str:
        return (f"GPU entry {self.entry!r} of the VMI names {self.resource}, which KubeVirt does not "
                "permit (not in the KubeVirt CR's spec.configuration.permittedHostDevices), "
                "so it would not start this VMI; remove the entry or ask the operator to permit it")


@dataclass(frozen=True, slots=True)
class SetNeeds(Reason):
    """The set needs `needs` new units of `resource` (class `class_name`) on one node; the
    most free on an eligible node serving it is `most_free` (None: none is eligible).
    `largest`: set when no node serving the class has as many as the set's `members` of it
    at all, free or not (the most any has): no wait makes room, a smaller set or a larger
    node does."""
    code: ClassVar[Code] = Code.SET_NEEDS
    class_name: str
    resource: str
    needs: int
    most_free: int | None
    largest: int | None = None
    members: int = 0

    def render(self) -> str:
        most = (f"the most free on an eligible node serving it is {self.most_free}"
                if self.most_free is not None else "no node serving it is eligible")
        never = (f"; no node serving it has {self.members} at all (the largest has "
                 f"{self.largest})" if self.largest is not None else "")
        return (f"the set needs {self.needs} × {resource_label(self.resource)} (class "
                f"{self.class_name}) on one node; {most}{never}")


@dataclass(frozen=True, slots=True)
class NoRoomForSet(Reason):
    """No eligible node has room for the set (and it adds no new unit to name)."""
    code: ClassVar[Code] = Code.NO_ROOM_FOR_SET

    def render(self) -> str:
        return "no eligible node has room for the set"


@dataclass(frozen=True, slots=True)
class SameNameConflict(Reason):
    """Another admission of a VMI of the same name still holds the device."""
    code: ClassVar[Code] = Code.SAME_NAME_CONFLICT
    device: str
    namespace: str
    vmi: str

    def render(self) -> str:
        return (f"GPU device {self.device} is being attached by another admission of VMI "
                f"{self.namespace}/{self.vmi} (a concurrent create of the same "
                "name); retry once it has finished")


@dataclass(frozen=True, slots=True)
class DeviceKept(Reason):
    """H4: the device is part of a set kept for VirtualMachine `namespace/vm` (its VMI went
    away while the VM exists) until `until` (RFC 3339); only a VMI owned by that VM may take
    it (W4), `owner_required` says the denied VMI was of the same name but not that VM's."""
    code: ClassVar[Code] = Code.DEVICE_KEPT
    device: str
    namespace: str
    vm: str
    until: str
    owner_required: bool = False

    def render(self) -> str:
        who = ("only a VMI owned by that VirtualMachine may take it (this one is not)"
               if self.owner_required else "only that VM's next VMI may take it")
        return (f"GPU device {self.device} is kept for VirtualMachine {self.namespace}/{self.vm} "
                f"until {self.until} (keepSetFor): {who}; delete the VM to release it")


@dataclass(frozen=True, slots=True)
class KeptForVM(Reason):
    """H4: on node `node`, `count` units of `resource` are kept for the stopped
    VirtualMachine `namespace/vm` until `until` (RFC 3339): they count as used there and
    are released when the VM is deleted or the time runs out."""
    code: ClassVar[Code] = Code.KEPT_FOR_VM
    node: str
    resource: str
    count: int
    namespace: str
    vm: str
    until: str

    def render(self) -> str:
        return (f"node {self.node}: {self.count} × {resource_label(self.resource)} kept for VirtualMachine "
                f"{self.namespace}/{self.vm} until {self.until} (keepSetFor)")


@dataclass(frozen=True, slots=True)
class TenantBusy(Reason):
    """The tenant `namespace` got no turn at this replica, whose admissions were all taken
    (its share binding while other tenants wait): `in_flight` of its own in progress and
    `waiting` waiting for a turn (its line full), or this one waited `waited` seconds, as long
    as the review's deadline allowed; retry after `retry_after` seconds."""
    code: ClassVar[Code] = Code.TENANT_BUSY
    namespace: str
    in_flight: int
    waiting: int
    waited: float
    retry_after: int

    def render(self) -> str:
        why = (f"this one waited {self.waited:.1f} s" if self.waited > 0
               else f"{self.waiting} more wait")
        return (f"tenant {self.namespace} has {self.in_flight} GPU admissions in progress at "
                f"this busy gpu-binder replica and {why} for a turn of its fair share; too "
                f"many requests, retry after {self.retry_after} s")


@dataclass(frozen=True, slots=True)
class BudgetInFlight(Reason):
    """The tenant `namespace`'s budget of `resource` has no room for this set while its
    `in_flight` other admissions in progress at this replica (not yet Bound) hold `held`
    units of it: `used` Bound, `budget` in all, the set adds `adds`. Retryable (429):
    should an admission in progress fail, the budget is free again; retry after
    `retry_after` seconds (answered before a turn is waited for)."""
    code: ClassVar[Code] = Code.BUDGET_IN_FLIGHT
    namespace: str
    resource: str
    used: int
    held: int
    budget: int
    adds: int
    in_flight: int
    retry_after: int

    def render(self) -> str:
        return (f"tenant {self.namespace} has {self.in_flight} GPU admissions in progress at "
                f"this gpu-binder replica holding {self.held} × {resource_label(self.resource)} of its budget "
                f"of {self.budget} ({self.used} used) and this set adds {self.adds}: more than "
                f"its fair share while they last; too many requests, retry after "
                f"{self.retry_after} s")


# --- W1's denial of the set, carrying the reasons above ----------------------------------------


@dataclass(frozen=True, slots=True)
class CannotPlace(Reason):
    """W1's denial of a set that fails its checks: "GPU set of VMI <ns>/<vmi> cannot be
    placed: " and the `reasons`. `code` and `category` are the first reason's."""
    namespace: str
    vmi: str
    reasons: tuple[Reason, ...]

    @property
    def code(self) -> Code:  # type: ignore[override]
        return self.reasons[0].code

    @property
    def category(self) -> Category:
        return self.reasons[0].category

    def render(self) -> str:
        return (f"GPU set of VMI {self.namespace}/{self.vmi} cannot be placed: "
                + "; ".join(r.render() for r in self.reasons))


W1_DEVICE_CODES = frozenset({Code.DEVICE_BEING_DELETED, Code.TEMPLATE_BEING_DELETED,
                             Code.TEMPLATE_NAMED_AS_HELD, Code.DEVICE_ATTACHED, Code.NAME_TAKEN,
                             Code.SAME_NAME_CONFLICT, Code.DEVICE_KEPT})
"""W1's reasons about one device of the set that the binder never sees (explain lists them
among the set's problems)."""
