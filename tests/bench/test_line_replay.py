"""`bench.line_replay`: the contention trace replayed in memory through the real model. On a
small trace (2 boards, a minute of arrivals): no node ever holds more than its 8 GPUs, every
scored set starts (the drain ends with none waiting), only preemptible sets are stopped and
each comes back, the replay is deterministic, and the line and its kept reservations are
what the settings say."""

from __future__ import annotations

from bench.contention_trace import make_trace
from bench.line_replay import Settings, replay, summary, SeedResult
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


def test_the_replay_keeps_capacity_drains_and_is_deterministic():
    for line in (True, False):
        log = replay(TRACE, Settings(line=line, min_runtime=5.0, drain=300.0))
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
        again = replay(TRACE, Settings(line=line, min_runtime=5.0, drain=300.0))
        assert again.runs == log.runs and again.waits == log.waits


def test_without_the_line_nothing_is_gated_and_with_it_reservations_are_kept():
    seen: list = []
    replay(TRACE, Settings(line=False, min_runtime=5.0, drain=300.0), observe=lambda *a: seen.append(a))
    assert seen == []  # the line off: no gate, no reservation
    for keep in (True, False):
        moves = holders = 0
        last: dict = {}

        def observe(t, line, reserved, actions, snap):
            nonlocal moves, holders
            for ident, node in reserved.items():
                if ident in last and last[ident] != node:
                    moves += 1
                holders += ident not in last
                last[ident] = node
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


def test_summary_of_ratios():
    rs = [SeedResult(1, 100.0, 400.0), SeedResult(2, 300.0, 400.0), SeedResult(3, 200.0, 400.0),
          SeedResult(4, None, 10.0)]
    s = summary(rs)
    assert s["ratios"] == 3 and s["median"] == 0.5 and s["min"] == 0.25 and s["max"] == 0.75
    assert s["met"] == 2 and s["median_with_line_s"] == 200.0 and s["median_without_line_s"] == 400.0


# -- the command line: a refused value is one line and exit 2, before any replay -------------

import pytest  # noqa: E402

from bench import line_replay  # noqa: E402


@pytest.mark.parametrize("argv", [
    ["--seeds", "0"], ["--seeds", "-1"], ["--seeds", "1001"], ["--seeds", "99999999999"],
    ["--reserve-after", "nan"], ["--reserve-after", "inf"], ["--reserve-after", "-1"],
    ["--out", ""],
])
def test_cli_refuses_bad_values(argv, capsys, monkeypatch):
    # on the old code: --seeds 0/-1 printed empty summaries and exited 0, --reserve-after
    # nan/inf/-1 ended in a traceback, --out '' wrote line-replay.json into the working directory
    monkeypatch.setattr(line_replay, "trace_of", lambda seed: pytest.fail("replayed a refused value"))
    with pytest.raises(SystemExit) as exc:
        line_replay.main([*argv, "--seeds" if argv[0] != "--seeds" else "--first-seed", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[0]}:" in err and "Traceback" not in err
