"""B1(b) against a lagging view: a refusal only for classes or devices the view does not hold
waits for the view (`Coordinator._awaits_view`), the in-memory store standing in for an
informer cache that relists after an outage (`IndexedView.follow_with`). Found in CI: after a
kube-apiserver restart the class informer was still in its backoff when a request for a
class made meanwhile arrived, and the request was refused "class … not found"."""

from __future__ import annotations

import anyio
import pytest

from fakes.memory_store import MemoryStore
from model.reasons import ClassNotFound, DeviceAt, RequestRef, SetRefused
from model.types import Result
from tests.support.binder import fast_config, quiet_logging, results_of, running_binder, settle
from tests.timing import advance, eventually

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def store_without_its_class() -> MemoryStore:
    """Tenant `t`, node n1 with 2 H100, device `new` of class h100, which the view lacks."""
    s = MemoryStore()
    s.add_namespace("t")
    s.add_node("n1", {H100: 2})
    s.add_device("t", "new", "h100")
    return s


async def test_B1_a_class_missing_while_the_view_relists_is_waited_for_and_then_placed() -> None:
    s = store_without_its_class()
    following = False
    s.follow_with(lambda: following)
    cfg = fast_config()
    async with running_binder(s, cfg) as binder:
        rid = s.request("t", "vm", ["new"])
        # while the view does not follow the API server, "not found" is no answer
        await advance(20 * cfg.coordinator.missing_grace)
        assert results_of(s, "t", rid) == {"new": (None, None, "Pending", None)}
        s.add_class("h100", H100)
        following = True
        await settle(s, binder)
        assert results_of(s, "t", rid) == {"new": (Result.SUCCEEDED, "n1", "Bound", "n1")}


async def test_B1_a_class_missing_from_a_following_view_is_refused_after_the_grace() -> None:
    s = store_without_its_class()
    cfg = fast_config()
    grace = cfg.coordinator.missing_grace
    async with running_binder(s, cfg) as binder:
        started = anyio.current_time()
        rid = s.request("t", "vm", ["new"])
        await advance(grace / 2)
        assert results_of(s, "t", rid)["new"][0] is None
        await settle(s, binder)
        waited = anyio.current_time() - started
        got = await eventually(lambda: s.device(("t", "new")).status.bind_request)
        assert got.result is Result.REFUSED
        expected = SetRefused((DeviceAt("new", None),), (ClassNotFound("h100"),),
                              RequestRef("t", "vm", rid))
        assert got.message == expected.render()
        assert grace <= waited < grace + 2 * cfg.coordinator.missing_retry + 0.1, waited
