"""The leader's preemption worker played on a `MemoryStore` (docs/contract.md §3c P4), for the
in-memory tests: what `k8s.preemption.Preemption` does on the API, on the store's VMIs.

Each round plans with the production's pure `model.nomination.sweep` on the store, then
deletes each victim's VMI with its uid as precondition (`MemoryStore.delete_vmi`, recorded as
op `vmi-deleted`), plays what housekeeping does after a VMI is gone (H2: its request's
attachments and bindRequests cleared, its template devices deleted; its held devices stay
Bound, idle) and deletes the nominations that are done. A round runs at once after `poke`
and at least every `period` seconds (loop time). `abandon` ends the round in progress after
its current step, as a leader killed mid-round would (the next round, a new leader's, plans
again from the store). Not a test module.
"""

from __future__ import annotations

from typing import Callable

import anyio

from actors.ports import Clock
from fakes.memory_store import MemoryStore
from model.nomination import Sweep, sweep


class MemoryPreemption:
    """The worker (see the module docstring). `on_stop(namespace, vmi, uid)` is called after
    each victim's VMI is deleted and released (before the next step of the round)."""

    def __init__(self, store: MemoryStore, clock: Clock, *, period: float = 0.01,
                 on_stop: Callable[[str, str, str], None] | None = None) -> None:
        self.store, self.clock, self.period = store, clock, period
        self.on_stop = on_stop
        self._wake = anyio.Event()
        self._abandon = False
        self.rounds = self.stopped = self.dropped = 0

    def poke(self) -> None:
        """Run a round soon (the store changed)."""
        self._wake.set()

    def abandon(self) -> None:
        """End the round in progress after its current step (a leader killed)."""
        self._abandon = True

    async def run(self) -> None:
        """Rounds until cancelled."""
        while True:
            with anyio.move_on_after(self.period):
                await self._wake.wait()
            self._wake = anyio.Event()
            self._abandon = False
            await self.round()

    def plan(self) -> Sweep:
        """`model.nomination.sweep` on the store now."""
        snap = self.store.snapshot()
        return sweep(self.store.nominations().values(), self.clock.now(), self.store.vmi, snap.devices_in)

    async def round(self) -> None:
        """One round (see the module docstring)."""
        plan = self.plan()
        self.rounds += 1
        for stop in plan.stops:
            v = stop.victim
            if not self.store.delete_vmi(v.namespace, v.vmi, stop.uid, by=f"preemption:{stop.nomination.name}"):
                continue
            self.stopped += 1
            self.release(v.namespace, v.vmi, v.admission)
            if self.on_stop is not None:
                self.on_stop(v.namespace, v.vmi, stop.uid)
            if self._abandon:
                return
            await anyio.sleep(0)
        for drop in plan.drops:
            await self.store.delete(drop.nomination.name)
            self.dropped += 1
            if self._abandon:
                return

    def release(self, namespace: str, vmi: str, admission: str | None) -> None:
        """H2 after VMI `namespace/vmi` (admitted as `admission`) is gone: the requests its
        devices carry for it withdrawn (attachment and bindRequest cleared), its template
        devices deleted."""
        requests = set()
        templates = []
        for d in self.store.snapshot().devices_in(namespace).values():
            att, br = d.status.attached_to, d.status.bind_request
            if att is not None and att.vmi == vmi and (admission is None or att.admission == admission):
                if br is not None:
                    requests.add(br.id)
            if d.template_for == vmi:
                templates.append(d.key)
        for rid in sorted(requests):
            self.store.withdraw(namespace, rid)
        for key in sorted(templates):
            self.store.delete_device(key)


__all__ = ["MemoryPreemption"]
