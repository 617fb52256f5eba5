"""`RoundLoop`: the loop of the leader's level-based housekeepers (housekeeping, VM waiting).

A round reads the whole cache and does what it finds due, so rounds need no arguments and
kicks need no payload: a kick only says "something changed, run a round soon". The loop
runs a round at once, then one after each kick (a burst of kicks, and every kick that
arrives while a round runs, coalesced into one next round) and at least every `period`
seconds. One key in a coalescing `actors.workqueue.WorkQueue` carries the kicks, so the
semantics are the work queue's: a key already due is not added twice, an earlier due time
replaces a later one.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Iterable, Protocol

import anyio
from anyio.abc import TaskStatus

from actors.workqueue import WorkQueue

_ROUND = "round"


class Source(Protocol):
    """What the loop needs of a change feed (an `k8s.informer.Informer`)."""

    def add_listener(self, fn: Callable[[tuple[str, str], dict | None], None]) -> None: ...

    def remove_listener(self, fn: Callable[[tuple[str, str], dict | None], None]) -> None: ...


class RoundLoop:
    """Runs `round()` (an async callable; it bounds its own API calls) in a loop.

    `period` (seconds, > 0) is the longest wait between the end of a round and the next;
    `coalesce` (seconds, >= 0) the delay from the first kick of a burst to its round; every
    change of a `sources` feed kicks while `run` runs. `rounds` counts the rounds finished.
    Raises ValueError for a period that is not positive or a negative coalesce."""

    def __init__(self, round: Callable[[], Awaitable[None]], *, period: float,
                 coalesce: float = 0.0, sources: Iterable[Source] = ()) -> None:
        if not period > 0 or not coalesce >= 0:
            raise ValueError(f"RoundLoop needs period > 0 and coalesce >= 0 seconds, not "
                             f"{period!r} and {coalesce!r}")
        self._round = round
        self.period = period
        self.coalesce = coalesce
        self._sources = tuple(sources)
        self._queue: WorkQueue[str] | None = None
        self.rounds = 0

    def kick(self, after: float | None = None) -> None:
        """Ask for a round `after` seconds from now (None: `coalesce`), or sooner if one is
        asked for sooner; a kick during a round asks for the round after it. No-op while
        `run` is not running. Never raises, never blocks."""
        if self._queue is not None:
            self._queue.add_after(_ROUND, self.coalesce if after is None else after)

    def _changed(self, key: tuple[str, str], obj: dict | None) -> None:
        self.kick()

    async def run(self, *, task_status: TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Round now, then after each (coalesced) kick and at least every `period` seconds,
        until cancelled. Reports started once it listens to its sources (before the first
        round). A round's exception propagates (the loop ends, its listeners removed).
        Cancellation: stops between or within a round; the sources are left as found."""
        queue: WorkQueue[str] = WorkQueue()
        self._queue = queue
        for source in self._sources:
            source.add_listener(self._changed)
        try:
            task_status.started()
            while True:
                await self._round()
                self.rounds += 1
                try:
                    queue.done(await queue.get(timeout=self.period))
                except TimeoutError:
                    pass
        finally:  # leadership lost or shutdown: stop being told
            for source in self._sources:
                source.remove_listener(self._changed)
            queue.shutdown()
            self._queue = None
