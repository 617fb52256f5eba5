"""Coordinator: the binder's one decision loop (B2). Its writes are its status pipeline's.

Its requests to decide are one work queue (`actors.workqueue.WorkQueue`, keyed by request,
handing requests out round-robin over tenants:
`Examine` and `Resync` add to it, a retry or a stalled request is deferred in it); a small
pump task takes the first key due and tells `_Decide` to the coordinator, which takes every
other key due up to `batch_size` (so its state changes only in `receive`) and plans the batch
synchronously and purely (`model.plan.plan_batch`) on a snapshot of the ClusterView plus
what the requests in flight still hold (asked of the pipeline, `GetFlights`: B3 "counting
reservations in flight"), each decision seeing the holds planned before it. The batch's
placements then run the two-phase protocol on the node actors at once
(`actors.reservation.reserve`); a request a node actor refused is requeued, and a later
batch decides it again on a fresh snapshot and tries its next candidate (one candidate a
batch: `receive` never waits for a fallback). Every decision goes to the
pipeline (`actors.status_pipeline`: `Fly`, one wave per batch), which writes it, keeps the
reservation until the view shows the writes and then releases the node actor's hold (B8:
the pipeline is the only status writer).

On start it reads back the bare VMIs' first refusals from the waiting line's published
summaries (P5, `model.line_memory`: its line starts empty, a failover or a restart loses it),
attaches to its pipeline, adopts the node actors' ledgers (dropping holds of
earlier incarnations) and recovers every request that carries a decision
(`bindRequest.node`) but not all its results, finishing it on that node whatever the
capacity now (B7), before deciding anything. It and its pipeline are one supervised group
(one-for-all, `supervisor.binder`): a crash of either restarts both, so this recovery also
covers the flights a crashed pipeline lost.

Defragmentation (docs/contract.md §3a; off unless `defrag_interval` > 0): every `defrag_interval`
seconds a timer tells `_Defrag`; the round (`_defragment`) runs in `receive`, so inside the
one decision loop (D2), and only when no request is waiting in the queue or falling back
(a complete request waiting is decided first: the round stays due and runs after the batch
that empties the queue). It plans on the view plus the holds in flight
(`model.defrag.plan_round`), reserves every move on its target's node actor (two-phase, as
a B1 move) and hands them to the pipeline as one wave (`Decided.moving_from`: one `move`
write each, an Event on the device). If a node actor refuses one move the whole round is
given up (its holds aborted), so a half-made clearing never shrinks a class (D3). In device
mode each hold names the device recorded on the target (DR2: the node actor refuses one
taken meanwhile), and a re-point within a node lands nothing and takes no unit (DR4).

A nomination whose plan moves idle held devices (docs/contract.md §3c P3/P4, D-moves) has them
carried out the same way (`_carry_moves`), right after the batch that announces it: each move
still to make (its device idle where the plan found it, no write moving it already) reserved
on its target's node actor and handed to the pipeline as a wave of moves, all or none; one
left undone is made when the preemptor is decided again.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import anyio
import structlog

from actors.node_actor import Abort, Adopt, Claim
from actors.ports import Clock, ClusterView, DecisionObserver, NodeDirectory
from actors.reservation import Placing, ledger_refusal, reserve, tell_quietly
from actors.runtime import Actor, ActorContext, ActorRef
from actors.workqueue import WorkQueue
from actors.status_pipeline import (
    Attach,
    Decided,
    Flights,
    Fly,
    GetFlights,
    GetPipelineStatus,
    PipelineStatus,
    Settle,
    Stalled,
)
from model.decide import Decision, Move, Placement, Request, Rule, describe_placement
from model.requests import find_requests
from model.defrag import DEFRAG_REQUEST_PREFIX, DefragPlan, movable, plan_round
from model.device.dra import DeviceRef
from model.device.tainted_records import off_taint
from model.hold import Hold
from model.line import Entry, Identity, Line, reservation
from model.line_memory import NOTHING, Recalled, recall, recalled
from model.line_plan import first_allowed, gate_batch, leaves, line_entry, refresh, ripening_reservations, tidy
from model.line_status import ClassLine
from model.nominate import Preempting
from model.nomination import Nomination, nomination_holds
from model.plan import (Action, Answer, Finish, Nominate, Place, Recover, Requeue, Skip, placement_hold,
                        plan_batch, plan_one, recorded_node, recovery)
from model.reasons import Code, NodeRefusal, Placed, RequestRef, SetRefused
from model.snapshot import Reserving, Snapshot
from model.types import DeviceKey, RequestKey, Result

from actors.coordinator_protocol import (CoordinatorConfig, CoordinatorStatus, Examine, GetLine, GetStatus,
                                         LineState, RefusedAtW1, Resync, VMsWaiting)

_log = structlog.get_logger("gpu_binder.coordinator")


def _tenant(key: RequestKey) -> str:
    """The tenant of a request key (its namespace): the decision queue's fairness group."""
    return key[0]


@dataclass(frozen=True, slots=True)
class _Answer:
    """A decision that lands nothing (Refused, or Succeeded with nothing to move: B5, B6),
    held until the batch's tentative reservations are known to have held."""

    decided: Decided
    rule: Rule
    started: float
    code: Code | None = None  # the refusal's (metrics)

    @property
    def request(self) -> Request:
        return self.decided.request


@dataclass(frozen=True, slots=True)
class _Decide:
    """To itself, from the pump: decide `first` (taken from the queue, processing) and the
    other requests due, as one batch."""

    first: RequestKey


@dataclass(frozen=True, slots=True)
class _Defrag:
    """To itself, from the defragmentation timer: a round is due (D2, D3)."""


@dataclass(slots=True)
class _Chain:
    """A request whose placement the node actors refused, between two batches: the nodes
    refused so far (its next batch tries the next candidate), why, and when its first
    decision started (for the observer)."""

    started: float
    refused: set[str] = field(default_factory=set)
    refusals: list[NodeRefusal] = field(default_factory=list)


class Coordinator(Actor):
    """The coordinator actor (see the module docstring). Build one per incarnation;
    `pipeline` is its status pipeline (the other member of its supervised group);
    `published`, when given, reads the waiting line's published summaries (P5, each
    GPUClass's `status.line`, `model.line_status.published_lines`) once at the start, so that
    the bare VMIs they list keep their places when refused again soon after
    (`model.line_memory`)."""

    name = "coordinator"

    def __init__(
        self,
        view: ClusterView,
        pipeline: ActorRef,
        nodes: NodeDirectory,
        clock: Clock,
        config: CoordinatorConfig | None = None,
        observer: DecisionObserver | None = None,
        published: Callable[[], Mapping[str, ClassLine]] | None = None,
    ) -> None:
        self._observer = observer
        self._published = published  # P5: the line's published summaries, read at start
        self._view = view
        self._pipeline = pipeline
        self._nodes = nodes
        self._clock = clock
        self._cfg = config or CoordinatorConfig()
        self._owner = f"coordinator-{uuid.uuid4().hex[:10]}"
        # on loop time, as anyio's timers; round-robin over tenants (a request key's
        # namespace), so one tenant's burst of requests does not delay another's
        self._queue: WorkQueue[RequestKey] = WorkQueue(fair_by=_tenant)
        self._rounds: dict[RequestKey, int] = {}
        self._missing: dict[RequestKey, float] = {}  # waiting for the view (monotonic s since)
        self._chains: dict[RequestKey, _Chain] = {}  # requests falling back to a next candidate
        self._handled: anyio.Event | None = None  # set once the pump's `_Decide` is handled
        self._counts: Counter[str] = Counter()
        self._defrag_due = False  # a round waits for the queue to empty (D2)
        self._line = Line()  # P5: replaced on each change; empty on a new leader
        self._recalled: Recalled = NOTHING  # P5: bare VMIs' published first refusals
        self._reserved: Mapping[Identity, str] = {}  # P5: the nodes reserved at the last batch
        self._line_reserved: Mapping[Identity, str] = {}  # of them, `model.line.reservation`'s
        self._nominated: dict[RequestKey, Nomination] = {}  # P4: new ones the view does not show yet
        # wall instants (epoch s) of the `decision` lines (bench floor's split of the webhook's
        # wait): when the router first found each queued request complete since its last batch
        # (`Examine.seen_at`; bounded by the queue), those of the batch being decided, its start
        self._seen: dict[RequestKey, float] = {}
        self._batch_seen: dict[RequestKey, float] = {}
        self._batch_at: float | None = None
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
        self._recall_published()
        complete, _ = find_requests(self._view.devices().values())
        snap = self._view.snapshot()
        wave: list[Decided] = []
        for req in complete:
            members = self._view.request_members(req.namespace, req.id)
            node, _ = recorded_node(req.id, members)
            if node is not None:  # before any new decision (B7)
                wave.append(self._recover(recovery(req, node, members, snap)))
            else:
                self._queue.add((req.namespace, req.id))
        if wave:
            await self._tell_pipeline(Fly(self._owner, tuple(wave)))
        _log.info("coordinator_start", owner=self._owner, incarnation=ctx.incarnation,
                  recovered=len(wave), pending=len(self._queue))
        self._tg.start_soon(self._pump)
        self._tg.start_soon(self._resync_timer)
        if self._cfg.defrag_interval > 0:
            self._tg.start_soon(self._defrag_timer)

    async def on_stop(self) -> None:
        self._tg.cancel_scope.cancel()  # the pump and the resync timer (the queue goes with us)

    async def receive(self, message: Any) -> Any:
        match message:
            case Examine(namespace, request_id, seen_at):
                self._queue.add((namespace, request_id))
                if seen_at is not None:
                    self._seen.setdefault((namespace, request_id), seen_at)
            case _Decide(first):
                try:
                    await self._decide_due(first)
                finally:
                    if self._handled is not None:
                        self._handled.set()
                await self._defrag_if_idle()
            case _Defrag():
                self._defrag_due = True
                await self._defrag_if_idle()
            case Stalled(key):
                self._queue.add_after(key, self._cfg.stalled_delay)
            case Resync():
                self._scan()
            case GetStatus():
                return await self.status()
            case GetLine():  # without the bare VMIs whose clients stopped retrying (P5)
                self._set_line(tidy(self._line, self._clock.now(), self._cfg.line))
                return LineState(self._line, dict(self._reserved))
            case VMsWaiting(entries, gone):  # P5: VMs refused at W1 wait too
                self._set_line(refresh(self._line, entries, gone, self._clock.now(),
                                       self._cfg.line.per_namespace))
            case RefusedAtW1(e):  # P5: and bare VMIs, told by the leader's webhook
                now = self._clock.now()
                # the coordinator's clock for its times; the webhook's `retried` and `attempt`
                # kept (a first refusal is not yet a place: `Entry.retried`, P5)
                self._set_line(self._line.refused(replace(e, first_refused=now, last_seen=now), now,
                                                  self._cfg.line.per_namespace))
            case _:
                raise TypeError(f"coordinator: unexpected message {message!r}")
        return None

    async def status(self) -> CoordinatorStatus:
        """This incarnation's counters, the pipeline's asked for (bounded by `ask_timeout`)."""
        p: PipelineStatus = await self._pipeline.ask(GetPipelineStatus(), timeout=self._cfg.ask_timeout)
        c = self._counts
        return CoordinatorStatus(
            owner=self._owner, pending=len(self._queue), deferred=self._queue.statistics().deferred,
            in_flight=p.in_flight, writing=p.writing, decided=c["decided"],
            succeeded=p.succeeded, refused=p.refused, recovered=c["recovered"],
            withdrawn=p.withdrawn, gave_up=p.gave_up, defrag_moves=c["defrag_moves"],
        )

    # -- the loop's progress: the queue, pumped into the mailbox -------------------------------

    async def _pump(self) -> None:
        """Take the first request due (waiting for one: the queue wakes it for a deferral
        too), tell `_Decide` with it, and wait until `receive` handled it: one `_Decide` in
        the mailbox at a time, so a batch takes every request due by then. Touches no other
        state; cancelled with the incarnation."""
        assert self._ref is not None
        while True:
            key = await self._queue.get()
            handled = self._handled = anyio.Event()
            await self._ref.tell(_Decide(key))  # waiting for room: the actor drains its mailbox
            await handled.wait()

    async def _resync_timer(self) -> None:
        """Every `resync_interval` seconds, a `Resync` (the level-based safety net)."""
        assert self._ref is not None
        while True:
            await anyio.sleep(self._cfg.resync_interval)
            await self._ref.tell(Resync())

    async def _defrag_timer(self) -> None:
        """Every `defrag_interval` seconds, a `_Defrag` (D3: only when turned on)."""
        assert self._ref is not None
        while True:
            await anyio.sleep(self._cfg.defrag_interval)
            await self._ref.tell(_Defrag())

    async def _decide_due(self, first: RequestKey) -> None:
        """Decide `first` and the requests due after it (at most `batch_size` in all) as one
        batch; each is done in the queue afterwards (one added meanwhile comes again)."""
        batch = [first]
        try:
            while len(batch) < self._cfg.batch_size:
                try:
                    batch.append(self._queue.get_nowait())
                except anyio.WouldBlock:
                    break
            await self._decide_batch(batch)
        finally:
            for key in batch:
                self._queue.done(key)

    def _scan(self) -> None:
        """Every complete request lacking a result to the queue (requests whose writes run,
        or ended and the view does not show yet, are skipped when their batch is decided)."""
        complete, _ = find_requests(self._view.devices().values())
        for req in complete:
            self._queue.add((req.namespace, req.id))
        self._set_line(tidy(self._line, self._clock.now(), self._cfg.line))

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
        scatter-gather of prepares, one of commits). Requests of the batch whose earlier
        placement the node actors refused are planned first, each on its next candidate
        (`_plan_fall_backs`), and their holds counted for the rest.

        A tentative reservation that did not hold (a node actor refused or did not answer)
        was capacity the later decisions of the batch counted as taken: those are not
        answered but decided again in the next batch (their committed holds aborted), so a
        phantom reservation never makes a refusal, a B5(a) answer or a B4 choice. The
        request refused itself is requeued to try its next candidate in a later batch (no
        fallback is awaited here). The batch's decisions go to the pipeline together."""
        self._batch_seen = {k: self._seen.pop(k) for k in batch if k in self._seen}
        flights = await self._flights()
        fresh: list = []
        again: list[RequestKey] = []
        for ns, rid in batch:
            if (ns, rid) in flights.running or (ns, rid) in flights.settling:
                continue  # its writes run, or ended and the view does not show them yet (B7)
            if (ns, rid) in self._chains:
                again.append((ns, rid))
            else:
                fresh.append((ns, rid, self._view.request_members(ns, rid)))
        if not fresh and not again:
            return
        started = self._clock.monotonic()
        self._batch_at = self._clock.now().timestamp()
        wave: list[Decided] = []
        entries: list[Placing | _Answer] = []
        targets: dict[RequestKey, Placement] = {}  # of the fallbacks (others: their first)
        snap = self._view.snapshot()
        holds = flights.holds_in(snap.devices.get) + self._unrecorded(
            snap, [*((ns, rid) for ns, rid, _ in fresh), *again])
        if again:
            holds += self._plan_fall_backs(again, snap, holds, started, flights, wave, entries, targets)
        actions, after = plan_batch(snap, holds, fresh, self._preempting())
        actions, snap = self._in_line(snap, holds, actions, after)
        for action in actions:
            entry = self._act(action, started, flights, wave)
            if entry is not None:
                entries.append(entry)
        placing = [e for e in entries if isinstance(e, Placing)]
        if placing:
            await reserve(placing, snap, self._nodes, self._owner, self._cfg.ask_timeout,
                          [targets.get(e.key) or e.decision.placements[0] for e in placing])
        cut = next((i for i, e in enumerate(entries)
                    if isinstance(e, Placing) and e.placement is None), len(entries))
        for i, e in enumerate(entries):
            if isinstance(e, Placing) and e.placement is None:
                self._refused(e, targets.get(e.key) or e.decision.placements[0])
            elif i > cut:  # decided against a reservation that did not hold: again
                if isinstance(e, Placing) and e.ref is not None:
                    tell_quietly(e.ref, Abort(e.request.id))
                self._queue.add((e.request.namespace, e.request.id))
            elif isinstance(e, _Answer):
                d = e.decided
                self._observe(e.rule, d.result, e.code, e.started)
                wave.append(d)
            else:
                self._placed(e, snap, wave)
        self._line_after(wave, snap)
        if wave:
            await self._tell_pipeline(Fly(self._owner, tuple(wave)))
        moving = [d.nomination for d in wave if d.nomination is not None and d.nomination.moves]
        if moving:
            await self._carry_moves(moving, flights)

    # -- the waiting line (docs/contract.md §3c P5) ----------------------------------------------

    def _in_line(self, snap: Snapshot, holds: list[Hold], actions: list[Action],
                 after: Snapshot) -> tuple[list[Action], Snapshot]:
        """The planned batch as the line lets it be (`model.line_plan.gate_batch`, with the
        nodes reserved now): the new line kept, the requests decided against a placement the
        line held back requeued (not answered); returns the actions and the snapshot after
        the batch's kept holds (`after`, the planner's, when nobody waits and nothing is
        refused: the batch as planned). The line is tidied first (`model.line_plan.tidy`): a
        bare VMI not retried within `line.retryGrace` holds back nobody, nor reserves a node.
        With P5 off (`line.enabled` false) the batch as planned, nothing reserved."""
        if not self._cfg.line.enabled:
            self._reserved = self._line_reserved = {}
            return actions, after
        self._set_line(tidy(self._line, self._clock.now(), self._cfg.line))
        if not self._line and not any(isinstance(a, Answer) and a.decision.result is Result.REFUSED
                                      for a in actions):
            self._reserved = self._line_reserved = {}
            return actions, after
        now = self._clock.now()
        # the live nominations hold their room for their preemptors (P4, P6) here as in the
        # planner: a set ahead in line cannot use a room nominated for another set
        holds = [*holds, *(h for h in nomination_holds(snap.nominations, now, snap.devices_in)
                           if not h.empty)]
        work = snap.with_reservations(holds)
        # P5: a reservation stays with its holder until it starts (`kept`: the line's own at
        # the last batch; the ripening ones are judged afresh each batch)
        self._line_reserved = reservation(self._line, work, now, self._cfg.line,
                                          self._line_reserved) if self._line else {}
        self._reserved = ripening_reservations(
            self._line, work, now, self._cfg.preemption, self._line_reserved) if self._line else {}
        gated = gate_batch(self._line, snap, holds, actions, now, reservations=self._reserved,
                           settings=self._cfg.line)
        self._set_line(gated.line)
        out: list[Action] = []
        for a in gated.actions:
            key = (a.request.namespace, a.request.id) if isinstance(a, Answer | Nominate) else None
            if key is not None and key in gated.again:
                self._queue.add(key)  # decided again in a later batch, not answered (nor nominated)
            else:
                out.append(a)
        return out, gated.snapshot

    def _line_after(self, wave: list[Decided], snap: Snapshot) -> None:
        """The batch's written decisions in the line: a Succeeded set leaves it (its wait
        observed), a refusal by the node ledgers (room taken meanwhile) enters it."""
        line = self._line
        for d in wave:
            if d.result is Result.SUCCEEDED:
                line, left = leaves(line, snap, d.request)
                if left is not None:
                    self._observe_left(left)
            elif d.code is Code.LEDGERS_REFUSED:
                now = self._clock.now()
                line = line.refused(line_entry(snap, d.request, now), now, self._cfg.line.per_namespace)
        self._set_line(line)

    def _recall_published(self) -> None:
        """P5 after a failover or a restart: the first refusals of the bare VMIs the line's
        published summaries list (`published`, the GPUClasses' `status.line`), kept for
        `line.retryGrace` from now (`model.line_memory.recalled`), so that such a set refused
        again meanwhile keeps its place (`_set_line`). Nothing with P5 off."""
        if self._published is None or not self._cfg.line.enabled:
            return
        self._recalled = recalled(self._published(), self._clock.now(), self._cfg.line.retry_grace)
        if self._recalled:
            _log.info("line_recalled", sets=len(self._recalled.since),
                      until=self._recalled.until.isoformat())

    def _set_line(self, line: Line) -> None:
        """Keep `line` as the waiting line and tell the observer its lengths; with P5 off
        (`line.enabled` false) the line stays empty: nobody waits, nothing is observed. A bare
        VMI the published summaries listed, entering within `line.retryGrace` of this
        incarnation's start, takes its published first refusal (`model.line_memory.recall`:
        once each)."""
        if self._recalled:
            before, now = self._recalled, self._clock.now()
            line, self._recalled = recall(before, line, now)
            if now <= before.until and len(self._recalled.since) < len(before.since):
                _log.info("line_places_recalled", sets=sorted(
                    f"{ns}/{vmi}" for ns, vmi in before.since.keys() - self._recalled.since.keys()))
        if line is self._line or not self._cfg.line.enabled:
            return
        self._line = line
        observe = getattr(self._observer, "line_changed", None)
        if observe is None:
            return
        try:
            observe({c: len(line.of_class(c)) for c in line.classes})
        except Exception:  # an observer must not break the decision loop
            _log.exception("observer_failed", rule="line")

    def _observe_preempted(self, req: Request, victims: int) -> None:
        """A fresh nomination (P4): one preemption of `req`'s classes, `victims` sets to stop
        (the observer's optional `preempted(classes, victims)`, metrics)."""
        observe = getattr(self._observer, "preempted", None)
        if observe is None:
            return
        classes = tuple(dict.fromkeys(m.class_name for m in self._view.request_members(req.namespace, req.id)))
        try:
            observe(classes, victims)
        except Exception:  # an observer must not break the decision loop
            _log.exception("observer_failed", rule="preemption")

    def _observe_left(self, left: Entry) -> None:
        observe = getattr(self._observer, "left_line", None)
        if observe is None:
            return
        try:
            observe(left.priority, left.shape.classes,
                    (self._clock.now() - left.first_refused).total_seconds())
        except Exception:  # an observer must not break the decision loop
            _log.exception("observer_failed", rule="line")

    def _plan_fall_backs(self, keys: list[RequestKey], snap: Snapshot, holds: list[Hold],
                         started: float, flights: Flights, wave: list[Decided],
                         entries: list[Placing | _Answer],
                         targets: dict[RequestKey, Placement]) -> list[Hold]:
        """Decide again each request of `keys` (refused by a node actor in an earlier batch)
        on `snap` with `holds` (every request in flight counted: a restarted node actor may
        have lost their holds, so its ledger alone is not enough, B3) and the holds planned
        before it; a placement goes for its next candidate in B4 order that no node actor
        refused yet (into `entries`, its target into `targets`), and is answered Refused by
        the ledgers, or retried later, when none is left (`_placed`, B1). Anything else the
        planner says (withdrawn, now refused or placed in place) is carried out as for any
        request. Pure but for booking; returns the holds it planned."""
        preempting = self._preempting()
        noms = [h for h in nomination_holds(snap.nominations, preempting.now, snap.devices_in) if not h.empty]
        work = Reserving(snap.with_reservations([*holds, *noms]))
        planned: list[Hold] = []
        for key in keys:
            chain = self._chains[key]
            action = plan_one(work.snapshot, key[0], key[1], self._view.request_members(*key),
                              preempting)
            if not isinstance(action, Place):
                del self._chains[key]
                entry = self._act(action, chain.started, flights, wave)
                if entry is not None:
                    entries.append(entry)
                held = action.hold if isinstance(action, Recover) else None
            else:
                it = Placing(key, action.request, action.decision, chain.started,
                             refusals=chain.refusals)
                target = first_allowed(self._line, work.snapshot, action.request,
                                       [p for p in action.decision.placements
                                        if (p.moves or p.devices) and p.node not in chain.refused],
                                       reservations=self._reserved, settings=self._cfg.line)
                if target is None:  # every candidate refused: a round is over
                    del self._chains[key]
                    self._placed(it, work.snapshot, wave)
                    continue
                _log.info("fall_back", request_id=key[1], namespace=key[0], chosen=target.node,
                          refused=sorted(chain.refused))
                targets[key] = target
                entries.append(it)
                held = placement_hold(action.request, target, work.snapshot)
            if held is not None and not held.empty:
                work.add(held)
                planned.append(held)
        return planned

    def _unrecorded(self, snap: Snapshot, deciding: Iterable[RequestKey] = ()) -> list[Hold]:
        """The holds of the new nominations this incarnation decided that `snap` (the view)
        does not show yet (P4, P6: a nomination holds its room from its decision on; its
        pipeline records it before the refusal, and a later batch must not promise that room,
        or the victims' freed room, to another set meanwhile). One leaves when the view shows
        it or another nomination of its preemptor, when it expires, or when its request is
        decided again (in `deciding`: its writes gave up; the new decision nominates anew)."""
        if not self._nominated:
            return []
        for key in deciding:
            self._nominated.pop(key, None)
        now = self._clock.now()
        out = []
        for key, n in list(self._nominated.items()):
            if not n.live(now) or snap.nomination_for(n.namespace, n.vmi) is not None:
                del self._nominated[key]
                continue
            out.extend(n.holds(snap.devices.get))
        return out

    def _preempting(self) -> Preempting:
        """This batch's preemption context (P4: now, the settings). Also when this replica
        does not nominate (`settings.enabled` False): the live nominations (one read from the
        API after a failover) still hold their room for their preemptors (P6), and a
        preemptor is still decided on its nominated node."""
        return Preempting(self._clock.now(), self._cfg.preemption)

    def _refused(self, it: Placing, target: Placement) -> None:
        """The node actor of `target` refused `it`: requeue it to try its next candidate in
        a later batch (its chain remembers the nodes refused so far)."""
        chain = self._chains.get(it.key)
        if chain is None:
            chain = self._chains[it.key] = _Chain(it.started, refusals=it.refusals)
        chain.refused.add(target.node)
        self._queue.add(it.key)

    def _act(self, action: Action, started: float, flights: Flights,
             wave: list[Decided]) -> Placing | _Answer | None:
        """Carry out what needs no waiting of one planned action: recover, finish a
        cut-short refusal, requeue, or book the decision (into `wave` when it goes at
        once); returns what waits for the batch's reservation (an `_Answer`, which lands
        nothing, or a `Placing`)."""
        match action:
            case Skip(ns, rid):
                self._rounds.pop((ns, rid), None)
                self._missing.pop((ns, rid), None)
                if (ns, rid) in flights.stalled:  # nothing more to write: only unobserved binds
                    tell_quietly(self._pipeline, Settle((ns, rid)))
                return None
            case Recover():
                wave.append(self._recover(action))
                return None
            case Finish(req, message, code):  # a refusal whose writes were cut short: finish it
                wave.append(Decided(req, Result.REFUSED, None, message, None, code=code))
                return None
            case Requeue(req, error):  # a bug in the model must not crash-loop the binder
                _log.error("decide_failed", request_id=req.id, namespace=req.namespace, error=error)
                self._queue.add_after((req.namespace, req.id), self._cfg.poison_delay)
                return None
            case Nominate(req, nominated):  # P4: the nomination is written before the refusal
                self._counts["decided"] += 1
                reason, n = nominated.reason, nominated.nomination
                if nominated.fresh:
                    self._nominated[(req.namespace, req.id)] = n  # its room held until the view shows it
                _log.info("decision", request_id=req.id, namespace=req.namespace, vmi=req.vmi,
                          rule=Rule.REFUSED, result=Result.REFUSED.value, chosen=None, candidates=[],
                          nominated=n.node, victims=[v.name for v in n.victims], fresh=nominated.fresh,
                          **self._instants(req))
                if nominated.fresh:
                    self._observe_preempted(req, len(n.victims))
                return _Answer(Decided(req, Result.REFUSED, None, reason.render(), None, code=reason.code,
                                       nomination=n), Rule.REFUSED, started, reason.code)
        req, decision = action.request, action.decision
        if isinstance(action, Answer) and self._awaits_view(req, decision):
            return None
        self._counts["decided"] += 1
        _log.info("decision", request_id=req.id, namespace=req.namespace, vmi=req.vmi,
                  rule=decision.rule, result=decision.result.value, chosen=decision.node,
                  candidates=[p.node for p in decision.placements], **self._instants(req))
        if isinstance(action, Answer):
            reason = decision.reason
            code = reason.code if reason is not None else None
            return _Answer(Decided(req, decision.result, decision.node, decision.message, None,
                                   code=code), decision.rule, started, code)
        return Placing((req.namespace, req.id), req, decision, started, hold=action.hold)

    def _instants(self, req: Request) -> dict[str, float | None]:
        """The `decision` line's wall instants (epoch s, the Clock's `now()`): `seen_at` when
        the router found `req` complete (`Examine.seen_at`; None when it was queued otherwise,
        by a resync or this incarnation's start, or decided again in a later batch) and
        `batch_at` when the batch deciding it started. `bench floor` joins them with the
        webhook's instants (docs/benchmarks.md)."""
        return {"seen_at": self._batch_seen.pop((req.namespace, req.id), None),
                "batch_at": self._batch_at}

    def _awaits_view(self, req: Request, decision: Decision) -> bool:
        """A refusal only for devices or classes the view does not hold
        (`SetRefused.only_missing`) waits for the view: requeued after `missing_retry`
        while the view does not follow the API server (an informer relisting after an
        outage holds none of what was made meanwhile), and until it has followed it for
        `missing_grace` s (a class's watch may deliver it after the device that names it).
        Then it is written as any refusal (bad input gets its answer). True: requeued."""
        key = (req.namespace, req.id)
        reason = decision.reason
        if decision.result is not Result.REFUSED or not isinstance(reason, SetRefused) \
                or not reason.only_missing:
            self._missing.pop(key, None)
            return False
        now, following = self._clock.monotonic(), self._view.following()
        if key not in self._missing:
            _log.info("waiting_for_view", request_id=req.id, namespace=req.namespace,
                      following=following, why=reason.render())
        if not following:
            self._missing[key] = now
        if now - self._missing.setdefault(key, now) < self._cfg.missing_grace:
            self._queue.add_after(key, self._cfg.missing_retry)
            return True
        self._missing.pop(key, None)
        return False

    def _placed(self, it: Placing, snap: Snapshot, wave: list[Decided]) -> None:
        """Hand a placed item to `wave`; one without a placement (every candidate refused
        by the node actors) is retried after `requeue_delay`, or answered Refused after
        `max_rounds` such rounds (ledgers, B1)."""
        req, decision, key = it.request, it.decision, it.key
        placement = it.placement
        if placement is None:
            rounds = self._rounds.get(key, 0) + 1
            if rounds >= self._cfg.max_rounds:
                self._rounds.pop(key, None)
                _log.info("refused_by_ledgers", request_id=req.id, namespace=req.namespace,
                          reasons=[r.render() for r in it.refusals])
                refusal = ledger_refusal(req, snap, it.refusals)
                self._observe(Rule.LEDGERS, Result.REFUSED, refusal.code, it.started)
                wave.append(Decided(req, Result.REFUSED, None, refusal.render(), None,
                                    code=refusal.code))
            else:
                self._rounds[key] = rounds
                self._queue.add_after(key, self._cfg.requeue_delay)
            return
        self._observe(decision.rule, Result.SUCCEEDED, None, it.started)
        self._rounds.pop(key, None)
        self._chains.pop(key, None)
        first = decision.placements[0]
        message = decision.message if placement is first else describe_placement(req, placement)
        _log_off_taint(req, placement, snap)
        wave.append(Decided(req, Result.SUCCEEDED, placement.node, message, it.hold_of(placement, snap)))

    # -- defragmentation (docs/contract.md §3a) ------------------------------------------------------

    async def _defrag_if_idle(self) -> None:
        """Run the due round when no request waits for the loop (D2: admissions first)."""
        if not self._defrag_due or len(self._queue) or self._queue.processing() or self._chains:
            return
        self._defrag_due = False
        await self._defragment()

    async def _defragment(self) -> None:
        """One round (see the module docstring): plan on the view plus the holds in flight,
        reserve every move on its target node actor, hand them to the pipeline."""
        flights = await self._flights()
        snap = self._view.snapshot()
        holds = flights.holds_in(snap.devices.get)
        # P4, P6: nominated room is nobody else's, not even a move's
        holds += [h for h in nomination_holds(snap.nominations, self._clock.now(), snap.devices_in)
                  if not h.empty] + self._unrecorded(snap)
        snap = snap.with_reservations(holds)
        plan = plan_round(snap, max_moves=self._cfg.defrag_max_moves)
        if not plan.moves:
            self._observe_defrag(0, plan)
            return
        started = self._clock.monotonic()
        items = [_move_placing(m.device, m.resource, m.from_node, m.to_node, m.to_device, m.repoint, started)
                 for m in plan.moves]
        if not await self._reserve_moves(items, snap):
            _log.info("defrag_given_up", refusals=[r.render() for it in items for r in it.refusals])
            self._observe_defrag(0, plan, given_up=True)
            return
        wave = tuple(Decided(it.request, Result.SUCCEEDED, m.to_node, m.render(), it.hold,
                             moving_from=m.from_node, moving_device=m.from_device)
                     for it, m in zip(items, plan.moves))
        for m, it in zip(plan.moves, items):
            _log.info("defrag_move", request_id=it.request.id, namespace=m.device[0],
                      device=m.device[1], from_node=m.from_node, to_node=m.to_node,
                      **({"from_device": str(m.from_device), "to_device": str(m.to_device)}
                         if m.to_device is not None else {}),
                      why=m.render())
        self._counts["defrag_moves"] += len(wave)
        await self._tell_pipeline(Fly(self._owner, wave))
        self._observe_defrag(len(wave), plan)

    async def _reserve_moves(self, items: list[Placing], snap: Snapshot) -> bool:
        """Reserve every move of `items` on its target's node actor (two-phase, as a B1 move);
        when one is refused, abort the others' holds and return False (all or none: a half
        made clearing or room helps nobody)."""
        await reserve(items, snap, self._nodes, self._owner, self._cfg.ask_timeout)
        if all(it.placement is not None for it in items):
            return True
        for it in items:
            if it.placement is not None and it.ref is not None:
                tell_quietly(it.ref, Abort(it.request.id))
        return False

    async def _carry_moves(self, nominations: list[Nomination], flights: Flights) -> None:
        """P3/P4 with D1-D5: carry out the D-moves of `nominations` (just announced, fresh or
        reused) through defragmentation's path: each move still to make is reserved on its
        target's node actor and handed to the pipeline as a wave of `Decided` moves (one `move`
        write each, an Event on the device). A move is still to make when the view shows its
        device idle and movable (D1) where the plan found it (same node, device mode: same
        record) and no flight is moving it already: so each is written once, and a move left
        undone (a leader killed in between, a node actor that refused) is made again when its
        preemptor is decided again. A device that changed meanwhile (attached, deleted, moved
        elsewhere) is left alone: the room is then not free, the preemptor is not admitted
        until it is, and the nomination expires as any. A nomination's moves go all or none.
        The moves' targets are held for the nomination meanwhile (`Nomination.holds`)."""
        snap = self._view.snapshot()
        busy = {k for h in flights.holds for k, _ in h.landing} | {k for h in flights.holds for k, _ in h.devices}
        started = self._clock.monotonic()
        for n in nominations:
            todo = []
            for m in n.moves:
                d = snap.device(*m.key)
                if (d is None or m.key in busy or d.bound_node != m.from_node or not movable(d, snap)
                        or (m.from_device is not None and d.status.device != m.from_device)):
                    continue
                todo.append(m)
            if not todo:
                continue
            items = [_move_placing(m.key, m.resource, m.from_node, m.to_node, m.to_device, m.repoint, started)
                     for m in todo]
            if not await self._reserve_moves(items, snap):
                _log.info("preemption_moves_given_up", nomination=n.name,
                          refusals=[r.render() for it in items for r in it.refusals])
                continue
            wave = tuple(Decided(it.request, Result.SUCCEEDED, m.to_node, m.render(n.preemptor), it.hold,
                                 moving_from=m.from_node, moving_device=m.from_device)
                         for it, m in zip(items, todo))
            for m, it in zip(todo, items):
                _log.info("preemption_move", request_id=it.request.id, namespace=m.namespace, device=m.name,
                          from_node=m.from_node, to_node=m.to_node, nomination=n.name,
                          **({"from_device": str(m.from_device), "to_device": str(m.to_device)}
                             if m.to_device is not None else {}))
            self._counts["preemption_moves"] += len(wave)
            await self._tell_pipeline(Fly(self._owner, wave))

    def _observe_defrag(self, moves: int, plan: DefragPlan, *, given_up: bool = False) -> None:
        observe = getattr(self._observer, "defragmented", None)
        if observe is None:
            return
        sizes = plan.before if given_up or not moves else plan.after
        try:
            observe(moves, {x.class_name: x.size for x in sizes})
        except Exception:  # an observer must not break the decision loop
            _log.exception("observer_failed", rule=Rule.D3)

    def _observe(self, rule: Rule, result: Result, code: Code | None, started: float) -> None:
        if self._observer is not None:
            try:
                self._observer.decided(rule, result, code, self._clock.monotonic() - started)
            except Exception:  # an observer must not break the decision loop
                _log.exception("observer_failed", rule=rule)

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


def _move_placing(device: DeviceKey, resource: str, from_node: str, to_node: str,
                  to_device: DeviceRef | None, repoint: bool, started: float) -> Placing:
    """One move of an idle held device (a defragmenting move, D2, or a preemption plan's
    D-move) as a request of its own (id `DEFRAG_REQUEST_PREFIX` + random) to reserve on the
    target's node actor: in device mode the hold names the device recorded on the target
    (DR2); a re-point lands nothing and takes no unit (DR4: the record alone changes)."""
    rid = f"{DEFRAG_REQUEST_PREFIX}{uuid.uuid4().hex[:12]}"
    ns, name = device
    req = Request(rid, ns, "", (name,))
    chosen = ((device, to_device),) if to_device is not None else ()
    moves = () if repoint else (Move(device, from_node, to_node),)
    needs = () if repoint else ((resource, 1),)
    placement = Placement(to_node, moves, needs, (), chosen)
    hold = Hold(rid, ns, to_node, needs, (), tuple((mv.device, resource) for mv in moves), chosen)
    outcome = Placed(RequestRef(ns, "", rid), to_node, (), ((name, from_node),))
    decision = Decision(rid, Result.SUCCEEDED, to_node, (placement,), Rule.D3, outcome)
    return Placing((ns, rid), req, decision, started, hold=hold)


def _log_off_taint(req: Request, placement: Placement, snap: Snapshot) -> None:
    """HL1: one log line per member whose record names a device under a NoSchedule/NoExecute
    taint and which `placement` re-points within its node or moves (`off_taint`): the node,
    the tainted device, the taint and what put it there, and where the record goes. Nothing
    in count mode or when no record is tainted."""
    if not snap.mode.matches:
        return
    members = [m for name in req.devices if (m := snap.device(req.namespace, name)) is not None]
    for o in off_taint(snap, members, placement.node, dict(placement.devices)):
        r = o.record
        _log.info("record_off_tainted_device", request_id=req.id, namespace=req.namespace,
                  vmi=req.vmi, member=r.device, node=r.node, device=r.recorded,
                  taint=f"{r.key}:{r.effect}", rule=r.rule or "ResourceSlice",
                  to_node=o.to_node, to_device=o.to_device, repoint=o.repoint)


__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorStatus",
    "Examine",
    "GetLine",
    "GetStatus",
    "LineState",
    "RefusedAtW1",
    "Resync",
    "VMsWaiting",
]
