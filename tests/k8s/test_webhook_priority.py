"""P1 at the webhook (docs/contract.md §3c): a VMI's `spec.priorityClassName` is resolved at
admission against the cache's PriorityClasses and recorded in every member's
`status.bindRequest` (priority, preemptionPolicy, priorityClassName); a class that does not
exist is denied 403 naming it before any read or write, a dry run included; a VMI asking for
no GPU is untouched. On the in-memory store and a scripted client: no API server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson
import pytest

from fakes.kube_client import ScriptedClient
from fakes.memory_store import MemoryStore
from k8s import errors
from k8s.cache import ClusterCache
from k8s.webhook import steps
from k8s.webhook.admission import VMIAdmission
from k8s.webhook.review import Rejected, decode
from k8s.webhook.steps import Attempt, request_body
from model.admission import AdmissionPlan
from model.housekeeping import VMIs
from model.parse import parse_gpu_device
from model.priority import PreemptionPolicy, Priority, PriorityClassInfo, PriorityScope, ScopeRequirement
from model.types import DeviceStatus, GPUDevice, Phase
from tests.timing import FAKE_TIME
from tests.support.webhook_cache import StoreCache

NOW = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
H100 = "nvidia.com/H100"
TEMPLATES = "gpu.cozystack.io/templates"
DEVICES = "gpu.cozystack.io/devices"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def review(*, pc=None, ann=None, dry_run=False, name="vm"):
    spec: dict = {}
    if pc is not None:
        spec["priorityClassName"] = pc
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "operation": "CREATE", "namespace": "t1", "name": name, "dryRun": dry_run,
        "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
        "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                   "metadata": {"name": name, "namespace": "t1",
                                "annotations": {DEVICES: "gpu-a"} if ann is None else ann},
                   "spec": spec},
        "userInfo": {"username": "tenant"}}}
    return decode(orjson.dumps(doc))


def world() -> MemoryStore:
    """Tenant t1 holds gpu-a, Bound on n1 (a set with nothing to create); PriorityClasses
    spot, on-demand (Never) and a globalDefault standard."""
    store = MemoryStore()
    store.add_namespace("t1")
    store.add_class("h100", H100)
    store.add_node("n1", {H100: 4})
    store.put_device(GPUDevice("t1", "gpu-a", "h100", status=DeviceStatus(Phase.BOUND, "n1", NOW)))
    store.add_priority_class("spot", 100)
    store.add_priority_class("on-demand", 1000, policy=PreemptionPolicy.NEVER)
    store.add_priority_class("standard", 10, global_default=True)
    return store


def admission(store: MemoryStore, client: ScriptedClient, monkeypatch, bodies: list) -> VMIAdmission:
    async def attached(api, attempt, request, plan, written) -> None:
        bodies.append(request)  # W3 (2)/(3): the bindRequest every member gets

    async def succeeded(*a, **k) -> str:  # W3 (4): the binder answered Succeeded on n1
        return "n1"
    monkeypatch.setattr(steps, "attach_all", attached)
    monkeypatch.setattr(steps, "wait_result", succeeded)
    return VMIAdmission(client, StoreCache(store), bind_timeout=5.0,  # type: ignore[arg-type]
                        grace=timedelta(seconds=30), clock=lambda: NOW)


def name_free(client: ScriptedClient) -> None:
    client.script("get", errors.NotFound("read VMI t1/vm", 404, 'virtualmachineinstances "vm" not found',
                                         reason="NotFound", details={"name": "vm"}))


def test_the_decoder_reads_the_class_and_refuses_one_that_is_not_a_string():
    assert review(pc="spot").priority_class_name == "spot"
    assert review(pc="").priority_class_name is None
    assert review().priority_class_name is None
    bad = review(pc=7)
    assert isinstance(bad, Rejected) and bad.denial.code == 422
    assert "spec.priorityClassName" in bad.denial.message
    assert review(pc=7, ann={}).ask is None  # no GPU: not the webhook's business


async def test_an_unknown_class_is_denied_403_naming_it_before_any_read_or_write(monkeypatch):
    for dry_run in (False, True):
        store, client, bodies = world(), ScriptedClient(), []
        adm = admission(store, client, monkeypatch, bodies)
        answer = await adm.handle(review(pc="on-demnad", dry_run=dry_run))
        assert answer["allowed"] is False
        assert answer["status"]["code"] == 403
        assert answer["status"]["message"] == "no PriorityClass with name on-demnad was found"
        # nothing read or written (a dry run writes no Event either; a real one's Event is
        # the only write, and it names the class too)
        assert [c.method for c in client.calls] == ([] if dry_run else ["create_event"])
        assert bodies == []


async def test_a_vmi_asking_for_no_gpu_is_untouched_whatever_its_class(monkeypatch):
    store, client = world(), ScriptedClient()
    answer = await admission(store, client, monkeypatch, []).handle(review(pc="nope", ann={}))
    assert answer == {"uid": "u-1", "allowed": True}
    assert client.calls == []


@pytest.mark.parametrize("pc, want", [
    ("spot", {"priority": 100, "preemptionPolicy": "PreemptLowerPriority", "priorityClassName": "spot"}),
    ("on-demand", {"priority": 1000, "preemptionPolicy": "Never", "priorityClassName": "on-demand"}),
    (None, {"priority": 10, "preemptionPolicy": "PreemptLowerPriority", "priorityClassName": "standard"}),
])
async def test_the_resolved_priority_is_recorded_in_the_bind_request(monkeypatch, pc, want):
    store, client, bodies = world(), ScriptedClient(), []
    name_free(client)
    answer = await admission(store, client, monkeypatch, bodies).handle(review(pc=pc))
    assert answer["allowed"] is True
    (body,) = bodies
    assert {k: body[k] for k in want} == want
    assert body["devices"] == ["gpu-a"] and body["vmi"] == "vm"


async def test_no_class_and_no_default_records_nothing_as_an_older_replica_did(monkeypatch):
    store, client, bodies = world(), ScriptedClient(), []
    store.remove_priority_class("standard")
    name_free(client)
    assert (await admission(store, client, monkeypatch, bodies).handle(review()))["allowed"] is True
    assert not {"priority", "preemptionPolicy", "priorityClassName"} & bodies[0].keys()


async def test_a_dry_run_resolves_too_and_writes_nothing(monkeypatch):
    store, client, bodies = world(), ScriptedClient(), []
    name_free(client)
    answer = await admission(store, client, monkeypatch, bodies).handle(review(pc="spot", dry_run=True))
    assert answer["allowed"] is True and bodies == []
    assert [c.method for c in client.calls] == ["get"]


async def test_a_quota_scoped_on_the_class_refuses_it_403_before_any_write(monkeypatch):
    store, client, bodies = world(), ScriptedClient(), []
    store.add_budget("t1", H100, 0, PriorityScope((ScopeRequirement("In", ("on-demand",)),)))
    answer = await admission(store, client, monkeypatch, bodies).handle(review(pc="on-demand"))
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert "PriorityClass In (on-demand)" in answer["status"]["message"]
    assert bodies == [] and [c.method for c in client.calls] == ["create_event"]
    name_free(client)
    assert (await admission(store, client, monkeypatch, bodies).handle(review(pc="spot")))["allowed"]


def test_the_request_body_serialises_the_priority_as_the_status_parser_reads_it():
    attempt = Attempt("t1", "vm", "adm-1", NOW, VMIs(), timedelta(seconds=30), lambda: NOW)
    prio = Priority(-5, PreemptionPolicy.NEVER, "batch")
    body = request_body(attempt, AdmissionPlan("t1", "vm", ("gpu-a",), (), "n1", prio), (("zone", "a"),), ())
    assert body == {"id": "adm-1", "vmi": "vm", "devices": ["gpu-a"], "requestedAt": "2026-12-06T08:00:00Z",
                    "nodeSelector": {"zone": "a"}, "priority": -5, "preemptionPolicy": "Never",
                    "priorityClassName": "batch"}
    raw = {"metadata": {"name": "gpu-a", "namespace": "t1"}, "spec": {"class": "h100"},
           "status": {"bindRequest": body}}
    assert parse_gpu_device(raw).status.bind_request.priority == prio


def test_the_cache_feeds_priority_classes_into_the_snapshot():
    cache = ClusterCache(object())  # type: ignore[arg-type]  # never run: events delivered here
    cache.priority_classes._apply("ADDED", {"metadata": {"name": "spot", "resourceVersion": "1"},
                                            "value": 100, "managedFields": []})
    cache.priority_classes._apply("ADDED", {"metadata": {"name": "broken", "resourceVersion": "2"},
                                            "value": "high"})
    assert dict(cache.view.snapshot().priority_classes) == {"spot": PriorityClassInfo("spot", 100)}
    cache.priority_classes._apply("DELETED", {"metadata": {"name": "spot"}})
    assert dict(cache.view.snapshot().priority_classes) == {}
    assert cache.priority_classes in cache.informers
