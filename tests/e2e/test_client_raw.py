"""`k8s.client.KubeClient`'s raw path against the real kube-apiserver (issue 40 item 5): the
calls of the admission's hot path and the rest round-trip as plain dicts without
kubernetes_asyncio's call machinery (the ApiClient here refuses `call_api`), every write
carries the field manager (managedFields), authentication is the Configuration's (its
token refresh hook honoured), and the API server's failures come out as the `k8s.errors`
types: 404 (the object, or its kind), 409 AlreadyExists and Conflict, 422, 403, 429 and
503 with Retry-After (from a stand-in admission webhook that refuses with those codes, as
API Priority and Fairness and our own webhook do), and a call that outlives the client's
timeout."""

from __future__ import annotations

import base64
import ssl
import uuid

import anyio
import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio.config import new_client_from_config

from k8s import errors
from k8s.client import (GPU_CLASSES, GPU_DEVICES, LEASES, RESOURCE_CLAIMS, VMIS, KubeClient,
                        Resource, reuse_newest_first, resolve_environment_once)
from localcluster.controlplane import free_port
from model.types import GROUP, VERSION
from tests.e2e.helpers import eventually

pytestmark = pytest.mark.anyio
MANAGER = "raw-path-test"
LABEL = "gpu-binder.test/raw-path"


def _device(name: str, **labels: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
            "metadata": {"name": name, "labels": labels}, "spec": {"class": "h100"}}


def _managers(obj: dict) -> set[tuple[str, str, str]]:
    """(manager, operation, subresource) of each managedFields entry of `obj`."""
    return {(m["manager"], m["operation"], m.get("subresource", ""))
            for m in obj["metadata"].get("managedFields") or []}


def _no_call_machinery(api) -> None:
    """Make `api` fail any call through kubernetes_asyncio's generated machinery."""
    def refuse(*_a, **_k):
        raise AssertionError("the raw path must not use kubernetes_asyncio's call_api")
    api.call_api = refuse
    api.sanitize_for_serialization = refuse
    api.deserialize = refuse


@pytest.fixture
def client(admin_client) -> KubeClient:
    """The admin's client as a replica builds it, with the call machinery refused."""
    api = reuse_newest_first(resolve_environment_once(admin_client))
    _no_call_machinery(api)
    return KubeClient(api, timeout=5.0, field_manager=MANAGER)


@pytest.fixture
def namespace(control_plane) -> str:
    ns = f"raw-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", ns)
    return ns


async def test_a_device_s_writes_carry_the_field_manager_and_come_back_as_dicts(
        client, namespace):
    created = await client.create(GPU_DEVICES, namespace, _device("gpu-0"))
    assert (created["metadata"]["name"], created["spec"]) == ("gpu-0", {"class": "h100"})
    assert _managers(created) == {(MANAGER, "Update", "")}
    rv = created["metadata"]["resourceVersion"]
    binder = client.using(field_manager=f"{MANAGER}-binder")
    bound = await binder.patch_status(GPU_DEVICES, namespace, "gpu-0", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/status", "value": {"phase": "Bound", "nodeName": "node-1"}}])
    assert bound["status"] == {"phase": "Bound", "nodeName": "node-1"}
    merged = await client.patch_status(GPU_DEVICES, namespace, "gpu-0",
                                       {"status": {"nodeName": "node-2"}})
    assert merged["status"] == {"phase": "Bound", "nodeName": "node-2"}
    labelled = await client.patch(GPU_DEVICES, namespace, "gpu-0", [
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}])
    read = await client.get(GPU_DEVICES, namespace, "gpu-0")
    assert (await client.get_status(GPU_DEVICES, namespace, "gpu-0"))["status"] == read["status"]
    assert (labelled["metadata"]["labels"], read["status"]["nodeName"]) == ({"a": "b"}, "node-2")
    assert _managers(read) == {(MANAGER, "Update", ""), (MANAGER, "Update", "status"),
                               (f"{MANAGER}-binder", "Update", "status")}
    with pytest.raises(errors.Conflict) as stale:                 # preconditions
        await client.delete(GPU_DEVICES, namespace, "gpu-0", uid="not-its-uid")
    assert (stale.value.status, stale.value.reason) == (409, "Conflict")
    await client.delete(GPU_DEVICES, namespace, "gpu-0", uid=read["metadata"]["uid"],
                        resource_version=read["metadata"]["resourceVersion"])
    with pytest.raises(errors.NotFound) as gone:
        await client.get(GPU_DEVICES, namespace, "gpu-0")
    assert gone.value.names("gpu-0")


async def test_the_other_kinds_round_trip_through_the_raw_path(client, namespace):
    cls = f"raw-{uuid.uuid4().hex[:8]}"                      # cluster-scoped
    await client.create(GPU_CLASSES, None, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUClass",
                                            "metadata": {"name": cls},
                                            "spec": {"resourceName": "nvidia.com/GH100_H100"}})
    written = await client.patch_status(GPU_CLASSES, None, cls, {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})
    assert (written["status"]["conditions"][0]["status"], _managers(written)) == (
        "True", {(MANAGER, "Update", ""), (MANAGER, "Update", "status")})
    await client.delete(GPU_CLASSES, None, cls)
    await client.create_event(namespace, {
        "metadata": {"name": "ev-1", "namespace": namespace},
        "involvedObject": {"kind": "GPUDevice", "namespace": namespace, "name": "gpu-0"},
        "reason": "Test", "message": "raw", "type": "Normal"})
    event = await client.get(Resource("", "v1", "events", "Event"), namespace, "ev-1")
    assert (event["message"], _managers(event)) == ("raw", {(MANAGER, "Update", "")})
    cm = await client.create_config_map(namespace, {"metadata": {"name": "cm"},
                                                    "data": {"k": "1"}})
    replaced = await client.replace_config_map(namespace, "cm", {**cm, "data": {"k": "2"}})
    assert replaced["data"] == {"k": "2"}
    with pytest.raises(errors.Conflict):                       # cm's resourceVersion is stale
        await client.replace_config_map(namespace, "cm", {**cm, "data": {"k": "3"}})
    assert await client.read_lease(namespace, "l") is None
    await client.create_lease(namespace, {"metadata": {"name": "l"},
                                          "spec": {"holderIdentity": "a"}})
    lease = await client.read_lease(namespace, "l")
    await client.replace_lease(namespace, "l", {**lease, "spec": {"holderIdentity": "b"}})
    lease = await client.get(LEASES, namespace, "l")
    assert (lease["spec"], _managers(lease)) == ({"holderIdentity": "b"},
                                                 {(MANAGER, "Update", "")})
    # the policy on claims spares the system namespaces (k8s/manifests/policies)
    claim = await client.create(RESOURCE_CLAIMS, "kube-public", {
        "metadata": {"name": f"raw-{uuid.uuid4().hex[:8]}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "example.com-none", "allocationMode": "ExactCount",
            "count": 1}}]}}})
    name = claim["metadata"]["name"]
    assert _managers(claim) == {(MANAGER, "Update", "")}
    await client.delete(RESOURCE_CLAIMS, "kube-public", name, uid=claim["metadata"]["uid"])
    with pytest.raises(errors.NotFound):
        await client.get(RESOURCE_CLAIMS, "kube-public", name)


async def test_the_api_server_s_refusals_come_out_typed(client, namespace, make_tenant,
                                                        tenant_client):
    with pytest.raises(errors.NotFound) as missing:
        await client.get(VMIS, namespace, "vm-1")
    with pytest.raises(errors.NotFound) as no_kind:
        await client.get(Resource("nothing.example.com", "v1", "things", "Thing"), namespace, "x")
    assert (missing.value.reason, missing.value.names("vm-1"), no_kind.value.names("x")) == (
        "NotFound", True, False)
    assert str(missing.value).startswith(f"read VMI {namespace}/vm-1: 404 ")
    await client.create(GPU_DEVICES, namespace, _device("gpu-0"))
    with pytest.raises(errors.AlreadyExists) as exists:
        await client.create(GPU_DEVICES, namespace, _device("gpu-0"))
    assert (exists.value.status, exists.value.reason, exists.value.details["name"]) == (
        409, "AlreadyExists", "gpu-0")
    with pytest.raises(errors.Invalid) as failed_test:       # a JSON Patch `test` that fails
        await client.patch_status(GPU_DEVICES, namespace, "gpu-0", [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "add", "path": "/status", "value": {"phase": "Bound"}}])
    assert failed_test.value.status == 422
    with pytest.raises(errors.Invalid) as invalid:           # the schema: an unknown phase
        await client.patch_status(GPU_DEVICES, namespace, "gpu-0",
                                  {"status": {"phase": "Lost"}})
    assert (invalid.value.reason, invalid.value.details["causes"][0]["field"]) == (
        "Invalid", "status.phase")
    assert "Unsupported value" in invalid.value.message        # the causes are kept
    tenant = make_tenant()
    theirs = KubeClient(await tenant_client(tenant.kubeconfig), timeout=5.0)
    with pytest.raises(errors.Forbidden) as denied:
        await theirs.patch_status(GPU_DEVICES, namespace, "gpu-0", {"status": {"phase": "Bound"}})
    assert (denied.value.status, denied.value.reason) == (403, "Forbidden")


async def test_a_service_account_s_token_is_sent_and_refreshed_as_the_configuration_says(
        control_plane, namespace, tmp_path):
    control_plane.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    kubeconfig = control_plane.write_service_account_kubeconfig(
        tmp_path / "reader.kubeconfig", namespace, "reader")
    api = await new_client_from_config(config_file=str(kubeconfig))
    try:
        _no_call_machinery(api)
        token = api.configuration.api_key["BearerToken"]
        api.configuration.api_key["BearerToken"] = "Bearer expired"
        refreshed: list[str] = []

        def refresh(cfg) -> None:     # as the in-cluster loader's hook re-reads its token file
            cfg.api_key["BearerToken"] = token
            refreshed.append(token)
        api.configuration.refresh_api_key_hook = refresh
        with pytest.raises(errors.Forbidden) as denied:   # authenticated: 403, not 401
            await KubeClient(api, timeout=5.0).get(GPU_DEVICES, namespace, "gpu-0")
        assert f"system:serviceaccount:{namespace}:reader" in denied.value.message
        assert refreshed == [token]
    finally:
        await api.close()


class _StandIn:
    """A validating admission webhook on loopback (TLS by the control plane's CA) for the
    GPUDevice creates labelled LABEL in one namespace: "throttle" is refused with 429,
    "unavailable" with 503 (each with details.retryAfterSeconds, which kube-apiserver turns
    into Retry-After), "probe" with 400, and "hang" is held until `release` is set."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.port = free_port()

    async def review(self, request: web.Request) -> web.Response:
        review = await request.json()
        req = review["request"]
        what = req["object"]["metadata"]["labels"][LABEL]
        if what == "hang":
            await self.release.wait()
        code, retry = {"throttle": (429, 7), "unavailable": (503, 3)}.get(what, (400, 0))
        status = {"code": code, "message": f"stand-in says {what}",
                  "reason": {429: "TooManyRequests", 503: "ServiceUnavailable"}.get(code, "BadRequest")}
        if retry:
            status["details"] = {"retryAfterSeconds": retry}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": req["uid"], "allowed": False,
                                               "status": status}})


@pytest.fixture
async def stand_in(control_plane, namespace, tmp_path):
    """A `_StandIn` serving and registered for `namespace` (unregistered after the test)."""
    hook = _StandIn()
    pair = control_plane.ca.issue_server(["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    app = web.Application()
    app.router.add_post("/validate", hook.review)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", hook.port, ssl_context=tls).start()
    name = f"raw-path-{namespace}"
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "raw-path.gpu-binder.test", "sideEffects": "None", "failurePolicy": "Fail",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 10,
            "clientConfig": {"url": f"https://127.0.0.1:{hook.port}/validate",
                             "caBundle": base64.b64encode(control_plane.ca.cert_pem).decode()},
            "rules": [{"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE"],
                       "resources": ["gpudevices"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {"matchExpressions": [{"key": LABEL, "operator": "Exists"}]}}]}))
    try:
        yield hook
    finally:
        hook.release.set()
        control_plane.kubectl("delete", "validatingwebhookconfiguration", name,
                              "--ignore-not-found")
        await runner.cleanup()


async def test_throttled_and_unavailable_answers_keep_retry_after_and_a_hung_call_times_out(
        client, namespace, stand_in):
    probes = iter(range(1000))

    async def registered() -> bool:      # the API server calls the stand-in once it saw it
        try:
            await client.create(GPU_DEVICES, namespace, _device(f"probe-{next(probes)}",
                                                                **{LABEL: "probe"}))
        except errors.ApiError as err:
            return err.status == 400
        return False
    await eventually(registered, what="the stand-in webhook called")
    with pytest.raises(errors.TooManyRequests) as throttled:
        await client.create(GPU_DEVICES, namespace, _device("t", **{LABEL: "throttle"}))
    with pytest.raises(errors.Unavailable) as unavailable:
        await client.create(GPU_DEVICES, namespace, _device("u", **{LABEL: "unavailable"}))
    assert (throttled.value.status, throttled.value.retry_after, throttled.value.reason) == (
        429, 7.0, "TooManyRequests")
    assert (unavailable.value.status, unavailable.value.retry_after) == (503, 3.0)
    assert "stand-in says throttle" in throttled.value.message
    with pytest.raises(errors.Unavailable) as hung:
        await client.using(timeout=1.0).create(GPU_DEVICES, namespace,
                                               _device("h", **{LABEL: "hang"}))
    assert (hung.value.status, hung.value.what) == (0, f"create GPUDevice {namespace}/h")
