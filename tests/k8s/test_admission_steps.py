"""The webhook's concurrent W3 steps (k8s/webhook/admission.py `_each`): every device written, a
bounded number at once, and the first failure raised as it is (Denied before an API error)."""

from __future__ import annotations

import anyio
import pytest

from k8s import errors
from k8s.webhook.admission import STEP_PARALLEL, Denied, _each
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
    await _each(write, list(range(20)))
    assert sorted(done) == list(range(20))
    assert peak == STEP_PARALLEL
    assert anyio.current_time() - t0 == pytest.approx(-(-20 // STEP_PARALLEL) * 0.001)  # rounds


async def test_a_denial_is_raised_as_it_is_before_an_api_error() -> None:
    async def write(name: str) -> None:
        if name == "api":
            raise errors.Conflict("patch GPUDevice t/api", 409, "conflict")
        if name == "taken":  # fails in the same step as "api": both are in the group
            raise Denied("GPU device taken is attached to VMI other")
        await anyio.sleep(1)  # a slow write, cancelled by the failures

    t0 = anyio.current_time()
    with pytest.raises(Denied, match="attached to VMI other"):
        await _each(write, ["api", "slow", "taken"])
    assert anyio.current_time() == t0  # the slow write did not hold the denial back


async def test_one_item_runs_inline_and_its_error_is_not_wrapped() -> None:
    async def write(name: str) -> None:
        raise errors.Conflict(f"patch GPUDevice t/{name}", 409, "conflict")

    with pytest.raises(errors.Conflict):
        await _each(write, ["only"])


async def test_W1_W6_an_early_denial_is_logged_naming_the_request_and_the_vmi(monkeypatch) -> None:
    """Denials before any judgement (here an unknown annotation and a malformed one) leave
    one log line each with the review's uid and the VMI, as placement denials do."""
    from k8s.webhook import admission
    from k8s.webhook.admission import VMIAdmission

    logs: list[dict] = []

    class Recorder:  # the module's logger (structlog caches bound loggers once configured)
        def info(self, event: str, **fields) -> None:
            logs.append({"event": event, **fields})
    monkeypatch.setattr(admission, "log", Recorder())

    adm = object.__new__(VMIAdmission)  # the early checks read nothing of the instance
    review = {"uid": "u-1", "kind": {"group": "kubevirt.io", "kind": "VirtualMachineInstance"},
              "operation": "CREATE", "namespace": "t1",
              "object": {"metadata": {"name": "vm", "annotations": {
                  "gpu.cozystack.io/tempaltes": "h100=1"}}}}
    bad = {**review, "uid": "u-2", "object": {"metadata": {"name": "vm2", "annotations": {
        "gpu.cozystack.io/templates": "h100=x"}}}}
    first = await adm.handle(review)
    second = await adm.handle(bad)
    assert (first["allowed"], second["allowed"]) == (False, False)
    denied = [e for e in logs if e["event"] == "VMI denied"]
    assert [(e["uid"], e["namespace"], e["vmi"], e["code"]) for e in denied] == [
        ("u-1", "t1", "vm", 422), ("u-2", "t1", "vm2", 422)]
    assert denied[0]["reason"].startswith("unknown annotation gpu.cozystack.io/tempaltes")
    assert denied[1]["reason"].startswith("invalid GPU annotations on VMI t1/vm2")
