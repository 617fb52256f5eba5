"""Device mode in the actors (docs/contract.md §3b DR2, DR6; B2): the node ledger reserves named
devices and refuses a prepare naming one that is taken (another lease, a Bound record, a
claim's allocation); the status pipeline writes `status.device` with the placement; through
the real coordinator and node actors on the in-memory store, concurrent device-mode
admissions never put one device on two records, every Succeeded set forms its partition,
and two admissions racing for the last whole partition: one Succeeded, the other Refused."""

from __future__ import annotations

import random

import anyio
import anyio.lowlevel
import pytest

from actors.node_actor import Abort, Commit, Committed, GetLedger, NodeActor, NodeActorConfig, Prepare, Prepared, PrepareRefused, Release
from actors.runtime import spawn
from fakes.clock import ManualClock
from fakes.memory_store import Faults, MemoryStore
from model.hold import Hold
from model.reasons import Cordoned, DevicesTaken, NodeUnfit
from model.device.match import MatchAttribute
from model.device.topology import resolve_attribute
from model.types import Result
from tests.support.binder import check_invariants, quiet_logging, running_binder, settle
from model.types import OnCordon
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node, ref, tainted

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def dra_store(nodes, seed: int = 0, faults: Faults | None = None) -> MemoryStore:
    s = MemoryStore(seed=seed, faults=faults or Faults())
    s.put_class(device_class())
    for t in ("t1", "t2"):
        s.add_namespace(t)
    for n in nodes:
        s.put_node(n)
    return s


def named(rid: str, *pairs: tuple[str, int], node: str = "n1") -> Hold:
    """A hold of request `rid` landing Pending members `name` on GPU `index` of `node`."""
    land = tuple((("t1", name), RES) for name, _ in pairs)
    return Hold(rid, "t1", node, ((RES, len(pairs)),), ((RES, len(pairs)),), land,
                tuple((("t1", name), ref(node, i)) for name, i in pairs))


# --- the ledger (DR2) -----------------------------------------------------------------------------

async def test_DR2_the_ledger_refuses_names_another_lease_a_record_or_a_claim_takes() -> None:
    s = dra_store([dra_node("n1", taken=(7,))])
    s.add_device("t1", "held", CLASS, node="n1", device=ref("n1", 6))
    for name in ("a", "b", "c", "d"):
        s.add_device("t1", name, CLASS)
    clock = ManualClock()
    async with anyio.create_task_group() as tg:
        node, cell = await spawn(tg, lambda: NodeActor("n1", s, clock, NodeActorConfig(prepare_ttl=5.0)),
                                 name="n1")
        p = await node.ask(Prepare(named("r1", ("a", 0), ("b", 3))))
        assert isinstance(p, Prepared)
        assert (await node.ask(GetLedger())).held_devices == ("gpu-vfio-0", "gpu-vfio-3")
        no = await node.ask(Prepare(named("r2", ("c", 3), ("d", 1))))
        assert no == PrepareRefused("n1", "r2", DevicesTaken(("gpu-vfio-3",)))
        no = await node.ask(Prepare(named("r2", ("c", 6), ("d", 7))))
        assert no == PrepareRefused("n1", "r2", DevicesTaken(("gpu-vfio-6", "gpu-vfio-7")))
        assert isinstance(await node.ask(Prepare(named("r2", ("c", 2), ("d", 1)))), Prepared)
        # abort frees r2's names; expiry frees r1's
        assert await node.ask(Abort("r2")) is True
        assert isinstance(await node.ask(Prepare(named("r3", ("c", 1)))), Prepared)
        clock.advance(5.0)
        assert isinstance(await node.ask(Prepare(named("r4", ("d", 0), ("c", 3)))), Prepared)
        assert (await node.ask(GetLedger())).held_devices == ("gpu-vfio-0", "gpu-vfio-3")
        cell.close()


async def test_DR2_a_committed_lease_holds_its_names_until_released_and_own_records_are_free() -> None:
    s = dra_store([dra_node("n1")])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 2))  # re-pointed by r1 to 0
    s.add_device("t1", "b", CLASS)
    async with anyio.create_task_group() as tg:
        node, cell = await spawn(tg, lambda: NodeActor("n1", s, ManualClock()), name="n1")
        hold = Hold("r1", "t1", "n1", ((RES, 1),), ((RES, 1),), ((("t1", "b"), RES),),
                    ((("t1", "a"), ref("n1", 0)), (("t1", "b"), ref("n1", 2))))
        p = await node.ask(Prepare(hold))  # b takes a's old device: a is r1's own member
        assert isinstance(p, Prepared)
        assert isinstance(await node.ask(Commit("r1", p.incarnation)), Committed)
        assert isinstance(await node.ask(Prepare(named("r2", ("b", 0)))), PrepareRefused)
        assert await node.ask(Release("r1")) is True
        assert isinstance(await node.ask(Prepare(named("r2", ("b", 0)))), Prepared)
        cell.close()


# --- through the coordinator (DR6, B2) ----------------------------------------------------------

def _records_problems(store: MemoryStore) -> list[str]:
    """No device on two records; each Succeeded request's members record devices of its
    node forming the class's group (DR6)."""
    problems = []
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for key, dev in store.devices().items():
        rec = dev.status.device
        if rec is None:
            continue
        if dev.bound_node is None:
            problems.append(f"{key} records {rec} but is not Bound")
            continue
        where = (dev.bound_node, rec.device)
        if where in seen:
            problems.append(f"{where} recorded by {seen[where]} and {key}")
        seen[where] = key
    by_request: dict[tuple[str, str], list] = {}
    for dev in store.devices().values():
        br = dev.status.bind_request
        if br is not None and br.result is Result.SUCCEEDED:
            by_request.setdefault((dev.namespace, br.id), []).append(dev)
    for rid, members in by_request.items():
        node = members[0].bound_node
        attr = resolve_attribute(MatchAttribute.of(store.classes()[CLASS].match_attribute), len(members))
        devs = {d.ref: d.as_device() for d in store.node(node).devices_of(CLASS)}
        values = {devs[m.status.device].attribute(attr) if m.status.device in devs else None
                  for m in members}
        if None in values or len(values) != 1 or any(m.bound_node != node for m in members):
            problems.append(f"{rid}: members {[(m.name, m.bound_node, m.status.device) for m in members]}"
                            f" do not form one {attr}")
    return problems


async def test_DR6_concurrent_device_mode_admissions_never_share_a_device() -> None:
    rng = random.Random(20261204)
    for rep in range(12):
        s = dra_store([dra_node(f"n{i}", taken=tuple(rng.sample(range(8), rng.randint(0, 2))))
                       for i in range(3)], seed=rep,
                      faults=Faults(latency=rng.choice([0.0, 0.0002]), error_rate=0.05,
                                    conflict_rate=0.05))
        requests = []
        async with running_binder(s) as binder:
            for i in range(rng.randint(6, 12)):
                size = rng.choice([1, 1, 2, 2, 4, 8])
                ns = rng.choice(["t1", "t2"])
                names = [f"r{i}-{j}" for j in range(size)]
                for n in names:
                    s.add_device(ns, n, CLASS)
                requests.append((ns, s.request(ns, f"vm{i}", names)))
                if rng.random() < 0.3:
                    await anyio.lowlevel.checkpoint()
            await settle(s, binder)
        assert _records_problems(s) == []
        assert check_invariants(s) == []
        results = [s.request_members(ns, rid)[0].status.bind_request.result for ns, rid in requests]
        assert Result.SUCCEEDED in results


async def test_B2_two_admissions_racing_for_the_last_whole_partition_one_wins() -> None:
    """n1: GPU 1 is taken, so quad {0-3} is broken; quad {4-7} is the last whole partition of
    four. Two 4-GPU sets race for it: exactly one Succeeded (on {4-7}), the other Refused."""
    rng = random.Random(32)
    for rep in range(60):
        s = dra_store([dra_node("n1", taken=(1,))], seed=rep,
                      faults=Faults(latency=rng.choice([0.0, 0.0002]),
                                    error_rate=rng.choice([0.0, 0.1])))
        ids = []
        async with running_binder(s) as binder:
            for t in ("t1", "t2"):
                names = [f"{t}-{j}" for j in range(4)]
                for n in names:
                    s.add_device(t, n, CLASS)
                ids.append((t, s.request(t, "vm", names)))
                if rng.random() < 0.5:
                    await anyio.lowlevel.checkpoint()
            await settle(s, binder)
        results = sorted(s.request_members(t, rid)[0].status.bind_request.result.value
                         for t, rid in ids)
        assert results == ["Refused", "Succeeded"], rep
        winner = next((t, rid) for t, rid in ids
                      if s.request_members(t, rid)[0].status.bind_request.result is Result.SUCCEEDED)
        assert sorted(m.status.device.device for m in s.request_members(*winner)) == [
            "gpu-vfio-4", "gpu-vfio-5", "gpu-vfio-6", "gpu-vfio-7"]
        assert _records_problems(s) == []


async def test_DR2_the_memory_store_writes_keeps_and_clears_status_device() -> None:
    from actors.ports import StatusWrite
    from datetime import datetime, timezone
    s = dra_store([dra_node("n1"), dra_node("n2")])
    key = s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 2))
    rid = s.request("t1", "vm", ["a"])
    assert s.device(key).status.device == ref("n1", 2)  # the webhook's write keeps it
    at = datetime(2026, 12, 4, tzinfo=timezone.utc)
    await s.answer(StatusWrite(key, rid, Result.SUCCEEDED, "re-pointed", node="n1", device=ref("n1", 5)))
    assert (s.device(key).bound_node, s.device(key).status.device) == ("n1", ref("n1", 5))
    s.withdraw("t1", rid)
    assert s.device(key).status.device == ref("n1", 5)
    rid = s.request("t1", "vm", ["a"])
    await s.answer(StatusWrite(key, rid, Result.SUCCEEDED, "moved", node="n2", bound_at=at,
                               clear_device=True))
    assert (s.device(key).bound_node, s.device(key).status.device) == ("n2", None)


async def test_DR4_held_devices_split_over_two_pairs_are_re_pointed_within_the_node() -> None:
    """a records GPU 1 (pair {1,2}), b GPU 3 (pair {0,3}); GPUs 0 and 2 are a foreign
    claim's: the set is re-pointed to a whole pair of the node by status writes (no move,
    no bind), Succeeded there, and the next request of the same set is B6."""
    s = dra_store([dra_node("n1", taken=(0, 2)), dra_node("n2")])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 1))
    s.add_device("t1", "b", CLASS, node="n1", device=ref("n1", 3))
    async with running_binder(s) as binder:
        rid = s.request("t1", "vm", ["a", "b"])
        await settle(s, binder)
        members = s.request_members("t1", rid)
        assert {m.status.bind_request.result for m in members} == {Result.SUCCEEDED}
        assert {m.bound_node for m in members} == {"n1"}
        assert {m.status.device.device for m in members} in (
            {"gpu-vfio-5", "gpu-vfio-7"}, {"gpu-vfio-4", "gpu-vfio-6"})
        assert not [r for r in s.history if r.op == "answer" and r.moved]
        s.withdraw("t1", rid)
        rid2 = s.request("t1", "vm", ["a", "b"])
        await settle(s, binder)
        assert "already placed" in s.request_members("t1", rid2)[0].status.bind_request.message
    assert _records_problems(s) == []


async def test_B5b_a_set_on_its_cordoned_node_whose_record_broke_is_re_pointed_there() -> None:
    """n1 is cordoned and its class onCordon Stay; a records GPU 3, b GPU 0 (pair {0,3}), and
    GPU 0 is now NoExecute-tainted: B5(b) keeps the set on n1 but re-points it to a whole pair
    of n1 (status writes, no move, though n2 has room; the node ledger takes a hold that lands
    nothing on a cordoned node, DR4), and the next request of the set is B5(b) as it is."""
    s = dra_store([tainted(dra_node("n1", unschedulable=True), 0), dra_node("n2")])
    s.put_class(device_class(on_cordon=OnCordon.STAY))
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 3))
    s.add_device("t1", "b", CLASS, node="n1", device=ref("n1", 0))
    async with running_binder(s) as binder:
        rid = s.request("t1", "vm", ["a", "b"])
        await settle(s, binder)
        members = s.request_members("t1", rid)
        assert {m.status.bind_request.result for m in members} == {Result.SUCCEEDED}
        assert {m.bound_node for m in members} == {"n1"}
        assert sorted(m.status.device.device for m in members) == ["gpu-vfio-1", "gpu-vfio-2"]
        assert "kept on cordoned node n1 (B5b" in members[0].status.bind_request.message
        assert not [r for r in s.history if r.op == "answer" and r.moved]
        s.withdraw("t1", rid)
        rid2 = s.request("t1", "vm", ["a", "b"])
        await settle(s, binder)
        again = s.request_members("t1", rid2)
        assert "kept on cordoned node n1 (B5b" in again[0].status.bind_request.message
        assert "devices" not in again[0].status.bind_request.message
        assert sorted(m.status.device.device for m in again) == ["gpu-vfio-1", "gpu-vfio-2"]
    assert _records_problems(s) == []


async def test_B5_the_ledger_takes_a_re_point_only_hold_on_a_cordoned_node_not_a_landing_one() -> None:
    s = dra_store([dra_node("n1", unschedulable=True)])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 3))
    s.add_device("t1", "c", CLASS)
    clock = ManualClock()
    async with anyio.create_task_group() as tg:
        node, cell = await spawn(tg, lambda: NodeActor("n1", s, clock, NodeActorConfig(prepare_ttl=5.0)),
                                 name="n1")
        repoint = Hold("r1", "t1", "n1", devices=((("t1", "a"), ref("n1", 1)),))
        assert isinstance(await node.ask(Prepare(repoint)), Prepared)
        no = await node.ask(Prepare(named("r2", ("c", 4))))
        assert no == PrepareRefused("n1", "r2", NodeUnfit((Cordoned(),)))
        cell.close()


# --- defragmentation in device mode (D1-D5 with DR2-DR4) ---------------------------------------

def _defrag_config(interval: float = 10.0, max_moves: int = 4):
    from dataclasses import replace as _replace

    from tests.support.binder import fast_config
    c = fast_config()
    return _replace(c, coordinator=_replace(c.coordinator, defrag_interval=interval,
                                            defrag_max_moves=max_moves))


async def test_D2_D4_DR4_a_round_re_points_an_idle_held_device_and_a_set_of_four_then_fits() -> None:
    """n1 alone; idle held a (GPU 0, partition of 4 {1-4}) and b (GPU 4, {5-8}): a 4-set is
    refused (no free partition of 4). A round re-points one of them within n1 (one `move`
    write with the same node and the new record, a GPUDeviceRepointed Event, boundAt kept),
    the node ledger releases its hold once the view shows the record, and the 4-set is then
    admitted on n1 forming a partition; no device on two records."""
    from tests.support.binder import results_of
    from tests.timing import advance, eventually
    s = dra_store([dra_node("n1")])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 0))
    s.add_device("t1", "b", CLASS, node="n1", device=ref("n1", 4))
    bound_at = {k: s.device(("t1", k)).status.bound_at for k in ("a", "b")}
    async with running_binder(s, _defrag_config()) as binder:
        for i in range(4):
            s.add_device("t1", f"p{i}", CLASS)
        rid = s.request("t1", "vm4", [f"p{i}" for i in range(4)])
        await settle(s, binder)
        assert {r[0] for r in results_of(s, "t1", rid).values()} == {Result.REFUSED}
        s.withdraw("t1", rid)
        await advance(10.5)
        await eventually(lambda: [r for r in s.history if r.op == "move"], what="a re-point written")
        (move,) = [r for r in s.history if r.op == "move"]
        assert (move.from_node, move.node, move.moved) == ("n1", "n1", False)
        key = move.key
        assert s.device(key).bound_node == "n1" and s.device(key).status.device != ref("n1", 0 if key[1] == "a" else 4)
        assert s.device(key).status.bound_at == bound_at[key[1]]
        assert [e[1] for e in s.events] == ["GPUDeviceRepointed"]
        assert "re-pointed t1/" in s.events[0][2] and "grows from 2 to 4" in s.events[0][2]
        await eventually(lambda: not binder.pipeline.statistics().reservations,
                         what="the re-point's hold released once the view shows it")
        rid = s.request("t1", "vm4", [f"p{i}" for i in range(4)])
        await settle(s, binder)
        res = results_of(s, "t1", rid)
        assert {(r[0], r[1]) for r in res.values()} == {(Result.SUCCEEDED, "n1")}
        members = s.request_members("t1", rid)
        attr = resolve_attribute(MatchAttribute.of(device_class().match_attribute), 4)
        slice_ = {d.ref.device: d.as_device() for d in dra_node("n1").devices_of(CLASS)}
        assert len({slice_[m.status.device.device].attribute(attr) for m in members}) == 1
    assert _records_problems(s) == []


async def test_D1_D2_a_round_clears_a_node_in_device_mode_moving_records_and_never_a_running_set() -> None:
    """n1: idle held a0-a3 on GPUs 0-3; n2: a running VM's set on GPUs 4-7 (attached): the
    largest set is 4 on both. A round moves a0-a3 onto n2's free GPUs (each a `move` write
    recording its new GPU, GPUDeviceMoved), never the running set, and an 8-set then fits on
    n1. The node actors refuse nothing; no device on two records."""
    from tests.support.binder import results_of
    from tests.timing import advance, eventually
    s = dra_store([dra_node("n1"), dra_node("n2")])
    for i in range(4):
        s.add_device("t1", f"a{i}", CLASS, node="n1", device=ref("n1", i))
        s.add_device("t2", f"r{i}", CLASS, node="n2", device=ref("n2", 4 + i))
    async with running_binder(s, _defrag_config()) as binder:
        s.request("t2", "vm-running", [f"r{i}" for i in range(4)])
        await settle(s, binder)
        running = {k: (d.bound_node, d.status.device) for k, d in s.devices().items()
                   if d.status.attached_to is not None}
        assert len(running) == 4
        await advance(10.5)
        await eventually(lambda: len([r for r in s.history if r.op == "move"]) == 4,
                         what="four moves written")
        assert {(r.key[1], r.from_node, r.node) for r in s.history if r.op == "move"} == \
            {(f"a{i}", "n1", "n2") for i in range(4)}
        assert {s.device(("t1", f"a{i}")).status.device.device for i in range(4)} == \
            {f"gpu-vfio-{i}" for i in range(4)}
        assert all(s.device(("t1", f"a{i}")).status.device.pool == "n2" for i in range(4))
        assert {k: (d.bound_node, d.status.device) for k, d in s.devices().items()
                if d.status.attached_to is not None} == running
        assert [e[1] for e in s.events] == ["GPUDeviceMoved"] * 4
        await eventually(lambda: not binder.pipeline.statistics().reservations,
                         what="the moves' holds released")
        for i in range(8):
            s.add_device("t1", f"p{i}", CLASS)
        rid = s.request("t1", "vm8", [f"p{i}" for i in range(8)])
        await settle(s, binder)
        assert {(r[0], r[1]) for r in results_of(s, "t1", rid).values()} == {(Result.SUCCEEDED, "n1")}
    assert _records_problems(s) == []


async def test_DR2_the_ledger_refuses_a_members_own_record_that_another_claim_allocates() -> None:
    """The member's own record is free for it when the binder's claim allocates it, not when
    an administrator's does (`Node.foreign_claimed`): a re-point-only hold keeping it there is
    refused with DevicesTaken; one to another GPU is taken."""
    from dataclasses import replace as _replace
    node = _replace(dra_node("n1", taken=(2, 3)), foreign_claimed=frozenset({"gpu-vfio-3"}))
    s = dra_store([node])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 2))  # its own claim's: free for a
    s.add_device("t1", "b", CLASS, node="n1", device=ref("n1", 3))  # an administrator's
    async with anyio.create_task_group() as tg:
        actor, cell = await spawn(tg, lambda: NodeActor("n1", s, ManualClock()), name="n1")
        keep_a = Hold("r1", "t1", "n1", devices=((("t1", "a"), ref("n1", 2)),))
        assert isinstance(await actor.ask(Prepare(keep_a)), Prepared)
        keep_b = Hold("r2", "t1", "n1", devices=((("t1", "b"), ref("n1", 3)),))
        assert await actor.ask(Prepare(keep_b)) == PrepareRefused(
            "n1", "r2", DevicesTaken(("gpu-vfio-3",)))
        moved_b = Hold("r2", "t1", "n1", devices=((("t1", "b"), ref("n1", 5)),))
        assert isinstance(await actor.ask(Prepare(moved_b)), Prepared)
        cell.close()
