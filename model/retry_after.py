"""How long the preemptor is told to wait (docs/contract.md §3c P4, "The answer"): the 503's
`Retry-After` of a `preemption_nominated` refusal, from the victims' termination grace.

A victim stops within its VMI's `spec.terminationGracePeriodSeconds` of its deletion
(KubeVirt's virt-handler shuts the guest down, then kills it); unset it is KubeVirt's default,
30 s (`v1.DefaultGracePeriodSeconds`, which virt-api's mutating webhook writes into every VMI).
So the room is free at the latest when the slowest victim still there is gone: a victim not
yet being deleted after its whole grace (the leader deletes it at its next round), one being
deleted after what is left of its grace since `metadata.deletionTimestamp`; a victim gone
waits for nothing. Most guests stop well before their grace, and a client that honours
`Retry-After` sleeps it out whole (virt-controller's client-go does so inside the create call,
up to 10 times, before its own back-off): so the answer is that bound, at least `ROUND` (the
round that frees a stopped set's devices and decides the retry) and at most `RETRY_STEP`,
so the preemptor asks again within seconds of its room coming free, and never past the
nomination's remaining life (after it the hold is released and the answer changes). Each
retry costs one webhook call: at most one per `ROUND` seconds per preemptor.

Pure: `now` is an argument; reads only the VMI object given (as the informer caches it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from model.nomination import Nomination, Victim
from model.types import ADMISSION_ANNOTATION

KUBEVIRT_DEFAULT_GRACE = 30
"""Seconds: a VMI's `spec.terminationGracePeriodSeconds` when unset (KubeVirt's
`v1.DefaultGracePeriodSeconds`; virt-api writes it into every VMI it admits)."""

ROUND = 2
"""Seconds: the shortest answer while the nomination lives, about one round of the leader's
housekeeping and decision (the stopped set's devices freed, the retried create decided): a
victim already gone still leaves that round."""

RETRY_STEP = 5
"""Seconds: the longest Retry-After given, whatever a victim's grace: the preemptor asks again
at least this often while its victims stop, so it starts within about this long of its room
coming free (client-go retries up to 10 times on a `Retry-After`, 50 s at this step; a
KubeVirt VM then gets the binder's nudge once its room is free, k8s/vm_waiting.py)."""


@dataclass(frozen=True, slots=True)
class VictimWait:
    """A victim's VMI still there: `grace` its `spec.terminationGracePeriodSeconds` (None:
    unset, KubeVirt's default), `deleting_since` its `metadata.deletionTimestamp` (UTC; None:
    not being deleted yet)."""

    grace: int | None
    deleting_since: datetime | None = None

    def left(self, now: datetime) -> float:
        """Seconds until the VMI is stopped at the latest (≥ 0)."""
        grace = KUBEVIRT_DEFAULT_GRACE if self.grace is None else max(0, self.grace)
        if self.deleting_since is None:
            return float(grace)
        return max(0.0, (self.deleting_since - now).total_seconds() + grace)


def victim_wait(victim: Victim, obj: Mapping[str, Any] | None) -> VictimWait | None:
    """The wait for `victim` given its VMI as cached (`obj`; None: gone): None when the VMI
    is gone or is another incarnation (another uid than the recorded one, another
    `gpu.cozystack.io/admission`); a grace that is not a whole number of seconds ≥ 0, or a
    deletionTimestamp that does not parse, counts as unset (KubeVirt's default; now)."""
    if obj is None:
        return None
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    if victim.uid is not None and meta.get("uid") != victim.uid:
        return None
    if victim.admission is not None and ann.get(ADMISSION_ANNOTATION) != victim.admission:
        return None
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    grace = spec.get("terminationGracePeriodSeconds")
    if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
        grace = None
    return VictimWait(grace, _deleting_since(meta.get("deletionTimestamp")))


def _deleting_since(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)  # being deleted, since when unknown: no wait
    return when.astimezone(timezone.utc) if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def preemptor_retry_after(nomination: Nomination, now: datetime,
                          vmi: Callable[[str, str], Mapping[str, Any] | None]) -> int:
    """Seconds of the Retry-After answering `nomination`'s preemptor at `now` (see the module
    docstring): the longest `VictimWait.left` of its victims still there (`vmi(namespace,
    name)` gives a VMI as cached, None when gone), at least `ROUND`, at most `RETRY_STEP`,
    at most the seconds the nomination still lives (rounded up), and at least 1. A
    nomination naming no victims (never made by a plan) answers its recorded
    `retryAfterSeconds`, bounded the same way. Never raises."""
    remaining = max(1, math.ceil((nomination.expires - now).total_seconds()))
    if not nomination.victims:
        return max(1, min(nomination.retry_after, RETRY_STEP, remaining))
    found = (victim_wait(v, vmi(v.namespace, v.vmi)) for v in nomination.victims)
    waits = [w.left(now) for w in found if w is not None]
    seconds = max(math.ceil(max(waits, default=0.0)), ROUND)
    return max(1, min(seconds, RETRY_STEP, remaining))


__all__ = ["KUBEVIRT_DEFAULT_GRACE", "RETRY_STEP", "ROUND", "VictimWait", "preemptor_retry_after",
           "victim_wait"]
