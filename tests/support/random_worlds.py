"""Random fleets for the model's property tests, and the brute-force oracle of B1–B6 they
are judged against (docs/contract.md §7): `worlds()` draws nodes (labels, H100/L40S allocatable,
cordons), the three classes, two tenants with budgets, devices (Bound, Pending, on a node
that is gone) and reservations of other requests; `oracle` decides a request from the text
of the rules, every node scanned, no index."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st

from model.decide import Request
from model.hold import Hold
from model.snapshot import Snapshot
from model.types import (
    Budget,
    DeviceStatus,
    GPUClass,
    GPUDevice,
    LabelSelector,
    Namespace,
    Node,
    OnCordon,
    Phase,
)
from tests.support.world import H, L

PROPS = settings(max_examples=500, derandomize=False, print_blob=True, deadline=None)
TENANTS = ("t1", "t2")


@dataclass
class World:
    """What `worlds()` draws, as lists; `snapshot()` builds the model's Snapshot of it."""

    nodes: list[Node]
    classes: list[GPUClass]
    namespaces: list[Namespace]
    budgets: list[Budget]
    devices: list[GPUDevice]
    reservations: list[Hold]

    def snapshot(self) -> Snapshot:
        return Snapshot.build(nodes=self.nodes, classes=self.classes, devices=self.devices,
                              budgets=self.budgets, namespaces=self.namespaces,
                              reservations=self.reservations)


@st.composite
def worlds(draw, bound: bool = True) -> World:
    """A random World: 1–6 nodes, 1–6 devices per tenant (Bound somewhere, the node "gone"
    included, or Pending; all Pending when not `bound`), 0–2 reservations of other
    requests."""
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        labels = {"zone": draw(st.sampled_from("ab")), "kubevirt.io/schedulable": "true"}
        if draw(st.booleans()):
            labels["gpu"] = "yes"
        alloc = tuple((r, n) for r, n in ((H, draw(st.integers(0, 4))), (L, draw(st.integers(0, 3)))) if n)
        nodes.append(Node(f"n{i}", tuple(sorted(labels.items())), alloc, draw(st.integers(0, 3)) == 0))
    classes = [
        GPUClass("h100", H, draw(st.sampled_from(OnCordon)), (("gpu", "yes"),) if draw(st.booleans()) else ()),
        GPUClass("h100s", H, OnCordon.STAY),
        GPUClass("l40s", L, draw(st.sampled_from(OnCordon)), (),
                 LabelSelector((("tier", "gold"),)) if draw(st.booleans()) else None),
    ]
    namespaces = [Namespace("t1", (("tier", "gold"),)), Namespace("t2")]
    budgets = [Budget(ns, r, draw(st.integers(0, 6))) for ns in TENANTS for r in (H, L) if draw(st.booleans())]
    names = [n.name for n in nodes] + ["gone"]
    devices = []
    for ns in TENANTS:
        for i in range(draw(st.integers(1, 6))):
            on = draw(st.none() | st.sampled_from(names)) if bound else None
            kinds = ["h100", "h100", "h100s", "l40s"] + (["a100"] if draw(st.integers(0, 9)) == 0 else [])
            devices.append(GPUDevice(ns, f"d{i}", draw(st.sampled_from(kinds)),
                                     status=DeviceStatus(Phase.BOUND if on else Phase.PENDING, on)))
    reservations = []
    for i in range(draw(st.integers(0, 2))):
        res = draw(st.sampled_from((H, L)))
        reservations.append(Hold(f"other-{i}", draw(st.sampled_from(TENANTS)), draw(st.sampled_from(names)),
                                        ((res, draw(st.integers(1, 2))),), ((res, draw(st.integers(0, 2))),)))
    return World(nodes, classes, namespaces, budgets, devices, reservations)


# --- the oracle: B1–B6 from the text, brute force -------------------------------------------


def oracle(snap: Snapshot, request: Request, budgets: list[Budget]) -> tuple[str, list[str]]:
    """(rule, nodes): rule as `Decision.rule`; nodes = the B5/B6 node or every eligible node
    in B4 order. `budgets` is the raw list of quotas."""
    devices = list(snap.devices.values())
    classes = dict(snap.classes)
    res_of = {c.name: c.resource_name for c in classes.values()}
    rsv = [r for r in snap.reservations if r.request_id != request.id]
    ns = request.namespace

    def used(n, r):
        return sum(1 for d in devices if d.bound_node == n and res_of.get(d.class_name) == r)

    def alloc(n, r):
        return dict(snap.nodes[n].allocatable).get(r, 0) if n in snap.nodes else 0

    def free(n, r):
        return alloc(n, r) - used(n, r) - sum(k for x in rsv if x.node == n for rr, k in x.needs if rr == r)

    def serves(n, c):
        labels = dict(snap.nodes[n].labels)
        return alloc(n, classes[c].resource_name) > 0 and all(labels.get(k) == v for k, v in classes[c].node_selector)

    if len(set(request.devices)) != len(request.devices) or not request.devices:
        return "refused", []
    members = [snap.devices.get((ns, name)) for name in request.devices]
    if any(m is None for m in members):
        return "refused", []
    cls = {m.class_name for m in members}
    for c in cls:
        if c not in classes:
            return "refused", []
        sel = classes[c].namespace_selector
        if sel is not None and not sel.matches(dict(snap.namespaces[ns].labels) if ns in snap.namespaces else {}):
            return "refused", []
    for r in {res_of[c] for c in cls}:
        adds = sum(1 for m in members if m.bound_node is None and res_of[m.class_name] == r)
        budget = min((b.hard for b in budgets if b.namespace == ns and b.resource_name == r), default=None)
        slots = {}
        for x in rsv:
            if x.namespace == ns:
                for rr, k in x.budget_needs:
                    if rr == r:
                        slots[x.request_id] = max(k, slots.get(x.request_id, 0))
        usage = sum(1 for d in devices if d.namespace == ns and d.bound_node and res_of.get(d.class_name) == r) + sum(slots.values())
        if adds and budget is not None and usage + adds > budget:
            return "refused", []

    def need(n, r):
        return sum(1 for m in members if res_of[m.class_name] == r and m.bound_node != n)

    set_res = {res_of[c] for c in cls}

    def eligible(n, ignore_cordon=False):
        if n not in snap.nodes or (snap.nodes[n].unschedulable and not ignore_cordon):
            return False
        labels = dict(snap.nodes[n].labels)
        return (all(serves(n, c) for c in cls) and all(labels.get(k) == v for k, v in request.node_selector)
                and all(free(n, r) - need(n, r) >= 0 for r in set_res))

    homes = {m.bound_node for m in members}
    if len(homes) == 1 and None not in homes:
        (home,) = homes
        if eligible(home):
            return "B6", [home]
        if home in snap.nodes and snap.nodes[home].unschedulable:
            if any(classes[c].on_cordon is OnCordon.STAY for c in cls):
                labels = dict(snap.nodes[home].labels)
                if not (any(used(home, r) > alloc(home, r) for r in set_res) or not all(serves(home, c) for c in cls)
                        or not all(labels.get(k) == v for k, v in request.node_selector)):
                    return "B5b", [home]
            elif eligible(home, ignore_cordon=True) and not any(eligible(n) for n in snap.nodes):
                return "B5a", [home]
    moves = {n: sum(1 for m in members if m.bound_node is not None and m.bound_node != n) for n in snap.nodes}
    ranked = sorted((moves[n], sum(free(n, r) - need(n, r) for r in set_res), n) for n in snap.nodes if eligible(n))
    return ("B1", [n for _, _, n in ranked]) if ranked else ("refused", [])
