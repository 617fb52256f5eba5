"""`gpu-binder bench contention` lane (d), gpu-binder without the line (P5 off,
`--line-enabled=false`), no cluster: the second cluster after the first (`_on_cluster`
monkeypatched: which lanes each runs, with which controller arguments), lane (d)'s results
computed as lane (a)'s, the report's shape, the lanes the command line picks, and the target
"8-GPU maximum wait with the line <= 1/2 of without" with a set never started as a lower
bound."""

from __future__ import annotations

import argparse

import pytest

from bench import contention
from bench.common import BadArgs
from bench.contention_metrics import LaneLog, Run, Wait, lane_figures, max_wait, max_wait_censored
from bench.contention_report import summary, targets
from bench.contention_trace import ON_DEMAND, PREEMPTIBLE
from tests.bench.test_contention import trace_of


def _waits_8(wait: float, *, started: bool = True) -> tuple:
    """A trace of one scored 8-GPU set asking at 0 and a log where it waits `wait` s (never
    started: it waits until the trace's end, 100 s)."""
    tr = trace_of((0, 8, ON_DEMAND, 50))
    log = LaneLog(("n0",))
    log.waits.append(Wait(0, 0.0, wait if started else None))
    if started:
        log.runs.append(Run(0, "n0", tuple(range(8)), wait, wait + 50))
    return tr, log


def test_the_8_gpu_maximum_wait_says_when_it_is_a_lower_bound():
    tr, log = _waits_8(20.0)
    assert max_wait_censored(tr, log, 8) == (20.0, False) == (max_wait(tr, log, 8), False)
    tr, log = _waits_8(0, started=False)
    assert max_wait_censored(tr, log, 8) == (100.0, True)
    fig = lane_figures(tr, log, min_runtime=5.0)
    assert (fig["max_wait_8_s"], fig["max_wait_8_censored"]) == (100.0, True)
    assert max_wait_censored(trace_of((0, 1, PREEMPTIBLE, 5)), LaneLog(("n0",)), 8) == (None, False)


def _ab(wa, ca, wd, cd) -> dict:
    return targets({"results": {"a": {"max_wait_8_s": wa, "max_wait_8_censored": ca},
                                "d": {"max_wait_8_s": wd, "max_wait_8_censored": cd}}})["max_wait_8_with_line"]


@pytest.mark.parametrize("wa, ca, wd, cd, met", [
    (20.0, False, 40.0, False, True),    # exactly half
    (21.0, False, 40.0, False, False),
    (20.0, False, 40.0, True, True),     # d waited at least 40 s: a is under half for sure
    (30.0, False, 40.0, True, None),     # d's real wait may be 60 s or more: not known
    (30.0, True, 40.0, False, False),    # a waited at least 30 s > 20 s: fails for sure
    (10.0, True, 40.0, False, None),     # a's real wait may pass 20 s: not known
    (10.0, True, 40.0, True, None),
    (None, False, 40.0, False, None),    # no 8-GPU set asked in lane a
])
def test_the_line_halves_the_8_gpu_maximum_wait_target(wa, ca, wd, cd, met):
    t = _ab(wa, ca, wd, cd)
    assert t["met"] is met and t["target"] == "<= 0.5 x without the line"
    if wa is not None:
        assert t["value"] == f"{'≥' if ca else ''}{wa} s with the line vs {'≥' if cd else ''}{wd} s without"


def _logs(keys) -> dict[str, LaneLog]:
    """A log per lane: lane k's one 8-GPU set waits 10 s in (a), 30 s in (d), 20 s elsewhere."""
    out = {}
    for k in keys:
        log = LaneLog(("n0",))
        wait = {"a": 10.0, "d": 30.0}.get(k, 20.0)
        log.waits.append(Wait(0, 0.0, wait))
        log.runs.append(Run(0, "n0", tuple(range(8)), wait, wait + 50))
        out[k] = log
    return out


@pytest.fixture
def clusters(monkeypatch, tmp_path):
    """`_on_cluster` recorded, not run: (log dir, lanes, controller arguments) per cluster;
    a hand-made trace of one 8-GPU set."""
    calls: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []

    def fake(log_dir, plan, trace, keys, args):
        calls.append((log_dir.name, keys, args))
        return _logs(keys), "v1.36.3"
    monkeypatch.setattr(contention, "_on_cluster", fake)
    monkeypatch.setattr(contention, "make_trace", lambda **_: trace_of((0, 8, ON_DEMAND, 50)))
    monkeypatch.setattr(contention, "commit", lambda: "c0ffee")
    return calls


def test_lane_d_runs_on_a_second_cluster_after_the_first_with_the_line_off(clusters, tmp_path):
    plan = contention.QUICK
    report = contention.run(tmp_path, plan=plan)
    assert [(d, k) for d, k, _ in clusters] == [("logs", ("a", "b", "c")), ("logs-second", ("d",))]
    first, second = clusters[0][2], clusters[1][2]
    assert "--line-enabled=false" not in first and second == (*first, "--line-enabled=false")
    assert report["lanes_on_second_cluster"] == ["d"]
    assert report["second_cluster"]["lanes"] == ["d"]
    assert "--line-enabled=false" in report["second_cluster"]["controller_args"]
    assert list(report["lanes"]) == ["a", "b", "c", "d"] and list(report["results"]) == ["a", "b", "c", "d"]
    # lane (d)'s figures are lane (a)'s kind, from its own log
    assert report["results"]["d"].keys() == report["results"]["a"].keys()
    assert (report["results"]["a"]["max_wait_8_s"], report["results"]["d"]["max_wait_8_s"]) == (10.0, 30.0)
    t = report["targets"]["max_wait_8_with_line"]
    assert t["met"] is True and t["value"] == "10.0 s with the line vs 30.0 s without"
    assert (tmp_path / "contention.json").exists()
    assert any(line.startswith("(d) gpu-binder without the line [second cluster") for line in summary(report))


def test_without_lane_d_one_cluster_runs_and_the_report_says_why(clusters, tmp_path):
    report = contention.run(tmp_path, plan=contention.QUICK, lanes=("a", "b", "c"))
    assert [k for _, k, _ in clusters] == [("a", "b", "c")]
    assert "lanes_on_second_cluster" not in report
    assert report["results"]["d"] == {"available": False, "why": contention.NO_LINE}
    assert report["targets"]["max_wait_8_with_line"]["met"] is None
    only_d = contention.run(tmp_path, plan=contention.QUICK, lanes=("d",))
    assert [k for _, k, _ in clusters[1:]] == [("d",)] and only_d["lanes_on_second_cluster"] == ["d"]


def test_the_command_line_picks_the_lanes():
    """Full run: (d) too; --quick stays one cluster; `--lanes a,b,c` skips (d)."""
    assert contention.run_lanes(None, quick=False) == ("a", "b", "c", "d")
    assert contention.run_lanes(None, quick=True) == ("a", "b", "c")
    assert contention.run_lanes("a,b,c", quick=False) == ("a", "b", "c")
    assert contention.run_lanes("a,d", quick=True) == ("a", "d")
    with pytest.raises(BadArgs, match="--lanes takes a,b,c,d"):
        contention.run_lanes(",", quick=False)
    with pytest.raises(BadArgs, match="--lanes takes a,b,c,d"):
        contention.run_lanes("a,e", quick=False)
    p = argparse.ArgumentParser()
    contention._arguments(p)
    assert p.parse_args([]).lanes is None and p.parse_args(["--lanes", "a,b,c"]).lanes == "a,b,c"


def test_lane_d_is_a_binder_lane_with_a_controller_whose_line_is_off():
    assert "d" in contention.BINDER_LANES and contention.SECOND_CLUSTER == ("d",)
    args = contention.controller_args(contention.FULL, line=False)
    assert args[-1] == "--line-enabled=false" and args[:-1] == contention.controller_args(contention.FULL)


def test_reserve_after_reaches_the_controller_only_when_a_plan_sets_it():
    """P5's reservation in the benchmark: the plans keep the controller's default (5 min);
    a plan that sets `reserve_after` passes it to every binder lane's controller."""
    from dataclasses import replace

    for plan in (contention.FULL, contention.QUICK):
        assert plan.reserve_after is None
        assert not [a for a in contention.controller_args(plan) if "reserve-after" in a]
    scaled = replace(contention.FULL, reserve_after=30.0)
    assert "--line-reserve-after=30" in contention.controller_args(scaled)
    assert "--line-reserve-after=30" in contention.controller_args(scaled, line=False)


def test_lanes_may_be_written_with_spaces():
    """A newcomer's find: `--lanes 'a, b'` was refused as an unknown lane ' b'."""
    assert contention.run_lanes("a, b", quick=False) == ("a", "b")
    assert contention.run_lanes(" c ,d ", quick=False) == ("c", "d")
