"""The binder's planner: what to do with a batch of requests, decided synchronously and
purely (B2, B3, B7), before any node actor or API write is involved.

`plan_batch(snapshot, holds, batch)` takes the view as a Snapshot, the holds of requests in
flight (what they still take: `model.hold.outstanding`) and, per request of the batch, its
members as the view shows them. It answers one action per request, in order, each deciding
on the snapshot plus every hold planned before it in the batch (so two requests of one
batch never take the same unit or budget slot):

- `Skip`: nothing to do (withdrawn, partial, or every member has its result).
- `Recover`: a member records a node for it (B7): finish it there whatever the capacity now.
- `Finish`: a refusal whose writes were cut short: write it on the other members.
- `Answer`: decided, and nothing lands (Refused, or B5/B6: Succeeded in place).
- `Place`: decided to land devices; its first placement's hold is counted for the rest of
  the batch. The caller reserves it on the node actors (two-phase) and writes it.
- `Requeue`: `decide` raised on it (a model bug must not stop the loop); try it later.
- `Nominate` (P4, with `preempting`): refused for room, with a nomination (new, or its own
  live one reused: `model.nominate`): the caller writes the nomination, then the refusal
  `PreemptionNominated` (retryable). A new nomination's holds are counted for the rest of the
  batch, as a `Place`'s (its node's, and one per node its D-moves go to).

Every live nomination holds its room for everyone but its preemptor
(`model.nomination.nomination_holds`, P4, P6), whether or not this replica nominates: one
read from the API after a failover binds every replica. With `preempting` (settings enabled
or not), a preemptor is decided on its nominated node when that node takes it
(`model.nominate.on_nominated_node`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Sequence

from model.decide import Decision, Placement, Request, decide, recovery_devices
from model.requests import complete_request
from model.hold import Hold, Landing, outstanding
from model.nominate import Nominated, Preempting, nominate, on_nominated_node
from model.nomination import nomination_holds
from model.reasons import Code, RequestRef, Resumed
from model.snapshot import Reserving, Snapshot
from model.types import GPUDevice, Result


@dataclass(frozen=True, slots=True)
class Skip:
    """Nothing to do for request `request_id` of `namespace`."""

    namespace: str
    request_id: str


@dataclass(frozen=True, slots=True)
class Recover:
    """Finish `request` on `node` (B7: its decision is recorded on a member); `hold` what it
    still lands there (None: nothing), `message` the Succeeded message to write."""

    request: Request
    node: str
    message: str
    hold: Hold | None


@dataclass(frozen=True, slots=True)
class Finish:
    """A Refused answer already written on some member: write `message` and `code` (None:
    the member carries none, written by an older replica) on the others."""

    request: Request
    message: str
    code: Code | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """A decision that lands nothing: Refused (`node` None) or Succeeded in place (B5, B6)."""

    request: Request
    decision: Decision


@dataclass(frozen=True, slots=True)
class Place:
    """A decision that lands devices; `hold` is its first placement's (counted by the
    requests planned after it in the batch)."""

    request: Request
    decision: Decision
    hold: Hold


@dataclass(frozen=True, slots=True)
class Requeue:
    """`decide` raised `error` on `request`: try it again later."""

    request: Request
    error: str


@dataclass(frozen=True, slots=True)
class Nominate:
    """P4: `request` refused for room, answered by `nominated` (the nomination to write
    first, and the retryable refusal to write after it)."""

    request: Request
    nominated: Nominated


Action = Skip | Recover | Finish | Answer | Place | Requeue | Nominate


def landing(placement: Placement, snap: Snapshot) -> Landing:
    """The members `placement` lands on its node, with their resource (devices whose class
    is unknown count against no resource and are left out)."""
    return _landing(placement, snap)[0]


def _landing(placement: Placement, snap: Snapshot) -> tuple[Landing, dict]:
    """`landing`, and the moved members as `snap` has them (None: gone) by key."""
    found: dict = {}
    out = []
    classes = snap.classes
    for move in placement.moves:
        key = move.device
        dev = found[key] = snap.device(key[0], key[1])
        cls = classes.get(dev.class_name) if dev is not None else None
        if cls is not None:
            out.append((key, cls.resource_name))
    return tuple(out), found


def placement_hold(request: Request, placement: Placement, snap: Snapshot) -> Hold:
    """The hold of `request` landing `placement` (what it takes: units on the node, budget
    slots of its Pending members; device mode: the devices chosen for members that do not
    record them there yet, DR2), counted from `snap`'s devices."""
    land, found = _landing(placement, snap)  # the members looked up once for both steps
    if placement.devices:
        for key, _ in placement.devices:
            if key not in found:
                found[key] = snap.device(key[0], key[1])
    return outstanding(Hold(request.id, request.namespace, placement.node, placement.needs,
                            placement.budget_needs, land, placement.devices), found.get)


def changes(placement: Placement, snap: Snapshot) -> bool:
    """Whether `placement` writes a placement: a member moves, or (device mode) a member
    Bound on its node is re-pointed to another device of it (DR4: a status write)."""
    if placement.moves:
        return True
    for key, ref in placement.devices:
        dev = snap.device(key[0], key[1])
        if dev is not None and dev.status.device != ref:
            return True
    return False


def recorded_node(request_id: str, members: Iterable[GPUDevice]) -> tuple[str | None, bool]:
    """The node recorded for `request_id` on its members (B7), the most common if (by a
    bug) they disagree, and whether they disagree; None when no member carries one."""
    nodes: dict[str, int] = {}
    for m in members:
        br = m.status.bind_request
        if (br is not None and br.node is not None and br.id == request_id
                and br.result is not Result.REFUSED):
            nodes[br.node] = nodes.get(br.node, 0) + 1
    if len(nodes) <= 1:
        return next(iter(nodes), None), False
    return Counter(nodes).most_common(1)[0][0], True


def _in_order(req: Request, members: Sequence[GPUDevice]) -> list[GPUDevice]:
    by_name = {m.name: m for m in members}
    return [by_name[n] for n in dict.fromkeys(req.devices) if n in by_name]


def recovery(req: Request, node: str, members: Sequence[GPUDevice], snap: Snapshot) -> Recover:
    """B7: the `Recover` of `req`, decided for `node` (recorded on a member): the members
    not Bound there yet land there (`hold`), with the Succeeded message already written on
    a member, else a standard one."""
    classes = snap.classes
    land = tuple((m.key, classes[m.class_name].resource_name) for m in _in_order(req, members)
                 if m.bound_node != node and m.class_name in classes)
    message = next((m.status.bind_request.message for m in members
                    if m.status.bind_request is not None
                    and m.status.bind_request.result is Result.SUCCEEDED
                    and m.status.bind_request.message), None)
    message = message or Resumed(RequestRef(req.namespace, req.vmi, req.id), node).render()
    hold = None
    chosen = recovery_devices(snap, req, node)
    if land or chosen:
        needs = Counter(res for _, res in land)
        hold = outstanding(Hold(req.id, req.namespace, node, tuple(sorted(needs.items())), (), land,
                                chosen), snap.devices.get)
        if hold.empty:
            hold = None
    return Recover(req, node, message, hold)


def plan_one(snap: Snapshot, namespace: str, request_id: str,
             members: Sequence[GPUDevice], preempting: Preempting | None = None) -> Action:
    """The action for one request on `snap` (which already counts every hold in flight and,
    with `preempting`, every live nomination's hold)."""
    req = complete_request(namespace, request_id, members)
    if req is None:
        return Skip(namespace, request_id)
    node, _ = recorded_node(request_id, members)
    if node is not None:
        return recovery(req, node, members, snap)
    refused = next((m.status.bind_request for m in members
                    if m.status.bind_request is not None
                    and m.status.bind_request.result is Result.REFUSED
                    and m.status.bind_request.message is not None), None)
    if refused is not None:
        return Finish(req, refused.message, refused.code)
    try:
        decision = decide(snap, req)
        if preempting is not None:
            if decision.result is Result.REFUSED:
                nominated = nominate(snap, req, decision, preempting)
                if nominated is not None:
                    return Nominate(req, nominated)
            else:
                decision = on_nominated_node(snap, req, decision, preempting)
    except Exception as exc:  # noqa: BLE001 - a model bug must not stop the batch
        return Requeue(req, repr(exc))
    if decision.result is Result.REFUSED or not changes(decision.placements[0], snap):
        return Answer(req, decision)
    return Place(req, decision, placement_hold(req, decision.placements[0], snap))


def live_nomination_holds(snapshot: Snapshot, now: datetime | None) -> tuple[Hold, ...]:
    """The holds of `snapshot`'s nominations live at `now` whose preemptor is not admitted
    yet (`model.nomination.nomination_holds`); `now` None: every nomination counts as live."""
    if not snapshot.nominations:
        return ()
    return nomination_holds(snapshot.nominations, now if now is not None else _NEVER, snapshot.devices_in)


_NEVER = datetime.min.replace(tzinfo=timezone.utc)


def plan_batch(snapshot: Snapshot, holds: Iterable[Hold],
               batch: Sequence[tuple[str, str, Sequence[GPUDevice]]],
               preempting: Preempting | None = None, *,
               now: datetime | None = None) -> tuple[list[Action], Snapshot]:
    """One action per `(namespace, request_id, members)` of `batch`, in order (see the
    module docstring), and the snapshot after the batch (with every planned hold).

    `snapshot` is the view without holds; `holds` what requests in flight still take (as
    `outstanding` gives them; empty ones are ignored). Each request is decided on the
    snapshot with those holds and the holds of the `Place` and `Recover` actions planned
    before it, and always the holds of the nominations live at `now` (UTC; default
    `preempting.now`; with neither, every nomination of `snapshot` counts as live: erring on
    the side of P6). With `preempting` (P4) enabled, a request refused for room may be
    answered `Nominate` (see the module docstring). Pure and deterministic; never raises for
    a bad request (`Requeue`)."""
    holds = [h for h in holds if not h.empty]
    when = now if now is not None else preempting.now if preempting is not None else None
    holds += [h for h in live_nomination_holds(snapshot, when) if not h.empty]
    work = Reserving(snapshot.with_reservations(holds))
    actions: list[Action] = []
    for namespace, request_id, members in batch:
        action = plan_one(work.snapshot, namespace, request_id, members, preempting)
        held = (action.hold,) if isinstance(action, Place | Recover) else ()
        if isinstance(action, Nominate) and action.nominated.fresh:
            held = action.nominated.nomination.holds()  # its node's, and its moves' targets
        for h in held:
            if h is not None and not h.empty:
                work.add(h)  # = with_reservation, without a copy of the counts per hold
        actions.append(action)
    return actions, work.snapshot


__all__ = ["Action", "Answer", "Finish", "Nominate", "Place", "Recover", "Requeue", "Skip", "changes", "landing",
           "live_nomination_holds", "placement_hold", "plan_batch", "plan_one", "recorded_node", "recovery"]
