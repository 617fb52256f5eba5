"""Property tests of the pure model over random fleets and request sequences (docs/contract.md §7).

Requests are judged by `decide` and carried out by `apply_decision`; after each step the
invariants 1, 3 and 4 are checked, the decision is compared with a brute-force oracle written
from the text of B1–B6 (no index, every node scanned), and the copy-on-write index is compared
with one built from scratch. Also: what W1 (`check_order`, `check_set`) admits, the binder
places. On failure hypothesis prints the reproducing blob (`@reproduce_failure`).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import assume, event, given, note
from hypothesis import strategies as st

from model.check import check_set
from model.decide import MAX_PLACEMENTS, Request, apply_decision, decide
from model.reasons import RequestRef
from model.snapshot import Order, Snapshot
from model.types import Budget, GPUDevice, Result
from tests.support.random_worlds import PROPS, TENANTS, World, oracle, worlds
from tests.support.world import H, L, NOW


request_steps = st.tuples(st.just("request"), st.sampled_from(TENANTS), st.lists(st.integers(0, 5), max_size=4),
                          st.lists(st.sampled_from(["h100", "h100s", "l40s"]), max_size=3),
                          st.none() | st.sampled_from("ab"))
node_steps = st.tuples(st.sampled_from(["cordon", "shrink", "grow"]), st.integers(0, 5), st.sampled_from((H, L)))
home_steps = st.tuples(st.just("home"), st.sampled_from(TENANTS), st.integers(0, 6), st.none() | st.sampled_from("ab"))
release_steps = st.tuples(st.just("release"), st.sampled_from(TENANTS))
evict_steps = st.tuples(st.just("evict"), st.sampled_from(TENANTS), st.integers(0, 5), st.none() | st.sampled_from("ab"))
steps = st.lists(st.one_of(request_steps, request_steps, home_steps, evict_steps, node_steps, release_steps),
                 min_size=2, max_size=10)


def expand(plan):
    """An "evict" step is a cordon of a node, then a request of what a tenant holds on it."""
    for step in plan:
        if step[0] == "evict":
            yield ("cordon-on", step[2], H)
            yield ("home",) + step[1:]
        else:
            yield step


# --- checks -----------------------------------------------------------------------------------


def counts(snap: Snapshot):
    used, tenant = {}, {}
    for d in snap.devices.values():
        r = snap.classes[d.class_name].resource_name if d.class_name in snap.classes else None
        if d.bound_node and r:
            used[(d.bound_node, r)] = used.get((d.bound_node, r), 0) + 1
            tenant[(d.namespace, r)] = tenant.get((d.namespace, r), 0) + 1
    return used, tenant


def check_step(before: Snapshot, after: Snapshot, request: Request, decision) -> None:
    placed = lambda s: {k: (d.status.phase, d.status.node_name) for k, d in s.devices.items()}  # noqa: E731
    used0, tenant0 = counts(before)
    used1, tenant1 = counts(after)
    # invariant 1: no placement makes a node's Bound devices exceed allocatable (reservations counted)
    for (n, r), k in used1.items():
        if k > used0.get((n, r), 0):
            assert k + after.reserved(n, r) <= after.allocatable(n, r), (n, r)
    # invariant 4: no tenant's Bound devices (plus reserved slots) exceed its budget
    for (ns, r), k in tenant1.items():
        b = after.budget_of(ns, r)
        if k > tenant0.get((ns, r), 0) and b is not None:
            assert after.tenant_usage(ns, r) <= b, (ns, r)
    # invariant 3
    members = [after.device(request.namespace, n) for n in request.devices]
    if decision.result is Result.SUCCEEDED:
        assert all(m is not None and m.bound_node == decision.node for m in members)
        assert all(m.status.bind_request.result is Result.SUCCEEDED for m in members)
    else:
        assert placed(after) == placed(before)  # a refusal changes no placement at all
        refusal = decision.reason  # B1(b): names the request and every device listed
        assert refusal is not None and refusal.request == RequestRef(request.namespace, "vm", request.id)
        assert {d.name for d in refusal.devices} == set(request.devices)
        assert decision.message == refusal.render()
    # the copy-on-write index equals one built from scratch
    fresh = Snapshot.build(nodes=after.nodes.values(), classes=after.classes.values(),
                           devices=after.devices.values(), budgets=[Budget(ns, r, h) for (ns, r), h in after.budgets.items()],
                           namespaces=after.namespaces.values(), reservations=after.reservations)
    for r in (H, L):
        assert dict(after.free_buckets(r)) == dict(fresh.free_buckets(r))
        for n in list(after.nodes) + ["gone"]:
            assert (after.used(n, r), after.free(n, r)) == (fresh.used(n, r), fresh.free(n, r))
        for ns in TENANTS:
            assert after.tenant_usage(ns, r) == fresh.tenant_usage(ns, r)


@PROPS
@given(worlds(), steps)
def test_invariants_hold_over_request_sequences(w: World, plan):
    snap = w.snapshot()
    counter = 0
    for step in expand(plan):
        kind = step[0]
        if kind in ("request", "home"):
            counter += 1
            if kind == "request":  # some held devices and some new template devices
                _, ns, held, templates, zone = step
                existing = [d for (dns, _), d in snap.devices.items() if dns == ns and not d.name.startswith("tpl")]
                names = list(dict.fromkeys(existing[i].name for i in held if i < len(existing)))
                tpls = [GPUDevice(ns, f"tpl-{counter}-{i}", c, template_for="vm") for i, c in enumerate(templates)]
                names += [t.name for t in tpls]
            else:  # every device the tenant holds on one node (B5, B6)
                _, ns, i, zone = step
                home = (list(snap.nodes) + ["gone"])[min(i, len(snap.nodes))]
                names = [d.name for (dns, _), d in snap.devices.items() if dns == ns and d.bound_node == home]
                tpls = []
            if not names:
                continue
            snap = snap.with_devices(tpls)
            request = Request(f"r{counter}", ns, "vm", tuple(names), (("zone", zone),) if zone else ())
            decision = decide(snap, request)
            note(f"{request} -> {decision.rule} {decision.node}: {decision.message}")
            event(f"rule {decision.rule}")
            rule, nodes = oracle(snap, request, w.budgets)
            assert decision.rule == rule
            if rule == "refused":
                assert decision.result is Result.REFUSED and decision.placements == ()
            else:
                assert [p.node for p in decision.placements] == nodes[:MAX_PLACEMENTS]
                assert decision.node == nodes[0]
                assert [p.node for p in decide(snap, request, limit=2).placements] == nodes[:2]
                assert [p.node for p in decide(snap, request, limit=None).placements] == nodes
            after = apply_decision(snap, request, decision, now=NOW)
            check_step(snap, after, request, decision)
            snap = after
        elif kind == "release":
            for (dns, name), d in list(snap.devices.items()):
                if dns == step[1] and d.template_for:
                    snap = snap.without_device(dns, name)
        else:
            _, i, res = step
            nodes = list(snap.nodes.values())
            if i >= len(nodes):
                continue
            n = nodes[i]
            if kind in ("cordon", "cordon-on"):
                n = replace(n, unschedulable=kind == "cordon-on" or not n.unschedulable)
            else:
                alloc = dict(n.allocatable)
                alloc[res] = max(0, alloc.get(res, 0) + (-1 if kind == "shrink" else 1))
                n = replace(n, allocatable=tuple(sorted((r, k) for r, k in alloc.items() if k)))
            nodes[i] = n
            snap = snap.with_nodes(nodes)


def orders_for(snap: Snapshot, ns: str, held: list[int], templates: list[str]) -> list[Order]:
    existing = sorted(d.name for (dns, _), d in snap.devices.items() if dns == ns)
    names = list(dict.fromkeys(existing[i] if i < len(existing) else "missing" for i in held))
    return [Order(ns, "", n) for n in names] + [Order(ns, c) for c in templates]


def equivalent_request(snap: Snapshot, ns: str, orders: list[Order]) -> tuple[Snapshot, Request]:
    tpls = [GPUDevice(ns, f"tpl-{i}", o.class_name) for i, o in enumerate(orders) if o.device is None]
    names = [o.device for o in orders if o.device is not None] + [t.name for t in tpls]
    return snap.with_devices(tpls), Request("w1", ns, "vm", tuple(names))


@PROPS
@given(worlds(), st.sampled_from(TENANTS), st.lists(st.integers(0, 6), max_size=3),
       st.lists(st.sampled_from(["h100", "h100s", "l40s", "a100"]), max_size=3))
def test_W1_check_set_admits_exactly_what_decide_places(w: World, ns, held, templates):
    snap = w.snapshot()
    orders = orders_for(snap, ns, held, templates)
    assume(orders)
    verdict = check_set(snap, ns, orders)
    whole, request = equivalent_request(snap, ns, orders)
    decision = decide(whole, request)
    note(f"{verdict} / {decision}")
    event(f"check_set {'admitted' if verdict.admitted else 'denied'}"
          f"{', reservations in flight' if snap.reservations else ''}")
    if verdict.admitted:
        assert decision.result is Result.SUCCEEDED and decision.node == verdict.node
    elif not snap.reservations:
        # With reservations in flight a held set on a cordoned node can pass B5(b) (no lost
        # capacity) while check_order sees no free unit in place; W1 is then stricter.
        assert decision.result is Result.REFUSED


@PROPS
@given(worlds(), st.sampled_from(TENANTS), st.integers(0, 6), st.sampled_from(["h100", "h100s", "l40s", "a100"]))
def test_W1_check_order_admitting_implies_decide_succeeds(w: World, ns, held, template):
    snap = w.snapshot()
    for order in orders_for(snap, ns, [held], []) + [Order(ns, template)]:
        verdict = snap.check_order(order)
        event(f"check_order {'admitted' if verdict.admitted else 'denied'}")
        if verdict.admitted:
            whole, request = equivalent_request(snap, ns, [order])
            decision = decide(whole, request)
            note(f"{order}: {verdict} / {decision}")
            assert decision.result is Result.SUCCEEDED
