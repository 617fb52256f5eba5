"""H4 in the webhook's pure judgement (model.admission): only the VMI owned by the
VirtualMachine a set is kept for may take it (W4), other VMIs of the tenant are told a held
device is kept, and another tenant refused for room is told which sets are kept where and
until when. Kept devices stay Bound: they count against the tenant's budget."""

from datetime import datetime, timedelta, timezone

from model.admission import (AdmissionPlan, Refusal, already_admitted, check, kept_conflict,
                             same_name_conflict, vm_owner)
from model.housekeeping import VMIs
from model.parse import VMIAsk
from model.reasons import (BudgetExhausted, CannotPlace, Code, DeviceKept, KeptForVM)
from model.snapshot import Snapshot
from model.types import (Attachment, BindRequest, Budget, DeviceStatus, GPUClass, GPUDevice,
                         Node, Phase, Result)

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
UNTIL = NOW + timedelta(minutes=30)
GRACE = timedelta(minutes=2)
H100 = "nvidia.com/H100"
KV = (("kubevirt.io/schedulable", "true"),)
VM_UID = "vm-uid-1"


def kept(name, *, ns="t1", vm="vm1", until=UNTIL, owner=VM_UID, template=True):
    att = Attachment(vm, NOW - timedelta(minutes=5), "a1", "vmi-u1", owner, until)
    br = BindRequest("a1", vm, (f"{vm}-h100-0", f"{vm}-h100-1"), result=Result.SUCCEEDED, node="n1")
    return GPUDevice(ns, name, "h100", template_for=vm if template else None, status=DeviceStatus(
        phase=Phase.BOUND, node_name="n1", attached_to=att, bind_request=br))


def snap(*devices, budget=None):
    nodes = [Node("n1", KV, allocatable=((H100, 2),))]
    budgets = [Budget(ns, H100, budget) for ns in ("t1", "t2")] if budget is not None else []
    return Snapshot.build(nodes=nodes, classes=[GPUClass("h100", H100, keep_set_for=timedelta(minutes=30))],
                          devices=devices, budgets=budgets)


def vmi(owner_uid=None, kind="VirtualMachine", controller=True):
    meta = {"name": "vm1", "namespace": "t1"}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": kind, "name": "vm1",
                                    "uid": owner_uid, "controller": controller}]
    return {"metadata": meta}


def test_H4_vm_owner_is_the_controller_reference_to_a_virtualmachine():
    assert vm_owner(vmi(VM_UID)) == VM_UID
    assert vm_owner(vmi()) is None
    assert vm_owner(vmi(VM_UID, kind="VirtualMachinePool")) is None
    assert vm_owner(vmi(VM_UID, controller=False)) is None


def test_H4_the_vms_next_vmi_takes_the_kept_set_by_W4_without_a_new_placement():
    s = snap(kept("vm1-h100-0"), kept("vm1-h100-1"))
    plan = check(s, "t1", "vm1", VMIAsk((), (("h100", 2),)), VMIs(), NOW, GRACE)
    assert isinstance(plan, AdmissionPlan) and plan.devices == ("vm1-h100-0", "vm1-h100-1")
    assert kept_conflict(s, plan, VM_UID) is None
    assert already_admitted(s, plan, NOW) == "n1"                 # W4: same node, same devices
    assert same_name_conflict(s, plan, VMIs(), NOW, GRACE, "new", VM_UID) is None


def test_H4_a_bare_vmi_or_another_vm_of_the_name_may_not_take_the_kept_set():
    s = snap(kept("vm1-h100-0"), kept("vm1-h100-1"))
    plan = check(s, "t1", "vm1", VMIAsk((), (("h100", 2),)), VMIs(), NOW, GRACE)
    want = Refusal(DeviceKept("vm1-h100-0", "t1", "vm1", "2026-11-30T08:30:00Z", owner_required=True))
    assert kept_conflict(s, plan, None) == want               # bare VMI after the VM's deletion
    assert kept_conflict(s, plan, "vm-uid-2") == want         # a re-created VM of the name
    assert want.reason.category.value == "policy"
    assert same_name_conflict(s, plan, VMIs(), NOW, GRACE, "new", None) is not None


def test_H4_another_vmi_of_the_tenant_is_told_a_held_device_is_kept():
    s = snap(kept("gpu-a", template=False))
    assert check(s, "t1", "other", VMIAsk(("gpu-a",), ()), VMIs(), NOW, GRACE) == \
        Refusal(DeviceKept("gpu-a", "t1", "vm1", "2026-11-30T08:30:00Z"))


def test_H4_another_tenant_refused_for_room_is_told_what_is_kept_where_and_until_when():
    s = snap(kept("vm1-h100-0"), kept("vm1-h100-1"))
    got = check(s, "t2", "x", VMIAsk((), (("h100", 1),)), VMIs(), NOW, GRACE)
    assert isinstance(got, Refusal) and isinstance(got.reason, CannotPlace)
    assert KeptForVM("n1", H100, 2, "t1", "vm1", "2026-11-30T08:30:00Z") in got.reason.reasons
    assert "kept for VirtualMachine t1/vm1 until 2026-11-30T08:30:00Z" in got.message
    # once the keep ran out it is no longer named (housekeeping releases it within a round)
    late = check(s, "t2", "x", VMIAsk((), (("h100", 1),)), VMIs(), UNTIL, GRACE)
    assert not any(isinstance(r, KeptForVM) for r in late.reason.reasons)


def test_H4_kept_devices_count_against_the_tenants_budget():
    s = snap(kept("vm1-h100-0"), kept("vm1-h100-1"), budget=2)
    assert s.tenant_usage("t1", H100) == 2
    got = check(s, "t1", "vm2", VMIAsk((), (("h100", 1),)), VMIs(), NOW, GRACE)
    assert isinstance(got, Refusal) and got.code is Code.BUDGET_EXHAUSTED
    assert isinstance(got.reason.reasons[0], BudgetExhausted)


def test_H4_explain_and_top_show_kept_sets():
    from cli.tools import render_explain, render_top
    from model.explain import KeptSet, explain, top
    s = snap(kept("vm1-h100-0"), kept("vm1-h100-1"))
    e = explain(s, "t1", "vm1", VMIAsk((), (("h100", 2),)), live_vmis=VMIs(), now=NOW, grace=GRACE)
    assert e.admitted and e.node == "n1"
    assert e.kept == (KeptSet("t1", "vm1", "n1", ("vm1-h100-0", "vm1-h100-1"), UNTIL),)
    assert ("kept: vm1-h100-0, vm1-h100-1 on n1 for VirtualMachine t1/vm1 until "
            "2026-11-30T08:30:00Z") in render_explain(e)
    other = explain(s, "t2", "x", VMIAsk((), (("h100", 1),)), live_vmis=VMIs(), now=NOW, grace=GRACE)
    text = render_explain(other)
    assert "2 × nvidia.com/H100 kept for VirtualMachine t1/vm1 until 2026-11-30T08:30:00Z" in text
    assert "not seen yet" not in text  # a kept set is not an admission awaited
    t = top(s, VMIs())
    assert (t.classes[0].kept, t.classes[0].awaiting, t.classes[0].idle) == (2, 0, 0)
    assert t.kept == e.kept
    assert "t1/vm1       n1    vm1-h100-0, vm1-h100-1  2026-11-30T08:30:00Z" in render_top(t)


def test_P4_a_victim_of_a_live_nomination_never_takes_its_set_back_by_W4():
    """A VM's VMI re-created while its set yields to a preemptor (runStrategy Always): W4's
    take-over is refused while the nomination lives (the set goes to the binder, which counts
    the hold); once the nomination is gone W4 applies again."""
    from model.nomination import Nomination, Victim
    s = snap(kept("vm1-h100-0"), kept("vm1-h100-1"))
    plan = check(s, "t1", "vm1", VMIAsk((), (("h100", 2),)), VMIs(), NOW, GRACE)
    assert isinstance(plan, AdmissionPlan)
    n = Nomination("t2", "big", 1000, "n1", ((H100, 2),), (), (Victim("t1", "vm1", "a1", "vmi-u1", 100, NOW),),
                   NOW, NOW + timedelta(minutes=2), 5)
    nominated = s.with_nominations([n])
    assert already_admitted(nominated, plan, NOW) is None
    assert already_admitted(nominated, plan, NOW + timedelta(minutes=3)) == "n1"   # expired
    assert already_admitted(s, plan, NOW) == "n1"
