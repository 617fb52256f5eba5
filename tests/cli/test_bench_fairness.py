"""`gpu-binder bench fairness`: the parser takes it, the quantile and the summary's lines."""

from __future__ import annotations

import pytest

from bench.fairness import quantile, summary
from cli.main import build_parser


def test_the_parser_takes_bench_fairness():
    args = build_parser().parse_args(["bench", "fairness", "--out", "x"])
    assert (args.which, args.out) == ("fairness", "x")


def test_quantile_is_nearest_rank():
    samples = [0.1 * i for i in range(1, 11)]  # 0.1 .. 1.0
    assert quantile(samples, 0.5) == pytest.approx(0.5)
    assert quantile(samples, 0.99) == pytest.approx(1.0)
    assert quantile([3.0], 0.99) == 3.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_summary_states_the_target_met_or_not():
    def part(p50, p99):
        return {"n": 10, "admitted": 10, "p50_s": p50, "p99_s": p99, "max_s": p99}
    busy = {**part(0.06, 0.4), "each_s": [0.4, 0.06], "in_webhook_s": [0.05, 0.04],
            "before_webhook_s": [0.35, 0.02]}
    report = {"b_alone": part(0.05, 0.08), "b_under_flood": busy, "a_flood": 200,
              "a_by_status": {"201": 1, "429": 50}, "a_flood_seconds": 1.2,
              "target": {"target": "B's p99 under A's flood <= 3 x its p99 alone",
                         "value": 5.0, "met": False}, "load_before": (4.0, 3.5, 3.0)}
    lines = summary(report)
    assert lines[0] == "B alone: p50 0.050 s, p99 0.080 s, max 0.080 s, 10/10 admitted"
    assert lines[1].startswith("B under A's flood: p50 0.060 s, p99 0.400 s")
    assert lines[2] == ("  slowest (create 1): 0.400 s, of which 0.050 s in the webhook's "
                        "admission and 0.350 s before it (API server, the call to the "
                        "webhook, its HTTP server)")
    assert lines[4].endswith("ratio 5.0: NOT met")
    assert lines[5] == "load average before: 4.00, 3.50, 3.00"
    assert len(lines) == 6
    report["apf"] = {"flow_schema": ["flowschemas/gpu-binder-vmi-creates"],
                     "priority_level": ["prioritylevelconfigurations/gpu-binder-vmi-creates"]}
    assert summary(report)[6] == ("B's creates classified by flowschemas/gpu-binder-vmi-creates"
                                  " at prioritylevelconfigurations/gpu-binder-vmi-creates")


def test_summary_gives_the_lone_tenants_burst_and_its_target():
    base = {"b_alone": {"n": 50, "admitted": 50, "p50_s": 0.05, "p99_s": 0.08, "max_s": 0.08},
            "b_under_flood": {"n": 50, "admitted": 50, "p50_s": 0.06, "p99_s": 0.1,
                              "max_s": 0.1},
            "a_flood": 200, "a_by_status": {"403": 200}, "a_flood_seconds": 1.0,
            "target": {"target": "t", "value": 1.25, "met": True}, "load_before": (1, 1, 1),
            "burst": {"n": 200, "at_once": 50, "admitted": 200, "share_admitted": 1.0,
                      "seconds": 8.0, "admissions_per_s": 25.0,
                      "answers_by_status": {"201": 200, "429": 31},
                      "retry_after_s": {"1": 31}},
            "burst_target": {"target": "all 200 of the lone tenant's burst admitted within "
                                       "1.5 x its time before the gate (6 s): 9.00 s",
                             "value": 8.0, "met": True}}
    lines = summary(base)
    assert lines[-2] == ("lone tenant's burst: 200/200 admitted (100%), 50 at a time, in "
                         "8.00 s: 25.0 admissions/s; answers (retries included) by status: "
                         "{'201': 200, '429': 31}; Retry-After seconds told: {'1': 31}")
    assert lines[-1].endswith("(6 s): 9.00 s: 8.00 s: met")
