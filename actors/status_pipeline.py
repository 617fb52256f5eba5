"""StatusPipeline: the coordinator's write half, the binder's only status writer (B8).

It owns the *flights*: requests the coordinator decided (and, when they land devices,
reserved on a node actor) whose writes are running, or done but not yet visible in the
view. A decision arrives as a message (`Fly`: one batch's decisions, written together as one
wave); the pipeline writes each member once (`StatusWriter.write_many`: the decided node,
the placement when the member lands and the result in one write; the first applied one is
the durable record of the decision, B7). Writes that fail with a conflict or a transient
error are retried with tenacity (bounded: `retry_attempts` tries in all); RequestWithdrawn
or NotFound stop the request (what is written stays); when the retries give up the request
is *stalled*: it keeps its whole reservation and the coordinator is told (`Stalled`) to
examine it again after `stalled_delay`.

A refusal that announces a nomination (P4, `Decided.nomination`: `preemption_nominated`) is
written only after its nomination is recorded (`NominationWriter.put`, retried as the status
writes are): a leader killed between the two leaves the nomination, which the next leader's
decision finds and reuses, and never a refusal without its nomination. A nomination that cannot
be recorded stalls its request (nothing of it written).

A flight keeps its reservation until its writes are done *and* the view shows them
(`model.hold.outstanding`, the rule the node ledger and the snapshot use), or for at most
`settle_timeout` after its writes ended; then the pipeline sends `Release` to the node
actor and forgets it. Meanwhile it answers the coordinator's `GetFlights` with what every
flight still holds and which requests are running or stalled, so each decision counts them
(B3: "counting reservations in flight") and no request is decided twice while its writes run.

State changes only in `receive` (and `on_tick`, handled from the mailbox like a message):
the write tasks (children in the incarnation's task group) read nothing of it and report
their outcome by a message to the pipeline itself (`_Written`).

Supervision: the pipeline and its coordinator are one group
(`supervisor.tree.Supervisor.start_group`, one-for-all). A crash of either stops both, and
the new coordinator incarnation adopts the node ledgers (dropping every hold of the old one)
and recovers every decided request from the view (B7): so a writer crash never leaves a
ledger holding capacity nobody releases (Adopt drops it), nor a coordinator deciding without
the flights it no longer sees (it is new and reads the view). A fresh pipeline incarnation
drops decisions queued by an earlier coordinator incarnation (`Fly.owner` is not the
`Attach`ed one): the new coordinator recovers or decides those requests again.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Callable, Mapping

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
from actors.node_actor import Release
from actors.ports import Clock, ClusterView, NominationWriter, NodeDirectory, StatusWrite, StatusWriter
from actors.runtime import Actor, ActorContext, ActorRef
from model.device.dra import DeviceRef
from model.device.records import recorded_on
from model.decide import Request
from model.hold import Hold, outstanding
from model.nomination import Nomination
from model.reasons import Code
from model.types import DeviceKey, GPUDevice, RequestKey, Result

_log = structlog.get_logger("gpu_binder.status_pipeline")

# -- messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decided:
    """One decided request to write: `result`, `node` (None: Refused), the `message` to
    write on every member with the refusal's `code` beside it (None when Succeeded), and
    `hold`, what it lands on `node` (None: nothing lands; the node actor holds the same
    capacity, committed or claimed, until `Release`).

    A defragmenting move (D2) is a Decided too, with `moving_from` set: its one member
    goes from `moving_from` to `node` by one `move` write (`StatusWrite`), `message` the
    why for its Event; it keeps its hold until the view shows the device on `node`. In
    device mode `moving_device` is the record it leaves and the hold names the device it
    records on `node` (`Hold.devices`); `moving_from == node` is a re-point (DR4).

    P4: `nomination`, on a refusal announcing it (`preemption_nominated`), is recorded before
    any member is written."""

    request: Request
    result: Result
    node: str | None
    message: str
    hold: Hold | None
    moving_from: str | None = None
    moving_device: DeviceRef | None = None
    code: Code | None = None
    nomination: Nomination | None = None

    @property
    def key(self) -> RequestKey:
        return (self.request.namespace, self.request.id)


@dataclass(frozen=True, slots=True)
class Attach:
    """Sent first by every coordinator incarnation: `owner` is its id (decisions of other
    owners are dropped), `coordinator` where `Stalled` goes. Reply: None."""

    owner: str
    coordinator: ActorRef


@dataclass(frozen=True, slots=True)
class Fly:
    """Write `decisions` (one wave: their writes go in one `write_many`) for coordinator
    incarnation `owner`. A decision for a request already in flight replaces it (the
    coordinator only re-decides requests whose writes are not running), releasing the
    node the old one held when it differs. Reply: None."""

    owner: str
    decisions: tuple[Decided, ...]


@dataclass(frozen=True, slots=True)
class GetFlights:
    """Reply: `Flights` (after dropping the flights the view has caught up with)."""


@dataclass(frozen=True, slots=True)
class Flights:
    """What the flights still hold (B3: one `Hold` per flight that still takes capacity,
    as `outstanding` gives it), which requests have writes running (not to be decided
    again) and which are stalled (their writes gave up)."""

    holds: tuple[Hold, ...]
    running: frozenset[RequestKey]
    stalled: frozenset[RequestKey]
    attempted: tuple[frozenset[DeviceKey] | None, ...] = ()
    """Per hold (same order), the placement writes its flight attempted once its writes
    stopped (`outstanding`'s filter), None while they run (or for a move)."""
    settling: frozenset[RequestKey] = frozenset()
    """Requests whose writes ended (not stalled) and which the view does not show yet: not
    to be decided again either (B7: their first applied write is the decision). A view
    behind its API server (a relist after a kube-apiserver restart) still shows them
    pending; deciding them again wrote a second answer over the first, one the webhook had
    already read (the device soak's `admitted-not-placed`)."""

    def holds_in(self, device: Callable[[DeviceKey], GPUDevice | None]) -> list[Hold]:
        """The non-empty holds as a later reading of the view shows them (`device`: the
        snapshot the caller decides on): a member that reading shows landed holds no longer
        (`model.hold.outstanding` applied again). B3: the coordinator asks for the flights
        and then takes its snapshot, so a member seen Bound in between would otherwise be
        counted twice, as Bound and as held (a tenant at its budget's edge refused for a
        slot it has; issue 39's CI run: "198 bound + 2 being bound of 200" for 199 VMIs).
        Pruning only drops flights the view already caught up with, so the later reading
        shows those too: nothing is counted less than once."""
        out = []
        for i, hold in enumerate(self.holds):
            attempted = self.attempted[i] if i < len(self.attempted) else None
            left = outstanding(hold, device, attempted=attempted)
            if not left.empty:
                out.append(left)
        return out


@dataclass(frozen=True, slots=True)
class Settle:
    """The coordinator found nothing left to write for stalled request `key` (every
    member answered, or it is gone): keep only what its attempted placement writes may
    still land, until the view shows them. Reply: None."""

    key: RequestKey


@dataclass(frozen=True, slots=True)
class GetPipelineStatus:
    """Reply: `PipelineStatus`."""


@dataclass(frozen=True, slots=True)
class PipelineStatus:
    """Counters of this incarnation: `in_flight` flights (writes running, stalled, or
    done and not yet seen in the view), `writing` with writes running; outcomes of the
    writes that ended: `succeeded`/`refused` (done), `withdrawn`, `gave_up`."""

    in_flight: int
    writing: int
    succeeded: int
    refused: int
    withdrawn: int
    gave_up: int


@dataclass(frozen=True, slots=True)
class Stalled:
    """Told to the coordinator: the writes of `key` gave up (its reservation is kept):
    examine it again after `stalled_delay`."""

    key: RequestKey


class WriteOutcome(StrEnum):
    """How the writes of a flight ended (the value is the `outcome` of the `writes_finished`
    log line and a `PipelineStatus` counter): `DONE` every member written (or already so),
    `WITHDRAWN` a member no longer carries the request or is gone (RequestWithdrawn,
    NotFound: what was written stays), `GAVE_UP` the retries were exhausted (the flight is
    stalled and keeps its reservation)."""

    DONE = "done"
    WITHDRAWN = "withdrawn"
    GAVE_UP = "gave_up"


@dataclass(frozen=True, slots=True)
class _Written:
    """A write task's report: the flights `serials` ended with `outcome`."""

    serials: tuple[int, ...]
    outcome: WriteOutcome


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """Seconds unless named otherwise. `write_timeout` bounds one `write_many` call (and
    a write task's report to its pipeline); `retry_*` the tenacity policy per flight
    (`retry_attempts` tries in all, counting the first); `settle_timeout` the longest a
    finished flight waits for the view to show its writes (polled every `settle_poll`)."""

    write_timeout: float = 10.0
    retry_attempts: int = 6
    retry_initial: float = 0.05
    retry_max: float = 2.0
    retry_jitter: float = 0.05
    settle_timeout: float = 60.0
    settle_poll: float = 0.05


@dataclass(slots=True)
class _Flight:
    """A decided request whose writes are running (`running`), gave up (`stalled`: the
    whole reservation kept), or ended at `finished_at` and wait for the view. `written`:
    members whose placement write was attempted (may have applied). `started_at` and
    `finished_at` are loop time; `flown_at` the wall time (epoch s, the Clock's `now()`) at
    which it was registered, for the `writes_finished` line."""

    decided: Decided
    serial: int
    started_at: float
    written: frozenset[DeviceKey] = frozenset()
    running: bool = True
    stalled: bool = False
    finished_at: float | None = None
    withdrawn: bool = False
    flown_at: float | None = None


_serials = itertools.count(1)


class StatusPipeline(Actor):
    """The pipeline actor (see the module docstring). Build one per incarnation."""

    name = "status_pipeline"

    def __init__(self, view: ClusterView, writer: StatusWriter, nodes: NodeDirectory,
                 clock: Clock, config: PipelineConfig | None = None,
                 nominations: NominationWriter | None = None) -> None:
        self._view = view
        self._writer = writer
        self._nominations = nominations
        self._nodes = nodes
        self._clock = clock
        self._cfg = config or PipelineConfig()
        self.tick_interval = self._cfg.settle_poll
        self._owner: str | None = None
        self._coordinator: ActorRef | None = None
        self._flights: dict[RequestKey, _Flight] = {}
        self._by_serial: dict[int, RequestKey] = {}
        self._counts: Counter[str] = Counter()
        self._settling = False  # some finished flight waits for the view (`_prune`)
        self._ref: ActorRef | None = None
        self._tg: Any = None

    def log_context(self) -> Mapping[str, Any]:
        return {"actor": "status_pipeline"}

    def reservations(self) -> int:
        """Flights (requests in flight)."""
        return len(self._flights)

    async def on_start(self, ctx: ActorContext) -> None:
        self._ref, self._tg = ctx.ref, ctx.task_group

    async def on_stop(self) -> None:
        self._tg.cancel_scope.cancel()  # writes die with the incarnation: the next one recovers

    def wants_tick(self) -> bool:
        """Ticks poll the view for finished flights it has not caught up with yet (as the
        last `_prune` found them: every message that ends writes prunes)."""
        return self._settling

    async def on_tick(self) -> None:
        self._prune()

    async def receive(self, message: Any) -> Any:
        match message:
            case _Written(serials, outcome):
                for serial in serials:
                    self._finish(serial, outcome)
                self._prune()
                return None
            case Fly(owner, decisions):
                if owner != self._owner:
                    _log.info("stale_decisions_dropped", owner=owner, attached=self._owner,
                              requests=[d.request.id for d in decisions])
                    return None
                self._fly(decisions)
                return None
            case GetFlights():
                return self.flights()
            case Settle(key):
                flight = self._flights.get(key)
                if flight is not None and flight.stalled:
                    flight.stalled = False
                    flight.finished_at = anyio.current_time()
                self._prune()
                return None
            case Attach(owner, coordinator):
                self._owner, self._coordinator = owner, coordinator
                return None
            case GetPipelineStatus():
                return self.status()
        raise TypeError(f"status pipeline: unexpected message {message!r}")

    def flights(self) -> Flights:
        """`Flights` now (see `GetFlights`)."""
        self._prune()
        holds, attempted = [], []
        for flight in self._flights.values():
            left = self._outstanding(flight)
            if left is not None and not left.empty:
                holds.append(left)
                attempted.append(self._attempted(flight))
        return Flights(
            tuple(holds),
            frozenset(k for k, f in self._flights.items() if f.running),
            frozenset(k for k, f in self._flights.items() if f.stalled),
            tuple(attempted),
            frozenset(k for k, f in self._flights.items() if not f.running and not f.stalled),
        )

    def status(self) -> PipelineStatus:
        c = self._counts
        return PipelineStatus(
            in_flight=len(self._flights),
            writing=sum(1 for f in self._flights.values() if f.running),
            succeeded=c["succeeded"], refused=c["refused"], withdrawn=c[WriteOutcome.WITHDRAWN],
            gave_up=c[WriteOutcome.GAVE_UP],
        )

    # -- flights --------------------------------------------------------------------------------

    def _fly(self, decisions: tuple[Decided, ...]) -> None:
        """Register the flights of one wave, plan their writes (read from the view now)
        and start one task writing them all."""
        plan: list[tuple[int, list[StatusWrite]]] = []
        first: dict[int, Nomination] = {}  # P4: recorded before the flight's writes
        now, wall = anyio.current_time(), self._clock.now().timestamp()
        for d in decisions:
            if self._answered_otherwise(d):
                # moot (B7): nothing written; its own reservation released, the flight that
                # answered it (if still here) kept with its hold until the view shows it
                self._counts[WriteOutcome.WITHDRAWN] += 1
                if d.node is not None and d.hold is not None:
                    self._release(d)
                continue
            old = self._flights.get(d.key)
            if old is not None:
                self._by_serial.pop(old.serial, None)
                if old.decided.node is not None and old.decided.hold is not None \
                        and old.decided.node != d.node:
                    self._release(old.decided)  # an earlier attempt held capacity elsewhere
            serial = next(_serials)
            writes, written = self._writes(d)
            self._flights[d.key] = _Flight(d, serial, now, written, flown_at=wall)
            self._by_serial[serial] = d.key
            if writes:
                plan.append((serial, writes))
                if d.nomination is not None:
                    first[serial] = d.nomination
            else:
                self._finish(serial, WriteOutcome.DONE)  # every member carries it already
        if plan:
            self._tg.start_soon(self._write_wave, plan, first)
        self._prune()

    def _finish(self, serial: int, outcome: WriteOutcome) -> None:
        """Book the end of flight `serial`'s writes (a report of a replaced flight is
        ignored)."""
        key = self._by_serial.get(serial)
        flight = self._flights.get(key) if key is not None else None
        if flight is None or flight.serial != serial or not flight.running:
            return
        d = flight.decided
        flight.running = False
        flight.finished_at = anyio.current_time()
        self._counts[outcome] += 1
        flight.withdrawn = outcome is WriteOutcome.WITHDRAWN
        if outcome is WriteOutcome.DONE:
            self._counts["moved" if d.moving_from is not None
                         else "succeeded" if d.result is Result.SUCCEEDED else "refused"] += 1
        elif outcome is WriteOutcome.GAVE_UP:
            flight.stalled = True
            if self._coordinator is not None:
                try:
                    self._coordinator.tell_nowait(Stalled(d.key))
                except (MailboxFull, ActorStopped):
                    pass  # the coordinator's resync examines it again (level based)
        # flown_at, finished_at: wall s (bench floor's split of the webhook's wait)
        _log.info("writes_finished", request_id=d.request.id, namespace=d.request.namespace,
                  outcome=outcome, result=d.result.value, chosen=d.node,
                  seconds=round(flight.finished_at - flight.started_at, 4),
                  flown_at=flight.flown_at, finished_at=self._clock.now().timestamp())

    def _prune(self) -> None:
        """Drop finished flights the view has caught up with (its placements, or a refusal's
        answer: `_answer_unseen`), or that waited longer than `settle_timeout`, releasing
        their node holds."""
        now = anyio.current_time()
        settling = False
        for key, flight in list(self._flights.items()):
            if flight.running or flight.stalled:
                continue
            left = self._outstanding(flight)
            unseen = (not left.empty) if left is not None else self._answer_unseen(flight)
            if unseen and now - (flight.finished_at or now) <= self._cfg.settle_timeout:
                settling = True
                continue
            del self._flights[key]
            self._by_serial.pop(flight.serial, None)
            if flight.decided.node is not None and flight.decided.hold is not None:
                self._release(flight.decided)
        self._settling = settling

    def _answer_unseen(self, flight: _Flight) -> bool:
        """A flight that holds nothing (a refusal), its writes done: True while a member in
        the view still carries its request without a result, so that the coordinator does not
        decide it again on that view (`Flights.settling`, B7). A withdrawn flight: False."""
        return not flight.withdrawn and any(
            br.result is None for _, br in self._carried(flight.decided.request))

    def _carried(self, req: Request):
        """(member name, its bindRequest) for each member of `req` the view shows still
        carrying that request (same id)."""
        for name in req.devices:
            dev = self._view.device((req.namespace, name))
            br = dev.status.bind_request if dev is not None else None
            if br is not None and br.id == req.id:
                yield name, br

    def _release(self, d: Decided) -> None:
        """`Release` to the node actor of decision `d`'s node (best effort: a lost one is
        left to the ledger's own settling and its commit expiry)."""
        ref = self._nodes.node_actor(d.node) if d.node is not None else None
        if ref is not None:
            try:
                ref.tell_nowait(Release(d.request.id))
            except (MailboxFull, ActorStopped):
                pass

    @staticmethod
    def _attempted(flight: _Flight) -> frozenset[DeviceKey] | None:
        """`outstanding`'s `attempted` filter for `flight` (see `_outstanding`)."""
        if flight.decided.moving_from is not None or flight.running or flight.stalled:
            return None
        return frozenset(flight.written)

    def _outstanding(self, flight: _Flight) -> Hold | None:
        """What `flight` still holds (`model.hold.outstanding`; None: nothing lands). Once
        its writes stopped, only placement writes it attempted and the view does not show
        yet."""
        hold = flight.decided.hold
        if hold is None:
            return None
        finished = not flight.running and not flight.stalled
        if flight.decided.moving_from is not None:
            # a move carries no request on the device, so "attempted" cannot be told by
            # the id: a withdrawn move wrote nothing (its compare-and-set failed), any
            # other holds until the view shows the device on its node (or settle_timeout)
            if finished and flight.withdrawn:
                return None
            return outstanding(hold, self._view.device)
        return outstanding(hold, self._view.device, attempted=self._attempted(flight))

    def _writes(self, d: Decided) -> tuple[list[StatusWrite], frozenset[DeviceKey]]:
        """One write per member of `d` not answered yet, read from the view now: the node,
        the placement when the member lands (is not Bound on the node yet) and the result
        together (B1, B7). A member already carrying all of it gets none. Also the members
        whose placement is written (attempted)."""
        req, node, rid = d.request, d.node, d.request.id
        if d.moving_from is not None:
            return self._move_writes(d)
        landing = {k for k, _ in d.hold.landing} if d.hold is not None else set()
        chosen = dict(d.hold.devices) if d.hold is not None and d.hold.devices else {}
        out: list[StatusWrite] = []
        written: set[DeviceKey] = set()
        now = None
        for name in dict.fromkeys(req.devices):
            key = (req.namespace, name)
            dev = self._view.device(key)
            br = dev.status.bind_request if dev is not None else None
            lands = key in landing and (dev is None or dev.bound_node != node)
            device = chosen.get(key)
            # DR4: a member Bound here recording another device is re-pointed (no move)
            repoint = (device is not None and not lands and dev is not None
                       and dev.bound_node == node and recorded_on(dev) != (node, device))
            if (not lands and not repoint and br is not None and br.id == rid
                    and (br.result, br.node, br.message, br.code)
                    == (d.result, node, d.message, d.code)):
                continue
            if lands or repoint:
                written.add(key)
            if lands:
                now = now or self._clock.now()
            out.append(StatusWrite(key, rid, d.result, d.message, node=node, code=d.code,
                                   bound_at=now if lands else None,
                                   expect_version=dev.resource_version if dev is not None else None,
                                   device=device if lands or repoint else None,
                                   clear_device=(lands and device is None and dev is not None
                                                 and dev.status.device is not None)))
        return out, frozenset(written)

    def _answered_otherwise(self, d: Decided) -> bool:
        """B7: a member of `d`'s request shows it answered Succeeded already, for another node
        or with another result than `d`: the first applied answer is the decision, and `d`
        (made on a view that had not caught up with it) is moot. Its flight writes nothing."""
        for name, br in self._carried(d.request):
            if br.result is Result.SUCCEEDED and (br.node, br.result) != (d.node, d.result):
                _log.warning("decision_moot", request_id=d.request.id, namespace=d.request.namespace,
                             device=name, answered=br.node, decided=d.node, result=d.result.value)
                return True
        return False

    def _move_writes(self, d: Decided) -> tuple[list[StatusWrite], frozenset[DeviceKey]]:
        """The one `move` write of a defragmenting move (D2), none when the view shows the
        device on its node already; the writer checks it is still idle where it was."""
        key = (d.request.namespace, d.request.devices[0])
        dev = self._view.device(key)
        to = dict(d.hold.devices).get(key) if d.hold is not None else None
        if dev is not None and dev.bound_node == d.node and (to is None or recorded_on(dev) == (d.node, to)):
            return [], frozenset()
        return [StatusWrite(key, d.request.id, d.result, d.message, node=d.node,
                            bound_at=self._clock.now(), op="move", from_node=d.moving_from,
                            expect_version=dev.resource_version if dev is not None else None,
                            device=to, from_device=d.moving_device)
                ], frozenset((key,))

    # -- write tasks (children: they touch no state, they report by message) -------------------

    async def _write_wave(self, plan: list[tuple[int, list[StatusWrite]]],
                          first: Mapping[int, Nomination] | None = None) -> None:
        """The writes of one wave in one `write_many`; a flight with a failed write goes
        on alone (`_retry_flight`), so it never holds back the others' settling. The
        nominations of `first` (by flight serial, P4) are recorded before: a flight whose
        nomination cannot be is left out of the wave and reported gave up (stalled)."""
        if first:
            lost, superseded = await self._put_nominations(first)
            if lost or superseded:
                plan = [(serial, ws) for serial, ws in plan if serial not in lost | superseded]
            if lost:
                await self._report(tuple(sorted(lost)), WriteOutcome.GAVE_UP)
            if superseded:
                await self._report(tuple(sorted(superseded)), WriteOutcome.WITHDRAWN)
            if not plan:
                return
        outcomes = await self._write_many([w for _, ws in plan for w in ws])
        i = 0
        done = []
        for serial, ws in plan:
            failed = [(w, e) for w, e in zip(ws, outcomes[i:i + len(ws)]) if e is not None]
            i += len(ws)
            if failed:
                self._tg.start_soon(self._retry_flight, serial, failed)
            else:
                done.append(serial)
        if done:
            await self._report(tuple(done), WriteOutcome.DONE)  # one report for the wave's done flights

    async def _put_nominations(self, first: Mapping[int, Nomination]) -> tuple[set[int], set[int]]:
        """Record each nomination of `first` (`NominationWriter.put`), retried with the
        status writes' policy, at most `write_timeout` a try; the serials whose nomination
        could not be recorded (or every one, without a `NominationWriter`: a refusal never
        announces a nomination that is not recorded), and those whose nomination a later one
        of the same preemptor superseded (`RequestWithdrawn`: its decision is moot, its
        refusal not written)."""
        if self._nominations is None:
            _log.error("nomination_without_writer", nominations=[n.name for n in first.values()])
            return set(first), set()
        lost: set[int] = set()
        superseded: set[int] = set()
        cfg = self._cfg
        for serial, nomination in first.items():
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(RETRYABLE_WRITE_ERRORS),
                wait=wait_exponential_jitter(multiplier=cfg.retry_initial, max=cfg.retry_max,
                                             jitter=cfg.retry_jitter),
                stop=stop_after_attempt(max(1, cfg.retry_attempts)),
                sleep=anyio.sleep,
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        with anyio.fail_after(cfg.write_timeout):
                            await self._nominations.put(nomination)
            except RequestWithdrawn as exc:
                _log.info("nomination_superseded", nomination=nomination.name, error=str(exc))
                superseded.add(serial)
            except (WriteError, TimeoutError) as exc:
                _log.warning("nomination_not_recorded", nomination=nomination.name, error=str(exc))
                lost.add(serial)
            else:
                _log.info("nominated", nomination=nomination.name, node=nomination.node,
                          victims=[v.name for v in nomination.victims])
        return lost, superseded

    async def _retry_flight(self, serial: int, failed: list[tuple[StatusWrite, WriteError]]) -> None:
        """Retry the failed writes of one flight; report done, withdrawn (RequestWithdrawn,
        NotFound: never retried) or gave_up (retries exhausted, or another WriteError)."""
        outcome = WriteOutcome.DONE
        try:
            for w, err in failed:
                if not isinstance(err, RETRYABLE_WRITE_ERRORS):
                    raise err
            await self._retry(failed)
        except (RequestWithdrawn, NotFound) as exc:
            outcome = WriteOutcome.WITHDRAWN
            _log.info("withdrawn", request_id=failed[0][0].request_id, error=str(exc))
        except WriteError as exc:
            outcome = WriteOutcome.GAVE_UP
            _log.warning("writes_gave_up", request_id=failed[0][0].request_id,
                         namespace=failed[0][0].key[0], error=str(exc))
        await self._report((serial,), outcome)

    async def _report(self, serials: tuple[int, ...], outcome: WriteOutcome) -> None:
        """Tell the pipeline itself how the flights `serials` ended, waiting for room in its
        mailbox at most `write_timeout` (then TimeoutError crashes the pipeline, and its
        group: a lost report would keep a reservation for good)."""
        assert self._ref is not None
        with anyio.fail_after(self._cfg.write_timeout):
            await self._ref.tell(_Written(serials, outcome))

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
        outcome is a TransientWriteError (it may or may not have applied). Raises
        RuntimeError for a writer answering a wrong number of outcomes (a crash)."""
        timeout = self._cfg.write_timeout
        with anyio.move_on_after(timeout) as scope:
            outcomes = await self._writer.write_many(writes)
            if len(outcomes) != len(writes):  # a broken writer: crash, do not guess
                raise RuntimeError(f"write_many answered {len(outcomes)} of {len(writes)} writes")
            return outcomes
        assert scope.cancelled_caught
        err = TransientWriteError(f"writes of {len(writes)} devices timed out after {timeout}s")
        return [err] * len(writes)


__all__ = [
    "Attach",
    "Decided",
    "Flights",
    "Fly",
    "GetFlights",
    "GetPipelineStatus",
    "PipelineConfig",
    "PipelineStatus",
    "Settle",
    "Stalled",
    "StatusPipeline",
    "WriteOutcome",
]
