"""The collector policy (actors/heap.py): freeze the loaded state, raise the young threshold,
and undo both; and the periodic return of the C heap's free pages (issue 41 item 5)."""

from __future__ import annotations

import gc
import platform

import anyio
import pytest

from actors.heap import (YOUNG_THRESHOLD, malloc_trimmer, restore_heap, settle_heap,
                         trim_heap_every)


def test_settle_freezes_the_live_heap_and_raises_the_young_threshold_then_restore_undoes_it() -> None:
    gc.unfreeze()
    original = gc.get_threshold()
    kept = [{"long": "lived"} for _ in range(1000)]
    before = settle_heap()
    try:
        assert before == original
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, original[1], original[2])
    finally:
        restore_heap(before)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == original


class _Stop(Exception):
    pass


def _sleeps(n: int, slept: list[float]):
    """A `sleep` that records each duration asked and stops the loop at the `n`th call."""
    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == n:
            raise _Stop
    return sleep


def test_the_heap_is_trimmed_once_per_period_and_not_before_the_first_has_passed() -> None:
    """Issue 41 item 5: the trim is scheduled every `period` and bounded to one per period."""
    slept: list[float] = []
    trims: list[int] = []
    with pytest.raises(_Stop):
        anyio.run(lambda: trim_heap_every(60.0, lambda: trims.append(1) or 1,
                                          sleep=_sleeps(4, slept)))
    assert slept == [60.0, 60.0, 60.0, 60.0]
    assert len(trims) == 3   # after each of the three periods that ended; none at the start


@pytest.mark.parametrize("period, trim", [(0.0, lambda: 1), (60.0, None)])
def test_no_period_or_no_malloc_trim_returns_at_once_without_trimming(period, trim, monkeypatch) -> None:
    monkeypatch.setattr("actors.heap.malloc_trimmer", lambda: None)
    slept: list[float] = []
    assert anyio.run(lambda: trim_heap_every(period, trim, sleep=_sleeps(1, slept))) is None
    assert slept == []


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_malloc_trim_gives_freed_pages_inside_the_heap_back() -> None:
    """What the trim is for: 64 KiB chunks (glibc's heap, below its mmap threshold)
    alternating with 64 KiB ones that stay, so the freed chunks are holes inside the heap,
    not its top: freeing them returns nothing, and their pages stay resident until
    `malloc_trim` gives them back."""
    trim = malloc_trimmer()
    assert trim is not None
    trim()
    freed, kept = [], []
    for _ in range(128):
        freed.append(bytearray(64 * 1024))   # bytearray zero-fills: its pages are resident
        kept.append(bytearray(64 * 1024))
    del freed
    before = _rss_kib()
    assert trim() == 1
    released = before - _rss_kib()
    assert released >= 4 * 1024, released   # of the 8 MiB of holes
    del kept


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
