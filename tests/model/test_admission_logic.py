"""W1/W4 judgement and the VMI mutation of model.admission (pure). Refusals are asserted as
typed reasons (`model.reasons`); their wording is `tests/model/test_reasons.py`'s."""

from datetime import datetime, timedelta, timezone

from model.admission import (AdmissionPlan, Refusal, already_admitted, check, template_name,
                             vmi_patch)
from model.parse import VMIAsk
from model.reasons import (BudgetExhausted, CannotPlace, Category, Code, DeviceAt, DeviceAttached,
                           DeviceBeingDeleted, HeldDeviceNotFound, NodeProblems, NoEligibleNode,
                           NoRoom, SetNeeds, SetRefused, TooManySelectorEntries, TooManyTolerations,
                           UnknownAnnotation)
from model.snapshot import Snapshot
from model.types import (Attachment, BindRequest, Budget, DeviceStatus, GPUClass, GPUDevice,
                         Node, Phase, Result)

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)
H100 = "nvidia.com/H100"
KV = (("kubevirt.io/schedulable", "true"),)  # KubeVirt runs VMs here (B3)


def snap(*devices, budget=None, free=2):
    nodes = [Node("n1", KV, allocatable=((H100, free),)), Node("n2", KV, allocatable=((H100, 1),))]
    budgets = [Budget("t1", H100, budget)] if budget is not None else []
    return Snapshot.build(nodes=nodes, classes=[GPUClass("h100", H100)], devices=devices,
                          budgets=budgets)


def held(name, bound=None, attached=None, since_s=0, br=None):
    return GPUDevice("t1", name, "h100", status=DeviceStatus(
        phase=Phase.BOUND if bound else Phase.PENDING, node_name=bound,
        attached_to=Attachment(attached, NOW - timedelta(seconds=since_s)) if attached else None,
        bind_request=br))


def test_W1_plan_names_templates_deterministically_and_picks_a_node():
    got = check(snap(held("g1", bound="n1")), "t1", "vm", VMIAsk(("g1",), (("h100", 1),)),
                set(), NOW, GRACE)
    assert got == AdmissionPlan("t1", "vm", ("g1",), (("vm-h100-0", "h100"),), "n1")
    assert got.devices == ("g1", "vm-h100-0")


def test_W1_refuses_device_attached_to_live_vmi_but_not_a_stale_attachment():
    busy = held("g1", bound="n1", attached="other", since_s=10)
    assert check(snap(busy), "t1", "vm", VMIAsk(("g1",), ()), set(), NOW, GRACE) == \
        Refusal(DeviceAttached("g1", "other"))
    stale = held("g1", bound="n1", attached="other", since_s=500)
    assert isinstance(check(snap(stale), "t1", "vm", VMIAsk(("g1",), ()), set(), NOW, GRACE),
                      AdmissionPlan)
    assert check(snap(stale), "t1", "vm", VMIAsk(("g1",), ()), {("t1", "other")}, NOW, GRACE) \
        == Refusal(DeviceAttached("g1", "other"))


def test_W1_refuses_missing_device_and_budget():
    assert check(snap(), "t1", "vm", VMIAsk(("nope",), ()), set(), NOW, GRACE) == \
        Refusal(HeldDeviceNotFound("nope", "t1"))
    got = check(snap(held("g1", bound="n1"), budget=1), "t1", "vm",
                VMIAsk((), (("h100", 1),)), set(), NOW, GRACE)
    assert got == Refusal(CannotPlace("t1", "vm", (BudgetExhausted("t1", H100, 1, 1, 1),)))
    assert (got.code, got.reason.category) == (Code.BUDGET_EXHAUSTED, Category.POLICY)


def test_W4_retry_counts_existing_bound_templates_once():
    br = BindRequest("r1", "vm", ("vm-h100-0",), result=Result.SUCCEEDED, node="n1")
    t = GPUDevice("t1", "vm-h100-0", "h100", template_for="vm", status=DeviceStatus(
        phase=Phase.BOUND, node_name="n1", attached_to=Attachment("vm", NOW), bind_request=br))
    s = snap(t, budget=1)
    plan = check(s, "t1", "vm", VMIAsk((), (("h100", 1),)), set(), NOW, GRACE)
    assert isinstance(plan, AdmissionPlan)
    assert already_admitted(s, plan, NOW) == "n1"


def test_template_name_is_bounded():
    long = template_name("v" * 250, "h100", 3)
    assert len(long) == 253 and long == template_name("v" * 250, "h100", 3)


def test_vmi_patch_replaces_gpu_entries_of_effective_set_and_pins_node():
    vmi = {"spec": {"domain": {"devices": {"gpus": [
        {"name": "gpu1", "deviceName": "nvidia.com/H100"},
        {"name": "other", "deviceName": "vendor.com/fpga"}]}}, "nodeSelector": {"zone": "a"}}}
    ops = vmi_patch(vmi, [("g1", H100)], "n1", [H100])
    assert ops == [
        {"op": "add", "path": "/spec/domain/devices/gpus", "value": [
            {"name": "other", "deviceName": "vendor.com/fpga"},
            {"name": "g1", "deviceName": H100}]},
        {"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": "n1"},
    ]
    assert vmi_patch({"spec": {}}, [("g1", H100)], "n2", [H100]) == [
        {"op": "add", "path": "/spec/domain", "value": {"devices": {"gpus": [
            {"name": "g1", "deviceName": H100}]}}},
        {"op": "add", "path": "/spec/nodeSelector", "value": {"kubernetes.io/hostname": "n2"}},
    ]


def test_W1_set_larger_than_any_node_says_what_it_needs_and_the_most_free():
    one = Snapshot.build(nodes=[Node("n1", KV, allocatable=((H100, 2),))],
                         classes=[GPUClass("h100", H100)])
    got = check(one, "t1", "vm", VMIAsk((), (("h100", 3),)), set(), NOW, GRACE)
    assert got == Refusal(CannotPlace("t1", "vm", (
        SetNeeds("h100", H100, needs=3, most_free=2, largest=2, members=3),
        NoEligibleNode((NodeProblems("n1", (NoRoom(H100, needs=3, free=2),)),)))))
    # newcomer: it read like a shortage that waiting would end; no node has 3 at all
    assert got.reason.reasons[0].render().endswith(
        "the most free on an eligible node serving it is 2; no node serving it has 3 at all "
        "(the largest has 2)")
    # a node with 4, all taken: a wait may end it, so nothing more is said
    four = one.with_nodes([Node("n2", KV, allocatable=((H100, 4),), foreign=((H100, 4),))])
    got = check(four, "t1", "vm", VMIAsk((), (("h100", 3),)), set(), NOW, GRACE)
    needs = got.reason.reasons[0]
    assert (needs.largest, needs.members) == (None, 0) and "at all" not in needs.render()


def test_W1_the_most_free_counts_only_eligible_nodes_taints_and_selector_too():
    """A tainted node or one the launcher's nodeSelector excludes is not "the most free"
    (the refusal would contradict its own per-node reasons)."""
    from model.types import Taint

    taint = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")
    snap = Snapshot.build(nodes=[Node("n1", KV, allocatable=((H100, 4),), taints=(taint,)),
                                 Node("n2", (*KV, ("zone", "b")), allocatable=((H100, 1),))],
                          classes=[GPUClass("h100", H100)])
    got = check(snap, "t1", "vm", VMIAsk((), (("h100", 2),)), set(), NOW, GRACE)
    assert isinstance(got, Refusal) and isinstance(got.reason, CannotPlace)
    needs, per_node = got.reason.reasons
    assert needs == SetNeeds("h100", H100, needs=2, most_free=1)
    assert [(n.node, [p.code for p in n.problems]) for n in per_node.nodes] == [
        ("n1", [Code.TAINTS_NOT_TOLERATED]), ("n2", [Code.NO_ROOM])]
    assert per_node.nodes[0].problems[0].taints == ("node.kubernetes.io/not-ready:NoSchedule",)
    got = check(snap, "t1", "vm", VMIAsk((), (("h100", 2),)), set(), NOW, GRACE,
                node_selector=(("zone", "a"),))
    assert got.reason.reasons[0] == SetNeeds("h100", H100, needs=2, most_free=None)


def test_W1_set_larger_than_free_units_across_nodes_gets_the_binders_per_node_reasons():
    got = check(snap(free=2), "t1", "vm", VMIAsk((), (("h100", 3),)), set(), NOW, GRACE)
    assert got == Refusal(CannotPlace("t1", "vm", (SetRefused(
        (DeviceAt("new h100 #1"), DeviceAt("new h100 #2"), DeviceAt("new h100 #3")),
        (NoEligibleNode((NodeProblems("n1", (NoRoom(H100, needs=3, free=2),)),
                         NodeProblems("n2", (NoRoom(H100, needs=3, free=1),)))),)),)))


def _att(vmi, since_s=0, admission=None, uid=None):
    return Attachment(vmi, NOW - timedelta(seconds=since_s), admission, uid)


def test_W1_same_name_attachment_of_a_concurrent_admission_refuses_the_second_create():
    from model.admission import same_name_conflict
    from model.housekeeping import VMIs
    d = GPUDevice("t1", "g1", "h100", status=DeviceStatus(
        phase=Phase.BOUND, node_name="n1", attached_to=_att("vm", 1, "a1")))
    s = snap(d)
    plan = check(s, "t1", "vm", VMIAsk(("g1",), ()), VMIs(), NOW, GRACE)
    assert isinstance(plan, AdmissionPlan)   # W1 proper leaves the same name to W4 / this check
    got = same_name_conflict(s, plan, VMIs(), NOW, GRACE)
    assert isinstance(got, Refusal) and got.code is Code.SAME_NAME_CONFLICT
    assert (got.reason.device, got.reason.namespace, got.reason.vmi) == ("g1", "t1", "vm")
    assert got.reason.category is Category.UNAVAILABLE  # retry once the other has finished
    # the same attachment of an incarnation seen deleted (tombstone a1) may be taken over
    assert same_name_conflict(s, plan, VMIs({}, frozenset({("t1", "a1")})), NOW, GRACE) is None
    # ... and so may one whose VMI uid was recorded (that incarnation is gone: a live read
    # said no VMI of the name exists)
    linked = GPUDevice("t1", "g1", "h100", status=DeviceStatus(
        phase=Phase.BOUND, node_name="n1", attached_to=_att("vm", 1, "a1", "u1")))
    assert same_name_conflict(snap(linked), plan, VMIs(), NOW, GRACE) is None


def test_W1_refuses_a_device_being_deleted():
    from dataclasses import replace
    d = replace(held("g1", bound="n1"), deleting=True)
    assert check(snap(d), "t1", "vm", VMIAsk(("g1",), ()), set(), NOW, GRACE) == \
        Refusal(DeviceBeingDeleted("g1"))


def test_B3_a_bound_device_being_deleted_still_uses_its_unit():
    from dataclasses import replace
    d = replace(held("g1", bound="n2"), deleting=True)
    s = snap(d)
    assert s.used("n2", H100) == 1 and s.free("n2", H100) == 0


def test_W3_patch_annotates_the_vmi_with_its_admission_id():
    vmi = {"metadata": {"name": "vm", "annotations": {"gpu.cozystack.io/templates": "h100=1"}},
           "spec": {"domain": {"devices": {}}}}
    ops = vmi_patch(vmi, [("vm-h100-0", H100)], "n1", [H100], "adm-1")
    assert ops[0] == {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1admission",
                      "value": "adm-1"}


def test_W1_refuses_a_node_selector_or_tolerations_the_bind_request_cannot_carry():
    from model.types import Toleration

    ask = VMIAsk(("g1",), ())
    ok = [(f"k{i}", "v") for i in range(64)]
    assert isinstance(check(snap(held("g1", bound="n1")), "t1", "vm", ask, set(), NOW, GRACE,
                            node_selector=tuple(ok)), Refusal)  # no node has those labels
    got = check(snap(held("g1", bound="n1")), "t1", "vm", ask, set(), NOW, GRACE,
                node_selector=tuple([*ok, ("k64", "v")]))
    assert got == Refusal(TooManySelectorEntries(65, 64))
    assert got.reason.category is Category.INVALID
    long_value = check(snap(held("g1", bound="n1")), "t1", "vm", ask, set(), NOW, GRACE,
                       node_selector=(("zone", "x" * 64),))
    assert isinstance(long_value, Refusal) and long_value.code is Code.SELECTOR_ENTRY_TOO_LONG
    assert long_value.reason.key == "zone"
    many = tuple(Toleration(f"k{i}") for i in range(65))
    got = check(snap(held("g1", bound="n1")), "t1", "vm", ask, set(), NOW, GRACE, tolerations=many)
    assert got == Refusal(TooManyTolerations(65, 64))
    fits = check(snap(held("g1", bound="n1")), "t1", "vm", ask, set(), NOW, GRACE,
                 tolerations=many[:64])
    assert isinstance(fits, AdmissionPlan)


def test_W1_request_bounds_equal_the_gpudevice_schema():
    """The bounds `request_bounds` checks are the CRD's, so the webhook refuses exactly what
    the API server would refuse half-way through the request writes."""
    from pathlib import Path

    import yaml

    from model import admission as a

    crd = yaml.safe_load((Path(__file__).parents[2] / "k8s/manifests/crds/"
                          "gpu.cozystack.io_gpudevices.yaml").read_text())
    br = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
        "properties"]["bindRequest"]["properties"]
    sel, tol = br["nodeSelector"], br["tolerations"]
    assert sel["maxProperties"] == a.MAX_SELECTOR_ENTRIES
    assert sel["additionalProperties"]["maxLength"] == a.MAX_LABEL_VALUE
    assert "size(k) <= %d" % a.MAX_LABEL_KEY in sel["x-kubernetes-validations"][0]["rule"]
    assert tol["maxItems"] == a.MAX_TOLERATIONS
    assert tol["items"]["properties"]["key"]["maxLength"] == a.MAX_LABEL_KEY
    assert tol["items"]["properties"]["value"]["maxLength"] == a.MAX_LABEL_VALUE
    # the refusal's code beside its message: optional (older replicas write none), any string
    # (a newer replica's code must not make the write invalid), bounded like a label value
    assert br["code"] == {"description": br["code"]["description"], "type": "string", "maxLength": 63}
    assert max(len(c.value) for c in Code) <= 63 and "code" not in crd["spec"]["versions"][0][
        "schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["bindRequest"]["required"]


def test_W1_unknown_gpu_annotation_is_refused_by_the_webhook_rule_and_explain_alike():
    """A typo (`tempaltes`) or the webhook's own `admission` annotation set by a tenant:
    the webhook denies it, and `gpu-binder explain` says so rather than "admitted"."""
    import pytest

    from cli.tools import Cluster, ToolError, explain_vmi
    from model.admission import unknown_annotations

    assert unknown_annotations({"gpu.cozystack.io/templates": "h100=1", "other/x": "y"}) is None
    got = unknown_annotations({"gpu.cozystack.io/tempaltes": "h100=1",
                               "gpu.cozystack.io/admission": "forged"})
    assert got is not None and got.reason == UnknownAnnotation(
        ("gpu.cozystack.io/admission", "gpu.cozystack.io/tempaltes"),
        "gpu.cozystack.io/devices", "gpu.cozystack.io/templates",
        ("gpu.cozystack.io/admission",))
    # the forged one is named as gpu-binder's own, not as unknown
    assert got.reason.render() == (
        'unknown annotation gpu.cozystack.io/tempaltes: gpu-binder reads '
        'gpu.cozystack.io/devices (held devices, "gpu-a,gpu-b") and gpu.cozystack.io/templates '
        '(new devices, "h100=2,l40s=1"); annotation gpu.cozystack.io/admission is written by '
        'gpu-binder when it admits a VMI; a VMI may not carry it when created')
    forged = unknown_annotations({"gpu.cozystack.io/admission": "forged"})
    assert forged is not None and forged.reason.render() == (
        "annotation gpu.cozystack.io/admission is written by gpu-binder when it admits a VMI; "
        "a VMI may not carry it when created")
    vmi = {"metadata": {"name": "vm", "namespace": "t1",
                        "annotations": {"gpu.cozystack.io/tempaltes": "h100=1"}}, "spec": {}}
    with pytest.raises(ToolError, match=r"VMI t1/vm would be denied: unknown annotation "
                                        r"gpu\.cozystack\.io/tempaltes"):
        explain_vmi(Cluster(snap(), set(), {}), vmi, grace=120, now=NOW)


def test_W1_explain_of_a_running_vmi_accepts_the_admission_annotation_the_webhook_wrote():
    import pytest

    from cli.tools import Cluster, ToolError, explain_vmi

    ann = {"gpu.cozystack.io/templates": "h100=1", "gpu.cozystack.io/admission": "a1"}
    running = {"metadata": {"name": "vm", "namespace": "t1", "uid": "u-1", "annotations": ann},
               "spec": {}}
    cluster = Cluster(snap(), {("t1", "vm")}, {("t1", "vm"): running})
    assert explain_vmi(cluster, running, grace=120, now=NOW).admitted  # judged, not refused
    forged = {"metadata": {"name": "vm-2", "namespace": "t1", "annotations": ann}, "spec": {}}
    with pytest.raises(ToolError, match="would be denied: annotation gpu.cozystack.io/admission is written by gpu-binder"):
        explain_vmi(cluster, forged, grace=120, now=NOW)


def test_W1_budget_in_flight_counts_other_admissions_unbound_units_only():
    """issue 23: a set that fits the budget on the cache but not with the unbound units of
    the tenant's other admissions in progress is THROTTLED (429, retryable); Bound units are
    counted once (in use), a held device already Bound adds nothing, no budget: no limit."""
    from model.admission import budget_in_flight, unbound_units
    from model.reasons import BudgetInFlight

    bound = held("g1", bound="n1")
    s = snap(bound, held("g2"), budget=3)
    racer = AdmissionPlan("t1", "a", (), (("a-h100-0", "h100"), ("a-h100-1", "h100")), "n1")
    mine = AdmissionPlan("t1", "b", ("g2",), (), "n1")
    assert unbound_units(s, racer) == {H100: 2} and unbound_units(s, mine) == {H100: 1}
    assert unbound_units(s, AdmissionPlan("t1", "c", ("g1",), (), "n1")) == {}
    got = budget_in_flight(s, mine, [racer], retry_after=1)   # 1 used + 2 held + 1 > 3
    assert got == Refusal(BudgetInFlight("t1", H100, 1, 2, 3, 1, 1, retry_after=1))
    assert got.reason.category is Category.THROTTLED
    assert budget_in_flight(snap(bound, held("g2"), budget=4), mine, [racer],
                            retry_after=1) is None                  # 1 + 2 + 1 = 4 fits
    assert budget_in_flight(snap(bound, held("g2")), mine, [racer], retry_after=1) is None
    held_bound = AdmissionPlan("t1", "c", ("g1",), (), "n1")  # nothing new to hold
    assert budget_in_flight(s, mine, [held_bound], retry_after=1) is None
