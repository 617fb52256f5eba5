"""The operator's questions, answered by the binder's own judgement (docs/contract.md §3, §4).

- `explain`: would this VMI be admitted now, per node why the set fits there or not (the B3
  reasons `model.decide` writes into refusals), the node the binder would choose and the
  moves it would make (B4), and when it fits nowhere the smallest change that would make it
  fit (idle held devices to move away from a node, units missing, the budget short), and
  whether it would fit after one defragmentation round (D4, `model.defrag`).
- `top`: per class and node Bound / attached / idle / free, and the largest set of each class
  placeable now (fragmentation); per tenant, budget used of budget.

The third question, what-if (cordon or drain some nodes, then re-admit every held set on
them), is `model.what_if`'s; it builds its requests with `set_request`, as explain does.

Every verdict comes from `model.admission.check` (W1) and `model.decide.assess`/`decide`
(B1–B6), never from a re-implementation, so the tools say what an admission then does
(barring changes in between). Units are devices. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

from model.admission import (Refusal, check, effective_resources, placed_for, same_name_conflict,
                             unpermitted_gpu_entries, with_templates)
from model.decide import Move, Request, Rule, apply_decision, assess, decide
from model.device.view import (Blocks, NodeDevices, blocks, largest_device_set, recorded_choice,
                                set_view, takes)
from model.device.dra import DeviceRef
from model.defrag import DEFAULT_MAX_MOVES, DefragPlan, apply_moves, plan_round
from model.housekeeping import VMIs
from model.device.lost import LostDevice
from model.device.tainted_records import tainted_records
from model.line import Identity, Line, line_place
from model.lost import ClassDevices, classify, lost_members
from model.parse import VMIAsk
from model.priority import Priority, resolve_priority
from model.reasons import CAPACITY_CODES, W1_DEVICE_CODES, Code, LinePlace, Reason, RecordTainted
from model.snapshot import Snapshot
from model.types import GPUDevice, Labels, Result, Toleration

EXPLAIN_REQUEST_ID = "(explain)"
"""Request id of the hypothetical requests judged here; never a real (generated) id."""

DEVICE_MODE_ONLY = {"omit_empty": True}
"""Field metadata of the device-mode parts of the answers (DR2-DR4): empty in count mode,
and then left out of `--json` (`cli.tools.to_jsonable`), so count mode's output is as before."""

PROBE_NAMESPACE = "(probe)"
"""Namespace of `top`'s probe devices: not a valid namespace name, so it clashes with none."""



# --- explain ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One node for one set: `reasons` the B3 problems (the binder's, `model.reasons`; empty:
    the set is eligible there), `holds` members already Bound there, `chosen` the binder's
    choice."""

    node: str
    reasons: tuple[Reason, ...]
    holds: int = 0
    chosen: bool = False

    @property
    def fits(self) -> bool:
        """True when the node is eligible for the whole set (B3)."""
        return not self.reasons


@dataclass(frozen=True, slots=True)
class Shortfall:
    """The smallest change that would make the set fit on `node`: `missing` units per
    resource; `idle` held devices Bound there, attached to no live VMI, whose moving away
    would free them, each as ((namespace, name), the node it could go to, or None when no
    other node has room: then only releasing it frees the unit); `short` units
    per resource still missing after moving them (capacity to add or devices to release);
    `uncordon` when the node is also cordoned; `awaiting` the devices Bound there attached
    to a VMI not seen (an admission in progress, or a create that failed), per VMI as
    ((namespace, vmi), devices, when H1 frees them unless the VMI appears: attached since +
    the attachment grace, UTC). They are neither idle nor movable; they count in `short`."""

    node: str
    missing: tuple[tuple[str, int], ...]
    idle: tuple[tuple[tuple[str, str], str | None], ...]
    short: tuple[tuple[str, int], ...]
    uncordon: bool = False
    awaiting: tuple[tuple[tuple[str, str], int, datetime], ...] = ()

    @property
    def size(self) -> int:
        """Units missing in all (the ranking of shortfalls)."""
        return sum(n for _, n in self.missing)


@dataclass(frozen=True, slots=True)
class AfterDefrag:
    """D4: a refused set would be admitted on `node` after the defragmentation round
    `plan` (what the binder's round would move now: `model.defrag.plan_round`)."""

    plan: DefragPlan
    node: str


@dataclass(frozen=True, slots=True)
class Explanation:
    """The answer of `explain` for VMI `namespace/vmi`.

    `admitted`: an admission now would admit it (W1 passes and the binder places the set);
    `reason`: the denial the admission would give (W1's reason, or the binder's refusal),
    typed (`model.reasons`), None when admitted; `message` renders it. `devices`: the set (held names, then template names). `node`, `rule`,
    `moves`: the binder's decision when the admission would admit. `set_problems`: reasons that
    refuse the set whatever the node (device, attachment, class, entitlement, budget; typed).
    `nodes`: one verdict per node, sorted by name. `shortfalls`: when it fits nowhere, the
    nodes failing on capacity or cordon only, with the change that would make the set fit
    there, smallest first: moving idle devices away, then lifting a cordon, then the fewest
    units to add. `budget_short`: units per resource by which
    the tenant's budget is short (raise the quota or release Bound devices). `after_defrag`:
    when refused, and one defragmentation round would make the admission admit it (D4);
    else None. `device_nodes`: device mode (DR2-DR4), per node with devices of the set's
    device-mode classes, its free devices and groups for the set's share and the devices a
    placement there takes (`model.device.view.NodeDevices`); empty in count mode."""

    namespace: str
    vmi: str
    devices: tuple[str, ...]
    admitted: bool
    reason: Reason | None
    node: str | None
    rule: Rule | None
    moves: tuple[Move, ...]
    set_problems: tuple[Reason, ...]
    nodes: tuple[NodeVerdict, ...]
    shortfalls: tuple[Shortfall, ...]
    budget_short: tuple[tuple[str, int], ...]
    after_defrag: AfterDefrag | None = None
    kept: tuple["KeptSet", ...] = ()
    """H4: the set's devices kept for their VirtualMachine (`attachedTo.keptUntil`), per node."""
    device_nodes: tuple[NodeDevices, ...] = field(default=(), metadata=DEVICE_MODE_ONLY)
    lost: tuple[LostDevice, ...] = field(default=(), metadata=DEVICE_MODE_ONLY)
    """HL3: the set's recorded devices that are lost (left the slices, or published without
    the class's topology attribute), with why (`model.lost.lost_members`)."""
    tainted: tuple[RecordTainted, ...] = field(default=(), metadata=DEVICE_MODE_ONLY)
    """HL1: the set's records on a device under a NoSchedule/NoExecute taint, with the taint
    and what put it there (`model.device.tainted_records`): an idle one is re-pointed within
    its node, or the set moved, at its next placement; a running VMI's is left alone."""
    line: LinePlace | None = field(default=None, metadata={"omit_empty": True})
    """P5: the set's place in the waiting line of its classes, what is ahead and its
    reservation (`model.line.line_place`); None when it does not wait or no line was given."""

    @property
    def message(self) -> str | None:
        """The denial's text (`reason` rendered), None when admitted."""
        return None if self.reason is None else self.reason.render()


def set_request(snapshot: Snapshot, namespace: str, vmi: str, ask: VMIAsk,
                node_selector: Labels = (),
                tolerations: tuple[Toleration, ...] = ()) -> tuple[Snapshot, Request]:
    """The snapshot and complete request the binder would judge for this VMI's set (§3):
    held devices by name, template devices under their deterministic names
    (`template_name`, W3 step 1) added as Pending devices when they do not exist yet."""
    snap, names = with_templates(snapshot, namespace, vmi, ask.held, ask.templates)
    return snap, Request(EXPLAIN_REQUEST_ID, namespace, vmi, names, node_selector,
                         None, tolerations)


def live_vmi_keys(live_vmis: VMIs | set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The (namespace, name) of the live VMIs, from `VMIs` or such a set."""
    return set(live_vmis.live) if isinstance(live_vmis, VMIs) else set(live_vmis)


def explain(snapshot: Snapshot, namespace: str, vmi: str, ask: VMIAsk, *,
            live_vmis: VMIs | set[tuple[str, str]], now: datetime, grace: timedelta,
            node_selector: Labels = (), tolerations: tuple[Toleration, ...] = (),
            permitted: frozenset[str] | None = None,
            vmi_object: Mapping[str, Any] | None = None,
            defrag_max_moves: int = DEFAULT_MAX_MOVES, line: Line | None = None,
            reservations: Mapping[Identity, str] | None = None) -> Explanation:
    """Explain the admission of VMI `namespace/vmi` asking for `ask` with its own
    `spec.nodeSelector` and `spec.tolerations` (B3), KubeVirt's `permitted` host devices
    (None: no KubeVirt CR) and the VMI object itself (its kept `gpus` entries), as a CREATE of it now would go: W1 (`check`, then
    `same_name_conflict` unless the set is already placed for this name, `placed_for`) with
    the VMI itself not live, as the webhook sees it (so an existing VMI is explained as if re-created: its own
    attachments do not stand in its way), `now` and `grace`; then the binder's B1–B6 on the
    request the webhook would write. When refused, `after_defrag` says whether one
    defragmentation round of at most `defrag_max_moves` moves (D4; the set's own devices
    stay) would make the same admission admit it. P1: the VMI object's
    `spec.priorityClassName` is resolved as the webhook resolves it (a class not found is
    W1's refusal; the request is judged with the priority, for budgets scoped on its
    class). With the waiting `line` (P5), `line` says the VMI's place in it and its
    reservation (`reservations`, `model.line.reservation`) when it waits. Pure; never
    raises."""
    vmis = live_vmis if isinstance(live_vmis, VMIs) else VMIs.of_keys(live_vmis)
    vmis = vmis.without((namespace, vmi))
    live_keys = set(vmis.live)
    spec = vmi_object.get("spec") if vmi_object is not None else None
    pc_name = spec.get("priorityClassName") if isinstance(spec, Mapping) else None
    pc_name = pc_name if isinstance(pc_name, str) and pc_name else None
    priority = resolve_priority(pc_name, snapshot.priority_classes)
    w1 = check(snapshot, namespace, vmi, ask, vmis, now, grace, node_selector=node_selector,
               tolerations=tolerations, permitted=permitted, priority_class_name=pc_name)
    if not isinstance(w1, Refusal) and vmi_object is not None:
        w1 = unpermitted_gpu_entries(vmi_object, effective_resources(snapshot), permitted) or w1
    # the set placed for this name (W4, or kept for its VM, H4) is no conflict; whether W4
    # admits it as it is (not on a tainted device, HL1) the decision below says
    # a set placed for this name (W4's, or kept for its VM, H4) is no conflict: whether W4
    # admits it as it is (HL1: not on a tainted device) the binder's decision below says
    if not isinstance(w1, Refusal) and placed_for(snapshot, w1, now) is None:
        w1 = same_name_conflict(snapshot, w1, vmis, now, grace) or w1
    snap, request = set_request(snapshot, namespace, vmi, ask, node_selector, tolerations)
    if isinstance(priority, Priority) and priority != request.priority:
        request = replace(request, priority=priority)
    a = assess(snap, request)
    d = a.decision
    ok = d.result is Result.SUCCEEDED
    set_problems = list(a.set_problems)
    reason: Reason | None = None
    if isinstance(w1, Refusal):
        reason = w1.reason
        # W1's own reasons about a held device (attached to another VMI, a template device
        # named as held, a name taken): the binder never sees them
        if w1.reason.code in W1_DEVICE_CODES:
            set_problems.insert(0, w1.reason)
    elif not ok:
        reason = d.reason
    admitted = not isinstance(w1, Refusal) and ok
    moves = d.placements[0].moves if admitted and d.placements else ()
    verdicts = tuple(NodeVerdict(n, r, a.holding.get(n, 0), admitted and n == d.node)
                     for n, r in sorted(a.nodes.items()))
    shortfalls: tuple[Shortfall, ...] = ()
    if not any(v.fits for v in verdicts):
        shortfalls = _shortfalls(snap, request, verdicts, live_keys, grace)
    after = None
    if not admitted and not set_problems and isinstance(priority, Priority):
        after = _after_defrag(snapshot, namespace, vmi, ask, vmis, now, grace, node_selector,
                              tolerations, permitted, defrag_max_moves)
    members = [m for n in request.devices if (m := snap.device(namespace, n)) is not None]
    return Explanation(namespace, vmi, request.devices, admitted, reason,
                       d.node if admitted else None, d.rule if admitted else None, moves,
                       tuple(set_problems), verdicts, shortfalls,
                       _budget_short(snap, request), after, _kept_of(snap, request),
                       device_nodes=_device_nodes(snap, request, d),
                       lost=lost_members(snap, members),
                       tainted=tainted_records(snap, members, live_keys),
                       line=(line_place(line, Identity(namespace, vmi), reservations)
                             if line is not None else None))


def _kept_of(snap: Snapshot, request: Request) -> tuple["KeptSet", ...]:
    """H4: the request's devices kept for a VirtualMachine, per (VM, node)."""
    by: dict[tuple[str, str, str], list] = {}
    for name in request.devices:
        d = snap.device(request.namespace, name)
        att = d.status.attached_to if d is not None else None
        if d is None or att is None or att.kept_until is None or d.bound_node is None:
            continue
        k = by.setdefault((d.namespace, att.vmi, d.bound_node), [[], att.kept_until])
        k[0].append(name)
        k[1] = min(k[1], att.kept_until)
    return tuple(KeptSet(ns, vm, node, tuple(devs), until)
                 for (ns, vm, node), (devs, until) in sorted(by.items()))


def _device_nodes(snap: Snapshot, request: Request, d) -> tuple[NodeDevices, ...]:
    """Device mode (DR2-DR4): the set's view per node (`model.device.view.set_view`), with
    the devices each placement of the binder's decision takes there (B1: every eligible
    node; B5/B6: the records kept). Empty in count mode."""
    members = [m for n in request.devices if (m := snap.device(request.namespace, n)) is not None]
    chosen = {p.node: p.devices or recorded_choice(members, p.node) for p in d.placements}
    return set_view(snap, request.id, members, chosen)


def _after_defrag(snapshot: Snapshot, namespace: str, vmi: str, ask: VMIAsk, vmis: VMIs,
                  now: datetime, grace: timedelta, node_selector: Labels,
                  tolerations: tuple[Toleration, ...], permitted: frozenset[str] | None,
                  max_moves: int) -> AfterDefrag | None:
    """D4: the round the binder would make now, when after it W1 passes and the binder
    places the set (its own held devices are kept out of the round); else None."""
    keep = {(namespace, name) for name in ask.held}
    plan = plan_round(snapshot, max_moves=max(1, max_moves), keep=keep)
    if not plan.moves:
        return None
    after = apply_moves(snapshot, plan.moves)
    if isinstance(check(after, namespace, vmi, ask, vmis, now, grace, node_selector=node_selector,
                        tolerations=tolerations, permitted=permitted), Refusal):
        return None
    snap, request = set_request(after, namespace, vmi, ask, node_selector, tolerations)
    d = decide(snap, request, limit=1)
    return AfterDefrag(plan, d.node) if d.result is Result.SUCCEEDED and d.node else None


def _set_needs(snap: Snapshot, request: Request) -> dict[str, dict[str, int]]:
    """Per node, units per resource the set still needs there (its members not Bound there)."""
    total: dict[str, int] = {}
    here: dict[str, dict[str, int]] = {}
    for name in request.devices:
        d = snap.device(request.namespace, name)
        cls = snap.classes.get(d.class_name) if d else None
        if cls is None:
            continue
        total[cls.resource_name] = total.get(cls.resource_name, 0) + 1
        if d.bound_node is not None:
            on = here.setdefault(d.bound_node, {})
            on[cls.resource_name] = on.get(cls.resource_name, 0) + 1
    return {n: {r: t - here.get(n, {}).get(r, 0) for r, t in total.items()} for n in snap.nodes}


def _shortfalls(snap: Snapshot, request: Request, verdicts: Sequence[NodeVerdict],
                live_vmis: set[tuple[str, str]], grace: timedelta) -> tuple[Shortfall, ...]:
    members = set(request.devices)
    needs = _set_needs(snap, request)
    out: list[Shortfall] = []
    for v in verdicts:
        others = [r.code for r in v.reasons if r.code not in CAPACITY_CODES]
        if others not in ([], [Code.CORDONED]):
            continue
        missing: dict[str, int] = {}
        for res, need in needs[v.node].items():
            short = need - snap.free(v.node, res)  # lost capacity: more than need
            if short > 0:
                missing[res] = short
        idle: list[tuple[tuple[str, str], str | None]] = []
        short = dict(missing)
        after = snap
        for d in _idle_devices(snap, v.node):
            res = snap.classes[d.class_name].resource_name
            if d.namespace == request.namespace and d.name in members or short.get(res, 0) <= 0:
                continue
            to = after.tightest_node(d.class_name, 1, exclude=frozenset((v.node,)))
            if to is not None:  # it takes a unit there: the next idle device sees that
                after = after.with_device(replace(d, status=replace(d.status, node_name=to)))
            idle.append((d.key, to))
            short[res] -= 1
        out.append(Shortfall(v.node, tuple(sorted(missing.items())), tuple(idle),
                             tuple(sorted((r, n) for r, n in short.items() if n > 0)),
                             others == [Code.CORDONED],
                             _awaiting(snap, v.node, live_vmis, grace, request)))
    # moving idle devices only, then lifting a cordon, then adding capacity (fewest first)
    out.sort(key=lambda s: (bool(s.short), s.uncordon, sum(n for _, n in s.short), s.size,
                            s.node))
    return tuple(out)


def _idle_devices(snap: Snapshot, node: str) -> list[GPUDevice]:
    """Held devices Bound on `node` attached to no VMI, by (namespace, name)."""
    out = [d for d in snap.devices.values()
           if d.bound_node == node and d.template_for is None and d.class_name in snap.classes
           and d.status.attached_to is None]
    out.sort(key=lambda d: d.key)
    return out


def _awaiting(snap: Snapshot, node: str, live_vmis: set[tuple[str, str]], grace: timedelta,
              request: Request) -> tuple[tuple[tuple[str, str], int, datetime], ...]:
    """Devices Bound on `node` attached to a VMI not in `live_vmis` (other than `request`'s
    own VMI and devices), per VMI: ((namespace, vmi), count, the earliest attachment +
    `grace`). Sets kept for a stopped VM (H4) are not awaited: W1 names them (KeptForVM)."""
    by: dict[tuple[str, str], list] = {}
    own = {(request.namespace, n) for n in request.devices}
    for d in snap.devices.values():
        att = d.status.attached_to
        if (d.bound_node != node or att is None or att.kept_until is not None
                or (d.namespace, att.vmi) in live_vmis
                or (d.namespace, att.vmi) == (request.namespace, request.vmi) or d.key in own):
            continue
        entry = by.setdefault((d.namespace, att.vmi), [0, att.since])
        entry[0] += 1
        entry[1] = min(entry[1], att.since)
    return tuple((k, n, since + grace) for k, (n, since) in sorted(by.items()))


def _attached_live(d: GPUDevice, live_vmis: set[tuple[str, str]]) -> bool:
    att = d.status.attached_to
    return att is not None and (d.namespace, att.vmi) in live_vmis


def _budget_short(snap: Snapshot, request: Request) -> tuple[tuple[str, int], ...]:
    adds: dict[str, int] = {}
    for name in request.devices:
        d = snap.device(request.namespace, name)
        cls = snap.classes.get(d.class_name) if d else None
        if cls is not None and d.bound_node is None:
            adds[cls.resource_name] = adds.get(cls.resource_name, 0) + 1
    out = []
    for res, n in sorted(adds.items()):
        budget = snap.budget_of(request.namespace, res)
        if budget is not None:
            over = snap.tenant_usage(request.namespace, res) + n - budget
            if over > 0:
                out.append((res, over))
    return tuple(out)


# --- top -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """One class on one node serving it: `allocatable` of its resource, `bound` devices of
    the class Bound there, of which `attached` to a live VMI, `awaiting` attached to a VMI
    not seen (its admission in progress, or a create that failed after the binder bound
    it: H1 clears that after the attachment grace) and `idle` attached to none, `free`
    units of the resource (allocatable − used − reserved, 0 at least), `largest` the
    largest set of the class the binder would place there now (0 when the node is not
    eligible). `kept`: Bound devices kept for a stopped VirtualMachine (H4,
    `attachedTo.keptUntil`; not among `awaiting` nor `idle`)."""

    node: str
    allocatable: int
    bound: int
    attached: int
    awaiting: int
    idle: int
    free: int
    largest: int
    cordoned: bool = False
    kept: int = 0


@dataclass(frozen=True, slots=True)
class ClassFigures:
    """One GPUClass: sums over the nodes serving it, and `largest` the largest set of the
    class placeable now on one node (B3), so `free` − `largest` shows fragmentation;
    `problem` the class's own when it cannot serve (`GPUClass.problem`, its Ready=False
    condition: its VMIs are refused with it)."""

    class_name: str
    resource: str
    bound: int
    attached: int
    awaiting: int
    idle: int
    free: int
    largest: int
    nodes: tuple[NodeFigures, ...]
    kept: int = 0
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """A tenant's use of one resource: Bound plus reserved `used`, budget `hard` (None: no
    quota names it)."""

    namespace: str
    resource: str
    used: int
    hard: int | None


@dataclass(frozen=True, slots=True)
class KeptSet:
    """H4: the devices kept for VirtualMachine `namespace/vm` on `node` until `until`."""

    namespace: str
    vm: str
    node: str
    devices: tuple[str, ...]
    until: datetime


@dataclass(frozen=True, slots=True)
class Top:
    """The answer of `top`: classes by name; tenants by namespace and resource; `kept` the
    sets kept for stopped VirtualMachines (H4) by namespace and VM; `blocks`, device mode
    (DR3): per device-mode class and node serving it, its groups (whole free partitions per
    size, or free devices per group; `model.device.view.Blocks`), by class then node. A
    device-mode class's rows are the nodes with its devices, `allocatable` and `free` count
    its devices, `largest` is the largest set its free groups take (HL3: a lost device is
    never free: `devices` adds each class's devices up, `lost` names the lost ones)."""

    classes: tuple[ClassFigures, ...]
    tenants: tuple[TenantFigures, ...]
    kept: tuple[KeptSet, ...] = ()
    blocks: tuple[Blocks, ...] = field(default=(), metadata=DEVICE_MODE_ONLY)
    devices: tuple[ClassDevices, ...] = field(default=(), metadata=DEVICE_MODE_ONLY)
    """HL3: per device-mode class, its devices by state, adding up (`model.lost`)."""
    lost: tuple[LostDevice, ...] = field(default=(), metadata=DEVICE_MODE_ONLY)
    """HL3: every lost device of a device-mode class, with why."""


def largest_placeable(snapshot: Snapshot, class_name: str) -> dict[str, int]:
    """Per node, the largest set of new devices of `class_name` the binder would place there
    now: the node's free units of the class's resource when a one-device probe request is
    eligible there (`assess`, B3), else 0; for a device-mode class the largest set its free
    groups take (DR3, `_largest_device_sets`). Entitlement and budgets are the tenant's and are
    left out. Empty for an unknown class."""
    cls = snapshot.classes.get(class_name)
    if cls is None:
        return {}
    probe = GPUDevice(PROBE_NAMESPACE, "probe", class_name)
    snap = snapshot.with_device(probe)
    request = Request(EXPLAIN_REQUEST_ID, PROBE_NAMESPACE, "(top)", ("probe",))
    res = cls.resource_name
    out = {n: 0 for n in snapshot.serving_nodes(class_name)}
    room = sorted(n for n in out if snapshot.free(n, res) >= 1)  # no room: 0 whatever else
    a = assess(snap, request, room, with_decision=False)
    if class_name in snapshot.mode.device_classes:  # DR3: free groups bound the set, not units
        return _largest_device_sets(snapshot, class_name, out, room, a.nodes)
    for n in room:
        if not a.nodes[n]:
            out[n] = snapshot.free(n, res)
    return out


def _largest_device_sets(snapshot: Snapshot, class_name: str, out: dict[str, int],
                         room: Sequence[str], reasons: Mapping[str, tuple[Reason, ...]]
                         ) -> dict[str, int]:
    """`largest_placeable` for a device-mode class: on each node where the one-device
    probe is eligible but for its own group (a set of one may have no group where larger
    ones do: `NoDeviceGroup` alone does not rule the node out), the largest set the node's
    free groups take (`model.device.view.largest_device_set`, DR3)."""
    for n in room:
        if all(r.code is Code.NO_DEVICE_GROUP for r in reasons[n]):
            out[n] = largest_device_set(snapshot, n, class_name)
    return out


def top(snapshot: Snapshot, live_vmis: VMIs | set[tuple[str, str]]) -> Top:
    """Figures per class and node, and per tenant budget (see `Top`); a device is attached
    when the VMI it is attached to exists (in `live_vmis`), awaiting when that VMI does not
    (yet). Pure."""
    live_vmis = live_vmi_keys(live_vmis)
    counts: dict[tuple[str, str], list[int]] = {}  # (class, node) -> [bound, attached, awaiting, kept]
    kept_sets: dict[tuple[str, str, str], list] = {}  # (ns, vm, node) -> [devices, until]
    holders: set[tuple[str, str]] = set()  # (namespace, resource) holding a device
    classes_by_name = snapshot.classes
    for d in snapshot.devices.values():
        cls = classes_by_name.get(d.class_name)
        if cls is not None:
            holders.add((d.namespace, cls.resource_name))
        if d.bound_node is None:
            continue
        c = counts.setdefault((d.class_name, d.bound_node), [0, 0, 0, 0])
        live = _attached_live(d, live_vmis)
        att = d.status.attached_to
        kept = att is not None and att.kept_until is not None and not live
        c[0] += 1
        c[1] += live
        c[2] += att is not None and not live and not kept
        c[3] += kept
        if kept:
            assert att is not None and att.kept_until is not None
            k = kept_sets.setdefault((d.namespace, att.vmi, d.bound_node), [[], att.kept_until])
            k[0].append(d.name)
            k[1] = min(k[1], att.kept_until)
    cordoned_nodes = snapshot.cordoned_nodes()
    classes = []
    for name in sorted(snapshot.classes):
        res = snapshot.classes[name].resource_name
        largest = largest_placeable(snapshot, name)
        rows = []
        nodes = set(snapshot.serving_nodes(name)) | {n for c, n in counts if c == name}
        for n in sorted(nodes):
            bound, attached, awaiting, kept = counts.get((name, n), (0, 0, 0, 0))
            cordoned = n in cordoned_nodes
            rows.append(NodeFigures(n, snapshot.allocatable(n, res), bound, attached, awaiting,
                                    bound - attached - awaiting - kept,
                                    max(snapshot.free(n, res), 0),
                                    largest.get(n, 0), cordoned, kept))
        if name in snapshot.mode.device_classes:
            rows = _device_rows(snapshot, name, rows)
        classes.append(ClassFigures(
            name, res, sum(r.bound for r in rows), sum(r.attached for r in rows),
            sum(r.awaiting for r in rows), sum(r.idle for r in rows),
            sum(r.free for r in rows if not r.cordoned),
            max((r.largest for r in rows), default=0), tuple(rows),
            sum(r.kept for r in rows), snapshot.classes[name].problem))
    tenants: dict[tuple[str, str], TenantFigures] = {}
    for (ns, res), hard in snapshot.budgets.items():
        tenants[(ns, res)] = TenantFigures(ns, res, snapshot.tenant_usage(ns, res), hard)
    for key in holders - tenants.keys():
        tenants[key] = TenantFigures(*key, snapshot.tenant_usage(*key), None)
    return Top(tuple(classes), tuple(tenants[k] for k in sorted(tenants)),
               tuple(KeptSet(ns, vm, node, tuple(sorted(devs)), until)
                     for (ns, vm, node), (devs, until) in sorted(kept_sets.items())),
               blocks=_blocks(snapshot), **_devices(snapshot, live_vmis))


def _devices(snapshot: Snapshot, live: set[tuple[str, str]]) -> dict[str, tuple]:
    """`Top.devices` and `Top.lost` (HL3, `model.lost.classify`); empty in count mode."""
    fleet = classify(snapshot, live)
    return {"devices": fleet.classes, "lost": fleet.lost}


def _device_rows(snapshot: Snapshot, class_name: str, rows: list[NodeFigures]) -> list[NodeFigures]:
    """`top`'s rows of a device-mode class (DR2): the nodes with devices of the class (or
    devices of it Bound there), not every node counting its DeviceClass's quota key (classes
    over one DeviceClass share that key); `allocatable` the class's devices there, `free`
    those free for a new set (`Snapshot.free_devices`, at most the free units)."""
    out = []
    for r in rows:
        devices = snapshot.nodes[r.node].devices_of(class_name) if r.node in snapshot.nodes else ()
        if not devices and not r.bound:
            continue
        free = min(len(snapshot.free_devices(r.node, class_name)), r.free)
        out.append(replace(r, allocatable=len(devices), free=free))
    return out


def _blocks(snapshot: Snapshot) -> tuple[Blocks, ...]:
    """`Top.blocks`: device-mode classes only (empty in count mode)."""
    out = []
    for name in sorted(snapshot.classes):
        if name in snapshot.mode.device_classes:
            for n in sorted(snapshot.serving_nodes(name)):
                b = blocks(snapshot, n, name)
                if b is not None and snapshot.nodes[n].devices_of(name):
                    out.append(b)
    return tuple(out)

