"""`VMIAdmission`'s budget with the tenant's admissions in progress counted (issue 23, the
noisy neighbour): a burst of one tenant racing for its own budget is answered 429 at once,
before any turn of the fair share, instead of waiting (each wait holds the API server's seat
of that create, which another tenant's create needs). On a fake cache and a stand-in for the
admission itself (`_admit`, held until released): no API server, no I/O."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import anyio
import orjson
import pytest

from fakes.kube_client import ScriptedClient
from k8s.webhook.admission import VMIAdmission
from model.reasons import BudgetInFlight
from k8s.webhook.fairness import TenantGate
from k8s.webhook.review import Category, decode
from model.admission import LauncherDefaults
from model.housekeeping import VMIs
from model.reasons import Code
from model.snapshot import Snapshot
from model.types import Budget, DeviceStatus, GPUClass, GPUDevice, Node, Phase
from tests.timing import FAKE_TIME

H100 = "nvidia.com/H100"
KV = (("kubevirt.io/schedulable", "true"),)
TEMPLATES = "gpu.cozystack.io/templates"


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


pytestmark = pytest.mark.anyio


class _Listeners:
    def add_listener(self, fn) -> None:  # ResultWaiter registers; nothing is delivered here
        pass


class FakeCache:
    """What VMIAdmission reads of `k8s.cache.ClusterCache` before any API call: a snapshot
    (one node of 8 H100, tenants t1 and t2 with budget 4 each), no VMIs, no KubeVirt CR."""

    def __init__(self) -> None:
        self.snap = Snapshot.build(
            nodes=[Node("n1", KV, allocatable=((H100, 8),))],
            classes=[GPUClass("h100", H100)], devices=[],
            budgets=[Budget("t1", H100, 4), Budget("t2", H100, 4)])
        self.view = SimpleNamespace(snapshot=lambda: self.snap)
        self.devices = _Listeners()

    def vmi_state(self) -> VMIs:
        return VMIs()

    def launcher_defaults(self) -> LauncherDefaults:
        return LauncherDefaults()

    def permitted_resources(self):
        return None


def review(ns: str, name: str, gpus: int):
    """A decoded VMI CREATE review of `ns/name` asking for `gpus` templates of class h100."""
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"{ns}-{name}", "operation": "CREATE", "namespace": ns, "name": name,
        "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
        "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                   "metadata": {"name": name, "namespace": ns,
                                "annotations": {TEMPLATES: f"h100={gpus}"}},
                   "spec": {}},
        "userInfo": {"username": "u"}}}
    return decode(orjson.dumps(doc))


class Harness:
    """VMIAdmission on FakeCache whose `_admit` (W1 live read to W3) is a stand-in: it
    records the VMI and returns an allow once `release` is set; `answers` collects what
    `handle` returned per VMI name."""

    def __init__(self) -> None:
        self.cache = FakeCache()
        self.adm = VMIAdmission(ScriptedClient(), self.cache, bind_timeout=10.0,  # type: ignore[arg-type]
                                grace=timedelta(minutes=2),
                                clock=lambda: datetime(2026, 12, 2, tzinfo=timezone.utc),
                                gate=TenantGate(capacity=8, per_tenant=4, queue=16,
                                                max_wait=5.0))
        self.release = anyio.Event()
        self.admitting: list[str] = []
        self.answers: dict[str, dict] = {}

        async def admit(rv, deadline):
            self.admitting.append(rv.name)
            await self.release.wait()
            return {"uid": rv.uid, "allowed": True}
        self.adm._admit = admit  # type: ignore[method-assign]

    async def handle(self, rv) -> None:
        self.answers[rv.name] = await self.adm.handle(rv)


def status(answer: dict) -> tuple[bool, int]:
    return answer["allowed"], answer.get("status", {}).get("code", 0)


async def test_a_set_that_only_the_tenants_admissions_in_progress_leave_no_room_for_is_429_at_once():
    h = Harness()
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.handle, review("t1", "first", 4))     # the whole budget, in progress
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(1):                             # answered without waiting
            await h.handle(review("t1", "second", 4))
            await h.handle(review("t1", "third", 1))
        assert h.admitting == ["first"]
        for name in ("second", "third"):
            assert status(h.answers[name]) == (False, 429)
        msg = h.answers["second"]["status"]["message"]
        assert msg == str(BudgetInFlight("t1", H100, 0, 4, 4, 4, 1, retry_after=1))
        assert "fair share" in msg and "retry after 1 s" in msg
        assert h.adm.rejected[("t1", Code.BUDGET_IN_FLIGHT)] == 2
        assert h.adm.gate.statistics().tenants == {"t1": (1, 0)}  # never queued for a turn
        tg.start_soon(h.handle, review("t2", "other", 4))     # another tenant: its own budget
        await anyio.wait_all_tasks_blocked()
        assert h.admitting == ["first", "other"]
        h.release.set()
    assert status(h.answers["first"]) == status(h.answers["other"]) == (True, 0)
    assert h.adm._claims == {}                                 # released with the admissions
    h.release = anyio.Event()
    h.release.set()
    await h.handle(review("t1", "second", 4))                  # the retry, once it is over
    assert status(h.answers["second"]) == (True, 0)


async def test_sets_that_fit_the_budget_together_are_not_refused_and_bound_units_count_once():
    h = Harness()
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.handle, review("t1", "a", 2))
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(h.handle, review("t1", "b", 2))          # 2 + 2 <= 4: both admit
        await anyio.wait_all_tasks_blocked()
        assert h.admitting == ["a", "b"]
        # a's devices Bound meanwhile: used 2 (a), held 2 (b); a is not counted twice
        h.cache.snap = h.cache.snap.with_devices(
            GPUDevice("t1", f"a-h100-{i}", "h100",
                      status=DeviceStatus(phase=Phase.BOUND, node_name="n1"))
            for i in range(2))
        with anyio.fail_after(1):
            await h.handle(review("t1", "c", 1))               # 2 used + 2 held + 1 > 4
        assert status(h.answers["c"]) == (False, 429)
        assert h.answers["c"]["status"]["message"] == str(
            BudgetInFlight("t1", H100, 2, 2, 4, 1, 2, retry_after=1))
        h.release.set()
    assert status(h.answers["a"]) == status(h.answers["b"]) == (True, 0)


async def test_a_set_over_the_budget_on_the_cache_alone_is_still_w1s_403():
    h = Harness()
    await h.handle(review("t1", "big", 5))
    assert status(h.answers["big"]) == (False, 403)
    assert h.admitting == [] and h.adm._claims == {}
    assert Category.THROTTLED.value == BudgetInFlight.code.category.value


async def test_another_try_of_the_same_vmi_is_not_refused_for_the_budget_its_first_try_holds():
    h = Harness()
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.handle, review("t1", "vm", 4))
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(h.handle, review("t1", "vm", 4))   # a retry: W4 and same_name_conflict's
        await anyio.wait_all_tasks_blocked()
        assert h.admitting == ["vm", "vm"]
        h.release.set()
    assert h.adm._claims == {}


async def test_a_turn_is_waited_for_while_the_reviews_deadline_allows_then_429_with_retry_after():
    """Issue 31: no fixed line or wait; a review waits for a turn during the first three
    quarters of the bind timeout (10 s here), then is answered 429 `tenant_busy` whose status
    carries `details.retryAfterSeconds` (kube-apiserver's Retry-After)."""
    from k8s.webhook.admission import AFTER_TURN
    from tests.timing import advance

    h = Harness()
    h.adm.gate = TenantGate(capacity=1, per_tenant=1)  # the shipped defaults: no queue, no cap
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.handle, review("t1", "first", 1))    # holds the one turn
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(h.handle, review("t2", "second", 1))   # waits for it
        await advance(10 * (1 - AFTER_TURN) - 0.01)
        assert "second" not in h.answers and h.adm.gate.statistics().waiting == 1
        await advance(0.02)
        assert h.answers["second"]["status"] == {
            "code": 429, "reason": "TooManyRequests", "details": {"retryAfterSeconds": 1},
            "message": "tenant t2 has 0 GPU admissions in progress at this busy gpu-binder "
                       "replica and this one waited 7.5 s for a turn of its fair share; too "
                       "many requests, retry after 1 s"}
        assert h.adm.rejected[("t2", Code.TENANT_BUSY)] == 1
        h.release.set()
    assert status(h.answers["first"]) == (True, 0)
