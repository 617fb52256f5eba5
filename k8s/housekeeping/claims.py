"""The ResourceClaims the binder made for device-mode VMIs (DR5): H1/H2 delete one no VMI
uses (H4: at once when its kept set was released), and DR6 makes again the claim of an
admitted VMI that someone deleted before its launcher Pod took it.

Claims are read from the cache's claim informer only (`claim_records` and `claim_keys`, the
only places that read them); while it does not follow the API server nothing is judged. Every step is
confirmed first by a live read of the VMI.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable, Mapping

from anyio.lowlevel import checkpoint

from k8s import errors, events
from k8s.cache import ClusterCache
from k8s.client import RESOURCE_CLAIMS, VMIS, KubeClient
from k8s.housekeeping.common import each_bounded, live_vmi, log
from model.admission import AdmissionPlan
from model.claim import (ClaimRecord, DeleteClaim, RestoreClaim, build_claim, claim_name,
                         claim_record, members_of, missing_claims, restorable_into,
                         stale_claims)
from model.device.seam import device_classes
from model.housekeeping_reasons import ClaimRestoredEvent, Rule
from model.types import DeviceKey, VMIKey

Key = tuple[str, str]
CHUNK = 256
"""VMIs judged between two checkpoints of the event loop (DR6 in a sweep)."""


def claim_records(cache: ClusterCache) -> list[ClaimRecord] | None:
    """The claims the binder made (`model.claim.claim_record`: label
    `app.kubernetes.io/managed-by: gpu-binder` and a claim-for annotation) as the claim
    informer has them, parsed once at ingest (`k8s.cache.ingest_claim`); None while it does
    not follow the API server (nothing to judge this round)."""
    if not cache.healthy(cache.claims):
        return None
    return [r for r in (claim_record(obj["parsed"]) for obj in cache.claims.items())
            if r is not None]


def claim_keys(cache: ClusterCache) -> set[tuple[str, str]] | None:
    """(namespace, name) of every claim the claim informer has, ours or not (a claim of the
    name that is not ours is never replaced); None while it does not follow the API
    server."""
    if not cache.healthy(cache.claims):
        return None
    return set(cache.claims.keys())


class _ClaimKeys:
    """Whether the claim informer has a claim of a (namespace, name), ours or not, read
    key by key (`missing_claims` asks only for the VMIs it judges)."""

    def __init__(self, cache: ClusterCache) -> None:
        self._claims = cache.claims

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self._claims.get(key) is not None  # type: ignore[arg-type]


@dataclass
class _Due:
    """What a round judges: `claims` (keys) for H1/H2/H4 and `vmis` ((namespace, name))
    for DR6; None: every one."""

    claims: set[Key] | None = None
    vmis: set[VMIKey] | None = None


@dataclass
class _Index:
    """The claims worker's memory between rounds (see `ClaimsWorker.follow`)."""

    records: dict[Key, ClaimRecord] = field(default_factory=dict)
    by_vmi: dict[VMIKey, set[Key]] = field(default_factory=dict)
    by_admission: dict[tuple[str, str], set[Key]] = field(default_factory=dict)
    attached: dict[DeviceKey, VMIKey] = field(default_factory=dict)
    devices_of: dict[VMIKey, set[DeviceKey]] = field(default_factory=dict)
    named: dict[Key, set[VMIKey]] = field(default_factory=dict)
    """(namespace, `claim_name(vmi)`) → the attached VMI names whose claim that would be."""
    heap: list[tuple[datetime, Key]] = field(default_factory=list)
    retry_claims: set[Key] = field(default_factory=set)
    retry_vmis: set[VMIKey] = field(default_factory=set)
    device_classes: frozenset[str] | None = None

    def put_claim(self, key: Key, rec: ClaimRecord | None) -> None:
        old = self.records.pop(key, None)
        if old is not None:
            _drop(self.by_vmi, (old.namespace, old.vmi), key)
            if old.admission:
                _drop(self.by_admission, (old.namespace, old.admission), key)
        if rec is not None:
            self.records[key] = rec
            self.by_vmi.setdefault((rec.namespace, rec.vmi), set()).add(key)
            if rec.admission:
                self.by_admission.setdefault((rec.namespace, rec.admission), set()).add(key)

    def put_device(self, key: DeviceKey, vmi: VMIKey | None) -> set[VMIKey]:
        """Device `key` (changed) is now attached to `vmi` (None: to none, or gone); the VMI
        names whose attached devices changed (DR6 reads their records, nodes and requests)."""
        old = self.attached.pop(key, None)
        if old == vmi:
            if vmi is not None:
                self.attached[key] = vmi
            return {vmi} if vmi is not None else set()
        if old is not None:
            _drop(self.devices_of, old, key)
            if old not in self.devices_of:
                _drop(self.named, (old[0], claim_name(old[1])), old)
        if vmi is not None:
            self.attached[key] = vmi
            self.devices_of.setdefault(vmi, set()).add(key)
            self.named.setdefault((vmi[0], claim_name(vmi[1])), set()).add(vmi)
        return {n for n in (old, vmi) if n is not None}


def _drop(index: dict, key, value) -> None:
    bucket = index.get(key)
    if bucket is not None:
        bucket.discard(value)
        if not bucket:
            del index[key]


def _attached_to(dev) -> VMIKey | None:
    att = dev.status.attached_to if dev is not None else None
    return (dev.namespace, att.vmi) if att is not None else None


class ClaimsWorker:
    """H1/H2 (`release`) and DR6 (`restore`) of the binder's claims; `grace` is
    `attachmentGrace`. Counters: `claims_deleted`, `claims_restored`, `actions_done` (both).

    `follow` tells it what changed since the last round (the claims, VMIs and GPUDevices
    the informers told of; None: not known): a round then judges only the claims and VMIs
    those can change, those whose grace ran out since (a heap of times), those whose kept
    set was just released (H4), and those it acted on last round (an action not done is
    tried again). Without `follow`, every claim and VMI is judged each round."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, grace: timedelta,
                 concurrency: int = 16) -> None:
        self._client = client
        self.concurrency = concurrency
        self.cache = cache
        self.grace = grace
        self.actions_done = 0
        self.claims_deleted = 0
        self.claims_restored = 0
        self._index: _Index | None = None
        self._due = _Due()

    def follow(self, changed: Mapping[str, set] | None, *, sweep: bool = False) -> None:
        """This round's changes (`changed`: {"claims", "vmis", "devices": keys}; None: not
        known, every claim and VMI judged and the memory rebuilt); `sweep`: judge every
        claim and VMI all the same. Call once a round, before `release` and `restore`."""
        if not self.cache.healthy(self.cache.claims):
            self._index, self._due = None, _Due()
            return
        classes = frozenset(device_classes(self.cache.view.classes().values()))
        index = self._index
        if changed is None or index is None or index.device_classes != classes:
            index = self._index = _Index(device_classes=classes)
            for obj in self.cache.claims.items():
                meta = obj.get("metadata") or {}
                rec = claim_record(obj["parsed"])
                index.put_claim((meta.get("namespace"), meta.get("name")), rec)
            for key, dev in self.cache.view.devices().items():
                index.put_device(key, _attached_to(dev))
            self._due = _Due()
            return
        claims = set(index.retry_claims)
        vmis = set(index.retry_vmis) | set(changed.get("vmis", ()))
        for key in changed.get("claims", ()):
            obj = self.cache.claims.get(key)
            index.put_claim(key, claim_record(obj["parsed"]) if obj is not None else None)
            claims.add(key)
            vmis |= index.named.get(key, set())
        for key in changed.get("devices", ()):
            vmis |= index.put_device(key, _attached_to(self.cache.view.device(key)))
        for name in vmis:
            claims |= index.by_vmi.get(name, set())
        self._due = _Due() if sweep else _Due(claims, vmis)

    async def release(self, now: datetime,
                      released: dict[tuple[str, str], datetime] | None = None) -> None:
        """H1/H2 for the claims the binder made (`model.claim.stale_claims`): deleted once no
        VMI of their name exists, no device is attached to that name, and the grace since the
        claim was made or last confirmed has passed; each confirmed by a live read of the VMI
        first (never on the cache's word) and deleted with uid and resourceVersion
        preconditions (an admission that confirmed it since changed its version: moot), up
        to `concurrency` at once (each its own read and preconditions). H4:
        the claim of a kept set this replica released (`released`: (namespace, admission id)
        → when, `KeptSets.released_admissions`) is deleted without the grace, once the
        released devices are no longer attached in the cache."""
        released = released or {}
        index, due = self._index, self._due
        if index is not None and due.claims is None:  # a sweep: every claim, from memory
            records = sorted(index.records.values(), key=lambda r: (r.namespace, r.name))
            attached = set(index.devices_of)
            live = set(self.cache.vmi_state().live)
        elif index is None:
            records = claim_records(self.cache)
            if not records:
                return
            attached = {(d.namespace, d.status.attached_to.vmi)
                        for d in self.cache.view.devices().values() if d.status.attached_to}
            live = set(self.cache.vmi_state().live)
        else:
            keys = set(due.claims)
            for adm in released:
                keys |= index.by_admission.get(adm, set())
            while index.heap and index.heap[0][0] <= now:
                keys.add(heapq.heappop(index.heap)[1])
            records = [index.records[k] for k in sorted(keys) if k in index.records]
            if not records:
                index.retry_claims = set()
                return
            names = {(r.namespace, r.vmi) for r in records}
            attached = {n for n in names if n in index.devices_of}
            live = {n for n in names if n in self.cache.vmi_state().live}
        actions = stale_claims(records, attached, live, now, self.grace, released=released)
        if index is not None:
            index.retry_claims = {(a.claim.namespace, a.claim.name) for a in actions}
            for r in records:
                if r.since is not None and (r.namespace, r.name) not in index.retry_claims \
                        and r.since + self.grace >= now:
                    heapq.heappush(index.heap, (r.since + self.grace, (r.namespace, r.name)))
        await each_bounded(actions, self._delete, self.concurrency)

    async def _delete(self, action: DeleteClaim) -> None:
        c = action.claim
        what = f"DeleteClaim {c.namespace}/{c.name}"
        try:
            if await live_vmi(self._client, c.namespace, c.vmi) is not None:
                log.warning("housekeeping action not confirmed: the VMI exists (the cache is "
                            "behind)", rule=action.rule, namespace=c.namespace, claim=c.name,
                            vmi=c.vmi)
                return
            await self._client.delete(RESOURCE_CLAIMS, c.namespace, c.name, uid=c.uid,
                                      resource_version=c.resource_version, what=what)
            self.actions_done += 1
            self.claims_deleted += 1
            log.info("housekeeping", rule=action.rule, action="DeleteClaim",
                     namespace=c.namespace, claim=c.name, vmi=c.vmi,
                     reason=action.reason.render())
        except errors.ApiError as err:
            if isinstance(err, (errors.NotFound, errors.Conflict)):
                log.info("housekeeping action moot", rule=action.rule, action="DeleteClaim",
                         namespace=c.namespace, claim=c.name, reason=err.message[:200])
            else:
                log.warning("housekeeping action failed", rule=action.rule,
                            action="DeleteClaim", namespace=c.namespace, claim=c.name,
                            error=str(err)[:300])

    async def restore(self, now: datetime) -> None:
        """DR6 (every admitted device-mode VMI has exactly one claim naming its recorded
        devices): a live VMI the binder admitted whose claim someone deleted before its
        launcher Pod took it (`model.claim.missing_claims`: nothing of the name in the claim
        informer, the set recorded whole) gets the claim made again from the record, so the
        Pod, which waits for it, is allocated exactly the recorded devices and the VMI is not
        left half-admitted. Confirmed first by a live read of the VMI: the same incarnation,
        neither being deleted nor finished, its own wiring the record's
        (`model.claim.restorable_into`); then the claim is created, without reading it first:
        AlreadyExists means one of the name is there after all, and nothing is made. Told by
        a Warning log line and a Warning Event `GPUClaimRestored` on the VMI. Skipped while
        the claim informer does not follow the API server."""
        index, due = self._index, self._due
        if index is None or due.vmis is None:
            claims = claim_keys(self.cache)
            if claims is None:
                return
            device = device_classes(self.cache.view.classes().values())
            if not device:
                return
            devices = list(self.cache.view.devices().values())
            found = missing_claims(devices, self.cache.vmi_state().live, claims, device)
        else:
            if not index.device_classes:
                return
            names = sorted(index.devices_of if due.vmis is None else due.vmis)
            found = []
            for i in range(0, len(names), CHUNK):  # a sweep judges every VMI: by chunks
                if i:
                    await checkpoint()
                devices = [d for name in names[i:i + CHUNK] for k in index.devices_of.get(name, ())
                           if (d := self.cache.view.device(k)) is not None]
                found += missing_claims(devices, self.cache.vmi_state().live,
                                        _ClaimKeys(self.cache), index.device_classes)
        if index is not None:
            index.retry_vmis = {(r.namespace, r.vmi) for r in found}
        await each_bounded(found, lambda r: self._restore(r, now), self.concurrency)

    async def _restore(self, r: RestoreClaim, now: datetime) -> None:
        name = claim_name(r.vmi)
        what = f"RestoreClaim {r.namespace}/{name}"
        ctx = {"rule": Rule.DR6, "namespace": r.namespace, "claim": name, "vmi": r.vmi}
        try:
            members = members_of(self.cache.view.snapshot(),
                                 AdmissionPlan(r.namespace, r.vmi, r.devices, (), r.node), r.node)
            if not isinstance(members, tuple):
                log.warning("claim of an admitted VMI missing; not made again: the record "
                            "does not give its devices", reason=str(members), **ctx)
                return
            try:
                raw = await self._client.get(VMIS, r.namespace, r.vmi)
            except errors.NotFound as err:
                if err.names(r.vmi):
                    return  # gone: H2 and the claim's own H1/H2 take it from here
                raise
            why = restorable_into(raw, r, members)
            if why is not None:
                log.info("claim of an admitted VMI missing; not made again", why=why, **ctx)
                return
            body = build_claim(r.namespace, r.vmi, members, r.admission, now)
            # The create is the live read of the claim: AlreadyExists proves one of the name
            # is there (the informer is behind, or it was made meanwhile), whoever made it; a
            # claim is never adopted or replaced, so nothing else needs reading to decide.
            await self._client.create(RESOURCE_CLAIMS, r.namespace, body, what=what)
        except errors.ApiError as err:
            if isinstance(err, errors.AlreadyExists):
                log.info("claim of an admitted VMI missing; not made again",
                         why="a claim of the name is there (the cache was behind)", **ctx)
                return
            log.warning("housekeeping action failed", action="RestoreClaim",
                        error=str(err)[:300], **ctx)
            return
        self.actions_done += 1
        self.claims_restored += 1
        ev = ClaimRestoredEvent(r.namespace, name, r.node,
                                tuple((m.device, m.ref.device) for m in members))
        log.warning("claim of an admitted VMI was missing; made again from the record",
                    action="RestoreClaim", node=r.node, devices=ev.listed(),
                    admission=r.admission, **ctx)
        body = events.event_body(
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": r.vmi,
             "namespace": r.namespace, "uid": r.uid},
            reason=ev.reason, warning=ev.warning, instance="housekeeping", when=now,
            message=ev.render())
        await events.record(self._client, body, **ctx)
