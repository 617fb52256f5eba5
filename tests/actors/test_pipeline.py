"""The status pipeline alone (actors.status_pipeline), on the in-memory store with a real
node actor: one write per member and one `write_many` per wave (B1, B7, B8), the
reservation kept until the view shows the writes then `Release`d, a stalled flight's
whole hold counted (B3), decisions of an earlier coordinator incarnation dropped."""

from __future__ import annotations

from typing import Any, Mapping

import anyio
import pytest

from actors.errors import TransientWriteError
from fakes.memory_store import MemoryStore
from actors.node_actor import Claim, GetLedger, NodeActor, NodeActorConfig
from fakes.clock import LoopClock
from actors.runtime import Actor, ActorRef, spawn
from actors.status_pipeline import (
    Attach,
    Decided,
    Fly,
    GetFlights,
    GetPipelineStatus,
    PipelineConfig,
    Settle,
    Stalled,
    StatusPipeline,
)
from model.decide import Request
from model.requests import find_requests
from model.hold import Hold, hold_for
from model.reasons import Code
from model.types import Result
from tests.support.binder import quiet_logging
from tests.timing import eventually

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"
FAST = PipelineConfig(write_timeout=2.0, retry_attempts=3, retry_initial=0.001, retry_max=0.002,
                      retry_jitter=0.001, settle_timeout=5.0, settle_poll=0.01)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


class Nodes:
    """A NodeDirectory of the node actors started by the test."""

    def __init__(self) -> None:
        self.refs: dict[str, ActorRef] = {}

    def node_actor(self, node: str) -> ActorRef | None:
        return self.refs.get(node)

    def node_actors(self) -> Mapping[str, ActorRef]:
        return dict(self.refs)


class Inbox(Actor):
    """Stands for the coordinator: keeps what it is told."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    async def receive(self, message: Any) -> Any:
        self.got.append(message)


def store() -> MemoryStore:
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 4})
    return s


def decided(s: MemoryStore, rid: str, node: str = "n1") -> tuple[Decided, Hold]:
    """The Succeeded decision of request `rid` on `node`, landing every member, and its hold."""
    members = s.request_members("t", rid)
    (req,), _ = find_requests(members)
    assert isinstance(req, Request)
    landing = tuple((("t", name), H100) for name in req.devices)
    hold = hold_for(rid, "t", node, landing, s.device)
    return Decided(req, Result.SUCCEEDED, node, f"placed on {node}", hold), hold


async def test_B7_B8_a_wave_is_one_write_per_member_and_the_hold_is_released_once_seen() -> None:
    s = store()
    for name in ("a", "b", "c"):
        s.add_device("t", name, "h100")
    r1 = s.request("t", "vm1", ["a", "b"])
    r2 = s.request("t", "vm2", ["c"])
    calls: list[int] = []
    write_many = s.write_many

    async def counting(writes):
        calls.append(len(writes))
        return await write_many(writes)

    s.write_many = counting  # type: ignore[method-assign]
    nodes = Nodes()
    async with anyio.create_task_group() as tg:
        nodes.refs["n1"], _ = await spawn(tg, lambda: NodeActor("n1", s, LoopClock(), NodeActorConfig()))
        inbox, _ = await spawn(tg, Inbox)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(s, s, nodes, LoopClock(), FAST))
        (d1, h1), (d2, h2) = decided(s, r1), decided(s, r2)
        for h in (h1, h2):
            await nodes.refs["n1"].ask(Claim(h, "owner-1"))
        await pipe.ask(Attach("owner-1", inbox))
        await pipe.ask(Fly("owner-1", (d1, d2)))
        await eventually(lambda: pipe.statistics().reservations == 0, what="flights settled")
        ledger = await nodes.refs["n1"].ask(GetLedger())
        status = await pipe.ask(GetPipelineStatus())
        tg.cancel_scope.cancel()
    assert calls == [3]  # one write_many for the wave, one write per member
    assert [(r.key[1], r.moved, r.node) for r in s.history if r.op == "answer"] == [
        ("a", True, "n1"), ("b", True, "n1"), ("c", True, "n1")]
    assert ledger.holds == ()  # released once the view showed the writes
    assert (status.succeeded, status.in_flight, status.writing) == (2, 0, 0)


async def test_decisions_of_an_earlier_coordinator_incarnation_are_dropped() -> None:
    s = store()
    s.add_device("t", "a", "h100")
    rid = s.request("t", "vm", ["a"])
    nodes = Nodes()
    async with anyio.create_task_group() as tg:
        inbox, _ = await spawn(tg, Inbox)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(s, s, nodes, LoopClock(), FAST))
        d, _ = decided(s, rid)
        await pipe.ask(Fly("old-owner", (d,)))  # queued before the new incarnation attached
        await pipe.ask(Attach("new-owner", inbox))
        await pipe.ask(Fly("old-owner", (d,)))
        flights = await pipe.ask(GetFlights())
        tg.cancel_scope.cancel()
    assert flights.holds == () and not flights.running
    assert [r for r in s.history if r.op == "answer"] == []


async def test_B3_a_stalled_flight_keeps_its_whole_hold_and_the_coordinator_is_told() -> None:
    s = store()
    for name in ("a", "b"):
        s.add_device("t", name, "h100")
    rid = s.request("t", "vm", ["a", "b"])
    s.fail_next(TransientWriteError, op="answer", times=100)
    nodes = Nodes()
    coordinator = Inbox()
    async with anyio.create_task_group() as tg:
        inbox, _ = await spawn(tg, lambda: coordinator)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(s, s, nodes, LoopClock(), FAST))
        d, hold = decided(s, rid)
        await pipe.ask(Attach("owner", inbox))
        await pipe.ask(Fly("owner", (d,)))
        await eventually(lambda: coordinator.got, what="the coordinator told")
        flights = await pipe.ask(GetFlights())
        s._injected.clear()
        await pipe.ask(Settle(("t", rid)))  # nothing more to write: keep only what may land
        settled = await pipe.ask(GetFlights())
        s.withdraw("t", rid)  # its members no longer carry it: none of its binds can land
        gone = await pipe.ask(GetFlights())
        left = pipe.statistics().reservations
        tg.cancel_scope.cancel()
    assert coordinator.got == [Stalled(("t", rid))]
    assert flights.holds == (hold,) and hold.needs == ((H100, 2),)  # the whole reservation
    assert flights.stalled == {("t", rid)} and not flights.running
    # the failed binds may have applied (ambiguous errors): held until the view says
    assert settled.holds == (hold,) and not settled.stalled and not settled.running
    assert gone.holds == () and left == 0


async def test_B3_a_member_seen_bound_after_the_flights_were_asked_is_not_counted_twice() -> None:
    """The coordinator asks for the flights and then takes its snapshot: a write seen in
    between shows the member Bound in the snapshot while the flights still hold its budget
    slot. `Flights.holds_in(snapshot)` counts it once (was: twice, "198 bound + 2 being
    bound of 200" for 199 VMIs, a refusal of a slot the tenant has)."""
    s = store()
    for name in ("a", "b"):
        s.add_device("t", name, "h100")
    rid = s.request("t", "vm", ["a", "b"])
    release = anyio.Event()
    write_many = s.write_many

    async def held_back(writes):
        await release.wait()
        return await write_many(writes)

    s.write_many = held_back  # type: ignore[method-assign]
    nodes = Nodes()
    async with anyio.create_task_group() as tg:
        inbox, _ = await spawn(tg, Inbox)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(s, s, nodes, LoopClock(), FAST))
        d, _ = decided(s, rid)
        await pipe.ask(Attach("owner-1", inbox))
        await pipe.ask(Fly("owner-1", (d,)))
        flights = await pipe.ask(GetFlights())  # asked while the writes are held back
        release.set()
        await eventually(lambda: s.tenant_bound("t", H100) == 2, what="both members Bound")
        snap = s.snapshot()  # taken after: shows the writes
        tg.cancel_scope.cancel()
    assert [h.budget_needs for h in flights.holds] == [((H100, 2),)]
    assert snap.with_reservations(flights.holds).tenant_counts("t", H100) == (2, 2)  # the race
    assert flights.holds_in(snap.devices.get) == []
    assert snap.with_reservations(flights.holds_in(snap.devices.get)).tenant_counts("t", H100) == (2, 0)


class LaggingView:
    """The store as a view that has not caught up with the devices in `frozen` (their state
    when frozen): an informer cache behind its API server, e.g. relisting after a
    kube-apiserver restart."""

    def __init__(self, s: MemoryStore) -> None:
        self._s = s
        self.frozen: dict = {}

    def freeze(self, *keys) -> None:
        self.frozen = {k: self._s.device(k) for k in keys}

    def device(self, key):
        return self.frozen[key] if key in self.frozen else self._s.device(key)

    def __getattr__(self, name):
        return getattr(self._s, name)


async def test_B7_a_flight_the_view_does_not_show_yet_is_settling_not_to_be_decided_again() -> None:
    """Writes done, view behind: `Flights.settling` names the request (the coordinator skips
    it as it skips `running`), and it keeps its hold; once the view shows it, it is gone."""
    s = store()
    s.add_device("t", "a", "h100")
    rid = s.request("t", "vm", ["a"])
    view, nodes = LaggingView(s), Nodes()
    view.freeze(("t", "a"))
    async with anyio.create_task_group() as tg:
        nodes.refs["n1"], _ = await spawn(tg, lambda: NodeActor("n1", s, LoopClock(), NodeActorConfig()))
        inbox, _ = await spawn(tg, Inbox)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(view, s, nodes, LoopClock(), FAST))
        d, h = decided(s, rid)
        await nodes.refs["n1"].ask(Claim(h, "owner-1"))
        await pipe.ask(Attach("owner-1", inbox))
        await pipe.ask(Fly("owner-1", (d,)))
        await eventually(lambda: s.device(("t", "a")).status.bind_request.result is Result.SUCCEEDED,
                         what="the answer written")
        await eventually(lambda: pipe.statistics().processed >= 3, what="the write reported")
        waiting = await pipe.ask(GetFlights())
        view.frozen = {}
        await eventually(lambda: pipe.statistics().reservations == 0, what="flight settled")
        after = await pipe.ask(GetFlights())
        tg.cancel_scope.cancel()
    assert waiting.settling == {("t", rid)} and not waiting.running and not waiting.stalled
    assert waiting.holds == (h,)
    assert after.settling == frozenset() and after.holds == ()


async def test_B7_a_decision_made_before_the_view_showed_the_first_answer_is_moot() -> None:
    """A request answered Succeeded on n1, decided again for n2 on a view that had not caught
    up (the device soak after a kube-apiserver restart: the second answer overwrote the first,
    which the webhook had already pinned the VMI to): the second writes nothing, its hold on
    n2 is released, the answer on n1 stands."""
    s = store()
    s.add_node("n2", {H100: 4})
    s.add_device("t", "a", "h100")
    rid = s.request("t", "vm", ["a"])
    nodes = Nodes()
    async with anyio.create_task_group() as tg:
        for n in ("n1", "n2"):
            nodes.refs[n], _ = await spawn(tg, lambda n=n: NodeActor(n, s, LoopClock(), NodeActorConfig()))
        inbox, _ = await spawn(tg, Inbox)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(s, s, nodes, LoopClock(), FAST))
        await pipe.ask(Attach("owner-1", inbox))
        d1, h1 = decided(s, rid, "n1")
        d2, h2 = decided(s, rid, "n2")
        await nodes.refs["n1"].ask(Claim(h1, "owner-1"))
        await pipe.ask(Fly("owner-1", (d1,)))
        await eventually(lambda: pipe.statistics().reservations == 0, what="the first answer settled")
        await nodes.refs["n2"].ask(Claim(h2, "owner-1"))
        await pipe.ask(Fly("owner-1", (d2,)))

        async def released() -> bool:
            return (await nodes.refs["n2"].ask(GetLedger())).holds == ()
        await eventually(released, what="n2's hold released")
        status = await pipe.ask(GetPipelineStatus())
        tg.cancel_scope.cancel()
    st = s.device(("t", "a")).status
    assert (st.node_name, st.bind_request.node, st.bind_request.result) == ("n1", "n1", Result.SUCCEEDED)
    assert [(r.key[1], r.node) for r in s.history if r.op == "answer"] == [("a", "n1")]
    assert (status.succeeded, status.withdrawn) == (1, 1)


async def test_B7_a_refusal_the_view_does_not_show_yet_is_settling_too() -> None:
    """A refusal holds nothing, but until the view shows its answer the request is still
    `settling`: a scan on that view would otherwise decide it again and write a second answer
    over the one its webhook already gave the tenant."""
    s = store()
    s.add_device("t", "a", "h100")
    rid = s.request("t", "vm", ["a"])
    view = LaggingView(s)
    view.freeze(("t", "a"))
    async with anyio.create_task_group() as tg:
        inbox, _ = await spawn(tg, Inbox)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(view, s, Nodes(), LoopClock(), FAST))
        await pipe.ask(Attach("owner-1", inbox))
        (req,), _ = find_requests(s.request_members("t", rid))
        await pipe.ask(Fly("owner-1", (Decided(req, Result.REFUSED, None, "no room", None, code=Code.NO_ROOM),)))
        await eventually(lambda: s.device(("t", "a")).status.bind_request.result is Result.REFUSED,
                         what="the refusal written")

        async def settling() -> bool:
            return (await pipe.ask(GetFlights())).settling == {("t", rid)}
        await eventually(settling, what="the refusal reported settling")
        view.frozen = {}
        await eventually(lambda: pipe.statistics().reservations == 0, what="the refusal seen")
        after = await pipe.ask(GetFlights())
        tg.cancel_scope.cancel()
    assert after.settling == frozenset() and after.holds == ()


async def test_P4_a_decision_whose_nomination_a_later_one_superseded_writes_nothing() -> None:
    """The device priorities soak: a refusal's nomination held up 30 s by a kube-apiserver
    restart replaced the preemptor's later nomination (another node, another victim) with the
    older one, on room another set had started on meanwhile. A later nomination of the
    preemptor is never replaced: the old decision is withdrawn, its refusal never written,
    and its flight holds nothing."""
    from datetime import timedelta

    from model.nomination import Nomination, Victim

    s = store()
    s.add_device("t", "a", "h100")
    rid = s.request("t", "vm", ["a"])
    members = s.request_members("t", rid)
    (req,), _ = find_requests(members)
    now = LoopClock().now()
    victim = Victim("spot", "x", "adm-x", None, 0, now - timedelta(hours=1))
    old = Nomination("t", "vm", 1000, "n1", ((H100, 1),), (), (victim,), now, now + timedelta(minutes=2), 2)
    later = Nomination("t", "vm", 1000, "n2", ((H100, 1),), (), (victim,), now + timedelta(seconds=7),
                       now + timedelta(minutes=2, seconds=7), 2)
    await s.put(later)
    nodes = Nodes()
    coordinator = Inbox()
    async with anyio.create_task_group() as tg:
        inbox, _ = await spawn(tg, lambda: coordinator)
        pipe, _ = await spawn(tg, lambda: StatusPipeline(s, s, nodes, LoopClock(), FAST, nominations=s))
        d = Decided(req, Result.REFUSED, None, "stopping 1 lower-priority VM on n1", None,
                    code=Code.PREEMPTION_NOMINATED, nomination=old)
        await pipe.ask(Attach("owner", inbox))
        await pipe.ask(Fly("owner", (d,)))
        with anyio.fail_after(5):
            while (status := await pipe.ask(GetPipelineStatus())).in_flight:
                await anyio.sleep(0.01)
        flights = await pipe.ask(GetFlights())
        tg.cancel_scope.cancel()
    assert list(s.nominations().values()) == [later]
    assert [r for r in s.history if r.op == "answer"] == []
    assert s.request_members("t", rid)[0].status.bind_request.result is None
    assert not flights.running and not flights.stalled and flights.holds == ()
    assert not any(isinstance(m, Stalled) for m in coordinator.got)
    assert (status.withdrawn, status.gave_up, status.refused) == (1, 0, 0)
