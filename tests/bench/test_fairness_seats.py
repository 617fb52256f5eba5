"""`gpu-binder bench fairness --seats` (issue 40 item 4), its pure side: the seat counts the
flag takes, the tenants and nodes of each seat count, each of B's creates' seconds in the
webhook read from the replicas' log lines by namespace, the ratio and target per seat count,
and the summary's line per seat count; on real values, no cluster, no timing asserted."""

from __future__ import annotations

import json

import pytest

from bench import fairness
from bench.common import BadArgs
from cli.main import build_parser


def test_the_flag_is_off_by_default_and_takes_seat_counts_in_order():
    args = build_parser().parse_args(["bench", "fairness", "--out", "x"])
    assert args.seats is None
    assert fairness.seat_counts(args.seats) == ()
    args = build_parser().parse_args(["bench", "fairness", "--out", "x", "--seats", "5,12,25"])
    assert fairness.seat_counts(args.seats) == (5, 12, 25)
    assert fairness.seat_counts("25,5,25") == (25, 5)
    for bad in ("0", "5,x", "", "600"):
        with pytest.raises(BadArgs, match="--seats"):
            fairness.seat_counts(bad)


def test_each_seat_count_has_tenants_of_its_own_and_the_fleet_holds_them_all():
    assert fairness.tenants_of(None) == ("tenant-a", "tenant-b")
    assert fairness.tenants_of(12) == ("tenant-a-s12", "tenant-b-s12")
    assert fairness.nodes_needed(1) == fairness.NODES      # as before --seats: 8 nodes
    # C's 200, then per seat count B's 2 x 50 and A's 4: 512 GPUs on 13 nodes of 40
    assert fairness.nodes_needed(3) == 13
    assert 13 * fairness.NODE_GPUS >= 200 + 3 * (2 * 50 + 4)


def log_line(ns: str, vmi: str, seconds: float, node: str = "fair-node-3") -> str:
    """A replica's "VMI admitted" line, as k8s/webhook/admission.py writes it."""
    return json.dumps({"node": node, "request_id": "4c831dbd3d4c4d3f9d00896740ac6b84",
                       "devices": [f"{vmi}-h100-0"], "webhook_seconds": seconds,
                       "event": "VMI admitted", "namespace": ns, "vmi": vmi,
                       "user": "user-b", "level": "info",
                       "timestamp": "2026-12-06T10:37:34.054654Z"})


def latencies(each: list[float]) -> dict:
    return {"n": len(each), "admitted": len(each), "p50_s": sorted(each)[len(each) // 2],
            "p99_s": max(each), "max_s": max(each), "each_s": each}


def test_webhook_seconds_per_namespace_fill_each_seat_counts_creates(tmp_path):
    (tmp_path / "controller-0.log").write_text("\n".join([
        log_line("tenant-b-s5", "alone-0", 0.021), log_line("tenant-b-s5", "busy-1", 0.094),
        '{"event": "VMI refused", "namespace": "tenant-a-s5", "vmi": "a-0-1"}',
        "not json: VMI admitted", log_line("tenant-c", "c-0", 0.5)]) + "\n")
    (tmp_path / "controller-1.log").write_text("\n".join([
        log_line("tenant-b-s12", "alone-0", 0.019), log_line("tenant-b-s5", "alone-1", 0.03),
        log_line("tenant-b-s5", "busy-0", 0.088)]) + "\n")
    inside = fairness._webhook_seconds(tmp_path)
    assert inside == {("tenant-b-s5", "alone-0"): 0.021, ("tenant-b-s5", "busy-1"): 0.094,
                      ("tenant-c", "c-0"): 0.5, ("tenant-b-s12", "alone-0"): 0.019,
                      ("tenant-b-s5", "alone-1"): 0.03, ("tenant-b-s5", "busy-0"): 0.088}
    level = {"b_alone": latencies([0.052, 0.061]), "b_under_flood": latencies([0.12, 0.181])}
    fairness.finish_level(level, inside, "tenant-b-s5")
    assert level["b_alone"]["in_webhook_s"] == [0.021, 0.03]
    assert level["b_alone"]["before_webhook_s"] == [0.031, 0.031]
    assert level["b_under_flood"]["in_webhook_s"] == [0.088, 0.094]
    assert level["b_under_flood"]["before_webhook_s"] == [0.032, 0.087]
    assert level["ratio_p99"] == 2.97                                # 0.181 / 0.061
    assert level["target"] == {"target": "B's p99 under A's flood <= 3 x its p99 alone",
                               "value": 2.97, "met": True}
    other = {"b_alone": latencies([0.05]), "b_under_flood": latencies([0.2])}
    fairness.finish_level(other, inside, "tenant-b-s25")            # no line said: None
    assert other["b_alone"]["in_webhook_s"] == [None]
    assert other["b_alone"]["before_webhook_s"] == [None]
    assert other["target"]["met"] is False                          # 4.0


def seat_level(target: int, shares: int, seats: int | None, alone: float, busy: float,
               queue: dict | None) -> dict:
    level = {"seats_target": target, "shares": shares, "seats": seats,
             "b_alone": {"n": 50, "admitted": 50, "p50_s": 0.041, "p99_s": alone,
                         "max_s": alone},
             "b_under_flood": {"n": 50, "admitted": 50, "p50_s": 0.07, "p99_s": busy,
                               "max_s": busy},
             "a_by_status": {"201": 4, "403": 1262, "429": 54}, "a_rounds": 6,
             "apf": {"flow_schema": ["flowschemas/gpu-binder-vmi-creates"],
                     "priority_level": ["prioritylevelconfigurations/gpu-binder-vmi-creates"]},
             "apf_level_alone": None, "apf_level_under_flood": queue}
    ratio = round(busy / alone, 2)
    level["ratio_p99"] = ratio
    level["target"] = {"target": "t", "value": ratio, "met": ratio <= 3}
    return level


def test_summary_gives_one_line_per_seat_count():
    report = {
        "load_before": (0.41, 0.6, 0.85),
        "seats": [seat_level(5, 2, 5, 0.074, 0.228, {"dispatched": 1370, "rejected": 54,
                                                     "waited_mean_ms": 212.5,
                                                     "waited_p99_ms": 1000.0}),
                  seat_level(25, 11, 26, 0.07, 0.16, None)],
        "shares_restored": {"shares": 2, "seats": 5},
        "burst": {"n": 200, "at_once": 50, "admitted": 200, "share_admitted": 1.0,
                  "seconds": 4.01, "admissions_per_s": 49.8, "answers_by_status": {"201": 200},
                  "retry_after_s": {}},
        "burst_target": {"target": "all 200 of the lone tenant's burst admitted within 1.5 x "
                                   "its time before the gate (7.27 s): 10.90 s",
                         "value": 4.01, "met": True}}
    lines = fairness.summary(report)
    assert lines[0] == (
        "5 seats (shares 2, server says 5): B alone p50 0.041 s p99 0.074 s (50/50 admitted), "
        "under A's flood p50 0.070 s p99 0.228 s (50/50 admitted): ratio 3.08 NOT met; A's 6 "
        "rounds by status {'201': 4, '403': 1262, '429': 54}; the level under the flood "
        "waited mean 212.5 ms, p99 <= 1000 ms, rejected 54")
    assert lines[1] == (
        "25 seats (shares 11, server says 26): B alone p50 0.041 s p99 0.070 s (50/50 "
        "admitted), under A's flood p50 0.070 s p99 0.160 s (50/50 admitted): ratio 2.29 met; "
        "A's 6 rounds by status {'201': 4, '403': 1262, '429': 54}; the level under the flood "
        "waited mean - ms, p99 <= - ms, rejected -")
    assert lines[2] == "the level's shares restored to 2 (server says 5 seats)"
    assert lines[3] == "load average before: 0.41, 0.60, 0.85"
    assert lines[4] == ("B's creates classified by flowschemas/gpu-binder-vmi-creates at "
                        "prioritylevelconfigurations/gpu-binder-vmi-creates")
    assert lines[5].startswith("lone tenant's burst: 200/200 admitted (100%), 50 at a time, "
                               "in 4.01 s: 49.8 admissions/s")
    assert lines[6].endswith("(7.27 s): 10.90 s: 4.01 s: met")
    assert len(lines) == 7
    assert not any(line.startswith(("B alone:", "target B's")) for line in lines)
