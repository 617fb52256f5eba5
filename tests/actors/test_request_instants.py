"""The leader's wall instants of one request on its log lines (`bench floor`'s split of the
webhook's wait, docs/benchmarks.md), through the real router, coordinator and status pipeline
on the in-memory store, on fake time (the clock `fakes.clock.LoopClock`: EPOCH plus the
loop's time): the `decision` line's `seen_at` (the router found the request complete) and
`batch_at` (its batch started), the `writes_finished` line's `flown_at` (the decision handed
to the pipeline) and `finished_at`; in that order. A request the coordinator queued without
the router (found at its start) has no `seen_at`."""

from __future__ import annotations

import pytest

from fakes.clock import EPOCH
from fakes.memory_store import MemoryStore
from tests.support.binder import quiet_logging, running_binder, settle
from tests.support.logs import captured_logs

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def cluster() -> MemoryStore:
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 4})
    for name in ("a", "b", "c"):
        s.add_device("t", name, "h100")
    return s


def lines(logs: list[dict], event: str, rid: str) -> list[dict]:
    return [e for e in logs if e["event"] == event and e.get("request_id") == rid]


async def test_a_request_the_router_examined_carries_its_instants_in_order() -> None:
    s = cluster()
    with captured_logs() as logs:
        async with running_binder(s) as binder:
            await settle(s, binder)
            rid = s.request("t", "vm", ["a", "b"])
            await settle(s, binder)
    (decision,) = lines(logs, "decision", rid)
    (writes,) = lines(logs, "writes_finished", rid)
    assert writes["outcome"] == "done"
    instants = [decision["seen_at"], decision["batch_at"], writes["flown_at"], writes["finished_at"]]
    assert all(isinstance(t, float) and t >= EPOCH.timestamp() for t in instants)
    assert instants == sorted(instants)


async def test_a_request_found_at_the_coordinators_start_has_no_seen_at() -> None:
    s = cluster()
    rid = s.request("t", "vm", ["c"])      # complete before any replica runs: no Examine
    with captured_logs() as logs:
        async with running_binder(s) as binder:
            await settle(s, binder)
    (decision,) = lines(logs, "decision", rid)
    assert decision["seen_at"] is None and isinstance(decision["batch_at"], float)
    (writes,) = lines(logs, "writes_finished", rid)
    assert decision["batch_at"] <= writes["flown_at"] <= writes["finished_at"]
