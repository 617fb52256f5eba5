"""The garbage-collector policy of a long-running binder process (the controller, bench/).

A binder's heap is mostly long-lived (the synced informer cache, one actor per node) plus a
stream of short-lived values per request (model values replaced on every write, messages).
With CPython's default thresholds (700, 10, 10) the young generation is collected every few
hundred allocations and full collections rescan the whole cache: at 1,000 nodes about a
tenth of the binder's CPU and, at 5,000 nodes, pauses of 100–300 ms that set p99
(bench/core.py measures both). `settle_heap` is called once the long-lived state is loaded.

`trim_heap_every` gives the C heap's free pages back to the kernel now and then (glibc's
`malloc_trim(0)`, issue 41 item 5): what CPython allocates beyond 512 bytes (TLS buffers,
HTTP bodies, large dicts) comes from glibc, which keeps a freed chunk's pages resident
unless they border the top of its heap, so without it RSS is the high-water mark of every
burst of connections and admissions since the start and never comes down.
"""

from __future__ import annotations

import ctypes
import gc
import os
import tracemalloc
from pathlib import Path
from typing import Awaitable, Callable

import anyio

YOUNG_THRESHOLD = 10_000
"""Allocations (net of frees) between young-generation collections."""


def settle_heap() -> tuple[int, int, int]:
    """Collect, freeze everything alive (full collections no longer scan it), and raise the
    young-generation threshold to `YOUNG_THRESHOLD` (older generations keep theirs).
    Returns the thresholds it replaced, for `restore_heap`."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, before[1], before[2])
    return before


def restore_heap(thresholds: tuple[int, int, int]) -> None:
    """Undo `settle_heap` (for a process that loads another state next, as bench/ does)."""
    gc.unfreeze()
    gc.set_threshold(*thresholds)


MALLOC_TRIM_PERIOD = 60.0
"""Default seconds between two `malloc_trim(0)` calls (`--malloc-trim-period`). One call
walks glibc's free chunks: about 0.2 ms for a 50 MiB heap (`bench.cache_turnover`), so once a
minute is well below a thousandth of a core."""


def malloc_trimmer() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` as a callable returning what it returns (1: pages went back
    to the kernel, 0: none could), or None where the C library has none (musl, macOS).
    ctypes releases the GIL for the call."""
    try:
        fn = ctypes.CDLL(None).malloc_trim   # the process's own C library
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


async def trim_heap_every(period: float, trim: Callable[[], int] | None = None, *,
                          sleep: Callable[[float], Awaitable[None]] = anyio.sleep) -> None:
    """Every `period` seconds, one `trim()` (default: `malloc_trimmer()`'s), forever: glibc
    keeps the pages of chunks freed inside its heap resident (only a free top is returned by
    itself), so a replica's RSS held every burst's high-water mark (issue 41 item 5: a young
    follower rose in steps of 3-5 MiB at bursts of admissions and connections and never came
    down; `python -m bench.cache_turnover --conns 20 --bursts 4` reproduces the steps without
    a cluster, and a trim a minute brings RSS back to what is in use after each burst; in
    the device soak of 2026-12-07 the follower still grew 0.94 MiB/min with it, so that
    growth is something else, docs/benchmarks.md). One trim per period, none at the start (the caller has just settled the heap). Returns at
    once when `period` <= 0 (off) or this C library has no `malloc_trim`; otherwise runs
    until cancelled."""
    if trim is None:
        trim = malloc_trimmer()
    if period <= 0 or trim is None:
        return
    while True:
        await sleep(period)
        trim()


def heap_report(directory, n: int) -> dict:
    """What the heap holds now, for telling a leak from allocator growth (`gpu-binder
    controller` calls it on SIGUSR2; docs/troubleshooting.md), after a full collection
    (`gc_collected` objects found unreachable): garbage in reference cycles waits for one,
    and with `settle_heap`'s thresholds over a large heap that can take minutes, so without
    it a report counts garbage as held. Then the objects the garbage
    collector tracks (`gc_objects`, of which `gc_frozen` frozen by `settle_heap`) and, while
    tracemalloc traces (`PYTHONTRACEMALLOC=1` in the process's environment), the bytes Python
    has allocated and not freed (`traced_bytes`) with a snapshot written to
    `directory`/tracemalloc-<pid>-<n>.snap (read it with `tracemalloc.Snapshot.load`; compare
    two with `Snapshot.compare_to`). Returns those as a dict. OSError when the snapshot
    cannot be written."""
    collected = gc.collect()
    out = {"pid": os.getpid(), "gc_collected": collected, "gc_objects": len(gc.get_objects()),
           "gc_frozen": gc.get_freeze_count(),
           "tracing": tracemalloc.is_tracing()}
    if out["tracing"]:
        current, peak = tracemalloc.get_traced_memory()
        path = Path(directory) / f"tracemalloc-{os.getpid()}-{n}.snap"
        tracemalloc.take_snapshot().dump(str(path))
        out.update(traced_bytes=current, traced_peak_bytes=peak, snapshot=str(path))
    return out
