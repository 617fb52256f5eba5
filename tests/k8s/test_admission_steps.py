"""The webhook's steps (k8s/webhook/steps.py): the concurrent W3 steps (`each`: every device
written, a bounded number at once, the first failure raised as it is, Denied before an API
error) and the typing of API failures."""

from __future__ import annotations

import anyio
import pytest

from datetime import datetime, timedelta, timezone

from k8s import errors
from k8s.webhook.steps import STEP_PARALLEL, Attempt, Denied, api_denial, each, wait_result
from model.reasons import BinderRefused, Code, DeviceAttached
from model.types import BindRequest, DeviceStatus, GPUDevice, Result
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
            raise Denied(DeviceAttached("taken", "other"))
        await anyio.sleep(1)  # a slow write, cancelled by the failures

    t0 = anyio.current_time()
    with pytest.raises(Denied, match="attached to VMI other") as raised:
        await each(write, ["api", "slow", "taken"])
    assert raised.value.reason == DeviceAttached("taken", "other")
    assert raised.value.denial.code == 403
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


class _Answered:
    """A `ResultWaiter` whose devices already carry the binder's answer."""

    def __init__(self, *devices: GPUDevice) -> None:
        self.devices = list(devices)

    async def wait(self, namespace, request_id, names, timeout):
        return self.devices


def _refused(name: str, message: str | None, code: Code | None) -> GPUDevice:
    br = BindRequest("r1", "vm", ("g1", "g2"), result=Result.REFUSED, message=message, code=code)
    return GPUDevice("t1", name, "h100", None, DeviceStatus(bind_request=br))


@pytest.mark.parametrize(("code", "status"), [
    (Code.LEDGERS_REFUSED, 503),   # retryable: a retry decides again
    (Code.BUDGET_EXHAUSTED, 403),  # policy
    (Code.DEVICE_NOT_FOUND, 422),  # the request itself is wrong
    (None, 403),                   # an older replica wrote no code: as before the field
])
async def test_a_binder_refusal_is_answered_in_the_category_of_its_code(code, status) -> None:
    """W3 (4): the binder's refusal crosses the status boundary typed (`bindRequest.code`
    beside its message): the webhook's status follows the code, the text is the binder's."""
    now = datetime(2026, 1, 2, tzinfo=timezone.utc)
    attempt = Attempt("t1", "vm", "r1", now, None, timedelta(seconds=30), lambda: now)
    waiter = _Answered(_refused("g1", "refused t1/vm request r1: …", code), _refused("g2", None, None))
    with pytest.raises(Denied) as raised:
        await wait_result(waiter, attempt, ("g1", "g2"), 1.0, 30.0)
    assert raised.value.reason == BinderRefused("t1", "vm", "refused t1/vm request r1: …", code)
    assert (raised.value.denial.code, raised.value.denial.message) == (
        status, "refused t1/vm request r1: …")


class _WithNominations(_Answered):
    """`_Answered` whose cache's view shows `nominations` (P4)."""

    def __init__(self, nominations, *devices: GPUDevice) -> None:
        super().__init__(*devices)
        view = type("View", (), {"nominations": lambda self: {n.name: n for n in nominations}})()
        self.cache = type("Cache", (), {"view": view})()


@pytest.mark.parametrize("known, retry", [(True, 3), (False, 5)])
async def test_P4_a_nominated_refusal_is_503_with_the_nominations_retry_after(known, retry) -> None:
    """The preemptor's create is answered 503 with Retry-After: its nomination's
    `retryAfterSeconds` (at most the step, 5 s) and words saying the same, else the step
    when the cache lacks the nomination (the stored words as they are)."""
    from model.nomination import Nomination
    now = datetime(2026, 1, 2, tzinfo=timezone.utc)
    n = Nomination("t1", "vm", 1000, "n1", (("nvidia.com/H100", 2),), (), (), now, now + timedelta(minutes=2), 3)
    attempt = Attempt("t1", "vm", "r1", now, None, timedelta(seconds=30), lambda: now)
    waiter = _WithNominations([n] if known else [], _refused("g1", "refused t1/vm request r1 for now: …",
                                                             Code.PREEMPTION_NOMINATED),
                              _refused("g2", None, None))
    with pytest.raises(Denied) as raised:
        await wait_result(waiter, attempt, ("g1", "g2"), 1.0, 30.0)
    denial = raised.value.denial
    words = ("refused t1/vm request r1 for now: no room for the set now; stopping 0 lower-priority VMs "
             "on n1 to make room for it (priority 1000): ; its room is held for it, retry in 3s"
             if known else "refused t1/vm request r1 for now: …")
    assert raised.value.reason == BinderRefused("t1", "vm", words, Code.PREEMPTION_NOMINATED, retry)
    assert denial.code == 503 and denial.retry_after == retry
    assert denial.status()["details"] == {"retryAfterSeconds": retry}


async def test_P4_the_retry_after_comes_from_the_victims_grace() -> None:
    """With victims named, the Retry-After is the slowest victim's grace still to run
    (`model.retry_after`), at most the step, whatever `retryAfterSeconds` says; the words say
    the same seconds."""
    from model.nomination import Nomination, Victim
    now = datetime(2026, 1, 2, tzinfo=timezone.utc)
    victims = (Victim("s", "a", None, "uid-a", 100, now), Victim("s", "b", None, None, 100, now))
    n = Nomination("t1", "vm", 1000, "n1", (("nvidia.com/H100", 2),), (), victims, now,
                   now + timedelta(minutes=2), 30)
    attempt = Attempt("t1", "vm", "r1", now, None, timedelta(seconds=30), lambda: now)
    waiter = _WithNominations([n], _refused("g1", "refused t1/vm request r1 for now: …",
                                            Code.PREEMPTION_NOMINATED), _refused("g2", None, None))
    vmis = {("s", "a"): {"metadata": {"uid": "uid-a"}, "spec": {"terminationGracePeriodSeconds": 4}},
            ("s", "b"): {"metadata": {"uid": "uid-b"}, "spec": {"terminationGracePeriodSeconds": 3}}}
    waiter.cache.vmis = type("Informer", (), {"get": lambda self, key: vmis.get(key)})()
    with pytest.raises(Denied) as raised:
        await wait_result(waiter, attempt, ("g1", "g2"), 1.0, 30.0)
    assert raised.value.denial.code == 503 and raised.value.denial.retry_after == 4
    assert raised.value.reason.message.endswith("stopping 2 lower-priority VMs on n1 to make room for it "
                                                "(priority 1000): s/a, s/b; its room is held for it, retry in 4s")
