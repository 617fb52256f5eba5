"""The actor runtime: mailboxes, tell/ask, back-pressure, crashes, kills, statistics."""

from __future__ import annotations

import anyio
import pytest

from actors.errors import ActorKilled, ActorStopped, AskTimeout, MailboxFull, StartTimeout
from actors.runtime import Actor, ActorCell, ActorContext, Crash, TickSource, spawn
from tests.timing import advance, eventually

pytestmark = pytest.mark.anyio


class Echo(Actor):
    """Replies with what it got; 'boom' crashes it; ('sleep', s) sleeps first."""

    name = "echo"

    def __init__(self) -> None:
        self.seen: list[object] = []
        self.gate: anyio.Event | None = None

    async def receive(self, message: object) -> object:
        self.seen.append(message)
        if message == "boom":
            raise ValueError("boom")
        if isinstance(message, tuple) and message[0] == "sleep":
            await anyio.sleep(message[1])
        if message == "wait" and self.gate is not None:
            await self.gate.wait()
        return message

    def reservations(self) -> int:
        return len(self.seen)


async def test_ask_returns_the_reply_and_tell_delivers_in_order() -> None:
    actor = Echo()
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: actor, name="echo")
        await ref.tell("a")
        ref.tell_nowait("b")
        assert await ref.ask("c") == "c"
        assert actor.seen == ["a", "b", "c"]
        stats = ref.statistics()
        assert stats.processed == 3 and stats.running and stats.reservations == 3
        assert stats.mailbox_depth == 0 and stats.restarts == 0
        cell.close()


async def test_full_mailbox_pushes_back_and_tell_nowait_refuses() -> None:
    actor = Echo()
    actor.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: actor, name="echo", mailbox_size=2)
        ref.tell_nowait("wait")  # taken by the actor, which blocks on the gate
        await eventually(lambda: actor.seen == ["wait"], what="the actor took 'wait'")
        ref.tell_nowait(1)
        ref.tell_nowait(2)
        assert ref.statistics().mailbox_depth == 2
        with pytest.raises(MailboxFull):
            ref.tell_nowait(3)
        # tell waits while full; cancelled, it leaves the mailbox unchanged
        with anyio.move_on_after(0.02) as scope:
            await ref.tell(3)
        assert scope.cancelled_caught
        assert ref.statistics().mailbox_depth == 2
        actor.gate.set()
        await ref.tell(4)  # room again
        assert await ref.ask("end") == "end"
        assert actor.seen == ["wait", 1, 2, 4, "end"]
        cell.close()


async def test_ask_times_out_with_ask_timeout() -> None:
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, Echo, name="echo")
        with pytest.raises(AskTimeout):
            await ref.ask(("sleep", 0.2), timeout=0.02)
        cell.close()
        tg.cancel_scope.cancel()


async def test_crash_propagates_unsupervised_and_asker_gets_actor_stopped() -> None:
    caught: list[BaseException] = []
    with pytest.raises(BaseExceptionGroup) as info:
        async with anyio.create_task_group() as tg:
            ref, _ = await spawn(tg, Echo, name="echo")

            async def asker() -> None:
                try:
                    await ref.ask("boom")
                except ActorStopped as exc:
                    caught.append(exc)

            tg.start_soon(asker)
    assert any(isinstance(e, ValueError) for e in info.value.exceptions)  # not swallowed
    assert caught and isinstance(caught[0].__cause__, ValueError)


async def test_cell_keeps_its_mailbox_across_incarnations() -> None:
    cell = ActorCell("echo", mailbox_size=8)
    actors: list[Echo] = []

    def factory() -> Echo:
        actors.append(Echo())
        return actors[-1]

    crashed: list[BaseException] = []

    async def first_run(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await cell.run(factory, task_status=task_status)
        except ActorKilled as exc:
            crashed.append(exc)

    async with anyio.create_task_group() as tg:
        await tg.start(first_run)
        cell.ref.tell_nowait(Crash("test"))
        cell.ref.tell_nowait("after")  # queued behind the crash: for the next incarnation
        await eventually(lambda: not cell.running and crashed, what="the first run crashed")
        stats = cell.statistics()
        assert stats.crashes == 1 and "ActorKilled" in stats.last_crash
        await tg.start(cell.run, factory)
        assert await cell.ref.ask("x") == "x"
        assert actors[1].seen == ["after", "x"]
        assert cell.statistics().restarts == 1
        cell.close()


async def test_kill_crashes_the_running_incarnation() -> None:
    cell = ActorCell("echo")
    outcome: list[BaseException] = []
    actors: list[Echo] = []

    def factory() -> Echo:
        actors.append(Echo())
        return actors[-1]

    async def run_once() -> None:
        try:
            await cell.run(factory)
        except ActorKilled as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_once)
        await eventually(lambda: cell.running, what="the cell running")
        pending = []

        async def asker() -> None:
            try:
                await cell.ref.ask(("sleep", 1.0))
            except ActorStopped as exc:
                pending.append(exc)

        tg.start_soon(asker)
        await eventually(lambda: actors[0].seen == [("sleep", 1.0)], what="the ask taken")
        assert cell.kill("test")
        await eventually(lambda: outcome and pending, what="the run killed, the asker told")
    assert isinstance(outcome[0], ActorKilled) and isinstance(pending[0], ActorStopped)
    assert not cell.kill("again")  # nothing running
    cell.close()


async def test_closed_cell_refuses_messages_and_fails_queued_asks() -> None:
    cell = ActorCell("echo")
    cell.close()
    with pytest.raises(ActorStopped):
        cell.ref.tell_nowait("x")
    with pytest.raises(ActorStopped):
        await cell.ref.ask("x", timeout=0.1)
    with pytest.raises(ActorStopped):
        await cell.run(Echo)


async def test_clean_stop_drains_the_mailbox() -> None:
    actor = Echo()
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: actor, name="echo")
        ref.tell_nowait(1)
        ref.tell_nowait(2)
        cell.close()
    assert actor.seen == [1, 2]
    assert not cell.running


class SlowStart(Actor):
    async def on_start(self, ctx: ActorContext) -> None:
        await anyio.sleep(1)


async def test_start_timeout_is_an_error_not_a_hang() -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(StartTimeout):
            await spawn(tg, SlowStart, name="slow", start_timeout=0.02)


class Ticking(Actor):
    tick_interval = 0.005

    def __init__(self) -> None:
        self.ticks = 0

    async def on_tick(self) -> None:
        self.ticks += 1


@pytest.fixture(params=list(TickSource), ids=[t.value for t in TickSource])
def tick_source(request) -> TickSource:
    """Both sources of ticks: the asyncio timer callback and the ticker task (the fallback
    for other backends), given to the cell."""
    return request.param


async def test_ticks_arrive_when_idle(tick_source) -> None:
    actor = Ticking()
    async with anyio.create_task_group() as tg:
        _, cell = await spawn(tg, lambda: actor, name="ticking", ticks=tick_source)
        await advance(0.05)  # ten intervals of fake time, the actor idle throughout
        cell.close()
    assert actor.ticks in (9, 10)  # one per interval (the last may fall on the close)


class TicksWhileBusy(Ticking):
    """Wants ticks only while `busy` (set by a message, cleared by its third tick)."""

    def __init__(self) -> None:
        super().__init__()
        self.busy = False

    def wants_tick(self) -> bool:
        return self.busy

    async def receive(self, message: object) -> None:
        self.busy = True

    async def on_tick(self) -> None:
        self.ticks += 1
        if self.ticks % 3 == 0:
            self.busy = False


async def test_ticks_stop_while_unwanted_and_resume_after_a_message(tick_source) -> None:
    actor = TicksWhileBusy()
    async with anyio.create_task_group() as tg:
        ref, cell = await spawn(tg, lambda: actor, name="ticking", ticks=tick_source)
        await advance(0.04)
        assert actor.ticks == 0  # never wanted: no tick in 8 intervals
        for round_ in (1, 2):
            await ref.ask("work")
            await eventually(lambda: not actor.busy, 1.0, "three ticks while busy")
            assert actor.ticks == 3 * round_
            await advance(0.04)  # parked: 8 intervals pass without a tick
            assert actor.ticks == 3 * round_
        cell.close()


def test_a_cell_takes_only_a_tick_source() -> None:
    with pytest.raises(TypeError, match="TickSource"):
        ActorCell("a", ticks=True)  # type: ignore[arg-type]  # the old module flag's value
    assert ActorCell("a", ticks=TickSource.TASK).statistics().running is False
