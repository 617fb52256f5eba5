"""Defragmentation in device mode (docs/contract.md §3a, §3b; DR2-DR4): the candidate steps
of one node in a round, which `model.defrag` weighs like its count-mode clearings (the
seam's `defrag_steps`, `model.device.seam`). A step is one of
- a *re-point*: an idle held device keeps its node and records another of the node's free
  devices of its class, the one a new one-device set would take there (DR4's buddy best fit,
  `model.device.topology.choose_devices`), so that the block it leaves is whole again;
- a *clearing* of one class's idle held devices of a node (each alone, and the first k in
  name order), each to the tightest other eligible node with a device free for it,
  recording the device a one-device set would take there.
A step's effect on the largest set a node's free groups take (`model.device.view`) is worked
out on a `Scratch` over the snapshot, not on a derived snapshot per candidate.

Pure. The snapshot, devices and moves are the core's values, read by attribute.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from model.device.dra import DeviceRef
from model.device.lost import record_loss
from model.device.ports import DeviceView, SnapshotView
from model.device.topology import NoGroup, choose_devices
from model.device.view import capped, placeable_sizes


class Scratch:
    """Device mode: a candidate step's changes over `snap` without deriving a snapshot per
    candidate (a round weighs thousands on a large fleet): devices newly recorded per node
    (`taken`), records given up that are free again (`freed`), free units per (node,
    resource) (`units`), the nodes touched. `largest` is `largest_device_set` as the
    snapshot after the step would answer it (a property test checks them against
    `apply_moves`)."""

    __slots__ = ("snap", "taken", "freed", "units", "touched", "memo")

    def __init__(self, snap: SnapshotView, memo: dict) -> None:
        self.snap = snap
        self.memo = memo  # the round's: (node, class, free, units) -> largest
        self.taken: dict[str, set[str]] = {}
        self.freed: dict[str, set[str]] = {}
        self.units: dict[tuple[str, str], int] = {}
        self.touched: set[str] = set()

    def copy(self) -> Scratch:
        out = Scratch(self.snap, self.memo)
        out.taken = {k: set(v) for k, v in self.taken.items()}
        out.freed = {k: set(v) for k, v in self.freed.items()}
        out.units, out.touched = dict(self.units), set(self.touched)
        return out

    def free(self, node: str, class_name: str) -> frozenset[str]:
        """The devices of `class_name` on `node` free for a new set after the step (DR2)."""
        out = self.snap.free_devices(node, class_name)
        back, gone = self.freed.get(node), self.taken.get(node)
        if back:
            out = out | (back & self.snap.nodes[node].devices_of(class_name).names)
        return out - gone if gone else out

    def free_for(self, d: DeviceView) -> frozenset[str]:
        """`free` for a set of `d` alone: its own record counts free (DR4)."""
        node, rec = d.bound_node, d.status.device
        assert node is not None and rec is not None
        free = self.free(node, d.class_name)
        return free | {rec.device} if self._record_free(d) else free

    def _record_free(self, d: DeviceView) -> bool:
        """Whether `d`'s record is free once `d` gives it up: no claim allocates it, no taint
        covers it, no other device records it, no other reservation holds it, and the step
        has not recorded it again."""
        node, rec = d.bound_node, d.status.device
        assert node is not None and rec is not None
        n = self.snap.nodes[node]
        return (rec.device not in n.taken_devices
                and rec.device not in self.taken.get(node, ())
                and rec.device in self.snap.free_devices(node, d.class_name, None, (d.key,)))

    def units_of(self, node: str, res: str) -> int:
        return self.snap.free(node, res) + self.units.get((node, res), 0)

    def apply(self, m, d) -> None:
        """`d` moved or re-pointed as `m` says (device mode)."""
        assert m.to_device is not None
        if self._record_free(d):
            self.freed.setdefault(m.from_node, set()).add(m.from_device.device)  # type: ignore[union-attr]
        self.taken.setdefault(m.to_node, set()).add(m.to_device.device)
        if m.from_node != m.to_node:
            self.units[(m.from_node, m.resource)] = self.units.get((m.from_node, m.resource), 0) + 1
            self.units[(m.to_node, m.resource)] = self.units.get((m.to_node, m.resource), 0) - 1
        self.touched.update((m.from_node, m.to_node))

    def largest(self, node: str, class_name: str) -> int:
        """`largest_device_set(snapshot after the step, node, class_name)`."""
        snap = self.snap
        n = snap.nodes.get(node)
        if n is None:
            return 0
        free, units = self.free(node, class_name), self.units_of(node, snap.classes[class_name].resource_name)
        key = (node, class_name, free, units)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = capped(placeable_sizes(n.devices_of(class_name).board,
                                                            snap.mode.matches[class_name], free), units)
        return found


def device_steps(snap: SnapshotView, profile: Any, by_node: dict[str, dict[str, list]], budget: int,
                 cleared: set[str], targets: dict, *, move: Callable[..., Any],
                 targets_of: Callable[..., list[str]]) -> Iterator[tuple[str, list, Scratch]]:
    """The candidate steps of a round (see the module docstring), each as (node, moves
    without their why, its `Scratch`): per node and class (`by_node`: the idle held devices
    of device-mode classes, D1), each idle held device re-pointed alone and all of them
    re-pointed in turn (at most `budget`), each moved off alone and the first 2..`budget` in
    name order. A node where no class's figure could reach its largest set even with those
    devices gone is skipped (`_may_grow`): the other nodes a step touches only lose free
    devices.

    The core hands in what is its own: `profile` (`model.defrag`'s: `device_classes`,
    `eligible`, `classes`, `sizes`, `rank(c)`), the nodes `cleared` this round (never a
    target), `targets` (per class, the tightest targets, filled here), the move type `move`
    (`model.defrag.DefragMove`) and `targets_of(snap, class, resource, exclude, count)`,
    the tightest eligible nodes (`model.defrag._targets`)."""
    memo: dict = {}  # the round's: (node, class, free, units) -> largest
    for node in sorted(by_node):
        for c, devices in sorted(by_node[node].items()):
            devices.sort(key=lambda d: d.key)
            devices = [d for d in devices if _record_exists(snap, d)]
            res = snap.classes[c].resource_name
            if devices and _may_grow(snap, profile, node, res, 0):
                for d in devices:
                    scratch = Scratch(snap, memo)
                    m = _repoint(scratch, d, move)
                    if m is not None:
                        scratch.apply(m, d)
                        yield node, [m], scratch
                if len(devices) > 1:
                    step: list = []
                    scratch = Scratch(snap, memo)
                    for d in devices:
                        m = _repoint(scratch, d, move)
                        if m is not None:
                            step.append(m)
                            scratch.apply(m, d)
                            if len(step) >= budget:
                                break
                    if len(step) > 1:
                        yield node, step, scratch
            if not devices or not _may_grow(snap, profile, node, res, min(budget, len(devices))):
                continue
            clearings = [[d] for d in devices]
            clearings += [devices[:k] for k in range(2, min(budget, len(devices)) + 1)]
            for group in clearings:
                found = _clear(snap, node, c, group, cleared, targets, budget, memo, move, targets_of)
                if found is not None:
                    yield node, *found


def _may_grow(snap: SnapshotView, profile: Any, node: str, res: str, freed: int) -> bool:
    """Whether `node`, with `freed` more free units of `res`, could grow some device-mode
    class's rank (D3): its figure there, at most the class's devices on the node and its free
    units, could pass the class's largest set, or reach it from below (one more node)."""
    n = snap.nodes.get(node)
    if n is None:
        return False
    for c in profile.device_classes:
        if node not in profile.eligible[c]:
            continue
        top = profile.rank(c)[0]
        r = profile.classes[c]
        upper = min(len(n.devices_of(c)), snap.free(node, r) + (freed if r == res else 0))
        if upper > top or (upper == top and profile.sizes[c].get(node, 0) < top):
            return True
    return False


def _record_exists(snap: SnapshotView, d: DeviceView) -> bool:
    """Whether `d`'s record names a device its node still publishes for its class, with the
    class's topology attribute (HL3: a lost one, `model.device.lost.record_loss`, is never
    moved nor re-pointed away from: its record waits for the device to return)."""
    rec = d.status.device
    return rec is not None and d.bound_node is not None and record_loss(
        snap.nodes.get(d.bound_node), d.class_name, snap.mode.matches.get(d.class_name), rec) is None


def one_device(snap: SnapshotView, node: str, class_name: str, free: frozenset[str],
               keep: frozenset[str] = frozenset()) -> DeviceRef | None:
    """The device of `node` a new one-device set of `class_name` takes among `free` (names
    of devices of the class on `node`): DR4's buddy best fit, `keep` first on a tie; None
    when none (the node or the class has none, or no group of one is free)."""
    n = snap.nodes.get(node)
    if n is None or not free:
        return None
    sds = n.devices_of(class_name)
    choice = choose_devices(sds.board, free, 1, snap.mode.matches[class_name], keep)
    if isinstance(choice, NoGroup):
        return None
    name = choice.devices[0]
    return next(sd.ref for sd in sds if sd.ref.device == name)


def _repoint(scratch: Scratch, d: DeviceView, move: Callable[..., Any]) -> Any:
    """DR4: `d` re-pointed to the device of its node a one-device set would take, counting
    its own record free; None when that is its record."""
    node, rec = d.bound_node, d.status.device
    assert node is not None and rec is not None
    free = scratch.free_for(d)
    to = one_device(scratch.snap, node, d.class_name, free, frozenset((rec.device,)) & free)
    if to is None or to == rec:
        return None
    return move(d.key, d.class_name, scratch.snap.classes[d.class_name].resource_name,
                node, node, node, "", 0, 0, rec, to)


def _clear(snap: SnapshotView, node: str, class_name: str, group: list, cleared: set[str], targets: dict,
           budget: int, memo: dict, move: Callable[..., Any], targets_of: Callable[..., list[str]]):
    """`group` (idle held devices of `class_name` on `node`) moved off, each to the tightest
    other eligible node with a device free for it (B4; not a node of `cleared`), recording
    the device a one-device set takes there: (moves, `Scratch`), or None when one of them
    has nowhere to go."""
    res = snap.classes[class_name].resource_name
    firsts = targets.get(class_name)
    if firsts is None:  # once a round per class: the tightest nodes with a device free
        firsts = targets[class_name] = sorted(
            (snap.free(n, res), n, to) for n in targets_of(snap, class_name, res, cleared, budget + 8)
            if (to := one_device(snap, n, class_name, snap.free_devices(n, class_name))) is not None)
    scratch, step = Scratch(snap, memo), []
    went: list[str] = []  # the targets of this step: only theirs differ from `firsts`
    for d in group:
        options = []
        for n in went:
            if (f := scratch.units_of(n, res)) >= 1 and (
                    to := one_device(snap, n, class_name, scratch.free(n, class_name))) is not None:
                options.append((f, n, to))
        first = next((o for o in firsts if o[1] != node and o[1] not in went), None)
        if first is not None:
            options.append(first)
        if not options:
            return None
        _, to_node, to = min(options, key=lambda o: o[:2])
        m = move(d.key, class_name, res, node, to_node, node, "", 0, 0, d.status.device, to)
        step.append(m)
        scratch.apply(m, d)
        if to_node not in went:
            went.append(to_node)
    return step, scratch


__all__ = ["Scratch", "device_steps", "one_device"]
