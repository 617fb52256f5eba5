"""W1 for a whole set (docs/contract.md §4): judge a VMI's orders on a `Snapshot` the way the binder
will judge its bind request. Sits above `model.snapshot` (per-order checks, budgets, room) and
`model.decide` (B1–B6), which it combines: the webhook's W1 and the binder's placement agree
because both end in `decide`'s judgement.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from model.decide import Request, judge, mixed_modes, size_nowhere
from model.reasons import (BudgetExhausted, Code, DeviceListedTwice, NoDevices, WrongNamespace,
                           new_device_name)
from model.priority import DEFAULT_PRIORITY, Priority
from model.snapshot import Order, Snapshot, Verdict
from model.types import GPUDevice, Labels, Phase, Toleration

CHECK_REQUEST_ID = "(check)"
"""Request id `check_set` uses for the one-node test; never a real (generated) id."""


def check_set(snapshot: Snapshot, namespace: str, orders: Sequence[Order], *, node_selector: Labels = (),
              tolerations: tuple[Toleration, ...] = (), priority: Priority = DEFAULT_PRIORITY) -> Verdict:
    """W1 for a whole set: `check_order` on each order in turn, adding each admitted
    device as Bound on its verdict's node before checking the next (so budget and room
    are judged for the set), then the binder's own judgement (`model.decide.decide`,
    B1–B6) on a request of the set, with template devices as Pending devices named
    "new <class> #<n>" (`new_device_name`): the set must fit one node. `node_selector` and
    `tolerations` are the VMI's, judged as the binder judges the bind request (B3). The
    verdict's node is the node the binder would choose now. The reason of a refusal (`model.reasons`):
    `NoDevices`, `WrongNamespace` or `DeviceListedTwice` for a malformed set, the first
    refused order's (`check_order`; a budget one with the whole set's numbers), else the
    binder's `SetRefused` without its request (the "refused <vmi> request <id>:" prefix).

    Device mode (DR1, DR3): a set mixing device-mode and count-mode classes is refused
    first (`MixedModes`: KubeVirt refuses such a VMI); a class with a problem is refused by
    `check_order` (`ClassProblem`); the binder's judgement checks the topology (a set of 3
    on HGX boards is refused naming the partition sizes that exist, per node, even where
    fewer units are free than it asks: no room would make that size exist).

    P1: `priority` is the set's, as the webhook will record it; a budget scoped on its
    PriorityClass that the set takes over (held devices recorded under another class
    included) refuses it with that `BudgetExhausted` (the binder's own judgement finds it)."""
    if not orders:
        return Verdict(False, NoDevices(asked=True))
    mixed = mixed_modes(snapshot, dict.fromkeys(_order_class(snapshot, o) for o in orders))
    if mixed is not None:
        return Verdict(False, mixed)
    snap = snapshot
    names: list[str] = []
    templates: list[GPUDevice] = []
    counts: dict[str, int] = {}
    for order in orders:
        if order.namespace != namespace:
            return Verdict(False, WrongNamespace(order.namespace, namespace))
        if order.device is not None and order.device in names:
            return Verdict(False, DeviceListedTwice(order.device))
        if order.tolerations != tolerations:
            order = replace(order, tolerations=tolerations)
        verdict = snap.check_order(order)
        if not verdict.admitted:
            if verdict.reason is not None and verdict.reason.code is Code.NO_FREE_UNIT:
                counts_of: dict[str, int] = {}
                for o in orders:
                    c = _order_class(snapshot, o)
                    counts_of[c] = counts_of.get(c, 0) + 1
                if size_nowhere(snapshot, counts_of):  # DR3: no room would take it
                    return judge_set(snapshot, namespace, orders, node_selector=node_selector,
                                     tolerations=tolerations, priority=priority)
            return _set_budget_verdict(snapshot, namespace, orders, verdict)
        if order.device is not None:
            base = snap.device(namespace, order.device)
            assert base is not None
        else:
            counts[order.class_name] = counts.get(order.class_name, 0) + 1
            base = GPUDevice(namespace, new_device_name(order.class_name, counts[order.class_name]),
                             order.class_name)
            templates.append(base)
        names.append(base.name)
        if base.bound_node != verdict.node:
            snap = snap.with_device(replace(base, status=replace(
                base.status, phase=Phase.BOUND, node_name=verdict.node)))
    return _judge_set(snapshot, namespace, names, templates, node_selector, tolerations, priority)

def _set_budget_verdict(snapshot: Snapshot, namespace: str, orders: Sequence[Order], verdict: Verdict) -> Verdict:
    """`verdict` of one order of a set; a budget refusal (counted on the snapshot with the
    set's earlier devices added) reworded with the whole set's numbers: usage before the
    set, and what the set adds (its members not Bound yet), as B1's refusal says."""
    reason = verdict.reason
    if not isinstance(reason, BudgetExhausted):
        return verdict
    res = reason.resource
    budget = snapshot.budget_of(namespace, res)
    if budget is None:
        return verdict
    adds = sum(1 for o in orders if _order_resource(snapshot, o) == res and not (
        o.device is not None and (d := snapshot.device(namespace, o.device)) is not None
        and d.bound_node is not None))
    bound, reserved = snapshot.tenant_counts(namespace, res)
    return Verdict(False, BudgetExhausted(namespace, res, bound, budget, adds, reserved))

def _order_class(snapshot: Snapshot, order: Order) -> str:
    """The class that governs `order`: a held device's own, else the order's."""
    dev = snapshot.device(order.namespace, order.device) if order.device is not None else None
    return dev.class_name if dev is not None else order.class_name

def _order_resource(snapshot: Snapshot, order: Order) -> str | None:
    dev = snapshot.device(order.namespace, order.device) if order.device is not None else None
    cls = snapshot.classes.get(dev.class_name if dev is not None else order.class_name)
    return cls.resource_name if cls is not None else None

def judge_set(snapshot: Snapshot, namespace: str, orders: Sequence[Order], *, node_selector: Labels = (),
              tolerations: tuple[Toleration, ...] = (), priority: Priority = DEFAULT_PRIORITY) -> Verdict:
    """The binder's own judgement (`model.decide`, B1–B6) of the whole set alone, without
    `check_order`'s per-device checks: what `check_set` ends with. Orders of held devices
    that do not exist are left out. For the per-node reasons of a set that has no room."""
    names: list[str] = []
    templates: list[GPUDevice] = []
    counts: dict[str, int] = {}
    for order in orders:
        if order.device is not None:
            if snapshot.device(namespace, order.device) is not None:
                names.append(order.device)
            continue
        counts[order.class_name] = counts.get(order.class_name, 0) + 1
        templates.append(GPUDevice(namespace, new_device_name(order.class_name, counts[order.class_name]),
                                   order.class_name))
        names.append(templates[-1].name)
    return _judge_set(snapshot, namespace, names, templates, node_selector, tolerations, priority)

def _judge_set(snapshot: Snapshot, namespace: str, names: list[str], templates: list[GPUDevice],
               node_selector: Labels, tolerations: tuple[Toleration, ...],
               priority: Priority = DEFAULT_PRIORITY) -> Verdict:
    """`judge` on the set as a request (templates added as Pending devices); a refusal's
    reason is the binder's `SetRefused` without its request, or the bare `BudgetExhausted`
    of a budget scoped on the set's PriorityClass (P1), as `check_order` gives the others."""
    whole = snapshot.with_devices(templates) if templates else snapshot
    decision = judge(whole, Request(CHECK_REQUEST_ID, namespace, "", tuple(names),
                                    node_selector, tolerations=tolerations, priority=priority), 1)
    if decision.reason is not None:
        scoped = next((x for x in decision.reason.reasons
                       if isinstance(x, BudgetExhausted) and x.scope is not None), None)
        if scoped is not None:
            return Verdict(False, scoped)
        return Verdict(False, replace(decision.reason, request=None))
    return Verdict(True, node=decision.node)
