"""`k8s.client.KubeClient`'s raw path on a kubernetes_asyncio `ApiClient` whose aiohttp
session is a script: each call sends what the API server expects (method, path, patch
content type, field manager, timeout, the Configuration's token) and a failure comes out
once, as the `k8s.errors` type, keeping the API Status's reason, details and Retry-After.
tests/e2e/test_client_raw.py checks the same against a real kube-apiserver."""

from __future__ import annotations

import aiohttp
import anyio
import orjson
import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from k8s import errors
from k8s.client import GPU_CLASSES, GPU_DEVICES, VMIS, KubeClient
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio
HOST = "https://api.test:6443"


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


class _Answer:
    """An aiohttp response as the raw path reads it: `status`, `reason`, `headers`, and a
    `body` (a dict or list encoded as JSON, or bytes as they are)."""

    def __init__(self, status: int, body: object = None, *, headers: dict | None = None,
                 reason: str = "") -> None:
        self.status, self.reason, self.headers = status, reason, headers or {}
        self.body = body if isinstance(body, bytes) else orjson.dumps(body)
        self.released = False

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        self.released = True


def _status(code: int, reason: str, message: str, details: dict | None = None,
            headers: dict | None = None) -> _Answer:
    return _Answer(code, {"kind": "Status", "status": "Failure", "code": code,
                          "reason": reason, "message": message, "details": details or {}},
                   headers=headers, reason=reason)


class _Session:
    """Stands for the ApiClient's aiohttp session: `request` records what it was sent and
    answers from `answers` (an exception is raised, "hang" sleeps past every timeout, an
    `_Answer` returned)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.requests: list[dict] = []

    async def request(self, method, url, *, headers, data, timeout, **kw):
        self.requests.append({"method": method, "url": url, "headers": dict(headers),
                              "body": None if data is None else orjson.loads(data),
                              "timeout": timeout.total, **kw})
        got = self.answers.pop(0)
        if got == "hang":
            await anyio.sleep(3600)
        if isinstance(got, BaseException):
            raise got
        return got

    async def close(self) -> None:
        pass


async def _api(*answers: object, configuration: Configuration | None = None
               ) -> tuple[ApiClient, _Session]:
    """An ApiClient on HOST whose session is a `_Session` of `answers` (its own closed)."""
    cfg = configuration or Configuration()
    cfg.host = HOST
    api = ApiClient(cfg)
    await api.rest_client.pool_manager.close()
    session = _Session(*answers)
    api.rest_client.pool_manager = session
    return api, session


async def test_a_404_keeps_the_status_reason_and_details_and_tells_the_object_from_its_kind():
    about_vmi = _status(404, "NotFound", 'virtualmachineinstances "vm-1" not found',
                        {"name": "vm-1", "group": "kubevirt.io", "kind": "virtualmachineinstances"})
    no_kind = _status(404, "NotFound", "the server could not find the requested resource")
    api, session = await _api(about_vmi, no_kind)
    client = KubeClient(api, timeout=2.0)
    with pytest.raises(errors.NotFound) as got:
        await client.get(VMIS, "t", "vm-1")
    err = got.value
    assert (err.status, err.reason, err.details["kind"], err.names("vm-1"), err.names("vm-2")) == (
        404, "NotFound", "virtualmachineinstances", True, False)
    assert str(err) == 'read VMI t/vm-1: 404 virtualmachineinstances "vm-1" not found'
    with pytest.raises(errors.NotFound) as got:
        await client.get(VMIS, "t", "vm-1")
    assert (got.value.details, got.value.names("vm-1")) == ({}, False)  # the kind is unknown
    assert (session.requests[0]["method"], session.requests[0]["url"],
            session.requests[0]["body"]) == (
        "GET", f"{HOST}/apis/kubevirt.io/v1/namespaces/t/virtualmachineinstances/vm-1", None)
    assert about_vmi.released and no_kind.released
    await api.close()


async def test_writes_carry_the_field_manager_the_patch_type_and_the_timeout():
    api, session = await _api(_Answer(200, {"metadata": {"resourceVersion": "7"}}),
                              _Answer(200, {}), _Answer(201, {}), _Answer(200, {}),
                              _Answer(201, {}))
    client = KubeClient(api, timeout=2.0, field_manager="base").using(field_manager="mine/é")
    ops = [{"op": "test", "path": "/status/bindRequest/id", "value": "r1"}]
    assert await client.patch_status(GPU_DEVICES, "t", "gpu-0", ops) == {
        "metadata": {"resourceVersion": "7"}}
    await client.patch_status(GPU_CLASSES, None, "h100", {"status": {"conditions": []}})
    await client.create(GPU_DEVICES, "t", {"metadata": {"name": "tmpl"}})
    await client.delete(GPU_DEVICES, "t", "tmpl", uid="u1", resource_version="9")
    await client.create_event("t", {"metadata": {"namespace": "t"}})
    json_patch, merge, create, delete, event = session.requests
    devices = f"{HOST}/apis/gpu.cozystack.io/v1alpha1/namespaces/t/gpudevices"
    assert (json_patch["method"], json_patch["url"], json_patch["headers"]["Content-Type"],
            json_patch["body"], json_patch["timeout"]) == (
        "PATCH", f"{devices}/gpu-0/status?fieldManager=mine%2F%C3%A9",
        "application/json-patch+json", ops, 2.0)
    assert (merge["url"], merge["headers"]["Content-Type"]) == (
        f"{HOST}/apis/gpu.cozystack.io/v1alpha1/gpuclasses/h100/status?fieldManager=mine%2F%C3%A9",
        "application/merge-patch+json")
    assert (create["method"], create["url"], create["body"]) == (
        "POST", f"{devices}?fieldManager=mine%2F%C3%A9", {"metadata": {"name": "tmpl"}})
    assert (delete["method"], delete["url"], delete["body"]) == (
        "DELETE", f"{devices}/tmpl", {"preconditions": {"uid": "u1", "resourceVersion": "9"}})
    assert (event["method"], event["url"]) == (
        "POST", f"{HOST}/api/v1/namespaces/t/events?fieldManager=mine%2F%C3%A9")
    assert {r["headers"]["Accept"] for r in session.requests} == {"application/json"}
    await api.close()


async def test_conflicts_throttling_and_hung_calls_come_out_typed():
    api, _ = await _api(_status(409, "AlreadyExists", 'gpudevices "x" already exists',
                                {"name": "x"}),
                        _status(409, "Conflict", "the object has been modified"),
                        _status(429, "TooManyRequests", "too many requests",
                                headers={"Retry-After": "3"}),
                        aiohttp.ClientConnectionError("reset"),
                        _Answer(200, b"<html>proxy error</html>"),
                        "hang")
    client = KubeClient(api, timeout=2.0)
    with pytest.raises(errors.AlreadyExists) as exists:
        await client.create(GPU_DEVICES, "t", {"metadata": {"name": "x"}})
    with pytest.raises(errors.Conflict) as conflict:
        await client.delete(GPU_DEVICES, "t", "x", uid="u")
    with pytest.raises(errors.TooManyRequests) as busy:
        await client.create_event("t", {"metadata": {"namespace": "t"}})
    assert (exists.value.reason, exists.value.details, conflict.value.reason,
            busy.value.retry_after) == ("AlreadyExists", {"name": "x"}, "Conflict", 3.0)
    with pytest.raises(errors.Unavailable, match="read GPUDevice t/x: 0 .*reset"):
        await client.get(GPU_DEVICES, "t", "x")
    with pytest.raises(errors.Unavailable, match="response is not JSON"):
        await client.get(GPU_DEVICES, "t", "x")
    t0 = anyio.current_time()
    with pytest.raises(errors.Unavailable) as hung:          # bounded on the loop too
        await client.get_status(GPU_DEVICES, "t", "x")
    assert (anyio.current_time() - t0, hung.value.status) == (pytest.approx(2.0), 0)
    await api.close()


async def test_every_call_carries_the_token_the_configuration_refreshes():
    cfg = Configuration()
    cfg.api_key = {"BearerToken": "old"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    tokens = iter(["t1", "t2"])

    def refresh(c: Configuration) -> None:  # as kubernetes_asyncio's in-cluster loader does
        c.api_key["BearerToken"] = next(tokens)
    cfg.refresh_api_key_hook = refresh
    api, session = await _api(_Answer(200, {}), _Answer(200, {}), configuration=cfg)
    client = KubeClient(api, timeout=2.0)
    await client.get(GPU_DEVICES, "t", "a")
    await client.get(GPU_DEVICES, "t", "b")
    assert [r["headers"]["authorization"] for r in session.requests] == [
        "Bearer t1", "Bearer t2"]
    assert session.requests[0]["headers"]["User-Agent"] == api.user_agent
    await api.close()


async def test_the_proxy_and_tls_server_name_of_the_api_client_are_used():
    api, session = await _api(_Answer(200, {}))
    api.rest_client.proxy = "http://proxy.test:3128"
    api.rest_client.server_hostname = "kubernetes.default"
    await KubeClient(api, timeout=2.0).get(GPU_DEVICES, "t", "a")
    assert (session.requests[0]["proxy"], session.requests[0]["server_hostname"]) == (
        "http://proxy.test:3128", "kubernetes.default")
    await api.close()


def test_a_timeout_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="timeout"):
        KubeClient(object(), timeout=0)  # type: ignore[arg-type]


async def test_a_lease_is_read_a_missing_one_is_none_and_a_lost_race_is_typed():
    lease = {"metadata": {"name": "l", "resourceVersion": "3"}, "spec": {"holderIdentity": "a"}}
    api, session = await _api(_Answer(200, lease),
                              _status(404, "NotFound", "not found", {"name": "l"}),
                              _status(409, "Conflict", "the object has been modified"))
    client = KubeClient(api, timeout=0.5)
    assert await client.read_lease("ns", "l") == lease
    assert await client.read_lease("ns", "l") is None
    with pytest.raises(errors.Conflict, match="replace Lease ns/l: 409"):
        await client.replace_lease("ns", "l", lease)
    assert [r["timeout"] for r in session.requests] == [0.5, 0.5, 0.5]
    assert session.requests[2]["url"] == (
        f"{HOST}/apis/coordination.k8s.io/v1/namespaces/ns/leases/l?fieldManager=gpu-binder")
    await api.close()
