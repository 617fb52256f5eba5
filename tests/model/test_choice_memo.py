"""The remembered device-mode choice (docs/contract.md §3b DR2-DR4; issue 32's admission latency):
`model.device.topology.choose_devices` on a node's worked-out `Layout`, and `Snapshot.free_devices`
on a node's `model.device.dra.DeviceSet`, give exactly what the straightforward computation gives.
Hypothesis compares both with reference copies of the computation they replaced (kept here,
verbatim but for names) on random boards, free sets, keep sets, records, holds, claims and
taints, asked repeatedly so the memos answer too."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from model.device.dra import DeviceRef, DeviceTaint, SliceDevice
from model.hold import Hold
from model.snapshot import Snapshot
from model.device.view import largest_device_set
from model.device.match import MatchAttribute
from model.device.topology import (SIZE_PLACEHOLDER, Board, Device, GroupChoice, NoGroup, choose_devices, layout,
                            natural_key, resolve_attribute, sizes_present)
from model.types import DeviceStatus, GPUClass, GPUDevice, Node, Phase
from tests.model.test_topology import PARTITION, PCIE_ROOT, hgx, pcie_node

PROPS = settings(max_examples=300, deadline=None, print_blob=True)


# --- the reference: choose_devices as it was before the layout ----------------------------------

def _ref_levels(template, count, devices, group_members):
    if template is None or SIZE_PLACEHOLDER not in template:
        return [list(devices)]
    levels = []
    for size in (n for n in sizes_present(MatchAttribute(template), devices) if n > count):
        attribute = resolve_attribute(MatchAttribute(template), size)
        values = {d.attribute(attribute) for d in group_members} - {None}
        levels.append([d for d in devices if d.attribute(attribute) in values])
    return levels or [list(devices)]


def reference_choose(devices, free, count, template, keep=()):
    attribute = resolve_attribute(MatchAttribute.of(template), count)
    free_set, keep_set = set(free), set(keep)
    groups: dict = {}
    for device in devices:
        value = device.attribute(attribute) if attribute is not None else None
        if attribute is not None and value is None:
            continue
        groups.setdefault(value, []).append(device)
    best = None
    largest_free = 0
    for value, members in groups.items():
        free_members = [d for d in members if d.name in free_set]
        largest_free = max(largest_free, len(free_members))
        if len(free_members) < count:
            continue
        ordered = sorted(free_members, key=lambda d: (d.name not in keep_set, natural_key(d.name)))
        chosen = ordered[:count]
        left = tuple(sum(1 for d in level if d.name in free_set) - count
                     for level in _ref_levels(template, count, devices, members))
        choice = GroupChoice(tuple(sorted((d.name for d in chosen), key=natural_key)), value, left,
                             len(free_members) - count, sum(1 for d in chosen if d.name in keep_set))
        key = (choice.fit, natural_key(str(value)))
        if best is None or key < best[0]:
            best = (key, choice)
    if best is not None:
        return best[1]
    sizes = sizes_present(MatchAttribute(template), devices) if template is not None else ()
    return NoGroup(attribute, count, largest_free, attribute is not None and not groups, sizes)


@st.composite
def nodes(draw):
    """A node's devices: an HGX-like board (random partition sizes, 2-16 GPUs, in a random
    order, some lacking the attribute), PCIe cards (unsized attribute) or no constraint;
    a free set, a keep subset and a count (sizes that exist and some that do not)."""
    kind = draw(st.sampled_from(["hgx", "pcie", "none"]))
    if kind == "hgx":
        k = draw(st.integers(1, 4))
        all_sizes = [2 ** j for j in range(k + 1)]
        sizes = tuple(sorted(draw(st.sets(st.sampled_from(all_sizes), min_size=1))))
        devices = hgx(sizes=sizes, gpus=2 ** k)
        template = PARTITION
        bare = draw(st.sets(st.sampled_from([d.name for d in devices]), max_size=2))
        devices = [Device(d.name) if d.name in bare else d for d in devices]
    else:
        devices, template = pcie_node(), (PCIE_ROOT if kind == "pcie" else None)
    devices = draw(st.permutations(devices))
    free = draw(st.sets(st.sampled_from([d.name for d in devices])))
    keep = draw(st.sets(st.sampled_from(sorted(free)))) if free else set()
    count = draw(st.integers(1, 9))
    return tuple(devices), frozenset(free), frozenset(keep), count, template


@PROPS
@given(nodes(), st.randoms(use_true_random=False))
def test_property_the_layout_choice_is_the_straightforward_one(case, rnd: random.Random):
    devices, free, keep, count, template = case
    want = reference_choose(devices, free, count, template, keep)
    match = MatchAttribute.of(template)
    assert choose_devices(devices, free, count, match, keep) == want
    board = Board(devices)  # the layouts live with the node's devices
    assert choose_devices(board, free, count, match, keep) == want
    assert choose_devices(board, free, count, match, keep) == want  # remembered
    listed = list(free)
    rnd.shuffle(listed)
    assert choose_devices(list(devices), listed, count, match, sorted(keep)) == want  # by value
    assert board.layout(match, count) is board.layout(match, count)
    assert layout(board, match, count) is board.layout(match, count)


# --- the reference: free_devices as it was before the DeviceSet ---------------------------------

CLASS, RES, DRIVER = "h100x", "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices", "gpu.nvidia.com"


def reference_free(snap: Snapshot, node: str, class_name: str, request_id=None, own=()):
    n = snap.nodes.get(node)
    if n is None:
        return frozenset()
    devices = n.devices_of(class_name)
    if not devices:
        return frozenset()
    own_keys = set(own)
    recorded = snap.recorded_devices(node)
    mine = {name for name, keys in recorded.items() if any(k in own_keys for k in keys)}
    others = {name for name, keys in recorded.items() if any(k not in own_keys for k in keys)}
    held = set()
    for r in snap.reservations:
        if r.devices and r.node == node and r.request_id != request_id:
            held.update(ref.device for _, ref in r.devices)
    out = set()
    for d in devices:
        name = d.ref.device
        if d.tainted or name in others or name in held:
            continue
        if not MatchAttribute(PARTITION).carried_by(d.attributes):  # HL3: lost, never free
            continue
        if name in n.taken_devices and name not in mine:
            continue
        out.add(name)
    return frozenset(out)


def _ref(node: str, i: int) -> DeviceRef:
    return DeviceRef(DRIVER, node, f"gpu-{i}")


@st.composite
def worlds(draw):
    """Two 8-GPU nodes with random taints and claims; devices of tenants t and u recording
    random GPUs (two now and then recording the same one); holds of requests r1-r3 naming
    random GPUs; the question's request and its own members."""
    node_list = []
    for name in ("n1", "n2"):
        tainted = draw(st.sets(st.integers(0, 7), max_size=2))
        bare = draw(st.sets(st.integers(0, 7), max_size=2))  # HL3: published without a partition
        devs = tuple(SliceDevice(_ref(name, i), name,
                                 () if i in bare else ((PARTITION.replace("{size}", "1"), i),),
                                 (DeviceTaint("k", "", draw(st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]))),)
                                 if i in tainted else ()) for i in range(8))
        taken = frozenset(f"gpu-{i}" for i in draw(st.sets(st.integers(0, 7), max_size=3)))
        node_list.append(Node(name, allocatable=((RES, 8),), class_devices=((CLASS, devs),),
                              taken_devices=taken))
    devices = []
    for k in range(draw(st.integers(0, 8))):
        ns = draw(st.sampled_from(["t", "u"]))
        node = draw(st.sampled_from(["n1", "n2"]))
        i = draw(st.integers(0, 7))
        devices.append(GPUDevice(ns, f"d{k}", CLASS, status=DeviceStatus(Phase.BOUND, node, None,
                                                                         device=_ref(node, i))))
    holds = []
    for k in range(draw(st.integers(0, 3))):
        node = draw(st.sampled_from(["n1", "n2"]))
        idx = draw(st.sets(st.integers(0, 7), min_size=1, max_size=3))
        holds.append(Hold(f"r{k + 1}", "t", node,
                          devices=tuple((("t", f"h{k}-{i}"), _ref(node, i)) for i in sorted(idx))))
    snap = Snapshot.build(nodes=node_list, classes=[GPUClass(CLASS, RES, device_class_name="vfio.gpu.nvidia.com",
                                                             match_attribute=PARTITION)],
                          devices=devices, reservations=holds)
    own = draw(st.sets(st.sampled_from([d.key for d in devices]))) if devices else set()
    request = draw(st.sampled_from([None, "r1", "r2", "r9"]))
    return snap, request, frozenset(own)


@PROPS
@given(worlds())
def test_property_free_devices_is_the_straightforward_set(case):
    snap, request, own = case
    for node in ("n1", "n2", "gone"):
        want = reference_free(snap, node, CLASS, request, own)
        got = snap.free_devices(node, CLASS, request, own)
        assert got == want and isinstance(got, frozenset)
        assert snap.free_devices(node, CLASS, request, list(own)) == want
        assert snap.free_devices(node, "other", request, own) == frozenset()
        if not own:
            got = snap.free_devices(node, CLASS, request)
            assert got == want and isinstance(got, frozenset)


# --- the snapshot's node memo: decisions on derived snapshots equal those on fresh ones ----------

def _fresh(snap: Snapshot) -> Snapshot:
    """The same content built anew (no memo, no index, no records carried over)."""
    return Snapshot.build(nodes=snap.nodes.values(), classes=snap.classes.values(),
                          devices=snap.devices.values(), namespaces=snap.namespaces.values(),
                          reservations=snap.reservations)


def _hgx_node(name: str, taken: frozenset[str]) -> Node:
    from tests.support.dra_worlds import dra_node
    return dra_node(name, taken=tuple(int(t.rsplit("-", 1)[1]) for t in sorted(taken)))


@settings(max_examples=60, deadline=None, print_blob=True)
@given(st.randoms(use_true_random=False))
def test_property_decisions_on_derived_snapshots_equal_those_on_fresh_ones(rnd: random.Random):
    """A random life of a 4-node HGX fleet: sets placed and carried out (records), stopped,
    other requests' holds added and dropped, a batch planned through `Reserving` (holds
    added in place), a node's claims changed (`with_nodes`); after each step the decision
    and the W1 check of a new set of 1, 2, 4 or 8 on the derived snapshot (its node memo
    carried over) equal those on the same content built anew."""
    from model.check import check_set
    from model.decide import Request, apply_decision, decide
    from model.plan import placement_hold
    from model.snapshot import Order, Reserving
    from model.types import Result
    from tests.support.dra_worlds import CLASS as HCLASS, device_class, ref

    now = None
    nodes = [_hgx_node(f"n{i}", frozenset()) for i in range(4)]
    snap = Snapshot.build(nodes=nodes, classes=[device_class()])
    running: list[list[tuple[str, str]]] = []
    step = 0

    def new_set(size: int):
        nonlocal step
        step += 1
        tpls = [GPUDevice("t", f"v{step}-{i}", HCLASS, template_for=f"v{step}") for i in range(size)]
        return tpls, Request(f"r{step}", "t", f"v{step}", tuple(t.name for t in tpls))

    def same(s: Snapshot) -> None:
        size = rnd.choice([1, 1, 2, 4, 8])
        assert check_set(s, "t", [Order("t", HCLASS)] * size) == check_set(_fresh(s), "t", [Order("t", HCLASS)] * size)
        tpls, req = new_set(size)
        with_t = s.with_devices(tpls)
        assert decide(with_t, req) == decide(_fresh(with_t), req)

    for _ in range(12):
        op = rnd.choice(["place", "place", "stop", "hold", "drop", "batch", "nodes"])
        if op == "place":
            tpls, req = new_set(rnd.choice([1, 2, 4]))
            snap = snap.with_devices(tpls)
            d = decide(snap, req)
            snap = apply_decision(snap, req, d, now=now)
            if d.result is Result.SUCCEEDED:
                running.append([t.key for t in tpls])
            else:
                snap = snap.without_devices(t.key for t in tpls)
        elif op == "stop" and running:
            snap = snap.without_devices(running.pop(rnd.randrange(len(running))))
        elif op == "hold":
            node = rnd.choice(list(snap.nodes))
            idx = rnd.sample(range(8), rnd.randint(1, 3))
            snap = snap.with_reservation(Hold(f"h{step}-{rnd.randrange(3)}", "u", node, devices=tuple(
                (("u", f"x{i}"), ref(node, i)) for i in idx)))
        elif op == "drop" and snap.reservations:
            snap = snap.without_reservation(rnd.choice(snap.reservations).request_id)
        elif op == "batch":
            work = Reserving(snap)
            for _ in range(3):
                tpls, req = new_set(rnd.choice([1, 2, 4]))
                base = work.snapshot
                work = Reserving(base.with_devices(tpls))
                d = decide(work.snapshot, req)
                assert d == decide(_fresh(work.snapshot), req)
                if d.result is Result.SUCCEEDED and d.placements[0].devices:
                    work.add(placement_hold(req, d.placements[0], work.snapshot))
                    same(work.snapshot)
            snap = snap.without_devices(())  # the batch's holds were tentative: back to the view
        elif op == "nodes":
            node = rnd.choice(list(snap.nodes))
            taken = frozenset(f"gpu-vfio-{i}" for i in rnd.sample(range(8), rnd.randint(0, 2)))
            snap = snap.with_nodes([_hgx_node(n, taken) if n == node else x for n, x in snap.nodes.items()])
        same(snap)


# --- the largest placeable set (top, metrics, defragmentation) ----------------------------------

def reference_largest(snap: Snapshot, node: str, class_name: str) -> int:
    """`largest_device_set` straight from its docstring: the largest n <= free units with n
    free devices sharing the attribute resolved for n (any n without a constraint)."""
    from model.device.topology import resolve_attribute, sizes_present
    cls, n = snap.classes.get(class_name), snap.nodes.get(node)
    if cls is None or not cls.device_mode or n is None:
        return 0
    units = snap.free(node, cls.resource_name)
    devices = [d.as_device() for d in n.devices_of(class_name)]
    free = snap.free_devices(node, class_name)
    template = cls.match_attribute
    if template is None:
        return max(0, min(len(free), units))

    def most_in_a_group(attribute: str) -> int:
        counts: dict = {}
        for d in devices:
            v = d.attribute(attribute)
            if v is not None and d.name in free:
                counts[v] = counts.get(v, 0) + 1
        return max(counts.values(), default=0)

    if SIZE_PLACEHOLDER not in template:
        return max(0, min(most_in_a_group(template), units))
    match = MatchAttribute(template)
    return max((size for size in sizes_present(match, devices)
                if size <= units and most_in_a_group(resolve_attribute(match, size)) >= size),
               default=0)


@PROPS
@given(st.randoms(use_true_random=False))
def test_property_largest_device_set_is_the_straightforward_one_on_derived_snapshots(rnd: random.Random):
    """On HGX nodes (partition{size}), a PCIe-root class and an unconstrained one, with random
    claims, foreign units and records, and snapshots derived by moving records about (the
    figure is remembered on the snapshot's node memo): always the reference figure."""
    from localcluster.dra_profiles import DEVICE_CLASS
    from tests.support.dra_worlds import RES as DRA_RES, dra_node, recorded
    classes = [GPUClass(c, DRA_RES, device_class_name=DEVICE_CLASS, match_attribute=m)
               for c, m in (("h100x", PARTITION), ("root", "resource.kubernetes.io/pcieRoot"),
                            ("any", None))]
    nodes = [dra_node(f"n{i}", classes=("any", "h100x", "root"),
                      taken=tuple(rnd.sample(range(8), rnd.randint(0, 2)))) for i in range(3)]
    devices = []
    for k in range(rnd.randint(0, 12)):
        node = rnd.choice(nodes).name
        devices.append(recorded(rnd.choice("tu"), f"d{k}", node, rnd.randrange(8),
                                class_name=rnd.choice(["h100x", "root", "any"])))
    snap = Snapshot.build(nodes=nodes, classes=classes, devices=devices)
    for _ in range(4):
        for n in nodes:
            for c in classes:
                assert largest_device_set(snap, n.name, c.name) == \
                    reference_largest(_fresh(snap), n.name, c.name)
        if not devices:
            break
        d = rnd.choice(devices)
        node = rnd.choice(nodes).name
        moved = recorded(d.namespace, d.name, node, rnd.randrange(8), class_name=d.class_name)
        devices = [moved if x.key == d.key else x for x in devices]
        snap = snap.with_devices([moved])
