"""`gpu-binder defrag --plan` and explain's defragmentation line (D4): read-only, text and
JSON from `model.defrag`'s plan; bad input refused before the cluster is read."""

from __future__ import annotations

import json
from datetime import timedelta

from cli.main import main
from cli.tools import render_defrag, render_explain, to_jsonable
from model.defrag import plan_round
from model.explain import explain
from model.parse import VMIAsk
from model.snapshot import Snapshot
from tests.support.world import CLASSES, NOW, NS, attached, dev, node


def _snap() -> Snapshot:
    devices = [dev("i1", on="n1", ns="tenant-b"), dev("i2", on="n1", ns="tenant-b"),
               attached(dev("r1", on="n2")), attached(dev("r2", on="n2"))]
    return Snapshot.build(nodes=[node("n1", h=4), node("n2", h=4)], classes=CLASSES,
                          devices=devices)


def test_D4_plan_text_lists_moves_and_largest_sets_before_and_after():
    text = render_defrag(plan_round(_snap(), max_moves=4), 4)
    lines = text.splitlines()
    assert lines[0] == "defragmentation round (at most 4 moves): 2 moves"
    assert lines[1] == "  tenant-b/i1 (h100): n1 -> n2  (frees n1: largest h100 set 2 -> 4)"
    assert lines[2] == "  tenant-b/i2 (h100): n1 -> n2  (frees n1: largest h100 set 2 -> 4)"
    row = next(line for line in lines if line.startswith("h100 "))
    assert row.split()[2:] == ["2", "on", "2", "nodes", "4", "on", "1", "node"]


def test_D4_plan_json_has_each_move_with_its_why():
    data = json.loads(json.dumps(to_jsonable(plan_round(_snap(), max_moves=1))))
    (move,) = data["moves"]
    assert (move["device"], move["from_node"], move["to_node"]) == (["tenant-b", "i1"], "n1", "n2")
    assert move["message"].startswith("defragmentation: moved tenant-b/i1 (h100) from n1 to n2")
    assert {x["class_name"]: x["size"] for x in data["after"]}["h100"] == 3


def test_D4_nothing_to_move_says_so():
    snap = Snapshot.build(nodes=[node("n1", h=4)], classes=CLASSES, devices=[])
    assert "nothing to move" in render_defrag(plan_round(snap), 4).splitlines()[0]


def test_D4_explain_text_says_it_would_fit_after_a_defragmentation():
    e = explain(_snap(), NS, "vm-4", VMIAsk((), (("h100", 4),)), live_vmis={(NS, "vm-x")},
                now=NOW, grace=timedelta(minutes=2))
    text = render_explain(e)
    assert "after a defragmentation (2 moves) it would fit on n1:" in text
    assert "  move idle tenant-b/i1 from n1 to n2" in text


def test_defrag_bad_max_moves_is_refused_before_reading_the_cluster(capsys, tmp_path):
    assert main(["defrag", "--plan", "--max-moves", "0",
                 "--kubeconfig", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == "gpu-binder defrag: --max-moves must be at least 1, got 0\n"


def test_D4_DR4_device_mode_plan_names_the_devices_and_says_re_point():
    """Device mode: a re-point reads "n1: gpu-vfio-0 -> gpu-vfio-6 (re-point)", a move
    "n1/gpu-vfio-0 -> n2/gpu-vfio-3"; JSON carries from_device and to_device (count mode's
    JSON has neither)."""
    from tests.support.dra_worlds import device_class, dra_node, recorded
    one = Snapshot.build(nodes=[dra_node("n1")], classes=[device_class()],
                         devices=[recorded("t", "a", "n1", 0), recorded("t", "b", "n1", 4)])
    text = render_defrag(plan_round(one), 4)
    assert text.splitlines()[0] == "defragmentation round (at most 4 moves): 1 move"
    line = text.splitlines()[1]
    assert line.startswith("  t/") and " (h100x): n1: gpu-vfio-" in line
    assert "(re-point)  (on n1: largest h100x set 2 -> 4)" in line
    (move,) = json.loads(json.dumps(to_jsonable(plan_round(one))))["moves"]
    assert move["from_node"] == move["to_node"] == "n1"
    assert move["to_device"]["pool"] == "n1" and move["from_device"]["device"] in ("gpu-vfio-0", "gpu-vfio-4")
    two = Snapshot.build(nodes=[dra_node("n1"), dra_node("n2")], classes=[device_class()],
                         devices=[recorded("t", f"a{i}", "n1", i) for i in range(4)]
                         + [recorded("t", f"b{i}", "n2", i) for i in range(4, 8)])
    lines = render_defrag(plan_round(two), 4).splitlines()
    assert lines[1].startswith("  t/a0 (h100x): n1/gpu-vfio-0 -> n2/gpu-vfio-")
    assert lines[1].endswith("(frees n1: largest h100x set 4 -> 8)")
    count = json.loads(json.dumps(to_jsonable(plan_round(_snap(), max_moves=1))))["moves"][0]
    assert "to_device" not in count and "from_device" not in count


def test_D4_DR4_explain_in_device_mode_says_a_re_point_would_make_room():
    """A 4-GPU VMI on the HGX node whose partitions of 4 each have one idle held device:
    refused now, and explain says one re-point would make it fit on n1."""
    from tests.support.dra_worlds import device_class, dra_node, recorded
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[device_class()],
                          devices=[recorded("t", "a", "n1", 0), recorded("t", "b", "n1", 4)])
    e = explain(snap, "t", "vm-4", VMIAsk((), (("h100x", 4),)), live_vmis=set(), now=NOW,
                grace=timedelta(minutes=2))
    text = render_explain(e)
    assert "after a defragmentation (1 move) it would fit on n1:" in text, text
    assert "  re-point idle t/" in text and " on n1 from gpu-vfio-" in text
