"""A coalescing per-key work queue (the ideas of client-go's `util/workqueue`, our own code).

A key names work ("request r of namespace n changed", "device d has actions"), never the
work itself: level based, the consumer re-reads the state it names. `WorkQueue` keeps
three promises:

- a key already waiting is not added twice (the dirty set);
- a key being processed (handed out by `get`, not yet `done`) is never handed out again
  until `done(key)`; added meanwhile, it is queued again by `done`;
- a key deferred (`add_after`) waits until due on the queue's clock, then is added as by
  `add`; a key added meanwhile is due now (the deferral is dropped).

Keys come out in the order they became due (first added, first out) — or, with `fair_by`
(a key's group, e.g. a request key's namespace: its tenant), round-robin over the groups
with keys waiting, the group served least recently first and FIFO within a group, so one
group's thousand keys do not make another's one key wait behind them. One event loop, not
thread-safe. No Kubernetes here; time comes from the clock given (default: the event
loop's, `anyio.current_time`), so tests drive it with a manual clock and `get_nowait`.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Iterable, Protocol, TypeVar

import anyio
from anyio.lowlevel import checkpoint

K = TypeVar("K", bound=Hashable)


class _Monotonic(Protocol):
    """What the queue needs of an `actors.ports.Clock` (not imported: ports names this module)."""

    def monotonic(self) -> float: ...


class QueueShutDown(Exception):
    """The queue is shut down and nothing is waiting in it: no key will come out again."""


@dataclass(frozen=True, slots=True)
class WorkQueueStatistics:
    """What a queue holds now: `waiting` keys ready to be handed out, `processing` keys
    handed out and not yet done (of which `dirty` were added again meanwhile), `deferred`
    keys not due yet; `adds` counts every `add` that queued or marked a key since the queue
    was made (coalesced ones not)."""

    waiting: int
    processing: int
    dirty: int
    deferred: int
    adds: int
    shut_down: bool


@dataclass(slots=True)
class _State(Generic[K]):
    waiting: OrderedDict[K, None]  # ready, in order (O(1) pop of the first and removal of any)
    processing: set[K]
    dirty: set[K]                 # must be processed (again): waiting, or added while processing
    deferred: dict[K, float]      # key -> due time (the heap may hold stale entries)
    heap: list[tuple[float, int, K]]
    served: dict[Hashable, int]   # fair_by: group -> serial of the last key handed out
    seq: int = 0
    turn: int = 0
    adds: int = 0
    shut_down: bool = False
    wakeup: anyio.Event | None = None        # any `get` waiting
    key_waiters: dict[K, anyio.Event] | None = None  # `get_key` waiting, by key
    idle: anyio.Event | None = None          # `drain` waiting


class WorkQueue(Generic[K]):
    """A coalescing per-key work queue with deferrals.

    `clock` is an `actors.ports.Clock` (its `monotonic()`, seconds) or a function giving
    seconds; default the event loop's time. Waiting calls (`get`, `get_key`, `drain`) wait on
    the loop's timers for the time the clock says is left until the next deferral is due,
    so with a clock other than the loop's (a manual clock in a test) a deferral that became
    due by moving the clock is seen by the next call of any method, not by a waiting `get`.

    `fair_by(key)` (None: FIFO) names the key's group; `get`/`get_nowait` then hand out the
    first waiting key of the group served least recently (a group never served, or idle
    since, first; ties in queue order). Taking a key costs O(keys waiting) then.
    """

    def __init__(self, clock: _Monotonic | Callable[[], float] | None = None, *,
                 fair_by: Callable[[K], Hashable] | None = None) -> None:
        if clock is None:
            self._now: Callable[[], float] = anyio.current_time
        elif callable(clock):
            self._now = clock
        else:
            self._now = clock.monotonic
        self._fair_by = fair_by
        self._s: _State[K] = _State(OrderedDict(), set(), set(), {}, [], {})

    # -- adding -------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue `key` (due now). No-op when it is already waiting, or when the queue is shut
        down; when it is being processed it is only marked, and `done(key)` queues it. Drops a
        deferral of `key`. Never raises, never blocks."""
        s = self._s
        if s.heap:
            self._promote()
        if s.shut_down or key in s.dirty:  # a dirty key is never deferred too
            return
        if s.deferred:
            s.deferred.pop(key, None)
        s.dirty.add(key)
        s.adds += 1
        if key in s.processing:
            return
        s.waiting[key] = None
        if s.wakeup is not None or s.key_waiters:
            self._wake(key)

    def add_after(self, key: K, seconds: float) -> None:
        """Queue `key` once `seconds` have passed on the queue's clock (at once when
        `seconds` <= 0). No-op when it is already waiting or marked (it comes sooner), when
        it is already deferred to come no later, or when the queue is shut down; an earlier
        due time replaces a later one. Never raises, never blocks."""
        s = self._s
        self._promote()
        if s.shut_down:
            return
        if seconds <= 0:
            s.deferred.pop(key, None)
            self._add(key)
            return
        if key in s.dirty:
            return
        due = self._now() + seconds
        have = s.deferred.get(key)
        if have is not None and have <= due:
            return
        s.deferred[key] = due
        s.seq += 1
        heapq.heappush(s.heap, (due, s.seq, key))
        self._wake_all()  # a waiting `get` may now have to wake earlier

    def discard(self, key: K) -> None:
        """Take back every add of `key` not handed out yet: it leaves the waiting keys, the
        deferred ones and the dirty set (a key being processed stays so until `done`, which
        then does not queue it again). Never raises."""
        s = self._s
        if s.heap:
            self._promote()
        s.waiting.pop(key, None)
        s.dirty.discard(key)
        s.deferred.pop(key, None)

    # -- taking -------------------------------------------------------------------------------

    def get_nowait(self) -> K:
        """The first key due, now marked processing (hand it back with `done`). Raises
        `anyio.WouldBlock` when none is due, `QueueShutDown` when the queue is shut down and
        none is waiting."""
        s = self._s
        if s.heap:
            self._promote()
        if s.waiting:
            if self._fair_by is None:
                return self._take(s.waiting.popitem(last=False)[0])
            key = self._fair_next()
            del s.waiting[key]
            return self._take(key)
        if s.shut_down:
            raise QueueShutDown
        raise anyio.WouldBlock

    def _fair_next(self) -> K:
        """The first waiting key of the group served least recently (`fair_by`); that group
        is served now. Groups with nothing waiting are forgotten once there are many."""
        s, group_of = self._s, self._fair_by
        assert group_of is not None
        best: K | None = None
        best_turn = 0
        seen: set[Hashable] = set()
        for key in s.waiting:
            group = group_of(key)
            if group in seen:
                continue
            seen.add(group)
            turn = s.served.get(group, -1)
            if best is None or turn < best_turn:
                best, best_turn = key, turn
                if turn < 0:
                    break  # never served (or idle since): nobody comes before it
        assert best is not None
        s.turn += 1
        s.served[group_of(best)] = s.turn
        if len(s.served) > 2 * len(seen) + 64:  # forget idle groups: the map stays bounded
            waiting = {group_of(k) for k in s.waiting} | {group_of(k) for k in s.processing}
            s.served = {g: t for g, t in s.served.items() if g in waiting}
        return best

    def _take(self, key: K) -> K:
        """`key`, just removed from `waiting`, handed out: processing until `done`."""
        self._s.dirty.discard(key)
        self._s.processing.add(key)
        return key

    async def get(self, timeout: float | None = None) -> K:
        """`get_nowait`, waiting for a key to become due: at most `timeout` seconds (None:
        until a key comes or the queue shuts down). Raises `TimeoutError` when the time is
        up, `QueueShutDown` as `get_nowait`. Cancellation: either you get a key (and it is
        yours to `done`) or you get the cancellation and the queue is unchanged."""
        await checkpoint()
        with anyio.fail_after(math.inf if timeout is None else timeout):
            while True:
                try:
                    return self.get_nowait()
                except anyio.WouldBlock:
                    pass
                s = self._s
                if s.wakeup is None:
                    s.wakeup = anyio.Event()
                await self._wait(s.wakeup)

    def get_key_nowait(self, key: K) -> K:
        """`key` itself when it is waiting (it is then processing, as after `get_nowait`).
        Raises `anyio.WouldBlock` when it is not waiting, `QueueShutDown` when the queue is
        shut down and it is not waiting."""
        s = self._s
        if s.heap:
            self._promote()
        if key in s.waiting:
            del s.waiting[key]
            return self._take(key)
        if s.shut_down:
            raise QueueShutDown
        raise anyio.WouldBlock

    async def get_key(self, key: K, timeout: float | None = None) -> K:
        """`get_key_nowait`, waiting for `key` to become due: for a consumer that owns one
        key (an admission waiting for its own request). At most `timeout` seconds (None:
        until it comes or the queue shuts down); raises `TimeoutError`, `QueueShutDown`.
        Cancellation: either you get the key or the cancellation and the queue is
        unchanged. Two consumers must not wait for the same key at once (`RuntimeError`)."""
        await checkpoint()
        s = self._s
        if s.key_waiters is None:
            s.key_waiters = {}
        if key in s.key_waiters:
            raise RuntimeError(f"workqueue: a consumer already waits for {key!r}")
        try:
            with anyio.fail_after(math.inf if timeout is None else timeout):
                while True:
                    try:
                        return self.get_key_nowait(key)
                    except anyio.WouldBlock:
                        pass
                    event = s.key_waiters[key] = anyio.Event()
                    await self._wait(event)
        finally:
            s.key_waiters.pop(key, None)

    def done(self, key: K) -> None:
        """`key`'s processing is over: when it was added meanwhile it is queued again.
        Raises `ValueError` when `key` is not being processed (a bug of the caller)."""
        s = self._s
        if s.heap:
            self._promote()
        try:
            s.processing.remove(key)
        except KeyError:
            raise ValueError(f"workqueue: done({key!r}) of a key not being processed") from None
        if key in s.dirty:
            s.waiting[key] = None
            self._wake(key)
        elif not s.processing and not s.waiting and s.idle is not None:
            s.idle.set()

    # -- ending -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """No key is accepted from now on and the deferred ones are dropped; the keys waiting
        are still handed out, then every `get` raises `QueueShutDown` (waiting ones wake).
        Keys being processed may still be `done`, and one added before the shutdown while
        it was processing is queued then. Idempotent; never raises."""
        s = self._s
        s.shut_down = True
        s.deferred.clear()
        s.heap.clear()
        self._wake_all()

    async def drain(self, timeout: float) -> None:
        """Shut down (`shutdown`), then wait until no key is waiting or being processed (the
        consumers have taken and `done` every one), at most `timeout` seconds. Raises
        `TimeoutError` when the time is up. Cancellation: the queue stays shut down."""
        self.shutdown()
        s = self._s
        with anyio.fail_after(timeout):
            while s.waiting or s.processing:
                s.idle = anyio.Event()
                await s.idle.wait()

    # -- looking ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys waiting (due, not handed out)."""
        if self._s.heap:
            self._promote()
        return len(self._s.waiting)

    def __contains__(self, key: object) -> bool:
        """Whether `key` is waiting, deferred, or marked to be processed again."""
        s = self._s
        return key in s.dirty or key in s.deferred

    def processing(self) -> frozenset[K]:
        """The keys handed out and not yet done."""
        return frozenset(self._s.processing)

    def waiting(self) -> tuple[K, ...]:
        """The keys waiting, in the order they come out."""
        if self._s.heap:
            self._promote()
        return tuple(self._s.waiting)

    def next_due(self) -> float | None:
        """The clock time the next deferral is due at; None when nothing is deferred."""
        self._promote()
        return self._s.heap[0][0] if self._s.heap else None

    def statistics(self) -> WorkQueueStatistics:
        """A frozen count of what the queue holds (see `WorkQueueStatistics`)."""
        if self._s.heap:
            self._promote()
        s = self._s
        return WorkQueueStatistics(
            waiting=len(s.waiting), processing=len(s.processing),
            dirty=len(s.dirty & s.processing), deferred=len(s.deferred),
            adds=s.adds, shut_down=s.shut_down)

    def add_all(self, keys: Iterable[K]) -> None:
        """`add` each of `keys`, in order."""
        for key in keys:
            self.add(key)

    # -- internals ----------------------------------------------------------------------------

    def _add(self, key: K) -> None:
        s = self._s
        if key in s.dirty:
            return
        s.dirty.add(key)
        s.adds += 1
        if key in s.processing:
            return
        s.waiting[key] = None
        self._wake(key)

    def _wake(self, key: K) -> None:
        s = self._s
        if s.wakeup is not None:
            s.wakeup.set()
            s.wakeup = None
        if s.key_waiters:
            event = s.key_waiters.get(key)
            if event is not None:
                event.set()

    def _wake_all(self) -> None:
        s = self._s
        if s.wakeup is not None:
            s.wakeup.set()
            s.wakeup = None
        for event in (s.key_waiters or {}).values():
            event.set()
        if s.idle is not None:
            s.idle.set()

    def _drop_stale(self) -> None:
        s = self._s
        while s.heap and s.deferred.get(s.heap[0][2]) != s.heap[0][0]:
            heapq.heappop(s.heap)

    def _promote(self) -> None:
        """Add every deferral due by the clock's now, in due order."""
        s = self._s
        self._drop_stale()
        if not s.heap or s.heap[0][0] > self._now():
            return
        now = self._now()
        while s.heap and s.heap[0][0] <= now:
            due, _, key = heapq.heappop(s.heap)
            if s.deferred.get(key) == due:
                del s.deferred[key]
                self._add(key)
        self._drop_stale()

    async def _wait(self, event: anyio.Event) -> None:
        """Wait for `event`, or until the next deferral is due (loop timers)."""
        due = self.next_due()
        if due is None:
            await event.wait()
            return
        with anyio.move_on_after(max(0.0, due - self._now())):
            await event.wait()


__all__ = ["QueueShutDown", "WorkQueue", "WorkQueueStatistics"]
