"""The test clock itself (tests/timing.py, fakes/clock.py): the tests of this folder run on
fake loop time, waits cost no wall time, and `eventually` fails by its deadline."""

from __future__ import annotations

import time

import anyio
import pytest

from fakes.clock import EPOCH, LoopClock
from tests.timing import advance, eventually, on_fake_time

pytestmark = pytest.mark.anyio


async def test_an_hour_of_fake_time_passes_at_once_and_the_loop_clock_follows() -> None:
    assert on_fake_time()
    clock = LoopClock()
    t0, wall0, now0 = clock.monotonic(), time.monotonic(), clock.now()
    with anyio.move_on_after(1800) as scope:
        await anyio.sleep(3600)
    assert scope.cancelled_caught and clock.monotonic() - t0 == pytest.approx(1800)
    await advance(1800)
    assert clock.monotonic() - t0 == pytest.approx(3600)
    assert (clock.now() - now0).total_seconds() == pytest.approx(3600) and now0 >= EPOCH
    assert time.monotonic() - wall0 < 1.0


async def test_eventually_returns_the_first_truthy_value_or_fails_at_its_deadline() -> None:
    calls: list[float] = []

    def probe() -> int:
        calls.append(anyio.current_time())
        return len(calls) if len(calls) >= 3 else 0

    t0 = anyio.current_time()
    assert await eventually(probe, 1.0, interval=0.1) == 3
    assert calls[-1] - t0 == pytest.approx(0.2)

    async def never() -> list:
        return []

    with pytest.raises(AssertionError, match="the impossible not reached within 30 s; last: \\[\\]"):
        await eventually(never, 30.0, "the impossible", interval=1.0)
    assert anyio.current_time() - t0 == pytest.approx(30.2)
