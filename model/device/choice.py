"""A set's device-mode questions on a node (docs/contract.md §3b, DR2-DR4): which group of
the node's free devices each device-mode class of the set takes (`SetDevices.choice`), how
tight it is (`fit`), which device each member records (`assign`), whether the members'
records still hold (`records_hold`), and the device-mode reasons a node is not eligible
(`problems`, naming the device taints in the way: `tainted_devices`, HL1). `model.decide` asks them through the seam (`model.device.seam`); a set
without device-mode classes gets `NO_DEVICES`, which answers as count mode does.

Pure. The snapshot and the members are the core's values (`model.snapshot.Snapshot`,
`model.types.GPUDevice`), read by attribute.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from operator import itemgetter
from typing import Callable, Iterator, Sequence

from model.device.dra import HARD_DEVICE_TAINTS, DeviceRef
from model.device.match import MatchAttribute
from model.device.ports import DeviceKey, DeviceView, NodeView, SnapshotView
from model.device.records import Ranking, held_names
from model.device.topology import ClassShare, GroupChoice, NoGroup, choose_set, natural_key
from model.reasons import Code, NoDeviceGroup, NoRoom, Reason, TaintedDevices

_NO_NAMES: frozenset[str] = frozenset()

Elsewhere = Callable[[int | None], list[tuple[int, str]]]
"""The count-mode core's eligible nodes holding no member, as sorted (leftover, name), at
least the first `limit` (None: all): `model.decide`'s `_Set.eligible_elsewhere`."""

Tightest = Callable[[], Iterator[tuple[int, str]]]
"""For a set of one resource, a new walk over (leftover, name) of every node that may be
eligible for it (placeable, with room), sorted: a superset of the eligible nodes, each with
the leftover `eligible_node` gives it (`model.decide`'s `_Set.tightest`)."""

_SCAN = 8
"""`SetDevices.ranked_elsewhere`: how many nodes of `Tightest` a walk for one fit group
looks at per member of the group before it asks the members instead. Looking at a node of
another group is one dict read, asking a member about ten times that."""


def no_group(class_name: str, why: NoGroup, free: int) -> NoDeviceGroup:
    """The reason of a failed choice of `class_name` with `free` devices free (DR3)."""
    return NoDeviceGroup(class_name, why.attribute, why.count, free, why.largest_free,
                         why.attribute_missing, why.sizes if why.attribute_missing else ())


class NoDevices:
    """The null object: a set without device-mode classes (count mode). Its records always
    hold, every node has its (empty) choice, it assigns no device and adds no reason."""

    __slots__ = ()

    def records_hold(self, node: str) -> bool:
        return True

    def fit(self, node: str) -> tuple:
        return ()

    def assign(self, node: str) -> tuple[tuple[DeviceKey, DeviceRef], ...]:
        return ()

    def repointed(self, node: str) -> tuple[tuple[DeviceKey, DeviceRef], ...] | None:
        """B5 on a cordoned `node` whose records do not hold: the devices the members are
        re-pointed to there, None when no group is free (never asked in count mode)."""
        return ()

    def elsewhere(self, eligible: Elsewhere, limit: int | None) -> list[tuple[int, str]]:
        """The eligible nodes holding no member, at most `limit`: count mode's as they are."""
        return eligible(limit)

    def ranked_elsewhere(self, eligible_node: Callable[[str], int | None], tightest: Tightest,
                         limit: int) -> list[tuple[int, str]] | None:
        """`elsewhere` from the snapshot's ranking, or None when it does not apply (count
        mode: the count-mode walk is already in B4 order)."""
        return None

    def problems(self, node: str, out: list[Reason], short: bool) -> list[Reason]:
        """`out` (the count-mode reasons of `node`) with the device-mode ones: none."""
        return out


NO_DEVICES = NoDevices()


class SetDevices(NoDevices):
    """A set's members (`members`, of request `request_id`) with device-mode classes
    `classes` (in the set's order) on `snap`; the choice on each node is remembered here (and
    a new set's on the snapshot's `NodeMemo`). `matches` maps every device-mode class to its
    matchAttribute."""

    __slots__ = ("snap", "request_id", "members", "classes", "matches", "own", "by_class",
                 "here", "_choices", "_own_holds")

    def __init__(self, snap: SnapshotView, request_id: str, members: Sequence[DeviceView], classes: list[str],
                 matches: dict[str, MatchAttribute | None]) -> None:
        self.snap, self.request_id, self.members, self.classes = snap, request_id, members, classes
        self.matches = matches
        self.own = frozenset(m.key for m in members)
        self.by_class: dict[str, list[DeviceView]] = {c: [] for c in classes}
        self.here: set[str] = set()
        for m in members:
            if m.class_name in self.by_class:
                self.by_class[m.class_name].append(m)
            if m.bound_node is not None:
                self.here.add(m.bound_node)
        self._choices: dict[str, dict[str, GroupChoice] | NoDeviceGroup] = {}
        self._own_holds = frozenset(h.node for h in snap.reservations
                                    if h.request_id == request_id and h.devices)
        """Nodes where this request holds devices (its free names there differ)."""

    def choice(self, node: str) -> dict[str, GroupChoice] | NoDeviceGroup:
        """DR3/DR4 on `node` (which exists): one group per device-mode class of the set
        (`model.device.topology.choose_set`), from the devices free for this request
        (`Snapshot.free_devices`), keeping the members' records on the node where the choice
        allows; or why there is none (`NoDeviceGroup`). Cached per node."""
        found = self._choices.get(node)
        if found is not None:
            return found
        snap, n = self.snap, self.snap.nodes[node]
        holding = node in self.here  # members record devices only where they are Bound
        if not holding and len(self.classes) == 1:
            # the common case, as `choose_set` would do it for one class and nothing to keep
            # (a new set's choice there depends on the node alone: remembered on the snapshot
            # for every request without a hold of its own on the node)
            c = self.classes[0]
            count = len(self.by_class[c])
            memo = None if node in self._own_holds else snap.memo
            found = memo.group(node, c, count) if memo is not None else None
            if found is None:
                free = snap.free_devices(node, c, self.request_id)
                outcome = n.devices_of(c).board.layout(self.matches[c], count).choose(free, _NO_NAMES, count)
                found = no_group(c, outcome, len(free)) if isinstance(outcome, NoGroup) else {c: outcome}
                if memo is not None:
                    memo.put_group(node, c, count, found)
            self._choices[node] = found
            return found
        own = self.own if holding else ()
        shares, free_all, free_of = [], set(), {}
        for c in self.classes:
            free = snap.free_devices(node, c, self.request_id, own)
            free_of[c] = len(free)
            free_all |= free
            keep = tuple(m.status.device.device for m in self.by_class[c]
                         if m.bound_node == node and m.status.device is not None
                         and m.status.device.device in free) if holding else ()
            shares.append(ClassShare(c, n.devices_of(c).board, len(self.by_class[c]),
                                     self.matches[c], keep))
        chosen, failed = choose_set(shares, free_all)
        if chosen is None:
            assert failed is not None
            c, why = failed
            found = no_group(c, why, free_of[c])
        else:
            found = chosen
        self._choices[node] = found
        return found

    def fit(self, node: str) -> tuple:
        """The DR4 tightness of the device choice on `node` (per class, in the set's order)."""
        choice = self.choice(node)
        assert not isinstance(choice, NoDeviceGroup)
        return tuple(choice[c].fit for c in self.classes)

    def assign(self, node: str) -> tuple[tuple[DeviceKey, DeviceRef], ...]:
        """The chosen device of every device-mode member on `node` (request order): a member
        whose record on the node is among its class's chosen devices keeps it; the others
        take the rest in natural name order."""
        choice = self.choice(node)
        assert not isinstance(choice, NoDeviceGroup)
        n = self.snap.nodes[node]
        out: dict[DeviceKey, DeviceRef] = {}
        for c in self.classes:
            devices = n.devices_of(c)
            left = list(choice[c].devices)
            waiting = []
            for m in self.by_class[c]:
                rec = m.status.device
                if m.bound_node == node and rec is not None and rec.device in left:
                    left.remove(rec.device)
                    out[m.key] = devices.by_name(rec.device).ref
                else:
                    waiting.append(m)
            left.sort(key=natural_key)
            for m, name in zip(waiting, left):
                out[m.key] = devices.by_name(name).ref
        return tuple((m.key, out[m.key]) for m in self.members if m.key in out)

    def repointed(self, node: str) -> tuple[tuple[DeviceKey, DeviceRef], ...] | None:
        return None if isinstance(self.choice(node), NoDeviceGroup) else self.assign(node)

    def records_hold(self, node: str) -> bool:
        """B6 in device mode: every device-mode member Bound on `node` records a device that
        still exists there (`Node.devices_of`), is free for this set (no other record, hold,
        claim or taint), and no two record the same device; per class, the records share the
        class's attribute (DR3)."""
        snap = self.snap
        seen: set[str] = set()
        for c in self.classes:
            members = self.by_class[c]
            free = snap.free_devices(node, c, self.request_id, self.own)
            match = self.matches[c]
            attribute = match.resolve(len(members)) if match is not None else None
            devices = snap.nodes[node].devices_of(c)
            values = set()
            for m in members:
                rec = m.status.device
                if m.bound_node != node or rec is None or rec.device in seen:
                    return False
                d = devices.by_name(rec.device)
                if d is None or d.ref != rec or rec.device not in free:
                    return False
                seen.add(rec.device)
                if attribute is not None:
                    value = d.as_device().attribute(attribute)
                    if value is None:
                        return False
                    values.add(value)
            if len(values) > 1:
                return False
        return True

    def elsewhere(self, eligible: Elsewhere, limit: int | None) -> list[tuple[int, str]]:
        """Every count-eligible node holding no member where the device choice succeeds, in
        DR4 order (tightest group, then tightest node, then name), at most `limit` (None:
        all). Looks at every count-eligible node: the group's fit is not ordered by the
        node's free units."""
        ok = []
        for lo, name in eligible(None):
            choice = self.choice(name)
            if not isinstance(choice, NoDeviceGroup):  # `fit`, inlined
                ok.append((tuple(choice[c].fit for c in self.classes), lo, name))
        ok.sort()
        found = [(lo, name) for _, lo, name in ok]
        return found if limit is None else found[:limit]

    def ranked_elsewhere(self, eligible_node: Callable[[str], int | None], tightest: Tightest,
                         limit: int) -> list[tuple[int, str]] | None:
        """`elsewhere(…, limit)` without a look at every node, for a set of one class with
        no member Bound and no hold of its own on any node (a new set, the common case):
        the same list (DR4's order, B4 within one group fit: tightest node, then name), None
        when it does not apply.

        The snapshot's ranking of the class and count (`NodeMemo.ranked`, `ranked`) gives
        the fit groups, tightest first; they are taken in turn until `limit` nodes are found
        (a later group comes after every node of an earlier one). `eligible_node(name)` is a
        node's leftover when `eligible` would list it, else None. Within a group the order
        is (leftover, name), which the ranking does not know (free units change without a
        node's entry going), so a group larger than the nodes still wanted is walked in the
        order of `tightest()` ((leftover, name) of every node `eligible_node` may accept, in
        that order, from the snapshot's free buckets), keeping its members, and stops when
        enough are found: no node of the group it has not reached can come before them. A
        fresh fleet is one group of every node (issue 40: the walk asked all of them); that
        walk asks about `limit` nodes. It gives up after `_SCAN` nodes per member of the
        group (most of them in other groups) and asks the group's members in the ranking's
        order instead, each at most once.

        Shapes: `eligible_node` name -> leftover units or None; `tightest` a `Tightest`;
        `limit` at least 1; returns at most `limit` (leftover, name), best first."""
        if len(self.classes) != 1 or self._own_holds or self.here:
            return None  # the ranking is a new set's: a member's record would score its node
        c = self.classes[0]
        ranking = self.ranked(c, len(self.by_class[c]))
        keys, fit_of = ranking.keys, ranking.fit_of
        found: list[tuple[tuple, int, str]] = []
        i, end = 0, len(keys)
        while i < end and len(found) < limit:
            fit = keys[i][0]
            j = bisect.bisect_right(keys, fit, i, end, key=itemgetter(0))
            asked: dict[str, int | None] = {}
            need = limit - len(found)
            if j - i > need:
                budget = _SCAN * (j - i)
                got: list[tuple[tuple, int, str]] = []
                for _, name in tightest():
                    budget -= 1
                    if budget < 0:
                        break  # too far from the group's members: ask them instead
                    if fit_of.get(name) != fit:
                        continue
                    lo = asked[name] = eligible_node(name)
                    if lo is not None:
                        got.append((fit, lo, name))
                        if len(got) == need:
                            break
                if budget >= 0:  # `need` members found, or every node seen
                    found += got
                    i = j
                    continue
            for k in range(i, j):
                name = keys[k][1]
                lo = asked[name] if name in asked else eligible_node(name)
                if lo is not None:
                    found.append((fit, lo, name))
            i = j
        found.sort()
        return [(lo, name) for _, lo, name in found[:limit]]

    def ranked(self, c: str, count: int) -> Ranking:
        """The snapshot's ranking of a new set of `count` devices of class `c` (which this
        set is, and holds no device on any node): a `model.device.records.Ranking` whose
        `keys` are (fit, node) sorted, for every node serving `c` where the choice succeeds
        (DR3/DR4); built once per snapshot memo, its stale nodes worked out again
        (`Ranking.refreshed`: a bisection each, no pass over every node)."""
        memo = self.snap.memo.ranked
        found = memo.get((c, count))
        if found is not None and not found.dirty:
            return found
        serving = self.snap.serving_nodes(c)
        if found is None:
            keys = []
            for n in serving:
                choice = self.choice(n)
                if not isinstance(choice, NoDeviceGroup):
                    keys.append((choice[c].fit, n))
            keys.sort()
            found = Ranking(keys)
        else:
            fits: dict[str, tuple | None] = {}
            for n in found.dirty:
                choice = self.choice(n) if n in serving else None
                fits[n] = None if choice is None or isinstance(choice, NoDeviceGroup) else choice[c].fit
            found = found.refreshed(fits)
        memo[(c, count)] = found
        return found

    def problems(self, node: str, out: list[Reason], short: bool) -> list[Reason]:
        """`out` (the count-mode reasons `node` fails the set with; it serves every class)
        with DR3's: a size that exists nowhere on the node replaces the shortage of units of
        its resource (room would not help; explain's smallest change leaves the node out,
        `CAPACITY_CODES`); else, when the units are there, no group of them."""
        snap = self.snap
        missing = size_missing(snap, node, {c: len(self.by_class[c]) for c in self.classes},
                               self.matches)
        if missing is not None:
            res = snap.classes[missing.class_name].resource_name
            out = [r for r in out if not (isinstance(r, NoRoom) and r.resource == res)]
            out.append(missing)
        elif not short:
            choice = self.choice(node)
            if isinstance(choice, NoDeviceGroup):
                out.append(choice)
        return self._name_taints(node, out)

    def _name_taints(self, node: str, out: list[Reason]) -> list[Reason]:
        """HL1: `out` with each `NoRoom` of a device-mode class's resource and each
        `NoDeviceGroup` naming the device taints (and their DeviceTaintRules) that keep
        devices of the node from the set (`tainted_devices`); a NoRoom's `foreign` then no
        longer counts them (the DRA index counts a tainted device there). `out` itself
        when no device of the set's classes on the node is tainted (two lengths compared per
        class: nothing more is done without a taint)."""
        n = self.snap.nodes.get(node)
        if n is None or not any(r.code in _TAINT_NAMED for r in out):
            return out
        by_class = {c: tainted_devices(self.snap, n, c, self.request_id, self.own, self.members)
                    for c in self.classes}
        if not any(by_class.values()):
            return out
        classes = self.snap.classes
        named = []
        for r in out:
            if isinstance(r, NoRoom):
                found = [by_class[c] for c in self.classes
                         if by_class[c] and classes[c].resource_name == r.resource]
                if found:
                    tainted = _merge(found)
                    counted = set().union(*(t.devices for t in tainted)) & n.taken_devices
                    counted -= set(self.snap.recorded_devices(node))
                    r = replace(r, foreign=max(r.foreign - len(counted), 0), tainted=tainted)
            elif isinstance(r, NoDeviceGroup) and not r.missing and by_class.get(r.class_name):
                r = replace(r, tainted=by_class[r.class_name])
            named.append(r)
        return named


_TAINT_NAMED = frozenset({Code.NO_ROOM, Code.NO_DEVICE_GROUP})
"""The codes of a node's reasons that name the device taints in the way (HL1)."""


def tainted_devices(snap: SnapshotView, node: NodeView, class_name: str, request_id: str,
                    own: frozenset[DeviceKey], members: Sequence[DeviceView]) -> tuple[TaintedDevices, ...]:
    """DR2/HL1: the devices of `class_name` on `node` that only a NoSchedule/NoExecute
    device taint keeps from request `request_id` (members `members`, keys `own`): tainted,
    and neither recorded by a GPUDevice not of the set, nor held by another request, nor
    allocated by a claim the binder did not make (`Node.foreign_claimed`). One
    `TaintedDevices` per (DeviceTaintRule, key, effect), by rule then key, each naming the
    set's members that record one of its devices. Empty, and at once, when no device of
    the class there is tainted (`DeviceSet.untainted`, worked out once per node)."""
    devices = node.devices_of(class_name)
    if len(devices.untainted) == len(devices):
        return ()
    hit = set(devices.names - devices.untainted)
    recorded = snap.recorded_devices(node.name)
    hit = {d for d in hit if all(k in own for k in recorded.get(d, ()))}
    hit -= node.foreign_claimed
    if hit:
        hit -= held_names((h for h in snap.reservations if h.node == node.name and h.devices),
                          request_id)
    by_taint: dict[tuple[str, str, str], list[str]] = {}
    for name in sorted(hit, key=natural_key):
        for t in devices.by_name(name).taints:
            if t.effect in HARD_DEVICE_TAINTS:
                names = by_taint.setdefault((t.rule, t.key, t.effect), [])
                if name not in names:
                    names.append(name)
    held = {m.status.device.device: m.key[1] for m in members
            if m.bound_node == node.name and m.status.device is not None}
    return tuple(TaintedDevices(tuple(names), key, effect, rule,
                                tuple((held[d], d) for d in names if d in held))
                 for (rule, key, effect), names in sorted(by_taint.items()))


def _merge(found: Sequence[tuple[TaintedDevices, ...]]) -> tuple[TaintedDevices, ...]:
    """The `TaintedDevices` of several classes on one resource, one per taint (the classes
    may share devices)."""
    if len(found) == 1:
        return found[0]
    by: dict[tuple[str, str, str], tuple[list[str], list[tuple[str, str]]]] = {}
    for group in found:
        for t in group:
            names, held = by.setdefault((t.rule, t.key, t.effect), ([], []))
            names += [d for d in t.devices if d not in names]
            held += [h for h in t.held if h not in held]
    return tuple(TaintedDevices(tuple(sorted(names, key=natural_key)), key, effect, rule, tuple(held))
                 for (rule, key, effect), (names, held) in sorted(by.items()))


def size_missing(snap: SnapshotView, node: str, counts: dict[str, int],
                 matches: dict[str, MatchAttribute | None]) -> NoDeviceGroup | None:
    """DR3: the first device-mode class of `counts` (class name -> the set's count of it)
    whose sized matchAttribute (`matches`), resolved for that count, no device of `node`
    carries, as a `NoDeviceGroup` naming the sizes that exist there; None when each one's
    exists, or the class is unsized or has no device on the node."""
    n = snap.nodes.get(node)
    if n is None:
        return None
    for c, count in counts.items():
        match = matches.get(c)
        if match is None or not match.sized:
            continue
        devices = n.devices_of(c)
        if not devices:
            continue
        lay = devices.board.layout(match, count)
        if lay.attribute_missing:
            return NoDeviceGroup(c, lay.attribute, count, 0, 0, True, lay.sizes)
    return None


__all__ = ["NO_DEVICES", "NoDevices", "SetDevices", "no_group", "size_missing", "tainted_devices"]
