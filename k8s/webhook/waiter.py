"""W3 step 4: an admission waits for the binder's results on the device informer, never
polling the API server."""

from __future__ import annotations

import itertools

import anyio

from actors.workqueue import WorkQueue
from k8s.cache import ClusterCache
from model.types import GPUDevice

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
