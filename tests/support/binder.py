"""Helpers shared by the actor and supervisor tests: a running Binder on a MemoryStore, fast
configurations, waiting until settled, and the invariant checks of docs/contract.md §7 over the
store's state and write history. Not a test module (no `test_` prefix)."""

from __future__ import annotations

from collections import defaultdict
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio

from actors.coordinator_protocol import CoordinatorConfig
from fakes.clock import LoopClock
from fakes.memory_store import MemoryStore
from actors.node_actor import NodeActorConfig
from actors.status_pipeline import PipelineConfig
from model.requests import find_requests
from model.types import Result
from supervisor import Binder, BinderConfig, SupervisorConfig
from tests.timing import eventually


def fast_config(**overrides) -> BinderConfig:
    """Small timings so tests run in milliseconds; a generous restart intensity."""
    coordinator = CoordinatorConfig(ask_timeout=2.0, requeue_delay=0.002, stalled_delay=0.01,
                                    resync_interval=0.5, missing_grace=0.2, missing_retry=0.02)
    pipeline = PipelineConfig(write_timeout=2.0, retry_attempts=5, retry_initial=0.001,
                              retry_max=0.005, retry_jitter=0.001, settle_timeout=5.0)
    node = NodeActorConfig(prepare_ttl=2.0, commit_ttl=30.0, sweep_interval=0.25)
    sup = SupervisorConfig(max_restarts=1000, max_seconds=1.0, backoff_initial=0.001,
                           backoff_max=0.01)
    base = dict(supervisor=sup, node=node, coordinator=coordinator, pipeline=pipeline,
                shutdown=1.0)
    base.update(overrides)
    return BinderConfig(**base)


@asynccontextmanager
async def running_binder(store: MemoryStore, config: BinderConfig | None = None,
                         clock=None, observer=None, nominations=None,
                         published=None) -> AsyncIterator[Binder]:
    """A Binder running on `store` for the duration of the block; cancelled after it. Its
    clock is `clock`, else the event loop's (`LoopClock`: fake on fake time); `observer`,
    when given, is the Binder's observer (metrics hooks); `nominations` its nomination
    writer (§3c P4; None: it nominates nobody); `published` what its coordinators read back
    of the waiting line's published summaries (§3c P5; None: nothing)."""
    binder = Binder(store, store, store, clock or LoopClock(), config or fast_config(),
                    observer=observer, nominations=nominations, published=published)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        try:
            yield binder
        finally:
            tg.cancel_scope.cancel()


def results_of(store: MemoryStore, namespace: str, request_id: str) -> dict[str, tuple]:
    """device name -> (result, node, phase, nodeName) of the members carrying `request_id`."""
    out = {}
    for dev in store.request_members(namespace, request_id):
        br = dev.status.bind_request
        out[dev.name] = (br.result, br.node, dev.status.phase.value, dev.status.node_name)
    return out


def all_answered(store: MemoryStore) -> bool:
    """True when no complete request lacks a result on some member."""
    complete, _ = find_requests(store.devices().values())
    return not complete


async def settle(store: MemoryStore, binder: Binder, timeout: float = 10.0) -> None:
    """Wait until every complete request is answered, the coordinator is idle and its
    pipeline has no request in flight."""
    def idle() -> bool:
        ref, pipe = binder.coordinator, binder.pipeline
        if ref is None or pipe is None or ref.statistics().mailbox_depth:
            return False
        p = pipe.statistics()
        if p.reservations or p.mailbox_depth:
            return False
        return all_answered(store)
    await eventually(idle, timeout, "every complete request answered and no reservation left",
                     interval=0.005)


def check_invariants(store: MemoryStore, *, withdrawn: set[str] = frozenset(),
                     initial_over: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Invariants 1–4 of docs/contract.md §7 over the final state and the write history.

    1 capacity: every bind write left its node within allocatable (checked on the history
      replayed over the initial state is too costly; the chaos test checks it live through
      `store.on_write`; here the final state is checked).
    2 every complete request not withdrawn has a result on every member.
    3 Succeeded ⇒ every member Bound on the result node; Refused ⇒ no member moved by it;
      exactly one (result, node) per member and request in the history.
    4 no tenant over budget.
    """
    problems: list[str] = []
    classes = store.classes()
    # 1: final state
    for node in store.nodes().values():
        for res, alloc in node.allocatable:
            used = store.used(node.name, res)
            if used > alloc and (node.name, res) not in initial_over:
                problems.append(f"inv1: node {node.name} {res}: {used} bound > {alloc}")
    # 2
    complete, _ = find_requests(store.devices().values())
    for req in complete:
        if req.id not in withdrawn:
            problems.append(f"inv2: request {req.namespace}/{req.id} lacks results")
    # 3: history
    results: dict[tuple, set] = defaultdict(set)
    binds: dict[str, list] = defaultdict(list)
    for rec in store.history:
        if rec.op == "answer":
            results[(rec.key, rec.request_id)].add((rec.result, rec.node))
        if rec.moved:
            binds[rec.request_id].append(rec)
    for (key, rid), seen in results.items():
        if len(seen) != 1:
            problems.append(f"inv3: {key} request {rid} got several results {sorted(map(str, seen))}")
        (result, node), = list(seen)[:1] or [(None, None)]
        if result is Result.REFUSED and binds.get(rid):
            problems.append(f"inv3: refused request {rid} moved {[b.key for b in binds[rid]]}")
        if result is Result.SUCCEEDED:
            for b in binds.get(rid, []):
                if b.node != node:
                    problems.append(f"inv3: request {rid} bound {b.key} on {b.node}, result on {node}")
    for dev in store.devices().values():
        br = dev.status.bind_request
        if br is None or br.result is None:
            continue
        if br.result is Result.SUCCEEDED and dev.bound_node != br.node:
            problems.append(f"inv3: {dev.key} Succeeded on {br.node} but Bound on {dev.bound_node}")
    # 4
    for budget in store.budgets():
        bound = store.tenant_bound(budget.namespace, budget.resource_name)
        if bound > budget.hard:
            problems.append(f"inv4: tenant {budget.namespace} {budget.resource_name}: {bound} > {budget.hard}")
    del classes
    return problems


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def quiet_logging(level: int = 30) -> None:
    """Configure the binder's logging to discard lines below `level` (default WARNING) and
    everything else too: tests that check logs configure their own stream."""
    from actors.logging import configure_logging

    configure_logging(stream=_Discard(), level=level)  # type: ignore[arg-type]


def kill_child(binder: Binder, child_id: str, reason: str = "killed by a test") -> bool:
    """Crash one child of the running `binder` now, through its supervisor's public API
    (`Supervisor.kill`): `COORDINATOR` or `PIPELINE` (either restarts both, one group) or
    `node_child_id(n)`. The supervisor restarts it, counted against the restart intensity.
    False when the binder is not running or the child is not (unknown, or between
    incarnations)."""
    sup = binder.supervisor
    return sup is not None and sup.kill(child_id, reason)
