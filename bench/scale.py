"""A large populated cluster with KubeVirt in the loop (`gpu-binder bench scale`, issue 22).

`populate(lc, kv, fleet, spec)` builds, on a running `LocalCluster` with KubeVirt's harness
(`localcluster.kubevirt.KubeVirt`: virt-api, virt-controller, kube-scheduler, KWOK), the
population `ScaleSpec` describes: KWOK nodes of two GPU models, a few of them cordoned,
tainted or not Ready, one GPUClass per model, tenant namespaces, held GPUDevices, and running
VMIs made through the real path (our webhook admits and pins each VMI, virt-controller makes
its virt-launcher Pod, kube-scheduler binds it, KWOK runs it). The measurements
(`measure`, `run`) then time a fresh replica's start-up, admissions one at a time and in
bursts, and a leader failover on it, at `--nodes` and at `--baseline-nodes` for ratios.

Used by the benchmark here and by the soak (`bench/soak.py`). Every object `populate` makes
is named with `spec.prefix`, so a shared control plane (an e2e session's) keeps them apart.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import anyio

from localcluster.fleet import Fleet

VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"
DEV_GROUP, DEV_VERSION = "gpu.cozystack.io", "v1alpha1"
TAINT = {"key": "gpu.example.com/reserved", "value": "team-x", "effect": "NoSchedule"}
"""The taint of the spec's tainted nodes (no VMI here tolerates it)."""


@dataclass(frozen=True)
class ScaleSpec:
    """What `populate` builds.

    - `nodes` KWOK nodes of `gpus_per_node` GPUs, alternating between the `models`
      ((short name, extended resource) pairs; one GPUClass per model, named
      `<prefix><short>`); of them `cordoned`, `tainted` (TAINT, NoSchedule) and `not_ready`
      (Ready=False, not KWOK-managed) nodes, disjoint, spread over the fleet;
    - `tenants` tenant namespaces `<prefix>t<k>` (no budget quota);
    - `vmis` VMIs, round-robin over the tenants, of sizes drawn (seeded by `seed`) from
      `sizes` ((GPU count, weight) pairs) and a class drawn uniformly from the models; a share
      `held_share` of them asks for held devices (`gpu.cozystack.io/devices`, devices created
      first by the tenant), the rest for template devices (`gpu.cozystack.io/templates`);
    - then held, never attached GPUDevices (Pending) until the tenants' namespaces hold
      `devices` GPUDevices in all (None: `nodes * gpus_per_node`), none if already past;
    - `concurrency`: writes in flight at once (one anyio.Semaphore for every create);
      `vmi_timeout`: seconds an admitted VMI's launcher Pod has to be bound (from its
      admission: on 2 cores the launcher Pods lag the admissions by minutes at 1,000 nodes).

    Defaults are issue 22's 1,000-node cluster; `scaled(n)` keeps the proportions at n nodes.
    """

    nodes: int = 1000
    gpus_per_node: int = 8
    models: tuple[tuple[str, str], ...] = (("h100", "h100.scale.example.com/gpu"),
                                           ("l40s", "l40s.scale.example.com/gpu"))
    cordoned: int = 10
    tainted: int = 10
    not_ready: int = 10
    vmis: int = 2000
    tenants: int = 20
    sizes: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.25), (4, 0.15), (8, 0.10))
    held_share: float = 0.25
    devices: int | None = None
    concurrency: int = 24
    vmi_timeout: float = 600.0
    prefix: str = "sc-"
    seed: int = 1

    def scaled(self, nodes: int, **changes) -> "ScaleSpec":
        """This spec at `nodes` nodes: VMIs, cordoned/tainted/not-Ready counts and devices in
        the same proportion (at least 1 of each problem node, 1 VMI), then `changes`."""
        from dataclasses import replace

        f = nodes / self.nodes
        kw = {"nodes": nodes, "vmis": max(1, round(self.vmis * f)),
              "cordoned": max(1, round(self.cordoned * f)) if self.cordoned else 0,
              "tainted": max(1, round(self.tainted * f)) if self.tainted else 0,
              "not_ready": max(1, round(self.not_ready * f)) if self.not_ready else 0,
              "devices": None if self.devices is None else round(self.devices * f)}
        return replace(self, **{**kw, **changes})

    @property
    def classes(self) -> dict[str, str]:
        """GPUClass name -> extended resource name."""
        return {f"{self.prefix}{short}": res for short, res in self.models}


@dataclass
class VmiRecord:
    """One VMI `populate` (or a measurement) asked for and what became of it."""

    namespace: str
    name: str
    cls: str
    size: int
    held: tuple[str, ...] = ()
    """The held GPUDevices it names (empty: template devices)."""
    admitted: bool = False
    refusal: str = ""
    """The API's message when not admitted."""
    uid: str = ""
    pin: str = ""
    """The node the webhook pinned it to (spec.nodeSelector kubernetes.io/hostname)."""
    node: str = ""
    """The node kube-scheduler bound its launcher Pod to ("" until bound)."""
    admit_ms: float = 0.0
    """Create call to answer, ms (webhooks of ours and virt-api's in the path)."""
    bound_lag_s: float | None = None
    """Seconds from the admission's answer to the launcher Pod seen bound (populate only)."""


@dataclass
class Population:
    """What `populate` made: `nodes` (name -> class), the problem nodes, `tenants`, every VMI
    (`vmis`, admitted or not), `held_idle` (held GPUDevices never attached, (namespace, name)),
    `seconds` per phase (nodes, devices, vmis, total; wall clock), `counts` (retries,
    refusals, launcher Pods not bound in time), and `writes` (kube-apiserver write requests
    per resource during `populate`, from its /metrics) and `cpu_s` (CPU seconds each process
    of the cluster spent during `populate`)."""

    spec: ScaleSpec
    nodes: dict[str, str] = field(default_factory=dict)
    cordoned: list[str] = field(default_factory=list)
    tainted: list[str] = field(default_factory=list)
    not_ready: list[str] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    vmis: list[VmiRecord] = field(default_factory=list)
    held_idle: list[tuple[str, str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    writes: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def admitted(self) -> list[VmiRecord]:
        return [v for v in self.vmis if v.admitted]

    @property
    def devices(self) -> int:
        """GPUDevices made: the admitted VMIs' devices and the idle held ones."""
        return sum(v.size for v in self.vmis if v.admitted or v.held) + len(self.held_idle)

    def summary(self) -> dict:
        """JSON-ready figures (no per-VMI list): counts, phase seconds, writes, CPU."""
        adm = self.admitted
        return {"spec": {**asdict(self.spec), "models": [list(m) for m in self.spec.models],
                         "sizes": [list(s) for s in self.spec.sizes]},
                "nodes": len(self.nodes), "cordoned": len(self.cordoned),
                "tainted": len(self.tainted), "not_ready": len(self.not_ready),
                "tenants": len(self.tenants), "vmis_asked": len(self.vmis),
                "vmis_admitted": len(adm),
                "vmis_running": sum(1 for v in adm if v.node and v.node == v.pin),
                "gpus_in_use": sum(v.size for v in adm), "gpudevices": self.devices,
                "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
                "vmis_per_s": round(len(adm) / self.seconds["vmis"], 2)
                if self.seconds.get("vmis") else None,
                "launcher_bound_lag_s": {
                    p: _pct([v.bound_lag_s for v in adm if v.bound_lag_s is not None], q)
                    for p, q in (("p50", 50), ("p99", 99), ("max", 100))},
                "counts": dict(self.counts), "apiserver_writes": self.writes,
                "cpu_seconds": {k: round(v, 1) for k, v in self.cpu_s.items()}}


def _say(text: str) -> None:
    """A progress line on stderr (the benchmark runs for minutes)."""
    import sys

    print(f"[bench scale {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- process figures -------------------------------------------------------------------------

def cluster_pids(lc, kv=None) -> dict[str, int]:
    """name -> pid of every process of the cluster: the control plane's (etcd,
    kube-apiserver), KubeVirt's harness (virt-api, virt-controller, kube-scheduler, kwok) and
    each live replica (its identity)."""
    pids = {n: p.pid for n, p in lc.cp.procs.items() if p.poll() is None}
    kv = kv or lc.kubevirt
    if kv is not None:
        pids.update({n: p.pid for n, p in kv.procs.items() if p.poll() is None})
    pids.update({r.identity: r.proc.pid for r in lc.replicas if r.alive})
    return pids


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (and its waited-for children), seconds; 0.0 when it is gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def memory(pid: int) -> dict[str, float]:
    """{"rss_mib": VmRSS, "hwm_mib": VmHWM} of `pid` from /proc/<pid>/status, MiB (0 when
    the process is gone)."""
    out = {"rss_mib": 0.0, "hwm_mib": 0.0}
    try:
        for line in open(f"/proc/{pid}/status"):
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss_mib" if key == "VmRSS" else "hwm_mib"] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return out


async def apiserver_writes(api) -> dict[str, int]:
    """kube-apiserver's write requests served so far (create, update, patch, apply, delete;
    any code), per resource, from its /metrics `apiserver_request_total`."""
    import re

    resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"],
                              _preload_content=False)
    text = (await resp.read()).decode()
    resp.release()
    out: Counter = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        if not re.search(r'verb="(POST|PATCH|PUT|DELETE|APPLY|CREATE|UPDATE)"', line):
            continue
        m = re.search(r'resource="([^"]*)"', line)
        sub = re.search(r'subresource="([^"]*)"', line)
        key = (m.group(1) if m else "?") + (f"/{sub.group(1)}" if sub and sub.group(1) else "")
        out[key] += int(float(line.rsplit(" ", 1)[1]))
    return dict(out)


async def apiserver_latency(api) -> dict[str, tuple[float, int]]:
    """kube-apiserver's own request latency so far for what an admission costs:
    "<verb> <resource>[/<subresource>]" -> (seconds summed, requests), from
    `apiserver_request_duration_seconds` (GPUDevice and VMI requests, any verb)."""
    import re

    resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"],
                              _preload_content=False)
    text = (await resp.read()).decode()
    resp.release()
    out: dict[str, list] = {}
    for line in text.splitlines():
        for suffix, slot in (("_sum{", 0), ("_count{", 1)):
            if not line.startswith("apiserver_request_duration_seconds" + suffix):
                continue
            res = re.search(r'resource="([^"]*)"', line)
            if not res or res.group(1) not in ("gpudevices", "virtualmachineinstances"):
                continue
            sub = re.search(r'subresource="([^"]*)"', line)
            verb = re.search(r'verb="([^"]*)"', line)
            key = f"{verb.group(1) if verb else '?'} {res.group(1)}" + (
                f"/{sub.group(1)}" if sub and sub.group(1) else "")
            out.setdefault(key, [0.0, 0])[slot] += float(line.rsplit(" ", 1)[1])
    return {k: (v[0], int(v[1])) for k, v in out.items()}


# -- the real path ---------------------------------------------------------------------------

class Pods:
    """The launcher Pods of the watched namespaces (prefix), by the VMI uid that created
    them (label kubevirt.io/created-by): uid -> (node or "", phase). Run `watch()` in a task
    group; `bound(uid, timeout)` waits for a node."""

    def __init__(self, api, prefix: str) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        self.core = CoreV1Api(api)
        self.prefix = prefix
        self.by_uid: dict[str, tuple[str, str]] = {}
        self._waiting: dict[str, anyio.Event] = {}

    def _event(self, kind: str, obj: dict) -> None:
        uid = (obj["metadata"].get("labels") or {}).get("kubevirt.io/created-by")
        if not uid:
            return
        if kind == "DELETED":
            self.by_uid.pop(uid, None)
            return
        node = obj["spec"].get("nodeName") or ""
        self.by_uid[uid] = (node, (obj.get("status") or {}).get("phase") or "")
        if node and uid in self._waiting:
            self._waiting.pop(uid).set()

    async def watch(self) -> None:
        from bench.packing import _watch

        await _watch(self.core.list_pod_for_all_namespaces, (), self._event, self.prefix)

    async def bound(self, uid: str, timeout: float) -> str:
        """The node the launcher Pod of VMI `uid` is bound to, "" if none within `timeout` s."""
        if not self.by_uid.get(uid, ("", ""))[0]:
            ev = self._waiting.setdefault(uid, anyio.Event())
            with anyio.move_on_after(timeout):
                await ev.wait()
        return self.by_uid.get(uid, ("", ""))[0]


def vmi_body(rec: VmiRecord) -> dict:
    """KubeVirt's own vmi-gpu example asking for `rec`'s devices (held by name, else
    templates of its class), its own GPU entry removed (ours replace it)."""
    from bench.packing import _base_vmi

    v = _base_vmi()
    v["apiVersion"] = f"{VMI_GROUP}/{VMI_VERSION}"
    v["metadata"] = {"name": rec.name, "labels": {"scale-bench/size": str(rec.size)}}
    del v["spec"]["domain"]["devices"]["gpus"]
    v["metadata"]["annotations"] = (
        {"gpu.cozystack.io/devices": ",".join(rec.held)} if rec.held
        else {"gpu.cozystack.io/templates": f"{rec.cls}={rec.size}"})
    return v


async def admit(fleet: Fleet, rec: VmiRecord, counts: Counter, *, retry_for: float = 30.0) -> None:
    """Create `rec`'s VMI through the API server and fill `rec` (admitted, uid, pin,
    admit_ms of the call that got the final answer, or refusal). Retried, and counted in
    `counts`: a 429 (a tenant's turn at the webhook, or API priority and fairness) after its
    Retry-After (1 s when absent), and a 422 naming a held device "not found" (the webhook's
    cache has not seen the tenant's brand-new GPUDevice yet), for up to `retry_for` s; any
    other denial is the answer. Never raises ApiException."""
    from kubernetes_asyncio.client import ApiException

    deadline = time.monotonic() + retry_for
    while True:
        t0 = time.perf_counter()
        try:
            made = await fleet.custom.create_namespaced_custom_object(
                VMI_GROUP, VMI_VERSION, rec.namespace, VMIS, vmi_body(rec))
        except ApiException as exc:
            rec.admit_ms = round((time.perf_counter() - t0) * 1000, 1)
            msg = _message(exc)
            late = time.monotonic() > deadline
            if exc.status == 429 and not late:
                counts["retried_429"] += 1
                await anyio.sleep(float((exc.headers or {}).get("Retry-After") or 1))
                continue
            if exc.status == 422 and rec.held and "not found" in msg and not late:
                counts["retried_device_not_found"] += 1
                await anyio.sleep(0.25)
                continue
            if exc.status == 409 and "already exists" in msg:
                # an earlier try's answer was lost (a replica killed mid-call): the VMI is there
                counts["found_after_lost_answer"] += 1
                made = await fleet.custom.get_namespaced_custom_object(
                    VMI_GROUP, VMI_VERSION, rec.namespace, VMIS, rec.name)
            else:
                rec.refusal = f"{exc.status}: {msg}"[:300]
                counts[f"answer_{exc.status}"] += 1
                return
        else:
            rec.admit_ms = round((time.perf_counter() - t0) * 1000, 1)
        rec.admitted = True
        rec.uid = made["metadata"]["uid"]
        rec.pin = ((made.get("spec") or {}).get("nodeSelector") or {}).get("kubernetes.io/hostname", "")
        return


def _message(exc) -> str:
    try:
        return json.loads(exc.body).get("message", "") or str(exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or exc.reason)


async def _permitted(fleet: Fleet, cls: str, timeout: float = 90.0) -> None:
    """Wait until GPUClass `cls` shows KubeVirtPermitted=True (the leader's housekeeping has
    seen the KubeVirt CR permitting its resource). Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        got = await fleet.custom.get_cluster_custom_object(DEV_GROUP, DEV_VERSION, "gpuclasses", cls)
        if any(c["type"] == "KubeVirtPermitted" and c["status"] == "True"
               for c in (got.get("status") or {}).get("conditions") or []):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"GPUClass {cls} not KubeVirtPermitted within {timeout:.0f} s")
        await anyio.sleep(0.5)


def plan_vmis(spec: ScaleSpec, tenants: list[str]) -> list[VmiRecord]:
    """The spec's VMIs, deterministic in `spec.seed`: round-robin tenants, seeded sizes and
    classes, the held ones naming devices `<vmi>-h<k>`; larger sets first (a fleet filled
    small-first may leave no empty node for the 8-GPU sets it still has to place)."""
    rng = random.Random(spec.seed)
    sizes, weights = zip(*spec.sizes)
    classes = list(spec.classes)
    out = []
    for i in range(spec.vmis):
        size = rng.choices(sizes, weights)[0]
        cls = rng.choice(classes)
        ns = tenants[i % len(tenants)]
        name = f"{spec.prefix}vm{i:05d}"
        held = tuple(f"{name}-h{k}" for k in range(size)) if rng.random() < spec.held_share else ()
        out.append(VmiRecord(ns, name, cls, size, held))
    return sorted(out, key=lambda v: -v.size)


async def populate(lc, kv, fleet: Fleet, spec: ScaleSpec) -> "Population":
    """Build `spec`'s population on `lc` (a started LocalCluster whose replicas serve the
    webhook) with `kv` (a started localcluster.kubevirt.KubeVirt on the same control plane)
    through `fleet` (an admin Fleet). Returns the Population, with its own phase durations.

    Phases: (1) `kv`'s KubeVirt CR is made to permit the models' resources, the GPUClasses
    and tenants are created, then every node (concurrently, at most `spec.concurrency`
    writes in flight); waits until every class is KubeVirtPermitted; (2) the held GPUDevices
    (those the VMIs name, then the idle ones up to `spec.devices`); (3) the VMIs, at most
    `spec.concurrency` at once, each through `admit`, then awaited until kube-scheduler has
    bound its launcher Pod (`spec.vmi_timeout` s; counted `not_bound` if not, `off_pin` if
    bound elsewhere than its pin). A refused VMI is recorded (its `refusal`), not retried.
    Raises kubernetes_asyncio ApiException on a failed node, class, tenant or device write,
    TimeoutError when a class is not permitted within 90 s."""
    pop = Population(spec)
    t_all = time.monotonic()
    pids = cluster_pids(lc, kv)
    cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
    w0 = await apiserver_writes(fleet.custom.api_client)
    limit = anyio.Semaphore(spec.concurrency)

    # (1) classes, tenants, nodes
    t = time.monotonic()
    kv.set_permitted(tuple(sorted(set(kv.permitted) | set(spec.classes.values()))))
    for cls, res in spec.classes.items():
        await fleet.gpu_class(cls, res)
    pop.tenants = [f"{spec.prefix}t{k:02d}" for k in range(spec.tenants)]
    problems = _problem_nodes(spec)
    classes = list(spec.classes.items())

    async def tenant(ns: str) -> None:
        async with limit:
            await fleet.tenant(ns)

    async def node(i: int) -> None:
        name = f"{spec.prefix}n{i:04d}"
        cls, res = classes[i % len(classes)]
        kind = problems.get(i)
        kw: dict = {"labels": {"scale-bench/model": cls}, "kwok": kind != "not_ready"}
        if kind == "cordoned":
            kw["cordoned"] = True
        elif kind == "tainted":
            kw["taints"] = [TAINT]
        elif kind == "not_ready":
            kw["ready"] = False
        async with limit:
            await fleet.node(name, {res: spec.gpus_per_node}, **kw)
        pop.nodes[name] = cls
        if kind:
            getattr(pop, kind).append(name)
    async with anyio.create_task_group() as tg:
        for ns in pop.tenants:
            tg.start_soon(tenant, ns)
        for i in range(spec.nodes):
            tg.start_soon(node, i)
    for cls in spec.classes:
        await _permitted(fleet, cls)
    pop.seconds["nodes"] = time.monotonic() - t
    _say(f"{spec.nodes} nodes, {len(spec.classes)} classes, {spec.tenants} tenants in "
         f"{pop.seconds['nodes']:.1f} s")

    # (2) held devices
    t = time.monotonic()
    pop.vmis = plan_vmis(spec, pop.tenants)
    wanted = spec.nodes * spec.gpus_per_node if spec.devices is None else spec.devices
    asked = sum(v.size for v in pop.vmis)
    idle = max(0, wanted - asked)
    idle_names = [(pop.tenants[k % len(pop.tenants)], f"{spec.prefix}idle{k:05d}",
                   list(spec.classes)[k % len(spec.classes)]) for k in range(idle)]

    async def device(ns: str, name: str, cls: str) -> None:
        async with limit:
            await fleet.device(ns, name, cls)
    async with anyio.create_task_group() as tg:
        for v in pop.vmis:
            for d in v.held:
                tg.start_soon(device, v.namespace, d, v.cls)
        for ns, name, cls in idle_names:
            tg.start_soon(device, ns, name, cls)
    pop.held_idle = [(ns, name) for ns, name, _ in idle_names]
    pop.seconds["devices"] = time.monotonic() - t
    _say(f"{sum(len(v.held) for v in pop.vmis) + idle} held devices in {pop.seconds['devices']:.1f} s")

    # (3) VMIs through the real path
    t = time.monotonic()
    pods = Pods(fleet.custom.api_client, spec.prefix)
    async with anyio.create_task_group() as watches:
        watches.start_soon(pods.watch)

        async def one(rec: VmiRecord) -> None:
            async with limit:
                await admit(fleet, rec, pop.counts)
            pop.counts["answered"] += 1
            if pop.counts["answered"] % 250 == 0:
                _say(f"{pop.counts['answered']}/{len(pop.vmis)} VMIs answered, "
                     f"{time.monotonic() - t:.0f} s")
            if not rec.admitted:
                pop.counts["refused"] += 1
                return
            answered_at = time.monotonic()
            rec.node = await pods.bound(rec.uid, spec.vmi_timeout)
            rec.bound_lag_s = round(time.monotonic() - answered_at, 2) if rec.node else None
            if not rec.node:
                pop.counts["not_bound"] += 1
            elif rec.node != rec.pin:
                pop.counts["off_pin"] += 1
        async with anyio.create_task_group() as tg:
            for rec in pop.vmis:
                tg.start_soon(one, rec)
        watches.cancel_scope.cancel()
    pop.seconds["vmis"] = time.monotonic() - t
    _say(f"{len(pop.admitted)} of {len(pop.vmis)} VMIs admitted in {pop.seconds['vmis']:.1f} s")

    pop.seconds["total"] = time.monotonic() - t_all
    w1 = await apiserver_writes(fleet.custom.api_client)
    pop.writes = {k: w1[k] - w0.get(k, 0) for k in sorted(w1) if w1[k] - w0.get(k, 0)}
    pop.cpu_s = {n: cpu_seconds(p) - cpu0[n] for n, p in pids.items()}
    return pop


def _problem_nodes(spec: ScaleSpec) -> dict[int, str]:
    """node index -> "cordoned" | "tainted" | "not_ready", spread evenly over the fleet."""
    kinds = ["cordoned"] * spec.cordoned + ["tainted"] * spec.tainted + ["not_ready"] * spec.not_ready
    if len(kinds) > spec.nodes:
        raise ValueError(f"{len(kinds)} problem nodes asked of a {spec.nodes}-node fleet")
    step = spec.nodes / max(1, len(kinds))
    return {int(k * step + step / 2): kind for k, kind in enumerate(kinds)}


# -- the measurements ------------------------------------------------------------------------

def _pct(values: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of `values`, None when empty."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(p / 100 * (len(values) - 1)))))]


def latency_summary(recs: list[VmiRecord], seconds: float | None = None) -> dict:
    """{asked, admitted, refused, p50_ms, p99_ms, max_ms, refusals (first 3)} of `recs`'s
    answers (admitted ones' latencies), and admissions/s over `seconds` when given."""
    lat = [r.admit_ms for r in recs if r.admitted]
    out = {"asked": len(recs), "admitted": len(lat), "refused": sum(1 for r in recs if not r.admitted),
           "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "max_ms": max(lat) if lat else None,
           "refusals": [r.refusal for r in recs if not r.admitted][:3]}
    if seconds:
        out["seconds"] = round(seconds, 2)
        out["admissions_per_s"] = round(len(lat) / seconds, 2)
    return out


@dataclass
class Plan:
    """How many samples each measurement takes: `quiet` admissions one at a time per GPU
    count (1, 4, 8), `bursts` sizes, `failover_burst` VMIs in flight when the leader is
    killed, `bind_timeout` s each admitted VMI's launcher Pod has to bind."""

    quiet: dict[int, int] = field(default_factory=lambda: {1: 60, 4: 30, 8: 30})
    bursts: tuple[int, ...] = (20, 50)
    failover_burst: int = 20
    bind_timeout: float = 90.0


QUICK_PLAN = Plan(quiet={1: 8, 4: 4, 8: 4}, bursts=(10,), failover_burst=10)


class Measure:
    """The measurements on a populated cluster (`run` calls them in order). Each new VMI is
    named `<prefix><tag><k>`, spread round-robin over the population's tenants and classes."""

    def __init__(self, lc, fleet: Fleet, pop: Population, pods: Pods, plan: Plan) -> None:
        self.lc, self.fleet, self.pop, self.pods, self.plan = lc, fleet, pop, pods, plan
        self.k = 0
        self.extra: list[VmiRecord] = []

    def _new(self, tag: str, size: int) -> VmiRecord:
        self.k += 1
        spec = self.pop.spec
        rec = VmiRecord(self.pop.tenants[self.k % len(self.pop.tenants)],
                        f"{spec.prefix}{tag}{self.k:04d}", list(spec.classes)[self.k % len(spec.classes)], size)
        self.extra.append(rec)
        return rec

    async def _bound(self, recs: list[VmiRecord]) -> None:
        async def one(r: VmiRecord) -> None:
            r.node = await self.pods.bound(r.uid, self.plan.bind_timeout)
        async with anyio.create_task_group() as tg:
            for r in recs:
                if r.admitted:
                    tg.start_soon(one, r)

    async def release(self, recs: list[VmiRecord], timeout: float = 120.0) -> dict:
        """Delete `recs`' admitted VMIs (grace 0, finalizers dropped: no virt-handler runs)
        and their launcher Pods, then wait until the leader's housekeeping (H2) has deleted
        their template devices and the Pods are gone, so the next measurement meets the
        population as it was. Returns {released, seconds, timed_out}."""
        from kubernetes_asyncio.client import ApiException

        t0 = time.monotonic()
        adm = [r for r in recs if r.admitted]

        async def one(r: VmiRecord) -> None:
            for patch in (False, True):
                try:
                    if patch:
                        await self.fleet.custom.patch_namespaced_custom_object(
                            VMI_GROUP, VMI_VERSION, r.namespace, VMIS, r.name,
                            {"metadata": {"finalizers": None}},
                            _content_type="application/merge-patch+json")
                    else:
                        await self.fleet.custom.delete_namespaced_custom_object(
                            VMI_GROUP, VMI_VERSION, r.namespace, VMIS, r.name,
                            grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            pods = await self.fleet.core.list_namespaced_pod(
                r.namespace, label_selector=f"kubevirt.io/created-by={r.uid}")
            for pod in pods.items:
                try:
                    await self.fleet.core.delete_namespaced_pod(pod.metadata.name, r.namespace,
                                                                grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        limit = anyio.Semaphore(16)

        async def bounded(r: VmiRecord) -> None:
            async with limit:
                await one(r)
        async with anyio.create_task_group() as tg:
            for r in adm:
                tg.start_soon(bounded, r)
        names = ",".join(sorted({r.name for r in adm}))
        timed_out = False
        while adm:
            got = await self.fleet.custom.list_cluster_custom_object(
                DEV_GROUP, DEV_VERSION, "gpudevices",
                label_selector=f"gpu.cozystack.io/template-for in ({names})")
            left = {(d["metadata"]["namespace"], d["metadata"]["labels"]["gpu.cozystack.io/template-for"])
                    for d in got["items"]}
            left &= {(r.namespace, r.name) for r in adm}
            if not left and not any(r.uid in self.pods.by_uid for r in adm):
                break
            if time.monotonic() - t0 > timeout:
                timed_out = True
                self.pop.counts["release_timeout"] += 1
                break
            await anyio.sleep(1)
        return {"released": len(adm), "seconds": round(time.monotonic() - t0, 1),
                "timed_out": timed_out}

    def memory(self) -> dict:
        """Per live replica: {leader, rss_mib, hwm_mib}."""
        leader = self.lc.leader()
        return {r.identity: {"leader": r.identity == leader, **memory(r.proc.pid)}
                for r in self.lc.replicas if r.alive}

    async def startup(self) -> dict:
        """A fresh replica added to the populated cluster: seconds from its process start to
        /readyz ok (informers synced), its memory then, and the cache sizes it logged."""
        t0 = time.monotonic()
        i = self.lc.add_replica()
        await anyio.to_thread.run_sync(lambda: self.lc.wait_ready(i, timeout=600))
        ready = time.monotonic() - t0
        r = self.lc.replicas[i]
        out = {"identity": r.identity, "to_ready_s": round(ready, 2), **memory(r.proc.pid)}
        await anyio.sleep(5)  # what it holds a little after (the first resyncs)
        out["after_5s"] = memory(r.proc.pid)
        await anyio.to_thread.run_sync(lambda: self.lc.kill_replica(i, 15))
        return out

    async def histograms(self) -> dict[str, float]:
        """The replicas' own timings so far, summed over the live replicas:
        {admission_s, admissions, decision_s, decisions} (gpu_binder_admission_seconds: the
        webhook's time per VMI; gpu_binder_decision_seconds: the binder's decision loop)."""
        out = {"admission_s": 0.0, "admissions": 0.0, "decision_s": 0.0, "decisions": 0.0}
        names = {"gpu_binder_admission_seconds_sum": "admission_s",
                 "gpu_binder_admission_seconds_count": "admissions",
                 "gpu_binder_decision_seconds_sum": "decision_s",
                 "gpu_binder_decision_seconds_count": "decisions"}
        for i, r in enumerate(self.lc.replicas):
            if not r.alive:
                continue
            text = await anyio.to_thread.run_sync(self.lc.metrics, i)
            for line in text.splitlines():
                key = line.split(" ", 1)[0].split("{", 1)[0]
                if key in names:
                    out[names[key]] += float(line.rsplit(" ", 1)[1])
        return out

    async def quiet(self) -> dict:
        """Admissions one at a time (each VMI's launcher Pod awaited bound before the next;
        the GPU count's VMIs released, `release`, before the next count): per GPU count, latency_summary, how many launcher Pods bound on their pin, and the
        replicas' own mean webhook and decision times over the same admissions (`inside`:
        what of the client's latency our webhook and binder account for)."""
        out = {}
        for size, n in self.plan.quiet.items():
            recs = []
            h0 = await self.histograms()
            a0 = await apiserver_latency(self.fleet.custom.api_client)
            for _ in range(n):
                rec = self._new(f"q{size}-", size)
                await admit(self.fleet, rec, self.pop.counts)
                await self._bound([rec])
                recs.append(rec)
            h1 = await self.histograms()
            a1 = await apiserver_latency(self.fleet.custom.api_client)
            d = {k: h1[k] - h0[k] for k in h0}
            released = await self.release(recs)
            out[str(size)] = {**latency_summary(recs), **_on_pin(recs), "inside": {
                "webhook_mean_ms": round(1000 * d["admission_s"] / d["admissions"], 1)
                if d["admissions"] else None,
                "decision_mean_ms": round(1000 * d["decision_s"] / d["decisions"], 2)
                if d["decisions"] else None,
                "client_mean_ms": round(sum(r.admit_ms for r in recs if r.admitted)
                                        / max(1, sum(r.admitted for r in recs)), 1),
                "apiserver": {k: {"requests": a1[k][1] - a0.get(k, (0, 0))[1],
                                  "mean_ms": round(1000 * (a1[k][0] - a0.get(k, (0, 0))[0])
                                                   / (a1[k][1] - a0.get(k, (0, 0))[1]), 1)}
                              for k in a1 if a1[k][1] - a0.get(k, (0, 0))[1] > 0}},
                "release": released}
        return out

    async def burst(self, n: int, size: int = 1) -> dict:
        """`n` creates of `size`-GPU VMIs at once: latency_summary over the burst's wall time
        (first create to last answer), then launcher Pods on their pins; then released."""
        recs = [self._new(f"b{n}-", size) for _ in range(n)]
        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for r in recs:
                tg.start_soon(admit, self.fleet, r, self.pop.counts)
        took = time.monotonic() - t0
        await self._bound(recs)
        return {**latency_summary(recs, took), **_on_pin(recs), "release": await self.release(recs)}

    async def failover(self) -> dict:
        """kill -9 the leader while a burst of `plan.failover_burst` 1-GPU creates is in
        flight (at its first answer, or 0.3 s in), then one create at a time until
        one is admitted. Figures: `to_next_admitted_s` (kill to the answer of the first
        admission asked after the kill: the new leader's first decision, the failover time),
        `to_first_admitted_answer_s` (kill to any admitted answer after it, a burst member
        the old leader may have decided included), `to_new_leader_s` (kill to the Lease naming another
        holder, polled every 0.5 s), every answer's time relative to the kill, and the
        none-lost check: every create answered, every admitted VMI's launcher Pod bound on
        its pin, no refused VMI in the API, no device still attached to a refused VMI
        (awaited up to attachment grace + 60 s: H1 clears what a killed webhook left)."""
        lc = self.lc
        leader = lc.leader()
        idx = next(i for i, r in enumerate(lc.replicas) if r.identity == leader and r.alive)
        recs = [self._new("f-", 1) for _ in range(self.plan.failover_burst)]
        answered: dict[str, float] = {}
        first = anyio.Event()
        t_kill = 0.0
        probes: list[VmiRecord] = []
        new_leader = {"s": None, "who": None}

        async def one(r: VmiRecord) -> None:
            await admit(self.fleet, r, self.pop.counts, retry_for=5)
            answered[r.name] = time.monotonic()
            first.set()

        from kubernetes_asyncio.client import CoordinationV1Api

        leases = CoordinationV1Api(self.fleet.custom.api_client)

        async def watch_lease() -> None:
            with anyio.move_on_after(150):
                while True:
                    got = await leases.read_namespaced_lease("gpu-binder", "cozy-system")
                    who = got.spec.holder_identity
                    if who and who != leader:
                        new_leader.update(s=round(time.monotonic() - t_kill, 2), who=who)
                        return
                    await anyio.sleep(0.5)

        async with anyio.create_task_group() as tg:
            t0 = time.monotonic()
            for r in recs:
                tg.start_soon(one, r)
            with anyio.move_on_after(0.3):  # creates in flight, none or few answered
                await first.wait()
            t_kill = time.monotonic()
            await anyio.to_thread.run_sync(lambda: lc.kill_replica(idx, 9))
            kill_at = t_kill - t0
            tg.start_soon(watch_lease)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                p = self._new("fp-", 1)
                await admit(self.fleet, p, self.pop.counts, retry_for=5)
                answered[p.name] = time.monotonic()
                probes.append(p)
                if p.admitted:
                    break
                await anyio.sleep(0.2)
        everyone = recs + probes
        after = sorted(answered[r.name] - t_kill for r in everyone
                       if r.admitted and answered[r.name] > t_kill)
        after_probe = sorted(answered[r.name] - t_kill for r in probes if r.admitted)
        await self._bound(everyone)
        refused = [r for r in everyone if not r.admitted]
        leftover = await self._refused_leftovers(refused)
        lost = [r.name for r in everyone if r.name not in answered]
        return {"killed": leader, "killed_at_s_into_burst": round(kill_at, 2),
                "to_next_admitted_s": round(after_probe[0], 2) if after_probe else None,
                "to_first_admitted_answer_s": round(after[0], 2) if after else None,
                "to_new_leader_s": new_leader["s"], "new_leader": new_leader["who"],
                "burst": latency_summary(recs), "probes": latency_summary(probes),
                "answers": [{"vmi": r.name, "probe": r in probes, "admitted": r.admitted,
                             "t_s": round(answered[r.name] - t_kill, 2), "ms": r.admit_ms,
                             "refusal": r.refusal[:160]} for r in everyone if r.name in answered],
                "none_lost": {"unanswered": lost, **_on_pin(everyone),
                              "refused_vmis_in_api": leftover["in_api"],
                              "devices_attached_to_refused": leftover["attached"],
                              "attachments_cleared_after_s": leftover["cleared_s"]},
                "ok": not lost and _on_pin(everyone)["off_pin_or_unbound"] == 0
                and not leftover["in_api"] and leftover["attached"] == 0}

    async def _refused_leftovers(self, refused: list[VmiRecord], grace: float = 30.0) -> dict:
        from kubernetes_asyncio.client import ApiException

        in_api = []
        for r in refused:
            try:
                await self.fleet.custom.get_namespaced_custom_object(
                    VMI_GROUP, VMI_VERSION, r.namespace, VMIS, r.name)
                in_api.append(r.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        names = {(r.namespace, r.name) for r in refused}
        t0 = time.monotonic()
        attached = 0
        while True:
            got = await self.fleet.custom.list_cluster_custom_object(DEV_GROUP, DEV_VERSION, "gpudevices")
            attached = sum(1 for d in got["items"]
                           if (d["metadata"]["namespace"],
                               ((d.get("status") or {}).get("attachedTo") or {}).get("vmi")) in names
                           or (d["metadata"]["namespace"],
                               (d["metadata"].get("labels") or {}).get("gpu.cozystack.io/template-for")) in names)
            if not attached or time.monotonic() - t0 > grace + 60:
                break
            await anyio.sleep(2)
        return {"in_api": in_api, "attached": attached,
                "cleared_s": round(time.monotonic() - t0, 1) if not attached else None}


def _on_pin(recs: list[VmiRecord]) -> dict:
    adm = [r for r in recs if r.admitted]
    ok = sum(1 for r in adm if r.node and r.node == r.pin)
    return {"bound_on_pin": ok, "off_pin_or_unbound": len(adm) - ok}


# -- the run ---------------------------------------------------------------------------------

CONTROLLER_ARGS = ("--attachment-grace=30",)
"""The replicas' flags: defaults (the default Lease: 10 s, renew deadline 7 s, retry 1 s)
but a 30 s attachment grace, so the failover's none-lost check sees a killed webhook's
leftovers cleared (H1) within the run."""


async def _client(lc):
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.config import load_kube_config

    cfg = Configuration()
    await load_kube_config(config_file=str(lc.cp.admin_kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 128
    return ApiClient(cfg)


async def measure_on(lc, spec: ScaleSpec, plan: Plan) -> dict:
    """Populate `lc` (started with KubeVirt) with `spec`, then measure (module docstring):
    replica memory, a fresh replica's start-up, quiet admissions, bursts, failover. Returns
    that size's part of the report."""
    api = await _client(lc)
    try:
        fleet = Fleet(api)
        pop = await populate(lc, lc.kubevirt, fleet, spec)
        out: dict = {"population": pop.summary(), "load_after_population": os.getloadavg()}
        pods = Pods(api, spec.prefix)
        async with anyio.create_task_group() as watches:
            watches.start_soon(pods.watch)
            m = Measure(lc, fleet, pop, pods, plan)
            await anyio.sleep(2)
            out["memory"] = m.memory()
            _say("memory read; start-up")
            out["startup"] = await m.startup()
            _say("quiet admissions")
            out["quiet"] = await m.quiet()
            out["bursts"] = {str(n): await m.burst(n) for n in plan.bursts}
            out["memory_after_bursts"] = m.memory()
            _say("failover")
            out["failover"] = await m.failover()
            watches.cancel_scope.cancel()
        out["counts"] = dict(pop.counts)
        return out
    finally:
        await api.close()


def run(out, *, nodes: int = 1000, baseline_nodes: int | None = 100, vmis: int | None = None,
        plan: Plan | None = None, spec: ScaleSpec | None = None, log_dir=None,
        kwok_args: tuple[str, ...] = ()) -> dict:
    """The benchmark: for `baseline_nodes` (None: skipped) then `nodes`, a LocalCluster of
    its own (two replicas with CONTROLLER_ARGS, KubeVirt's harness) populated with `spec`
    (default ScaleSpec) scaled to that many nodes (`vmis`: VMIs at `nodes`, scaled for the
    baseline) and measured (`measure_on`); `kwok_args`: extra KWOK flags (KWOK's defaults:
    a 40 s node Lease renewed every 10 s). Writes scale.json and scale.png into `out`;
    returns the report. Raises ControlPlaneError when a cluster cannot start."""
    from pathlib import Path

    from localcluster.cluster import LocalCluster

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan or Plan()
    base = spec or ScaleSpec()
    top = base.scaled(nodes, **({"vmis": vmis} if vmis else {}))
    sizes = [top] + ([top.scaled(baseline_nodes)] if baseline_nodes and baseline_nodes != nodes else [])
    from bench.packing import _commit
    import platform

    report: dict = {"benchmark": "scale", "commit": _commit(), "nodes": nodes,
                    "baseline_nodes": baseline_nodes, "plan": asdict(plan),
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()},
                    "controller_args": list(CONTROLLER_ARGS), "kwok_args": list(kwok_args),
                    "load_before": os.getloadavg(),
                    "sizes": {}}
    for sp in sorted(sizes, key=lambda s: s.nodes):
        t0 = time.monotonic()
        _say(f"{sp.nodes} nodes: starting the cluster; load {os.getloadavg()}")
        logs = Path(log_dir or out / "logs") / f"{sp.nodes}"
        with LocalCluster(controllers=2, controller_args=CONTROLLER_ARGS, log_dir=logs) as lc:
            from localcluster.kubevirt import KubeVirt

            lc.kubevirt = KubeVirt(lc.cp, log_dir=logs / "kubevirt", kwok_args=kwok_args)
            lc.kubevirt.start()
            part = anyio.run(measure_on, lc, sp, plan)
        part["wall_s"] = round(time.monotonic() - t0, 1)
        report["sizes"][str(sp.nodes)] = part
    report["load_after"] = os.getloadavg()
    report["targets"] = targets(report)
    (out / "scale.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "scale.png")
    return report


def _max_hwm(part: dict) -> float | None:
    vals = [m["hwm_mib"] for key in ("memory", "memory_after_bursts")
            for m in (part.get(key) or {}).values()]
    if part.get("startup"):
        vals.append(part["startup"]["after_5s"]["hwm_mib"])
    return max(vals) if vals else None


def targets(report: dict) -> dict:
    """Issue 22's targets at `nodes`, each {value, target, met, ratio_to_baseline}: 1-GPU
    quiet p99 < 500 ms, 8-GPU quiet p99 < 1000 ms, replica peak RSS (VmHWM, every replica)
    < 300 MiB, failover (kill to the next admission answered) < 15 s."""
    top = report["sizes"].get(str(report["nodes"])) or {}
    base = report["sizes"].get(str(report["baseline_nodes"])) or {}

    def fig(part: dict, key: str):
        if not part:
            return None
        if key == "p99_1":
            return (part.get("quiet") or {}).get("1", {}).get("p99_ms")
        if key == "p99_8":
            return (part.get("quiet") or {}).get("8", {}).get("p99_ms")
        if key == "rss":
            return _max_hwm(part)
        return (part.get("failover") or {}).get("to_next_admitted_s")

    out = {}
    for key, name, limit, unit in (("p99_1", "1-GPU admission p99, quiet", 500, "ms"),
                                   ("p99_8", "8-GPU admission p99, quiet", 1000, "ms"),
                                   ("rss", "replica peak RSS (VmHWM)", 300, "MiB"),
                                   ("failover", "failover to the next admitted VMI", 15, "s")):
        v, b = fig(top, key), fig(base, key)
        out[name] = {"value": v, "unit": unit, "target": f"< {limit} {unit}",
                     "met": None if v is None else v < limit,
                     "baseline": b, "ratio_to_baseline": round(v / b, 2) if v and b else None}
    return out


def plot(report: dict, path) -> None:
    """Four panels: quiet and burst admission p50/p99 per size, replica memory and
    start-up per size, and the failover's answers over time since the kill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(report["sizes"])
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    width = 0.8 / max(1, len(sizes))
    for j, n in enumerate(sizes):
        part = report["sizes"][n]
        q = part.get("quiet") or {}
        xs = list(q)
        for p, alpha in (("p99_ms", 0.5), ("p50_ms", 1.0)):
            ax[0][0].bar([k + j * width for k in range(len(xs))], [q[x][p] or 0 for x in xs],
                         width, alpha=alpha, color=f"C{j}",
                         label=f"{n} nodes {p[:3]}")
        ax[0][0].set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(xs))],
                            [f"{x} GPU" for x in xs])
        b = part.get("bursts") or {}
        bx = list(b)
        for p, alpha in (("p99_ms", 0.5), ("p50_ms", 1.0)):
            ax[0][1].bar([k + j * width for k in range(len(bx))], [b[x][p] or 0 for x in bx],
                         width, alpha=alpha, color=f"C{j}", label=f"{n} nodes {p[:3]}")
        ax[0][1].set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(bx))],
                            [f"burst {x}" for x in bx])
        mem = {**{f"{k}": v for k, v in (part.get("memory_after_bursts") or {}).items()},
               "fresh": (part.get("startup") or {}).get("after_5s", {})}
        names = list(mem)
        ax[1][0].bar([k + j * width for k in range(len(names))],
                     [mem[x].get("hwm_mib", 0) for x in names], width, alpha=0.5, color=f"C{j}",
                     label=f"{n} nodes VmHWM")
        ax[1][0].bar([k + j * width for k in range(len(names))],
                     [mem[x].get("rss_mib", 0) for x in names], width, color=f"C{j}",
                     label=f"{n} nodes VmRSS (start-up {(part.get('startup') or {}).get('to_ready_s')} s)")
        ax[1][0].set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(names))], names,
                            fontsize=7)
        fo = part.get("failover") or {}
        for a in fo.get("answers") or []:
            ax[1][1].scatter(a["t_s"], j + (0.15 if a["probe"] else -0.15),
                             marker="o" if a["admitted"] else "x",
                             color="C2" if a["admitted"] else "C3", s=18)
        if fo.get("to_new_leader_s") is not None:
            ax[1][1].scatter(fo["to_new_leader_s"], j, marker="|", s=300, color="k")
    ax[0][0].axhline(500, color="grey", ls=":")
    ax[0][0].axhline(1000, color="grey", ls="--")
    ax[0][0].set_title("quiet cluster: one admission at a time (ms; targets 500 / 1000 at p99)")
    ax[0][1].set_title("bursts of 1-GPU creates at once (ms)")
    ax[1][0].axhline(300, color="grey", ls=":")
    ax[1][0].set_title("replica memory (MiB; target VmHWM < 300)")
    ax[1][1].axvline(15, color="grey", ls=":")
    ax[1][1].set_yticks(range(len(sizes)), [f"{n} nodes" for n in sizes])
    ax[1][1].set_title("failover: answers after kill -9 (o admitted, x refused; | new Lease)")
    ax[1][1].set_xlabel("seconds since the kill (lower: burst, upper: probes)")
    for a in (ax[0][0], ax[0][1], ax[1][0]):
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary(report: dict) -> list[str]:
    """Markdown rows (header first): per size the population time, quiet p50/p99 per GPU
    count, bursts, memory, start-up, failover; then the targets."""
    rows = ["| nodes | VMIs running | devices | populate s | quiet 1/4/8 GPU p50/p99 ms | "
            "burst p50/p99 ms | replica VmHWM MiB | start-up s | failover s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for n, part in report["sizes"].items():
        pop = part["population"]
        q = " · ".join(f"{v['p50_ms']}/{v['p99_ms']}" for v in part["quiet"].values())
        b = " · ".join(f"{k}: {v['p50_ms']}/{v['p99_ms']}" for k, v in part["bursts"].items())
        rows.append(f"| {n} | {pop['vmis_running']} | {pop['gpudevices']} | {pop['seconds']['total']} "
                    f"| {q} | {b} | {_max_hwm(part)} | {part['startup']['to_ready_s']} "
                    f"| {part['failover']['to_next_admitted_s']} |")
    for name, t in report["targets"].items():
        met = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        ratio = (f"; {t['ratio_to_baseline']}× the baseline's {t['baseline']}"
                 if t["baseline"] is not None else "; no baseline run")
        rows.append(f"target {name}: {t['value']} {t['unit']} ({t['target']}{ratio}): {met}")
    return rows
