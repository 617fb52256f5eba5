"""H4 (a VirtualMachine keeps its GPU set across stop and start) in model.housekeeping:
the pure judgement on fake time. Level-based: each round judges the status alone (the keep
lives in `attachedTo.keptUntil`), so a new leader decides as the old one would have."""

from datetime import datetime, timedelta, timezone

import pytest

from model.admission import attachment_is_live
from model.housekeeping import (ClearAttachment, DeleteTemplate, KeepAttachment, State, kept_for_vms,
                                VMIRecord, VMIs, VMRecord, judge, plan, set_keep)
from model.housekeeping_reasons import (HousekeepingCode, KeepRanOut, KeptCondition, Rule,
                                        VmiDeleted)
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)
KEEPS = {"h100": timedelta(minutes=30), "l40s": timedelta(minutes=10), "a10": None}
VM_UID = "vm-uid-1"


def dev(name, cls="h100", *, owner=VM_UID, uid="vmi-u1", admission="a1", kept=None,
        template=True, vmi="vm1", node="n1"):
    att = Attachment(vmi, T0 - timedelta(minutes=5), admission, uid, owner, kept)
    br = BindRequest(admission, vmi, ("vm1-h100-0", "vm1-h100-1"), result=Result.SUCCEEDED,
                     node=node)
    st = DeviceStatus(phase=Phase.BOUND, node_name=node, attached_to=att, bind_request=br)
    return GPUDevice("t1", name, cls, template_for=vmi if template else None, status=st,
                     uid=f"uid-{name}")


def vms(uid=VM_UID, deleting=False, run="Halted"):
    return {("t1", "vm1"): VMRecord("t1", "vm1", uid, run, deleting)}


def running(uid="vmi-u1", admission="a1"):
    return VMIs({("t1", "vm1"): VMIRecord("t1", "vm1", uid, admission)})


def test_H4_set_keep_is_the_smallest_keepSetFor_and_off_when_one_class_lacks_it():
    assert set_keep(["h100", "l40s"], KEEPS) == timedelta(minutes=10)
    assert set_keep(["h100"], KEEPS) == timedelta(minutes=30)
    assert set_keep(["h100", "a10"], KEEPS) is None          # all must set it
    assert set_keep(["h100", "unknown"], KEEPS) is None
    assert set_keep([], KEEPS) is None


def test_H4_vmi_of_existing_vm_gone_keeps_the_set_with_one_time_for_every_device():
    a = dev("vm1-h100-0")
    b = dev("vm1-h100-1", uid=None)  # the VMI uid is recorded on one device of the set
    got = plan([a, b], VMIs(), T0, GRACE, keeps=KEEPS, vms=vms())
    until = T0 + timedelta(minutes=30)
    assert [type(x) for x in got] == [KeepAttachment, KeepAttachment]
    assert [(x.device, x.owner, x.until, x.admission, x.uid) for x in got] == [
        (("t1", "vm1-h100-0"), VM_UID, until, "a1", "vmi-u1"),
        (("t1", "vm1-h100-1"), VM_UID, until, "a1", "vmi-u1")]
    assert judge(a, VMIs(), T0, GRACE, keep=timedelta(minutes=30), vms=vms()).holds


def test_H4_mixed_classes_keep_for_the_smallest():
    a, b = dev("vm1-h100-0"), dev("vm1-l40s-0", cls="l40s")
    got = plan([a, b], VMIs(), T0, GRACE, keeps=KEEPS, vms=vms())
    assert {x.until for x in got} == {T0 + timedelta(minutes=10)}


def test_H4_partial_keep_write_is_completed_with_the_recorded_time():
    # a leader wrote keptUntil on one device and died: the next leader writes the same time
    earlier = T0 + timedelta(minutes=20)
    a = dev("vm1-h100-0", kept=earlier)
    b = dev("vm1-h100-1", uid=None)
    got = plan([a, b], VMIs(), T0 + timedelta(minutes=3), GRACE, keeps=KEEPS, vms=vms())
    assert [(x.device[1], x.until) for x in got] == [("vm1-h100-1", earlier)]


@pytest.mark.parametrize("why, kw, rule_reason", [
    ("class without keepSetFor", dict(cls="a10"), VmiDeleted("vm1", "vmi-u1")),
    ("bare VMI (no VM owner)", dict(owner=None), VmiDeleted("vm1", "vmi-u1")),
])
def test_H4_off_by_default_and_bare_vmi_unchanged(why, kw, rule_reason):
    d = dev("vm1-h100-0", **kw)
    assert plan([d], VMIs(), T0, GRACE, keeps=KEEPS, vms=vms()) == [
        DeleteTemplate(("t1", "vm1-h100-0"), "uid-vm1-h100-0", Rule.H2, rule_reason)], why


def test_H4_vm_already_deleted_or_being_deleted_or_another_uid_releases_at_once():
    d = dev("vm1-h100-0")
    for known in ({}, vms(deleting=True), vms(uid="other-vm")):
        got = plan([d], VMIs(), T0, GRACE, keeps=KEEPS, vms=known)
        assert [(type(x), x.rule) for x in got] == [(DeleteTemplate, Rule.H2)]


def test_H4_vms_unknown_neither_keeps_nor_releases_a_keeping_set():
    d = dev("vm1-h100-0")
    assert judge(d, VMIs(), T0, GRACE, keep=timedelta(minutes=30), vms=None).state is State.PENDING
    assert plan([d], VMIs(), T0, GRACE, keeps=KEEPS, vms=None) == []
    # a set that does not keep is released as before, VMs known or not
    bare = dev("vm1-h100-0", owner=None)
    assert len(plan([bare], VMIs(), T0, GRACE, keeps=KEEPS, vms=None)) == 1


def test_H4_live_vmi_is_not_kept():
    d = dev("vm1-h100-0")
    assert plan([d], running(), T0, GRACE, keeps=KEEPS, vms=vms()) == []
    assert judge(d, running(), T0, GRACE, keep=timedelta(minutes=30), vms=vms()).state is State.LIVE


def test_H4_kept_set_holds_until_keptUntil_then_released_within_the_round():
    until = T0 + timedelta(minutes=30)
    held = dev("gpu-a", template=False, kept=until)
    tmpl = dev("vm1-h100-0", kept=until)
    for t in (T0, until - timedelta(seconds=1)):
        assert plan([held, tmpl], VMIs(), t, GRACE, keeps=KEEPS, vms=vms()) == []
        v = judge(tmpl, VMIs(), t, GRACE, vms=vms())
        assert (v.state, v.until) == (State.KEPT, until)
        assert attachment_is_live(tmpl, VMIs(), t, GRACE)  # W1: other VMIs may not take it
    got = plan([held, tmpl], VMIs(), until, GRACE, keeps=KEEPS, vms=vms())
    assert [(type(x), x.device[1], x.rule) for x in got] == [
        (ClearAttachment, "gpu-a", Rule.H4), (DeleteTemplate, "vm1-h100-0", Rule.H4)]
    assert got[0].reason == KeepRanOut("vm1", datetime(2026, 11, 30, 8, 30, tzinfo=timezone.utc))
    assert not attachment_is_live(tmpl, VMIs(), until, GRACE)


def test_H4_halted_vm_past_keptUntil_released_running_strategy_does_not_extend_it():
    until = T0 + timedelta(minutes=30)
    d = dev("vm1-h100-0", kept=until)
    for run in ("Halted", "Always", "Manual"):
        assert len(plan([d], VMIs(), until + timedelta(seconds=1), GRACE, keeps=KEEPS,
                        vms=vms(run=run))) == 1


def test_H4_vm_deleted_while_kept_releases_at_once_without_waiting_for_the_time():
    d = dev("vm1-h100-0", kept=T0 + timedelta(minutes=30))
    for known, code in (({}, HousekeepingCode.KEPT_VM_DELETED),
                        (vms(deleting=True), HousekeepingCode.KEPT_VM_DELETING),
                        (vms(uid="a-new-vm-of-the-name"), HousekeepingCode.KEPT_VM_DELETED)):
        got = plan([d], VMIs(), T0, GRACE, keeps=KEEPS, vms=known)
        assert [(type(x), x.rule) for x in got] == [(DeleteTemplate, Rule.H4)]
        assert (got[0].reason.code, got[0].reason.vm) == (code, "vm1")


def test_H4_keep_survives_a_leader_change_it_is_judged_from_status_only():
    # a new leader (no tombstones, no memory): the keep recorded in status still holds
    d = dev("vm1-h100-0", kept=T0 + timedelta(minutes=30))
    assert plan([d], VMIs(), T0 + timedelta(minutes=29), GRACE, keeps=KEEPS, vms=vms()) == []
    # and while this leader's VM informer is not synced, only the time decides
    assert plan([d], VMIs(), T0 + timedelta(minutes=29), GRACE, keeps=KEEPS, vms=None) == []
    assert len(plan([d], VMIs(), T0 + timedelta(minutes=31), GRACE, keeps=KEEPS, vms=None)) == 1


def test_H4_keep_measured_from_the_round_that_saw_the_vmi_gone_by_tombstone():
    # the VMI's uid was never recorded (deleted before a round saw it): the tombstone tells
    d = dev("vm1-h100-0", uid=None)
    got = plan([d], VMIs(deleted=frozenset({("t1", "a1")})), T0, GRACE, keeps=KEEPS, vms=vms())
    assert [(type(x), x.until) for x in got] == [(KeepAttachment, T0 + timedelta(minutes=30))]


def test_H4_kept_for_vms_names_the_node_the_devices_and_the_earliest_time():
    until = T0 + timedelta(minutes=30)
    kept = kept_for_vms([dev("vm1-h100-1", kept=until), dev("vm1-h100-0", kept=until),
                         dev("vm1-l40s-0", "l40s", kept=until - timedelta(minutes=1)),
                         dev("live", vmi="vm2")], T0)
    assert list(kept) == [("t1", "vm1")]
    k = kept[("t1", "vm1")]
    assert (k.owner, k.nodes, k.devices, k.until) == (
        VM_UID, ("n1",), ("vm1-h100-0", "vm1-h100-1", "vm1-l40s-0"), until - timedelta(minutes=1))
    assert k.condition() == KeptCondition(
        ("n1",), ("vm1-h100-0", "vm1-h100-1", "vm1-l40s-0"), until - timedelta(minutes=1))
    # run out (not yet released): no longer shown as kept
    assert kept_for_vms([dev("vm1-h100-0", kept=T0)], T0) == {}


def test_P4_a_set_that_yielded_to_a_preemptor_is_released_not_kept():
    """The victim of a live nomination (P4): its VM exists and its class keeps sets, but its
    room is the preemptor's: released (H2) whether or not a keep was recorded meanwhile;
    another VM's set is kept as before."""
    yielded = frozenset({("t1", "vm1")})
    a, b = dev("vm1-h100-0"), dev("vm1-h100-1", uid=None)
    got = plan([a, b], VMIs(), T0, GRACE, keeps=KEEPS, vms=vms(), yielded=yielded)
    assert [type(x) for x in got] == [DeleteTemplate, DeleteTemplate]
    assert {x.rule for x in got} == {Rule.H2}
    recorded = dev("vm1-h100-0", kept=T0 + timedelta(minutes=20))
    v = judge(recorded, VMIs(), T0, GRACE, keep=timedelta(minutes=30), vms=vms(), yielded=yielded)
    assert v.state is State.GONE and v.reason == VmiDeleted("vm1", "vmi-u1")
    other = plan([a, b], VMIs(), T0, GRACE, keeps=KEEPS, vms=vms(), yielded=frozenset({("t1", "vm2")}))
    assert [type(x) for x in other] == [KeepAttachment, KeepAttachment]


def test_P4_a_victims_template_left_without_attachment_is_deleted_at_once():
    """Found by bench contention: a victim's VMI re-created at once under its name found its
    old template devices (their names are deterministic), attached them, was refused (W5
    cleared the attachments) and left them Bound, with no attachment, until H1's grace from
    their creation ran out: its preemptor's room stayed taken for ~20 s. While the set
    yields (a live nomination names it) they are released at once; a fresh template (not
    Bound yet, an admission in flight) and another set's keep their grace."""
    from dataclasses import replace
    from model.housekeeping_reasons import YieldedTemplate
    left = replace(dev("vm1-h100-0"), status=replace(dev("vm1-h100-0").status, attached_to=None),
                   created_at=T0 - timedelta(seconds=10))
    yielded = frozenset({("t1", "vm1")})
    [got] = plan([left], VMIs(), T0, GRACE, yielded=yielded)
    assert isinstance(got, DeleteTemplate) and got.rule is Rule.H2
    assert got.reason == YieldedTemplate("vm1")
    assert plan([left], VMIs(), T0, GRACE) == []
    fresh = replace(left, status=DeviceStatus())
    assert plan([fresh], VMIs(), T0, GRACE, yielded=yielded) == []
    # a VMI of its name exists (an admission of the new incarnation in flight): left to it
    assert plan([left], running(uid="vmi-u2", admission="a2"), T0, GRACE, yielded=yielded) == []


def test_H4_no_uid_link_a_vmi_deleted_while_no_replica_watched_still_keeps_after_grace():
    # issue 40: no uid is recorded, so a new leader without a tombstone cannot tell this VMI
    # went away from one that never appeared: an admitted set (its request Succeeded) is kept
    # for its VM once the grace has passed (case 6), never released under a VM that exists
    a, b = dev("vm1-h100-0", uid=None), dev("vm1-h100-1", uid=None)
    young = T0 - timedelta(minutes=4)              # attachments 1 min old: within the grace
    assert plan([a, b], VMIs(), young, GRACE, keeps=KEEPS, vms=vms()) == []
    got = plan([a, b], VMIs(), T0, GRACE, keeps=KEEPS, vms=vms())
    until = T0 + timedelta(minutes=30)
    assert [(type(x), x.device[1], x.until, x.uid, x.admissions) for x in got] == [
        (KeepAttachment, "vm1-h100-0", until, None, frozenset({"a1"})),
        (KeepAttachment, "vm1-h100-1", until, None, frozenset({"a1"}))]
    assert judge(a, VMIs(), T0, GRACE, keep=timedelta(minutes=30), vms=vms()).state is State.KEPT
    # VMs not known yet: neither kept nor released; VM gone or no keep: released (H1)
    assert plan([a, b], VMIs(), T0, GRACE, keeps=KEEPS, vms=None) == []
    for known, keeps in (({}, KEEPS), (vms(), {"h100": None})):
        got = plan([a], VMIs(), T0, GRACE, keeps=keeps, vms=known)
        assert [(type(x), x.rule) for x in got] == [(DeleteTemplate, Rule.H1)]


def test_H4_a_set_never_admitted_is_not_kept_when_its_vmi_never_appeared():
    # H1 as before: a request that did not Succeed (refused, or no answer yet) is no VMI's
    d = dev("vm1-h100-0", uid=None)
    for br, rule in ((None, Rule.H1), (BindRequest("a1", "vm1", ("vm1-h100-0",)), Rule.H1),
                     (BindRequest("a1", "vm1", ("vm1-h100-0",), result=Result.REFUSED), Rule.H2)):
        st = DeviceStatus(phase=Phase.BOUND, node_name="n1", attached_to=d.status.attached_to,
                          bind_request=br)
        pending = GPUDevice("t1", d.name, "h100", template_for="vm1", status=st, uid=d.uid)
        got = plan([pending], VMIs(), T0, GRACE, keeps=KEEPS, vms=vms())
        assert [(type(x), x.rule) for x in got] == [(DeleteTemplate, rule)]
