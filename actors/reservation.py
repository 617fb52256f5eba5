"""The two-phase reservation of planned placements on the node actors (docs/contract.md §6).

`reserve` takes the `Placing`s of one batch (requests the planner decided to land
devices, `model.plan.Place`) and reserves each on its placement at once: every `Prepare`
scattered and gathered (`runtime.ask_all`), then every `Commit` likewise. A node actor that
refuses, or does not answer in time, leaves the item without a placement and with the
reason; a hold whose fate is unknown is aborted. The coordinator decides what to do next
(fall back to other candidates, decide again, or refuse: B1's "node ledgers refused").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from actors.errors import ActorStopped, MailboxFull
from actors.node_actor import Abort, Commit, CommitRefused, Committed, Prepare, Prepared, PrepareRefused
from actors.ports import NodeDirectory
from actors.runtime import ActorRef, ask_all
from model.decide import Decision, Placement, Request, request_ref
from model.hold import Hold
from model.plan import placement_hold
from model.reasons import (DeviceAt, LedgersRefused, NodeActorUnavailable, NodeRefusal, NoNodeActor,
                           SetRefused)
from model.snapshot import Snapshot
from model.types import RequestKey

@dataclass(slots=True)
class Placing:
    """A request decided to land devices, between its decision and its two-phase
    reservation: `placement` is set once a node actor committed one; `refusals` collects
    why the others did not (one `NodeRefusal` each); `ref` is the node actor of the first
    placement once prepared (so a hold can be aborted)."""

    key: RequestKey
    request: Request
    decision: Decision
    started: float
    refusals: list[NodeRefusal] = field(default_factory=list)
    incarnation: int = 0
    placement: Placement | None = None
    ref: ActorRef | None = None
    hold: Hold | None = None  # the planner's hold of the first placement (`model.plan.Place`)

    def hold_of(self, placement: Placement, snap: Snapshot) -> Hold:
        """The hold of landing `placement` (the planner's for the first placement)."""
        if self.hold is not None and placement is self.decision.placements[0]:
            return self.hold
        return placement_hold(self.request, placement, snap)


def tell_quietly(ref: ActorRef, message: Any) -> None:
    """Best effort: a full or stopped mailbox is left to the hold's expiry."""
    try:
        ref.tell_nowait(message)
    except (MailboxFull, ActorStopped):
        pass


async def reserve(items: Sequence[Placing], snap: Snapshot, nodes: NodeDirectory, owner: str,
                  timeout: float, placements: Sequence[Placement] | None = None) -> None:
    """The two-phase reservation of each item on its placement (`placements`, in the order
    of `items`; default: each one's first), holds counted from `snap`'s devices
    (`model.plan.placement_hold`), for coordinator incarnation `owner`; `timeout` bounds
    each round (seconds). Sets `placement` of each item committed; an item a node actor
    refused, or that got no answer (its hold aborted), keeps None and the reasons in
    `refusals`. Cancelled: every hold this call may have taken is aborted."""
    if placements is None:
        placements = [it.decision.placements[0] for it in items]
    sent: list[tuple[Placing, Placement, ActorRef]] = []
    try:
        prepares = []
        for it, p in zip(items, placements):
            ref = nodes.node_actor(p.node)
            if ref is None:
                it.refusals.append(NodeRefusal(p.node, NoNodeActor()))
                continue
            sent.append((it, p, ref))
            prepares.append((ref, Prepare(it.hold_of(p, snap), owner)))
        replies = await ask_all(prepares, timeout=timeout)
        commits: list[tuple[Placing, Placement, ActorRef]] = []
        for (it, p, ref), reply in zip(sent, replies):
            if isinstance(reply, Prepared):
                it.incarnation, it.ref = reply.incarnation, ref
                commits.append((it, p, ref))
            elif isinstance(reply, PrepareRefused):
                it.refusals.append(NodeRefusal(p.node, reply.reason))
            else:
                tell_quietly(ref, Abort(it.request.id))
                it.refusals.append(NodeRefusal(p.node, NodeActorUnavailable(type(reply).__name__)))
        replies = await ask_all([(ref, Commit(it.request.id, it.incarnation))
                                 for it, _, ref in commits], timeout=timeout)
        for (it, p, ref), reply in zip(commits, replies):
            if isinstance(reply, Committed):
                it.placement = p
                continue
            tell_quietly(ref, Abort(it.request.id))
            if isinstance(reply, CommitRefused):
                it.refusals.append(NodeRefusal(p.node, reply.reason))
            else:
                it.refusals.append(NodeRefusal(p.node, NodeActorUnavailable(type(reply).__name__)))
    except BaseException:
        for it, _, ref in sent:  # cancelled: do not leak a hold
            tell_quietly(ref, Abort(it.request.id))
        raise


def ledger_refusal(req: Request, snap: Snapshot, reasons: Sequence[NodeRefusal]) -> SetRefused:
    """The refusal when the model found room but every node actor refused (B1: names every
    device and its node, and why each candidate failed; `LedgersRefused`)."""
    devices = tuple(DeviceAt(name, dev.bound_node) if (dev := snap.device(req.namespace, name)) is not None
                    else DeviceAt(name, found=False) for name in req.devices)
    return SetRefused(devices, (LedgersRefused(tuple(reasons)),), request_ref(req))


__all__ = ["Placing", "ledger_refusal", "reserve", "tell_quietly"]
