"""W3 step 4: `k8s.webhook.waiter.ResultWaiter` wakes a wait by its own key when one of the
devices it names changes in the cache, and judges the devices from the cache. The device
informer is stood in for by its listener list; the view is a real `IndexedView`."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from actors.view import IndexedView
from k8s.webhook.waiter import ResultWaiter
from model.types import BindRequest, DeviceStatus, GPUDevice, Result
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME  # a wait that is never woken ends at its timeout, in no wall time


class _Cache:
    def __init__(self) -> None:
        self.view = IndexedView()
        self.listeners: list = []
        self.devices = SimpleNamespace(add_listener=self.listeners.append)

    def put(self, name: str, rid: str | None, result: Result | None = None) -> None:
        br = BindRequest(rid, "vm", ("a", "b"), result=result) if rid else None
        self.view.put_device(GPUDevice("t", name, "h100", None, DeviceStatus(bind_request=br)))
        for fn in self.listeners:
            fn(("t", name), {})


def _two_members_carrying(rid: str) -> tuple[_Cache, ResultWaiter, list]:
    """A cache whose devices a and b carry request `rid` without a result, its waiter, and
    the list `_wait` appends the wait's answer to."""
    cache = _Cache()
    waiter = ResultWaiter(cache)  # type: ignore[arg-type]
    cache.put("a", rid)
    cache.put("b", rid)
    return cache, waiter, []


async def _wait(waiter: ResultWaiter, got: list) -> None:
    got.append(await waiter.wait("t", "r1", ("a", "b"), timeout=5))


async def test_W3_a_wait_returns_once_every_named_device_has_its_result() -> None:
    cache, waiter, got = _two_members_carrying("r1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(_wait, waiter, got)
        await anyio.wait_all_tasks_blocked()
        cache.put("a", "r1", Result.SUCCEEDED)
        cache.put("other", "r9")  # a device the wait does not name
        await anyio.wait_all_tasks_blocked()
        assert got == []  # b has no result yet
        cache.put("b", "r1", Result.SUCCEEDED)
    assert [d.name for d in got[0]] == ["a", "b"]
    assert waiter._by_device == {}  # nothing stays registered


async def test_W5_a_wait_ends_with_none_when_a_member_loses_the_request_or_time_is_up() -> None:
    cache, waiter, got = _two_members_carrying("r1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(_wait, waiter, got)
        await anyio.wait_all_tasks_blocked()
        cache.put("b", None)  # housekeeping cleared it
    assert got == [None]
    assert await waiter.wait("t", "r1", ("a", "b"), timeout=0) is None
