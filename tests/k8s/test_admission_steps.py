"""The webhook's steps (k8s/webhook/steps.py): the concurrent W3 steps (`each`: every device
written, a bounded number at once, the first failure raised as it is, Denied before an API
error), the typing of API failures, and the early-denial log line."""

from __future__ import annotations

import anyio
import pytest

from k8s import errors
from k8s.webhook.review import Category
from k8s.webhook.steps import STEP_PARALLEL, Denied, api_denial, each
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME  # the writes' latencies below are fake time


async def test_every_item_is_done_and_no_more_than_the_bound_at_once() -> None:
    done: list[int] = []
    running = peak = 0

    async def write(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.001)  # the API call's latency
        running -= 1
        done.append(i)

    t0 = anyio.current_time()
    await each(write, list(range(20)))
    assert sorted(done) == list(range(20))
    assert peak == STEP_PARALLEL
    assert anyio.current_time() - t0 == pytest.approx(-(-20 // STEP_PARALLEL) * 0.001)  # rounds


async def test_a_denial_is_raised_as_it_is_before_an_api_error() -> None:
    async def write(name: str) -> None:
        if name == "api":
            raise errors.Conflict("patch GPUDevice t/api", 409, "conflict")
        if name == "taken":  # fails in the same step as "api": both are in the group
            raise Denied(Category.POLICY, "GPU device taken is attached to VMI other")
        await anyio.sleep(1)  # a slow write, cancelled by the failures

    t0 = anyio.current_time()
    with pytest.raises(Denied, match="attached to VMI other"):
        await each(write, ["api", "slow", "taken"])
    assert anyio.current_time() == t0  # the slow write did not hold the denial back


async def test_one_item_runs_inline_and_its_error_is_not_wrapped() -> None:
    async def write(name: str) -> None:
        raise errors.Conflict(f"patch GPUDevice t/{name}", 409, "conflict")

    with pytest.raises(errors.Conflict):
        await each(write, ["only"])


@pytest.mark.parametrize(("error", "status"), [
    (errors.Invalid("patch GPUDevice t/a", 422, "spec.x: Invalid value"), 422),
    (errors.TooManyRequests("patch GPUDevice t/a", 429, "slow down", 2.0), 429),
    (errors.Forbidden("patch GPUDevice t/a", 403, "no RBAC"), 500),
    (errors.Unavailable("patch GPUDevice t/a", 0, "TimeoutError()"), 503),
    (errors.Conflict("patch GPUDevice t/a", 409, "stale"), 503),
])
def test_an_api_failure_in_a_step_gets_the_status_of_what_it_is(error, status) -> None:
    """The schema refusing what the VMI made us write is invalid input; throttling and
    outages are retryable (the message says so); the webhook's own RBAC is an internal
    error a retry does not mend."""
    denial = api_denial(error)
    assert denial.code == status
    assert str(error) in denial.message
    assert denial.message.endswith("; retry") == denial.retryable == (status in (429, 503))


async def test_W1_W6_an_early_denial_is_logged_naming_the_request_and_the_vmi(monkeypatch) -> None:
    """Denials before any judgement (here an unknown annotation and a malformed one) leave
    one log line each with the review's uid and the VMI, as placement denials do, and
    answer 422 with the review's uid."""
    import aiohttp
    import orjson

    from k8s.webhook import transport
    from localcluster.controlplane import free_port

    logs: list[dict] = []

    class Recorder:  # the module's logger (structlog caches bound loggers once configured)
        def info(self, event: str, **fields) -> None:
            logs.append({"event": event, **fields})
    monkeypatch.setattr(transport, "log", Recorder())

    async def handler(review) -> dict:  # never reached: both are denied by the decoder
        raise AssertionError(review)

    def review(uid: str, name: str, annotations: dict) -> bytes:
        return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "request": {"uid": uid, "kind": {"group": "kubevirt.io",
                                                              "kind": "VirtualMachineInstance"},
                                         "operation": "CREATE", "namespace": "t1",
                                         "object": {"metadata": {"name": name,
                                                                 "annotations": annotations}}}})
    port = free_port()
    answers = []
    async with anyio.create_task_group() as tg:
        await tg.start(transport.serve, transport.make_app(handler), "127.0.0.1", port, None)
        async with aiohttp.ClientSession() as http:
            for body in (review("u-1", "vm", {"gpu.cozystack.io/tempaltes": "h100=1"}),
                         review("u-2", "vm2", {"gpu.cozystack.io/templates": "h100=x"})):
                async with http.post(f"http://127.0.0.1:{port}/mutate-vmi", data=body,
                                     headers={"Content-Type": "application/json"}) as resp:
                    answers.append((await resp.json())["response"])
        tg.cancel_scope.cancel()
    assert [(a["uid"], a["allowed"], a["status"]["code"]) for a in answers] == [
        ("u-1", False, 422), ("u-2", False, 422)]
    denied = [e for e in logs if e["event"] == "VMI denied"]
    assert [(e["uid"], e["namespace"], e["vmi"], e["code"]) for e in denied] == [
        ("u-1", "t1", "vm", 422), ("u-2", "t1", "vm2", 422)]
    assert denied[0]["reason"].startswith("unknown annotation gpu.cozystack.io/tempaltes")
    assert denied[1]["reason"].startswith("invalid GPU annotations on VMI t1/vm2")
