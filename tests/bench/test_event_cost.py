"""`bench.event_cost`: one small run of the leader replica taking each kind of event that
changes no placement (every kind measured, the population as asked), and its command line's
refusals."""

from __future__ import annotations

import pytest

from bench import event_cost


def test_a_small_run_measures_every_kind_on_the_population_asked():
    row = event_cost.measure(4, "device", events=2, window=0.25)
    assert (row["nodes"], row["vmis"], row["events"]) == (4, 8, 2)
    assert row["claims"] == 8 and row["gpudevices"] > 0
    assert list(row["kinds"]) == list(event_cost.KINDS)
    for kind, got in row["kinds"].items():
        assert got["window_ms_p50"] >= got["sync_ms_p50"] >= 0, kind


@pytest.mark.parametrize("argv, says", [
    (["--nodes", "0"], "--nodes"), (["--nodes", "x"], "--nodes"), (["--modes", "foo"], "--modes"),
    (["--events", "0"], "--events"), (["--window", "0.1"], "--window"),
    (["--window", "nan"], "--window"), (["--out", ""], "--out"),
])
def test_cli_refuses_bad_values(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(event_cost, "measure", lambda *a, **k: pytest.fail("measured a refused value"))
    try:
        code = event_cost.BENCHMARK.main(argv)
    except SystemExit as exc:      # argparse's own refusal
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and says in err.strip().splitlines()[-1]
