"""Time in tests (STYLE.md "Time in tests"): fake loop time, named conditions, and letting
fake time pass.

Tests of the actors, the supervisor, housekeeping and the Lease loop run on a looptime event
loop (`FAKE_TIME`, the `anyio_backend` of their folders or modules): the loop's clock, and so
every anyio `sleep`, `move_on_after` and `fail_after`, is virtual. It stands still while any
task can run and jumps to the next timer when none can, so a test's waits cost no wall time
and a timeout fires only when the system has nothing left to do before it — never because
the machine is slow. Nothing here is a test module.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Awaitable, Callable, TypeVar

import anyio
import looptime

T = TypeVar("T")

FAKE_TIME = ("asyncio", {"loop_factory": functools.partial(looptime.new_event_loop, noop_cycles=1)})
"""An anyio backend (the value of an `anyio_backend` fixture, or `backend`/`backend_options`
of `anyio.run` and `start_blocking_portal` as `*FAKE_TIME`): asyncio on a looptime loop whose
time starts at 0. One idle loop cycle before each jump of time, not looptime's default 42:
those are for I/O and threads finishing meanwhile, which these tests have none of (a fourth
of a chaos run's time went to them)."""


def on_fake_time() -> bool:
    """True inside a running looptime loop with its fake time on."""
    loop = asyncio.get_running_loop()
    return isinstance(loop, looptime.LoopTimeEventLoop) and loop.looptime_on


async def eventually(probe: Callable[[], T | Awaitable[T]], timeout: float = 5.0,
                     what: str = "condition", interval: float = 0.001) -> T:
    """Wait until `probe()` (a cheap function, or a coroutine function such as an API
    read) returns a truthy value, and return it. `probe` is called now and again after each
    `interval` seconds (> 0) of loop time; on fake time that is after the system has run
    everything it could meanwhile. Raises AssertionError naming `what` and the last value
    seen when that is still falsy after `timeout` seconds of loop time (a probe still
    running then is cancelled). Cancellation: propagates."""
    last: object = None
    with anyio.move_on_after(timeout):
        while True:
            last = probe()
            if inspect.isawaitable(last):
                last = await last
            if last:
                return last  # type: ignore[return-value]
            await anyio.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout:g} s; last: {last!r}")


async def advance(seconds: float) -> None:
    """Let `seconds` (>= 0) of fake time pass: every task runs until it waits, and every
    timer due within `seconds` fires, in order. What has not happened when this returns did
    not happen within that time — the fake-time way to say "nothing happened". Raises
    RuntimeError off fake time, where the same sleep would prove nothing."""
    if not on_fake_time():
        raise RuntimeError("advance() needs a looptime loop (tests/timing.FAKE_TIME)")
    await anyio.sleep(seconds)

