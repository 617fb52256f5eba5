"""The one-for-one supervisor: restart kinds, backoff, restart intensity and escalation,
graceful and brutal shutdown, start failures; one-for-all groups (the coordinator and its
status pipeline are one)."""

from __future__ import annotations

import enum

import anyio
import pytest

from actors.errors import ActorStopped, StartTimeout
from actors.runtime import Actor, ActorContext, Crash
from supervisor import ChildSpec, Restart, Supervisor, SupervisorConfig, SupervisorEscalation
from tests.support.binder import quiet_logging
from tests.timing import advance, eventually

pytestmark = pytest.mark.anyio

FAST = SupervisorConfig(max_restarts=50, max_seconds=1.0, backoff_initial=0.001, backoff_max=0.004)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


class Worker(Actor):
    """'boom' → crash; ('sleep', s) → sleeps; else echoes."""

    starts = 0

    def __init__(self, name: str = "worker") -> None:
        self.name = name
        Worker.starts += 1

    async def receive(self, message):
        if message == "boom":
            raise RuntimeError("boom")
        if isinstance(message, tuple) and message[0] == "sleep":
            await anyio.sleep(message[1])
        return message


async def test_one_for_one_restarts_only_the_crashed_child() -> None:
    async with Supervisor(FAST) as sup:
        a = await sup.start_child(ChildSpec("a", Worker))
        b = await sup.start_child(ChildSpec("b", Worker))
        a.tell_nowait("boom")
        await eventually(lambda: a.statistics().restarts == 1 and a.statistics().running, what="a restarted")
        assert await a.ask("hi") == "hi"  # same reference after the restart
        assert b.statistics().restarts == 0 and b.statistics().processed == 0
        stats = sup.statistics()
        assert stats.restarts == 1 and stats.children["a"].crashes == 1 and not stats.escalated


class _Kind(enum.Enum):
    A = "a"
    B = "b"


async def test_child_ids_select_by_the_spec_kind() -> None:
    async with Supervisor(FAST) as sup:
        await sup.start_child(ChildSpec("x", Worker, kind=_Kind.A))
        await sup.start_child(ChildSpec("y", Worker, kind=_Kind.B))
        await sup.start_child(ChildSpec("z", Worker, kind=_Kind.A))
        await sup.start_child(ChildSpec("w", Worker))
        assert sup.child_ids(_Kind.A) == ["x", "z"]
        assert sup.child_ids(_Kind.B) == ["y"]
        assert sup.child_ids() == ["x", "y", "z", "w"]
        assert sup.statistics().kinds == {"x": _Kind.A, "y": _Kind.B, "z": _Kind.A, "w": None}


async def test_kill_crashes_and_the_child_is_restarted() -> None:
    async with Supervisor(FAST) as sup:
        ref = await sup.start_child(ChildSpec("a", Worker))
        assert sup.kill("a")
        await eventually(lambda: ref.statistics().restarts == 1 and ref.statistics().running)
        ref.tell_nowait(Crash("via a message"))
        await eventually(lambda: ref.statistics().restarts == 2 and ref.statistics().running)
        assert "ActorKilled" in ref.statistics().last_crash


async def test_temporary_child_is_never_restarted_transient_only_after_a_crash() -> None:
    async with Supervisor(FAST) as sup:
        tmp = await sup.start_child(ChildSpec("tmp", Worker, restart=Restart.TEMPORARY))
        tr = await sup.start_child(ChildSpec("tr", Worker, restart=Restart.TRANSIENT))
        tmp.tell_nowait("boom")
        tr.tell_nowait("boom")
        await eventually(lambda: tr.statistics().restarts == 1 and tr.statistics().running)
        await advance(10 * FAST.backoff_max)  # ten restart backoffs: tmp's would have run
        assert not tmp.statistics().running and tmp.statistics().restarts == 0
        with pytest.raises(ActorStopped):
            await tmp.ask("anyone?", timeout=1.0)


async def test_backoff_grows_between_restarts() -> None:
    config = SupervisorConfig(max_restarts=10, max_seconds=5.0, backoff_initial=0.01,
                              backoff_multiplier=2.0, backoff_max=0.04)
    async with Supervisor(config) as sup:
        ref = await sup.start_child(ChildSpec("a", Worker))
        times = []
        for n in range(1, 5):
            t0 = anyio.current_time()
            ref.tell_nowait("boom")
            await eventually(lambda: ref.statistics().restarts == n and ref.statistics().running,
                             interval=0.0001)
            times.append(anyio.current_time() - t0)
    # fake time: the backoffs themselves, to the polling interval
    assert times == pytest.approx([0.01, 0.02, 0.04, 0.04], abs=0.0002)  # the last capped


async def test_restart_intensity_escalates_and_stops_every_child() -> None:
    config = SupervisorConfig(max_restarts=3, max_seconds=10.0, backoff_initial=0.001, backoff_max=0.001)
    refs = {}
    with pytest.raises(SupervisorEscalation) as info:
        async with Supervisor(config) as sup:
            refs["a"] = await sup.start_child(ChildSpec("a", Worker))
            refs["b"] = await sup.start_child(ChildSpec("b", Worker))
            for _ in range(10):
                with anyio.move_on_after(0.1):
                    try:
                        await refs["a"].tell("boom")
                    except ActorStopped:
                        break
                await advance(0.005)  # past the restart backoff
            await advance(1)  # cancelled by the escalation meanwhile
            pytest.fail("the supervisor did not escalate")
    assert info.value.child_id == "a"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not refs["a"].statistics().running and not refs["b"].statistics().running
    with pytest.raises(ActorStopped):
        refs["b"].tell_nowait("x")


async def test_graceful_shutdown_drains_and_brutal_kill_does_not_wait() -> None:
    async with Supervisor(FAST) as sup:
        slow = await sup.start_child(ChildSpec("slow", Worker, shutdown=0.02))
        slow.tell_nowait(("sleep", 5))  # longer than its shutdown timeout
        await eventually(lambda: slow.statistics().mailbox_depth == 0, what="slow busy")
        t0 = anyio.current_time()
        await sup.terminate_child("slow")
        assert anyio.current_time() - t0 == pytest.approx(0.02)  # its shutdown timeout
        assert sup.ref("slow") is None

        drains = await sup.start_child(ChildSpec("drains", Worker, shutdown=1.0))
        drains.tell_nowait(("sleep", 0.01))
        drains.tell_nowait("last")
        await sup.terminate_child("drains")
        assert drains.statistics().processed == 2  # handled what was queued, then stopped

        brutal = await sup.start_child(ChildSpec("brutal", Worker, shutdown=None))
        brutal.tell_nowait(("sleep", 5))
        await eventually(lambda: brutal.statistics().mailbox_depth == 0, what="brutal busy")
        t0 = anyio.current_time()
        await sup.terminate_child("brutal")
        assert anyio.current_time() - t0 == 0  # no wait at all


class NeverStarts(Actor):
    async def on_start(self, ctx: ActorContext) -> None:
        await anyio.sleep(10)


class FailsToStart(Actor):
    async def on_start(self, ctx: ActorContext) -> None:
        raise OSError("cannot start")


async def test_a_child_that_never_reports_started_is_an_error_not_a_hang() -> None:
    async with Supervisor(FAST) as sup:
        with pytest.raises(StartTimeout):
            await sup.start_child(ChildSpec("never", NeverStarts, start_timeout=0.02))
        with pytest.raises(OSError):
            await sup.start_child(ChildSpec("fails", FailsToStart))
        assert sup.child_ids() == []


async def test_duplicate_child_id_is_refused() -> None:
    async with Supervisor(FAST) as sup:
        await sup.start_child(ChildSpec("a", Worker))
        with pytest.raises(ValueError):
            await sup.start_child(ChildSpec("a", Worker))


async def test_leaving_the_block_stops_children_in_reverse_order() -> None:
    stopped: list[str] = []

    class Noting(Worker):
        async def on_stop(self) -> None:
            stopped.append(self.name)

    async with Supervisor(FAST) as sup:
        for name in ("first", "second", "third"):
            await sup.start_child(ChildSpec(name, lambda name=name: Noting(name)))
    assert stopped == ["third", "second", "first"]


# -- one-for-all groups ---------------------------------------------------------------------


class Logged(Worker):
    """A worker noting its starts and clean stops in `log` as (event, name)."""

    log: list[tuple[str, str]] = []

    async def on_start(self, ctx: ActorContext) -> None:
        Logged.log.append(("start", self.name))

    async def on_stop(self) -> None:
        Logged.log.append(("stop", self.name))


def logged(name: str) -> ChildSpec:
    return ChildSpec(name, lambda: Logged(name))


async def test_one_for_all_a_crash_in_a_group_restarts_every_member_once_and_nothing_else() -> None:
    async with Supervisor(FAST) as sup:
        solo = await sup.start_child(ChildSpec("solo", Worker))
        a, b = await sup.start_group([logged("a"), logged("b")])
        assert sup.child_ids() == ["solo", "a", "b"]
        Logged.log = []
        b.tell_nowait("boom")
        await eventually(lambda: all(r.statistics().restarts == 1 and r.statistics().running
                                     for r in (a, b)), what="a and b restarted")
        assert Logged.log == [("start", "a"), ("start", "b")]  # in order, each once
        assert await a.ask("hi") == "hi" and await b.ask("ho") == "ho"  # same references
        stats = sup.statistics()
        assert stats.restarts == 1  # one restart of the group, counted once
        assert stats.children["b"].crashes == 1
        assert stats.children["a"].crashes == 0  # stopped with its group, not crashed
        assert solo.statistics().restarts == 0 and solo.statistics().running
        assert sup.kill("a")  # a kill of either member restarts both too
        await eventually(lambda: all(r.statistics().restarts == 2 and r.statistics().running
                                     for r in (a, b)), what="a and b restarted again")
        assert sup.statistics().restarts == 2 and solo.statistics().restarts == 0


async def test_a_group_stops_in_reverse_order_and_terminating_a_member_stops_the_group() -> None:
    Logged.log = []
    async with Supervisor(FAST) as sup:
        await sup.start_group([logged("x"), logged("y")])
        await sup.start_group([logged("p"), logged("q")])
        await sup.terminate_child("p")
        assert sup.child_ids() == ["x", "y"]
    assert Logged.log == [("start", "x"), ("start", "y"), ("start", "p"), ("start", "q"),
                          ("stop", "q"), ("stop", "p"), ("stop", "y"), ("stop", "x")]


async def test_group_members_are_permanent_and_a_failed_start_keeps_no_member() -> None:
    async with Supervisor(FAST) as sup:
        with pytest.raises(ValueError):
            await sup.start_group([ChildSpec("a", Worker), ChildSpec("b", Worker, restart=Restart.TRANSIENT)])
        with pytest.raises(ValueError):
            await sup.start_group([])
        with pytest.raises(OSError):
            await sup.start_group([ChildSpec("ok", Worker), ChildSpec("fails", FailsToStart)])
        assert sup.child_ids() == []
        a, = await sup.start_group([ChildSpec("ok", Worker)])  # the id is free again
        assert await a.ask("x") == "x"


async def test_group_restarts_count_against_the_restart_intensity() -> None:
    config = SupervisorConfig(max_restarts=2, max_seconds=10.0, backoff_initial=0.001, backoff_max=0.001)
    with pytest.raises(SupervisorEscalation) as info:
        async with Supervisor(config) as sup:
            await sup.start_group([ChildSpec("a", Worker), ChildSpec("b", Worker)])
            for _ in range(10):
                sup.kill("b")
                await advance(0.01)  # past the restart backoff
            await advance(1)  # cancelled by the escalation meanwhile
            pytest.fail("the supervisor did not escalate")
    assert info.value.child_id == "b"
