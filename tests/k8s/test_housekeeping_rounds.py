"""How housekeeping's workers carry out a round (`k8s.housekeeping`): the device worker's
plan (H1, H2) a device's own actions in plan order, different devices concurrently and
bounded; the claims worker's H1/H2 and DR6 on the claims the claim informer holds. The API
calls are replaced by a recorder here; tests/e2e carry them out against the real API
server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import anyio
import pytest

from fakes.kube_client import ScriptedClient
from k8s.housekeeping import Housekeeper
from k8s.housekeeping.devices import DeviceWorker
from k8s.housekeeping.kept import KeptSets
from model.housekeeping import ClearAttachment, DeleteTemplate, LinkAttachment
from model.housekeeping_reasons import KeepRanOut, Rule, VmiDeleted
from tests.support.logs import captured_logs
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio
SINCE = datetime(2026, 12, 1, tzinfo=timezone.utc)
CALL = 0.01


@pytest.fixture
def anyio_backend():
    return FAKE_TIME  # each recorded API call takes 10 ms of fake time


class _Recorder(DeviceWorker):
    """A device worker whose `_do` (one action's API calls) only records and takes `CALL`."""

    def __init__(self, concurrency: int) -> None:
        cache = SimpleNamespace()
        super().__init__(ScriptedClient(), cache,  # type: ignore[arg-type]
                         KeptSets(ScriptedClient(), cache, grace=timedelta(minutes=2)),  # type: ignore[arg-type]
                         concurrency=concurrency)
        self.log: list[tuple[str, tuple[str, str], str]] = []
        self.running = 0
        self.peak = 0

    async def _do(self, action) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.log.append(("start", action.device, type(action).__name__))
        await anyio.sleep(CALL)  # the API call's latency
        self.log.append(("end", action.device, type(action).__name__))
        self.running -= 1


async def test_H2_a_rounds_actions_run_per_device_in_order_and_devices_at_once_bounded():
    # uid links are written only for attachments without an admission id (issue 40): one each
    links = [LinkAttachment(("t", f"gpu-{i}"), "vm", "uid-1", None, SINCE) for i in range(40)]
    clear = ClearAttachment(("t", "tmpl"), "old", Rule.H2, VmiDeleted("old"), SINCE, "adm-0")
    delete = DeleteTemplate(("t", "tmpl"), None, Rule.H2, VmiDeleted("old"))
    keeper = _Recorder(concurrency=8)
    t0 = anyio.current_time()
    await keeper.carry_out([clear, *links, delete])
    # 42 calls, 8 at a time: six rounds of calls, the template's two among them
    assert anyio.current_time() - t0 == pytest.approx(6 * CALL)
    starts = [e for e in keeper.log if e[0] == "start"]
    assert len(starts) == 42                                  # every action, once
    assert keeper.peak == 8                                   # devices at once, bounded
    tmpl = [e for e in keeper.log if e[1] == ("t", "tmpl")]   # one device: in plan order
    assert tmpl == [("start", ("t", "tmpl"), "ClearAttachment"), ("end", ("t", "tmpl"), "ClearAttachment"),
                    ("start", ("t", "tmpl"), "DeleteTemplate"), ("end", ("t", "tmpl"), "DeleteTemplate")]


# -- H1/H2 for the ResourceClaims the binder made (DR5) ------------------------------------

def _claim(vmi: str, made: datetime, *, labels: dict | None = None) -> dict:
    from model.claim import ClaimMember, build_claim
    from model.device.dra import DeviceRef
    from tests.support.dra_worlds import device_class
    raw = build_claim("t", vmi, [ClaimMember("g", device_class(), DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-0"), "u0")],
                      "adm", made)
    raw["metadata"].update(uid=f"uid-{vmi}", resourceVersion="5")
    if labels is not None:
        raw["metadata"]["labels"] = labels
    return raw


def _claim_keeper(client: ScriptedClient, devices=(), live=(), claims=(),
                  healthy: bool = True) -> Housekeeper:
    """A Housekeeper over a cache whose claim informer holds the claims `claims` as its
    transform keeps them (`k8s.cache.ingest_claim`: parsed once)."""
    from k8s.cache import ingest_claim
    from model.housekeeping import VMIs, VMIRecord
    informer = SimpleNamespace(items=lambda: [ingest_claim(c) for c in claims], healthy=healthy,
                               keys=lambda: [(c["metadata"]["namespace"], c["metadata"]["name"])
                                             for c in claims])
    cache = SimpleNamespace(
        claims=informer, healthy=lambda *i: all(x.healthy for x in i),
        view=SimpleNamespace(devices=lambda: {d.key: d for d in devices}),
        vmi_state=lambda: VMIs({k: VMIRecord(k[0], k[1], "uid") for k in live}))
    return Housekeeper(client, cache, grace=timedelta(minutes=2), raw_policy="denied")  # type: ignore[arg-type]


async def test_H1_H2_a_claim_of_a_vmi_that_never_appeared_or_is_gone_is_deleted_after_the_grace():
    from k8s import errors
    from k8s.client import RESOURCE_CLAIMS, VMIS
    from model.types import Attachment, DeviceStatus, GPUDevice
    now = SINCE + timedelta(minutes=10)
    attached = GPUDevice("t", "held", "h100x", status=DeviceStatus(attached_to=Attachment("kept", SINCE)))
    client = ScriptedClient()
    claims = [_claim("gone", SINCE), _claim("young", now - timedelta(minutes=1)),
              _claim("live", SINCE), _claim("kept", SINCE),
              _claim("tenants", SINCE, labels={})]   # a tenant's: never ours
    client.script("get", errors.NotFound("read VMI t/gone", 404, 'virtualmachineinstances "gone" not found',
                                          details={"name": "gone"}))
    keeper = _claim_keeper(client, devices=[attached], live=[("t", "live")], claims=claims)
    await keeper.claims.release(now)
    assert client.of("get") == [(VMIS, "t", "gone")]                 # confirmed live first
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t", "gone-gpus", "uid-gone", "5")]
    assert keeper.claims.claims_deleted == 1


async def test_H1_H2_stale_claims_are_deleted_concurrently_not_one_at_a_time():
    """The device soak of 2026-12-07: after a leader kill the new leader deleted a backlog of
    268 claims one at a time (a live read and a delete each, ~0.4 s under load), so 22 of
    them outlived the 300 s grace. Each delete is confirmed and preconditioned on its own,
    so they go `concurrency` at a time: here every live read is held until three are in
    flight at once (one at a time, the first read would wait alone and time out)."""
    import anyio

    from k8s import errors
    from k8s.client import RESOURCE_CLAIMS

    class HeldReads(ScriptedClient):
        def __init__(self, together: int) -> None:
            super().__init__()
            self.reads = {"in_flight": 0, "most": 0}   # shared by the copies `using` makes
            self.together = together
            self.all_in = anyio.Event()

        async def get(self, res, ns, name):
            r = self.reads
            r["in_flight"] += 1
            r["most"] = max(r["most"], r["in_flight"])
            if r["in_flight"] >= self.together:
                self.all_in.set()
            with anyio.fail_after(5):   # a bound, not a wait: the event ends it
                await self.all_in.wait()
            r["in_flight"] -= 1
            await super().get(res, ns, name)
            raise errors.NotFound(f"read VMI {ns}/{name}", 404,
                                  f'virtualmachineinstances "{name}" not found',
                                  details={"name": name})

    names = ["a", "b", "c", "d", "e"]
    client = HeldReads(together=3)
    keeper = _claim_keeper(client, claims=[_claim(n, SINCE) for n in names])
    keeper.claims.concurrency = 3
    await keeper.claims.release(SINCE + timedelta(minutes=10))
    assert client.reads["most"] == 3
    assert sorted(client.of("delete")) == [(RESOURCE_CLAIMS, "t", f"{n}-gpus", f"uid-{n}", "5")
                                           for n in names]
    assert keeper.claims.claims_deleted == 5


async def test_H1_a_claim_whose_vmi_the_live_read_finds_is_not_deleted():
    client = ScriptedClient()
    client.script("get", {"metadata": {"name": "vm", "uid": "u1"}})   # the cache was behind
    keeper = _claim_keeper(client, claims=[_claim("vm", SINCE)])
    await keeper.claims.release(SINCE + timedelta(minutes=10))
    assert client.of("delete") == [] and keeper.claims.claims_deleted == 0


async def test_H1_claims_are_judged_only_while_the_claim_informer_follows_and_never_listed():
    """The claims come from the cache's claim informer alone (no list of the API server's,
    which only test caches without one reached): while it does not follow, nothing is judged,
    not even a claim long past the grace; once it does, the claim goes."""
    from k8s import errors
    from k8s.client import RESOURCE_CLAIMS
    client = ScriptedClient()
    old = [_claim("gone", SINCE)]
    for _ in range(3):
        await _claim_keeper(client, claims=old, healthy=False).claims.release(
            SINCE + timedelta(minutes=10))
    assert client.calls == []
    client.script("get", errors.NotFound("read VMI t/gone", 404, 'virtualmachineinstances "gone" not found',
                                          details={"name": "gone"}))
    await _claim_keeper(client, claims=old).claims.release(SINCE + timedelta(minutes=10))
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t", "gone-gpus", "uid-gone", "5")]


async def test_H4_the_claim_of_a_keep_this_replica_released_is_deleted_without_the_grace():
    from k8s import errors
    from k8s.client import RESOURCE_CLAIMS
    now = SINCE + timedelta(seconds=30)                 # the claim is 30 s old, grace 2 min
    client = ScriptedClient()
    client.script("get", errors.NotFound("read VMI t/vm", 404, 'virtualmachineinstances "vm" not found',
                                          details={"name": "vm"}))
    keeper = _claim_keeper(client, claims=[_claim("vm", SINCE)])  # last confirmed by "adm"
    why = KeepRanOut("vm", SINCE)
    keeper.kept.note_released("t", "vm", "vm-uid", "d0", "adm", why, now - timedelta(seconds=1),
                              expired=True)
    keeper.kept.note_released("t", "vm", "vm-uid", "d1", "old", why, now - timedelta(minutes=3),
                              expired=True)                   # past the grace: forgotten
    await keeper.claims.release(now, keeper.kept.released_admissions(now))
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t", "vm-gpus", "uid-vm", "5")]
    assert list(keeper.kept.released_admissions(now)) == [("t", "adm")]


# -- DR6: the claim of an admitted VMI, made again from the record ---------------------------

def _restore_keeper(client: ScriptedClient, claims=()) -> Housekeeper:
    """A Housekeeper over a cache with node n1 (hgx-h100-8), VMI t/vm admitted by adm-1 and
    its set of two recorded on n1, and a claim informer holding `claims` ((ns, name))."""
    from model.housekeeping import VMIs, VMIRecord
    from model.snapshot import Snapshot
    from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result
    from tests.support.dra_worlds import device_class, dra_node, ref
    cls = device_class()
    br = BindRequest("req-1", "vm", ("held", "vm-t-0"), result=Result.SUCCEEDED, node="n1")
    devs = [GPUDevice("t", n, cls.name, status=DeviceStatus(
        Phase.BOUND, "n1", None, Attachment("vm", SINCE, "adm-1"), br, ref("n1", i)))
        for n, i in (("held", 2), ("vm-t-0", 3))]
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[cls], devices=devs)
    informer = SimpleNamespace(keys=lambda: list(claims), healthy=True)
    cache = SimpleNamespace(
        claims=informer, healthy=lambda *i: all(x.healthy for x in i),
        view=SimpleNamespace(devices=lambda: {d.key: d for d in devs}, snapshot=lambda: snap,
                             classes=lambda: {cls.name: cls}),
        vmi_state=lambda: VMIs({("t", "vm"): VMIRecord("t", "vm", "uid-1", "adm-1")}))
    return Housekeeper(client, cache, grace=timedelta(minutes=2), raw_policy="denied")  # type: ignore[arg-type]


def _wired_vmi(uid: str = "uid-1") -> dict:
    return {"metadata": {"name": "vm", "uid": uid}, "spec": {
        "resourceClaims": [{"name": "gpu-binder", "resourceClaimName": "vm-gpus"}],
        "domain": {"devices": {"gpus": [{"name": "held", "claimName": "gpu-binder", "requestName": "gpu-0"},
                                        {"name": "vm-t-0", "claimName": "gpu-binder", "requestName": "gpu-1"}]}}}}


async def test_DR6_a_deleted_claim_of_an_admitted_vmi_is_made_again_from_the_record():
    from k8s import errors
    from k8s.client import RESOURCE_CLAIMS, VMIS
    from localcluster.dra_profiles import HGX_H100_8, gpu_uuid
    client = ScriptedClient()
    client.script("get", _wired_vmi())
    keeper = _restore_keeper(client)
    await keeper.claims.restore(SINCE)
    assert client.of("get") == [(VMIS, "t", "vm")]       # the VMI read live; the claim is not read
    assert [c.method for c in client.calls] == ["get", "create", "create_event"]
    [(res, ns, body)] = client.of("create")
    assert (res, ns, body["metadata"]["name"]) == (RESOURCE_CLAIMS, "t", "vm-gpus")
    assert body["metadata"]["annotations"]["gpu.cozystack.io/admission"] == "adm-1"
    uuids = [r["exactly"]["selectors"][0]["cel"]["expression"].split('"')[-2]
             for r in body["spec"]["devices"]["requests"]]
    assert uuids == [gpu_uuid(HGX_H100_8, 2), gpu_uuid(HGX_H100_8, 3)]        # the record, in order
    [(_, event)] = client.of("create_event")
    assert event["reason"] == "GPUClaimRestored" and event["involvedObject"]["uid"] == "uid-1"
    assert keeper.claims.claims_restored == 1


async def test_DR6_nothing_is_made_when_the_informer_has_the_claim_or_the_vmi_is_another_or_finished():
    client = ScriptedClient()
    await _restore_keeper(client, claims=[("t", "vm-gpus")]).claims.restore(SINCE)
    assert client.calls == []                                  # the informer has it
    client.script("get", _wired_vmi("uid-2"))                  # another incarnation
    await _restore_keeper(client).claims.restore(SINCE)
    client.script("get", {**_wired_vmi(), "status": {"phase": "Succeeded"}})   # its Pod is done
    await _restore_keeper(client).claims.restore(SINCE)
    assert client.of("create") == [] and client.of("create_event") == []


async def test_DR6_a_create_answered_AlreadyExists_is_a_claim_there_after_all_and_nothing_else_is_done():
    """The claim informer was behind, or the claim was made between the round's look and
    the create: the 409 is the live read that it is there. No read of it follows, no Event,
    nothing counted, and the next round (the informer caught up) does nothing."""
    from k8s import errors
    from k8s.client import RESOURCE_CLAIMS, VMIS
    client = ScriptedClient()
    client.script("get", _wired_vmi())
    client.script("create", errors.AlreadyExists(
        "RestoreClaim t/vm-gpus", 409, 'resourceclaims.resource.k8s.io "vm-gpus" already exists',
        reason="AlreadyExists", details={"name": "vm-gpus"}))
    keeper = _restore_keeper(client)
    with captured_logs() as logs:
        await keeper.claims.restore(SINCE)
    assert [c.method for c in client.calls] == ["get", "create"]
    [told] = [e for e in logs if e["event"].startswith("claim of an admitted VMI")]
    assert (told["event"], told["log_level"], told["rule"]) == (
        "claim of an admitted VMI missing; not made again", "info", "DR6")
    assert client.of("get") == [(VMIS, "t", "vm")]
    [(res, ns, body)] = client.of("create")
    assert (res, ns, body["metadata"]["name"]) == (RESOURCE_CLAIMS, "t", "vm-gpus")
    assert keeper.claims.claims_restored == 0 and keeper.statistics().actions_done == 0
    client.calls.clear()
    await _restore_keeper(client, claims=[("t", "vm-gpus")]).claims.restore(SINCE)
    assert client.calls == []


async def test_DR6_a_create_that_fails_otherwise_is_logged_and_counts_nothing():
    from k8s import errors
    client = ScriptedClient()
    client.script("get", _wired_vmi())
    client.script("create", errors.Forbidden("RestoreClaim t/vm-gpus", 403, "forbidden"))
    keeper = _restore_keeper(client)
    with captured_logs() as logs:
        await keeper.claims.restore(SINCE)
    assert client.of("create_event") == [] and keeper.claims.claims_restored == 0
    [failed] = [e for e in logs if e["event"] == "housekeeping action failed"]
    assert (failed["action"], failed["rule"], failed["claim"]) == ("RestoreClaim", "DR6", "vm-gpus")


async def test_H1_H2_the_claims_come_from_the_informer_as_parsed_at_ingest():
    """With the cache's claim informer, housekeeping reads the `model.claim.Claim` values its
    transform made (`k8s.cache.ingest_claim`), ours only, and lists nothing live."""
    from k8s import errors
    from k8s.cache import ingest_claim
    from k8s.client import RESOURCE_CLAIMS
    from model.housekeeping import VMIs
    client = ScriptedClient()
    client.script("get", errors.NotFound("read VMI t/gone", 404, 'virtualmachineinstances "gone" not found',
                                         details={"name": "gone"}))
    held = [ingest_claim(_claim("gone", SINCE)), ingest_claim(_claim("tenants", SINCE, labels={}))]
    cache = SimpleNamespace(view=SimpleNamespace(devices=lambda: {}), vmi_state=lambda: VMIs({}),
                            claims=SimpleNamespace(items=lambda: held, healthy=True),
                            healthy=lambda *i: all(x.healthy for x in i))
    keeper = Housekeeper(client, cache, grace=timedelta(minutes=2), raw_policy="denied")  # type: ignore[arg-type]
    await keeper.claims.release(SINCE + timedelta(minutes=10))
    assert client.of("list") == []
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t", "gone-gpus", "uid-gone", "5")]
