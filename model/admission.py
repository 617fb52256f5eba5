"""The webhook's pure judgement of a VMI CREATE (docs/contract.md §4, W1 and W4) and the mutation
of an admitted VMI (§2 VMI). No I/O: the k8s adapter supplies the snapshot, the set of
live VMIs and the time, and carries out the writes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

from model.check import check_set, judge_set
from model.device.records import foreign_claimed_records
from model.device.tainted_records import tainted_records
from model.housekeeping import VMIs, judge
from model.nomination import hold_id, nomination_holds, yielding
from model.parse import VMIAsk
from model.priority import DEFAULT_PRIORITY, Priority, resolve_priority
from model.reasons import (BudgetInFlight, CannotPlace, ClassNotPermitted, Code, DeviceAttached, DeviceBeingDeleted,
                           DeviceKept, KeptForVM,
                           GpuEntryNotPermitted, HeldDeviceNotFound, NameTaken, NoRoomForSet, Reason,
                           SameNameConflict, SelectorEntryTooLong, SetNeeds, SetRefused,
                           TemplateBeingDeleted, TemplateNamedAsHeld, TolerationTooLong,
                           TooManySelectorEntries, TooManyTolerations, UnknownAnnotation)
from model.settings import resource_names
from model.snapshot import Order, Snapshot
from model.types import (ADMISSION_ANNOTATION, DEVICES_ANNOTATION, HOSTNAME_LABEL,
                         TEMPLATES_ANNOTATION, GPUDevice, Labels, Phase, Result, Toleration,
                         labels_include)

MAX_NAME = 253


def template_name(vmi: str, class_name: str, index: int) -> str:
    """Deterministic name of template device `index` (0-based) of `class_name` for `vmi`, so
    a retried admission finds it (W3 step 1): "<vmi>-<class>-<index>", shortened with a hash
    when over 253 characters."""
    name = f"{vmi}-{class_name}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:MAX_NAME - 11].rstrip('-.')}-{digest}"


def with_templates(snapshot: Snapshot, namespace: str, vmi: str, held: Iterable[str],
                   templates: Iterable[tuple[str, int]]) -> tuple[Snapshot, tuple[str, ...]]:
    """The snapshot with `vmi`'s template devices (`templates`: (class, count)) added as
    Pending devices under their W3 names (`template_name`) where they do not exist yet, and
    the set's device names: `held` first, then the templates'. What `explain` and the
    waiting line judge a set on before its devices are written."""
    names = list(held)
    new: list[GPUDevice] = []
    for class_name, count in templates:
        for i in range(count):
            name = template_name(vmi, class_name, i)
            names.append(name)
            if snapshot.device(namespace, name) is None:
                new.append(GPUDevice(namespace, name, class_name, template_for=vmi))
    return (snapshot.with_devices(new) if new else snapshot), tuple(names)


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    """What the webhook will reserve for one VMI: `held` device names, `templates` as
    (device name, class name) in a deterministic order, and `devices` = all names (held
    first). `node` is where W1 expects the set to fit (the binder decides for real)."""

    namespace: str
    vmi: str
    held: tuple[str, ...]
    templates: tuple[tuple[str, str], ...]
    node: str | None
    priority: Priority = DEFAULT_PRIORITY
    """The set's priority as resolved at admission (P1), what `status.bindRequest` records."""

    @property
    def devices(self) -> tuple[str, ...]:
        return self.held + tuple(n for n, _ in self.templates)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A W1 denial: `reason` is typed (`model.reasons`: its `code`, its `category` for the
    HTTP status, its data); `message` renders it, telling the user what to fix."""

    reason: Reason

    @property
    def message(self) -> str:
        """The denial's text (`reason` rendered)."""
        return self.reason.render()

    @property
    def code(self) -> Code:
        return self.reason.code


def attachment_is_live(device: GPUDevice, vmis: VMIs | set[tuple[str, str]], now: datetime,
                       grace: timedelta) -> bool:
    """W1: an attachment holds while its VMI exists or may still appear (`judge`: LIVE or
    PENDING), i.e. unless that VMI incarnation is deleted, its request refused, or it never
    appeared within `grace`."""
    if not isinstance(vmis, VMIs):
        vmis = VMIs.of_keys(vmis)
    v = judge(device, vmis, now, grace)
    return v is not None and v.holds


ANNOTATION_PREFIX = "gpu.cozystack.io/"


def unknown_annotations(annotations: Mapping[str, str] | None) -> Refusal | None:
    """W1: a Refusal naming every `gpu.cozystack.io/` annotation other than the two a VMI
    may carry (a typo such as `tempaltes` must not admit the VMI without its GPUs; the
    webhook sets `gpu.cozystack.io/admission` itself, so a tenant may not). None when there
    is none."""
    unknown = sorted(k for k in (annotations or {}) if isinstance(k, str)
                     and k.startswith(ANNOTATION_PREFIX)
                     and k not in (DEVICES_ANNOTATION, TEMPLATES_ANNOTATION))
    if not unknown:
        return None
    return Refusal(UnknownAnnotation(tuple(unknown), DEVICES_ANNOTATION, TEMPLATES_ANNOTATION,
                                     tuple(k for k in unknown if k == ADMISSION_ANNOTATION)))


def unbound_units(snap: Snapshot, plan: AdmissionPlan) -> dict[str, int]:
    """{resource: devices of `plan` of it not Bound on `snap`} (a template not created yet
    counts by its class's resource; an unknown class or device counts nothing). Pure."""
    out: dict[str, int] = {}
    classes = dict(plan.templates)
    for name in plan.devices:
        dev = snap.device(plan.namespace, name)
        if dev is not None and dev.bound_node is not None:
            continue
        cls = snap.classes.get(dev.class_name if dev is not None else classes.get(name, ""))
        if cls is not None:
            out[cls.resource_name] = out.get(cls.resource_name, 0) + 1
    return out


def budget_in_flight(snap: Snapshot, plan: AdmissionPlan, others: Sequence[AdmissionPlan], *,
                     retry_after: int) -> Refusal | None:
    """W1: a Refusal (`BudgetInFlight`, THROTTLED: 429, retryable) when the
    tenant's budget of a resource of `plan` has room for the set on `snap` (W1's budget
    check passed) but not with the units its `others` (admissions in progress for other
    VMIs of the same tenant) hold and are not Bound yet; None otherwise (no budget, nothing
    held, or room for all). Used is `Snapshot.tenant_usage`; the binder judges the budget
    for real (B1). A budget scoped on PriorityClass (P1) that matches the plan's class counts
    only the others of classes it matches, and its own usage (`Snapshot.scoped_usage`).
    Pure."""
    adds = unbound_units(snap, plan)
    ns = plan.namespace
    for res, n in adds.items():
        budget = snap.budget_of(ns, res)
        if budget is not None:
            held = sum(unbound_units(snap, p).get(res, 0) for p in others)
            used = snap.tenant_usage(ns, res)
            if held and used + held + n > budget:
                return Refusal(BudgetInFlight(ns, res, used, held, budget, n,
                                              len(others), retry_after=retry_after))
        for hard, scope in snap.scoped_budgets(ns, res):
            if not scope.matches(plan.priority.class_name):
                continue
            mine = [p for p in others if scope.matches(p.priority.class_name)]
            held = sum(unbound_units(snap, p).get(res, 0) for p in mine)
            used = snap.scoped_usage(ns, res, scope)
            if held and used + held + n > hard:
                return Refusal(BudgetInFlight(ns, res, used, held, hard, n, len(mine),
                                              retry_after=retry_after))
    return None


# Bounds of `bindRequest.nodeSelector` and `bindRequest.tolerations` in the GPUDevice CRD
# schema (k8s/manifests/crds; tests/model/test_admission_logic.py keeps them equal).
MAX_SELECTOR_ENTRIES = 64
MAX_TOLERATIONS = 64
MAX_LABEL_KEY = 317
MAX_LABEL_VALUE = 63


def request_bounds(node_selector: Labels, tolerations: Sequence[Toleration]) -> Refusal | None:
    """W1: a Refusal naming the part of the VMI's launcher nodeSelector or tolerations that
    the bind request could not carry (more entries, or longer keys or values, than the
    GPUDevice schema allows), so the API server never refuses a request write half-way;
    None when they fit."""
    if len(node_selector) > MAX_SELECTOR_ENTRIES:
        return Refusal(TooManySelectorEntries(len(node_selector), MAX_SELECTOR_ENTRIES))
    for k, v in node_selector:
        if len(k) > MAX_LABEL_KEY or len(v) > MAX_LABEL_VALUE:
            return Refusal(SelectorEntryTooLong(k[:80], MAX_LABEL_KEY, MAX_LABEL_VALUE))
    if len(tolerations) > MAX_TOLERATIONS:
        return Refusal(TooManyTolerations(len(tolerations), MAX_TOLERATIONS))
    for t in tolerations:
        if len(t.key) > MAX_LABEL_KEY or len(t.value) > MAX_LABEL_VALUE:
            return Refusal(TolerationTooLong(t.key[:80], MAX_LABEL_KEY, MAX_LABEL_VALUE))
    return None


def check(snapshot: Snapshot, namespace: str, vmi: str, ask: VMIAsk,
          live_vmis: VMIs | set[tuple[str, str]], now: datetime,
          grace: timedelta, *, node_selector: Labels = (), tolerations: tuple[Toleration, ...] = (),
          permitted: frozenset[str] | None = None,
          priority_class_name: str | None = None) -> AdmissionPlan | Refusal:
    """W1: every check before any write. Refuses when a held device is missing or being
    deleted, attached to another VMI that holds it (`attachment_is_live`), of a missing or
    unentitled class, when a template class is missing or unentitled, when a class's
    resource is not in KubeVirt's `permittedHostDevices` (`permitted`; None: no KubeVirt CR
    is known, nothing is checked), when the tenant's budget has no room for the set, or when
    the set cannot fit one node now (`model.check.check_set`, with the VMI's `node_selector`
    and `tolerations`, B3). Template devices this VMI already has (a retried admission, W4)
    are judged as the devices they are, not as new ones. Attachments to the same VMI name are
    judged by `same_name_conflict`, after W4. A nodeSelector or tolerations the bind
    request could not carry are refused first (`request_bounds`).

    P1: `priority_class_name` (the VMI's `spec.priorityClassName`) is resolved against the
    snapshot's PriorityClasses as Kubernetes resolves a Pod's (`model.priority.
    resolve_priority`): a class that does not exist is refused next (`PriorityClassNotFound`,
    403, naming it); the plan carries the priority, and a budget scoped on its class is
    judged with the set (`check_set`)."""
    bounds = request_bounds(node_selector, tolerations)
    if bounds is not None:
        return bounds
    priority = resolve_priority(priority_class_name, snapshot.priority_classes)
    if not isinstance(priority, Priority):
        return Refusal(priority)
    templates: list[tuple[str, str]] = []
    for class_name, count in ask.templates:
        templates.extend((template_name(vmi, class_name, i), class_name) for i in range(count))
    orders: list[Order] = []
    for name in ask.held:
        dev = snapshot.device(namespace, name)
        if dev is None:
            return Refusal(HeldDeviceNotFound(name, namespace))
        if dev.deleting:
            return Refusal(DeviceBeingDeleted(name))
        if dev.template_for is not None and dev.template_for != vmi:
            return Refusal(TemplateNamedAsHeld(name, dev.template_for))
        att = dev.status.attached_to
        if att is not None and att.vmi != vmi and attachment_is_live(dev, live_vmis, now, grace):
            if att.kept_until is not None:  # H4: kept for a stopped VM
                return Refusal(DeviceKept(name, namespace, att.vmi, _stamp(att.kept_until)))
            return Refusal(DeviceAttached(name, att.vmi))
        orders.append(Order(namespace, dev.class_name, name))
    for name, class_name in templates:
        dev = snapshot.device(namespace, name)
        if dev is not None:
            if dev.template_for != vmi or dev.class_name != class_name:
                return Refusal(NameTaken(name, class_name, vmi))
            if dev.deleting:
                return Refusal(TemplateBeingDeleted(name))
            orders.append(Order(namespace, class_name, name))
        else:
            orders.append(Order(namespace, class_name))
    if permitted is not None:
        refusal = _unpermitted(snapshot, orders, permitted)
        if refusal is not None:
            return refusal
    room = nominated_room_held(snapshot, namespace, vmi, now)
    verdict = check_set(room, namespace, orders, node_selector=node_selector,
                        tolerations=tolerations, priority=priority)
    if not verdict.admitted:
        assert verdict.reason is not None
        reasons: tuple[Reason, ...] = (verdict.reason,)
        if verdict.reason.code is Code.NO_FREE_UNIT:
            reasons = _room_reasons(room, orders, node_selector, tolerations)
            judged = judge_set(room, namespace, orders, node_selector=node_selector,
                               tolerations=tolerations, priority=priority)
            if isinstance(judged.reason, SetRefused):  # the binder's per-node reasons (B3)
                reasons += judged.reason.reasons
            reasons += kept_sets(snapshot, orders, now)  # H4: what stopped VMs keep
        return Refusal(CannotPlace(namespace, vmi, reasons))
    return AdmissionPlan(namespace, vmi, tuple(ask.held), tuple(templates), verdict.node, priority)


def nominated_room_held(snapshot: Snapshot, namespace: str, vmi: str, now: datetime) -> Snapshot:
    """`snapshot` with the room of every nomination live at `now` held (P6: placed for
    nobody but its preemptor; `model.nomination.nomination_holds`, as the binder's planner
    holds it), except VMI `namespace/vmi`'s own (the room nominated for it is its own). So
    W1 refuses for room a set the binder would refuse for room, and the set waits in line or
    is nominated at W1 (no bindRequest written, no binder round trip a retry), instead of
    passing W1 on room the binder holds for a preemptor. `snapshot` itself when nothing is
    nominated. Pure."""
    if not snapshot.nominations:
        return snapshot
    mine = hold_id(namespace, vmi)
    holds = [h for h in nomination_holds(snapshot.nominations, now, snapshot.devices_in)
             if h.request_id != mine and not h.empty]
    return snapshot.with_reservations(holds)


def _stamp(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def kept_sets(snapshot: Snapshot, orders: Sequence[Order], now: datetime) -> tuple[Reason, ...]:
    """H4: for a set refused for room, the sets kept for stopped VirtualMachines
    (`attachedTo.keptUntil` still ahead of `now`) that hold units of the set's resources on
    nodes serving its classes: one `KeptForVM` per (node, resource, VM), by node, so the
    tenant reads that those units are kept and until when."""
    classes: set[str] = set()
    for o in orders:
        dev = snapshot.device(o.namespace, o.device) if o.device else None
        classes.add(dev.class_name if dev else o.class_name)
    resources = {snapshot.classes[c].resource_name for c in classes if c in snapshot.classes}
    serving = set().union(*(snapshot.serving_nodes(c) for c in classes)) if classes else set()
    count: dict[tuple[str, str, str, str], int] = {}
    until: dict[tuple[str, str, str, str], datetime] = {}
    for d in snapshot.devices.values():
        att = d.status.attached_to
        if att is None or att.kept_until is None or att.kept_until <= now:
            continue
        cls = snapshot.classes.get(d.class_name)
        if d.bound_node is None or d.bound_node not in serving or cls is None \
                or cls.resource_name not in resources:
            continue
        key = (d.bound_node, cls.resource_name, d.namespace, att.vmi)
        count[key] = count.get(key, 0) + 1
        until[key] = min(until.get(key, att.kept_until), att.kept_until)
    return tuple(KeptForVM(n, r, c, ns, vm, _stamp(until[(n, r, ns, vm)]))
                 for (n, r, ns, vm), c in sorted(count.items()))


def vm_owner(vmi: Mapping[str, Any]) -> str | None:
    """H4: the uid of the VirtualMachine that owns the VMI `vmi` (its controller
    ownerReference of kind VirtualMachine, group kubevirt.io, as virt-controller sets it on
    the VMI it creates for a VM), None for a bare VMI."""
    meta = vmi.get("metadata") if isinstance(vmi.get("metadata"), Mapping) else {}
    for ref in meta.get("ownerReferences") or []:
        if (isinstance(ref, Mapping) and ref.get("kind") == "VirtualMachine"
                and str(ref.get("apiVersion", "")).startswith("kubevirt.io/")
                and ref.get("controller") is True and isinstance(ref.get("uid"), str)
                and ref.get("uid")):
            return ref["uid"]
    return None


def kept_conflict(snapshot: Snapshot, plan: AdmissionPlan, owner: str | None) -> Refusal | None:
    """H4 (W1, before W4): a device of the plan kept for VirtualMachine `plan.vmi`
    (`attachedTo.keptUntil`) may be taken only by a VMI that VM owns (`owner`, from
    `vm_owner`, equal to the keep's `attachedTo.owner`): a bare VMI of the same name, or
    one owned by another VM of the name (the kept one deleted and re-created), is refused
    (`DeviceKept`) until housekeeping releases the set. None when nothing of the plan is
    kept, or the owner matches."""
    for name in plan.devices:
        dev = snapshot.device(plan.namespace, name)
        att = dev.status.attached_to if dev else None
        if att is None or att.kept_until is None or att.vmi != plan.vmi:
            continue
        if owner is None or att.owner != owner:
            return Refusal(DeviceKept(name, plan.namespace, att.vmi, _stamp(att.kept_until),
                                      owner_required=True))
    return None


def _unpermitted(snapshot: Snapshot, orders: Sequence[Order], permitted: frozenset[str]) -> Refusal | None:
    """W1: the first class of the set whose resource KubeVirt does not permit, as a Refusal.
    Device-mode classes are not host devices: KubeVirt takes their GPUs from the VMI's
    ResourceClaims (`GPUsWithDRA`), not from `permittedHostDevices` (DR1, DR5). A class with
    a problem (neither or both of resourceName and deviceClassName) is left to `check_set`,
    which refuses it with that problem (`ClassProblem`), not as an unpermitted "" resource."""
    for o in orders:
        dev = snapshot.device(o.namespace, o.device) if o.device else None
        cls = snapshot.classes.get(dev.class_name if dev else o.class_name)
        if cls is not None and cls.problem is None and cls.name not in snapshot.mode.device_classes \
                and cls.resource_name not in permitted:
            return Refusal(ClassNotPermitted(cls.name, cls.resource_name))
    return None


def unpermitted_gpu_entries(vmi: Mapping[str, Any], effective: Sequence[str],
                            permitted: frozenset[str] | None) -> Refusal | None:
    """W1: the VMI's own `spec.domain.devices.gpus` entries that the mutation keeps (their
    `deviceName` is not a GPUClass resource) must name resources KubeVirt permits too, or
    virt-controller would never make the launcher Pod of the admitted VMI. None when all
    do, or when no KubeVirt CR is known (`permitted` None)."""
    if permitted is None:
        return None
    spec = vmi.get("spec") if isinstance(vmi.get("spec"), Mapping) else {}
    domain = spec.get("domain") if isinstance(spec.get("domain"), Mapping) else {}
    devs = domain.get("devices") if isinstance(domain.get("devices"), Mapping) else {}
    gpus = devs.get("gpus") if isinstance(devs.get("gpus"), list) else []
    ours = set(effective)
    for g in gpus:
        res = g.get("deviceName") if isinstance(g, Mapping) else None
        if isinstance(res, str) and res not in ours and res not in permitted:
            return Refusal(GpuEntryNotPermitted(g.get("name"), res))
    return None


def _room_reasons(snapshot: Snapshot, orders: Sequence[Order], node_selector: Labels,
                  tolerations: tuple[Toleration, ...]) -> tuple[Reason, ...]:
    """What the set needs on one node and the most any eligible node has, per resource
    (B3: placeable, no untolerated NoSchedule/NoExecute taint, matching the launcher's
    nodeSelector; the per-device check's own wording would read as if nothing were free)."""
    need: dict[tuple[str, str], int] = {}
    members: dict[str, int] = {}
    for o in orders:
        dev = snapshot.device(o.namespace, o.device) if o.device else None
        cls_name = dev.class_name if dev else o.class_name
        cls = snapshot.classes.get(cls_name)
        members[cls_name] = members.get(cls_name, 0) + 1
        if cls is not None and (dev is None or dev.bound_node is None):
            need[(cls_name, cls.resource_name)] = need.get((cls_name, cls.resource_name), 0) + 1
    parts: list[Reason] = []
    unplaceable = snapshot.unplaceable_nodes()

    def eligible(node: str) -> bool:
        return (node not in unplaceable and not snapshot.untolerated_taints(node, tolerations)
                and labels_include(snapshot.node_labels(node), node_selector))
    for (cls_name, res), n in sorted(need.items()):
        frees = [snapshot.free(node, res) for node in snapshot.serving_nodes(cls_name)
                 if eligible(node)]
        by_device = cls_name in snapshot.mode.device_classes
        sizes = [len(snapshot.nodes[node].devices_of(cls_name)) if by_device
                 else snapshot.allocatable(node, res) for node in snapshot.serving_nodes(cls_name)]
        largest = max(sizes) if sizes and max(sizes) < members[cls_name] else None
        parts.append(SetNeeds(cls_name, res, n, max(frees) if frees else None, largest,
                              members[cls_name] if largest is not None else 0))
    return tuple(parts) or (NoRoomForSet(),)


def same_name_conflict(snapshot: Snapshot, plan: AdmissionPlan, vmis: VMIs, now: datetime,
                       grace: timedelta, admission: str | None = None,
                       owner: str | None = None) -> Refusal | None:
    """W1 for a VMI name that a live read showed does not exist: a device of the plan that is
    attached to that same name by another admission which still holds it (PENDING: a
    concurrent create of the name, whose VMI may yet be stored) refuses the new admission,
    so it can neither move nor strip that admission's devices. An attachment of a deleted
    incarnation (GONE) or a stale one may be taken over, and this admission's own
    (`admission`) is no conflict, nor a set kept for the VM that owns this VMI (H4: `owner`
    is the keep's `attachedTo.owner`). `vmis` must not show the VMI."""
    for name in plan.devices:
        dev = snapshot.device(plan.namespace, name)
        att = dev.status.attached_to if dev else None
        if att is None or att.vmi != plan.vmi or (admission and att.admission == admission):
            continue
        if att.kept_until is not None and owner is not None and att.owner == owner:
            continue
        v = judge(dev, vmis, now, grace)
        if v is not None and v.holds:
            return Refusal(SameNameConflict(name, plan.namespace, plan.vmi))
    return None


def already_admitted(snapshot: Snapshot, plan: AdmissionPlan, now: datetime) -> str | None:
    """W4: the node of the set placed for this VMI (`placed_for`), None when there is none,
    or when a member records a device now under a NoSchedule/NoExecute device taint (HL1,
    `model.device.tainted_records`: a set kept for a stopped VM, H4, is then decided again,
    re-pointed within its node or moved, B1, never admitted as it is onto that device,
    which kube-scheduler would not allocate), or one a claim the binder did not make now
    allocates (`model.device.records.foreign_claimed_records`: the same, DR5)."""
    node = placed_for(snapshot, plan, now)
    if node is None:
        return None
    members = [snapshot.device(plan.namespace, n) for n in plan.devices]
    if tainted_records(snapshot, members) or foreign_claimed_records(snapshot, members):
        return None
    return node


def placed_for(snapshot: Snapshot, plan: AdmissionPlan, now: datetime) -> str | None:
    """The set placed for this VMI name (W4's case, or a set kept for its VM, H4): the node
    when every device of the plan exists, is attached to the VMI and carries a Succeeded
    request for it on one node where it is Bound; else None. None too for a victim of a
    nomination live at `now` (P4/P6): the set is being stopped to make room for another, so
    a VMI re-created under its name (a VM with runStrategy Always) never takes its devices
    back before housekeeping releases them; it goes to the binder, which counts the
    nomination's hold, and waits. Whether W4 admits the set as it is says
    `already_admitted`."""
    if (plan.namespace, plan.vmi) in yielding(snapshot.nominations, now):
        return None
    nodes = set()
    for name in plan.devices:
        dev = snapshot.device(plan.namespace, name)
        if dev is None:
            return None
        br, att = dev.status.bind_request, dev.status.attached_to
        if att is None or att.vmi != plan.vmi or br is None or br.vmi != plan.vmi:
            return None
        if br.result is not Result.SUCCEEDED or br.node is None:
            return None
        if dev.status.phase is not Phase.BOUND or dev.status.node_name != br.node:
            return None
        nodes.add(br.node)
    return nodes.pop() if len(nodes) == 1 else None


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def vmi_patch(vmi: Mapping[str, Any], devices: Sequence[tuple[str, str]], node: str,
              effective_resources: Sequence[str], admission: str | None = None) -> list[dict]:
    """The JSONPatch that admits `vmi` (§2): one `spec.domain.devices.gpus` entry per
    (device name, resource name) in `devices`, replacing entries naming a resource of
    `effective_resources` and keeping the others, and
    `spec.nodeSelector["kubernetes.io/hostname"] = node`; with `admission`, the annotation
    `gpu.cozystack.io/admission` (the id in the devices' attachments, linking this VMI
    incarnation to them)."""
    effective = set(effective_resources)
    ours = [{"name": name, "deviceName": res} for name, res in devices]
    return wiring_patch(vmi, ours, lambda g: g.get("deviceName") in effective, node, admission)


def wiring_patch(vmi: Mapping[str, Any], ours: list[dict], replaced: Callable[[Mapping], bool],
                 node: str, admission: str | None = None,
                 claim: Mapping[str, str] | None = None) -> list[dict]:
    """The JSONPatch admitting `vmi` on `node` with the gpus entries `ours`, dropping the VMI's
    own entries for which `replaced(entry)` holds and keeping the others, pinning it to
    `node`, annotating `admission` (see `vmi_patch`); with `claim` (a `spec.resourceClaims`
    entry, device mode, DR5), that entry added, replacing one of the same name."""
    spec = vmi.get("spec") if isinstance(vmi.get("spec"), Mapping) else None
    ops: list[dict] = []
    if admission is not None:
        meta = vmi.get("metadata") if isinstance(vmi.get("metadata"), Mapping) else {}
        if isinstance(meta.get("annotations"), Mapping):
            ops.append({"op": "add", "path": "/metadata/annotations/"
                        + _escape(ADMISSION_ANNOTATION), "value": admission})
        else:
            ops.append({"op": "add", "path": "/metadata/annotations",
                        "value": {ADMISSION_ANNOTATION: admission}})
    if spec is None:
        value: dict[str, Any] = {"domain": {"devices": {"gpus": ours}},
                                 "nodeSelector": {HOSTNAME_LABEL: node}}
        if claim is not None:
            value["resourceClaims"] = [dict(claim)]
        return ops + [{"op": "add", "path": "/spec", "value": value}]
    if claim is not None:
        have = spec.get("resourceClaims") if isinstance(spec.get("resourceClaims"), list) else []
        kept_claims = [c for c in have
                       if not (isinstance(c, Mapping) and c.get("name") == claim["name"])]
        ops.append({"op": "add", "path": "/spec/resourceClaims",
                    "value": kept_claims + [dict(claim)]})
    domain = spec.get("domain") if isinstance(spec.get("domain"), Mapping) else None
    if domain is None:
        ops.append({"op": "add", "path": "/spec/domain", "value": {"devices": {"gpus": ours}}})
    else:
        devs = domain.get("devices") if isinstance(domain.get("devices"), Mapping) else None
        if devs is None:
            ops.append({"op": "add", "path": "/spec/domain/devices", "value": {"gpus": ours}})
        else:
            existing = devs.get("gpus") if isinstance(devs.get("gpus"), list) else []
            kept = [g for g in existing if not (isinstance(g, Mapping) and replaced(g))]
            ops.append({"op": "add", "path": "/spec/domain/devices/gpus", "value": kept + ours})
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        ops.append({"op": "add", "path": f"/spec/nodeSelector/{_escape(HOSTNAME_LABEL)}",
                    "value": node})
    else:
        ops.append({"op": "add", "path": "/spec/nodeSelector", "value": {HOSTNAME_LABEL: node}})
    return ops


def effective_resources(snapshot: Snapshot) -> tuple[str, ...]:
    """The effective resource-name set of the snapshot's GPUClasses (sorted)."""
    return resource_names(snapshot.classes.values())


ARCH_LABEL = "kubernetes.io/arch"


@dataclass(frozen=True, slots=True)
class LauncherDefaults:
    """What virt-controller puts in a launcher Pod's nodeSelector besides the VMI's own
    (KubeVirt v1.8, `NewNodeSelectorRenderer`): `architecture`, the KubeVirt CR's
    `status.defaultArchitecture` ("" when unknown), which virt-api's mutator writes into a VMI
    without `spec.architecture`; `node_selectors`, the CR's
    `spec.configuration.developerConfiguration.nodeSelectors`."""

    architecture: str = ""
    node_selectors: Labels = ()


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _step(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def launcher_defaults(kubevirts: Sequence[Mapping[str, Any]]) -> LauncherDefaults:
    """`LauncherDefaults` of the cluster's KubeVirt CR (raw objects; the first by name when
    there are several, as KubeVirt runs one). No CR, or a malformed part: the empty
    defaults (nothing added), never an error."""
    crs = sorted((cr for cr in kubevirts if isinstance(cr, Mapping)),
                 key=lambda cr: str(_step(cr, "metadata", "name") or ""))
    if not crs:
        return LauncherDefaults()
    cr = crs[0]
    arch = _step(cr, "status", "defaultArchitecture")
    extra = _string_map(_step(cr, "spec", "configuration", "developerConfiguration", "nodeSelectors"))
    return LauncherDefaults(arch if isinstance(arch, str) else "", tuple(sorted(extra.items())))


def node_selector_of(vmi: Mapping[str, Any], defaults: LauncherDefaults | None = None) -> Labels:
    """The nodeSelector virt-controller gives the VMI's launcher Pod, as frozen labels
    (copied into the bind request and judged by B3 and W1, so the pinned node is one
    kube-scheduler can bind the launcher Pod to): `kubernetes.io/arch` = the lower-cased
    `spec.architecture`, else `defaults.architecture`, when either is set; then
    `defaults.node_selectors`; then the VMI's own `spec.nodeSelector`, which wins, as in
    KubeVirt. Non-string entries are ignored."""
    d = defaults or LauncherDefaults()
    spec = vmi.get("spec") if isinstance(vmi.get("spec"), Mapping) else {}
    arch = spec.get("architecture") if isinstance(spec.get("architecture"), str) else ""
    arch = arch or d.architecture
    out: dict[str, str] = {ARCH_LABEL: arch.lower()} if arch else {}
    out.update(d.node_selectors)
    out.update(_string_map(spec.get("nodeSelector")))
    return tuple(sorted(out.items()))
