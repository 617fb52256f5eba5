"""Soak (issue 22 item 2): a KWOK fleet with KubeVirt and kube-scheduler running, under seeded
churn — VMI creates (1/2/4/8 GPUs, template or held devices) and deletes as tenants, node
cordons and uncordons (held devices then move: B4/B5), a kill -9 of the leader every few
minutes and one kube-apiserver restart in the first part of the run, then a *steady stretch*
(the last `steady_share` of it: the same churn, the live set constant, nothing killed) — while
the invariants of DESIGN §7 (`localcluster.invariants`) are checked every few seconds and once
more after settling.

Figures: invariant violations (by kind), admissions lost (a create that got neither an answer
nor, if admitted, a bound launcher Pod on its pin), creates/admitted/refused/deleted, held-device
moves, leader takeovers, the API-server restart's outage, each replica's RSS every ~10 s, and
the RSS trend (`rss_trend`): for each replica process alive through the whole steady stretch,
the least-squares slope of its RSS over that stretch (MiB/min, ± 2 standard errors) judged
against RSS_SLOPE_MAX_MIB_PER_MIN.

The population: `population="scale"` (the bench) is `bench.scale.populate`'s — two GPU
models, cordoned, tainted and not-Ready nodes, 2 running VMIs per node made through the real
path, held devices up to 8 per node (idle ones included) — with a ResourceQuota budget per
tenant added; `population="own"` (the shortened soak of `make test`) is nodes of one class and
a few held devices per tenant, the live set reached by the churn's first creates.

The operations are a pure function of the spec (`schedule(spec)`): the same seed gives the
same schedule (times, kinds, tenants, sizes, classes, nodes; its digest is printed); outcomes
(admitted or refused, which node) depend on the cluster.

`gpu-binder bench soak --nodes N --minutes M --seed S --out DIR` runs it on its own cluster
(`run`); `tests/e2e/test_soak.py` runs a short one on the session's (`soak_on`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import signal
import statistics
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio

from localcluster import invariants as inv

VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"
DEV_GROUP, DEV_VERSION = "gpu.cozystack.io", "v1alpha1"
SIZES = ((1, .5), (2, .25), (4, .15), (8, .10))
MAX_CREATE_RATE = 50.0          # creates/s; 20 minutes of it is 60,000 operations
RSS_TARGET_MIB = 300.0         # issue 22's target for a replica's RSS
RSS_SLOPE_MAX_MIB_PER_MIN = round(RSS_TARGET_MIB / (24 * 60), 3)
RSS_SLOPE_WHY = (f"{RSS_SLOPE_MAX_MIB_PER_MIN} MiB/min = the whole {RSS_TARGET_MIB:g} MiB RSS "
                 f"target added in 24 h: a replica growing faster would need a restart (or "
                 f"twice its memory) within a day; slower growth is below what a steady "
                 f"stretch of minutes resolves (the slope's standard error there is ~0.05-0.1 "
                 f"MiB/min against the GC's sawtooth)")
SOAK_ARGS = ("--lease-duration=8", "--renew-deadline=6", "--retry-period=1",
             "--attachment-grace=30", "--bind-timeout=15", "--housekeeping-period=2")


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
    everything named `prefix`…. `minutes` of churn (≤ 20). ValueError (from `schedule`) when
    the disturbances do not fit before `disturb_until`."""

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

    @property
    def n_tenants(self) -> int:
        return self.tenants or max(2, self.nodes // 50)

    @property
    def n_live(self) -> int:
        return self.live or 2 * self.nodes

    @property
    def seconds(self) -> float:
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
        return f"{self.prefix}gpu.example.com/gpu"

    @property
    def cls(self) -> str:
        return f"{self.prefix}h100"

    def scale_spec(self):
        """The `bench.scale.ScaleSpec` of the "scale" population (None for "own")."""
        if self.population == "own":
            return None
        if self.population != "scale":
            raise ValueError(f"population is 'own' or 'scale', got {self.population!r}")
        from bench.scale import ScaleSpec

        return ScaleSpec(gpus_per_node=self.gpus_per_node, held_share=self.held_share,
                         prefix=self.prefix, seed=self.seed).scaled(
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
        from bench.scale import _problem_nodes

        return frozenset(_problem_nodes(sc))

    def pre_populated(self) -> int:
        """VMIs running before the churn starts (asked of the population)."""
        sc = self.scale_spec()
        return sc.vmis if sc else 0

    def budget(self, resource: str | None = None) -> int:
        """A tenant's budget of `resource` (None: the own class's): `budget_share` of that
        class's GPUs, at least 8."""
        res = list(self.classes().values())
        share = 1 / len(res) if resource is None or resource in res else 0
        return max(8, int(self.nodes * self.gpus_per_node * share * self.budget_share))

    def tenant(self, i: int) -> str:
        return f"{self.prefix}t{i:02d}"

    def node(self, i: int) -> str:
        return f"{self.prefix}n{i:04d}"


@dataclass(frozen=True)
class Op:
    """One scheduled operation: at `at` s into the churn, `kind` one of create, delete,
    cordon, uncordon, kill-leader, restart-apiserver; `tenant`/`size`/`held`/`name`/`cls`
    (index into `SoakSpec.classes()`) for VMIs, `node` for cordons."""

    at: float
    kind: str
    tenant: int = -1
    size: int = 0
    held: bool = False
    name: str = ""
    node: int = -1
    cls: int = 0


def schedule(spec: SoakSpec) -> list[Op]:
    """The churn's operations, sorted by time; a pure function of `spec` (same seed, same
    list). Kills at `kill_every`, 2·`kill_every`, … before `disturb_until`; the restart at
    `restart_at` of the run, moved 5 s on while within 15 s of a kill. ValueError when
    `disturb_until` ≤ 0 or the restart does not fit before it."""
    if spec.disturb_until <= 0:
        raise ValueError(f"no room for disturbances: steady stretch from {spec.steady_from} s, "
                         f"disturbances until {spec.disturb_until} s")
    rng = random.Random(spec.seed)
    sizes, weights = zip(*SIZES)
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
                      cls=cls))
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
    return sorted(ops, key=lambda o: o.at)   # stable: a delete stays before its create


def schedule_digest(ops: list[Op]) -> str:
    """A short hash of a schedule (printed, so two runs can be seen to replay the same)."""
    import hashlib

    return hashlib.sha256(json.dumps([asdict(o) for o in ops]).encode()).hexdigest()[:12]


# -- RSS ----------------------------------------------------------------------------------

def rss_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB, None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _fit(ts: list[float], ys: list[float]) -> tuple[float, float, float, float]:
    """Least squares y = a + b·t over ≥ 3 points with distinct t: (a, b, standard error of b,
    residual standard deviation), in the units of y and t."""
    n = len(ts)
    tm, ym = statistics.fmean(ts), statistics.fmean(ys)
    sxx = sum((t - tm) ** 2 for t in ts)
    b = sum((t - tm) * (y - ym) for t, y in zip(ts, ys)) / sxx
    a = ym - b * tm
    sd = math.sqrt(sum((y - a - b * t) ** 2 for t, y in zip(ts, ys)) / (n - 2))
    return a, b, sd / math.sqrt(sxx), sd


def rss_trend(samples: list[tuple[float, int, int, float]], start: float, end: float, *,
              every: float = 10.0, threshold: float = RSS_SLOPE_MAX_MIB_PER_MIN) -> dict:
    """The RSS judgement over the steady stretch [`start`, `end`] s of `samples` [(t s,
    replica index, pid, RSS MiB)] taken every `every` s. Pure.

    Judged: each process (replica, pid) alive through the whole stretch — a sample at or
    before `start` and one at or after `end - 1.5·every` — fitted on its samples within the
    stretch (at least 5 spanning ≥ 60 s). Its verdict against `threshold` (MiB/min): "flat"
    when slope + 2 SE ≤ threshold, "growing" when slope − 2 SE > threshold, else
    "inconclusive". The run's verdict: "growing" if any process grows, "flat" if every judged
    one is flat, "inconclusive" otherwise, None when no process was judged. Processes not
    alive through it are listed with why (`excluded`). Returns {from_s, to_s,
    threshold_mib_per_min, threshold_why, processes: [{replica, pid, samples, span_s,
    slope_mib_per_min, se_mib_per_min, ci95_mib_per_min: [lo, hi], resid_sd_mib,
    level_mib (fitted at `end`), peak_mib, hours_to_target (None when not growing),
    verdict}], excluded: [{replica, pid, first_s, last_s, why}], verdict, peak_mib}."""
    by: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for t, i, pid, mib in samples:
        by.setdefault((i, pid), []).append((t, mib))
    judged, excluded = [], []
    for (i, pid), pts in sorted(by.items()):
        pts.sort()
        first, last = pts[0][0], pts[-1][0]
        why = ("started after the stretch began" if first > start else
               "gone before the stretch ended" if last < end - 1.5 * every else "")
        fit = [(t, m) for t, m in pts if start <= t <= end]
        if not why and (len(fit) < 5 or fit[-1][0] - fit[0][0] < 60):
            why = "too few samples in the stretch"
        if why:
            excluded.append({"replica": i, "pid": pid, "first_s": first, "last_s": last,
                             "why": why})
            continue
        a, b, se, sd = _fit([t for t, _ in fit], [m for _, m in fit])
        slope, se = b * 60, se * 60
        lo, hi = slope - 2 * se, slope + 2 * se
        level = a + b * end
        verdict = "flat" if hi <= threshold else "growing" if lo > threshold else "inconclusive"
        judged.append({
            "replica": i, "pid": pid, "samples": len(fit),
            "span_s": round(fit[-1][0] - fit[0][0], 1),
            "slope_mib_per_min": round(slope, 3), "se_mib_per_min": round(se, 3),
            "ci95_mib_per_min": [round(lo, 3), round(hi, 3)],
            "resid_sd_mib": round(sd, 2), "level_mib": round(level, 1),
            "peak_mib": round(max(m for _, m in fit), 1),
            "hours_to_target": (round(max(0.0, RSS_TARGET_MIB - level) / slope / 60, 1)
                                if slope > 0 and verdict != "flat" else None),
            "fit": [round(a, 3), round(b, 6)],
            "verdict": verdict})
    verdicts = {p["verdict"] for p in judged}
    verdict = (None if not judged else "growing" if "growing" in verdicts else
               "flat" if verdicts == {"flat"} else "inconclusive")
    return {"from_s": start, "to_s": end, "threshold_mib_per_min": threshold,
            "threshold_why": RSS_SLOPE_WHY, "processes": judged, "excluded": excluded,
            "verdict": verdict,
            "peak_mib": round(max(m for *_, m in samples), 1) if samples else None}


# -- the run ------------------------------------------------------------------------------

@dataclass
class Rec:
    """One create (or a VMI of the population): outcome "admitted" / "refused" / "lost" (no
    answer in time, or admitted without a launcher Pod bound on its pin), its GPUClass, the
    pin, the launcher Pod's node, held devices named and how many of them moved."""

    ns: str
    name: str
    size: int
    cls: str = ""
    held: tuple[str, ...] = ()
    outcome: str = ""
    refusal: str = ""
    pin: str = ""
    pod_node: str = ""
    uid: str = ""
    answer_s: float = 0.0
    moved: int = 0
    tries: int = 0


class Pods:
    """Launcher Pods in the soak's namespaces by VMI uid (label kubevirt.io/created-by) ->
    nodeName; `watch()` runs in a task group, re-listing after any error (the API server
    restarts); `bound(uid, timeout)` waits for a node ("" if none)."""

    def __init__(self, api, prefix: str) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        self.core, self.prefix = CoreV1Api(api), prefix
        self.node: dict[str, str] = {}
        self._wait: dict[str, anyio.Event] = {}

    def _event(self, kind: str, obj: dict) -> None:
        uid = (obj["metadata"].get("labels") or {}).get(inv.CREATED_BY)
        if not uid:
            return
        if kind == "DELETED":
            self.node.pop(uid, None)
            return
        self.node[uid] = obj["spec"].get("nodeName") or ""
        if self.node[uid] and uid in self._wait:
            self._wait.pop(uid).set()

    async def watch(self) -> None:
        from bench.packing import _watch

        while True:
            try:
                await _watch(self.core.list_pod_for_all_namespaces, (), self._event, self.prefix)
            except Exception:   # noqa: BLE001 — the API server restarting; list again
                await anyio.sleep(1)

    async def bound(self, uid: str, timeout: float) -> str:
        if not self.node.get(uid):
            ev = self._wait.setdefault(uid, anyio.Event())
            with anyio.move_on_after(timeout):
                await ev.wait()
        return self.node.get(uid, "")


def _message(exc) -> str:
    try:
        return json.loads(exc.body).get("message", "") or str(exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "body", "") or getattr(exc, "reason", "") or exc)


_SPAWNER = None


def _spawner():
    """The process-wide spawner thread (a one-worker ThreadPoolExecutor, never shut down:
    what it starts lives as long as the process needs it)."""
    global _SPAWNER
    if _SPAWNER is None:
        from concurrent.futures import ThreadPoolExecutor

        _SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="soak-spawner")
    return _SPAWNER


async def _until(probe, timeout: float, interval: float) -> bool:
    """Poll `probe()` every `interval` s until it is truthy (True) or `timeout` s pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if await probe():
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(interval)


def vmi_body(spec: SoakSpec, rec: Rec) -> dict:
    """KubeVirt's own vmi-gpu example asking for `rec`'s devices (held by name, else
    templates of its class)."""
    from bench.packing import _base_vmi

    v = _base_vmi()
    v["apiVersion"] = f"{VMI_GROUP}/{VMI_VERSION}"
    v["metadata"] = {"name": rec.name, "annotations": (
        {"gpu.cozystack.io/devices": ",".join(rec.held)} if rec.held
        else {"gpu.cozystack.io/templates": f"{rec.cls or spec.cls}={rec.size}"})}
    del v["spec"]["domain"]["devices"]["gpus"]
    return v


class Soak:
    """The churn driver on a running cluster (`lc` a LocalCluster whose replicas it may kill,
    `cp` its ControlPlane, `api` an admin ApiClient). `populate()` then `run()`; `report()`."""

    def __init__(self, lc, api, spec: SoakSpec, log=print) -> None:
        from localcluster.fleet import Fleet

        self.lc, self.cp, self.api, self.spec, self.log = lc, lc.cp, api, spec, log
        self.fleet = Fleet(api)
        self.ops = schedule(spec)
        self.recs: list[Rec] = []
        self.admitted: set[tuple[str, str]] = set()          # held as admitted, not deleting
        self.running: dict[str, deque[Rec]] = {}              # deletable, oldest first
        self.held_free: dict[tuple[str, str], set[str]] = {}   # (ns, class) -> free held
        self.held_node: dict[tuple[str, str], str] = {}
        self.population: dict = {}
        self.counts: Counter = Counter()
        self.tally = inv.Tally()
        self.events: list[dict] = []
        self.rss: list[tuple[float, int, int, float]] = []
        # (t s, replica, pid, {informer: objects}) from `gpu_binder_cache_objects`
        self.cached: list[tuple[float, int, int, dict[str, int]]] = []
        self.samples: list[tuple[float, int, int]] = []        # (t, violations so far, admitted)
        self.cordoned: set[str] = set()
        self.t0 = 0.0
        self.churning = False
        self.pods = Pods(api, spec.prefix)
        self.final: dict = {}

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- population --------------------------------------------------------------------
    async def populate(self, kv) -> dict:
        """The spec's population ("own": `populate_own`, "scale": `populate_scale`); returns
        seconds per phase."""
        if self.spec.population == "scale":
            return await self.populate_scale(kv)
        return await self.populate_own(kv)

    async def populate_scale(self, kv) -> dict:
        """`bench.scale.populate` with `spec.scale_spec()` (its VMIs through the real path,
        awaited until their launcher Pods are bound), then a ResourceQuota `gpu-budget` per
        tenant (`spec.budget` of each class's resource, at least what the tenant's admitted
        VMIs hold plus two nodes' GPUs), and the churn's state from it: every
        admitted VMI running (deletable, oldest first, held as admitted), every held
        GPUDevice no admitted VMI names free for the churn's held creates. Returns seconds
        per phase (and keeps the population's summary in `self.population`)."""
        from bench.scale import populate

        s, sc = self.spec, self.spec.scale_spec()
        pop = await populate(self.lc, kv, self.fleet, sc)
        t = time.monotonic()
        used: Counter = Counter()
        for v in pop.admitted:
            used[(v.namespace, sc.classes[v.cls])] += v.size
        budgets = {}
        for ns in pop.tenants:
            # never below what the population already holds (at small fleets a tenant's share
            # of it can pass budget_share), with two nodes' worth of room to churn in
            budgets[ns] = {r: max(s.budget(r), used[(ns, r)] + 2 * s.gpus_per_node)
                           for r in sc.classes.values()}
            await self.fleet.core.create_namespaced_resource_quota(ns, {
                "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-budget"},
                "spec": {"hard": {f"requests.{r}": str(n) for r, n in budgets[ns].items()}}})
            self.running[ns] = deque()
            for cls in sc.classes:
                self.held_free[(ns, cls)] = set()
        named = set()
        for v in pop.vmis:
            if not v.admitted:
                continue
            rec = Rec(v.namespace, v.name, v.size, cls=v.cls, held=v.held, outcome="admitted",
                      pin=v.pin, pod_node=v.node, uid=v.uid)
            self.admitted.add((rec.ns, rec.name))
            self.running[rec.ns].append(rec)
            for h in v.held:
                named.add((v.namespace, h))
                self.held_node[(v.namespace, h)] = v.pin
        devs = await self.fleet.custom.list_cluster_custom_object(DEV_GROUP, DEV_VERSION,
                                                                  "gpudevices")
        for d in devs["items"]:
            md = d["metadata"]
            key = (md["namespace"], d["spec"].get("class", ""))
            if (key in self.held_free and inv.TEMPLATE_LABEL not in (md.get("labels") or {})
                    and (md["namespace"], md["name"]) not in named):
                self.held_free[key].add(md["name"])
        self.population = {**pop.summary(), "budgets": budgets,
                           "held_free": sum(map(len, self.held_free.values()))}
        return {**{f"{k}_s": round(v, 1) for k, v in pop.seconds.items()},
                "budgets_s": round(time.monotonic() - t, 1)}

    async def populate_own(self, kv) -> dict:
        """The class (KubeVirt permitting its resource), `nodes` KWOK nodes, the tenants
        with budgets and held devices; returns seconds per phase. Waits until the class is
        KubeVirtPermitted (TimeoutError after 90 s)."""
        s, t = self.spec, time.monotonic()
        kv.set_permitted(tuple(sorted({*kv.permitted, s.resource})))
        await self.fleet.gpu_class(s.cls, s.resource)
        sem = anyio.Semaphore(16)

        async def node(i: int) -> None:
            async with sem:
                await self.fleet.node(s.node(i), {s.resource: s.gpus_per_node}, kwok=True)

        async with anyio.create_task_group() as tg:
            for i in range(s.nodes):
                tg.start_soon(node, i)
        phases = {"nodes_s": round(time.monotonic() - t, 1)}
        t = time.monotonic()
        for k in range(s.n_tenants):
            ns = s.tenant(k)
            await self.fleet.tenant(ns, budgets={s.resource: s.budget()})
            self.held_free[(ns, s.cls)] = set()
            self.running[ns] = deque()
            for h in range(s.held):
                await self.fleet.device(ns, f"held-{h}", s.cls)
                self.held_free[(ns, s.cls)].add(f"held-{h}")

        async def permitted():
            got = await self.fleet.custom.get_cluster_custom_object(DEV_GROUP, DEV_VERSION,
                                                                    "gpuclasses", s.cls)
            return [c for c in (got.get("status") or {}).get("conditions") or []
                    if c["type"] == "KubeVirtPermitted" and c["status"] == "True"]
        if not await _until(permitted, 90, 0.5):
            raise TimeoutError(f"GPUClass {s.cls} not KubeVirtPermitted in 90 s")
        phases["tenants_s"] = round(time.monotonic() - t, 1)
        return phases

    # -- operations --------------------------------------------------------------------
    async def _call(self, fn, *args, what: str, deadline: float, **kw):
        """`fn(*args)` retried on transport errors and 5xx (the API server or a replica
        restarting, a tenant's retry) and 429 until `deadline` (monotonic); ApiException 4xx
        propagate; TimeoutError at the deadline."""
        import aiohttp
        from kubernetes_asyncio.client import ApiException

        while True:
            try:
                return await fn(*args, _request_timeout=40, **kw)
            except ApiException as exc:
                if exc.status == 429 or exc.status >= 500:
                    self.counts[f"retried_{what}_{exc.status}"] += 1
                    wait = float((exc.headers or {}).get("Retry-After") or 1)
                else:
                    raise
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.counts[f"retried_{what}_{type(exc).__name__}"] += 1
                wait = 1.0
            if time.monotonic() + wait > deadline:
                raise TimeoutError(what)
            await anyio.sleep(wait)

    async def create(self, op: Op) -> None:
        from kubernetes_asyncio.client import ApiException

        s = self.spec
        ns = s.tenant(op.tenant)
        cls = list(s.classes())[op.cls]
        rec = Rec(ns, op.name, op.size, cls=cls)
        pool = self.held_free[(ns, cls)]
        if op.held and len(pool) >= op.size:
            rec.held = tuple(sorted(pool)[:op.size])
            pool -= set(rec.held)
        self.recs.append(rec)
        before = {h: self.held_node.get((ns, h), "") for h in rec.held}
        t, deadline = time.monotonic(), time.monotonic() + s.answer_timeout
        custom = self.fleet.custom
        try:
            try:
                made = await self._call(custom.create_namespaced_custom_object, VMI_GROUP,
                                        VMI_VERSION, ns, VMIS, vmi_body(s, rec),
                                        what="create", deadline=deadline)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # an earlier try's answer was lost on the way: the VMI is there
                self.counts["found_after_lost_answer"] += 1
                made = await self._call(custom.get_namespaced_custom_object, VMI_GROUP,
                                        VMI_VERSION, ns, VMIS, rec.name, what="get",
                                        deadline=deadline + 30)
        except ApiException as exc:
            rec.outcome, rec.refusal = "refused", f"{exc.status}: {_message(exc)}"[:300]
            rec.answer_s = round(time.monotonic() - t, 3)
            self.held_free[(ns, cls)] |= set(rec.held)
            return
        except TimeoutError:
            rec.outcome = "lost"
            rec.refusal = f"no answer in {s.answer_timeout:.0f} s"
            self.log(f"soak: LOST {ns}/{rec.name}: {rec.refusal}")
            return
        rec.answer_s = round(time.monotonic() - t, 3)
        rec.uid = made["metadata"]["uid"]
        rec.pin = (made["spec"].get("nodeSelector") or {}).get(inv.PIN_LABEL, "")
        rec.outcome = "admitted"
        rec.moved = sum(1 for h, n in before.items() if n and n != rec.pin)
        for h in rec.held:
            self.held_node[(ns, h)] = rec.pin
        self.counts["held_moves"] += rec.moved
        self.admitted.add((ns, rec.name))
        rec.pod_node = await self.pods.bound(rec.uid, s.pod_timeout)
        if rec.pod_node != rec.pin:
            rec.outcome = "lost"
            rec.refusal = f"admitted on {rec.pin}; launcher Pod on {rec.pod_node!r}"
            self.log(f"soak: LOST {ns}/{rec.name}: {rec.refusal}")
        if (ns, rec.name) in self.admitted:
            self.running[ns].append(rec)

    async def delete(self, op: Op) -> None:
        from kubernetes_asyncio.client import ApiException

        ns = self.spec.tenant(op.tenant)
        if len(self.admitted) < self.spec.n_live:   # refusals left the live set short
            self.counts["delete_skipped_below_live"] += 1
            return
        if not self.running[ns]:
            self.counts["delete_skipped"] += 1
            return
        rec = self.running[ns].popleft()
        self.admitted.discard((ns, rec.name))
        try:
            await self._call(self.fleet.custom.delete_namespaced_custom_object, VMI_GROUP,
                             VMI_VERSION, ns, VMIS, rec.name, what="delete",
                             deadline=time.monotonic() + 120)
        except ApiException as exc:
            if exc.status != 404:
                self.counts[f"delete_{exc.status}"] += 1
        except TimeoutError:
            self.counts["delete_timeout"] += 1
        self.counts["deleted"] += 1
        self.held_free[(ns, rec.cls)] |= set(rec.held)

    async def cordon(self, op: Op, on: bool) -> None:
        name = self.spec.node(op.node)
        await self._call(self.fleet.core.patch_node, name, {"spec": {"unschedulable": on}},
                         what="cordon", deadline=time.monotonic() + 60,
                         _content_type="application/merge-patch+json")
        (self.cordoned.add if on else self.cordoned.discard)(name)
        self.counts["cordons" if on else "uncordons"] += 1

    async def _spawning(self, fn, *args):
        """Run `fn(*args)` (one that starts a process: a replica, kube-apiserver) on the
        soak's one long-lived spawner thread. The harness starts its processes with
        PR_SET_PDEATHSIG, which the kernel ties to the *thread* that forked them: started
        from an anyio worker thread (which exits when idle) they would be SIGKILLed seconds
        later."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(_spawner(), fn, *args)

    def _leader_index(self) -> int | None:
        who = self.lc.leader()
        return next((i for i, r in enumerate(self.lc.replicas) if r.identity == who), None)

    async def kill_leader(self) -> None:
        """kill -9 the Lease holder, restart it, and record the takeover (s until another
        replica holds the Lease)."""
        i = await anyio.to_thread.run_sync(self._leader_index)
        if i is None:
            self.events.append({"at": round(self.now(), 1), "kind": "kill-leader",
                                "skipped": "no leader"})
            return
        old = self.lc.replicas[i].identity
        at, t = round(self.now(), 1), time.monotonic()
        await anyio.to_thread.run_sync(self.lc.kill_replica, i)
        new = None
        while time.monotonic() - t < 120:
            new = await anyio.to_thread.run_sync(self.lc.leader)
            if new and new != old:
                break
            await anyio.sleep(0.5)
        takeover = round(time.monotonic() - t, 1)
        await self._spawning(self.lc.start_replica, i)
        await anyio.to_thread.run_sync(self.lc.wait_ready, i, 90)
        self.events.append({"at": at, "kind": "kill-leader", "killed": old, "new_leader": new,
                            "takeover_s": takeover,
                            "back_s": round(time.monotonic() - t, 1)})
        self.log(f"soak: t={at:.0f}s killed leader {old}; {new} leads after {takeover} s")

    async def restart_apiserver(self) -> None:
        at, t = round(self.now(), 1), time.monotonic()
        await self._spawning(self.cp.restart_apiserver)
        self.events.append({"at": at, "kind": "restart-apiserver",
                            "outage_s": round(time.monotonic() - t, 1)})
        self.log(f"soak: t={at:.0f}s kube-apiserver killed and restarted "
                 f"({time.monotonic() - t:.1f} s down)")

    async def _op(self, op: Op) -> None:
        try:
            if op.kind == "create":
                await self.create(op)
            elif op.kind == "delete":
                await self.delete(op)
            elif op.kind in ("cordon", "uncordon"):
                await self.cordon(op, op.kind == "cordon")
            elif op.kind == "kill-leader":
                await self.kill_leader()
            elif op.kind == "restart-apiserver":
                await self.restart_apiserver()
        except Exception as exc:   # noqa: BLE001 — an op's failure is a figure, not the end
            self.counts[f"op_error_{op.kind}"] += 1
            self.events.append({"at": round(self.now(), 1), "kind": f"{op.kind}-error",
                                "error": repr(exc)[:300]})

    # -- sampling ----------------------------------------------------------------------
    async def _sample(self, final: bool = False) -> list[inv.Violation] | None:
        before = set(self.admitted)
        try:
            snap = (await inv.snapshot(self.api, pods=final)).within(self.spec.prefix)
        except Exception:   # noqa: BLE001 — the API server restarting: no sample this time
            self.counts["samples_failed"] += 1
            return None
        got = inv.check(snap, settled=before & self.admitted if not final else before,
                        final=final)
        return got

    async def sampler(self) -> None:
        while self.churning:
            got = await self._sample()
            if got is not None:
                for v in self.tally.add(got):
                    self.log(f"soak: VIOLATION t={self.now():.0f}s §{v.item} {v.kind} "
                             f"{'/'.join(map(str, v.obj))}: {v.message[:300]}")
                self.samples.append((round(self.now(), 1), len(self.tally.seen),
                                     len(self.admitted)))
            await anyio.sleep(self.spec.check_every)

    async def rss_sampler(self) -> None:
        """Every `rss_every` s, each live replica's RSS and the objects its informers hold
        (`gpu_binder_cache_objects` from its /metrics; a scrape that fails is skipped): what
        a growing RSS may follow."""
        while self.churning:
            for i, r in enumerate(self.lc.replicas):
                if r.alive:
                    mib = rss_mib(r.proc.pid)
                    if mib is not None:
                        self.rss.append((round(self.now(), 1), i, r.proc.pid, round(mib, 1)))
                    held = await cache_objects(self.lc, i)
                    if held is not None:
                        self.cached.append((round(self.now(), 1), i, r.proc.pid, held))
            await anyio.sleep(self.spec.rss_every)

    async def heap_reporter(self) -> None:
        """SIGUSR2 to every live replica at the steady stretch's start and end: each logs a
        `heap report` (actors.heap.heap_report: gc's objects; traced bytes and a tracemalloc
        snapshot when run with PYTHONTRACEMALLOC), read back by `heap_reports`."""
        for at in (self.spec.steady_from, self.spec.seconds):
            if at > self.now():
                await anyio.sleep(at - self.now())
            for r in self.lc.replicas:
                if r.alive:
                    r.proc.send_signal(signal.SIGUSR2)

    # -- the whole run -----------------------------------------------------------------
    async def run(self) -> dict:
        """The churn (ops at their scheduled times; each in its own task), the samplers,
        then settling (uncordon all, every replica up, housekeeping clear, launcher Pods
        bound) and the final check. Returns the report."""
        s = self.spec
        self.log(f"soak: seed {s.seed}, {len(self.ops)} operations over {s.minutes:g} min, "
                 f"schedule {schedule_digest(self.ops)}")
        async with anyio.create_task_group() as outer:
            outer.start_soon(self.pods.watch)
            self.t0, self.churning = time.monotonic(), True
            async with anyio.create_task_group() as samplers:
                samplers.start_soon(self.sampler)
                samplers.start_soon(self.rss_sampler)
                samplers.start_soon(self.heap_reporter)
                async with anyio.create_task_group() as tg:
                    for op in self.ops:
                        wait = op.at - self.now()
                        if wait > 0:
                            await anyio.sleep(wait)    # pacing the seeded schedule
                        tg.start_soon(self._op, op)
                    self.log(f"soak: t={self.now():.0f}s last operation started; "
                             f"waiting for answers and launcher Pods")
                self.churn_s = round(self.now(), 1)
                await self.settle()
                self.churning = False
            outer.cancel_scope.cancel()
        return self.report()

    async def settle(self) -> None:
        """Uncordon every node the churn left cordoned, wait until every replica runs and a
        leader holds the Lease, then until housekeeping has cleared what deleted VMIs left
        and every admitted VMI's launcher Pod is bound (`settle_timeout`); then the final
        check (its violations are counted whether or not settling finished)."""
        t = time.monotonic()
        for name in sorted(self.cordoned):
            await self.fleet.cordon(name, False)
        for i, r in enumerate(self.lc.replicas):
            if not r.alive:
                await self._spawning(self.lc.start_replica, i)
                await anyio.to_thread.run_sync(self.lc.wait_ready, i, 90)
        left: list = []

        async def settled():
            try:
                snap = (await inv.snapshot(self.api, pods=True)).within(self.spec.prefix)
            except Exception:   # noqa: BLE001
                return None
            left[:] = inv.leftovers(snap) + [
                v for v in inv.check(snap, settled=set(self.admitted), final=True)
                if v.kind == inv.LAUNCHER_OFF_PIN]
            return None if left else snap
        settled_ok = await _until(settled, self.spec.settle_timeout, 1.0)
        got = await self._sample(final=True)
        final = (got or []) + (inv.leftovers((await inv.snapshot(self.api)).within(
            self.spec.prefix)) if not settled_ok else [])
        for v in self.tally.add(final):
            self.log(f"soak: VIOLATION (final) §{v.item} {v.kind} "
                     f"{'/'.join(map(str, v.obj))}: {v.message[:300]}")
        self.final = {"settled": settled_ok, "settle_s": round(time.monotonic() - t, 1),
                      "violations": len(final), "admitted_running": len(self.admitted)}

    def steady(self) -> dict:
        """The steady stretch [spec.steady_from, spec.seconds]: its bounds, the operations
        scheduled in it by kind, and the VMIs held as admitted at its samples (min, max)."""
        s = self.spec
        live = [n for t, _, n in self.samples if s.steady_from <= t <= s.seconds]
        return {"from_s": s.steady_from, "to_s": s.seconds,
                "share": round(1 - s.steady_from / s.seconds, 3),
                "operations": dict(Counter(o.kind for o in self.ops
                                           if o.at >= s.steady_from)),
                "live_min": min(live) if live else None, "live_max": max(live) if live else None}

    def report(self) -> dict:
        out = Counter(r.outcome for r in self.recs)
        answers = sorted(r.answer_s for r in self.recs if r.outcome in ("admitted", "refused"))
        trend = rss_trend(self.rss, self.spec.steady_from, self.spec.seconds,
                          every=self.spec.rss_every)
        return {
            "seed": self.spec.seed, "schedule": schedule_digest(self.ops),
            "spec": asdict(self.spec), "operations": dict(Counter(o.kind for o in self.ops)),
            "population": self.population,
            "churn_s": getattr(self, "churn_s", None),
            "creates": len(self.recs), "admitted": out["admitted"], "refused": out["refused"],
            "admissions_lost": out["lost"],
            "lost": [asdict(r) for r in self.recs if r.outcome == "lost"][:20],
            "refusal_reasons": dict(Counter(refusal_reason(r.refusal)
                                            for r in self.recs if r.outcome == "refused")
                                    .most_common(8)),
            "answer_p50_s": answers[len(answers) // 2] if answers else None,
            "answer_p99_s": answers[int(len(answers) * .99)] if answers else None,
            "violations": len(self.tally.seen), "violations_by_kind": self.tally.by_kind(),
            "violation_list": [v.to_dict() for v in self.tally.violations][:50],
            "samples": self.tally.samples, "counts": dict(self.counts),
            "events": self.events, "final": self.final,
            "steady": self.steady(), "rss_trend": trend, "rss_peak_mib": trend["peak_mib"],
            "rss_samples": self.rss, "violation_timeline": self.samples,
            "cache_samples": self.cached,
            "cache_over_steady": cache_change(self.cached, trend["from_s"], trend["to_s"]),
            "heap_over_steady": heap_change(heap_reports(
                [r.log_path for r in self.lc.replicas])),
        }


def refusal_reason(refusal: str) -> str:
    """'403: admission webhook "…" denied the request: <reason>' -> '403: <reason>' (its
    first 80 characters): what the report counts refusals by."""
    status, _, message = refusal.partition(": ")
    return f"{status}: {message.rpartition('denied the request: ')[2]}"[:80]


def heap_reports(logs: list[Path]) -> list[dict]:
    """The `heap report` lines (JSON) of the replicas' logs, in order, each with the index
    of the log it came from as `replica`."""
    out = []
    for i, path in enumerate(logs):
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if '"heap report"' in line:
                try:
                    out.append({**json.loads(line), "replica": i})
                except ValueError:
                    pass
    return out


def heap_change(reports: list[dict], top: int = 12) -> list[dict]:
    """For each process with two heap reports or more (alive at the steady stretch's start
    and end, when the soak sent SIGUSR2): its first and last (gc's objects, traced MiB) and,
    when both wrote a tracemalloc snapshot, the `top` source lines whose allocations grew
    most between them ([file:line, KiB, blocks])."""
    import tracemalloc

    by: dict[tuple[int, int], list[dict]] = {}
    for r in reports:
        by.setdefault((r["replica"], r.get("pid")), []).append(r)
    out = []
    for (replica, pid), mine in by.items():
        if len(mine) < 2:
            continue
        first, last = mine[0], mine[-1]
        row = {"replica": replica, "pid": pid,
               "gc_objects": [first["gc_objects"], last["gc_objects"]],
               "gc_frozen": last.get("gc_frozen")}
        if first.get("snapshot") and last.get("snapshot"):
            row["traced_mib"] = [round(first["traced_bytes"] / 2**20, 1),
                                 round(last["traced_bytes"] / 2**20, 1)]
            try:
                a = tracemalloc.Snapshot.load(first["snapshot"])
                b = tracemalloc.Snapshot.load(last["snapshot"])
            except OSError as exc:
                row["top_growth"] = f"cannot read the snapshots: {exc}"
            else:
                row["top_growth"] = [
                    [str(d.traceback[0]), round(d.size_diff / 1024, 1), d.count_diff]
                    for d in b.compare_to(a, "lineno")[:top]]
        out.append(row)
    return out


async def cache_objects(lc, i: int) -> dict[str, int] | None:
    """{informer: objects held} of replica `i` from its /metrics (`gpu_binder_cache_objects`),
    None when the scrape fails (a replica starting or killed)."""
    from localcluster.metrics_text import parse_metrics

    try:
        text = await anyio.to_thread.run_sync(lc.metrics, i)
    except OSError:
        return None
    return {dict(labels).get("informer", "?"): int(v)
            for (name, labels), v in parse_metrics(text).items()
            if name == "gpu_binder_cache_objects"}


def cache_change(samples: list[tuple[float, int, int, dict[str, int]]], start: float,
                 end: float) -> list[dict]:
    """For each process sampled at least twice within the steady stretch [`start`, `end`] s,
    its informers' objects at the first and the last of those samples, in order of replica
    and first sample: [{replica, pid, first_s, last_s, first: {informer: n}, last: {…}}].
    Pure."""
    by: dict[tuple[int, int], list[tuple[float, dict[str, int]]]] = {}
    for t, i, pid, held in sorted(samples, key=lambda x: x[0]):
        if start <= t <= end:
            by.setdefault((i, pid), []).append((t, held))
    return [{"replica": i, "pid": pid, "first_s": pts[0][0], "last_s": pts[-1][0],
             "first": pts[0][1], "last": pts[-1][1]}
            for (i, pid), pts in sorted(by.items(), key=lambda kv: (kv[0][0], kv[1][0][0]))
            if len(pts) >= 2]


async def soak_on(lc, kv, spec: SoakSpec, log=print) -> dict:
    """Populate and soak on a running LocalCluster `lc` (its KubeVirt harness `kv`); the
    report (see `Soak.report`) with the population's phase seconds."""
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.config import load_kube_config

    cfg = Configuration()
    await load_kube_config(config_file=str(lc.cp.admin_kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 64
    async with ApiClient(cfg) as api:
        soak = Soak(lc, api, spec, log)
        phases = await soak.populate(kv)
        log(f"soak: populated ({spec.population}) {spec.nodes} nodes, {spec.n_tenants} "
            f"tenants: {phases}")
        report = await soak.run()
        report["population_s"] = phases
        return report


def targets(report: dict) -> dict:
    """Issue 22's soak targets in a report: 0 violations, 0 admissions lost, replica RSS flat
    over the steady stretch (`rss_trend`'s verdict), peak RSS under RSS_TARGET_MIB."""
    trend = report["rss_trend"]
    return {
        "violations": {"value": report["violations"], "target": 0,
                       "met": report["violations"] == 0},
        "admissions_lost": {"value": report["admissions_lost"], "target": 0,
                            "met": report["admissions_lost"] == 0},
        "rss_flat": {"value": {f"replica-{p['replica']} pid {p['pid']}":
                               f"{p['slope_mib_per_min']} ± {2 * p['se_mib_per_min']:.3f}"
                               for p in trend["processes"]} or None,
                     "target": f"slope + 2 SE <= {trend['threshold_mib_per_min']} MiB/min "
                               f"over {trend['from_s']:.0f}-{trend['to_s']:.0f} s",
                     "met": None if trend["verdict"] in (None, "inconclusive")
                     else trend["verdict"] == "flat"},
        "rss_peak": {"value": report["rss_peak_mib"], "target": f"< {RSS_TARGET_MIB:g} MiB",
                     "met": None if report["rss_peak_mib"] is None
                     else report["rss_peak_mib"] < RSS_TARGET_MIB}}


def run(out: Path, *, nodes: int = 1000, minutes: float = 20.0, seed: int = 1,
        population: str = "scale", create_rate: float = 2.0, tracemalloc: bool = False) -> dict:
    """The soak on a cluster of its own (2 replicas with SOAK_ARGS, KubeVirt), `population`
    "scale" (default) or "own", `create_rate` VMI creates per second (with the scale
    population each preceded by a delete: twice that in operations); writes soak.json and
    soak.png into `out`; returns the report. `tracemalloc`: the replicas run with
    PYTHONTRACEMALLOC=1 (slower) and the report names the source lines whose allocations grew
    over the steady stretch. ValueError when `minutes` is not in (0, 20], `create_rate` is
    not in (0, MAX_CREATE_RATE], or the run leaves no room for the disturbances."""
    from localcluster.cluster import LocalCluster

    if not 0 < minutes <= 20:
        raise ValueError(f"--minutes is at most 20, got {minutes}")
    if not 0 < create_rate <= MAX_CREATE_RATE:   # also refuses nan and inf
        raise ValueError(f"--create-rate is creates per second in (0, {MAX_CREATE_RATE:g}], "
                         f"got {create_rate}")
    spec = SoakSpec(nodes=nodes, minutes=minutes, seed=seed, population=population,
                    create_rate=create_rate)
    ops = schedule(spec)   # the ValueError before any cluster starts
    out.mkdir(parents=True, exist_ok=True)
    print(f"soak: seed {seed}, schedule {schedule_digest(ops)}: {len(ops)} operations; "
          f"disturbances until {spec.disturb_until:.0f} s, steady stretch "
          f"{spec.steady_from:.0f}-{spec.seconds:.0f} s", flush=True)
    report_head = {"benchmark": "soak", "load_before": os.getloadavg(),
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                               "platform": platform.platform()}}
    t = time.monotonic()
    with LocalCluster(controllers=2, controller_args=SOAK_ARGS, log_dir=out / "logs",
                      kubevirt=True,
                      controller_env={"PYTHONTRACEMALLOC": "1"} if tracemalloc else None) as lc:
        from bench.packing import _commit

        report = {**report_head, "commit": _commit(), "controller_args": list(SOAK_ARGS),
                  **anyio.run(soak_on, lc, lc.kubevirt, spec,
                              lambda m: print(m, flush=True))}
    report["load_after"] = os.getloadavg()
    report["wall_s"] = round(time.monotonic() - t, 1)
    report["targets"] = targets(report)
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "soak.png")
    for line in summary(report):
        print(line, flush=True)
    return report


def summary(report: dict) -> list[str]:
    """Human lines of a report."""
    tr = report["rss_trend"]
    st = report.get("steady") or {}
    return [f"soak seed {report['seed']} schedule {report['schedule']}: "
            f"{report['creates']} creates, {report['admitted']} admitted, "
            f"{report['refused']} refused, {report['counts'].get('deleted', 0)} deleted, "
            f"{report['counts'].get('held_moves', 0)} held-device moves",
            f"violations {report['violations']} {report['violations_by_kind']}, "
            f"admissions lost {report['admissions_lost']}, samples {report['samples']}",
            f"events {[(e['at'], e['kind'], e.get('takeover_s', e.get('outage_s'))) for e in report['events']]}",
            f"steady stretch {tr['from_s']:.0f}-{tr['to_s']:.0f} s: live "
            f"{st.get('live_min')}-{st.get('live_max')}, ops {st.get('operations')}",
            "RSS over it (MiB/min, ± 2 SE): " + (", ".join(
                f"replica-{p['replica']} pid {p['pid']} {p['slope_mib_per_min']} ± "
                f"{2 * p['se_mib_per_min']:.3f} ({p['verdict']}, level {p['level_mib']} MiB)"
                for p in tr["processes"]) or "no process alive through it")
            + f"; threshold {tr['threshold_mib_per_min']}: {tr['verdict']}; "
              f"peak RSS {tr['peak_mib']} MiB"] + [
            f"informers' objects over it, replica-{c['replica']} pid {c['pid']}: " + ", ".join(
                f"{k} {c['first'].get(k)} -> {c['last'].get(k)}" for k in sorted(c["last"]))
            for c in report.get("cache_over_steady", [])] + [
            f"heap over it, replica-{h['replica']} pid {h['pid']}: gc objects "
            f"{h['gc_objects'][0]} -> {h['gc_objects'][1]}"
            + (f", traced {h['traced_mib'][0]} -> {h['traced_mib'][1]} MiB" if "traced_mib" in h
               else "")
            for h in report.get("heap_over_steady", [])]


def plot(report: dict, path: Path) -> None:
    """RSS per replica process over time (the steady stretch shaded, each judged process's
    fit over it drawn, kills and the API-server restart marked), and below the VMIs held as
    admitted with the running count of distinct violations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = report["rss_trend"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True,
                               gridspec_kw={"height_ratios": [3, 2]})
    by: dict = {}
    for t, i, pid, mib in report["rss_samples"]:
        by.setdefault((i, pid), []).append((t, mib))
    judged = {(p["replica"], p["pid"]): p for p in tr["processes"]}
    for (i, pid), pts in sorted(by.items()):
        p = judged.get((i, pid))
        label = f"replica {i} pid {pid}" + (
            f": {p['slope_mib_per_min']:+.3f} ± {2 * p['se_mib_per_min']:.3f} MiB/min "
            f"({p['verdict']})" if p else "")
        line, = a.plot([q[0] for q in pts], [q[1] for q in pts], lw=1.2 if p else 0.8,
                       label=label)
        if p:
            a0, b0 = p["fit"]
            a.plot([tr["from_s"], tr["to_s"]], [a0 + b0 * tr["from_s"], a0 + b0 * tr["to_s"]],
                   color=line.get_color(), ls=":", lw=2)
    for ax in (a, b):
        ax.axvspan(tr["from_s"], tr["to_s"], color="green", alpha=0.08)
        for e in report["events"]:
            ax.axvline(e["at"], color="red" if e["kind"] == "kill-leader" else "purple",
                       ls="--", lw=0.8)
    a.axhline(RSS_TARGET_MIB, color="grey", lw=0.6)
    a.set_ylabel("RSS (MiB)")
    a.set_title(f"soak seed {report['seed']} ({report['schedule']}): "
                f"{report['spec']['nodes']} nodes; RSS over the steady stretch (green, "
                f"dotted: fits): {tr['verdict']} at <= {tr['threshold_mib_per_min']} MiB/min; "
                f"peak {tr['peak_mib']} MiB\n(red: leader kill -9, purple: kube-apiserver "
                f"restart, grey: {RSS_TARGET_MIB:g} MiB target)", fontsize=9)
    a.legend(fontsize=7, loc="lower right")
    tl = report["violation_timeline"]
    b.plot([x[0] for x in tl], [x[2] for x in tl], label="VMIs held as admitted")
    b.plot([x[0] for x in tl], [x[1] for x in tl], label="distinct violations", color="red")
    b.set_xlabel("s into the churn")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
