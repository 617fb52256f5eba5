"""`k8s.rounds.RoundLoop` on fake time: a round at once, a burst of kicks and every kick
during a round coalesced into one next round, a round at least every period, deferred kicks,
and listeners that come and go with `run`."""

from __future__ import annotations

import anyio
import pytest

from k8s.rounds import RoundLoop
from tests.timing import FAKE_TIME, advance

pytestmark = pytest.mark.anyio
ROUND = 0.5  # each round takes half a second of fake time


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


class _Feed:
    """An informer's listener registry."""

    def __init__(self) -> None:
        self.listeners: list = []

    def add_listener(self, fn) -> None:
        self.listeners.append(fn)

    def remove_listener(self, fn) -> None:
        self.listeners.remove(fn)

    def change(self) -> None:
        for fn in list(self.listeners):
            fn(("ns", "name"), {})


class _Rounds:
    """The rounds' start times, each round taking `ROUND`."""

    def __init__(self) -> None:
        self.started: list[float] = []

    async def __call__(self) -> None:
        self.started.append(anyio.current_time())
        await anyio.sleep(ROUND)


async def test_a_round_at_once_then_one_every_period_without_kicks():
    rounds = _Rounds()
    loop = RoundLoop(rounds, period=10.0, coalesce=0.2)
    async with anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        tg.start_soon(loop.run)
        await advance(31.0)
        tg.cancel_scope.cancel()
    # each wait of a period starts when the round before it ends
    assert [t - t0 for t in rounds.started] == pytest.approx([0.0, 10.5, 21.0])
    assert loop.rounds == 3


async def test_a_burst_of_kicks_is_one_round_coalesce_after_its_first():
    rounds, feed = _Rounds(), _Feed()
    loop = RoundLoop(rounds, period=100.0, coalesce=0.2, sources=[feed])
    async with anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        await tg.start(loop.run)
        await advance(1.0)                    # the first round is over
        for _ in range(5):                    # a burst of changes over 0.1 s
            feed.change()
            await advance(0.02)
        await advance(5.0)
        tg.cancel_scope.cancel()
    assert [t - t0 for t in rounds.started] == pytest.approx([0.0, 1.2])


async def test_kicks_during_a_round_coalesce_into_exactly_one_next_round():
    rounds, feed = _Rounds(), _Feed()
    loop = RoundLoop(rounds, period=100.0, coalesce=0.0, sources=[feed])
    async with anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        await tg.start(loop.run)
        await advance(0.1)                    # within the first round
        for _ in range(10):
            feed.change()
        await advance(0.1)
        feed.change()
        await advance(5.0)
        tg.cancel_scope.cancel()
    assert [t - t0 for t in rounds.started] == pytest.approx([0.0, ROUND])
    assert loop.rounds == 2


async def test_a_deferred_kick_waits_and_a_sooner_one_wins():
    rounds = _Rounds()
    loop = RoundLoop(rounds, period=100.0, coalesce=0.2)
    loop.kick()                               # not running: nothing to tell
    async with anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        await tg.start(loop.run)
        await advance(1.0)
        loop.kick(after=5.0)                  # due at 6.0
        loop.kick(after=2.0)                  # sooner: due at 3.0, and only that one
        await advance(10.0)
        tg.cancel_scope.cancel()
    assert [t - t0 for t in rounds.started] == pytest.approx([0.0, 3.0])


async def test_listeners_are_added_for_the_run_only_and_a_failing_round_ends_it():
    feed = _Feed()
    calls = 0

    async def failing() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("round 2 broke")

    loop = RoundLoop(failing, period=1.0, sources=[feed])
    with pytest.raises(RuntimeError, match="round 2 broke"):
        await loop.run()
    assert (feed.listeners, calls, loop.rounds) == ([], 2, 1)
    with pytest.raises(ValueError, match="period > 0"):
        RoundLoop(failing, period=0.0)
