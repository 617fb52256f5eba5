"""model.plan: the pure planner of a batch (B2, B3, B7), against the brute-force oracle of
B1–B6 in tests/support/random_worlds.py."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import assume, event, given, note
from hypothesis import strategies as st

from model.decide import MAX_PLACEMENTS, Request, decide
from model.hold import Hold
from model.plan import Answer, Finish, Place, Recover, Skip, plan_batch
from model.snapshot import Snapshot
from model.types import BindRequest, DeviceStatus, GPUClass, GPUDevice, Namespace, Node, Phase, Result
from tests.support.random_worlds import PROPS, TENANTS, World, oracle, worlds
KV = (("kubevirt.io/schedulable", "true"),)  # KubeVirt runs VMs on these nodes (B3)

H = "nvidia.com/H100"
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def with_request(dev: GPUDevice, rid: str, names: tuple[str, ...], *, result: Result | None = None,
                 node: str | None = None, message: str | None = None) -> GPUDevice:
    st_ = dev.status
    br = BindRequest(rid, "vm", names, T0, (), result, message, node)
    return GPUDevice(dev.namespace, dev.name, dev.class_name, dev.template_for,
                     DeviceStatus(st_.phase, st_.node_name, st_.bound_at, None, br))


def small() -> Snapshot:
    return Snapshot.build(nodes=[Node("n1", KV, ((H, 2),)), Node("n2", KV, ((H, 4),))],
                          classes=[GPUClass("h100", H)], namespaces=[Namespace("t")],
                          devices=[GPUDevice("t", n, "h100") for n in ("a", "b", "c", "d")])


def members(snap: Snapshot, rid: str, names: tuple[str, ...], **kw) -> tuple[GPUDevice, ...]:
    return tuple(with_request(snap.device("t", n), rid, names, **kw) for n in names)


def test_B2_B3_a_batch_never_gives_one_unit_twice() -> None:
    snap = small()
    batch = [("t", "r1", members(snap, "r1", ("a", "b"))),
             ("t", "r2", members(snap, "r2", ("c", "d")))]
    actions, after = plan_batch(snap, (), batch)
    assert [type(a) for a in actions] == [Place, Place]
    assert actions[0].hold.node == "n1" and actions[0].hold.needs == ((H, 2),)  # tightest fit
    assert actions[1].decision.node == "n2"  # n1's two units are held by r1
    assert after.reserved("n1", H) == 2 and after.reserved("n2", H) == 2


def test_B3_holds_in_flight_count_and_empty_ones_are_ignored() -> None:
    snap = small()
    held = [Hold("other", "t", "n2", ((H, 4),)), Hold("done", "t", "n1")]
    actions, _ = plan_batch(snap, held, [("t", "r1", members(snap, "r1", ("a", "b", "c")))])
    assert isinstance(actions[0], Answer) and actions[0].decision.result is Result.REFUSED


def test_B7_a_recorded_node_is_recovered_there_whatever_the_capacity() -> None:
    snap = small()
    ms = members(snap, "r1", ("a", "b", "c"))
    ms = (with_request(ms[0], "r1", ("a", "b", "c"), result=Result.SUCCEEDED, node="n1",
                       message="placed on n1"), *ms[1:])
    full = snap.with_reservation(Hold("x", "t", "n1", ((H, 2),)))
    actions, after = plan_batch(full, (), [("t", "r1", ms)])
    (rec,) = actions
    assert isinstance(rec, Recover) and (rec.node, rec.message) == ("n1", "placed on n1")
    assert rec.hold is not None and rec.hold.needs == ((H, 3),)  # a is not Bound yet either
    assert after.reserved("n1", H) == 5


def test_B1_a_cut_short_refusal_is_finished_and_partial_or_answered_requests_skipped() -> None:
    snap = small()
    ms = members(snap, "r1", ("a", "b"))
    refused = (with_request(ms[0], "r1", ("a", "b"), result=Result.REFUSED, message="no"), ms[1])
    answered = tuple(with_request(m, "r3", ("c",), result=Result.SUCCEEDED, node="n1", message="ok")
                     for m in members(snap, "r3", ("c",)))
    actions, _ = plan_batch(snap, (), [("t", "r1", refused),
                                       ("t", "r2", members(snap, "r2", ("c", "d"))[:1]),
                                       ("t", "r3", answered), ("t", "gone", ())])
    assert isinstance(actions[0], Finish) and actions[0].message == "no"
    assert actions[1:] == [Skip("t", "r2"), Skip("t", "r3"), Skip("t", "gone")]


def test_B6_nothing_to_land_is_an_answer() -> None:
    snap = Snapshot.build(nodes=[Node("n1", KV, ((H, 2),))], classes=[GPUClass("h100", H)],
                          devices=[GPUDevice("t", "a", "h100", status=DeviceStatus(Phase.BOUND, "n1"))])
    actions, after = plan_batch(snap, (), [("t", "r1", members(snap, "r1", ("a",)))])
    assert isinstance(actions[0], Answer) and actions[0].decision.rule == "B6"
    assert after.reserved("n1", H) == 0


# -- against the oracle ------------------------------------------------------------------------

batches = st.lists(st.tuples(st.sampled_from(TENANTS), st.lists(st.integers(0, 5), max_size=3),
                             st.lists(st.sampled_from(["h100", "h100s", "l40s"]), max_size=3),
                             st.none() | st.sampled_from("ab")), min_size=1, max_size=5)


@PROPS
@given(worlds(), batches)
def test_B2_B4_plan_batch_decides_each_request_as_the_oracle_on_the_holds_before_it(w: World, plan):
    """Each request of a batch is decided as the brute-force oracle decides it on the view
    plus the holds in flight plus the holds planned before it; a Place's node had room for
    its hold then (invariant 1) and the tenant's budget too (invariant 4)."""
    snap = w.snapshot()
    base = Snapshot.build(nodes=w.nodes, classes=w.classes, devices=w.devices,
                          budgets=w.budgets, namespaces=w.namespaces)
    taken: set[tuple[str, str]] = set()
    batch, tpls = [], []
    for i, (ns, held, templates, zone) in enumerate(plan):
        existing = [d for (dns, _), d in snap.devices.items() if dns == ns
                    and d.key not in taken and not d.name.startswith("tpl")]
        names = list(dict.fromkeys(existing[j].name for j in held if j < len(existing)))
        new = [GPUDevice(ns, f"tpl-{i}-{j}", c, template_for="vm") for j, c in enumerate(templates)]
        names += [t.name for t in new]
        if not names:
            continue
        tpls += new
        rid = f"r{i}"
        sel = (("zone", zone),) if zone else ()
        view = {d.name: d for d in (*snap.devices_in(ns).values(), *new)}
        ms = tuple(GPUDevice(ns, n, view[n].class_name, view[n].template_for,
                             DeviceStatus(view[n].status.phase, view[n].status.node_name, None, None,
                                          BindRequest(rid, "vm", tuple(names), T0, sel)))
                   for n in names)
        taken |= {(ns, n) for n in names}
        batch.append((ns, rid, ms, Request(rid, ns, "vm", tuple(names), sel, T0)))
    assume(batch)
    view = base.with_devices(tpls)
    actions, after = plan_batch(view, w.reservations, [(ns, rid, ms) for ns, rid, ms, _ in batch])
    current = view.with_reservations(w.reservations)
    for (ns, rid, _, req), action in zip(batch, actions):
        rule, nodes = oracle(current, req, w.budgets)
        note(f"{req} -> {action}")
        event(f"{type(action).__name__} {rule}")
        if isinstance(action, Place):
            d = action.decision
            assert d.rule == rule == "B1" and [p.node for p in d.placements] == nodes[:MAX_PLACEMENTS]
            for res, n in action.hold.needs:
                assert current.free(action.hold.node, res) >= n
            for res, n in action.hold.budget_needs:
                b = current.budget_of(ns, res)
                assert b is None or current.tenant_usage(ns, res) + n <= b
            current = current.with_reservation(action.hold)
        else:
            assert isinstance(action, Answer), action
            assert action.decision.rule == rule
            assert action.decision == decide(current, req)
    for r in (w.classes[0].resource_name, w.classes[2].resource_name):
        for n in after.nodes:
            assert after.reserved(n, r) == current.reserved(n, r)
