"""An OTP-style supervisor on anyio: one-for-one between children, one-for-all within a
group of linked children.

A `ChildSpec` says how to build a child (`start`: a factory of fresh `Actor`s, one per
incarnation), whether to restart it (`permanent`: always; `transient`: only after a
crash; `temporary`: never) and how long a graceful shutdown may take (`shutdown`
seconds, None for a brutal kill). A crash (an exception out of the actor's run, a kill
included) restarts only that child, after an exponential backoff; a clean return or a
cancellation is a shutdown. More than `max_restarts` restarts within `max_seconds`
(restart intensity) makes the supervisor stop all its children and raise
`SupervisorEscalation` out of its `async with` block, so the process can exit non-zero.

`start_group` starts several children as one *group* (OTP's one-for-all sub-tree, kept
flat): they run as one incarnation, started in order, and when any of them crashes (or
exits) the others are stopped too (cancelled) and the whole group is restarted, after one
backoff, counting one restart against the intensity. It is for children whose states only
make sense together: the binder's coordinator and its status pipeline (the flights the
pipeline writes are reservations the coordinator made; losing either half loses what the
other relies on, so both start again and the new coordinator recovers from the view, B7).
Every child of a group is `permanent`. Mailboxes outlive incarnations as for any child:
a group's members drop what the previous incarnation queued for them when it matters
(the pipeline does, see `actors.status_pipeline`).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, Sequence

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
    started by then is a crash. `kind`: what sort of child this is, an enum member of the
    owner's (e.g. `supervisor.binder.ChildKind`) or None; the supervisor never reads it, it
    only lets the owner select children (`Supervisor.child_ids(kind)`,
    `SupervisorStatistics.kinds`) without parsing their ids."""

    id: str
    start: Callable[[], Actor]
    restart: Restart = Restart.PERMANENT
    shutdown: float | None = 5.0
    mailbox_size: int = 64
    start_timeout: float = 10.0
    kind: enum.Enum | None = None


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
    """A frozen view: every child's statistics by id, each child's spec `kind` by id, total
    restarts, escalated or not."""

    children: dict[str, ActorStatistics]
    kinds: dict[str, enum.Enum | None]
    restarts: int
    escalated: bool


class _Child:
    __slots__ = ("spec", "cell", "ended")

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.cell = ActorCell(spec.id, mailbox_size=spec.mailbox_size)
        self.ended = anyio.Event()  # set when the current incarnation's run is over


class _Group:
    """Children that run, crash and restart together (one member: a plain child)."""

    __slots__ = ("members", "scope", "done", "terminating")

    def __init__(self, specs: Sequence[ChildSpec]) -> None:
        self.members = [_Child(spec) for spec in specs]
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.terminating = False

    @property
    def ids(self) -> list[str]:
        return [m.spec.id for m in self.members]


class Supervisor:
    """One-for-one supervisor (one-for-all within a group). Use as `async with
    Supervisor(config) as sup:`; children run in its task group. Leaving the block normally
    stops the children gracefully, in reverse start order; an escalation raises
    `SupervisorEscalation` from the block.
    """

    def __init__(self, config: SupervisorConfig | None = None, *, name: str = "supervisor") -> None:
        self._cfg = config or SupervisorConfig()
        self.name = name
        self._children: dict[str, _Child] = {}
        self._groups: dict[str, _Group] = {}  # by member id
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
        return (await self._start([spec]))[0]

    async def start_group(self, specs: Sequence[ChildSpec]) -> list[ActorRef]:
        """Start `specs` as one group (one-for-all, see the module docstring), in order,
        each started before the next is built; return their references (in order) once
        every one reported started. Raises ValueError for an empty group, a duplicate id
        or a member that is not `permanent`, or what a first start raised (the members
        already started are stopped; none is kept)."""
        if not specs:
            raise ValueError("a group needs at least one child")
        if len(specs) > 1 and any(s.restart is not Restart.PERMANENT for s in specs):
            raise ValueError("every child of a group is permanent")
        return await self._start(specs)

    async def _start(self, specs: Sequence[ChildSpec]) -> list[ActorRef]:
        if self._tg is None:
            raise RuntimeError("supervisor is not running (use `async with`)")
        ids = [s.id for s in specs]
        if len(set(ids)) != len(ids) or any(i in self._children for i in ids):
            raise ValueError(f"child id already exists: {ids}")
        group = _Group(specs)
        for m in group.members:
            self._children[m.spec.id] = m
            self._groups[m.spec.id] = group
        try:
            return await self._tg.start(self._group_loop, group)
        except BaseException:
            self._forget(group)
            raise

    def _forget(self, group: _Group) -> None:
        for m in group.members:
            if self._children.get(m.spec.id) is m:
                del self._children[m.spec.id]
                del self._groups[m.spec.id]
            m.cell.close()

    async def terminate_child(self, child_id: str) -> None:
        """Stop a child for good (with its whole group: the members in reverse start
        order): its mailbox is closed (new messages get `ActorStopped`), it handles what
        is queued and stops; after `spec.shutdown` seconds (at once when None) the group's
        members still running are cancelled. Returns when they have stopped. No-op for an
        unknown id."""
        group = self._groups.get(child_id)
        if group is None:
            return
        group.terminating = True
        for m in reversed(group.members):
            m.cell.close()
            if m.spec.shutdown is None:
                group.scope.cancel()
                break
            with anyio.move_on_after(m.spec.shutdown):
                await m.ended.wait()
            if not m.ended.is_set():
                group.scope.cancel()
                break
        group.scope.cancel()
        grace = max(1.0, max((m.spec.shutdown or 0.0) for m in group.members))
        with anyio.move_on_after(grace):
            await group.done.wait()
        self._forget(group)

    def kill(self, child_id: str, reason: str = "killed by supervisor.kill") -> bool:
        """Crash a child now (it is restarted per its spec, with its group). Returns False
        when it is not running (unknown, or between incarnations)."""
        child = self._children.get(child_id)
        return child is not None and child.cell.kill(reason)

    def ref(self, child_id: str) -> ActorRef | None:
        """The child's reference (stable across restarts), or None for an unknown id."""
        child = self._children.get(child_id)
        return child.cell.ref if child is not None else None

    def child_ids(self, kind: enum.Enum | None = None) -> list[str]:
        """The children's ids in start order; with `kind`, only those whose spec has that
        `kind`."""
        if kind is None:
            return list(self._children)
        return [cid for cid, c in self._children.items() if c.spec.kind is kind]

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            children={cid: c.cell.statistics() for cid, c in self._children.items()},
            kinds={cid: c.spec.kind for cid, c in self._children.items()},
            restarts=self._restarts,
            escalated=self._escalation is not None,
        )

    # -- the restart loop -----------------------------------------------------------------------

    async def _group_loop(self, group: _Group, *, task_status: TaskStatus[list[ActorRef]]) -> None:
        crashes_in_a_row = 0
        first = True
        try:
            with group.scope:
                while True:
                    started_at = anyio.current_time()
                    ended = await self._run_once(group, task_status if first else None)
                    if ended is None:  # closed for good between incarnations
                        return
                    first = False
                    child, crash = ended
                    spec = child.spec
                    if group.terminating or any(m.cell.closed for m in group.members):
                        return
                    if crash is None:
                        if spec.restart is not Restart.PERMANENT:
                            return
                        _log.info("child_exited", child=spec.id, restart=spec.restart.value)
                    else:
                        _log.warning("child_crashed", child=spec.id, group=group.ids,
                                     error=f"{type(crash).__name__}: {crash}")
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
                    if group.terminating or any(m.cell.closed for m in group.members):
                        return
                    self._restarts += 1
                    _log.info("child_restart", child=spec.id, group=group.ids,
                              backoff=round(delay, 4), restarts=self._restarts)
        finally:
            for m in group.members:
                m.cell.close()  # never runs again: queued asks fail now, not at their timeout
                m.ended.set()
            group.done.set()

    async def _run_once(
        self, group: _Group, task_status: TaskStatus[list[ActorRef]] | None
    ) -> tuple[_Child, BaseException | None] | None:
        """One incarnation of the group: start the members in order, then wait until one
        of them ends; the first to end (with its crash, None for a clean return) stops the
        others (one-for-all) unless the group is terminating. With `task_status` (the
        first incarnation) report started once all started; a member failing to start
        then raises. None when a member's cell was closed before it could run."""
        ended: list[tuple[_Child, BaseException | None]] = []
        stopped = reported = False
        failed: Exception | None = None
        async with anyio.create_task_group() as tg:
            refs = []
            for m in group.members:
                m.ended = anyio.Event()
                try:
                    refs.append(await tg.start(self._run_member, group, m, ended, tg.cancel_scope))
                except ActorStopped:
                    stopped = True
                except Exception as exc:
                    if task_status is not None:
                        failed = exc  # the first start failed: start_child raises it
                    else:
                        ended.append((m, exc))
                if stopped or ended or failed:
                    tg.cancel_scope.cancel()
                    break
            else:
                if task_status is not None:
                    task_status.started(refs)
                    reported = True
        if failed is not None:
            raise failed
        if task_status is not None and not reported:
            # the first incarnation ended before every member started: start_group raises
            if ended and ended[0][1] is not None:
                raise ended[0][1]
            raise ActorStopped(f"{group.ids}: stopped before starting")
        return ended[0] if ended else None

    async def _run_member(self, group: _Group, child: _Child,
                          ended: list[tuple[_Child, BaseException | None]],
                          scope: anyio.CancelScope, *, task_status: TaskStatus[ActorRef]) -> None:
        relay = _Relay(task_status)
        try:
            await child.cell.run(child.spec.start, start_timeout=child.spec.start_timeout,
                                 task_status=relay)
        except Exception as exc:
            if not relay.reported:
                raise  # a start failure: `tg.start` raises it
            ended.append((child, exc))
            scope.cancel()  # one-for-all: the other members stop too
        else:
            ended.append((child, None))
            if not group.terminating:
                scope.cancel()
        finally:
            child.ended.set()

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
