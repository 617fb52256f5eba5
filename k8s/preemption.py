"""The leader's preemption worker (docs/contract.md §3c P4): stops the victims of every live
nomination and deletes the nominations that are done.

In rounds (`k8s.rounds.RoundLoop`: at once, after every change of nominations, VMIs or
devices, and at least every `period` seconds) it plans purely with `model.nomination.sweep`
on the cache, then:

- for each victim still running (`parallel` at once): a live read of its VMI confirms the incarnation the
  nomination names (its `gpu.cozystack.io/admission` annotation, and the uid the cache shows
  for the VMI carrying it: no device records a VMI's uid, issue 40), then an exact delete
  with that uid as precondition, so a VMI recreated under the same name is never hit; a Warning Event `GPUSetPreempted` on the VMI, and on its VirtualMachine when a
  VM owns it, names the preemptor and both priorities and says what follows by the VM's
  `runStrategy` (read live before the delete; `model.reasons.StoppedAs`): Always (and Once)
  create the VMI again, which then waits for room; Manual and RerunOnFailure leave the VM
  stopped until its owner starts it, as `virtctl stop` would (its stop request deletes the
  VMI the same way); the binder never writes a VM's spec. Right before the delete the
  nomination is asked again, on the cache then, whether it still holds
  (`model.nomination.done`): not if it expired, was deleted, or its preemptor was admitted
  meanwhile (on a node whose room came free first) or stopped;
- once per nomination and leader, a Normal Event `GPUSetPreempting` on the preemptor's VM
  (the VMI of a VM has the VM's name): waiting for N victims to stop;
- deletes the nominations that expired (their hold released) and those whose preemptor's set
  is admitted on its node.

Idempotent across leader kills: a deleted victim is gone (its second delete is NotFound, no
second Event), one still terminating (a finalizer, its guest shutting down) is not deleted
again (no second Event), a dropped nomination is gone too; the plan is read from the cache every round. Only a
victim of a live nomination is ever deleted (P6): the one use of the controller's `delete`
right on VMIs (docs/security.md).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

import anyio
import structlog

from actors.errors import WriteError
from actors.ports import NominationWriter
from k8s import errors, events
from k8s.cache import ClusterCache
from k8s.client import VMIS, VMS, KubeClient
from k8s.rounds import RoundLoop
from model.nomination import Nomination, Stop, Sweep, done, sweep
from model.reasons import Preempts, StoppedAs
from model.types import ADMISSION_ANNOTATION
from model.admission import vm_owner
from model.vm import run_strategy

log = structlog.get_logger("gpu_binder.preemption")

FIELD_MANAGER = "gpu-binder-preemption"


class Preemption:
    """The worker (see the module docstring). `client` is the leader's; `nominations` writes
    the nomination objects (`k8s.nominations.ApiNominations`); `parallel` victims are stopped
    at once (each stop is four or five API calls: a burst of nominations' victims one after
    another took 30-45 s a round in the priorities soak); `now` the UTC clock."""

    def __init__(self, client: KubeClient, cache: ClusterCache, nominations: NominationWriter, *,
                 period: float = 5.0, coalesce: float = 0.2, parallel: int = 8,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self._client = client.using(field_manager=FIELD_MANAGER)
        self.cache = cache
        self._nominations = nominations
        self._now = now
        self._parallel = parallel
        self._announced: set[tuple[str, datetime]] = set()  # (nomination, created) told to its VM
        self._loop = RoundLoop(self.round, period=period, coalesce=coalesce,
                               sources=(cache.nominations, cache.vmis, cache.devices))
        self.rounds = self.stopped = self.dropped = self.errors = 0

    async def run(self) -> None:
        """Rounds until cancelled (see the module docstring)."""
        await self._loop.run()

    def plan(self, now: datetime) -> Sweep:
        """`model.nomination.sweep` on the cache now."""
        live = self.cache.vmi_state().live
        snap = self.cache.view.snapshot()

        def vmi(ns: str, name: str) -> tuple[str, str | None] | None:
            rec = live.get((ns, name))
            return None if rec is None else (rec.uid, rec.admission)

        return sweep(self.cache.view.nominations().values(), now, vmi, snap.devices_in)

    async def round(self) -> None:
        """One round: stop the victims, announce, drop (API failures are logged and left to
        the next round)."""
        now = self._now()
        plan = self.plan(now)
        limit = anyio.CapacityLimiter(self._parallel)

        async def stop(s: Stop) -> None:
            async with limit:
                await self._stop(s, now)

        async with anyio.create_task_group() as tg:
            for s in plan.stops:
                tg.start_soon(stop, s)
        for n, running in plan.waiting:
            if running and (n.name, n.created) not in self._announced:
                self._announced.add((n.name, n.created))
                await self._announce(n, running, now)
        for drop in plan.drops:
            try:
                await self._nominations.delete(drop.nomination.name)
            except WriteError as exc:
                self.errors += 1
                log.warning("nomination_not_deleted", nomination=drop.nomination.name, error=str(exc))
                continue
            self.dropped += 1
            self._announced.discard((drop.nomination.name, drop.nomination.created))
            log.info("nomination_deleted", nomination=drop.nomination.name, why=drop.why)
        self.rounds += 1

    async def _stop(self, stop: Stop, now: datetime) -> None:
        """Confirm the victim's incarnation with a live read, delete it with its uid as the
        precondition, and record the Event (best effort)."""
        v, n = stop.victim, stop.nomination
        try:
            live = await self._client.get(VMIS, v.namespace, v.vmi)
        except errors.NotFound:
            return
        except errors.ApiError as exc:
            self.errors += 1
            log.warning("victim_not_read", victim=v.name, error=str(exc))
            return
        meta = live.get("metadata") or {}
        ann = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        uid = meta.get("uid")
        if uid != stop.uid or (v.admission is not None and ann.get(ADMISSION_ANNOTATION) != v.admission):
            return  # another incarnation since the cache saw it: never hit
        if meta.get("deletionTimestamp"):
            return  # being deleted already (by us before, or by anyone): stopped once, one Event
        vm_uid = vm_owner(live)  # a VM's VMI has the VM's name
        owner = (v.vmi, vm_uid) if vm_uid is not None else None
        strategy = await self._run_strategy(v.namespace, owner) if owner is not None else None
        why = self._done(n)
        if why is not None:
            # the round's plan is as of its start; the reads before (this victim's, and the
            # other stops' in the round) may have outlasted the nomination, or its preemptor
            # was admitted meanwhile on a node whose room came free first (P6: only a victim
            # of a nomination that still holds is ever deleted)
            log.info("victim_not_stopped", victim=v.name, nomination=n.name, why=why)
            return
        try:
            await self._client.delete(VMIS, v.namespace, v.vmi, uid=uid)
        except (errors.NotFound, errors.Conflict):
            return  # gone, or recreated meanwhile (the uid precondition)
        except errors.ApiError as exc:
            self.errors += 1
            log.warning("victim_not_deleted", victim=v.name, error=str(exc))
            return
        self.stopped += 1
        why = Preempts(v.name, v.priority, n.preemptor, n.priority, n.node).render()
        log.info("victim_stopped", victim=v.name, uid=uid, nomination=n.name, why=why)
        after = StoppedAs(strategy).render() if owner is None or strategy else \
            "its VirtualMachine's runStrategy could not be read"
        message = f"gpu-binder stopped VMI {v.name}: {why}; {after}"
        targets = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": v.vmi,
                    "namespace": v.namespace, "uid": uid}]
        if owner is not None:
            targets.append({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": owner[0],
                            "namespace": v.namespace, "uid": owner[1]})
        for target in targets:
            body = events.event_body(target, reason="GPUSetPreempted", message=message,
                                      warning=True, instance="preemption", when=now)
            await events.record(self._client, body, victim=v.name)

    def _done(self, n: Nomination) -> str | None:
        """Why `n` no longer holds on the cache now (`model.nomination.done`; "deleted": the
        cache shows no nomination of its name made when it was), None while it does."""
        nominations = self.cache.view.nominations()
        current = nominations.get(n.name)
        if current is None or current.created != n.created:
            return "deleted"
        return done(current, nominations.values(), self._now(), self.cache.view.snapshot().devices_in)

    async def _run_strategy(self, namespace: str, owner: tuple[str, str]) -> str | None:
        """The run strategy of VM `owner` (name, uid) as read live now (`model.vm.run_strategy`);
        None when it cannot be read or is another VM of the name (best effort: only the
        Event's words depend on it)."""
        try:
            vm = await self._client.get(VMS, namespace, owner[0])
        except errors.ApiError as exc:
            log.info("victim_vm_not_read", vm=f"{namespace}/{owner[0]}", error=str(exc)[:300])
            return None
        if (vm.get("metadata") or {}).get("uid") not in (None, owner[1]):
            return None
        return run_strategy(vm)

    async def _announce(self, n: Nomination, running: int, now: datetime) -> None:
        """The preemptor's VM is told it waits for `running` victims to stop (best effort)."""
        names = ", ".join(v.name for v in n.victims)
        body = events.event_body(
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": n.vmi,
             "namespace": n.namespace},
            reason="GPUSetPreempting",
            message=(f"waiting for {running} lower-priority VM{'s' if running != 1 else ''} to stop "
                     f"on {n.node} to make room for this set (priority {n.priority}): {names}"),
            warning=False, instance="preemption", when=now)
        await events.record(self._client, body, preemptor=n.preemptor)


__all__ = ["FIELD_MANAGER", "Preemption"]
