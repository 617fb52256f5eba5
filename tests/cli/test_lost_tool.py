"""HL3 in `top` and `explain` as printed (docs/device-mode.md, "Nothing lost silently"): the device
totals of each device-mode class adding up with the lost column, the lost devices named with why, and a
set's lost device in `explain`; count mode prints as before."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from cli.tools import render_explain, render_top, to_jsonable
from model.explain import explain, top
from model.parse import VMIAsk
from model.snapshot import Snapshot
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node, recorded
from tests.support.world import LIVE, what_if_cluster

NOW = datetime(2026, 12, 6, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)


def _fleet() -> Snapshot:
    """n1: gpu-vfio-3 left the slice (recorded by t/a), gpu-vfio-5 republished without its
    partitions (recorded by t/b), gpu-vfio-6 likewise and recorded by none; n2 whole."""
    n1 = dra_node("n1")
    devs = tuple(replace(d, attributes=tuple((k, v) for k, v in d.attributes if "partition" not in k
                                             and "gpuModuleID" not in k))
                 if d.ref.device in ("gpu-vfio-5", "gpu-vfio-6") else d
                 for d in n1.devices_of(CLASS) if d.ref.device != "gpu-vfio-3")
    n1 = replace(n1, allocatable=((RES, 7),), class_devices=((CLASS, devs),))
    return Snapshot.build(nodes=[n1, dra_node("n2")], classes=[device_class()],
                          devices=[recorded("t", "a", "n1", 3), recorded("t", "b", "n1", 5)])


def test_HL3_top_adds_the_devices_up_and_names_the_lost_ones():
    t = top(_fleet(), set())
    lines = render_top(t).splitlines()
    start = lines.index("DEVICES (device mode; a lost device is never free: HL3)")
    assert lines[start + 1:start + 7] == [
        "h100x  15 published + 1 recorded unpublished = 13 free + 0 used + 0 held + 3 lost "
        "(left-slices 1, attribute-lost 2) + 0 tainted",
        "LOST (the record is kept until the device returns or the set is placed again):",
        "  n1 gpu-vfio-5 (h100x, attribute-lost): t/b",
        "  n1 gpu-vfio-6 (h100x, attribute-lost): not recorded",
        "  n1 gpu-vfio-3 (h100x, left-slices): t/a",
        "  attribute-lost: published without the class's matchAttribute "
        "(dra-driver-nvidia-gpu#1331: unbind the GPU from vfio-pci and restart the driver's "
        "plugin; docs/troubleshooting.md)"]
    (c,) = t.devices
    assert c.adds_up
    # the FREE column never counts a lost device: n1 has 5 free devices, capped by 7 − 2 units
    row = next(r for r in t.classes[0].nodes if r.node == "n1")
    assert (row.free, row.bound) == (5, 2)
    j = to_jsonable(t)
    assert j["devices"][0]["lost_by"] == [["left-slices", 1], ["attribute-lost", 2]]
    assert [x["reason"] for x in j["lost"]] == ["attribute-lost", "attribute-lost", "left-slices"]


def test_HL3_explain_names_the_sets_lost_devices():
    e = explain(_fleet(), "t", "vm", VMIAsk(("a", "b"), ()), live_vmis=set(), now=NOW, grace=GRACE)
    lost = [line for line in render_explain(e).splitlines() if line.startswith("lost: ")]
    assert lost == [
        "lost: device gpu-vfio-3 of node n1 (class h100x) is lost: no longer published for the "
        "class (its ResourceSlice was deleted or rewritten without it, it no longer matches "
        "the class's selectors, or its node is gone); recorded by t/a, kept until it returns "
        "(nothing moves) or the set is placed again",
        "lost: device gpu-vfio-5 of node n1 (class h100x) is lost: published without "
        "gpu.nvidia.com/partition{size}, so in no group of the class (a GPU left bound to "
        "vfio-pci across a restart of NVIDIA's DRA plugin is republished so: "
        "dra-driver-nvidia-gpu#1331); recorded by t/b, kept until it returns (nothing moves) "
        "or the set is placed again"]
    assert [x["reason"] for x in to_jsonable(e)["lost"]] == ["left-slices", "attribute-lost"]


def test_HL3_count_mode_prints_no_device_totals():
    t = top(what_if_cluster(), LIVE)
    assert "devices" not in to_jsonable(t) and "lost" not in to_jsonable(t)
    assert "DEVICES (device mode" not in render_top(t)
