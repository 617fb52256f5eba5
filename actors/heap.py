"""The garbage-collector policy of a long-running binder process (the controller, bench/).

A binder's heap is mostly long-lived (the synced informer cache, one actor per node) plus a
stream of short-lived values per request (model values replaced on every write, messages).
With CPython's default thresholds (700, 10, 10) the young generation is collected every few
hundred allocations and full collections rescan the whole cache: at 1,000 nodes about a
tenth of the binder's CPU and, at 5,000 nodes, pauses of 100–300 ms that set p99
(bench/core.py measures both). `settle_heap` is called once the long-lived state is loaded.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

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
