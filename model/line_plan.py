"""The waiting line applied to the coordinator's planned batch (docs/contract.md §3c P5, B2):
`model.plan.plan_batch` says where each set would go; this module says which of those
placements the line lets start (`model.line.may_place` per candidate), turns the others into
typed refusals (`behind_in_line`, `node_reserved`, category unavailable: the webhook answers
503 with Retry-After) and keeps the line up to date with the batch's refusals for room.

- `identity_of`, `line_entry`: who a request is in the line, and the entry its refusal makes.
- `joins_line`: does a planned action refuse its set for room (so that it waits)?
- `gate`: one action judged against the line (a `Place` starts at its first allowed
  candidate, or becomes a refusal); `first_allowed`: the first of some candidates it allows.
- `gate_batch`: a whole batch, in order: the adjusted actions, the new line, and the
  requests decided against a placement that the line then refused (to decide again).
- `tidy`: the line without the entries whose clients stopped retrying (`Line.expire` for bare
  VMIs, after `line.retryGrace` without a new attempt; `VM_TTL` for a VM's, as a safety net:
  the coordinator sees no VirtualMachine). The coordinator tidies before each batch, so an
  abandoned create holds back nobody past its grace, whenever the periodic resync comes.
- `refresh`: the VMs the waiting-VM loop found waiting for room (refused at W1, before the
  coordinator saw them) entered or kept in place, and those it found running or stopped out.
- `w1_entry`: the entry of a bare VMI W1 refused for room (the webhook hands it to the leader's
  line: W1 refuses before the coordinator sees the set).
- `ripening_reservations`: a head whose preemption victims are only too young yet reserves
  the node of the plan that ripens (P2, P5), so nothing backfills there meanwhile.

Pure: no I/O, no wall clock (`now` is an argument, UTC).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Mapping, Sequence

from model.decide import Decision, Placement, Request, Rule, placed, request_ref
from model.admission import template_name
from model.hold import Hold
from model.line import (Allowed, Behind, Entry, Identity, Line, LineSettings, Reserved, entry, may_place,
                        shape_of, shape_of_ask, soonest, waits_for_room)
from model.parse import VMIAsk
from model.priority import Priority
from model.nominate import NominationSettings, ripening_node
from model.plan import Action, Answer, Nominate, Place, Recover, placement_hold
from model.reasons import Code, DeviceAt, Reason, SetRefused
from model.snapshot import Reserving, Snapshot
from model.types import Labels, RequestKey, Result, Toleration

VM_TTL = timedelta(minutes=20)
"""How long a VirtualMachine's entry stays without a new refusal (`tidy`). The coordinator
sees no VirtualMachine, so it cannot tell a VM stopped or deleted while it waited (P5's
"gone") from one still retrying; an entry left forever would hold back every set behind it
(P6). A VM that still wants to run retries its VMI's create (KubeVirt's VM controller, with
its own backoff): twenty minutes is longer than client-go's default controller rate
limiter's longest backoff (1000 s), so a VM still retrying keeps its place."""


def identity_of(snapshot: Snapshot, request: Request) -> Identity:
    """`request`'s set in the line: its VMI (namespace, name) and the uid of the VirtualMachine
    that owns it (`status.attachedTo.owner` of a member attached to that VMI; None: a bare
    VMI, or no member says)."""
    owner = None
    for name in request.devices:
        d = snapshot.device(request.namespace, name)
        att = d.status.attached_to if d is not None else None
        if att is not None and att.vmi == request.vmi and att.owner is not None:
            owner = att.owner
            break
    return Identity(request.namespace, request.vmi, owner)


def line_entry(snapshot: Snapshot, request: Request, now: datetime) -> Entry:
    """The entry `request`'s refusal for room at `now` makes: `identity_of`, its shape
    (`model.line.shape_of`) and its recorded priority (`Request.priority`, P1); a bare VMI's
    (no VM uid) not `retried` yet (its client's next attempt confirms the place, `Line.refused`;
    a VM's VMI is retried by KubeVirt for as long as the VM wants to run); its `attempt` the
    request's id (each create attempt's bind request is a new one)."""
    ident = identity_of(snapshot, request)
    e = replace(entry(ident, shape_of(snapshot, request), request.priority, now), attempt=request.id)
    return e if ident.vm_uid is not None else replace(e, retried=False)


def joins_line(action: Action) -> bool:
    """True when `action` answers its set Refused for room (`model.line.waits_for_room` of the
    decision's typed outcome), or for the line itself (`behind_in_line`, `node_reserved`)."""
    if not isinstance(action, Answer) or action.decision.result is not Result.REFUSED:
        return False
    outcome = action.decision.outcome
    return waits_for_room(outcome) or isinstance(outcome, SetRefused) and outcome.code in LINE_CODES


LINE_CODES = frozenset({Code.BEHIND_IN_LINE, Code.NODE_RESERVED})
"""The line's own refusals (`model.reasons.line`): the set fits, but waits its turn."""


@dataclass(frozen=True, slots=True)
class Gated:
    """What `gate_batch` answers: `actions` one per planned action, in order (a `Place` the
    line holds back is an `Answer` Refused with `behind_in_line` / `node_reserved`, one it
    lets start on fewer candidates keeps only those); `line` the line after the batch's
    refusals (entries refused for room entered or refreshed; nobody leaves here: a set
    leaves when its placement is written, `Line.started`); `again` the requests whose
    refusal for room or nomination was decided while a placement the line then held back was
    counted as taken (its room was not taken after all): decide them again, do not answer
    them (nor write their nominations); `snapshot` the batch's snapshot with the holds in
    flight and those of the kept placements, recoveries and new nominations (as
    `plan_batch`'s, without the held-back ones)."""

    actions: tuple[Action, ...]
    line: Line
    again: frozenset[RequestKey]
    snapshot: Snapshot


def _refusal(snapshot: Snapshot, request: Request, verdict: Behind | Reserved) -> Decision:
    """`request` refused by the line: every member and where it is, then the line's reason."""
    devices = []
    for name in request.devices:
        d = snapshot.device(request.namespace, name)
        devices.append(DeviceAt(name, found=False) if d is None else DeviceAt(name, d.bound_node))
    outcome = SetRefused(tuple(devices), (verdict.reason(),), request_ref(request))
    return Decision(request.id, Result.REFUSED, None, (), Rule.REFUSED, outcome)


def gate(line: Line, snapshot: Snapshot, action: Action, *,
         reservations: Mapping[Identity, str] | None = None,
         settings: LineSettings = LineSettings()) -> Action:
    """`action` as the line lets it be (P5). Anything but a `Place` is returned as it is
    (recoveries finish whatever the line, B7; a set kept in place takes nothing). A `Place`
    starts at its first candidate `model.line.may_place` allows on `snapshot` (which counts
    every hold planned before it), in B4 order: the candidates before it are dropped, its
    decision's outcome and hold follow the new first one, and the candidates after it are
    kept unjudged (only the first is reserved; a fallback to a later one is judged then, by
    `gate` again). When none is allowed it becomes an `Answer` Refused with the verdict of
    its first candidate (`BehindInLine` or `NodeReserved`). Pure; never raises."""
    if not isinstance(action, Place) or (not line and not reservations):
        return action
    req, decision = action.request, action.decision
    first_verdict = None
    for i, p in enumerate(decision.placements):
        verdict = may_place(line, snapshot, req, p, priority=req.priority, reservations=reservations,
                            settings=settings)
        if isinstance(verdict, Allowed):
            if i == 0:
                return action
            rest = decision.placements[i:]
            new = Decision(decision.request_id, Result.SUCCEEDED, p.node, rest, decision.rule,
                           placed(req, p))
            return Place(req, new, placement_hold(req, p, snapshot))
        if first_verdict is None:
            first_verdict = verdict
    assert first_verdict is not None  # a Place has at least one candidate
    return Answer(req, _refusal(snapshot, req, first_verdict))


def first_allowed(line: Line, snapshot: Snapshot, request: Request, placements: Sequence[Placement], *,
                  reservations: Mapping[Identity, str] | None = None,
                  settings: LineSettings = LineSettings()) -> Placement | None:
    """The first of `placements` (in their order) that `model.line.may_place` allows for
    `request` on `snapshot`; None when the line holds the set back on each. Pure."""
    for p in placements:
        if (not line and not reservations) or isinstance(
                may_place(line, snapshot, request, p, priority=request.priority, reservations=reservations,
                          settings=settings), Allowed):
            return p
    return None


def gate_batch(line: Line, snapshot: Snapshot, holds: Sequence[Hold], actions: Sequence[Action],
               now: datetime, *, reservations: Mapping[Identity, str] | None = None,
               settings: LineSettings = LineSettings()) -> Gated:
    """The batch `actions` (from `model.plan.plan_batch` on `snapshot` with `holds`) as the line
    lets it be, in order (with an empty line and nothing reserved, `actions` as they are):
    each `Place` judged by `gate` (but one whose request holds room in flight, one of `holds`:
    decided before and let through by the line then, its writes stalled or not yet seen, it
    keeps its room) on `snapshot` with `holds` and the holds
    of the placements and recoveries kept before it (not of those the line held back) and of
    the new nominations (`Nominate`, fresh) planned before it (P6: nominated room is nobody
    else's, so a set ahead cannot count on it either); each refusal for room (`joins_line`,
    the line's own refusals included) enters the line or keeps its place (`Line.refused` at
    `now`). A refusal for room or a `Nominate` planned after the first placement the line held
    back is in `Gated.again` (that placement's room was counted as taken when it was decided:
    a nomination made against it could stop victims for room that is free). `reservations`
    are the nodes reserved now (`model.line.reservation`). `line` is taken as it is: the
    caller tidies it first (`tidy`, as the coordinator does before each batch). Pure; never
    raises."""
    work = Reserving(snapshot.with_reservations(h for h in holds if not h.empty))
    flying = {h.request_id for h in holds}
    out: list[Action] = []
    again: set[RequestKey] = set()
    held_back = False
    for action in actions:
        if isinstance(action, Place) and action.request.id in flying:
            gated: Action = action  # decided before and let through then: it keeps its room
        else:
            gated = gate(line, work.snapshot, action, reservations=reservations, settings=settings)
        if isinstance(action, Place) and not isinstance(gated, Place):
            held_back = True
        elif held_back and (joins_line(gated) or isinstance(gated, Nominate)):
            again.add((gated.request.namespace, gated.request.id))
            out.append(gated)
            continue
        held = (gated.hold,) if isinstance(gated, Place | Recover) else ()
        if isinstance(gated, Nominate) and gated.nominated.fresh:
            held = gated.nominated.nomination.holds()  # P6: its room (and moves), as plan_batch counted it
        for hold in held:
            if hold is not None and not hold.empty:
                work.add(hold)
        if joins_line(gated):
            line = line.refused(line_entry(work.snapshot, gated.request, now), now, settings.per_namespace)
        out.append(gated)
    return Gated(tuple(out), line, frozenset(again), work.snapshot)


def tidy(line: Line, now: datetime, settings: LineSettings = LineSettings(),
         vm_ttl: timedelta = VM_TTL) -> Line:
    """`line` without the bare VMIs' entries last refused (last attempted) more than
    `settings.retry_grace` (`line.retryGrace`) before `now` (`Line.expire`: their clients
    stopped retrying) and the VMs' last refused more than `vm_ttl` before (`VM_TTL`). The
    same Line when nothing left."""
    line = line.expire(now, settings.retry_grace)
    kept = [e for e in line if e.identity.vm_uid is None or now - e.last_seen <= vm_ttl]
    return line if len(kept) == len(line) else Line(kept)


def refresh(line: Line, waiting: Sequence[Entry], gone: Sequence[Identity], now: datetime,
            limit: int | None = None) -> Line:
    """`line` with the sets of `waiting` refused for room at `now` (as `Line.refused` one by
    one: an entry already there keeps its first-refused time and so its place, takes the new
    shape and priority and `last_seen` `now`; a new one enters with its own first-refused
    time) and without those of `gone` (`Identity.same`); with `limit`
    (`LineSettings.per_namespace`), the namespaces of `waiting` then keep their first `limit`
    entries (`Line.capped`). One sort, whatever the number. Pure."""
    by_key = {e.identity.key: e for e in line}
    for ident in gone if by_key else ():  # an empty line loses nobody (issue 40: `gone` is
        e = by_key.get(ident.key)          # every running VM, told each waiting-VM round)
        if e is not None and e.identity.same(ident):
            del by_key[ident.key]
    for new in waiting:
        old = by_key.get(new.identity.key)
        if old is not None and old.identity.same(new.identity):
            ident = new.identity if new.identity.vm_uid is not None else old.identity
            by_key[new.identity.key] = Entry(ident, new.shape, new.priority, old.first_refused,
                                             max(old.last_seen, now), old.retried or new.retried,
                                             new.attempt or old.attempt)
        else:
            by_key[new.identity.key] = replace(new, last_seen=now)
    out = Line(by_key.values())
    if limit is None or not waiting:
        return out
    return out.capped(limit, {e.identity.namespace for e in waiting})


def w1_entry(snapshot: Snapshot, namespace: str, vmi: str, ask: VMIAsk, refusal: Reason,
             priority: Priority, now: datetime, *, owner: str | None = None, node_selector: Labels = (),
             tolerations: tuple[Toleration, ...] = (), attempt: str = "") -> Entry | None:
    """P5 at W1: the line entry of VMI `namespace/vmi` asking `ask`, which W1 refused at `now`
    with `refusal` (its typed reason, judged on `snapshot`): keyed by (namespace, vmi) with no
    VM uid, its shape (`model.line.shape_of_ask`, with the launcher's `node_selector` and the
    VMI's `tolerations`) and its `priority` (P1), first refused `now` (the line keeps an
    earlier first refusal: `Line.refused`). The webhook answers such a set 503 with
    `Retry-After` (`model.line.RETRY_AFTER`, `model.reasons.WaitsInLine`), and the entry
    stays only while the attempts come (`LineSettings.retry_grace`, `tidy`). None when the refusal is not for room only
    (`model.line.waits_for_room`: budget, entitlement, a class problem, bad input, a size no
    node has never wait), or the VMI has a VirtualMachine `owner` (its uid: a VM's place
    comes from the waiting-VM loop, `model.vm_line.vm_entries`, which reads when the VM
    began to wait from its status), or its shape names no class, or no node could take it
    once room frees (`model.line.soonest` None: a size no node has, though W1 words it per
    node). `attempt`: the review's uid (`Entry.attempt`). Pure; never raises."""
    if owner is not None or not waits_for_room(refusal):
        return None
    shape = shape_of_ask(snapshot, namespace, ask, node_selector, tolerations)
    if not shape.classes:
        return None
    # not retried until a refusal of another attempt (`attempt`: the AdmissionReview's uid)
    e = replace(entry(Identity(namespace, vmi), shape, priority, now), retried=False, attempt=attempt)
    # room must be able to free somewhere: a set larger than every node that could take it
    # (each node's allocatable less the units of Pods outside the binder) never waits, its
    # refusal stays W1's 403 (W1's per-node "needs 2, has 1 free" alone does not say so)
    return e if soonest(snapshot, e) is not None else None


def leaves(line: Line, snapshot: Snapshot, request: Request) -> tuple[Line, Entry | None]:
    """`request`'s set started (its placement is written, Succeeded): the line without it, and
    the entry that left (None: it did not wait)."""
    ident = identity_of(snapshot, request)
    e = line.find(ident)
    return (line, None) if e is None else (line.started(ident), e)


def ripening_reservations(line: Line, snapshot: Snapshot, now: datetime, settings: NominationSettings,
                          reserved: Mapping[Identity, str]) -> dict[Identity, str]:
    """P2 and P5: `reserved` (`model.line.reservation`'s, kept as they are) plus, for each
    head (`Line.heads`, in line order) not holding one yet, the node where its preemption
    ripens (`model.nominate.ripening_node`: P3's plan once every set running now has run
    `preemption.minRuntime`), unless an earlier head holds that node. Such a head has no
    plan now only because its victims are young; a lower-priority set backfilled onto that
    node meanwhile would be young in turn and put the head's start off by a whole
    minRuntime (bench contention's on-demand p99). A head with a live nomination holds its
    room by the nomination instead. Pure; costs one P3 plan per unreserved head that may
    preempt, nothing when nominating is off or the line is empty."""
    out = dict(reserved)
    if not settings.enabled or not line:
        return out
    taken = set(out.values())
    for head in line.heads():
        if head.identity in out or not head.priority.may_preempt:
            continue
        ns, vmi = head.identity.key
        shape = head.shape
        templates = [(template_name(vmi, c, i), c) for c, n in shape.templates for i in range(n)]
        node = ripening_node(snapshot, ns, vmi, [n for n, _ in shape.held], templates, head.priority,
                             now, settings, node_selector=shape.node_selector,
                             tolerations=shape.tolerations)
        if node is not None and node not in taken:
            out[head.identity] = node
            taken.add(node)
    return out


__all__ = ["Gated", "LINE_CODES", "VM_TTL", "first_allowed", "gate", "gate_batch", "identity_of", "joins_line",
           "ripening_reservations",
           "leaves", "line_entry", "refresh", "tidy", "w1_entry"]
