"""`gpu-binder bench contention`'s pure parts (issue 39 item 6), no cluster: the two-tier
trace, the lane's figures (latency, GPU-hours, utilisation, the 8-GPU wait), priority
inversions, the brute-force check of each preemption, the targets and the summary."""

from __future__ import annotations

import pytest

from bench import contention
from bench.contention_metrics import (LaneLog, Nominated, Run, Wait, brute_force_minimum,
                                      gpu_hours, inversions, lane_figures, latency_table,
                                      max_wait, preemption_check, stops_without_nomination,
                                      utilisation)
from bench.contention_report import raw, summary, targets
from bench.contention_trace import (ON_DEMAND, PREEMPTIBLE, PRIORITY, CSet, CTrace,
                                    make_trace, offered)

OD, PE = PRIORITY[ON_DEMAND], PRIORITY[PREEMPTIBLE]


def trace_of(*sets: tuple[float, int, str, float], nodes: int = 1, warmup: float = 0.0,
             span: float = 100.0) -> CTrace:
    """A hand-made trace: (arrive, size, tier, life) per set, ids in order, all scored
    after `warmup`."""
    return CTrace(1, nodes, 1.1, 50.0, warmup, span, 0.3,
                  tuple(CSet(i, a, z, t, life, a >= warmup) for i, (a, z, t, life) in enumerate(sets)))


# -- the trace -----------------------------------------------------------------------------

def test_the_trace_is_seeded_two_tiered_and_offers_exactly_its_load():
    a = make_trace(seed=3, nodes=2, load=1.1, mean_life=30, span=90, warmup=30)
    b = make_trace(seed=3, nodes=2, load=1.1, mean_life=30, span=90, warmup=30)
    assert a == b and a.digest() == b.digest()
    assert a.digest() != make_trace(seed=4, nodes=2, load=1.1, mean_life=30, span=90,
                                    warmup=30).digest()
    assert {s.tier for s in a.sets} == {ON_DEMAND, PREEMPTIBLE}
    assert {s.size for s in a.sets} <= {1, 2, 4, 8}
    assert offered(a) == pytest.approx(1.1)
    assert all(s.scored == (s.arrive >= 30) for s in a.sets)
    assert max(s.arrive for s in a.sets) < a.end == 120


@pytest.mark.parametrize("bad", [dict(nodes=0), dict(load=0), dict(span=0), dict(warmup=-1),
                                 dict(on_demand_share=1.5)])
def test_a_trace_of_bad_sizes_is_refused(bad):
    args = dict(seed=1, nodes=1, load=1.1, mean_life=10, span=10, warmup=0) | bad
    with pytest.raises(ValueError):
        make_trace(**args)


# -- latency, GPU-hours, utilisation ---------------------------------------------------------

def _two_sets_log() -> tuple[CTrace, LaneLog]:
    tr = trace_of((0, 8, PREEMPTIBLE, 40), (10, 8, ON_DEMAND, 20), (12, 1, PREEMPTIBLE, 5))
    log = LaneLog(("n0",))
    log.waits += [Wait(0, 0.0, 0.5), Wait(1, 10.0, 30.0), Wait(2, 12.0, None)]
    log.runs += [Run(0, "n0", tuple(range(8)), 1.0, 30.0, preempted=True),
                 Run(1, "n0", tuple(range(8)), 31.0, 51.0)]
    log.waits.append(Wait(0, 30.0, None, first=False))
    return tr, log


def test_latency_is_first_ask_to_bound_per_tier_and_size_with_the_unstarted_censored():
    tr, log = _two_sets_log()
    lat = latency_table(tr, log)
    assert lat[ON_DEMAND]["8"] == {"sets": 1, "started": 1, "not_started": 0, "p50_s": 21.0,
                                   "p50_censored": False, "p99_s": 21.0, "p99_censored": False,
                                   "started_p99_s": 21.0, "max_wait_s": 21.0,
                                   "max_wait_censored": False, "rewaits": 0,
                                   "rewait_p99_s": None}
    assert lat[PREEMPTIBLE]["8"]["p99_s"] == 1.0
    one = lat[PREEMPTIBLE]["1"]
    assert (one["started"], one["not_started"], one["max_wait_s"], one["max_wait_censored"]) == \
        (0, 1, 88.0, True)
    # the set never started counts, as a lower bound, in the tier's quantiles
    both = lat[PREEMPTIBLE]["all"]
    assert (both["sets"], both["p99_s"], both["p99_censored"], both["started_p99_s"]) == \
        (2, 88.0, True, 1.0)
    assert max_wait(tr, log, 8) == 21.0
    assert max_wait(tr, log, 4) is None


def test_gpu_hours_and_utilisation_count_what_ran():
    tr, log = _two_sets_log()
    h = gpu_hours(tr, log)
    assert h[PREEMPTIBLE]["8"] == round(8 * 29 / 3600, 4)
    assert h[ON_DEMAND]["all"] == round(8 * 20 / 3600, 4)
    assert utilisation(tr, log) == round((8 * 29 + 8 * 20) / (8 * 100), 4)


# -- inversions ---------------------------------------------------------------------------------

def test_a_lower_tier_start_on_room_a_waiting_higher_tier_set_fits_is_an_inversion():
    # the on-demand set (8 GPUs) fits the empty board now, and nowhere once the run took a GPU
    tr = trace_of((0, 8, ON_DEMAND, 50), (5, 1, PREEMPTIBLE, 50))
    log = LaneLog(("n0",))
    log.waits += [Wait(0, 0.0, None), Wait(1, 5.0, 6.0)]
    log.runs.append(Run(1, "n0", (0,), 6.5, 50.0))
    got = inversions(tr, log)
    assert got == [{"t": 6.5, "set": 1, "tier": PREEMPTIBLE, "node": "n0", "waiting": [0]}]


def test_no_inversion_when_the_higher_tier_set_does_not_fit_or_asked_later_or_is_lower():
    # the 8-GPU on-demand set cannot fit: a GPU is taken by a running set
    tr = trace_of((0, 1, PREEMPTIBLE, 90), (1, 8, ON_DEMAND, 50), (5, 1, PREEMPTIBLE, 50),
                  (20, 2, ON_DEMAND, 9))
    log = LaneLog(("n0",))
    log.waits += [Wait(0, 0.0, 0.1), Wait(1, 1.0, None), Wait(2, 5.0, 6.0),
                  Wait(3, 20.0, 21.0)]
    log.runs += [Run(0, "n0", (0,), 0.2, 90.0), Run(2, "n0", (1,), 6.5, 50.0),
                 Run(3, "n0", (2, 3), 21.5, 30.0)]
    assert inversions(tr, log) == []
    # the on-demand set asked after the preemptible one was placed: not ahead of it
    tr2 = trace_of((0, 1, PREEMPTIBLE, 9), (2, 1, ON_DEMAND, 9))
    log2 = LaneLog(("n0",))
    log2.waits += [Wait(0, 0.0, 1.0), Wait(1, 2.0, None)]
    log2.runs.append(Run(0, "n0", (0,), 3.0, 9.0))
    assert inversions(tr2, log2) == []


def test_no_inversion_when_the_waiting_set_still_fits_once_the_run_took_its_gpus():
    """P5's backfill, exactly (docs/contract.md): a set ahead that can still be placed
    once the run's placement is carried out, on the same board or another, does not hold
    the run back. Found by bench contention: a 1-GPU victim's freed GPU taken beside the
    preemptor's nominated one was counted as an inversion."""
    tr = trace_of((0, 2, ON_DEMAND, 50), (5, 1, PREEMPTIBLE, 50), nodes=2)
    log = LaneLog(("n0", "n1"))
    log.waits += [Wait(0, 0.0, None), Wait(1, 5.0, 6.0)]
    log.runs.append(Run(1, "n0", (0,), 6.5, 50.0))
    assert inversions(tr, log) == []
    # n0 full but for the run's GPU, n1 free: the 2-GPU set still fits on n1
    log.runs.append(Run(1, "n0", tuple(range(1, 8)), 1.0, 60.0))
    assert inversions(tr, log) == []


def test_no_inversion_for_a_waiting_set_of_the_warm_up():
    """The docstring's "scored set": a set that asked during the warm-up is not counted
    (found by bench contention: a warm-up set in flight counted in lanes (a) and (c))."""
    tr = trace_of((0, 8, ON_DEMAND, 50), (5, 1, PREEMPTIBLE, 50), warmup=1.0)
    log = LaneLog(("n0",))
    log.waits += [Wait(0, 0.0, None), Wait(1, 5.0, 6.0)]
    log.runs.append(Run(1, "n0", (0,), 6.5, 50.0))
    assert inversions(tr, log) == []


# -- preemptions against the brute force -----------------------------------------------------

def test_the_brute_force_takes_the_fewest_victims_that_free_a_whole_partition():
    # board: partition pairs by module id, not PCI order (bench.packing_hgx): find a pair
    from bench.packing_hgx import partition_of

    pair = next((i, j) for i in range(8) for j in range(i + 1, 8) if partition_of((i, j)) is not None)
    running = {"n0": [(10 + g, PE, (g,)) for g in range(8)]}  # a 1-GPU set on every GPU
    assert brute_force_minimum({"n0": frozenset()}, running, 2) == (PE, 2, 2)
    one_free = {"n0": [r for r in running["n0"] if r[2] != (pair[1],)]}
    assert brute_force_minimum({"n0": frozenset({pair[1]})}, one_free, 2) == (PE, 1, 1)
    assert brute_force_minimum({"n0": frozenset()}, running, 8) == (PE, 8, 8)
    assert brute_force_minimum({"n0": frozenset()}, {}, 2) is None
    assert brute_force_minimum({"n0": frozenset(range(8))}, {}, 8) == (0, 0, 0)


def test_a_nomination_is_minimal_when_no_smaller_set_of_victims_frees_room():
    tr = trace_of(*[(0, 1, PREEMPTIBLE, 90)] * 8, (10, 8, ON_DEMAND, 20), (10, 1, ON_DEMAND, 5))
    log = LaneLog(("n0",))
    log.runs += [Run(i, "n0", (i,), 0.5, 12.0 if i < 8 else 90, preempted=True) for i in range(8)]
    log.nominations.append(Nominated(11.0, 8, 8, OD, "n0", tuple(range(8))))
    log.nominations.append(Nominated(11.5, 8, 8, OD, "n0", tuple(range(8))))  # seen again
    got = preemption_check(tr, log, min_runtime=5.0)
    assert len(got) == 1 and got[0]["minimal"] and got[0]["brute_force"] == [PE, 8, 8]
    # a 1-GPU preemptor needs one victim: naming two is not minimal
    log.nominations.append(Nominated(11.7, 9, 1, OD, "n0", (0, 1)))
    got = preemption_check(tr, log, min_runtime=5.0)
    assert [c["minimal"] for c in got] == [True, False]
    # sets that have not run min_runtime are no candidates: no brute-force plan at all
    assert preemption_check(tr, log, min_runtime=60.0)[0]["brute_force"] is None


def test_a_stopped_set_the_binder_has_not_released_yet_still_holds_its_gpus():
    # set 0 stopped at 10 but its devices went only at 12: a nomination at 11 that names
    # it (the binder's snapshot) is as small as the brute force on the same record
    tr = trace_of((0, 8, PREEMPTIBLE, 10), (10.5, 8, ON_DEMAND, 20))
    log = LaneLog(("n0",))
    log.runs.append(Run(0, "n0", tuple(range(8)), 0.5, 10.0, held_until=12.0))
    log.nominations.append(Nominated(11.0, 1, 8, OD, "n0", (0,)))
    assert Run(0, "n0", (0,), 0.5, 10.0, held_until=12.0).freed == 12.0
    assert preemption_check(tr, log, min_runtime=5.0)[0]["minimal"] is True


def test_room_another_nomination_holds_is_not_free_to_the_brute_force():
    tr = trace_of((0, 1, PREEMPTIBLE, 90), (10, 8, ON_DEMAND, 20), (11, 1, ON_DEMAND, 5))
    log = LaneLog(("n0",))
    log.runs.append(Run(0, "n0", (0,), 0.5, 90.0))
    # the 8-GPU preemptor's nomination holds the seven free GPUs until it is deleted at 20
    log.nominations.append(Nominated(10.5, 1, 8, OD, "n0", (0,), tuple(range(1, 8)), gone=20.0))
    log.nominations.append(Nominated(12.0, 2, 1, OD, "n0", (0,)))
    got = preemption_check(tr, log, min_runtime=5.0)
    assert [(c["preemptor"], c["minimal"], c["room_was_free"]) for c in got] == \
        [(1, True, False), (2, True, False)]
    # once it is gone the room was free: the 1-GPU nomination named a victim it did not need
    log.nominations[0] = Nominated(10.5, 1, 8, OD, "n0", (0,), tuple(range(1, 8)), gone=11.0)
    got = preemption_check(tr, log, min_runtime=5.0)
    assert (got[1]["minimal"], got[1]["room_was_free"]) == (False, True)


def test_an_admitted_set_holds_its_gpus_from_its_admission():
    run = Run(1, "n0", (0, 1), start=5.0, stop=9.0, held_from=4.0)
    assert run.taken == 4.0 and Run(0, "n0", (0,), 5.0, 9.0).taken == 5.0
    tr = trace_of((0, 8, ON_DEMAND, 50), (1, 2, PREEMPTIBLE, 8))
    log = LaneLog(("n0",))
    log.waits += [Wait(0, 0.0, None), Wait(1, 1.0, 4.0)]
    log.runs.append(run)
    # the on-demand set asked first, fits the empty board, and waited: an inversion at 4.0
    assert inversions(tr, log)[0]["t"] == 4.0
    assert raw(log)["runs"] == [[1, "n0", [0, 1], 4.0, 5.0, 9.0, None, False]]


def test_a_stop_no_nomination_named_is_counted():
    log = LaneLog(("n0",))
    log.runs += [Run(0, "n0", (0,), 0, 5, preempted=True), Run(1, "n0", (1,), 0, 9, preempted=True)]
    log.nominations.append(Nominated(4.0, 2, 1, OD, "n0", (0,)))
    assert stops_without_nomination(log) == 1


# -- targets and summary ------------------------------------------------------------------------

def _report(a_lat=12.0, inv=0, ua=0.9, uc=0.89) -> dict:
    tr, log = _two_sets_log()
    fig = lane_figures(tr, log, min_runtime=5.0)
    a = {**fig, "inversions": inv, "utilisation": ua, "minimal_share": 1.0, "preemptions": 3}
    a["latency"][ON_DEMAND]["all"]["p99_s"] = a_lat
    return {"quick": True, "seed": 1, "plan": {"nodes": 1, "load": 1.1, "mean_life": 50},
            "trace": {"offered_load": 1.1, "scored": 3, "sets": 3, "digest": "x"},
            "load_before": (1.0, 1.0, 1.0), "load_after": (2.0, 2.0, 2.0),
            "lanes": dict(contention.LANES),
            "results": {"a": a, "b": fig, "c": {**fig, "utilisation": uc},
                        "d": {"available": False, "why": contention.NO_LINE}}}


def test_the_targets_sit_beside_the_figures():
    t = targets(_report())
    assert t["on_demand_p99"]["met"] is True and "kube-scheduler alone" in t["on_demand_p99"]["value"]
    assert t["victims_minimal"]["met"] is True
    assert t["inversions"]["met"] is True and t["partial_stops"]["met"] is True
    assert t["utilisation_vs_no_preemption"]["met"] is True
    assert t["max_wait_8_with_line"]["met"] is None  # lane (d) not run: said, not guessed
    assert "not run" in t["max_wait_8_with_line"]["value"]
    censored = _report()
    censored["results"]["a"]["latency"][ON_DEMAND]["all"]["p99_censored"] = True
    assert targets(censored)["on_demand_p99"]["met"] is None  # "at least 12 s": not known
    assert "≥12.0 s" in targets(censored)["on_demand_p99"]["value"]
    bad = targets(_report(a_lat=31.0, inv=2, ua=0.81, uc=0.85))
    assert [bad[k]["met"] for k in ("on_demand_p99", "inversions",
                                    "utilisation_vs_no_preemption")] == [False, False, False]
    assert bad["utilisation_vs_no_preemption"]["value"] == "0.81 vs 0.85 (-4.00 points)"
    # what preemption costs is bounded; serving more GPU time than (c) is not a cost
    above = targets(_report(ua=0.9, uc=0.85))["utilisation_vs_no_preemption"]
    assert above["met"] is True and above["value"] == "0.9 vs 0.85 (+5.00 points)"
    assert above["target"] == "at most 3 points below"
    edge = targets(_report(ua=0.82, uc=0.85))["utilisation_vs_no_preemption"]
    assert edge["met"] is True and edge["value"].endswith("(-3.00 points)")


def test_the_summary_names_each_lane_and_the_load():
    lines = summary(_report())
    assert lines[0].startswith("contention (quick): 1 HGX boards") and "1.00 / 1.00 / 1.00 -> 2.00" in lines[0]
    assert any(line.startswith("(a) gpu-binder: preemption and the line") for line in lines)
    assert any(line.startswith("(d) gpu-binder without the line: not run") for line in lines)
    assert any("on-demand: all" in line for line in lines)


def test_the_command_line_refuses_a_bad_value_before_anything_starts(capsys):
    assert contention.BENCHMARK.main(["--lanes", "a,x"]) == 2
    assert "--lanes takes a,b,c" in capsys.readouterr().err
    assert contention.BENCHMARK.main(["--recreate-delay", "-1"]) == 2
    assert "--recreate-delay takes finite seconds >= 0" in capsys.readouterr().err
