"""P1 (docs/contract.md §3c): a VMI's priority from Kubernetes' own PriorityClasses, resolved
as kube-apiserver's Priority admission plugin resolves a Pod's
(plugin/pkg/admission/priority/admission.go), the PriorityClass parser, and ResourceQuotas
scoped on PriorityClass (`scopeSelector`, as the quota evaluator matches Pods): which sets they
apply to and what they count, in the webhook's W1 (`model.admission.check`) and in the binder's
judgement (`model.decide`). Refusals are asserted as typed reasons."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.admission import AdmissionPlan, Refusal, check
from model.decide import Request, decide
from model.requests import complete_request
from model.hold import Hold
from model.parse import ParseError, VMIAsk, parse_budgets, parse_gpu_device, parse_priority_class
from model.priority import (DEFAULT_PRIORITY, PreemptionPolicy, Priority, PriorityClassInfo, PriorityScope,
                            ScopeRequirement, default_class, resolve_priority)
from model.reasons import BudgetExhausted, CannotPlace, Category, Code, PriorityClassNotFound, SetRefused
from model.snapshot import Snapshot
from model.types import Attachment, BindRequest, Budget, DeviceStatus, GPUClass, GPUDevice, Node, Phase, Result

NOW = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)
H100 = "nvidia.com/H100"
KV = (("kubevirt.io/schedulable", "true"),)

SPOT = PriorityClassInfo("spot", 100)
ON_DEMAND = PriorityClassInfo("on-demand", 1000, preemption_policy=PreemptionPolicy.PREEMPT_LOWER)
CALM = PriorityClassInfo("calm", 500, preemption_policy=PreemptionPolicy.NEVER)
CRITICAL = PriorityClassInfo("system-cluster-critical", 2_000_000_000)
CLASSES = {pc.name: pc for pc in (SPOT, ON_DEMAND, CALM, CRITICAL)}


# --- resolution ------------------------------------------------------------------------------


def test_a_named_class_gives_its_value_policy_and_name():
    assert resolve_priority("on-demand", CLASSES) == Priority(1000, PreemptionPolicy.PREEMPT_LOWER, "on-demand")
    assert resolve_priority("calm", CLASSES) == Priority(500, PreemptionPolicy.NEVER, "calm")
    assert not resolve_priority("calm", CLASSES).may_preempt


def test_a_class_that_does_not_exist_is_refused_naming_it_as_kubernetes_refuses_the_pod():
    got = resolve_priority("on-demnad", CLASSES)
    assert got == PriorityClassNotFound("on-demnad")
    assert got.code is Code.PRIORITY_CLASS_NOT_FOUND and got.category is Category.POLICY  # 403
    assert got.render() == "no PriorityClass with name on-demnad was found"
    # a globalDefault never stands in for a name that does not resolve
    with_default = {**CLASSES, "d": PriorityClassInfo("d", 7, global_default=True)}
    assert resolve_priority("nope", with_default) == PriorityClassNotFound("nope")


def test_no_name_is_the_global_default_else_zero():
    assert resolve_priority(None, CLASSES) == DEFAULT_PRIORITY == Priority(0, PreemptionPolicy.PREEMPT_LOWER, None)
    assert resolve_priority("", CLASSES) == DEFAULT_PRIORITY
    assert resolve_priority(None, {}) == DEFAULT_PRIORITY
    default = PriorityClassInfo("standard", 10, global_default=True, preemption_policy=PreemptionPolicy.NEVER)
    # the plugin writes the default's name into the Pod: the set records it too
    assert resolve_priority(None, {**CLASSES, "standard": default}) == Priority(10, PreemptionPolicy.NEVER, "standard")


def test_several_global_defaults_the_lowest_value_wins_as_in_the_plugin():
    a = PriorityClassInfo("a", 50, global_default=True)
    b = PriorityClassInfo("b", 20, global_default=True)
    c = PriorityClassInfo("c", 20, global_default=True)
    assert default_class({"a": a, "b": b, "c": c}) == b  # equal values: the first by name
    assert resolve_priority(None, {"a": a, "c": c, "b": b}).class_name == "b"


def test_the_built_in_system_classes_resolve_like_any_class_the_informer_sees():
    assert resolve_priority("system-cluster-critical", CLASSES).value == 2_000_000_000


def _plugin(name, classes):
    """A straightforward reimplementation of the Priority plugin's admitPod, to compare."""
    if name:
        if name not in classes:
            return ("forbidden", f"no PriorityClass with name {name} was found")
        pc = classes[name]
        return (pc.value, pc.preemption_policy.value, name)
    defaults = [pc for pc in classes.values() if pc.global_default]
    if not defaults:
        return (0, "PreemptLowerPriority", None)
    low = min(pc.value for pc in defaults)
    pc = sorted((pc for pc in defaults if pc.value == low), key=lambda p: p.name)[0]
    return (pc.value, pc.preemption_policy.value, pc.name)


_names = st.sampled_from(["a", "b", "c", "spot", "on-demand"])
_classes = st.dictionaries(_names, st.tuples(st.integers(-(2**31), 10**9), st.booleans(),
                                             st.sampled_from(PreemptionPolicy))).map(
    lambda d: {n: PriorityClassInfo(n, v, g, p) for n, (v, g, p) in d.items()})


@settings(max_examples=300, deadline=None)
@given(_classes, st.one_of(st.none(), st.just(""), _names))
def test_property_resolution_agrees_with_the_plugins_logic(classes, name):
    got = resolve_priority(name, classes)
    want = _plugin(name, classes)
    if isinstance(got, PriorityClassNotFound):
        assert want == ("forbidden", got.render())
    else:
        assert (got.value, got.policy.value, got.class_name) == want


# --- parsing ---------------------------------------------------------------------------------


def pc_obj(**fields):
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": "spot"}, **fields}


def test_a_priority_class_is_parsed_with_kubernetes_defaults():
    assert parse_priority_class(pc_obj(value=100)) == PriorityClassInfo("spot", 100, False,
                                                                       PreemptionPolicy.PREEMPT_LOWER)
    assert parse_priority_class(pc_obj(value=-3, globalDefault=True, preemptionPolicy="Never")) == \
        PriorityClassInfo("spot", -3, True, PreemptionPolicy.NEVER)


@pytest.mark.parametrize("obj, message", [
    (pc_obj(), "PriorityClass spot: value: required"),
    (pc_obj(value="high"), "PriorityClass spot: value: must be a 32-bit integer, got 'high'"),
    (pc_obj(value=True), "PriorityClass spot: value: must be a 32-bit integer, got True"),
    (pc_obj(value=2**31), "PriorityClass spot: value: must be a 32-bit integer, got 2147483648"),
    (pc_obj(value=1, globalDefault="yes"), "PriorityClass spot: globalDefault: must be a boolean, got 'yes'"),
    (pc_obj(value=1, preemptionPolicy="Sometimes"),
     "PriorityClass spot: preemptionPolicy: must be PreemptLowerPriority or Never, got 'Sometimes'"),
    ({"value": 1, "metadata": {}}, "PriorityClass <unnamed>: metadata.name: required"),
    ("spot", "PriorityClass: (object): must be an object, got str"),
])
def test_a_malformed_priority_class_is_a_parse_error_naming_the_field(obj, message):
    with pytest.raises(ParseError) as raised:
        parse_priority_class(obj)
    assert str(raised.value) == message


def quota(hard=0, *, exprs=None, scopes=None, name="no-on-demand"):
    spec: dict = {"hard": {f"requests.{H100}": str(hard)}}
    if exprs is not None:
        spec["scopeSelector"] = {"matchExpressions": exprs}
    if scopes is not None:
        spec["scopes"] = scopes
    return {"metadata": {"name": name, "namespace": "t1"}, "spec": spec}


def test_a_quota_scoped_on_priority_class_gives_scoped_budgets():
    got = parse_budgets(quota(0, exprs=[{"scopeName": "PriorityClass", "operator": "In",
                                         "values": ["on-demand"]}]))
    assert got == [Budget("t1", H100, 0, PriorityScope((ScopeRequirement("In", ("on-demand",)),)))]
    assert parse_budgets(quota(4)) == [Budget("t1", H100, 4)]
    # spec.scopes [PriorityClass] is Exists, as the quota evaluator reads it
    assert parse_budgets(quota(2, scopes=["PriorityClass"]))[0].scope == PriorityScope((ScopeRequirement("Exists"),))


def test_other_scopes_as_they_match_a_launcher_pod():
    """A launcher Pod is NotTerminating and NotBestEffort: quotas of those scopes apply to
    every set; Terminating, BestEffort, cross-namespace affinity and PVC scopes never apply;
    a scope Kubernetes may add later applies (fail closed)."""
    exists = lambda name: [{"scopeName": name, "operator": "Exists"}]
    assert parse_budgets(quota(3, scopes=["NotTerminating"])) == [Budget("t1", H100, 3)]
    assert parse_budgets(quota(3, exprs=exists("NotBestEffort"))) == [Budget("t1", H100, 3)]
    for never in ("Terminating", "BestEffort", "CrossNamespacePodAffinity", "VolumeAttributesClass"):
        assert parse_budgets(quota(0, scopes=[never])) == []
        assert parse_budgets(quota(0, exprs=exists(never))) == []
    assert parse_budgets(quota(1, exprs=exists("SomethingNew"))) == [Budget("t1", H100, 1)]
    both = parse_budgets(quota(0, scopes=["NotBestEffort"], exprs=[
        {"scopeName": "PriorityClass", "operator": "NotIn", "values": ["spot"]}]))
    assert both[0].scope == PriorityScope((ScopeRequirement("NotIn", ("spot",)),))


@pytest.mark.parametrize("exprs, field", [
    ([{"scopeName": "PriorityClass", "operator": "In"}], "values"),
    ([{"scopeName": "PriorityClass", "operator": "Exists", "values": ["x"]}], "values"),
    ([{"scopeName": "PriorityClass", "operator": "Near", "values": ["x"]}], "operator"),
    ([{"operator": "In", "values": ["x"]}], "scopeName"),
    (["PriorityClass"], "matchExpressions[0]"),
    ("PriorityClass", "matchExpressions"),
])
def test_a_malformed_scope_selector_is_a_parse_error(exprs, field):
    with pytest.raises(ParseError) as raised:
        parse_budgets(quota(0, exprs=exprs))
    assert field in raised.value.field


@pytest.mark.parametrize("op, values, none, spot, on_demand", [
    ("In", ("on-demand",), False, False, True),
    ("NotIn", ("on-demand",), True, True, False),
    ("Exists", (), False, True, True),
    ("DoesNotExist", (), True, False, False),
])
def test_scope_operators_match_as_the_quota_evaluator_matches_a_pod(op, values, none, spot, on_demand):
    r = ScopeRequirement(op, values)
    assert (r.matches(None), r.matches("spot"), r.matches("on-demand")) == (none, spot, on_demand)


# --- scoped budgets in W1 and in the binder's judgement --------------------------------------

IN_ON_DEMAND = PriorityScope((ScopeRequirement("In", ("on-demand",)),))
OD = Priority(1000, PreemptionPolicy.PREEMPT_LOWER, "on-demand")
SP = Priority(100, PreemptionPolicy.PREEMPT_LOWER, "spot")


def device(name, *, bound=None, priority=None, rid="old", vmi="vm-old", ns="t1", devices=None,
           attached=True):
    br = None if priority is None else BindRequest(rid, vmi, tuple(devices or (name,)), NOW,
                                                   result=Result.SUCCEEDED if bound else None,
                                                   priority=priority)
    return GPUDevice(ns, name, "h100", status=DeviceStatus(
        Phase.BOUND if bound else Phase.PENDING, bound, NOW if bound else None,
        Attachment(vmi, NOW) if priority is not None and attached else None, br))


def world(*devices, budgets=(), reservations=(), free=8):
    return Snapshot.build(nodes=[Node("n1", KV, allocatable=((H100, free),))],
                          classes=[GPUClass("h100", H100)], devices=devices, budgets=budgets,
                          priority_classes=CLASSES.values(), reservations=reservations)


def admit(snap, ask, name=None, vmi="vm"):
    return check(snap, "t1", vmi, ask, set(), NOW, GRACE, priority_class_name=name)


def test_W1_an_unknown_priority_class_is_refused_before_anything_else():
    got = admit(world(), VMIAsk((), (("h100", 1),)), "nope")
    assert got == Refusal(PriorityClassNotFound("nope"))


def test_W1_the_plan_carries_the_resolved_priority():
    got = admit(world(), VMIAsk((), (("h100", 2),)), "on-demand")
    assert isinstance(got, AdmissionPlan) and got.priority == OD
    assert admit(world(), VMIAsk((), (("h100", 1),))).priority == DEFAULT_PRIORITY


def test_W1_a_scoped_quota_of_zero_forbids_that_class_only():
    guard = Budget("t1", H100, 0, IN_ON_DEMAND)
    snap = world(budgets=[guard])
    got = admit(snap, VMIAsk((), (("h100", 2),)), "on-demand")
    assert got == Refusal(CannotPlace("t1", "vm", (BudgetExhausted("t1", H100, 0, 0, 2, 0,
                                                                   "PriorityClass In (on-demand)"),)))
    assert got.reason.category is Category.POLICY
    assert "PriorityClass In (on-demand)" in got.reason.render()
    assert isinstance(admit(snap, VMIAsk((), (("h100", 2),)), "spot"), AdmissionPlan)
    assert isinstance(admit(snap, VMIAsk((), (("h100", 2),))), AdmissionPlan)


def test_W1_a_scoped_quota_counts_only_the_sets_of_its_classes():
    snap = world(device("a", bound="n1", priority=OD), device("b", bound="n1", priority=SP),
                 device("c", bound="n1", priority=SP), device("idle", bound="n1"),
                 budgets=[Budget("t1", H100, 2, IN_ON_DEMAND), Budget("t1", H100, 10)], free=16)
    assert isinstance(admit(snap, VMIAsk((), (("h100", 1),)), "on-demand"), AdmissionPlan)  # 1 + 1 <= 2
    got = admit(snap, VMIAsk((), (("h100", 2),)), "on-demand")
    assert got.reason.reasons == (BudgetExhausted("t1", H100, 1, 2, 2, 0, "PriorityClass In (on-demand)"),)
    assert isinstance(admit(snap, VMIAsk((), (("h100", 6),)), "spot"), AdmissionPlan)  # only the 10 applies
    got = admit(snap, VMIAsk((), (("h100", 7),)), "spot")  # the unscoped quota still governs all
    assert got.reason.reasons == (BudgetExhausted("t1", H100, 4, 10, 7),)


def test_W1_held_devices_recorded_under_another_class_enter_the_scope():
    """The re-attach attack: devices held under spot (or under no class, idle) cannot be
    taken into a forbidden class: they would be counted under it from this admission on."""
    # g1: its spot VM stopped (the attachment cleared, the record kept); g2: idle, no record
    snap = world(device("g1", bound="n1", priority=SP, attached=False), device("g2", bound="n1"),
                 budgets=[Budget("t1", H100, 0, IN_ON_DEMAND)])
    got = admit(snap, VMIAsk(("g1", "g2"), ()), "on-demand")
    assert got.reason.reasons == (BudgetExhausted("t1", H100, 0, 0, 2, 0, "PriorityClass In (on-demand)"),)
    assert isinstance(admit(snap, VMIAsk(("g1", "g2"), ()), "spot"), AdmissionPlan)


def test_W1_every_applicable_scoped_quota_must_have_room():
    not_spot = PriorityScope((ScopeRequirement("NotIn", ("spot",)),))
    snap = world(device("a", bound="n1", priority=OD),
                 budgets=[Budget("t1", H100, 5, IN_ON_DEMAND), Budget("t1", H100, 1, not_spot)])
    got = admit(snap, VMIAsk((), (("h100", 1),)), "on-demand")
    assert got.reason.reasons == (BudgetExhausted("t1", H100, 1, 1, 1, 0, "PriorityClass NotIn (spot)"),)
    assert isinstance(admit(snap, VMIAsk((), (("h100", 3),)), "spot"), AdmissionPlan)


def request_world(*, budgets, reservations=(), extra=()):
    members = [device(n, priority=OD, rid="r1", vmi="vm", devices=("m1", "m2")) for n in ("m1", "m2")]
    return world(*members, *extra, budgets=budgets, reservations=reservations), members


def test_B1_the_binder_judges_a_scoped_quota_by_the_recorded_class():
    snap, members = request_world(budgets=[Budget("t1", H100, 1, IN_ON_DEMAND)])
    req = complete_request("t1", "r1", members)
    assert req is not None and req.priority == OD
    d = decide(snap, req)
    assert d.result is Result.REFUSED
    assert d.reason.reasons[0] == BudgetExhausted("t1", H100, 0, 1, 2, 0, "PriorityClass In (on-demand)")
    ok, members = request_world(budgets=[Budget("t1", H100, 2, IN_ON_DEMAND)])
    assert decide(ok, complete_request("t1", "r1", members)).result is Result.SUCCEEDED


def test_B1_reservations_of_sets_of_the_class_count_against_its_scoped_quota():
    other = [device(n, priority=OD, rid="r0", vmi="vm0", devices=("o1", "o2")) for n in ("o1", "o2")]
    spot = [device(n, priority=SP, rid="s0", vmi="vms", devices=("s1", "s2")) for n in ("s1", "s2")]
    holds = (Hold("r0", "t1", "n1", ((H100, 2),), ((H100, 2),), tuple((d.key, H100) for d in other)),
             Hold("s0", "t1", "n1", ((H100, 2),), ((H100, 2),), tuple((d.key, H100) for d in spot)))
    snap, members = request_world(budgets=[Budget("t1", H100, 3, IN_ON_DEMAND)], reservations=holds,
                                  extra=(*other, *spot))
    d = decide(snap, complete_request("t1", "r1", members))
    assert d.reason.reasons[0] == BudgetExhausted("t1", H100, 0, 3, 2, 2, "PriorityClass In (on-demand)")
    roomy, members = request_world(budgets=[Budget("t1", H100, 4, IN_ON_DEMAND)], reservations=holds,
                                   extra=(*other, *spot))
    assert decide(roomy, complete_request("t1", "r1", members)).result is Result.SUCCEEDED


def test_the_scoped_counts_follow_devices_as_they_change():
    """The counting index carries the per-class counts copy-on-write: a derived snapshot
    answers as a fresh build of the same devices does."""
    guard = [Budget("t1", H100, 3, IN_ON_DEMAND)]
    snap = world(device("a", bound="n1", priority=SP), budgets=guard)
    assert snap.scoped_budget_refusal("t1", H100, "on-demand", 3) is None  # index built here
    moved = snap.with_devices([device("a", bound="n1", priority=OD, rid="x"),
                               device("b", bound="n1", priority=OD, rid="x")])
    fresh = world(device("a", bound="n1", priority=OD, rid="x"), device("b", bound="n1", priority=OD, rid="x"),
                  budgets=guard)
    for s in (moved, fresh):
        assert s.scoped_budget_refusal("t1", H100, "on-demand", 2) == BudgetExhausted(
            "t1", H100, 2, 3, 2, 0, "PriorityClass In (on-demand)")
    gone = moved.without_device("t1", "b")
    assert gone.scoped_budget_refusal("t1", H100, "on-demand", 2) is None
    assert gone.scoped_budget_refusal("t1", H100, "on-demand", 3) is not None
    # a device's recorded class changing on its node moves it between the counts
    spot_again = moved.with_device(device("b", bound="n1", priority=SP, rid="y"))
    assert spot_again.scoped_budget_refusal("t1", H100, "on-demand", 2) is None
    # a held member of the set recorded under spot enters the scope with the set
    assert spot_again.scoped_budget_refusal("t1", H100, "on-demand", 1, ["spot"]) is None
    assert spot_again.scoped_budget_refusal("t1", H100, "on-demand", 1, ["spot", "on-demand", None]) == \
        BudgetExhausted("t1", H100, 1, 3, 3, 0, "PriorityClass In (on-demand)")


def test_a_recorded_priority_round_trips_through_the_status():
    from model.serialize import device_status_to_dict
    dev = device("a", bound="n1", priority=OD)
    raw = {"metadata": {"name": "a", "namespace": "t1"}, "spec": {"class": "h100"},
           "status": device_status_to_dict(dev.status)}
    assert raw["status"]["bindRequest"]["priorityClassName"] == "on-demand"
    assert parse_gpu_device(raw).status.bind_request.priority == OD


def test_a_request_is_judged_with_the_priority_its_members_record():
    members = [device(n, priority=SP, rid="r9", vmi="vm", devices=("x1", "x2")) for n in ("x1", "x2")]
    req = complete_request("t1", "r9", members)
    assert req == Request("r9", "t1", "vm", ("x1", "x2"), (), NOW, (), SP)
    assert isinstance(decide(world(*members), req).outcome, object)
    assert not isinstance(decide(world(*members), req).reason, SetRefused)


# --- the VirtualMachine path -----------------------------------------------------------------


def template_vm(priority_class=None, count=1):
    spec: dict = {"domain": {"devices": {}}}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"name": "vm", "namespace": "t1", "creationTimestamp": "2026-12-06T07:00:00Z"},
            "spec": {"runStrategy": "Always", "template": {
                "metadata": {"annotations": {"gpu.cozystack.io/templates": f"h100={count}"}},
                "spec": spec}},
            "status": {"conditions": [{"type": "Failure", "status": "True", "reason": "FailedCreate"}]}}


def test_a_vms_template_class_that_does_not_exist_is_its_waiting_reason():
    from model.housekeeping import VMIs
    from model.vm import judge_vm
    e, cond = judge_vm(world(), template_vm("on-demnad"), vmis=VMIs(), now=NOW, grace=GRACE)
    assert (cond.status, cond.reason, cond.message) == (
        "False", "PriorityClassNotFound", "no PriorityClass with name on-demnad was found")
    assert e is not None and e.reason == PriorityClassNotFound("on-demnad") and e.after_defrag is None
    _, ok = judge_vm(world(), template_vm("spot"), vmis=VMIs(), now=NOW, grace=GRACE)
    assert ok.status == "True"


def test_a_vms_template_class_is_judged_against_the_quotas_scoped_on_it():
    from model.housekeeping import VMIs
    from model.vm import judge_vm
    snap = world(budgets=[Budget("t1", H100, 0, IN_ON_DEMAND)])
    _, cond = judge_vm(snap, template_vm("on-demand", 2), vmis=VMIs(), now=NOW, grace=GRACE)
    assert (cond.status, cond.reason) == ("False", "BudgetExhausted")
    assert "PriorityClass In (on-demand)" in cond.message
    _, ok = judge_vm(snap, template_vm(None, 2), vmis=VMIs(), now=NOW, grace=GRACE)
    assert ok.status == "True"


def test_W1_admissions_in_flight_count_against_a_scoped_quota_only_when_of_its_classes():
    from model.admission import budget_in_flight
    from model.reasons import BudgetInFlight
    snap = world(device("a", bound="n1", priority=OD), budgets=[Budget("t1", H100, 3, IN_ON_DEMAND)])
    plan = AdmissionPlan("t1", "vm", (), (("vm-h100-0", "h100"),), "n1", OD)
    od_other = AdmissionPlan("t1", "vm2", (), (("vm2-h100-0", "h100"), ("vm2-h100-1", "h100")), "n1", OD)
    spot_other = AdmissionPlan("t1", "vm3", (), (("vm3-h100-0", "h100"),) * 1, "n1", SP)
    assert budget_in_flight(snap, plan, [spot_other], retry_after=1) is None
    assert budget_in_flight(snap, plan, [od_other, spot_other], retry_after=1) == Refusal(
        BudgetInFlight("t1", H100, 1, 2, 3, 1, 1, retry_after=1))
    assert budget_in_flight(snap, replace_priority(plan, SP), [od_other], retry_after=1) is None


def replace_priority(plan, priority):
    from dataclasses import replace
    return replace(plan, priority=priority)


def test_the_view_keeps_every_scoped_budget_beside_the_smallest_unscoped_one():
    from actors.view import IndexedView
    v = IndexedView()
    guard = Budget("t1", H100, 0, IN_ON_DEMAND)
    v.set_budgets("t1", [Budget("t1", H100, 5), Budget("t1", H100, 3), guard,
                         Budget("t1", H100, 2, PriorityScope((ScopeRequirement("Exists"),)))])
    snap = v.snapshot()
    assert snap.budgets == {("t1", H100): 3}
    assert sorted(h for h, _ in snap.scoped_budgets("t1", H100)) == [0, 2]
    v.set_budgets("t1", [Budget("t1", H100, 3)])
    assert v.snapshot().scoped_budgets("t1", H100) == ()
    assert v.budgets() == (Budget("t1", H100, 3),)


_pcs = st.sampled_from([None, "spot", "on-demand"])
_dev = st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["t1", "t2"]),
                 st.sampled_from([None, "n1"]), _pcs)


def _make(spec):
    name, ns, node, pc = spec
    prio = None if pc is None else Priority(1, PreemptionPolicy.PREEMPT_LOWER, pc)
    return device(name, ns=ns, bound=node, priority=prio, attached=False)


SCOPES = [IN_ON_DEMAND, PriorityScope((ScopeRequirement("NotIn", ("spot",)),)),
          PriorityScope((ScopeRequirement("DoesNotExist"),)), PriorityScope((ScopeRequirement("Exists"),))]


@settings(max_examples=150, deadline=None)
@given(st.lists(_dev, max_size=6), st.lists(st.lists(_dev, max_size=3), max_size=4),
       st.lists(st.tuples(st.sampled_from(["t1", "t2"]), st.sampled_from(["a", "b", "c", "d"])), max_size=3))
def test_property_scoped_usage_of_a_derived_snapshot_is_a_fresh_counts(start, steps, gone):
    """The per-class counts carried copy-on-write by `with_changes` equal those of a
    snapshot built from the same devices (only t1 has scoped budgets: t2's never count)."""
    budgets = [Budget("t1", H100, 9, s) for s in SCOPES]
    snap = world(*map(_make, start), budgets=budgets)
    snap.scoped_usage("t1", H100, SCOPES[0])  # the index exists before the changes
    for batch in steps:
        snap = snap.with_changes([_make(s) for s in batch], ())
    snap = snap.with_changes((), gone)
    fresh = world(*(snap.devices.values()), budgets=budgets)
    for scope in SCOPES:
        want = sum(1 for d in snap.devices.values() if d.namespace == "t1" and d.bound_node
                   and scope.matches(d.status.bind_request.priority.class_name if d.status.bind_request else None))
        assert snap.scoped_usage("t1", H100, scope) == fresh.scoped_usage("t1", H100, scope) == want
        assert snap.scoped_usage("t2", H100, scope) == 0
