"""Coordinator: the binder's one decision loop (B2) and its only status writer (B8).

It takes complete requests in batches and decides them one after the other on a snapshot of
the ClusterView plus its own requests in flight (capacity and budget they will take and the
view does not show yet), each decision seeing the tentative reservations of those before it
(`model.decide`). The batch's successes then run the two-phase protocol on the node actors
at once (prepares, then commits, scatter-gathered); a request a node actor refused is
decided again on a fresh snapshot and tries its other candidates (`_decide_batch`).
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
    ActorStopped,
    MailboxFull,
    NotFound,
    RequestWithdrawn,
    TransientWriteError,
    WriteError,
)
from actors.node_actor import (
    Abort,
    Adopt,
    Claim,
    Commit,
    CommitRefused,
    Committed,
    Prepare,
    Prepared,
    PrepareRefused,
    Release,
)
from actors.ports import (
    Clock,
    ClusterView,
    DecisionObserver,
    DeviceKey,
    NodeDirectory,
    StatusWrite,
    StatusWriter,
)
from actors.runtime import Actor, ActorContext, ActorRef, ask_all
from model.decide import Decision, Placement, Request, decide, describe_placement, find_requests
from model.hold import Hold, Landing, outstanding
from model.snapshot import Snapshot
from model.types import GPUDevice, Result

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
class _Placing:
    """A request decided to land devices, between its decision and its two-phase
    reservation: `placement` is set once a node actor committed one."""

    key: RequestKey
    request: Request
    decision: Decision
    started: float
    refusals: list[str] = field(default_factory=list)
    incarnation: int = 0
    placement: Placement | None = None
    ref: ActorRef | None = None  # the node actor of the first placement, once prepared


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
            self._tell_quietly(ref, Adopt(self._owner))
        complete, _ = find_requests(self._view.devices().values())
        recovered = 0
        for req in complete:
            key = (req.namespace, req.id)
            members = self._view.request_members(req.namespace, req.id)
            node = _recorded_node(req.id, members)
            if node is not None:
                self._recover(req, node, members)  # before any new decision (B7)
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
        self._prune()
        held = (self._reservation(flight) for flight in self._flights.values())
        return self._view.snapshot().with_reservations(r for r in held if r is not None)

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
                    self._tell_quietly(ref, Release(flight.request.id))
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
        """Decide `batch` in order on one snapshot, each decision seeing the tentative
        reservations of those before it (B2, B3); then reserve every decision that lands
        devices at once (`_reserve`: one scatter-gather of prepares, one of commits).

        A tentative reservation that did not hold (a node actor refused or did not answer)
        was capacity the later decisions of the batch counted as taken: those are not
        answered but decided again in the next batch (their committed holds aborted), so a
        phantom reservation never makes a refusal, a B5(a) answer or a B4 choice. The
        batch's answers are written together (one wave); then each request whose first
        placement failed falls back, one after the other, on a fresh decision
        (`_fall_back`), and writes alone."""
        snap: Snapshot | None = None  # built on the first request that needs deciding
        entries: list[_Placing | _Answer] = []
        failed: list[_Placing] = []
        self._wave = wave = []
        try:
            for key in batch:
                snap, entry = self._triage(key, snap)
                if entry is not None:
                    entries.append(entry)
            placing = [e for e in entries if isinstance(e, _Placing)]
            if placing:
                assert snap is not None
                await self._reserve(placing, snap)
            cut = next((i for i, e in enumerate(entries)
                        if isinstance(e, _Placing) and e.placement is None), len(entries))
            for i, e in enumerate(entries):
                if isinstance(e, _Placing) and e.placement is None:
                    failed.append(e)
                elif i > cut:  # decided against a reservation that did not hold: again
                    if isinstance(e, _Placing) and e.ref is not None:
                        self._tell_quietly(e.ref, Abort(e.request.id))
                    self._pending[e.key] = None
                elif isinstance(e, _Answer):
                    self._observe(e.rule, e.result, e.message, e.started)
                    self._start(e.request, e.result, e.node, e.message, None)
                else:
                    assert snap is not None
                    self._placed(e, snap)
        finally:
            self._wave = None
            if wave:  # the batch's writes go together (cancelled: they die with the loop)
                self._tg.start_soon(self._carry_out_wave, wave)
        for it in failed:  # after the others' writes started; each then writes alone
            assert snap is not None
            it.placement = await self._fall_back(it)
            self._placed(it, snap)

    def _triage(self, key: RequestKey, snap: Snapshot | None
                ) -> tuple[Snapshot | None, _Placing | _Answer | None]:
        """Act on one request without waiting: recover it, finish a cut-short refusal, or
        decide it. Returns the snapshot for the next request (None: not built yet) and the
        decision: an `_Answer` (lands nothing), or a `_Placing` for the two-phase
        reservation (its first placement is then reserved in the returned snapshot)."""
        ns, rid = key
        flight = self._flights.get(key)
        if flight is not None and flight.running:
            return snap, None
        members = self._view.request_members(ns, rid)
        complete, _ = find_requests(members)
        req = next((r for r in complete if r.id == rid), None)
        if req is None:  # withdrawn, partial, or every member has its result
            self._rounds.pop(key, None)
            if flight is not None and flight.stalled:
                flight.stalled = False  # nothing more to write: keep only unobserved binds
            return snap, None
        node = _recorded_node(rid, members)
        if node is not None:
            flight = self._recover(req, node, members)
            return (None if snap is None else self._with_flight(snap, flight)), None
        refused = next((m.status.bind_request.message for m in members
                        if m.status.bind_request is not None
                        and m.status.bind_request.result is Result.REFUSED), None)
        if refused is not None:  # a refusal whose writes were cut short: finish it
            self._start(req, Result.REFUSED, None, refused, None)
            return snap, None
        if snap is None:
            snap = self._snapshot()
        started = self._clock.monotonic()
        try:
            decision = decide(snap, req)
        except Exception:  # a bug in the model must not crash-loop the binder on one request
            _log.exception("decide_failed", request_id=rid, namespace=ns)
            self._defer(key, self._cfg.poison_delay)
            return snap, None
        self._counts["decided"] += 1
        _log.info("decision", request_id=rid, namespace=ns, vmi=req.vmi, rule=decision.rule,
                  result=decision.result.value, chosen=decision.node,
                  candidates=[p.node for p in decision.placements])
        if decision.result is Result.REFUSED:
            return snap, _Answer(key, req, Result.REFUSED, None, decision.message,
                                 decision.rule, started)
        first = decision.placements[0]
        if not first.moves:  # B5, B6: nothing lands anywhere
            return snap, _Answer(key, req, Result.SUCCEEDED, first.node, decision.message,
                                 decision.rule, started)
        item = _Placing(key, req, decision, started)
        tentative = _Flight(req, Result.SUCCEEDED, first.node, decision.message,
                            self._hold(req, first, snap), anyio.current_time())
        return self._with_flight(snap, tentative), item

    async def _reserve(self, items: list[_Placing], snap: Snapshot,
                       placements: list[Placement] | None = None) -> None:
        """The two-phase reservation of each item on its placement (`placements`, in the
        order of `items`; default: each one's first): prepares scattered and gathered at
        once (`ask_all`), then commits likewise. Sets `placement` of each item committed;
        an item a node actor refused, or that got no answer (its hold aborted), keeps None
        and the reasons in `refusals`. Cancelled: every hold this call may have taken is
        aborted."""
        timeout = self._cfg.ask_timeout
        if placements is None:
            placements = [it.decision.placements[0] for it in items]
        sent: list[tuple[_Placing, Placement, ActorRef]] = []
        try:
            prepares = []
            for it, p in zip(items, placements):
                ref = self._nodes.node_actor(p.node)
                if ref is None:
                    it.refusals.append(f"{p.node}: no node actor")
                    continue
                sent.append((it, p, ref))
                prepares.append((ref, Prepare(self._hold(it.request, p, snap), self._owner)))
            replies = await ask_all(prepares, timeout=timeout)
            commits: list[tuple[_Placing, Placement, ActorRef]] = []
            for (it, p, ref), reply in zip(sent, replies):
                if isinstance(reply, Prepared):
                    it.incarnation, it.ref = reply.incarnation, ref
                    commits.append((it, p, ref))
                elif isinstance(reply, PrepareRefused):
                    it.refusals.append(f"{p.node}: {reply.reason}")
                else:
                    self._tell_quietly(ref, Abort(it.request.id))
                    it.refusals.append(f"{p.node}: node actor unavailable ({type(reply).__name__})")
            replies = await ask_all([(ref, Commit(it.request.id, it.incarnation))
                                     for it, _, ref in commits], timeout=timeout)
            for (it, p, ref), reply in zip(commits, replies):
                node = p.node
                if isinstance(reply, Committed):
                    it.placement = p
                    continue
                self._tell_quietly(ref, Abort(it.request.id))
                if isinstance(reply, CommitRefused):
                    it.refusals.append(f"{node}: {reply.reason}")
                else:
                    it.refusals.append(f"{node}: node actor unavailable ({type(reply).__name__})")
        except BaseException:
            for it, _, ref in sent:  # cancelled: do not leak a hold
                self._tell_quietly(ref, Abort(it.request.id))
            raise

    def _placed(self, it: _Placing, snap: Snapshot) -> None:
        """Start the writes of a placed item, or requeue it / refuse it (ledgers)."""
        req, decision, key = it.request, it.decision, it.key
        ns, rid = key
        placement = it.placement
        if placement is None:
            rounds = self._rounds.get(key, 0) + 1
            if rounds >= self._cfg.max_rounds:
                self._rounds.pop(key, None)
                _log.info("refused_by_ledgers", request_id=rid, namespace=ns, reasons=it.refusals)
                message = _ledger_refusal(req, snap, it.refusals)
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
        self._start(req, Result.SUCCEEDED, placement.node, message, self._hold(req, placement, snap))

    def _with_flight(self, snap: Snapshot, flight: _Flight) -> Snapshot:
        held = self._reservation(flight)
        return snap if held is None else snap.with_reservation(held)

    def _reservation(self, flight: _Flight) -> Hold | None:
        """What `flight` still holds, for a snapshot (None: nothing left to land)."""
        left = self._outstanding(flight)
        return None if left is None or left.empty else left

    @staticmethod
    def _hold(req: Request, placement: Placement, snap: Snapshot) -> Hold:
        """The hold of `req` landing `placement` (counts from `snap`'s devices)."""
        return Hold(req.id, req.namespace, placement.node, placement.needs,
                    placement.budget_needs, _landing(placement, snap))

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

    async def _fall_back(self, it: _Placing) -> Placement | None:
        """After the node actor of its first placement refused `it`: decide it again on a
        fresh snapshot (every request started since counted: a restarted node actor may
        have lost their holds, so its ledger alone is not enough, B3) and try the
        candidates the ledgers have not refused yet, in B4 order. None when none commits
        or the request no longer lands devices (it is then requeued)."""
        snap = self._snapshot()
        try:
            decision = decide(snap, it.request)
        except Exception:  # as in `_triage`: a model bug must not crash the loop
            _log.exception("decide_failed", request_id=it.request.id, namespace=it.request.namespace)
            return None
        refused = {it.decision.placements[0].node}
        candidates = [p for p in decision.placements if p.moves and p.node not in refused]
        for placement in candidates if decision.result is not Result.REFUSED else ():
            await self._reserve([it], snap, [placement])
            if it.placement is not None:
                return it.placement
        return None

    @staticmethod
    def _tell_quietly(ref: ActorRef, message: Any) -> None:
        """Best effort: a full or stopped mailbox is left to the hold's expiry."""
        try:
            ref.tell_nowait(message)
        except (MailboxFull, ActorStopped):
            pass

    # -- recovery (B7) --------------------------------------------------------------------------

    def _recover(self, req: Request, node: str, members: tuple[GPUDevice, ...]) -> _Flight:
        classes = self._view.classes()
        landing = tuple(
            (m.key, classes[m.class_name].resource_name) for m in _in_order(req, members)
            if m.bound_node != node and m.class_name in classes
        )
        message = next((m.status.bind_request.message for m in members
                        if m.status.bind_request is not None
                        and m.status.bind_request.result is Result.SUCCEEDED
                        and m.status.bind_request.message), None)
        message = message or (f"placed {req.namespace}/{req.vmi} request {req.id} on {node}: "
                              "finishing a decision made before a binder restart")
        self._counts["recovered"] += 1
        _log.info("recover", request_id=req.id, namespace=req.namespace, chosen=node,
                  landing=[k for k, _ in landing])
        ref = self._nodes.node_actor(node)
        needs = Counter(res for _, res in landing)
        hold = Hold(req.id, req.namespace, node, tuple(sorted(needs.items())), (), landing)
        hold = outstanding(hold, self._view.device) if landing else None
        if ref is not None and hold is not None:
            self._tell_quietly(ref, Claim(hold, self._owner))
        return self._start(req, Result.SUCCEEDED, node, message, hold)

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
                self._tell_quietly(ref, Release(req.id))
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


def _recorded_node(request_id: str, members: tuple[GPUDevice, ...]) -> str | None:
    """The node recorded for `request_id` on its members (B7), the most common if (by a bug)
    they disagree; None when no member carries one."""
    nodes = Counter(
        br.node for m in members
        if (br := m.status.bind_request) is not None and br.id == request_id
        and br.node is not None and br.result is not Result.REFUSED
    )
    if not nodes:
        return None
    if len(nodes) > 1:
        _log.error("recorded_nodes_disagree", request_id=request_id, nodes=dict(nodes))
    return nodes.most_common(1)[0][0]


def _in_order(req: Request, members: tuple[GPUDevice, ...]) -> list[GPUDevice]:
    by_name = {m.name: m for m in members}
    return [by_name[n] for n in dict.fromkeys(req.devices) if n in by_name]


def _landing(placement: Placement, snap: Snapshot) -> Landing:
    out = []
    for move in placement.moves:
        dev = snap.devices.get(move.device)
        cls = snap.classes.get(dev.class_name) if dev is not None else None
        if cls is not None:
            out.append((move.device, cls.resource_name))
    return tuple(out)


def _ledger_refusal(req: Request, snap: Snapshot, reasons: list[str]) -> str:
    """The Refused message when the model found room but every node actor refused (B1:
    names every device and its node, and why each candidate failed)."""
    described = []
    for name in req.devices:
        dev = snap.device(req.namespace, name)
        if dev is None:
            described.append(f"{name} (not found)")
        elif dev.bound_node:
            described.append(f"{name} (Bound on {dev.bound_node})")
        else:
            described.append(f"{name} (Pending)")
    why = "; ".join(reasons) or "no candidate node"
    return (f"refused {req.namespace}/{req.vmi} request {req.id}: devices {', '.join(described)}; "
            f"node ledgers refused every candidate: {why}")


__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorStatus",
    "Examine",
    "GetStatus",
    "Resync",
]
