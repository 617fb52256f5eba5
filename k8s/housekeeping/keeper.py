"""`Housekeeper`: the leader's housekeeping round, composing one worker per job."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterator, Mapping

from anyio.lowlevel import checkpoint

from actors.view import IndexedView
from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping.changes import Changes
from k8s.housekeeping.claims import ClaimsWorker
from k8s.housekeeping.class_conditions import ClassConditions
from k8s.housekeeping.common import FIELD_MANAGER, log
from k8s.housekeeping.devices import DeviceWorker
from k8s.housekeeping.kept import KeptSets
from k8s.housekeeping.lost import LostDevices
from k8s.housekeeping.settings import SettingsWorker
from k8s.informer import Informer
from k8s.rounds import RoundLoop
from model.housekeeping import Action, kept_for_vms
from model.housekeeping_index import Incremental, PlanIndex
from model.nomination import yielding
from model.housekeeping_reasons import Rule
from model.types import DeviceKey, GPUDevice

SWEEP_EVERY = timedelta(seconds=60)
"""The longest time between two rounds that judge every set (`Housekeeper.round`): the
safety net under the incremental rounds (H1/H2 follow the level, not the events)."""
CHUNK = 256
"""Sets judged between two checkpoints of the event loop in a round that judges many
(the first of a leader, a sweep, a relist): the webhook and the coordinator on the same loop
wait for one chunk at most, not for the fleet."""


class _ViewDevices(Mapping[DeviceKey, GPUDevice]):
    """The view's devices as a Mapping read key by key (`IndexedView.device`); iterating
    copies them (only a round that judges every set does)."""

    def __init__(self, view: IndexedView) -> None:
        self._view = view

    def __getitem__(self, key: DeviceKey) -> GPUDevice:
        dev = self._view.device(key)
        if dev is None:
            raise KeyError(key)
        return dev

    def __iter__(self) -> Iterator[DeviceKey]:
        return iter(self._view.devices())

    def __len__(self) -> int:
        return len(self._view.devices())

    def items(self):  # type: ignore[override]  # one copy, not a lookup per key
        return self._view.devices().items()


class _SetKeeps(Mapping[tuple[str, str], "timedelta | None"]):
    """H4: each set's keep ((namespace, admission id) → `model.housekeeping.set_keep` of
    its devices' classes) as the planner's index has the sets now, worked out on lookup
    (the device worker asks only for the sets it acts on)."""

    def __init__(self, index: PlanIndex, keeps: Mapping[str, timedelta | None]) -> None:
        self._index = index
        self._keeps = keeps

    def __getitem__(self, group: tuple[str, str]) -> timedelta | None:
        if ("set", *group) not in self._index.groups():
            raise KeyError(group)
        return self._index.set_keep(group[0], group[1], self._keeps)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter([(g[1], g[2]) for g in self._index.groups() if g[0] == "set"])

    def __len__(self) -> int:
        return sum(1 for g in self._index.groups() if g[0] == "set")


@dataclass(frozen=True, slots=True)
class HousekeepingStats:
    """What housekeeping has done, as one frozen value (`Housekeeper.statistics()`; the
    metrics read it): `rounds` completed (paused ones included), `paused_rounds`,
    `actions_done` (device and claim actions), H3's `settings_present` (None before its
    first look) and `settings_recreated`, H4's `kept_now` (sets kept as of the last round;
    None before one), `released_by` (kept sets released, by cause: `vm_deleted`,
    `expired`), `kept_sets` and `released_sets` (Events told), `condition_writes`, and the
    claims' `claims_deleted` and `claims_restored` (DR6)."""

    rounds: int = 0
    paused_rounds: int = 0
    actions_done: int = 0
    settings_present: bool | None = None
    settings_recreated: int = 0
    kept_now: int | None = None
    released_by: Mapping[str, int] = field(
        default_factory=lambda: {"vm_deleted": 0, "expired": 0})
    kept_sets: int = 0
    released_sets: int = 0
    condition_writes: int = 0
    claims_deleted: int = 0
    claims_restored: int = 0


class Housekeeper:
    """Runs a round (`round`) every `period` seconds and whenever devices, VMIs, classes, the
    settings ConfigMap, KubeVirt CRs or VMs change (`coalesce` seconds after the first change
    of a burst; `k8s.rounds`). `client` makes its API calls (its timeout bounds each; writes
    carry field manager `gpu-binder-housekeeping`); `grace` is `attachmentGrace`;
    `answer_window` (the bind timeout) is how long a refused request is left to the webhook
    that wrote it; up to `concurrency` devices are worked on at once; `vms` is the VM
    informer (H4; None: no set is ever kept).

    The workers, by job: `devices` (H1, H2, H4 on GPUDevices), `kept` (H4's Events, VM
    conditions and released keeps), `claims` (H1/H2 of the binder's claims, DR6),
    `settings` (H3), `class_conditions` (GPUClass Ready, KubeVirtPermitted) and `lost` (HL3:
    the lost devices' Events).

    While `run` runs, a round judges only the sets whose inputs changed since the last one
    (`changes`, `planner`: `model.housekeeping_index`); a round called on its own, the first
    of a leader, one after a pause, and one at least every `sweep_every` judge every set."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, grace: timedelta,
                 raw_policy: str, period: float = 5.0, concurrency: int = 16,
                 coalesce: float = 0.2, answer_window: timedelta = timedelta(0),
                 vms: Informer | None = None, sweep_every: timedelta = SWEEP_EVERY) -> None:
        client = client.using(field_manager=FIELD_MANAGER)
        self.cache = cache
        self.grace = grace
        self.answer_window = answer_window
        self.period = period
        self.coalesce = coalesce
        self.vms = vms
        self.kept = KeptSets(client, cache, grace=grace, vms=vms)
        self.devices = DeviceWorker(client, cache, self.kept, concurrency=concurrency)
        self.claims = ClaimsWorker(client, cache, grace=grace, concurrency=concurrency)
        self.settings = SettingsWorker(client, cache, raw_policy=raw_policy)
        self.class_conditions = ClassConditions(client, cache)
        self.lost = LostDevices(client, cache)
        self.rounds = 0
        self.paused_rounds = 0
        self.full_rounds = 0
        self._paused = False
        self.changes: Changes | None = None  # while `listening`
        self.planner = Incremental()
        self.sweep_every = sweep_every
        self._last_sweep: datetime | None = None
        self._changed_devices: set | None = None  # this round's, for the lost devices
        self._lost_behind = True
        self._taken: dict | None = None   # this round's changes as taken (None: not known)
        self._sweep = True

    async def run(self) -> None:
        """Loop until cancelled: a round now, then one after every change of the devices,
        VMIs, classes, the settings ConfigMap, KubeVirt CRs or VMs (a burst of changes
        coalesced into one round `coalesce` seconds after its first) and at least every
        `period`."""
        with self.listening():
            await self._loop()

    @contextmanager
    def listening(self) -> Iterator[None]:
        """While the block runs, rounds learn what changed from the informers' listeners
        (`changes`) and judge only that (the class); `run` listens."""
        self.changes = Changes(devices=self.cache.devices, vmis=self.cache.vmis, vms=self.vms,
                               claims=self.cache.claims)
        try:
            with self.changes.listening():
                yield
        finally:
            self.changes = None

    async def _loop(self) -> None:
        await RoundLoop(self.round, period=self.period, coalesce=self.coalesce, sources=(
            self.cache.devices, self.cache.vmis, self.cache.classes, self.cache.settings,
            self.cache.kubevirts, self.cache.slices,
            *((self.vms,) if self.vms is not None else ()))).run()

    def keeps(self) -> dict[str, timedelta | None]:
        """H4: each GPUClass's keepSetFor (None: off)."""
        return {name: c.keep_set_for for name, c in self.cache.view.classes().items()}

    async def round(self, now: datetime | None = None, *, full: bool = False) -> None:
        """One pass: H1, H2 and H4 on the devices and the binder's claims, DR6, then H3, the
        class conditions and the lost devices (HL3). The device and claim work pauses while the devices' or VMIs'
        informer is unhealthy (what the cache shows may be long gone or missing). `full`:
        judge every set (see the class), as is done anyway when what changed is not known."""
        now = now or datetime.now(timezone.utc)
        self._changed_devices = None
        if not self.cache.healthy(self.cache.devices, self.cache.vmis):
            self.paused_rounds += 1
            if not self._paused:
                log.warning("housekeeping paused: an informer is not following the API "
                            "server", rule=Rule.H2, devices=self.cache.devices.healthy,
                            vmis=self.cache.vmis.healthy)
            self._paused = True
            if self.changes is not None:
                self.changes.forget()
        else:
            if self._paused:
                log.info("housekeeping resumed: informers follow the API server", rule=Rule.H2)
            self._paused = False
            await self._devices_and_claims(now, full)
        if self.cache.healthy(self.cache.classes, self.cache.settings):
            await self.settings.ensure()
        if self.cache.healthy(self.cache.classes, self.cache.kubevirts):
            await self.class_conditions.ensure()
        if self.cache.healthy(self.cache.slices, self.cache.devices, self.cache.nodes):
            # HL3: a relist in progress is no loss
            await self.lost.tell(now, None if self._lost_behind else self._changed_devices)
            self._lost_behind = False
        else:
            self._lost_behind = True
        self.rounds += 1

    async def _plan(self, now: datetime, full: bool) -> list[Action]:
        """This round's device actions (`model.housekeeping.plan`'s), from the sets whose
        inputs changed, or every set (`full`, a sweep due, what changed not known); a
        checkpoint every `CHUNK` sets."""
        changed = self.changes.take() if self.changes is not None else None
        vm_changes = None if changed is None else changed.get("vms", set())
        self._taken = changed
        last = self._last_sweep
        if full or changed is None or last is None or not last <= now < last + self.sweep_every:
            changed = None
            self._last_sweep = now
            self.full_rounds += 1
        self._changed_devices = None if self._taken is None else self._taken["devices"]
        self._sweep = changed is None
        keeps = self.keeps()
        vms = self.kept.vm_records(vm_changes)
        vmis = self.cache.vmi_state()
        yielded = yielding(self.cache.view.nominations().values(), now)
        names = () if changed is None else changed.get("vmis", set()) | changed.get("vms", set())
        groups = self.planner.due(_ViewDevices(self.cache.view),
                                  None if changed is None else changed["devices"], names, vmis,
                                  now, self.grace, self.answer_window, keeps, vms, yielded)
        actions: list[Action] = []
        for i in range(0, len(groups), CHUNK):
            if i:
                await checkpoint()
            chunk = groups[i:i + CHUNK]
            found = self.planner.plan_groups(chunk, vmis, now, yielded=yielded, vms=vms)
            self.planner.settle(chunk, found, now)
            actions += found
        return sorted(actions, key=lambda a: a.device)

    async def _devices_and_claims(self, now: datetime, full: bool = False) -> None:
        actions = await self._plan(now, full)
        keeps = self.keeps()
        kept = kept_for_vms(self.planner.index.kept(), now)
        self.kept.kept_now = len(kept)
        await self.devices.carry_out(actions, now, _SetKeeps(self.planner.index, keeps))
        await self.kept.tell(now)
        if self.vms is not None and self.vms.healthy:
            taken = None if self._taken is None or self._sweep else \
                self._taken.get("vms", set()) | self._taken.get("vmis", set())
            await self.kept.write_conditions(kept, now, taken)
        else:
            self.kept.forget_conditions()  # what changed meanwhile is not followed
        self.claims.follow(self._taken, sweep=self._sweep)
        await self.claims.release(now, self.kept.released_admissions(now))
        await self.claims.restore(now)

    async def ensure_settings(self) -> None:
        """H3 alone (`SettingsWorker.ensure`)."""
        await self.settings.ensure()

    async def ensure_class_conditions(self) -> None:
        """The GPUClass conditions alone (`ClassConditions.ensure`)."""
        await self.class_conditions.ensure()

    def statistics(self) -> HousekeepingStats:
        """What housekeeping has done so far, as a frozen value."""
        k = self.kept
        return HousekeepingStats(
            rounds=self.rounds, paused_rounds=self.paused_rounds,
            actions_done=self.devices.actions_done + self.claims.actions_done,
            settings_present=self.settings.settings_present,
            settings_recreated=self.settings.settings_recreated,
            kept_now=k.kept_now, released_by=dict(k.released_by), kept_sets=k.kept_sets,
            released_sets=k.released_sets, condition_writes=k.condition_writes,
            claims_deleted=self.claims.claims_deleted,
            claims_restored=self.claims.claims_restored)
