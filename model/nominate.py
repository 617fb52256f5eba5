"""What the decision loop does for a set refused for room (docs/contract.md §3c P4): nominate,
or reuse the nomination it made before, and decide a preemptor on its nominated node. Pure:
`now` is an argument; the coordinator (`actors/coordinator.py`, through `model.plan`) calls it
for every Refused decision, the status pipeline writes the nomination before the refusal.

- `nominate`: a set refused for room gets P3's plan (`model.preemption.plan_preemption`) as a
  new `Nomination` (expiring `NominationSettings.ttl` after `now`), or its own live nomination
  back when it has one (made by this leader or an earlier one: it is reused, never doubled);
  the refusal becomes `PreemptionNominated` (retryable). None when there is no plan: the
  refusal stands as decided.
- `on_nominated_node`: a preemptor whose room is free is decided on its nominated node when
  that node takes the whole set (B4/DR4 within it), else as any set.
- `w1_nominee`: W1 (the webhook's checks on its cache) refuses a set for room before the
  binder sees it; a set that would be nominated (its live nomination, or P3's plan) goes on
  to the binder instead, which nominates and answers 503.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Sequence

from model.decide import Decision, Request, Rule, decide_on
from model.nomination import DEFAULT_RETRY_AFTER, DEFAULT_TTL, Nomination, Victim, spent
from model.preemption import PreemptionPlan, PreemptionSettings, RunningSet, plan_preemption
from model.priority import Priority
from model.reasons import Code, NoEligibleNode, PreemptionNominated, Reason, RequestRef
from model.snapshot import Snapshot
from model.types import BindRequest, GPUDevice, Labels, Result, Toleration

W1_REQUEST_ID = "(preemption check)"
"""Request id of `w1_nominee`'s trial request; never a real (generated) id."""

_W1_ROOM = frozenset({Code.NO_FREE_UNIT, Code.NO_ELIGIBLE_NODE, Code.SET_NEEDS, Code.NO_ROOM_FOR_SET})
"""W1's refusals that may be for room (`model.admission.check`'s `CannotPlace` leads with one;
whether stopping victims would cure it is P3's plan's to say: a size no node has is not)."""


@dataclass(frozen=True, slots=True)
class NominationSettings:
    """The operator's preemption settings as the decision loop applies them: `preemption`
    (P2's `min_runtime`), `ttl` (`preemption.nominationTTL`), `retry_after` the seconds the
    preemptor is told to wait (at most the TTL); `enabled` False turns nominating off."""

    preemption: PreemptionSettings = PreemptionSettings()
    ttl: timedelta = DEFAULT_TTL
    retry_after: int = DEFAULT_RETRY_AFTER
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class Preempting:
    """One batch's preemption context: the time `now` (UTC) and the `settings`."""

    now: datetime
    settings: NominationSettings = NominationSettings()


@dataclass(frozen=True, slots=True)
class Nominated:
    """A refusal for room answered with a nomination: `decision` the refusal as decided
    (B1), `reason` what is written instead (`PreemptionNominated`, retryable), `nomination`
    to write before it, `fresh` True when made now (its hold is not counted yet), False when
    reused."""

    decision: Decision
    reason: PreemptionNominated
    nomination: Nomination
    fresh: bool


def nomination_of(plan: PreemptionPlan, now: datetime,
                  settings: NominationSettings = NominationSettings()) -> Nomination:
    """The nomination of P3's `plan`, made at `now`, expiring `settings.ttl` later; its
    `retry_after` is `settings.retry_after` capped by the TTL (at least 1 s); the plan's
    D-moves recorded as its `moves` (the coordinator carries them out)."""
    victims = tuple(_victim(v) for v in plan.victims)
    units = tuple(sorted((r, n) for r, n in plan.placement.needs if n > 0))
    devices = tuple(ref for _, ref in plan.devices)
    ttl = max(1, int(settings.ttl.total_seconds()))
    return Nomination(plan.namespace, plan.vmi, plan.priority.value, plan.node, units, devices,
                      victims, now, now + settings.ttl, max(1, min(settings.retry_after, ttl)), plan.moves)


def _victim(s: RunningSet) -> Victim:
    return Victim(s.namespace, s.vmi, s.admission, None, s.priority.value, s.started)


def refused_for_room(decision: Decision) -> bool:
    """True when `decision` is a refusal naming only nodes without room (B1's
    `NoEligibleNode`), the one kind of refusal stopping victims may cure."""
    reason = decision.reason
    return (decision.result is Result.REFUSED and reason is not None
            and len(reason.reasons) == 1 and isinstance(reason.reasons[0], NoEligibleNode))


def nominate(snapshot: Snapshot, request: Request, decision: Decision,
             preempting: Preempting) -> Nominated | None:
    """The nomination answering `decision` (see the module docstring), or None. `snapshot`
    counts every hold in flight and every live nomination's hold (the request's own is left
    out by `model.decide`). Never raises for a bad plan input (`plan_preemption` does not)."""
    if not preempting.settings.enabled or not request.vmi or not refused_for_room(decision):
        return None
    now = preempting.now
    mine = _live(snapshot, request.namespace, request.vmi, now)
    if mine is not None:
        return Nominated(decision, _reason(request, mine), mine, False)
    plan = plan_preemption(snapshot, request, now, preempting.settings.preemption)
    if not isinstance(plan, PreemptionPlan):
        return None
    made = nomination_of(plan, now, preempting.settings)
    return Nominated(decision, _reason(request, made), made, True)


def _live(snapshot: Snapshot, namespace: str, vmi: str, now: datetime) -> Nomination | None:
    """The nomination of preemptor `namespace/vmi` when it is live at `now` and not
    `model.nomination.spent` (its preemptor since stopped as another's victim); else None."""
    mine = snapshot.nomination_for(namespace, vmi)
    if mine is None or not mine.live(now) or spent(mine, snapshot.nominations, now):
        return None
    return mine


def _reason(request: Request, n: Nomination) -> PreemptionNominated:
    return nominated_refusal(n, request.namespace, request.vmi, request.id)


def nominated_refusal(n: Nomination, namespace: str, vmi: str, request_id: str,
                      retry_after: int | None = None) -> PreemptionNominated:
    """P4: the refusal that answers `n`'s preemptor (request `request_id` of VMI
    `namespace/vmi`) while its victims stop; `retry_after` (seconds) the answer's Retry-After
    (None: the nomination's recorded `retryAfterSeconds`), so the words say what the header
    says (the webhook re-renders with `model.retry_after.preemptor_retry_after`)."""
    return PreemptionNominated(n.node, tuple(v.name for v in n.victims), n.priority,
                               n.retry_after if retry_after is None else retry_after,
                               str(RequestRef(namespace, vmi, request_id)))


def on_nominated_node(snapshot: Snapshot, request: Request, decision: Decision,
                      preempting: Preempting) -> Decision:
    """`decision` (Succeeded) for a preemptor with a live nomination, moved to its
    nominated node when that node takes the whole set now (`model.decide.decide_on`);
    `decision` itself otherwise (no nomination, expired, already there, or no room there)."""
    if decision.result is not Result.SUCCEEDED or not request.vmi:
        return decision
    mine = _live(snapshot, request.namespace, request.vmi, preempting.now)
    if mine is None or decision.node == mine.node:
        return decision
    if decision.rule is not Rule.B1:
        return decision  # kept in place (B5, B6): nothing to move
    there, rank = decide_on(snapshot, request, mine.node)
    return there if rank is not None else decision


def _trial(snapshot: Snapshot, namespace: str, vmi: str, held: Sequence[str],
           templates: Sequence[tuple[str, str]], priority: Priority, now: datetime,
           node_selector: Labels, tolerations: tuple[Toleration, ...]) -> tuple[Snapshot, Request] | None:
    """The snapshot and trial request P3 judges a set on before its request is written:
    its `held` devices and `templates` ((name, class); Pending devices added when absent)
    carry a bind request of id `W1_REQUEST_ID` recording `priority`. None when a held
    device is missing (refused for it, not for room)."""
    names = tuple(held) + tuple(n for n, _ in templates)
    br = BindRequest(W1_REQUEST_ID, vmi, names, now, node_selector, tolerations=tolerations,
                     priority=priority)
    trial: list[GPUDevice] = []
    for name in held:
        dev = snapshot.device(namespace, name)
        if dev is None:
            return None
        trial.append(replace(dev, status=replace(dev.status, bind_request=br)))
    for name, class_name in templates:
        dev = snapshot.device(namespace, name) or GPUDevice(namespace, name, class_name, template_for=vmi)
        trial.append(replace(dev, status=replace(dev.status, bind_request=br)))
    return (snapshot.with_devices(trial),
            Request(W1_REQUEST_ID, namespace, vmi, names, node_selector, now, tolerations))


def w1_nominee(snapshot: Snapshot, namespace: str, vmi: str, refusal: Reason,
               held: Sequence[str], templates: Sequence[tuple[str, str]], priority: Priority,
               now: datetime, settings: NominationSettings = NominationSettings(), *,
               node_selector: Labels = (), tolerations: tuple[Toleration, ...] = ()) -> str | None:
    """W1 and P4: the node VMI `namespace/vmi`, refused at W1 with `refusal`, would be
    nominated on: its own live nomination's, else the node of P3's plan for the set (`held`
    device names and `templates` (name, class), of `priority`, judged on `snapshot` as the
    binder will judge its request); None when the refusal is not for room, the priority may
    not preempt, or there is no plan. The webhook then lets the set go on to the binder."""
    if not settings.enabled or not priority.may_preempt or refusal.code not in _W1_ROOM:
        return None
    mine = _live(snapshot, namespace, vmi, now)
    if mine is not None:
        return mine.node
    got = _trial(snapshot, namespace, vmi, held, templates, priority, now, node_selector, tolerations)
    if got is None:
        return None
    plan = plan_preemption(*got, now, settings.preemption)
    return plan.node if isinstance(plan, PreemptionPlan) else None


def ripening_node(snapshot: Snapshot, namespace: str, vmi: str, held: Sequence[str],
                  templates: Sequence[tuple[str, str]], priority: Priority, now: datetime,
                  settings: NominationSettings = NominationSettings(), *,
                  node_selector: Labels = (), tolerations: tuple[Toleration, ...] = ()) -> str | None:
    """P2 and P5: the node of P3's plan for a waiting set (as `w1_nominee` judges it) once
    every set running now has run `preemption.minRuntime`: the plan at `now` + minRuntime.
    A set refused for room whose victims are only too young has no plan now, and a set that
    backfills their node meanwhile would be young again when they come of age (each start
    restarts the clock): the line reserves this node for the set instead
    (`model.line_plan.ripening_reservations`), and P3 nominates there once the victims are
    of age. None when nominating is off, the priority may not preempt, the set already has
    a live nomination, a held device is missing, or no plan comes even then."""
    if not settings.enabled or not priority.may_preempt or settings.preemption.min_runtime <= timedelta(0):
        return None
    if _live(snapshot, namespace, vmi, now) is not None:
        return None
    got = _trial(snapshot, namespace, vmi, held, templates, priority, now, node_selector, tolerations)
    if got is None:
        return None
    plan = plan_preemption(*got, now + settings.preemption.min_runtime, settings.preemption)
    return plan.node if isinstance(plan, PreemptionPlan) else None


__all__ = ["NominationSettings", "Nominated", "Preempting", "nominate", "nomination_of",
           "on_nominated_node", "refused_for_room", "ripening_node", "w1_nominee"]
