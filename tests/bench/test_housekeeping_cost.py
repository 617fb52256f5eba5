"""bench.housekeeping_cost at a small size: the population it builds and the report's fields
per scenario. The 100/1,000-node figures are the bench's (docs/benchmarks.md), not this
test's."""

from __future__ import annotations

import pytest

from bench.housekeeping_cost import measure


@pytest.mark.parametrize("mode", ["count", "device"])
def test_the_report_has_each_scenarios_cpu_and_longest_stretch(mode):
    row = measure(3, mode, rounds=2)
    assert (row["nodes"], row["mode"], row["gpudevices"]) == (3, mode, 24)
    assert row["vmis"] == row["vms"] > 0 and row["claims"] == (row["vmis"] if mode == "device" else 0)
    for scenario in ("quiet", "churn", "sweep"):
        got = row[scenario]
        assert 0 <= got["cpu_ms_median"] <= got["cpu_ms_max"]
        assert got["longest_stretch_ms"] >= 0
