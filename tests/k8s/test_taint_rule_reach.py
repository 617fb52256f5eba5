"""Issue 41 "Bad input" (docs/device-mode.md "A DeviceTaintRule that takes a whole class, or
nothing"; DR2, HL1): a DeviceTaintRule whose selector takes every device of a class, and one
whose selector takes none, from the cache's real DRA index to what the binder decides, the
webhook's W1 denies and `explain` prints.

A rule over every device (`{driver}`, `{}` or a node's `{pool}`), NoSchedule or NoExecute: a
new set is refused with a reason naming the rule, its taint and the devices it keeps; an idle
held set on those devices is moved where a healthy device exists (another node) and, where
none does, refused and left as it is, each record named in `explain`. Nothing crashes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cli.tools import render_explain
from localcluster.dra_profiles import HGX_H100_8, resource_slice
from model.admission import check
from model.decide import Request, decide
from model.explain import explain
from model.parse import VMIAsk
from model.reasons import Code
from model.types import Result
from tests.k8s.test_taint_refusals import DRIVER, NODE, NOW, event, gpudevice, world

KEY = "example.com/maintenance"
SELECTS_ALL = {"driver": {"driver": DRIVER}, "empty": {}, "pool": {"pool": NODE}}
GRACE = timedelta(minutes=1)


def drain(selector: dict, effect: str, name: str = "drain-all") -> dict:
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector,
                                                  "taint": {"key": KEY, "value": "x", "effect": effect}}}


def second_node(cache, node: str = "hgx-2") -> None:
    event(cache.nodes, {"metadata": {"name": node, "labels": {"kubevirt.io/schedulable": "true"}},
                        "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    event(cache.slices, resource_slice(node, HGX_H100_8))


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
@pytest.mark.parametrize("selector", SELECTS_ALL.values(), ids=SELECTS_ALL.keys())
def test_a_rule_over_every_device_of_the_class_refuses_a_new_set_naming_the_rule(selector, effect):
    cache = world()
    event(cache.taint_rules, drain(selector, effect))
    snap = cache.view.snapshot()
    assert len(cache.view.node(NODE).taken_devices) == 8
    # W1 (the webhook's model path) for a template set of class hgx
    verdict = check(snap, "t", "vm", VMIAsk((), (("hgx", 2),)), set(), NOW, GRACE)
    assert verdict.reason.code is Code.SET_NEEDS
    text = verdict.reason.render()
    assert "the most free on an eligible node serving it is 0" in text
    assert (f"hgx-1: needs 2 × vfio.gpu.nvidia.com devices, has 0 free (gpu-vfio-0, gpu-vfio-1, "
            f"gpu-vfio-2, gpu-vfio-3 and 4 more tainted {KEY}:{effect} by DeviceTaintRule drain-all)") in text
    # the binder's decision for a Pending set of the class
    for name in ("a", "b"):
        event(cache.devices, gpudevice(name))
    d = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    assert d.result is Result.REFUSED and d.placements == ()
    assert f"and 4 more tainted {KEY}:{effect} by DeviceTaintRule drain-all" in d.reason.render()


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_an_idle_held_set_under_a_rule_over_every_device_is_left_and_named(effect):
    """No healthy device anywhere: the held pair {0,3} is refused, not moved and not
    dropped; the refusal names its held devices and `explain` a line for each."""
    cache = world()
    event(cache.devices, gpudevice("a", 0))
    event(cache.devices, gpudevice("b", 3))
    event(cache.taint_rules, drain({"driver": DRIVER}, effect))
    snap = cache.view.snapshot()
    d = decide(snap, Request("r1", "t", "vm", ("a", "b")))
    assert d.result is Result.REFUSED and d.placements == ()
    text = d.reason.render()
    assert ("(gpu-vfio-0 of held device a, gpu-vfio-1, gpu-vfio-2, gpu-vfio-3 of held device b and "
            f"4 more tainted {KEY}:{effect} by DeviceTaintRule drain-all)") in text
    # the records are as they were
    assert [str(snap.device("t", n).status.device) for n in ("a", "b")] == [
        f"{DRIVER}/{NODE}/gpu-vfio-0", f"{DRIVER}/{NODE}/gpu-vfio-3"]
    e = explain(snap, "t", "vm", VMIAsk(("a", "b"), ()), live_vmis=set(), now=NOW, grace=GRACE)
    assert not e.admitted
    lines = [line for line in render_explain(e).splitlines() if line.startswith("tainted: ")]
    assert lines == [f"tainted: held device {n} records gpu-vfio-{i} on {NODE}, tainted {KEY}:{effect} "
                     f"by DeviceTaintRule drain-all: its next placement re-points it within {NODE} "
                     f"or moves the set" for n, i in (("a", 0), ("b", 3))]


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_an_idle_held_set_moves_where_a_healthy_device_exists_and_only_there(effect):
    """The rule takes every device of hgx-1 (its pool); hgx-2 is healthy: the held pair
    moves there. A second rule over hgx-2 as well: refused, nothing moves."""
    cache = world()
    second_node(cache)
    event(cache.devices, gpudevice("a", 0))
    event(cache.devices, gpudevice("b", 3))
    event(cache.taint_rules, drain({"pool": NODE}, effect))
    d = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    assert d.result is Result.SUCCEEDED and d.node == "hgx-2"
    moved = {key[1]: r for key, r in d.placements[0].devices}
    assert set(moved) == {"a", "b"} and {r.pool for r in moved.values()} == {"hgx-2"}
    event(cache.taint_rules, drain({"pool": "hgx-2"}, effect, name="drain-2"))
    d = decide(cache.view.snapshot(), Request("r2", "t", "vm", ("a", "b")))
    assert d.result is Result.REFUSED and d.placements == ()
    text = d.reason.render()
    assert "by DeviceTaintRule drain-all)" in text and "by DeviceTaintRule drain-2)" in text


SELECTS_NONE = {"no-such-device": {"driver": DRIVER, "pool": NODE, "device": "gpu-vfio-99"},
                "no-such-pool": {"pool": "no-such-node"}, "other-driver": {"driver": "example.com"}}


def test_a_rule_selecting_no_device_changes_nothing_and_is_named_as_such():
    """Rules whose selector picks no published device (and one without a selector, which
    the API says matches none): no device taken, the same placement as without them, each
    named by `rules_selecting_nothing` (what `top` prints); a rule that does select a device
    is not named, and one whose node comes to publish its device leaves the list."""
    cache = world()
    for name in ("a", "b"):
        event(cache.devices, gpudevice(name))
    event(cache.taint_rules, drain({"device": "gpu-vfio-7"}, "NoSchedule", name="one"))
    before = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    assert before.result is Result.SUCCEEDED and cache.rules_selecting_nothing() == ()
    for name, selector in SELECTS_NONE.items():
        event(cache.taint_rules, drain(selector, "NoExecute", name=name))
    event(cache.taint_rules, {"metadata": {"name": "no-selector"}, "spec": {
        "taint": {"key": KEY, "effect": "NoSchedule"}}})
    assert cache.view.node(NODE).taken_devices == {"gpu-vfio-7"}  # "one"'s only
    after = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    assert (after.result, after.node, after.placements) == (before.result, before.node, before.placements)
    assert cache.rules_selecting_nothing() == ("no-selector", "no-such-device", "no-such-pool", "other-driver")
    second_node(cache, "no-such-node")
    assert cache.rules_selecting_nothing() == ("no-selector", "no-such-device", "other-driver")
    assert cache.view.node("no-such-node").taken_devices == {f"gpu-vfio-{i}" for i in range(8)}


MALFORMED = {"device-not-a-string": {"driver": DRIVER, "pool": NODE, "device": 7},
             "empty-pool": {"driver": DRIVER, "pool": ""},
             "selector-a-list": [{"device": "gpu-vfio-3"}]}


@pytest.mark.parametrize("selector", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_rule_with_a_malformed_selector_is_logged_and_taints_nothing(selector):
    """A selector field that is not a non-empty string (or a selector that is not a
    mapping) is never served by the API server; the binder does not read it as "any"
    (which took all 8 GPUs before) but skips the rule with an error log naming it, and a
    rule that turns malformed on update loses the taint it put."""
    from structlog.testing import capture_logs

    cache = world()
    event(cache.taint_rules, drain({"driver": DRIVER, "pool": NODE, "device": "gpu-vfio-3"}, "NoSchedule",
                                   name="bad"))
    assert cache.view.node(NODE).taken_devices == {"gpu-vfio-3"}
    with capture_logs() as logs:
        event(cache.taint_rules, drain(selector, "NoSchedule", name="bad"))
    assert cache.view.node(NODE).taken_devices == frozenset()
    assert cache.rules_selecting_nothing() == ()  # not held as a rule at all
    (entry,) = [e for e in logs if e["event"] == "skipping malformed object"]
    assert (entry["kind"], entry["name"]) == ("DeviceTaintRule", "bad")
    assert entry["error"].startswith("DeviceTaintRule bad: spec.deviceSelector")


def test_a_rule_without_a_taint_key_is_logged_and_taints_nothing():
    from structlog.testing import capture_logs

    cache = world()
    with capture_logs() as logs:
        event(cache.taint_rules, {"metadata": {"name": "keyless"}, "spec": {
            "deviceSelector": {}, "taint": {"effect": "NoExecute"}}})
    assert cache.view.node(NODE).taken_devices == frozenset()
    assert [e["error"] for e in logs if e["event"] == "skipping malformed object"] == [
        "DeviceTaintRule keyless: no name or no spec.taint.key"]
