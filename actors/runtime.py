"""A small actor runtime on anyio: bounded mailboxes, tell/ask, one task group per actor.

An `ActorCell` owns a mailbox (a bounded queue, so a full mailbox pushes back on senders)
and runs *incarnations* of an actor one after another:
each `run` builds a fresh `Actor` from a factory, opens the actor's own task group, reports
started, and handles messages one at a time until the mailbox is closed (a clean stop), the
run is cancelled (a shutdown), or the actor raises (a crash, raised out of `run` for the
supervisor to count; never swallowed). The mailbox outlives incarnations: messages queued
for a crashed actor are handled by the next one; the message being handled when it crashed
is lost and its asker gets `ActorStopped`. An `ActorRef` is the only handle on a cell;
it comes from the cell (or from `spawn`), never from the actor itself.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.lowlevel import checkpoint, checkpoint_if_cancelled

from actors.errors import ActorKilled, ActorStopped, AskTimeout, MailboxFull, StartTimeout

_log = structlog.get_logger("gpu_binder.runtime")

DEFAULT_ASK_TIMEOUT = 10.0

_FAIRNESS = 32
"""Messages an actor handles in a row from a non-empty mailbox before it yields once."""


class TickSource(enum.Enum):
    """Where an actor's `Tick`s come from, chosen per `ActorCell`.

    TIMER: on asyncio, a timer callback (`loop.call_later`), so arming a tick costs no task
    wake-up; on another anyio backend it falls back to TASK. TASK: a ticker task in the
    actor's task group, on any backend. Both send the same ticks (the runtime's tests run
    both)."""

    TIMER = "timer"
    TASK = "task"


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    """A frozen view of one actor for tests, metrics and bench/.

    `mailbox_depth` messages are queued (not counting one being handled); `processed`
    counts handled messages over all incarnations; `restarts` counts incarnations after
    the first; `crashes` counts runs that ended by an exception (kills included);
    `reservations` is what the actor reports holding (capacity holds for a NodeActor,
    requests in flight for the StatusPipeline)."""

    name: str
    mailbox_depth: int
    mailbox_capacity: int
    processed: int
    restarts: int
    crashes: int
    reservations: int
    running: bool
    incarnation: int
    last_crash: str | None


@dataclass(frozen=True, slots=True)
class Crash:
    """A message that makes the receiving actor crash with `ActorKilled(reason)` when it is
    handled (after the messages queued before it). For chaos tests and operators."""

    reason: str = "crash requested"


@dataclass(frozen=True, slots=True)
class Tick:
    """Sent by the runtime to an actor every `Actor.tick_interval` seconds (dropped when the
    mailbox is full: a busy actor gets its ticks from its own traffic)."""


@dataclass(frozen=True, slots=True)
class ActorContext:
    """What an incarnation gets on start: its own reference, its own task group (children
    started there die with the incarnation; an exception in one crashes the actor) and its
    incarnation number (1 for the first run of the cell, +1 per restart)."""

    ref: ActorRef
    task_group: TaskGroup
    incarnation: int


class Actor:
    """Base class of actors. Subclasses override what they need.

    `receive` handles one message and returns the reply for `ask` (ignored for `tell`); an
    exception raised from it crashes the actor. Refusals are replies (values), not
    exceptions. Nothing else runs concurrently with `receive` except the actor's own
    children in `ActorContext.task_group`, which share its state on the same event loop.
    """

    name: str = "actor"
    tick_interval: float | None = None
    """Seconds between `Tick` messages, None for no ticks."""

    def log_context(self) -> Mapping[str, Any]:
        """Context variables bound (structlog contextvars) for the whole incarnation."""
        return {"actor": self.name}

    async def on_start(self, ctx: ActorContext) -> None:
        """Runs before the incarnation reports started (e.g. rebuild state from a view)."""

    async def receive(self, message: Any) -> Any:
        """Handle one message; the return value is the reply to `ask`."""
        raise NotImplementedError

    async def on_tick(self) -> None:
        """Handle a `Tick`."""

    def wants_tick(self) -> bool:
        """Whether ticks are wanted now (default: always). While it returns False the
        runtime sends none and keeps no timer (on asyncio the ticks come from a timer
        callback; on another backend from a ticker task that parks), and it asks again
        after every message the actor handles, so ticks resume within `tick_interval` of
        the message that made them wanted. An actor with nothing to time (e.g. a ledger
        without holds) then costs no wake-up per interval."""
        return True

    async def on_stop(self) -> None:
        """Runs after a clean stop (mailbox closed and drained), before the actor's task
        group waits for its children: stop long-running children here."""

    def reservations(self) -> int:
        """What `ActorStatistics.reservations` reports."""
        return 0


class _Gather:
    """The replies of one `ask` or `ask_all`: one slot per ask, one event when every slot
    is in."""

    __slots__ = ("event", "results", "missing")

    def __init__(self, n: int) -> None:
        self.event = anyio.Event()
        self.results: list[Any] = [_NO_REPLY] * n
        self.missing = n
        if n == 0:
            self.event.set()


class _Slot:
    """The reply handle of one envelope: `set(value)` or `fail(error)`, first one wins."""

    __slots__ = ("_gather", "_index")

    def __init__(self, gather: _Gather, index: int) -> None:
        self._gather = gather
        self._index = index

    def set(self, value: Any) -> None:
        g = self._gather
        if g.results[self._index] is _NO_REPLY:
            g.results[self._index] = value
            g.missing -= 1
            if g.missing == 0:
                g.event.set()

    def fail(self, error: BaseException) -> None:
        self.set(_Failed(error))


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


_NO_REPLY = object()


@dataclass(slots=True)
class _Envelope:
    message: Any
    reply: _Slot | None = None


@dataclass(slots=True)
class _CellState:
    processed: int = 0
    wake: anyio.Event | None = None  # set by senders while the loop waits on an empty mailbox
    ticker: anyio.CancelScope | None = None  # of the ticker task of this incarnation, if any
    tick_parked: anyio.Event | None = None  # set to resume a ticker parked while unwanted
    tick_timer: asyncio.TimerHandle | None = None  # the next tick's timer (asyncio), if any
    loop: asyncio.AbstractEventLoop | None = None  # the asyncio loop of the incarnation
    incarnation: int = 0
    crashes: int = 0
    running: bool = False
    closed: bool = False
    last_crash: str | None = None
    actor: Actor | None = None
    scope: anyio.CancelScope | None = None
    kill_reason: str | None = None
    current: _Envelope | None = None


class ActorRef:
    """The handle on an actor: `tell`, `tell_nowait`, `ask`, `statistics`. Thin: all state
    lives in the cell. Stays valid across restarts of the actor."""

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def name(self) -> str:
        return self._cell.name

    def tell_nowait(self, message: Any) -> None:
        """Queue `message` without waiting.

        Raises `MailboxFull` when the mailbox is full, `ActorStopped` when the actor is
        stopped for good. On either error nothing was queued."""
        self._cell._send_nowait(_Envelope(message))

    async def tell(self, message: Any) -> None:
        """Queue `message`, waiting while the mailbox is full (back-pressure).

        Raises `ActorStopped` when the actor is stopped for good. Cancellation: either the
        message is queued or you get the cancellation and the mailbox is unchanged. Bound
        the wait with a cancel scope (`anyio.fail_after`) where a full mailbox must not
        stall you."""
        await self._cell._send(_Envelope(message))

    async def ask(self, message: Any, *, timeout: float = DEFAULT_ASK_TIMEOUT) -> Any:
        """Queue `message` and wait for the actor's reply; return the reply.

        Raises `AskTimeout` when queueing plus handling took longer than `timeout` seconds
        (the message may still be handled later), `ActorStopped` when the actor is stopped
        for good or crashed while holding the message (`__cause__` is the crash).
        Cancellation: the message may already be queued and will be handled; its reply is
        dropped. A caller that must not leak what the reply grants (e.g. a capacity hold)
        sends the compensating message in its cancellation handler."""
        (reply,) = await _gather(((self, message),), timeout)
        if isinstance(reply, _Failed):
            raise reply.error
        return reply

    def statistics(self) -> ActorStatistics:
        """A frozen view of the actor now."""
        return self._cell.statistics()

    def __repr__(self) -> str:
        return f"ActorRef({self.name!r})"


class ActorCell:
    """Owns one actor's mailbox and runs its incarnations (see the module docstring).

    The supervisor calls `run` once per incarnation, `kill` to crash the running one,
    `close` to stop for good. Not for use by actors themselves: they get an `ActorRef`.

    The mailbox is a deque of at most `mailbox_size` envelopes that only the running
    incarnation's loop takes from; senders that find it full wait (`tell`) or get
    `MailboxFull` (`tell_nowait`); once closed, senders get `ActorStopped`.
    """

    def __init__(self, name: str, *, mailbox_size: int = 64,
                 ticks: TickSource = TickSource.TIMER) -> None:
        if mailbox_size < 1:
            raise ValueError("mailbox_size must be >= 1")
        if not isinstance(ticks, TickSource):
            raise TypeError(f"ticks must be a TickSource, not {ticks!r}")
        self.name = name
        self._ticks = ticks
        self._capacity = mailbox_size
        self._box: deque[_Envelope] = deque()
        self._space: anyio.Event | None = None  # set when a full mailbox gets room (or closes)
        self._state = _CellState()
        self.ref = ActorRef(self)

    # -- sending ------------------------------------------------------------------------

    def _send_nowait(self, env: _Envelope) -> None:
        if self._state.closed:
            raise ActorStopped(f"{self.name}: stopped")
        box = self._box
        if len(box) >= self._capacity:
            raise MailboxFull(f"{self.name}: mailbox full ({self._capacity})")
        box.append(env)
        wake = self._state.wake
        if wake is not None:
            self._state.wake = None
            wake.set()

    async def _send(self, env: _Envelope) -> None:
        await checkpoint()  # a send is a checkpoint, room or not
        while True:
            if self._state.closed:
                raise ActorStopped(f"{self.name}: stopped")
            if len(self._box) < self._capacity:
                self._send_nowait(env)
                return
            space = self._space
            if space is None:
                space = self._space = anyio.Event()
            await space.wait()  # cancelled here: nothing was queued

    def _took(self) -> None:
        """An envelope left the mailbox: let senders waiting for room try again."""
        space = self._space
        if space is not None:
            self._space = None
            space.set()

    def _wake(self) -> None:
        wake = self._state.wake
        if wake is not None:
            self._state.wake = None
            wake.set()

    # -- lifecycle ----------------------------------------------------------------------

    async def run(
        self,
        factory: Callable[[], Actor],
        *,
        start_timeout: float = 30.0,
        task_status: TaskStatus[ActorRef] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one incarnation of the actor built by `factory()`; report started (with the
        `ActorRef`) once its `on_start` returned.

        Returns when the mailbox was closed and drained (clean stop). Raises what the actor
        raised (a crash; a `Crash` message or `kill` raises `ActorKilled`), `StartTimeout`
        when `on_start` took longer than `start_timeout`, `ActorStopped` when the cell is
        already closed. Cancellation: the incarnation stops at its next await; the message
        being handled is lost and its asker gets `ActorStopped`.
        """
        actor = self._begin(factory)
        try:
            await self._incarnation(actor, start_timeout, task_status)
        except BaseException as exc:
            error = self._crashed(exc)
            if error is not exc:  # unwrap the task group's one-exception group
                error.__suppress_context__ = True
                raise error
            raise
        finally:
            self._end()

    def _begin(self, factory: Callable[[], Actor]) -> Actor:
        """Build the next incarnation's actor and mark it running. Raises `ActorStopped`
        when the cell is closed, RuntimeError when an incarnation is running, and what
        `factory` raises (nothing is marked then)."""
        st = self._state
        if st.closed:
            raise ActorStopped(f"{self.name}: closed")
        if st.running:
            raise RuntimeError(f"{self.name}: already running")
        actor = factory()
        self._event_class = type(anyio.Event())
        try:
            st.loop = asyncio.get_running_loop() if self._ticks is TickSource.TIMER else None
        except RuntimeError:  # another anyio backend: ticks come from a ticker task
            st.loop = None
        st.incarnation += 1
        st.running = True
        st.actor = actor
        st.kill_reason = None
        return actor

    async def _incarnation(self, actor: Actor, start_timeout: float,
                           task_status: TaskStatus[ActorRef]) -> None:
        """The incarnation in its own task group: `on_start` (within `start_timeout`, else
        `StartTimeout`), started reported, the message loop until the mailbox is closed and
        drained, then `on_stop`. Raises `ActorKilled` when it was killed."""
        st = self._state
        with structlog.contextvars.bound_contextvars(**actor.log_context()):
            async with anyio.create_task_group() as tg:
                st.scope = tg.cancel_scope
                ctx = ActorContext(ref=self.ref, task_group=tg, incarnation=st.incarnation)
                try:
                    with anyio.fail_after(start_timeout):
                        await actor.on_start(ctx)
                except TimeoutError:
                    raise StartTimeout(f"{self.name}: not started in {start_timeout}s") from None
                self._tick_if_wanted(actor, tg)
                task_status.started(self.ref)
                await self._loop(actor, tg)
                # Clean stop: end the ticker, let the actor wind its children down;
                # the task group then waits for them (the supervisor bounds that wait).
                if st.ticker is not None:
                    st.ticker.cancel()
                self._cancel_tick_timer()
                await actor.on_stop()
        if st.kill_reason is not None:
            raise ActorKilled(f"{self.name}: killed: {st.kill_reason}")

    def _crashed(self, exc: BaseException) -> BaseException:
        """The incarnation ended with `exc`: count it as a crash unless it is a
        cancellation, fail the asker of the message being handled with `ActorStopped`
        (caused by the error), and return the error to raise (`exc` out of its task
        group's one-exception group)."""
        st = self._state
        error = _unwrap(exc)
        if not isinstance(error, anyio.get_cancelled_exc_class()):
            st.crashes += 1
            st.last_crash = f"{type(error).__name__}: {error}"
        if st.current is not None and st.current.reply is not None:
            stopped = ActorStopped(f"{self.name}: stopped while handling the message")
            stopped.__cause__ = error
            st.current.reply.fail(stopped)
        return error

    def _end(self) -> None:
        """The incarnation is over, however it ended: nothing of it stays in the cell; a
        closed cell fails what is still queued."""
        st = self._state
        st.running = False
        st.current = st.scope = st.actor = st.wake = st.ticker = st.tick_parked = None
        self._cancel_tick_timer()
        if st.closed:
            self._drain_closed()

    def _tick_if_wanted(self, actor: Actor, tg: TaskGroup) -> None:
        """When the actor has ticks and wants them: on asyncio, arm the timer of the next
        tick unless it is armed (`_tick_due`); elsewhere start the ticker task (once per
        incarnation) or resume it if it is parked."""
        st = self._state
        if actor.tick_interval is None:
            return
        if st.loop is not None:
            if st.tick_timer is None and actor.wants_tick():
                st.tick_timer = st.loop.call_later(actor.tick_interval, self._tick_due, actor)
            return
        if st.ticker is None:
            if actor.wants_tick():
                scope = st.ticker = anyio.CancelScope()
                tg.start_soon(self._ticker, actor, actor.tick_interval, scope)
        elif st.tick_parked is not None and actor.wants_tick():
            parked, st.tick_parked = st.tick_parked, None
            parked.set()

    def _tick_due(self, actor: Actor) -> None:
        """The tick timer fired (asyncio): send a `Tick` and arm the next one while the
        actor wants ticks; when it does not, nothing stays armed (no timer, no wake-up)
        until the loop arms it again after a message that makes ticks wanted. A timer
        callback, not a task: a tick costs no task wake-up of its own. Should `wants_tick`
        raise here, the Tick is sent and the loop's next call raises it in the actor."""
        st = self._state
        st.tick_timer = None
        if st.actor is not actor or st.loop is None:
            return  # the incarnation is over
        try:
            wanted = actor.wants_tick()
        except Exception:  # noqa: BLE001 - raised again in the actor's own task
            wanted = True
        if not wanted:
            return
        try:
            self._send_nowait(_Envelope(Tick()))
        except (MailboxFull, ActorStopped):
            pass
        if not st.closed:
            st.tick_timer = st.loop.call_later(actor.tick_interval, self._tick_due, actor)  # type: ignore[arg-type]

    def _cancel_tick_timer(self) -> None:
        timer = self._state.tick_timer
        if timer is not None:
            self._state.tick_timer = None
            timer.cancel()

    async def _ticker(self, actor: Actor, interval: float, scope: anyio.CancelScope) -> None:
        """A `Tick` every `interval` while `actor.wants_tick()`; while it does not, the task
        parks on an event (no timer, no wake-ups) until the loop resumes it after a message
        that makes ticks wanted, so ticks resume within `interval` of that message."""
        st = self._state
        try:
            with scope:
                while True:
                    if not actor.wants_tick():
                        parked = st.tick_parked = anyio.Event()
                        await parked.wait()
                        continue
                    await anyio.sleep(interval)
                    if not actor.wants_tick():
                        continue
                    try:
                        self._send_nowait(_Envelope(Tick()))
                    except (MailboxFull, ActorStopped):
                        pass
        finally:
            if st.ticker is scope:
                st.ticker = None
                st.tick_parked = None

    async def _receive(self) -> _Envelope:
        """The next envelope: taken at once when one is queued (after a cancellation
        check), else waited for on an event the senders set (the wait is the cancellation
        check then), so a cancelled incarnation takes no further message. Raises
        EndOfStream once the mailbox is closed and drained."""
        box = self._box
        if box:
            await checkpoint_if_cancelled()
        else:
            while not box:
                if self._state.closed:
                    raise anyio.EndOfStream
                wake = self._state.wake = self._event()
                try:
                    await wake.wait()
                finally:
                    self._state.wake = None
        env = box.popleft()
        if self._space is not None:
            self._took()
        return env

    _event_class: type[anyio.Event] | None = None

    def _event(self) -> anyio.Event:
        """A fresh `anyio.Event` of the running backend's class (built directly: the
        backend lookup of `anyio.Event()` costs more than the event; looked up once per
        incarnation, see `run`)."""
        cls = self._event_class
        return cls() if cls is not None else anyio.Event()

    async def _loop(self, actor: Actor, tg: TaskGroup) -> None:
        st = self._state
        in_a_row = 0
        while True:
            if in_a_row >= _FAIRNESS:  # a busy mailbox still lets other tasks run
                in_a_row = 0
                await checkpoint()
            try:
                env = await self._receive()
            except anyio.EndOfStream:
                return
            in_a_row += 1
            st.current = env
            message = env.message
            if isinstance(message, Crash):
                st.kill_reason = message.reason
                raise ActorKilled(f"{self.name}: {message.reason}")
            if isinstance(message, Tick):
                await actor.on_tick()
                st.current = None
            else:
                value = await actor.receive(message)
                st.processed += 1
                st.current = None
                if env.reply is not None:
                    env.reply.set(value)
            if st.tick_timer is None and (st.ticker is None or st.tick_parked is not None):
                self._tick_if_wanted(actor, tg)

    def kill(self, reason: str = "killed") -> bool:
        """Crash the running incarnation now (it stops at its next await) so that `run`
        raises `ActorKilled`. Returns False when nothing is running. Like Erlang's
        `exit(Pid, kill)`: the actor gets no chance to clean up beyond its `finally`s."""
        st = self._state
        if not st.running or st.scope is None:
            return False
        st.kill_reason = reason
        st.scope.cancel()
        return True

    def close(self) -> None:
        """Stop for good: new messages are refused with `ActorStopped`; the running
        incarnation (if any) handles what is queued and returns; queued asks left after it
        (or with nothing running) get `ActorStopped`. Idempotent."""
        st = self._state
        if st.closed:
            return
        st.closed = True
        self._wake()  # a waiting loop finds the mailbox closed
        self._took()  # senders waiting for room find it closed
        if not st.running:
            self._drain_closed()

    def _drain_closed(self) -> None:
        box = self._box
        while box:
            env = box.popleft()
            if env.reply is not None:
                env.reply.fail(ActorStopped(f"{self.name}: stopped"))

    @property
    def running(self) -> bool:
        return self._state.running

    @property
    def closed(self) -> bool:
        return self._state.closed

    def statistics(self) -> ActorStatistics:
        st = self._state
        actor = st.actor
        return ActorStatistics(
            name=self.name,
            mailbox_depth=len(self._box),
            mailbox_capacity=self._capacity,
            processed=st.processed,
            restarts=max(0, st.incarnation - 1),
            crashes=st.crashes,
            reservations=actor.reservations() if actor is not None else 0,
            running=st.running,
            incarnation=st.incarnation,
            last_crash=st.last_crash,
        )


async def ask_all(
    asks: Sequence[tuple[ActorRef, Any]], *, timeout: float = DEFAULT_ASK_TIMEOUT
) -> list[Any]:
    """Scatter-gather: queue every `(ref, message)` of `asks`, then wait once for all the
    replies, the whole call bounded by `timeout` seconds. Returns, in the order of `asks`,
    each reply or, in its place, the exception `ActorRef.ask` would have raised:
    `AskTimeout` (no reply in time; the message may still be handled), `ActorStopped`.
    Never raises those. The cost of one `ask` for the whole batch: one event, one deadline.
    Cancellation: some messages may be queued and will be handled; replies are dropped (a
    caller that must not leak what a reply grants compensates, as with `ask`)."""
    return [r.error if isinstance(r, _Failed) else r for r in await _gather(asks, timeout)]


async def _gather(asks: Sequence[tuple[ActorRef, Any]], timeout: float) -> list[Any]:
    """Queue every ask, wait once (bounded by `timeout`) for every reply. Each result is
    the reply or `_Failed(AskTimeout | ActorStopped)`."""
    gather = _Gather(len(asks))
    await checkpoint_if_cancelled()
    with anyio.CancelScope(deadline=anyio.current_time() + timeout):
        for i, (ref, message) in enumerate(asks):
            slot = _Slot(gather, i)
            env = _Envelope(message, slot)
            try:
                try:
                    ref._cell._send_nowait(env)  # the common case: room in the mailbox
                except MailboxFull:
                    await ref._cell._send(env)  # back-pressure, under the same deadline
            except ActorStopped as exc:
                slot.fail(exc)
        await gather.event.wait()
    return [_Failed(AskTimeout(f"{ref.name}: no reply to {type(message).__name__} in {timeout}s"))
            if value is _NO_REPLY else value
            for (ref, message), value in zip(asks, gather.results)]


def _unwrap(exc: BaseException) -> BaseException:
    """The single leaf of (nested) one-exception groups, else `exc` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def spawn(
    task_group: TaskGroup,
    factory: Callable[[], Actor],
    *,
    name: str | None = None,
    mailbox_size: int = 64,
    start_timeout: float = 30.0,
    ticks: TickSource = TickSource.TIMER,
) -> tuple[ActorRef, ActorCell]:
    """Start one unsupervised incarnation of `factory()` in `task_group` and return its
    reference and cell once it reported started. A crash propagates into `task_group`
    (nothing restarts it); `cell.close()` stops it cleanly. Raises what `on_start` raised,
    or `StartTimeout`. `mailbox_size` and `ticks` go to the `ActorCell`."""
    cell = ActorCell(name or getattr(factory, "__name__", "actor"), mailbox_size=mailbox_size,
                     ticks=ticks)
    ref = await task_group.start(_run_cell, cell, factory, start_timeout)
    return ref, cell


async def _run_cell(
    cell: ActorCell,
    factory: Callable[[], Actor],
    start_timeout: float,
    *,
    task_status: TaskStatus[ActorRef] = anyio.TASK_STATUS_IGNORED,
) -> None:
    await cell.run(factory, start_timeout=start_timeout, task_status=task_status)


__all__ = [
    "Actor",
    "ActorCell",
    "ActorContext",
    "ActorRef",
    "ActorStatistics",
    "Crash",
    "Tick",
    "TickSource",
    "ask_all",
    "spawn",
]
