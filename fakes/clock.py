"""A clock for tests: time moves only when told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class ManualClock:
    """A clock that only moves when told (`advance`), for tests of expiry and timestamps.
    Deadlines of anyio waits still run on the event loop's own clock."""

    def __init__(self, start: datetime | None = None) -> None:
        self._mono = 1000.0
        self._start = start or datetime(2030, 1, 1, tzinfo=UTC)

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._mono - 1000.0)

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (>= 0)."""
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._mono += seconds
