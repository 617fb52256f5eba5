"""The webhook's waits on its cache (`k8s.webhook.waiter.until`; DR5's records, `VMIAdmission._wire`) on the in-memory store and fake
time: a wait is judged once, then again only when a change it names comes — it ends at the
very moment of that change, not at the next tick of a timer — and it gives up exactly at its
bound. A change made between the judgement and the wait is not lost, and no wait leaves a
subscription behind, whether it returns, times out or is cancelled."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import anyio
import pytest

from fakes.kube_client import ScriptedClient
from fakes.memory_store import MemoryStore
from k8s.webhook import steps
from k8s.webhook.admission import VMIAdmission, _Judged
from k8s.webhook.steps import Api, Attempt, Denied, create_template
from k8s.webhook.waiter import TEMPLATE_WAIT, until
from model.admission import AdmissionPlan
from model.housekeeping import VMIs
from model.reasons import DeviceUnrecorded
from model.types import DeviceStatus, GPUDevice, Phase
from tests.support.dra_worlds import device_class, dra_node, recorded
from tests.timing import FAKE_TIME
from tests.support.webhook_cache import StoreCache

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
H100 = device_class()


@pytest.fixture
def anyio_backend():
    return FAKE_TIME  # a wait's end is read off the loop's clock, in no wall time


def _device(name: str, cls: str = "h100") -> GPUDevice:
    return GPUDevice("t", name, cls)


class _Probe:
    """`ready` for `until`: the device `t/name` of `store`, counting its judgements."""

    def __init__(self, store: MemoryStore, name: str) -> None:
        self.store, self.key, self.calls = store, ("t", name), 0

    def __call__(self) -> GPUDevice | None:
        self.calls += 1
        return self.store.device(self.key)

    def relevant(self, change) -> bool:
        return change == ("device", self.key)


async def _later(seconds: float, fn, *args) -> None:
    await anyio.sleep(seconds)
    fn(*args)


# -- until: the wait itself ------------------------------------------------------------------

async def test_a_wait_ends_at_the_change_it_names_not_at_a_timer_tick():
    store = MemoryStore()
    probe = _Probe(store, "a")
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_later, 0.3, store.put_device, _device("other"))  # not named: no judgement
        tg.start_soon(_later, 1.2345, store.put_device, _device("a"))
        got = await until(store, probe, 10, relevant=probe.relevant)
    assert got == _device("a")
    assert anyio.current_time() - t0 == pytest.approx(1.2345, abs=1e-9)  # a poll: 1.25 or 1.24
    assert probe.calls == 2  # judged when the wait began and when its change came: never between
    assert store.subscriptions() == 0


async def test_a_wait_for_any_change_is_woken_by_any_and_a_burst_is_one_wake_up():
    store = MemoryStore()
    calls = []

    def ready() -> int | None:
        calls.append(anyio.current_time())
        return len(calls) if len(calls) == 2 else None
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_later, 0.5, lambda: [store.put_device(_device(n)) for n in "xyz"])
        assert await until(store, ready, 10) == 2
    assert [t - t0 for t in calls] == pytest.approx([0, 0.5])


async def test_a_wait_gives_up_exactly_at_its_bound():
    store = MemoryStore()
    probe = _Probe(store, "a")
    t0 = anyio.current_time()
    assert await until(store, probe, 2.5, relevant=probe.relevant) is None
    assert anyio.current_time() - t0 == pytest.approx(2.5, abs=1e-9)
    assert probe.calls == 2  # when it began, and once more at the bound
    assert store.subscriptions() == 0


async def test_a_bound_already_past_judges_once_without_waiting():
    store = MemoryStore()
    probe = _Probe(store, "a")
    t0 = anyio.current_time()
    assert await until(store, probe, -1.0, relevant=probe.relevant) is None
    assert anyio.current_time() == t0
    store.put_device(_device("a"))
    assert await until(store, probe, 0.0, relevant=probe.relevant) == _device("a")


async def test_a_change_between_the_judgement_and_the_wait_is_not_lost():
    """The subscription starts before the first judgement: a change made right after it
    (here by the judgement itself, the worst moment) is waiting when the wait begins."""
    store = MemoryStore()
    probe = _Probe(store, "a")

    def racing() -> GPUDevice | None:
        got = probe()
        if probe.calls == 1:
            store.put_device(_device("a"))  # the informer's event, just after the look
        return got
    t0 = anyio.current_time()
    assert await until(store, racing, 10, relevant=probe.relevant) == _device("a")
    assert anyio.current_time() == t0  # woken at once, not at the bound


async def test_a_cancelled_wait_leaves_no_subscription():
    store = MemoryStore()
    probe = _Probe(store, "a")
    with anyio.move_on_after(1.0) as scope:
        await until(store, probe, 10, relevant=probe.relevant)
    assert scope.cancelled_caught
    assert store.subscriptions() == 0
    store.put_device(_device("a"))  # nobody is told any more
    assert probe.calls == 1


# -- W3 (1)-(2): the template device this call created is written as the create returned it ---

def _made(name: str, version: str) -> dict:
    return {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": name, "namespace": "t", "resourceVersion": version,
                         "labels": {"gpu.cozystack.io/template-for": "vm"}},
            "spec": {"class": "h100"}}


def _attempt() -> Attempt:
    return Attempt("t", "vm", "adm-1", NOW, VMIs(), timedelta(seconds=30), lambda: NOW)


async def test_W3_a_template_is_created_without_waiting_for_the_informer():
    client = ScriptedClient(latency=0.0123)
    client.script("create", _made("vm-gpu-0", "41"))
    t0 = anyio.current_time()
    made = await create_template(Api(client), "t", "vm", "vm-gpu-0", "h100")
    assert anyio.current_time() - t0 == pytest.approx(0.0123, abs=1e-9)  # the create alone
    assert made["metadata"]["resourceVersion"] == "41"
    assert [c.method for c in client.calls] == ["create"]


async def test_W3_the_attachment_is_written_on_the_created_object_without_a_read():
    client = ScriptedClient()
    client.script("create", _made("vm-gpu-0", "41"))
    written = steps.Written()
    attempt = _attempt()
    await steps.create_templates(Api(client), attempt, (("vm-gpu-0", "h100"),), written)
    await steps.attach(Api(client), attempt, {"id": "adm-1"}, "vm-gpu-0", "h100", written)
    assert [c.method for c in client.calls] == ["create", "patch_status"]
    ops = client.of("patch_status")[0][3]
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert ops[1]["path"] == "/status" and ops[1]["value"]["bindRequest"] == {"id": "adm-1"}
    assert (written.created, written.made) == (["vm-gpu-0"], {})


async def test_W3_a_created_object_changed_since_is_read_again_and_written_on_the_read():
    from k8s import errors

    client = ScriptedClient()
    client.script("create", _made("vm-gpu-0", "41"))
    client.script("patch_status", errors.Invalid("patch", 422, "test failed", reason="Invalid"))
    client.script("get", _made("vm-gpu-0", "42"))
    written = steps.Written()
    attempt = _attempt()
    await steps.create_templates(Api(client), attempt, (("vm-gpu-0", "h100"),), written)
    await steps.attach(Api(client), attempt, {"id": "adm-1"}, "vm-gpu-0", "h100", written)
    assert [c.method for c in client.calls] == ["create", "patch_status", "get", "patch_status"]
    assert [a[3][0]["value"] for a in client.of("patch_status")] == ["41", "42"]


# -- DR5: the records of a device-mode set, after the binder answered -------------------------

def _admission(store: MemoryStore, client: ScriptedClient, monkeypatch, **kw) -> VMIAdmission:
    async def attached(*a, **k) -> None:       # W3 (2)/(3): their own tests
        return None

    async def succeeded(*a, **k) -> str:       # W3 (4): the binder answered Succeeded on n1
        return "n1"
    monkeypatch.setattr(steps, "attach_all", attached)
    monkeypatch.setattr(steps, "wait_result", succeeded)
    return VMIAdmission(client, StoreCache(store), bind_timeout=5.0,  # type: ignore[arg-type]
                        grace=timedelta(seconds=30), clock=lambda: NOW, **kw)


def _unrecorded_world() -> MemoryStore:
    """Node n1 in device mode; member gpu-a Bound there without its record yet."""
    store = MemoryStore()
    store.put_class(H100)
    store.put_node(dra_node("n1"))
    store.put_device(GPUDevice("t1", "gpu-a", H100.name, status=DeviceStatus(Phase.BOUND, "n1")))
    return store


def _judged(store: MemoryStore) -> _Judged:
    plan = AdmissionPlan("t1", "vm", ("gpu-a",), (), "n1")
    attempt = Attempt("t1", "vm", "adm-2", NOW, VMIs(), timedelta(seconds=30), lambda: NOW)
    return _Judged(plan, (), store.snapshot(), attempt)


REVIEW = SimpleNamespace(uid="u", object={"metadata": {"name": "vm"}, "spec": {}}, tolerations=())


async def test_DR5_the_wait_for_a_record_ends_when_the_informer_shows_it(monkeypatch):
    store = _unrecorded_world()
    client = ScriptedClient()
    adm = _admission(store, client, monkeypatch)
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_later, 0.7123, store.put_device, recorded("t1", "gpu-a", "n1", 3))
        node, ops = await adm._reserve(REVIEW, _judged(store), t0 + 5)
    assert node == "n1"
    assert anyio.current_time() - t0 == pytest.approx(0.7123, abs=1e-9)
    assert [c.method for c in client.calls] == ["create"]  # the claim, once the record came
    assert any(op["path"] == "/spec/resourceClaims" for op in ops)
    assert store.subscriptions() == 0


async def test_DR5_a_record_never_shown_is_denied_at_the_record_wait_before_the_deadline(
        monkeypatch):
    store = _unrecorded_world()
    client = ScriptedClient()
    client.script("get", None)  # W5's clean-up reads the device
    adm = _admission(store, client, monkeypatch, record_wait=1.5)
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_later, 1.0, store.put_device,  # a change of the member, still no record
                      GPUDevice("t1", "gpu-a", H100.name, status=DeviceStatus(Phase.BOUND, "n1"),
                                resource_version="2"))
        with pytest.raises(Denied) as raised:
            await adm._reserve(REVIEW, _judged(store), t0 + 5)
    assert raised.value.reason == DeviceUnrecorded("gpu-a", "n1", None)
    assert anyio.current_time() - t0 == pytest.approx(1.5, abs=1e-9)
    assert "create" not in [c.method for c in client.calls]
    assert store.subscriptions() == 0


# -- the two bounds are settings, with the defaults they had ---------------------------------

def test_the_waits_bounds_are_settings_with_their_former_defaults():
    """`--webhook-template-wait` is deprecated (W3 (1) waits no more) but still accepted and
    validated as before, so existing flags and environments keep working."""
    from k8s.config import default, field_help, load

    assert default("webhook_template_wait") == TEMPLATE_WAIT == 5.0   # W3 (1)'s former 5 s
    assert "deprecated, no effect" in field_help("webhook_template_wait")
    assert default("webhook_record_wait") == 0.0                      # DR5: the deadline
    assert "(default: 5)" in field_help("webhook_template_wait")
    cfg = load(None, env={}, flags={"webhook_port": "0", "webhook_template_wait": "2.5",
                                    "webhook_record_wait": "3"})
    assert (cfg.webhook_template_wait, cfg.webhook_record_wait) == (2.5, 3.0)
    for name, value in (("webhook_template_wait", "0"), ("webhook_record_wait", "-1")):
        with pytest.raises(ValueError, match="--" + name.replace("_", "-")):
            load(None, env={}, flags={"webhook_port": "0", name: value})
