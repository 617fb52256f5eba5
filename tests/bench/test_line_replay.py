"""`bench.line_replay`: the contention trace replayed in memory through the real model. On a
small trace (2 boards, a minute of arrivals): no node ever holds more than its 8 GPUs, every
scored set starts (the drain ends with none waiting), only preemptible sets are stopped and
each comes back, the replay is deterministic, and the line and its kept reservations are
what the settings say. On hand-made one-board traces (issue 39, P5's 8-GPU target):
preemption off stops nobody and gives the line's own effect, the 8-GPU maximum wait split by
tier, and the re-waits of preempted 8-GPU sets counted."""

from __future__ import annotations

import json

import pytest

from bench.contention_trace import ON_DEMAND, PREEMPTIBLE, CSet, CTrace, make_trace
from bench.line_replay import Lane, Settings, SeedResult, figures, replay, summary
from model.plan import Place

TRACE = make_trace(seed=3, nodes=2, load=1.1, mean_life=30.0, span=90.0, warmup=30.0)


def _peak(log) -> dict[str, int]:
    """The most GPUs any node held at once over `log.runs` (a run holds [start, stop))."""
    peak: dict[str, int] = {}
    for node in {r.node for r in log.runs}:
        runs = [r for r in log.runs if r.node == node]
        for t in {r.start for r in runs}:
            used = sum(len(r.gpus) for r in runs if r.start <= t < r.stop)
            peak[node] = max(peak.get(node, 0), used)
    return peak


@pytest.mark.parametrize("asks", ["rounds", "own"])
def test_the_replay_keeps_capacity_drains_and_is_deterministic(asks):
    for line in (True, False):
        log = replay(TRACE, Settings(line=line, min_runtime=5.0, drain=300.0, asks=asks))
        assert max(_peak(log).values()) <= 8
        assert not log.drain_capped
        started = {r.set_id for r in log.runs}
        assert {s.id for s in TRACE.sets if s.scored} <= started
        assert all(w.decided is not None and w.decided >= w.begin for w in log.waits)
        sets = {s.id: s for s in TRACE.sets}
        stopped = [r for r in log.runs if r.preempted]
        assert all(sets[r.set_id].tier == "preemptible" for r in stopped)
        for r in stopped:  # each victim asks again and runs again
            assert any(w.set_id == r.set_id and not w.first and w.begin == r.stop for w in log.waits)
            assert any(x.set_id == r.set_id and x.start >= r.stop for x in log.runs)
        again = replay(TRACE, Settings(line=line, min_runtime=5.0, drain=300.0, asks=asks))
        assert again.runs == log.runs and again.waits == log.waits


def test_without_the_line_nothing_is_gated_and_with_it_reservations_are_kept():
    seen: list = []
    replay(TRACE, Settings(line=False, min_runtime=5.0, drain=300.0), observe=lambda *a: seen.append(a))
    assert seen == []  # the line off: no gate, no reservation
    for keep in (True, False):
        moves = holders = 0
        last: dict = {}
        seen_holders: set = set()

        def observe(t, line, reserved, actions, snap):
            nonlocal moves, holders, last
            for ident, node in reserved.items():  # a move: held at the last batch, another node now
                if ident in last and last[ident] != node:
                    moves += 1
                holders += ident not in seen_holders
                seen_holders.add(ident)
            last = dict(reserved)
            for a in actions:  # a reserved node takes nobody behind its holder
                if isinstance(a, Place):
                    for ident, node in reserved.items():
                        if node == a.decision.node and ident.vmi != a.request.vmi:
                            holder = line.find(ident)
                            me = line.find(type(ident)(a.request.namespace, a.request.vmi))
                            assert holder is not None
                            assert me is None or me.order_key < holder.order_key or me.priority.value > holder.priority.value

        replay(TRACE, Settings(reserve_after=5.0, min_runtime=5.0, drain=300.0, keep_reservations=keep),
               observe=observe)
        assert holders > 0
        if keep:
            assert moves == 0


# -- preemption off: the line's own effect (issue 39, P5's 8-GPU target) ---------------------

P, OD = PREEMPTIBLE, ON_DEMAND


def _one_board(*sets: tuple[float, int, str, float], span: float = 60.0) -> CTrace:
    """A trace of one 8-GPU board, no warm-up (every set scored): (arrive, size, tier, life)
    per set, ids in order. The replay's rounds are every 2 s from 0: a set arriving at
    0.5 asks first at 2."""
    return CTrace(1, 1, 1.0, 50.0, 0.0, span,
                  0.3, tuple(CSet(i, a, z, t, life, True) for i, (a, z, t, life) in enumerate(sets)))


# 0 (preemptible, 8) runs from 2 s; 1 (preemptible, 8) asks at 12 s; 2 (on-demand, 8) at 22 s
TIERS_TRACE = _one_board((0.5, 8, P, 100.0), (10.5, 8, P, 10.0), (20.5, 8, OD, 10.0))


def _lane(trace, **kw):
    log = replay(trace, Settings(min_runtime=5.0, drain=300.0, **kw))
    return log, figures(trace, log)


def test_preemption_off_nobody_is_stopped_and_the_line_orders_priority_first():
    # on: 2 preempts 0 at 22 s (run 20 s >= 5) and starts at 24 s; 0 asks again from 22 s.
    # With the line 1 (refused at 12 s) goes before 0 (refused again at 24 s) when 2 ends at
    # 34 s; without it the round's shuffle gave the board to 0 again, and 1 waits for its end
    log, a = _lane(TIERS_TRACE, preemption=True)
    assert [(r.set_id, r.start, r.stop, r.preempted) for r in log.runs][:3] == \
        [(0, 2.0, 22.0, True), (2, 24.0, 34.0, False), (1, 34.0, 44.0, False)]
    assert (a.max_wait, a.by_tier, a.rewaits, a.longest_rewait) == \
        (23.5, {OD: (3.5, False), P: (23.5, False)}, {OD: {}, P: {0: 1}}, {OD: (None, False), P: (22.0, False)})
    _, d = _lane(TIERS_TRACE, line=False, preemption=True)
    assert (d.max_wait, d.longest_tier(), d.rewaits[P], d.longest_rewait[P]) == (103.5, P, {0: 1}, (12.0, False))
    # off: 0 runs its whole life (to 102 s); then on-demand 2 (P5: priority first) and 1
    for line in (True, False):
        log, x = _lane(TIERS_TRACE, line=line, preemption=False)
        assert not any(r.preempted for r in log.runs) and all(w.first for w in log.waits)
        assert [(r.set_id, r.start) for r in log.runs] == [(0, 2.0), (2, 102.0), (1, 112.0)]
        assert (x.max_wait, x.by_tier, x.rewaits) == (101.5, {OD: (81.5, False), P: (101.5, False)}, {OD: {}, P: {}})
        assert x.longest_tier() == P and x.longest_rewait == {OD: (None, False), P: (None, False)}


# 1 (8 GPUs) asks at 12 s behind 0 (4 GPUs, to 52 s); 4-GPU sets 2 and 3 keep taking the half
# board left free: the 8-GPU VM behind a stream of small ones
STREAM = _one_board((0.5, 4, P, 50.0), (10.5, 8, P, 10.0), (20.5, 4, P, 50.0), (60.5, 4, P, 50.0), span=70.0)


def test_preemption_off_the_line_reserves_for_the_8_gpu_set_behind_a_stream():
    _, d = _lane(STREAM, line=False, preemption=False)
    assert d.by_tier[P] == (101.5, False)  # 2 backfills at 22 s (to 72 s), 3 at 62 s (to 112 s)
    _, a300 = _lane(STREAM, reserve_after=300.0, preemption=False)
    assert a300.max_wait == 101.5  # no head waits 300 s: 2 and 3 backfill as without the line
    log, a5 = _lane(STREAM, reserve_after=5.0, preemption=False)
    assert a5.max_wait == 41.5  # 1 reserves the board at 22 s, starts when 0 ends at 52 s
    assert [(r.set_id, r.start) for r in log.runs][:2] == [(0, 2.0), (1, 52.0)]
    r = SeedResult.of(1, a5, d)
    assert (r.with_line, r.without_line, r.censored) == (41.5, 101.5, (False, False))
    assert round(r.ratio, 3) == round(r.tier_ratio(P), 3) == 0.409 and r.tier_ratio(OD) is None


# two boards, each full with two 4-GPU sets (n1's end at 42 and 55 s, n0's at 47 and 52 s);
# 8-GPU sets 4 and 5 ask at 12 and 14 s, 4-GPU set 6 at 32 s (behind both)
TWO_BOARDS = CTrace(1, 2, 1.0, 50.0, 0.0, 60.0, 0.0, tuple(
    CSet(i, a, z, P, life, True) for i, (a, z, life) in enumerate(
        [(0.5, 4, 40.0), (0.5, 4, 50.0), (0.5, 4, 45.0), (0.5, 4, 53.0), (10.5, 8, 10.0), (11.5, 8, 10.0),
         (30.5, 4, 50.0)])))


def test_the_set_next_behind_the_head_reserves_a_second_board():
    """`Settings.reserving` (`model.line.LineSettings.reserving`): with the head alone
    reserving (1, before), 8-GPU set 5 waits behind 4, n1's half freed at 42 s goes to 4-GPU
    set 6 and 5 starts on n0 after 4 (62 s); with the default (2) 5 reserves n1 too, which
    takes nobody behind it, and 5 starts there at 56 s (the round after 55 s)."""
    runs = {}
    for n in (1, 2):
        most = 0

        def observe(t, line, reserved, actions, snap):
            nonlocal most
            most = max(most, len(reserved))

        log = replay(TWO_BOARDS, Settings(reserve_after=5.0, reserving=n, min_runtime=5.0, drain=300.0,
                                          preemption=False), observe=observe)
        runs[n] = (most, sorted((r.set_id, r.node, r.start) for r in log.runs if r.set_id >= 4),
                   figures(TWO_BOARDS, log).max_wait)
    assert runs[1] == (1, [(4, "n0", 52.0), (5, "n0", 62.0), (6, "n1", 42.0)], 50.5)
    assert runs[2] == (2, [(4, "n0", 52.0), (5, "n1", 56.0), (6, "n0", 62.0)], 44.5)
    assert Settings().reserving == 2


def test_summary_per_tier_and_re_waits():
    def lane(od, p, rewaits=None, longest=None):
        m = max(x for x in (od, p) if x is not None)
        return Lane(m, False, {OD: (od, False), P: (p, False)}, {OD: {}, P: rewaits or {}},
                    {OD: (None, False), P: (longest, False)})
    rs = [SeedResult.of(1, lane(50.0, 100.0, {7: 2}, 80.0), lane(100.0, 400.0, {7: 1, 9: 1}, 30.0)),
          SeedResult.of(2, lane(300.0, 200.0), lane(200.0, 400.0, {4: 3}, 50.0)),
          SeedResult.of(3, lane(None, 120.0), lane(None, 200.0))]
    s = summary(rs)
    assert (s["ratios"], s["median"], s["min"], s["max"], s["met"]) == (3, 0.6, 0.25, 0.75, 1)
    assert {k: s["tiers"][OD][k] for k in ("ratios", "median", "min", "max", "met")} == \
        {"ratios": 2, "median": 1.0, "min": 0.5, "max": 1.5, "met": 1}
    assert (s["tiers"][P]["median"], s["tiers"][P]["met"]) == (0.5, 2)
    assert (s["tiers"][OD]["longest_with_line"], s["tiers"][P]["longest_with_line"]) == (1, 2)
    assert (s["tiers"][OD]["longest_without_line"], s["tiers"][P]["longest_without_line"]) == (0, 3)
    assert s["rewaits_8gpu"]["with_line"][P] == {"sets": 1, "rewaits": 2, "most": 2, "median_longest_s": 80.0}
    assert s["rewaits_8gpu"]["without_line"][P] == {"sets": 3, "rewaits": 5, "most": 3, "median_longest_s": 40.0}
    assert s["rewaits_8gpu"]["with_line"][OD] == {"sets": 0, "rewaits": 0, "most": 0, "median_longest_s": None}


def test_cli_preemption_off_replays_both_lanes_without_preemption(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(line_replay, "trace_of", lambda seed, **kw: STREAM)
    assert line_replay.main(["--seeds", "1", "--reserve-after", "5", "--preemption", "off",
                             "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [x.split(" {")[0] for x in out] == [
        "preemption off, reserveAfter 5 s, 2 reserving, reservations chosen afresh",
        "preemption off, reserveAfter 5 s, 2 reserving, reservations kept"]
    doc = json.loads((tmp_path / "line-replay.json").read_text())
    assert doc["settings"]["preemption"] == [False]
    kept = doc["variants"][1]
    # the lane without the line asks on its own (`ASKS_WITHOUT_LINE`): 2 and 3 take the half
    # board at their arrivals (20.5, 60.5 s), 1 starts at its first ask after 3's end (110.5 s)
    assert (kept["preemption"], kept["keep_reservations"], kept["reserving"], kept["summary"]["median"]) == (
        False, True, 2, 0.412)
    seed = kept["seeds"][0]
    assert seed["by_tier"][P] == {"with_line_s": 41.5, "without_line_s": 100.67, "ratio": 0.412,
                                  "censored": [False, False]}
    assert seed["by_tier"][OD]["ratio"] is None
    assert seed["rewaits_8gpu"] == {"with_line": {OD: {}, P: {}}, "without_line": {OD: {}, P: {}}}


def test_summary_of_ratios():
    rs = [SeedResult(1, 100.0, 400.0), SeedResult(2, 300.0, 400.0), SeedResult(3, 200.0, 400.0),
          SeedResult(4, None, 10.0)]
    s = summary(rs)
    assert s["ratios"] == 3 and s["median"] == 0.5 and s["min"] == 0.25 and s["max"] == 0.75
    assert s["met"] == 2 and s["median_with_line_s"] == 200.0 and s["median_without_line_s"] == 400.0


# -- the command line: a refused value is one line and exit 2, before any replay -------------


from bench import line_replay  # noqa: E402


@pytest.mark.parametrize("argv", [
    ["--seeds", "0"], ["--seeds", "-1"], ["--seeds", "1001"], ["--seeds", "99999999999"],
    ["--reserve-after", "nan"], ["--reserve-after", "inf"], ["--reserve-after", "-1"],
    ["--out", ""], ["--preemption", "none"], ["--on-demand-share", "1.5"],
    ["--on-demand-share", "-0.1"], ["--on-demand-share", "nan"], ["--reserving", "0"], ["--reserving", "x"],
    ["--keep", "afresh"], ["--asks-without-line", "batch"], ["--asks-with-line", ""], ["--latency", "-1"],
    ["--latency", "nan"],
])
def test_cli_refuses_bad_values(argv, capsys, monkeypatch):
    # on the old code: --seeds 0/-1 printed empty summaries and exited 0, --reserve-after
    # nan/inf/-1 ended in a traceback, --out '' wrote line-replay.json into the working directory
    monkeypatch.setattr(line_replay, "trace_of", lambda seed, **kw: pytest.fail("replayed a refused value"))
    with pytest.raises(SystemExit) as exc:
        line_replay.main([*argv, "--seeds" if argv[0] != "--seeds" else "--first-seed", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[0]}:" in err and "Traceback" not in err


def test_cli_reserving_and_kept_only_with_utilisation(tmp_path, capsys, monkeypatch):
    """`--reserving N` (repeatable) and `--keep kept`: one variant per value, reservations kept
    only; each variant's summary and each seed give the GPU utilisation with and without the
    line (`Lane.utilisation`), so a rule cannot buy its waits with idle GPUs unseen."""
    monkeypatch.setattr(line_replay, "trace_of", lambda seed, **kw: TWO_BOARDS)
    assert line_replay.main(["--seeds", "1", "--reserve-after", "5", "--reserving", "1", "--reserving", "2",
                             "--keep", "kept", "--preemption", "off", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [x.split(" {")[0] for x in out] == [
        "preemption off, reserveAfter 5 s, 1 reserving, reservations kept",
        "preemption off, reserveAfter 5 s, 2 reserving, reservations kept"]
    doc = json.loads((tmp_path / "line-replay.json").read_text())
    one, two = doc["variants"]
    assert (one["reserving"], two["reserving"]) == (1, 2)
    assert one["seeds"][0]["with_line_s"] == 50.5 and two["seeds"][0]["with_line_s"] == 44.5
    u1, u2 = one["summary"]["utilisation"], two["summary"]["utilisation"]
    assert u1["without_line"] == u2["without_line"] == one["seeds"][0]["utilisation"][1]
    assert (u1["with_line"], u2["with_line"]) == (one["seeds"][0]["utilisation"][0], two["seeds"][0]["utilisation"][0])
    assert u2["change_points"] == round(100 * (u2["with_line"] - u2["without_line"]), 2)
    assert u1["with_line"] > u2["with_line"]  # n1 half idle from 42 to 56 s for set 5


def test_cli_on_demand_share_0_replays_one_tier():
    """`--on-demand-share 0`: every set of the trace preemptible (one tier), the same arrivals
    and sizes as the default trace of that seed; the default keeps 30 % on-demand."""
    one, two = line_replay.trace_of(1, on_demand_share=0.0), line_replay.trace_of(1)
    assert {s.tier for s in one.sets} == {"preemptible"}
    assert {s.tier for s in two.sets} == {"preemptible", "on-demand"}
    assert [(s.arrive, s.size, s.life) for s in one.sets] == [(s.arrive, s.size, s.life) for s in two.sets]


# -- when the sets ask: rounds (one shuffled batch each 2 s) or each on its own, as the
# cluster's driver (lane (d) of bench contention) ---------------------------------------------

# 0 (8 GPUs) runs 0.5-9.5 s; 1 (8) asks at 1, 3, ... s; 2 (1 GPU, 20 s) arrives at 10.3 s
FIRST_ASKER = _one_board((0.5, 8, P, 9.0), (1.0, 8, P, 10.0), (10.3, 1, P, 20.0))


def test_own_asks_freed_room_goes_to_whoever_asks_first_after_it_frees():
    """`Settings.asks` "own" (the cluster's lane without the line: a create at arrival, then
    every 2 s after a refusal, each decided alone): the board freed at 9.5 s is empty when
    1-GPU set 2 arrives at 10.3 s, before 8-GPU set 1's next ask (11 s), so 2 takes it and
    1 waits for 2's end (30.3 s), starting at its next ask, 31 s. In rounds (before) every
    set asked at the rounds 2, 4, ... s: 0 and 1 shuffled at 2 s, 2 only at 12 s."""
    log, d = _lane(FIRST_ASKER, line=False, preemption=False, asks="own")
    assert [(r.set_id, r.start, r.stop) for r in log.runs] == [(0, 0.5, 9.5), (2, 10.3, 30.3), (1, 31.0, 41.0)]
    assert sorted((w.set_id, w.begin, w.decided) for w in log.waits) == [
        (0, 0.5, 0.5), (1, 1.0, 31.0), (2, 10.3, 10.3)]
    assert (d.max_wait, d.waits) == (30.0, ((0, 8, 0.5, 0.5), (1, 8, 1.0, 31.0), (2, 1, 10.3, 10.3)))
    rounds, _ = _lane(FIRST_ASKER, line=False, preemption=False)
    assert all(r.start % 2 == 0 for r in rounds.runs)  # every start on a round


def test_the_lane_without_the_line_asks_on_its_own_with_the_clusters_latency():
    """`without_line` (and the CLI's lane without the line) replays with asks "own" and
    `LATENCY`: 8-GPU set 1 of `FIRST_ASKER` asks 15 times before 2 ends at 30.3 s, each answer
    up to 0.03 s late, so it starts at its first ask after 30.3 s, 31 s plus that drift (30 s
    with no latency; rounds: 31 s, its start at the round 32 s)."""
    assert (line_replay.ASKS_WITHOUT_LINE, line_replay.LATENCY) == ("own", 0.03)
    wait, censored = line_replay.without_line(FIRST_ASKER, preemption=False)
    assert 30.0 < wait < 30.0 + 15 * 0.03 and not censored
    assert line_replay.with_line(FIRST_ASKER, Settings(line=False, preemption=False)) == (31.0, False)


def test_own_asks_a_victim_asks_again_at_once():
    # 0 (preemptible, 8) runs from 0.5 s; on-demand 1 (8) asks at 20.5 s and is nominated:
    # 0 is stopped then and asks again at that instant; 1 starts at its next ask, 22.5 s
    log, _ = _lane(_one_board((0.5, 8, P, 100.0), (20.5, 8, OD, 10.0)), line=False, asks="own")
    assert [(r.set_id, r.start, r.stop, r.preempted) for r in log.runs][:2] == [
        (0, 0.5, 20.5, True), (1, 22.5, 32.5, False)]
    assert [(w.set_id, w.begin, w.first) for w in log.waits if not w.first] == [(0, 20.5, False)]


def test_the_ask_order_and_an_unknown_asks():
    """`Settings.order`: 0 is the seed's own shuffle (the figures before it existed); another
    value replays the same trace in another ask order."""
    base = replay(TRACE, Settings(line=False, min_runtime=5.0, drain=300.0))
    same = replay(TRACE, Settings(line=False, min_runtime=5.0, drain=300.0, order=0))
    assert same.runs == base.runs
    others = [replay(TRACE, Settings(line=False, min_runtime=5.0, drain=300.0, order=k)).runs for k in (1, 2, 3)]
    assert any(o != base.runs for o in others)
    with pytest.raises(ValueError, match="asks"):
        replay(TRACE, Settings(asks="batch"))


def test_cli_asks_and_set_waits(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(line_replay, "trace_of", lambda seed, **kw: FIRST_ASKER)
    assert line_replay.main(["--seeds", "1", "--reserve-after", "5", "--keep", "kept", "--preemption", "off",
                             "--asks-without-line", "own", "--latency", "0", "--set-waits",
                             "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "line-replay.json").read_text())
    assert doc["settings"]["asks"] == {"with_line": "rounds", "without_line": "own"}
    seed = doc["variants"][0]["seeds"][0]
    assert seed["without_line_s"] == 30.0
    assert seed["set_waits"]["without_line"] == [[0, 8, 0.5, 0.5], [1, 8, 1.0, 31.0], [2, 1, 10.3, 10.3]]
    assert [w[0] for w in seed["set_waits"]["with_line"]] == [0, 1, 2]
    assert line_replay.main(["--seeds", "1", "--reserve-after", "5", "--keep", "kept", "--preemption", "off",
                             "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "line-replay.json").read_text())
    assert doc["settings"]["asks"]["without_line"] == line_replay.ASKS_WITHOUT_LINE
    assert doc["settings"]["latency_s"] == line_replay.LATENCY
    assert "set_waits" not in doc["variants"][0]["seeds"][0]
