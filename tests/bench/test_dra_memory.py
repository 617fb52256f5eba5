"""bench.dra_memory at a small size: the report's fields, a relist that keeps no second copy,
and a loose bound per slice far under main's former cost (about 52 KB a slice kept: the
decoded attribute dicts beside a parsed copy). The 1,000-node figure is the bench's
(docs/benchmarks.md), not this test's."""

from __future__ import annotations

from bench.dra_memory import measure


def test_the_cache_keeps_one_compact_copy_of_each_slice_and_a_relist_adds_none():
    report = measure(nodes=20, top=3)
    assert (report["nodes"], report["devices"]) == (20, 160)
    assert 0 < report["kept_bytes"] < 20 * 10_000, report["bytes_per_slice"]
    assert report["after_relist_bytes"] < report["kept_bytes"] * 1.1
    assert len(report["top_lines"]) == 3 and all(line["bytes"] > 0 for line in report["top_lines"])
