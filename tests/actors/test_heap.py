"""The collector policy (actors/heap.py): freeze the loaded state, raise the young threshold,
and undo both."""

from __future__ import annotations

import gc

from actors.heap import YOUNG_THRESHOLD, restore_heap, settle_heap


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
