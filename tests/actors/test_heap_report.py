"""actors.heap.heap_report (the controller's SIGUSR2): gc's objects always; traced bytes and
a snapshot that tracemalloc can load back while tracing; an unwritable directory raises."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from actors.heap import heap_report


def test_without_tracing_it_counts_objects_and_writes_nothing(tmp_path):
    assert not tracemalloc.is_tracing()
    got = heap_report(tmp_path, 1)
    assert got["pid"] == os.getpid() and got["gc_objects"] > 1000 and not got["tracing"]
    assert "snapshot" not in got and list(tmp_path.iterdir()) == []


def test_while_tracing_it_writes_a_snapshot_that_shows_what_grew(tmp_path):
    tracemalloc.start()
    try:
        first = heap_report(tmp_path, 1)
        kept = [bytearray(4096) for _ in range(256)]   # 1 MiB held between the reports
        last = heap_report(tmp_path, 2)
    finally:
        tracemalloc.stop()
    assert first["snapshot"] == str(tmp_path / f"tracemalloc-{os.getpid()}-1.snap")
    assert last["traced_bytes"] - first["traced_bytes"] >= 1 << 20
    diff = tracemalloc.Snapshot.load(last["snapshot"]).compare_to(
        tracemalloc.Snapshot.load(first["snapshot"]), "lineno")
    top = diff[0]
    assert top.traceback[0].filename == __file__ and top.size_diff >= 1 << 20, top
    assert len(kept) == 256


def test_an_unwritable_directory_raises_oserror(tmp_path):
    tracemalloc.start()
    try:
        with pytest.raises(OSError):
            heap_report(tmp_path / "missing", 1)
    finally:
        tracemalloc.stop()


def test_garbage_in_a_cycle_is_collected_before_it_is_counted(tmp_path):
    """A report counts what is held, not cyclic garbage waiting for a full collection."""
    import gc

    class Node:
        def __init__(self) -> None:
            self.me = self
            self.buffer = bytearray(1 << 16)

    gc.disable()
    try:
        for _ in range(50):
            Node()           # each unreachable at once, but only a collection frees it
        got = heap_report(tmp_path, 1)
    finally:
        gc.enable()
    assert got["gc_collected"] >= 50, got     # the 50 instances (and any dicts of theirs)
