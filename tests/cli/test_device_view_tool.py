"""`explain`, `what-if` and `top` as printed, in device mode (docs/contract.md §3b DR2-DR4; issue 32
item 4), on a canned world: per node the free devices and the groups (named by GPU module
ids), the devices a placement takes; top's device-mode rows and groups. Count mode prints
and serialises as before (the device parts are left out when empty)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from cli.tools import render_explain, render_top, render_what_if, to_jsonable
from model.explain import explain, top
from model.parse import VMIAsk
from model.snapshot import Snapshot
from model.what_if import what_if
from tests.support.dra_worlds import L40S_4, device_class, dra_node, recorded
from tests.support.world import LIVE, NOW as COUNT_NOW, what_if_cluster

NOW = datetime(2026, 12, 4, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)


def _fleet() -> Snapshot:
    return Snapshot.build(
        nodes=[dra_node("gpu-node-03", taken=(1, 5, 6)), dra_node("gpu-node-04", taken=(0,)),
               dra_node("l40s-01", classes=("l40s",), profile=L40S_4, taken=(1,))],
        classes=[device_class(), device_class("l40s", "resource.kubernetes.io/pcieRoot")],
        devices=[recorded("t", "a", "gpu-node-04", 2)])


def test_DR3_explain_prints_free_devices_groups_and_the_devices_taken():
    e = explain(_fleet(), "t", "vm", VMIAsk((), (("h100x", 4),)), live_vmis=set(), now=NOW,
                grace=GRACE)
    assert render_explain(e).splitlines() == [
        "VMI t/vm: 4 devices (vm-h100x-0, vm-h100x-1, vm-h100x-2, vm-h100x-3)",
        "verdict: admitted on gpu-node-04 (B1): bind vm-h100x-0, vm-h100x-1, vm-h100x-2, vm-h100x-3",
        "nodes:",
        "  gpu-node-04  fits, chosen",
        "               h100x: 6 free, a free partition of 4: modules {5-8} free",
        "               h100x takes gpu-vfio-4, gpu-vfio-5, gpu-vfio-6, gpu-vfio-7 (modules 5-8)",
        "  gpu-node-03  no: no 4 free h100x devices share gpu.nvidia.com/partition4: 5 free, "
        "the largest group has 3",
        "               h100x: 5 free, no free partition of 4: modules {1-4} 1 used, {5-8} 2 used",
        "  (1 other node does not serve the set's classes; --json lists all)",
    ]
    data = json.loads(json.dumps(to_jsonable(e)))
    chosen = next(v for v in data["device_nodes"] if v["node"] == "gpu-node-04")
    assert chosen["takes"] == [["h100x", "gpu-vfio-4, gpu-vfio-5, gpu-vfio-6, gpu-vfio-7 (modules 5-8)"]]
    assert chosen["classes"][0]["groups"][1] == {
        "value": 2, "label": "{5-8}", "devices": ["gpu-vfio-4", "gpu-vfio-5", "gpu-vfio-6",
                                                  "gpu-vfio-7"],
        "free": ["gpu-vfio-4", "gpu-vfio-5", "gpu-vfio-6", "gpu-vfio-7"]}


def test_DR3_explain_refused_everywhere_shows_each_nodes_groups():
    snap = Snapshot.build(nodes=[dra_node("gpu-node-03", taken=(1, 5, 6))],
                          classes=[device_class()])
    e = explain(snap, "t", "vm", VMIAsk((), (("h100x", 4),)), live_vmis=set(), now=NOW,
                grace=GRACE)
    lines = render_explain(e).splitlines()
    assert lines[-2:] == [
        "  gpu-node-03  no: no 4 free h100x devices share gpu.nvidia.com/partition4: 5 free, "
        "the largest group has 3",
        "               h100x: 5 free, no free partition of 4: modules {1-4} 1 used, {5-8} 2 used"]


def test_explain_smallest_change_names_device_mode_units_as_devices_not_the_quota_key():
    # newcomer: "add or free 3 × vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    snap = Snapshot.build(nodes=[dra_node("gpu-node-03", taken=(0, 1, 2, 3, 4, 5, 6))],
                          classes=[device_class()])
    e = explain(snap, "t", "vm", VMIAsk((), (("h100x", 2),)), live_vmis=set(), now=NOW,
                grace=GRACE)
    text = render_explain(e)
    assert "smallest change that would make it fit:" in text
    assert "gpu-node-03 (1 × vfio.gpu.nvidia.com devices missing): add or free 1 × " \
           "vfio.gpu.nvidia.com devices" in text
    assert "deviceclass.resource.k8s.io" not in text


def test_DR4_what_if_prints_the_devices_a_moved_set_takes():
    w = what_if(_fleet(), "cordon", ["gpu-node-04"], live_vmis=set(), now=NOW)
    assert render_what_if(w).splitlines() == [
        "what if cordon gpu-node-04: 1 held set on it",
        "  t idle devices on gpu-node-04 [a]: moves to gpu-node-03 (B1): move a from "
        "gpu-node-04; h100x takes gpu-vfio-7 (module 6)",
        "stranded: none"]


def test_DR3_top_prints_device_rows_and_groups():
    text = render_top(top(_fleet(), set()))
    assert [line.split() for line in text.splitlines()[:6]] == [
        ["CLASS", "NODE", "ALLOC", "BOUND", "ATTACHED", "AWAITING", "IDLE", "FREE", "LARGEST"],
        ["h100x", "gpu-node-03", "8", "0", "0", "0", "0", "5", "2"],
        ["h100x", "gpu-node-04", "8", "1", "0", "0", "1", "6", "4"],
        ["h100x", "=", "all", "(vfio.gpu.nvidia.com", "devices)", "1", "0", "0", "1", "11", "4"],
        ["l40s", "l40s-01", "4", "0", "0", "0", "0", "3", "2"],
        ["l40s", "=", "all", "(vfio.gpu.nvidia.com", "devices)", "0", "0", "0", "0", "3", "2"]]
    assert text.splitlines()[6:11] == [
        "",
        "DEVICE GROUPS (free/all; LARGEST above: the largest set one free group takes)",
        "h100x gpu-node-03  whole free partitions by size: 8: 0/1, 4: 0/2, 2: 1/4, 1: 5/8",
        "h100x gpu-node-04  whole free partitions by size: 8: 0/1, 4: 1/2, 2: 2/4, 1: 6/8",
        "l40s l40s-01       pcieRoot free: pci0000:16 gpu-vfio-{0,1} 1/2, pci0000:b0 gpu-vfio-{2,3} 2/2"]


def test_count_mode_json_and_text_carry_no_device_parts():
    snap = what_if_cluster()
    t = top(snap, LIVE)
    assert "blocks" not in to_jsonable(t) and "DEVICE GROUPS" not in render_top(t)
    w = what_if(snap, "drain", ["n1"], live_vmis=LIVE, now=COUNT_NOW)
    assert all("devices" not in o and "takes" not in o for o in to_jsonable(w)["outcomes"])
    e = explain(snap, "tenant-a", "vm-new", VMIAsk((), (("h100", 1),)), live_vmis=LIVE,
                now=COUNT_NOW, grace=GRACE)
    assert "device_nodes" not in to_jsonable(e)
    assert all(not line.startswith("     ") for line in render_explain(e).splitlines())


def test_top_says_which_class_cannot_serve_and_why():
    """A class that cannot serve (both resourceName and deviceClassName set: Ready=False,
    CannotServe) is not shown as a count row of zeros alone: a NOT READY line names it and
    its problem, the text its VMIs are refused with."""
    import dataclasses

    fleet = _fleet()
    broken = dataclasses.replace(device_class("both"), problem="sets both resourceName and deviceClassName")
    snap = Snapshot.build(nodes=list(fleet.nodes.values()),
                          classes=[*fleet.classes.values(), broken], devices=list(fleet.devices.values()))
    text = render_top(top(snap, set()))
    assert ("NOT READY: class both cannot serve: sets both resourceName and deviceClassName "
            "(its VMIs are refused with this)") in text.splitlines()
    assert "NOT READY" not in render_top(top(_fleet(), set()))
