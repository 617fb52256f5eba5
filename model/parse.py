"""Parsers from Kubernetes objects (plain dicts as the API returns them) to model values,
the VMI annotation parser (W1), and the inverse of the GPUDevice status for writers.

Every parser raises `ParseError` naming the object ("GPUDevice tenant-a/gpu-1") and the field
("spec.class") of the first problem found; nothing else escapes for malformed input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

from model.device.dra import DeviceRef
from model.reasons import Code
from model.priority import (DEFAULT_PRIORITY, ClassPreemption, PreemptionPolicy, Priority, PriorityClassInfo,
                            PriorityScope, ScopeRequirement)
from model.types import (
    DEVICES_ANNOTATION,
    DRA_QUOTA_SUFFIX,
    TEMPLATE_FOR_LABEL,
    TEMPLATES_ANNOTATION,
    Attachment,
    BindRequest,
    Budget,
    DeviceStatus,
    GPUClass,
    GPUDevice,
    LabelSelector,
    Labels,
    Namespace,
    Node,
    OnCordon,
    Phase,
    Result,
    SelectorRequirement,
    Taint,
    Toleration,
    dra_resource_name,
    freeze_labels,
)

MAX_ANNOTATION_BYTES = 4096
"""Largest accepted value of either VMI annotation, in bytes of UTF-8."""

MAX_SET_DEVICES = 64
"""Most devices (held plus template) one VMI may ask for."""

DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes object name (DNS-1123 subdomain) without its 253-character cap: `fullmatch` it."""
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class ParseError(ValueError):
    """A Kubernetes object or annotation that cannot be turned into a model value.

    `what` names the object ("GPUDevice tenant-a/gpu-1"), `field` the path inside it
    ("spec.class"), `problem` what is wrong ("required"); `str()` is "what: field: problem".
    """

    def __init__(self, what: str, field: str, problem: str) -> None:
        super().__init__(f"{what}: {field}: {problem}")
        self.what = what
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class VMIAsk:
    """What a VMI asks for by annotation (§2 VMI): held device names in annotation order and
    (class name, count) pairs of template devices, in annotation order."""

    held: tuple[str, ...]
    templates: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        """Number of devices of the set (held plus every template count)."""
        return len(self.held) + sum(n for _, n in self.templates)


# --- small readers --------------------------------------------------------------------------


class _Reader:
    """Typed access to one object's fields, raising ParseError that names the object."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, field: str, problem: str) -> ParseError:
        return ParseError(self.what, field, problem)

    def obj(self, value: Any, field: str, *, required: bool = False) -> Mapping[str, Any]:
        if value is None:
            if required:
                raise self.fail(field, "required")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(field, f"must be an object, got {type(value).__name__}")
        return value

    def text(self, value: Any, field: str, *, required: bool = False) -> str | None:
        if value is None or (required and value == ""):
            if required:
                raise self.fail(field, "required")
            return None
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, got {type(value).__name__}")
        return value

    def labels(self, value: Any, field: str) -> Labels:
        m = self.obj(value, field)
        for k, v in m.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise self.fail(f"{field}[{k}]", "keys and values must be strings")
        return freeze_labels(m)

    def time(self, value: Any, field: str, *, required: bool = False) -> datetime | None:
        text = self.text(value, field, required=required)
        if text is None:
            return None
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise self.fail(field, f"not an RFC 3339 time: {text!r}") from None
        if when.tzinfo is None:
            raise self.fail(field, f"RFC 3339 time without a zone: {text!r}")
        return when.astimezone(timezone.utc)


def _metadata(obj: Any, kind: str, *, namespaced: bool) -> tuple[_Reader, Mapping[str, Any]]:
    """The reader named after `obj` and its metadata; raises ParseError for a missing name."""
    if not isinstance(obj, Mapping):
        raise ParseError(kind, "(object)", f"must be an object, got {type(obj).__name__}")
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name, ns = meta.get("name"), meta.get("namespace")
    label = name if isinstance(name, str) and name else "<unnamed>"
    if namespaced:
        label = f"{ns if isinstance(ns, str) and ns else '<no namespace>'}/{label}"
    reader = _Reader(f"{kind} {label}")
    reader.text(name, "metadata.name", required=True)
    if namespaced:
        reader.text(ns, "metadata.namespace", required=True)
    return reader, meta


def parse_quantity_int(value: Any) -> int | None:
    """A Kubernetes quantity ("4", 4, "2k", "1Gi", "3500m", "1e3") as an int, or None when it
    is not a whole number or not a quantity at all. Never raises."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?", value.strip())
    if not m:
        return None
    number, suffix = m.group(1), m.group(2) or ""
    scale = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "Pi": 2**50, "Ei": 2**60}
    try:
        if suffix[:1] in ("e", "E"):
            amount = Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        else:
            amount = Decimal(number) * scale[suffix]
    except (InvalidOperation, OverflowError, ValueError):
        return None
    if amount != amount.to_integral_value():
        return None
    return int(amount)


# --- objects --------------------------------------------------------------------------------


def _parse_label_selector(value: Any, reader: _Reader, field: str) -> LabelSelector:
    """A LabelSelector object (`matchLabels`, `matchExpressions`); raises ParseError on unknown
    operators, `In`/`NotIn` without values or `Exists`/`DoesNotExist` with values."""
    m = reader.obj(value, field)
    match_labels = reader.labels(m.get("matchLabels"), f"{field}.matchLabels")
    reqs = []
    for f, key, op, values in _match_expressions(reader, m, field, "key"):
        _check_arity(reader, f, op, values)
        reqs.append(SelectorRequirement(key, op, values))
    return LabelSelector(match_labels, tuple(reqs))


def _match_expressions(reader: _Reader, container: Mapping[str, Any], field: str,
                       key_field: str) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """`container.matchExpressions` of a label or scope selector as (field path, the
    `key_field` of the expression, operator, values); raises ParseError for a list that is
    not one, a missing key or operator, an unknown operator or values that are not strings
    (each caller checks the operator's values count: `_check_arity`)."""
    exprs = container.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise reader.fail(f"{field}.matchExpressions", "must be a list")
    out = []
    for i, e in enumerate(exprs):
        f = f"{field}.matchExpressions[{i}]"
        e = reader.obj(e, f, required=True)
        key = reader.text(e.get(key_field), f"{f}.{key_field}", required=True)
        op = reader.text(e.get("operator"), f"{f}.operator", required=True)
        if op not in _SELECTOR_OPERATORS:
            raise reader.fail(f"{f}.operator", f"unknown operator {op!r}")
        values = e.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise reader.fail(f"{f}.values", "must be a list of strings")
        out.append((f, key, op, tuple(values)))
    return out


def _check_arity(reader: _Reader, f: str, op: str, values: tuple[str, ...]) -> None:
    """`In`/`NotIn` need values, `Exists`/`DoesNotExist` take none; raises ParseError."""
    if op in ("In", "NotIn") and not values:
        raise reader.fail(f"{f}.values", f"required for operator {op}")
    if op in ("Exists", "DoesNotExist") and values:
        raise reader.fail(f"{f}.values", f"must be empty for operator {op}")


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s|ms)")


def parse_duration(value: str) -> timedelta:
    """A Go/metav1 duration ("30m", "1h30m", "45s", "1.5h", "500ms") → timedelta. Raises
    ValueError for an empty, negative or malformed text."""
    text = value.strip() if isinstance(value, str) else ""
    pos, total = 0, 0.0
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            break
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise ValueError(f"not a duration like 30m or 1h30m: {value!r}")
    return timedelta(seconds=total)


def parse_gpu_class(obj: dict) -> GPUClass:
    """A GPUClass object → GPUClass. Raises ParseError ("GPUClass h100: spec.onCordon: ...")
    for a missing name, an onCordon other than Move/Stay, a malformed nodeSelector/
    namespaceSelector, selectors or keepSetFor.

    DR1: exactly one of `spec.resourceName` (count mode) and `spec.deviceClassName` (device
    mode). Both or neither is not a ParseError: the class is returned with `problem` saying
    so (it serves nothing; its VMIs are refused with that text, and the controller shows it as
    a condition), so one bad class never hides from the tenants what is wrong."""
    r, meta = _metadata(obj, "GPUClass", namespaced=False)
    spec = r.obj(obj.get("spec"), "spec", required=True)
    resource = r.text(spec.get("resourceName"), "spec.resourceName")
    device_class = r.text(spec.get("deviceClassName"), "spec.deviceClassName")
    on_cordon = r.text(spec.get("onCordon"), "spec.onCordon") or OnCordon.MOVE.value
    if on_cordon not in (OnCordon.MOVE.value, OnCordon.STAY.value):
        raise r.fail("spec.onCordon", f"must be Move or Stay, got {on_cordon!r}")
    ns_sel = spec.get("namespaceSelector")
    selectors: list[str] = []
    raw_selectors = spec.get("selectors")
    if raw_selectors is not None and not isinstance(raw_selectors, list):
        raise r.fail("spec.selectors", "must be a list of {cel: {expression}}")
    for i, sel in enumerate(raw_selectors or ()):
        cel = r.obj(r.obj(sel, f"spec.selectors[{i}]").get("cel"), f"spec.selectors[{i}].cel", required=True)
        selectors.append(r.text(cel.get("expression"), f"spec.selectors[{i}].cel.expression", required=True))
    topology = r.obj(spec.get("topology"), "spec.topology")
    match_attribute = r.text(topology.get("matchAttribute"), "spec.topology.matchAttribute") or None
    preemption = r.text(spec.get("preemption"), "spec.preemption") or ClassPreemption.LOWER_PRIORITY.value
    if preemption not in tuple(ClassPreemption):
        raise r.fail("spec.preemption", f"must be LowerPriority or Never, got {preemption!r}")
    keep_text = r.text(spec.get("keepSetFor"), "spec.keepSetFor")
    keep = None
    if keep_text:
        try:
            keep = parse_duration(keep_text)
        except ValueError as e:
            raise r.fail("spec.keepSetFor", str(e)) from None
    problem = None
    if resource and device_class:
        problem = "sets both spec.resourceName and spec.deviceClassName: exactly one is allowed (DR1)"
    elif not resource and not device_class:
        problem = "sets neither spec.resourceName nor spec.deviceClassName: exactly one is required (DR1)"
    elif resource and (selectors or match_attribute):
        problem = "spec.selectors and spec.topology need spec.deviceClassName (device mode, DR1)"
    if device_class and not resource:
        resource = dra_resource_name(device_class)
    return GPUClass(
        name=meta["name"],
        resource_name=resource or "",
        on_cordon=OnCordon(on_cordon),
        node_selector=r.labels(spec.get("nodeSelector"), "spec.nodeSelector"),
        namespace_selector=None if ns_sel is None else _parse_label_selector(ns_sel, r, "spec.namespaceSelector"),
        device_class_name=device_class,
        selectors=tuple(selectors),
        match_attribute=match_attribute,
        keep_set_for=keep,
        problem=problem,
        preemption=ClassPreemption(preemption),
    )


def parse_node(obj: dict) -> Node:
    """A core Node → Node. `status.allocatable` keeps every entry whose quantity is a whole
    non-negative number (so "4" and "16Gi" are kept, "3500m" is dropped); `spec.unschedulable` is the
    cordon. Raises ParseError for a missing name or malformed labels/allocatable."""
    r, meta = _metadata(obj, "Node", namespaced=False)
    spec = r.obj(obj.get("spec"), "spec")
    status = r.obj(obj.get("status"), "status")
    alloc = r.obj(status.get("allocatable"), "status.allocatable")
    allocatable = []
    for key, q in alloc.items():
        n = parse_quantity_int(q)
        if isinstance(key, str) and n is not None and n >= 0:
            allocatable.append((key, n))
    unsched = spec.get("unschedulable", False)
    if not isinstance(unsched, bool):
        raise r.fail("spec.unschedulable", "must be a boolean")
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        raise r.fail("status.conditions", "must be a list")
    ready = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in conditions)
    raw_taints = spec.get("taints") or []
    if not isinstance(raw_taints, list):
        raise r.fail("spec.taints", "must be a list")
    taints = []
    for i, t in enumerate(raw_taints):
        t = r.obj(t, f"spec.taints[{i}]", required=True)
        taints.append(Taint(r.text(t.get("key"), f"spec.taints[{i}].key", required=True),
                            r.text(t.get("value"), f"spec.taints[{i}].value") or "",
                            r.text(t.get("effect"), f"spec.taints[{i}].effect", required=True)))
    return Node(
        name=meta["name"],
        labels=r.labels(meta.get("labels"), "metadata.labels"),
        allocatable=tuple(sorted(allocatable)),
        unschedulable=unsched,
        ready=ready,
        taints=tuple(taints),
    )


def parse_tolerations(value: Any, what: str = "VMI", field: str = "spec.tolerations") -> tuple[Toleration, ...]:
    """A `tolerations` list (VMI `spec.tolerations`, bindRequest `tolerations`) → Tolerations
    in list order. Raises ParseError (naming `what` and `field`) when it is not a list of
    objects with string key/operator/value/effect, or an operator is not Equal/Exists (B3)."""
    r = _Reader(what)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise r.fail(field, "must be a list")
    out = []
    for i, t in enumerate(value):
        f = f"{field}[{i}]"
        t = r.obj(t, f, required=True)
        op = r.text(t.get("operator"), f"{f}.operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise r.fail(f"{f}.operator", f"must be Equal or Exists, got {op!r}")
        out.append(Toleration(r.text(t.get("key"), f"{f}.key") or "", op,
                              r.text(t.get("value"), f"{f}.value") or "",
                              r.text(t.get("effect"), f"{f}.effect") or ""))
    return tuple(out)


def parse_permitted_host_devices(kubevirt: Any) -> frozenset[str]:
    """The resource names a KubeVirt CR permits as host devices: `resourceName` of every
    `spec.configuration.permittedHostDevices.pciHostDevices[]` and `mediatedDevices[]`
    entry (the kinds a VMI's `spec.domain.devices.gpus` may name). Malformed parts are
    skipped (never raises): what is not clearly permitted is not permitted."""
    out: set[str] = set()
    if not isinstance(kubevirt, Mapping):
        return frozenset()
    cur: Any = kubevirt
    for step in ("spec", "configuration", "permittedHostDevices"):
        cur = cur.get(step) if isinstance(cur, Mapping) else None
    if not isinstance(cur, Mapping):
        return frozenset()
    for kind in ("pciHostDevices", "mediatedDevices"):
        entries = cur.get(kind)
        for e in entries if isinstance(entries, list) else []:
            name = e.get("resourceName") if isinstance(e, Mapping) else None
            if isinstance(name, str) and name:
                out.add(name)
    return frozenset(out)


def parse_namespace(obj: dict) -> Namespace:
    """A core Namespace → Namespace (name and labels). Raises ParseError for a missing name."""
    r, meta = _metadata(obj, "Namespace", namespaced=False)
    return Namespace(name=meta["name"], labels=r.labels(meta.get("labels"), "metadata.labels"))


def _parse_bind_request(r: _Reader, value: Any) -> BindRequest | None:
    if value is None:
        return None
    f = "status.bindRequest"
    m = r.obj(value, f)
    devices = m.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, str) and d for d in devices):
        raise r.fail(f"{f}.devices", "required: a list of device names")
    result = r.text(m.get("result"), f"{f}.result")
    if result is not None and result not in (Result.SUCCEEDED.value, Result.REFUSED.value):
        raise r.fail(f"{f}.result", f"must be Succeeded or Refused, got {result!r}")
    return BindRequest(
        id=r.text(m.get("id"), f"{f}.id", required=True),
        vmi=r.text(m.get("vmi"), f"{f}.vmi", required=True),
        devices=tuple(devices),
        requested_at=r.time(m.get("requestedAt"), f"{f}.requestedAt"),
        node_selector=r.labels(m.get("nodeSelector"), f"{f}.nodeSelector"),
        result=None if result is None else Result(result),
        message=r.text(m.get("message"), f"{f}.message"),
        node=r.text(m.get("node"), f"{f}.node") or None,
        tolerations=parse_tolerations(m.get("tolerations"), r.what, f"{f}.tolerations"),
        code=_code(r.text(m.get("code"), f"{f}.code")),
        priority=_priority(r, m, f),
    )


def _priority(r: _Reader, m: dict, f: str) -> Priority:
    """`bindRequest.priority`, `.preemptionPolicy`, `.priorityClassName` → Priority (P1);
    the default when all are absent (a replica older than the fields wrote it)."""
    value = m.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
        raise r.fail(f"{f}.priority", f"must be a 32-bit integer, got {value!r}")
    policy = r.text(m.get("preemptionPolicy"), f"{f}.preemptionPolicy") or PreemptionPolicy.PREEMPT_LOWER.value
    if policy not in tuple(PreemptionPolicy):
        raise r.fail(f"{f}.preemptionPolicy", f"must be PreemptLowerPriority or Never, got {policy!r}")
    name = r.text(m.get("priorityClassName"), f"{f}.priorityClassName") or None
    return Priority(value=value, policy=PreemptionPolicy(policy), class_name=name)


def _code(value: str | None) -> Code | None:
    """`bindRequest.code` → Code; None when absent (an older replica's refusal) or unknown
    (a newer replica's code): never a ParseError, so a device stays readable across an
    upgrade or a rollback (`BindRequest`)."""
    try:
        return Code(value) if value else None
    except ValueError:
        return None


def parse_gpu_device(obj: dict) -> GPUDevice:
    """A GPUDevice object → GPUDevice; times become aware UTC datetimes. Raises ParseError
    ("GPUDevice tenant-a/gpu-1: spec.class: required") for a missing name, namespace or class,
    an unknown phase or result, a Bound phase without nodeName, a bad time, or a malformed
    attachedTo/bindRequest."""
    r, meta = _metadata(obj, "GPUDevice", namespaced=True)
    spec = r.obj(obj.get("spec"), "spec", required=True)
    class_name = r.text(spec.get("class"), "spec.class", required=True)
    labels = r.labels(meta.get("labels"), "metadata.labels")
    status = r.obj(obj.get("status"), "status")
    phase = r.text(status.get("phase"), "status.phase") or Phase.PENDING.value
    if phase not in (Phase.PENDING.value, Phase.BOUND.value):
        raise r.fail("status.phase", f"must be Pending or Bound, got {phase!r}")
    node_name = r.text(status.get("nodeName"), "status.nodeName") or None
    if phase == Phase.BOUND.value and node_name is None:
        raise r.fail("status.nodeName", "required when phase is Bound")
    attached = None
    if status.get("attachedTo") is not None:
        a = r.obj(status.get("attachedTo"), "status.attachedTo")
        attached = Attachment(
            vmi=r.text(a.get("vmi"), "status.attachedTo.vmi", required=True),
            since=r.time(a.get("since"), "status.attachedTo.since", required=True),
            admission=r.text(a.get("admission"), "status.attachedTo.admission") or None,
            uid=r.text(a.get("uid"), "status.attachedTo.uid") or None,
            owner=r.text(a.get("owner"), "status.attachedTo.owner") or None,
            kept_until=r.time(a.get("keptUntil"), "status.attachedTo.keptUntil"),
        )
    return GPUDevice(
        namespace=meta["namespace"],
        name=meta["name"],
        class_name=class_name,
        template_for=dict(labels).get(TEMPLATE_FOR_LABEL),
        status=DeviceStatus(
            phase=Phase(phase),
            node_name=node_name,
            bound_at=r.time(status.get("boundAt"), "status.boundAt"),
            attached_to=attached,
            bind_request=_parse_bind_request(r, status.get("bindRequest")),
            device=_parse_device_record(r, status.get("device")),
        ),
        resource_version=r.text(meta.get("resourceVersion"), "metadata.resourceVersion"),
        uid=r.text(meta.get("uid"), "metadata.uid"),
        created_at=r.time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        deleting=meta.get("deletionTimestamp") is not None,
    )


def _parse_device_record(r: _Reader, value: Any) -> DeviceRef | None:
    """`status.device` `{driver, pool, device}` (DR2) → DeviceRef; None when absent."""
    if value is None:
        return None
    m = r.obj(value, "status.device")
    return DeviceRef(r.text(m.get("driver"), "status.device.driver", required=True),
                     r.text(m.get("pool"), "status.device.pool", required=True),
                     r.text(m.get("device"), "status.device.device", required=True))


_APPLIES_TO_LAUNCHERS = {"NotTerminating": True, "NotBestEffort": True, "Terminating": False,
                         "BestEffort": False, "CrossNamespacePodAffinity": False,
                         "VolumeAttributesClass": False}
"""Whether a ResourceQuota scope other than PriorityClass matches a VMI's launcher Pod: it
sets no `activeDeadlineSeconds` (NotTerminating), requests CPU and memory (NotBestEffort),
and the binder does not model Pod affinity across namespaces nor PVC scopes (they limit
Pods and claims, which kube-apiserver itself checks at the launcher's creation). A scope
not listed (a newer Kubernetes') is taken as matching: fail closed."""


def _quota_scope(r: _Reader, spec: Mapping[str, Any]) -> tuple[bool, PriorityScope | None]:
    """(whether the quota can apply to a VMI's set at all, its PriorityClass scope or None)
    from `spec.scopes` and `spec.scopeSelector.matchExpressions`, all of which must match
    (as kube-apiserver's quota evaluator reads them). Raises ParseError for a malformed
    list, an unknown operator, In/NotIn without values or Exists/DoesNotExist with some."""
    scopes = spec.get("scopes") or []
    if not isinstance(scopes, list) or not all(isinstance(x, str) for x in scopes):
        raise r.fail("spec.scopes", "must be a list of strings")
    reqs: list[ScopeRequirement] = []
    applies = True
    for name in scopes:
        if name == "PriorityClass":
            reqs.append(ScopeRequirement("Exists"))
        else:
            applies = applies and _APPLIES_TO_LAUNCHERS.get(name, True)
    selector = r.obj(spec.get("scopeSelector"), "spec.scopeSelector")
    for f, name, op, values in _match_expressions(r, selector, "spec.scopeSelector", "scopeName"):
        if name != "PriorityClass":
            applies = applies and _APPLIES_TO_LAUNCHERS.get(name, True)
            continue
        _check_arity(r, f, op, values)
        reqs.append(ScopeRequirement(op, values))
    return applies, (PriorityScope(tuple(reqs)) if reqs else None)


def parse_budgets(resource_quota: dict) -> list[Budget]:
    """A ResourceQuota → one Budget per `spec.hard["requests.<resourceName>"]` whose resource
    is an extended resource (contains "/"), and one per DRA device count
    `spec.hard["<deviceClassName>.deviceclass.resource.k8s.io/devices"]` (a device-mode
    class's budget, DR1; its resource is the key itself), in key order; other keys are
    ignored.

    Scopes (P1, docs/contract.md §3c): a `scopeSelector` on `PriorityClass` (In, NotIn,
    Exists, DoesNotExist; `spec.scopes: [PriorityClass]` is Exists) gives every Budget that
    `scope`: it applies only to sets whose recorded PriorityClass matches. A quota with a
    scope that never matches a VMI's launcher Pod (Terminating, BestEffort,
    CrossNamespacePodAffinity, VolumeAttributesClass) gives no Budget; NotTerminating and
    NotBestEffort always match. Raises ParseError for a missing name/namespace, a budget
    that is not a whole, non-negative quantity, or a malformed scope."""
    r, meta = _metadata(resource_quota, "ResourceQuota", namespaced=True)
    spec = r.obj(resource_quota.get("spec"), "spec")
    hard = r.obj(spec.get("hard"), "spec.hard")
    applies, scope = _quota_scope(r, spec)
    budgets = []
    for key in sorted(k for k in hard if isinstance(k, str)):
        if key.endswith(DRA_QUOTA_SUFFIX) and not key.startswith("requests."):
            resource = key  # DRA devices of a DeviceClass (DR1): the quota key is the resource
        elif key.startswith("requests.") and "/" in key:
            resource = key[len("requests."):]
        else:
            continue
        n = parse_quantity_int(hard[key])
        if n is None or n < 0:
            raise r.fail(f"spec.hard[{key}]", f"must be a whole, non-negative number, got {hard[key]!r}")
        budgets.append(Budget(meta["namespace"], resource, n, scope))
    return budgets if applies else []


def parse_priority_class(obj: dict) -> PriorityClassInfo:
    """A `scheduling.k8s.io/v1` PriorityClass → PriorityClassInfo (P1): `value` (required, a
    32-bit integer), `globalDefault` (default false), `preemptionPolicy` (default
    PreemptLowerPriority). Raises ParseError ("PriorityClass spot: value: ...") for a missing
    name or value, a value that is not a 32-bit integer, a globalDefault that is not a
    boolean or a preemptionPolicy other than PreemptLowerPriority/Never."""
    r, meta = _metadata(obj, "PriorityClass", namespaced=False)
    value = obj.get("value")
    if value is None:
        raise r.fail("value", "required")
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
        raise r.fail("value", f"must be a 32-bit integer, got {value!r}")
    default = obj.get("globalDefault", False)
    if default is None:
        default = False
    if not isinstance(default, bool):
        raise r.fail("globalDefault", f"must be a boolean, got {default!r}")
    policy = r.text(obj.get("preemptionPolicy"), "preemptionPolicy") or PreemptionPolicy.PREEMPT_LOWER.value
    if policy not in tuple(PreemptionPolicy):
        raise r.fail("preemptionPolicy", f"must be PreemptLowerPriority or Never, got {policy!r}")
    return PriorityClassInfo(meta["name"], value, default, PreemptionPolicy(policy))


# --- VMI annotations (W1) -------------------------------------------------------------------


def _split(value: Any, annotation: str) -> list[str]:
    r = _Reader("VMI")
    field = f"metadata.annotations[{annotation}]"
    if not isinstance(value, str):
        raise r.fail(field, "must be a string")
    if len(value.encode("utf-8")) > MAX_ANNOTATION_BYTES:
        raise r.fail(field, f"longer than {MAX_ANNOTATION_BYTES} bytes")
    if not value.strip():
        raise r.fail(field, "is empty")
    items = [item.strip() for item in value.split(",")]
    for item in items:
        if not item:
            raise r.fail(field, f"empty entry in {value!r}")
    return items


def _check_name(name: str, what: str, field: str) -> None:
    if len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        raise ParseError("VMI", field, f"invalid {what} {name!r}: not a DNS-1123 subdomain")


def parse_vmi_request(annotations: Mapping[str, str] | None) -> VMIAsk | None:
    """The GPU set a VMI asks for (§2 VMI, W1) from its annotations, or None when it has
    neither `gpu.cozystack.io/devices` ("gpu-a,gpu-b") nor `gpu.cozystack.io/templates`
    ("h100=2,l40s=1"). Whitespace around entries is ignored.

    Raises ParseError (what "VMI", field "metadata.annotations[<key>]") for: an annotation
    over 4 KiB, an empty annotation or entry, a name that is not a DNS-1123 subdomain, a
    duplicate device or class, a count that is not a positive integer, or more than 64 devices
    in total.
    """
    if not annotations:
        return None
    raw_devices = annotations.get(DEVICES_ANNOTATION)
    raw_templates = annotations.get(TEMPLATES_ANNOTATION)
    if raw_devices is None and raw_templates is None:
        return None
    held: list[str] = []
    templates: list[tuple[str, int]] = []
    if raw_devices is not None:
        field = f"metadata.annotations[{DEVICES_ANNOTATION}]"
        for name in _split(raw_devices, DEVICES_ANNOTATION):
            _check_name(name, "device name", field)
            if name in held:
                raise ParseError("VMI", field, f"device {name} listed twice")
            held.append(name)
    if raw_templates is not None:
        field = f"metadata.annotations[{TEMPLATES_ANNOTATION}]"
        for item in _split(raw_templates, TEMPLATES_ANNOTATION):
            class_name, sep, count_text = (part.strip() for part in item.partition("="))
            if not sep:
                raise ParseError("VMI", field, f"entry {item!r} is not <class>=<count>")
            _check_name(class_name, "class name", field)
            if not re.fullmatch(r"[0-9]+", count_text) or int(count_text) < 1:
                raise ParseError("VMI", field, f"count of class {class_name} must be a positive integer, got {count_text!r}")
            if any(c == class_name for c, _ in templates):
                raise ParseError("VMI", field, f"class {class_name} listed twice")
            templates.append((class_name, int(count_text)))
    ask = VMIAsk(tuple(held), tuple(templates))
    if ask.total > MAX_SET_DEVICES:
        raise ParseError("VMI", "metadata.annotations", f"asks for {ask.total} devices, more than {MAX_SET_DEVICES}")
    return ask


# --- the inverse, for writers ---------------------------------------------------------------


