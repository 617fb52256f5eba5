"""`gpu-binder bench e2e`'s report in both modes (issue 32) without a cluster: the device ÷
count ratios pair each level with its own twin, the targets name each set size run at
concurrency 20 in both modes, count mode's own targets read count-mode levels only, and the
plot draws both modes. The run itself is the benchmark's (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench import e2e


def _level(mode: str, gpus: int, c: int, p50: float, p99: float) -> dict:
    return {"mode": mode, "gpus": gpus, "concurrency": c, "vmis": 20, "admitted": 20,
            "refused": 0, "p50_ms": p50, "p99_ms": p99, "admissions_per_s": 10.0,
            "writes_per_admission": 4.0, "share_of_write_ceiling": 0.7}


LEVELS = [_level("count", 8, 20, 100.0, 200.0), _level("device", 8, 20, 120.0, 260.0),
          _level("count", 1, 1, 40.0, 50.0), _level("device", 1, 1, 45.0, 60.0),
          _level("count", 1, 20, 80.0, 300.0), _level("device", 1, 20, 90.0, 600.0),
          _level("count", 4, 20, 90.0, 250.0)]   # 4 GPUs in count mode only


def test_device_vs_count_pairs_each_level_with_its_twin_in_the_order_run():
    got = e2e.device_vs_count(LEVELS)
    assert [(r["gpus"], r["concurrency"]) for r in got] == [(8, 20), (1, 1), (1, 20)]
    assert got[0] == {"gpus": 8, "concurrency": 20, "count_p99_ms": 200.0, "device_p99_ms": 260.0,
                      "p99_ratio": 1.3, "count_p50_ms": 100.0, "device_p50_ms": 120.0,
                      "p50_ratio": 1.2, "count_webhook_mean_ms": None,
                      "device_webhook_mean_ms": None, "count_decision_mean_ms": None,
                      "device_decision_mean_ms": None}
    assert got[2]["p99_ratio"] == 2.0


def test_a_level_with_nothing_admitted_has_no_ratio():
    levels = [_level("count", 1, 20, 80.0, 300.0), _level("device", 1, 20, 0, float("nan"))]
    (r,) = e2e.device_vs_count(levels)
    assert r["p99_ratio"] is None and r["p50_ratio"] is None


def test_targets_per_set_size_at_concurrency_20_and_count_mode_own_targets():
    report = {"levels": LEVELS, "device_vs_count": e2e.device_vs_count(LEVELS)}
    t = e2e._targets(report)
    assert set(t) == {"share_of_write_ceiling", "p99_ms", "device_over_count_p99_8gpu",
                      "device_over_count_p99_1gpu"}
    assert t["device_over_count_p99_8gpu"] == {"at": "concurrency 20", "target": "<= 1.5",
                                               "value": 1.3, "met": True}
    assert t["device_over_count_p99_1gpu"]["value"] == 2.0
    assert t["device_over_count_p99_1gpu"]["met"] is False
    assert t["p99_ms"]["value"] == 300.0   # count mode's level, not device mode's 600
    # a count-only report (no device levels) keeps its targets as before
    count_only = [r for r in LEVELS if r["mode"] == "count"]
    assert set(e2e._targets({"levels": count_only, "device_vs_count": []})) == {
        "share_of_write_ceiling", "p99_ms"}


@pytest.mark.parametrize("modes", [("count",), ("count", "device")])
def test_plot_draws_every_mode(tmp_path, modes):
    levels = [r for r in LEVELS if r["mode"] in modes]
    e2e._plot({"levels": levels, "raw_status_patch_per_s": 500.0}, tmp_path / "e2e.png")
    assert (tmp_path / "e2e.png").stat().st_size > 10_000


def test_run_refuses_an_unknown_mode(tmp_path):
    with pytest.raises(ValueError, match="modes"):
        e2e.run(tmp_path, modes=("count", "devices"))


def test_the_replicas_own_timings_of_each_mode_go_with_the_ratio():
    from bench.common import timings_between

    before = {"admission_s": 1.0, "admissions": 10.0, "decision_s": 0.1, "decisions": 10.0}
    after = {"admission_s": 3.0, "admissions": 30.0, "decision_s": 0.5, "decisions": 30.0}
    assert timings_between(before, after) == {"webhook_mean_ms": 100.0, "decision_mean_ms": 20.0}
    assert timings_between(after, after) == {"webhook_mean_ms": None, "decision_mean_ms": None}
    count, device = _level("count", 1, 20, 80.0, 300.0), _level("device", 1, 20, 90.0, 600.0)
    count["inside"] = timings_between(before, after)
    device["inside"] = {"webhook_mean_ms": 250.0, "decision_mean_ms": 60.0}
    (r,) = e2e.device_vs_count([count, device])
    assert (r["count_webhook_mean_ms"], r["device_webhook_mean_ms"],
            r["count_decision_mean_ms"], r["device_decision_mean_ms"]) == (100.0, 250.0, 20.0, 60.0)


def test_vmis_per_level_sizes_the_fleet():
    plan, per_level, nodes = e2e._plan(False, (1, 8), (20,), vmis=300)
    assert plan == [(1, 20), (8, 20)] and per_level == 300
    assert nodes == 422            # (300 + 2,400) GPUs × 1.25 ÷ 8, rounded up
    assert e2e._plan(True, (1,), None)[1:] == (20, 20)


def test_phases_of_one_mode_between_two_scrapes():
    name = "gpu_binder_admission_phase_seconds"

    def s(phase, mode, total, n):
        labels = (("mode", mode), ("phase", phase))
        return {(f"{name}_sum", labels): total, (f"{name}_count", labels): n}
    before = {**s("live-read", "count", 1.0, 10), **s("total", "count", 5.0, 10)}
    after = {**s("live-read", "count", 1.3, 20), **s("total", "count", 7.0, 20),
             **s("total", "device", 9.0, 3)}
    assert e2e._phases(before, after, "count") == {"live-read": 30.0, "total": 200.0,
                                                   "own": 170.0}
    assert e2e._phases(before, after, "device") == {"total": 3000.0, "own": 3000.0}
