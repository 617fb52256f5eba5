"""The webhook's ResourceClaim of a device-mode set (k8s/webhook/steps.py `ensure_claim`,
`clean_up`; `VMIAdmission._reserve`/`_wire`; DR5, W4, W5) on the scripted client: a retry
finds the claim in place, a claim of other devices is replaced, a tenant's claim of the name is
never adopted, quota and in-use refusals are typed, and a refusal, a failure or a cancellation
after the create deletes the claim this call made, never one another admission stamped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import anyio
import pytest

from actors.view import IndexedView
from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.client import RESOURCE_CLAIMS
from k8s.webhook import steps
from k8s.webhook.admission import VMIAdmission, _Judged
from k8s.webhook.steps import Api, Attempt, Denied, Written, clean_up, ensure_claim
from localcluster.dra_profiles import HGX_H100_8, gpu_uuid
from model.admission import AdmissionPlan, LauncherDefaults
from model.claim import ClaimMember, build_claim
from model.housekeeping import VMIs
from model.reasons import (ClaimBeingDeleted, ClaimInUse, ClaimNameTaken, ClaimOverQuota,
                           DeviceUnrecorded)
from model.snapshot import Snapshot
from tests.support.dra_worlds import device_class, dra_node, recorded, ref
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
H100 = device_class()


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def attempt(admission: str = "adm-2") -> Attempt:
    return Attempt("t1", "vm", admission, NOW, VMIs(), timedelta(seconds=30), lambda: NOW)


def body(index: int = 3, admission: str = "adm-2") -> dict:
    return build_claim("t1", "vm", [ClaimMember("gpu-a", H100, ref("n1", index), gpu_uuid(HGX_H100_8, index))],
                       admission, NOW)


def stored(claim: dict, *, rv: str = "41", **meta) -> dict:
    out = {**claim, "metadata": {**claim["metadata"], "uid": "uid-1", "resourceVersion": rv, **meta}}
    return out


def exists() -> errors.AlreadyExists:
    return errors.AlreadyExists("create ResourceClaim t1/vm-gpus", 409, "already exists")


def methods(client: ScriptedClient) -> list[str]:
    return [c.method for c in client.calls]


async def test_DR5_the_claim_is_created_and_recorded_for_W5():
    client = ScriptedClient()
    written = Written()
    await ensure_claim(Api(client), attempt(), body(), written)
    assert client.of("create") == [(RESOURCE_CLAIMS, "t1", body())]
    assert client.calls[0].field_manager == "gpu-binder-webhook"
    assert written.claim == "vm-gpus"


async def test_W4_a_retry_finds_its_claim_in_place_and_stamps_it_without_a_new_one():
    client = ScriptedClient()
    client.script("create", exists())
    client.script("get", stored(body(admission="adm-1")))   # an earlier try of this VMI
    written = Written()
    await ensure_claim(Api(client), attempt("adm-2"), body(), written)
    assert methods(client) == ["create", "get", "patch"]
    (_, ns, name, ops), = client.of("patch")
    assert (ns, name) == ("t1", "vm-gpus")
    assert ops == [{"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                   {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1admission", "value": "adm-2"},
                   {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1claimed-at",
                    "value": "2026-12-04T10:00:00Z"}]
    assert written.claim is None                             # not this call's to delete


async def test_DR5_a_tenants_claim_of_the_name_is_never_adopted_nor_touched():
    forged = stored(body())
    forged["metadata"]["annotations"] = {"gpu.cozystack.io/claim-for": "other-vm"}  # not for this VMI
    tenant = {"metadata": {"name": "vm-gpus", "uid": "u", "resourceVersion": "1"}, "spec": body()["spec"]}
    for foreign in (tenant, forged):
        client = ScriptedClient()
        client.script("create", exists())
        client.script("get", foreign)
        written = Written()
        with pytest.raises(Denied) as raised:
            await ensure_claim(Api(client), attempt(), body(), written)
        assert raised.value.reason == ClaimNameTaken("t1", "vm-gpus", "vm")
        assert raised.value.denial.code == 403
        assert methods(client) == ["create", "get"]          # no patch, no delete
        assert written.claim is None


async def test_W4_our_claim_of_other_devices_is_replaced():
    client = ScriptedClient()
    client.script("create", exists(), body())                # then the second create succeeds
    client.script("get", stored(body(index=0, admission="adm-1")))   # re-pointed since
    written = Written()
    await ensure_claim(Api(client), attempt(), body(), written)
    assert methods(client) == ["create", "get", "delete", "create"]
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t1", "vm-gpus", "uid-1", "41")]
    assert written.claim == "vm-gpus"


async def test_W4_our_claim_of_other_devices_still_held_by_a_pod_or_being_deleted_is_retryable():
    held = stored(body(index=0))
    held["status"] = {"reservedFor": [{"resource": "pods", "name": "virt-launcher-vm-x", "uid": "p"}]}
    going = stored(body(), deletionTimestamp="2026-12-04T09:59:00Z")
    for raw, reason in ((held, ClaimInUse("t1", "vm-gpus")), (going, ClaimBeingDeleted("t1", "vm-gpus"))):
        client = ScriptedClient()
        client.script("create", exists())
        client.script("get", raw)
        with pytest.raises(Denied) as raised:
            await ensure_claim(Api(client), attempt(), body(), Written())
        assert raised.value.reason == reason and raised.value.denial.code == 503
        assert "delete" not in methods(client)


async def test_DR5_a_quota_refusal_of_the_claim_is_a_policy_denial_and_nothing_to_delete():
    msg = ('resourceclaims.resource.k8s.io "vm-gpus" is forbidden: exceeded quota: gpus, requested: '
           'vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices=1, used: ..=4, limited: ..=4')
    client = ScriptedClient()
    client.script("create", errors.Forbidden("create ResourceClaim t1/vm-gpus", 403, msg))
    written = Written()
    with pytest.raises(Denied) as raised:
        await ensure_claim(Api(client), attempt(), body(), written)
    assert raised.value.reason == ClaimOverQuota("t1", "vm-gpus", msg)
    assert raised.value.denial.code == 403 and "exceeded quota" in raised.value.denial.message
    assert written.claim is None
    # RBAC's 403 is no quota: the webhook's own permissions, an internal error (500)
    client = ScriptedClient()
    client.script("create", errors.Forbidden("create ResourceClaim t1/vm-gpus", 403,
                                             'User "x" cannot create resource "resourceclaims"'))
    with pytest.raises(errors.Forbidden) as api_err:
        await ensure_claim(Api(client), attempt(), body(), Written())
    assert steps.api_denial(api_err.value).code == 500


async def test_W5_clean_up_deletes_the_claim_this_call_made_even_when_the_binder_decided():
    client = ScriptedClient()
    client.script("get", stored(body()))                     # the claim, as this call made it
    client.script("get", {"status": {"bindRequest": {"id": "adm-2", "node": "n1"}}})  # decided
    await clean_up(Api(client), attempt(), Written(attached=["gpu-a"], claim="vm-gpus"))
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t1", "vm-gpus", "uid-1", "41")]
    assert "patch_status" not in methods(client)             # the attachment is the binder's (B7)


async def test_W5_clean_up_leaves_a_claim_another_admission_stamped_since():
    client = ScriptedClient()
    client.script("get", stored(body(admission="adm-3")))
    await clean_up(Api(client), attempt("adm-2"), Written(claim="vm-gpus"))
    assert "delete" not in methods(client)


# -- through VMIAdmission: the claim is made after Succeeded, before the answer -------------

class _Cache:
    def __init__(self, snap: Snapshot) -> None:
        self.view = SimpleNamespace(snapshot=lambda: snap, device=lambda key: None,
                                    subscribe=IndexedView().subscribe)  # no change comes
        self.devices = SimpleNamespace(add_listener=lambda fn: None)

    def vmi_state(self) -> VMIs:
        return VMIs()

    def launcher_defaults(self) -> LauncherDefaults:
        return LauncherDefaults()


def _admission(client: ScriptedClient, snap: Snapshot, monkeypatch, node: str = "n1") -> VMIAdmission:
    async def attached(*a, **kw) -> None:       # W3 (2)/(3): covered by their own tests
        return None

    async def succeeded(*a, **kw) -> str:       # W3 (4): the binder answered Succeeded
        return node
    monkeypatch.setattr(steps, "attach_all", attached)
    monkeypatch.setattr(steps, "wait_result", succeeded)
    return VMIAdmission(client, _Cache(snap), bind_timeout=5.0, grace=timedelta(seconds=30),  # type: ignore[arg-type]
                        clock=lambda: NOW)


def _judged(snap: Snapshot) -> _Judged:
    plan = AdmissionPlan("t1", "vm", ("gpu-a",), (), "n1")
    return _Judged(plan, (), snap, attempt())


REVIEW = SimpleNamespace(uid="u", object={"metadata": {"name": "vm"}, "spec": {}}, tolerations=())


async def test_DR5_an_admitted_set_answers_with_the_claim_wiring(monkeypatch):
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[H100], devices=[recorded("t1", "gpu-a", "n1", 3)])
    client = ScriptedClient()
    adm = _admission(client, snap, monkeypatch)
    node, ops = await adm._reserve(REVIEW, _judged(snap), anyio.current_time() + 5)
    assert node == "n1"
    assert client.of("create") == [(RESOURCE_CLAIMS, "t1", body())]
    assert {"op": "add", "path": "/spec/resourceClaims",
            "value": [{"name": "gpu-binder", "resourceClaimName": "vm-gpus"}]} in ops
    assert {"op": "add", "path": "/spec/domain",
            "value": {"devices": {"gpus": [{"name": "gpu-a", "claimName": "gpu-binder",
                                            "requestName": "gpu-0"}]}}} in ops


async def test_W5_a_create_that_timed_out_after_the_server_stored_it_is_deleted(monkeypatch):
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[H100], devices=[recorded("t1", "gpu-a", "n1", 3)])
    client = ScriptedClient()
    client.script("create", errors.Unavailable("create ResourceClaim t1/vm-gpus", 0, "TimeoutError()"))
    client.script("get", stored(body()))                      # it was stored after all
    client.script("get", None)                                # the device, for the attachment
    adm = _admission(client, snap, monkeypatch)
    with pytest.raises(Denied) as raised:
        await adm._reserve(REVIEW, _judged(snap), anyio.current_time() + 5)
    assert raised.value.denial.code == 503
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t1", "vm-gpus", "uid-1", "41")]


async def test_W5_a_drain_cancelling_the_create_deletes_the_claim(monkeypatch):
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[H100], devices=[recorded("t1", "gpu-a", "n1", 3)])
    client = ScriptedClient(latency=1.0)                      # every call takes 1 s
    client.script("get", stored(body()), None)
    adm = _admission(client, snap, monkeypatch)
    with anyio.move_on_after(0.5):                            # cancelled during the create
        await adm._reserve(REVIEW, _judged(snap), anyio.current_time() + 5)
    assert client.of("delete") == [(RESOURCE_CLAIMS, "t1", "vm-gpus", "uid-1", "41")]


async def test_DR5_a_record_the_cache_does_not_show_in_time_is_retryable_and_no_claim_is_made(monkeypatch):
    from model.types import DeviceStatus, GPUDevice, Phase
    bare = GPUDevice("t1", "gpu-a", H100.name, status=DeviceStatus(Phase.BOUND, "n1"))
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[H100], devices=[bare])
    client = ScriptedClient()
    client.script("get", None)
    adm = _admission(client, snap, monkeypatch)
    t0 = anyio.current_time()
    with pytest.raises(Denied) as raised:
        await adm._reserve(REVIEW, _judged(snap), t0 + 1)
    assert raised.value.reason == DeviceUnrecorded("gpu-a", "n1", None)
    assert anyio.current_time() - t0 == pytest.approx(1, abs=0.1)   # waited for it until the deadline
    assert "create" not in methods(client)
