"""W3 step 4: an admission waits for the binder's results on the device informer, never
polling the API server."""

from __future__ import annotations

import anyio

from k8s.cache import ClusterCache
from model.types import GPUDevice


class ResultWaiter:
    """Wakes admissions waiting for a request's results, from the device informer's events
    (W3 step 4: waiting on the informer, not polling the API)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._events: dict[tuple[str, str], anyio.Event] = {}
        cache.devices.add_listener(self._on_device)

    def _on_device(self, key: tuple[str, str], obj: dict | None) -> None:
        # any change in the namespace (a result, a cleared request, a deletion) wakes its
        # waiters, who re-judge from the cache; waiters are few (one per admission)
        for (ns, _), ev in list(self._events.items()):
            if ns == key[0]:
                ev.set()

    async def wait(self, namespace: str, request_id: str, names: tuple[str, ...],
                   timeout: float) -> list[GPUDevice] | None:
        """The devices once every one carries `request_id` with a result; None on timeout,
        or when a device that was seen carrying the request vanished or lost it."""
        key = (namespace, request_id)
        seen: set[str] = set()  # devices the cache has shown carrying the request
        with anyio.move_on_after(timeout):
            while True:
                self._events[key] = anyio.Event()
                try:
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
                    await self._events[key].wait()
                finally:
                    self._events.pop(key, None)
        return None
