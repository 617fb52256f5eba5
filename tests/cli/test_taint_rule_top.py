"""Issue 41 "Bad input" in `top` (docs/troubleshooting.md, "A DeviceTaintRule takes
every GPU of a class, or selects no device"): a DeviceTaintRule whose selector picks no
published device taints nothing, and `top` names it, one line each, in text and in
`--json`; nothing when every rule selects a device."""

from __future__ import annotations

import argparse
import json

from cli import tools
from cli.tools import Cluster, render_top
from model.explain import top
from model.snapshot import Snapshot
from tests.support.dra_worlds import device_class, dra_node

LINE = ("RULE SELECTS NOTHING: DeviceTaintRule drain-old selects no device a ResourceSlice "
        "publishes: it taints nothing and changes no placement (check its deviceSelector's "
        "driver, pool and device; docs/troubleshooting.md)")


def _cluster(rules: tuple[str, ...]) -> Cluster:
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[device_class()])
    return Cluster(snap, set(), {}, rules_selecting_nothing=rules)


def _top(monkeypatch, capsys, cluster: Cluster, *flags: str) -> str:
    async def read(*_a, **_k) -> Cluster:
        return cluster
    monkeypatch.setattr(tools, "read_cluster", read)
    args = argparse.Namespace(command="top", timeout=5.0, kubeconfig="-", settings_namespace="x",
                              json="--json" in flags)
    assert tools.run(args) == 0
    return capsys.readouterr().out


def test_top_names_a_rule_selecting_no_device(monkeypatch, capsys):
    out = _top(monkeypatch, capsys, _cluster(("drain-old",)))
    assert [line for line in out.splitlines() if line.startswith("RULE SELECTS NOTHING")] == [LINE]
    doc = json.loads(_top(monkeypatch, capsys, _cluster(("drain-old",)), "--json"))
    assert doc["rules_selecting_nothing"] == ["drain-old"]


def test_top_says_nothing_of_rules_when_every_rule_selects_a_device(monkeypatch, capsys):
    assert "RULE SELECTS NOTHING" not in _top(monkeypatch, capsys, _cluster(()))
    assert json.loads(_top(monkeypatch, capsys, _cluster(()), "--json"))["rules_selecting_nothing"] == []
    assert "RULE SELECTS NOTHING" not in render_top(top(_cluster(()).snapshot, set()))
