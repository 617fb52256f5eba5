"""bench.soak's pure parts, without a cluster: the seeded schedule (disturbances first, a
steady stretch after) and the RSS-trend judgement over the steady stretch."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from bench.soak import (RSS_SLOPE_MAX_MIB_PER_MIN, RSS_TARGET_MIB, SoakSpec, rss_trend,
                        schedule, schedule_digest, summary, targets)

DISTURBANCES = ("kill-leader", "restart-apiserver")


def test_same_seed_same_schedule_and_another_seed_another():
    spec = SoakSpec(nodes=30, minutes=2, seed=5, live=40, create_rate=2)
    a, b = schedule(spec), schedule(spec)
    assert a == b and schedule_digest(a) == schedule_digest(b)
    assert schedule_digest(schedule(SoakSpec(nodes=30, minutes=2, seed=6, live=40,
                                             create_rate=2))) != schedule_digest(a)
    assert [o.at for o in a] == sorted(o.at for o in a)
    kinds = [o.kind for o in a]
    # 120 s: steady from 66 s, disturbances before 48 s: no kill (every 150 s), the restart
    assert kinds.count("kill-leader") == 0 and kinds.count("restart-apiserver") == 1
    # own population: deletes start once the steady number of VMIs has been created
    first_delete = kinds.index("delete")
    assert kinds[:first_delete].count("create") == 40


def test_the_bench_schedule_disturbs_first_then_churns_steadily():
    spec = SoakSpec(nodes=1000, minutes=20, seed=1, population="scale")
    ops = schedule(spec)
    assert (spec.steady_from, spec.disturb_until) == (660.0, 570.0)
    assert 1 - spec.steady_from / spec.seconds >= 0.4
    kills = [o.at for o in ops if o.kind == "kill-leader"]
    restarts = [o.at for o in ops if o.kind == "restart-apiserver"]
    assert kills == [150.0, 300.0, 450.0] and restarts == [360.0]
    steady = [o for o in ops if o.at >= spec.steady_from]
    assert not [o for o in steady if o.kind in DISTURBANCES]
    kinds = {o.kind for o in steady}
    assert {"create", "delete", "cordon", "uncordon"} <= kinds
    # the population is running before the churn: every create is preceded by a delete
    creates = [o for o in ops if o.kind == "create"]
    assert len([o for o in ops if o.kind == "delete"]) == len(creates) > 2000
    assert {o.cls for o in creates} == {0, 1}            # both GPU models
    assert not {o.node for o in ops if o.kind == "cordon"} & spec.avoided_nodes()
    assert len(spec.avoided_nodes()) == 30
    assert spec.budget("h100.scale.example.com/gpu") == 600   # 15 % of the model's 4,000
    assert schedule_digest(schedule(spec)) == schedule_digest(ops)


def test_a_schedule_whose_disturbances_do_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        schedule(SoakSpec(nodes=30, minutes=2, restart_at=0.5))
    with pytest.raises(ValueError, match="no room"):
        schedule(SoakSpec(nodes=30, minutes=2, steady_share=0.9, recover=30))


def _series(replica, pid, t0, t1, level, slope_per_min, noise, seed=0, every=10.0):
    """RSS samples every `every` s over [t0, t1]: a line plus seeded Gaussian noise plus a
    GC-like sawtooth of 3 MiB."""
    rng = random.Random(seed)
    out, t = [], t0
    while t <= t1:
        saw = 3.0 * ((t / every) % 7) / 7
        out.append((t, replica, pid, level + slope_per_min * (t - t0) / 60 + saw
                    + rng.gauss(0, noise)))
        t += every
    return out


def test_a_flat_series_over_the_steady_stretch_passes():
    samples = _series(0, 11, 0, 1200, 250, 0.0, 1.5, seed=1)
    got = rss_trend(samples, 660, 1200)
    (p,) = got["processes"]
    assert p["verdict"] == "flat" and got["verdict"] == "flat"
    lo, hi = p["ci95_mib_per_min"]
    assert lo <= 0.0 <= hi and hi <= RSS_SLOPE_MAX_MIB_PER_MIN
    assert p["samples"] == 55 and p["span_s"] == 540
    assert p["hours_to_target"] is None
    assert got["peak_mib"] == round(max(m for *_, m in samples), 1)


def test_a_growing_series_fails_and_says_when_it_reaches_the_target():
    samples = _series(0, 11, 0, 1200, 200, 1.0, 1.5, seed=2)
    got = rss_trend(samples, 660, 1200)
    (p,) = got["processes"]
    assert p["verdict"] == "growing" and got["verdict"] == "growing"
    lo, hi = p["ci95_mib_per_min"]
    assert lo <= 1.0 <= hi and hi - lo < 0.4          # the true slope, within ± 2 SE
    assert lo > RSS_SLOPE_MAX_MIB_PER_MIN
    # at the stretch's end ~220 MiB + 1.5 MiB sawtooth mean; 300 MiB ~80 min later
    assert 1.0 < p["hours_to_target"] < 1.6


def test_growth_just_over_the_threshold_is_growing_and_noise_is_inconclusive():
    slow = rss_trend(_series(0, 1, 0, 1200, 200, 0.5, 0.5, seed=3), 660, 1200)
    assert slow["verdict"] == "growing"
    noisy = rss_trend(_series(0, 1, 0, 1200, 200, 0.2, 15, seed=4), 660, 1200)
    assert noisy["verdict"] == "inconclusive", noisy["processes"]


def test_only_processes_alive_through_the_stretch_are_judged():
    flat = _series(1, 20, 0, 1200, 240, 0.0, 1.0, seed=5)
    killed = _series(0, 21, 0, 800, 100, 5.0, 1.0, seed=6)        # gone mid-stretch
    restarted = _series(0, 22, 820, 1200, 150, 5.0, 1.0, seed=7)  # started in it
    got = rss_trend(flat + killed + restarted, 660, 1200)
    assert [(p["replica"], p["pid"]) for p in got["processes"]] == [(1, 20)]
    assert {x["pid"]: x["why"] for x in got["excluded"]} == {
        21: "gone before the stretch ended", 22: "started after the stretch began"}
    assert got["verdict"] == "flat"
    # a growing process anywhere makes the run's verdict "growing"
    grows = _series(0, 23, 0, 1200, 100, 2.0, 1.0, seed=8)
    assert rss_trend(flat + grows, 660, 1200)["verdict"] == "growing"


# Issue 41 item 5: the 60-minute device soak's stretch (1,260-3,600 s, the restart at
# 1,080 s), 2,000 live VMIs deleted at 2 a second: a warm-up of 1,000 s.
WARM = {"live": 2000, "deletes_per_s": 2.0}


def _turnover(replica, pid, t0, t1, rise_until, slope_after=0.0, seed=0):
    """RSS every 10 s over [t0, t1]: 1 MiB/min until `rise_until` s (a heap turning over its
    listed objects), `slope_after` MiB/min after it, a 3 MiB sawtooth and seeded noise."""
    rng = random.Random(seed)
    return [(t, replica, pid, 200 + min(t, rise_until) / 60 + slope_after
             * max(0, t - rise_until) / 60 + 3.0 * ((t / 10) % 7) / 7 + rng.gauss(0, 0.5))
            for t in range(t0, t1 + 1, 10)]


def test_the_warm_up_begins_at_the_first_sample_or_the_latest_api_restart_after_it():
    from bench.soak import warmup_window
    from k8s.cache import TOMBSTONE_TTL

    assert warmup_window(0.0, **WARM) == {"from_s": 0.0, "until_s": 1000.0, "length_s": 1000.0}
    assert warmup_window(0.0, restarts_s=[360.0, 1080.0], **WARM)["from_s"] == 1080.0
    assert warmup_window(1100.0, restarts_s=[1080.0], **WARM)["until_s"] == 2100.0
    # a small population turns over faster than its tombstones expire: the TTL is the floor
    assert warmup_window(50.0, live=100, deletes_per_s=2.0)["length_s"] == TOMBSTONE_TTL
    assert warmup_window(50.0)["until_s"] == 50.0 + TOMBSTONE_TTL     # rate unknown


def test_a_replica_growing_in_its_warm_up_then_flat_is_judged_flat():
    """The 60-minute soak's replicas: growing until the churn has replaced what they listed
    after the restart (1,080 + 1,000 s), flat after; the whole stretch says "growing"."""
    rss = _turnover(0, 31, 0, 3600, rise_until=2080, seed=1)
    got = rss_trend(rss, 1260, 3600, restarts_s=[1080.0], **WARM)
    (p,) = got["processes"]
    assert p["warmup"] == {"from_s": 1080.0, "until_s": 2080.0, "length_s": 1000.0}
    assert p["from_s"] == 2080 and p["samples"] == 153
    assert p["verdict"] == "flat" and got["verdict"] == "flat" and got["not_judged"] is None
    assert abs(p["slope_mib_per_min"]) < 0.05
    assert p["whole_stretch"]["from_s"] == 1260 and p["whole_stretch"]["verdict"] == "growing"
    assert got["whole_stretch_verdict"] == "growing"
    t = targets({"violations": 0, "admissions_lost": 0, "rss_trend": got,
                 "rss_peak_mib": got["peak_mib"]})["rss_flat"]
    assert t["met"] is True and list(t["value"]) == ["replica-0 pid 31"]
    assert t["value"]["replica-0 pid 31"].endswith("over 2080-3600 s")


def test_a_replica_growing_after_its_warm_up_is_judged_growing():
    rss = _turnover(0, 32, 0, 3600, rise_until=2080, slope_after=0.5, seed=2)
    got = rss_trend(rss, 1260, 3600, restarts_s=[1080.0], **WARM)
    (p,) = got["processes"]
    assert p["verdict"] == "growing" and got["verdict"] == "growing"
    assert abs(p["slope_mib_per_min"] - 0.5) < 0.05
    assert targets({"violations": 0, "admissions_lost": 0, "rss_trend": got,
                    "rss_peak_mib": got["peak_mib"]})["rss_flat"]["met"] is False


def test_a_replica_too_young_at_the_stretch_end_is_excluded_with_why():
    """The 20-minute soak: the restart at 360 s puts every replica's warm-up end at 1,360 s,
    past the stretch (660-1,200 s): none judged, the target neither met nor missed."""
    old = _turnover(0, 33, 0, 1200, rise_until=1200, seed=3)
    young = _turnover(1, 34, 460, 1200, rise_until=1200, seed=4)
    got = rss_trend(old + young, 660, 1200, restarts_s=[360.0], **WARM)
    assert got["processes"] == [] and got["verdict"] is None
    assert {x["pid"]: x["why"] for x in got["excluded"]} == {
        33: "warming up until 1360 s (first turnover of its listed VMIs)",
        34: "warming up until 1460 s (first turnover of its listed VMIs)"}
    assert all(x["whole_stretch"]["verdict"] == "growing" for x in got["excluded"])
    assert got["whole_stretch_verdict"] == "growing"
    assert got["not_judged"] == "no process past its warm-up for 300 s of the stretch"
    t = targets({"violations": 0, "admissions_lost": 0, "rss_trend": got,
                 "rss_peak_mib": got["peak_mib"]})["rss_flat"]
    assert t["met"] is None and t["value"] == got["not_judged"]
    # without the restart the old replica's warm-up ends at 1,000 s: 200 s of the stretch,
    # too short to judge
    assert rss_trend(old, 660, 1200, **WARM)["processes"] == []
    # with a 600-s warm-up (a small population), 600-1,200 s: judged
    (p,) = rss_trend(old, 660, 1200, live=100, deletes_per_s=2.0)["processes"]
    assert p["from_s"] == 660 and p["verdict"] == "growing"


def test_the_api_restart_moves_the_warm_up():
    rss = _turnover(0, 35, 0, 3600, rise_until=1000, seed=5)
    (p,) = rss_trend(rss, 1260, 3600, **WARM)["processes"]
    assert p["warmup"]["until_s"] == 1000 and p["from_s"] == 1260
    (q,) = rss_trend(rss, 1260, 3600, restarts_s=[1080.0], **WARM)["processes"]
    assert q["warmup"]["until_s"] == 2080 and q["from_s"] == 2080
    # a restart after the stretch ends does not count
    (r,) = rss_trend(rss, 1260, 3600, restarts_s=[3700.0], **WARM)["processes"]
    assert r["warmup"]["from_s"] == 0


def test_with_tracemalloc_rss_is_not_judged():
    from bench.soak import judge_inputs

    rss = _turnover(0, 36, 0, 3600, rise_until=2080, seed=6)
    got = rss_trend(rss, 1260, 3600, restarts_s=[1080.0], tracemalloc=True, **WARM)
    assert got["processes"] == [] and got["verdict"] is None
    assert "tracemalloc" in got["not_judged"]
    (x,) = got["excluded"]
    assert x["why"] == got["not_judged"] and x["whole_stretch"]["verdict"] == "growing"
    both = targets({"violations": 0, "admissions_lost": 0, "rss_trend": got,
                    "rss_peak_mib": 735.3})
    t = both["rss_flat"]
    assert t["met"] is None and "tracemalloc" in t["value"]
    # nor the peak: tracemalloc's tables are part of it (735.3 MiB in such a run)
    assert both["rss_peak"]["met"] is None and both["rss_peak"]["value"].startswith("735.3 MiB, ")
    # a report from before spec.tracemalloc: inferred from its heap reports' traced figures
    old = {"spec": {"rss_every": 10.0}, "events": [{"at": 360.0, "kind": "restart-apiserver"}],
           "steady": {"from_s": 660.0, "to_s": 1200.0, "live_max": 2064,
                      "operations": {"delete": 1070}},
           "heap_over_steady": [{"replica": 0, "traced_mib": [50.0, 55.0]}]}
    got = judge_inputs(old)
    assert got["tracemalloc"] is True and got["restarts_s"] == [360.0]
    assert got["live"] == 2064 and abs(got["deletes_per_s"] - 1070 / 540) < 1e-9
    assert got["missing"] == ["spec.tracemalloc (inferred from the heap reports: tracemalloc "
                              "snapshots)"]
    assert judge_inputs({**old, "spec": {"tracemalloc": False}})["tracemalloc"] is False


def test_rejudge_rewrites_a_saved_report_and_says_what_it_lacked(tmp_path, capsys):
    from bench.soak.report import main

    rss = _turnover(0, 37, 0, 3600, rise_until=2080, seed=7)
    saved = {"spec": {"rss_every": 10.0, "tracemalloc": False},
             "events": [{"at": 1080.0, "kind": "restart-apiserver", "outage_s": 20.0}],
             "steady": {"from_s": 1260.0, "to_s": 3600.0, "live_max": 2340,
                        "operations": {"delete": 4680}},   # 2 a second: 1,170 s
             "violations": 0, "admissions_lost": 0, "rss_samples": [list(x) for x in rss],
             "rss_trend": {"verdict": "growing"}, "rss_peak_mib": 1.0}
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(saved))
    assert main(["--rejudge", str(path)]) == 0
    out = capsys.readouterr().out
    assert "replica-0 pid 37" in out and "over 2250-3600 s (flat" in out
    assert "missing: heap_parts_samples (no heap_parts_trend)" in out
    assert "target rss_flat:" in out and out.rstrip().endswith("(no heap_parts_trend)")
    assert json.loads(path.read_text())["rss_trend"] == {"verdict": "growing"}   # no --write
    assert main(["--rejudge", str(path), "--write"]) == 0
    back = json.loads(path.read_text())
    assert back["rss_trend"]["verdict"] == "flat" and back["targets"]["rss_flat"]["met"] is True
    assert back["rss_peak_mib"] == back["rss_trend"]["peak_mib"]
    assert back["rss_rejudged"]["missing"] == ["heap_parts_samples (no heap_parts_trend)"]
    (tmp_path / "bad.json").write_text("{}")
    assert main(["--rejudge", str(tmp_path / "bad.json")]) == 2


@pytest.mark.parametrize("text, why", [
    ("[1]", "cannot re-judge: ValueError: not a soak report: the file holds a JSON list, "
            "not an object"),
    ("nope", "cannot re-judge: not JSON: Expecting value (line 1, column 1)"),
    ("{}", "cannot re-judge: KeyError: no steady stretch (steady or rss_trend from_s/to_s)"),
    (None, "cannot re-judge: No such file or directory"),
])
def test_rejudge_refuses_what_is_not_a_soak_report_in_one_line_on_stderr(tmp_path, capsys,
                                                                         text, why):
    from bench.soak.report import main

    path = tmp_path / "x.json"
    if text is not None:
        path.write_text(text)
    assert main(["--rejudge", str(path)]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err == f"{path}: {why}\n"


def test_rejudge_runs_as_a_module_without_a_warning(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "x.json"
    path.write_text("[]")
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m",
                           "bench.soak.rejudge", "--rejudge", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"{path}: cannot re-judge: ValueError: not a soak report: the file "
                           "holds a JSON list, not an object\n")


@pytest.mark.parametrize("minutes, share", [(61.0, 0.45), (float("nan"), 0.45), (40, 0.9),
                                            (40, 0.1), (40, float("nan"))])
def test_a_run_longer_than_an_hour_or_a_steady_share_out_of_range_is_refused(minutes, share,
                                                                              tmp_path):
    from bench.soak import run

    with pytest.raises(ValueError, match=r"--minutes is in \(0, 60\]|--steady-share is in"):
        run(tmp_path / "out", nodes=30, minutes=minutes, steady_share=share)
    assert not (tmp_path / "out").exists()


def test_a_long_run_with_a_long_steady_stretch_fits_its_disturbances_before_it():
    """The schedule the lead's 36-minute soak uses: 5 kills and the restart before the
    stretch, 21.6 minutes of it."""
    spec = SoakSpec(nodes=1000, minutes=36, seed=1, population="scale", steady_share=0.6)
    ops = schedule(spec)
    kills = [o.at for o in ops if o.kind == "kill-leader"]
    (restart,) = [o.at for o in ops if o.kind == "restart-apiserver"]
    assert kills == [150, 300, 450, 600, 750] and restart == 648
    assert spec.steady_from == 864 and spec.disturb_until == 774


def test_no_process_through_the_stretch_gives_no_verdict_and_the_target_is_not_met_or_missed():
    got = rss_trend(_series(0, 30, 0, 40, 90, 0.0, 1.0), 45, 75)
    assert got["processes"] == [] and got["verdict"] is None
    report = {"violations": 0, "admissions_lost": 0, "rss_trend": got,
              "rss_peak_mib": got["peak_mib"]}
    t = targets(report)
    assert t["rss_flat"]["met"] is None and t["violations"]["met"] is True
    assert t["rss_peak"]["met"] is (got["peak_mib"] < RSS_TARGET_MIB)


def test_cache_change_takes_each_process_first_and_last_sample_in_the_stretch():
    from bench.soak import cache_change

    samples = [(90.0, 0, 7, {"pods": 1}), (100.0, 0, 7, {"pods": 2}), (150.0, 0, 7, {"pods": 5}),
               (200.0, 0, 7, {"pods": 6}), (210.0, 0, 7, {"pods": 9}),
               (120.0, 1, 8, {"pods": 40}),            # sampled once in the stretch
               (130.0, 1, 9, {"pods": 3}), (140.0, 1, 9, {"pods": 4})]
    assert cache_change(samples, 100.0, 200.0) == [
        {"replica": 0, "pid": 7, "first_s": 100.0, "last_s": 200.0, "first": {"pods": 2},
         "last": {"pods": 6}},
        {"replica": 1, "pid": 9, "first_s": 130.0, "last_s": 140.0, "first": {"pods": 3},
         "last": {"pods": 4}}]


def test_heap_change_pairs_each_judged_process_first_and_last_report(tmp_path):
    import json
    import tracemalloc

    from bench.soak import heap_change, heap_reports

    tracemalloc.start()
    try:
        a = tracemalloc.take_snapshot()
        a.dump(str(tmp_path / "a.snap"))
        grown = [bytearray(1024) for _ in range(512)]
        b = tracemalloc.take_snapshot()
        b.dump(str(tmp_path / "b.snap"))
    finally:
        tracemalloc.stop()
    log0 = tmp_path / "controller-0.log"
    log0.write_text("\n".join([
        json.dumps({"event": "starting"}),
        json.dumps({"event": "heap report", "pid": 7, "gc_objects": 10, "gc_frozen": 4,
                    "traced_bytes": 2**20, "snapshot": str(tmp_path / "a.snap")}),
        "not json \"heap report\"",
        json.dumps({"event": "heap report", "pid": 7, "gc_objects": 15, "gc_frozen": 3,
                    "traced_bytes": 3 * 2**20, "snapshot": str(tmp_path / "b.snap")})]))
    reports = heap_reports([log0, tmp_path / "absent.log"])
    assert [(r["pid"], r["gc_objects"], r["replica"]) for r in reports] == [(7, 10, 0), (7, 15, 0)]
    # pid 8 reported once (started after the stretch began): not paired
    [row] = heap_change(reports + [{"event": "heap report", "pid": 8, "gc_objects": 3,
                                    "replica": 1}])
    assert (row["gc_objects"], row["traced_mib"], row["gc_frozen"]) == ([10, 15], [1.0, 3.0], [4, 3])
    where, kib, blocks = row["top_growth"][0]
    assert where.startswith(__file__) and kib >= 512 and blocks >= 512, row["top_growth"][:3]
    assert len(grown) == 512


def test_refusals_are_counted_by_status_and_the_binders_reason():
    from bench.soak import refusal_reason

    got = refusal_reason('403: admission webhook "vmi.gpu.cozystack.io" denied the request: '
                         'soak-t01/vm00012 cannot be placed: budget of tenant soak-t01 ' + "x" * 80)
    assert got == ("403: soak-t#/vm# cannot be placed: budget of tenant soak-t# " + "x" * 80)[:120]
    assert len(got) == 120
    assert refusal_reason("429: Too many requests, please try again later.") == \
        "429: Too many requests, please try again later."


def test_one_cause_of_the_binder_is_one_key_whatever_the_set_and_its_request():
    """The binder's refusals name the set, its request id and its devices before the reason:
    left out, two sets refused for the same cause count under one key, with an example."""
    from bench.soak.report import refusals_by_reason

    def binder(vmi: str, request: str, devices: str, why: str) -> str:
        return (f'403: admission webhook "vmi.gpu.cozystack.io" denied the request: refused '
                f"soak-t01/{vmi} request {request}: {devices}; {why}")
    a = binder("vm00289", "747493aeff5a4f8c8260306fc5c09b97", "devices soak-vm00085-h0 (Pending)",
               "no eligible node: soak-n0038 has 3 free, needs 4")
    b = binder("vm00293", "421044268e18470699d9761e3e5b8708", "4 new h100 devices",
               "no eligible node: soak-n0107 has 1 free, needs 4")
    c = '403: admission webhook "vmi.gpu.cozystack.io" denied the request: budget of soak-t02 spent'
    reasons, examples = refusals_by_reason([a, b, c, a])
    assert reasons == {"403: no eligible node: soak-n# has # free, needs #": 3,
                       "403: budget of soak-t# spent": 1}
    assert examples == {"403: no eligible node: soak-n# has # free, needs #": a,
                        "403: budget of soak-t# spent": c}


@pytest.mark.parametrize("rate", [0.0, -2.0, float("nan"), float("inf"), 51.0])
def test_a_create_rate_outside_its_range_is_refused_before_any_cluster(rate, tmp_path):
    from bench.soak import run

    with pytest.raises(ValueError, match=r"--create-rate is creates per second in \(0, 50\]"):
        run(tmp_path / "out", nodes=30, minutes=2, create_rate=rate)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("nodes", [0, -3])
def test_no_nodes_is_refused_before_any_cluster(nodes, tmp_path):
    from bench.soak import run

    with pytest.raises(ValueError, match=rf"--nodes is KWOK nodes of 8 GPUs, at least 1, got {nodes}"):
        run(tmp_path / "out", nodes=nodes, minutes=2)
    assert not (tmp_path / "out").exists()


# -- device mode (issue 41 item 5) -------------------------------------------------------------

def _device_spec(**kw) -> SoakSpec:
    return SoakSpec(**{"nodes": 1000, "minutes": 20, "seed": 1, "population": "scale",
                       "mode": "device", **kw})


def test_count_mode_keeps_its_schedule_and_has_no_taints():
    count = SoakSpec(nodes=1000, minutes=20, seed=1, population="scale")
    ops = schedule(count)
    assert not [o for o in ops if o.kind in ("taint", "untaint")]
    # the digest published for count mode does not move with the fields device mode added
    assert schedule_digest(ops) == "910c09bd56e9"
    # device mode (one class: its draws differ) keeps the disturbances, taints besides
    device = schedule(_device_spec())
    kinds = Counter(o.kind for o in device)
    assert [o for o in device if o.kind in DISTURBANCES] == [
        o for o in ops if o.kind in DISTURBANCES]
    assert kinds["taint"] == kinds["untaint"] == 56 and kinds["create"] > 2000


def test_device_mode_injects_seeded_taints_each_removed_later():
    from bench.soak import taints

    spec = _device_spec()
    ops = taints(spec, spec.avoided_nodes())
    made = [o for o in ops if o.kind == "taint"]
    removed = {o.name: o.at for o in ops if o.kind == "untaint"}
    assert ops == taints(spec, spec.avoided_nodes())       # same seed, same taints
    assert len(made) == 56 and set(removed) == {o.name for o in made}
    assert all(removed[o.name] == min(o.at + spec.taint_for, spec.seconds) for o in made)
    assert made[0].at == spec.taint_every and made[-1].at < spec.seconds
    effects = Counter(o.effect for o in made)
    assert effects == {"NoExecute": 20, "NoSchedule": 36}
    # NoExecute names a tenant (a running VMI of it is chosen in the run), NoSchedule a GPU
    # of a node the churn may cordon (never a problem node)
    avoid = spec.avoided_nodes()
    for o in made:
        if o.effect == "NoExecute":
            assert 0 <= o.tenant < spec.n_tenants and o.node == -1
        else:
            assert 0 <= o.node < spec.nodes and o.node not in avoid
            assert 0 <= o.device < spec.gpus_per_node
    # throughout the run, steady stretch included
    assert [o for o in made if o.at >= spec.steady_from]
    assert schedule_digest(schedule(spec)) != schedule_digest(schedule(_device_spec(seed=2)))


def test_device_mode_needs_the_scale_population_and_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="population='scale'"):
        schedule(SoakSpec(nodes=30, minutes=2, live=40, mode="device"))
    with pytest.raises(ValueError, match="mode is 'count' or 'device'"):
        schedule(SoakSpec(nodes=30, minutes=2, live=40, mode="devices"))
    assert _device_spec().classes() == {
        "soak-hgx": "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices"}
    assert _device_spec().cls_name == "soak-hgx"


T0 = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


def _claim(ns: str, name: str, vmi: str, *, at: datetime = T0, managed: bool = True) -> dict:
    return {"metadata": {"namespace": ns, "name": name,
                         "labels": {"app.kubernetes.io/managed-by": "gpu-binder"} if managed
                         else {},
                         "annotations": {"gpu.cozystack.io/claim-for": vmi,
                                         "gpu.cozystack.io/claimed-at":
                                             at.strftime("%Y-%m-%dT%H:%M:%SZ")}},
            "spec": {}}


def _vmi(ns: str, name: str, claim: str | None) -> dict:
    spec = {"resourceClaims": [{"name": "gpu-binder", "resourceClaimName": claim}]} if claim else {}
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def test_claims_orphan_after_the_grace_and_missing_for_an_admitted_vmi():
    from bench.soak.device import MISSING_CLAIM, ORPHAN_CLAIM, check_claims

    claims = [_claim("t", "a-gpus", "a"), _claim("t", "gone-gpus", "gone"),
              _claim("t", "late-gpus", "late"),
              _claim("t", "theirs", "nobody", managed=False)]
    vmis = [_vmi("t", "a", "a-gpus"), _vmi("t", "b", "b-gpus"), _vmi("t", "c", None),
            _vmi("t", "d", "d-gpus")]
    # gone deleted 200 s ago (past the 120 s grace; its claim older); late deleted 30 s ago
    # (within it); d exists without its claim but is not held as admitted (being admitted)
    deleted = {("t", "gone"): T0 + timedelta(seconds=100),
               ("t", "late"): T0 + timedelta(seconds=270)}
    now = T0 + timedelta(seconds=300)
    got = check_claims(claims, vmis, {("t", "a"), ("t", "b"), ("t", "c"), ("t", "x")},
                       deleted, now, grace=120)
    assert sorted((v.kind, v.obj) for v in got) == [
        (MISSING_CLAIM, ("ResourceClaim", "t", "b-gpus")),
        (MISSING_CLAIM, ("VirtualMachineInstance", "t", "c")),
        (ORPHAN_CLAIM, ("ResourceClaim", "t", "gone-gpus"))]
    assert {v.item for v in got} == {"3b.DR5", "5.H1/H2"}
    assert "200 s past" in next(v for v in got if v.kind == ORPHAN_CLAIM).message
    # after settling, every claim of ours without its VMI: late too (a tenant's never)
    final = check_claims(claims, vmis, (), deleted, now, grace=120, final=True)
    assert sorted(v.obj[2] for v in final) == ["gone-gpus", "late-gpus"]
    # what each sample reports: the age of each claim of ours without its VMI
    from bench.soak.device import orphan_ages
    assert sorted(orphan_ages(claims, vmis, deleted, now)) == [30.0, 200.0]


def test_a_vmi_being_stopped_has_no_missing_claim():
    """The device priorities soak flagged 8 victims at once: the binder deleted them (§3c P4)
    and housekeeping their claims once they were gone, between the soak's VMI read and its
    claims read. A VMI named a victim (`stopping`) or read with a deletionTimestamp has no
    missing claim; any other admitted VMI still does."""
    from bench.soak.device import MISSING_CLAIM, check_claims

    dying = _vmi("t", "d", "d-gpus")
    dying["metadata"]["deletionTimestamp"] = "2026-12-07T23:28:06Z"
    vmis = [_vmi("t", "v", "v-gpus"), dying, _vmi("t", "b", "b-gpus")]
    settled = {("t", "v"), ("t", "d"), ("t", "b")}
    got = check_claims([], vmis, settled, {}, T0, grace=120, stopping={("t", "v"): None})
    assert [(v.kind, v.obj) for v in got] == [(MISSING_CLAIM, ("ResourceClaim", "t", "b-gpus"))]
    assert sorted(v.obj[2] for v in check_claims([], vmis, settled, {}, T0, grace=120)) == [
        "b-gpus", "v-gpus"]


def _bound(ns: str, name: str, device: str, at: datetime | None, phase: str = "Bound",
           bound: datetime | None = None, result: str | None = "Succeeded") -> dict:
    """A GPUDevice recording `device`; its request made `at` (None: no request, as after a
    move) and answered `result`, `boundAt` `bound`."""
    st = {"phase": phase, "device": {"driver": "gpu.nvidia.com", "pool": "n1", "device": device}}
    if at is not None:
        st["bindRequest"] = {"id": f"r-{name}", "requestedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                             **({"result": result} if result else {})}
    if bound is not None:
        st["boundAt"] = bound.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"namespace": ns, "name": name}, "spec": {"class": "soak-hgx"},
            "status": st}


def test_a_placement_on_a_tainted_device_after_the_grace_and_before_removal_is_a_violation():
    from bench.soak.device import (TAINTED_PLACEMENT, Taint, check_budgets, check_taints,
                                   placement_windows)

    ref = ("gpu.nvidia.com", "n1", "gpu-vfio-3")
    taints = [Taint("r1", ref, "NoSchedule", T0, T0 + timedelta(seconds=90)),
              Taint("r2", ("gpu.nvidia.com", "n1", "gpu-vfio-5"), "NoExecute", T0)]
    s = timedelta(seconds=1)
    devices = [_bound("t", "before", "gpu-vfio-3", T0 - 60 * s, bound=T0 - 59 * s),  # kept
               _bound("t", "in-grace", "gpu-vfio-3", T0 + 10 * s, bound=T0 + 11 * s),  # lag
               _bound("t", "placed", "gpu-vfio-3", T0 + 40 * s, bound=T0 + 41 * s),   # violation
               _bound("t", "after", "gpu-vfio-3", T0 + 95 * s, bound=T0 + 96 * s),    # removed
               _bound("t", "pending", "gpu-vfio-3", T0 + 40 * s, phase="Pending"),
               _bound("t", "other", "gpu-vfio-4", T0 + 40 * s, bound=T0 + 41 * s),
               _bound("u", "still", "gpu-vfio-5", T0 + 500 * s, bound=T0 + 501 * s),  # NoExecute
               # a held device Bound idle on gpu-vfio-5 since before its rule, asked for by a
               # set (pending, then refused by the binder): nothing placed
               _bound("u", "asked", "gpu-vfio-5", T0 + 500 * s, bound=T0 - 900 * s, result=None),
               _bound("u", "refused", "gpu-vfio-5", T0 + 500 * s, bound=T0 - 900 * s, result="Refused")]
    windows: dict = {}
    placement_windows(devices, windows, T0 + 600 * s, None)
    got, unsure = check_taints(devices, taints, windows, grace=15)
    assert [(v.kind, v.obj) for v in got] == [
        (TAINTED_PLACEMENT, ("GPUDevice", "t", "placed", "r1")),
        (TAINTED_PLACEMENT, ("GPUDevice", "u", "still", "r2"))]
    assert unsure == []
    assert got[0].item == "HL1" and "NoSchedule rule r1" in got[0].message
    # device budgets: t holds 5 Bound devices of the class (the Pending one not counted)
    assert check_budgets(devices, {"t": 5, "u": 3}, "soak-hgx") == []
    over = check_budgets(devices, {"t": 4, "u": 3}, "soak-hgx")
    assert [(v.obj, v.item) for v in over] == [(("Namespace", "", "t", "soak-hgx"), "3b.DR1")]
    assert "5 Bound devices" in over[0].message


def test_a_placement_decided_after_the_rule_went_is_not_a_violation():
    """The device soak's run of 2026-12-07 04:11: a leader elected during the API server's
    restart decided at 04:22:11 a request made at 04:21:57, on a device whose rule went at
    04:22:09 (its boundAt says so); a held set, re-admitted, whose boundAt is older than its
    request, is judged up to the read that first showed it."""
    from bench.soak.device import Taint, check_taints, placement_windows

    s = timedelta(seconds=1)
    made = T0
    taints = [Taint("r19", ("gpu.nvidia.com", "n1", "gpu-vfio-4"), "NoExecute", made,
                    made + 89 * s),
              Taint("r20", ("gpu.nvidia.com", "n1", "gpu-vfio-0"), "NoExecute", made,
                    made + 92 * s)]
    fresh = _bound("t01", "vm00695", "gpu-vfio-4", made + 77 * s, bound=made + 91 * s)
    held = _bound("t08", "idle00368", "gpu-vfio-0", made + 91 * s, bound=made - 900 * s)
    windows: dict = {}
    placement_windows([fresh, held], windows, made + 102 * s, made + 80 * s)
    got, unsure = check_taints([fresh, held], taints, windows, grace=15)
    assert got == []
    assert [(u["device"], u["rule"], u["window"]) for u in unsure] == [
        ("t01/vm00695", "r19", [(made + 77 * s).isoformat(), (made + 91 * s).isoformat()]),
        ("t08/idle00368", "r20", [(made + 91 * s).isoformat(), (made + 102 * s).isoformat()])]
    # the same records held the whole time the rules were live: violations
    early = {k: (made + 20 * s, made + 21 * s) for k in windows}
    got, unsure = check_taints([fresh, held], taints, early, grace=15)
    assert sorted(v.obj[2] for v in got) == ["idle00368", "vm00695"] and unsure == []


def test_a_move_or_a_re_point_is_judged_from_the_read_before():
    """A move (D2) has no request: its window opens at the read before and closes at its
    boundAt; a re-point within the node keeps its boundAt, so it closes at the read that
    showed it. A window opened by the read before a rule's grace ended is unsure."""
    from bench.soak.device import TAINTED_PLACEMENT, Taint, check_taints, placement_windows

    s = timedelta(seconds=1)
    ref = ("gpu.nvidia.com", "n1", "gpu-vfio-2")
    taints = [Taint("r", ref, "NoSchedule", T0)]
    moved = _bound("t", "moved", "gpu-vfio-2", None, bound=T0 + 50 * s)
    windows: dict = {}
    placement_windows([moved], windows, T0 + 60 * s, T0 + 45 * s)
    assert windows[("t", "moved", ref, None, (T0 + 50 * s).strftime("%Y-%m-%dT%H:%M:%SZ"))] \
        == (T0 + 45 * s, T0 + 50 * s)
    got, unsure = check_taints([moved], taints, windows, grace=15)
    assert [(v.kind, v.obj[2]) for v in got] == [(TAINTED_PLACEMENT, "moved")] and unsure == []
    repointed = _bound("t", "kept", "gpu-vfio-2", None, bound=T0 - 300 * s)
    windows = {}
    placement_windows([repointed], windows, T0 + 30 * s, T0 + 10 * s)
    got, unsure = check_taints([repointed], taints, windows, grace=15)
    assert got == [] and [u["window"] for u in unsure] == [
        [(T0 + 10 * s).isoformat(), (T0 + 30 * s).isoformat()]]
    # a window once given is kept: a later read does not move it
    placement_windows([repointed], windows, T0 + 90 * s, T0 + 60 * s)
    assert list(windows.values()) == [(T0 + 10 * s, T0 + 30 * s)]


def test_a_request_cleared_after_its_vmi_went_is_no_new_placement():
    """The device soak's run of 2026-12-07 05:13: a VMI admitted before a NoExecute rule was
    evicted by it; housekeeping cleared its request (H2) and the held device stayed Bound on
    the tainted GPU, idle, until its next placement (HL1). Its record, without the request,
    is the placement it was; a new request on it is a new one."""
    from bench.soak.device import TAINTED_PLACEMENT, Taint, check_taints, placement_windows

    s = timedelta(seconds=1)
    ref = ("gpu.nvidia.com", "n1", "gpu-vfio-2")
    taints = [Taint("r", ref, "NoExecute", T0)]
    admitted = _bound("t", "h0", "gpu-vfio-2", T0 - 300 * s, bound=T0 - 299 * s)
    windows: dict = {}
    placement_windows([admitted], windows, T0 - 290 * s, None)
    idle = _bound("t", "h0", "gpu-vfio-2", None, bound=T0 - 299 * s)   # request cleared
    placement_windows([idle], windows, T0 + 60 * s, T0 + 50 * s)
    assert len(windows) == 1
    assert check_taints([idle], taints, windows, grace=15) == ([], [])
    again = _bound("t", "h0", "gpu-vfio-2", T0 + 70 * s, bound=T0 - 299 * s)  # re-admitted
    again["status"]["bindRequest"]["id"] = "r-h0-again"
    placement_windows([again], windows, T0 + 80 * s, T0 + 60 * s)
    got, unsure = check_taints([again], taints, windows, grace=15)
    assert [(v.kind, v.obj[2]) for v in got] == [(TAINTED_PLACEMENT, "h0")] and unsure == []


def test_the_device_part_counts_each_kind_and_the_evictions():
    from bench.soak import device_part, targets

    part = device_part({"orphan-claim": 1, "admitted-not-placed": 2},
                       {"taints_NoSchedule": 4, "taints_NoExecute": 3, "untaints": 6,
                        "evicted": 3},
                       [{"at": 20.0, "vmi": "t/a", "device": "d", "evicted": True,
                         "evicted_s": 4.0},
                        {"at": 40.0, "vmi": "t/b", "device": "d", "evicted": True,
                         "evicted_s": 9.5},
                        {"at": 60.0, "vmi": "t/c", "device": "d", "evicted": False,
                         "evicted_s": 240.0}],
                       [(5.0, 10, 0, 0.0), (10.0, 14, 3, 42.5), (15.0, 12, 1, 47.5)])
    assert part["violations"] == {"orphan-claim": 1, "missing-claim": 0,
                                  "placed-on-tainted-device": 0,
                                  "tenant-over-device-budget": 0, "device-recorded-twice": 0}
    assert part["taints"] == {"taints_NoSchedule": 4, "taints_NoExecute": 3, "untaints": 6,
                              "noexecute_skipped": 0, "noexecute_no_record": 0}
    assert part["tainted_unsure"] == {"count": 0, "placements": []}
    unsure = [{"device": "t/a", "rule": "r1"}]
    assert device_part({}, {}, [], [], unsure)["tainted_unsure"] == {"count": 1,
                                                                    "placements": unsure}
    ev = part["evictions"]
    assert (ev["asked"], ev["evicted"], ev["p50_s"], ev["p99_s"], ev["max_s"]) == (3, 2, 9.5, 9.5, 9.5)
    assert [e["vmi"] for e in ev["not_evicted"]] == ["t/c"]
    assert part["claims"] == {"samples": 3, "min": 10, "max": 14, "last": 12,
                              "without_vmi_max": 3, "without_vmi_oldest_s": 47.5}
    report = {"violations": 3, "admissions_lost": 0, "rss_peak_mib": 200.0, "device": part,
              "rss_trend": {"processes": [], "verdict": None, "threshold_mib_per_min": 0.208,
                            "from_s": 660, "to_s": 1200}}
    got = targets(report)
    assert got["device_orphan_claim"] == {"value": 1, "target": 0, "met": False}
    assert got["device_missing_claim"]["met"] is True


def test_the_population_is_deleted_in_mixed_sizes_not_largest_first():
    """Count mode's RSS verdict "not flat" (2026-12-03): deleted oldest first in plan order
    (largest sets first), the population's template devices fell then climbed back through
    the steady stretch, and the replicas' caches with them. In `deletion_order` each quarter
    of the population holds about the population's mean size."""
    from bench.scale.workload import ScaleSpec, plan_vmis
    from bench.soak import deletion_order

    spec = SoakSpec(nodes=1000, minutes=20, seed=1, population="scale")
    sc = spec.scale_spec()
    plan = plan_vmis(sc, [spec.tenant(i) for i in range(spec.n_tenants)])
    order = deletion_order(plan, spec.seed)
    assert order == deletion_order(plan, spec.seed) and order != plan
    assert sorted(v.name for v in order) == sorted(v.name for v in plan)

    def quarters(vmis):
        q = len(vmis) // 4
        return [sum(v.size for v in vmis[k * q:(k + 1) * q]) / q for k in range(4)]
    mean = sum(v.size for v in plan) / len(plan)
    # plan order: the first quarter all 8s and 4s, the last all 1s
    assert quarters(plan)[0] > 2 * mean and quarters(plan)[3] == 1.0
    assert all(abs(m - mean) < 0.25 * mean for m in quarters(order)), (quarters(order), mean)


def test_cache_objects_reads_the_informers_and_the_connections():
    """What the soak samples beside RSS: each informer's objects and the replica's
    connections (API client pool in use and idle, the webhook's), from its /metrics."""
    import anyio

    from bench.soak.driver import cache_objects

    text = "\n".join([
        "# TYPE gpu_binder_cache_objects gauge",
        'gpu_binder_cache_objects{informer="nodes"} 1000.0',
        'gpu_binder_cache_objects{informer="pods"} 2064.0',
        "# TYPE gpu_binder_api_connections gauge",
        'gpu_binder_api_connections{state="in_use"} 17.0',
        'gpu_binder_api_connections{state="idle"} 51.0',
        "# TYPE gpu_binder_api_connections_limit gauge",
        "gpu_binder_api_connections_limit 100.0",
        "# TYPE gpu_binder_webhook_connections gauge",
        "gpu_binder_webhook_connections 6.0", ""])

    class Cluster:
        def metrics(self, i: int) -> str:
            if i:
                raise OSError("replica 1 is down")
            return text

    assert anyio.run(cache_objects, Cluster(), 0) == {
        "nodes": 1000, "pods": 2064, "~api connections in use": 17,
        "~api connections idle": 51, "~webhook connections": 6}
    assert anyio.run(cache_objects, Cluster(), 1) is None


def test_replica_figures_reads_the_heap_parts_beside_the_informers():
    """Issue 41 item 5: the soak samples where each replica's memory lives
    (`gpu_binder_heap_bytes{part}`, `gpu_binder_heap_pymalloc_blocks`) from the scrape that
    gives its informers' objects; a replica without them gives no parts."""
    import anyio

    from bench.soak.driver import replica_figures

    text = "\n".join([
        "# TYPE gpu_binder_cache_objects gauge",
        'gpu_binder_cache_objects{informer="nodes"} 1000.0',
        "# TYPE gpu_binder_heap_bytes gauge",
        'gpu_binder_heap_bytes{part="rss_anon"} 1.048576e+08',
        'gpu_binder_heap_bytes{part="rss_heap"} 5.24288e+07',
        'gpu_binder_heap_bytes{part="malloc_free"} 4096.0',
        "# TYPE gpu_binder_heap_pymalloc_blocks gauge",
        "gpu_binder_heap_pymalloc_blocks 1.234567e+06", ""])
    old = 'gpu_binder_cache_objects{informer="nodes"} 1000.0\n'

    class Cluster:
        def metrics(self, i: int) -> str:
            return (text, old)[i]

    assert anyio.run(replica_figures, Cluster(), 0) == (
        {"nodes": 1000}, {"rss_anon": 100 * 2**20, "rss_heap": 50 * 2**20,
                          "malloc_free": 4096, "pymalloc_blocks": 1234567})
    assert anyio.run(replica_figures, Cluster(), 1) == ({"nodes": 1000}, {})


def _parts(replica, pid, t0, t1, slopes: dict[str, float], blocks_per_min=0.0, seed=0,
           every=10.0):
    """Heap-part samples every `every` s over [t0, t1]: each part (MiB/min in `slopes`) a
    line from 50 MiB plus seeded noise of 0.2 MiB, in bytes; pymalloc blocks from 10^6."""
    rng = random.Random(seed)
    out, t = [], t0
    while t <= t1:
        parts = {p: int((50 + s * (t - t0) / 60 + rng.gauss(0, 0.2)) * 2**20)
                 for p, s in slopes.items()}
        parts["pymalloc_blocks"] = int(1e6 + blocks_per_min * (t - t0) / 60)
        out.append((t, replica, pid, parts))
        t += every
    return out


def test_heap_parts_trend_names_the_part_that_grows():
    """The device soak's young follower grew ~1 MiB/min with its objects flat: the report
    fits each part over the steady stretch and names the growing ones, steepest first."""
    from bench.soak import heap_parts_trend

    follower = _parts(1, 41, 0, 1200, {"rss_anon": 1.0, "rss_heap": 0.0,
                                       "rss_thread_arenas": 0.3, "malloc_free": 0.0},
                      blocks_per_min=0.0, seed=1)
    leader = _parts(0, 40, 0, 1200, {"rss_anon": 0.0, "rss_heap": 0.0}, seed=2)
    killed = _parts(0, 39, 0, 700, {"rss_anon": 5.0}, seed=3)          # gone mid-stretch
    got = heap_parts_trend(follower + leader + killed, 660, 1200)
    assert got["from_s"] == 660 and got["to_s"] == 1200
    assert [(p["replica"], p["pid"]) for p in got["processes"]] == [(0, 40), (1, 41)]
    lead, follow = got["processes"]
    assert list(follow["parts"])[:2] == ["rss_anon", "rss_thread_arenas"]  # steepest first
    slopes = [v["slope_mib_per_min"] for v in follow["parts"].values()]
    assert slopes == sorted(slopes, reverse=True) and len(slopes) == 4
    anon = follow["parts"]["rss_anon"]
    assert abs(anon["slope_mib_per_min"] - 1.0) < 0.05 and anon["verdict"] == "growing"
    assert abs(anon["level_mib"] - 70.0) < 0.5                     # 50 + 1.0 × 20 min
    assert abs(follow["parts"]["rss_thread_arenas"]["slope_mib_per_min"] - 0.3) < 0.05
    assert follow["growing"] == ["rss_anon", "rss_thread_arenas"]
    assert follow["parts"]["rss_heap"]["verdict"] == "flat"
    assert abs(follow["pymalloc_blocks_per_min"]) < 1
    assert lead["growing"] == [] and set(lead["parts"]) == {"rss_anon", "rss_heap"}
    lines = summary({
        "seed": 1, "schedule": "x", "creates": 0, "admitted": 0, "refused": 0, "counts": {},
        "violations": 0, "violations_by_kind": {}, "admissions_lost": 0, "samples": 0,
        "events": [], "rss_trend": rss_trend([], 660, 1200), "heap_parts_trend": got})
    (line,) = [x for x in lines if "replica-1 pid 41" in x and "memory by part" in x]
    assert line.startswith("memory by part over it (MiB/min, ± 2 SE; level MiB), "
                           "replica-1 pid 41: rss_anon 1.0")
    assert line.endswith("growing: rss_anon, rss_thread_arenas")
    assert "pymalloc blocks +0/min" in line
    # a run whose replicas export no parts (older code) reports none
    assert heap_parts_trend([], 660, 1200)["processes"] == []


def test_priorities_add_a_seeded_tier_mix_and_larger_sets_and_leave_the_default_alone():
    from bench.contention_trace import ON_DEMAND, PREEMPTIBLE
    from bench.soak.workload import PRIORITY_SIZES, SIZES

    base = SoakSpec(nodes=200, minutes=10, seed=3, population="scale")
    prio = SoakSpec(nodes=200, minutes=10, seed=3, population="scale", priorities=True)
    plain, ops = schedule(base), schedule(prio)
    assert ops == schedule(prio)                                     # deterministic for a seed
    assert schedule_digest(ops) == schedule_digest(schedule(prio)) != schedule_digest(plain)
    assert {o.tier for o in plain} == {""}                           # off: no PriorityClass
    creates = [o for o in ops if o.kind == "create"]
    tiers = Counter(o.tier for o in creates)
    assert set(tiers) == {ON_DEMAND, PREEMPTIBLE}
    assert 0.25 < tiers[ON_DEMAND] / len(creates) < 0.35             # on_demand_share 0.3
    assert {o.priority for o in creates} == {1000, 100}
    # the same times, tenants, classes and held draws; sizes from the larger mix
    def shape(os):
        return [(o.at, o.kind, o.tenant, o.held, o.cls, o.node) for o in os]
    assert shape(ops) == shape(plain)
    mean = sum(o.size for o in creates) / len(creates)
    assert 3.1 < mean < 3.7 and sum(s * w for s, w in SIZES) < 2.5
    assert sum(s * w for s, w in PRIORITY_SIZES) == pytest.approx(3.4)
    # another seed, another mix
    other = schedule(SoakSpec(nodes=200, minutes=10, seed=4, population="scale", priorities=True))
    assert [o.tier for o in other if o.kind == "create"][:50] != [o.tier for o in creates][:50]
    # budgets leave room to fill the fleet (4 tenants at 200 nodes: 15 % each would cap it
    # at 60 %); the controller may preempt sets younger than its default 10 minutes
    assert base.budget("h100.scale.example.com/gpu") == 120
    assert prio.budget("h100.scale.example.com/gpu") == 300          # 1.5 / 4 of 800
    assert base.controller_args() == () and prio.controller_args() == (
        "--preemption-min-runtime=15",)
    # 2.5 VMIs a node kept running (2 without), the population made as many
    assert (base.n_live, prio.n_live, prio.pre_populated()) == (400, 500, 500)
    assert sum(o.kind == "delete" for o in ops) == len(creates)


def test_the_P6_part_counts_what_its_checks_ran_over_and_says_when_nothing_was():
    from bench.soak import p6_part
    from bench.soak.report import p6_lines

    # a run without preemptions: 0 violations, but not read as P6 proven
    none = p6_part({}, {}, [], 0, {}, priorities=False)
    assert none["preemptions"] == 0 and none["exercised"] is False
    assert "0 preemptions" in none["note"] and "not checked" in none["note"]
    assert {v["violations"] for v in none["invariants"].values()} == {0}
    assert "NOT EXERCISED" in p6_lines(none)[0]
    noms = [{"preemptor": "soak-t00/vm00007", "created": "c1", "node": "soak-n0003",
             "priority": 1000, "victims": ["soak-t01/vm00002", "soak-t02/sc-vm00011"],
             "victim_priorities": [0, 100]},
            {"preemptor": "soak-t01/vm00040", "created": "c2", "node": "soak-n0009",
             "priority": 1000, "victims": ["soak-t00/vm00030"], "victim_priorities": [100]}]
    counts = {"preemptors_nominated": 2, "preemptors_admitted": 2,
              "preemptors_on_nominated_node": 2, "waits_in_line": 17}
    judged = {("a", "x", "1"): 2, ("a", "y", "1"): 0, ("a", "z", "1"): False,
              ("a", "w", None): None}
    got = p6_part({"lower-priority-start": 1}, counts, noms, 3, judged, priorities=True)
    assert (got["preemptions"], got["victims_named"], got["victims_seen_gone"]) == (2, 3, 3)
    assert got["victims_per_preemption"] == 1.5 and got["exercised"] is True and got["note"] is None
    assert got["preemptors"] == {"nominated": 2, "admitted": 2, "on_nominated_node": 2, "elsewhere": 0}
    assert got["line"] == {"sets_judged": 2, "sets_started_while_higher_waited": 1,
                           "sets_not_judged": 1, "waits_in_line": 17}
    rule3 = got["invariants"]["no_lower_priority_start_on_room_a_waiting_set_could_use"]
    assert rule3["violations"] == 1 and rule3["checked_over"].startswith(
        "1 sets started while a higher-priority set waited in line, of 2 judged")
    # preemptions, but nobody started while a higher-priority set waited: not exercised
    idle = p6_part({}, counts, noms, 3, {("a", "y", "1"): 0}, priorities=True)
    assert idle["exercised"] is False and "ran over none" in idle["note"]
    assert got["invariants"]["nominated_room_for_nobody_else"]["checked_over"] == "2 nominations"
    # the target says whether it was exercised (with --priorities only)
    trend = {"processes": [], "verdict": None, "threshold_mib_per_min": 0.2, "from_s": 0, "to_s": 1}
    base = {"violations": 1, "admissions_lost": 0, "rss_peak_mib": None, "rss_trend": trend}
    assert targets({**base, "p6": got, "spec": {"priorities": True}})["p6_exercised"]["met"] is True
    assert targets({**base, "p6": p6_part({}, {}, [], 0, {}, True),
                    "spec": {"priorities": True}})["p6_exercised"]["met"] is False
    assert "p6_exercised" not in targets({**base, "p6": none, "spec": {"priorities": False}})


def test_the_driver_tells_a_wait_in_line_and_a_nomination_from_the_webhooks_503():
    import json as _json

    from kubernetes_asyncio.client import ApiException

    from bench.soak.driver import P6Check, Rec, Soak, in_line, nominated_node
    from bench.soak.workload import Op

    def answer(status, message):
        exc = ApiException(status=status, reason="x")
        exc.body = _json.dumps({"kind": "Status", "message": message})
        return exc

    from bench.soak.driver import WAITS_IN_LINE
    from model.reasons.line import WaitsInLine
    from model.reasons.preemption import FitsWithoutPreemption

    words = WaitsInLine(FitsWithoutPreemption("n"), retry_after=2, grace=10).render()
    assert WAITS_IN_LINE in words   # the model's own words
    line = answer(503, f'admission webhook "vmi.gpu.cozystack.io" denied the request: {words}')
    busy = answer(503, 'admission webhook "vmi.gpu.cozystack.io" denied the request: the '
                       "webhook's cache is not synced yet; retry")
    nominated = answer(503, 'admission webhook "vmi.gpu.cozystack.io" denied the request: no '
                            "room for the set now; stopping 2 lower-priority VMs on soak-n0007 to "
                            "make room for it (priority 1000): soak-t01/vm1, soak-t02/vm2; its "
                            "room is held for it, retry in 5s")
    down = answer(503, "the server is currently unable to handle the request")
    assert in_line(line) and in_line(nominated) and not in_line(down)
    assert nominated_node(str(nominated.body)) == "soak-n0007" and nominated_node("no room") is None
    # the driver's bookkeeping, without a cluster: the second 503 in line makes the set
    # Waiting (its client retried); a nomination takes it out and names the node
    soak = Soak.__new__(Soak)
    soak.counts, soak._last_in_line, soak.p6 = Counter(), {}, P6Check("soak-", line=True)
    soak._line_sent = {}
    op = Op(1.0, "create", tenant=0, size=8, name="vm00001", tier="on-demand")
    rec = Rec("soak-t00", "vm00001", 8, cls="soak-h100", tier="on-demand")
    soak._waited(rec, op, line)
    assert rec.waited == 1 and not soak.p6.waiting
    soak._waited(rec, op, down)
    assert rec.waited == 1 and soak._last_in_line[("soak-t00", "vm00001")] is False
    soak._waited(rec, op, line)
    assert not soak.p6.waiting   # kube-apiserver's 503 between: not two in line in a row
    soak._waited(rec, op, line)
    w = soak.p6.waiting[("soak-t00", "vm00001")]
    assert (w.cls, w.gpus, w.priority) == ("soak-h100", 8, 1000)
    # another retryable refusal of ours: an answer, but not known to be in line
    soak._waited(rec, op, busy)
    assert rec.waited == 4 and not soak.p6.waiting
    soak._waited(rec, op, line)
    assert not soak.p6.waiting          # one answer in line since: not retried in line yet
    soak._waited(rec, op, line)
    assert soak.p6.waiting
    soak._waited(rec, op, nominated)
    assert rec.nominated == "soak-n0007" and not soak.p6.waiting
    assert soak.counts == Counter({"waits_in_line": 5, "preemptors_nominated": 1,
                                   "webhook_503_other": 1})


def test_a_waiting_set_stops_waiting_when_an_attempt_does_not_reach_our_webhook():
    """kube-apiserver's own 503 (or 429, another 5xx) or a transport error (the API server
    restarting, a request timed out) between two answers in line: the binder may have
    dropped the set's line entry meanwhile (a bare VMI's, after `line.retryGrace` without an
    attempt), so the set is no longer known to wait (P6's third rule would otherwise judge
    a lower-priority start against a set not in line) until two answers in line again."""
    import json as _json

    import aiohttp
    from kubernetes_asyncio.client import ApiException

    from bench.soak.driver import WAITS_IN_LINE, P6Check, Rec, Soak
    from bench.soak.workload import Op

    def answer(status, message):
        exc = ApiException(status=status, reason="x")
        exc.body = _json.dumps({"kind": "Status", "message": message})
        return exc

    line = answer(503, 'admission webhook "vmi.gpu.cozystack.io" denied the request: no room '
                       f"for the set now; {WAITS_IN_LINE}: retry after 2 s")
    key = ("soak-t00", "vm00001")
    for between in (answer(503, "the server is currently unable to handle the request"),
                    answer(429, "too many requests"), answer(500, "etcdserver: timeout"),
                    aiohttp.ClientConnectionError("refused"), TimeoutError()):
        soak = Soak.__new__(Soak)
        soak.counts, soak._last_in_line, soak.p6 = Counter(), {}, P6Check("soak-", line=True)
        soak._line_sent = {}
        op = Op(1.0, "create", tenant=0, size=8, name="vm00001", tier="on-demand")
        rec = Rec(*key, 8, cls="soak-h100", tier="on-demand")
        soak._waited(rec, op, line)
        soak._waited(rec, op, line)
        assert key in soak.p6.waiting
        soak._waited(rec, op, between)
        assert key not in soak.p6.waiting and rec.lined == 0, between
        soak._waited(rec, op, line)
        assert key not in soak.p6.waiting, between
        soak._waited(rec, op, line)
        assert key in soak.p6.waiting, between
        assert rec.waited == 4, between   # only our webhook's answers count as waits


def test_answers_in_line_further_apart_than_the_lines_retry_grace_are_not_in_a_row(monkeypatch):
    """A bare VMI's entry leaves the binder's line `line.retryGrace` (10 s) after its last
    refusal without another: when an answer in line comes that long after the previous
    in-line attempt was sent (a slow round trip), the entry may have left and come back
    unretried meanwhile, holding back nobody: the count of answers in line starts again."""
    import json as _json
    from types import SimpleNamespace

    from kubernetes_asyncio.client import ApiException

    import bench.soak.driver as driver_mod
    from bench.soak.driver import WAITS_IN_LINE, P6Check, Rec, Soak
    from bench.soak.workload import Op

    line = ApiException(status=503, reason="x")
    line.body = _json.dumps({"kind": "Status", "message": 'admission webhook "vmi.gpu.cozystack.io" '
                             f"denied the request: no room; {WAITS_IN_LINE}: retry after 2 s"})
    key = ("soak-t00", "vm00001")

    def soak_and_rec():
        soak = Soak.__new__(Soak)
        soak.counts, soak._last_in_line, soak.p6 = Counter(), {}, P6Check("soak-", line=True)
        soak._line_sent = {}
        return soak, Rec(*key, 8, cls="soak-h100", tier="on-demand")

    op = Op(1.0, "create", tenant=0, size=8, name="vm00001", tier="on-demand")
    m = 1000.0   # the driver's monotonic clock now, answers arriving
    monkeypatch.setattr(driver_mod, "time", SimpleNamespace(monotonic=lambda: m))
    soak, rec = soak_and_rec()
    soak._waited(rec, op, line, sent=m - 3)
    soak._waited(rec, op, line, sent=m - 1)          # 3 s since the first was sent: in a row
    assert key in soak.p6.waiting
    soak, rec = soak_and_rec()
    soak._waited(rec, op, line, sent=m - 40)
    soak._waited(rec, op, line, sent=m - 35)         # answered 40 s after the first was sent
    assert key not in soak.p6.waiting and rec.lined == 1
    soak._waited(rec, op, line, sent=m - 0.1)        # 35 s after the second was sent
    assert key not in soak.p6.waiting and rec.lined == 1
    soak._waited(rec, op, line, sent=m)
    assert key in soak.p6.waiting and rec.lined == 2


def test_the_soaks_call_tells_retried_of_transport_errors_too(monkeypatch):
    import aiohttp
    import anyio

    import bench.soak.driver as driver_mod
    from bench.soak.driver import Soak

    seen, tries = [], iter([aiohttp.ClientConnectionError("refused"), None])

    async def fn(*args, **kw):
        exc = next(tries)
        if exc is not None:
            raise exc
        return "made"

    real = anyio.sleep

    async def no_pause(_s):
        await real(0)

    monkeypatch.setattr(driver_mod.anyio, "sleep", no_pause)

    async def main():
        soak = Soak.__new__(Soak)
        soak.counts = Counter()
        got = await soak._call(fn, what="create", deadline=float("inf"),
                               retried=lambda exc, sent: seen.append(exc))
        return got, soak.counts

    got, counts = anyio.run(main)
    assert got == "made" and [type(e) for e in seen] == [aiohttp.ClientConnectionError]
    assert counts == Counter({"retried_create_ClientConnectionError": 1})


def test_a_create_that_only_ever_waited_in_line_gave_up_and_one_unanswered_is_lost():
    import json as _json
    from types import SimpleNamespace

    import anyio
    from kubernetes_asyncio.client import ApiException

    from bench.soak.driver import P6Check, Soak
    from bench.soak.workload import Op

    def answer(message):
        exc = ApiException(status=503, reason="x")
        exc.body = _json.dumps({"kind": "Status", "message": message})
        exc.headers = {"Retry-After": "0"}
        return exc

    def soak_answering(exc):
        async def create(*args, **kw):
            raise exc
        soak = Soak.__new__(Soak)
        soak.spec = SoakSpec(nodes=4, priorities=True, answer_timeout=0.3)
        soak.fleet = SimpleNamespace(custom=SimpleNamespace(create_namespaced_custom_object=create))
        soak.held_free = {("soak-t00", "soak-h100"): set()}
        soak.recs, soak.counts, soak.log = [], Counter(), lambda m: None
        soak._last_in_line, soak.p6, soak._line_sent = {}, P6Check("soak-", line=True), {}
        return soak

    op = Op(1.0, "create", tenant=0, size=2, name="vm00001", tier="preemptible")
    soak = soak_answering(answer('admission webhook "vmi.gpu.cozystack.io" denied the request: '
                                 "no room for the set now; the set waits in the line for room: "
                                 "retry after 2 s"))
    anyio.run(soak.create, op)
    rec = soak.recs[0]
    assert rec.outcome == "gave up" and rec.waited >= 1 and "503 in line" in rec.refusal
    assert soak.p6.waiting == {} and soak._last_in_line == {} and soak._line_sent == {}
    # kube-apiserver's own 503 all along: no answer of ours, the admission is lost
    soak = soak_answering(answer("the server is currently unable to handle the request"))
    anyio.run(soak.create, op)
    assert soak.recs[0].outcome == "lost" and soak.recs[0].waited == 0
