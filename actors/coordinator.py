"""Coordinator: the binder's one decision loop (B2). Its writes are its status pipeline's.

It takes complete requests in batches (`Examine`, `Resync`; the loop's progress is a
message to itself, `_Decide`, so its state changes only in `receive`) and plans each batch
synchronously and purely (`model.plan.plan_batch`) on a snapshot of the ClusterView plus
what the requests in flight still hold (asked of the pipeline, `GetFlights`: B3 "counting
reservations in flight"), each decision seeing the holds planned before it. The batch's
placements then run the two-phase protocol on the node actors at once
(`actors.reservation.reserve`); a request a node actor refused is decided again on a fresh
snapshot and tries its other candidates (`_fall_back`). Every decision goes to the
pipeline (`actors.status_pipeline`: `Fly`, one wave per batch), which writes it, keeps the
reservation until the view shows the writes and then releases the node actor's hold (B8:
the pipeline is the only status writer).

On start it attaches to its pipeline, adopts the node actors' ledgers (dropping holds of
earlier incarnations) and recovers every request that carries a decision
(`bindRequest.node`) but not all its results, finishing it on that node whatever the
capacity now (B7), before deciding anything. It and its pipeline are one supervised group
(one-for-all, `supervisor.binder`): a crash of either restarts both, so this recovery also
covers the flights a crashed pipeline lost.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Mapping

import anyio
import structlog

from actors.errors import ActorStopped, MailboxFull
from actors.node_actor import Abort, Adopt, Claim
from actors.ports import Clock, ClusterView, DecisionObserver, NodeDirectory
from actors.reservation import Placing, ledger_refusal, reserve, tell_quietly
from actors.runtime import Actor, ActorContext, ActorRef
from actors.status_pipeline import (
    Attach,
    Decided,
    Flights,
    Fly,
    GetFlights,
    GetPipelineStatus,
    PipelineConfig,
    PipelineStatus,
    Settle,
    Stalled,
)
from model.decide import Placement, Request, decide, describe_placement, find_requests
from model.plan import Action, Answer, Finish, Recover, Requeue, Skip, plan_batch, recorded_node, recovery
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
    """Reply: `CoordinatorStatus` (asks the pipeline for its part)."""


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    """Counters of this incarnation (coordinator and pipeline). `in_flight` requests hold a
    reservation (writes running, stalled, or done but not yet seen in the view); `writing`
    have writes running; `succeeded`/`refused`/`withdrawn`/`gave_up` count ended writes."""

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
    """Timeouts and bounds of the coordinator and its pipeline (seconds unless named
    otherwise).

    `ask_timeout` bounds one prepare/commit round and one question to the pipeline;
    `max_rounds` decide-and-prepare rounds before a request every node actor refused is
    answered Refused; `requeue_delay` between rounds; `stalled_delay` before a request whose
    writes gave up is tried again; `resync_interval` between full scans; `poison_delay`
    before a request on which `model.decide` raised is tried again; `batch_size` requests
    decided on one snapshot. The pipeline's (`pipeline()`): `write_timeout` bounds one
    StatusWriter call; `retry_*` the tenacity policy per write; `settle_timeout` the longest
    a finished request waits for the view to show its writes (polled every `settle_poll`)."""

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

    def pipeline(self) -> PipelineConfig:
        """The status pipeline's part of this configuration."""
        return PipelineConfig(**{f.name: getattr(self, f.name) for f in fields(PipelineConfig)})


@dataclass(frozen=True, slots=True)
class _Answer:
    """A decision that lands nothing (Refused, or Succeeded with nothing to move: B5, B6),
    held until the batch's tentative reservations are known to have held."""

    decided: Decided
    rule: str
    started: float

    @property
    def request(self) -> Request:
        return self.decided.request


@dataclass(frozen=True, slots=True)
class _Decide:
    """To itself: decide the next batch of pending requests."""


@dataclass(frozen=True, slots=True)
class _Due:
    """To itself, from the alarm set for `at` (loop time): deferrals or the periodic resync
    due by then are due."""

    at: float


class Coordinator(Actor):
    """The coordinator actor (see the module docstring). Build one per incarnation;
    `pipeline` is its status pipeline (the other member of its supervised group)."""

    name = "coordinator"

    def __init__(
        self,
        view: ClusterView,
        pipeline: ActorRef,
        nodes: NodeDirectory,
        clock: Clock,
        config: CoordinatorConfig | None = None,
        observer: DecisionObserver | None = None,
    ) -> None:
        self._observer = observer
        self._view = view
        self._pipeline = pipeline
        self._nodes = nodes
        self._clock = clock
        self._cfg = config or CoordinatorConfig()
        self._owner = f"coordinator-{uuid.uuid4().hex[:10]}"
        self._pending: dict[RequestKey, None] = {}
        self._deferred: dict[RequestKey, float] = {}
        self._rounds: dict[RequestKey, int] = {}
        self._next_resync = 0.0
        self._alarms: set[float] = set()  # times of the alarm tasks pending
        self._decide_queued = False
        self._counts: Counter[str] = Counter()
        self._ref: ActorRef | None = None
        self._tg: Any = None

    def log_context(self) -> Mapping[str, Any]:
        return {"actor": "coordinator"}

    # -- lifecycle --------------------------------------------------------------------------

    async def on_start(self, ctx: ActorContext) -> None:
        self._ref, self._tg = ctx.ref, ctx.task_group
        await self._tell_pipeline(Attach(self._owner, ctx.ref))
        for ref in self._nodes.node_actors().values():
            tell_quietly(ref, Adopt(self._owner))
        complete, _ = find_requests(self._view.devices().values())
        snap = self._view.snapshot()
        wave: list[Decided] = []
        for req in complete:
            members = self._view.request_members(req.namespace, req.id)
            node, _ = recorded_node(req.id, members)
            if node is not None:  # before any new decision (B7)
                wave.append(self._recover(recovery(req, node, members, snap)))
            else:
                self._pending[(req.namespace, req.id)] = None
        if wave:
            await self._tell_pipeline(Fly(self._owner, tuple(wave)))
        self._next_resync = anyio.current_time() + self._cfg.resync_interval
        self._arm(self._next_resync)
        _log.info("coordinator_start", owner=self._owner, incarnation=ctx.incarnation,
                  recovered=len(wave), pending=len(self._pending))
        self._kick()

    async def on_stop(self) -> None:
        self._tg.cancel_scope.cancel()  # alarms

    async def receive(self, message: Any) -> Any:
        match message:
            case Examine(namespace, request_id):
                self._pending[(namespace, request_id)] = None
            case _Decide():
                self._decide_queued = False
                self._due()
                batch = list(self._pending)[: self._cfg.batch_size]
                for key in batch:
                    del self._pending[key]
                if batch:
                    await self._decide_batch(batch)
            case _Due(at):
                self._alarms.discard(at)
                self._due(at)
            case Stalled(key):
                self._defer(key, self._cfg.stalled_delay)
            case Resync():
                self._scan()
            case GetStatus():
                return await self.status()
            case _:
                raise TypeError(f"coordinator: unexpected message {message!r}")
        self._kick()
        return None

    async def status(self) -> CoordinatorStatus:
        """This incarnation's counters, the pipeline's asked for (bounded by `ask_timeout`)."""
        p: PipelineStatus = await self._pipeline.ask(GetPipelineStatus(), timeout=self._cfg.ask_timeout)
        c = self._counts
        return CoordinatorStatus(
            owner=self._owner, pending=len(self._pending), deferred=len(self._deferred),
            in_flight=p.in_flight, writing=p.writing, decided=c["decided"],
            succeeded=p.succeeded, refused=p.refused, recovered=c["recovered"],
            withdrawn=p.withdrawn, gave_up=p.gave_up,
        )

    # -- the loop's progress: messages to itself ------------------------------------------------

    def _kick(self) -> None:
        """Queue one `_Decide` when requests are pending and none is queued. A full mailbox
        leaves it to the end of the next message (one will come: the mailbox is full)."""
        if self._pending and not self._decide_queued:
            assert self._ref is not None
            try:
                self._ref.tell_nowait(_Decide())
                self._decide_queued = True
            except (MailboxFull, ActorStopped):  # stopped: the incarnation is ending
                pass

    def _due(self, at: float = 0.0) -> None:
        """Move the deferred requests due by now (or by `at`, an alarm's time: a timer may
        wake a hair early) to pending; rescan when due; re-arm."""
        now = max(anyio.current_time(), at)
        self._alarms = {t for t in self._alarms if t > now}
        for key, due in list(self._deferred.items()):
            if due <= now:
                del self._deferred[key]
                self._pending[key] = None
        if now >= self._next_resync:
            self._next_resync = now + self._cfg.resync_interval
            self._scan()
        self._arm(min([self._next_resync, *self._deferred.values()]))

    def _arm(self, at: float) -> None:
        """Make sure a `_Due` arrives by `at`: a new alarm task unless one is due by then
        (so the alarms pending are few: each new one is earlier than all the others)."""
        if self._alarms and min(self._alarms) <= at:
            return
        self._alarms.add(at)
        self._tg.start_soon(self._alarm, at)

    async def _alarm(self, at: float) -> None:
        """Sleep until `at`, then tell `_Due` to the coordinator (waiting for room: the actor
        drains its own mailbox). Touches no state."""
        await anyio.sleep(max(0.0, at - anyio.current_time()))
        assert self._ref is not None
        await self._ref.tell(_Due(at))

    def _defer(self, key: RequestKey, delay: float) -> None:
        due = anyio.current_time() + delay
        self._deferred[key] = due
        self._arm(due)

    def _scan(self) -> None:
        """Every complete request lacking a result to pending (requests whose writes run
        are skipped when their batch is decided)."""
        complete, _ = find_requests(self._view.devices().values())
        for req in complete:
            self._pending[(req.namespace, req.id)] = None

    async def _tell_pipeline(self, message: Any) -> None:
        """Tell the pipeline, waiting for room at most `ask_timeout` (TimeoutError then
        crashes this incarnation, and its group: a decision never silently lost)."""
        with anyio.fail_after(self._cfg.ask_timeout):
            await self._pipeline.tell(message)

    async def _flights(self) -> Flights:
        return await self._pipeline.ask(GetFlights(), timeout=self._cfg.ask_timeout)

    # -- deciding a batch -----------------------------------------------------------------------

    async def _decide_batch(self, batch: list[RequestKey]) -> None:
        """Plan `batch` on one snapshot of the view plus the holds in flight
        (`model.plan.plan_batch`: each decision sees the holds planned before it, B2, B3);
        then reserve every planned placement at once (`actors.reservation.reserve`: one
        scatter-gather of prepares, one of commits).

        A tentative reservation that did not hold (a node actor refused or did not answer)
        was capacity the later decisions of the batch counted as taken: those are not
        answered but decided again in the next batch (their committed holds aborted), so a
        phantom reservation never makes a refusal, a B5(a) answer or a B4 choice. The
        batch's decisions go to the pipeline together (one wave); then each request whose
        first placement failed falls back, one after the other, on a fresh decision
        (`_fall_back`), and goes alone."""
        flights = await self._flights()
        items = [(ns, rid, self._view.request_members(ns, rid)) for ns, rid in batch
                 if (ns, rid) not in flights.running]
        if not items:
            return
        started = self._clock.monotonic()
        actions, snap = plan_batch(self._view.snapshot(), flights.holds, items)
        wave: list[Decided] = []
        entries: list[Placing | _Answer] = []
        for action in actions:
            entry = self._act(action, started, flights, wave)
            if entry is not None:
                entries.append(entry)
        placing = [e for e in entries if isinstance(e, Placing)]
        if placing:
            await reserve(placing, snap, self._nodes, self._owner, self._cfg.ask_timeout)
        cut = next((i for i, e in enumerate(entries)
                    if isinstance(e, Placing) and e.placement is None), len(entries))
        failed: list[Placing] = []
        for i, e in enumerate(entries):
            if isinstance(e, Placing) and e.placement is None:
                failed.append(e)
            elif i > cut:  # decided against a reservation that did not hold: again
                if isinstance(e, Placing) and e.ref is not None:
                    tell_quietly(e.ref, Abort(e.request.id))
                self._pending[(e.request.namespace, e.request.id)] = None
            elif isinstance(e, _Answer):
                d = e.decided
                self._observe(e.rule, d.result, d.message, e.started)
                wave.append(d)
            else:
                self._placed(e, snap, wave)
        if wave:
            await self._tell_pipeline(Fly(self._owner, tuple(wave)))
        for it in failed:  # after the wave went; each then goes alone
            it.placement = await self._fall_back(it)
            alone: list[Decided] = []
            self._placed(it, snap, alone)
            if alone:
                await self._tell_pipeline(Fly(self._owner, tuple(alone)))

    def _act(self, action: Action, started: float, flights: Flights,
             wave: list[Decided]) -> Placing | _Answer | None:
        """Carry out what needs no waiting of one planned action: recover, finish a
        cut-short refusal, requeue, or book the decision (into `wave` when it goes at
        once); returns what waits for the batch's reservation (an `_Answer`, which lands
        nothing, or a `Placing`)."""
        match action:
            case Skip(ns, rid):
                self._rounds.pop((ns, rid), None)
                if (ns, rid) in flights.stalled:  # nothing more to write: only unobserved binds
                    tell_quietly(self._pipeline, Settle((ns, rid)))
                return None
            case Recover():
                wave.append(self._recover(action))
                return None
            case Finish(req, message):  # a refusal whose writes were cut short: finish it
                wave.append(Decided(req, Result.REFUSED, None, message, None))
                return None
            case Requeue(req, error):  # a bug in the model must not crash-loop the binder
                _log.error("decide_failed", request_id=req.id, namespace=req.namespace, error=error)
                self._defer((req.namespace, req.id), self._cfg.poison_delay)
                return None
        req, decision = action.request, action.decision
        self._counts["decided"] += 1
        _log.info("decision", request_id=req.id, namespace=req.namespace, vmi=req.vmi,
                  rule=decision.rule, result=decision.result.value, chosen=decision.node,
                  candidates=[p.node for p in decision.placements])
        if isinstance(action, Answer):
            return _Answer(Decided(req, decision.result, decision.node, decision.message, None),
                           decision.rule, started)
        return Placing((req.namespace, req.id), req, decision, started, hold=action.hold)

    def _placed(self, it: Placing, snap: Snapshot, wave: list[Decided]) -> None:
        """Hand a placed item to `wave`, or requeue it / refuse it (ledgers, B1)."""
        req, decision, key = it.request, it.decision, it.key
        placement = it.placement
        if placement is None:
            rounds = self._rounds.get(key, 0) + 1
            if rounds >= self._cfg.max_rounds:
                self._rounds.pop(key, None)
                _log.info("refused_by_ledgers", request_id=req.id, namespace=req.namespace,
                          reasons=it.refusals)
                message = ledger_refusal(req, snap, it.refusals)
                self._observe("ledgers", Result.REFUSED, message, it.started)
                wave.append(Decided(req, Result.REFUSED, None, message, None))
            else:
                self._rounds[key] = rounds
                self._defer(key, self._cfg.requeue_delay)
            return
        self._observe(decision.rule, Result.SUCCEEDED, decision.message, it.started)
        self._rounds.pop(key, None)
        first = decision.placements[0]
        message = decision.message if placement is first else describe_placement(req, placement)
        wave.append(Decided(req, Result.SUCCEEDED, placement.node, message, it.hold_of(placement, snap)))

    def _observe(self, rule: str, result: Result, message: str, started: float) -> None:
        if self._observer is not None:
            try:
                self._observer.decided(rule, result, message, self._clock.monotonic() - started)
            except Exception:  # an observer must not break the decision loop
                _log.exception("observer_failed", rule=rule)

    async def _fall_back(self, it: Placing) -> Placement | None:
        """After the node actor of its first placement refused `it`: decide it again on a
        fresh snapshot (every request in flight counted, the batch's wave included: a
        restarted node actor may have lost their holds, so its ledger alone is not enough,
        B3) and try the candidates the ledgers have not refused yet, in B4 order. None
        when none commits or the request no longer lands devices (it is then requeued)."""
        flights = await self._flights()
        snap = self._view.snapshot().with_reservations(h for h in flights.holds if not h.empty)
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

    def _recover(self, rec: Recover) -> Decided:
        """Finish `rec.request` on `rec.node` (B7): claim what it still lands there on the
        node actor; the returned decision goes to the pipeline."""
        req, node = rec.request, rec.node
        self._counts["recovered"] += 1
        _log.info("recover", request_id=req.id, namespace=req.namespace, chosen=node,
                  landing=[k for k, _ in rec.hold.landing] if rec.hold else [])
        ref = self._nodes.node_actor(node)
        if ref is not None and rec.hold is not None:
            tell_quietly(ref, Claim(rec.hold, self._owner))
        return Decided(req, Result.SUCCEEDED, node, rec.message, rec.hold)


__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorStatus",
    "Examine",
    "GetStatus",
    "Resync",
]
