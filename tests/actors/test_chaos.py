"""Seeded chaos: many tenants race for scarce capacity while actors die and writes fail.

Per seed: ≥20 nodes, ≥200 requests from many tenants (held devices, some Bound, plus fresh
template devices), budgets; node actors, the coordinator and its status pipeline (the
writer) are killed at random, and the coordinator or the pipeline also right after a
placement write of a request with more to come (between its first and last placement
write, B7; either restarts both, their group); nodes are cordoned and uncordoned; writes fail at
random (errors, conflicts, ambiguous errors applied-then-failed); some requests are
withdrawn mid-way. Invariants 1
and 4 of DESIGN.md §7 are checked on every placement write; after quiescence, 1–4 over the
final state and the write history, and every complete request has exactly one result on
every member. Run more seeds with `--chaos-seeds=N`, one with `--chaos-first-seed=S
--chaos-seeds=1`.
"""

from __future__ import annotations

import random
from collections import defaultdict

import anyio
import pytest

from fakes.memory_store import Faults, MemoryStore, WriteRecord
from model.types import OnCordon, Result
from supervisor import COORDINATOR, PIPELINE, node_child_id
from tests.actors_harness import check_invariants, fast_config, quiet_logging, running_binder, settle

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()

RESOURCES = {"h100": "nvidia.com/H100", "l40s": "nvidia.com/L40S"}


class World:
    """The seeded scenario plus the live invariant checks."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        rng = self.rng
        self.store = MemoryStore(seed=seed, faults=Faults(
            error_rate=rng.choice([0.0, 0.05, 0.1]),
            conflict_rate=rng.choice([0.0, 0.03]),
            ambiguous_rate=rng.choice([0.0, 0.03]),
            latency=rng.choice([0.0, 0.0, 0.0005]),
        ))
        s = self.store
        s.add_class("h100", RESOURCES["h100"], on_cordon=OnCordon.MOVE)
        s.add_class("l40s", RESOURCES["l40s"], on_cordon=OnCordon.STAY)
        self.nodes = [f"node-{i:02d}" for i in range(rng.randint(20, 24))]
        self.alloc: dict[tuple[str, str], int] = {}
        for name in self.nodes:
            alloc = {}
            for cls, res in RESOURCES.items():
                units = rng.choice([0, 1, 2, 2, 3, 4])
                if units:
                    alloc[res] = units
                    self.alloc[(name, res)] = units
            s.add_node(name, alloc, labels={"zone": rng.choice(["a", "b"])})
        self.tenants = [f"tenant-{i}" for i in range(rng.randint(6, 10))]
        self.budget: dict[tuple[str, str], int] = {}
        for t in self.tenants:
            s.add_namespace(t)
            for res in RESOURCES.values():
                if rng.random() < 0.5:
                    self.budget[(t, res)] = rng.randint(2, 8)
        for (t, res), hard in self.budget.items():
            s.add_budget(t, res, hard)
        # Held devices: some Bound where there is room (and budget), the rest Pending.
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.tenant_used: dict[tuple[str, str], int] = defaultdict(int)
        self.held: dict[str, list[str]] = {t: [] for t in self.tenants}
        for t in self.tenants:
            for i in range(rng.randint(2, 5)):
                cls = rng.choice(list(RESOURCES))
                res = RESOURCES[cls]
                node = None
                if rng.random() < 0.6:
                    room = [n for n in self.nodes if self.alloc.get((n, res), 0) > self.used[(n, res)]]
                    within = self.tenant_used[(t, res)] < self.budget.get((t, res), 10**9)
                    if room and within:
                        node = rng.choice(room)
                        self.used[(node, res)] += 1
                        self.tenant_used[(t, res)] += 1
                s.add_device(t, f"held-{i}", cls, node=node)
                self.held[t].append(f"held-{i}")
        self.busy: dict[tuple[str, str], str] = {}  # held device -> its unanswered request
        self.issued: list[tuple[str, str, list[str]]] = []
        self.withdrawn: set[str] = set()
        self.violations: list[str] = []
        self.binds_by_request: dict[str, int] = defaultdict(int)
        self.mid_kills = 0
        self.mid_killed: set[str] = set()
        self.binder = None
        self.store.on_write = self.on_write

    def fail(self, message: str) -> str:
        return f"chaos seed {self.seed}: {message}"

    def on_write(self, rec: WriteRecord) -> None:
        """Invariants 1 and 4 on every placement write; kills between placement writes."""
        if not rec.moved:
            return
        dev = self.store.device(rec.key)
        res = self.store.classes()[dev.class_name].resource_name
        if rec.from_node is not None:
            self.used[(rec.from_node, res)] -= 1
        else:
            self.tenant_used[(dev.namespace, res)] += 1
        self.used[(rec.node, res)] += 1
        if self.used[(rec.node, res)] > self.alloc.get((rec.node, res), 0):
            self.violations.append(f"inv1: bind {rec.key} of {rec.request_id} put {rec.node} "
                                   f"over {res}: {self.used[(rec.node, res)]}")
        hard = self.budget.get((dev.namespace, res))
        if hard is not None and self.tenant_used[(dev.namespace, res)] > hard:
            self.violations.append(f"inv4: bind {rec.key} of {rec.request_id} put "
                                   f"{dev.namespace} over {res}")
        self.binds_by_request[rec.request_id] += 1
        # Kill the coordinator or the pipeline (the writer) right after a placement write of
        # a request with more placement writes to come (B7: the next incarnation of the
        # pair must finish it on that node).
        if self.binder is not None and (self.mid_kills == 0 or self.rng.random() < 0.1):
            to_come = [m for m in self.store.request_members(dev.namespace, rec.request_id)
                       if m.bound_node != rec.node]
            victim = self.rng.choice([COORDINATOR, PIPELINE])
            if to_come and self.binder.kill(victim, "chaos: between placement writes"):
                self.mid_kills += 1
                self.mid_killed.add(rec.request_id)

    def new_request(self, n: int) -> tuple[str, str, list[str]] | None:
        rng, s = self.rng, self.store
        t = rng.choice(self.tenants)
        free_held = [d for d in self.held[t] if (t, d) not in self.busy]
        names: list[str] = []
        for d in rng.sample(free_held, k=min(len(free_held), rng.choice([0, 0, 1, 2]))):
            names.append(d)
        for j in range(rng.choice([1, 1, 2]) if len(names) < 3 else 0):
            cls = rng.choice(list(RESOURCES))
            name = f"tpl-{n}-{j}"
            s.add_device(t, name, cls, template_for=f"vm-{n}")
            names.append(name)
        sel = {"zone": rng.choice(["a", "b"])} if rng.random() < 0.1 else None
        rid = f"r{n:04d}"
        s.request(t, f"vm-{n}", names, request_id=rid, node_selector=sel)
        for d in names:
            if d.startswith("held-"):
                self.busy[(t, d)] = rid
        return t, rid, names

    def release_answered(self) -> None:
        for t, rid, names in self.issued:
            members = self.store.request_members(t, rid)
            if not members or all(m.status.bind_request.result is not None for m in members):
                for d in names:
                    if self.busy.get((t, d)) == rid:
                        del self.busy[(t, d)]


async def chaos_run(seed: int) -> World:
    world = World(seed)
    rng = world.rng
    n_requests = 200
    kill_stop = anyio.Event()

    async def killer() -> None:
        nodes = [node_child_id(n) for n in world.nodes]
        while not kill_stop.is_set():
            await anyio.sleep(rng.uniform(0.0005, 0.004))
            r = rng.random()
            victim = COORDINATOR if r < 0.15 else PIPELINE if r < 0.25 else rng.choice(nodes)
            world.binder.kill(victim, "chaos")
            if rng.random() < 0.05:  # an operator cordons or uncordons a node (B3, B5)
                node = rng.choice(world.nodes)
                world.store.cordon(node, not world.store.node(node).unschedulable)

    async def withdraw_later(t: str, rid: str) -> None:
        await anyio.sleep(rng.uniform(0, 0.003))
        if world.store.withdraw(t, rid):
            world.withdrawn.add(rid)

    async with running_binder(world.store, fast_config(
        supervisor=fast_config().supervisor.__class__(
            max_restarts=100_000, max_seconds=1.0, backoff_initial=0.0005, backoff_max=0.002),
    )) as binder:
        world.binder = binder
        async with anyio.create_task_group() as tg:
            tg.start_soon(killer)
            for n in range(n_requests):
                if n % 8 == 0:
                    world.release_answered()
                    await anyio.sleep(rng.uniform(0, 0.002))
                issued = world.new_request(n)
                if issued is None:
                    continue
                world.issued.append(issued)
                if rng.random() < 0.04:
                    tg.start_soon(withdraw_later, issued[0], issued[1])
            await anyio.sleep(0.02)
            kill_stop.set()
        world.chaos_done = anyio.current_time()
        await settle(world.store, binder, timeout=30.0)
        world.settled = anyio.current_time()
        world.binder = None
    return world


async def test_chaos_invariants_hold(chaos_seed: int) -> None:
    """Invariants 1–4 (DESIGN.md §7) and exactly one result per member, under chaos."""
    print(f"chaos seed {chaos_seed}")
    try:
        world = await chaos_run(chaos_seed)
    except BaseException as exc:  # the seed must be in the failure, whatever it is
        raise AssertionError(f"chaos seed {chaos_seed}: run failed: {exc!r}") from exc
    s = world.store
    assert not world.violations, world.fail(f"live invariant violations: {world.violations[:5]}")
    problems = check_invariants(s, withdrawn=world.withdrawn)
    assert not problems, world.fail(f"invariants: {problems[:5]}")
    assert len(world.issued) >= 200, world.fail("too few requests")
    # Every complete request not withdrawn: exactly one result on every member, in history.
    written: dict[tuple, set] = defaultdict(set)
    for rec in s.history:
        if rec.op == "answer":
            written[(rec.key, rec.request_id)].add((rec.result, rec.node))
    outcomes = defaultdict(int)
    for t, rid, names in world.issued:
        if rid in world.withdrawn:
            continue
        results = set()
        for d in names:
            seen = written.get(((t, d), rid), set())
            assert len(seen) == 1, world.fail(f"{t}/{d} of {rid}: results {seen}")
            results |= seen
        assert len(results) == 1, world.fail(f"request {rid}: members disagree {results}")
        (result, node), = results
        outcomes[result] += 1
        if result is Result.SUCCEEDED:
            for d in names:
                dev = s.device((t, d))
                br = dev.status.bind_request
                if br is not None and br.id == rid:
                    assert dev.bound_node == node, world.fail(f"{t}/{d} of {rid} not on {node}")
    assert outcomes[Result.SUCCEEDED] > 0, world.fail("nothing succeeded")
    between = [r for r in world.mid_killed if world.binds_by_request[r] > 1]
    assert between, world.fail("no kill landed between the first and the last placement write")
    assert outcomes[Result.REFUSED] > 0, world.fail("nothing refused: capacity is not scarce")
