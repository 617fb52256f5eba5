"""H4 on the API server: the sets kept for a VirtualMachine, told to the operator.

The device worker keeps and releases sets (`k8s.housekeeping.devices`); this worker reads the
VirtualMachines (`vm_records`, the leader's VM informer shared with `k8s.vm_waiting`), sends
one Event per VM and round (`GPUSetKept`, Normal: until when; `GPUSetReleased`), writes the
VM condition `GPUSetKept` (`model.housekeeping.KEPT_CONDITION`) while a set is kept for a VM
without a VMI, and remembers the keeps it released so their claims go without the grace
(`released_admissions`, read by the claims worker).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable, Mapping

from k8s import errors, events
from k8s.cache import ClusterCache
from k8s.client import VMS, KubeClient
from k8s.housekeeping.common import log
from k8s.informer import Informer
from model.housekeeping import KEPT_CONDITION, KEPT_REASON, KeptFor, VMRecord
from model.housekeeping_reasons import (HousekeepingEvent, HousekeepingReason, Rule, SetKeptEvent,
                                        SetReleasedEvent)
from model.serialize import format_time
from model.vm import run_strategy

RELEASE_CAUSES = ("vm_deleted", "expired")
"""Why a kept set was released (`KeptSets.released_by`): its VM deleted (being deleted, or
re-created with another uid), or its `keepSetFor` ran out."""


@dataclass
class _Told:
    """The devices of one VM kept or released this round, for its one Event."""

    devices: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    until: datetime | None = None
    reason: HousekeepingReason | None = None
    cause: str = ""


class KeptSets:
    """H4's bookkeeping and its words. `vms` is the VM informer (None: no set is ever kept);
    `grace` bounds how long a released keep is remembered for its claim. Counters:
    `kept_sets`, `released_sets` (Events told), `released_by` (by cause, `RELEASE_CAUSES`),
    `kept_now` (sets kept as of the last round; None before one), `condition_writes`."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, grace: timedelta,
                 vms: Informer | None = None) -> None:
        self._client = client
        self.cache = cache
        self.grace = grace
        self.vms = vms
        self.kept_sets = 0
        self.released_sets = 0
        self.kept_now: int | None = None
        self.released_by = {cause: 0 for cause in RELEASE_CAUSES}
        self.condition_writes = 0
        self._told: dict[tuple[str, str, str, str], _Told] = {}
        self._released: dict[tuple[str, str], datetime] = {}
        self._vms: dict[tuple[str, str], VMRecord] | None = None
        self._conditions_kept: dict[tuple[str, str], KeptFor] | None = None
        self._conditions_tried: set[tuple[str, str]] = set()

    def vm_records(self, changed: Iterable[tuple[str, str]] | None = None
                   ) -> Mapping[tuple[str, str], VMRecord] | None:
        """The VirtualMachines as the VM informer has them; None while it does not follow
        the API server (or there is none): no set is then newly kept nor released for its VM
        being gone. `changed`: the keys of the VMs changed since the last call (only those
        are read again); None: every VM is read."""
        if self.vms is None or not self.vms.healthy:
            self._vms = None
            return None
        if changed is None or self._vms is None:
            self._vms = {}
            changed = [k for k in self.vms.keys()]
        for key in changed:
            vm = self.vms.get(key)
            meta = (vm or {}).get("metadata") or {}
            ns, name = meta.get("namespace"), meta.get("name")
            if vm is None or not isinstance(ns, str) or not isinstance(name, str):
                self._vms.pop(key, None)
                continue
            self._vms[(ns, name)] = VMRecord(ns, name, str(meta.get("uid") or ""),
                                             run_strategy(vm), bool(meta.get("deletionTimestamp")))
        return self._vms

    def note_kept(self, ns: str, vm: str, owner: str, device: str, node: str | None,
                  until: datetime) -> None:
        """Device `device` (on `node`) of VM `ns/vm` (uid `owner`) was kept until `until`."""
        self._note("kept", ns, vm, owner, device, node, until=until)

    def note_released(self, ns: str, vm: str, owner: str | None, device: str,
                      admission: str | None, reason: HousekeepingReason, now: datetime,
                      expired: bool) -> None:
        """Device `device` of a set kept for VM `ns/vm` was released at `now` for `reason`
        (`expired`: its time ran out, else its VM is gone); the claim of that admission goes
        with it (`released_admissions`)."""
        if admission:
            self._released[(ns, admission)] = now
        self._note("released", ns, vm, owner, device, None, reason=reason,
                   cause="expired" if expired else "vm_deleted")

    def _note(self, kind: str, ns: str, vm: str, uid: str | None, device: str,
              node: str | None, *, until: datetime | None = None,
              reason: HousekeepingReason | None = None, cause: str = "") -> None:
        told = self._told.setdefault((kind, ns, vm, uid or ""), _Told())
        told.devices.append(device)
        if node and node not in told.nodes:
            told.nodes.append(node)
        told.until, told.reason, told.cause = until, reason, cause

    def released_admissions(self, now: datetime) -> dict[tuple[str, str], datetime]:
        """(namespace, admission id) of the kept sets this replica released within `grace`
        of `now` -> when (older ones forgotten: the claims' H1/H2 covers them then, as after
        a change of leader)."""
        self._released = {k: t for k, t in self._released.items() if now - t <= self.grace}
        return dict(self._released)

    async def tell(self, now: datetime) -> None:
        """One Event per VM whose set was kept (`GPUSetKept`, Normal: until when) or released
        (`GPUSetReleased`) since the last call; best effort."""
        pending, self._told = self._told, {}
        for (kind, ns, vm, uid), t in sorted(pending.items()):
            ev: HousekeepingEvent
            if kind == "kept":
                assert t.until is not None  # `note_kept` always gives one
                self.kept_sets += 1
                ev = SetKeptEvent(ns, vm, tuple(t.devices), tuple(t.nodes), t.until)
            else:
                self.released_sets += 1
                self.released_by[t.cause] = self.released_by.get(t.cause, 0) + 1
                ev = SetReleasedEvent(ns, vm, tuple(t.devices), t.reason)
            log.info("H4 " + kind, rule=Rule.H4, namespace=ns, vm=vm, devices=", ".join(t.devices),
                     until=format_time(t.until) if t.until else None)
            body = events.event_body(
                {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": vm,
                 "namespace": ns, **({"uid": uid} if uid else {})},
                reason=ev.reason, message=ev.render(), warning=ev.warning,
                instance="housekeeping", when=now)
            await events.record(self._client, body, rule=Rule.H4, namespace=ns, name=vm)

    def forget_conditions(self) -> None:
        """The next `write_conditions` looks at every VM (what changed meanwhile is not
        known)."""
        self._conditions_kept = None

    async def write_conditions(self, kept: dict[tuple[str, str], KeptFor], now: datetime,
                               changed: Iterable[tuple[str, str]] | None = None) -> None:
        """The `GPUSetKept` condition on each VM: True while a set is kept for it (`kept`:
        `model.housekeeping.kept_for_vms` of this round's devices, for this VM's uid) and it
        has no VMI, removed otherwise. A VM with a VMI is left alone (virt-controller keeps
        only the VMI's conditions on it). Written with a JSON Patch that `test`s the VM's
        resourceVersion as cached, only when it differs from the cached VM; best effort
        (retried next round). `changed`: the (namespace, name)s of the VMs and VMIs changed
        since the last call; only those, the VMs whose keep changed and those written last
        time are looked at (None: every VM)."""
        live = self.cache.vmi_state().live
        if changed is None or self._conditions_kept is None:
            vms = self.vms.items() if self.vms is not None else ()
        else:
            keys = set(changed) | self._conditions_tried
            keys |= {k for k in kept.keys() | self._conditions_kept.keys()
                     if kept.get(k) != self._conditions_kept.get(k)}
            vms = [vm for k in sorted(keys) if self.vms is not None
                   and (vm := self.vms.get(k)) is not None]
        self._conditions_kept = dict(kept)
        self._conditions_tried = set()
        for vm in vms:
            meta = vm.get("metadata") or {}
            key = (meta.get("namespace"), meta.get("name"))
            if key in live or not isinstance(key[0], str) or not isinstance(key[1], str):
                continue
            status = vm.get("status") if isinstance(vm.get("status"), dict) else {}
            conds = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
            have = next((c for c in conds if c.get("type") == KEPT_CONDITION), None)
            k = kept.get(key)
            if k is not None and (k.owner != meta.get("uid") or meta.get("deletionTimestamp")):
                k = None
            if k is None and have is None:
                continue
            want = None if k is None else {
                "type": KEPT_CONDITION, "status": "True", "reason": KEPT_REASON,
                "message": k.condition().render()[:1024],
                "lastTransitionTime": (have or {}).get("lastTransitionTime")
                if (have or {}).get("status") == "True" else format_time(now),
                "lastProbeTime": None}
            if want is not None and have is not None and all(
                    have.get(f) == want[f] for f in ("status", "reason", "message")):
                continue
            new = [c for c in conds if c.get("type") != KEPT_CONDITION] + ([want] if want else [])
            self._conditions_tried.add(key)
            await self._patch_conditions(key[0], key[1], meta.get("resourceVersion"),
                                         new, bool(status), want is not None)

    async def _patch_conditions(self, ns: str, name: str, rv: str | None, new: list[dict],
                                has_status: bool, kept: bool) -> None:
        ops: list[dict] = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                           {"op": "add", "path": "/status/conditions", "value": new}
                           if has_status else
                           {"op": "add", "path": "/status", "value": {"conditions": new}}]
        try:
            await self._client.patch_status(
                VMS, ns, name, ops, what=f"write the {KEPT_CONDITION} condition of VM {ns}/{name}")
        except errors.ApiError as err:  # a newer VM (Conflict/Invalid: the test) or gone
            if not isinstance(err, (errors.Invalid, errors.Conflict, errors.NotFound)):
                log.warning("VM condition not written", rule=Rule.H4, vm=f"{ns}/{name}",
                            condition=KEPT_CONDITION, error=str(err)[:300])
            return
        self.condition_writes += 1
        log.info("VM condition written", rule=Rule.H4, vm=f"{ns}/{name}",
                 condition=KEPT_CONDITION, status="True" if kept else None)
