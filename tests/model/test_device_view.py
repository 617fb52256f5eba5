"""`model.device.view`: device mode in the operator's view (docs/contract.md §3b DR2, DR3; issue 32
item 4): groups named by module ids, a node's free devices and groups for a set, the largest
set placeable respecting topology — and the property tying it to the binder: on every node,
`largest_placeable` (top, the metrics) is the largest n for which `decide` places a set of n
new devices of the class on that node alone."""

from __future__ import annotations

from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from model.decide import Request, decide
from model.defrag import largest_sets
from model.device.view import blocks, class_on_node, compress_names, largest_device_set
from model.explain import EXPLAIN_REQUEST_ID, largest_placeable
from model.hold import Hold
from model.snapshot import Snapshot
from model.types import GPUDevice, Result, Taint
from tests.support.dra_worlds import (CLASS, L40S_4, RES, device_class, dra_node, recorded, ref)

PCIE = "resource.kubernetes.io/pcieRoot"
L40S, ANY = "l40s", "anyh"
CLASSES = [device_class(), device_class(L40S, PCIE), device_class(ANY, None)]
PROPS = settings(max_examples=200, deadline=None, print_blob=True)


def snap_of(nodes, devices=(), reservations=()) -> Snapshot:
    return Snapshot.build(nodes=nodes, classes=CLASSES, devices=devices, reservations=reservations)


# --- names and groups -------------------------------------------------------------------------


def test_names_compress_to_ranges():
    assert compress_names(["gpu-vfio-0", "gpu-vfio-1"]) == "gpu-vfio-{0,1}"
    assert compress_names(["gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-2", "gpu-vfio-5"]) == "gpu-vfio-{0-2,5}"
    assert compress_names(["a", "b"]) == "{a, b}"
    assert compress_names(["gpu-0"]) == "gpu-0"


def test_DR3_a_node_with_5_free_and_no_free_partition_of_4_names_its_quads_by_module_ids():
    # GPUs 1, 5, 6 (PCI order) are modules 4, 5, 8: quad {1-4} has 1 used, {5-8} has 2
    snap = snap_of([dra_node("n1", taken=(1, 5, 6))])
    view = class_on_node(snap, "n1", CLASS, 4)
    assert (len(view.free), view.room, view.attribute) == (5, False, "gpu.nvidia.com/partition4")
    assert [(g.label, g.used) for g in view.groups] == [("{1-4}", 1), ("{5-8}", 2)]
    assert view.render() == "5 free, no free partition of 4: modules {1-4} 1 used, {5-8} 2 used"
    # a pair: only the pairs with room are named
    assert class_on_node(snap, "n1", CLASS, 2).render() == (
        "5 free, a free partition of 2: modules {1,2} free")
    assert class_on_node(snap, "n1", CLASS, 1).render() == "5 free, a free partition of 1"
    assert class_on_node(snap, "n1", CLASS, 3).render() == (
        "5 free, no partition of 3 (sizes: 1, 2, 4, 8)")


def test_DR2_records_holds_and_taints_count_as_used_and_own_records_as_free():
    node = dra_node("n1", taken=(0,))
    hold = Hold("r-other", "u", "n1", devices=((("u", "y"), ref("n1", 4)),))
    mine = recorded("t", "a", "n1", 7)
    snap = snap_of([node], [recorded("u", "x", "n1", 3), mine], [hold])
    view = class_on_node(snap, "n1", CLASS, 4, "r1", {mine.key})
    # used: 0 (claim), 3 (a record), 4 (another request's hold); 7 is the set's own record
    assert view.free == ("gpu-vfio-1", "gpu-vfio-2", "gpu-vfio-5", "gpu-vfio-6", "gpu-vfio-7")
    assert [(g.label, g.used) for g in view.groups] == [("{1-4}", 2), ("{5-8}", 1)]


def test_DR3_an_unsized_attribute_names_its_groups_by_value_and_devices():
    snap = snap_of([dra_node("l1", classes=(L40S,), profile=L40S_4, taken=(1,))])
    assert class_on_node(snap, "l1", L40S, 2).render() == (
        "3 free, a pcieRoot with 2 free: pci0000:b0 gpu-vfio-{2,3} free")
    view = class_on_node(snap, "l1", L40S, 3)
    assert view.render() == ("3 free, no pcieRoot with 3 free: pci0000:16 gpu-vfio-{0,1} 1 used, "
                             "pci0000:b0 gpu-vfio-{2,3} free")
    assert blocks(snap, "l1", L40S).render() == (
        "pcieRoot free: pci0000:16 gpu-vfio-{0,1} 1/2, pci0000:b0 gpu-vfio-{2,3} 2/2")
    assert largest_device_set(snap, "l1", L40S) == 2


def test_DR3_blocks_count_whole_free_partitions_per_size():
    snap = snap_of([dra_node("n1", taken=(1, 5, 6))])
    assert blocks(snap, "n1", CLASS).render() == (
        "whole free partitions by size: 8: 0/1, 4: 0/2, 2: 1/4, 1: 5/8")
    assert blocks(snap, "n1", "nope") is None


def test_count_mode_classes_get_no_device_view():
    from tests.support.world import gpu_class, node
    snap = Snapshot.build(nodes=[node("n1", h=4)], classes=[gpu_class()])
    assert class_on_node(snap, "n1", "h100", 2) is None
    assert blocks(snap, "n1", "h100") is None
    assert largest_device_set(snap, "n1", "h100") == 0


# --- the largest placeable set ----------------------------------------------------------------


def test_DR3_five_free_gpus_spread_over_partitions_place_at_most_the_largest_whole_partition():
    """The example of issue 32: 5 free GPUs, no whole quad: the largest placeable set is a
    pair, in top, in the fleet gauge (via top) and in defragmentation's profile (the D4 gauge)."""
    snap = snap_of([dra_node("n1", taken=(1, 5, 6)), dra_node("n2", taken=(0, 1, 2, 3, 5, 7))])  # n2: modules 7, 8 free
    assert snap.free("n1", RES) == 5
    assert largest_placeable(snap, CLASS) == {"n1": 2, "n2": 2}
    [h] = [x for x in largest_sets(snap) if x.class_name == CLASS]
    assert (h.size, h.nodes) == (2, 2)
    # the same DRA key counts units there, but no device of the class: the nodes do not
    # serve it (Snapshot.serving, DR1), so they are not listed
    assert largest_placeable(snap, ANY) == {}
    whole = snap_of([dra_node("n1", taken=(1, 5, 6)), dra_node("n2", taken=(0,))])
    assert largest_placeable(whole, CLASS) == {"n1": 2, "n2": 4}


def test_DR3_a_board_without_partitions_of_one_still_places_its_pairs():
    """A one-device probe fails its own group there (no partition1): the node is not ruled
    out for larger sets."""
    from dataclasses import replace
    from model.device.dra import SliceDevice
    node = dra_node("n1")
    stripped = tuple((c, tuple(SliceDevice(d.ref, d.node, tuple(
        (k, v) for k, v in d.attributes if not k.endswith("partition1")), d.taints) for d in devs))
        for c, devs in node.class_devices)
    snap = snap_of([replace(node, class_devices=stripped)])
    assert largest_placeable(snap, CLASS) == {"n1": 8}


@st.composite
def fleets(draw):
    """HGX nodes (the partition class and an unconstrained one) and L40S nodes (pcieRoot),
    with foreign claims, other tenants' records, holds of other requests, cordons, taints."""
    nodes, devices, holds = [], [], []
    for i in range(draw(st.integers(1, 3))):
        hgx = draw(st.booleans())
        size = 8 if hgx else 4
        name = f"{'n' if hgx else 'l'}{i}"
        taken = tuple(draw(st.sets(st.integers(0, size - 1), max_size=size // 2)))
        kw = {}
        if draw(st.integers(0, 5)) == 0:
            kw["unschedulable"] = True
        if draw(st.integers(0, 5)) == 0:
            kw["taints"] = (Taint("gpu", "x", "NoSchedule"),)
        nodes.append(dra_node(name, taken=taken, classes=(CLASS, ANY), **kw) if hgx
                     else dra_node(name, taken=taken, classes=(L40S,), profile=L40S_4, **kw))
        rest = [j for j in range(size) if j not in taken]
        recs = draw(st.sets(st.sampled_from(rest), max_size=2)) if rest else set()
        for j in sorted(recs):
            devices.append(recorded("u", f"{name}-r{j}", name, j, CLASS if hgx else L40S))
        rest = [j for j in rest if j not in recs]
        if rest and draw(st.booleans()):
            held = draw(st.sets(st.sampled_from(rest), min_size=1, max_size=2))
            holds.append(Hold(f"r-{name}", "u", name, ((RES, len(held)),), (),
                              devices=tuple((("u", f"{name}-h{j}"), ref(name, j)) for j in sorted(held))))
    return snap_of(nodes, devices, holds)


def _places_alone(snap: Snapshot, node: str, class_name: str, n: int) -> bool:
    alone = snap.with_nodes([snap.nodes[node]])
    probes = [GPUDevice("probe-ns", f"p{i}", class_name) for i in range(n)]
    d = decide(alone.with_devices(probes),
               Request(EXPLAIN_REQUEST_ID, "probe-ns", "vm", tuple(p.name for p in probes)))
    return d.result is Result.SUCCEEDED


@PROPS
@given(fleets(), st.sampled_from([CLASS, L40S, ANY]))
def test_DR3_property_largest_placeable_is_the_largest_set_decide_places_on_the_node_alone(snap, class_name):
    per_node = largest_placeable(snap, class_name)
    for node in snap.serving_nodes(class_name):
        largest = per_node.get(node, 0)
        placed = [n for n in range(1, 10) if _places_alone(snap, node, class_name, n)]
        note(f"{node} {class_name}: largest {largest}, decide places {placed}")
        if snap.nodes[node].devices_of(class_name):
            event(f"largest placeable {class_name}: {largest}")
        assert largest == max(placed, default=0)
    # defragmentation's profile (the D4 gauge) gives the same figure, maximised over nodes
    [profile] = [x for x in largest_sets(snap) if x.class_name == class_name]
    best = max(per_node.values(), default=0)
    assert profile.size == best
    assert profile.nodes == (sum(1 for v in per_node.values() if v == best) if best else 0)


# --- explain, what-if, top in device mode ------------------------------------------------------


def _fleet() -> Snapshot:
    """gpu-node-03: GPUs 1, 5, 6 claimed (5 free, no whole quad); gpu-node-04: GPU 0 claimed,
    tenant t's idle held `a` recorded on GPU 2 (module 3); l40s-01: one card claimed."""
    return snap_of([dra_node("gpu-node-03", taken=(1, 5, 6)), dra_node("gpu-node-04", taken=(0,)),
                    dra_node("l40s-01", classes=(L40S,), profile=L40S_4, taken=(1,))],
                   [recorded("t", "a", "gpu-node-04", 2)])


def test_DR3_explain_names_free_devices_groups_and_the_devices_taken():
    from datetime import datetime, timedelta, timezone
    from model.explain import explain
    from model.parse import VMIAsk
    e = explain(_fleet(), "t", "vm", VMIAsk((), ((CLASS, 4),)), live_vmis=set(),
                now=datetime(2026, 12, 4, tzinfo=timezone.utc), grace=timedelta(minutes=2))
    assert e.admitted and e.node == "gpu-node-04"
    views = {v.node: v for v in e.device_nodes}
    assert set(views) == {"gpu-node-03", "gpu-node-04"}  # l40s-01 has no h100x device
    assert views["gpu-node-03"].lines() == [
        "h100x: 5 free, no free partition of 4: modules {1-4} 1 used, {5-8} 2 used"]
    assert views["gpu-node-04"].lines() == [
        "h100x: 6 free, a free partition of 4: modules {5-8} free",
        "h100x takes gpu-vfio-4, gpu-vfio-5, gpu-vfio-6, gpu-vfio-7 (modules 5-8)"]
    # the devices shown are the binder's placement's
    assert {r.device for _, r in views["gpu-node-04"].devices} == {
        "gpu-vfio-4", "gpu-vfio-5", "gpu-vfio-6", "gpu-vfio-7"}


def test_DR4_explain_keeps_the_held_members_record_in_its_pair():
    from datetime import datetime, timedelta, timezone
    from model.explain import explain
    from model.parse import VMIAsk
    e = explain(_fleet(), "t", "vm", VMIAsk(("a",), ((CLASS, 1),)), live_vmis=set(),
                now=datetime(2026, 12, 4, tzinfo=timezone.utc), grace=timedelta(minutes=2))
    assert (e.admitted, e.node) == (True, "gpu-node-04")
    [v] = [v for v in e.device_nodes if v.node == "gpu-node-04"]
    assert v.takes == (("h100x", "gpu-vfio-1, gpu-vfio-2 (modules 3,4)"),)
    assert dict(v.devices)[("t", "a")].device == "gpu-vfio-2"  # its record, kept


def test_DR3_what_if_says_which_devices_a_moved_device_mode_set_takes():
    from datetime import datetime, timezone
    from model.what_if import what_if
    w = what_if(_fleet(), "cordon", ["gpu-node-04"], live_vmis=set(),
                now=datetime(2026, 12, 4, tzinfo=timezone.utc))
    [o] = w.outcomes
    assert (o.action, o.node) == ("move", "gpu-node-03")
    # buddy best fit: a single GPU goes into a pair already broken (modules 5,6: 5 claimed)
    assert o.takes == (("h100x", "gpu-vfio-7 (module 6)"),)
    assert [(k, r.device) for k, r in o.devices] == [(("t", "a"), "gpu-vfio-7")]


def test_DR3_top_counts_a_device_mode_class_on_its_own_nodes_in_devices_and_groups():
    from model.explain import top
    t = top(_fleet(), set())
    h = next(c for c in t.classes if c.class_name == CLASS)
    assert [(r.node, r.allocatable, r.bound, r.idle, r.free, r.largest) for r in h.nodes] == [
        ("gpu-node-03", 8, 0, 0, 5, 2), ("gpu-node-04", 8, 1, 1, 6, 4)]
    assert (h.free, h.largest) == (11, 4)
    l40 = next(c for c in t.classes if c.class_name == L40S)
    assert [(r.node, r.free, r.largest) for r in l40.nodes] == [("l40s-01", 3, 2)]
    assert [(b.class_name, b.node, b.render()) for b in t.blocks] == [
        (CLASS, "gpu-node-03", "whole free partitions by size: 8: 0/1, 4: 0/2, 2: 1/4, 1: 5/8"),
        (CLASS, "gpu-node-04", "whole free partitions by size: 8: 0/1, 4: 1/2, 2: 2/4, 1: 6/8"),
        (L40S, "l40s-01", "pcieRoot free: pci0000:16 gpu-vfio-{0,1} 1/2, pci0000:b0 gpu-vfio-{2,3} 2/2")]


def test_count_mode_answers_carry_no_device_parts():
    from model.explain import top
    from tests.support.world import LIVE, what_if_cluster
    t = top(what_if_cluster(), LIVE)
    assert t.blocks == ()
