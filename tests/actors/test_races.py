"""B2 under repetition: two admissions racing for the last unit of a node, or for a tenant's
last budget slot, never both succeed — 1,000 races each, in one event loop, each on a fresh
in-memory cluster with its own binder, with seeded write latency and faults so the second
request is often decided while the first one's writes are still in flight."""

from __future__ import annotations

import random

import anyio
import anyio.lowlevel
import pytest

from fakes.memory_store import Faults, MemoryStore
from model.types import Result
from tests.support.binder import fast_config, quiet_logging, running_binder, settle

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"
REPETITIONS = 1000


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def race_store(seed: int, rng: random.Random) -> MemoryStore:
    return MemoryStore(seed=seed, faults=Faults(
        latency=rng.choice([0.0, 0.0, 0.0002]),
        error_rate=rng.choice([0.0, 0.1]),
        conflict_rate=rng.choice([0.0, 0.05]),
    ))


async def race(store: MemoryStore, rng: random.Random, requests: list[tuple[str, str, str]]) -> list[Result]:
    """Issue the requests (namespace, vmi, device) close together; return their results."""
    config = fast_config()
    async with running_binder(store, config) as binder:
        ids = []
        for i, (ns, vmi, dev) in enumerate(requests):
            ids.append((ns, store.request(ns, vmi, [dev]), dev))
            if i == 0 and rng.random() < 0.5:
                await anyio.lowlevel.checkpoint()  # sometimes let the first get a head start
        await settle(store, binder)
    return [store.device((ns, dev)).status.bind_request.result for ns, _, dev in ids]


async def test_B2_two_requests_racing_for_the_last_unit_never_both_succeed() -> None:
    rng = random.Random(20261130)
    wins = 0
    for rep in range(REPETITIONS):
        s = race_store(rep, rng)
        s.add_class("h100", H100)
        s.add_node("n1", {H100: 2})
        for t in ("t1", "t2"):
            s.add_namespace(t)
        s.add_device("t1", "taken", "h100", node="n1")  # one unit left
        s.add_device("t1", "a", "h100")
        s.add_device("t2", "b", "h100")
        results = await race(s, rng, [("t1", "vm-a", "a"), ("t2", "vm-b", "b")])
        assert results.count(Result.SUCCEEDED) <= 1, f"repetition {rep}: both won the last unit"
        assert None not in results, f"repetition {rep}: unanswered {results}"
        assert s.used("n1", H100) <= 2, f"repetition {rep}: node over capacity"
        wins += results.count(Result.SUCCEEDED)
    assert wins == REPETITIONS  # and one always wins: the unit was free


async def test_B2_two_requests_racing_for_a_tenants_last_budget_slot_never_both_succeed() -> None:
    rng = random.Random(4242)
    wins = 0
    for rep in range(REPETITIONS):
        s = race_store(10_000 + rep, rng)
        s.add_class("h100", H100)
        s.add_node("n1", {H100: 4})
        s.add_node("n2", {H100: 4})
        s.add_namespace("t")
        s.add_budget("t", H100, 2)
        s.add_device("t", "held", "h100", node="n2")  # one slot left
        s.add_device("t", "a", "h100")
        s.add_device("t", "b", "h100")
        results = await race(s, rng, [("t", "vm-a", "a"), ("t", "vm-b", "b")])
        assert results.count(Result.SUCCEEDED) <= 1, f"repetition {rep}: both won the last slot"
        assert None not in results, f"repetition {rep}: unanswered {results}"
        assert s.tenant_bound("t", H100) <= 2, f"repetition {rep}: tenant over budget"
        wins += results.count(Result.SUCCEEDED)
    assert wins == REPETITIONS
