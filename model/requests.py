"""Requests among devices (docs/contract.md §3 "request"): the devices of one request carry
the same `status.bindRequest.id`, and a request is *complete* when every member lists exactly
the group. `find_requests` finds every complete request with a member still lacking its
result (the router, the coordinator's resync, recovery); `complete_request` looks at one
request's members (the planner). Pure: values in, values out.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterable

from model.decide import Request
from model.types import GPUDevice

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def find_requests(devices: Iterable[GPUDevice]) -> tuple[list[Request], list[str]]:
    """Group devices by (namespace, `status.bindRequest.id`) (§3 "request").

    A group is complete when its members' `bindRequest.devices` all list exactly the group,
    without duplicates, and agree on vmi and nodeSelector. Returns (complete requests of which
    some member still lacks a result, sorted by requestedAt — earliest member's; absent last —
    then namespace and id; sorted unique ids of partial requests, never to be acted on).
    """
    groups: dict[tuple[str, str], list[GPUDevice]] = {}
    for d in devices:
        br = d.status.bind_request
        if br is not None:
            groups.setdefault((d.namespace, br.id), []).append(d)
    complete: list[Request] = []
    partial: set[str] = set()
    for (ns, rid), members in groups.items():
        req, ok = _complete(ns, rid, members)
        if not ok:
            partial.add(rid)
        elif req is not None:
            complete.append(req)
    complete.sort(key=lambda r: (r.requested_at is None, r.requested_at or _EPOCH, r.namespace, r.id))
    return complete, sorted(partial)


def complete_request(namespace: str, request_id: str, members: Iterable[GPUDevice]) -> Request | None:
    """The request `request_id` of `namespace` as `find_requests` finds it among `members`
    (devices of other namespaces or requests are ignored): None when it is partial, every
    member has its result, or no member carries it. For one request without grouping all
    (the planner and the router look at one request's members)."""
    group = [m for m in members if m.namespace == namespace
             and (br := m.status.bind_request) is not None and br.id == request_id]
    if not group:
        return None
    return _complete(namespace, request_id, group)[0]


def _name(d: GPUDevice) -> str:
    return d.name


def _complete(ns: str, rid: str, members: list[GPUDevice]) -> tuple[Request | None, bool]:
    """One group of `find_requests` (every member carries `rid` in `ns`): (the request, or
    None when every member has its result; complete?). The fields come from the member of
    the smallest name; members whose `bindRequest.devices` equal its are judged by it."""
    first = min(members, key=_name).status.bind_request
    assert first is not None
    names = {m.name for m in members}
    listed = first.devices
    n = len(names)
    if len(listed) != n or set(listed) != names:
        return None, False
    vmi, selector, tolerations = first.vmi, first.node_selector, first.tolerations
    answered = True
    earliest = None
    for m in members:
        br = m.status.bind_request
        assert br is not None
        if br is not first:
            if br.devices != listed and (len(br.devices) != n or set(br.devices) != names):
                return None, False
            if br.vmi != vmi or br.node_selector != selector or br.tolerations != tolerations:
                return None, False
        if br.result is None:
            answered = False
        at = br.requested_at
        if at is not None and (earliest is None or at < earliest):
            earliest = at
    if answered:
        return None, True
    return Request(rid, ns, vmi, listed, selector, earliest, tolerations, first.priority), True


__all__ = ["complete_request", "find_requests"]
