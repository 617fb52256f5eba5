"""The webhook's transport (k8s/webhook/transport.py) on a real loopback aiohttp server (plain
HTTP; TLS is test_webhook_tls.py): it always answers an AdmissionReview with the request's
uid and a status that fits, whatever comes in or whatever the handler does (W6)."""

from __future__ import annotations

import anyio
import orjson
import pytest

from k8s.webhook.review import refusal_denial
from k8s.webhook.transport import MAX_BODY, allow, make_app, serve
from localcluster.controlplane import free_port
from model import reasons
from model.admission import Refusal

pytestmark = pytest.mark.anyio


def review(uid: str = "u-1") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "CREATE", "namespace": "t",
                        "kind": {"group": "kubevirt.io", "kind": "VirtualMachineInstance"},
                        "object": {"metadata": {"name": "vm", "annotations": {
                            "gpu.cozystack.io/templates": "h100=1"}}}}}


async def _post(handler, body: bytes, content_type: str = "application/json",
                timeout: float = 25.0) -> tuple[int, dict]:
    import aiohttp

    port = free_port()
    async with anyio.create_task_group() as tg:
        await tg.start(serve, make_app(handler, timeout=timeout), "127.0.0.1", port, None)
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{port}/mutate-vmi", data=body,
                                 headers={"Content-Type": content_type}) as resp:
                status, doc = resp.status, await resp.json()
        tg.cancel_scope.cancel()
    assert (doc["apiVersion"], doc["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    return status, doc["response"]


async def _never_called(review) -> dict:
    raise AssertionError(f"the handler was called with {review}")


async def test_W6_an_oversized_body_is_denied_413_without_reaching_the_handler() -> None:
    status, resp = await _post(_never_called, b"{" + b" " * (MAX_BODY + 1) + b"}")
    assert (status, resp["allowed"], resp["status"]["code"]) == (200, False, 413)
    assert resp["status"]["reason"] == "RequestEntityTooLarge"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-notjson",
                                          "application/yaml"])
async def test_W6_a_body_of_another_content_type_is_denied_415(content_type) -> None:
    status, resp = await _post(_never_called, orjson.dumps(review()), content_type)
    assert (status, resp["allowed"], resp["status"]["code"]) == (200, False, 415)
    assert content_type in resp["status"]["message"]


async def test_W6_a_crashing_handler_is_an_internal_error_denial_with_the_uid() -> None:
    async def crash(review) -> dict:
        raise KeyError("boom")
    status, resp = await _post(crash, orjson.dumps(review("u-crash")))
    assert (status, resp["uid"], resp["allowed"]) == (200, "u-crash", False)
    assert resp["status"] == {"code": 500, "reason": "InternalError",
                              "message": "gpu-binder admission failed internally: KeyError"}


async def test_W6_a_handler_past_its_deadline_is_a_retryable_denial() -> None:
    async def stuck(review) -> dict:
        await anyio.Event().wait()
        raise AssertionError("not reached")
    status, resp = await _post(stuck, orjson.dumps(review("u-slow")), timeout=0.2)
    assert (resp["uid"], resp["allowed"], resp["status"]["code"]) == ("u-slow", False, 503)
    assert resp["status"]["message"].endswith("; retry")


async def test_the_answer_always_carries_the_reviews_uid() -> None:
    async def other_uid(review) -> dict:
        return allow("not-the-reviews-uid")
    status, resp = await _post(other_uid, orjson.dumps(review("u-7")))
    assert resp == {"uid": "u-7", "allowed": True}


async def test_W1_W6_an_early_denial_is_logged_naming_the_request_and_the_vmi(monkeypatch) -> None:
    """Denials before any judgement (here an unknown annotation and a malformed one) leave
    one log line each with the review's uid, the VMI, the requester and the dry-run flag, as
    placement denials do, and answer 422 with the review's uid."""
    import aiohttp

    from k8s.webhook import transport

    logs: list[dict] = []

    class Recorder:  # the module's logger (structlog caches bound loggers once configured)
        def info(self, event: str, **fields) -> None:
            logs.append({"event": event, **fields})
    monkeypatch.setattr(transport, "log", Recorder())

    async def handler(review) -> dict:  # never reached: both are denied by the decoder
        raise AssertionError(review)

    def review(uid: str, name: str, annotations: dict, dry_run: bool) -> bytes:
        return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "request": {"uid": uid, "kind": {"group": "kubevirt.io",
                                                              "kind": "VirtualMachineInstance"},
                                         "operation": "CREATE", "namespace": "t1",
                                         "dryRun": dry_run,
                                         "userInfo": {"username": f"user-{uid}"},
                                         "object": {"metadata": {"name": name,
                                                                 "annotations": annotations}}}})
    port = free_port()
    answers = []
    async with anyio.create_task_group() as tg:
        await tg.start(transport.serve, transport.make_app(handler), "127.0.0.1", port, None)
        async with aiohttp.ClientSession() as http:
            for body in (review("u-1", "vm", {"gpu.cozystack.io/tempaltes": "h100=1"}, False),
                         review("u-2", "vm2", {"gpu.cozystack.io/templates": "h100=x"}, True)):
                async with http.post(f"http://127.0.0.1:{port}/mutate-vmi", data=body,
                                     headers={"Content-Type": "application/json"}) as resp:
                    answers.append((await resp.json())["response"])
        tg.cancel_scope.cancel()
    assert [(a["uid"], a["allowed"], a["status"]["code"]) for a in answers] == [
        ("u-1", False, 422), ("u-2", False, 422)]
    denied = [e for e in logs if e["event"] == "VMI denied"]
    assert [(e["uid"], e["namespace"], e["vmi"], e["user"], e["dry_run"], e["code"])
            for e in denied] == [("u-1", "t1", "vm", "user-u-1", False, 422),
                                 ("u-2", "t1", "vm2", "user-u-2", True, 422)]
    assert denied[0]["reason"].startswith("unknown annotation gpu.cozystack.io/tempaltes")
    assert denied[1]["reason"].startswith("invalid GPU annotations on VMI t1/vm2")


@pytest.mark.parametrize(("reason", "status"), [
    (reasons.UnknownAnnotation(("gpu.cozystack.io/tempaltes",), "gpu.cozystack.io/devices",
                               "gpu.cozystack.io/templates"), 422),
    (reasons.DeviceAttached("gpu-a", "other"), 403),
    (reasons.SameNameConflict("gpu-a", "t", "vm"), 503),
])
def test_a_refusal_is_denied_in_the_category_of_its_typed_reason(reason, status) -> None:
    denial = refusal_denial(Refusal(reason))
    assert (denial.code, denial.message) == (status, reason.render())
    assert denial.category.value == reason.category.value


@pytest.mark.parametrize("limit, closes", [(3, [3, 6]), (1, list(range(1, 8))), (0, [])])
async def test_a_connection_is_closed_after_its_keepalive_reviews_by_the_answer(limit,
                                                                                 closes) -> None:
    """--webhook-keepalive-reviews: on one kept-alive client connection, the answer to every
    `limit`-th review says `Connection: close` and the client's next review opens a new
    connection (which a Service may place on another replica); every review is answered."""
    import aiohttp

    from k8s.webhook.transport import KEEPALIVE

    async def handler(r):
        return allow(r.uid)

    port, app = free_port(), make_app(handler, keepalive_reviews=limit)
    closed_on, opened = [], []        # reviews answered with a close; that opened a connection
    current = [0]

    async def on_create(_session, _ctx, _params) -> None:
        opened.append(current[0])

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_create)
    async with anyio.create_task_group() as tg:
        await tg.start(serve, app, "127.0.0.1", port, None)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                         trace_configs=[trace]) as http:
            for i in range(1, 8):
                current[0] = i
                async with http.post(f"http://127.0.0.1:{port}/mutate-vmi",
                                     data=orjson.dumps(review(f"u-{i}")),
                                     headers={"Content-Type": "application/json"}) as resp:
                    doc = await resp.json()
                assert (resp.status, doc["response"]["uid"]) == (200, f"u-{i}")
                if resp.headers.get("Connection", "").lower() == "close":
                    closed_on.append(i)
        tg.cancel_scope.cancel()
    assert closed_on == closes
    assert app[KEEPALIVE].closed == len(closes)
    # the first review and each one after a close opened a connection; the others reused it
    assert opened == [1] + [c + 1 for c in closes if c < 7]
