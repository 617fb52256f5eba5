"""`bench/keep.py`'s pure helpers (issue 33 H4) without a cluster: the distribution of a
figure, and device mode's "same node and same uuids in every cycle" read from the test's
per-cycle record. The run itself is the benchmark's (docs/virtualmachines.md, Measured)."""

from __future__ import annotations

import pytest

from bench import keep

FIRST = {"node": "hgx-a", "allocated": [["hgx-a", "gpu-2"], ["hgx-a", "gpu-3"]],
         "uuids": ["GPU-2", "GPU-3"]}


def _report(*cycles: dict) -> dict:
    return {"first": FIRST, "per_cycle": list(cycles)}


def test_summary_gives_the_distribution_of_the_values_in_any_order():
    got = keep.summary([0.4, 0.1, 0.3, 0.2])
    assert got == {"n": 4, "min": 0.1, "p50": 0.3, "p90": 0.4, "p99": 0.4, "max": 0.4,
                   "mean": pytest.approx(0.25)}


def test_every_cycle_on_the_first_starts_node_devices_and_uuids_is_the_same():
    assert keep.same_every_cycle(_report(dict(FIRST), dict(FIRST), dict(FIRST))) is True


@pytest.mark.parametrize("change", [{"node": "hgx-b"},
                                    {"allocated": [["hgx-a", "gpu-2"], ["hgx-a", "gpu-4"]]},
                                    {"uuids": ["GPU-3", "GPU-2"]}])
def test_one_cycle_elsewhere_or_with_other_devices_or_uuids_is_not_the_same(change):
    assert keep.same_every_cycle(_report(dict(FIRST), {**FIRST, **change}, dict(FIRST))) is False


def test_no_cycle_is_not_a_yes():
    assert keep.same_every_cycle(_report()) is False
