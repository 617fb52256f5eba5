"""The Lease loop (k8s.leader) against an in-memory Lease API that can be made to fail:
one leader at a time, leadership dropped before the Lease can expire, release on exit."""

from __future__ import annotations

import copy

import anyio
import orjson
import pytest
from kubernetes_asyncio.client import ApiException

from k8s.leader import LeaderElector, LeaseConfig

pytestmark = pytest.mark.anyio
CFG = LeaseConfig(namespace="ns", name="lease", lease_duration=1.5, renew_deadline=1.0,
                  retry_period=0.2)


class _Resp:
    def __init__(self, status: int, body: dict) -> None:
        self.status, self.reason, self.headers = status, "", {}
        self._body = orjson.dumps(body)

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


class FakeLeases:
    """The three CoordinationV1Api calls the elector makes, with optimistic concurrency."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.rv = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ApiException(status=503, reason="unavailable")

    async def read_namespaced_lease(self, name, ns, **_):
        self._check()
        if self.lease is None:
            return _Resp(404, {"code": 404})
        return _Resp(200, copy.deepcopy(self.lease))

    async def create_namespaced_lease(self, ns, body, **_):
        self._check()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)

    async def replace_namespaced_lease(self, name, ns, body, **_):
        self._check()
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)

    @property
    def holder(self) -> str | None:
        return (self.lease or {}).get("spec", {}).get("holderIdentity") or None


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_one_leader_and_it_stops_leading_before_the_lease_can_expire():
    api = FakeLeases()
    a, b = LeaderElector(api, "a", CFG), LeaderElector(api, "b", CFG)
    leading: dict[str, list[float]] = {"a": [], "b": []}
    stopped: dict[str, float] = {}

    def lead(name: str):
        async def run() -> None:
            leading[name].append(anyio.current_time())
            try:
                await anyio.sleep_forever()
            finally:
                stopped[name] = anyio.current_time()
        return run

    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run, lead("a"))
        await until(lambda: a.is_leader, 2.0, "a leads")
        tg.start_soon(b.run, lead("b"))
        await anyio.sleep(3 * CFG.retry_period)  # b has tried a few times meanwhile
        assert (a.is_leader, b.is_leader, api.holder) == (True, False, "a")
        api.down = True                      # the API server goes away
        outage = anyio.current_time()
        # a drops leadership within the renew deadline (+ one retry), before expiry
        await until(lambda: "a" in stopped and not a.is_leader, CFG.lease_duration,
                    "a stops leading")
        assert not a.is_leader and stopped["a"] - outage < CFG.lease_duration
        api.down = False
        await until(lambda: sum(e.is_leader for e in (a, b)) == 1, 4 * CFG.lease_duration,
                    "one leader again")
        await anyio.sleep(3 * CFG.retry_period)
        assert sum(e.is_leader for e in (a, b)) == 1  # and only one, as renewals go on
        tg.cancel_scope.cancel()
    assert api.holder is None                 # released on shutdown


async def until(cond, timeout: float, what: str) -> None:
    """Poll `cond` every 20 ms; fail with `what` after `timeout` seconds."""
    try:
        with anyio.fail_after(timeout):
            while not cond():
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


async def test_release_lets_a_successor_take_over_without_waiting_for_expiry():
    api = FakeLeases()
    a, b = LeaderElector(api, "a", CFG), LeaderElector(api, "b", CFG)

    async def idle() -> None:
        await anyio.sleep_forever()

    async with anyio.create_task_group() as outer:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.run, idle)
                await until(lambda: a.is_leader, 2.0, "a leads")
                outer.start_soon(b.run, idle)
                await anyio.sleep(0.3)
                assert not b.is_leader
                scope.cancel()                 # a shuts down and releases the Lease
        released = anyio.current_time()
        with anyio.fail_after(CFG.lease_duration - 0.3):
            while not b.is_leader:
                await anyio.sleep(0.05)
        assert anyio.current_time() - released < CFG.lease_duration
        outer.cancel_scope.cancel()
