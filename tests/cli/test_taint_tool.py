"""HL1 in `explain` as printed (docs/device-mode.md, "A held device on a tainted GPU"): one
`tainted:` line per record of the set on a tainted GPU, the taint and its DeviceTaintRule
named, and the typed reason in `--json`; nothing for a set without one."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from cli.tools import render_explain, to_jsonable
from model.device.dra import DeviceTaint
from model.device.taint_rules import TaintRule
from model.explain import explain
from model.parse import VMIAsk
from model.snapshot import Snapshot
from tests.support.dra_worlds import device_class, dra_node, recorded

NOW = datetime(2026, 12, 6, 15, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)
XID = TaintRule("xid-79", DeviceTaint("example.com/xid", "79", "NoSchedule")).taint


def _fleet(tainted: bool) -> Snapshot:
    n1 = dra_node("n1")
    if tainted:
        n1 = replace(n1, class_devices=tuple(
            (c, tuple(replace(d, taints=(XID,)) if d.ref.device == "gpu-vfio-0" else d for d in devs))
            for c, devs in n1.class_devices), taken_devices=frozenset({"gpu-vfio-0"}))
    return Snapshot.build(nodes=[n1], classes=[device_class()],
                          devices=[recorded("t", "a", "n1", 3), recorded("t", "b", "n1", 0)])


def test_HL1_explain_names_a_record_on_a_tainted_gpu_and_its_rule():
    e = explain(_fleet(True), "t", "vm", VMIAsk(("a", "b"), ()), live_vmis=set(), now=NOW, grace=GRACE)
    lines = [line for line in render_explain(e).splitlines() if line.startswith("tainted: ")]
    assert lines == ["tainted: held device b records gpu-vfio-0 on n1, tainted example.com/xid:NoSchedule "
                     "by DeviceTaintRule xid-79: its next placement re-points it within n1 or moves the set"]
    [got] = to_jsonable(e)["tainted"]
    assert (got["code"], got["device"], got["recorded"], got["rule"], got["running"]) == (
        "record_tainted", "b", "gpu-vfio-0", "xid-79", False)


def test_HL1_explain_of_an_untainted_set_prints_and_serialises_nothing_of_it():
    e = explain(_fleet(False), "t", "vm", VMIAsk(("a", "b"), ()), live_vmis=set(), now=NOW, grace=GRACE)
    assert not [line for line in render_explain(e).splitlines() if line.startswith("tainted: ")]
    assert "tainted" not in to_jsonable(e)
