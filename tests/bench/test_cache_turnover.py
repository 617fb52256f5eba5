"""bench.cache_turnover: a follower's `ClusterCache` fed a soak population and its churn in
one process (issue 41 item 5): the churn replaces the listed objects at constant counts
through the real informers, the frozen start-up heap shrinks as it does, and a trim period
is kept (one `malloc_trim` per period)."""

from __future__ import annotations

import platform

import pytest

import k8s.cache
from bench.cache_turnover import World, run


def test_the_churn_replaces_the_listed_objects_at_constant_counts():
    clock = k8s.cache.time
    got = run(20, 3, trim_every=None, scrape=True)
    assert k8s.cache.time is clock                       # the simulated clock is undone
    samples = got["samples"]
    assert [s["t_min"] for s in samples] == [1.0, 2.0, 3.0]
    assert {(s["vmis"], s["pods"]) for s in samples} == {(40, 40)}   # 2 per node, one Pod each
    frozen = [got["listed"]["gc_frozen"]] + [s["gc_frozen"] for s in samples]
    assert frozen == sorted(frozen, reverse=True) and frozen[0] > frozen[-1]
    assert got["trims"] == 0


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/smaps")
def test_each_sample_says_where_the_resident_memory_lives():
    """`parts` (actors.heap.heap_parts, MiB): the resident parts add up to the sample's RSS,
    and the scrape's worker thread shows as a malloc arena of its own."""
    import os

    from actors.heap import RSS_PARTS, mallinfo_reader

    got = run(20, 1, trim_every=None, scrape=True)
    for s in [got["listed"], *got["samples"]]:
        parts = s["parts"]
        total = sum(parts[f"rss_{p}"] for p in RSS_PARTS)
        assert abs(total - s["rss_mib"]) < 0.05 * s["rss_mib"], (total, s["rss_mib"])
        assert parts["pymalloc_blocks"] > 0 and parts["rss_file"] > 0
    if mallinfo_reader() is not None and "MALLOC_ARENA_MAX" not in os.environ:
        assert got["samples"][-1]["parts"]["rss_thread_arenas"] > 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trim_period_trims_once_per_period():
    got = run(10, 2, trim_every=30, scrape=False, conns=2, bursts=1, hold=1)
    assert got["trims"] == 4                             # 120 simulated seconds / 30
    assert all(s["connections"] >= 16 for s in got["samples"])


def test_the_world_holds_what_it_would_list():
    w = World(10, 1)
    assert len(w.objs["nodes"]) == 10 and len(w.objs["virtualmachineinstances"]) == 20
    assert len(w.objs["gpudevices"]) >= 80               # 8 a node, held ones beside the idle
    events: list = []
    w.new_vmi(events)
    w.delete_vmi(events)
    kinds = {k for k, _ in events}
    assert kinds == {"gpudevices", "virtualmachineinstances", "pods"}
    assert len(w.objs["virtualmachineinstances"]) == 20  # one created, one deleted
