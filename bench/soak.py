"""Soak (issue 22 item 2): a KWOK fleet with KubeVirt and kube-scheduler running, under seeded
churn — VMI creates (1/2/4/8 GPUs, template or held devices) and deletes as tenants, node
cordons and uncordons (held devices then move: B4/B5), a kill -9 of the leader every few
minutes, one kube-apiserver restart — while the invariants of DESIGN §7
(`localcluster.invariants`) are checked every few seconds and once more after settling.

Figures: invariant violations (by kind), admissions lost (a create that got neither an answer
nor, if admitted, a bound launcher Pod on its pin), creates/admitted/refused/deleted, held-device
moves, leader takeovers, the API-server restart's outage, and each replica's RSS every ~10 s
with a linear-fit slope (MiB/min) and a "flat" verdict (`RSS_FLAT_MIB_PER_MIN`).

The operations are a pure function of the spec (`schedule(spec)`): the same seed gives the
same schedule (times, kinds, tenants, sizes, nodes); outcomes (admitted or refused, which
node) depend on the cluster.

`gpu-binder bench soak --nodes N --minutes M --seed S --out DIR` runs it on its own cluster
(`run`); `tests/e2e/test_soak.py` runs a short one on the session's (`soak_on`).
"""

from __future__ import annotations

import json
import os
import platform
import random
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
RSS_FLAT_MIB_PER_MIN = 1.0     # a replica's RSS slope at or below this is "flat"
RSS_WARMUP_S = 60.0            # a replica's first minute (caches filling) is not fitted
SOAK_ARGS = ("--lease-duration=8", "--renew-deadline=6", "--retry-period=1",
             "--attachment-grace=30", "--bind-timeout=15", "--housekeeping-period=2")


@dataclass(frozen=True)
class SoakSpec:
    """What the soak runs. `nodes` KWOK nodes of `gpus_per_node` GPUs of one class;
    `tenants` (None: nodes // 50, at least 2) each with a budget of `budget_share` of the
    fleet's GPUs over the tenants and `held` held GPUDevices; `live` VMIs kept running at
    steady state (None: 2 per node) reached at `create_rate` creates/s, after which every
    create is preceded by a delete of that tenant's oldest running VMI; `held_share` of the
    creates name held devices; a cordon every `cordon_every` s lasting `cordon_for` s; a
    leader kill -9 every `kill_every` s; one kube-apiserver restart at `restart_at` of the
    duration (None: none); the invariants sampled every `check_every` s, RSS every
    `rss_every` s; everything named `prefix`…. `minutes` of churn (≤ 20)."""

    nodes: int = 1000
    gpus_per_node: int = 8
    minutes: float = 20.0
    seed: int = 1
    tenants: int | None = None
    budget_share: float = 0.15
    held: int = 8
    live: int | None = None
    create_rate: float = 4.0
    held_share: float = 0.25
    cordon_every: float = 20.0
    cordon_for: float = 30.0
    kill_every: float = 180.0
    restart_at: float | None = 0.55
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
    def resource(self) -> str:
        return f"{self.prefix}gpu.example.com/gpu"

    @property
    def cls(self) -> str:
        return f"{self.prefix}h100"

    def budget(self) -> int:
        return max(8, int(self.nodes * self.gpus_per_node * self.budget_share))

    def tenant(self, i: int) -> str:
        return f"{self.prefix}t{i:02d}"

    def node(self, i: int) -> str:
        return f"{self.prefix}n{i:04d}"


@dataclass(frozen=True)
class Op:
    """One scheduled operation: at `at` s into the churn, `kind` one of create, delete,
    cordon, uncordon, kill-leader, restart-apiserver; `tenant`/`size`/`held`/`name` for VMIs,
    `node` for cordons."""

    at: float
    kind: str
    tenant: int = -1
    size: int = 0
    held: bool = False
    name: str = ""
    node: int = -1


def schedule(spec: SoakSpec) -> list[Op]:
    """The churn's operations, sorted by time; a pure function of `spec` (same seed, same
    list)."""
    rng = random.Random(spec.seed)
    sizes, weights = zip(*SIZES)
    ops: list[Op] = []
    t, i = 0.0, 0
    while True:
        t += rng.expovariate(spec.create_rate)
        if t >= spec.seconds:
            break
        tenant = rng.randrange(spec.n_tenants)
        size = rng.choices(sizes, weights)[0]
        held = rng.random() < spec.held_share
        if i >= spec.n_live:
            ops.append(Op(t, "delete", tenant=tenant))
        ops.append(Op(t, "create", tenant=tenant, size=size, held=held, name=f"vm{i:05d}"))
        i += 1
    t = spec.cordon_every
    while t < spec.seconds:
        node = rng.randrange(spec.nodes)
        ops.append(Op(t, "cordon", node=node))
        ops.append(Op(min(t + spec.cordon_for, spec.seconds), "uncordon", node=node))
        t += spec.cordon_every
    t = spec.kill_every
    while t < spec.seconds:
        ops.append(Op(t, "kill-leader"))
        t += spec.kill_every
    if spec.restart_at is not None:
        at = spec.restart_at * spec.seconds
        kills = [o.at for o in ops if o.kind == "kill-leader"]
        while any(abs(at - k) < 15 for k in kills):   # not on top of a kill: each its own event
            at += 5
        if at < spec.seconds:
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


def rss_slopes(samples: list[tuple[float, int, int, float]]) -> list[dict]:
    """Per process (replica index, pid) of `samples` [(t s, replica, pid, MiB)]: the linear-fit
    slope in MiB/min over its samples after its first RSS_WARMUP_S s, when at least 5 remain
    spanning ≥ 60 s. Pure."""
    by: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for t, i, pid, mib in samples:
        by.setdefault((i, pid), []).append((t, mib))
    out = []
    for (i, pid), pts in sorted(by.items()):
        t0 = pts[0][0]
        fit = [(t, m) for t, m in pts if t - t0 >= RSS_WARMUP_S]
        if len(fit) < 5 or fit[-1][0] - fit[0][0] < 60:
            out.append({"replica": i, "pid": pid, "samples": len(pts), "slope_mib_per_min": None,
                        "first_mib": round(pts[0][1], 1), "last_mib": round(pts[-1][1], 1)})
            continue
        slope = statistics.linear_regression([t for t, _ in fit], [m for _, m in fit]).slope
        out.append({"replica": i, "pid": pid, "samples": len(pts),
                    "fitted_s": round(fit[-1][0] - fit[0][0]),
                    "slope_mib_per_min": round(slope * 60, 3),
                    "first_mib": round(pts[0][1], 1), "last_mib": round(pts[-1][1], 1)})
    return out


# -- the run ------------------------------------------------------------------------------

@dataclass
class Rec:
    """One create: outcome "admitted" / "refused" / "lost" (no answer in time, or admitted
    without a launcher Pod bound on its pin), the pin, the launcher Pod's node, held devices
    named and how many of them moved."""

    ns: str
    name: str
    size: int
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
    templates of the soak's class)."""
    from bench.packing import _base_vmi

    v = _base_vmi()
    v["apiVersion"] = f"{VMI_GROUP}/{VMI_VERSION}"
    v["metadata"] = {"name": rec.name, "annotations": (
        {"gpu.cozystack.io/devices": ",".join(rec.held)} if rec.held
        else {"gpu.cozystack.io/templates": f"{spec.cls}={rec.size}"})}
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
        self.held_free: dict[str, set[str]] = {}
        self.held_node: dict[tuple[str, str], str] = {}
        self.counts: Counter = Counter()
        self.tally = inv.Tally()
        self.events: list[dict] = []
        self.rss: list[tuple[float, int, int, float]] = []
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
            self.held_free[ns] = set()
            self.running[ns] = deque()
            for h in range(s.held):
                await self.fleet.device(ns, f"held-{h}", s.cls)
                self.held_free[ns].add(f"held-{h}")

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
        rec = Rec(ns, op.name, op.size)
        if op.held and len(self.held_free[ns]) >= op.size:
            rec.held = tuple(sorted(self.held_free[ns])[:op.size])
            self.held_free[ns] -= set(rec.held)
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
            self.held_free[ns] |= set(rec.held)
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
        self.held_free[ns] |= set(rec.held)

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
        while self.churning:
            for i, r in enumerate(self.lc.replicas):
                if r.alive:
                    mib = rss_mib(r.proc.pid)
                    if mib is not None:
                        self.rss.append((round(self.now(), 1), i, r.proc.pid, round(mib, 1)))
            await anyio.sleep(self.spec.rss_every)

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

    def report(self) -> dict:
        out = Counter(r.outcome for r in self.recs)
        slopes = rss_slopes(self.rss)
        fitted = [x["slope_mib_per_min"] for x in slopes if x["slope_mib_per_min"] is not None]
        answers = sorted(r.answer_s for r in self.recs if r.outcome in ("admitted", "refused"))
        return {
            "seed": self.spec.seed, "schedule": schedule_digest(self.ops),
            "spec": asdict(self.spec), "operations": dict(Counter(o.kind for o in self.ops)),
            "churn_s": getattr(self, "churn_s", None),
            "creates": len(self.recs), "admitted": out["admitted"], "refused": out["refused"],
            "admissions_lost": out["lost"],
            "lost": [asdict(r) for r in self.recs if r.outcome == "lost"][:20],
            "refusal_reasons": dict(Counter(r.refusal.split(":", 1)[-1].strip()[:60]
                                            for r in self.recs if r.outcome == "refused")
                                    .most_common(8)),
            "answer_p50_s": answers[len(answers) // 2] if answers else None,
            "answer_p99_s": answers[int(len(answers) * .99)] if answers else None,
            "violations": len(self.tally.seen), "violations_by_kind": self.tally.by_kind(),
            "violation_list": [v.to_dict() for v in self.tally.violations][:50],
            "samples": self.tally.samples, "counts": dict(self.counts),
            "events": self.events, "final": self.final,
            "rss_threshold_mib_per_min": RSS_FLAT_MIB_PER_MIN, "rss_slopes": slopes,
            "rss_max_slope_mib_per_min": max(fitted) if fitted else None,
            "rss_flat": (max(fitted) <= RSS_FLAT_MIB_PER_MIN) if fitted else None,
            "rss_samples": self.rss, "violation_timeline": self.samples,
        }


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
        log(f"soak: populated {spec.nodes} nodes, {spec.n_tenants} tenants: {phases}")
        report = await soak.run()
        report["population_s"] = phases
        return report


def run(out: Path, *, nodes: int = 1000, minutes: float = 20.0, seed: int = 1) -> dict:
    """The soak on a cluster of its own (2 replicas, KubeVirt); writes soak.json and
    soak.png into `out`; returns the report."""
    from localcluster.cluster import LocalCluster

    if not 0 < minutes <= 20:
        raise ValueError(f"--minutes is at most 20, got {minutes}")
    out.mkdir(parents=True, exist_ok=True)
    spec = SoakSpec(nodes=nodes, minutes=minutes, seed=seed)
    print(f"soak: seed {seed}", flush=True)
    report_head = {"benchmark": "soak", "load_before": os.getloadavg(),
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                               "platform": platform.platform()}}
    t = time.monotonic()
    with LocalCluster(controllers=2, controller_args=SOAK_ARGS, log_dir=out / "logs",
                      kubevirt=True) as lc:
        from bench.packing import _commit

        report = {**report_head, "commit": _commit(),
                  **anyio.run(soak_on, lc, lc.kubevirt, spec,
                              lambda m: print(m, flush=True))}
    report["load_after"] = os.getloadavg()
    report["wall_s"] = round(time.monotonic() - t, 1)
    report["targets"] = {
        "violations": {"value": report["violations"], "target": 0,
                       "met": report["violations"] == 0},
        "admissions_lost": {"value": report["admissions_lost"], "target": 0,
                            "met": report["admissions_lost"] == 0},
        "rss_flat": {"value": report["rss_max_slope_mib_per_min"],
                     "target": f"<= {RSS_FLAT_MIB_PER_MIN} MiB/min", "met": report["rss_flat"]}}
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "soak.png")
    for line in summary(report):
        print(line, flush=True)
    return report


def summary(report: dict) -> list[str]:
    """Human lines of a report."""
    return [f"soak seed {report['seed']} schedule {report['schedule']}: "
            f"{report['creates']} creates, {report['admitted']} admitted, "
            f"{report['refused']} refused, {report['counts'].get('deleted', 0)} deleted, "
            f"{report['counts'].get('held_moves', 0)} held-device moves",
            f"violations {report['violations']} {report['violations_by_kind']}, "
            f"admissions lost {report['admissions_lost']}, samples {report['samples']}",
            f"events {[(e['at'], e['kind'], e.get('takeover_s', e.get('outage_s'))) for e in report['events']]}",
            f"RSS slopes MiB/min {[x['slope_mib_per_min'] for x in report['rss_slopes']]} "
            f"(flat <= {report['rss_threshold_mib_per_min']}): {report['rss_flat']}"]


def plot(report: dict, path: Path) -> None:
    """RSS per replica process over time (kills and the API-server restart marked), and the
    running count of distinct violations with the VMIs held as admitted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    by: dict = {}
    for t, i, pid, mib in report["rss_samples"]:
        by.setdefault((i, pid), []).append((t, mib))
    for (i, pid), pts in sorted(by.items()):
        a.plot([p[0] for p in pts], [p[1] for p in pts], label=f"replica {i} pid {pid}")
    for e in report["events"]:
        for ax in (a, b):
            ax.axvline(e["at"], color="red" if e["kind"] == "kill-leader" else "purple",
                       ls="--", lw=0.8)
    a.set_ylabel("RSS (MiB)")
    a.set_title(f"soak seed {report['seed']}: {report['spec']['nodes']} nodes, "
                f"RSS max slope {report['rss_max_slope_mib_per_min']} MiB/min "
                f"(red: leader kill -9, purple: kube-apiserver restart)", fontsize=9)
    a.legend(fontsize=7)
    tl = report["violation_timeline"]
    b.plot([x[0] for x in tl], [x[2] for x in tl], label="VMIs held as admitted")
    b.plot([x[0] for x in tl], [x[1] for x in tl], label="distinct violations", color="red")
    b.set_xlabel("s into the churn")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
