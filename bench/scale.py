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
      `vmi_timeout`: seconds an admitted VMI's launcher Pod has to be bound.

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
    vmi_timeout: float = 120.0
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
                "counts": dict(self.counts), "apiserver_writes": self.writes,
                "cpu_seconds": {k: round(v, 1) for k, v in self.cpu_s.items()}}


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

    # (3) VMIs through the real path
    t = time.monotonic()
    pods = Pods(fleet.custom.api_client, spec.prefix)
    async with anyio.create_task_group() as watches:
        watches.start_soon(pods.watch)

        async def one(rec: VmiRecord) -> None:
            async with limit:
                await admit(fleet, rec, pop.counts)
            if not rec.admitted:
                pop.counts["refused"] += 1
                return
            rec.node = await pods.bound(rec.uid, spec.vmi_timeout)
            if not rec.node:
                pop.counts["not_bound"] += 1
            elif rec.node != rec.pin:
                pop.counts["off_pin"] += 1
        async with anyio.create_task_group() as tg:
            for rec in pop.vmis:
                tg.start_soon(one, rec)
        watches.cancel_scope.cancel()
    pop.seconds["vmis"] = time.monotonic() - t

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
