"""Clocks for tests: one that moves only when told, one that reads the event loop's time
(fake under looptime, see tests/timing.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
"""What `now()` of both clocks returns at their time zero."""


class ManualClock:
    """A clock that only moves when told (`advance`), for tests of expiry and timestamps.
    Deadlines of anyio waits still run on the event loop's own clock."""

    def __init__(self, start: datetime | None = None) -> None:
        self._mono = 1000.0
        self._start = start or EPOCH

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._mono - 1000.0)

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (>= 0)."""
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._mono += seconds


class LoopClock:
    """The `actors.ports.Clock` of the running event loop: `monotonic()` is
    `anyio.current_time()` (seconds; the scale of every anyio sleep and deadline), `now()` is
    `EPOCH` plus that. On a looptime loop both are fake and move together with the loop's
    timers; the production `SystemClock` reads the process's clocks instead, which a fake
    loop does not move. Must be called inside the event loop (RuntimeError otherwise)."""

    def monotonic(self) -> float:
        return anyio.current_time()

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=anyio.current_time())
