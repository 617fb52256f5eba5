"""The VMI admission webhook's orchestration (docs/contract.md §4, W1–W6).

`VMIAdmission.handle(review)` is the handler behind `k8s.webhook.transport`, given a decoded
`review.Review`: it judges with `model.admission.check` on the cache first (W1, no I/O: what
the binder need not see is refused before any read, write or wait), waits for a turn of the
tenant's fair share (`k8s.webhook.fairness.TenantGate`, which lends idle slots; none before
the review's deadline: 429), judges again after the
live read (W1, no writes), stops on a dry run
(W2), short-cuts a set already admitted (W4), then reserves (W3: templates; `attachedTo` and
the one `bindRequest` in a single optimistic write per device; the wait on the informer for
the binder's results) and admits with a JSONPatch pinning the VMI, or cleans up what it wrote
and denies (W5). The steps themselves are `k8s.webhook.steps`; every denial is a typed
`review.Denial`, whose category gives the status the tenant sees.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import anyio
import structlog
from k8s import errors
from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.webhook import steps
from k8s.webhook.phases import PhaseObserver, mark, marked, phase, recording, set_mode
from k8s.webhook.fairness import Busy, EventBudget, TenantGate
from k8s.webhook.review import Category, Denial, Review, reason_denial, refusal_denial
from k8s.webhook.steps import Attempt, Denied, Written
from k8s.webhook.transport import allow, deny, patch_response
from k8s.webhook.waiter import RECORD_WAIT, ResultWaiter, until
from model.admission import (AdmissionPlan, Refusal, already_admitted, budget_in_flight, check,
                             effective_resources, kept_conflict, node_selector_of,
                             same_name_conflict, template_name, unpermitted_gpu_entries, vm_owner)
from model.line import DEFAULT_RETRY_GRACE, RETRY_AFTER as LINE_RETRY_AFTER, Entry, waits_for_room
from model.line_plan import LINE_CODES, w1_entry
from model.nominate import NominationSettings, w1_nominee
from model.priority import DEFAULT_PRIORITY, Priority, resolve_priority
from model.reasons import BinderRefused, Code, NotSynced, ShuttingDown, TenantBusy, WaitsInLine
from model.snapshot import Snapshot
from model.types import Labels

log = structlog.get_logger("gpu_binder.admission")

DRY_RUN_WARNING = "dry run: GPU devices were checked but not reserved"
AFTER_TURN = 0.25
"""The part of the bind timeout kept for the admission itself once its turn came: a turn is
waited for during the first three quarters of it at most (the review's deadline,
not a fixed line, bounds the wait; bind timeout < the webhook's timeoutSeconds)."""


_MISSING = frozenset({Code.HELD_DEVICE_NOT_FOUND, Code.CLASS_NOT_FOUND, Code.DEVICE_NOT_FOUND})
"""W1's refusals for an object the cache does not hold: a 503 to retry, not a 403, while the
cache does not follow the API server (`ClusterView.following`)."""


def _counted(refusal: Refusal) -> Code:
    """The code a refusal is counted under (`VMIAdmission.rejected`, metrics): W1's own for
    a set it put in the line (`WaitsInLine`: why it waits, not that it does), else its own."""
    reason = refusal.reason
    return reason.refusal.code if isinstance(reason, WaitsInLine) else refusal.code


def _still_waits(exc: Denied) -> bool:
    """A follower's set refused for room at W1 and sent on to the binder (P5): True unless the
    binder refused it for something room will not change (its `BinderRefused` code neither
    waits for room, `model.line.waits_for_room`, nor is the line's own). No answer in time
    (`NotBoundInTime`) and the webhook's own transient failures count as waiting: W1 found
    no room, and the retry is judged again."""
    r = exc.reason
    return not isinstance(r, BinderRefused) or waits_for_room(r) or r.refused in LINE_CODES


def _nominated(exc: Denied) -> bool:
    """The binder refused the set with a nomination (P4's `preemption_nominated`): room is
    being made for it, and its 503 with Retry-After is the answer."""
    return isinstance(exc.reason, BinderRefused) and exc.reason.refused is Code.PREEMPTION_NOMINATED


@dataclass(frozen=True, slots=True)
class _Judged:
    """W1's outcome for one review: the plan, the launcher nodeSelector the binder must
    match (B3), the snapshot judged and this call's attempt (its admission id); `w1` W1's
    refusal for room of a bare VMI a follower sends on to the binder (P5, `_in_line`): the
    answer when the binder does not admit it either (None: W1 let the set through)."""

    plan: AdmissionPlan
    selector: Labels
    snap: Snapshot
    attempt: Attempt
    w1: Refusal | None = None


class VMIAdmission:
    """Handles VMI CREATE reviews. `bind_timeout` (seconds) bounds steps 1–4 of W3; `grace`
    is `attachmentGrace`; `clock` returns aware UTC time; `client`'s timeout bounds each API
    call; `gate` (None: unbounded) gives each tenant its fair share of concurrent admissions
    past W1's checks on the cache; `record_wait` (seconds, `--webhook-record-wait`) bounds
    the wait on the cache for a device-mode set's records, also ended by the review's
    deadline (0: by the deadline alone). `admitted`/`denied`
    count answers, `rejected`
    W1 refusals and turns refused by the gate per (namespace, code) (for metrics).
    `phase_observer` (None: nobody) is told of each admitted review's phases
    (`k8s.webhook.phases`: seconds per step and the review's total; `k8s.metrics.Metrics`
    sets itself). `line` (None: W1's refusals for room stand as they are, as in tools and
    tests) tells the leader's waiting line of a bare VMI W1 refused for room (P5,
    `_in_line`): True when this replica has a coordinator to tell (it leads), False when
    not (a follower: the set then goes on to the binder, whose refusal for room enters the
    leader's line); such a set is answered 503 with Retry-After (`WaitsInLine`,
    `model.line.RETRY_AFTER`), its words saying it keeps its place for `line_grace`
    (`line.retryGrace`) without a retry."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, bind_timeout: float,
                 grace: timedelta, clock: Callable[[], datetime] | None = None,
                 gate: TenantGate | None = None, record_wait: float = RECORD_WAIT,
                 preemption: NominationSettings = NominationSettings(),
                 line: Callable[[Entry], bool] | None = None,
                 line_grace: timedelta = DEFAULT_RETRY_GRACE) -> None:
        self.api = steps.Api(client)
        self.line = line  # P5: a bare VMI refused for room at W1 waits in the leader's line
        self.line_grace = line_grace
        self.preemption = preemption  # P4: a set W1 refuses for room that would be nominated goes on
        self.cache = cache
        self.bind_timeout = bind_timeout
        self.grace = grace
        self.now = clock or (lambda: datetime.now(timezone.utc))
        self.waiter = ResultWaiter(cache)
        self.gate = gate
        self.record_wait = record_wait
        self.events = EventBudget()
        self.admitted = 0
        self.denied = 0
        self.rejected: dict[tuple[str, Code], int] = {}
        self._claims: dict[str, list[AdmissionPlan]] = {}  # tenant -> plans past _precheck
        self.draining = False
        self._inflight: set[anyio.CancelScope] = set()
        self._idle: anyio.Event | None = None  # set by the last review in flight, for drain
        self.phase_observer: PhaseObserver | None = None

    async def drain(self, timeout: float = 5.0) -> None:
        """Shutdown: refuse new reviews, cancel the ones in flight (each cleans up what it
        wrote, under a shield, and answers with a denial), and wait for them, bounded."""
        self.draining = True
        for scope in list(self._inflight):
            scope.cancel()
        if self._inflight:
            self._idle = anyio.Event()
            with anyio.move_on_after(timeout):
                await self._idle.wait()

    # -- entry -------------------------------------------------------------------------
    async def handle(self, review: Review) -> dict:
        """A decoded review → AdmissionResponse dict (uid set). A VMI asking for no GPU is
        admitted unchanged; a draining replica denies UNAVAILABLE. Raises nothing for a
        refusal (a denial is an answer); a cancellation by `drain` is a denial too."""
        if review.ask is None:
            return allow(review.uid)
        if self.draining:
            return deny(review.uid, reason_denial(ShuttingDown()))
        scope = anyio.CancelScope()
        self._inflight.add(scope)
        try:
            with structlog.contextvars.bound_contextvars(namespace=review.namespace,
                                                         vmi=review.name,
                                                         user=review.user or None), scope, \
                    recording() as phases:
                try:
                    resp = await self._fair_admit(review)
                except Denied as exc:
                    return await self._refused(review, exc.denial)
        finally:
            self._inflight.discard(scope)
            if not self._inflight and self._idle is not None:
                self._idle.set()
        if scope.cancelled_caught:  # drained: what this call wrote was cleaned up
            self.denied += 1
            return deny(review.uid, reason_denial(ShuttingDown(while_admitting=True)))
        self.admitted += 1
        recorded = phases.finish()  # None unless a patch admitted it (`_wire`'s mode)
        if recorded is not None and self.phase_observer is not None:
            self.phase_observer.admission_phases(recorded)
        return resp

    async def _refused(self, review: Review, denial: Denial) -> dict:
        """Count, log and answer a denial; a Warning Event unless a dry run (W2: it writes
        nothing, Events included), a THROTTLED one (429: the cheapest answer) or the tenant
        has spent its Event budget (`EventBudget`: a burst of 10, then 1 a second)."""
        self.denied += 1
        log.info("VMI denied", uid=review.uid[:64], code=denial.code,
                 reason=denial.message[:500], dry_run=review.dry_run)
        if (not review.dry_run and denial.category is not Category.THROTTLED  # a 429: none
                and self.events.take(review.namespace)):
            await steps.record_event(self.api, review.namespace, review.name, denial.message,
                                     self.now())
        return deny(review.uid, denial)

    # -- the admission -----------------------------------------------------------------
    async def _fair_admit(self, review: Review) -> dict:
        """W1 on the cache alone first (`_precheck`: no I/O, so what the binder need not see
        is refused before any read, write or turn), then the tenant's budget with its
        admissions in progress here counted (`_budget_in_flight`: none left, THROTTLED, 429,
        before any turn), then a turn of the tenant's fair share (`gate`; none within the
        first `1 - AFTER_TURN` of the bind timeout: THROTTLED, 429), then `_admit`. Raises
        Denied."""
        deadline = anyio.current_time() + self.bind_timeout  # the wait for a turn included
        ns = review.namespace
        with phase("precheck"):
            judged = self._precheck(review)
            held = None if judged is None or isinstance(judged, Refusal) \
                else self._budget_in_flight(ns, judged)
        if isinstance(judged, Refusal):
            self._rejection(ns, _counted(judged))
            raise Denied.of(refusal_denial(judged))
        if judged is not None:
            if held is not None:
                self._rejection(ns, held.code)
                raise Denied.of(refusal_denial(held))
            self._claims.setdefault(ns, []).append(judged)
        try:
            if self.gate is None:
                return await self._admit(review, deadline)
            try:  # the turn is waited for while the review's deadline leaves time to admit
                with phase("turn"):
                    await self.gate.enter(ns, deadline - self.bind_timeout * AFTER_TURN)
            except Busy as busy:
                self._rejection(ns, Code.TENANT_BUSY)
                reason = TenantBusy(ns, busy.in_flight, busy.waiting, busy.waited,
                                    retry_after=1)
                raise Denied.of(refusal_denial(Refusal(reason))) from None
            try:
                return await self._admit(review, deadline)
            finally:
                self.gate.leave(ns)
        finally:
            if judged is not None:
                claims = self._claims[ns]
                claims.remove(judged)
                if not claims:
                    del self._claims[ns]

    def _budget_in_flight(self, namespace: str, plan: AdmissionPlan) -> Refusal | None:
        """`model.admission.budget_in_flight` of `plan` against the tenant's other
        admissions in progress at this replica (past `_precheck`; another try of the same
        VMI not counted: W4 and same_name_conflict judge it after the live read). So a
        burst of one tenant racing for its own budget is answered at once instead of
        waiting for turns it cannot use (a turn waited for holds the API server's
        seat of the create, which another tenant's create needs)."""
        others = [p for p in self._claims.get(namespace, ()) if p.vmi != plan.vmi]
        if not others:
            return None
        return budget_in_flight(self.cache.view.snapshot(), plan, others, retry_after=1)

    def _nominee(self, snap: Snapshot, review: Review, refusal: Refusal, now: datetime,
                 selector: Labels) -> AdmissionPlan | Refusal:
        """P4: `refusal` (W1's) stands unless it is for room and the set would be nominated
        (`model.nominate.w1_nominee`: its live nomination, or P3's plan): then the plan of
        the set, to go on to the binder, which nominates and answers 503 with Retry-After
        (or admits, once its room is free). The set's priority is `_priority` (P1)."""
        ask = review.ask
        assert ask is not None
        templates = tuple((template_name(review.name, c, i), c) for c, n in ask.templates for i in range(n))
        priority = self._priority(snap, review)
        node = w1_nominee(snap, review.namespace, review.name, refusal.reason, ask.held, templates,
                          priority, now, self.preemption,
                          node_selector=selector, tolerations=review.tolerations)
        if node is None:
            return refusal
        log.info("refused for room at W1; goes on to the binder (preemption)", namespace=review.namespace,
                 vmi=review.name, node=node)
        return AdmissionPlan(review.namespace, review.name, tuple(ask.held), templates, node, priority)

    def _in_line(self, snap: Snapshot, review: Review, refusal: Refusal, now: datetime,
                 selector: Labels) -> AdmissionPlan | Refusal:
        """P5: a bare VMI (no VirtualMachine owner) that W1 refuses for room only
        (`model.line_plan.w1_entry`: never for budget, entitlement, a class problem, bad input
        or a size no node has) takes its place in the leader's waiting line, keyed by
        (namespace, vmi), with its priority (P1) and first refusal, kept while its client
        retries (`LineSettings.retry_grace`). On the leader (`line` answers True: its
        coordinator is told) the answer is `refusal` as 503 with Retry-After (`_waits`); on a replica with no coordinator (False: a follower) the set
        goes on to the binder as any set does (W3 writes its bindRequest, which the leader's
        informer brings to its coordinator): the binder's refusal for room enters the line
        there. A dry run (W2: it writes nothing and waits for nothing),
        a VM's VMI (its VM's place comes from the waiting-VM loop, `k8s.vm_waiting`) and a
        webhook without `line` leave `refusal` as it is. A set the binder refuses too (or does
        not answer in time) is answered `refusal` (`_admit`), so the answer does not depend on
        the replica the review reached (503 with Retry-After while the binder's refusal is for
        room or the line, `_still_waits`); one it nominates for (P4) gets the nomination's 503."""
        ask = review.ask
        if self.line is None or review.dry_run or ask is None:
            return refusal
        priority = self._priority(snap, review)
        waiting = w1_entry(snap, review.namespace, review.name, ask, refusal.reason, priority, now,
                           owner=vm_owner(review.object), node_selector=selector,
                           tolerations=review.tolerations, attempt=review.uid)
        if waiting is None:
            return refusal
        if self.line(waiting):
            log.info("refused for room at W1; waits in the leader's line", code=refusal.code,
                     priority=priority.value)
            return self._waits(refusal)
        log.info("refused for room at W1; goes on to the binder (the leader's line)", code=refusal.code)
        # the binder decides it for real: admitted when the leader finds room W1 did not see
        # (and the line lets it start), else answered W1's refusal (`_admit`)
        templates = tuple((template_name(review.name, c, i), c) for c, n in ask.templates for i in range(n))
        return AdmissionPlan(review.namespace, review.name, tuple(ask.held), templates, None, priority)

    def _binder_waits(self, review: Review, exc: Denied) -> Refusal | None:
        """P5 for a set W1 found room for: the binder's refusal (`exc`) as the tenant gets it
        when it is for room only (`model.line.waits_for_room` of its `BinderRefused`, a 403
        as written: `no_eligible_node`) and the set is a bare VMI with the line on: then the
        coordinator has put the set in its line (`model.line_plan.joins_line`), and the answer
        is the binder's words as `WaitsInLine` (503 with Retry-After, `_waits`), so that the
        client's retry keeps the place. None (the refusal stands as it is) for any other
        refusal, a VM's VMI (its place comes from the waiting-VM loop; KubeVirt retries it)
        or a webhook without `line`. Before: the 403 ended a bare VMI's create, and its
        place in line, which nobody retried, lapsed."""
        r = exc.reason
        if (self.line is None or vm_owner(review.object) is not None
                or not isinstance(r, BinderRefused) or r.category is not Category.POLICY
                or not waits_for_room(r)):
            return None
        return self._waits(Refusal(r))

    def _waits(self, refusal: Refusal) -> Refusal:
        """W1's `refusal` for room of a set that waits in the line (P5) as the tenant gets it:
        `WaitsInLine`, 503 with Retry-After `model.line.RETRY_AFTER`, so that a client that
        honours it (client-go, kubectl) keeps retrying and keeps the place, which is lost
        after `line_grace` without an attempt (`model.line_plan.tidy`)."""
        return Refusal(WaitsInLine(refusal.reason, LINE_RETRY_AFTER,
                                   max(1, round(self.line_grace.total_seconds()))))

    def _priority(self, snap: Snapshot, review: Review) -> Priority:
        """The set's priority (P1) as `model.admission.check` resolved it and
        `status.bindRequest` records it: the VMI's `spec.priorityClassName` against the
        snapshot's PriorityClasses. A class not found is W1's own refusal before this is
        asked (only a refusal for room is), so it never stands here: the default then."""
        got = resolve_priority(review.priority_class_name, snap.priority_classes)
        return got if isinstance(got, Priority) else DEFAULT_PRIORITY

    def _rejection(self, namespace: str, code: Code) -> None:
        key = (namespace, code)
        self.rejected[key] = self.rejected.get(key, 0) + 1

    def _lagging(self, plan: Refusal | AdmissionPlan) -> Refusal | AdmissionPlan:
        """W1 on a lagging cache: a refusal for a device or class the cache does not hold
        (`_MISSING`) while the cache does not follow the API server (an informer relists
        after an outage, `ClusterView.following`) becomes `NotSynced(relisting=True)`, a
        503 to retry, as the coordinator waits before such a refusal (B1(b)); else `plan`."""
        if isinstance(plan, Refusal) and plan.code in _MISSING and not self.cache.view.following():
            return Refusal(NotSynced(relisting=True))
        return plan

    def _precheck(self, review: Review) -> Refusal | AdmissionPlan | None:
        """W1's checks on the cache's snapshot (`model.admission.check`: class, entitlement,
        budget, a set larger than any node, held devices …) and the VMI's own gpus entries,
        without the live read; the Refusal, or the plan when `_judge` should go on, or None
        while the cache shows a VMI of that name: the live read then says the name is taken
        (W1's answer to a create of a live name, whatever else is wrong with the set)."""
        assert review.ask is not None
        key = (review.namespace, review.name)
        state = self.cache.vmi_state()
        if key in state.live:
            return None
        vmis = state.without(key)
        snap = self.cache.view.snapshot()
        selector = node_selector_of(review.object, self.cache.launcher_defaults())
        permitted = self.cache.permitted_resources()
        now = self.now()
        plan = check(snap, review.namespace, review.name, review.ask, vmis, now,
                     self.grace, node_selector=selector, tolerations=review.tolerations,
                     permitted=permitted, priority_class_name=review.priority_class_name)
        plan = self._lagging(plan)
        if isinstance(plan, Refusal):
            plan = self._nominee(snap, review, plan, now, selector)
        if isinstance(plan, Refusal):
            plan = self._in_line(snap, review, plan, now, selector)
        if isinstance(plan, Refusal):
            return plan
        kept = unpermitted_gpu_entries(review.object, effective_resources(snap), permitted)
        return plan if kept is None else kept

    async def _admit(self, review: Review, deadline: float) -> dict:
        """W1, then W4's short cut, W2, and W3 (steps 1-4 within `deadline`, loop time);
        raises Denied."""
        judged = await self._judge(review, deadline)
        attempt, plan = judged.attempt, judged.plan
        node = already_admitted(judged.snap, plan, attempt.now())
        if node is not None and review.dry_run:
            return allow(review.uid, DRY_RUN_WARNING)
        taken = Written()  # devices W4 re-keyed to this admission, if it went half-way
        snap = judged.snap
        if node is not None:  # W4: same set, already Succeeded on one node
            with phase("take-over"):
                took = await steps.take_over(self.api, attempt, plan, snap)
            if took:
                log.info("VMI already admitted; no new request", node=node,
                         admission=attempt.admission)
                written = Written()
                try:
                    ops = await self._wire(review, attempt, plan, node, written, deadline)
                except BaseException as exc:
                    if written.claim is not None:
                        await steps.delete_own_claim(self.api, attempt, written.claim)
                    if isinstance(exc, errors.ApiError):
                        raise Denied.of(steps.api_denial(exc)) from exc
                    raise
                return patch_response(review.uid, ops)
            taken.attached.extend(plan.devices)  # maybe in part; a device changed: afresh
            snap = self.cache.view.snapshot()
        conflict = same_name_conflict(snap, plan, attempt.vmis, attempt.since, self.grace,
                                      attempt.admission, attempt.owner)
        if conflict is not None:
            await steps.clean_up(self.api, attempt, taken)
            raise Denied.of(refusal_denial(conflict))
        if review.dry_run:  # W2
            return allow(review.uid, DRY_RUN_WARNING)
        try:
            node, ops = await self._reserve(review, judged, deadline)
        except Denied as exc:
            if _nominated(exc):
                raise
            if judged.w1 is None:
                # P5 when W1 found room and the binder did not (taken meanwhile, or held for a
                # live nomination W1 does not count): its refusal entered the leader's line, so
                # a bare VMI waits there like one W1 refused (503 with Retry-After)
                waits = self._binder_waits(review, exc)
                if waits is None:
                    raise
                raise Denied.of(refusal_denial(waits)) from exc
            # P5 on a follower: the binder's refusal entered the leader's line; the tenant is
            # answered W1's refusal, as on the leader (the binder's words, or its timeout, would
            # make the answer depend on the replica the review reached): 503 with Retry-After
            # while the set waits, W1's own when the binder refused it for something else
            self._rejection(review.namespace, judged.w1.code)
            answer = self._waits(judged.w1) if _still_waits(exc) else judged.w1
            raise Denied.of(refusal_denial(answer)) from exc
        log.info("VMI admitted", node=node, request_id=attempt.admission,
                 devices=list(plan.devices),  # seconds since the review reached _fair_admit:
                 webhook_seconds=round(anyio.current_time() - deadline + self.bind_timeout, 3),
                 # wall s when the attach patches had returned and the result was seen, and
                 # wait-result's seconds (its phase): bench floor's split of the wait
                 **marked("wait-result"))
        return patch_response(review.uid, ops)

    async def _judge(self, review: Review, deadline: float) -> _Judged:
        """W1: the live read (`steps.check_name_free`), then every check on the cache's
        snapshot (`model.admission.check`) and the VMI's own gpus entries; raises Denied."""
        ns, vmi = review.namespace, review.name
        with phase("live-read"):
            await steps.check_name_free(self.api, ns, vmi)
        with phase("judge"):
            return self._judged(review, deadline)

    def _judged(self, review: Review, deadline: float) -> _Judged:
        """W1 after the live read: every check on the cache's snapshot; raises Denied."""
        ns, vmi = review.namespace, review.name
        vmis = self.cache.vmi_state().without((ns, vmi))
        snap = self.cache.view.snapshot()
        now = self.now()
        selector = node_selector_of(review.object, self.cache.launcher_defaults())  # B3
        permitted = self.cache.permitted_resources()
        plan = check(snap, ns, vmi, review.ask, vmis, now, self.grace, node_selector=selector,
                     tolerations=review.tolerations, permitted=permitted,
                     priority_class_name=review.priority_class_name)
        plan = self._lagging(plan)
        if isinstance(plan, Refusal):
            plan = self._nominee(snap, review, plan, now, selector)
        w1 = plan if isinstance(plan, Refusal) else None
        if isinstance(plan, Refusal):
            plan = self._in_line(snap, review, plan, now, selector)
        if isinstance(plan, Refusal):
            self._rejection(ns, _counted(plan))
            raise Denied.of(refusal_denial(plan))
        kept = unpermitted_gpu_entries(review.object, effective_resources(snap), permitted)
        if kept is not None:
            self._rejection(ns, kept.code)
            raise Denied.of(refusal_denial(kept))
        owner = vm_owner(review.object)  # H4: only the VM's own VMI takes a set kept for it
        refusal = kept_conflict(snap, plan, owner)
        if refusal is not None:
            self._rejection(ns, refusal.code)
            raise Denied.of(refusal_denial(refusal))
        # unique to this call: keys its attachments and clean-up, and is its request's id
        attempt = Attempt(ns, vmi, uuid.uuid4().hex, now, vmis, self.grace, self.now, owner,
                          deadline)
        return _Judged(plan, selector, snap, attempt, w1)

    async def _reserve(self, review: Review, judged: _Judged,
                       deadline: float) -> tuple[str, list[dict]]:
        """W3 (1)–(4) in order (within a step the set's devices go concurrently, bounded):
        the node the binder placed the set on and the JSONPatch admitting the VMI there (in
        device mode after its ResourceClaim was made, DR5). On any failure, cancellation
        included, what this call wrote is cleaned up (W5: the claim it made included) before
        Denied (or the cancellation) goes on."""
        attempt, plan = judged.attempt, judged.plan
        written = Written()
        try:
            with phase("template-create"):
                await steps.create_templates(self.api, attempt, plan.templates, written)
            request = steps.request_body(attempt, plan, judged.selector, review.tolerations)
            with phase("attach"):
                await steps.attach_all(self.api, attempt, request, plan, written)
            with phase("wait-result"):  # its wall instants for "VMI admitted" (bench floor)
                mark("attached_at", self.now().timestamp())
                node = await steps.wait_result(self.waiter, attempt, plan.devices,
                                               max(0.5, deadline - anyio.current_time()),
                                               self.bind_timeout)
                mark("result_at", self.now().timestamp())
            return node, await self._wire(review, attempt, plan, node, written, deadline)
        except BaseException as exc:
            await steps.clean_up(self.api, attempt, written)
            if isinstance(exc, errors.ApiError):
                raise Denied.of(steps.api_denial(exc)) from exc
            raise

    async def _wire(self, review: Review, attempt: Attempt, plan: AdmissionPlan, node: str,
                    written: Written, deadline: float) -> list[dict]:
        """The JSONPatch admitting the VMI on `node`: in count mode `steps.admit_patch`; in
        device mode (DR5) after the set's claim exists (`steps.wire_claim`, recorded in
        `written.claim` when this call made it), its members' records read from the cache,
        which may show the binder's result a moment before a record: waited for (woken by the
        view's changes of the set's devices, of `node` and of the classes, never polling)
        until `deadline` (loop time), or `record_wait` seconds when that is shorter, then
        `DeviceUnrecorded` (503). Raises Denied or ApiError."""
        view = self.cache.view
        missing: Denied | None = None
        keys = {("device", (plan.namespace, name)) for name in plan.devices} | {("node", node)}

        def members() -> tuple[Snapshot, Any] | None:  # the snapshot, claim_members' answer
            nonlocal missing
            snap = view.snapshot()
            try:
                return snap, steps.claim_members(snap, plan, node)
            except Denied as exc:
                missing = exc
                return None

        left = deadline - anyio.current_time()
        with phase("record-wait"):
            got = await until(view, members, min(self.record_wait, left) if self.record_wait > 0
                              else left, relevant=lambda c: c.kind == "class" or c in keys)
        if got is None:
            assert missing is not None  # judged at least once, and not ready
            raise missing
        snap, found = got
        if found is None:
            with phase("patch-build"):
                ops = steps.admit_patch(snap, review.object, plan, node, attempt.admission)
            set_mode("count")
            return ops
        with phase("claim"):
            ops = await steps.wire_claim(self.api, attempt, review.object, snap, plan, node,
                                         found, written)
        set_mode("device")
        return ops
