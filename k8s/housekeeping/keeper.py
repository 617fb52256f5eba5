"""`Housekeeper`: the leader's housekeeping round, composing one worker per job."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Mapping

from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping.claims import ClaimsWorker
from k8s.housekeeping.class_conditions import ClassConditions
from k8s.housekeeping.common import FIELD_MANAGER, log
from k8s.housekeeping.devices import DeviceWorker
from k8s.housekeeping.kept import KeptSets
from k8s.housekeeping.lost import LostDevices
from k8s.housekeeping.settings import SettingsWorker
from k8s.informer import Informer
from k8s.rounds import RoundLoop
from model.housekeeping import kept_for_vms, plan, set_keeps
from model.nomination import yielding
from model.housekeeping_reasons import Rule


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
    the lost devices' Events)."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, grace: timedelta,
                 raw_policy: str, period: float = 5.0, concurrency: int = 16,
                 coalesce: float = 0.2, answer_window: timedelta = timedelta(0),
                 vms: Informer | None = None) -> None:
        client = client.using(field_manager=FIELD_MANAGER)
        self.cache = cache
        self.grace = grace
        self.answer_window = answer_window
        self.period = period
        self.coalesce = coalesce
        self.vms = vms
        self.kept = KeptSets(client, cache, grace=grace, vms=vms)
        self.devices = DeviceWorker(client, cache, self.kept, concurrency=concurrency)
        self.claims = ClaimsWorker(client, cache, grace=grace)
        self.settings = SettingsWorker(client, cache, raw_policy=raw_policy)
        self.class_conditions = ClassConditions(client, cache)
        self.lost = LostDevices(client, cache)
        self.rounds = 0
        self.paused_rounds = 0
        self._paused = False

    async def run(self) -> None:
        """Loop until cancelled: a round now, then one after every change of the devices,
        VMIs, classes, the settings ConfigMap, KubeVirt CRs or VMs (a burst of changes
        coalesced into one round `coalesce` seconds after its first) and at least every
        `period`."""
        await RoundLoop(self.round, period=self.period, coalesce=self.coalesce, sources=(
            self.cache.devices, self.cache.vmis, self.cache.classes, self.cache.settings,
            self.cache.kubevirts, self.cache.slices,
            *((self.vms,) if self.vms is not None else ()))).run()

    def keeps(self) -> dict[str, timedelta | None]:
        """H4: each GPUClass's keepSetFor (None: off)."""
        return {name: c.keep_set_for for name, c in self.cache.view.classes().items()}

    async def round(self, now: datetime | None = None) -> None:
        """One pass: H1, H2 and H4 on the devices and the binder's claims, DR6, then H3, the
        class conditions and the lost devices (HL3). The device and claim work pauses while the devices' or VMIs'
        informer is unhealthy (what the cache shows may be long gone or missing)."""
        now = now or datetime.now(timezone.utc)
        if not self.cache.healthy(self.cache.devices, self.cache.vmis):
            self.paused_rounds += 1
            if not self._paused:
                log.warning("housekeeping paused: an informer is not following the API "
                            "server", rule=Rule.H2, devices=self.cache.devices.healthy,
                            vmis=self.cache.vmis.healthy)
            self._paused = True
        else:
            if self._paused:
                log.info("housekeeping resumed: informers follow the API server", rule=Rule.H2)
            self._paused = False
            await self._devices_and_claims(now)
        if self.cache.healthy(self.cache.classes, self.cache.settings):
            await self.settings.ensure()
        if self.cache.healthy(self.cache.classes, self.cache.kubevirts):
            await self.class_conditions.ensure()
        if self.cache.healthy(self.cache.slices, self.cache.devices, self.cache.nodes):
            await self.lost.tell(now)  # HL3: a relist in progress is no loss
        self.rounds += 1

    async def _devices_and_claims(self, now: datetime) -> None:
        devices = list(self.cache.view.devices().values())
        keeps = self.keeps()
        kept = kept_for_vms(devices, now)
        self.kept.kept_now = len(kept)
        vms = self.kept.vm_records()
        await self.devices.carry_out(
            plan(devices, self.cache.vmi_state(), now, self.grace, self.answer_window,
                 keeps=keeps, vms=vms, yielded=yielding(self.cache.view.nominations().values(), now)),
            now, set_keeps(devices, keeps)[0])
        await self.kept.tell(now)
        if vms is not None:
            await self.kept.write_conditions(kept, now)
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
