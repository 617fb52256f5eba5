"""Defragmentation (docs/contract.md §3a, D1–D5): which idle held devices to move so that larger
sets fit. Pure: `plan_round` reads a `Snapshot` and returns a `DefragPlan`; nothing here
writes or waits. The binder's coordinator carries a plan out inside its one decision loop
(D2); `gpu-binder defrag --plan` and `explain` (D4) show it.

Vocabulary:
- a *movable* device (D1): held (no template label), Bound, carrying no attachment and no
  bind request, not being deleted, its class known and `Move`; in device mode (DR1) also
  recording its exact device (DR2, the seam's `movable`);
- the *largest placeable set* of a class: the most new devices of the class one node can
  take now — over the placeable nodes serving the class (not cordoned, Ready,
  `kubevirt.io/schedulable=true`, no NoSchedule/NoExecute taint), their free units of the
  class's resource counting reservations in flight (B3) — and how many nodes have that room.
  The same figure as `model.explain.largest_placeable` (a one-device probe with no
  tolerations), maximised over nodes; for a device-mode class the largest set a node's
  free groups take (DR3, `model.device.view.largest_device_set`), not its free units;
- a *profile*: that pair (largest, nodes with room for it) per class. A round is kept only
  when no class's pair goes down (lexicographically) and some class's goes up (D3).

The search is greedy over *clearings*: free units on one node by moving k of its movable
devices of one resource away (each to the tightest eligible other node, B4's tightest fit;
never to a node this round clears), keeping the clearing that grows the profile most
(then the fewest moves, then node name), until `max_moves` moves are planned or no
clearing helps. Every move targets a node eligible for the device's class with a free
unit (D2: reservations in flight counted); a move never changes a tenant's Bound count, so
no budget figure moves (D5).

Device mode (DR2-DR4): the idle held devices of device-mode classes are weighed through the
seam (`Snapshot.mode.defrag_steps`, `model.device.defrag`): re-points (a status write on
the same node, `DefragMove.repoint`) and clearings that record the device a one-device set
takes on the target. The profile of a device-mode class is per node the largest set its
free groups take (`Snapshot.mode.largest`), worked out again after the step for the nodes
it touches (`_Profile.refresh`). A re-point wins a tie with a move.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Collection, Iterable

from model.device.defrag import one_device
from model.device.dra import DeviceRef
from model.snapshot import Snapshot
from model.types import DeviceKey, GPUDevice, OnCordon, Phase

DEFAULT_MAX_MOVES = 4
"""Default `max_moves` of a round (`--defrag-max-moves`)."""

DEFRAG_REQUEST_PREFIX = "defrag-"
"""Request ids the binder gives its defragmenting moves (never a webhook's id: those are
the admission ids the webhook generates, hex without a dash)."""


@dataclass(frozen=True, slots=True)
class Largest:
    """The largest placeable set of class `class_name` (resource `resource`): `size` new
    devices fit on one node, on `nodes` nodes (0 and 0 when no node has a free unit)."""

    class_name: str
    resource: str
    size: int
    nodes: int

    @property
    def rank(self) -> tuple[int, int]:
        """What D3 compares: (size, nodes), lexicographically."""
        return (self.size, self.nodes)


@dataclass(frozen=True, slots=True)
class DefragMove:
    """One defragmenting move: held device `device` (namespace, name) of class `class_name`
    goes from `from_node` to `to_node`; `why` says what it helps: the clearing of
    `cleared` that grows the largest placeable set of `for_class` from `before` to `after`
    (sizes, devices). `render()` is the Event's and the log's text.

    Device mode (DR2, DR4): `from_device` is the device recorded before, `to_device` the one
    recorded after (both None in count mode); `from_node == to_node` is a re-point (a
    status write on the same node, `repoint`)."""

    device: DeviceKey
    class_name: str
    resource: str
    from_node: str
    to_node: str
    cleared: str
    for_class: str
    before: int
    after: int
    from_device: DeviceRef | None = field(default=None, metadata={"omit_empty": True})
    to_device: DeviceRef | None = field(default=None, metadata={"omit_empty": True})

    @property
    def repoint(self) -> bool:
        """Device mode (DR4): the device stays on its node and records another device of it."""
        return self.from_node == self.to_node and self.to_device is not None

    def render(self) -> str:
        """E.g. "defragmentation: moved tenant-b/gpu-c (h100) from node-1 to node-2, freeing
        node-1 so the largest placeable h100 set grows from 3 to 4"; device mode names the
        devices: "... moved tenant-b/g (hgx) from node-1 (gpu-vfio-1) to node-2 (gpu-vfio-5)
        ..." or "... re-pointed tenant-b/g (hgx) on node-1 from gpu-vfio-1 to gpu-vfio-5,
        freeing node-1 ..."."""
        ns, name = self.device
        grows = (f"grows from {self.before} to {self.after}" if self.after > self.before
                 else f"fits on more nodes (size {self.after})")
        why = f"freeing {self.cleared} so the largest placeable {self.for_class} set {grows}"
        if self.repoint:
            return (f"defragmentation: re-pointed {ns}/{name} ({self.class_name}) on "
                    f"{self.from_node} from {_name(self.from_device)} to "
                    f"{_name(self.to_device)}, {why}")
        where = ((f"{self.from_node} ({_name(self.from_device)})", f"{self.to_node} "
                  f"({_name(self.to_device)})") if self.to_device is not None
                 else (self.from_node, self.to_node))
        return (f"defragmentation: moved {ns}/{name} ({self.class_name}) from {where[0]} "
                f"to {where[1]}, {why}")

    @property
    def message(self) -> str:
        """`render()` (the Event's text; also the "message" of `defrag --plan --json`)."""
        return self.render()

    def __str__(self) -> str:
        return self.render()


def _name(ref: DeviceRef | None) -> str:
    return ref.device if ref is not None else "no device"


@dataclass(frozen=True, slots=True)
class DefragPlan:
    """A round's plan: `moves` in the order to make them (at most the round's `max_moves`;
    empty when nothing helps), the profile `before` and `after` them (one `Largest` per
    class, by name). Invariant (D3): no class's `rank` is lower after, and when `moves` is
    not empty some class's is higher."""

    moves: tuple[DefragMove, ...]
    before: tuple[Largest, ...]
    after: tuple[Largest, ...]

    def grown(self) -> tuple[tuple[str, int, int], ...]:
        """(class, size before, size after) of the classes whose largest set grows."""
        return tuple((b.class_name, b.size, a.size) for b, a in zip(self.before, self.after)
                     if a.size > b.size)


def movable(device: GPUDevice, snap: Snapshot) -> bool:
    """D1: `device` may be moved by a defragmentation (see the module docstring)."""
    st = device.status
    if device.template_for is not None or device.bound_node is None or device.deleting:
        return False
    if st.attached_to is not None or st.bind_request is not None:
        return False
    cls = snap.classes.get(device.class_name)
    if cls is None or cls.on_cordon is not OnCordon.MOVE:
        return False
    return snap.mode.movable(device)  # DR2: device mode moves a record


def eligible_nodes(snap: Snapshot, class_name: str) -> frozenset[str]:
    """The nodes a new device of `class_name` may go to, room aside: placeable (see
    `Snapshot.unplaceable_nodes`), serving the class, without a NoSchedule/NoExecute taint
    (a device with no VMI has no tolerations). B3 for one device."""
    unplaceable = snap.unplaceable_nodes()
    return frozenset(n for n in snap.serving_nodes(class_name)
                     if n not in unplaceable and not snap.has_hard_taints(n))


def move_targets(snap: Snapshot, class_name: str, exclude: Collection[str], count: int) -> list[str]:
    """The first `count` nodes an idle held device of `class_name` may be moved to now,
    tightest first (free units of the class's resource >= 1, counting reservations in flight,
    then name: B4's tightest fit; eligible as `eligible_nodes`, not in `exclude`). D2's target
    check, the one a defragmenting clearing walks; a caller placing k devices in turn, each
    on the tightest with a unit left, needs `count` >= k + 1. Empty for an unknown class."""
    cls = snap.classes.get(class_name)
    if cls is None:
        return []
    return _targets(snap, class_name, cls.resource_name, set(exclude), count)


def device_target(snap: Snapshot, node: str, class_name: str,
                  taken: Collection[str] = ()) -> DeviceRef | None:
    """Device mode (DR2, DR4): the device of `node` a moved or re-pointed idle held device of
    `class_name` records there now: the one a new one-device set takes among the node's free
    devices (`Snapshot.free_devices`: untainted, unclaimed, unrecorded, unheld) but `taken`
    (names), as a defragmenting move records it. None when no device is free for it."""
    free = snap.free_devices(node, class_name)
    if taken:
        free = free - frozenset(taken)
    return one_device(snap, node, class_name, free)


def largest_sets(snap: Snapshot) -> tuple[Largest, ...]:
    """The largest placeable set of every class, by class name (see the module docstring)."""
    return _Profile(snap).largest()


def apply_moves(snap: Snapshot, moves: Iterable[DefragMove], *, now: datetime | None = None) -> Snapshot:
    """`snap` with each moved device Bound on its `to_node` (`boundAt` = `now` when given,
    else kept). Moves of devices not in `snap` are skipped. For the read-only plan, explain
    and tests: the binder writes moves through its status pipeline."""
    changed = []
    for m in moves:
        d = snap.device(*m.device)
        if d is None:
            continue
        st = d.status
        if m.repoint:  # DR4: the record alone changes
            changed.append(replace(d, status=replace(st, device=m.to_device)))
        else:
            changed.append(replace(d, status=replace(
                st, phase=Phase.BOUND, node_name=m.to_node, bound_at=now or st.bound_at,
                device=m.to_device if m.to_device is not None else st.device)))
        snap = snap.with_devices(changed[-1:])
    return snap


def plan_round(snap: Snapshot, *, max_moves: int = DEFAULT_MAX_MOVES,
               keep: Collection[DeviceKey] = ()) -> DefragPlan:
    """Plan one defragmentation round on `snap` (which counts the reservations in flight,
    D2): at most `max_moves` moves of movable devices (D1; never one of `keep`, e.g. the
    members of a set being explained) that grow the profile and shrink no class's (D3).
    Deterministic. Raises ValueError when `max_moves` is below 1."""
    if max_moves < 1:
        raise ValueError(f"max_moves must be at least 1, got {max_moves}")
    keep = frozenset(keep)
    profile = _Profile(snap)
    before = profile.largest()
    moves: list[DefragMove] = []
    cleared: set[str] = set()  # nodes this round frees: never a target
    while len(moves) < max_moves:
        best = _best_clearing(snap, profile, max_moves - len(moves), keep, cleared)
        if best is None:
            break
        _, node, step, _ = best
        moves += step
        cleared.add(node)
        keep |= {m.device for m in step}  # a device moves at most once a round
        snap = apply_moves(snap, step)
        profile = _Profile(snap)
    return DefragPlan(tuple(moves), before, profile.largest())


# --- the search -------------------------------------------------------------------------------


class _Profile:
    """Per class, the free units (>= 1) of each eligible node counted, as a Counter of free
    values; cheap to copy and update for one moved device: the free units per (node,
    resource) are read from the snapshot and only the changed ones are kept (`delta`).
    Device-mode classes (DR3): per eligible node the largest set its free groups take
    (`sizes`, of the snapshot the profile was built on; `resized` the nodes worked out again
    on a later snapshot, `refresh`)."""

    __slots__ = ("classes", "device_classes", "eligible", "frees", "snap", "delta", "sizes",
                 "resized")

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.delta: dict[tuple[str, str], int] = {}
        self.resized: dict[tuple[str, str], int] = {}
        self.sizes: dict[str, dict[str, int]] = {}
        self.classes = {c: snap.classes[c].resource_name for c in sorted(snap.classes)}
        self.eligible = {c: eligible_nodes(snap, c) for c in self.classes}
        self.frees: dict[str, Counter[int]] = {}
        self.device_classes = snap.mode.device_classes & self.classes.keys()
        for c, res in self.classes.items():
            if c in self.device_classes:  # DR3: per node the largest set its free groups take
                sizes = self.sizes[c] = {n: snap.mode.largest(snap, n, c)
                                         for n in self.eligible[c]}
                self.frees[c] = Counter(v for v in sizes.values() if v >= 1)
                continue
            counts: Counter[int] = Counter()
            for f, names in snap.free_buckets(res).items():
                if f >= 1:
                    n = sum(1 for x in names if x in self.eligible[c])
                    if n:
                        counts[f] = n
            self.frees[c] = counts

    def copy(self) -> _Profile:
        out = object.__new__(_Profile)
        out.snap, out.classes, out.eligible = self.snap, self.classes, self.eligible
        out.device_classes, out.sizes = self.device_classes, self.sizes
        out.delta = dict(self.delta)
        out.resized = dict(self.resized)
        out.frees = {c: Counter(v) for c, v in self.frees.items()}
        return out

    def free(self, node: str, res: str) -> int:
        return self.snap.free(node, res) + self.delta.get((node, res), 0)

    def shift(self, node: str, res: str, delta: int) -> None:
        """`delta` more free units of `res` on `node` (count mode)."""
        old = self.free(node, res)
        new = old + delta
        self.delta[(node, res)] = self.delta.get((node, res), 0) + delta
        for c, r in self.classes.items():
            if r != res or node not in self.eligible[c] or c in self.device_classes:
                continue  # device mode: `refresh` works its figure out again
            _recount(self.frees[c], old, new)

    def refresh(self, largest, nodes: Iterable[str]) -> None:
        """Device mode: the largest set of every device-mode class on `nodes` as `largest(node,
        class)` gives it after a step (DR3)."""
        for c in self.device_classes:
            for node in nodes:
                if node not in self.eligible[c]:
                    continue
                old = self.resized.get((c, node), self.sizes[c].get(node, 0))
                new = self.resized[(c, node)] = largest(node, c)
                _recount(self.frees[c], old, new)

    def rank(self, c: str) -> tuple[int, int]:
        counts = self.frees[c]
        if not counts:
            return (0, 0)
        top = max(counts)
        return (top, counts[top])

    def largest(self) -> tuple[Largest, ...]:
        return tuple(Largest(c, res, *self.rank(c)) for c, res in self.classes.items())


def _recount(counts: Counter[int], old: int, new: int) -> None:
    """`counts` (nodes per figure >= 1) with one node's figure going from `old` to `new`."""
    if old >= 1:
        counts[old] -= 1
        if not counts[old]:
            del counts[old]
    if new >= 1:
        counts[new] += 1


def _gain(before: _Profile, after: _Profile) -> tuple[int, int] | None:
    """(sum of size gains, sum of node-count gains over classes whose size is unchanged)
    when no class's rank drops and some class's rises; else None (D3)."""
    up = False
    sizes = nodes = 0
    for c in before.classes:
        b, a = before.rank(c), after.rank(c)
        if a < b:
            return None
        if a > b:
            up = True
            sizes += a[0] - b[0]
            if a[0] == b[0]:
                nodes += a[1] - b[1]
    return (sizes, nodes) if up else None


def _targets(snap: Snapshot, class_name: str, res: str, exclude: set[str], count: int) -> list[str]:
    """The first `count` nodes a device of `class_name` may go to, tightest first (free
    units >= 1, then name; B4 tightest fit; eligible as `eligible_nodes`, not in
    `exclude`). Walking these with the units a step takes gives what `tightest_node` on the
    snapshot after each move gives: a step takes at most `count - 2` units."""
    eligible = eligible_nodes(snap, class_name)
    out: list[str] = []
    buckets = snap.free_buckets(res)
    for f in sorted(k for k in buckets if k >= 1):
        for name in buckets[f]:
            if name in eligible and name not in exclude:
                out.append(name)
                if len(out) >= count:
                    return out
    return out


def _best_clearing(snap: Snapshot, profile: _Profile, budget: int, keep: frozenset[DeviceKey],
                   cleared: set[str]):
    """The best step of at most `budget` moves (see the module docstring): (gain key,
    node, moves, profile after), or None when none grows the profile. The gain key: size
    gains, node-count gains, fewer moves, fewer moves off their node (a re-point first)."""
    by_node: dict[str, dict[str, list[GPUDevice]]] = {}
    of_devices: dict[str, dict[str, list[GPUDevice]]] = {}  # device-mode classes' (DR2-DR4)
    device_classes = snap.mode.device_classes
    for d in snap.devices.values():
        if d.key in keep or d.bound_node in cleared or not movable(d, snap):
            continue
        cls = snap.classes[d.class_name]
        if d.class_name in device_classes:
            of_devices.setdefault(d.bound_node, {}).setdefault(  # type: ignore[arg-type]
                d.class_name, []).append(d)
            continue
        by_node.setdefault(d.bound_node, {}).setdefault(  # type: ignore[arg-type]
            cls.resource_name, []).append(d)
    targets: dict = {}  # per class: tightest first (count mode: names; device mode: (free, name, device))
    best = None
    for node in sorted(by_node):
        for res, devices in sorted(by_node[node].items()):
            devices.sort(key=lambda d: d.key)
            step: list[DefragMove] = []
            after = profile.copy()
            for d in devices[:budget]:
                cands = targets.get(d.class_name)
                if cands is None:
                    cands = targets[d.class_name] = _targets(snap, d.class_name, res, cleared,
                                                             budget + 2)
                to = min(((f, n) for n in cands
                          if n != node and (f := after.free(n, res)) >= 1), default=(0, None))[1]
                if to is None:
                    break
                after.shift(node, res, +1)
                after.shift(to, res, -1)
                step.append(DefragMove(d.key, d.class_name, res, node, to, node, "", 0, 0))
                gain = _gain(profile, after)
                if gain is None:
                    continue
                key = (gain[0], gain[1], -len(step), -len(step))
                if best is None or key > best[0]:
                    best = (key, node, _explained(list(step), profile, after), after.copy())
    steps = snap.mode.defrag_steps(snap, profile, of_devices, budget, cleared, targets,
                                   move=DefragMove, targets_of=_targets)
    for node, step, scratch in steps:
        after = profile.copy()
        after.refresh(scratch.largest, scratch.touched)
        gain = _gain(profile, after)
        if gain is None:
            continue
        key = (gain[0], gain[1], -len(step), -sum(1 for m in step if not m.repoint))
        if best is None or key > best[0]:
            best = (key, node, _explained(step, profile, after), after)
    return best


def _explained(step: list[DefragMove], before: _Profile, after: _Profile) -> tuple[DefragMove, ...]:
    """`step` with the why filled in: the class that grows most (size, then nodes, then
    name)."""
    grows = sorted(((after.rank(c)[0] - before.rank(c)[0], after.rank(c)[1] - before.rank(c)[1], c)
                    for c in before.classes if after.rank(c) > before.rank(c)),
                   key=lambda t: (-t[0], -t[1], t[2]))
    _, _, c = grows[0]
    return tuple(replace(m, for_class=c, before=before.rank(c)[0], after=after.rank(c)[0])
                 for m in step)


__all__ = ["DEFAULT_MAX_MOVES", "DEFRAG_REQUEST_PREFIX", "DefragMove", "DefragPlan", "Largest",
           "apply_moves", "device_target", "eligible_nodes", "largest_sets", "movable", "move_targets",
           "plan_round"]
