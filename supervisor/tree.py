"""A one-for-one supervisor in the OTP manner, on anyio.

A `ChildSpec` says how to build a child (`start`: a factory of fresh `Actor`s, one per
incarnation), whether to restart it (`permanent`: always; `transient`: only after a
crash; `temporary`: never) and how long a graceful shutdown may take (`shutdown`
seconds, None for a brutal kill). A crash (an exception out of the actor's run, a kill
included) restarts only that child, after an exponential backoff; a clean return or a
cancellation is a shutdown. More than `max_restarts` restarts within `max_seconds`
(restart intensity) makes the supervisor stop all its children and raise
`SupervisorEscalation` out of its `async with` block, so the process can exit non-zero.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Callable

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from actors.errors import ActorStopped
from actors.runtime import Actor, ActorCell, ActorRef, ActorStatistics

_log = structlog.get_logger("gpu_binder.supervisor")


class Restart(str, enum.Enum):
    """When a child is restarted: PERMANENT always, TRANSIENT after a crash only,
    TEMPORARY never."""

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to run one child. `start()` builds a fresh actor for each incarnation.
    `shutdown`: seconds a graceful stop may take before the child is cancelled (None:
    cancel at once, a brutal kill). `start_timeout`: an incarnation that has not reported
    started by then is a crash."""

    id: str
    start: Callable[[], Actor]
    restart: Restart = Restart.PERMANENT
    shutdown: float | None = 5.0
    mailbox_size: int = 64
    start_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    """Restart intensity (`max_restarts` within `max_seconds`) and the backoff before a
    restart: `backoff_initial` × `backoff_multiplier`^(crashes in a row − 1), at most
    `backoff_max`; a child up for longer than `max_seconds` starts again from the initial
    backoff."""

    max_restarts: int = 5
    max_seconds: float = 10.0
    backoff_initial: float = 0.05
    backoff_multiplier: float = 2.0
    backoff_max: float = 5.0


class SupervisorEscalation(Exception):
    """Restart intensity exceeded: the supervisor stopped every child. `child_id` is the
    child whose crash went over the limit; `__cause__` its last crash."""

    def __init__(self, message: str, *, child_id: str) -> None:
        super().__init__(message)
        self.child_id = child_id


@dataclass(frozen=True, slots=True)
class SupervisorStatistics:
    """A frozen view: every child's statistics by id, total restarts, escalated or not."""

    children: dict[str, ActorStatistics]
    restarts: int
    escalated: bool


class _Child:
    __slots__ = ("spec", "cell", "scope", "done", "terminating")

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.cell = ActorCell(spec.id, mailbox_size=spec.mailbox_size)
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.terminating = False


class Supervisor:
    """One-for-one supervisor. Use as `async with Supervisor(config) as sup:`; children run
    in its task group. Leaving the block normally stops the children gracefully, in reverse
    start order; an escalation raises `SupervisorEscalation` from the block.
    """

    def __init__(self, config: SupervisorConfig | None = None, *, name: str = "supervisor") -> None:
        self._cfg = config or SupervisorConfig()
        self.name = name
        self._children: dict[str, _Child] = {}
        self._restart_times: deque[float] = deque()
        self._restarts = 0
        self._escalation: SupervisorEscalation | None = None
        self._tg: TaskGroup | None = None

    async def __aenter__(self) -> Supervisor:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        if exc_type is None and self._escalation is None:
            for child_id in reversed(list(self._children)):
                await self.terminate_child(child_id)
        else:
            self._tg.cancel_scope.cancel()
        try:
            suppressed = await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            for child in self._children.values():
                child.cell.close()
        if self._escalation is not None:
            raise self._escalation
        return suppressed

    # -- children -------------------------------------------------------------------------------

    async def start_child(self, spec: ChildSpec) -> ActorRef:
        """Start a child and return its reference once its first incarnation reported
        started. Raises ValueError for a duplicate id, or what the first start raised
        (e.g. `StartTimeout`); a child that fails its first start is not kept."""
        if self._tg is None:
            raise RuntimeError("supervisor is not running (use `async with`)")
        if spec.id in self._children:
            raise ValueError(f"child {spec.id!r} already exists")
        child = _Child(spec)
        self._children[spec.id] = child
        try:
            return await self._tg.start(self._child_loop, child)
        except BaseException:
            self._children.pop(spec.id, None)
            child.cell.close()
            raise

    async def terminate_child(self, child_id: str) -> None:
        """Stop a child for good: its mailbox is closed (new messages get `ActorStopped`),
        it handles what is queued and stops; after `spec.shutdown` seconds (at once when
        None) it is cancelled. Returns when it has stopped. No-op for an unknown id."""
        child = self._children.get(child_id)
        if child is None:
            return
        child.terminating = True
        child.cell.close()
        if child.spec.shutdown is None:
            child.scope.cancel()
        else:
            with anyio.move_on_after(child.spec.shutdown):
                await child.done.wait()
            child.scope.cancel()
        with anyio.move_on_after(max(1.0, child.spec.shutdown or 0.0)):
            await child.done.wait()
        self._children.pop(child_id, None)

    def kill(self, child_id: str, reason: str = "killed by supervisor.kill") -> bool:
        """Crash a child now (it is restarted per its spec). Returns False when it is not
        running (unknown, or between incarnations)."""
        child = self._children.get(child_id)
        return child is not None and child.cell.kill(reason)

    def ref(self, child_id: str) -> ActorRef | None:
        """The child's reference (stable across restarts), or None for an unknown id."""
        child = self._children.get(child_id)
        return child.cell.ref if child is not None else None

    def child_ids(self) -> list[str]:
        return list(self._children)

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            children={cid: c.cell.statistics() for cid, c in self._children.items()},
            restarts=self._restarts,
            escalated=self._escalation is not None,
        )

    # -- the restart loop -----------------------------------------------------------------------

    async def _child_loop(self, child: _Child, *, task_status: TaskStatus[ActorRef]) -> None:
        spec = child.spec
        crashes_in_a_row = 0
        first = True
        relay = _Relay(task_status)
        try:
            with child.scope:
                while True:
                    started_at = anyio.current_time()
                    crash: BaseException | None = None
                    try:
                        await child.cell.run(
                            spec.start,
                            start_timeout=spec.start_timeout,
                            task_status=relay if first else anyio.TASK_STATUS_IGNORED,
                        )
                    except ActorStopped:
                        if first:
                            raise
                        return  # closed for good between incarnations
                    except Exception as exc:
                        if first and not relay.reported:
                            raise  # the first start failed: start_child raises it
                        crash = exc
                    first = False
                    if child.terminating or child.cell.closed:
                        return
                    if crash is None:
                        if spec.restart is not Restart.PERMANENT:
                            return
                        _log.info("child_exited", child=spec.id, restart=spec.restart.value)
                    else:
                        _log.warning("child_crashed", child=spec.id, error=f"{type(crash).__name__}: {crash}")
                        if spec.restart is Restart.TEMPORARY:
                            return
                    now = anyio.current_time()
                    if now - started_at > self._cfg.max_seconds:
                        crashes_in_a_row = 0
                    crashes_in_a_row += 1
                    if not self._allow_restart(spec.id, now, crash):
                        return
                    delay = min(
                        self._cfg.backoff_max,
                        self._cfg.backoff_initial * self._cfg.backoff_multiplier ** (crashes_in_a_row - 1),
                    )
                    await anyio.sleep(delay)
                    if child.terminating or child.cell.closed:
                        return
                    self._restarts += 1
                    _log.info("child_restart", child=spec.id, backoff=round(delay, 4),
                              restarts=self._restarts)
        finally:
            child.cell.close()  # never runs again: queued asks fail now, not at their timeout
            child.done.set()

    def _allow_restart(self, child_id: str, now: float, crash: BaseException | None) -> bool:
        times = self._restart_times
        times.append(now)
        while times and now - times[0] > self._cfg.max_seconds:
            times.popleft()
        if len(times) <= self._cfg.max_restarts:
            return True
        error = SupervisorEscalation(
            f"{self.name}: more than {self._cfg.max_restarts} restarts in "
            f"{self._cfg.max_seconds}s (last: {child_id})",
            child_id=child_id,
        )
        error.__cause__ = crash
        _log.error("supervisor_escalation", child=child_id, max_restarts=self._cfg.max_restarts,
                   max_seconds=self._cfg.max_seconds)
        self._escalation = error
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return False


class _Relay:
    """Passes `started` on to the task group and remembers that it was called."""

    def __init__(self, inner: TaskStatus[ActorRef]) -> None:
        self._inner = inner
        self.reported = False

    def started(self, value: ActorRef | None = None) -> None:
        self.reported = True
        self._inner.started(value)
