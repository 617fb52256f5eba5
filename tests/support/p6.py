"""The invariants of docs/contract.md §3c P6, checked by the in-memory tests (the chaos test,
tests/actors/test_chaos.py) on a `MemoryStore` and on the coordinator's decisions. Each
function answers a list of problems (English, for the failure message; empty: none). Not a
test module.

- `deletion_problem`: a VMI the binder deleted was a victim of a nomination live then (P4, P6).
- `nominated_room_problems`: the room of every live nomination (its preemptor not admitted on
  its node yet, the nomination not `model.nomination.spent`) is Bound for nobody but its preemptor and its victims (count mode: per node
  and resource, the other sets' Bound units plus the nominated units fit the allocatable).
- `nomination_problems`: a nomination as written: every victim of strictly lower priority
  than its preemptor, as the store records both (so two sets of equal priority never preempt
  each other), of a class that allows preemption, a preemptor whose policy allows it; and a
  live nomination is never replaced by another for the same preemptor (never doubled).
- `line_problems`, `place_problems`: P5/P6's "no lower-priority set starts on devices a
  waiting higher-priority set could start on now", judged on the very inputs of the
  coordinator's line gate (`model.line_plan.gate_batch`, `first_allowed`): see
  `place_problems` for the exact definition.
"""

from __future__ import annotations

from datetime import datetime
from typing import Iterable, Sequence

from fakes.memory_store import MemoryStore
from model.decide import Placement, Request, decide, decide_on
from model.hold import Hold
from model.line import Line, entry_request
from model.line_plan import joins_line, line_entry
from model.nomination import Nomination, admitted, spent
from model.plan import Action, Answer, Nominate, Place, Recover, placement_hold
from model.priority import ClassPreemption
from model.snapshot import Reserving, Snapshot
from model.types import GPUDevice, RequestKey, Result


def _is_victim(n: Nomination, namespace: str, vmi: str, admission: str | None) -> bool:
    return any(v.namespace == namespace and v.vmi == vmi
               and (v.admission is None or v.admission == admission) for v in n.victims)


def deletion_problem(store: MemoryStore, namespace: str, vmi: str, admission: str | None,
                     now: datetime) -> str | None:
    """P6 "no set is stopped unless it is a victim of a live nomination": the binder deleted
    VMI `namespace/vmi` (admitted as `admission`) at `now`; None when a nomination of the
    store live at `now` names that incarnation a victim."""
    for n in store.nominations().values():
        if n.live(now) and _is_victim(n, namespace, vmi, admission):
            return None
    return f"P6: VMI {namespace}/{vmi} ({admission}) deleted at {now}: no live nomination names it a victim"


def _set_of(d: GPUDevice, n: Nomination) -> bool:
    """`d` belongs to `n`'s preemptor or to one of its victims (attached to it, or its
    template), or is an idle device `n` moves off its node (a D-move of its plan, P3)."""
    if any(m.key == d.key for m in n.moves):
        return True
    if d.namespace == n.namespace and (d.template_for == n.vmi or (
            d.status.attached_to is not None and d.status.attached_to.vmi == n.vmi)):
        return True
    att = d.status.attached_to
    return att is not None and _is_victim(n, d.namespace, att.vmi, att.admission)


def nominated_room_problems(store: MemoryStore, now: datetime) -> list[str]:
    """P6 "a nominated device is never placed for anyone but its preemptor", count mode (see
    the module docstring), on the store now."""
    noms = list(store.nominations().values())
    if not any(n.live(now) for n in noms):
        return []
    snap = store.snapshot()
    by_node: dict[str, list[Nomination]] = {}
    for n in noms:
        # a spent nomination (its preemptor admitted since, now another's victim) is done
        if n.live(now) and not admitted(n, snap.devices_in(n.namespace)) and not spent(n, noms, now):
            by_node.setdefault(n.node, []).append(n)
    out = []
    classes = store.classes()
    for node, group in sorted(by_node.items()):
        alloc = dict(store.node(node).allocatable) if store.node(node) is not None else {}
        held: dict[str, int] = {}
        for n in group:
            for r, k in n.units:
                held[r] = held.get(r, 0) + k
        others: dict[str, int] = {}
        for d in store.devices_on(node):
            c = classes.get(d.class_name)
            if c is None or any(_set_of(d, n) for n in group):
                continue
            others[c.resource_name] = others.get(c.resource_name, 0) + 1
        for r, k in sorted(held.items()):
            if others.get(r, 0) + k > alloc.get(r, 0):
                out.append(f"P6: node {node} {r}: {others.get(r, 0)} Bound for other sets + {k} nominated "
                           f"({', '.join(n.preemptor for n in group)}) > allocatable {alloc.get(r, 0)}")
    return out


def _recorded_priority(snap: Snapshot, namespace: str, vmi: str, admission: str | None):
    """The priority recorded on a running set's members (bindRequest.priority), None when no
    member of that incarnation carries one."""
    for d in snap.devices_in(namespace).values():
        att, br = d.status.attached_to, d.status.bind_request
        if (att is not None and att.vmi == vmi and br is not None
                and (admission is None or att.admission == admission)):
            return br.priority, d.class_name
    return None


def nomination_problems(store: MemoryStore, n: Nomination, previous: Nomination | None,
                        now: datetime) -> list[str]:
    """P2/P6 on nomination `n` as it is written at `now` (`previous`: the object of that name
    before the write, None when there was none); see the module docstring."""
    out = []
    snap = store.snapshot()
    if (previous is not None and previous != n and previous.live(now)
            and not spent(previous, store.nominations().values(), now)):
        out.append(f"P6: nomination {n.name} replaced while live (doubled): {previous} -> {n}")
    mine = _recorded_priority(snap, n.namespace, n.vmi, None)
    if mine is not None and not mine[0].may_preempt:
        out.append(f"P2: {n.preemptor} of policy Never nominated victims")
    if mine is not None and mine[0].value != n.priority:
        out.append(f"P6: nomination {n.name} says priority {n.priority}, the set records {mine[0].value}")
    classes = store.classes()
    for v in n.victims:
        got = _recorded_priority(snap, v.namespace, v.vmi, v.admission)
        if got is None:
            continue  # gone already
        prio, cls = got
        if prio.value >= n.priority:
            out.append(f"P6: {n.preemptor} ({n.priority}) nominated {v.name} of priority {prio.value}: "
                       "not strictly lower")
        c = classes.get(cls)
        if c is not None and c.preemption is ClassPreemption.NEVER:
            out.append(f"P2: {v.name} of class {cls} (preemption Never) nominated a victim of {n.preemptor}")
    return out


def place_problems(line: Line, snapshot: Snapshot, request: Request, placement: Placement) -> list[str]:
    """P6 for `request` started by `placement` (on node N) on `snapshot` (the room as the
    coordinator saw it: the view, every hold in flight, every live nomination's, and those of
    the batch's actions kept before it). A problem for each entry W of `line` (the sets
    waiting in the coordinator's line: refused for room by this incarnation and not started
    since; a bare VMI's once its client retried, `model.line.Entry.retried`) that is *waiting with a higher priority in the same class* (W's priority value
    strictly above the request's, a GPUClass in common) and *could use N now*: the binder
    would place W on N now (`model.decide.decide_on`), and once `placement` is carried out
    W fits nowhere (`model.decide.decide` refuses it). A W that still fits elsewhere after
    is backfill, not a problem. A placement that does not fit `snapshot` itself (more new
    units than the node has free there) is not judged: the node actors' ledgers refuse it
    (two-phase, B3), so it starts nowhere; the coordinator decides it again. (Such a
    placement arises when the line gate starts a set of the batch at a later candidate: the
    actions planned after it counted its room on the first.)"""
    if any(snapshot.free(placement.node, r) < n for r, n in placement.needs if n > 0):
        return []
    classes = {d.class_name for name in request.devices
               if (d := snapshot.device(request.namespace, name)) is not None}
    mine = request.priority.value
    out: list[str] = []
    after: Snapshot | None = None
    for e in line:
        if not e.retried or e.priority.value <= mine or not classes & set(e.shape.classes):
            continue  # (a bare VMI refused once, not retried yet, is not waiting: `Entry.retried`)
        esnap, ereq = entry_request(snapshot, e)
        _, rank = decide_on(esnap, ereq, placement.node)
        if rank is None:
            continue
        if after is None:
            after = snapshot.with_reservation(placement_hold(request, placement, snapshot))
        asnap, areq = entry_request(after, e)
        if decide(asnap, areq, limit=1).result is not Result.SUCCEEDED:
            out.append(f"P6: {request.namespace}/{request.vmi} (priority {mine}) started on {placement.node}, "
                       f"which {e.identity.namespace}/{e.identity.vmi} (priority {e.priority.value}, waiting) "
                       "could use now and nothing else after")
    return out


def line_problems(line: Line, snapshot: Snapshot, holds: Sequence[Hold], actions: Iterable[Action],
                  now: datetime, again: frozenset[RequestKey] = frozenset()) -> list[str]:
    """`place_problems` of every `Place` among `actions` (the line gate's output on `line`,
    `snapshot` and `holds`, as `model.line_plan.gate_batch` answered it), each judged on
    `snapshot` with `holds` and the holds of the actions before it (placements, recoveries,
    new nominations), against `line` with the refusals for room before it entered (at `now`,
    as the gate enters them); those in `again` are not carried out. A `Place` whose request
    holds room in flight (one of `holds`) was judged when first decided: skipped."""
    actions = list(actions)
    values = {e.priority.value for e in line} | {a.request.priority.value for a in actions
                                                if isinstance(a, Place | Answer | Nominate)}
    if len(values) < 2:
        return []  # one priority: nobody waits with a higher one
    work = Reserving(snapshot.with_reservations(h for h in holds if not h.empty))
    flying = {h.request_id for h in holds}
    out: list[str] = []
    for a in actions:
        if isinstance(a, Answer | Nominate) and (a.request.namespace, a.request.id) in again:
            continue
        if isinstance(a, Place) and a.request.id not in flying:
            out += place_problems(line, work.snapshot, a.request, a.decision.placements[0])
        hold = a.hold if isinstance(a, Place | Recover) else None
        held = (hold,) if hold is not None else ()
        if isinstance(a, Nominate) and a.nominated.fresh:
            held = a.nominated.nomination.holds()  # its room, and its D-moves' targets
        for h in held:
            if not h.empty:
                work.add(h)
        if joins_line(a):
            line = line.refused(line_entry(work.snapshot, a.request, now), now)
    return out


__all__ = ["deletion_problem", "line_problems", "nominated_room_problems", "nomination_problems",
           "place_problems"]
