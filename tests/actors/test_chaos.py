"""Seeded chaos: many tenants race for scarce capacity while actors die and writes fail.

Per seed: ≥20 nodes, ≥200 requests from many tenants (held devices, some Bound, plus fresh
template devices), budgets; node actors, the coordinator and its status pipeline (the
writer) are killed at random, and the coordinator or the pipeline also right after a
placement write of a request with more to come (between its first and last placement
write, B7; either restarts both, their group); nodes are cordoned and uncordoned; writes fail at
random (errors, conflicts, ambiguous errors applied-then-failed); some requests are
withdrawn mid-way. Invariants 1
and 4 of docs/contract.md §7 are checked on every placement write; after quiescence, 1–4 over the
final state and the write history, and every complete request has exactly one result on
every member.

Priorities and preemption (§3c), in every `PRIORITIES_EVERY`-th seed (seed 0 among them): every
request names one of two or three PriorityClasses
(values 100/500/1000, some `preemptionPolicy: Never`), a GPUClass sometimes says
`preemption: Never`, `preemption.minRuntime` is 0 and nominations live `NOMINATION_TTL`. The
binder records its nominations in the store; the leader's preemption worker is played by
`tests.support.preemption.MemoryPreemption` (the production's `model.nomination.sweep`, a uid-
preconditioned VMI delete recorded in the store, then H2's cleanup). A preemptor told
`preemption_nominated` creates its VMI again after a short wait (a new request, as client-go's
retry does), up to `MAX_RETRIES` times; a victim's VM sometimes starts it again (a new
incarnation, which waits like any set). Kill points: the coordinator or the pipeline right
after a nomination is written (before its victims are deleted), and the coordinator right after
a victim's VMI is deleted (before the preemptor is admitted), each with the worker's round
abandoned as a killed leader's would be. P6 (`tests.support.p6`) is checked live:
(a) on every VMI delete: the binder deleted only a victim of a nomination live at that moment;
(b) on every placement and nomination write, and at the end: a live nomination's room is
Bound for nobody but its preemptor and its victims; (c) on every batch the coordinator's line
gate judged (and every fallback it allowed): no placement of a set on node N while a set of
strictly higher priority *waiting* in a GPUClass they share could start on N now and nowhere
once the placement is carried out — *waiting* meaning: an entry of the coordinator's own line
(`model.line.Line`: refused for room by this coordinator incarnation, not started since; a
restart empties it, as a failover does, docs/contract.md §3c), including the entries the same
batch added before the placement; (d) on every nomination written: each victim's recorded
priority strictly below the preemptor's (so two sets of equal priority never preempt each
other), no victim of a `Never` class, no preemptor of policy `Never`, and no live nomination
replaced by another (never doubled); (e) the kills above lose nothing (every invariant above and
below still holds) and stop no extra VMI ((a), and every VMI incarnation deleted once at most).

A run is a `Schedule` generated up front from one `random.Random(seed)` — the cluster, the
fault rates, every request, kill, cordon and withdrawal with its fake time, and the streams
that decide write faults and kills between placement writes (consumed one per write, in
write order) — then replayed by one driver task on fake loop time (tests/timing.py), where
nothing depends on how fast the machine is. So one seed replays the same faults, requests
and outcomes; `test_chaos_a_seed_replays_the_same_run` runs one twice and compares the
recorded event sequences. Run more seeds with `--chaos-seeds=N`, one with
`--chaos-first-seed=S --chaos-seeds=1`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import anyio
import pytest

from dataclasses import replace
from datetime import timedelta
from unittest import mock

import actors.coordinator as coordinator_module
from actors.coordinator_protocol import CoordinatorConfig
from fakes.clock import LoopClock
from fakes.memory_store import Faults, MemoryStore, WriteRecord
from model.nominate import NominationSettings
from model.preemption import PreemptionSettings
from model.priority import ClassPreemption, PreemptionPolicy, Priority
from model.reasons import Code
from model.types import OnCordon, Result
from supervisor import COORDINATOR, PIPELINE, node_child_id
from tests.support.binder import check_invariants, fast_config, kill_child, quiet_logging, running_binder, settle
from tests.support.p6 import (deletion_problem, line_problems, nominated_room_problems, nomination_problems,
                              place_problems)
from tests.support.preemption import MemoryPreemption

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()

RESOURCES = {"h100": "nvidia.com/H100", "l40s": "nvidia.com/L40S"}
N_REQUESTS = 200
KILL_WINDOW = 0.03
"""Kills and cordons go on this long (fake seconds) after the last request. On fake time
the binder's work between two timers takes no time: a scheduled kill lands where tasks wait
(write latency, retry backoffs, restarts), so most seeds give writes a latency."""
BETWEEN_DRAWS = 4096
"""Decisions drawn for kills between placement writes; later placement writes kill nothing."""
P6_DRAWS = 1024
"""Decisions drawn for kills at nomination writes and victim deletions, and for victims' VMs
starting again; later ones kill (restart) nothing."""
NOMINATION_TTL = timedelta(seconds=0.1)
MAX_RETRIES = 8
RETRY_DELAY = 0.003
"""A preemptor's create again after this long (fake seconds), at most `MAX_RETRIES` times."""
VALUES = (100, 500, 1000)
PRIORITIES_EVERY = 8
"""Seeds that are a multiple of this (seed 0, which the replay test runs, among them) draw
priorities and preemption; the others run at one priority (0), without preemption, as
before: a decision refused for room costs a P3 plan (`model.preemption.plan_preemption`,
about three times a seed's time), so the default 200 seeds stay within the suite's budget."""


# -- the schedule: everything random, drawn up front --------------------------------------


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """Request `n` of `tenant`: its first `held_count` held devices of `held_order` that have
    no unanswered request when it is issued, plus one template device per class in
    `templates`; `selector` its nodeSelector."""

    n: int
    tenant: str
    held_order: tuple[str, ...]
    held_count: int
    templates: tuple[str, ...]
    selector: dict[str, str] | None
    priority: str = ""   # its PriorityClass (§3c P1)


StepKind = Literal["request", "withdraw", "kill", "cordon"]


@dataclass(frozen=True, slots=True)
class Step:
    """At `at` fake seconds after the start: issue a request (`what` a RequestSpec),
    withdraw one (`what` its (tenant, request id)), kill a child (`what` its id), or flip a
    node's cordon (`what` the node)."""

    at: float
    kind: StepKind
    what: object


@dataclass(frozen=True, slots=True)
class Schedule:
    """One chaos run, all drawn from `random.Random(seed)` before anything runs.

    `store_seed` seeds the store's fault and latency stream (one draw per write attempt, in
    write order), `jitter_seed` the global `random` that the retries' jitter uses (tenacity),
    `between` says per placement write whether to kill the coordinator or the pipeline right
    after it (a child id, or None), in placement-write order. `priorities` the
    PriorityClasses (name, value, policy), `never_classes` the GPUClasses of `preemption:
    Never`; `at_nomination` / `at_deletion` per nomination write / victim deletion whether to
    kill (a child id, or None), `restarts` per victim deletion whether its VM starts it again."""

    seed: int
    faults: Faults
    store_seed: int
    jitter_seed: int
    nodes: tuple[tuple[str, dict[str, int], str], ...]   # name, allocatable, zone
    tenants: tuple[str, ...]
    budgets: tuple[tuple[str, str, int], ...]             # tenant, resource, hard
    held: tuple[tuple[str, str, str, str | None], ...]    # tenant, device, class, Bound node
    steps: tuple[Step, ...]                               # in time order
    between: tuple[str | None, ...]
    priorities: tuple[tuple[str, int, PreemptionPolicy], ...] = ()
    never_classes: frozenset[str] = frozenset()
    at_nomination: tuple[str | None, ...] = ()
    at_deletion: tuple[str | None, ...] = ()
    restarts: tuple[bool, ...] = ()
    preemption: bool = False


def make_schedule(seed: int) -> Schedule:
    """The run of `seed` (see `Schedule`); a pure function of `seed`."""
    rng = random.Random(seed)
    faults = Faults(error_rate=rng.choice([0.0, 0.05, 0.1]),
                    conflict_rate=rng.choice([0.0, 0.03]),
                    ambiguous_rate=rng.choice([0.0, 0.03]),
                    latency=rng.choice([0.0, 0.0002, 0.0005]))
    store_seed, jitter_seed = rng.getrandbits(32), rng.getrandbits(32)
    nodes, alloc = [], {}
    for i in range(rng.randint(20, 24)):
        name, units = f"node-{i:02d}", {}
        for res in RESOURCES.values():
            u = rng.choice([0, 1, 2, 2, 3, 4])
            if u:
                units[res] = alloc[(name, res)] = u
        nodes.append((name, units, rng.choice(["a", "b"])))
    tenants = [f"tenant-{i}" for i in range(rng.randint(6, 10))]
    if seed % PRIORITIES_EVERY == 0:
        values = sorted(rng.sample(VALUES, rng.choice([2, 3])))
        priorities = tuple((f"prio-{v}", v, PreemptionPolicy.NEVER if v != values[-1] and rng.random() < 0.3
                            else PreemptionPolicy.PREEMPT_LOWER) for v in values)
        never_classes = frozenset(c for c in RESOURCES if rng.random() < 0.2)
    else:
        priorities, never_classes = (("prio-0", 0, PreemptionPolicy.PREEMPT_LOWER),), frozenset()
    budget = {(t, res): rng.randint(2, 8) for t in tenants for res in RESOURCES.values()
              if rng.random() < 0.5}
    # Held devices: some Bound where there is room (and budget), the rest Pending.
    used: dict[tuple[str, str], int] = defaultdict(int)
    tenant_used: dict[tuple[str, str], int] = defaultdict(int)
    held, held_of = [], defaultdict(list)
    for t in tenants:
        for i in range(rng.randint(2, 5)):
            cls = rng.choice(list(RESOURCES))
            res, node = RESOURCES[cls], None
            if rng.random() < 0.6:
                room = [n for n, _, _ in nodes if alloc.get((n, res), 0) > used[(n, res)]]
                if room and tenant_used[(t, res)] < budget.get((t, res), 10**9):
                    node = rng.choice(room)
                    used[(node, res)] += 1
                    tenant_used[(t, res)] += 1
            held.append((t, f"held-{i}", cls, node))
            held_of[t].append(f"held-{i}")
    steps: list[Step] = []
    at = 0.0
    for n in range(N_REQUESTS):
        if n % 8 == 0:
            at += rng.uniform(0, 0.002)
        t = rng.choice(tenants)
        spec = RequestSpec(n, t, tuple(rng.sample(held_of[t], k=len(held_of[t]))),
                           rng.choice([0, 0, 1, 2]),
                           tuple(rng.choice(list(RESOURCES)) for _ in range(rng.choice([1, 1, 2]))),
                           {"zone": rng.choice(["a", "b"])} if rng.random() < 0.1 else None,
                           rng.choice(priorities)[0])
        steps.append(Step(at, "request", spec))
        if rng.random() < 0.04:
            steps.append(Step(at + rng.uniform(0, 0.003), "withdraw", (t, f"r{n:04d}")))
    end, at = at + KILL_WINDOW, 0.0
    children = [node_child_id(name) for name, _, _ in nodes]
    while at < end:
        at += rng.uniform(0.0002, 0.002)
        r = rng.random()
        steps.append(Step(at, "kill", COORDINATOR if r < 0.15 else PIPELINE if r < 0.25
                          else rng.choice(children)))
        if rng.random() < 0.05:  # an operator cordons or uncordons a node (B3, B5)
            steps.append(Step(at, "cordon", rng.choice(nodes)[0]))
    between = tuple(rng.choice([COORDINATOR, PIPELINE]) if i == 0 or rng.random() < 0.1 else None
                    for i in range(BETWEEN_DRAWS))
    at_nomination = tuple(rng.choice([COORDINATOR, PIPELINE]) if i == 0 or rng.random() < 0.2 else None
                          for i in range(P6_DRAWS))
    at_deletion = tuple(COORDINATOR if i == 0 or rng.random() < 0.2 else None for i in range(P6_DRAWS))
    restarts = tuple(rng.random() < 0.5 for _ in range(P6_DRAWS))
    return Schedule(seed, faults, store_seed, jitter_seed, tuple(nodes), tuple(tenants),
                    tuple((t, res, hard) for (t, res), hard in budget.items()), tuple(held),
                    tuple(sorted(steps, key=lambda step: step.at)), between, priorities,
                    never_classes, at_nomination, at_deletion, restarts, seed % PRIORITIES_EVERY == 0)


# -- the run: the schedule replayed on fake time, its events recorded ---------------------


class World:
    """A schedule's cluster, its replay, the live invariant checks and the record of events
    (`trace`: requests, withdrawals, kills, cordons, every applied write with the count of
    failed attempts so far, and the outcomes, each with its fake time since the start)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.seed = schedule.seed
        self.store = s = MemoryStore(seed=schedule.store_seed, faults=schedule.faults,
                                     clock=LoopClock())
        never = {c: ClassPreemption.NEVER if c in schedule.never_classes else ClassPreemption.LOWER_PRIORITY
                 for c in RESOURCES}
        s.add_class("h100", RESOURCES["h100"], on_cordon=OnCordon.MOVE, preemption=never["h100"])
        s.add_class("l40s", RESOURCES["l40s"], on_cordon=OnCordon.STAY, preemption=never["l40s"])
        self.priorities = {name: Priority(value, policy, name) for name, value, policy in schedule.priorities}
        for name, value, policy in schedule.priorities:
            s.add_priority_class(name, value, policy=policy)
        self.nodes = [name for name, _, _ in schedule.nodes]
        self.alloc: dict[tuple[str, str], int] = {}
        for name, units, zone in schedule.nodes:
            s.add_node(name, units, labels={"zone": zone})
            self.alloc.update({(name, res): u for res, u in units.items()})
        self.tenants = list(schedule.tenants)
        self.budget = {(t, res): hard for t, res, hard in schedule.budgets}
        for t in self.tenants:
            s.add_namespace(t)
        for t, res, hard in schedule.budgets:
            s.add_budget(t, res, hard)
        for t, name, cls, node in schedule.held:
            s.add_device(t, name, cls, node=node)
        self.busy: dict[tuple[str, str], str] = {}  # held device -> its unanswered request
        self.issued: list[tuple[str, str, list[str]]] = []
        self.withdrawn: set[str] = set()
        self.violations: list[str] = []
        self.binds_by_request: dict[str, int] = defaultdict(int)
        self.placements = 0
        self.mid_kills = 0
        self.mid_killed: set[str] = set()
        self.trace: list[tuple] = []
        self.t0 = 0.0
        self.binder = None
        self.clock = LoopClock()
        self.worker = MemoryPreemption(s, self.clock, period=0.01, on_stop=self.stopped)
        self.tg = None  # the run's task group: preemptors' and victims' creates again
        self.specs: dict[str, tuple[RequestSpec, list[str], int]] = {}  # rid -> spec, names, retries
        self.retried: set[str] = set()
        self.last_nomination: dict[str, object] = {}
        self.nominations = self.deletions = self.restarted = self.retries = 0
        self.p6_kills = 0
        self.landed: set[str] = set()  # preemptors placed on their nominated node
        self.store.on_write = self.on_write

    def fail(self, message: str) -> str:
        return f"chaos seed {self.seed}: {message}"

    def note(self, *event: object) -> None:
        self.trace.append((round(anyio.current_time() - self.t0, 6), *event))

    def on_write(self, rec: WriteRecord) -> None:
        """Record the write; invariants 1 and 4 on every placement write; kills between
        placement writes."""
        self.note("write", rec.op, rec.key, rec.request_id, rec.result, rec.node, rec.moved,
                  self.store.writes_attempted, self.store.writes_failed)
        if rec.op in ("nomination", "nomination-deleted", "vmi-deleted"):
            self.on_preemption_write(rec)
            return
        if rec.op == "answer" and rec.result is Result.REFUSED:
            self.maybe_retry(rec)
        if not rec.moved:
            return
        self.violations += nominated_room_problems(self.store, self.clock.now())
        dev = self.store.device(rec.key)
        res = self.store.classes()[dev.class_name].resource_name
        # counted on the store (victims' template devices are deleted, H2, freeing units)
        used = self.store.used(rec.node, res)
        if used > self.alloc.get((rec.node, res), 0):
            self.violations.append(f"inv1: bind {rec.key} of {rec.request_id} put {rec.node} "
                                   f"over {res}: {used}")
        hard = self.budget.get((dev.namespace, res))
        if hard is not None and self.store.tenant_bound(dev.namespace, res) > hard:
            self.violations.append(f"inv4: bind {rec.key} of {rec.request_id} put "
                                   f"{dev.namespace} over {res}")
        self.binds_by_request[rec.request_id] += 1
        # Kill the coordinator or the pipeline (the writer) right after a placement write of
        # a request with more placement writes to come (B7: the next incarnation of the
        # pair must finish it on that node); always, until one such kill has landed (its
        # request has had a placement write since).
        if self.binder is None:
            return
        draws = self.schedule.between
        victim = draws[self.placements] if self.placements < len(draws) else None
        self.placements += 1
        if victim is None and not self.landed_between():
            victim = draws[0]
        if victim is None:
            return
        to_come = [m for m in self.store.request_members(dev.namespace, rec.request_id)
                   if m.bound_node != rec.node]
        if to_come and kill_child(self.binder, victim, "chaos: between placement writes"):
            self.mid_kills += 1
            self.mid_killed.add(rec.request_id)
            self.note("kill between placement writes", victim, rec.request_id)

    # -- §3c: nominations, victims, preemptors' retries -----------------------------------

    def on_preemption_write(self, rec: WriteRecord) -> None:
        """P6 (a), (b), (d) on a nomination write or a VMI delete; the kill points of (e)."""
        now = self.clock.now()
        if rec.op == "nomination-deleted":
            self.last_nomination.pop(rec.key, None)
            return
        if rec.op == "nomination":
            n = self.store.nominations()[rec.key]
            self.violations += nomination_problems(self.store, n, self.last_nomination.get(rec.key), now)
            self.violations += nominated_room_problems(self.store, now)
            self.last_nomination[rec.key] = n
            draws, i = self.schedule.at_nomination, self.nominations
            self.nominations += 1
            self.worker.poke()
        else:
            ns, name, uid, admission, _ = self.store.deleted_vmis[-1]
            problem = deletion_problem(self.store, ns, name, admission, now)
            if problem is not None:
                self.violations.append(problem)
            if sum(1 for d in self.store.deleted_vmis if d[2] == uid) > 1:
                self.violations.append(f"P6: VMI {ns}/{name} uid {uid} deleted twice")
            draws, i = self.schedule.at_deletion, self.deletions
            self.deletions += 1
        victim = draws[i] if i < len(draws) else None
        if victim is not None and self.binder is not None:
            self.worker.abandon()  # the leader's worker dies with it, mid-round
            if kill_child(self.binder, victim, f"chaos: at {rec.op}"):
                self.p6_kills += 1
                self.note(f"kill at {rec.op}", victim, rec.key)

    def maybe_retry(self, rec: WriteRecord) -> None:
        """A preemptor told `preemption_nominated` on every member creates its VMI again
        after `RETRY_DELAY` (W5 cleared its request first), at most `MAX_RETRIES` times."""
        rid = rec.request_id
        if rid in self.retried or rid not in self.specs or self.tg is None:
            return
        dev = self.store.device(rec.key)
        br = dev.status.bind_request if dev is not None else None
        if br is None or br.code is not Code.PREEMPTION_NOMINATED:
            return
        t = rec.key[0]
        members = self.store.request_members(t, rid)
        if any(m.status.bind_request.result is None for m in members):
            return
        spec, names, retries = self.specs[rid]
        if retries >= MAX_RETRIES:
            return
        self.retried.add(rid)
        self.tg.start_soon(self.retry, t, rid, spec, names, retries)

    async def retry(self, t: str, rid: str, spec: RequestSpec, names: list[str], retries: int) -> None:
        await anyio.sleep(RETRY_DELAY)
        self.store.withdraw(t, rid)  # W5: the denied create's writes are cleared
        if any(self.store.device((t, d)) is None for d in names):
            return
        again = f"{rid.split('-')[0]}-{retries + 1}"
        self.retries += 1
        self.make_request(spec, names, again, retries + 1)
        self.note("retry", rid, again)

    def stopped(self, ns: str, vmi: str, uid: str) -> None:
        """A victim's VMI was deleted and released: sometimes its VM starts it again (a new
        incarnation with new template devices: it waits like any set)."""
        i = len(self.store.deleted_vmis) - 1
        if self.tg is None or not (i < len(self.schedule.restarts) and self.schedule.restarts[i]):
            return
        rid = next((r for r, (sp, _, _) in self.specs.items() if f"vm-{sp.n}" == vmi and sp.tenant == ns), None)
        if rid is None:
            return
        self.tg.start_soon(self.restart, self.specs[rid][0], i)

    async def restart(self, spec: RequestSpec, i: int) -> None:
        await anyio.sleep(RETRY_DELAY)
        names = []
        for j, cls in enumerate(spec.templates):
            name = f"tpl-{spec.n}-v{i}-{j}"
            self.store.add_device(spec.tenant, name, cls, template_for=f"vm-{spec.n}")
            names.append(name)
        self.restarted += 1
        self.make_request(spec, names, f"r{spec.n:04d}v{i}", 0)

    def make_request(self, spec: RequestSpec, names: list[str], rid: str, retries: int) -> None:
        """Create VMI `vm-<n>` (a new incarnation, admitted as `rid`) and its request."""
        t = spec.tenant
        self.store.add_vmi(t, f"vm-{spec.n}", admission=rid)
        self.store.request(t, f"vm-{spec.n}", names, request_id=rid, node_selector=spec.selector,
                           priority=self.priorities[spec.priority], admission=rid)
        for d in names:
            if d.startswith("held-"):
                self.busy[(t, d)] = rid
        self.specs[rid] = (spec, list(names), retries)
        self.issued.append((t, rid, list(names)))
        self.note("request", rid, tuple(names))

    def landed_between(self) -> bool:
        """Some request killed between its placement writes had more than one."""
        return any(self.binds_by_request[r] > 1 for r in self.mid_killed)

    def perform(self, step: Step) -> None:
        """Carry out one step of the schedule, now."""
        if step.kind == "request":
            self.issue(step.what)  # type: ignore[arg-type]
        elif step.kind == "withdraw":
            t, rid = step.what  # type: ignore[misc]
            ok = self.store.withdraw(t, rid)
            if ok:
                self.withdrawn.add(rid)
            self.note("withdraw", rid, ok)
        elif step.kind == "kill":
            self.note("kill", step.what, kill_child(self.binder, step.what, "chaos"))
        else:
            node = self.store.node(step.what)
            self.store.cordon(node.name, not node.unschedulable)
            self.note("cordon", node.name, not node.unschedulable)

    def issue(self, spec: RequestSpec) -> None:
        if spec.n % 8 == 0:
            self.release_answered()
        t = spec.tenant
        free = [d for d in spec.held_order if (t, d) not in self.busy]
        names = free[:spec.held_count]
        if len(names) < 3:
            for j, cls in enumerate(spec.templates):
                name = f"tpl-{spec.n}-{j}"
                self.store.add_device(t, name, cls, template_for=f"vm-{spec.n}")
                names.append(name)
        self.make_request(spec, names, f"r{spec.n:04d}", 0)

    def release_answered(self) -> None:
        for t, rid, names in self.issued:
            if rid in self.retried:
                continue  # its retry holds the devices now
            members = self.store.request_members(t, rid)
            if not members or all(m.status.bind_request.result is not None for m in members):
                for d in names:
                    if self.busy.get((t, d)) == rid:
                        del self.busy[(t, d)]


def chaos_config(preemption: bool = True):
    """`fast_config` with a generous restart intensity; with `preemption`, preemption on (§3c:
    min runtime 0, nominations living `NOMINATION_TTL`; the binder nominates only when given a
    nomination writer too)."""
    base = fast_config(supervisor=fast_config().supervisor.__class__(
        max_restarts=100_000, max_seconds=1.0, backoff_initial=0.0005, backoff_max=0.002))
    if not preemption:
        return base
    preemption = NominationSettings(PreemptionSettings(min_runtime=timedelta(0)), ttl=NOMINATION_TTL)
    coordinator: CoordinatorConfig = replace(base.coordinator, preemption=preemption)
    return replace(base, coordinator=coordinator)


class _LineWatch:
    """P6 (c) on the coordinator's decisions: `model.line_plan.gate_batch` and `first_allowed`
    as the coordinator calls them, each answer judged by `tests.support.p6` on its own inputs
    (the coordinator's line, the room it saw) and the problems added to `world.violations`."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.gate_batch = coordinator_module.gate_batch
        self.first_allowed = coordinator_module.first_allowed
        self.batches = 0

    def gate(self, line, snapshot, holds, actions, now, **kw):
        gated = self.gate_batch(line, snapshot, holds, actions, now, **kw)
        self.batches += 1
        self.world.violations += line_problems(line, snapshot, holds, gated.actions, now, gated.again)
        return gated

    def first(self, line, snapshot, request, placements, **kw):
        chosen = self.first_allowed(line, snapshot, request, placements, **kw)
        if chosen is not None:
            self.world.violations += place_problems(line, snapshot, request, chosen)
        return chosen


async def chaos_run(seed: int) -> World:
    """Replay the schedule of `seed` on a fresh store and binder, then settle (bounded) and
    record every request's outcome. Must run on fake time (tests/timing.py)."""
    schedule = make_schedule(seed)
    world = World(schedule)
    saved = random.getstate()
    random.seed(schedule.jitter_seed)  # the retries' jitter (tenacity draws the global one)
    watch = _LineWatch(world)
    try:
        with mock.patch.object(coordinator_module, "gate_batch", watch.gate), \
                mock.patch.object(coordinator_module, "first_allowed", watch.first):
            preemption = schedule.preemption
            async with running_binder(world.store, chaos_config(preemption),
                                      nominations=world.store if preemption else None) as binder, \
                    anyio.create_task_group() as tg:
                world.binder, world.tg = binder, tg
                if preemption:
                    tg.start_soon(world.worker.run)
                world.t0 = anyio.current_time()
                for step in schedule.steps:
                    wait = world.t0 + step.at - anyio.current_time()
                    if wait > 0:
                        await anyio.sleep(wait)
                    world.perform(step)
                world.chaos_done = anyio.current_time()
                await settle(world.store, binder, timeout=30.0)
                world.settled = anyio.current_time()
                world.binder = world.tg = None
                tg.cancel_scope.cancel()
    finally:
        random.setstate(saved)
    world.line_batches = watch.batches
    world.violations += nominated_room_problems(world.store, world.clock.now())
    for t, rid, names in world.issued:
        world.note("outcome", rid, tuple(sorted(
            (d, br.result, br.node) for d in names
            if (dev := world.store.device((t, d))) is not None
            and (br := dev.status.bind_request) is not None and br.id == rid)))
    return world


async def test_chaos_a_seed_replays_the_same_run(request: pytest.FixtureRequest) -> None:
    """The same seed gives the same run: the same requests, withdrawals, kills and cordons
    at the same fake times, the same writes (and failed attempts between them) in the same
    order, the same outcomes. The seed is `--chaos-first-seed`."""
    seed = request.config.getoption("--chaos-first-seed")
    print(f"chaos seed {seed}, run twice")
    assert make_schedule(seed) == make_schedule(seed)
    first = await chaos_run(seed)
    second = await chaos_run(seed)
    kinds = {event[1] for event in first.trace}
    assert {"request", "kill", "write", "outcome"} <= kinds
    assert len(first.trace) == len(second.trace), f"chaos seed {seed}: runs differ in length"
    for i, (a, b) in enumerate(zip(first.trace, second.trace)):
        assert a == b, f"chaos seed {seed}: runs differ at event {i}: {a} != {b}"


async def test_chaos_invariants_hold(chaos_seed: int) -> None:
    """Invariants 1–4 (docs/contract.md §7) and exactly one result per member, under chaos."""
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
                if dev is None:
                    continue  # a victim's template device, deleted once its VMI was (H2)
                br = dev.status.bind_request
                if br is not None and br.id == rid:
                    assert dev.bound_node == node, world.fail(f"{t}/{d} of {rid} not on {node}")
    assert outcomes[Result.SUCCEEDED] > 0, world.fail("nothing succeeded")
    assert world.landed_between(), world.fail(
        "no kill landed between the first and the last placement write")
    assert outcomes[Result.REFUSED] > 0, world.fail("nothing refused: capacity is not scarce")
