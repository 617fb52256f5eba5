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


# -- the split of wait-result from the replicas' logs -------------------------------------------

T0 = 1_796_000_000.0   # wall seconds (epoch) of the webhook's attach returned, first VMI
NS = floor.OURS


def admitted_line(vmi: str, rid: str, attached: float, result: float, wait_s: float | None) -> dict:
    """The webhook's "VMI admitted" line, as k8s/webhook/admission.py writes it."""
    line = {"node": "floor-node-1", "request_id": rid, "devices": [f"{vmi}-gpu-0"],
            "webhook_seconds": 0.03, "attached_at": attached, "result_at": result,
            "event": "VMI admitted", "namespace": NS, "vmi": vmi, "level": "info",
            "timestamp": "2026-12-07T14:40:00.000000Z"}
    if wait_s is not None:
        line["wait_result_s"] = wait_s
    return line


def leader_lines(rid: str, seen: float | None, batch: float, flown: float, finished: float,
                 outcome: str = "done") -> list[dict]:
    """The leader's "decision" and "writes_finished" lines of request `rid`, as the
    coordinator and status pipeline write them."""
    return [{"request_id": rid, "namespace": NS, "vmi": "x", "rule": "B1", "result": "Succeeded",
             "chosen": "floor-node-1", "candidates": ["floor-node-1"], "seen_at": seen,
             "batch_at": batch, "event": "decision", "actor": "coordinator", "level": "info"},
            {"request_id": rid, "namespace": NS, "outcome": outcome, "result": "Succeeded",
             "chosen": "floor-node-1", "seconds": finished - flown, "flown_at": flown,
             "finished_at": finished, "event": "writes_finished", "actor": "status_pipeline",
             "level": "info"}]


def at(ms: float, base: float = T0) -> float:
    return base + ms / 1000


def test_wait_result_is_split_by_the_leaders_instants_whichever_replica_answered():
    """VMI q-0 answered by the leader itself, q-1 by the follower; the leader decided both.
    q-0: 4 ms to the leader, 2 queued, 1.5 deciding, 10 writing, 2.5 back, and its phase
    0.5 ms longer than the instants cover; q-1 (10 s later): its watch reached the leader 1 ms
    before the webhook's patch answer did (-1 ms), then 3, 2.5, 12, 4.5, 0."""
    t1 = T0 + 10
    leader = [admitted_line("q-0", "r0", at(0), at(20), 0.0205),
              *leader_lines("r0", at(4), at(6), at(7.5), at(17.5)),
              *leader_lines("r1", at(-1, t1), at(2, t1), at(4.5, t1), at(16.5, t1))]
    follower = [admitted_line("q-1", "r1", at(0, t1), at(21, t1), 0.021)]
    got = fr.wait_split({"replica-0": leader, "replica-1": follower}, NS, ["q-0", "q-1"])
    assert got["admissions"] == 2 and got["joined"] == 2 and got["unjoined"] == {}
    assert got["wait_result"] == {"mean_ms": 20.75, "p50_ms": 20.5}
    assert got["parts"] == {
        "to_leader": {"mean_ms": 1.5, "p50_ms": -1.0},
        "queue": {"mean_ms": 2.5, "p50_ms": 2.0},
        "decision": {"mean_ms": 2.0, "p50_ms": 1.5},
        "status_write": {"mean_ms": 11.0, "p50_ms": 10.0},
        "back": {"mean_ms": 3.5, "p50_ms": 2.5},
        "unexplained": {"mean_ms": 0.25, "p50_ms": 0.0}}
    total = sum(p["mean_ms"] for p in got["parts"].values())
    assert abs(total - got["wait_result"]["mean_ms"]) <= 0.01 * len(fr.WAIT_PARTS)


def test_admissions_whose_lines_are_missing_are_counted_unjoined_by_reason():
    r0 = [admitted_line("ok", "r-ok", at(0), at(20), 0.02),
          *leader_lines("r-ok", at(4), at(6), at(8), at(18)),
          admitted_line("old", "r-old", at(0), at(20), None),          # an older replica
          admitted_line("undecided", "r-und", at(0), at(20), 0.02),    # its leader's log lost
          admitted_line("moved", "r-mv", at(0), at(20), 0.02),
          leader_lines("r-mv", at(4), at(6), at(8), at(18))[0],         # decided here ...
          admitted_line("resync", "r-rs", at(0), at(20), 0.02),
          *leader_lines("r-rs", None, at(6), at(8), at(18)),            # queued by a resync
          admitted_line("withdrawn", "r-wd", at(0), at(20), 0.02),
          *leader_lines("r-wd", at(4), at(6), at(8), at(18), outcome="withdrawn")]
    r1 = [leader_lines("r-mv", at(4), at(6), at(8), at(18))[1]]         # ... written there
    vmis = ["ok", "old", "undecided", "moved", "resync", "withdrawn", "rotated"]
    got = fr.wait_split({"replica-0": r0, "replica-1": r1}, NS, vmis)
    assert got["admissions"] == 7 and got["joined"] == 1
    assert got["unjoined"] == {"no_webhook_line": 1, "no_webhook_instants": 1,
                               "no_decision_line": 1, "leader_changed": 1, "not_seen": 1,
                               "no_writes_line": 1}
    assert got["joined"] + sum(got["unjoined"].values()) == got["admissions"]
    assert got["parts"]["status_write"] == {"mean_ms": 10.0, "p50_ms": 10.0}
    # another namespace's VMI of the same name is not ours
    other = {**admitted_line("ok", "r-ok", at(0), at(20), 0.02), "namespace": "elsewhere"}
    assert fr.wait_split({"replica-0": [other]}, NS, ["ok"])["unjoined"] == {"no_webhook_line": 1}


def test_nothing_joined_gives_no_figures():
    got = fr.wait_split({}, NS, [])
    assert got == {"admissions": 0, "joined": 0, "unjoined": {},
                   "wait_result": {"mean_ms": None, "p50_ms": None},
                   "parts": {p: {"mean_ms": None, "p50_ms": None} for p in fr.WAIT_PARTS}}


def test_log_entries_keeps_the_joined_events_of_a_replicas_stdout():
    """A replica's stdout as LocalCluster records it: JSON lines of every event, and now and
    then a line that is not JSON (a traceback's, Python's warnings)."""
    text = "\n".join([
        '{"identity":"replica-0","event":"starting","level":"info","timestamp":"2026-12-07T14:40:00Z"}',
        '{"request_id":"r0","outcome":"done","result":"Succeeded","chosen":"n1","seconds":0.01,'
        '"flown_at":1796000000.0075,"finished_at":1796000000.0175,"event":"writes_finished",'
        '"actor":"status_pipeline","level":"info","timestamp":"2026-12-07T14:40:00.017500Z"}',
        'Traceback (most recent call last): "decision" in a message',
        '{"node":"n1","request_id":"r0","outcome":"reserved","event":"prepare","level":"info"}',
        '{"request_id":"r0","seen_at":1796000000.004,"batch_at":1796000000.006,"event":"decision",'
        '"level":"info"}',
        ""])
    got = fr.log_entries(text)
    assert [e["event"] for e in got] == ["writes_finished", "decision"]
    assert got[1]["seen_at"] == 1796000000.004


def test_the_summary_line_gives_the_quiet_split_when_the_row_has_one():
    row = {"mode": "count", "gpus": 1,
           "floor": {"p50_ms": 20.0, "p99_ms": 40.0}, "quiet": {"p50_ms": 30.0, "p99_ms": 60.0},
           "busy": {}, "ratio": {"quiet_p50": 1.5, "quiet_p99": 1.5},
           "quiet_inside": {"phases": {"count": {"wait-result": {"n": 2, "mean_ms": 20.75}}}},
           "quiet_wait_split": {"admissions": 3, "joined": 2, "unjoined": {"not_seen": 1},
                                "wait_result": {"mean_ms": 20.75, "p50_ms": 20.5},
                                "parts": {"to_leader": {"mean_ms": 1.5}, "queue": {"mean_ms": 2.5},
                                          "decision": {"mean_ms": 2.0},
                                          "status_write": {"mean_ms": 11.0},
                                          "back": {"mean_ms": 3.5},
                                          "unexplained": {"mean_ms": 0.25}}}}
    (line,) = fr.summary_lines({"rows": [row]})
    assert line.endswith(
        "quiet phases wait-result 20.75 ms; wait-result 20.75 ms mean = to leader 1.5, "
        "queue 2.5, decision 2, write 11, back 3.5, unexplained 0.25 ms (2 of 3 joined, "
        "1 unjoined)")


def test_bench_floor_reads_every_replicas_log_file(tmp_path):
    """`bench.floor._wait_split` on LocalCluster's replicas (their stdout files): the
    follower's webhook line joins the leader's; a replica whose file is gone adds nothing."""
    import json
    from types import SimpleNamespace

    def replica(name: str, entries: list[dict]) -> SimpleNamespace:
        path = tmp_path / f"{name}.log"
        path.write_text("not json\n" + "".join(json.dumps(e) + "\n" for e in entries))
        return SimpleNamespace(identity=name, log_path=path)
    lc = SimpleNamespace(replicas=[
        replica("replica-0", leader_lines("r0", at(4), at(6), at(7.5), at(17.5))),
        replica("replica-1", [admitted_line("q-0", "r0", at(0), at(20), 0.0205)]),
        SimpleNamespace(identity="replica-2", log_path=tmp_path / "gone.log")])
    got = floor._wait_split(lc, ["q-0"])
    assert (got["joined"], got["unjoined"]) == (1, {})
    assert got["parts"]["status_write"] == {"mean_ms": 10.0, "p50_ms": 10.0}
