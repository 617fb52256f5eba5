"""`bench.admission_path`: its JSON Patch applier, and one small run of the leader replica over
the loopback API (every sample admitted, the webhook's and the binder's calls made)."""

from __future__ import annotations

import pytest

from bench.admission_path import apply_patch, measure


def test_apply_patch_tests_adds_replaces_and_removes_on_a_copy():
    doc = {"metadata": {"resourceVersion": "3"}, "status": {"a": 1, "list": [1, 2]}}
    got = apply_patch(doc, [{"op": "test", "path": "/metadata/resourceVersion", "value": "3"},
                            {"op": "add", "path": "/status/b~1c", "value": {"x": 1}},
                            {"op": "replace", "path": "/status/a", "value": 2},
                            {"op": "add", "path": "/status/list/-", "value": 3},
                            {"op": "remove", "path": "/status/list/0"}])
    assert got == {"metadata": {"resourceVersion": "3"},
                   "status": {"a": 2, "b/c": {"x": 1}, "list": [2, 3]}}
    assert doc["status"] == {"a": 1, "list": [1, 2]}
    with pytest.raises(ValueError):
        apply_patch(doc, [{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}])
    with pytest.raises(KeyError):
        apply_patch(doc, [{"op": "replace", "path": "/status/missing", "value": 1}])


@pytest.mark.parametrize("mode", ["device", "count"])
def test_a_small_run_admits_every_sample_through_the_webhook_and_the_binder(mode):
    row = measure(6, mode, 4, samples=2, settle=0.05)
    assert (row["samples"], row["admitted"]) == (2, 2)
    assert row["vmis"] == 4 and row["gpudevices"] > 0
    assert row["decisions"] == 2 and row["decision_ms_mean"] > 0  # one per measured sample
    calls = row["calls"]
    assert calls["create gpudevices"] == 4          # one template per admission (2 warm-up)
    assert calls["get virtualmachineinstances"] == 4  # W1's live read
    assert calls["patch_status gpudevices"] >= 8     # the attachment, then the binder's answer
    if mode == "device":
        # every device of the world records its GPU, and so does each admitted template
        assert calls["create resourceclaims"] == 4 and row["records"] == row["gpudevices"] + 4
    else:
        assert "create resourceclaims" not in calls and row["records"] == 0


# -- the command line: a refused value is one line and exit 2, before any point is built -----

from bench import admission_path  # noqa: E402


@pytest.mark.parametrize("argv, says", [
    (["--nodes", "0"], "--nodes"), (["--nodes", "-1"], "--nodes"), (["--nodes", "nan"], "--nodes"),
    (["--nodes", ""], "--nodes"), (["--sets", "-1"], "--sets"), (["--sets", "x"], "--sets"),
    (["--modes", "foo"], "--modes"), (["--modes", ""], "--modes"),
    (["--samples", "0"], "--samples"), (["--settle", "nan"], "--settle"),
    (["--settle", "inf"], "--settle"), (["--settle", "-1"], "--settle"),
    (["--profile", "-1"], "--profile"), (["--out", ""], "--out"),
])
def test_cli_refuses_bad_values(argv, says, capsys, monkeypatch):
    # on the old code each of these ended in a traceback (ValueError, StatisticsError,
    # IsADirectoryError), ran nothing and exited 0 (--modes foo, --nodes 0) or slept forever
    monkeypatch.setattr(admission_path, "measure",
                        lambda *a, **k: pytest.fail("measured a refused value"))
    try:
        code = admission_path.BENCHMARK.main(argv)
    except SystemExit as exc:      # argparse's own refusal
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert says in err.strip().splitlines()[-1]        # the error is the last line (after usage)
