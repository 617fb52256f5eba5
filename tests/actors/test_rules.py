"""The binding contract B1–B8 (docs/contract.md §3) through the whole actor system on the
in-memory store: supervisor, node actors, coordinator. A written message is compared with
the rendering of the typed outcome expected (`model.reasons`), never matched in part."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest
import structlog

from actors.coordinator_protocol import GetStatus
from actors.errors import RequestWithdrawn, TransientWriteError, WriteConflict
from fakes.clock import LoopClock
from fakes.memory_store import Faults, MemoryStore
from actors.node_actor import GetLedger
from actors.ports import StatusWrite
from model.hold import Hold
from model.reasons import (BudgetExhausted, Code, DeviceAt, KeptCordoned, LedgersRefused, NodeProblems,
                           NodeRefusal, NoEligibleNode, NoRoom, Placed, RequestRef, SetRefused, Short)
from model.types import OnCordon, Result
from supervisor import COORDINATOR, PIPELINE, Binder, node_child_id
from tests.support.binder import (
    check_invariants,
    fast_config,
    kill_child,
    quiet_logging,
    results_of,
    running_binder,
    settle,
)
from tests.timing import advance, eventually

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"
L40S = "nvidia.com/L40S"
RESYNC = fast_config().coordinator.resync_interval


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def cluster(**nodes: int) -> MemoryStore:
    """A store with tenant `t`, classes h100 (Move) and l40s (Stay), and nodes name=H100 units."""
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_class("l40s", L40S, on_cordon=OnCordon.STAY)
    for name, units in nodes.items():
        s.add_node(name, {H100: units, L40S: units})
    return s


def ops(store: MemoryStore, request_id: str) -> list[tuple[str, str]]:
    """The binder's writes of `request_id`: ("place", device) for a write that also moved
    the device, ("answer", device) for one that did not."""
    return [("place" if r.moved else "answer", r.key[1]) for r in store.history
            if r.request_id == request_id and r.op == "answer"]


async def answer(store: MemoryStore, binder: Binder, namespace: str, request_id: str) -> dict:
    await settle(store, binder)
    return results_of(store, namespace, request_id)


# -- B1 -------------------------------------------------------------------------------------


async def test_B1_gathers_the_whole_set_on_one_node_moving_held_devices() -> None:
    s = cluster(n1=1, n2=4)
    s.add_device("t", "held", "h100", node="n1")
    s.add_device("t", "new-a", "h100")
    s.add_device("t", "new-b", "h100")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["held", "new-a", "new-b"])
        res = await answer(s, binder, "t", rid)
    assert res == {name: (Result.SUCCEEDED, "n2", "Bound", "n2") for name in ("held", "new-a", "new-b")}
    msg = s.device(("t", "held")).status.bind_request.message
    assert msg == Placed(RequestRef("t", "vm", rid), "n2", ("new-a", "new-b"), (("held", "n1"),)).render()
    assert check_invariants(s) == []


async def test_B1_B7_one_write_per_member_carries_node_placement_and_result() -> None:
    """docs/contract.md §3 Writes: the decided node, the placement and the result of a member in
    one write; one write per member in all."""
    s = cluster(n1=4)
    for name in ("a", "b"):
        s.add_device("t", name, "h100")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a", "b"])
        await answer(s, binder, "t", rid)
    assert ops(s, rid) == [("place", "a"), ("place", "b")]
    recs = [r for r in s.history if r.request_id == rid and r.op == "answer"]
    assert {(r.node, r.result, r.from_node) for r in recs} == {("n1", Result.SUCCEEDED, None)}


async def test_B1_refuses_with_a_message_and_changes_no_placement() -> None:
    s = cluster(n1=1, n2=1)
    s.add_device("t", "held", "h100", node="n1")
    s.add_device("t", "new", "h100")
    s.add_device("t", "other", "h100", node="n2")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["held", "new"])
        res = await answer(s, binder, "t", rid)
    assert {v[0] for v in res.values()} == {Result.REFUSED}
    assert res["held"][3] == "n1" and res["new"][2] == "Pending"
    msg = s.device(("t", "new")).status.bind_request.message
    assert msg == SetRefused((DeviceAt("held", "n1"), DeviceAt("new")), (NoEligibleNode((
        NodeProblems("n1", (NoRoom(H100, needs=1, free=0),)),
        NodeProblems("n2", (NoRoom(H100, needs=2, free=0),)))),), RequestRef("t", "vm", rid)).render()
    assert ops(s, rid) == [("answer", "held"), ("answer", "new")]


async def test_B1_partial_request_is_never_acted_on() -> None:
    s = cluster(n1=4)
    for name in ("a", "b"):
        s.add_device("t", name, "h100")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a", "b"], only=["a"])  # b lacks the id
        await advance(2 * RESYNC)  # the router has seen it and the coordinator rescanned twice
        assert ops(s, rid) == []
        s.request("t", "vm", ["a", "b"], request_id=rid, only=["b"])  # now complete
        res = await answer(s, binder, "t", rid)
    assert {v[0] for v in res.values()} == {Result.SUCCEEDED}


# -- B2 -------------------------------------------------------------------------------------


async def test_B2_racing_requests_for_the_last_unit_cannot_both_win() -> None:
    s = cluster(n1=1)
    s.faults = Faults(latency=0.002)  # writes in flight while the second is decided
    s.add_device("t", "a", "h100")
    s.add_device("t", "b", "h100")
    async with running_binder(s) as binder:
        r1 = s.request("t", "vm1", ["a"])
        r2 = s.request("t", "vm2", ["b"])
        await settle(s, binder)
    results = [results_of(s, "t", r)[d][0] for r, d in ((r1, "a"), (r2, "b"))]
    assert sorted(results) == [Result.REFUSED, Result.SUCCEEDED]


async def test_B2_node_ledgers_are_checked_again_and_refusals_fall_through() -> None:
    """When a node actor refuses the model's first choice, the next placement is tried."""
    s = cluster(n1=1, n2=2)
    s.add_device("t", "a", "h100")
    async with running_binder(s) as binder:
        # Make n1 (the tightest fit, B4's first choice) look full to its own ledger only.
        from actors.node_actor import Claim
        await binder.node_actor("n1").ask(Claim(Hold("phantom", "t", "n1", ((H100, 1),))))
        rid = s.request("t", "vm", ["a"])
        res = await answer(s, binder, "t", rid)
    assert res["a"][:2] == (Result.SUCCEEDED, "n2")


# -- B3 -------------------------------------------------------------------------------------


async def test_B3_cordoned_node_and_node_selector_are_not_eligible() -> None:
    s = cluster(n1=4, n2=4, n3=8)
    s.cordon("n3")
    s.add_node("n2", {H100: 4}, labels={"zone": "b"})
    s.add_device("t", "a", "h100")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a"], node_selector={"zone": "b"})
        res = await answer(s, binder, "t", rid)
    assert res["a"][:2] == (Result.SUCCEEDED, "n2")


async def test_B3_counts_reservations_in_flight() -> None:
    """A request whose writes are still in flight holds its capacity: a second request is
    decided while the first is being written and must not take the same units."""
    s = cluster(n1=2)
    s.faults = Faults(latency=0.01)
    for name in ("a", "b", "c"):
        s.add_device("t", name, "h100")
    async with running_binder(s) as binder:
        r1 = s.request("t", "vm1", ["a", "b"])
        await eventually(lambda: any(r.op == "answer" for r in s.history), what="r1 decided")
        r2 = s.request("t", "vm2", ["c"])
        await settle(s, binder)
    assert results_of(s, "t", r1)["a"][0] is Result.SUCCEEDED
    assert results_of(s, "t", r2)["c"][0] is Result.REFUSED
    assert s.used("n1", H100) == 2


async def test_B3_budget_is_checked_in_the_loop() -> None:
    s = cluster(n1=8)
    s.add_budget("t", H100, 2)
    s.add_device("t", "bound", "h100", node="n1")
    s.add_device("t", "a", "h100")
    s.add_device("t", "b", "h100")
    async with running_binder(s) as binder:
        r1 = s.request("t", "vm1", ["a", "b"])
        res = await answer(s, binder, "t", r1)
    assert res["a"][0] is Result.REFUSED
    br = s.device(("t", "a")).status.bind_request
    assert br.message == SetRefused(
        (DeviceAt("a"), DeviceAt("b")), (BudgetExhausted("t", H100, bound=1, budget=2, adds=2),),
        RequestRef("t", "vm1", r1)).render()
    assert br.code is Code.BUDGET_EXHAUSTED  # typed beside the message: the webhook's 403


async def test_B1_a_refusal_by_the_node_ledgers_is_written_with_its_code() -> None:
    """The model sees a free unit on n1, but n1's ledger holds it (a hold of another
    coordinator incarnation the view does not show): every round's prepare is refused, and
    after `max_rounds` the refusal is written with `ledgers_refused` beside its message (the
    webhook answers it 503: a retry decides again)."""
    from actors.node_actor import Claim

    s = cluster(n1=1)
    s.add_device("t", "a", "h100")
    async with running_binder(s) as binder:
        await binder.node_actor("n1").ask(Claim(Hold("elsewhere", "t", "n1", ((H100, 1),)), "another-owner"))
        rid = s.request("t", "vm", ["a"])
        res = await answer(s, binder, "t", rid)
    br = s.device(("t", "a")).status.bind_request
    assert res["a"][0] is Result.REFUSED and br.code is Code.LEDGERS_REFUSED
    assert br.message == SetRefused((DeviceAt("a"),), (LedgersRefused((
        NodeRefusal("n1", Short((NoRoom(H100, needs=1, free=0),))),)),), RequestRef("t", "vm", rid)).render()


# -- B4 -------------------------------------------------------------------------------------


async def test_B4_fewest_moves_then_tightest_fit_then_name() -> None:
    s = cluster(n1=3, n2=2, n3=2, n4=8)
    s.add_device("t", "h1", "h100", node="n1")
    s.add_device("t", "h2", "h100", node="n1")
    s.add_device("t", "p1", "h100")
    s.add_device("t", "q1", "h100")
    async with running_binder(s) as binder:
        r1 = s.request("t", "vm1", ["h1", "h2", "p1"])  # n1 holds two: fewest moves
        assert (await answer(s, binder, "t", r1))["p1"][:2] == (Result.SUCCEEDED, "n1")
        r2 = s.request("t", "vm2", ["q1"])  # n2 and n3 are tightest; n2 by name
        assert (await answer(s, binder, "t", r2))["q1"][:2] == (Result.SUCCEEDED, "n2")


async def test_B1_a_reservation_a_ledger_refused_does_not_refuse_the_rest_of_its_batch() -> None:
    """n1 has 2 units; its ledger holds 1 the model does not see (a hold of another
    coordinator incarnation). A (2 devices) and B (1) are decided in one batch: A first,
    on n1, tentatively reserving both units, so B's decision in that batch says n1 is full.
    n1 refuses A's prepare; B must then be decided again (1 unit is free), not refused."""
    from actors.node_actor import Claim

    s = cluster(n1=2)
    for name in ("a1", "a2", "b1"):
        s.add_device("t", name, "h100")
    async with running_binder(s) as binder:
        await binder.node_actor("n1").ask(Claim(Hold("elsewhere", "t", "n1", ((H100, 1),)), "another-owner"))
        ra = s.request("t", "vmA", ["a1", "a2"])
        rb = s.request("t", "vmB", ["b1"])  # same routing pass: the same batch
        await settle(s, binder)
    assert results_of(s, "t", rb)["b1"] == (Result.SUCCEEDED, "n1", "Bound", "n1")
    assert {r[0] for r in results_of(s, "t", ra).values()} == {Result.REFUSED}
    message = s.device(("t", "a1")).status.bind_request.message
    assert message == SetRefused((DeviceAt("a1"), DeviceAt("a2")), (NoEligibleNode((
        NodeProblems("n1", (NoRoom(H100, needs=2, free=1),)),)),), RequestRef("t", "vmA", ra)).render()


async def test_a_fallback_waiting_on_a_slow_node_actor_does_not_hold_back_its_batch(monkeypatch) -> None:
    """A and B in one batch: B commits at once on n3; A's ledger refuses it on n1 and its
    fallback waits on n2's node actor (blocked here). B's answer must not wait for A."""
    from actors import node_actor
    from actors.node_actor import Claim, Prepare

    gate = anyio.Event()
    receive = node_actor.NodeActor.receive

    async def gated(self, message):
        if self.node == "n2" and isinstance(message, Prepare):
            await gate.wait()
        return await receive(self, message)

    monkeypatch.setattr(node_actor.NodeActor, "receive", gated)
    s = cluster(n1=1, n2=1, n3=2)
    for name in ("a", "b", "b2"):
        s.add_device("t", name, "h100")
    config = fast_config()  # A's ask to n2 must not time out while B's answer is awaited
    config = replace(config, coordinator=replace(config.coordinator, ask_timeout=60.0))
    async with running_binder(s, config) as binder:
        await binder.node_actor("n1").ask(Claim(Hold("elsewhere", "t", "n1", ((H100, 1),)), "another-owner"))
        rb = s.request("t", "vmB", ["b", "b2"])  # only n3 has room for two
        ra = s.request("t", "vmA", ["a"])  # n1 (tightest, by name) is full in its ledger
        await eventually(lambda: results_of(s, "t", rb)["b"][0] is not None, timeout=3.0,
                         what="B answered while A's fallback waits")
        assert results_of(s, "t", ra)["a"][0] is None  # A's fallback still waits on n2
        gate.set()
        await settle(s, binder)
    assert results_of(s, "t", rb)["b"] == (Result.SUCCEEDED, "n3", "Bound", "n3")
    assert results_of(s, "t", ra)["a"] == (Result.SUCCEEDED, "n2", "Bound", "n2")


# -- B5 -------------------------------------------------------------------------------------


async def test_B5a_move_class_on_cordoned_node_stays_when_no_other_node_has_room() -> None:
    s = cluster(n1=2, n2=1)
    s.add_device("t", "a", "h100", node="n1")
    s.add_device("t", "b", "h100", node="n1")
    s.cordon("n1")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a", "b"])
        res = await answer(s, binder, "t", rid)
    assert {v[:2] for v in res.values()} == {(Result.SUCCEEDED, "n1")}
    assert ops(s, rid) == [("answer", "a"), ("answer", "b")]
    assert s.device(("t", "a")).status.bind_request.message == KeptCordoned(
        RequestRef("t", "vm", rid), "n1", "B5a").render()


async def test_B5a_move_class_is_moved_when_another_node_has_room() -> None:
    s = cluster(n1=2, n2=2)
    s.add_device("t", "a", "h100", node="n1")
    s.add_device("t", "b", "h100", node="n1")
    s.cordon("n1")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a", "b"])
        res = await answer(s, binder, "t", rid)
    assert {v for v in res.values()} == {(Result.SUCCEEDED, "n2", "Bound", "n2")}


async def test_B5b_stay_class_keeps_its_node_even_with_room_elsewhere() -> None:
    s = cluster(n1=1, n2=4)
    s.add_device("t", "a", "l40s", node="n1")
    s.cordon("n1")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a"])
        res = await answer(s, binder, "t", rid)
    assert res["a"] == (Result.SUCCEEDED, "n1", "Bound", "n1")
    assert s.device(("t", "a")).status.bind_request.message == KeptCordoned(
        RequestRef("t", "vm", rid), "n1", "B5b", ("l40s",)).render()


async def test_B5b_not_when_the_node_is_gone() -> None:
    s = cluster(n1=1, n2=4)
    s.add_device("t", "a", "l40s", node="n1")
    s.cordon("n1")
    s.delete_node("n1")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a"])
        res = await answer(s, binder, "t", rid)
    assert res["a"] == (Result.SUCCEEDED, "n2", "Bound", "n2")


# -- B6 -------------------------------------------------------------------------------------


async def test_B6_already_placed_succeeds_without_a_placement_write() -> None:
    s = cluster(n1=2)
    s.add_device("t", "a", "h100", node="n1")
    s.add_device("t", "b", "h100", node="n1")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a", "b"])
        res = await answer(s, binder, "t", rid)
    assert {v for v in res.values()} == {(Result.SUCCEEDED, "n1", "Bound", "n1")}
    assert ops(s, rid) == [("answer", "a"), ("answer", "b")]


# -- B7 -------------------------------------------------------------------------------------


async def test_B7_coordinator_killed_between_placement_writes_finishes_on_the_same_node() -> None:
    """Killed after the first bind; meanwhile the node loses capacity. The restarted
    coordinator finishes the request on the recorded node anyway (the decision was made)."""
    s = cluster(n1=3, n2=3)
    for name in ("a", "b", "c"):
        s.add_device("t", name, "h100")
    holder: dict = {}

    def on_write(rec) -> None:
        if rec.moved and not holder.get("killed"):
            holder["killed"] = kill_child(holder["binder"], COORDINATOR, "test: between binds")
            s.set_allocatable(rec.node, H100, 1)  # capacity now short for the rest

    s.on_write = on_write
    s.faults = Faults(latency=0.005)  # the members' writes apart: the kill lands between them
    config = fast_config()
    config = replace(config, supervisor=replace(config.supervisor, backoff_initial=0.02))
    async with running_binder(s, config) as binder:
        holder["binder"] = binder
        rid = s.request("t", "vm", ["a", "b", "c"])
        res = await answer(s, binder, "t", rid)
        assert binder.coordinator.statistics().restarts == 1
        assert binder.pipeline.statistics().restarts == 1  # its group: the writer too
    assert holder["killed"]
    node = res["a"][1]
    assert res == {n: (Result.SUCCEEDED, node, "Bound", node) for n in ("a", "b", "c")}
    assert [op for op, _ in ops(s, rid)].count("place") == 3


async def test_B7_the_writer_killed_between_placement_writes_restarts_both_and_leaves_no_hold() -> None:
    """The status pipeline (the writer, owner of the flights) is killed after the first
    bind of a 3-device request. Its group restarts: the coordinator too (a new owner, so
    the ledger drops the old incarnation's committed hold), which recovers the request on
    the recorded node (B7). No hold is left behind: the free unit goes to the next request,
    and nothing is over-placed."""
    s = cluster(n1=4)
    for name in ("a", "b", "c", "d", "e"):
        s.add_device("t", name, "h100")
    holder: dict = {}

    def on_write(rec) -> None:
        if rec.moved and not holder.get("killed"):
            holder["killed"] = kill_child(holder["binder"], PIPELINE, "test: between binds")

    s.on_write = on_write
    s.faults = Faults(latency=0.005)  # the members' writes apart: the kill lands between them
    async with running_binder(s) as binder:
        holder["binder"] = binder
        owner = (await binder.coordinator.ask(GetStatus())).owner
        rid = s.request("t", "vm", ["a", "b", "c"])
        res = await answer(s, binder, "t", rid)
        assert holder["killed"]
        assert binder.pipeline.statistics().restarts == 1
        assert binder.coordinator.statistics().restarts == 1  # one incarnation: both restarted
        status = await binder.coordinator.ask(GetStatus())
        assert status.owner != owner and status.recovered == 1
        s.on_write = None
        r2 = s.request("t", "vm2", ["d"])  # the 4th unit is free: no hold kept it
        r3 = s.request("t", "vm3", ["e"])  # and there is no 5th
        await settle(s, binder)
        ledger = await binder.node_actor("n1").ask(GetLedger())
    assert res == {n: (Result.SUCCEEDED, "n1", "Bound", "n1") for n in ("a", "b", "c")}
    assert results_of(s, "t", r2)["d"][:2] == (Result.SUCCEEDED, "n1")
    assert results_of(s, "t", r3)["e"][0] is Result.REFUSED
    assert ledger.holds == () and ledger.free[H100] == 0
    assert check_invariants(s) == []


async def test_B7_a_new_binder_finishes_a_recorded_request() -> None:
    """The whole binder restarts (leader failover): bindRequest.node is the durable record."""
    s = cluster(n1=2, n2=2)
    for name in ("a", "b"):
        s.add_device("t", name, "h100")
    rid = s.request("t", "vm", ["a", "b"])
    s.add_device("t", "other", "h100", node="n1")  # a fresh decision would pick n1 (tightest)
    await s.answer(StatusWrite(("t", "a"), rid, Result.SUCCEEDED, "placed on n2", node="n2",
                               bound_at=s.clock.now()))  # a previous leader got this far
    async with running_binder(s) as binder:
        res = await answer(s, binder, "t", rid)
        status = await binder.coordinator.ask(GetStatus())
    assert res == {n: (Result.SUCCEEDED, "n2", "Bound", "n2") for n in ("a", "b")}
    assert status.recovered == 1


async def test_B7_withdrawn_request_stops_writing_and_releases_its_capacity() -> None:
    s = cluster(n1=2)
    for name in ("a", "b", "c", "d"):
        s.add_device("t", name, "h100")
    withdrawn: dict = {}

    def on_write(rec) -> None:
        if rec.moved and not withdrawn:
            withdrawn["n"] = s.withdraw("t", rec.request_id)  # the webhook gave up

    s.on_write = on_write
    async with running_binder(s) as binder:
        rid = s.request("t", "vm1", ["a", "b"])
        await settle(s, binder)
        assert [op for op, _ in ops(s, rid)] == ["place"]  # the done write stays, no other
        s.on_write = None
        r2 = s.request("t", "vm2", ["c"])  # the other unit is free again
        res = await answer(s, binder, "t", r2)
        ledger = await binder.node_actor("n1").ask(GetLedger())
    assert res["c"][:2] == (Result.SUCCEEDED, "n1")
    assert ledger.holds == ()


# -- B8 -------------------------------------------------------------------------------------


class RecordingWriter:
    """A StatusWriter wrapper noting which actor made each call (structlog contextvars)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.callers: list[tuple[str, str | None]] = []

    def _note(self, op: str) -> None:
        self.callers.append((op, structlog.contextvars.get_contextvars().get("actor")))

    async def answer(self, write):
        self._note(write.op)
        await self.store.answer(write)

    async def write_many(self, writes):
        for w in writes:
            self._note(w.op)
        return await self.store.write_many(writes)


async def test_B8_the_status_pipeline_is_the_only_status_writer() -> None:
    s = cluster(n1=2, n2=2)
    for name in ("a", "b", "c", "d", "e"):
        s.add_device("t", name, "h100")
    writer = RecordingWriter(s)
    binder = Binder(s, s, writer, LoopClock(), fast_config())
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        s.request("t", "vm1", ["a", "b"])
        s.request("t", "vm2", ["c", "d", "e"])
        await settle(s, binder)
        tg.cancel_scope.cancel()
    assert writer.callers and {actor for _, actor in writer.callers} == {"status_pipeline"}
    assert {r.op for r in s.history} <= {"request", "answer"}


# -- writes: retries ------------------------------------------------------------------------


async def test_transient_errors_and_conflicts_are_retried() -> None:
    s = cluster(n1=2)
    s.add_device("t", "a", "h100")
    s.fail_next(TransientWriteError, op="answer", times=2)
    s.fail_next(WriteConflict, op="answer", times=1)
    s.fail_next(TransientWriteError, op="answer", applied=True)  # ambiguous
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a"])
        res = await answer(s, binder, "t", rid)
    assert res["a"] == (Result.SUCCEEDED, "n1", "Bound", "n1")
    assert ops(s, rid) == [("place", "a")]  # the ambiguous write applied; the retry is a no-op


async def test_request_withdrawn_is_never_retried() -> None:
    s = cluster(n1=2)
    s.add_device("t", "a", "h100")
    s.fail_next(RequestWithdrawn, op="answer")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a"])
        await eventually(lambda: s.writes_attempted >= 1, what="the write tried")
        # far past the whole retry budget (5 tries, 5 ms apart at most), and before the
        # periodic rescan (which re-reads the request: the store still shows it)
        await advance(RESYNC / 2)
        assert s.writes_attempted == 1  # one write, no retry
        del binder
    assert ops(s, rid) == []


async def test_exhausted_retries_keep_the_reservation_and_try_again_later() -> None:
    s = cluster(n1=1)
    s.add_device("t", "a", "h100")
    s.add_device("t", "b", "h100")
    s.fail_next(TransientWriteError, op="answer", times=6)  # more than one round of retries
    async with running_binder(s) as binder:
        r1 = s.request("t", "vm1", ["a"])
        await eventually(lambda: (binder.pipeline.statistics().reservations == 1
                                  and s.writes_failed >= 5), what="r1 stalled")
        r2 = s.request("t", "vm2", ["b"])  # must not take r1's unit meanwhile
        await settle(s, binder)
    assert results_of(s, "t", r1)["a"][:2] == (Result.SUCCEEDED, "n1")
    assert results_of(s, "t", r2)["b"][0] is Result.REFUSED


# -- routing and node lifecycle ---------------------------------------------------------------


async def test_nodes_appearing_and_disappearing_start_and_stop_their_actors() -> None:
    s = cluster(n1=1)
    s.add_device("t", "a", "h100")
    async with running_binder(s) as binder:
        assert binder.child_ids() == [node_child_id("n1"), PIPELINE, COORDINATOR]
        s.add_node("n2", {H100: 4})
        await eventually(lambda: binder.node_actor("n2") is not None, what="n2 actor")
        s.delete_node("n1")
        await eventually(lambda: binder.node_actor("n1") is None, what="n1 actor stopped")
        rid = s.request("t", "vm", ["a"])
        res = await answer(s, binder, "t", rid)
    assert res["a"][:2] == (Result.SUCCEEDED, "n2")


async def test_a_stalled_request_withdrawn_meanwhile_releases_its_reservation() -> None:
    s = cluster(n1=1)
    s.add_device("t", "a", "h100")
    s.add_device("t", "b", "h100")
    s.fail_next(TransientWriteError, op="answer", times=5)  # exactly one round of retries
    async with running_binder(s) as binder:
        r1 = s.request("t", "vm1", ["a"])
        await eventually(lambda: s.writes_failed >= 5, what="r1 stalled")
        s.withdraw("t", r1)
        await eventually(lambda: binder.pipeline.statistics().reservations == 0,
                         what="reservation released")
        r2 = s.request("t", "vm2", ["b"])
        res = await answer(s, binder, "t", r2)
    assert res["b"][:2] == (Result.SUCCEEDED, "n1")
