"""Immutable value types of the GPU API (docs/contract.md §2).

Every type is a frozen, slotted dataclass; mappings are stored as sorted tuples of pairs so
values hash and compare by content. Parsers from Kubernetes objects live in `model.parse`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Mapping

from model.device.dra import DeviceRef, DeviceSet, SliceDevice
from model.priority import DEFAULT_PRIORITY, ClassPreemption, Priority, PriorityScope
from model.reasons import DRA_DEVICES_SUFFIX, Code, Cordoned, NotKubevirtSchedulable, NotReady, Reason

GROUP = "gpu.cozystack.io"
VERSION = "v1alpha1"
TEMPLATE_FOR_LABEL = "gpu.cozystack.io/template-for"
DEVICES_ANNOTATION = "gpu.cozystack.io/devices"
TEMPLATES_ANNOTATION = "gpu.cozystack.io/templates"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ADMISSION_ANNOTATION = "gpu.cozystack.io/admission"
"""Set by the webhook on every VMI it admits: the admission id also written into each
device's `status.attachedTo.admission`, linking the VMI incarnation to its attachments."""
KUBEVIRT_SCHEDULABLE_LABEL = "kubevirt.io/schedulable"
"""KubeVirt puts `kubevirt.io/schedulable: "true"` into every launcher Pod's nodeSelector (B3)."""
DRA_QUOTA_SUFFIX = DRA_DEVICES_SUFFIX
"""ResourceQuota counts DRA devices of a DeviceClass under `<deviceClassName>` + this suffix
(Kubernetes' quota for `resource.k8s.io`, and the budget key of a device-mode class, DR1)."""
HARD_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects kube-scheduler enforces (PreferNoSchedule only scores) (B3)."""

Labels = tuple[tuple[str, str], ...]
"""A label map frozen as a tuple of (key, value) pairs sorted by key."""


DeviceKey = tuple[str, str]
"""(namespace, name) of a GPUDevice (`GPUDevice.key`): the identity used by every index and
message."""

RequestKey = tuple[str, str]
"""(namespace, `status.bindRequest.id`) of a request: the set of devices carrying that id."""

VMIKey = tuple[str, str]
"""(namespace, name) of a VirtualMachineInstance."""


def freeze_labels(labels: Mapping[str, str] | None) -> Labels:
    """Return `labels` as a sorted tuple of pairs (the frozen form used by every type)."""
    return tuple(sorted((labels or {}).items()))


class OnCordon(str, Enum):
    """GPUClass `spec.onCordon`: what a cordon of its node does to a held device (B5)."""

    MOVE = "Move"
    STAY = "Stay"


class Phase(str, Enum):
    """GPUDevice `status.phase`: Pending (no node) or Bound (to `status.nodeName`)."""

    PENDING = "Pending"
    BOUND = "Bound"


class Result(str, Enum):
    """`status.bindRequest.result` written by the binder (B1)."""

    SUCCEEDED = "Succeeded"
    REFUSED = "Refused"


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """One `matchExpressions` entry of a LabelSelector: operator In, NotIn, Exists, DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes LabelSelector (`matchLabels` + `matchExpressions`); empty matches all."""

    match_labels: Labels = ()
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | Labels) -> bool:
        """True when `labels` (a mapping or frozen pairs) satisfy every `matchLabels` pair and
        every expression, with Kubernetes semantics: `In` needs the key with one of `values`,
        `NotIn` matches an absent key too, `Exists`/`DoesNotExist` look at the key only. An
        unknown operator matches nothing (fail closed). The empty selector matches all."""
        have = labels if isinstance(labels, Mapping) else dict(labels)
        for key, value in self.match_labels:
            if have.get(key) != value:
                return False
        for req in self.match_expressions:
            op = req.operator
            if op == "In":
                if req.key not in have or have[req.key] not in req.values:
                    return False
            elif op == "NotIn":
                if req.key in have and have[req.key] in req.values:
                    return False
            elif op == "Exists":
                if req.key not in have:
                    return False
            elif op == "DoesNotExist":
                if req.key in have:
                    return False
            else:
                return False
        return True


def labels_include(labels: Mapping[str, str], required: Labels) -> bool:
    """True when `labels` carry every (key, value) pair of `required` (a nodeSelector)."""
    for key, value in required:
        if labels.get(key) != value:
            return False
    return True


def dra_resource_name(device_class_name: str) -> str:
    """The resource key a device-mode class counts under: `<deviceClassName>.deviceclass.
    resource.k8s.io/devices`, the name ResourceQuota gives a DeviceClass's devices (so a
    tenant's budget of a device-mode class is that quota, DR1). Node capacity of this key is
    the node's devices of the DeviceClass (`Node.allocatable`, filled in by the cache)."""
    return device_class_name + DRA_QUOTA_SUFFIX


@dataclass(frozen=True, slots=True)
class GPUClass:
    """A GPUClass (cluster-scoped): the extended resource it names and where it may run.

    `node_selector` are labels a node must carry to serve the class; `namespace_selector`
    None means every namespace is entitled.

    Device mode (DR1): `device_class_name` names a DeviceClass (`spec.deviceClassName`);
    `resource_name` is then `dra_resource_name(device_class_name)` (budget and count key).
    `selectors` are the class's own CEL expressions (`spec.selectors[].cel.expression`) a
    device must also match; `match_attribute` is `spec.topology.matchAttribute` (may hold
    `{size}`, DR3). `keep_set_for` is `spec.keepSetFor` (H4; None: off). `problem` is set
    when the object is readable but cannot serve (both or neither of resourceName and
    deviceClassName, a DeviceClass that does not exist, a selector that does not compile):
    its text is the class's condition and the refusal of its VMIs. `preemption` is
    `spec.preemption` (P2): whether its running sets may yield to a higher-priority set.
    """

    name: str
    resource_name: str
    on_cordon: OnCordon = OnCordon.MOVE
    node_selector: Labels = ()
    namespace_selector: LabelSelector | None = None
    device_class_name: str | None = None
    selectors: tuple[str, ...] = ()
    match_attribute: str | None = None
    keep_set_for: timedelta | None = None
    problem: str | None = None
    preemption: ClassPreemption = ClassPreemption.LOWER_PRIORITY

    @property
    def device_mode(self) -> bool:
        """True for a device-mode class (`spec.deviceClassName`, DR1)."""
        return self.device_class_name is not None


@dataclass(frozen=True, slots=True)
class Taint:
    """One `spec.taints` entry of a Node: key, value (may be empty) and effect (NoSchedule,
    PreferNoSchedule or NoExecute)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    """One `spec.tolerations` entry of a VMI (copied into the bind request, B3): operator
    `Equal` (default) or `Exists`; an empty key with `Exists` tolerates every taint; an empty
    effect tolerates every effect."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' ToleratesTaint: effect matches (or is empty), and for `Exists` the key
        matches (or is empty), for `Equal` key and value match. Unknown operators tolerate
        nothing (fail closed)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        if self.operator == "Equal":
            return bool(self.key) and self.key == taint.key and self.value == taint.value
        return False


def untolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> list[Taint]:
    """The NoSchedule/NoExecute taints of `taints` that no toleration tolerates (B3)."""
    return [t for t in taints if t.effect in HARD_TAINT_EFFECTS
            and not any(tol.tolerates(t) for tol in tolerations)]


_NO_DEVICES = DeviceSet()


@dataclass(frozen=True, slots=True)
class Node:
    """A core Node as the binder sees it: labels, `status.allocatable` of extended resources
    (integers, units of devices), whether it is cordoned (`spec.unschedulable`), whether its
    `Ready` condition is True, its taints, and `foreign`: units per extended resource that
    Pods on it request (kube-scheduler's effective requests) beyond what the launcher Pods'
    Bound, attached devices already count there (filled in by the cache from the Pod
    informer and the binder's own records, not from the Node object; capacity §2, W7;
    `model.foreign`)."""

    name: str
    labels: Labels = ()
    allocatable: tuple[tuple[str, int], ...] = ()
    unschedulable: bool = False
    ready: bool = True
    taints: tuple[Taint, ...] = ()
    foreign: tuple[tuple[str, int], ...] = ()
    class_devices: tuple[tuple[str, tuple[SliceDevice, ...]], ...] = ()
    """Device mode (DR1): per device-mode GPUClass name (sorted), the node's devices of the
    current pool generations matching its DeviceClass's and its own selectors (sorted by
    ref). Filled in by the cache from ResourceSlices; empty in count mode."""
    taken_devices: frozenset[str] = frozenset()
    """Device mode (DR2): names of this node's devices some ResourceClaim's allocation lists
    or a NoSchedule/NoExecute device taint covers (the binder's own records are not in it:
    the snapshot adds them). The devices of `class_devices` among them that no Bound record
    names are also counted in `foreign` under the class's resource."""
    foreign_claimed: frozenset[str] = frozenset()
    """Device mode (DR2): those of `taken_devices` a claim the binder did not make allocates
    (an administrator's: no `app.kubernetes.io/managed-by: gpu-binder`). A device a set
    records is free for that set though a claim allocates it (its own claim, DR5) unless
    it is here: then someone else uses it, and the set is placed anew."""

    def __post_init__(self) -> None:
        # each class's devices as a `DeviceSet` (the DRA index makes them; a tuple given
        # here becomes one), so what decisions work out of them lives with the node
        if self.class_devices and not all(type(d) is DeviceSet for _, d in self.class_devices):
            object.__setattr__(self, "class_devices",
                               tuple((c, DeviceSet.of(d)) for c, d in self.class_devices))

    def devices_of(self, class_name: str) -> DeviceSet:
        """The devices of device-mode class `class_name` on this node (empty when none), with
        their names, topology view and layouts (`model.device.dra.DeviceSet`)."""
        for name, devices in self.class_devices:
            if name == class_name:
                return devices  # type: ignore[return-value]
        return _NO_DEVICES

    @property
    def kubevirt_schedulable(self) -> bool:
        """True when the node carries `kubevirt.io/schedulable=true` (KubeVirt's label, B3)."""
        for key, value in self.labels:
            if key == KUBEVIRT_SCHEDULABLE_LABEL:
                return value == "true"
        return False

    def placement_reasons(self) -> list[Reason]:
        """The request-independent B3 failures of this node (`Cordoned`, `NotReady`,
        `NotKubevirtSchedulable`); empty when none."""
        out: list[Reason] = []
        if self.unschedulable:
            out.append(Cordoned())
        if not self.ready:
            out.append(NotReady())
        if not self.kubevirt_schedulable:
            out.append(NotKubevirtSchedulable(KUBEVIRT_SCHEDULABLE_LABEL))
        return out

    def allocatable_of(self, resource_name: str) -> int:
        """Allocatable units of `resource_name` on this node (0 when not advertised)."""
        for name, value in self.allocatable:
            if name == resource_name:
                return value
        return 0


@dataclass(frozen=True, slots=True)
class Namespace:
    """A tenant namespace: its labels decide entitlement (GPUClass `namespaceSelector`)."""

    name: str
    labels: Labels = ()


@dataclass(frozen=True, slots=True)
class Attachment:
    """`status.attachedTo`: the one VMI a device is reserved for, and since when (UTC).

    `admission` is the id of the one admission that wrote it (unique per webhook call that
    attached the device; the VMI it admits carries it as `ADMISSION_ANNOTATION`), None on
    attachments written before admission ids existed. `uid` is the uid of the VMI incarnation
    it belongs to, recorded by housekeeping once that VMI was seen (H2), else None.

    H4: `owner` is the uid of the VirtualMachine that owned the admitted VMI (its controller
    ownerReference at CREATE, recorded by the webhook), None for a bare VMI. `kept_until` is
    set by housekeeping once that VMI is gone while its VM still exists and every class of
    the set has `keepSetFor`: until then the set stays Bound and attached, kept for that VM
    (only a VMI owned by the VM with uid `owner` may take it, W4).
    """

    vmi: str
    since: datetime
    admission: str | None = None
    uid: str | None = None
    owner: str | None = None
    kept_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class BindRequest:
    """`status.bindRequest`: the webhook writes id..node_selector and tolerations (the VMI's
    `spec.tolerations`, B3), the binder result, message, code and node (B8). `code` is the
    refusal's `model.reasons.Code` beside its rendered `message` (Refused only); None when
    Succeeded, when written by a replica older than the field, or when it names a code this
    replica does not know (a newer one's): readers then treat the refusal as a policy one,
    as before the field existed. `priority` is the VMI's priority as the webhook resolved
    it at admission (P1: `priority`, `preemptionPolicy`, `priorityClassName`); the default
    (0, PreemptLowerPriority) when absent, as written by a replica older than the field."""

    id: str
    vmi: str
    devices: tuple[str, ...]
    requested_at: datetime | None = None
    node_selector: Labels = ()
    result: Result | None = None
    message: str | None = None
    node: str | None = None
    tolerations: tuple[Toleration, ...] = ()
    code: Code | None = None
    priority: Priority = DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """`status` of a GPUDevice."""

    phase: Phase = Phase.PENDING
    node_name: str | None = None
    bound_at: datetime | None = None
    attached_to: Attachment | None = None
    bind_request: BindRequest | None = None
    device: DeviceRef | None = None
    """Device mode (DR2): `status.device` `{driver, pool, device}`, the exact device of its
    node this GPUDevice holds while Bound (written with the placement by the binder)."""


@dataclass(frozen=True, slots=True)
class GPUDevice:
    """A GPUDevice in a tenant namespace. `template_for` is the VMI name of a template
    device (label `gpu.cozystack.io/template-for`), None for a held device."""

    namespace: str
    name: str
    class_name: str
    template_for: str | None = None
    status: DeviceStatus = field(default_factory=DeviceStatus)
    resource_version: str | None = None
    uid: str | None = None
    created_at: datetime | None = None
    deleting: bool = False
    """`metadata.deletionTimestamp` is set (a finalizer keeps it): still counts as using its
    unit while Bound, but no new VMI may take it (W1)."""
    bound_node: str | None = field(init=False, repr=False, compare=False)
    """The node this device is Bound to, or None when Pending (derived from `status` when
    the value is made: read on every index update and decision, so not a property)."""

    def __post_init__(self) -> None:
        st = self.status
        object.__setattr__(self, "bound_node", st.node_name if st.phase is Phase.BOUND else None)

    @property
    def key(self) -> DeviceKey:
        """(namespace, name): the identity used by every index and message."""
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Budget:
    """A tenant's cap on Bound (plus being-bound) devices of one resource: one ResourceQuota's
    `spec.hard["requests.<resourceName>"]` in the namespace. `scope` None: the quota applies
    to every set (the smallest such hard governs); else only to the sets whose recorded
    PriorityClass matches it, counting only their devices (P1, a `scopeSelector` on
    `PriorityClass`, as kube-apiserver applies it to Pods)."""

    namespace: str
    resource_name: str
    hard: int
    scope: PriorityScope | None = None
