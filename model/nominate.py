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
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from model.decide import Decision, Request, Rule, decide_on
from model.nomination import DEFAULT_RETRY_AFTER, DEFAULT_TTL, Nomination, Victim
from model.preemption import PreemptionPlan, PreemptionSettings, RunningSet, plan_preemption
from model.reasons import NoEligibleNode, PreemptionNominated, RequestRef
from model.snapshot import Snapshot
from model.types import Result


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
    `retry_after` is `settings.retry_after` capped by the TTL (at least 1 s)."""
    victims = tuple(_victim(v) for v in plan.victims)
    units = tuple(sorted((r, n) for r, n in plan.placement.needs if n > 0))
    devices = tuple(ref for _, ref in plan.devices)
    ttl = max(1, int(settings.ttl.total_seconds()))
    return Nomination(plan.namespace, plan.vmi, plan.priority.value, plan.node, units, devices,
                      victims, now, now + settings.ttl, max(1, min(settings.retry_after, ttl)))


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
    mine = snapshot.nomination_for(request.namespace, request.vmi)
    if mine is not None and mine.live(now):
        return Nominated(decision, _reason(request, mine), mine, False)
    plan = plan_preemption(snapshot, request, now, preempting.settings.preemption)
    if not isinstance(plan, PreemptionPlan):
        return None
    made = nomination_of(plan, now, preempting.settings)
    return Nominated(decision, _reason(request, made), made, True)


def _reason(request: Request, n: Nomination) -> PreemptionNominated:
    return PreemptionNominated(n.node, tuple(v.name for v in n.victims), n.priority, n.retry_after,
                               str(RequestRef(request.namespace, request.vmi, request.id)))


def on_nominated_node(snapshot: Snapshot, request: Request, decision: Decision,
                      preempting: Preempting) -> Decision:
    """`decision` (Succeeded) for a preemptor with a live nomination, moved to its
    nominated node when that node takes the whole set now (`model.decide.decide_on`);
    `decision` itself otherwise (no nomination, expired, already there, or no room there)."""
    if decision.result is not Result.SUCCEEDED or not request.vmi:
        return decision
    mine = snapshot.nomination_for(request.namespace, request.vmi)
    if mine is None or not mine.live(preempting.now) or decision.node == mine.node:
        return decision
    if decision.rule is not Rule.B1:
        return decision  # kept in place (B5, B6): nothing to move
    there, rank = decide_on(snapshot, request, mine.node)
    return there if rank is not None else decision


__all__ = ["NominationSettings", "Nominated", "Preempting", "nominate", "nomination_of",
           "on_nominated_node", "refused_for_room"]
