"""An admission's waits on the informer cache, never polls: for the binder's results (W3
step 4, `ResultWaiter`), and for the cache to show what the webhook wrote or what the binder
recorded (`until`: a device-mode set's records, DR5).
Each is woken by the cache's change notifications and bounded by the review's deadline."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable, TypeVar

import anyio

from actors.ports import Change, ChangeFeed
from actors.workqueue import WorkQueue
from model.types import GPUDevice

if TYPE_CHECKING:
    from k8s.cache import ClusterCache

T = TypeVar("T")

TEMPLATE_WAIT = 5.0
"""The default of the deprecated `--webhook-template-wait` (no effect: W3 (1) no longer waits
for the informer to show a template device it created; W3 (2) writes the created object)."""
RECORD_WAIT = 0.0
"""Seconds an admission waits at most, after the binder's Succeeded, for the informer to show
its device-mode set's device records (DR5); 0: until the review's deadline, as before.
`--webhook-record-wait` sets it."""


async def until(feed: ChangeFeed, ready: Callable[[], T | None], timeout: float, *,
                relevant: Callable[[Change], bool] | None = None) -> T | None:
    """What `ready()` returns once it is not None: judged now, then again after each change
    of `feed` that `relevant` names (default: any change), never on a timer. None when it is
    still None after `timeout` seconds of loop time (<= 0: judged once, no wait).

    The subscription starts before the first judgement, so a change made between a
    judgement and the wait is not lost (it is waiting in the queue). `ready` must be cheap
    and must not await. Cancellation: propagates; the subscription ends with the wait
    (nothing stays registered), as it does on every return."""
    async with feed.subscribe() as changes:
        with anyio.move_on_after(max(0.0, timeout)):
            while True:
                got = ready()
                if got is not None:
                    return got
                await _changed(changes, relevant)
        return ready()  # the change that woke the deadline's last moment, if any


async def _changed(changes: WorkQueue[Change], relevant: Callable[[Change], bool] | None) -> None:
    """Return once a change `relevant` names (any, when None) has come: every change
    waiting is taken (and handed back) on the way, a burst being one wake-up."""
    while True:
        change = await changes.get()
        changes.done(change)
        hit = relevant is None or relevant(change)
        while True:
            try:
                change = changes.get_nowait()
            except anyio.WouldBlock:
                break
            changes.done(change)
            hit = hit or relevant is None or relevant(change)
        if hit:
            return

_Wait = tuple[str, str, int]
"""(namespace, request id, serial): one admission's wait (the serial keeps two waits for
one request apart)."""


class ResultWaiter:
    """Wakes admissions waiting for a request's results, from the device informer's events
    (W3 step 4: waiting on the informer, not polling the API).

    Each wait is a key of one coalescing work queue (`actors.workqueue.WorkQueue`); a change
    of one of the devices a wait names adds that wait's key, and the admission takes its own
    key (`get_key`) and re-judges the devices from the cache: a burst of events is one wake-up,
    and a change of a device no wait names wakes nobody."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._queue: WorkQueue[_Wait] = WorkQueue()
        self._by_device: dict[tuple[str, str], set[_Wait]] = {}
        self._serial = itertools.count()
        cache.devices.add_listener(self._on_device)

    def _on_device(self, key: tuple[str, str], obj: dict | None) -> None:
        # a result, a cleared request, a deletion: the waits naming this device re-judge
        for wait in self._by_device.get(key, ()):
            self._queue.add(wait)

    async def wait(self, namespace: str, request_id: str, names: tuple[str, ...],
                   timeout: float) -> list[GPUDevice] | None:
        """The devices once every one carries `request_id` with a result; None on timeout
        (`timeout` seconds), or when a device that was seen carrying the request vanished or
        lost it. Cancellation: the wait is withdrawn (nothing stays registered)."""
        wait: _Wait = (namespace, request_id, next(self._serial))
        keys = [(namespace, n) for n in dict.fromkeys(names)]
        for k in keys:
            self._by_device.setdefault(k, set()).add(wait)
        seen: set[str] = set()  # devices the cache has shown carrying the request
        try:
            with anyio.move_on_after(timeout):
                while True:
                    devs = [self.cache.view.device((namespace, n)) for n in names]
                    carrying = {d.name for d in devs if d is not None
                                and d.status.bind_request is not None
                                and d.status.bind_request.id == request_id}
                    if seen - carrying:  # deleted, or the request was cleared or replaced
                        return None
                    seen |= carrying
                    if len(carrying) == len(names) and all(
                            d.status.bind_request.result is not None for d in devs):
                        return devs
                    # the cache may still be behind our own writes: wait for the informer
                    await self._queue.get_key(wait)
                    self._queue.done(wait)  # changed again from now on: woken again
            return None
        finally:
            for k in keys:
                waits = self._by_device.get(k)
                if waits is not None:
                    waits.discard(wait)
                    if not waits:
                        del self._by_device[k]
            self._queue.discard(wait)
