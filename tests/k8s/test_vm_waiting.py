"""k8s.vm_waiting's pure parts: what the VM informer keeps, and the write bounds that keep the
binder from driving a retry storm through virt-controller (each VM status write re-queues the
VM there)."""

import math

from k8s.vm_waiting import slim_vm, write_due
from model.vm import Condition

WAIT = Condition("False", "SetNeeds", "needs 2, has 0 free")


def test_slim_vm_keeps_what_the_plan_reads_and_drops_user_data_and_foreign_annotations():
    vm = {"metadata": {"name": "a", "namespace": "t", "uid": "u", "resourceVersion": "7",
                       "creationTimestamp": "2026-12-02T04:00:00Z", "managedFields": [{}],
                       "annotations": {"x": "y"}},
          "spec": {"runStrategy": "Always", "template": {
              "metadata": {"annotations": {"gpu.cozystack.io/templates": "h100=1", "other": "z"}},
              "spec": {"volumes": [{"cloudInitNoCloud": {"userData": "secret"}}],
                       "nodeSelector": {"zone": "a"}}}},
          "status": {"conditions": [{"type": "Ready"}], "printableStatus": "Stopped",
                     "volumeSnapshotStatuses": [{}]}}
    got = slim_vm(vm)
    assert got["metadata"] == {"name": "a", "namespace": "t", "uid": "u", "resourceVersion": "7",
                               "creationTimestamp": "2026-12-02T04:00:00Z",
                               "deletionTimestamp": None}
    assert got["spec"]["template"] == {
        "metadata": {"annotations": {"gpu.cozystack.io/templates": "h100=1"}},
        "spec": {"nodeSelector": {"zone": "a"}}}
    assert got["status"] == {"conditions": [{"type": "Ready"}], "printableStatus": "Stopped"}


def test_write_due_nothing_to_write_is_never():
    old = {"status": "False", "reason": "SetNeeds", "message": WAIT.message}
    assert write_due(old, WAIT, [0.0], 2, 30) == math.inf
    assert write_due(None, None, [0.0], 2, 30) == math.inf


def test_write_due_a_change_of_status_waits_min_interval_a_message_only_change_refresh_interval():
    old = {"status": "False", "reason": "SetNeeds", "message": "needs 2, has 1 free"}
    assert write_due(None, WAIT, [], 2, 30) == 0.0                 # first write: now
    assert write_due(old, WAIT, [10.0], 2, 30) == 20.0             # message only: 30 s apart
    assert write_due(old, WAIT, [100.0], 2, 30) == 0.0             # (an old write is no bound)
    room = Condition("True", "RoomAvailable", "room on n1")
    assert write_due(old, room, [0.5], 2, 30) == 1.5               # the nudge: 2 s apart at most
    assert write_due(old, room, [5.0, 70.0], 2, 30) == 0.0
    assert write_due(old, None, [0.0], 2, 30) == 2.0               # removal: bounded too


def test_write_due_at_most_max_writes_per_window_so_flickering_room_is_no_storm():
    """Room that comes and goes every second would flip a VM True/False at every
    min_interval (30 writes, so 30 webhook calls, a minute): the budget holds it to
    max_writes per window; a VM that wrote less than that is not delayed by it."""
    old = {"status": "False", "reason": "SetNeeds", "message": "m"}
    room = Condition("True", "RoomAvailable", "room on n1")
    assert write_due(old, room, [3.0, 20.0, 40.0], 2, 30, max_writes=4, window=60) == 0.0
    assert write_due(old, room, [3.0, 20.0, 40.0, 50.0], 2, 30, max_writes=4, window=60) == 10.0
    assert write_due(old, room, [3.0, 20.0, 40.0, 50.0, 59.0], 2, 30, max_writes=4,
                     window=60) == 10.0
    assert write_due(old, room, [3.0, 20.0, 40.0, 61.0], 2, 30, max_writes=4, window=60) == 0.0


def test_write_due_simulated_flicker_stays_within_the_budget():
    """A minute of room flipping every 0.5 s: at most max_writes writes in any window."""
    writes: list[float] = []
    for step in range(0, 1800):  # 15 minutes in 0.5 s steps
        now = step * 0.5
        cond = {"status": "True" if writes and len(writes) % 2 else "False", "reason": "r",
                "message": "m"}
        new = Condition("False" if cond["status"] == "True" else "True", "x", "m")
        if write_due(cond, new, [now - t for t in writes], 2, 30, max_writes=4,
                     window=60) == 0.0:
            writes.append(now)
    for t in writes:
        assert len([u for u in writes if t <= u < t + 60]) <= 4
    assert len(writes) >= 4 * 15 - 1  # and the budget is used, not starved


def test_victims_are_remembered_after_their_nomination_until_their_vm_runs_again_or_goes():
    """P4: the leader remembers a nomination's victims once the nomination is gone (the
    preemptor admitted), so their VMs still say who they yielded to while they wait."""
    from datetime import datetime, timedelta, timezone

    from k8s.cache import ClusterCache
    from k8s.vm_waiting import VMWaiting
    from model.housekeeping import VMIRecord, VMIs
    from model.nomination import Nomination, Victim

    now = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
    s1 = Victim("spot", "s1", "adm-1", "uid-1", 100, now - timedelta(hours=1))
    n = Nomination("od", "big", 1000, "n1", (("nvidia.com/H100", 2),), (), (s1,), now,
                   now + timedelta(minutes=2))

    class Client:
        def using(self, **_):
            return self

        def lister(self, _):
            return None

    w = VMWaiting(Client(), ClusterCache(object()), grace=timedelta(minutes=2), remember=100.0)
    w.vms._apply("MODIFIED", {"metadata": {"namespace": "spot", "name": "s1", "resourceVersion": "1"}})
    got = w.remembered([n], VMIs(), 0.0)
    assert got[("spot", "s1")].words.preemptor == "od/big"
    assert w.remembered([], VMIs(), 50.0) == got                       # the nomination gone
    same = VMIs({("spot", "s1"): VMIRecord("spot", "s1", "uid-1", "adm-1")})
    assert w.remembered([], same, 60.0) == got                         # the victim still stopping
    again = VMIs({("spot", "s1"): VMIRecord("spot", "s1", "uid-2", "adm-2")})
    assert w.remembered([], again, 61.0) == {}                         # it runs another VMI
    w.remembered([n], VMIs(), 62.0)
    assert w.remembered([], VMIs(), 162.0) == {}                       # `remember` passed
    w.remembered([n], VMIs(), 200.0)
    w.vms._apply("DELETED", {"metadata": {"namespace": "spot", "name": "s1"}})
    assert w.remembered([], VMIs(), 201.0) == {}                       # the VM is gone
