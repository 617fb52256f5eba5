"""The demo's table (localcluster.demo, no cluster): a long refusal keeps its beginning and is
cut at its end with an ellipsis, on a whole word; every column has a label."""

from __future__ import annotations

import pytest

from localcluster.demo import DENIED_PREFIX, Row, print_table, short_reason, write_whole_reasons

# a refusal as a waiting VM shows it, rendered by model.reasons (SetNeeds), 185 characters
LONG = ("waiting (GPUSetRefused): GPU set of tenant-blue/vm-07-h100x4 refused: the set needs "
        "4 × nvidia.com/GH100_H100 (class h100) on one node; the most free on an eligible "
        "node serving it is 0")


def test_a_short_reason_is_shown_whole_without_the_api_servers_prefix():
    assert short_reason(DENIED_PREFIX + "budget: no room") == "budget: no room"
    assert short_reason(LONG) == LONG   # one reason, shown whole by default
    assert short_reason("x" * 200) == "x" * 200


def test_a_long_reason_keeps_its_beginning_and_ends_with_an_ellipsis_on_a_whole_word():
    got = short_reason(LONG, limit=100)
    assert got == ("waiting (GPUSetRefused): GPU set of tenant-blue/vm-07-h100x4 refused: the set "
                   "needs 4 ×…")
    assert len(got) <= 100
    assert short_reason(DENIED_PREFIX + LONG, limit=100) == got   # the prefix is not counted


def test_a_reason_without_spaces_is_cut_mid_word_at_the_limit():
    assert short_reason("a" * 50, limit=10) == "a" * 9 + "…"


def test_a_cut_drops_the_punctuation_before_the_ellipsis():
    assert short_reason("refused: the set, and more words after it", limit=18) == "refused: the set…"


@pytest.mark.parametrize("limit", [1, 0, -5])
def test_a_limit_without_room_for_the_ellipsis_is_refused(limit):
    with pytest.raises(ValueError, match=f"limit must be at least 2, got {limit}"):
        short_reason(LONG, limit=limit)


def test_the_table_labels_every_column_and_shows_the_answer_time_under_its_label(capsys):
    rows = [Row("vm-00-h100x1", "tenant-acme", "h100=1", node="gpu-node-00", seconds=0.876,
                launcher_node="gpu-node-00", launcher_gpus=1, state="Running"),
            Row("vm-07-h100x4", "tenant-blue", "h100=4", reason=LONG + "; " + LONG, seconds=2.5,
                state="Waiting")]
    print_table(rows)
    lines = capsys.readouterr().out.splitlines()
    header = lines[1]
    assert header.split() == ["VM", "TENANT", "GPUs", "ASKED", "STATE", "ANSWER", "AFTER", "RESULT"]
    admitted = next(line for line in lines if line.startswith("vm-00-h100x1"))
    assert admitted.index("0.88 s") == header.index("ANSWER AFTER")
    assert admitted[header.index("RESULT"):] == (
        "admitted, pinned to gpu-node-00; virt-launcher Pod bound to gpu-node-00 by "
        "kube-scheduler, requests 1 GPU")
    waiting = next(line for line in lines if line.startswith("vm-07-h100x4"))
    assert waiting.index("2.50 s") == header.index("ANSWER AFTER")
    shown = waiting[header.index("RESULT"):]
    assert shown == short_reason(LONG + "; " + LONG) and len(shown) <= 200
    assert shown.startswith(LONG) and shown.endswith("…")
    assert lines[-2] == "2 VMs: 1 admitted, 1 waiting; 1 of 1 launcher Pods bound on their pinned node"
    assert lines[-1] == "admitted per node: gpu-node-00=1"


def test_the_reasons_the_table_cut_are_written_whole(tmp_path):
    # newcomer: a cut reason's end was nowhere once the demo had stopped the cluster
    rows = [Row("vm-a", "tenant-acme", "h100=1", reason=DENIED_PREFIX + LONG + "; " + LONG),
            Row("vm-b", "tenant-acme", "h100=1", reason="short"),
            Row("vm-c", "tenant-acme", "h100=1", node="gpu-node-00")]
    path = tmp_path / "logs" / "reasons.txt"
    assert write_whole_reasons(rows, path) == 1
    assert path.read_text() == f"vm-a tenant-acme: {LONG}; {LONG}\n"
    assert write_whole_reasons(rows[1:], tmp_path / "none.txt") == 0
    assert not (tmp_path / "none.txt").exists()


def test_the_demo_clears_only_an_empty_or_its_own_log_dir(tmp_path):
    """`--log-dir` is emptied for a new run only when it is absent, empty or a demo's own
    (its marker, or an earlier demo's controller-0.log); a directory with anything else, or a
    file, is refused naming it, and nothing in it is touched (`--log-dir .` once deleted the
    directory it named, whatever it held)."""
    from localcluster.demo import LOG_MARKER, clear_log_dir

    mine = tmp_path / "logs"
    clear_log_dir(mine)                                     # absent: made, marked
    (mine / "replica-0").mkdir()
    (mine / "replica-0" / "n1.jsonl").write_text("{}\n")
    clear_log_dir(mine)                                     # its own: emptied, marked again
    assert sorted(p.name for p in mine.iterdir()) == [LOG_MARKER]
    old = tmp_path / "old"
    old.mkdir()
    (old / "controller-0.log").write_text("x")
    clear_log_dir(old)                                      # an earlier demo's (no marker yet)
    assert sorted(p.name for p in old.iterdir()) == [LOG_MARKER]
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=f"--log-dir {home} is not empty and not a demo's log directory"):
        clear_log_dir(home)
    assert (home / "notes.txt").read_text() == "keep me" and (home / "src").is_dir()
    with pytest.raises(ValueError, match="is a file, not a directory"):
        clear_log_dir(home / "notes.txt")


def test_demo_with_a_foreign_log_dir_is_one_line_and_exit_2(tmp_path, capsys):
    from cli.main import main

    (tmp_path / "notes.txt").write_text("keep me")
    assert main(["demo", "--log-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a demo's log directory" in err
    assert (tmp_path / "notes.txt").read_text() == "keep me"
