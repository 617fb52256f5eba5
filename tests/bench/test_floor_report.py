"""`bench floor`'s pure report (bench/floor_report.py): the replicas' phase means from
/metrics deltas summed over replicas, the API Priority and Fairness counters per priority
level, the shares that give a level its seats (bench/apf.py), the ratios to the floor, the
issue's targets and the summary lines, on real exposition text and values; no timing
asserted."""

from __future__ import annotations

import math

import pytest

from bench import apf, floor, floor_report as fr

PHASE = "gpu_binder_admission_phase_seconds"


def replica(attach_sum: float, attach_n: int, total_sum: float, wait_sum: float = 0.0,
            decision: tuple[float, int] = (0.0, 0)) -> str:
    """A replica's /metrics: phase histograms of count mode (attach, wait-result, total),
    the admission and decision histograms (only _sum and _count matter here)."""
    n = attach_n
    return f"""# HELP {PHASE} seconds of each phase
# TYPE {PHASE} histogram
{PHASE}_bucket{{le="+Inf",mode="count",phase="attach"}} {n}
{PHASE}_count{{mode="count",phase="attach"}} {n}
{PHASE}_sum{{mode="count",phase="attach"}} {attach_sum}
{PHASE}_bucket{{le="+Inf",mode="count",phase="wait-result"}} {n}
{PHASE}_count{{mode="count",phase="wait-result"}} {n}
{PHASE}_sum{{mode="count",phase="wait-result"}} {wait_sum}
{PHASE}_bucket{{le="+Inf",mode="count",phase="total"}} {n}
{PHASE}_count{{mode="count",phase="total"}} {n}
{PHASE}_sum{{mode="count",phase="total"}} {total_sum}
# HELP gpu_binder_admission_seconds VMI admission latency
# TYPE gpu_binder_admission_seconds histogram
gpu_binder_admission_seconds_bucket{{le="+Inf"}} {n}
gpu_binder_admission_seconds_count {n}
gpu_binder_admission_seconds_sum {total_sum + 0.001 * n}
# HELP gpu_binder_decision_seconds binder decision latency
# TYPE gpu_binder_decision_seconds histogram
gpu_binder_decision_seconds_bucket{{le="+Inf"}} {decision[1]}
gpu_binder_decision_seconds_count {decision[1]}
gpu_binder_decision_seconds_sum {decision[0]}
"""


def test_phase_means_are_the_delta_over_both_replicas_and_name_the_webhooks_own_time():
    before = fr.added([fr.samples(replica(0.5, 10, 2.0)), fr.samples(replica(0.0, 0, 0.0))])
    # 10 more admissions: 4 on one replica, 6 on the other; the leader decided all 10
    after = fr.added([fr.samples(replica(0.5 + 0.08, 14, 2.0 + 0.4, wait_sum=0.2)),
                      fr.samples(replica(0.12, 6, 0.6, wait_sum=0.3, decision=(0.05, 10)))])
    d = fr.delta(before, after)
    got = fr.phase_means(d)
    assert got["count"]["attach"] == {"n": 10, "mean_ms": 20.0}
    assert got["count"]["wait-result"] == {"n": 10, "mean_ms": 50.0}
    assert got["count"]["total"] == {"n": 10, "mean_ms": 100.0}
    assert got["count"]["own"] == {"n": 10, "mean_ms": 30.0}    # 100 - 20 - 50
    assert fr.replica_means(d) == {"webhook_mean_ms": 101.0, "decision_mean_ms": 5.0,
                                   "decisions": 10}


def test_per_admission_ms_weighs_a_phase_met_in_some_reviews_and_sums_to_the_total():
    """A take-over met in 2 of 10 reviews (mean 15 ms when met) adds 3 ms to the average
    review; the phases and "own" then sum to "total"."""
    phases = {"attach": {"n": 10, "mean_ms": 20.0}, "take-over": {"n": 2, "mean_ms": 15.0},
              "total": {"n": 10, "mean_ms": 100.0}, "own": {"n": 10, "mean_ms": 77.0}}
    got = fr.per_admission_ms(phases)
    assert got == {"attach": 20.0, "take-over": 3.0, "total": 100.0, "own": 77.0}
    assert got["attach"] + got["take-over"] + got["own"] == got["total"]
    assert fr.per_admission_ms({"attach": {"n": 3, "mean_ms": 1.0}}) == {}   # no total
    assert fr.per_admission_ms({}) == {}


def test_no_admission_between_readings_gives_no_phase_and_no_mean():
    text = fr.samples(replica(0.5, 10, 2.0))
    d = fr.delta(text, text)
    assert fr.phase_means(d) == {}
    assert fr.replica_means(d) == {"webhook_mean_ms": None, "decision_mean_ms": None,
                                   "decisions": 0}


WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"


def apiserver(dispatched: int, rejected: int, waits: dict[float, int], wait_sum: float,
              sa: int) -> str:
    """kube-apiserver's flow-control samples: our VMI-create level (queued waits as
    cumulative buckets) and the ServiceAccounts' level, which never waited."""
    labels = 'flow_schema="gpu-binder-vmi-creates",priority_level="gpu-binder-vmi-creates"'
    lines = [f"# TYPE apiserver_flowcontrol_dispatched_requests_total counter",
             f"apiserver_flowcontrol_dispatched_requests_total{{{labels}}} {dispatched}",
             'apiserver_flowcontrol_dispatched_requests_total{flow_schema="service-accounts",'
             f'priority_level="workload-low"}} {sa}',
             f"# TYPE apiserver_flowcontrol_rejected_requests_total counter",
             f'apiserver_flowcontrol_rejected_requests_total{{{labels},reason="queue-full"}} '
             f"{rejected}",
             f"# TYPE {WAIT} histogram"]
    total = 0
    for le in (0.005, 0.02, 0.05, 0.1, 0.2):
        total += waits.get(le, 0)
        lines.append(f'{WAIT}_bucket{{execute="true",{labels},le="{le}"}} {total}')
    lines += [f'{WAIT}_bucket{{execute="true",{labels},le="+Inf"}} {total}',
              f'{WAIT}_sum{{execute="true",{labels}}} {wait_sum}',
              f'{WAIT}_count{{execute="true",{labels}}} {total}',
              "# TYPE apiserver_flowcontrol_nominal_limit_seats gauge",
              'apiserver_flowcontrol_nominal_limit_seats{priority_level="gpu-binder-vmi-creates"} 5']
    return "\n".join(lines) + "\n"


def test_apf_counters_per_priority_level_between_two_readings():
    before = fr.samples(apiserver(100, 0, {0.005: 100}, 0.1, 5000))
    # 200 more creates: 100 waited under 5 ms, 80 under 50 ms, 20 under 200 ms; 3 rejected
    after = fr.samples(apiserver(300, 3, {0.005: 200, 0.05: 80, 0.2: 20}, 0.1 + 4.0, 5900))
    got = fr.apf(fr.delta(before, after))
    assert got == {
        "gpu-binder-vmi-creates": {"dispatched": 200, "rejected": 3, "waited_mean_ms": 20.0,
                                   "waited_p99_ms": 200.0},
        "workload-low": {"dispatched": 900, "rejected": 0, "waited_mean_ms": None,
                         "waited_p99_ms": None}}
    assert fr.seats_of("gpu-binder-vmi-creates", after) == 5
    assert fr.seats_of("workload-low", after) is None


def test_bucket_quantile_is_the_bound_of_the_bucket_holding_it():
    buckets = [(0.1, 50.0), (0.05, 10.0), (math.inf, 100.0), (1.0, 99.0)]
    assert fr.bucket_quantile(buckets, 0.5) == 0.1
    assert fr.bucket_quantile(buckets, 0.99) == 1.0
    assert fr.bucket_quantile(buckets, 1.0) == math.inf
    assert fr.bucket_quantile([(math.inf, 0.0)], 0.5) is None


@pytest.mark.parametrize("seats, shares", [(5, 2), (12, 5), (25, 11), (1, 1)])
def test_the_shares_that_give_a_level_its_seats(seats, shares):
    # 245: the built-in Limited levels' shares (the shipped level's comment: 2 shares -> 5)
    got = apf.shares_for(seats, 245)
    assert got == shares
    assert math.ceil(600 * got / (245 + got)) >= seats           # enough seats ...
    assert got == 1 or math.ceil(600 * (got - 1) / (244 + got)) < seats  # ... and the fewest shares
    with pytest.raises(ValueError):
        apf.shares_for(600, 245)


def test_latency_and_the_ratios_to_the_floor():
    assert fr.latency([0.05, 0.04, 0.06, 0.2]) == {"n": 4, "p50_ms": 50.0, "p99_ms": 200.0,
                                                   "mean_ms": 87.5}
    assert fr.latency([])["p50_ms"] is None
    row = {"floor": {"p50_ms": 40.0, "p99_ms": 80.0}, "quiet": {"p50_ms": 100.0, "p99_ms": 300.0},
           "busy": {"p50_ms": 400.0, "p99_ms": None}}
    assert fr.ratios(row) == {"quiet_p50": 2.5, "quiet_p99": 3.75, "busy_p50": 10.0,
                              "busy_p99": None}
    assert fr.step_means([{"attach": 0.01, "watch-1": 0.003}, {"attach": 0.03}]) == \
        {"attach": 20.0, "watch-1": 1.5}


def test_targets_of_the_issue_per_mode_and_size():
    rows = [{"mode": "count", "gpus": 1, "ratio": {"quiet_p50": 1.4, "quiet_p99": 3.2}},
            {"mode": "device", "gpus": 8, "ratio": {"quiet_p50": None, "quiet_p99": 2.0}},
            {"mode": "count", "gpus": 2, "ratio": {"quiet_p50": 9.0, "quiet_p99": 9.0}}]
    assert fr.targets(rows) == {
        "count_1gpu_quiet_p50": {"target": "<= 1.5", "value": 1.4, "met": True},
        "count_1gpu_quiet_p99": {"target": "<= 3.0", "value": 3.2, "met": False},
        "device_8gpu_quiet_p50": {"target": "<= 2.0", "value": None, "met": None}}


def test_summary_lines_name_the_largest_phases_the_seats_and_the_load():
    row = {"mode": "device", "gpus": 4,
           "floor": {"p50_ms": 40.0, "p99_ms": 60.0}, "quiet": {"p50_ms": 120.0, "p99_ms": 200.0},
           "busy": {"p50_ms": 300.0, "p99_ms": 500.0, "admissions_per_s": 41.5},
           "ratio": {"quiet_p50": 3.0, "quiet_p99": 3.33},
           "quiet_inside": {"phases": {"device": {
               "total": {"n": 8, "mean_ms": 118.0}, "wait-result": {"n": 8, "mean_ms": 60.0},
               "attach": {"n": 8, "mean_ms": 25.0}, "claim": {"n": 8, "mean_ms": 12.0},
               "own": {"n": 8, "mean_ms": 3.0}, "live-read": {"n": 8, "mean_ms": 4.0}}}}}
    seat = {"mode": "count", "seats_target": 12, "shares": 5, "seats": 12, "p50_ms": 90.0,
            "p99_ms": 150.5, "admissions_per_s": 120.0, "apf_waited_mean_ms": 0.4}
    lines = fr.summary_lines({"rows": [row], "seats": [seat], "load_before": (0.5, 0.7, 0.9),
                              "load_after": (1.25, 0.8, 0.9)})
    assert lines == [
        "device 4-GPU: floor p50 40 p99 60 ms; ours quiet p50 120 p99 200 ms (x3, x3.33); "
        "at 20 p50 300 p99 500 ms 41.5/s; quiet phases wait-result 60, attach 25, claim 12, "
        "live-read 4 ms",
        "count 1-GPU at 20, 12 seats (shares 5, server says 12): p50 90 p99 150.5 ms, "
        "120 admissions/s, VMI-create level waited mean 0.4 ms",
        "load (1, 5, 15 min) before 0.50 0.70 0.90, after 1.25 0.80 0.90"]


def test_the_fleet_holds_every_vmi_the_run_admits():
    plan = floor._plan(quick=True)
    need = floor.WARM + sum(g * (plan["quiet"] + plan["busy"]) for g in floor.SIZES) + 3 * plan["seats"]
    nodes = floor.nodes_needed(plan, floor.SIZES, (5, 12, 25))
    assert nodes * 8 >= need * 1.25
    assert floor.nodes_needed(plan, floor.SIZES, ()) < nodes
