"""`gpu-binder bench contention`'s drain (issue 39 item 6), no cluster: after the trace's
last arrival a lane keeps running until every scored set is running or done, or a cap
(`Plan.drain`). The end condition (`contention.drained`), a lane's end as the driver makes
it (its sets faked), the figures with starts in the drain (waits resolved, only the cap's
leftovers lower bounds; utilisation and GPU-hours over the trace alone), and the report."""

from __future__ import annotations

import anyio
import pytest

from bench import contention
from bench.contention_metrics import (LaneLog, Nominated, Run, Wait, gpu_hours, inversions,
                                      lane_end, lane_figures, latency_table, max_wait_censored,
                                      utilisation, waiting_at_end)
from bench.contention_report import raw, summary, targets
from bench.contention_trace import ON_DEMAND, PREEMPTIBLE, PRIORITY
from tests.bench.test_contention import trace_of

OD = PRIORITY[ON_DEMAND]


# -- the end condition ---------------------------------------------------------------------

def test_a_lane_is_drained_when_every_scored_set_runs_or_is_done():
    scored = [0, 1, 2]
    assert contention.drained(scored, running={0, 1}, over={2})
    assert contention.drained(scored, running=set(), over={0, 1, 2})  # every set finished
    assert not contention.drained(scored, running={0}, over={2})  # 1 never started
    # 1 started once and was preempted: neither running nor done, its re-wait is open
    assert not contention.drained(scored, running={0, 2}, over=set())
    assert contention.drained([], running=set(), over=set())


def test_the_plans_drain_for_minutes_and_zero_stops_at_the_trace_end():
    assert contention.FULL.drain == 900.0 and contention.QUICK.drain == 180.0
    # ten (six) mean lives: a board's longest residual life rarely passes it
    assert contention.FULL.drain >= 10 * contention.FULL.mean_life
    assert contention.QUICK.drain >= 6 * contention.QUICK.mean_life


# -- the lane's end, its sets faked ----------------------------------------------------------

def _lane(trace, drain: float, behave) -> tuple[contention.Driver, contention.Lane]:
    """A Driver (no API server: its clients are never called) of one lane (a) over `trace`
    with a drain cap of `drain` s, each set replayed by `behave(driver, lane, set)`."""
    plan = contention.Plan(nodes=1, mean_life=50.0, span=trace.span, warmup=trace.warmup,
                           drain=drain)
    lane = contention.Lane("a", "ct-a", ("n0",), LaneLog(("n0",)))
    driver = contention.Driver(object(), plan, trace, {"a": lane})

    async def fake(ln, s):
        try:
            await behave(driver, ln, s)
        finally:
            ln.over.add(s.id)
    driver.set_ = fake
    return driver, lane


async def _runs_forever(driver, lane, s):
    """Started at once, runs past any cap (its run cut at the lane's end)."""
    lane.log.waits.append(Wait(s.id, driver.t(), driver.t()))
    lane.open_runs[s.id] = ("n0", (s.id,), driver.t(), driver.t())
    await anyio.sleep_forever()


async def _never_placed(driver, lane, s):
    lane.open_waits[s.id] = (driver.t(), True, None)
    await anyio.sleep_forever()


def test_a_lane_ends_once_drained_not_at_its_cap_and_cuts_its_runs_there():
    tr = trace_of((0, 1, PREEMPTIBLE, 9), (0, 1, PREEMPTIBLE, 9), span=0.01)
    driver, lane = _lane(tr, drain=3600.0, behave=_runs_forever)
    anyio.run(driver.lane_, lane)
    logs = driver.close()
    assert not lane.log.drain_capped and tr.end <= lane.log.end < tr.end + 3600
    assert sorted(r.set_id for r in logs["a"].runs) == [0, 1]
    assert all(r.stop == lane.log.end and not r.preempted for r in logs["a"].runs)


def test_a_lane_whose_scored_set_never_starts_ends_at_its_cap_with_the_wait_censored():
    tr = trace_of((0, 8, PREEMPTIBLE, 9), span=0.01)
    driver, lane = _lane(tr, drain=0.2, behave=_never_placed)
    anyio.run(driver.lane_, lane)
    log = driver.close()["a"]
    assert log.drain_capped and log.end >= tr.end + 0.2
    assert log.waits == [Wait(0, log.waits[0].begin, None)]
    wait, censored = max_wait_censored(tr, log, 8)
    assert censored and wait == round(log.end - log.waits[0].begin, 2)


def test_a_drain_of_zero_stops_at_the_trace_end_as_before():
    tr = trace_of((0, 8, PREEMPTIBLE, 9), span=0.01)
    driver, lane = _lane(tr, drain=0.0, behave=_never_placed)
    anyio.run(driver.lane_, lane)
    assert lane.log.drain_capped and lane.log.end >= tr.end


# -- the figures with starts in the drain ----------------------------------------------------

def _drained_log() -> tuple:
    """Trace end 100, lane end 160 (the cap): set 0 (8 GPUs) starts in the drain at 130; set
    1 (1 GPU) never starts; set 2 runs 50..150, is preempted at 90 and starts again at 110;
    set 3 ran across the trace's end."""
    tr = trace_of((10, 8, PREEMPTIBLE, 50), (20, 1, PREEMPTIBLE, 30), (50, 2, PREEMPTIBLE, 60),
                  (60, 4, ON_DEMAND, 80))
    log = LaneLog(("n0",), end=160.0, drain_capped=True)
    log.waits += [Wait(0, 10.0, 129.0), Wait(1, 20.0, None), Wait(2, 50.0, 50.0),
                  Wait(2, 90.0, 109.0, first=False), Wait(3, 60.0, 60.0)]
    log.runs += [Run(2, "n0", (0, 1), 50.5, 90.0, preempted=True),
                 Run(3, "n0", (4, 5, 6, 7), 60.5, 140.5),
                 Run(2, "n0", (0, 1), 110.0, 130.0),
                 Run(0, "n0", tuple(range(8)), 141.0, 160.0)]
    return tr, log


def test_a_start_in_the_drain_resolves_the_wait_and_only_the_caps_leftover_is_censored():
    tr, log = _drained_log()
    assert lane_end(tr, log) == 160.0 and lane_end(tr, LaneLog(("n0",))) == tr.end
    assert max_wait_censored(tr, log, 8) == (131.0, False)  # 10 -> 141, in the drain
    lat = latency_table(tr, log)[PREEMPTIBLE]
    assert (lat["8"]["started"], lat["8"]["max_wait_s"], lat["8"]["max_wait_censored"]) == \
        (1, 131.0, False)
    # set 1 waited until the lane's end (the cap), not the trace's: 140 s, a lower bound
    assert (lat["1"]["not_started"], lat["1"]["max_wait_s"], lat["1"]["max_wait_censored"]) == \
        (1, 140.0, True)
    assert (lat["2"]["rewaits"], lat["2"]["rewait_p99_s"]) == (1, 20.0)
    assert waiting_at_end(tr, log) == [1]


def test_utilisation_and_gpu_hours_stay_over_the_trace_while_the_drain_runs():
    tr, log = _drained_log()
    served = 2 * 39.5 + 4 * 39.5  # to the trace's end at 100: set 2's first run, set 3's
    assert utilisation(tr, log) == round(served / (8 * 100), 4)
    assert gpu_hours(tr, log)[ON_DEMAND]["all"] == round(4 * 39.5 / 3600, 4)
    assert gpu_hours(tr, log)[PREEMPTIBLE]["8"] == 0.0  # set 0 ran only in the drain


def test_the_figures_say_how_long_the_drain_took_and_what_fell_in_it():
    tr, log = _drained_log()
    # in the drain: set 1 (1 GPU, preemptible) placed at 105 while an on-demand 8-GPU set
    # asked at 70 fits the empty board and nowhere once it took its GPU; a nomination at 108
    tr = trace_of(*((s.arrive, s.size, s.tier, s.life) for s in tr.sets), (70, 8, ON_DEMAND, 5))
    log.runs[:] = [Run(1, "n0", (0,), 105.0, 106.0)]
    log.waits[:] = [Wait(1, 20.0, 104.0), Wait(4, 70.0, None)]
    log.nominations.append(Nominated(108.0, 4, 8, OD, "n0", ()))
    assert [i["t"] for i in inversions(tr, log)] == [105.0]
    fig = lane_figures(tr, log, min_runtime=5.0)
    assert (fig["drain_s"], fig["drain_capped"], fig["waiting_at_end"]) == (60.0, True, 1)
    assert (fig["inversions"], fig["inversions_in_drain"]) == (1, 1)
    assert (fig["preemptions"], fig["preemptions_in_drain"]) == (1, 1)
    undrained = lane_figures(tr, LaneLog(("n0",)), min_runtime=5.0)
    assert (undrained["drain_s"], undrained["drain_capped"]) == (None, False)


# -- the report ----------------------------------------------------------------------------------

def _lane_8(wait: float, *, drain: float, capped: bool = False) -> dict:
    """Lane figures of one scored 8-GPU set asking at 0 (trace end 100) and starting at
    `wait` (None: never), the lane ending `drain` s after the trace."""
    tr = trace_of((0, 8, PREEMPTIBLE, 50))
    log = LaneLog(("n0",), end=100.0 + drain, drain_capped=capped)
    log.waits.append(Wait(0, 0.0, wait))
    if wait is not None:
        log.runs.append(Run(0, "n0", tuple(range(8)), wait, 100.0 + drain))
    return lane_figures(tr, log, min_runtime=5.0)


def test_the_8_gpu_target_is_known_once_the_drain_started_lane_ds_sets():
    a, d = _lane_8(80.0, drain=30.0), _lane_8(190.0, drain=120.0)
    t = targets({"results": {"a": a, "d": d}})["max_wait_8_with_line"]
    assert t["met"] is True
    assert t["value"] == "80.0 s with the line vs 190.0 s without; drain 30.0 s with, 120.0 s without"
    # the cap hit before (d)'s set started: a lower bound again, said so
    d = _lane_8(None, drain=120.0, capped=True)
    t = targets({"results": {"a": _lane_8(130.0, drain=30.0), "d": d}})["max_wait_8_with_line"]
    assert t["met"] is None
    assert t["value"].endswith("vs ≥220.0 s without; drain 30.0 s with, 120.0 s (capped, 1 "
                               "scored set waiting) without")


def test_the_summary_and_the_raw_log_carry_the_drain():
    a = {**_lane_8(80.0, drain=30.0), "inversions": 2, "inversions_in_drain": 1}
    d = _lane_8(None, drain=120.0, capped=True)
    report = {"seed": 1, "plan": {"nodes": 1, "load": 1.1, "mean_life": 50, "drain": 900.0},
              "trace": {"offered_load": 1.1, "scored": 1, "sets": 1, "digest": "x"},
              "lanes": dict(contention.LANES), "results": {"a": a, "d": d}}
    lines = summary(report)
    assert "drain cap 900 s" in lines[0]
    assert any(line.startswith("(a) ") and "drain 30.0 s, " in line
               and "inversions 2 (1 in the drain)," in line for line in lines)
    assert any(line.startswith("(d) ") and "drain 120.0 s (capped, 1 scored set waiting), "
               in line for line in lines)
    log = LaneLog(("n0",), end=130.0, drain_capped=True)
    assert (raw(log)["end"], raw(log)["drain_capped"]) == (130.0, True)


@pytest.mark.parametrize("given, want", [(None, 900.0), ("0", 0.0), ("45", 45.0)])
def test_the_command_line_sets_the_drain(monkeypatch, tmp_path, given, want):
    got = {}
    monkeypatch.setattr(contention, "run", lambda out, *, plan, **_: got.setdefault("plan", plan)
                        and {"plan": {}, "results": {}, "targets": {}})
    monkeypatch.setattr(contention.cr, "summary", lambda report: [])
    args = ["--out", str(tmp_path), *(() if given is None else ("--drain", given))]
    assert contention.BENCHMARK.main(args) == 0
    assert got["plan"].drain == want


@pytest.mark.parametrize(("given", "want"), [(None, None), ("30", 30.0), ("0", 0.0)])
def test_reserve_after_flag_sets_the_plan(monkeypatch, tmp_path, given, want):
    """`--reserve-after S` runs the binders with `--line-reserve-after=S` (`Plan.reserve_after`);
    without it the controller's default (None: the flag is not passed)."""
    got = {}
    monkeypatch.setattr(contention, "run", lambda out, *, plan, **_: got.setdefault("plan", plan)
                        and {"plan": {}, "results": {}, "targets": {}})
    monkeypatch.setattr(contention.cr, "summary", lambda report: [])
    args = ["--out", str(tmp_path), *(() if given is None else ("--reserve-after", given))]
    assert contention.BENCHMARK.main(args) == 0
    assert got["plan"].reserve_after == want


@pytest.mark.parametrize("flag", ["--drain", "--recreate-delay", "--reserve-after"])
@pytest.mark.parametrize("given", ["-1", "nan", "inf", "1e309"])
def test_a_drain_or_delay_not_finite_and_non_negative_is_refused(capsys, flag, given):
    """A newcomer's find: nan passed (the drain's loop then spins with no cap), inf too."""
    assert contention.BENCHMARK.main([flag, given]) == 2
    assert f"{flag} takes finite seconds >= 0" in capsys.readouterr().err


def test_reserve_after_beyond_the_controllers_bound_is_refused(capsys, monkeypatch):
    """A newcomer's find: 1e12 passed the bench's check, then every binder replica would stop
    with exit 2 ('--line-reserve-after: must be a finite number of seconds of at most 1e+09')
    after the cluster had started."""
    monkeypatch.setattr(contention, "run", lambda *a, **k: pytest.fail("ran a refused value"))
    assert contention.BENCHMARK.main(["--reserve-after", "1e12"]) == 2
    assert "--reserve-after takes at most 1e+09 seconds" in capsys.readouterr().err


@pytest.mark.parametrize(("given", "want"), [(None, 0.3), ("0", 0.0), ("1", 1.0)])
def test_on_demand_share_flag_sets_the_plan(monkeypatch, tmp_path, given, want):
    """`--on-demand-share 0` replays the trace as one tier (issue 39 item 6 is judged within
    one priority: lanes a and d then compare the line alone); without it the two-tier 30 %."""
    got = {}
    monkeypatch.setattr(contention, "run", lambda out, *, plan, **_: got.setdefault("plan", plan)
                        and {"plan": {}, "results": {}, "targets": {}})
    monkeypatch.setattr(contention.cr, "summary", lambda report: [])
    args = ["--out", str(tmp_path), *(() if given is None else ("--on-demand-share", given))]
    assert contention.BENCHMARK.main(args) == 0
    assert got["plan"].on_demand_share == want


@pytest.mark.parametrize("given", ["-0.1", "1.5", "nan", "x"])
def test_an_on_demand_share_outside_0_1_is_refused(capsys, monkeypatch, given):
    monkeypatch.setattr(contention, "run", lambda *a, **k: pytest.fail("ran a refused value"))
    with pytest.raises(SystemExit) as e:
        contention.BENCHMARK.main(["--on-demand-share", given])
    assert e.value.code == 2
    assert "takes a share in [0, 1]" in capsys.readouterr().err
