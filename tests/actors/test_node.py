"""NodeActor: the ledger of one node and the two-phase protocol (docs/contract.md §6)."""

from __future__ import annotations

import io

import anyio
import orjson
import pytest

from actors.logging import configure_logging
from actors.errors import ActorKilled
from fakes.memory_store import MemoryStore
from actors.node_actor import (
    Abort,
    Adopt,
    Claim,
    Commit,
    Committed,
    CommitRefused,
    DevicesChanged,
    GetLedger,
    NodeActor,
    NodeActorConfig,
    NodeChanged,
    Prepare,
    Prepared,
    PrepareRefused,
    Release,
)
from actors.ports import StatusWrite
from fakes.clock import ManualClock
from actors.runtime import ActorCell, spawn
from model.hold import Hold
from model.reasons import Cordoned, LedgerRebuilt, NodeGone, NodeUnfit, NoRoom, NoReservation, Short
from model.types import Result
from tests.support.binder import quiet_logging
from tests.timing import eventually

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def held(request_id: str, needs, landing=()) -> Hold:
    """A hold of `request_id` (tenant t) on n1."""
    return Hold(request_id, "t", "n1", needs, (), landing)


def store_with_node(alloc: int = 4, bound: int = 1) -> MemoryStore:
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: alloc})
    for i in range(bound):
        s.add_device("t", f"b{i}", "h100", node="n1")
    for i in range(4):
        s.add_device("t", f"p{i}", "h100")
    return s


def node_actor(store: MemoryStore, clock=None, **cfg) -> NodeActor:
    return NodeActor("n1", store, clock or ManualClock(), NodeActorConfig(**cfg))


async def test_prepare_reserves_and_refuses_what_does_not_fit() -> None:
    s = store_with_node(alloc=4, bound=1)
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s), name="n1")
        ok = await ref.ask(Prepare(held("r1", ((H100, 2),))))
        assert isinstance(ok, Prepared)
        no = await ref.ask(Prepare(held("r2", ((H100, 2),))))
        assert no == PrepareRefused("n1", "r2", Short((NoRoom(H100, needs=2, free=1),)))
        ledger = await ref.ask(GetLedger())
        assert ledger.bound[H100] == 1 and ledger.prepared[H100] == 2 and ledger.free[H100] == 1
        assert ref.statistics().reservations == 1
        cell.close()


async def test_commit_abort_and_release() -> None:
    s = store_with_node(alloc=2, bound=0)
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s), name="n1")
        p = await ref.ask(Prepare(held("r1", ((H100, 2),))))
        assert isinstance(await ref.ask(Commit("r1", p.incarnation)), Committed)
        assert isinstance(await ref.ask(Commit("r1", p.incarnation)), Committed)  # idempotent
        assert isinstance(await ref.ask(Prepare(held("r2", ((H100, 1),)))), PrepareRefused)
        assert await ref.ask(Release("r1")) is True
        p2 = await ref.ask(Prepare(held("r2", ((H100, 1),))))
        assert isinstance(p2, Prepared)
        assert await ref.ask(Abort("r2")) is True
        assert await ref.ask(Abort("r2")) is False
        refused = await ref.ask(Commit("r2", p2.incarnation))
        assert refused == CommitRefused("n1", "r2", NoReservation())
        cell.close()


async def test_prepared_hold_expires_after_ttl() -> None:
    s = store_with_node(alloc=1, bound=0)
    clock = ManualClock()
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s, clock, prepare_ttl=5.0), name="n1")
        p = await ref.ask(Prepare(held("r1", ((H100, 1),))))
        assert isinstance(await ref.ask(Prepare(held("r2", ((H100, 1),)))), PrepareRefused)
        clock.advance(5.0)
        assert isinstance(await ref.ask(Prepare(held("r2", ((H100, 1),)))), Prepared)
        assert isinstance(await ref.ask(Commit("r1", p.incarnation)), CommitRefused)
        cell.close()


async def test_commit_against_a_rebuilt_ledger_is_refused() -> None:
    """A restart gives a fresh incarnation and a ledger without holds."""
    s = store_with_node(alloc=2, bound=0)
    cell = ActorCell("n1")

    async def run_tolerating_kill(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await cell.run(lambda: node_actor(s), task_status=task_status)
        except ActorKilled:
            pass

    async with anyio.create_task_group() as tg:
        await tg.start(run_tolerating_kill)
        p = await cell.ref.ask(Prepare(held("r1", ((H100, 2),))))
        assert cell.kill("test")
        await eventually(lambda: not cell.running, what="the incarnation killed")
        await tg.start(cell.run, lambda: node_actor(s))
        reply = await cell.ref.ask(Commit("r1", p.incarnation))
        assert isinstance(reply, CommitRefused)
        assert reply.reason == LedgerRebuilt(incarnation=reply.reason.incarnation,
                                             prepared_in=p.incarnation)
        assert reply.reason.incarnation != p.incarnation
        ledger = await cell.ref.ask(GetLedger())
        assert ledger.incarnation != p.incarnation and ledger.holds == ()
        cell.close()
        tg.cancel_scope.cancel()


async def test_hold_counts_only_members_not_landed_yet() -> None:
    """A committed hold stops counting a member once the view shows it Bound here, so a
    device is never counted twice (bound and reserved) while writes progress."""
    s = store_with_node(alloc=2, bound=0)
    rid = s.request("t", "vm", ["p0", "p1"])
    devices = ((("t", "p0"), H100), (("t", "p1"), H100))
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s), name="n1")
        p = await ref.ask(Prepare(held(rid, ((H100, 2),), devices)))
        await ref.ask(Commit(rid, p.incarnation))
        await s.answer(StatusWrite(("t", "p0"), rid, Result.SUCCEEDED, "m", node="n1", bound_at=s.clock.now()))
        ledger = await ref.ask(GetLedger())
        assert ledger.bound[H100] == 1 and ledger.committed[H100] == 1 and ledger.free[H100] == 0
        await s.answer(StatusWrite(("t", "p1"), rid, Result.SUCCEEDED, "m", node="n1", bound_at=s.clock.now()))
        await ref.ask(DevicesChanged())
        ledger = await ref.ask(GetLedger())
        assert ledger.free[H100] == 0 and ledger.committed.get(H100, 0) == 0
        cell.close()


async def test_cordoned_or_deleted_node_refuses_prepare_but_allows_nothing_to_land() -> None:
    s = store_with_node(alloc=4, bound=0)
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s), name="n1")
        s.cordon("n1")
        led = await ref.ask(NodeChanged())
        assert led.unschedulable
        no = await ref.ask(Prepare(held("r1", ((H100, 1),))))
        assert no == PrepareRefused("n1", "r1", NodeUnfit((Cordoned(),)))
        assert isinstance(await ref.ask(Prepare(held("r0", ()))), Prepared)  # B5/B6: nothing lands
        s.delete_node("n1")
        no = await ref.ask(Prepare(held("r2", ((H100, 1),))))
        assert no == PrepareRefused("n1", "r2", NodeUnfit((NodeGone(),)))
        cell.close()


async def test_lowered_allocatable_shrinks_free_capacity() -> None:
    s = store_with_node(alloc=4, bound=2)
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s), name="n1")
        s.set_allocatable("n1", H100, 1)
        led = await ref.ask(NodeChanged())
        assert led.free[H100] == -1  # lost capacity
        assert isinstance(await ref.ask(Prepare(held("r1", ((H100, 1),)))), PrepareRefused)
        cell.close()


async def test_adopt_drops_holds_of_other_coordinators_and_claim_skips_the_check() -> None:
    s = store_with_node(alloc=1, bound=0)
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s), name="n1")
        await ref.ask(Prepare(held("old", ((H100, 1),)), owner="c1"))
        assert await ref.ask(Adopt("c2")) == ["old"]
        assert isinstance(await ref.ask(Claim(held("r1", ((H100, 1),)), owner="c2")), Committed)
        assert isinstance(await ref.ask(Claim(held("r2", ((H100, 1),)), owner="c2")), Committed)
        ledger = await ref.ask(GetLedger())
        assert ledger.free[H100] == -1  # claims are decisions already made (B7)
        cell.close()


async def test_every_decision_is_one_json_line_bound_to_the_node(tmp_path) -> None:
    buf = io.BytesIO()
    configure_logging(stream=buf, log_dir=tmp_path)
    s = store_with_node(alloc=1, bound=0)
    clock = ManualClock()
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: node_actor(s, clock, prepare_ttl=1.0), name="n1")
        p = await ref.ask(Prepare(held("r1", ((H100, 1),))))
        await ref.ask(Prepare(held("r2", ((H100, 1),))))
        await ref.ask(Commit("r1", p.incarnation))
        await ref.ask(Abort("r1"))
        await ref.ask(Prepare(held("r3", ((H100, 1),))))
        clock.advance(2)
        await ref.ask(GetLedger())
        cell.close()
    lines = [orjson.loads(line) for line in buf.getvalue().splitlines()]
    events = [(x["event"], x.get("outcome")) for x in lines]
    assert events == [("rebuild", None), ("prepare", "reserved"), ("prepare", "refused"),
                      ("commit", "committed"), ("abort", None), ("prepare", "reserved"),
                      ("expire", None)]
    assert all(x["node"] == "n1" and x["actor"] == "node" for x in lines)
    in_file = [orjson.loads(x) for x in (tmp_path / "n1.jsonl").read_bytes().splitlines()]
    assert in_file == lines
