"""The Kubernetes side of P4 (docs/contract.md §3c) with the scripted client: the nominations'
informer feeds `Snapshot.nominations`; `ApiNominations` creates, finds in place, replaces an
older one and deletes; the leader's worker (`k8s.preemption.Preemption`) deletes exactly the
victims of live nominations (a live read confirms the incarnation, the delete carries its
uid), writes the Events, drops expired and admitted nominations, and is idempotent (a second
round deletes nothing more)."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from actors.errors import RequestWithdrawn, TransientWriteError
from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.cache import ClusterCache
from k8s.client import VMIS
from k8s.nominations import GPU_NOMINATIONS, ApiNominations
from k8s.preemption import Preemption
from model.nomination import Nomination, Victim, nomination_body
from model.serialize import device_status_to_dict
from model.types import ADMISSION_ANNOTATION, Attachment, BindRequest, DeviceStatus, Phase, Result

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
H = "nvidia.com/H100"


def nomination(vmi: str = "vm-9", expires: datetime = NOW + timedelta(minutes=2), victims=None) -> Nomination:
    victims = victims or (Victim("spot", "a", "adm-a", None, 100, NOW - timedelta(hours=1)),
                          Victim("spot", "b", "adm-b", None, 100, NOW - timedelta(hours=1)))
    return Nomination("p", vmi, 1000, "n1", ((H, 4),), (), tuple(victims), NOW, expires, 30)


def event(informer, obj: dict | None, key=None) -> None:
    if obj is None:
        informer._apply("DELETED", {"metadata": {"namespace": key[0] or None, "name": key[1]}})
    else:
        informer._apply("MODIFIED", copy.deepcopy(obj))


def vmi_obj(ns: str, name: str, uid: str, admission: str) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"namespace": ns, "name": name, "uid": uid, "resourceVersion": "1",
                         "annotations": {ADMISSION_ANNOTATION: admission}}, "spec": {}}


def world() -> tuple[ClusterCache, ScriptedClient]:
    cache = ClusterCache(object())
    for n in (nomination(), nomination("vm-old", NOW - timedelta(seconds=1))):
        event(cache.nominations, nomination_body(n, "cozy-system"))
    event(cache.vmis, vmi_obj("spot", "a", "uid-a", "adm-a"))
    event(cache.vmis, vmi_obj("spot", "b", "uid-b2", "adm-b-new"))  # b was recreated: not a victim
    event(cache.vmis, vmi_obj("spot", "c", "uid-c", "adm-c"))       # no victim at all
    return cache, ScriptedClient()


def test_the_informer_feeds_the_snapshot():
    cache, _ = world()
    snap = cache.view.snapshot()
    assert sorted(n.vmi for n in snap.nominations) == ["vm-9", "vm-old"]
    assert snap.nomination_for("p", "vm-9") == nomination()
    event(cache.nominations, None, ("cozy-system", "p.vm-old"))
    assert [n.vmi for n in cache.view.snapshot().nominations] == ["vm-9"]
    # a malformed one is left out
    bad = nomination_body(nomination("vm-bad"), "cozy-system")
    del bad["spec"]["node"]
    event(cache.nominations, bad)
    assert [n.vmi for n in cache.view.snapshot().nominations] == ["vm-9"]


async def test_the_worker_stops_exactly_the_victims_of_live_nominations_and_drops_the_expired():
    cache, client = world()
    client.script("get", vmi_obj("spot", "a", "uid-a", "adm-a"))
    writer = ApiNominations(client, "cozy-system")
    worker = Preemption(client, cache, writer, now=lambda: NOW)
    await worker.round()
    assert client.of("get") == [(VMIS, "spot", "a")]  # b is another incarnation, c no victim
    deletes = client.of("delete")
    assert (VMIS, "spot", "a", "uid-a", None) in deletes
    assert not any(d[0] == VMIS and d[2] != "a" for d in deletes)
    assert (GPU_NOMINATIONS, "cozy-system", "p.vm-old", None, None) in deletes  # expired
    reasons = {(body["involvedObject"]["kind"], body["involvedObject"]["name"], body["reason"])
               for _, body in client.of("create_event")}
    assert reasons == {("VirtualMachineInstance", "a", "GPUSetPreempted"),
                       ("VirtualMachine", "vm-9", "GPUSetPreempting")}
    victim_event = next(b for _, b in client.of("create_event") if b["reason"] == "GPUSetPreempted")
    assert ("preempts spot/a (priority 100) for p/vm-9 (priority 1000) on n1"
            in victim_event["message"])
    assert worker.stopped == 1 and worker.dropped == 1


async def test_a_victim_whose_nomination_expired_during_the_round_is_not_deleted():
    # the round plans at NOW (the nomination lives until NOW + 2 min); the live read of the
    # victim (a loaded API server, earlier stops' reads) ends after the expiry: no delete
    cache, client = world()
    client.script("get", vmi_obj("spot", "a", "uid-a", "adm-a"))
    calls = []

    def clock():
        calls.append(None)
        return NOW if len(calls) == 1 else NOW + timedelta(minutes=3)

    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=clock)
    await worker.round()
    assert client.of("get") == [(VMIS, "spot", "a")]   # planned while the nomination lived
    assert not any(d[0] == VMIS for d in client.of("delete")) and worker.stopped == 0
    assert not any(b["reason"] == "GPUSetPreempted" for _, b in client.of("create_event"))


def admitted_device(vmi: str = "vm-9", node: str = "n1") -> dict:
    """A Bound device of the preemptor's namespace, its request Succeeded on `node`."""
    br = BindRequest("r9", vmi, (f"{vmi}-h100-0",), NOW, result=Result.SUCCEEDED, node=node)
    st = DeviceStatus(Phase.BOUND, node, NOW, Attachment(vmi, NOW, "adm-9"), br)
    return {"metadata": {"name": f"{vmi}-h100-0", "namespace": "p", "uid": "d9", "resourceVersion": "5",
                         "labels": {"gpu.cozystack.io/template-for": vmi}},
            "spec": {"class": "h100"}, "status": device_status_to_dict(st)}


async def test_a_victim_whose_preemptor_was_admitted_elsewhere_during_the_round_is_not_deleted():
    # the priorities soak: a preemptor placed on a node whose room came free first, 2 s
    # before its victim's stop ran (the round planned earlier), had its victim stopped for
    # nothing. Here the preemptor lands on n7 while the victim's live read runs.
    cache, client = world()
    client.script("get", vmi_obj("spot", "a", "uid-a", "adm-a"))
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW)
    read = worker._client.get

    async def get_while_it_lands(*args):
        got = await read(*args)
        event(cache.devices, admitted_device(node="n7"))
        return got

    worker._client.get = get_while_it_lands
    await worker.round()
    assert client.of("get") == [(VMIS, "spot", "a")]   # planned while the nomination held
    assert not any(d[0] == VMIS for d in client.of("delete")) and worker.stopped == 0
    assert not any(b["reason"] == "GPUSetPreempted" for _, b in client.of("create_event"))
    # the next round drops it as admitted
    await worker.round()
    assert (GPU_NOMINATIONS, "cozy-system", "p.vm-9", None, None) in client.of("delete")


async def test_victims_are_stopped_parallel_at_once():
    """A burst of nominations' victims is stopped `parallel` at a time, not one after another
    (a round of 30 stops took 30-45 s in the priorities soak while admitted preemptors'
    nominations waited for its end to be deleted)."""
    cache = ClusterCache(object())
    victims = tuple(Victim("spot", v, f"adm-{v}", None, 100, NOW - timedelta(hours=1)) for v in "acde")
    event(cache.nominations, nomination_body(nomination(victims=victims), "cozy-system"))
    client = ScriptedClient()
    for v in "acde":
        event(cache.vmis, vmi_obj("spot", v, f"uid-{v}", f"adm-{v}"))
        client.script("get", vmi_obj("spot", v, f"uid-{v}", f"adm-{v}"))
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW, parallel=3)
    read, inflight, peak = worker._client.get, [0], [0]

    async def get(*args):
        inflight[0] += 1
        peak[0] = max(peak[0], inflight[0])
        try:
            return await read(*args)
        finally:
            inflight[0] -= 1

    worker._client.get = get
    await worker.round()
    assert peak[0] == 3
    assert sorted(d[2] for d in client.of("delete") if d[0] == VMIS) == ["a", "c", "d", "e"]
    assert worker.stopped == 4


async def test_a_victim_recreated_since_the_cache_saw_it_is_never_deleted():
    cache, client = world()
    client.script("get", vmi_obj("spot", "a", "uid-a2", "adm-a2"))  # the live read: another one
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW)
    await worker.round()
    assert not any(d[0] == VMIS for d in client.of("delete"))


async def test_the_worker_is_idempotent_and_drops_an_admitted_preemptors_nomination():
    cache, client = world()
    event(cache.vmis, None, ("spot", "a"))  # a stopped
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW)
    await worker.round()
    assert not any(d[0] == VMIS for d in client.of("delete"))
    # the preemptor's set is admitted on n1: its nomination goes
    br = BindRequest("r9", "vm-9", ("vm-9-h100-0",), NOW, result=Result.SUCCEEDED, node="n1")
    st = DeviceStatus(Phase.BOUND, "n1", NOW, Attachment("vm-9", NOW, "adm-9"), br)
    event(cache.devices, {"metadata": {"name": "vm-9-h100-0", "namespace": "p", "uid": "d9",
                                       "resourceVersion": "5", "labels": {"gpu.cozystack.io/template-for": "vm-9"}},
                          "spec": {"class": "h100"}, "status": device_status_to_dict(st)})
    await worker.round()
    assert (GPU_NOMINATIONS, "cozy-system", "p.vm-9", None, None) in client.of("delete")


async def test_the_writer_creates_finds_in_place_replaces_an_older_one_and_deletes():
    client = ScriptedClient()
    writer = ApiNominations(client, "cozy-system")
    n = nomination()
    await writer.put(n)
    assert client.of("create")[0][2]["metadata"]["name"] == "p.vm-9"
    # already there, same: nothing more
    client.script("create", errors.AlreadyExists("create", 409, "exists"))
    client.script("get", {**nomination_body(n, "cozy-system")})
    await writer.put(n)
    assert len(client.of("create")) == 2 and not client.of("delete")
    # an older one of the same preemptor: replaced (uid precondition)
    old = nomination_body(nomination(expires=NOW - timedelta(minutes=1)), "cozy-system")
    old["metadata"]["uid"] = "u-old"
    client.script("create", errors.AlreadyExists("create", 409, "exists"))
    client.script("get", old)
    await writer.put(n)
    assert client.of("delete") == [(GPU_NOMINATIONS, "cozy-system", "p.vm-9", "u-old", None)]
    assert len(client.of("create")) == 4
    # a later one of the same preemptor (this put's decision was held up): never replaced
    later = replace(n, node="n7", created=NOW + timedelta(seconds=7), expires=NOW + timedelta(minutes=3))
    client.script("create", errors.AlreadyExists("create", 409, "exists"))
    client.script("get", nomination_body(later, "cozy-system"))
    with pytest.raises(RequestWithdrawn, match="a later one"):
        await writer.put(n)
    assert len(client.of("delete")) == 1 and len(client.of("create")) == 5
    # errors are transient write errors; a gone one deletes fine
    client.script("create", errors.Unavailable("create", 0, "TimeoutError()"))
    with pytest.raises(TransientWriteError):
        await writer.put(n)
    client.script("delete", errors.NotFound("delete", 404, "gone"))
    await writer.delete("p.vm-9")


async def test_a_victim_already_terminating_is_not_deleted_again():
    """A victim whose live read shows a deletionTimestamp (deleted by an earlier leader, held
    by a finalizer or its guest's shutdown) is stopped once: no second delete, no second Event."""
    cache, client = world()
    dying = vmi_obj("spot", "a", "uid-a", "adm-a")
    dying["metadata"]["deletionTimestamp"] = "2026-12-06T11:59:00Z"
    client.script("get", dying)
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW)
    await worker.round()
    assert client.of("get") == [(VMIS, "spot", "a")]
    assert not any(d[0] == VMIS for d in client.of("delete"))
    assert not [b for _, b in client.of("create_event") if b["reason"] == "GPUSetPreempted"]
    assert worker.stopped == 0


def test_the_vmis_being_deleted_reach_the_snapshot():
    """P2: the VMI informer tells the view which VMIs are being deleted (`Snapshot.stopping`:
    no victim), and forgets them when they go or the deletion is gone."""
    cache, _ = world()
    assert cache.view.snapshot().stopping == frozenset()
    dying = vmi_obj("spot", "a", "uid-a", "adm-a")
    dying["metadata"].update(deletionTimestamp="2026-12-06T11:59:00Z", resourceVersion="2")
    event(cache.vmis, dying)
    assert cache.view.snapshot().stopping == {("spot", "a")}
    event(cache.vmis, None, ("spot", "a"))
    assert cache.view.snapshot().stopping == frozenset()
    event(cache.vmis, dying)
    assert cache.view.snapshot().stopping == {("spot", "a")}
    undone = vmi_obj("spot", "a", "uid-a", "adm-a")
    undone["metadata"]["resourceVersion"] = "3"
    event(cache.vmis, undone)
    assert cache.view.snapshot().stopping == frozenset()
@pytest.mark.parametrize("strategy, after", [
    ("Always", "its VirtualMachine (runStrategy Always) starts it again, and it waits for room"),
    ("Manual", "stopped as a user's stop would stop it: its VirtualMachine (runStrategy Manual) "
               "stays stopped until its owner starts it"),
    ("RerunOnFailure", "stays stopped until its owner starts it"),
    (None, "its VirtualMachine's runStrategy could not be read"),
])
async def test_a_vms_victim_is_told_on_the_vmi_and_the_vm_what_follows_by_its_run_strategy(strategy, after):
    cache, client = world()
    owned = vmi_obj("spot", "a", "uid-a", "adm-a")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                             "name": "a", "uid": "vm-uid-a", "controller": True}]
    client.script("get", owned)
    if strategy is None:
        client.script("get", errors.Forbidden("get", 403, "no"))
    else:
        client.script("get", {"metadata": {"name": "a", "namespace": "spot", "uid": "vm-uid-a"},
                              "spec": {"runStrategy": strategy}})
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW)
    await worker.round()
    assert (VMIS, "spot", "a", "uid-a", None) in client.of("delete")
    told = [(b["involvedObject"]["kind"], b["message"]) for _, b in client.of("create_event")
            if b["reason"] == "GPUSetPreempted"]
    assert [k for k, _ in told] == ["VirtualMachineInstance", "VirtualMachine"]
    for _, message in told:
        assert message.startswith("gpu-binder stopped VMI spot/a: preempts spot/a (priority 100) for "
                                  "p/vm-9 (priority 1000) on n1; ")
        assert message.endswith(after), message


async def test_a_victim_already_stopping_is_not_deleted_or_told_again():
    """A deleted VMI stays (live, with a deletionTimestamp) for its grace period; rounds
    meanwhile neither delete it again nor repeat its Event."""
    cache, client = world()
    stopping = vmi_obj("spot", "a", "uid-a", "adm-a")
    stopping["metadata"]["deletionTimestamp"] = "2026-12-06T11:59:59Z"
    client.script("get", stopping)
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW)
    await worker.round()
    assert not any(d[0] == VMIS for d in client.of("delete"))
    assert not any(b["reason"] == "GPUSetPreempted" for _, b in client.of("create_event"))


async def test_no_uid_link_the_delete_precondition_is_the_uid_of_the_live_vmi_carrying_the_admission():
    # issue 40: the victim's devices record no VMI uid (housekeeping writes no link) and a
    # nomination names its victims by admission id (uid None): the delete's precondition is
    # the uid of the VMI that carries that admission, as the cache and then the live read show
    cache, client = world()
    br = BindRequest("adm-a", "a", ("a-h100-0",), NOW, result=Result.SUCCEEDED, node="n1")
    st = DeviceStatus(Phase.BOUND, "n1", NOW, Attachment("a", NOW - timedelta(hours=1), "adm-a"), br)
    assert st.attached_to.uid is None
    event(cache.devices, {"metadata": {"name": "a-h100-0", "namespace": "spot", "uid": "da",
                                       "resourceVersion": "3", "labels": {"gpu.cozystack.io/template-for": "a"}},
                          "spec": {"class": "h100"}, "status": device_status_to_dict(st)})
    assert all(v.uid is None for v in nomination().victims)
    client.script("get", vmi_obj("spot", "a", "uid-a", "adm-a"))
    worker = Preemption(client, cache, ApiNominations(client, "cozy-system"), now=lambda: NOW)
    await worker.round()
    assert [d for d in client.of("delete") if d[0] == VMIS] == [(VMIS, "spot", "a", "uid-a", None)]
    # b's VMI now carries another admission (adm-b-new, uid-b2): never deleted, whatever its uid
    assert not any(d[0] == VMIS and d[2] == "b" for d in client.of("delete"))
