"""`actors.view.IndexedView` (the informer cache's view, and the base of `MemoryStore`):
the indexes and the batched snapshot stay equal to a fresh build, and the change feed says
one `Change` per write (`put_*` only when the value changed; MemoryStore's setup always)."""

from __future__ import annotations

import random

import anyio
import pytest

from fakes.memory_store import MemoryStore
from actors.ports import Change
from actors.view import IndexedView
from model.snapshot import Snapshot
from model.types import (BindRequest, Budget, DeviceStatus, GPUClass, GPUDevice, Namespace,
                         Node, OnCordon, Phase)

H = "nvidia.com/H100"
NODES = ("n1", "n2", "n3")


def _node(name: str, units: int, cordoned: bool = False) -> Node:
    return Node(name, (("kubernetes.io/hostname", name), ("kubevirt.io/schedulable", "true")),
                ((H, units),), cordoned)


def _device(rng: random.Random, ns: str, name: str) -> GPUDevice:
    node = rng.choice((None, *NODES))
    rid = rng.choice((None, "r1", "r2"))
    br = BindRequest(rid, "vm", (name,), None) if rid else None
    status = DeviceStatus(Phase.BOUND, node, None, None, br) if node else DeviceStatus(bind_request=br)
    return GPUDevice(ns, name, "h100", None, status)


def _same(view: IndexedView) -> None:
    """The view's snapshot and indexes agree with a snapshot built from its contents."""
    snap = view.snapshot()
    fresh = Snapshot.build(nodes=view.nodes().values(), classes=view.classes().values(),
                           devices=view.devices().values(), budgets=view.budgets(),
                           namespaces=view.namespaces().values())
    assert dict(snap.devices) == dict(fresh.devices) == dict(view.devices())
    for n in (*NODES, "gone"):
        assert snap.used(n, H) == fresh.used(n, H)
        assert snap.free(n, H) == fresh.free(n, H)
        on = {d.key for d in view.devices().values() if d.bound_node == n}
        assert {d.key for d in view.devices_on(n)} == on
    for ns in ("a", "b"):
        assert snap.tenant_usage(ns, H) == fresh.tenant_usage(ns, H)
        for rid in ("r1", "r2"):
            want = {d.key for d in view.devices().values()
                    if d.namespace == ns and d.status.bind_request is not None
                    and d.status.bind_request.id == rid}
            assert {d.key for d in view.request_members(ns, rid)} == want
    assert snap.free_buckets(H) == fresh.free_buckets(H)


@pytest.mark.parametrize("seed", range(5))
def test_indexed_view_snapshot_and_indexes_follow_every_write(seed: int) -> None:
    rng = random.Random(seed)
    v = IndexedView()
    v.put_class(GPUClass("h100", H, OnCordon.MOVE))
    for ns in ("a", "b"):
        v.put_namespace(Namespace(ns))
    for n in NODES:
        v.put_node(_node(n, 4))
    names = [f"d{i}" for i in range(8)]
    for step in range(300):
        roll = rng.random()
        ns, name = rng.choice(("a", "b")), rng.choice(names)
        if roll < 0.55:
            v.put_device(_device(rng, ns, name))
        elif roll < 0.85:
            v.remove_device((ns, name))
        elif roll < 0.9:
            v.put_node(_node(rng.choice(NODES), rng.randint(1, 6), rng.random() < 0.3))
        elif roll < 0.95:
            v.set_budgets(ns, [Budget(ns, H, rng.randint(1, 9))])
        else:
            v.remove_node(rng.choice(NODES))
            v.put_node(_node(rng.choice(NODES), 4))
        if rng.random() < 0.3:  # sometimes several writes land before the next snapshot
            _same(v)
    _same(v)


async def _changes(view: IndexedView, writes) -> list[Change]:
    """The changes each of `writes` (callables, in order) emits, taken after each one (the
    feed coalesces a key changed again before it is taken)."""
    seen: list[Change] = []
    async with view.subscribe() as feed:
        for write in writes:
            write()
            while True:
                try:
                    change = feed.get_nowait()
                except anyio.WouldBlock:
                    break
                seen.append(change)
                feed.done(change)
    return seen


@pytest.mark.anyio
async def test_indexed_view_emits_only_real_changes() -> None:
    v = IndexedView()
    dev = GPUDevice("a", "d", "h100", None, DeviceStatus())

    writes = [
        lambda: v.put_node(_node("n1", 2)),
        lambda: v.put_node(_node("n1", 2)),  # same value: nothing
        lambda: v.put_class(GPUClass("h100", H, OnCordon.MOVE)),
        lambda: v.put_namespace(Namespace("a")),
        lambda: v.set_budgets("a", [Budget("a", H, 3), Budget("a", H, 2)]),
        lambda: v.set_budgets("a", [Budget("a", H, 2)]),  # same budgets: nothing
        lambda: v.put_device(dev),
        lambda: v.put_device(dev),  # a device put always says so
        lambda: v.remove_device(dev.key),
        lambda: v.remove_device(dev.key),  # gone already: nothing
        lambda: v.remove_namespace("a"),
        lambda: v.remove_class("h100"),
        lambda: v.remove_node("n1"),
        lambda: v.remove_node("n1"),
    ]

    assert await _changes(v, writes) == [
        Change("node", "n1"), Change("class", "h100"), Change("namespace", "a"),
        Change("budget", "a"), Change("device", dev.key), Change("device", dev.key),
        Change("device", dev.key), Change("namespace", "a"), Change("class", "h100"),
        Change("node", "n1")]


@pytest.mark.anyio
async def test_memory_store_setup_emits_one_change_per_call() -> None:
    s = MemoryStore()

    k = ("t", "a")
    rid: list[str] = []
    writes = [
        lambda: s.add_namespace("t"),
        lambda: s.add_namespace("t"),
        lambda: s.add_class("h100", H),
        lambda: s.add_node("n1", {H: 2}),
        lambda: s.add_node("n1", {H: 2}),
        lambda: s.cordon("n1"),
        lambda: s.cordon("n1"),
        lambda: s.set_allocatable("n1", H, 1),
        lambda: s.add_budget("t", H, 4),
        lambda: s.add_device("t", "a", "h100", node="n1"),
        lambda: rid.append(s.request("t", "vm", ["a"])),
        lambda: s.withdraw("t", rid[0]),
        lambda: s.delete_device(k),
        lambda: s.delete_device(k),  # missing: still one Change, as the store always did
        lambda: s.delete_node("n1"),
    ]
    assert await _changes(s, writes) == [
        Change("namespace", "t"), Change("namespace", "t"), Change("class", "h100"),
        Change("node", "n1"), Change("node", "n1"), Change("node", "n1"), Change("node", "n1"),
        Change("node", "n1"), Change("budget", "t"), Change("device", k), Change("device", k),
        Change("device", k), Change("device", k), Change("device", k), Change("node", "n1")]
    assert s.snapshot().devices == {} and s.used("n1", H) == 0


def test_memory_store_snapshot_follows_writes_between_reads() -> None:
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H)
    s.add_node("n1", {H: 4})
    keys = [s.add_device("t", f"d{i}", "h100", node="n1" if i % 2 else None) for i in range(4)]
    assert s.snapshot().used("n1", H) == 2
    s.delete_device(keys[1])
    s.delete_device(keys[0])
    s.add_device("t", "d9", "h100", node="n1")
    rid = s.request("t", "vm", ["d2", "d3"])
    snap = s.snapshot()
    assert snap.used("n1", H) == 2 and s.used("n1", H) == 2
    assert set(snap.devices) == {keys[2], keys[3], ("t", "d9")}
    assert snap.device("t", "d2").status.bind_request.id == rid
    assert s.snapshot() is snap
