"""The binder's defragmentation rounds (docs/contract.md §3a) on the in-memory store, fake time.

D2: a round runs inside the coordinator's one decision loop, each move reserved on its
target's node actor and written by the status pipeline as a `move` write (an Event on the
device, D4), yielding to a complete request waiting for the loop; D3: off by default, at
most `defrag_max_moves` moves; D1: only idle held devices move, never a running VM's; the
round makes a 4-device set placeable that was refused for fragmentation.
"""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from actors.coordinator import _Defrag

from actors.coordinator_protocol import GetStatus, Resync
from fakes.memory_store import MemoryStore
from model.types import Result
from tests.support.binder import fast_config, results_of, running_binder, settle
from tests.timing import advance, eventually

H = "nvidia.com/H100"
NS = "t"


class Observer:
    def __init__(self) -> None:
        self.rounds: list[tuple[int, dict]] = []

    def decided(self, *args) -> None:
        pass

    def defragmented(self, moves: int, largest) -> None:
        self.rounds.append((moves, dict(largest)))


def fragmented() -> MemoryStore:
    """Two 4-unit nodes: n1 holds two idle held devices, n2 two running VMs' devices: 2 free
    units on each, no 4-set fits anywhere."""
    s = MemoryStore()
    s.add_namespace(NS)
    s.add_class("h100", H)
    s.add_node("n1", {H: 4})
    s.add_node("n2", {H: 4})
    for name, node in (("idle-1", "n1"), ("idle-2", "n1"), ("run-1", "n2"), ("run-2", "n2")):
        s.add_device(NS, name, "h100", node=node)
    return s


def config(interval: float, max_moves: int = 4):
    c = fast_config()
    return replace(c, coordinator=replace(c.coordinator, defrag_interval=interval,
                                          defrag_max_moves=max_moves))


async def running_vms(s: MemoryStore) -> None:
    """Admit the running VMs' devices as the webhook would (attached, Succeeded)."""
    for vm, dev in (("vm-1", "run-1"), ("vm-2", "run-2")):
        s.request(NS, vm, [dev])


def nodes_of(s: MemoryStore) -> dict[str, str | None]:
    return {d.name: d.status.node_name for d in s.devices().values()}


@pytest.mark.anyio
async def test_D3_off_by_default_nothing_moves():
    s = fragmented()
    await running_vms(s)
    before = nodes_of(s)
    async with running_binder(s) as binder:
        await settle(s, binder)
        await advance(120)
        assert nodes_of(s) == before
        assert not [r for r in s.history if r.op == "move"]


@pytest.mark.anyio
async def test_D1_D2_D4_round_moves_idle_devices_and_the_4_set_then_fits():
    s = fragmented()
    await running_vms(s)
    obs = Observer()
    async with running_binder(s, config(interval=10.0), observer=obs) as binder:
        await settle(s, binder)
        attached = {d.name: d.status.node_name for d in s.devices().values()
                    if d.status.attached_to is not None}
        # a 4-set now: refused for fragmentation
        for i in range(4):
            s.add_device(NS, f"new-{i}", "h100")
        rid = s.request(NS, "vm-4", [f"new-{i}" for i in range(4)])
        await settle(s, binder)
        assert {r[0] for r in results_of(s, NS, rid).values()} == {Result.REFUSED}
        s.withdraw(NS, rid)  # W5: the webhook clears its refused request
        await advance(10.5)  # one round is due and runs
        await eventually(lambda: len([r for r in s.history if r.op == "move"]) == 2,
                         what="two moves written")
        moves = [r for r in s.history if r.op == "move"]
        assert {(r.key[1], r.from_node, r.node) for r in moves} == {("idle-1", "n1", "n2"),
                                                                 ("idle-2", "n1", "n2")}
        assert {d.name: d.status.node_name for d in s.devices().values()
                if d.status.attached_to is not None} == attached  # no running VM's device
        assert [e[1] for e in s.events] == ["GPUDeviceMoved", "GPUDeviceMoved"]
        assert "from n1 to n2, freeing n1 so the largest placeable h100 set grows from 2 to 4" \
            in s.events[0][2]
        status = await binder.coordinator.ask(GetStatus())
        assert status.defrag_moves == 2
        await eventually(lambda: not binder.pipeline.statistics().reservations,
                         what="the moves' holds released once the view shows them")
        rid = s.request(NS, "vm-4", [f"new-{i}" for i in range(4)])
        await settle(s, binder)
        assert {(r[0], r[1]) for r in results_of(s, NS, rid).values()} == {(Result.SUCCEEDED, "n1")}
        assert s.used("n1", H) == 4 and s.used("n2", H) == 4  # within allocatable
    assert obs.rounds and obs.rounds[0] == (2, {"h100": 4})


@pytest.mark.anyio
async def test_D3_at_most_max_moves_a_round():
    s = fragmented()
    await running_vms(s)
    async with running_binder(s, config(interval=5.0, max_moves=1)) as binder:
        await settle(s, binder)
        await advance(5.5)
        await eventually(lambda: [r for r in s.history if r.op == "move"], what="a move")
        await advance(0.5)
        assert len([r for r in s.history if r.op == "move"]) == 1


@pytest.mark.anyio
async def test_D2_a_waiting_request_is_decided_before_the_round():
    """A complete request waiting for the loop when a round is due is decided first: it
    takes n1's two free units, after which no move helps. Had the round gone first, it
    would have moved n1's idle devices to n2."""
    s = fragmented()
    await running_vms(s)
    obs = Observer()
    async with running_binder(s, config(interval=1000.0), observer=obs) as binder:
        await settle(s, binder)
        for i in range(2):
            s.add_device(NS, f"w-{i}", "h100")
        rid = s.request(NS, "vm-2b", ["w-0", "w-1"])
        # the request reaches the queue (Resync) before the round is due
        binder.coordinator.tell_nowait(Resync())
        binder.coordinator.tell_nowait(_Defrag())
        await settle(s, binder)
        await eventually(lambda: obs.rounds, what="the round ran")
        assert {r[1] for r in results_of(s, NS, rid).values()} == {"n1"}
        assert obs.rounds == [(0, {"h100": 2})]  # n2 still has 2 free units
        assert not [r for r in s.history if r.op == "move"]


@pytest.mark.anyio
async def test_D1_a_device_attached_after_the_plan_is_not_moved():
    """The move write is a compare-and-set on the device being idle where it was: a
    device the webhook attached meanwhile stays, and the round's hold is released."""
    s = fragmented()
    await running_vms(s)
    async with running_binder(s, config(interval=5.0)) as binder:
        await settle(s, binder)
        original = s._move  # noqa: SLF001 - a race at the write, as the API server would see it

        def racing(dev, w):
            if dev.name == "idle-1" and dev.status.attached_to is None:
                s.request(NS, "vm-late", ["idle-1"])
                dev = s.device(dev.key)
            return original(dev, w)
        s._move = racing  # noqa: SLF001
        await advance(5.5)
        await eventually(lambda: not binder.pipeline.statistics().reservations and
                         any(d.status.attached_to for d in s.devices().values()
                             if d.name == "idle-1"), what="the round over")
        assert s.device((NS, "idle-1")).status.node_name == "n1"
        assert all(r.key[1] != "idle-1" for r in s.history if r.op == "move")


@pytest.mark.anyio
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_D2_rounds_interleaved_with_churn_never_overcommit_a_node(seed):
    """Seeded churn (sets of 1-4 devices arriving, VMs ending and releasing their devices
    or leaving them held idle) with a round every 0.05 s: after every write no node is over allocatable (§7.1),
    and at the end invariants 1-4 hold and some moves were made."""
    import random

    from tests.support.binder import check_invariants

    rng = random.Random(seed)
    s = MemoryStore(seed=seed)
    s.add_namespace(NS)
    s.add_class("h100", H)
    for i in range(4):
        s.add_node(f"n{i}", {H: 4})
    over: list[str] = []

    def live_check(rec) -> None:
        if rec.moved:
            for n in s.nodes():
                if s.used(n, H) > 4:
                    over.append(f"{rec.op} {rec.key} -> {rec.node}: {n} has {s.used(n, H)}")
    s.on_write = live_check
    obs = Observer()
    async with running_binder(s, config(interval=0.05, max_moves=2), observer=obs) as binder:
        running: list[tuple[str, list[str]]] = []
        idle: list[list[str]] = []
        k = 0
        for step in range(60):
            while running and rng.random() < 0.5:  # a VM ends: devices released or left idle
                rid, names = running.pop(rng.randrange(len(running)))
                s.withdraw(NS, rid)
                idle.append(names)
            while idle and rng.random() < 0.4:  # a tenant releases idle held devices
                for name in idle.pop(rng.randrange(len(idle))):
                    s.delete_device((NS, name))
            size = rng.choice([1, 1, 2, 4])
            names = []
            for _ in range(size):
                s.add_device(NS, f"d{k}", "h100")
                names.append(f"d{k}")
                k += 1
            rid = s.request(NS, f"vm-{step}", names)
            await advance(rng.choice([0.0, 0.02, 0.06]))
            await settle(s, binder)
            res = {r[0] for r in results_of(s, NS, rid).values()}
            if res == {Result.SUCCEEDED}:
                running.append((rid, names))
            else:
                s.withdraw(NS, rid)
                for name in names:  # W5: the webhook deletes what it created
                    s.delete_device((NS, name))
        await advance(1.0)
        await eventually(lambda: not binder.pipeline.statistics().reservations,
                         what="every hold released")
    assert over == []
    assert check_invariants(s) == []
    assert [r for r in s.history if r.op == "move"], ("the churn never gave a round work",
                                                      len(obs.rounds), obs.rounds[-3:])
