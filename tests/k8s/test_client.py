"""`k8s.client.KubeClient` on a kubernetes_asyncio `ApiClient` whose transport is a script:
each call sends what the API server expects (path, method, patch content type, field
manager, timeout) and a failure comes out once, as the `k8s.errors` type, keeping the API
Status's reason and details."""

from __future__ import annotations

import anyio
import orjson
import pytest
from kubernetes_asyncio.client import ApiClient, ApiException

from k8s import errors
from k8s.client import GPU_CLASSES, GPU_DEVICES, VMIS, KubeClient
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def _status(code: int, reason: str, message: str, details: dict | None = None) -> ApiException:
    exc = ApiException(status=code, reason=reason)
    exc.body = orjson.dumps({"kind": "Status", "status": "Failure", "code": code,
                             "reason": reason, "message": message, "details": details or {}})
    exc.headers = {}
    return exc


class _Transport(ApiClient):
    """An ApiClient whose `call_api` records the request and answers from `answers` (an
    exception is raised, a value returned; `hang` sleeps past every timeout)."""

    def __init__(self, *answers: object) -> None:
        super().__init__()
        self.answers = list(answers)
        self.requests: list[dict] = []

    async def call_api(self, resource_path, method, path_params=None, query_params=None,
                       header_params=None, body=None, **kw):
        self.requests.append({"path": resource_path, "method": method, "params": path_params,
                              "query": dict(query_params or []), "headers": header_params,
                              "body": body, "timeout": kw.get("_request_timeout")})
        got = self.answers.pop(0)
        if got == "hang":
            await anyio.sleep(3600)
        if isinstance(got, BaseException):
            raise got
        return got


async def test_a_404_keeps_the_status_reason_and_details_and_tells_the_object_from_its_kind():
    about_vmi = _status(404, "NotFound", 'virtualmachineinstances "vm-1" not found',
                        {"name": "vm-1", "group": "kubevirt.io", "kind": "virtualmachineinstances"})
    no_kind = _status(404, "NotFound", "the server could not find the requested resource")
    api = _Transport(about_vmi, no_kind)
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
    path = "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"
    assert api.requests[0]["path"] == path
    assert api.requests[0]["params"] == {"group": "kubevirt.io", "version": "v1", "namespace": "t",
                                         "plural": "virtualmachineinstances", "name": "vm-1"}
    await api.close()


async def test_writes_carry_the_field_manager_the_patch_type_and_the_timeout():
    api = _Transport({"metadata": {"resourceVersion": "7"}}, {}, {}, None)
    client = KubeClient(api, timeout=2.0, field_manager="base").using(field_manager="mine")
    ops = [{"op": "test", "path": "/status/bindRequest/id", "value": "r1"}]
    assert await client.patch_status(GPU_DEVICES, "t", "gpu-0", ops) == {
        "metadata": {"resourceVersion": "7"}}
    await client.patch_status(GPU_CLASSES, None, "h100", {"status": {"conditions": []}})
    await client.create(GPU_DEVICES, "t", {"metadata": {"name": "tmpl"}})
    await client.delete(GPU_DEVICES, "t", "tmpl", uid="u1", resource_version="9")
    json_patch, merge, create, delete = api.requests
    assert (json_patch["method"], json_patch["headers"]["Content-Type"], json_patch["body"],
            json_patch["query"], json_patch["timeout"]) == (
        "PATCH", "application/json-patch+json", ops, {"fieldManager": "mine"}, 2.0)
    assert (merge["path"].endswith("/{plural}/{name}/status"), merge["params"].get("namespace"),
            merge["headers"]["Content-Type"]) == (True, None, "application/merge-patch+json")
    assert (create["method"], create["query"]) == ("POST", {"fieldManager": "mine"})
    assert (delete["method"], delete["body"]) == (
        "DELETE", {"preconditions": {"uid": "u1", "resourceVersion": "9"}})
    await api.close()


async def test_conflicts_throttling_and_hung_calls_come_out_typed():
    throttled = _status(429, "TooManyRequests", "too many requests")
    throttled.headers = {"Retry-After": "3"}
    api = _Transport(_status(409, "AlreadyExists", 'gpudevices "x" already exists',
                             {"name": "x"}),
                     _status(409, "Conflict", "the object has been modified"),
                     throttled, "hang")
    client = KubeClient(api, timeout=2.0)
    with pytest.raises(errors.AlreadyExists) as exists:
        await client.create(GPU_DEVICES, "t", {"metadata": {"name": "x"}})
    with pytest.raises(errors.Conflict) as conflict:
        await client.delete(GPU_DEVICES, "t", "x", uid="u")
    with pytest.raises(errors.TooManyRequests) as busy:
        await client.create_event("t", {"metadata": {"namespace": "t"}})
    assert (exists.value.reason, exists.value.details, conflict.value.reason,
            busy.value.retry_after) == ("AlreadyExists", {"name": "x"}, "Conflict", 3.0)
    t0 = anyio.current_time()
    with pytest.raises(errors.Unavailable) as hung:          # bounded on the loop too
        await client.get_status(GPU_DEVICES, "t", "x")
    assert (anyio.current_time() - t0, hung.value.status) == (pytest.approx(2.0), 0)
    await api.close()


def test_a_timeout_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="timeout"):
        KubeClient(object(), timeout=0)  # type: ignore[arg-type]


class _Raw:
    """An undecoded response (`_preload_content=False`), as the Lease read gets it."""

    def __init__(self, status: int, body: dict) -> None:
        self.status, self.reason, self.headers = status, "", {}
        self.body = orjson.dumps(body)

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass


async def test_a_lease_is_read_raw_a_missing_one_is_none_and_a_lost_race_is_typed():
    lease = {"metadata": {"name": "l", "resourceVersion": "3"}, "spec": {"holderIdentity": "a"}}
    api = _Transport(_Raw(200, lease), _Raw(404, {"kind": "Status", "code": 404,
                                                  "reason": "NotFound", "details": {"name": "l"}}),
                     _status(409, "Conflict", "the object has been modified"))
    client = KubeClient(api, timeout=0.5)
    assert await client.read_lease("ns", "l") == lease
    assert await client.read_lease("ns", "l") is None
    with pytest.raises(errors.Conflict, match="replace Lease ns/l: 409"):
        await client.replace_lease("ns", "l", lease)
    assert [r["timeout"] for r in api.requests] == [0.5, 0.5, 0.5]
    await api.close()
