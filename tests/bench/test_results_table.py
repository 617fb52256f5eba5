"""bench-results/README.md's table is the one `python -m bench.results_table` generates from
the JSON reports' own fields (as docs/metrics.md's reason-code table is kept by
tests/cli/test_docs_generated.py): a report added or replaced without regenerating it fails
here. And what the generator reads of a report, field by field, including what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.results_table import BEGIN, END, MISSING, commit_of, load_of, render, row, started_of, table

REPO = Path(__file__).resolve().parents[2]


def test_the_bench_results_readme_table_is_current():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "bench.results_table", "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, f"run `python -m bench.results_table`:\n{out.stdout}{out.stderr}"


def test_bench_results_holds_no_python():
    assert sorted(p.relative_to(REPO).as_posix()
                  for p in (REPO / "bench-results").rglob("*.py")) == []


def test_a_report_with_every_field():
    doc = {"benchmark": "fairness", "commit": "3d5f01fb775725b00332a2bb58c1f504be4fa73e",
           "started": "2026-12-03T08:42:31+00:00", "load_before": [1.657, 1.4, 1.1],
           "load_after": [1.289, 1.3, 1.1]}
    assert row("fairness.json", doc, None) == (
        "| `fairness.json` | fairness | `3d5f01f` | 2026-12-03 08:42 | 1.7 → 1.3 | none |")


def test_what_a_report_does_not_record_is_said_missing_not_guessed():
    assert row("e2e.json", {"benchmark": "e2e"}, "e2e.png") == (
        f"| `e2e.json` | e2e | {MISSING} | {MISSING} | {MISSING} | `e2e.png` |")
    assert load_of({"load_before": [2.0, 1, 1]}) == f"2.0 → {MISSING}"


def test_the_other_shapes_of_commit_time_and_load():
    assert commit_of({"git_commit": "7d3e1a0"}) == "`7d3e1a0`"
    assert commit_of({"trees": {"before": "8272b60 (main then)", "after": "7d3e1a0 (issue 14)"}}) \
        == "before `8272b60`, after `7d3e1a0`"
    assert started_of({"started_at": "2026-11-30T11:19:55+00:00"}) == "2026-11-30 11:19"
    assert load_of({"machine": {"load_average_at_start": [5.67, 6.0, 5.1]}}) == "5.7 at start"
    assert load_of({"runs": [{"load_average_1m": 6.9}, {"load_average_1m": 5.75}]}) == \
        "5.8–6.9 over its 2 runs"


def test_table_lists_every_report_by_name_with_its_figure(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"benchmark": "soak", "commit": "68c1b23"}))
    (tmp_path / "b.png").write_bytes(b"png")
    (tmp_path / "a.json").write_text(json.dumps({"benchmark": "core"}))
    lines = table(tmp_path).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| `a.json`", "| `b.json`"]
    assert lines[3].endswith("| `68c1b23` | not in the file | not in the file | `b.png` |")


def test_a_file_that_is_no_report_is_named(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="x.json: not a JSON object"):
        table(tmp_path)


def test_render_replaces_only_the_marked_block_and_needs_the_markers():
    text = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert render(text, "new") == f"head\n{BEGIN}\nnew\n{END}\ntail\n"
    with pytest.raises(ValueError, match="no"):
        render("head only\n", "new")
