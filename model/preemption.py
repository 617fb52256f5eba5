"""Whole-set preemption, the pure plan (docs/contract.md §3c P2, P3): which running sets
(admitted VMIs) may yield to a set refused for room, and on which node stopping the fewest,
least important of them makes room for the whole set. Nothing here writes, waits or reads a
clock: `now` is an argument; the binder nominates, holds and deletes (P4) elsewhere.

- *Running sets* (`running_sets`): the snapshot's devices grouped by the VMI incarnation
  they are attached to (namespace, `attachedTo.vmi`, `attachedTo.admission`), every member
  Bound on one node with its bindRequest Succeeded (a group that is not so, e.g. half
  moved, is no running set and never a victim: never a partial set). A set kept for a
  stopped VM (H4, `keptUntil`) is one too, and yields like a running one of its priority.
  Its priority is its `bindRequest.priority` (P1, as the webhook recorded it). Its start is
  the latest `attachedTo.since` of its members: when this incarnation was admitted (a held
  device's `boundAt` may be years older, from an earlier VM), a few seconds before the VM
  ran, so `min_runtime` is counted from the admission.
- *P2 who may yield* (`may_yield`): a running set of strictly lower priority value than the
  preemptor's, started at least `PreemptionSettings.min_runtime` before `now`, every class of
  it with `spec.preemption: LowerPriority` (a class not found: Never, fail closed); none at
  all when the preemptor's PriorityClass says `preemptionPolicy: Never`; none whose VMI is
  being deleted already (`Snapshot.stopping`: a victim that did not die within its
  nomination's life is not named again).
- *What stopping a set frees* (`release_sets`): its template devices are deleted (their
  units and, in device mode, their recorded devices and their claim's allocation are free);
  its held devices stay Bound to the tenant where they are, idle (attachment cleared), so
  they still take their node's units and devices. No budget changes.
- *P3 the plan* (`plan_preemption`): among nodes where stopping some eligible victims, and
  D-moves of idle held devices (below), make room for the whole set, the node, victims and
  moves minimising, in order: the highest victim priority, the number of victims, the
  victims' GPUs (every device of their sets, templates and held: what the stopped VMs had),
  the victims' start times sorted newest first (later is better, compared
  lexicographically), the number of moves (fewest: B4/DR4's "fewest moves"), then the
  binder's B4/DR4 rank of the node on the snapshot without the victims and after the moves
  (fewest moves of the set's own members, tightest group, tightest fit, name), and last the
  victims' identities and the moves' (device, target node, target device), so the answer is
  deterministic. Whether a candidate makes room is `model.decide.decide_on` on the snapshot
  `release_sets` gives, after the moves (`model.defrag.apply_moves`): the binder's own
  decision restricted to the node, so device mode's groups (DR3) are never worked out here.

D-moves of idle held devices (§3a D1-D5, "where they help"):

- *What may move* (`_movers`): an idle held device on the candidate node that
  `model.defrag.movable` allows (D1: held, Bound, no attachment, no bind request, not being
  deleted, class `Move`; device mode: it records its device, DR2), of a resource the set
  takes, with somewhere to go now; the first `MAX_MOVE_CANDIDATES` (4) by key per node, so at
  most 4 moves a plan. Only devices idle *now*: a victim's own held devices are attached until
  its VMI stops, so they are never moved by a plan (a simplification: moving them once the
  victims stopped could save another victim; the plan does not look that far).
- *Where it goes*, each move in turn by device key, counting the plan's earlier moves: off the
  node to the tightest node its class may use (`model.defrag.move_targets`: placeable, serving
  the class, no hard taint, a free unit counting reservations in flight, D2; then name), in
  device mode recording the device a one-device set takes there (`model.defrag.device_target`:
  a free, untainted, unclaimed device, DR4's buddy best fit); or, device mode, re-pointed on
  its own node to the device a one-device set takes among the node's free devices (DR4). A
  move never changes who holds what (D5): the device stays its tenant's, Bound.
- *Only where they help*: the number of moves comes after every victim criterion in the key,
  and each victim subset takes the fewest moves that make room with it, so a plan moves
  devices only when that gives better victims (fewer, of lower priority, fewer GPUs, newer)
  than every plan without, and among equal victims the fewest moves win.
- *Moves alone are no plan*: a plan stops at least one set. A node where some choice of moves
  makes room with no victim is no candidate at all: its room is defragmentation's to make
  (§3a, under D3's rule, when the operator turned it on), and a victim stopped there would
  stop for nothing. Whether the set fits now (`FitsWithoutPreemption`) or is refused for
  another reason (`NotRefusedForRoom`) is judged without moves, as before moves existed.

Cost: one decision on the whole snapshot (is the set refused for room?), two passes over the
devices (the running sets, the idle held devices of the nodes with victims), one B3
assessment of the nodes with victims, per class one pass over the nodes for the move
targets, then per node an arithmetic bound (free units plus every eligible victim's
template units plus the units its movers could free, per resource; device mode: units are
devices, so it is an upper bound) before any decision on a modified snapshot; subsets are
tried per node in P3's order (priority threshold ascending, subset size ascending) and only
while they could beat the best plan found so far. A node with movers costs one more
decision (could moves alone make room? then up to 80 choices of moves), and a victim subset
that does not make room alone one decision with every mover gone (an upper bound), then the
choices of moves by count, at most sum over m <= 4 of C(4, m) * 2^m = 81 decisions (device
mode; count mode 16).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from itertools import combinations, product
from typing import Collection, Iterable, Sequence

from model.decide import Placement, Request, assess, decide, decide_on
from model.defrag import DefragMove, apply_moves, device_target, movable, move_targets
from model.device.dra import DeviceRef
from model.nomination import RoomMove
from model.priority import DEFAULT_PRIORITY, ClassPreemption, Priority
from model.reasons import (CAPACITY_CODES, Code, FitsWithoutPreemption, NoDeviceGroup, NoEligibleNode,
                           NoEligibleVictim, NotRefusedForRoom, NothingFreesEnough, PreemptorNever, Preempts,
                           Reason)
from model.snapshot import Snapshot
from model.types import DeviceKey, GPUDevice, Result

DEFAULT_MIN_RUNTIME = timedelta(minutes=10)
"""`preemption.minRuntime`'s default (P2)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
_ROOM_CODES = CAPACITY_CODES | {Code.NO_DEVICE_GROUP}
"""Node problems stopping victims can cure (a size the node has nowhere excepted)."""


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    """The operator's preemption settings: `min_runtime` (`preemption.minRuntime`, P2), how
    long a set must have run before it may yield (0: at once)."""

    min_runtime: timedelta = DEFAULT_MIN_RUNTIME

    def __post_init__(self) -> None:
        """Raises ValueError for a negative `min_runtime`."""
        if self.min_runtime < timedelta(0):
            raise ValueError(f"preemption.minRuntime must not be negative, got {self.min_runtime}")


SetKey = tuple[str, str, str | None]
"""(namespace, VMI name, admission id) of a running set: one VMI incarnation."""


@dataclass(frozen=True, slots=True)
class RunningSet:
    """What one admitted VMI holds (see the module docstring): the set `key` (namespace,
    vmi, admission), Bound on `node`; `templates` and `held` its device names (sorted);
    `classes` its GPUClass names (sorted); `priority` (P1, from its bindRequest);
    `started` the latest `attachedTo.since` of its members (UTC); `kept` True for a set kept
    for a stopped VM (H4); `request_id` its bindRequest id."""

    namespace: str
    vmi: str
    admission: str | None
    node: str
    templates: tuple[str, ...]
    held: tuple[str, ...]
    classes: tuple[str, ...]
    priority: Priority
    started: datetime
    kept: bool = False
    request_id: str = ""

    @property
    def key(self) -> SetKey:
        """(namespace, vmi, admission): the set's identity."""
        return (self.namespace, self.vmi, self.admission)

    @property
    def gpus(self) -> int:
        """Every device of the set, templates and held."""
        return len(self.templates) + len(self.held)

    @property
    def name(self) -> str:
        """"<namespace>/<vmi>", as Events name it."""
        return f"{self.namespace}/{self.vmi}"


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """P3's choice for `request` (of `priority`): stop `victims` (sorted by key) on `node`,
    then the set takes `placement` there (the decision on the snapshot without the victims:
    its moves, needs and, in device mode, `devices`, the exact device of `node` for each
    member). `rank` is the P3 key the plan won with (see `plan_key`). `moves` the idle held
    devices moved off `node` (or re-pointed on it) first, in the order to make them (by
    device key; empty when stopping the victims alone makes the room): the placement is
    the decision on the snapshot without the victims and after the moves."""

    request_id: str
    namespace: str
    vmi: str
    priority: Priority
    node: str
    victims: tuple[RunningSet, ...]
    placement: Placement
    rank: tuple
    moves: tuple[RoomMove, ...] = ()

    @property
    def devices(self) -> tuple[tuple[DeviceKey, DeviceRef], ...]:
        """Device mode: the device each member takes (empty in count mode)."""
        return self.placement.devices

    def events(self) -> tuple[Preempts, ...]:
        """One Event text per victim ("preempts t/vm-2 (priority 0) for t/vm-9 (priority
        1000) on node-3")."""
        me = f"{self.namespace}/{self.vmi}"
        return tuple(Preempts(v.name, v.priority.value, me, self.priority.value, self.node)
                     for v in self.victims)


@dataclass(frozen=True, slots=True)
class NoPlan:
    """No plan for `request_id`: `reason` says why, typed (`model.reasons.preemption`)."""

    request_id: str
    reason: Reason

    @property
    def message(self) -> str:
        return self.reason.render()


# --- running sets -----------------------------------------------------------------------------


def running_sets(snapshot: Snapshot) -> tuple[RunningSet, ...]:
    """Every running set of `snapshot` (see the module docstring), sorted by node then key.
    One pass over the devices."""
    groups: dict[SetKey, list[GPUDevice]] = {}
    for d in snapshot.devices.values():
        att = d.status.attached_to
        if att is not None:
            groups.setdefault((d.namespace, att.vmi, att.admission), []).append(d)
    out = []
    for key, members in groups.items():
        s = _running(key, members)
        if s is not None:
            out.append(s)
    out.sort(key=lambda s: (s.node, s.namespace, s.vmi, s.admission or ""))
    return tuple(out)


def _running(key: SetKey, members: list[GPUDevice]) -> RunningSet | None:
    """The running set of one group of devices attached to one incarnation, or None when it
    is not one (a member not Bound, on another node, without a Succeeded bindRequest, or
    the members not of one request)."""
    node = members[0].bound_node
    if node is None:
        return None
    first = min(members, key=lambda d: d.name).status.bind_request
    if first is None:
        return None
    templates, held, classes = [], [], set()
    started = None
    kept = False
    for d in members:
        br = d.status.bind_request
        if (d.bound_node != node or br is None or br.result is not Result.SUCCEEDED
                or br.id != first.id):
            return None
        (templates if d.template_for is not None else held).append(d.name)
        classes.add(d.class_name)
        att = d.status.attached_to
        assert att is not None
        if started is None or att.since > started:
            started = att.since
        kept = kept or att.kept_until is not None
    assert started is not None
    return RunningSet(key[0], key[1], key[2], node, tuple(sorted(templates)), tuple(sorted(held)),
                      tuple(sorted(classes)), first.priority, started, kept, first.id)


def request_priority(snapshot: Snapshot, request: Request) -> Priority:
    """The priority the webhook recorded for `request` (P1): its members' `bindRequest.priority`
    (the member of the smallest name, as `model.requests.complete_request` reads a request);
    the default (0) when no member is found."""
    members = [d for n in request.devices if (d := snapshot.device(request.namespace, n)) is not None
               and d.status.bind_request is not None and d.status.bind_request.id == request.id]
    if not members:
        return DEFAULT_PRIORITY
    br = min(members, key=lambda d: d.name).status.bind_request
    assert br is not None
    return br.priority


# --- P2 ---------------------------------------------------------------------------------------


def may_yield(snapshot: Snapshot, victim: RunningSet, preemptor: Priority, now: datetime,
              settings: PreemptionSettings = PreemptionSettings()) -> bool:
    """P2: `victim` may yield to a set of priority `preemptor` at `now`: strictly lower
    priority value, run at least `settings.min_runtime`, every class allowing it (a class
    not in the snapshot: no), the preemptor's policy not Never, and its VMI not being deleted
    already (`Snapshot.stopping`: stopping it frees nothing sooner, and naming it again would
    renew a nomination its stuck VMI let expire)."""
    return (preemptor.may_preempt and victim.priority.value < preemptor.value
            and now - victim.started >= settings.min_runtime and _classes_allow(snapshot, victim)
            and (victim.namespace, victim.vmi) not in snapshot.stopping)


def _classes_allow(snapshot: Snapshot, victim: RunningSet) -> bool:
    classes = snapshot.classes
    return all(c in classes and classes[c].preemption is ClassPreemption.LOWER_PRIORITY
               for c in victim.classes)


def eligible_victims(snapshot: Snapshot, preemptor: Priority, now: datetime,
                     settings: PreemptionSettings = PreemptionSettings(),
                     sets: Sequence[RunningSet] | None = None) -> tuple[RunningSet, ...]:
    """The running sets (`sets`, default `running_sets(snapshot)`) that may yield (P2)."""
    sets = running_sets(snapshot) if sets is None else sets
    return tuple(s for s in sets if may_yield(snapshot, s, preemptor, now, settings))


# --- what stopping frees ----------------------------------------------------------------------


def release_sets(snapshot: Snapshot, sets: Iterable[RunningSet]) -> Snapshot:
    """`snapshot` after the VMIs of `sets` stopped (see the module docstring): their template
    devices gone, their held devices idle where they are, and in device mode the devices
    their ResourceClaims allocated no longer taken (`Node.taken_devices`; a device another's
    claim allocates, `foreign_claimed`, stays taken)."""
    sets = list(sets)
    return _drop(_release_claims(snapshot, sets), sets)


def _drop(snapshot: Snapshot, sets: Sequence[RunningSet]) -> Snapshot:
    """The template devices of `sets` removed and their held devices detached."""
    gone: list[DeviceKey] = []
    idle: list[GPUDevice] = []
    for s in sets:
        gone += [(s.namespace, n) for n in s.templates]
        for n in s.held:
            d = snapshot.device(s.namespace, n)
            if d is not None:
                idle.append(replace(d, status=replace(d.status, attached_to=None)))
    return snapshot.with_changes(idle, gone)


def _release_claims(snapshot: Snapshot, sets: Sequence[RunningSet]) -> Snapshot:
    """Device mode: `snapshot` whose nodes no longer count the devices the claims of `sets`
    allocated as taken (the binder's claims: not `foreign_claimed`). Itself when none is.
    Those devices stay recorded by the sets' GPUDevices until `_drop` removes them, so for
    every other set they are as taken as before."""
    if not snapshot.mode.device_classes:
        return snapshot
    freed: dict[str, set[str]] = {}
    for s in sets:
        node = snapshot.nodes.get(s.node)
        if node is None or not node.taken_devices:
            continue
        for n in s.templates + s.held:
            d = snapshot.device(s.namespace, n)
            rec = d.status.device if d is not None else None
            if rec is not None and rec.device in node.taken_devices and rec.device not in node.foreign_claimed:
                freed.setdefault(s.node, set()).add(rec.device)
    if not freed:
        return snapshot
    return snapshot.with_nodes(replace(n, taken_devices=n.taken_devices - freed[n.name]) if n.name in freed else n
                               for n in snapshot.nodes.values())


# --- P3 ---------------------------------------------------------------------------------------


def plan_key(victims: Sequence[RunningSet], rank: tuple, moves: Sequence[RoomMove] = ()) -> tuple:
    """P3's order of a candidate (smaller is better): the highest victim priority, the
    number of victims, their GPUs, their start times newest first (later is better), the
    number of D-moves (`moves`: fewest first, B4/DR4's "fewest moves"), the node's B4/DR4
    `rank` (`model.decide.decide_on`), then the victims' keys and the moves (device key,
    target node, target device) so the answer is deterministic."""
    starts = sorted((v.started for v in victims), reverse=True)
    return (max(v.priority.value for v in victims), len(victims), sum(v.gpus for v in victims),
            tuple(-((t - _EPOCH) // _US) for t in starts), len(moves), rank,
            tuple(sorted((v.namespace, v.vmi, v.admission or "") for v in victims)),
            tuple(sorted(_move_id(m) for m in moves)))


def _move_id(m: RoomMove) -> tuple[str, str, str, str]:
    return (m.namespace, m.name, m.to_node, m.to_device.device if m.to_device is not None else "")


def plan_preemption(snapshot: Snapshot, request: Request, now: datetime,
                    settings: PreemptionSettings = PreemptionSettings()) -> PreemptionPlan | NoPlan:
    """P3: the plan for `request` (a complete request, `model.decide.Request`) on `snapshot`
    at `now`, or why there is none (`NoPlan`: the preemptor's policy is Never, the set fits
    without preemption or is refused for another reason than room, no running set may
    yield, or stopping them frees room on no node, moves or not). The plan's `moves` are the
    D-moves of idle held devices it needs (D1-D5; see the module docstring: only where they
    give better victims, never without a victim). Deterministic; never raises."""
    snapshot = snapshot.without_reservation(request.id)  # its own holds are not against it
    priority = request_priority(snapshot, request)
    if not priority.may_preempt:
        return NoPlan(request.id, PreemptorNever(priority.value, priority.class_name))
    now_decision = decide(snapshot, request, limit=1)
    if now_decision.result is Result.SUCCEEDED:
        return NoPlan(request.id, FitsWithoutPreemption(now_decision.node or ""))
    refusal = now_decision.reason
    assert refusal is not None
    if not (len(refusal.reasons) == 1 and isinstance(refusal.reasons[0], NoEligibleNode)):
        return NoPlan(request.id, NotRefusedForRoom(refusal.code))
    sets = running_sets(snapshot)
    victims = eligible_victims(snapshot, priority, now, settings, sets)
    if not victims:
        return NoPlan(request.id, _why_none(snapshot, sets, priority, now, settings))
    by_node: dict[str, list[RunningSet]] = {}
    for v in victims:
        by_node.setdefault(v.node, []).append(v)
    best = _search(snapshot, request, by_node)
    if best is None:
        return NoPlan(request.id, NothingFreesEnough(len(victims), len(by_node)))
    key, node, chosen, placement, moves = best
    return PreemptionPlan(request.id, request.namespace, request.vmi, priority, node,
                          tuple(sorted(chosen, key=lambda v: v.key[:2] + (v.admission or "",))),
                          placement, key, tuple(moves))


def _why_none(snapshot: Snapshot, sets: Sequence[RunningSet], priority: Priority, now: datetime,
              settings: PreemptionSettings) -> NoEligibleVictim:
    lower = [s for s in sets if s.priority.value < priority.value]
    young = sum(1 for s in lower if now - s.started < settings.min_runtime)
    protected = sum(1 for s in lower if not _classes_allow(snapshot, s))
    return NoEligibleVictim(priority.value, len(lower), young, protected, _duration(settings.min_runtime))


def _duration(d: timedelta) -> str:
    """Go's duration text of a whole number of seconds ("10m0s", "1h0m0s", "30s")."""
    s = int(d.total_seconds())
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m}m{sec}s" if h else f"{m}m{sec}s" if m else f"{sec}s"


class _Need:
    """The set's units per resource, and what it still needs on a node (count arithmetic,
    the cheap bound P3 prunes with); `classes` the set's classes."""

    def __init__(self, snapshot: Snapshot, request: Request) -> None:
        self.snap = snapshot
        self.res = {c.name: c.resource_name for c in snapshot.classes.values()}
        self.total: dict[str, int] = {}
        self.here: dict[str, dict[str, int]] = {}
        self.classes: set[str] = set()
        for n in request.devices:
            d = snapshot.device(request.namespace, n)
            if d is None or d.class_name not in self.res:
                continue
            self.classes.add(d.class_name)
            r = self.res[d.class_name]
            self.total[r] = self.total.get(r, 0) + 1
            if d.bound_node is not None:
                on = self.here.setdefault(d.bound_node, {})
                on[r] = on.get(r, 0) + 1

    def short(self, node: str) -> dict[str, int]:
        """Units per resource `node` lacks for the set now (only those it lacks)."""
        here = self.here.get(node, {})
        out = {}
        for r, k in self.total.items():
            lack = k - here.get(r, 0) - self.snap.free(node, r)
            if lack > 0:
                out[r] = lack
        return out

    def frees(self, victim: RunningSet) -> dict[str, int]:
        """Units per resource stopping `victim` frees on its node (its templates)."""
        out: dict[str, int] = {}
        for n in victim.templates:
            d = self.snap.device(victim.namespace, n)
            if d is not None and d.class_name in self.res:
                r = self.res[d.class_name]
                out[r] = out.get(r, 0) + 1
        return out


def _covers(short: dict[str, int], freed: Iterable[dict[str, int]]) -> bool:
    total: dict[str, int] = {}
    for f in freed:
        for r, k in f.items():
            total[r] = total.get(r, 0) + k
    return all(total.get(r, 0) >= k for r, k in short.items())


# --- D-moves of idle held devices (D1-D5 in a plan) --------------------------------------------

MAX_MOVE_CANDIDATES = 4
"""Idle held devices per node a plan may move (the first by key of those that could help), so
at most this many moves a plan."""

_MOVE = "move"
_REPOINT = "repoint"
_TARGETS = MAX_MOVE_CANDIDATES + 8
"""How many of the tightest target nodes per class are looked at (`model.defrag.move_targets`):
k moves in turn need k + 1; device mode skips nodes without a device free for the class."""


@dataclass(slots=True)
class _Movers:
    """The idle held devices of one node a plan may move (see the module docstring):
    `devices` sorted by key, at most `MAX_MOVE_CANDIDATES`; `kinds` per device key what may
    be done with it now (off the node, `_MOVE`, and in device mode re-pointed, `_REPOINT`);
    `units` per resource, how many of them could leave the node (the cheap bound); `targets`
    per class, the tightest target nodes (shared by every node of a plan; this node among
    them is skipped)."""

    node: str
    devices: list[GPUDevice]
    kinds: dict[DeviceKey, tuple[str, ...]]
    units: dict[str, int]
    targets: dict[str, list[str]]


def _movers(snapshot: Snapshot, need: _Need, nodes: Collection[str]) -> dict[str, _Movers]:
    """Per node of `nodes`, the idle held devices a plan may move there (D1, `model.defrag.movable`,
    on `snapshot`: idle now, so never a victim's held device, which is attached until its VMI
    stops), of a resource the set takes (device mode: its devices may be the set's), each
    with somewhere to go now (a node eligible for its class with a free unit, device mode: a
    free untainted device there; or, device mode, a free device of its own node to re-point
    to). One pass over the devices."""
    device_classes = snapshot.mode.device_classes
    found: dict[str, list[GPUDevice]] = {}
    for d in snapshot.devices.values():
        node = d.bound_node
        if node is None or node not in nodes or d.class_name not in need.res:
            continue
        if need.res[d.class_name] in need.total and movable(d, snapshot):
            found.setdefault(node, []).append(d)
    out: dict[str, _Movers] = {}
    targets: dict[str, list[str]] = {}  # per class, once a plan (`move_targets` is a pass over the nodes)
    for node, devices in sorted(found.items()):
        devices.sort(key=lambda d: d.key)
        mv = _Movers(node, [], {}, {}, targets)
        for d in devices:
            kinds = []
            if _target(snapshot, mv, d, {}, {}) is not None:
                kinds.append(_MOVE)
            if d.class_name in device_classes and device_target(snapshot, node, d.class_name) is not None:
                kinds.append(_REPOINT)
            if not kinds:
                continue
            mv.devices.append(d)
            mv.kinds[d.key] = tuple(kinds)
            if _MOVE in kinds:
                r = need.res[d.class_name]
                mv.units[r] = mv.units.get(r, 0) + 1
            if len(mv.devices) >= MAX_MOVE_CANDIDATES:
                break
        if mv.devices:
            out[node] = mv
    return out


def _target(snapshot: Snapshot, mv: _Movers, d: GPUDevice, used: dict[tuple[str, str], int],
            taken: dict[str, set[str]]) -> tuple[str, DeviceRef | None] | None:
    """Where `d` (an idle held device on `mv.node`) goes off its node now: the tightest node
    eligible for its class (fewest free units of its resource left after the moves counted in
    `used`, then name; B4's tightest fit, D2) with a unit free and, device mode, a free device
    not in `taken` (the one a one-device set takes there, DR4). None when there is none."""
    targets = mv.targets.get(d.class_name)
    if targets is None:
        targets = mv.targets[d.class_name] = move_targets(snapshot, d.class_name, (), _TARGETS + 1)
    res = snapshot.classes[d.class_name].resource_name
    devices = d.class_name in snapshot.mode.device_classes
    best: tuple[int, str, DeviceRef | None] | None = None
    for n in targets:
        f = snapshot.free(n, res) - used.get((n, res), 0)
        if n == mv.node or f < 1 or (best is not None and (f, n) >= best[:2]):
            continue
        ref = device_target(snapshot, n, d.class_name, taken.get(n, ())) if devices else None
        if devices and ref is None:
            continue
        best = (f, n, ref)
    return None if best is None else (best[1], best[2])


def _assign(snapshot: Snapshot, mv: _Movers, choice: Sequence[tuple[GPUDevice, str]]) -> tuple[RoomMove, ...] | None:
    """The moves of `choice` ((device, kind), by device key), each target chosen in turn
    counting the earlier ones (`_target`; a re-point records the device a one-device set takes
    among its node's free devices, DR4); None when one has nowhere to go."""
    used: dict[tuple[str, str], int] = {}
    taken: dict[str, set[str]] = {}
    out = []
    for d, kind in choice:
        res = snapshot.classes[d.class_name].resource_name
        if kind == _REPOINT:
            ref = device_target(snapshot, mv.node, d.class_name, taken.get(mv.node, ()))
            if ref is None:
                return None
            to_node: str = mv.node
        else:
            got = _target(snapshot, mv, d, used, taken)
            if got is None:
                return None
            to_node, ref = got
            used[(to_node, res)] = used.get((to_node, res), 0) + 1
        if ref is not None:
            taken.setdefault(to_node, set()).add(ref.device)
        out.append(RoomMove(d.namespace, d.name, d.class_name, res, mv.node, to_node, d.status.device, ref))
    return tuple(out)


def _moved(snap: Snapshot, moves: Sequence[RoomMove]) -> Snapshot:
    """`snap` after `moves` (`model.defrag.apply_moves`)."""
    if not moves:
        return snap
    return apply_moves(snap, [DefragMove(m.key, m.class_name, m.resource, m.from_node, m.to_node,
                                         m.from_node, "", 0, 0, m.from_device, m.to_device) for m in moves])


def _move_choices(mv: _Movers, m: int) -> Iterable[tuple[tuple[GPUDevice, str], ...]]:
    """Every choice of `m` of `mv`'s devices (by key) with one of its kinds each."""
    for devices in combinations(mv.devices, m):
        for kinds in product(*(mv.kinds[d.key] for d in devices)):
            yield tuple(zip(devices, kinds))


# --- the search -------------------------------------------------------------------------------


def _search(snapshot: Snapshot, request: Request, by_node: dict[str, list[RunningSet]]):
    """The best (key, node, victims, placement, moves) over the nodes of `by_node` (each
    node's eligible victims), or None. See the module docstring for the pruning."""
    need = _Need(snapshot, request)
    movers = _movers(snapshot, need, by_node.keys())
    covered = []
    for node, vs in by_node.items():
        short = need.short(node)
        frees = {v.key: need.frees(v) for v in vs}
        mv = movers.get(node)
        extra = [mv.units] if mv is not None else []
        if _covers(short, [*frees.values(), *extra]):
            covered.append((node, vs, short, frees, mv))
    problems = _assessed(snapshot, request, sorted(n for n, *_ in covered))
    nodes = []
    for node, vs, short, frees, mv in covered:
        if not all(p.code in _ROOM_CODES and not (isinstance(p, NoDeviceGroup) and p.missing)
                   for p in problems.get(node, ())):
            continue  # cordoned, tainted, not matching, a size it has nowhere: no victim helps
        vs = sorted(vs, key=lambda v: (v.priority.value, v.key[:2], v.admission or ""))
        extra = [mv.units] if mv is not None else []
        # the lowest threshold whose pool could cover: a bound on the node's best key
        floor = next(v.priority.value for i, v in enumerate(vs)
                     if _covers(short, [*(frees[w.key] for w in vs[:i + 1]), *extra]))
        nodes.append((floor, node, vs, short, frees, mv))
    if not nodes:
        return None
    base = _release_claims(snapshot, [v for _, _, vs, _, _, _ in nodes for v in vs])
    nodes.sort(key=lambda t: (t[0], t[1]))
    best = None
    for floor, node, vs, short, frees, mv in nodes:
        if best is not None and floor > best[0][0]:
            break
        found = _node_best(_Node(base, snapshot, request, node, short, frees, mv), vs, best)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return best


def _assessed(snapshot: Snapshot, request: Request, nodes: list[str]) -> dict[str, tuple[Reason, ...]]:
    """B3's problems of each of `nodes` for the set now (`model.decide.assess`)."""
    return dict(assess(snapshot, request, nodes, with_decision=False).nodes)


@dataclass(slots=True)
class _Node:
    """One candidate node's search: `base` (the snapshot with every candidate's claims
    released), `snapshot` (as it is now: where moves go), the set's `request`, what `node`
    lacks (`short`), what each victim frees (`frees`), its idle held devices (`movers`)."""

    base: Snapshot
    snapshot: Snapshot
    request: Request
    node: str
    short: dict[str, int]
    frees: dict[SetKey, dict[str, int]]
    movers: _Movers | None

    def covers(self, victims: Iterable[RunningSet]) -> bool:
        """The cheap bound: the victims' templates and every mover leaving cover `short`."""
        extra = [self.movers.units] if self.movers is not None else []
        return _covers(self.short, [*(self.frees[v.key] for v in victims), *extra])

    def feasible(self, victims: Sequence[RunningSet], moves: Sequence[RoomMove] = ()
                 ) -> tuple[tuple, Placement] | None:
        """(the node's B4/DR4 rank, the placement) when the set is placed on `node` once
        `victims` stopped and `moves` made (`base` already counts the claims released), else
        None."""
        decision, rank = decide_on(_moved(_drop(self.base, victims), moves), self.request, self.node)
        if rank is None:
            return None
        return rank, decision.placements[0]

    def could(self, victims: Sequence[RunningSet]) -> bool:
        """Whether `victims` stopped and every mover gone from the node (more room than any
        choice of moves leaves, in units and devices) would make room: when not, no subset of
        `victims` with any moves does."""
        snap = _drop(self.base, victims)
        if self.movers is not None:
            snap = snap.without_devices(d.key for d in self.movers.devices)
        return decide_on(snap, self.request, self.node)[1] is not None


def _node_best(n: _Node, vs: list[RunningSet], best):
    """The best candidate on `n.node` (victims among `vs`, sorted by priority) that could
    beat `best`: thresholds ascending, then sizes ascending, all subsets of the first size that
    makes room compared by `plan_key` (a subset whose victims alone already lose to the best
    so far is not decided), each with the fewest moves that make room with it
    (`_fewest_moves`); None when none beats it."""
    if _moves_alone(n):
        return None  # its room is defragmentation's to make: a victim here would stop for nothing
    thresholds = sorted({v.priority.value for v in vs})
    for p in thresholds:
        if best is not None and p > best[0][0]:
            return None
        pool = [v for v in vs if v.priority.value <= p]
        if not n.covers(pool) or not n.could(pool):
            continue  # stopping the whole pool (moves or not) does not make room: no subset of it does
        for k in range(1, len(pool) + 1):
            if best is not None and (p, k) > best[0][:2]:
                return None
            found = None
            for combo in combinations(pool, k):
                if combo[-1].priority.value != p:
                    continue  # its highest is below p: a lower threshold already said no
                if not n.covers(combo):
                    continue
                head = plan_key(combo, ())[:4]  # what the victims alone decide of the key
                if (best is not None and head > best[0][:4]) or (found is not None and head > found[0][:4]):
                    continue  # loses whatever the node's rank: no decision needed
                got = _fewest_moves(n, combo, head, best, found)
                if got is not None and (found is None or got[0] < found[0]):
                    found = got
            if found is not None:
                return found if best is None or found[0] < best[0] else None
    return None


def _moves_alone(n: _Node) -> bool:
    """Whether some choice of `n.movers` makes room on `n.node` without any victim (a plan
    stops at least one set: such a node is no candidate, see the module docstring)."""
    mv = n.movers
    if mv is None or not n.could(()):
        return False
    for m in range(1, len(mv.devices) + 1):
        for choice in _move_choices(mv, m):
            moves = _assign(n.snapshot, mv, choice)
            if moves is not None and n.feasible((), moves) is not None:
                return True
    return False


def _fewest_moves(n: _Node, combo: Sequence[RunningSet], head: tuple, *bars):
    """The best (key, node, victims, placement, moves) of `combo` on `n.node`: without moves
    when stopping it makes room, else with the fewest moves of `n.movers` that do (every
    choice of that many compared by `plan_key`); None when none does, or when it could no
    longer beat one of `bars` (same victims' head, fewer moves)."""
    done = n.feasible(combo)
    if done is not None:
        return plan_key(combo, done[0]), n.node, combo, done[1], ()
    mv = n.movers
    if mv is None or not n.could(combo):
        return None
    for m in range(1, len(mv.devices) + 1):
        if any(b is not None and b[0][:5] < head + (m,) for b in bars):
            return None  # as good victims with fewer moves exist already
        got = None
        for choice in _move_choices(mv, m):
            moves = _assign(n.snapshot, mv, choice)
            if moves is None:
                continue
            done = n.feasible(combo, moves)
            if done is None:
                continue
            key = plan_key(combo, done[0], moves)
            if got is None or key < got[0]:
                got = (key, n.node, combo, done[1], moves)
        if got is not None:
            return got
    return None


__all__ = ["DEFAULT_MIN_RUNTIME", "MAX_MOVE_CANDIDATES", "NoPlan", "PreemptionPlan", "PreemptionSettings", "RunningSet",
           "SetKey", "eligible_victims", "may_yield", "plan_key", "plan_preemption", "release_sets",
           "request_priority", "running_sets"]
