"""Held capacity: the one shape of "what a decided request still takes" (B3: "counting
reservations in flight"), and the one rule of when a member has *landed*.

A `Hold` is capacity held on one node for one request between its decision and the view
showing its placement: the node ledger keeps one per prepared or committed request, the
coordinator one per request in flight, and a `Snapshot` counts them in every decision.
`outstanding` says what a hold still takes given the devices as the view shows them; it
is pure (the caller passes the lookup), so the node actor, the coordinator and the
planner apply the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection

from model.types import DeviceKey, GPUDevice

Needs = tuple[tuple[str, int], ...]
"""Units per resource name, sorted by resource name, only positive counts."""

Landing = tuple[tuple[DeviceKey, str], ...]
"""Members that land on the hold's node, each with its resource name, in request order."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Capacity held for request `request_id` of tenant `namespace` on `node`: `needs`
    units per resource on the node, and `budget_needs` budget slots per resource of the
    tenant (its Pending members, about to become Bound). `landing` lists the members that
    land on `node` (with their resource); when given, `outstanding` derives what is still
    held from it, when empty `needs`/`budget_needs` count as they are.

    A `Snapshot` counts `needs` and `budget_needs` as given (pass it `outstanding(...)`).
    Several holds of one request (prepares on several nodes) each hold their `needs` on
    their node, but the tenant's budget slots count once per request (the largest)."""

    request_id: str
    namespace: str
    node: str
    needs: Needs = ()
    budget_needs: Needs = ()
    landing: Landing = ()

    @property
    def empty(self) -> bool:
        """True when the hold takes nothing (no units on its node)."""
        return not any(n > 0 for _, n in self.needs)


def hold_for(request_id: str, namespace: str, node: str, landing: Landing,
             device: Callable[[DeviceKey], GPUDevice | None]) -> Hold:
    """The hold of a request deciding to land `landing` on `node`: `needs` and
    `budget_needs` counted from the members that have not landed yet (`outstanding`)."""
    return outstanding(Hold(request_id, namespace, node, landing=landing), device)


def outstanding(hold: Hold, device: Callable[[DeviceKey], GPUDevice | None], *,
                attempted: Collection[DeviceKey] | None = None) -> Hold:
    """What `hold` still takes, as a hold (same request, node and landing) with the counts
    of its members that have not *landed*.

    The landed rule, written once: a member of `landing` has landed when `device(key)` shows
    it Bound on the hold's node, or the device is gone (it will not land). Every other
    member holds one unit of its resource on the node, and one budget slot of its
    resource when it is Pending (a move of a Bound device takes no budget). With
    `attempted` (the request's writes stopped: only placement writes that may have
    applied can still show up), a member counts only if it is in `attempted` and still
    carries the request (`status.bindRequest.id`). A hold without `landing` is returned
    as it is. Pure: `device` is the caller's lookup (a ClusterView or a Snapshot)."""
    landing = hold.landing
    if not landing:
        return hold
    needs: dict[str, int] = {}
    budget: dict[str, int] = {}
    rid, node = hold.request_id, hold.node
    for key, res in landing:
        dev = device(key)
        if dev is None:
            continue
        bound = dev.bound_node
        if bound == node:
            continue
        if attempted is not None:
            br = dev.status.bind_request
            if key not in attempted or br is None or br.id != rid:
                continue
        needs[res] = needs.get(res, 0) + 1
        if bound is None:
            budget[res] = budget.get(res, 0) + 1
    counts = tuple(sorted(needs.items())) if len(needs) > 1 else tuple(needs.items())
    slots = tuple(sorted(budget.items())) if len(budget) > 1 else tuple(budget.items())
    if counts == hold.needs and slots == hold.budget_needs:
        return hold  # nothing landed since: the same value
    return Hold(rid, hold.namespace, node, counts, slots, landing)


__all__ = ["DeviceKey", "Hold", "Landing", "Needs", "hold_for", "outstanding"]
