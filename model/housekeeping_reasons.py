"""Why housekeeping acts or holds back (docs/contract.md §5, H1–H4, DR6), as types: the `Rule`
an action follows, a `HousekeepingCode` per finding, and one frozen dataclass per code
carrying its data. The English of every finding is written here once (`render()`, also
`str()`): `model.housekeeping` judges and plans with these values, and the edges (the
leader's log lines, Events and status conditions) render them. Nothing parses a message
back; tests compare codes and data.

Also here, for the same reason: the words of the GPUClass conditions housekeeping writes
(`ClassCondition`: `Ready`, DR1, and `KubeVirtPermitted`), of the `GPUSetKept` condition on a
VirtualMachine whose set is kept (`KeptCondition`, H4), and of the Events housekeeping sends
(`HousekeepingEvent`: `GPUSetKept`, `GPUSetReleased`, `GPUClaimRestored`,
`PolicyParameterMissing`).

Pure; of the rest of `model` it imports only the time format (`model.serialize.format_time`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from model.serialize import format_time


class Rule(StrEnum):
    """The housekeeping rule an action (or a log line) follows (docs/contract.md §5): H1 an
    attachment whose VMI never appeared, H2 one whose VMI incarnation is gone, H1_H2 a claim
    the binder made that no VMI uses (either), H3 the settings ConfigMap, H4 a set kept for
    a VirtualMachine, DR6 the claim of an admitted VMI made again. The value is what logs
    show (`rule=H2`)."""

    H1 = "H1"
    H2 = "H2"
    H1_H2 = "H1/H2"
    H3 = "H3"
    H4 = "H4"
    DR6 = "DR6"


class HousekeepingCode(StrEnum):
    """One code per finding of housekeeping's judgement (`model.housekeeping.judge`, `plan`,
    `model.claim.stale_claims`); the value is a bounded label."""

    # the attachment's VMI (H1, H2)
    VMI_EXISTS = "vmi_exists"
    VMI_DELETED = "vmi_deleted"
    VMI_NOT_YET_SEEN = "vmi_not_yet_seen"
    VMI_NEVER_APPEARED = "vmi_never_appeared"
    NEW_INCARNATION_IN_FLIGHT = "new_incarnation_in_flight"
    ANOTHER_INCARNATION = "another_incarnation"
    REQUEST_REFUSED = "request_refused"
    REFUSAL_BEING_READ = "refusal_being_read"
    UID_RECORDED = "uid_recorded"
    ORPHAN_TEMPLATE = "orphan_template"
    YIELDED_TEMPLATE = "yielded_template"
    # a set kept for its VirtualMachine (H4)
    KEEP_NOT_KNOWN = "keep_not_known"
    KEEP_STARTS = "keep_starts"
    KEPT = "kept"
    KEPT_VM_DELETED = "kept_vm_deleted"
    KEPT_VM_DELETING = "kept_vm_deleting"
    KEEP_RAN_OUT = "keep_ran_out"
    # the claims the binder made (H1/H2 of claims, H4)
    CLAIM_UNUSED = "claim_unused"
    CLAIM_OF_RELEASED_KEEP = "claim_of_released_keep"


def stamp(when: datetime) -> str:
    """`when` (aware) as the findings show it: RFC 3339 to the second, 'Z'."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class HousekeepingReason:
    """Base of every finding: `code` (class-level), `render()` the English wording (`str()`
    gives the same)."""

    __slots__ = ()
    code: ClassVar[HousekeepingCode]

    def render(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.render()


# --- the attachment's VMI (H1, H2) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VmiExists(HousekeepingReason):
    """LIVE: the VMI `vmi` exists (with the recorded `uid`, when the attachment has one)."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.VMI_EXISTS
    vmi: str
    uid: str | None = None

    def render(self) -> str:
        return f"VMI {self.vmi} (uid {self.uid}) exists" if self.uid else f"VMI {self.vmi} exists"


@dataclass(frozen=True, slots=True)
class VmiDeleted(HousekeepingReason):
    """GONE (H2): the attachment's VMI incarnation was deleted: known by its recorded `uid`
    no longer live, else by its admission among the tombstones (`uid` None)."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.VMI_DELETED
    vmi: str
    uid: str | None = None

    def render(self) -> str:
        if self.uid:
            return f"VMI {self.vmi} (uid {self.uid}) was deleted"
        return f"VMI {self.vmi} was deleted"


@dataclass(frozen=True, slots=True)
class VmiNotYetSeen(HousekeepingReason):
    """PENDING: the VMI has not appeared, within the grace."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.VMI_NOT_YET_SEEN
    vmi: str

    def render(self) -> str:
        return f"VMI {self.vmi} has not appeared yet"


@dataclass(frozen=True, slots=True)
class VmiNeverAppeared(HousekeepingReason):
    """STALE (H1): the VMI has not appeared `age` seconds after the attachment."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.VMI_NEVER_APPEARED
    vmi: str
    age: int

    def render(self) -> str:
        return f"VMI {self.vmi} has not appeared {self.age} s after attachment"


@dataclass(frozen=True, slots=True)
class NewIncarnationInFlight(HousekeepingReason):
    """PENDING: a VMI of the name exists as another incarnation, within the grace of the
    attachment (an admission of a new one in flight)."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.NEW_INCARNATION_IN_FLIGHT
    vmi: str

    def render(self) -> str:
        return f"VMI {self.vmi} exists as another incarnation (an admission of a new one in flight)"


@dataclass(frozen=True, slots=True)
class AnotherIncarnation(HousekeepingReason):
    """GONE (H2): the VMI of the name is another incarnation: its admission annotation
    `admission` (None: none) is not the attachment's `attached`."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.ANOTHER_INCARNATION
    vmi: str
    admission: str | None
    attached: str | None

    def render(self) -> str:
        return (f"VMI {self.vmi} exists as another incarnation (admission "
                f"{self.admission or 'none'}, not {self.attached})")


@dataclass(frozen=True, slots=True)
class RequestRefused(HousekeepingReason):
    """GONE (H2): the attachment's own bind request was refused (its answer window past)."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.REQUEST_REFUSED
    vmi: str

    def render(self) -> str:
        return f"the request of VMI {self.vmi} was refused"


@dataclass(frozen=True, slots=True)
class RefusalBeingRead(HousekeepingReason):
    """PENDING: the attachment's own request was refused, within the answer window: its
    webhook may still be reading the answer (W5)."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.REFUSAL_BEING_READ
    vmi: str

    def render(self) -> str:
        return (f"the request of VMI {self.vmi} was refused; its webhook may still be reading "
                "the answer")


@dataclass(frozen=True, slots=True)
class UidRecorded(HousekeepingReason):
    """H2 (`LinkAttachment`): the VMI was seen live; its uid is recorded on the set."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.UID_RECORDED

    def render(self) -> str:
        return "VMI seen: its uid recorded"


@dataclass(frozen=True, slots=True)
class OrphanTemplate(HousekeepingReason):
    """H1: a template device with no attachment, `age` seconds old, and no VMI of its name."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.ORPHAN_TEMPLATE
    age: int

    def render(self) -> str:
        return f"template device with no attachment, {self.age} s old"


@dataclass(frozen=True, slots=True)
class YieldedTemplate(HousekeepingReason):
    """H2 (P4): a template device of VMI `vmi`, Bound, with no attachment, while `vmi` is a
    victim of a live nomination: its room is its preemptor's, released without H1's grace."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.YIELDED_TEMPLATE
    vmi: str

    def render(self) -> str:
        return (f"template device of VMI {self.vmi}, which yielded to a preemptor, "
                "with no attachment")


# --- a set kept for its VirtualMachine (H4) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeepNotKnown(HousekeepingReason):
    """PENDING: the VMI `vmi` is gone and the VirtualMachines are not known yet, so whether
    its VM keeps the set cannot be told."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.KEEP_NOT_KNOWN
    vmi: str

    def render(self) -> str:
        return (f"VMI {self.vmi} is gone; whether VirtualMachine {self.vmi} keeps its set is "
                "not known yet")


@dataclass(frozen=True, slots=True)
class KeepStarts(HousekeepingReason):
    """KEPT: the VMI `vmi` is gone and its VirtualMachine keeps the set `seconds` long."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.KEEP_STARTS
    vmi: str
    seconds: int

    def render(self) -> str:
        return f"VMI {self.vmi} is gone; VirtualMachine {self.vmi} keeps its set for {self.seconds} s"


@dataclass(frozen=True, slots=True)
class Kept(HousekeepingReason):
    """KEPT: the set is kept for VirtualMachine `vm` until `until` (recorded)."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.KEPT
    vm: str
    until: datetime

    def render(self) -> str:
        return f"kept for VirtualMachine {self.vm} until {stamp(self.until)}"


@dataclass(frozen=True, slots=True)
class KeptVmDeleted(HousekeepingReason):
    """GONE (H4): the VirtualMachine the set was kept for (uid `owner`) is deleted, or
    another uid of the name."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.KEPT_VM_DELETED
    vm: str
    owner: str | None

    def render(self) -> str:
        return (f"VirtualMachine {self.vm} (uid {self.owner}) was deleted: its kept set is "
                "released")


@dataclass(frozen=True, slots=True)
class KeptVmDeleting(HousekeepingReason):
    """GONE (H4): the VirtualMachine the set was kept for is being deleted."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.KEPT_VM_DELETING
    vm: str

    def render(self) -> str:
        return f"VirtualMachine {self.vm} is being deleted: its kept set is released"


@dataclass(frozen=True, slots=True)
class KeepRanOut(HousekeepingReason):
    """GONE (H4): the keep ended at `until` (`keptUntil`)."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.KEEP_RAN_OUT
    vm: str
    until: datetime

    def render(self) -> str:
        return f"the set kept for VirtualMachine {self.vm} ran out at {stamp(self.until)}"


# --- the claims the binder made ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimUnused(HousekeepingReason):
    """H1/H2: no VMI `vmi` exists and no device is attached to it, `age` seconds after the
    claim was made or last confirmed."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.CLAIM_UNUSED
    vmi: str
    age: int

    def render(self) -> str:
        return (f"VMI {self.vmi} does not exist and no device is attached to it, {self.age} s "
                "after the claim was made")


@dataclass(frozen=True, slots=True)
class ClaimOfReleasedKeep(HousekeepingReason):
    """H4: the set kept for VirtualMachine `vmi` was released and no VMI of its name exists."""
    code: ClassVar[HousekeepingCode] = HousekeepingCode.CLAIM_OF_RELEASED_KEEP
    vmi: str

    def render(self) -> str:
        return (f"the set kept for VirtualMachine {self.vmi} was released and no VMI of its "
                "name exists")


# --- the conditions housekeeping writes ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeptCondition:
    """H4: the message of a VirtualMachine's `GPUSetKept` condition: its set kept on `nodes`
    (devices `devices`) until `until`."""
    nodes: tuple[str, ...]
    devices: tuple[str, ...]
    until: datetime

    def render(self) -> str:
        return (f"GPU set kept on node {', '.join(self.nodes) or '(none)'} (devices "
                f"{', '.join(self.devices)}) until {stamp(self.until)} "
                "(GPUClass keepSetFor): the next VMI of this VirtualMachine starts there with "
                "the same devices; deleting the VirtualMachine releases them")

    def __str__(self) -> str:
        return self.render()


class ClassCondition:
    """Base of a GPUClass condition's content: `status` ("True", "False", "Unknown") and
    `reason` (CamelCase) are the class's, `render()` the message. `as_tuple()` gives
    (status, reason, message) as the status write needs them."""

    __slots__ = ()
    status: ClassVar[str]
    reason: ClassVar[str]

    def render(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.render()

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.status, self.reason, self.render())


@dataclass(frozen=True, slots=True)
class CannotServe(ClassCondition):
    """Ready False (DR1): the class's `problem` (its VMIs are refused with that text)."""
    status: ClassVar[str] = "False"
    reason: ClassVar[str] = "CannotServe"
    problem: str

    def render(self) -> str:
        return self.problem


@dataclass(frozen=True, slots=True)
class ServesDevices(ClassCondition):
    """Ready True: a device-mode class serves devices of DeviceClass `device_class_name`,
    its sets sharing `match_attribute` (None: no matchAttribute)."""
    status: ClassVar[str] = "True"
    reason: ClassVar[str] = "DeviceMode"
    device_class_name: str | None
    match_attribute: str | None = None

    def render(self) -> str:
        topo = f", sets share {self.match_attribute}" if self.match_attribute else ""
        return (f"devices of DeviceClass {self.device_class_name} in the nodes' "
                f"ResourceSlices{topo}")


@dataclass(frozen=True, slots=True)
class ServesUnits(ClassCondition):
    """Ready True: a count-mode class serves units of extended resource `resource`."""
    status: ClassVar[str] = "True"
    reason: ClassVar[str] = "CountMode"
    resource: str | None

    def render(self) -> str:
        return f"units of extended resource {self.resource}"


@dataclass(frozen=True, slots=True)
class NoKubeVirt(ClassCondition):
    """KubeVirtPermitted Unknown: no KubeVirt CR exists (nothing is denied for it)."""
    status: ClassVar[str] = "Unknown"
    reason: ClassVar[str] = "NoKubeVirt"

    def render(self) -> str:
        return "no KubeVirt CR found; permittedHostDevices cannot be checked"


@dataclass(frozen=True, slots=True)
class Permitted(ClassCondition):
    """KubeVirtPermitted True: `resource` is in permittedHostDevices."""
    status: ClassVar[str] = "True"
    reason: ClassVar[str] = "Permitted"
    resource: str

    def render(self) -> str:
        return f"{self.resource} is in the KubeVirt CR's spec.configuration.permittedHostDevices"


@dataclass(frozen=True, slots=True)
class NotPermitted(ClassCondition):
    """KubeVirtPermitted False: `resource` is not in permittedHostDevices (the webhook then
    denies VMIs asking for the class, W1)."""
    status: ClassVar[str] = "False"
    reason: ClassVar[str] = "NotPermitted"
    resource: str

    def render(self) -> str:
        return (f"{self.resource} is not in the KubeVirt CR's "
                "spec.configuration.permittedHostDevices: KubeVirt would not start a VMI asking "
                "for it, so the webhook denies such VMIs")


# --- the Events housekeeping sends ---------------------------------------------------------------


class HousekeepingEvent:
    """Base of an Event's content: `reason` (the Event's CamelCase reason, class-level),
    `warning` (its type), `render()` the message."""

    __slots__ = ()
    reason: ClassVar[str]
    warning: ClassVar[bool]

    def render(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.render()


@dataclass(frozen=True, slots=True)
class SetKeptEvent(HousekeepingEvent):
    """H4, on VirtualMachine `namespace/vm`: its set (`devices` on `nodes`) is kept until
    `until`."""
    reason: ClassVar[str] = "GPUSetKept"
    warning: ClassVar[bool] = False
    namespace: str
    vm: str
    devices: tuple[str, ...]
    nodes: tuple[str, ...]
    until: datetime

    def render(self) -> str:
        return (f"GPU set of VirtualMachine {self.namespace}/{self.vm} (devices "
                f"{', '.join(self.devices)} on node {', '.join(self.nodes)}) kept until "
                f"{format_time(self.until)} (keepSetFor): its next VMI starts there with the "
                "same devices; deleting the VM releases them")


@dataclass(frozen=True, slots=True)
class SetReleasedEvent(HousekeepingEvent):
    """H4, on VirtualMachine `namespace/vm`: its kept set (`devices`) was released, `why`."""
    reason: ClassVar[str] = "GPUSetReleased"
    warning: ClassVar[bool] = False
    namespace: str
    vm: str
    devices: tuple[str, ...]
    why: HousekeepingReason | None

    def render(self) -> str:
        return (f"GPU set of VirtualMachine {self.namespace}/{self.vm} (devices "
                f"{', '.join(self.devices)}) released: {self.why}")


@dataclass(frozen=True, slots=True)
class ClaimRestoredEvent(HousekeepingEvent):
    """DR6, on the VMI: its ResourceClaim `namespace/claim` was made again from the record
    (`node`; `devices`: (GPUDevice, the device it records) in the claim's order)."""
    reason: ClassVar[str] = "GPUClaimRestored"
    warning: ClassVar[bool] = True
    namespace: str
    claim: str
    node: str
    devices: tuple[tuple[str, str], ...]

    def listed(self) -> str:
        """The devices as the message and the log line show them ("gpu-0=gpu-vfio-2, …")."""
        return ", ".join(f"{d}={r}" for d, r in self.devices)

    def render(self) -> str:
        return (f"ResourceClaim {self.namespace}/{self.claim} of this VMI was deleted before its "
                f"launcher Pod took it; made again from the binder's record (node {self.node}, "
                f"devices {self.listed()}). Delete the VMI to release its GPUs.")


@dataclass(frozen=True, slots=True)
class ParameterMissingEvent(HousekeepingEvent):
    """H3, on ConfigMap `namespace/name` (the shipped policies' parameter): it was missing
    and H3 created it (`error` None), or it is missing and H3 cannot create it (`error`:
    why, as the API server said)."""
    reason: ClassVar[str] = "PolicyParameterMissing"
    warning: ClassVar[bool] = True
    namespace: str
    name: str
    error: str | None = None

    def detail(self) -> str:
        """What happened, without naming the ConfigMap (the log line's `message`)."""
        if self.error is not None:
            return ("missing, and H3 cannot create it: the shipped policies deny every Pod, "
                    "VMI, ResourceClaim and ResourceClaimTemplate they match until it exists "
                    f"(parameterNotFoundAction: Deny): {self.error}")
        return ("was missing, and H3 created it: until then the shipped policies denied every "
                "Pod, VMI, ResourceClaim and ResourceClaimTemplate they match "
                "(parameterNotFoundAction: Deny)")

    def render(self) -> str:
        return (f"ConfigMap {self.namespace}/{self.name}, the parameter of "
                "ValidatingAdmissionPolicies gpu-binder-raw-pods, gpu-binder-raw-vmis and "
                f"gpu-binder-raw-claims, {self.detail()}")
