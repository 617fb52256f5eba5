"""What a VirtualMachine is told about preemption (docs/contract.md §3c P4), as its
`GPUSetReady` condition while it waits: the pure part `model.vm.plan_waiting` applies.

- A **preemptor** (a VM whose VMI a live nomination names as preemptor) that does not fit
  yet shows False, reason `PreemptionNominated`, saying how many victims still run on the
  nominated node and until when the room is held (`WaitingForVictims`); `model.vm.plan_waiting`
  shows it though the VM carries no `Failure` condition (virt-controller's client waits out
  the 503's `Retry-After` inside the create call).
- A **victim** (a VM whose VMI incarnation a nomination named and which has not run a VMI
  since) that waits for room again shows False, reason `Preempted`, naming the preemptor and
  both priorities (`PreemptedFor`), for as long as it is refused for room only
  (`model.line.waits_for_room`); a refusal room does not cure (a budget, an entitlement)
  shows that refusal instead, and room for its set shows True as for any waiting VM.

The victims are known from the nominations (`preempted_victims`); the leader keeps them
after their nomination is gone (`k8s.vm_waiting`) until the VM runs again (`restarted`), and
a stored `Preempted` condition is kept as it is while the VM still waits for room, so a new
leader that never saw the nomination does not take it back.

Pure: no clock (`now` is an argument), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping

from model.explain import Explanation
from model.housekeeping import VMIs
from model.line import waits_for_room
from model.nomination import Nomination, Victim
from model.reasons import Code, PreemptedFor, WaitingForVictims
from model.serialize import format_time

Key = tuple[str, str]

PREEMPTED_REASON = "Preempted"
"""The `GPUSetReady` reason of a victim's VM waiting for room again."""
NOMINATED_REASON = "".join(p[:1].upper() + p[1:] for p in Code.PREEMPTION_NOMINATED.value.split("_"))
"""The `GPUSetReady` reason of a preemptor's VM waiting for its victims ("PreemptionNominated",
as `model.vm.reason_name` spells the refusal's code)."""


@dataclass(frozen=True, slots=True)
class Preempted:
    """VM (`victim.namespace`, `victim.vmi`) whose VMI incarnation `victim` was named by a
    nomination; `words` what its condition says."""

    victim: Victim
    words: PreemptedFor


def preempted_victims(nominations: Iterable[Nomination]) -> dict[Key, Preempted]:
    """Every victim of `nominations` (live or expired: a victim stopped by an expired
    nomination was stopped all the same) by its VM's key (the VMI of a VM has the VM's
    name). A VM named by several keeps the latest nomination's (by `created`)."""
    out: dict[Key, Preempted] = {}
    for n in sorted(nominations, key=lambda n: (n.created, n.name)):
        for v in n.victims:
            out[(v.namespace, v.vmi)] = Preempted(v, PreemptedFor(n.preemptor, n.priority, v.priority, n.node))
    return out


def _same_incarnation(v: Victim, uid: str, admission: str | None) -> bool:
    """True when a live VMI (`uid`, `admission`) is the incarnation `v` names (as
    `model.nomination.sweep` judges it: a recorded uid or admission that differs is another
    incarnation)."""
    if v.uid is not None and uid and uid != v.uid:
        return False
    return v.admission is None or admission == v.admission


def restarted(p: Preempted, vmis: VMIs) -> bool:
    """True when the victim's VM runs a VMI again: a live VMI of its name that is not the
    incarnation stopped (then it is no longer told it was preempted)."""
    rec = vmis.live.get((p.victim.namespace, p.victim.vmi))
    return rec is not None and not _same_incarnation(p.victim, rec.uid, rec.admission)


def waiting_for_victims(n: Nomination, vmis: VMIs) -> WaitingForVictims:
    """The words of preemptor `n`'s condition: its victims whose named incarnation still runs."""
    running = []
    for v in n.victims:
        rec = vmis.live.get((v.namespace, v.vmi))
        if rec is not None and _same_incarnation(v, rec.uid, rec.admission):
            running.append(v.name)
    named = tuple(running) or tuple(v.name for v in n.victims)
    return WaitingForVictims(len(running), named, n.priority, n.node, format_time(n.expires))


def preemption_condition(key: Key, e: Explanation | None, old: Mapping | None,
                         nominations: Iterable[Nomination], preempted: Mapping[Key, Preempted],
                         vmis: VMIs, now: datetime) -> tuple[str, str] | None:
    """(reason, message) of VM `key`'s False `GPUSetReady` condition when preemption is what
    it waits on (module docstring), else None (its own explanation stands). `e` is its
    set's explanation now (None: its annotations do not parse), judged not admitted; `old`
    its stored condition; `nominations` those the cache shows; `preempted` the victims known
    (`preempted_victims`, kept by the leader)."""
    for n in nominations:
        if n.namespace == key[0] and n.vmi == key[1] and n.live(now):
            return NOMINATED_REASON, waiting_for_victims(n, vmis).render()
    if e is None or e.reason is None or not waits_for_room(e.reason):
        return None
    p = preempted.get(key)
    if p is not None:
        return PREEMPTED_REASON, p.words.render()
    if old is not None and old.get("status") == "False" and old.get("reason") == PREEMPTED_REASON \
            and isinstance(old.get("message"), str):
        return PREEMPTED_REASON, old["message"]
    return None


__all__ = ["NOMINATED_REASON", "PREEMPTED_REASON", "Preempted", "preempted_victims",
           "preemption_condition", "restarted", "waiting_for_victims"]
