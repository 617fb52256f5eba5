"""model.vm_preemption and its use by model.vm.plan_waiting (pure, docs/contract.md §3c P4):
the preemptor's VM says how many victims still run; a victim's VM, waiting for room again,
names its preemptor and both priorities (from a nomination, the leader's memory, or its
stored condition); room, or a refusal room does not cure, is shown as for any VM; the
nominations' holds count for every VM but their preemptor's; and the words of a victim's
Event per runStrategy."""

from datetime import datetime, timedelta, timezone

from model.housekeeping import VMIRecord, VMIs
from model.nomination import Nomination, Victim
from model.reasons import PreemptedFor, StoppedAs, WaitingForVictims
from model.snapshot import Snapshot
from model.types import Budget, DeviceStatus, GPUClass, GPUDevice, Node, Phase
from model.vm import ROOM_REASON, plan_waiting
from model.vm_preemption import (NOMINATED_REASON, PREEMPTED_REASON, preempted_victims,
                                 restarted, waiting_for_victims)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)
H100 = "nvidia.com/H100"
KV = (("kubevirt.io/schedulable", "true"),)
FAILED = {"type": "Failure", "status": "True", "reason": "FailedCreate", "message": "x"}
HOUR_AGO = NOW - timedelta(hours=1)
S1 = Victim("spot", "s1", "adm-s1", "uid-s1", 100, HOUR_AGO)
S2 = Victim("spot", "s2", "adm-s2", "uid-s2", 100, HOUR_AGO)


def nomination(victims=(S1, S2), expires=NOW + timedelta(minutes=2), created=NOW) -> Nomination:
    return Nomination("od", "big", 1000, "n1", ((H100, 2),), (), tuple(victims), created, expires, 30)


def snap(*, taken=0, nominations=(), budget=None) -> Snapshot:
    """Node n1 of 2 H100, `taken` of them Bound to another tenant's devices."""
    devices = [GPUDevice("other", f"x{i}", "h100", status=DeviceStatus(phase=Phase.BOUND, node_name="n1"))
               for i in range(taken)]
    return Snapshot.build(nodes=[Node("n1", KV, allocatable=((H100, 2),))], classes=[GPUClass("h100", H100)],
                          devices=devices, nominations=nominations,
                          budgets=[Budget("spot", H100, budget)] if budget is not None else [])


def vm(ns, name, count, conditions=(FAILED,)):
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-12-06T11:00:00Z"},
            "spec": {"runStrategy": "Always", "template": {
                "metadata": {"annotations": {"gpu.cozystack.io/templates": f"h100={count}"}},
                "spec": {"domain": {"devices": {}}}}},
            "status": {"conditions": list(conditions)}}


def live(*victims: Victim, uid_suffix: str = "") -> VMIs:
    return VMIs({(v.namespace, v.vmi): VMIRecord(v.namespace, v.vmi, v.uid + uid_suffix,
                                                 v.admission + uid_suffix) for v in victims})


def plan(snapshot, vms, vmis=VMIs(), preempted=None):
    return {w.key: w for w in plan_waiting(snapshot, vms, vmis=vmis, now=NOW, grace=GRACE,
                                           preempted=preempted)}


def test_the_preemptors_vm_says_how_many_victims_still_run_then_gets_its_held_room():
    n = nomination()
    big = vm("od", "big", 2)
    got = plan(snap(taken=2, nominations=[n]), [big], live(S1, S2))[("od", "big")]
    assert (got.condition.status, got.condition.reason) == ("False", NOMINATED_REASON)
    assert got.condition.reason == "PreemptionNominated"
    assert got.condition.message == (
        "waiting for 2 lower-priority VMs to stop on n1 to make room for this set (priority 1000): "
        "spot/s1, spot/s2; its room is held for it until 2026-12-06T12:02:00Z")
    # virt-controller's client waits out the 503's Retry-After inside the call: no Failure
    # condition on the VM meanwhile, yet it is told (its nomination is the refusal)
    quiet = plan(snap(taken=2, nominations=[n]), [vm("od", "big", 2, conditions=())], live(S1, S2))
    assert quiet[("od", "big")].condition == got.condition
    assert plan(snap(taken=2, nominations=[nomination(expires=NOW)]), [vm("od", "big", 2, conditions=())]) == {}
    got = plan(snap(taken=2, nominations=[n]), [big], live(S2))[("od", "big")]
    assert got.condition.message.startswith("waiting for 1 lower-priority VM to stop on n1")
    assert "spot/s2;" in got.condition.message and "s1" not in got.condition.message
    # victims gone, their GPUs not yet released: still held
    got = plan(snap(taken=2, nominations=[n]), [big])[("od", "big")]
    assert got.condition.message.startswith("the lower-priority VMs on n1 stopped; waiting for their GPUs")
    # room free: its own nomination's hold does not stand in its way; it is nudged
    got = plan(snap(nominations=[n]), [big])[("od", "big")]
    assert got.nudge and (got.condition.status, got.condition.reason) == ("True", ROOM_REASON)


def test_a_victims_vm_waiting_again_names_its_preemptor_and_both_priorities():
    n = nomination()
    s1 = vm("spot", "s1", 1)
    # the room freed is held for the preemptor: the victim waits, and says why
    got = plan(snap(nominations=[n]), [s1])[("spot", "s1")]
    assert (got.condition.status, got.condition.reason) == ("False", PREEMPTED_REASON)
    assert got.condition.message == (
        "stopped by gpu-binder on n1 to make room for od/big (priority 1000), of higher priority "
        "than this VM (priority 100); it starts again when room for its GPU set returns")
    assert not got.nudge
    # the nomination is gone (the preemptor runs): the leader's memory still names it
    remembered = preempted_victims([n])
    got = plan(snap(taken=2), [s1], preempted=remembered)[("spot", "s1")]
    assert (got.condition.reason, got.condition.message) == (PREEMPTED_REASON, remembered[("spot", "s1")].words.render())
    # room returns: True, the nudge
    got = plan(snap(taken=1), [s1], preempted=remembered)[("spot", "s1")]
    assert got.nudge and got.condition.reason == ROOM_REASON


def test_a_new_leader_keeps_the_stored_preempted_condition_while_the_vm_waits_for_room():
    stored = {"type": "GPUSetReady", "status": "False", "reason": PREEMPTED_REASON,
              "message": "stopped by gpu-binder on n1 to make room for od/big ...",
              "lastTransitionTime": "2026-12-06T11:59:00Z"}
    s1 = vm("spot", "s1", 1, conditions=(FAILED, stored))
    got = plan(snap(taken=2), [s1])[("spot", "s1")]
    assert (got.condition.reason, got.condition.message) == (PREEMPTED_REASON, stored["message"])
    # a refusal room does not cure is shown instead (here a budget of 0)
    got = plan(snap(taken=2, budget=0), [s1], preempted=preempted_victims([nomination()]))[("spot", "s1")]
    assert got.condition.reason == "BudgetExhausted"
    # and a VM never preempted, refused for room, says the binder's own reason
    other = vm("spot", "s9", 1)
    got = plan(snap(taken=2), [other], preempted=preempted_victims([nomination()]))[("spot", "s9")]
    assert got.condition.reason not in (PREEMPTED_REASON, NOMINATED_REASON)


def test_the_nominations_hold_counts_for_every_other_vm_and_an_expired_one_for_none():
    n = nomination(victims=())
    other = vm("t9", "w", 1)
    got = plan(snap(nominations=[n]), [other])[("t9", "w")]
    assert got.condition.status == "False" and not got.nudge
    got = plan(snap(nominations=[nomination(victims=(), expires=NOW)]), [other])[("t9", "w")]
    assert got.nudge


def test_victims_are_remembered_until_their_vm_runs_another_vmi():
    old = nomination(victims=(S1,), created=NOW - timedelta(minutes=5))
    new = Nomination("od", "other", 2000, "n2", ((H100, 1),), (), (S1,), NOW, NOW + timedelta(minutes=2))
    got = preempted_victims([new, old])
    assert got[("spot", "s1")].words == PreemptedFor("od/other", 2000, 100, "n2")
    p = got[("spot", "s1")]
    assert not restarted(p, VMIs())                        # stopped, not running
    assert not restarted(p, live(S1))                      # the victim itself, still running
    assert restarted(p, live(S1, uid_suffix="-2"))         # a new incarnation: it runs again
    assert waiting_for_victims(nomination(), live(S1, uid_suffix="-2")).running == 0


def test_the_words():
    assert WaitingForVictims(1, ("a/b",), 5, "n", "T").render() == (
        "waiting for 1 lower-priority VM to stop on n to make room for this set (priority 5): a/b; "
        "its room is held for it until T")
    assert StoppedAs(None).render() == "the VMI has no VirtualMachine: nothing creates it again but its owner"
    assert StoppedAs("Always").render() == "its VirtualMachine (runStrategy Always) starts it again, and it waits for room"
    assert StoppedAs("Once").render().startswith("its VirtualMachine (runStrategy Once) starts it again")
    for rs in ("Manual", "RerunOnFailure"):
        assert StoppedAs(rs).render() == (
            f"stopped as a user's stop would stop it: its VirtualMachine (runStrategy {rs}) stays "
            "stopped until its owner starts it")
    assert StoppedAs("Halted").render() == "its VirtualMachine (runStrategy Halted) stays stopped"
    assert "WaitAsReceiver" in StoppedAs("WaitAsReceiver").render()
