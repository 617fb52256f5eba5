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

from model.device.dra import DeviceRef
from model.types import DeviceKey, GPUDevice

Needs = tuple[tuple[str, int], ...]
"""Units per resource name, sorted by resource name, only positive counts."""

Landing = tuple[tuple[DeviceKey, str], ...]
"""Members that land on the hold's node, each with its resource name, in request order."""

Chosen = tuple[tuple[DeviceKey, DeviceRef], ...]
"""Device mode (DR2, DR4): members with the exact device of the hold's node chosen for them,
in request order."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Capacity held for request `request_id` of tenant `namespace` on `node`: `needs`
    units per resource on the node, and `budget_needs` budget slots per resource of the
    tenant (its Pending members, about to become Bound). `landing` lists the members that
    land on `node` (with their resource); when given, `outstanding` derives what is still
    held from it, when empty `needs`/`budget_needs` count as they are.

    A `Snapshot` counts `needs` and `budget_needs` as given (pass it `outstanding(...)`).
    Several holds of one request (prepares on several nodes) each hold their `needs` on
    their node, but the tenant's budget slots count once per request (the largest).

    Device mode (DR2): `devices` are the named devices of `node` the hold takes, one per
    member whose record (`status.device`) is not that device yet: members landing here and
    idle held members re-pointed within the node (DR4). A member stops holding its device
    once the view shows it Bound here recording it (`outstanding`)."""

    request_id: str
    namespace: str
    node: str
    needs: Needs = ()
    budget_needs: Needs = ()
    landing: Landing = ()
    devices: Chosen = ()

    @property
    def empty(self) -> bool:
        """True when the hold takes nothing (no units and no named devices on its node)."""
        return not self.devices and not any(n > 0 for _, n in self.needs)

    @property
    def device_names(self) -> frozenset[str]:
        """The names of the devices the hold takes on its node (device mode; empty else)."""
        return frozenset(ref.device for _, ref in self.devices)


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
    as it is. Pure: `device` is the caller's lookup (a ClusterView or a Snapshot).

    Device mode: a member of `devices` keeps holding its device until `device(key)` shows it
    Bound on the hold's node recording exactly that device, or the device is gone (with
    `attempted`, only members in it still carrying the request)."""
    landing, chosen = hold.landing, hold.devices
    if not landing and not chosen:
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
    if not landing:
        counts, slots = hold.needs, hold.budget_needs
    else:
        counts = tuple(sorted(needs.items())) if len(needs) > 1 else tuple(needs.items())
        slots = tuple(sorted(budget.items())) if len(budget) > 1 else tuple(budget.items())
    left = chosen
    if chosen:
        kept = []
        for key, ref in chosen:
            dev = device(key)
            if dev is None:
                continue
            if dev.bound_node == node and dev.status.device == ref:
                continue
            if attempted is not None:
                br = dev.status.bind_request
                if key not in attempted or br is None or br.id != rid:
                    continue
            kept.append((key, ref))
        left = tuple(kept) if len(kept) != len(chosen) else chosen
    if counts == hold.needs and slots == hold.budget_needs and left is chosen:
        return hold  # nothing landed since: the same value
    return Hold(rid, hold.namespace, node, counts, slots, landing, left)


__all__ = ["Chosen", "DeviceKey", "Hold", "Landing", "Needs", "hold_for", "outstanding"]
