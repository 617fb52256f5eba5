"""The binder's supervision tree and router: a node actor per node, one coordinator,
level-based routing of changes, escalation out of `Binder.run`."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from fakes.memory_store import MemoryStore
from actors.node_actor import GetLedger
from fakes.clock import LoopClock
from model.types import Result
from supervisor import COORDINATOR, PIPELINE, Binder, ChildKind, SupervisorEscalation, node_child_id
from tests.support.binder import fast_config, kill_child, quiet_logging, results_of, running_binder, settle
from tests.timing import advance, eventually

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def store() -> MemoryStore:
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 2})
    s.add_node("n2", {H100: 2})
    return s


async def test_one_node_actor_per_node_and_one_coordinator() -> None:
    s = store()
    async with running_binder(s) as binder:
        assert sorted(binder.child_ids()) == [COORDINATOR, node_child_id("n1"), node_child_id("n2"),
                                             PIPELINE]
        assert set(binder.node_actors()) == {"n1", "n2"}
        sup = binder.supervisor
        assert sup is not None
        assert sup.statistics().kinds == {
            node_child_id("n1"): ChildKind.NODE, node_child_id("n2"): ChildKind.NODE,
            PIPELINE: ChildKind.PIPELINE, COORDINATOR: ChildKind.COORDINATOR}
        assert sup.child_ids(ChildKind.NODE) == [node_child_id("n1"), node_child_id("n2")]


async def test_node_changes_reach_the_node_actor_which_rereads_the_view() -> None:
    s = store()
    async with running_binder(s) as binder:
        ref = binder.node_actor("n1")
        s.cordon("n1")
        s.set_allocatable("n1", H100, 5)
        await eventually(lambda: ref.statistics().processed >= 2, what="node changes routed")
        ledger = await ref.ask(GetLedger())
        assert ledger.unschedulable and ledger.allocatable[H100] == 5


async def test_nodes_appear_and_disappear() -> None:
    s = store()
    async with running_binder(s) as binder:
        s.add_node("n3", {H100: 1})
        await eventually(lambda: binder.node_actor("n3") is not None, what="n3 started")
        old = binder.node_actor("n1")
        s.delete_node("n1")
        await eventually(lambda: binder.node_actor("n1") is None, what="n1 stopped")
        assert not old.statistics().running
        s.add_node("n1", {H100: 1})  # back again: a fresh actor
        await eventually(lambda: binder.node_actor("n1") is not None, what="n1 restarted")
        assert binder.node_actor("n1") is not old


async def test_partial_requests_are_not_routed_complete_ones_are() -> None:
    s = store()
    s.add_device("t", "a", "h100")
    s.add_device("t", "b", "h100")
    async with running_binder(s) as binder:
        rid = s.request("t", "vm", ["a", "b"], only=["a"])
        # the router has seen the write, and the coordinator has rescanned twice meanwhile
        await advance(2 * fast_config().coordinator.resync_interval)
        assert [r for r in s.history if r.request_id == rid and r.op == "answer"] == []
        assert s.device(("t", "a")).status.bind_request.result is None  # nothing acted on
        s.request("t", "vm", ["a", "b"], request_id=rid, only=["b"])
        await settle(s, binder)
    assert {v[0] for v in results_of(s, "t", rid).values()} == {Result.SUCCEEDED}


async def test_a_killed_actor_is_restarted_with_the_same_reference() -> None:
    s = store()
    s.add_device("t", "a", "h100")
    async with running_binder(s) as binder:
        ref = binder.node_actor("n1")
        assert kill_child(binder, node_child_id("n1"))
        assert kill_child(binder, COORDINATOR)
        await eventually(lambda: ref.statistics().restarts == 1 and ref.statistics().running
                         and binder.coordinator.statistics().restarts == 1, what="restarts")
        assert binder.node_actor("n1") is ref
        rid = s.request("t", "vm", ["a"])
        await settle(s, binder)
    assert results_of(s, "t", rid)["a"][0] is Result.SUCCEEDED


async def test_past_the_restart_intensity_run_raises_supervisor_escalation() -> None:
    s = store()
    config = fast_config()
    config = replace(config, supervisor=replace(config.supervisor, max_restarts=2, max_seconds=10.0))
    binder = Binder(s, s, s, LoopClock(), config)

    started = anyio.Event()

    class Started:  # binder.run's task status: started once every actor has started
        def started(self, value: object = None) -> None:
            started.set()

    async def killer() -> None:
        # kills before the first start completes fail the start (OTP: start_link returns the
        # error); the intensity is about crashes of running children
        with anyio.fail_after(5):
            await started.wait()
        for _ in range(5):
            kill_child(binder, COORDINATOR)
            await advance(0.02)  # past the restart backoff

    async with anyio.create_task_group() as tg:
        tg.start_soon(killer)
        with pytest.raises(SupervisorEscalation) as info:
            await binder.run(task_status=Started())  # the process entry awaits this: it exits non-zero
        tg.cancel_scope.cancel()
    assert info.value.child_id == COORDINATOR
    stats = binder.statistics()
    assert stats.escalated and not any(c.running for c in stats.children.values())
