"""`actors.workqueue.WorkQueue` against an obviously correct model (hypothesis stateful
testing), on a manual clock: no sleeps. Plus the async waits, on anyio, each bounded."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors.workqueue import QueueShutDown, WorkQueue
from fakes.clock import ManualClock

KEYS = st.sampled_from("abcde")
DELAYS = st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0])


class _Model:
    """The queue as plain lists and sets, promoted eagerly before every operation."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waiting: list[str] = []
        self.processing: set[str] = set()
        self.dirty: set[str] = set()
        self.deferred: dict[str, tuple[float, int]] = {}  # key -> (due, order made)
        self.shut_down = False
        self.n = 0

    def promote(self) -> None:
        for key, _ in sorted(((k, v) for k, v in self.deferred.items() if v[0] <= self.now),
                             key=lambda kv: kv[1]):
            del self.deferred[key]
            self._add(key)

    def _add(self, key: str) -> None:
        if key in self.dirty:
            return
        self.dirty.add(key)
        if key not in self.processing:
            self.waiting.append(key)

    def add(self, key: str) -> None:
        self.promote()
        if not self.shut_down:
            self.deferred.pop(key, None)
            self._add(key)

    def add_after(self, key: str, delay: float) -> None:
        self.promote()
        if self.shut_down:
            return
        if delay <= 0:
            self.deferred.pop(key, None)
            self._add(key)
            return
        if key in self.dirty:
            return
        due = self.now + delay
        if key in self.deferred and self.deferred[key][0] <= due:
            return
        self.n += 1
        self.deferred[key] = (due, self.n)

    def get(self) -> str | None:
        self.promote()
        if not self.waiting:
            return None
        key = self.waiting.pop(0)
        self.dirty.discard(key)
        self.processing.add(key)
        return key

    def done(self, key: str) -> None:
        self.processing.discard(key)
        if key in self.dirty:
            self.waiting.append(key)

    def shutdown(self) -> None:
        self.shut_down = True
        self.deferred.clear()


class WorkQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.start = self.clock.monotonic()
        self.q: WorkQueue[str] = WorkQueue(self.clock)
        self.m = _Model()

    def _sync_time(self) -> None:
        self.m.now = self.clock.monotonic() - self.start

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        self.q.add(key)
        self.m.add(key)

    @rule(key=KEYS, delay=DELAYS)
    def add_after(self, key: str, delay: float) -> None:
        self.q.add_after(key, delay)
        self.m.add_after(key, delay)

    @rule()
    def get(self) -> None:
        want = self.m.get()
        if want is None:
            exc = QueueShutDown if self.m.shut_down else anyio.WouldBlock
            with pytest.raises(exc):
                self.q.get_nowait()
        else:
            assert self.q.get_nowait() == want

    @precondition(lambda self: self.m.processing)
    @rule(data=st.data())
    def done(self, data) -> None:
        key = data.draw(st.sampled_from(sorted(self.m.processing)))
        self.m.promote()
        self.q.done(key)
        self.m.done(key)

    @rule(key=KEYS)
    def done_of_a_key_not_processing_raises(self, key: str) -> None:
        event(f"done of a key {'being processed: skipped' if key in self.m.processing else 'not processing'}")
        if key not in self.m.processing:
            with pytest.raises(ValueError):
                self.q.done(key)

    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 3.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._sync_time()

    @precondition(lambda self: not self.m.shut_down)
    @rule()
    def shutdown(self) -> None:
        self.q.shutdown()
        self.m.promote()
        self.m.shutdown()

    @invariant()
    def same_contents(self) -> None:
        self.m.promote()
        assert self.q.waiting() == tuple(self.m.waiting)
        assert self.q.processing() == frozenset(self.m.processing)
        st_ = self.q.statistics()
        assert st_.deferred == len(self.m.deferred)
        assert st_.dirty == len(self.m.dirty & self.m.processing)

    @invariant()
    def never_waiting_and_processing_at_once(self) -> None:
        assert not set(self.q.waiting()) & self.q.processing()
        assert len(set(self.q.waiting())) == len(self.q.waiting())

    @invariant()
    def next_due_is_the_earliest_deferral(self) -> None:
        self.m.promote()
        want = min((d for d, _ in self.m.deferred.values()), default=None)
        got = self.q.next_due()
        assert (got is None) == (want is None)
        if got is not None:
            assert got - self.start == pytest.approx(want)


TestWorkQueueModel = WorkQueueMachine.TestCase
TestWorkQueueModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


# -- the async waits (on fake loop time: tests/actors/conftest.py; each bounded) ---------------

@pytest.mark.anyio
async def test_get_waits_for_an_add_and_the_key_is_not_handed_out_twice() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str] = []

    async def consumer() -> None:
        got.append(await q.get(timeout=5))

    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer)
        await anyio.wait_all_tasks_blocked()
        q.add("k")
    assert got == ["k"]
    q.add("k")  # processing: marked only
    with pytest.raises(anyio.WouldBlock):
        q.get_nowait()
    q.done("k")  # added meanwhile: queued again
    assert q.get_nowait() == "k"


@pytest.mark.anyio
async def test_get_times_out_and_a_cancelled_get_leaves_the_queue_unchanged() -> None:
    q: WorkQueue[str] = WorkQueue()
    with pytest.raises(TimeoutError):
        await q.get(timeout=0)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await q.get()
    assert scope.cancelled_caught
    q.add("k")
    with anyio.CancelScope() as scope:
        scope.cancel()
        await q.get()  # cancelled before taking: "k" stays
    assert q.waiting() == ("k",)


@pytest.mark.anyio
async def test_get_wakes_for_a_deferral_on_the_loop_clock() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("later", 0.02)
    with anyio.fail_after(5):
        assert await q.get() == "later"


@pytest.mark.anyio
async def test_get_key_takes_only_its_own_key() -> None:
    q: WorkQueue[tuple[str, int]] = WorkQueue()
    q.add(("other", 1))
    with pytest.raises(TimeoutError):
        await q.get_key(("mine", 2), timeout=0)

    async def add_mine() -> None:
        await anyio.wait_all_tasks_blocked()
        q.add(("mine", 2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(add_mine)
        assert await q.get_key(("mine", 2), timeout=5) == ("mine", 2)
    assert q.waiting() == (("other", 1),)


@pytest.mark.anyio
async def test_shutdown_hands_out_what_waits_then_raises_and_drain_waits_for_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_all(["a", "b"])
    q.add_after("c", 60)
    first = q.get_nowait()
    finished: list[str] = []

    async def drain() -> None:
        await q.drain(timeout=5)
        finished.append("drained")

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        await anyio.wait_all_tasks_blocked()
        q.add("d")  # refused: shut down
        assert q.get_nowait() == "b"
        q.done(first)
        await anyio.wait_all_tasks_blocked()
        assert finished == []  # "b" still processing
        q.done("b")
    assert finished == ["drained"]
    with pytest.raises(QueueShutDown):
        await q.get(timeout=5)


@pytest.mark.anyio
async def test_drain_is_bounded() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.get_nowait()
    with pytest.raises(TimeoutError):
        await q.drain(timeout=0)
