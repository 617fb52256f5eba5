"""The binder's judgement of one request (docs/contract.md §3): gather the whole set onto
one eligible node or refuse it (B1), eligibility (B3), choice (B4), the cordon exceptions
(B5) and the already-placed case (B6); the `Request` itself (found among devices by
`model.requests`). Also `decide_on` (one node, for P3's plan), `recovery_devices` (B7 after
a restart, `model.plan`), `assess` (every reason, for
`model.explain`) and `apply_decision` (a decision carried out on a snapshot: what-if,
tests and benchmarks).

Device mode (DR1-DR4) is asked through the snapshot's seam (`Snapshot.mode`,
`model.device.seam`): a set's device questions are `model.device.choice.SetDevices`
(`_Set.dev`), count mode's null object when the set has no device-mode class.

Pure: `decide` reads a `Snapshot` and returns a `Decision`; nothing here writes or waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Iterable, Iterator, Mapping

from model.device.dra import DeviceRef
from model.device.records import record_after
from model.reasons import (AlreadyPlaced, BudgetExhausted, ClassesNotServed, ClassNotFound, ClassProblem,
                           Code, DeviceAt, DeviceListedTwice, DeviceNotFound, KeptCordoned, LostCapacity,
                           MixedModes, NodeGone, NodeProblems, NoDevices, NoEligibleNode,
                           NoNodeServes, NoRoom, NotEntitled, Outcome, Placed, Reason, RequestRef,
                           SelectorMismatch, SetRefused, TaintsNotTolerated)
from model.counts import priority_class_of
from model.priority import DEFAULT_PRIORITY, Priority
from model.nomination import hold_id as nomination_hold_id
from model.snapshot import Snapshot
from model.types import (
    BindRequest,
    DeviceKey,
    DeviceStatus,
    GPUDevice,
    Labels,
    OnCordon,
    Phase,
    Result,
    Toleration,
    labels_include,
)

MAX_PLACEMENTS = 4
"""Default bound on `Decision.placements`: the first eligible nodes in B4 order. Listing every
eligible node of a large fleet would cost more than the decision itself (a placement of 8
devices is 8 Move values); a node actor refuses a prepare only when the coordinator's
snapshot is stale, so if every listed node refuses, the coordinator decides again against its
refreshed snapshot. Pass `limit=None` to `decide` for every eligible node."""

MESSAGE_NODES = 10
"""Most nodes a refusal message explains one by one; the rest are counted ("and 4990 more
nodes"), so a 5,000-node fleet does not make a megabyte message. Shown first: nodes holding
members (fewest moves first), then placeable nodes failing on capacity or an untolerated taint
(most free first), then unplaceable nodes (cordoned, not Ready, without
`kubevirt.io/schedulable=true`), nodes not matching the node selector, nodes not serving a
class (by name)."""



@dataclass(frozen=True, slots=True)
class Request:
    """A complete request (§3): the devices of tenant `namespace` that carry `id`, in the
    order of `bindRequest.devices`; `node_selector` and `tolerations` are the VMI's own
    (B3); `requested_at` when the webhook wrote it (None if absent); `priority` as the
    webhook recorded it at admission (P1; the member of the smallest name's)."""

    id: str
    namespace: str
    vmi: str
    devices: tuple[str, ...]
    node_selector: Labels = ()
    requested_at: datetime | None = None
    tolerations: tuple[Toleration, ...] = ()
    priority: Priority = DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class Move:
    """One placement change: `device` (namespace, name) goes from `from_node` (None: a
    Pending device being bound) to `to_node`."""

    device: tuple[str, str]
    from_node: str | None
    to_node: str


@dataclass(frozen=True, slots=True)
class Placement:
    """The set gathered on `node`: `moves` every member not Bound there yet (in request
    order); `needs` units per resource to reserve on `node` (those members); `budget_needs`
    budget slots per resource (the Pending members, about to become Bound). Sorted pairs.

    Device mode (DR3, DR4): `devices` the exact device of `node` chosen for every member of
    a device-mode class, in request order (empty in count mode, and for B6 and B5 where the
    records stay as they are; for B5(a)/(b) whose records no longer hold on the cordoned
    node, the group they are re-pointed to there). A member already Bound on `node` whose
    record differs is re-pointed: a status write, not a move."""

    node: str
    moves: tuple[Move, ...]
    needs: tuple[tuple[str, int], ...]
    budget_needs: tuple[tuple[str, int], ...]
    devices: tuple[tuple[DeviceKey, DeviceRef], ...] = ()


@dataclass(frozen=True, slots=True)
class Assessment:
    """Every reason the binder has about one request (what `decide`'s refusal message
    summarises), for the operator's tools (`model.explain`). Reasons are `model.reasons`
    values.

    `set_problems`: reasons that refuse the request whatever the node (a device missing or
    listed twice, a class missing or not entitled, the budget). `nodes`: per node asked
    about, why it is not eligible for the whole set (B3, the same reasons as the refusal
    message; empty: eligible), only when the set's classes resolve. `holding`: members
    Bound per node. `decision`: what `decide` answers (no limit), None when not asked for."""

    set_problems: tuple[Reason, ...]
    nodes: Mapping[str, tuple[Reason, ...]]
    holding: Mapping[str, int]
    decision: Decision | None


class Rule(StrEnum):
    """Which rule decided (`Decision.rule`; the value is the `rule` label of
    `gpu_binder_decisions_total` and of the coordinator's log lines): `B1` gathered the set
    on one node (moves or binds), `B5A`/`B5B` kept it on its cordoned node, `B6` it is
    already placed, `REFUSED` refused it (B1(b)); `D3` a defragmenting move the coordinator
    decided (docs/contract.md §3a); `LEDGERS` a refusal by the node actors after the model found
    room (the coordinator's, never `decide`'s)."""

    B1 = "B1"
    B5A = "B5a"
    B5B = "B5b"
    B6 = "B6"
    REFUSED = "refused"
    D3 = "D3"
    LEDGERS = "ledgers"


@dataclass(frozen=True, slots=True)
class Decision:
    """The binder's answer to one request.

    Succeeded: `node` is `placements[0].node`; for rule B1 `placements` are eligible
    nodes in B4 order (at most the `limit` given to `decide`), for B5a, B5b, B6 one
    placement on the current node with no moves and no needs. Refused (rule REFUSED):
    `node` None, no placements. `outcome` says why, typed (`model.reasons`: `SetRefused`
    for a refusal, else `Placed`, `KeptCordoned`, `AlreadyPlaced`); `message` renders it:
    what the binder writes (B1)."""

    request_id: str
    result: Result
    node: str | None
    placements: tuple[Placement, ...]
    rule: Rule
    outcome: Outcome

    @property
    def message(self) -> str:
        """The text the binder writes on every member (`outcome` rendered)."""
        return self.outcome.render()

    @property
    def reason(self) -> SetRefused | None:
        """The typed refusal (code, category and data); None when Succeeded."""
        return self.outcome if isinstance(self.outcome, SetRefused) else None


def decide(snapshot: Snapshot, request: Request, *, limit: int | None = MAX_PLACEMENTS) -> Decision:
    """Judge `request` against `snapshot` (B1–B6). Reservations of the request itself are
    not counted against it. `limit` bounds the placements of a B1 success (None: every
    eligible node).

    Refuses the whole request when a device is missing or listed twice, a member's class is
    missing or not entitled, or the Pending members would take the tenant over budget for a
    resource (usage + Pending members > budget; moves do not change usage). Otherwise:
    B6 when the set is Bound entirely on one eligible node; B5(a)/(b) for a set Bound
    entirely on one cordoned node (B5(b) also yields when the node does not match the
    request's nodeSelector, a choice beyond the seed, since the VMI could not run there);
    else B1 over the eligible nodes (B3) in B4 order, or refused with a message naming every
    device and its node and why each candidate node failed (see MESSAGE_NODES).

    Raises ValueError when `limit` is below 1; never raises for any snapshot or request.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1 or None, got {limit}")
    return judge(snapshot, request, limit)


def request_ref(request: Request) -> RequestRef:
    """How messages name `request` ("<namespace>/<vmi> request <id>")."""
    return RequestRef(request.namespace, request.vmi, request.id)


def placed(request: Request, placement: Placement) -> Placed:
    """The Succeeded outcome of a B1 placement (binds, then moves, in request order)."""
    return Placed(request_ref(request), placement.node,
                  tuple(m.device[1] for m in placement.moves if m.from_node is None),
                  tuple((m.device[1], m.from_node) for m in placement.moves if m.from_node is not None),
                  tuple((key[1], ref.device) for key, ref in placement.devices))


def describe_placement(request: Request, placement: Placement) -> str:
    """The Succeeded message of a B1 placement, e.g. "placed tenant-a/vm-1 request r1 on
    node-2: bind gpu-b; move gpu-a from node-1" (`placed` rendered)."""
    return placed(request, placement).render()


def apply_decision(snapshot: Snapshot, request: Request, decision: Decision, *, now: datetime) -> Snapshot:
    """The snapshot after the binder carried out `decision`: for Succeeded every member Bound
    on `decision.node` (`boundAt` = `now` for those that changed node), for Refused no
    placement change; in both, each member's bindRequest (created from `request` if it lacks
    one of this id) gets result, message and node; the request's reservations are dropped.
    Missing members are skipped. Device mode: a Succeeded member records the device its
    first placement chose for it (DR4: re-pointing one already Bound there); a member moved
    to a node without a chosen device records none (`model.device.records.record_after`)."""
    snap = snapshot.without_reservation(request.id)
    ok = decision.result is Result.SUCCEEDED
    node = decision.node if ok else None
    chosen = dict(decision.placements[0].devices) if ok and decision.placements else {}
    updated = []
    written: dict[tuple, BindRequest] = {}  # members usually carry equal requests: share one
    for name in dict.fromkeys(request.devices):
        d = snap.device(request.namespace, name)
        if d is None:
            continue
        st = d.status
        old = st.bind_request
        key = ((request.id, request.vmi, request.devices, request.requested_at, request.node_selector,
                request.tolerations, request.priority)
               if old is None or old.id != request.id else
               (old.id, old.vmi, old.devices, old.requested_at, old.node_selector, old.tolerations,
                old.priority))
        br = written.get(key)
        if br is None:
            br = written[key] = BindRequest(*key[:5], decision.result, decision.message, node,
                                            tolerations=key[5], priority=key[6])
        moved = ok and d.bound_node != node
        if moved:
            st = DeviceStatus(Phase.BOUND, node, now, st.attached_to, br, record_after(st, d.key, chosen, True))
        else:
            st = DeviceStatus(st.phase, st.node_name, st.bound_at, st.attached_to, br,
                              record_after(st, d.key, chosen, False))
        updated.append(GPUDevice(d.namespace, d.name, d.class_name, d.template_for, st,
                                 d.resource_version, d.uid, d.created_at, d.deleting))
    return snap.with_devices(updated)


# --- the judgement ----------------------------------------------------------------------------


class _Set:
    """A request's members resolved against a snapshot, with the per-node questions."""

    def __init__(self, snap: Snapshot, request: Request, members: list[GPUDevice], class_names: list[str]):
        self.snap, self.request, self.class_names = snap, request, class_names
        res_of = {c: snap.classes[c].resource_name for c in class_names}
        self.total: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        self.here: dict[str, dict[str, int]] = {}
        self.members = members
        for m in members:
            res = res_of[m.class_name]
            self.total[res] = self.total.get(res, 0) + 1
            node = m.bound_node
            if node is None:
                self.pending[res] = self.pending.get(res, 0) + 1
            else:
                on = self.here.setdefault(node, {})
                on[res] = on.get(res, 0) + 1
        self.resources = sorted(self.total)
        self.n_bound = len(members) - sum(self.pending.values())
        self.where = [(m.key, m.status.node_name if m.status.phase is Phase.BOUND else None) for m in members]
        self.budget_needs = tuple(sorted(self.pending.items()))
        self.dev = snap.mode.for_set(snap, request.id, members, class_names)
        """The set's device-mode questions (DR2-DR4, `model.device.choice.SetDevices`):
        count mode's null object when it has no device-mode class."""

    def problems(self, node: str) -> list[Reason]:
        """Why `node` is not eligible (B3) for the whole set; empty when it is."""
        snap = self.snap
        n = snap.nodes.get(node)
        if n is None:
            return [NodeGone()]
        out = n.placement_reasons()
        taints = snap.untolerated_taints(node, self.request.tolerations)
        if taints:
            out.append(TaintsNotTolerated(tuple(str(t) for t in taints)))
        unserved = [c for c in self.class_names if not snap.serves(node, c)]
        if unserved:
            out.append(ClassesNotServed(tuple(unserved)))
        sel = self.request.node_selector
        if sel and not labels_include(snap.node_labels(node), sel):
            have = dict(snap.node_labels(node))  # name only the entries the node lacks
            out.append(SelectorMismatch(tuple((k, v) for k, v in sel if have.get(k) != v)))
        here = self.here.get(node, {})
        short = False
        # a class the node does not serve is the reason; its units there (another class's
        # devices of the same DeviceClass or resource) are not room for the set
        unserved_res = {snap.classes[c].resource_name for c in unserved} - {
            snap.classes[c].resource_name for c in self.class_names if c not in unserved}
        for res in self.resources:
            alloc = snap.allocatable(node, res)
            if alloc <= 0 or res in unserved_res:
                continue  # reported as a class it does not serve
            need = self.total[res] - here.get(res, 0)
            free = snap.free(node, res)
            if free < need:
                short = True
                used = snap.used(node, res)
                foreign = snap.foreign(node, res)
                if used > alloc:
                    out.append(LostCapacity(res, used - foreign, foreign, alloc))
                else:
                    out.append(NoRoom(res, need, max(free, 0), foreign))
        return out if unserved else self.dev.problems(node, out, short)  # DR3: sizes, groups

    def leftover(self, node: str) -> int:
        here = self.here.get(node, {})
        return sum(self.snap.free(node, r) - (self.total[r] - here.get(r, 0)) for r in self.resources)

    def elsewhere(self, limit: int | None) -> list[tuple[int, str]]:
        """`eligible_elsewhere` as the set's device questions order and filter it (DR4:
        only nodes where a group is free, tightest group first); for a set of one resource
        and a `limit`, from the snapshot's ranking when the set's device questions have one
        (`SetDevices.ranked_elsewhere`: the same nodes, without a look at every node)."""
        if limit is not None and len(self.resources) == 1:
            found = self.dev.ranked_elsewhere(self.eligible_node, self.tightest, limit)
            if found is not None:
                return found
        return self.dev.elsewhere(self.eligible_elsewhere, limit)

    def eligible_node(self, name: str) -> int | None:
        """For a set of one resource: `name`'s leftover when `eligible_elsewhere` lists it
        (placeable, advertising the resource with room for the set, holding no member,
        serving every class, matching the selector, its hard taints tolerated), else None."""
        snap = self.snap
        r0 = self.resources[0]
        if name in self.here or name in snap.unplaceable_nodes() or name not in snap.nodes:
            return None
        if snap.allocatable(name, r0) <= 0:
            return None
        lo = snap.free(name, r0) - self.total[r0]
        if lo < 0:
            return None
        for c in self.class_names:
            if name not in snap.serving_nodes(c):
                return None
        sel = self.request.node_selector
        if sel and not labels_include(snap.node_labels(name), sel):
            return None
        if snap.has_hard_taints(name) and snap.untolerated_taints(name, self.request.tolerations):
            return None
        return lo

    def tightest(self) -> Iterator[tuple[int, str]]:
        """For a set of one resource holding no member: (leftover, name) of every node
        `eligible_node` may accept (placeable, advertising the resource, with room for the
        set), least leftover first, then by name, each with the leftover `eligible_node`
        gives it; lazily, from the snapshot's free buckets (`Snapshot.free_buckets`): a walk
        that stops early reads only the buckets it reached. The other conditions are
        `eligible_node`'s."""
        r0 = self.resources[0]
        t0 = self.total[r0]
        buckets = self.snap.free_buckets(r0)
        for f in sorted(k for k in buckets if k >= t0):
            lo = f - t0
            for name in buckets[f]:
                yield lo, name

    def eligible_elsewhere(self, limit: int | None) -> list[tuple[int, str]]:
        """Eligible nodes holding no member, as sorted (leftover, name), at least the first
        `limit` in B4 order (all when None). Walks schedulable nodes tightest first."""
        snap, total = self.snap, self.total
        r0 = min(self.resources, key=lambda r: (len(snap.advertising_nodes(r)), r))
        t0 = total[r0]
        others = [r for r in self.resources if r != r0]
        serving = sorted((snap.serving_nodes(c) for c in self.class_names), key=len)
        sel = self.request.node_selector
        tol = self.request.tolerations
        holding = self.here
        buckets = snap.free_buckets(r0)
        found: list[tuple[int, str]] = []
        for f in sorted(k for k in buckets if k >= t0):
            if limit is not None and len(found) >= limit and (
                    not others or sum(1 for lo, _ in found if lo < f - t0) >= limit):
                break
            for name in buckets[f]:
                if name in holding:
                    continue
                for s in serving:
                    if name not in s:
                        break
                else:
                    if sel and not labels_include(snap.node_labels(name), sel):
                        continue
                    if snap.has_hard_taints(name) and snap.untolerated_taints(name, tol):
                        continue
                    lo = f - t0
                    for r in others:
                        fr = snap.free(name, r) - total[r]
                        if fr < 0:
                            break
                        lo += fr
                    else:
                        found.append((lo, name))
                        if not others and limit is not None and len(found) >= limit:
                            break
        found.sort()
        return found

    def placement(self, node: str) -> Placement:
        moves = tuple([Move(key, at, node) for key, at in self.where if at != node])
        here = self.here.get(node)
        if here is None:
            needs = tuple([(r, self.total[r]) for r in self.resources])
        else:
            needs = tuple([(r, self.total[r] - here.get(r, 0)) for r in self.resources
                           if self.total[r] - here.get(r, 0) > 0])
        return Placement(node, moves, needs, self.budget_needs, self.dev.assign(node))

    def explain(self) -> Reason:
        """The per-node reason of a refusal, at most MESSAGE_NODES nodes (see there)."""
        snap = self.snap
        holding = sorted(self.here, key=lambda n: (self.n_bound - sum(self.here[n].values()), n))
        advertising: set[str] = set()
        for r in self.resources:
            advertising.update(snap.advertising_nodes(r))
        rest = advertising - set(holding)
        total = len(holding) + len(rest)
        if total == 0:
            return NoNodeServes(tuple(self.class_names))
        shown = holding[:MESSAGE_NODES]
        if len(shown) < MESSAGE_NODES and rest:
            served = frozenset.intersection(*(snap.serving_nodes(c) for c in self.class_names)) & rest
            sel = self.request.node_selector
            matching = {n for n in served if labels_include(snap.node_labels(n), sel)} if sel else served
            cordoned = matching & snap.unplaceable_nodes()
            capacity_only = matching - cordoned
            buckets = snap.free_buckets(self.resources[0])
            ranked = []  # capacity-only failures, most free first: every one is in a bucket
            for f in sorted(buckets, reverse=True):
                ranked += [n for n in buckets[f] if n in capacity_only]
                if len(shown) + len(ranked) >= MESSAGE_NODES:
                    break
            for group in (cordoned, served - matching, rest - served):
                if len(shown) + len(ranked) >= MESSAGE_NODES:
                    break
                ranked += sorted(group)
            shown += ranked[:MESSAGE_NODES - len(shown)]
        return NoEligibleNode(tuple(NodeProblems(n, tuple(self.problems(n))) for n in shown),
                              total - len(shown))


def _resolve(snap: Snapshot, request: Request) -> tuple[list[GPUDevice], list[DeviceAt], list[Reason], list[str]]:
    """The request's members against `snap`: (members found, each listed device with its
    node, set-level problems — a device missing or listed twice, a class missing or not
    entitled — and the members' class names in first-seen order)."""
    ns = request.namespace
    members: list[GPUDevice] = []
    described: list[DeviceAt] = []
    problems: list[Reason] = []
    seen: set[str] = set()
    for name in request.devices:
        if name in seen:
            problems.append(DeviceListedTwice(name))
            continue
        seen.add(name)
        d = snap.device(ns, name)
        if d is None:
            described.append(DeviceAt(name, found=False))
            problems.append(DeviceNotFound(name))
            continue
        members.append(d)
        described.append(DeviceAt(name, d.bound_node))
    if not request.devices:
        problems.append(NoDevices())
    class_names = list(dict.fromkeys(m.class_name for m in members))
    classes = snap.classes
    for c in class_names:
        if c not in classes:
            problems.append(ClassNotFound(c))
        elif not snap.entitled(ns, c):
            problems.append(NotEntitled(ns, c))
        elif classes[c].problem is not None:
            problems.append(ClassProblem(c, classes[c].problem))
    mixed = mixed_modes(snap, class_names)
    if mixed is not None:
        problems.append(mixed)
    return members, described, problems, class_names


def size_nowhere(snap: Snapshot, counts: Mapping[str, int]) -> bool:
    """DR3: some device-mode class of `counts` asks a size (`{size}` in its matchAttribute)
    that no node serving the class has (a set of 3 on HGX boards): no room would ever take
    the set, so W1 names the sizes (per node) rather than the units free."""
    return snap.mode.size_nowhere(snap, counts)


def mixed_modes(snap: Snapshot, class_names: Iterable[str]) -> MixedModes | None:
    """DR1: `MixedModes` when the known classes among `class_names` are of both modes (one
    set never mixes them: KubeVirt refuses such a VMI), else None."""
    device, count = [], []
    for c in class_names:
        if c in snap.classes:
            (device if c in snap.mode.device_classes else count).append(c)
    return MixedModes(tuple(device), tuple(count)) if device and count else None


def _budget_problems(snap: Snapshot, s: _Set) -> list[Reason]:
    """The budget refusals of the set's Pending members (moves do not change usage); then,
    per resource, the first budget scoped on the set's PriorityClass it takes over (P1,
    `Snapshot.scoped_budget_refusal`: its Bound members recorded under another class enter
    that scope too)."""
    ns = s.request.namespace
    out: list[Reason] = []
    for res in s.resources:
        adds = s.pending.get(res, 0)
        budget = snap.budget_of(ns, res)
        if adds and budget is not None:
            bound, reserved = snap.tenant_counts(ns, res)
            if bound + reserved + adds > budget:
                out.append(BudgetExhausted(ns, res, bound, budget, adds, reserved))
                continue
        if snap.scoped_budgets(ns, res):
            classes = snap.classes
            bound = [priority_class_of(m) for m in s.members if m.bound_node is not None
                     and m.class_name in classes and classes[m.class_name].resource_name == res]
            found = snap.scoped_budget_refusal(ns, res, s.request.priority.class_name, adds, bound)
            if found is not None:
                out.append(found)
    return out


def _without_own_holds(snap: Snapshot, request: Request) -> Snapshot:
    """`snap` without the reservations of `request` itself (they are not counted against it),
    nor the hold of its VMI's nomination (P4: the room nominated for it is its own)."""
    mine = nomination_hold_id(request.namespace, request.vmi) if request.vmi else None
    for r in snap.reservations:
        if r.request_id == request.id:
            snap = snap.without_reservation(request.id)
            break
    if mine is not None and any(r.request_id == mine for r in snap.reservations):
        snap = snap.without_reservation(mine)
    return snap


def _refuse(request: Request, devices: list[DeviceAt], reasons: list[Reason]) -> Decision:
    """B1(b): Refused, naming every device and its node, then the reasons."""
    refusal = SetRefused(tuple(devices), tuple(reasons), request_ref(request))
    return Decision(request.id, Result.REFUSED, None, (), Rule.REFUSED, refusal)


def _keep(request: Request, node: str, rule: Rule, stay: tuple[str, ...] = (),
          devices: tuple[tuple[DeviceKey, DeviceRef], ...] = ()) -> Decision:
    """Succeeded in place on `node` (B6, or B5 with the Stay classes `stay`), nothing moved;
    `devices` (B5 in device mode, DR4) the members' devices of `node` when some are
    re-pointed (empty: the records stay as they are)."""
    ref = request_ref(request)
    outcome = (AlreadyPlaced(ref, node) if rule is Rule.B6 else
               KeptCordoned(ref, node, rule, stay, tuple((key[1], r.device) for key, r in devices)))
    return Decision(request.id, Result.SUCCEEDED, node, (Placement(node, (), (), (), devices),), rule,
                    outcome)


def _keep_cordoned(s: _Set, home: str, rule: Rule, stay: tuple[str, ...] = ()) -> Decision | None:
    """B5(a)/(b) keeping the set on its cordoned `home`. Count mode: kept as it is. Device
    mode (DR2-DR4), as B6 checks a set: kept as it is only when the records still hold there
    (`SetDevices.records_hold`: each recorded device still in the node's slices, not tainted
    NoSchedule/NoExecute, recorded by another device or held by another request, the class's
    constraint met; a claim allocating a recorded device reads as the set's own, DR5); else
    kept with its members re-pointed to a group of the node's devices free for it (DR4: a
    status write, not a move); None when the node has no such group (the set is then treated
    like any other: moved if some node has room, else refused naming the node's
    `NoDeviceGroup`)."""
    if s.dev.records_hold(home):
        return _keep(s.request, home, rule, stay)
    devices = s.dev.repointed(home)
    return None if devices is None else _keep(s.request, home, rule, stay, devices)


def _in_place(s: _Set, limit: int | None) -> tuple[Decision | None, list[tuple[int, str]] | None]:
    """B6 and B5 for a set with nothing Pending, Bound entirely on one node: the decision
    to keep it there (None: not kept), and the eligible nodes elsewhere when B5(a) had to
    look for them (None: not looked for), so the caller need not look again. In device mode
    both look at the records (B6 `records_hold`, B5 `_keep_cordoned`)."""
    if s.pending or len(s.here) != 1:
        return None, None
    snap, request = s.snap, s.request
    (home,) = s.here
    home_problems = s.problems(home)
    if not home_problems:
        if s.dev.records_hold(home):
            return _keep(request, home, Rule.B6), None
        return None, None  # device mode: a new choice on the same node (re-points, DR4)
    if home not in snap.nodes or not snap.nodes[home].unschedulable:
        return None, None
    stay = tuple(c for c in s.class_names if snap.classes[c].on_cordon is OnCordon.STAY)
    if stay:  # B5(b), unless the node lost capacity, no longer serves or does not match
        blocked = (any(snap.lost_capacity(home, r) for r in s.resources)
                   or any(not snap.serves(home, c) for c in s.class_names)
                   or (request.node_selector
                       and not labels_include(snap.node_labels(home), request.node_selector)))
        return (None if blocked else _keep_cordoned(s, home, Rule.B5B, stay)), None
    if [p.code for p in home_problems] != [Code.CORDONED]:
        return None, None
    elsewhere = s.elsewhere(limit)  # B5(a): the cordon only, and no room elsewhere
    return (None if elsewhere else _keep_cordoned(s, home, Rule.B5A)), elsewhere


def _candidates(s: _Set, limit: int | None, elsewhere: list[tuple[int, str]] | None) -> list[str]:
    """B3 and B4: the eligible nodes, at most `limit` (None: all), best first — nodes
    holding members (fewest moves, then tightest fit, then name), then the others (tightest
    fit, then name; `elsewhere` when already found for at least `limit`). With device-mode
    classes (DR4): fewest moves, then the tightest group, then the tightest node, then name."""
    ranked = sorted(((s.n_bound - sum(s.here[n].values()), s.dev.fit(n), s.leftover(n), n)
                     for n in s.here if not s.problems(n)))  # count mode: fit () for all
    nodes = [r[-1] for r in ranked]
    if limit is None or len(nodes) < limit:
        if elsewhere is None:
            elsewhere = s.elsewhere(None if limit is None else limit - len(nodes))
        nodes += [n for _, n in elsewhere]
    return nodes if limit is None else nodes[:limit]


def judge(snap: Snapshot, request: Request, limit: int | None) -> Decision:
    """`decide` without the check of `limit` (shared with `model.check`): set-level
    problems, then budget, then the set kept in place (B6, B5), then B1 over the
    candidates, else refused with the per-node reasons."""
    snap = _without_own_holds(snap, request)
    members, devices, problems, class_names = _resolve(snap, request)
    if problems:
        return _refuse(request, devices, problems)
    s = _Set(snap, request, members, class_names)
    problems = _budget_problems(snap, s)
    if problems:
        return _refuse(request, devices, problems)
    kept, elsewhere = _in_place(s, limit)
    if kept is not None:
        return kept
    nodes = _candidates(s, limit, elsewhere)
    if not nodes:
        return _refuse(request, devices, [s.explain()])
    placements = tuple(s.placement(n) for n in nodes)
    return Decision(request.id, Result.SUCCEEDED, nodes[0], placements, Rule.B1,
                    placed(request, placements[0]))


def decide_on(snapshot: Snapshot, request: Request, node: str) -> tuple[Decision, tuple | None]:
    """`decide` restricted to `node`, for a plan that changes that node alone
    (`model.preemption`, P3): the same set-level and budget refusals; then Succeeded by B1
    with one placement on `node` when it is eligible for the whole set (B3, DR3), else
    Refused naming that node's problems (a `NoEligibleNode` of `node` alone). B5 and B6 are
    not looked at (a set kept or already placed is not refused for room). With the Decision,
    the B4/DR4 rank `node` has among the eligible nodes, a tuple (moves, tightest group,
    tightest fit, name) comparable across snapshots of one fleet, as `judge` orders its
    candidates; None when Refused. Pure; never raises for any snapshot, request or node."""
    snap = _without_own_holds(snapshot, request)
    members, devices, problems, class_names = _resolve(snap, request)
    if problems:
        return _refuse(request, devices, problems), None
    s = _Set(snap, request, members, class_names)
    problems = _budget_problems(snap, s)
    if problems:
        return _refuse(request, devices, problems), None
    here = s.problems(node)
    if here:
        return _refuse(request, devices, [NoEligibleNode((NodeProblems(node, tuple(here)),), 0)]), None
    placement = s.placement(node)
    rank = (s.n_bound - sum(s.here.get(node, {}).values()), s.dev.fit(node), s.leftover(node), node)
    return (Decision(request.id, Result.SUCCEEDED, node, (placement,), Rule.B1, placed(request, placement)),
            rank)


def recovery_devices(snap: Snapshot, request: Request, node: str) -> tuple[tuple[DeviceKey, DeviceRef], ...]:
    """B7 in device mode: the devices of `node` for the request's device-mode members when
    its decision for `node` is finished after a restart (what `Placement.devices` would
    say: the members' records there kept where the group allows, DR3/DR4), whatever the
    count capacity now. Empty in count mode, for a gone node, or when no group is free
    (the members then land without a recorded device; the refusal of their VMI's claim
    is the scheduler's)."""
    snap = _without_own_holds(snap, request)
    members, _, problems, class_names = _resolve(snap, request)
    if (not members or node not in snap.nodes
            or any(c not in snap.classes for c in class_names)):
        return ()
    devices = _Set(snap, request, members, class_names).dev.repointed(node)
    return devices or ()


def assess(snapshot: Snapshot, request: Request, nodes: Iterable[str] | None = None, *,
           with_decision: bool = True) -> Assessment:
    """The binder's judgement of `request` (B1–B6) with its reasons per node: `decide`'s
    decision (no placement limit; skipped when not `with_decision`) plus, for each of
    `nodes` (None: every node of the snapshot, sorted), the B3 problems `decide` would
    report for it, and the set-level problems (device, class, entitlement, budget).
    Reservations of the request itself are not counted against it, as in `decide`. Pure;
    never raises."""
    snap = _without_own_holds(snapshot, request)
    decision = judge(snap, request, None) if with_decision else None
    members, _, problems, class_names = _resolve(snap, request)
    per_node: dict[str, tuple[Reason, ...]] = {}
    holding: dict[str, int] = {}
    if not any(c not in snap.classes for c in class_names) and request.devices:
        s = _Set(snap, request, members, class_names)
        problems = problems + _budget_problems(snap, s)
        for name in (sorted(snap.nodes) if nodes is None else nodes):
            per_node[name] = tuple(s.problems(name))
        holding = {n: sum(on.values()) for n, on in s.here.items()}
    return Assessment(tuple(problems), per_node, holding, decision)
