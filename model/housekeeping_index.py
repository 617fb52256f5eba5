"""Housekeeping's plan, worked out incrementally (issue 40: a round's cost independent of
the fleet): the same actions as `model.housekeeping.plan` over every device, from judging
only the sets whose inputs changed since the last round.

`plan` decomposes by *set*: a device's actions read the device itself, the other devices
attached by the same admission ((namespace, admission id): the uid one of them records,
as earlier versions wrote it (`recorded_links`), their classes (`set_keeps`), their recorded
`keptUntil`), and what is known of the VMI and VirtualMachine of its name
(`VMIs`, `VMs`, the victims of live nominations), the admission's tombstone, the settings
(grace, answer window, each class's keepSetFor) and the time. A device without an admission
id (or without an attachment) is a set of its own. So `plan(all devices)` is the union over
sets of `plan(that set's devices)`, and a set whose inputs did not change between two rounds
gets the same actions, except for what time alone changes: the next threshold a judgement
compares `now` with (`next_threshold`) is kept in a heap, and the set is judged again
once it is reached.

`PlanIndex` keeps which devices form which set and which sets name which VMI; `Incremental`
decides which sets to judge in a round (`due`: those changed, those whose VMI, VM, tombstone
or nomination changed, those a threshold reached, those that had actions last round: an
action not carried out is planned again) and remembers what it found (`settle`). Anything
that every judgement reads (grace, answer window, keeps, whether the VMs are known) changing
makes a round judge every set, as does a caller asking for it (`full`, the safety net: the
level, not the events, decides H1/H2). Pure: no I/O, no clock; `now` is aware UTC.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Collection, Iterable, Mapping

from model.housekeeping import Action, VMIs, VMs, plan, set_keep
from model.types import DeviceKey, GPUDevice, VMIKey

Group = tuple[str, str, str]
"""A set as housekeeping judges it: ("set", namespace, admission id) for devices attached by
one admission, ("dev", namespace, name) for any other device (a set of its own)."""


def group_of(dev: GPUDevice) -> Group:
    """The set `dev` is judged with (`Group`)."""
    att = dev.status.attached_to
    if att is not None and att.admission:
        return ("set", dev.namespace, att.admission)
    return ("dev", dev.namespace, dev.name)


def names_of(dev: GPUDevice) -> tuple[VMIKey, ...]:
    """The (namespace, VMI name)s whose VMI, VM or nomination `dev`'s judgement reads: its
    attachment's VMI and the VMI it is a template for."""
    att = dev.status.attached_to
    out = []
    if att is not None:
        out.append((dev.namespace, att.vmi))
    if dev.template_for is not None and (att is None or att.vmi != dev.template_for):
        out.append((dev.namespace, dev.template_for))
    return tuple(out)


def next_threshold(devices: Iterable[GPUDevice], now: datetime, grace: timedelta,
                   answer_window: timedelta) -> datetime | None:
    """The first time at or after `now` at which the judgement of `devices` (one set) may
    change with no other input changing: `attachedTo.since` + grace, a request's time (else
    `since`) + answer window, `keptUntil`, a template's creation + grace; None when every
    one has passed. A superset of the times `judge` and `plan` compare `now` with."""
    out: datetime | None = None
    for dev in devices:
        att = dev.status.attached_to
        times = []
        if att is not None:
            times.append(att.since + grace)
            if att.kept_until is not None:
                times.append(att.kept_until)
            br = dev.status.bind_request
            if br is not None:
                times.append((br.requested_at or att.since) + answer_window)
        if dev.template_for is not None and dev.created_at is not None:
            times.append(dev.created_at + grace)
        for t in times:
            if t >= now and (out is None or t < out):
                out = t
    return out


class PlanIndex:
    """Which devices form which set (`Group`), which sets name which VMI, and which devices
    record a keep (`keptUntil`), kept current by `put` (a device's new value, None: gone).
    `devices()` is every device as last put."""

    def __init__(self) -> None:
        self._devices: dict[DeviceKey, GPUDevice] = {}
        self._members: dict[Group, dict[DeviceKey, GPUDevice]] = {}
        self._by_name: dict[VMIKey, set[Group]] = {}
        self._kept: dict[DeviceKey, GPUDevice] = {}

    def devices(self) -> Mapping[DeviceKey, GPUDevice]:
        return self._devices

    def put(self, key: DeviceKey, dev: GPUDevice | None) -> set[Group]:
        """Device `key` is now `dev` (None: deleted); the sets it left or joined."""
        touched: set[Group] = set()
        old = self._devices.pop(key, None)
        if old is not None:
            g = group_of(old)
            touched.add(g)
            members = self._members.get(g)
            if members is not None:
                members.pop(key, None)
                if not members:
                    del self._members[g]
                    for name in names_of(old):
                        self._drop_name(name, g)
                else:
                    still = {n for d in members.values() for n in names_of(d)}
                    for name in names_of(old):
                        if name not in still:
                            self._drop_name(name, g)
            self._kept.pop(key, None)
        if dev is not None:
            g = group_of(dev)
            touched.add(g)
            self._devices[key] = dev
            self._members.setdefault(g, {})[key] = dev
            for name in names_of(dev):
                self._by_name.setdefault(name, set()).add(g)
            att = dev.status.attached_to
            if att is not None and att.kept_until is not None:
                self._kept[key] = dev
        return touched

    def _drop_name(self, name: VMIKey, g: Group) -> None:
        groups = self._by_name.get(name)
        if groups is not None:
            groups.discard(g)
            if not groups:
                del self._by_name[name]

    def groups_named(self, name: VMIKey) -> set[Group]:
        """The sets whose judgement reads VMI (or VM) `name`."""
        return set(self._by_name.get(name, ()))

    def members(self, group: Group) -> list[GPUDevice]:
        """The devices of `group` (none when it has none now)."""
        return list(self._members.get(group, {}).values())

    def groups(self) -> Iterable[Group]:
        return self._members.keys()

    def kept(self) -> list[GPUDevice]:
        """The devices whose attachment records a `keptUntil` (H4)."""
        return list(self._kept.values())

    def set_keep(self, namespace: str, admission: str,
                 keeps: Mapping[str, timedelta | None]) -> timedelta | None:
        """H4: how long the set attached by `admission` is kept (`set_keep` over its devices'
        classes, as `model.housekeeping.set_keeps` gives it)."""
        members = self._members.get(("set", namespace, admission))
        if not members:
            return None
        return set_keep({d.class_name for d in members.values()}, keeps)


@dataclass
class _Settings:
    grace: timedelta
    answer_window: timedelta
    keeps: dict[str, timedelta | None]
    vms_known: bool


class Incremental:
    """The incremental planner (module docstring). A round: `due(...)` (the sets to judge),
    `plan_groups` of them (in chunks, as the caller likes), then `settle` with what was
    found. `plan_round` does all three at once. `index` is the devices as of the last
    `due`."""

    def __init__(self) -> None:
        self.index = PlanIndex()
        self._active: set[Group] = set()
        self._heap: list[tuple[datetime, Group]] = []
        self._deleted: frozenset[tuple[str, str]] = frozenset()
        self._yielded: frozenset[VMIKey] = frozenset()
        self._settings: _Settings | None = None
        self._synced = False

    def due(self, devices: Mapping[DeviceKey, GPUDevice], changed: Iterable[DeviceKey] | None,
            names: Iterable[VMIKey], vmis: VMIs, now: datetime, grace: timedelta,
            answer_window: timedelta, keeps: Mapping[str, timedelta | None],
            vms: VMs | None, yielded: Collection[VMIKey]) -> list[Group]:
        """The sets to judge this round, sorted. `devices`: every device now; `changed`: the
        keys of the devices changed since the last round (None: not known, every set is
        judged and the index made equal to `devices`); `names`: the (namespace, name)s of the VMIs and VMs
        changed since then. The other arguments are `plan`'s."""
        settings = _Settings(grace, answer_window, dict(keeps), vms is not None)
        yielded = frozenset(yielded)
        full = changed is None or not self._synced or settings != self._settings
        self._settings = settings
        if full:
            self._refresh(devices)
            self._heap = []
            self._active = set()
            self._deleted, self._yielded = vmis.deleted, yielded
            self._synced = True
            return sorted(self.index.groups())
        todo: set[Group] = set(self._active)
        for key in changed:
            todo |= self.index.put(key, devices.get(key))
        for name in set(names) | (self._yielded ^ yielded):
            todo |= self.index.groups_named(name)
        if vmis.deleted is not self._deleted:
            for ns, admission in self._deleted ^ vmis.deleted:
                todo.add(("set", ns, admission))
        self._deleted, self._yielded = vmis.deleted, yielded
        while self._heap and self._heap[0][0] <= now:
            todo.add(heapq.heappop(self._heap)[1])
        return sorted(todo)

    def _refresh(self, devices: Mapping[DeviceKey, GPUDevice]) -> None:
        """The index made equal to `devices`: only the devices that are not the very values
        it holds are put again (a sweep costs an identity check per device)."""
        index = self.index
        have = index.devices()
        devices = dict(devices.items())
        for key, dev in devices.items():
            if have.get(key) is not dev:
                index.put(key, dev)
        for key in [k for k in have if k not in devices]:
            index.put(key, None)

    def plan_groups(self, groups: Iterable[Group], vmis: VMIs, now: datetime, *,
                    yielded: Collection[VMIKey] = frozenset(), vms: VMs | None = None) -> list[Action]:
        """`plan` over the devices of `groups` (with the settings `due` was given)."""
        s = self._settings
        assert s is not None, "due() first"
        devices = [d for g in groups for d in self.index.members(g)]
        return plan(devices, vmis, now, s.grace, s.answer_window, keeps=s.keeps, vms=vms,
                    yielded=yielded)

    def settle(self, groups: Iterable[Group], actions: Iterable[Action], now: datetime) -> None:
        """Remember what judging `groups` at `now` found: the sets with `actions` are judged
        again next round; the others when their next threshold is reached."""
        s = self._settings
        assert s is not None, "due() first"
        acted = {group_of(d) for a in actions
                 if (d := self.index.devices().get(a.device)) is not None}
        grace, window = s.grace, s.answer_window
        for g in groups:
            members = self.index.members(g)
            if not members:
                self._active.discard(g)
                continue
            if g in acted:
                self._active.add(g)
                continue
            self._active.discard(g)
            nxt = next_threshold(members, now, grace, window)
            if nxt is not None:
                heapq.heappush(self._heap, (nxt, g))

    def plan_round(self, devices: Mapping[DeviceKey, GPUDevice],
                   changed: Iterable[DeviceKey] | None, names: Iterable[VMIKey], vmis: VMIs,
                   now: datetime, grace: timedelta, answer_window: timedelta = timedelta(0), *,
                   keeps: Mapping[str, timedelta | None] | None = None, vms: VMs | None = None,
                   yielded: Collection[VMIKey] = frozenset()) -> list[Action]:
        """One round at once: `due`, `plan_groups`, `settle`; the actions sorted by device
        key, equal to `plan(devices.values(), ...)`."""
        groups = self.due(devices, changed, names, vmis, now, grace, answer_window,
                          keeps or {}, vms, yielded)
        actions = self.plan_groups(groups, vmis, now, yielded=yielded, vms=vms)
        self.settle(groups, actions, now)
        return sorted(actions, key=lambda a: a.device)
