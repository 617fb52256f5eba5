"""The soak's workload: what it runs (`SoakSpec`) and its seeded schedule of operations
(`Op`, `schedule`, `schedule_digest`). Pure: the same spec gives the same schedule."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

from bench.contention_trace import ON_DEMAND, PREEMPTIBLE, PRIORITY
from bench.scale.workload import ScaleSpec, problem_nodes

SIZES = ((1, .5), (2, .25), (4, .15), (8, .10))
PRIORITY_SIZES = ((1, .3), (2, .25), (4, .25), (8, .20))
"""The churn's sizes with `SoakSpec.priorities`: a larger share of 4- and 8-GPU sets (mean 3.4
GPUs, against SIZES' 2.4), so that the live set (LIVE_PER_NODE_PRIORITIES a node) asks for
nearly all of the fleet's GPUs and an 8-GPU set often finds no node empty: refused for room, it
preempts (on-demand) or waits (preemptible)."""
ON_DEMAND_SHARE = 0.3
"""The share of the churn's creates at the on-demand tier with `SoakSpec.priorities` (bench
contention's `Plan.on_demand_share`); the others are preemptible."""
LIVE_PER_NODE_PRIORITIES = 2.5
"""VMIs kept running per node with `SoakSpec.priorities` (2 without): with PRIORITY_SIZES about
97 % of the GPUs asked. A best-fit model of the schedule (seed 1, 200 nodes, 10 minutes) found
2 a node filling 83 % with no create refused for room (packing kept a node empty for every
8-GPU set), 2.2 91 % and 14 preemptions, 2.5 97 % and 31 (15 in the steady stretch), the
preemptible 8-GPU sets waiting."""
FILL_BUDGET = 1.5
"""With `SoakSpec.priorities` the tenants' budgets together hold this many times each class's
GPUs (`SoakSpec.budget`): room, not budgets, must refuse the creates."""
MAX_CREATE_RATE = 50.0          # creates/s; 20 minutes of it is 60,000 operations
MAX_MINUTES = 60.0              # a run's churn; longer ones outlast CI's and a session's budget


@dataclass(frozen=True)
class SoakSpec:
    """What the soak runs. `nodes` KWOK nodes of `gpus_per_node` GPUs; `tenants` (None:
    nodes // 50, at least 2) each with a budget of `budget_share` of each class's GPUs;
    `live` VMIs kept running (None: 2 per node), after which every create is preceded by a
    delete of that tenant's oldest running VMI (skipped while fewer than `live` are held as
    admitted: refusals do not drain the live set); creates at `create_rate` /s; `held_share` of
    them name held devices; a cordon every `cordon_every` s lasting `cordon_for` s.

    `population`: "own" — one class, `held` held GPUDevices per tenant, the live set reached
    by the churn's first creates; "scale" — `bench.scale.populate`'s cluster at `nodes`
    (`scale_spec()`: two classes, problem nodes, `live` VMIs running before the churn starts,
    held devices up to `gpus_per_node` per node), tenants' budgets added after it.

    The disturbances come first: a leader kill -9 every `kill_every` s and one kube-apiserver
    restart at `restart_at` of the duration (None: none), all before `disturb_until`; then
    `recover` s (None: 15 % of the run, at most 90 s: a killed replica back and warm), then
    the steady stretch, the last `steady_share` of the run, from `steady_from`: the same churn,
    nothing killed. The invariants sampled every `check_every` s, RSS every `rss_every` s;
    everything named `prefix`…. `minutes` of churn (≤ MAX_MINUTES). ValueError (from `schedule`) when
    the disturbances do not fit before `disturb_until`.

    `mode` "device" (issue 41 item 5, docs/contract.md §3b; only with `population="scale"`):
    the population is `bench.scale`'s device mode (HGX boards publishing ResourceSlices, one
    device-mode class, every admitted set placed as a ResourceClaim), and DeviceTaintRules are
    injected throughout at one per `taint_every` s on average (seeded, exponential gaps), each
    removed `taint_for` s later: a `noexecute_share` of them `NoExecute` on a GPU of a running
    VMI (the eviction controller deletes its launcher Pod; the soak then deletes the VMI), the
    others `NoSchedule` on a seeded node's seeded GPU. A placement requested more than
    `taint_grace` s after a taint on its device was made is a violation, as is a claim of
    ours whose VMI has been gone for `claim_grace` s while churning (housekeeping's attachment
    grace and period, then the launcher Pod gone and the claim released by virt-controller and
    kube-controller-manager, which lag minutes on a loaded 2-core machine; every sample's
    oldest is reported), and any such claim after settling.

    `priorities` (issue 39 item 4, docs/contract.md §3c P6): the churn's creates name bench
    contention's PriorityClasses (`bench.contention.priority_class` under `prefix`), an
    `on_demand_share` of them on-demand (value 1000), the rest preemptible (100; the
    population's VMIs have none: 0); sizes from PRIORITY_SIZES; LIVE_PER_NODE_PRIORITIES VMIs
    a node kept running (the population made so many first); every tenant's budget at least
    FILL_BUDGET / tenants of each class's GPUs; the controller run with
    `--preemption-min-runtime=<min_runtime>` (its default, 10 minutes, outlives a soak's
    VMIs). So the fleet runs nearly full, on-demand creates refused for room preempt
    preemptible and population VMIs (a GPUNomination, its victims deleted, the preemptor
    admitted at its retry) and preemptible ones wait in the line (503) until room or
    `answer_timeout` (then "gave up"). Off (the default), the schedule and its digest are
    those of before."""

    nodes: int = 1000
    gpus_per_node: int = 8
    minutes: float = 20.0
    seed: int = 1
    tenants: int | None = None
    budget_share: float = 0.15
    held: int = 8
    live: int | None = None
    create_rate: float = 2.0
    held_share: float = 0.25
    cordon_every: float = 20.0
    cordon_for: float = 30.0
    kill_every: float = 150.0
    restart_at: float | None = 0.3
    steady_share: float = 0.45
    recover: float | None = None
    population: str = "own"
    check_every: float = 5.0
    rss_every: float = 10.0
    settle_timeout: float = 180.0
    answer_timeout: float = 90.0      # s a create may go unanswered (retrying) before it is lost
    pod_timeout: float = 240.0        # s an admitted VMI's launcher Pod may take to bind
    prefix: str = "soak-"
    mode: str = "count"
    taint_every: float = 20.0
    taint_for: float = 90.0
    noexecute_share: float = 0.3
    taint_grace: float = 15.0
    claim_grace: float = 300.0
    priorities: bool = False
    on_demand_share: float = ON_DEMAND_SHARE
    min_runtime: float = 15.0
    tracemalloc: bool = False         # the replicas run with PYTHONTRACEMALLOC=1: RSS not judged

    @property
    def n_tenants(self) -> int:
        """Tenants: `tenants`, or nodes // 50, at least 2."""
        return self.tenants or max(2, self.nodes // 50)

    @property
    def n_live(self) -> int:
        """VMIs kept running: `live`, or 2 per node (with `priorities`
        LIVE_PER_NODE_PRIORITIES)."""
        return self.live or round((LIVE_PER_NODE_PRIORITIES if self.priorities else 2) * self.nodes)

    @property
    def seconds(self) -> float:
        """The churn's length in seconds."""
        return self.minutes * 60

    @property
    def steady_from(self) -> float:
        """s into the churn where the steady stretch (no kills, no restart) begins."""
        return round((1 - self.steady_share) * self.seconds, 1)

    @property
    def disturb_until(self) -> float:
        """Every kill and the restart start before this (s into the churn)."""
        recover = min(90.0, 0.15 * self.seconds) if self.recover is None else self.recover
        return round(self.steady_from - recover, 1)

    @property
    def resource(self) -> str:
        """The "own" population's extended resource."""
        return f"{self.prefix}gpu.example.com/gpu"

    @property
    def cls(self) -> str:
        """The "own" population's GPUClass."""
        return f"{self.prefix}h100"

    @property
    def cls_name(self) -> str:
        """The first GPUClass of `classes()` (device mode's one class)."""
        return next(iter(self.classes()))

    def scale_spec(self) -> ScaleSpec | None:
        """The `bench.scale.ScaleSpec` of the "scale" population (None for "own").
        ValueError for a population other than "own" or "scale"."""
        if self.population == "own":
            return None
        if self.population != "scale":
            raise ValueError(f"population is 'own' or 'scale', got {self.population!r}")
        return ScaleSpec(gpus_per_node=self.gpus_per_node, held_share=self.held_share,
                         prefix=self.prefix, seed=self.seed, mode=self.mode).scaled(
            self.nodes, vmis=self.n_live, tenants=self.n_tenants)

    def classes(self) -> dict[str, str]:
        """GPUClass -> extended resource, in the order an Op's `cls` indexes."""
        sc = self.scale_spec()
        return dict(sc.classes) if sc else {self.cls: self.resource}

    def avoided_nodes(self) -> frozenset[int]:
        """Node indices the churn does not cordon: the population's cordoned, tainted and
        not-Ready ones (uncordoning would change them)."""
        sc = self.scale_spec()
        if not sc:
            return frozenset()
        return frozenset(problem_nodes(sc))

    def pre_populated(self) -> int:
        """VMIs running before the churn starts (asked of the population)."""
        sc = self.scale_spec()
        return sc.vmis if sc else 0

    def budget(self, resource: str | None = None) -> int:
        """A tenant's budget of `resource` (None: the own class's): `budget_share` of that
        class's GPUs (with `priorities` at least FILL_BUDGET / tenants of them), at least 8."""
        res = list(self.classes().values())
        share = 1 / len(res) if resource is None or resource in res else 0
        of = max(self.budget_share, FILL_BUDGET / self.n_tenants) if self.priorities else self.budget_share
        return max(8, int(self.nodes * self.gpus_per_node * share * of))

    @property
    def sizes(self) -> tuple[tuple[int, float], ...]:
        """The churn's (GPUs, weight) pairs: PRIORITY_SIZES with `priorities`, else SIZES."""
        return PRIORITY_SIZES if self.priorities else SIZES

    def controller_args(self) -> tuple[str, ...]:
        """Controller arguments the spec adds to the soak's: with `priorities`
        `--preemption-min-runtime`, else none."""
        return (f"--preemption-min-runtime={self.min_runtime:g}",) if self.priorities else ()

    def tenant(self, i: int) -> str:
        """Tenant `i`'s namespace."""
        return f"{self.prefix}t{i:02d}"

    def node(self, i: int) -> str:
        """Node `i`'s name."""
        return f"{self.prefix}n{i:04d}"


@dataclass(frozen=True)
class Op:
    """One scheduled operation: at `at` s into the churn, `kind` one of create, delete,
    cordon, uncordon, kill-leader, restart-apiserver, taint, untaint (device mode);
    `tenant`/`size`/`held`/`name`/`cls` (index into `SoakSpec.classes()`) and `tier` (a
    `bench.contention_trace.TIERS` name; "" without `SoakSpec.priorities`: no PriorityClass)
    for VMIs, `node` for cordons. A taint: `name` the DeviceTaintRule's, `effect` NoSchedule (on `node`'s GPU
    `device`) or NoExecute (on a GPU of a running VMI of `tenant`, chosen when it runs); its
    untaint names the same rule."""

    at: float
    kind: str
    tenant: int = -1
    size: int = 0
    held: bool = False
    name: str = ""
    node: int = -1
    cls: int = 0
    effect: str = ""
    device: int = -1
    tier: str = ""

    @property
    def priority(self) -> int:
        """The create's priority value: its tier's PriorityClass's, 0 without one."""
        return PRIORITY[self.tier] if self.tier else 0


def schedule(spec: SoakSpec) -> list[Op]:
    """The churn's operations, sorted by time; a pure function of `spec` (same seed, same
    list). Kills at `kill_every`, 2·`kill_every`, … before `disturb_until`; the restart at
    `restart_at` of the run, moved 5 s on while within 15 s of a kill. With `priorities`
    sizes are drawn from PRIORITY_SIZES (the same draws) and each create's tier from a random
    stream of its own seeded from `spec.seed` (`tiers`), so nothing else of the schedule
    changes. ValueError when `disturb_until` ≤ 0 or the restart does not fit before it."""
    if spec.disturb_until <= 0:
        raise ValueError(f"no room for disturbances: steady stretch from {spec.steady_from} s, "
                         f"disturbances until {spec.disturb_until} s")
    rng = random.Random(spec.seed)
    tier = tiers(spec)
    sizes, weights = zip(*spec.sizes)
    n_cls, pre = len(spec.classes()), spec.pre_populated()
    ops: list[Op] = []
    t, i = 0.0, 0
    while True:
        t += rng.expovariate(spec.create_rate)
        if t >= spec.seconds:
            break
        tenant = rng.randrange(spec.n_tenants)
        size = rng.choices(sizes, weights)[0]
        held = rng.random() < spec.held_share
        cls = rng.randrange(n_cls) if n_cls > 1 else 0
        if i + pre >= spec.n_live:
            ops.append(Op(t, "delete", tenant=tenant))
        ops.append(Op(t, "create", tenant=tenant, size=size, held=held, name=f"vm{i:05d}",
                      cls=cls, tier=tier()))
        i += 1
    avoid = spec.avoided_nodes()
    if len(avoid) >= spec.nodes:
        raise ValueError("every node is a problem node: nothing to cordon")
    t = spec.cordon_every
    while t < spec.seconds:
        node = rng.randrange(spec.nodes)
        while node in avoid:
            node = rng.randrange(spec.nodes)
        ops.append(Op(t, "cordon", node=node))
        ops.append(Op(min(t + spec.cordon_for, spec.seconds), "uncordon", node=node))
        t += spec.cordon_every
    t = spec.kill_every
    while t < spec.disturb_until:
        ops.append(Op(t, "kill-leader"))
        t += spec.kill_every
    if spec.restart_at is not None:
        at = spec.restart_at * spec.seconds
        kills = [o.at for o in ops if o.kind == "kill-leader"]
        while any(abs(at - k) < 15 for k in kills):   # not on top of a kill: each its own event
            at += 5
        if at >= spec.disturb_until:
            raise ValueError(f"the kube-apiserver restart ({at:.0f} s) does not fit before "
                             f"{spec.disturb_until} s")
        ops.append(Op(at, "restart-apiserver"))
    ops += taints(spec, avoid)
    return sorted(ops, key=lambda o: o.at)   # stable: a delete stays before its create


def tiers(spec: SoakSpec):
    """A function giving each create's tier in turn: "" without `spec.priorities`, else
    on-demand with probability `on_demand_share`, preemptible otherwise, drawn from a random
    stream of its own (`tiers-<seed>`). Pure: the same spec gives the same sequence."""
    if not spec.priorities:
        return lambda: ""
    rng = random.Random(f"tiers-{spec.seed}")
    return lambda: ON_DEMAND if rng.random() < spec.on_demand_share else PREEMPTIBLE


def taints(spec: SoakSpec, avoid: frozenset[int] = frozenset()) -> list[Op]:
    """Device mode's DeviceTaintRules (none in count mode): from `taint_every` s on, gaps
    drawn exponential with mean `taint_every` (a random stream of its own, seeded from
    `spec.seed`: the rest of the schedule is the same as without them), each a "taint" and
    its "untaint" `taint_for` s later (at the run's end at the latest); NoExecute with
    probability `noexecute_share` (on a tenant's running VMI), else NoSchedule on a node not
    in `avoid` and one of its `gpus_per_node` GPUs. Rules named `<prefix>taint-<k>`. Pure."""
    if spec.mode not in ("count", "device"):
        raise ValueError(f"mode is 'count' or 'device', got {spec.mode!r}")
    if spec.mode != "device":
        return []
    if spec.population != "scale":
        raise ValueError("device mode runs bench.scale's population (population='scale')")
    rng = random.Random(f"taints-{spec.seed}")
    ops: list[Op] = []
    t, k = spec.taint_every, 0
    while t < spec.seconds:
        name = f"{spec.prefix}taint-{k:04d}"
        if rng.random() < spec.noexecute_share:
            ops.append(Op(t, "taint", tenant=rng.randrange(spec.n_tenants), name=name,
                          effect="NoExecute"))
        else:
            node = rng.randrange(spec.nodes)
            while node in avoid:
                node = rng.randrange(spec.nodes)
            ops.append(Op(t, "taint", node=node, device=rng.randrange(spec.gpus_per_node),
                          name=name, effect="NoSchedule"))
        ops.append(Op(min(t + spec.taint_for, spec.seconds), "untaint", name=name))
        t += rng.expovariate(1 / spec.taint_every)
        k += 1
    return ops


def deletion_order(vmis: list, seed: int) -> list:
    """The population's VMIs (`vmis`, as `bench.scale.plan_vmis` made them: larger sets
    first) in the order the churn deletes them (oldest first): shuffled with a random stream
    of its own seeded from `seed`. Deleted in plan order, the 8-GPU sets would go first and
    the 1-GPU sets last, so the devices held (and the template GPUDevices every replica
    caches) would fall for the first part of the run and climb back through the steady
    stretch: not steady (count mode's soak of 2026-12-03: 8,000 -> 6,906 -> 8,108). Pure."""
    out = list(vmis)
    random.Random(f"order-{seed}").shuffle(out)
    return out


_LATER_FIELDS = {"effect": "", "device": -1, "tier": ""}
"""Op fields added after count-mode digests were published: left out of the digest while at
their defaults, so a count-mode schedule keeps its digest."""


def schedule_digest(ops: list[Op]) -> str:
    """A short hash of a schedule (printed, so two runs can be seen to replay the same)."""
    import hashlib

    rows = [{k: v for k, v in asdict(o).items() if _LATER_FIELDS.get(k, object()) != v}
            for o in ops]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:12]
