"""What a snapshot knows of device mode beyond its nodes (docs/contract.md §3b, DR2): the
records (`status.device`) of the Bound GPUDevices per node, carried over copy-on-write as
devices change; the devices free for a set on a node; and `NodeMemo`, the snapshot's memo of
answers that depend on one node alone.

Pure. Reads the core's values by attribute (a `model.types.GPUDevice`'s `key`, `bound_node`
and `status.device`, a `model.types.Node`'s devices, a `model.hold.Hold`'s `node`,
`request_id` and `devices`) and imports none of them.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable, Mapping, Sequence

from model.device.dra import DeviceRef
from model.device.match import MatchAttribute
from model.device.ports import DeviceKey, DeviceView, HoldView, NodeView, SnapshotView
from model.device.topology import GroupChoice, natural_key
from model.reasons import NoDeviceGroup

GroupOutcome = dict[str, GroupChoice] | NoDeviceGroup
"""A set's choice on a node: one group per device-mode class, or why there is none (DR3)."""

Change = tuple[DeviceView | None, DeviceView | None]
"""A device before and after (None: none), as a snapshot is derived."""

Records = dict[str, dict[str, tuple[DeviceKey, ...]]]
"""Per node, the device names Bound GPUDevices on it record, with their keys (DR2)."""


class NodeMemo:
    """A snapshot's memo of device-mode answers that depend only on one node (its devices,
    taken devices and taints), the records on it and the reservations naming its devices,
    kept per node: `groups[node][(class, count)]` the group choice of a new set
    (`model.device.choice`), `largest[node][class]` the sizes its free groups take
    (`model.device.view`). A snapshot derived by `with_*`/`without_*` keeps the entries of
    the nodes whose records and holds did not change (`without`: a copy of the outer map
    less those nodes, the per-node maps shared), sharing the memo when none did: an entry is
    true of every memo that holds its node's map, whichever fills it, since each derivation
    that changes a node drops that node's map."""

    __slots__ = ("groups", "largest", "ranked", "_lent_groups", "_lent_largest")

    def __init__(self, groups: dict[str, dict[tuple[str, int], GroupOutcome]] | None = None,
                 largest: dict[str, dict[str, int | tuple[int, ...]]] | None = None,
                 ranked: dict[tuple[str, int], Ranking] | None = None) -> None:
        self.groups: dict[str, dict[tuple[str, int], GroupOutcome]] = {} if groups is None else groups
        self.largest: dict[str, dict[str, int | tuple[int, ...]]] = {} if largest is None else largest
        self.ranked: dict[tuple[str, int], Ranking] = {} if ranked is None else ranked
        """`ranked[(class, count)]`: the serving nodes where a new set's group choice
        succeeds, tightest first (`Ranking`; `model.device.choice.SetDevices.ranked`)."""
        self._lent_groups: frozenset[str] | set[str] = frozenset()
        self._lent_largest: frozenset[str] | set[str] = frozenset()
        """The nodes whose map in `groups` (`largest`) this memo shares with the memo it was
        copied from (`copy`): copied before this memo fills it, never filled in place."""

    def group(self, node: str, class_name: str, count: int) -> GroupOutcome | None:
        """The remembered group choice of a new set of `count` devices of `class_name` on
        `node`, None when not worked out yet."""
        here = self.groups.get(node)
        return None if here is None else here.get((class_name, count))

    def put_group(self, node: str, class_name: str, count: int, outcome: GroupOutcome) -> None:
        """Remember `outcome` as `group(node, class_name, count)`."""
        here = self.groups.get(node)
        if here is None:
            here = self.groups[node] = {}
        elif node in self._lent_groups:
            here = self.groups[node] = dict(here)
            self._lent_groups.discard(node)  # type: ignore[union-attr] - a set once lent
        here[(class_name, count)] = outcome

    def sizes(self, node: str, class_name: str) -> int | tuple[int, ...] | None:
        """The remembered sizes the free groups of `class_name` on `node` take
        (`model.device.view.placeable_sizes`), None when not worked out yet."""
        here = self.largest.get(node)
        return None if here is None else here.get(class_name)

    def put_sizes(self, node: str, class_name: str, sizes: int | tuple[int, ...]) -> None:
        """Remember `sizes` as `sizes(node, class_name)`."""
        here = self.largest.get(node)
        if here is None:
            here = self.largest[node] = {}
        elif node in self._lent_largest:
            here = self.largest[node] = dict(here)
            self._lent_largest.discard(node)  # type: ignore[union-attr] - a set once lent
        here[class_name] = sizes

    def without(self, nodes: Iterable[str]) -> NodeMemo:
        """A new memo without the entries of `nodes` (this one is left as it is); each
        ranking keeps the others' places and works theirs out again on its next use. Costs
        a copy of the two outer maps (one entry per node), not a pass over the entries."""
        gone = set(nodes)
        groups, largest = dict(self.groups), dict(self.largest)
        for name in gone:
            groups.pop(name, None)
            largest.pop(name, None)
        out = NodeMemo(groups, largest, {k: r.stale(gone) for k, r in self.ranked.items()})
        if self._lent_groups:  # what this memo may not fill, the derived one may not either
            out._lent_groups = set(self._lent_groups) - gone
        if self._lent_largest:
            out._lent_largest = set(self._lent_largest) - gone
        return out

    def copy(self) -> NodeMemo:
        """A copy that never fills a map it shares: a planner may fill or trim it, and a
        reader in another thread may fill it while this one's owner derives from this one
        (`Snapshot.with_own_memo`). Copy-on-write: the outer maps are copied (in one call
        each, no Python loop over them that another thread's fill could break), the
        per-node maps shared until the copy fills one (then that one is copied), so a
        planner's batch costs no map copy per node (issue 40: it grew with the fleet's
        records). This memo still fills the shared maps in place: an entry is true of
        every memo holding its node's map (the class docstring), and the copy drops a
        node's map (`without`) before its holds change that node."""
        out = NodeMemo(dict(self.groups), dict(self.largest), dict(self.ranked))
        out._lent_groups = set(out.groups)
        out._lent_largest = set(out.largest)
        return out


class Ranking:
    """For a new set of `count` devices of one class (DR4): `keys`, sorted, (fit, node) for
    every node serving the class where the group choice succeeds (`GroupChoice.fit`);
    `fit_of`, the same as node -> fit (the fit group a node is in, for a walk in another
    order: `model.device.choice.SetDevices.ranked_elsewhere`); and `dirty`, the nodes whose
    entry may be wrong (their devices, records or holds changed since) and is worked out
    again before the next use (`refreshed`). `keys` and `fit_of` are never changed in place:
    a memo derived with `without` shares them. Nothing here depends on a node's free units
    (they change without its entry going: a hold naming no device, a foreign Pod), so the
    ranking says nothing of the order within one fit."""

    __slots__ = ("keys", "fit_of", "dirty")

    def __init__(self, keys: list[tuple[tuple, str]], dirty: frozenset[str] = frozenset(),
                 fit_of: dict[str, tuple] | None = None) -> None:
        self.keys = keys
        self.fit_of: dict[str, tuple] = {n: f for f, n in keys} if fit_of is None else fit_of
        self.dirty = dirty

    def stale(self, nodes: set[str]) -> Ranking:
        """This ranking with `nodes` to be worked out again (the keys shared)."""
        return Ranking(self.keys, self.dirty | nodes, self.fit_of) if nodes else self

    def refreshed(self, fits: Mapping[str, tuple | None]) -> Ranking:
        """This ranking with the `dirty` nodes' entries replaced by `fits` (node -> its fit
        now, None where the choice fails or it serves the class no more; every dirty node
        in it), and none dirty. Costs a copy of the two containers (one C-level copy each)
        and a bisection per dirty node, not a pass in Python over every node (issue 40)."""
        keys, fit_of = list(self.keys), dict(self.fit_of)
        for node, fit in fits.items():
            was = fit_of.pop(node, None)
            if was is not None:
                del keys[bisect.bisect_left(keys, (was, node))]
            if fit is not None:
                bisect.insort(keys, (fit, node))
                fit_of[node] = fit
        return Ranking(keys, frozenset(), fit_of)


def recorded_on(d: DeviceView | None) -> tuple[str, DeviceRef] | None:
    """Where and what GPUDevice `d` records (DR2): (its bound node, `status.device`), None
    when it is gone, on no node or records no device. The one reading of a record that
    the pipeline and the cache compare (a re-point, a move done, a node's excused device)."""
    if d is None or d.bound_node is None:
        return None
    ref = d.status.device
    return None if ref is None else (d.bound_node, ref)


def _recorded(d: DeviceView | None) -> bool:
    return recorded_on(d) is not None


def add_record(rec: Records, d: DeviceView) -> None:
    """Count `d`'s record (when it is Bound and records a device) into `rec`, in place."""
    ref = d.status.device
    node = d.bound_node
    if ref is None or node is None:
        return
    on = rec.setdefault(node, {})
    on[ref.device] = on.get(ref.device, ()) + (d.key,)


def records_of(by_ns: Mapping[str, Mapping[str, DeviceView]]) -> Records:
    """The records of every device of `by_ns` (namespace -> name -> GPUDevice)."""
    rec: Records = {}
    for devices in by_ns.values():
        for d in devices.values():
            add_record(rec, d)
    return rec


def derive_records(rec: Records, changes: Sequence[Change]) -> Records:
    """`rec` after `changes` (old, new GPUDevice pairs, None for none), copying only the
    touched nodes."""
    out = rec
    for old, new in changes:
        o, n = _recorded(old), _recorded(new)
        if not o and not n:
            continue
        if out is rec:
            out = dict(rec)
        if o:
            node, name = old.bound_node, old.status.device.device
            on = out[node] = dict(out.get(node, {}))
            keys = tuple(k for k in on.get(name, ()) if k != old.key)
            if keys:
                on[name] = keys
            else:
                on.pop(name, None)
        if n:
            node = new.bound_node
            out[node] = dict(out.get(node, {}))
            add_record(out, new)
    return out


def touched_nodes(changes: Sequence[Change], before: tuple[HoldView, ...],
                  after: tuple[HoldView, ...] | None, added: Sequence[HoldView] | None) -> set[str]:
    """The nodes whose records (device `changes`) or device holds (`before` -> `after`, with
    `added` the holds only added, when known) differ: their `NodeMemo` entries go."""
    out: set[str] = set()
    for old, new in changes:
        for d in (old, new):
            if _recorded(d):
                out.add(d.bound_node)
    if after is not None:
        if added is not None:
            moved: Iterable[HoldView] = added
        else:
            was, now = {id(h) for h in before}, {id(h) for h in after}
            moved = [h for h in after if id(h) not in was] + [h for h in before if id(h) not in now]
        out.update(h.node for h in moved if h.devices)
    return out


def holds_by_node(reservations: Iterable[HoldView]) -> dict[str, list[HoldView]]:
    """The reservations naming devices (`Hold.devices`), by node."""
    held: dict[str, list[HoldView]] = {}
    for r in reservations:
        if r.devices:
            held.setdefault(r.node, []).append(r)
    return held


def held_names(holds: Iterable[HoldView], exclude_request: str | None = None) -> frozenset[str]:
    """The device names `holds` (of one node) hold, except those of `exclude_request`."""
    out: set[str] = set()
    for r in holds:
        if r.request_id != exclude_request:
            out.update(ref.device for _, ref in r.devices)
    return frozenset(out)


def free_devices(node: NodeView | None, class_name: str, recorded: Mapping[str, tuple[DeviceKey, ...]] | None,
                 holds: Sequence[HoldView], request_id: str | None = None,
                 own: Iterable[DeviceKey] = (), match: MatchAttribute | None = None) -> frozenset[str]:
    """DR2: the names of the devices of `class_name` on `node` (a `model.types.Node`, None
    when gone) free for request `request_id` whose members are `own`: not tainted
    NoSchedule/NoExecute, carrying the class's topology attribute `match` (HL3: one
    published without it is lost, never free: `DeviceSet.without_attribute`), not in
    `Node.taken_devices`, not recorded (`recorded`: the node's
    records) by a Bound GPUDevice other than `own`, not held by another request's hold
    (`holds`: those naming the node's devices). A device recorded by one of `own` is free for
    it even when a claim the binder made allocates it (its own claim, DR5), not when another
    does (`Node.foreign_claimed`). Empty for a gone node or a class without devices there.

    Set operations on the node's `model.device.dra.DeviceSet` (its names worked out once per
    node): a decision asks this of every eligible node."""
    if node is None:
        return frozenset()
    devices = node.devices_of(class_name)
    if not devices:
        return frozenset()
    out = devices.untainted
    if match is not None:
        lost = devices.without_attribute(match)
        if lost:
            out = out - lost
    mine: frozenset[str] | set[str] = frozenset()
    if recorded:
        own_keys = own if isinstance(own, (set, frozenset)) else set(own)
        if own_keys:
            mine = {name for name, keys in recorded.items() if any(k in own_keys for k in keys)}
            others = {name for name, keys in recorded.items()
                      if any(k not in own_keys for k in keys)}
            out = out - others
        else:
            out = out.difference(recorded)
    if holds:
        out = out - held_names(holds, request_id)
    taken = node.taken_devices
    if taken:
        # a set's own claim does not take its recorded device from it; another's does
        out = out - (taken - (mine - node.foreign_claimed) if mine else taken)
    return out


def recorded_names(devices: Iterable[DeviceView]) -> set[str]:
    """The device names `devices` record (the Bound GPUDevices of one node)."""
    return {d.status.device.device for d in devices if d.status.device is not None}


def taken_names(wanted: Sequence[str], node: NodeView | None, devices_on: Iterable[DeviceView],
                own: set[DeviceKey], held: set[str]) -> tuple[str, ...]:
    """DR2 for a node actor's ledger: the names of `wanted` (the devices a hold names on
    `node`, None when gone) that are not free there, in natural order: in
    `Node.taken_devices` (a claim's allocation, a device taint), recorded by one of
    `devices_on` (the devices on the node) that is not of `own` (the hold's members and
    landing devices), held by another request's lease (`held`), or wanted twice. A member's
    own record is free for it (its claim may allocate it: not in the way), unless a claim the
    binder did not make allocates it (`Node.foreign_claimed`)."""
    taken_by_claims = node.taken_devices if node else frozenset()
    mine: set[str] = set()
    others: set[str] = set(held)
    for dev in devices_on:
        rec = dev.status.device
        if rec is not None:
            (mine if dev.key in own else others).add(rec.device)
    foreign = node.foreign_claimed if node else frozenset()
    out = {n for n in wanted
           if n in others or (n in taken_by_claims and (n not in mine or n in foreign))}
    if len(set(wanted)) != len(wanted):  # one device for two members: never
        out |= {n for n in wanted if wanted.count(n) > 1}
    return tuple(sorted(out, key=natural_key))


def foreign_claimed_records(snap: SnapshotView, members: Iterable[DeviceView]) -> tuple[tuple[str, str], ...]:
    """(member name, device name) for each of `members` (GPUDevices of one set), Bound, whose
    record (`status.device`) names a device of its node that a claim the binder did not make
    allocates (`Node.foreign_claimed`: kube-scheduler gave it to another consumer while the
    set was kept for a stopped VM, H4), in the members' order. W4 never admits such a set as
    it is (its claim could not be allocated: DR5); the binder re-points it (`free_devices`
    does not count the device free for it). Empty in count mode."""
    out = []
    for m in members:
        rec, node = m.status.device, m.bound_node
        if rec is None or node is None or m.class_name not in snap.mode.matches:
            continue
        n = snap.nodes.get(node)
        if n is not None and rec.device in n.foreign_claimed:
            out.append((m.key[1], rec.device))
    return tuple(out)


def record_after(status: Any, key: DeviceKey, chosen: Mapping[DeviceKey, DeviceRef],
                 moved: bool) -> DeviceRef | None:
    """The record (`status.device`) a GPUDevice of `key` carries after a decision: the device
    `chosen` for it, else none when it moved to another node, else the one it had (DR4)."""
    if moved:
        return chosen.get(key)
    return chosen.get(key, status.device)


__all__ = ["NodeMemo", "Records", "add_record", "derive_records", "foreign_claimed_records", "free_devices",
           "held_names", "holds_by_node", "record_after", "recorded_names", "recorded_on", "records_of",
           "taken_names", "touched_nodes"]
