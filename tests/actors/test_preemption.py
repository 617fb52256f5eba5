"""P4 through the actor system on the in-memory store (docs/contract.md §3c): the coordinator
nominates a set refused for room and its pipeline records the nomination *before* the
refusal (`preemption_nominated`) is written; a crash between the two leaves the nomination,
which the next incarnation reuses (one nomination, never two); the nominated room is placed
for nobody else while the nomination lives (P6); the preemptor's next request lands there once
the victims are gone; without a nomination writer nothing is nominated."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest

from actors.coordinator_protocol import CoordinatorConfig
from actors.errors import RequestWithdrawn, TransientWriteError
from fakes.clock import LoopClock
from fakes.memory_store import MemoryStore
from model.nominate import NominationSettings
from model.preemption import PreemptionSettings
from model.priority import Priority
from model.reasons import Code
from model.types import Result
from supervisor import COORDINATOR, Binder
from tests.support.binder import fast_config, kill_child, quiet_logging, settle
from tests.support.p6 import nominated_room_problems
from tests.timing import eventually

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"
SPOT, ON_DEMAND = Priority(100, class_name="spot"), Priority(1000, class_name="on-demand")


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def config(**pipeline):
    base = fast_config()
    preemption = NominationSettings(PreemptionSettings(min_runtime=timedelta(0)))
    coordinator = CoordinatorConfig(**{**{f: getattr(base.coordinator, f) for f in
                                          ("ask_timeout", "requeue_delay", "stalled_delay", "resync_interval")},
                                       "preemption": preemption})
    from dataclasses import replace
    return replace(base, coordinator=coordinator, pipeline=replace(base.pipeline, **pipeline))


class Running:
    def __init__(self, store: MemoryStore, binder: Binder) -> None:
        self.store, self.binder = store, binder


def full_store() -> MemoryStore:
    """n1 (4 × H100) full of spot VMs a and b (2 each, running); tenant p waits."""
    s = MemoryStore(clock=LoopClock())
    for ns in ("spot", "p", "q"):
        s.add_namespace(ns)
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 4})
    return s


def add_set(s: MemoryStore, ns: str, vmi: str, n: int, priority: Priority) -> str:
    names = [f"{vmi}-h100-{i}" for i in range(n)]
    for name in names:
        if (ns, name) not in s.devices():
            s.add_device(ns, name, "h100", template_for=vmi)
    return s.request(ns, vmi, names, priority=priority, admission=f"adm-{vmi}")


def result(s: MemoryStore, ns: str, rid: str):
    members = s.request_members(ns, rid)
    brs = {m.status.bind_request.result for m in members}
    codes = {m.status.bind_request.code for m in members}
    nodes = {m.status.bind_request.node for m in members}
    return (brs.pop() if len(brs) == 1 else brs, codes.pop() if len(codes) == 1 else codes,
            nodes.pop() if len(nodes) == 1 else nodes)


def ops_of(s: MemoryStore, rid: str | None = None) -> list[str]:
    return [r.op for r in s.history if r.op == "nomination" or (r.op == "answer" and r.request_id == rid)]


async def spot_pair_running(s: MemoryStore, binder) -> None:
    """The spot sets `spot/a` and `spot/b` (2 GPUs each) placed and settled, then a second
    of (fake) time before a preemptor comes (as each test did inline)."""
    add_set(s, "spot", "a", 2, SPOT), add_set(s, "spot", "b", 2, SPOT)
    await settle(s, binder)
    await anyio.sleep(1)


async def running(s: MemoryStore, cfg=None, nominations=True):
    binder = Binder(s, s, s, LoopClock(), cfg or config(), nominations=s if nominations else None)
    return binder


async def test_P4_the_nomination_is_recorded_before_the_refusal_and_names_P3s_victims():
    s = full_store()
    binder = await running(s)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        a, b = add_set(s, "spot", "a", 2, SPOT), add_set(s, "spot", "b", 2, SPOT)
        await settle(s, binder)
        assert result(s, "spot", a)[0] is Result.SUCCEEDED and result(s, "spot", b)[0] is Result.SUCCEEDED
        await anyio.sleep(1)  # the sets run a while (min runtime 0)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid) == (Result.REFUSED, Code.PREEMPTION_NOMINATED, None)
        (n,) = s.nominations().values()
        assert (n.namespace, n.vmi, n.priority, n.node, n.units) == ("p", "vm-9", 1000, "n1", ((H100, 4),))
        assert sorted(v.vmi for v in n.victims) == ["a", "b"]
        assert [v.admission for v in n.victims] == ["adm-a", "adm-b"]
        # the nomination first, then the refusal on each member
        assert ops_of(s, rid) == ["nomination"] + ["answer"] * 4
        message = s.request_members("p", rid)[0].status.bind_request.message
        assert "stopping 2 lower-priority VMs on n1" in message and "spot/a, spot/b" in message
        tg.cancel_scope.cancel()


async def test_P4_a_crash_between_the_nomination_and_the_refusal_loses_nothing():
    s = full_store()
    binder = await running(s)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        await spot_pair_running(s, binder)
        # the refusal's writes fail until the coordinator is killed: the nomination is in place
        s.fail_next(TransientWriteError, op="answer", times=1000)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await eventually(lambda: s.nominations(), 5.0, "the nomination recorded")
        first = next(iter(s.nominations().values()))
        assert result(s, "p", rid)[0] is None  # no refusal written yet
        assert kill_child(binder, COORDINATOR)
        s._injected.clear()  # the API server answers again
        await settle(s, binder)
        assert result(s, "p", rid) == (Result.REFUSED, Code.PREEMPTION_NOMINATED, None)
        # reused: the same nomination, recorded once
        assert list(s.nominations().values()) == [first]
        assert [r.op for r in s.history].count("nomination") == 1
        tg.cancel_scope.cancel()


async def test_P4_a_nomination_not_recorded_writes_no_refusal():
    s = full_store()
    binder = await running(s, config(retry_attempts=2))
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        await spot_pair_running(s, binder)
        s.fail_next(TransientWriteError, op="nomination", times=2)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await anyio.sleep(0.005)
        assert result(s, "p", rid)[0] is None or not s.nominations()
        # the request stalled, is examined again, and then both are written, in order
        await settle(s, binder)
        assert result(s, "p", rid) == (Result.REFUSED, Code.PREEMPTION_NOMINATED, None)
        assert ops_of(s, rid)[0] == "nomination"
        tg.cancel_scope.cancel()


async def test_P6_nominated_room_goes_to_its_preemptor_only():
    s = full_store()
    binder = await running(s)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        await spot_pair_running(s, binder)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid)[1] is Code.PREEMPTION_NOMINATED
        # the victims stop: their VMIs' template devices go (H2)
        for vmi in ("a", "b"):
            for i in range(2):
                s.delete_device(("spot", f"{vmi}-h100-{i}"))
        # another tenant's set of 2 (even of a higher priority) finds no room on n1
        other = add_set(s, "q", "vm-x", 2, Priority(5000))
        await settle(s, binder)
        assert result(s, "q", other)[0] is Result.REFUSED
        assert result(s, "q", other)[1] is not Code.PREEMPTION_NOMINATED  # nobody to stop
        # the preemptor's next create (W5 cleared its request; a new one) lands on n1
        s.withdraw("p", rid)
        again = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", again) == (Result.SUCCEEDED, None, "n1")
        tg.cancel_scope.cancel()


async def test_without_a_nomination_writer_nothing_is_nominated():
    s = full_store()
    binder = await running(s, nominations=False)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        await spot_pair_running(s, binder)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid)[:2] == (Result.REFUSED, Code.NO_ELIGIBLE_NODE)
        assert not s.nominations()
        tg.cancel_scope.cancel()


async def test_P6_a_nomination_read_from_the_API_holds_its_room_on_a_replica_that_does_not_preempt():
    """After a failover the nomination is read from the API; a replica that does not nominate
    itself (no writer here: preemption off) still places nobody else on its room."""
    from model.nomination import Nomination

    s = full_store()
    binder = await running(s, nominations=False)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        now = LoopClock().now()
        s.put_nomination(Nomination("p", "vm-9", 1000, "n1", ((H100, 4),), (), (), now,
                                    now + timedelta(minutes=2)))
        other = add_set(s, "q", "vm-x", 2, Priority(5000))
        await settle(s, binder)
        assert result(s, "q", other)[0] is Result.REFUSED, "placed on nominated room"
        # the preemptor lands there
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid) == (Result.SUCCEEDED, None, "n1")
        tg.cancel_scope.cancel()


async def test_P6_a_nomination_not_yet_recorded_holds_its_room_for_the_next_batches():
    """A nomination handed to the pipeline holds its room from its decision on, not only once
    the view shows it: a second preemptor decided meanwhile (the first's write is retried
    here) is not promised the same room, nor the same victim (found by the chaos test)."""
    s = full_store()
    binder = await running(s)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        await spot_pair_running(s, binder)
        s.fail_next(TransientWriteError, op="nomination", times=3)  # the first nomination's write lags
        first = add_set(s, "p", "vm-1", 2, ON_DEMAND)
        await anyio.sleep(0.0005)  # decided; its nomination's write is being retried
        assert not s.nominations()
        second = add_set(s, "q", "vm-2", 2, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", first)[1] is Code.PREEMPTION_NOMINATED
        assert result(s, "q", second)[1] is Code.PREEMPTION_NOMINATED
        n1, n2 = s.nominations()["p.vm-1"], s.nominations()["q.vm-2"]
        # n1 (4 GPUs): the two nominations' room fits beside the sets that are no victim
        assert nominated_room_problems(s, LoopClock().now()) == []
        assert [v.vmi for v in n1.victims] == ["a"] and [v.vmi for v in n2.victims] == ["a", "b"]
        tg.cancel_scope.cancel()


async def test_P6_a_leader_killed_between_the_victims_deletion_and_the_preemptors_admission_loses_nothing():
    """The leader (its coordinator and its preemption worker) dies right after the first
    victim's VMI is deleted: the next round stops the other victim once, the preemptor's
    retry lands on its room, the nomination is then deleted, and no other VMI is stopped."""
    from tests.support.p6 import deletion_problem
    from tests.support.preemption import MemoryPreemption

    s = full_store()
    binder = await running(s)
    clock = LoopClock()
    problems: list[str] = []

    def stopped(ns: str, vmi: str, uid: str) -> None:
        got = s.deleted_vmis[-1]
        if (problem := deletion_problem(s, got[0], got[1], got[3], clock.now())) is not None:
            problems.append(problem)
        if len(s.deleted_vmis) == 1:
            worker.abandon()  # the leader dies mid-round
            assert kill_child(binder, COORDINATOR)

    worker = MemoryPreemption(s, clock, period=0.01, on_stop=stopped)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        for vmi in ("a", "b"):
            s.add_vmi("spot", vmi, admission=f"adm-{vmi}")
        s.add_vmi("spot", "bystander", admission="adm-bystander")
        await spot_pair_running(s, binder)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid)[1] is Code.PREEMPTION_NOMINATED
        await worker.round()  # stops a, then the leader dies: b not yet
        assert [d[1] for d in s.deleted_vmis] == ["a"]
        await worker.round()  # the next leader's round
        assert sorted(d[1] for d in s.deleted_vmis) == ["a", "b"] and not problems
        s.withdraw("p", rid)
        again = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", again) == (Result.SUCCEEDED, None, "n1")
        await worker.round()
        assert not s.nominations()  # done: deleted as admitted
        assert sorted(d[1] for d in s.deleted_vmis) == ["a", "b"]  # nobody else, each once
        assert s.vmi("spot", "bystander") is not None
        tg.cancel_scope.cancel()


def store_with_idle() -> MemoryStore:
    s = MemoryStore(clock=LoopClock())
    for ns in ("spot", "p", "t"):
        s.add_namespace(ns)
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 5})
    s.add_device("t", "idle-1", "h100", node="n1")
    return s


async def test_P3_P4_a_D_move_that_fails_leaves_the_nomination_and_is_made_on_the_preemptors_retry():
    """The move's write fails as when the device is found no longer idle (RequestWithdrawn):
    the nomination stands, the preemptor is not admitted while its room is not free (its
    victim stopped, the idle device still there), and its retry makes the move again."""
    s = store_with_idle()
    binder = await running(s)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        add_set(s, "spot", "a", 2, SPOT), add_set(s, "spot", "c", 1, SPOT)
        await settle(s, binder)
        s.add_node("n2", {H100: 1})
        await anyio.sleep(1)
        s.fail_next(RequestWithdrawn, op="move")
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid)[1] is Code.PREEMPTION_NOMINATED
        (n,) = s.nominations().values()
        assert [m.name for m in n.moves] == ["idle-1"]
        assert s.devices()[("t", "idle-1")].status.node_name == "n1"  # not moved
        for i in range(2):
            s.delete_device(("spot", f"a-h100-{i}"))
        s.withdraw("p", rid)
        again = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        # 3 free on n1: not admitted, the same nomination; the move made now
        assert result(s, "p", again)[1] is Code.PREEMPTION_NOMINATED
        assert list(s.nominations().values()) == [n]
        assert s.devices()[("t", "idle-1")].status.node_name == "n2"
        s.withdraw("p", again)
        last = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", last) == (Result.SUCCEEDED, None, "n1")
        tg.cancel_scope.cancel()


async def test_P3_P4_a_nomination_with_a_D_move_moves_the_idle_device_once_then_the_preemptor_lands():
    """n1 (5 × H100): spot VMs a (2 GPUs) and c (1) and tenant t's idle held device; n2 (1)
    has one unit free. The on-demand 4-GPU set would need a and c stopped; moving the idle
    device to n2 leaves a the only victim. The nomination records the move, the binder writes
    it once (a `move`, as a defragmenting one), holds n2's unit for it, the victim stops and
    the preemptor's next create lands on n1."""
    s = store_with_idle()
    binder = await running(s)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        a, c = add_set(s, "spot", "a", 2, SPOT), add_set(s, "spot", "c", 1, SPOT)
        await settle(s, binder)
        assert result(s, "spot", a)[2] == result(s, "spot", c)[2] == "n1"
        s.add_node("n2", {H100: 1})
        await anyio.sleep(1)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid) == (Result.REFUSED, Code.PREEMPTION_NOMINATED, None)
        (n,) = s.nominations().values()
        assert [v.vmi for v in n.victims] == ["a"] and n.node == "n1"
        assert [(m.name, m.from_node, m.to_node) for m in n.moves] == [("idle-1", "n1", "n2")]
        assert nominated_room_problems(s, LoopClock().now()) == []
        moves = [r for r in s.history if r.op == "move"]
        assert [(r.key, r.node) for r in moves] == [(("t", "idle-1"), "n2")]
        assert "to make room on n1 for p/vm-9" in moves[0].message
        assert s.devices()[("t", "idle-1")].status.node_name == "n2"
        # the preemptor's retry before the victim stopped: refused again, the move not made twice
        s.withdraw("p", rid)
        again = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", again)[1] is Code.PREEMPTION_NOMINATED
        assert len([r for r in s.history if r.op == "move"]) == 1
        # the victim stops (its template devices go, H2); the preemptor's next create lands on n1
        for i in range(2):
            s.delete_device(("spot", f"a-h100-{i}"))
        s.withdraw("p", again)
        last = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", last) == (Result.SUCCEEDED, None, "n1")
        assert result(s, "spot", c)[0] is Result.SUCCEEDED  # c never stopped
        tg.cancel_scope.cancel()
