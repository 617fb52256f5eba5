"""Coordinator: the binder's one decision loop (B2) and its only status writer (B8).

It takes complete requests in batches and plans each batch synchronously and purely
(`model.plan.plan_batch`) on a snapshot of the ClusterView plus the holds of its requests in
flight (`model.hold`: capacity and budget they will take and the view does not show yet),
each decision seeing the holds planned before it. The batch's placements then run the
two-phase protocol on the node actors at once (`actors.reservation.reserve`: prepares, then
commits, scatter-gathered); a request a node actor refused is decided again on a fresh
snapshot and tries its other candidates (`_decide_batch`).
The writes of decided requests run as child tasks in the coordinator's task group, so the
loop goes on deciding: one write per member (`StatusWriter.write_many`, a batch's requests
together) carrying the decided node, the placement and the result at once; the first
applied one is the durable record of the decision (B7). Writes that fail with a conflict
or a transient error are retried with tenacity (bounded). A request in flight keeps its
reservation until its writes are done *and* the view shows them.

On start it adopts the node actors' ledgers (dropping holds of earlier incarnations) and
recovers every request that carries a decision (`bindRequest.node`) but not all its
results, finishing it on that node whatever the capacity now (B7), before deciding anything.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import anyio
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from actors.errors import (
    RETRYABLE_WRITE_ERRORS,
    NotFound,
    RequestWithdrawn,
    TransientWriteError,
    WriteError,
)
from actors.node_actor import Abort, Adopt, Claim, Release
from actors.ports import (
    Clock,
    ClusterView,
    DecisionObserver,
    DeviceKey,
    NodeDirectory,
    StatusWrite,
    StatusWriter,
)
from actors.reservation import Placing, ledger_refusal, reserve, tell_quietly
from actors.runtime import Actor, ActorContext
from model.decide import Placement, Request, decide, describe_placement, find_requests
from model.hold import Hold, Landing, outstanding
from model.plan import (
    Action,
    Answer,
    Finish,
    Recover,
    Requeue,
    Skip,
    plan_batch,
    recorded_node,
    recovery,
)
from model.snapshot import Snapshot
from model.types import Result

_log = structlog.get_logger("gpu_binder.coordinator")

RequestKey = tuple[str, str]
"""(namespace, request id)."""


# -- messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Examine:
    """Request `request_id` of `namespace` changed: read it from the view and act if it is
    complete and lacks a result. Level based: sending it twice is harmless."""

    namespace: str
    request_id: str


@dataclass(frozen=True, slots=True)
class Resync:
    """Scan every device for complete requests lacking a result (level-based safety net)."""


@dataclass(frozen=True, slots=True)
class GetStatus:
    """Reply: `CoordinatorStatus`."""


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    """Counters of this incarnation. `in_flight` requests hold a reservation (writes running,
    stalled, or done but not yet seen in the view); `writing` have a write task running."""

    owner: str
    pending: int
    deferred: int
    in_flight: int
    writing: int
    decided: int
    succeeded: int
    refused: int
    recovered: int
    withdrawn: int
    gave_up: int


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Timeouts and bounds of the coordinator (seconds unless named otherwise).

    `ask_timeout` bounds one prepare/commit; `write_timeout` one StatusWriter call;
    `retry_*` the tenacity policy per write; `max_rounds` decide-and-prepare rounds before a
    request every node actor refused is answered Refused; `requeue_delay` between rounds;
    `stalled_delay` before a request whose writes gave up is tried again; `resync_interval`
    between full scans; `settle_timeout` the longest a finished request waits for the view
    to show its writes (polled every `settle_poll`); `poison_delay` before a
    request on which `model.decide` raised is tried again; `batch_size` requests decided on one snapshot."""

    ask_timeout: float = 5.0
    write_timeout: float = 10.0
    retry_attempts: int = 6
    retry_initial: float = 0.05
    retry_max: float = 2.0
    retry_jitter: float = 0.05
    max_rounds: int = 3
    requeue_delay: float = 0.05
    stalled_delay: float = 1.0
    resync_interval: float = 30.0
    settle_timeout: float = 60.0
    settle_poll: float = 0.05
    poison_delay: float = 30.0
    batch_size: int = 64


@dataclass(slots=True)
class _Flight:
    """A decided request whose writes are running or not yet visible in the view: `node`
    the answer's (None: Refused), `hold` what it lands there (None: nothing lands)."""

    request: Request
    result: Result
    node: str | None
    message: str
    hold: Hold | None
    started_at: float
    written: set[DeviceKey] = field(default_factory=set)  # binds attempted (maybe applied)
    running: bool = True
    stalled: bool = False  # writes gave up: full reservation kept until tried again
    finished_at: float | None = None

    @property
    def landing(self) -> Landing:
        return self.hold.landing if self.hold is not None else ()


@dataclass(slots=True)
class _Answer:
    """A decision that lands nothing (Refused, or Succeeded with nothing to move: B5, B6),
    held until the batch's tentative reservations are known to have held."""

    key: RequestKey
    request: Request
    result: Result
    node: str | None
    message: str
    rule: str
    started: float


class Coordinator(Actor):
    """The coordinator actor (see the module docstring). Build one per incarnation."""

    name = "coordinator"

    def __init__(
        self,
        view: ClusterView,
        writer: StatusWriter,
        nodes: NodeDirectory,
        clock: Clock,
        config: CoordinatorConfig | None = None,
        observer: DecisionObserver | None = None,
    ) -> None:
        self._observer = observer
        self._view = view
        self._writer = writer
        self._nodes = nodes
        self._clock = clock
        self._cfg = config or CoordinatorConfig()
        self._owner = f"coordinator-{uuid.uuid4().hex[:10]}"
        self._pending: dict[RequestKey, None] = {}
        self._deferred: dict[RequestKey, float] = {}
        self._rounds: dict[RequestKey, int] = {}
        self._flights: dict[RequestKey, _Flight] = {}
        self._wakeup = anyio.Event()
        self._next_resync = 0.0
        self._counts: Counter[str] = Counter()
        self._tg: Any = None
        self._wave: list[_Flight] | None = None  # flights of the batch being decided

    def log_context(self) -> Mapping[str, Any]:
        return {"actor": "coordinator"}

    def reservations(self) -> int:
        return len(self._flights)

    # -- lifecycle --------------------------------------------------------------------------

    async def on_start(self, ctx: ActorContext) -> None:
        self._tg = ctx.task_group
        for ref in self._nodes.node_actors().values():
            tell_quietly(ref, Adopt(self._owner))
        complete, _ = find_requests(self._view.devices().values())
        recovered = 0
        snap = self._view.snapshot()
        for req in complete:
            key = (req.namespace, req.id)
            members = self._view.request_members(req.namespace, req.id)
            node, _ = recorded_node(req.id, members)
            if node is not None:
                self._recover(recovery(req, node, members, snap))  # before any new decision (B7)
                recovered += 1
            else:
                self._pending[key] = None
        self._next_resync = anyio.current_time() + self._cfg.resync_interval
        _log.info("coordinator_start", owner=self._owner, incarnation=ctx.incarnation,
                  recovered=recovered, pending=len(self._pending))
        ctx.task_group.start_soon(self._decision_loop)

    async def on_stop(self) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()

    async def receive(self, message: Any) -> Any:
        match message:
            case Examine(namespace, request_id):
                self._pending[(namespace, request_id)] = None
                self._wakeup.set()
                return None
            case Resync():
                self._scan()
                self._wakeup.set()
                return None
            case GetStatus():
                return self.status()
        raise TypeError(f"coordinator: unexpected message {message!r}")

    def status(self) -> CoordinatorStatus:
        c = self._counts
        return CoordinatorStatus(
            owner=self._owner,
            pending=len(self._pending),
            deferred=len(self._deferred),
            in_flight=len(self._flights),
            writing=sum(1 for f in self._flights.values() if f.running),
            decided=c["decided"], succeeded=c["succeeded"], refused=c["refused"],
            recovered=c["recovered"], withdrawn=c["withdrawn"], gave_up=c["gave_up"],
        )

    # -- the decision loop --------------------------------------------------------------------

    async def _decision_loop(self) -> None:
        """The one decision loop (B2): requests are taken in batches and decided one after
        the other, each against the snapshot that includes every reservation made before
        it (`_decide_batch`)."""
        while True:
            now = anyio.current_time()
            for key, due in list(self._deferred.items()):
                if due <= now:
                    del self._deferred[key]
                    self._pending[key] = None
            if now >= self._next_resync:
                self._next_resync = now + self._cfg.resync_interval
                self._scan()
            if not self._pending:
                wake_at = min([self._next_resync, *self._deferred.values()])
                if self._prune():
                    wake_at = min(wake_at, now + self._cfg.settle_poll)
                with anyio.move_on_after(max(0.0, wake_at - now)):
                    await self._wakeup.wait()
                self._wakeup = anyio.Event()
                continue
            self._wakeup = anyio.Event()
            batch = list(self._pending)[: self._cfg.batch_size]
            for key in batch:
                del self._pending[key]
            await self._decide_batch(batch)

    def _scan(self) -> None:
        complete, _ = find_requests(self._view.devices().values())
        for req in complete:
            key = (req.namespace, req.id)
            flight = self._flights.get(key)
            if flight is None or not flight.running:
                self._pending[key] = None

    def _snapshot(self) -> Snapshot:
        """The view plus what every request in flight will still take (B3: "counting
        reservations in flight")."""
        return self._view.snapshot().with_reservations(self._holds())

    def _holds(self) -> list[Hold]:
        """What every request in flight still holds (after dropping the finished ones the
        view has caught up with)."""
        self._prune()
        held = (self._reservation(flight) for flight in self._flights.values())
        return [h for h in held if h is not None]

    def _prune(self) -> bool:
        """Drop finished requests the view has caught up with (or that waited longer than
        `settle_timeout`), releasing their node holds. True if some finished request is
        still waiting for the view."""
        now = anyio.current_time()
        waiting = False
        for key, flight in list(self._flights.items()):
            if flight.running or flight.stalled:
                continue
            left = self._outstanding(flight)
            if left is not None and not left.empty and now - (flight.finished_at or now) <= self._cfg.settle_timeout:
                waiting = True
                continue
            del self._flights[key]
            if flight.node is not None and flight.landing:
                ref = self._nodes.node_actor(flight.node)
                if ref is not None:
                    tell_quietly(ref, Release(flight.request.id))
        return waiting

    def _outstanding(self, flight: _Flight) -> Hold | None:
        """What `flight` still holds (`model.hold.outstanding`; None: nothing lands). Once
        its writes stopped, only placement writes it attempted and the view does not show
        yet."""
        if flight.hold is None:
            return None
        finished = not flight.running and not flight.stalled
        return outstanding(flight.hold, self._view.device,
                           attempted=flight.written if finished else None)

    async def _decide_batch(self, batch: list[RequestKey]) -> None:
        """Plan `batch` on one snapshot of the view plus the holds in flight
        (`model.plan.plan_batch`: each decision sees the holds planned before it, B2, B3);
        then reserve every planned placement at once (`actors.reservation.reserve`: one
        scatter-gather of prepares, one of commits).

        A tentative reservation that did not hold (a node actor refused or did not answer)
        was capacity the later decisions of the batch counted as taken: those are not
        answered but decided again in the next batch (their committed holds aborted), so a
        phantom reservation never makes a refusal, a B5(a) answer or a B4 choice. The
        batch's answers are written together (one wave); then each request whose first
        placement failed falls back, one after the other, on a fresh decision
        (`_fall_back`), and writes alone."""
        items = []
        for ns, rid in batch:
            flight = self._flights.get((ns, rid))
            if flight is None or not flight.running:
                items.append((ns, rid, self._view.request_members(ns, rid)))
        if not items:
            return
        started = self._clock.monotonic()
        actions, snap = plan_batch(self._view.snapshot(), self._holds(), items)
        entries: list[Placing | _Answer] = []
        failed: list[Placing] = []
        self._wave = wave = []
        try:
            for action in actions:
                entry = self._act(action, started)
                if entry is not None:
                    entries.append(entry)
            placing = [e for e in entries if isinstance(e, Placing)]
            if placing:
                await reserve(placing, snap, self._nodes, self._owner, self._cfg.ask_timeout)
            cut = next((i for i, e in enumerate(entries)
                        if isinstance(e, Placing) and e.placement is None), len(entries))
            for i, e in enumerate(entries):
                if isinstance(e, Placing) and e.placement is None:
                    failed.append(e)
                elif i > cut:  # decided against a reservation that did not hold: again
                    if isinstance(e, Placing) and e.ref is not None:
                        tell_quietly(e.ref, Abort(e.request.id))
                    self._pending[e.key] = None
                elif isinstance(e, _Answer):
                    self._observe(e.rule, e.result, e.message, e.started)
                    self._start(e.request, e.result, e.node, e.message, None)
                else:
                    self._placed(e, snap)
        finally:
            self._wave = None
            if wave:  # the batch's writes go together (cancelled: they die with the loop)
                self._tg.start_soon(self._carry_out_wave, wave)
        for it in failed:  # after the others' writes started; each then writes alone
            it.placement = await self._fall_back(it)
            self._placed(it, snap)

    def _act(self, action: Action, started: float) -> Placing | _Answer | None:
        """Carry out what needs no waiting of one planned action: recover, finish a
        cut-short refusal, requeue, or book the decision; returns what waits for the
        batch's reservation (an `_Answer`, which lands nothing, or a `Placing`)."""
        match action:
            case Skip(ns, rid):
                self._rounds.pop((ns, rid), None)
                flight = self._flights.get((ns, rid))
                if flight is not None and flight.stalled:
                    flight.stalled = False  # nothing more to write: keep only unobserved binds
                return None
            case Recover():
                self._recover(action)
                return None
            case Finish(req, message):  # a refusal whose writes were cut short: finish it
                self._start(req, Result.REFUSED, None, message, None)
                return None
            case Requeue(req, error):  # a bug in the model must not crash-loop the binder
                _log.error("decide_failed", request_id=req.id, namespace=req.namespace, error=error)
                self._defer((req.namespace, req.id), self._cfg.poison_delay)
                return None
        req, decision = action.request, action.decision
        key = (req.namespace, req.id)
        self._counts["decided"] += 1
        _log.info("decision", request_id=req.id, namespace=req.namespace, vmi=req.vmi,
                  rule=decision.rule, result=decision.result.value, chosen=decision.node,
                  candidates=[p.node for p in decision.placements])
        if isinstance(action, Answer):
            return _Answer(key, req, decision.result, decision.node, decision.message,
                           decision.rule, started)
        return Placing(key, req, decision, started, hold=action.hold)

    def _placed(self, it: Placing, snap: Snapshot) -> None:
        """Start the writes of a placed item, or requeue it / refuse it (ledgers)."""
        req, decision, key = it.request, it.decision, it.key
        ns, rid = key
        placement = it.placement
        if placement is None:
            rounds = self._rounds.get(key, 0) + 1
            if rounds >= self._cfg.max_rounds:
                self._rounds.pop(key, None)
                _log.info("refused_by_ledgers", request_id=rid, namespace=ns, reasons=it.refusals)
                message = ledger_refusal(req, snap, it.refusals)
                self._observe("ledgers", Result.REFUSED, message, it.started)
                self._start(req, Result.REFUSED, None, message, None)
            else:
                self._rounds[key] = rounds
                self._defer(key, self._cfg.requeue_delay)
            return
        self._observe(decision.rule, Result.SUCCEEDED, decision.message, it.started)
        self._rounds.pop(key, None)
        first = decision.placements[0]
        message = decision.message if placement is first else describe_placement(req, placement)
        self._start(req, Result.SUCCEEDED, placement.node, message, it.hold_of(placement, snap))

    def _reservation(self, flight: _Flight) -> Hold | None:
        """What `flight` still holds, for a snapshot (None: nothing left to land)."""
        left = self._outstanding(flight)
        return None if left is None or left.empty else left

    def _observe(self, rule: str, result: Result, message: str, started: float) -> None:
        if self._observer is not None:
            try:
                self._observer.decided(rule, result, message, self._clock.monotonic() - started)
            except Exception:  # an observer must not break the decision loop
                _log.exception("observer_failed", rule=rule)

    def _defer(self, key: RequestKey, delay: float) -> None:
        self._deferred[key] = anyio.current_time() + delay
        self._wakeup.set()

    # -- two-phase reservation ------------------------------------------------------------------

    async def _fall_back(self, it: Placing) -> Placement | None:
        """After the node actor of its first placement refused `it`: decide it again on a
        fresh snapshot (every request started since counted: a restarted node actor may
        have lost their holds, so its ledger alone is not enough, B3) and try the
        candidates the ledgers have not refused yet, in B4 order. None when none commits
        or the request no longer lands devices (it is then requeued)."""
        snap = self._snapshot()
        try:
            decision = decide(snap, it.request)
        except Exception:  # as in `plan_batch`: a model bug must not crash the loop
            _log.exception("decide_failed", request_id=it.request.id, namespace=it.request.namespace)
            return None
        refused = {it.decision.placements[0].node}
        candidates = [p for p in decision.placements if p.moves and p.node not in refused]
        for placement in candidates if decision.result is not Result.REFUSED else ():
            await reserve([it], snap, self._nodes, self._owner, self._cfg.ask_timeout, [placement])
            if it.placement is not None:
                return it.placement
        return None

    # -- recovery (B7) --------------------------------------------------------------------------

    def _recover(self, rec: Recover) -> _Flight:
        """Finish `rec.request` on `rec.node` (B7): claim what it still lands there on the
        node actor and start its writes."""
        req, node = rec.request, rec.node
        self._counts["recovered"] += 1
        _log.info("recover", request_id=req.id, namespace=req.namespace, chosen=node,
                  landing=[k for k, _ in rec.hold.landing] if rec.hold else [])
        ref = self._nodes.node_actor(node)
        if ref is not None and rec.hold is not None:
            tell_quietly(ref, Claim(rec.hold, self._owner))
        return self._start(req, Result.SUCCEEDED, node, rec.message, rec.hold)

    # -- writes (B8) -----------------------------------------------------------------------------

    def _start(
        self,
        req: Request,
        result: Result,
        node: str | None,
        message: str,
        hold: Hold | None,
    ) -> _Flight:
        key = (req.namespace, req.id)
        old = self._flights.get(key)
        if old is not None and old.node is not None and old.landing and old.node != node:
            # A stalled earlier attempt held capacity elsewhere (re-decided): release it.
            ref = self._nodes.node_actor(old.node)
            if ref is not None:
                tell_quietly(ref, Release(req.id))
        flight = _Flight(req, result, node, message, hold, anyio.current_time())
        self._flights[key] = flight
        if self._wave is not None:
            self._wave.append(flight)
        else:
            self._tg.start_soon(self._carry_out, flight)
        return flight

    async def _carry_out_wave(self, flights: list[_Flight]) -> None:
        """The writes of the flights decided in one batch together: one `write_many` with
        one write per member of each (node, placement and result at once). A flight with a
        failed write goes on alone (`_carry_out`: retries, or stops when withdrawn), so it
        never holds back the others' settling."""
        active = flights
        try:
            plan = [(f, ws) for f in active if (ws := self._writes(f))]
            if plan:
                outcomes = await self._write_many([w for _, ws in plan for w in ws])
                left: set[int] = set()
                i = 0
                for f, ws in plan:
                    failed = [(w, e) for w, e in zip(ws, outcomes[i:i + len(ws)]) if e is not None]
                    i += len(ws)
                    if failed:
                        left.add(id(f))
                        self._tg.start_soon(self._carry_out, f, failed)
                if left:
                    active = [f for f in active if id(f) not in left]
        except BaseException:
            for f in active:
                f.running = False
                f.finished_at = anyio.current_time()
            raise
        for f in active:
            self._finish(f, "done")

    async def _carry_out(self, flight: _Flight,
                         failed: list[tuple[StatusWrite, WriteError]] | None = None) -> None:
        """Write the decision of one flight: one write per member (`_writes`), or, with
        `failed` (left by a wave), retry those. Stops at RequestWithdrawn/NotFound (what is
        written stays); on exhausted retries the request is tried again later, keeping its
        reservation."""
        outcome = "done"
        try:
            if failed is not None:
                for _, err in failed:
                    if not isinstance(err, RETRYABLE_WRITE_ERRORS):
                        raise err
                left = failed
            else:
                writes = self._writes(flight)
                left = await self._write_once(writes) if writes else []
            if left:
                await self._retry(left)
        except (RequestWithdrawn, NotFound) as exc:
            outcome = "withdrawn"
            _log.info("withdrawn", request_id=flight.request.id,
                      namespace=flight.request.namespace, error=str(exc))
        except WriteError as exc:
            outcome = "gave_up"
            _log.warning("writes_gave_up", request_id=flight.request.id,
                         namespace=flight.request.namespace, error=str(exc))
        except BaseException:
            flight.running = False
            flight.finished_at = anyio.current_time()
            raise
        self._finish(flight, outcome)

    def _finish(self, flight: _Flight, outcome: str) -> None:
        """Book the end of a flight's writes (`outcome`: done, withdrawn, gave_up)."""
        req = flight.request
        flight.running = False
        flight.finished_at = anyio.current_time()
        self._counts[outcome] += 1
        if outcome == "done":
            self._counts["succeeded" if flight.result is Result.SUCCEEDED else "refused"] += 1
        elif outcome == "gave_up":
            flight.stalled = True
            self._defer((req.namespace, req.id), self._cfg.stalled_delay)
        _log.info("writes_finished", request_id=req.id, namespace=req.namespace, outcome=outcome,
                  result=flight.result.value, chosen=flight.node,
                  seconds=round(flight.finished_at - flight.started_at, 4))
        self._wakeup.set()  # let the loop drop the reservation once the view shows the writes

    def _writes(self, flight: _Flight) -> list[StatusWrite]:
        """One write per member of `flight` not answered yet, read from the view just
        before: the node, the placement when the member lands (is not Bound on the node
        yet) and the result together (B1, B7: the first applied one is the durable record
        of the decision). A member already carrying all of it gets none."""
        req, node, rid = flight.request, flight.node, flight.request.id
        landing = {k for k, _ in flight.landing}
        view = self._view
        out: list[StatusWrite] = []
        now = None
        for name in dict.fromkeys(req.devices):
            key = (req.namespace, name)
            dev = view.device(key)
            br = dev.status.bind_request if dev is not None else None
            lands = key in landing and (dev is None or dev.bound_node != node)
            if (not lands and br is not None and br.id == rid
                    and (br.result, br.node, br.message) == (flight.result, node, flight.message)):
                continue
            if lands:
                flight.written.add(key)
                now = now or self._clock.now()
            out.append(StatusWrite(key, rid, flight.result, flight.message, node=node,
                                   bound_at=now if lands else None,
                                   expect_version=dev.resource_version if dev is not None else None))
        return out

    async def _retry(self, left: list[tuple[StatusWrite, WriteError]]) -> None:
        """Retry the writes that failed with WriteConflict or TransientWriteError (`left`,
        with their errors) with tenacity, exponential jitter, up to `retry_attempts` tries
        in all counting the first; the last error is raised. RequestWithdrawn and NotFound
        are raised at once, never retried. A retry does not trust the version the decision
        saw (`expect_version` dropped: the writer reads the device first)."""
        cfg = self._cfg
        if cfg.retry_attempts <= 1:
            raise left[0][1]
        _log.info("write_retry", error=str(left[0][1]), writes=len(left))
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(RETRYABLE_WRITE_ERRORS),
            wait=wait_exponential_jitter(multiplier=cfg.retry_initial, max=cfg.retry_max,
                                         jitter=cfg.retry_jitter),
            stop=stop_after_attempt(cfg.retry_attempts - 1),
            sleep=anyio.sleep,
            reraise=True,
        )
        await anyio.sleep(cfg.retry_initial)
        async for attempt in retrying:
            with attempt:
                left = await self._write_once([replace(w, expect_version=None) for w, _ in left])
                if left:
                    raise left[0][1]

    async def _write_once(self, writes: list[StatusWrite]) -> list[tuple[StatusWrite, WriteError]]:
        """One `write_many` call: the writes that failed with a retryable error, with it.
        Raises the first non-retryable error (RequestWithdrawn, NotFound)."""
        failed: list[tuple[StatusWrite, WriteError]] = []
        for w, err in zip(writes, await self._write_many(writes)):
            if err is None:
                continue
            if not isinstance(err, RETRYABLE_WRITE_ERRORS):
                raise err
            failed.append((w, err))
        return failed

    async def _write_many(self, writes: list[StatusWrite]) -> list[WriteError | None]:
        """`StatusWriter.write_many` bounded by `write_timeout`: on timeout every write's
        outcome is a TransientWriteError (it may or may not have applied)."""
        timeout = self._cfg.write_timeout
        with anyio.move_on_after(timeout) as scope:
            outcomes = await self._writer.write_many(writes)
            if len(outcomes) != len(writes):  # a broken writer: crash, do not guess
                raise RuntimeError(f"write_many answered {len(outcomes)} of {len(writes)} writes")
            return outcomes
        assert scope.cancelled_caught
        err = TransientWriteError(f"writes of {len(writes)} devices timed out after {timeout}s")
        return [err] * len(writes)

# -- helpers ------------------------------------------------------------------------------------


__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorStatus",
    "Examine",
    "GetStatus",
    "Resync",
]
