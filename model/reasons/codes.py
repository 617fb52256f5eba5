"""The catalogue of reasons (docs/contract.md §3 B1/B3, §4 W1): every `Code` (an Enum, its
value the bounded metrics label), its `Category` (the kind of no, which the webhook's HTTP
status follows), the `Reason` base every reason type derives from, and the wording helpers
the reason modules share (`resource_label`, `plural`). Adding a code: a member of `Code`
under its group comment (tools/reason-codes.py reads those), its `_CATEGORY` entry, and its
reason type in the module of its section (see the package's docstring).

Pure; imports nothing from the rest of `model`.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import ClassVar, Sequence


DRA_DEVICES_SUFFIX = ".deviceclass.resource.k8s.io/devices"
"""A device-mode class's count key ends so (`model.types.dra_resource_name`, DR1)."""


def resource_label(name: str) -> str:
    """How a message names a counted resource: an extended resource as it is
    (`nvidia.com/H100`), a device-mode class's DeviceClass quota key as
    "<DeviceClass> devices" (`vfio.gpu.nvidia.com devices`)."""
    if name.endswith(DRA_DEVICES_SUFFIX):
        return name[:-len(DRA_DEVICES_SUFFIX)] + " devices"
    return name


class Category(StrEnum):
    """What kind of no a denial is; the webhook's HTTP status follows it
    (`k8s.webhook.review.STATUS`), this one type for the model's reasons and the webhook's
    own denials alike. A reason's: `POLICY` the cluster's rules refuse it as asked (budget,
    entitlement, no room, cordon; 403); `INVALID` the request itself is wrong (malformed,
    unknown class, a device listed twice; 422); `UNAVAILABLE` a transient condition the
    caller may retry (503); `THROTTLED` the tenant has its fair share of admissions in
    progress, or the API server throttles the webhook, and the caller may retry shortly
    (429); `INTERNAL` the webhook failed (a bug, or its own RBAC; 500). The transport's own
    (W6): `MALFORMED` not an AdmissionReview the webhook serves (400), `TOO_LARGE` the body
    is over the size cap (413), `MEDIA_TYPE` the body is not application/json (415)."""

    POLICY = "policy"
    INVALID = "invalid"
    MALFORMED = "malformed"
    UNAVAILABLE = "unavailable"
    THROTTLED = "throttled"
    TOO_LARGE = "too-large"
    MEDIA_TYPE = "media-type"
    INTERNAL = "internal"


class Code(str, Enum):
    """One code per reason; the value is the bounded label metrics use
    (`gpu_binder_decisions_total{reason=...}`)."""

    # the set, whatever the node (B1 and W1)
    DEVICE_NOT_FOUND = "device_not_found"
    DEVICE_LISTED_TWICE = "device_listed_twice"
    NO_DEVICES = "no_devices"
    CLASS_NOT_FOUND = "class_not_found"
    NOT_ENTITLED = "not_entitled"
    BUDGET_EXHAUSTED = "budget_exhausted"
    WRONG_NAMESPACE = "wrong_namespace"
    NO_FREE_UNIT = "no_free_unit"
    # one node for the whole set (B3)
    NODE_GONE = "node_gone"
    CORDONED = "cordoned"
    NOT_READY = "not_ready"
    NOT_KUBEVIRT_SCHEDULABLE = "not_kubevirt_schedulable"
    TAINTS_NOT_TOLERATED = "taints_not_tolerated"
    CLASSES_NOT_SERVED = "classes_not_served"
    SELECTOR_MISMATCH = "selector_mismatch"
    LOST_CAPACITY = "lost_capacity"
    NO_ROOM = "no_room"
    NO_DEVICE_GROUP = "no_device_group"
    # device mode, the set whatever the node (DR1)
    CLASS_PROBLEM = "class_problem"
    MIXED_MODES = "mixed_modes"
    # device health: a set's record on a tainted device (HL1)
    RECORD_TAINTED = "record_tainted"
    # the set over the nodes (B1)
    NO_NODE_SERVES = "no_node_serves"
    NO_ELIGIBLE_NODE = "no_eligible_node"
    LEDGERS_REFUSED = "ledgers_refused"
    # no preemption plan for a set refused for room (P2, P3)
    PREEMPTOR_NEVER = "preemptor_never"
    FITS_WITHOUT_PREEMPTION = "fits_without_preemption"
    NOT_REFUSED_FOR_ROOM = "not_refused_for_room"
    NO_ELIGIBLE_VICTIM = "no_eligible_victim"
    NOTHING_FREES_ENOUGH = "nothing_frees_enough"
    # a set refused for room while victims are stopped for it (P4)
    PREEMPTION_NOMINATED = "preemption_nominated"
    # the webhook's own checks (W1)
    UNKNOWN_ANNOTATION = "unknown_annotation"
    TOO_MANY_SELECTOR_ENTRIES = "too_many_selector_entries"
    SELECTOR_ENTRY_TOO_LONG = "selector_entry_too_long"
    TOO_MANY_TOLERATIONS = "too_many_tolerations"
    TOLERATION_TOO_LONG = "toleration_too_long"
    HELD_DEVICE_NOT_FOUND = "held_device_not_found"
    DEVICE_BEING_DELETED = "device_being_deleted"
    TEMPLATE_BEING_DELETED = "template_being_deleted"
    TEMPLATE_NAMED_AS_HELD = "template_named_as_held"
    DEVICE_ATTACHED = "device_attached"
    NAME_TAKEN = "name_taken"
    CLASS_NOT_PERMITTED = "class_not_permitted"
    GPU_ENTRY_NOT_PERMITTED = "gpu_entry_not_permitted"
    SET_NEEDS = "set_needs"
    NO_ROOM_FOR_SET = "no_room_for_set"
    SAME_NAME_CONFLICT = "same_name_conflict"
    # H4: a set kept for a stopped VirtualMachine
    DEVICE_KEPT = "device_kept"
    KEPT_FOR_VM = "kept_for_vm"
    # the webhook's fair share per tenant
    TENANT_BUSY = "tenant_busy"
    BUDGET_IN_FLIGHT = "budget_in_flight"
    # the webhook's steps on the API server (W1's live read, W3, W4)
    VMI_EXISTS = "vmi_exists"
    NAME_UNCONFIRMED = "name_unconfirmed"
    DEVICE_MALFORMED = "device_malformed"
    DEVICE_DELETED = "device_deleted"
    ATTACHMENT_REFUSED = "attachment_refused"
    DEVICE_KEPT_CHANGING = "device_kept_changing"
    NOT_BOUND_IN_TIME = "not_bound_in_time"
    BINDER_REFUSED = "binder_refused"
    DEVICE_DISAPPEARED = "device_disappeared"
    API_INVALID = "api_invalid"
    API_THROTTLED = "api_throttled"
    API_FORBIDDEN = "api_forbidden"
    API_UNAVAILABLE = "api_unavailable"
    # the webhook's ResourceClaim of a device-mode set (DR5, W4, W5)
    DEVICE_UNRECORDED = "device_unrecorded"
    CLAIM_NAME_TAKEN = "claim_name_taken"
    CLAIM_BEING_DELETED = "claim_being_deleted"
    CLAIM_IN_USE = "claim_in_use"
    CLAIM_OVER_QUOTA = "claim_over_quota"
    # the webhook's transport and decoder (W6), and its own availability
    WRONG_MEDIA_TYPE = "wrong_media_type"
    BODY_TOO_LARGE = "body_too_large"
    BODY_NOT_JSON = "body_not_json"
    NOT_A_REVIEW = "not_a_review"
    NOT_A_VMI = "not_a_vmi"
    NOT_A_CREATE = "not_a_create"
    DRY_RUN_NOT_BOOLEAN = "dry_run_not_boolean"
    MALFORMED_METADATA = "malformed_metadata"
    INVALID_ANNOTATIONS = "invalid_annotations"
    INVALID_VMI = "invalid_vmi"
    NO_NAME = "no_name"
    NOT_SYNCED = "not_synced"
    SHUTTING_DOWN = "shutting_down"
    ADMISSION_TIMED_OUT = "admission_timed_out"
    ADMISSION_CRASHED = "admission_crashed"
    # priority as Kubernetes computes it (P1)
    PRIORITY_CLASS_NOT_FOUND = "priority_class_not_found"
    # the waiting line (P5)
    BEHIND_IN_LINE = "behind_in_line"
    NODE_RESERVED = "node_reserved"
    WAITS_IN_LINE = "waits_in_line"

    @property
    def category(self) -> Category:
        """The code's `Category` (see there). Every code has one (`_CATEGORY` lists them
        all; a unit test iterates `Code`), so a code added without one fails that test
        instead of answering 403 silently. Raises KeyError for such a code."""
        return _CATEGORY[self]


_CATEGORY: dict[Code, Category] = {
    **{c: Category.POLICY for c in (
        Code.NOT_ENTITLED, Code.BUDGET_EXHAUSTED, Code.NO_FREE_UNIT, Code.NODE_GONE,
        Code.CORDONED, Code.NOT_READY, Code.NOT_KUBEVIRT_SCHEDULABLE, Code.TAINTS_NOT_TOLERATED,
        Code.CLASSES_NOT_SERVED, Code.SELECTOR_MISMATCH, Code.LOST_CAPACITY, Code.NO_ROOM,
        Code.NO_DEVICE_GROUP, Code.CLASS_PROBLEM,
        Code.NO_NODE_SERVES, Code.NO_ELIGIBLE_NODE, Code.DEVICE_BEING_DELETED,
        Code.DEVICE_ATTACHED, Code.CLASS_NOT_PERMITTED, Code.GPU_ENTRY_NOT_PERMITTED,
        Code.SET_NEEDS, Code.NO_ROOM_FOR_SET, Code.VMI_EXISTS, Code.DEVICE_MALFORMED,
        Code.DEVICE_DELETED, Code.BINDER_REFUSED, Code.DEVICE_KEPT, Code.KEPT_FOR_VM)},
    **{c: Category.INVALID for c in (
        Code.DEVICE_NOT_FOUND, Code.DEVICE_LISTED_TWICE, Code.NO_DEVICES, Code.CLASS_NOT_FOUND,
        Code.WRONG_NAMESPACE, Code.MIXED_MODES, Code.UNKNOWN_ANNOTATION, Code.TOO_MANY_SELECTOR_ENTRIES,
        Code.SELECTOR_ENTRY_TOO_LONG, Code.TOO_MANY_TOLERATIONS, Code.TOLERATION_TOO_LONG,
        Code.HELD_DEVICE_NOT_FOUND, Code.TEMPLATE_NAMED_AS_HELD, Code.NAME_TAKEN,
        Code.ATTACHMENT_REFUSED, Code.API_INVALID)},
    **{c: Category.UNAVAILABLE for c in (
        Code.LEDGERS_REFUSED, Code.TEMPLATE_BEING_DELETED, Code.SAME_NAME_CONFLICT,
        Code.NAME_UNCONFIRMED, Code.DEVICE_KEPT_CHANGING, Code.NOT_BOUND_IN_TIME,
        Code.DEVICE_DISAPPEARED, Code.API_UNAVAILABLE)},
    **{c: Category.THROTTLED for c in (
        Code.TENANT_BUSY, Code.BUDGET_IN_FLIGHT, Code.API_THROTTLED)},
    **{c: Category.MALFORMED for c in (
        Code.BODY_NOT_JSON, Code.NOT_A_REVIEW, Code.NOT_A_VMI, Code.NOT_A_CREATE,
        Code.DRY_RUN_NOT_BOOLEAN)},
    **{c: Category.INVALID for c in (
        Code.MALFORMED_METADATA, Code.INVALID_ANNOTATIONS, Code.INVALID_VMI, Code.NO_NAME)},
    **{c: Category.UNAVAILABLE for c in (
        Code.NOT_SYNCED, Code.SHUTTING_DOWN, Code.ADMISSION_TIMED_OUT)},
    Code.WRONG_MEDIA_TYPE: Category.MEDIA_TYPE,
    Code.BODY_TOO_LARGE: Category.TOO_LARGE,
    Code.API_FORBIDDEN: Category.INTERNAL,
    **{c: Category.UNAVAILABLE for c in (
        Code.DEVICE_UNRECORDED, Code.CLAIM_BEING_DELETED, Code.CLAIM_IN_USE)},
    **{c: Category.POLICY for c in (Code.CLAIM_NAME_TAKEN, Code.CLAIM_OVER_QUOTA)},
    Code.ADMISSION_CRASHED: Category.INTERNAL,
    Code.PRIORITY_CLASS_NOT_FOUND: Category.POLICY,
    **{c: Category.UNAVAILABLE for c in (Code.BEHIND_IN_LINE, Code.NODE_RESERVED, Code.WAITS_IN_LINE)},
    **{c: Category.POLICY for c in (
        Code.PREEMPTOR_NEVER, Code.FITS_WITHOUT_PREEMPTION, Code.NOT_REFUSED_FOR_ROOM,
        Code.NO_ELIGIBLE_VICTIM, Code.NOTHING_FREES_ENOUGH)},
    Code.PREEMPTION_NOMINATED: Category.UNAVAILABLE,
    Code.RECORD_TAINTED: Category.POLICY,
}
"""Every `Code`'s `Category` (no default: see `Code.category`)."""


class Reason:
    """Base of every reason: `code` (class-level), `category` (the code's), `render()` the
    English wording (`str()` gives the same)."""

    __slots__ = ()
    code: ClassVar[Code]

    @property
    def category(self) -> Category:
        return self.code.category

    def render(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.render()


def plural(word: str, items: Sequence[str]) -> str:
    """"<word> a" for one item, "<word>es a, b" for more (`word` takes -es: "class")."""
    return f"{word} {items[0]}" if len(items) == 1 else f"{word}es {', '.join(items)}"
