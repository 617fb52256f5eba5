"""The Lease loop (k8s.leader) against an in-memory Lease API that can be made to fail:
one leader at a time, leadership dropped before the Lease can expire, release on exit."""

from __future__ import annotations

import copy

import anyio
import pytest

from k8s import errors
from k8s.leader import LeaderElector, LeaseConfig
from model.serialize import parse_time
from tests.timing import FAKE_TIME, advance, eventually

pytestmark = pytest.mark.anyio
CFG = LeaseConfig(namespace="ns", name="lease", lease_duration=1.5, renew_deadline=1.0,
                  retry_period=0.2)


class FakeLeases:
    """The three Lease calls of `k8s.client.KubeClient` the elector makes, with optimistic
    concurrency, failing as the client does (`k8s.errors`) while `down`."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.rv = 0
        self.down = False
        self.timeouts: set[float] = set()

    def using(self, *, timeout: float | None = None, **_) -> "FakeLeases":
        self.timeouts.add(timeout)
        return self

    def _check(self, what: str) -> None:
        if self.down:
            raise errors.Unavailable(what, 503, "unavailable")

    async def read_lease(self, ns, name):
        self._check("read Lease")
        return copy.deepcopy(self.lease)

    async def create_lease(self, ns, body):
        self._check("create Lease")
        if self.lease is not None:
            raise errors.AlreadyExists("create Lease", 409, "exists", reason="AlreadyExists")
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)

    async def replace_lease(self, ns, name, body):
        self._check("replace Lease")
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise errors.Conflict("replace Lease", 409, "modified", reason="Conflict")
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)

    @property
    def holder(self) -> str | None:
        return (self.lease or {}).get("spec", {}).get("holderIdentity") or None


@pytest.fixture
def anyio_backend():
    return FAKE_TIME  # the Lease loop's timers, renew deadline and expiry on fake time


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
        await eventually(lambda: a.is_leader, 2.0, "a leads")
        assert leading["a"] == [0.0]  # at once: the Lease did not exist
        tg.start_soon(b.run, lead("b"))
        await advance(3 * CFG.retry_period)  # b tries three times meanwhile
        assert (a.is_leader, b.is_leader, api.holder) == (True, False, "a")
        api.down = True                      # the API server goes away
        outage = anyio.current_time()
        # a drops leadership within the renew deadline (+ one retry), before expiry
        await eventually(lambda: "a" in stopped and not a.is_leader, CFG.lease_duration,
                         "a stops leading")
        assert stopped["a"] - outage <= CFG.renew_deadline + CFG.retry_period < CFG.lease_duration
        api.down = False
        await eventually(lambda: sum(e.is_leader for e in (a, b)) == 1, 4 * CFG.lease_duration,
                         "one leader again")
        await advance(3 * CFG.lease_duration)  # renewals go on, the Lease never lapses
        assert sum(e.is_leader for e in (a, b)) == 1 and len(leading["a"]) + len(leading["b"]) == 2
        tg.cancel_scope.cancel()
    assert api.holder is None                 # released on shutdown


async def test_release_lets_a_successor_take_over_without_waiting_for_expiry():
    api = FakeLeases()
    a, b = LeaderElector(api, "a", CFG), LeaderElector(api, "b", CFG)

    async def idle() -> None:
        await anyio.sleep_forever()

    async with anyio.create_task_group() as outer:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.run, idle)
                await eventually(lambda: a.is_leader, 2.0, "a leads")
                outer.start_soon(b.run, idle)
                await advance(CFG.lease_duration)  # b has found the Lease held, over and over
                assert not b.is_leader
                scope.cancel()                 # a shuts down and releases the Lease
        released = anyio.current_time()
        last_renew = api.lease["spec"]["renewTime"]  # a's last renewal, kept by its release
        await eventually(lambda: b.is_leader, CFG.lease_duration, "b leads", interval=0.01)
        # P5: how recent what a published is (b reads its line back only if recent)
        assert a.previous_renew is None and b.previous_renew == parse_time(last_renew) is not None
        # at b's next try, not after the Lease would have expired
        assert anyio.current_time() - released <= CFG.retry_period + 0.01
        outer.cancel_scope.cancel()
    assert api.timeouts == {CFG.retry_period}  # every Lease call bounded by the retry period
