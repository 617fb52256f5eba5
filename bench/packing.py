"""Placement quality on a churn trace, through the real system and kube-scheduler
(`gpu-binder bench packing [--quick] [--simulate] [--out DIR]`, issue 21).

One seeded trace per offered load (`bench.packing_trace`) is replayed identically against, in
one run on one API server with one KWOK fleet:

- **(a) gpu-binder**: VMIs through our webhook and binder (template sets by
  `gpu.cozystack.io/templates`, held sets by `gpu.cozystack.io/devices` over GPUDevices the
  tenant creates first); a set counts as started when the webhook admits it and kube-scheduler
  binds its virt-launcher Pod (KubeVirt's virt-api and virt-controller in the path);
- **(b) kube-scheduler, default profile**, no binder: the VMI asks for its GPUs with KubeVirt's
  own `spec.domain.devices.gpus` (deviceName = the extended resource the nodes advertise); it
  counts as started when its launcher Pod binds within `deadline` s, and as refused when
  kube-scheduler marks the Pod Unschedulable (or the deadline passes), then it is deleted;
- **(c) kube-scheduler with NodeResourcesFit `MostAllocated`** over the GPU resource names
  (a second profile of the same kube-scheduler, chosen by the VMI's `spec.schedulerName`);
- **(d) the perfect-repacking bound**, computed from the trace (`bench.packing_trace`);
- **(e) gpu-binder with defragmentation on** (`--defrag-interval`, `--defrag-max-moves`), run
  after (a)–(c) with the replicas restarted; reported as not available when the controller in
  this tree has no such flags.

**Separate pools.** Every (system, load) is a *lane*: its own namespace, its own extended
resource name and its own `nodes` KWOK nodes advertising only that resource, so lanes never
compete for a GPU and (a)–(c) of every load run at the same time. An idle held set is, in
(b) and (c), a placeholder Pod bound to the node its VM ran on (nodeName set, as a reservation
would be), deleted at the set's release.

**Time compression.** Trace time is cut into windows of about `per_window` arrivals each and
the trace is quantized to them (`bench.packing_trace.quantize`: every event at its window's
middle, a stop at least one window after its arrival), so the bound and the simulation see the
very order the cluster is given. In a window, every stop and release is applied first and
awaited (the VMI, its launcher Pod and its template devices gone), then every arrival is sent
at once, concurrently, and the next window starts when each arrival's outcome is known. Trace
time thus runs as fast as the system answers; nothing depends on the machine's speed but the
races inside a window, so the packing shares are robust to load while any timing is not.

**Figures** per lane (`bench.packing_trace.score`): share of GPU demand started, share of sets
started per size, mean GPU utilisation (running VMs' GPUs ÷ fleet GPUs over trace time), the
largest placeable set sampled after every window from the watched Bound devices (a, e) or
bound Pods (b, c). `--simulate` runs the policy simulation only (no cluster), labelled so.
Writes `packing.json` and `packing.png` into the output folder. A benchmark, not a test.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from bench import packing_trace as pt
from bench.common import base_vmi, commit, machine, watch_namespaced
from localcluster.cluster import LocalCluster
from localcluster.fleet import Fleet
from model.types import TEMPLATE_FOR_LABEL

SYSTEMS = {"a": "gpu-binder", "b": "kube-scheduler (default)", "c": "kube-scheduler MostAllocated",
           "d": "repacking bound", "e": "gpu-binder + defrag"}
MOST_ALLOCATED = "most-allocated"
CONTROLLER_ARGS = ("--housekeeping-period=1", "--attachment-grace=30", "--bind-timeout=15")
DEFRAG_ARGS = ("--defrag-interval=1", "--defrag-max-moves=8")
VMI_GROUP, VMI_VERSION = "kubevirt.io", "v1"
DEV_GROUP, DEV_VERSION = "gpu.cozystack.io", "v1alpha1"


def defrag_available() -> bool:
    """True when this tree's controller has the defragmentation settings (D3)."""
    from k8s.config import Config

    return {"defrag_interval", "defrag_max_moves"} <= set(Config.__dataclass_fields__)


def trace_digest(trace: pt.Trace) -> str:
    """sha256 over the trace's sets (id, arrive, size, stop, release, held), 16 hex digits."""
    h = hashlib.sha256()
    for s in trace.sets:
        h.update(f"{s.id},{s.arrive:.6f},{s.size},{s.stop:.6f},{s.release:.6f},{s.held};".encode())
    return h.hexdigest()[:16]


# -- what the watches see ------------------------------------------------------------------

@dataclass
class Seen:
    """The watched cluster: Bound GPUDevices and Pods of the benchmark's namespaces."""

    devices: dict[tuple[str, str], tuple[str | None, str]] = field(default_factory=dict)
    """(namespace, name) -> (nodeName once Bound else None, template-for VMI name or "")."""
    pods: dict[tuple[str, str], dict] = field(default_factory=dict)
    """(namespace, name) -> {uid: created-by VMI uid, node, unschedulable, gpus}."""

    def used_per_node(self, lane: "Lane") -> dict[str, int]:
        used: dict[str, int] = defaultdict(int)
        if lane.system in ("a", "e"):
            for (ns, _), (node, _t) in self.devices.items():
                if ns == lane.ns and node:
                    used[node] += 1
        else:
            for (ns, _), p in self.pods.items():
                if ns == lane.ns and p["node"]:
                    used[p["node"]] += p["gpus"]
        return used

    def pod_of(self, ns: str, uid: str) -> tuple[str, dict] | None:
        for (pns, name), p in self.pods.items():
            if pns == ns and p["uid"] == uid:
                return name, p
        return None


def _device_event(seen: Seen, kind: str, obj: dict) -> None:
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    if kind == "DELETED":
        seen.devices.pop(key, None)
        return
    st = obj.get("status") or {}
    seen.devices[key] = (st.get("nodeName") if st.get("phase") == "Bound" else None,
                         (obj["metadata"].get("labels") or {}).get(TEMPLATE_FOR_LABEL, ""))


def _pod_event(res_of: dict[str, str], seen: Seen, kind: str, obj: dict) -> None:
    meta = obj["metadata"]
    key = (meta["namespace"], meta["name"])
    if kind == "DELETED":
        seen.pods.pop(key, None)
        return
    res = res_of.get(meta["namespace"], "")
    gpus = sum(int(((c.get("resources") or {}).get("requests") or {}).get(res, 0))
               for c in obj["spec"].get("containers") or [])
    unsched = any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                  and c.get("reason") == "Unschedulable"
                  for c in (obj.get("status") or {}).get("conditions") or [])
    seen.pods[key] = {"uid": (meta.get("labels") or {}).get("kubevirt.io/created-by", ""),
                      "node": obj["spec"].get("nodeName"), "unschedulable": unsched, "gpus": gpus}


async def _until(cond, timeout: float) -> bool:
    """Poll the watch caches until cond() holds; False after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.05)
    return True


# -- one lane --------------------------------------------------------------------------------

@dataclass
class Lane:
    """One system on one load: its namespace, resource, class (a, e), nodes and what it did."""

    system: str
    trace: pt.Trace
    ns: str
    res: str
    cls: str
    nodes: list[str]
    outcome: pt.Outcome = field(default_factory=pt.Outcome)
    placed: dict[int, str] = field(default_factory=dict)   # started set id -> node
    vmi_uid: dict[int, str] = field(default_factory=dict)
    running: int = 0
    held_idle: int = 0
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    replayed: list[tuple[int, int, bool]] = field(default_factory=list)
    seconds: float = 0.0


def _vmi(name: str, lane: Lane, s: pt.GpuSet) -> dict:
    v = base_vmi()
    v["apiVersion"] = f"{VMI_GROUP}/{VMI_VERSION}"
    v["metadata"] = {"name": name, "labels": {"pk-bench/set": str(s.id)}}
    if lane.system in ("a", "e"):
        del v["spec"]["domain"]["devices"]["gpus"]
        v["metadata"]["annotations"] = (
            {"gpu.cozystack.io/devices": ",".join(_held_names(s))} if s.held
            else {"gpu.cozystack.io/templates": f"{lane.cls}={s.size}"})
    else:
        v["spec"]["domain"]["devices"]["gpus"] = [{"name": f"gpu{k}", "deviceName": lane.res}
                                                  for k in range(s.size)]
        if lane.system == "c":
            v["spec"]["schedulerName"] = MOST_ALLOCATED
    return v


def _held_names(s: pt.GpuSet) -> list[str]:
    return [f"h{s.id}-{k}" for k in range(s.size)]


class Replayer:
    """Replays lanes against the cluster through one ApiClient and the shared watch caches."""

    def __init__(self, api, seen: Seen, *, deadline: float, release_timeout: float = 60.0) -> None:
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

        self.core = CoreV1Api(api)
        self.custom = CustomObjectsApi(api)
        self.seen = seen
        self.deadline = deadline
        self.release_timeout = release_timeout

    async def lane(self, lane: Lane, window: float) -> None:
        """Replay `lane.trace` window by window (module docstring); fills `lane.outcome`."""
        started = time.monotonic()
        events = lane.trace.events()
        sent: set[int] = set()
        carried: list[tuple[str, pt.GpuSet]] = []
        k = 0
        while k < len(events) or carried:
            w = int(events[k][0] // window) if k < len(events) else int(lane.trace.end // window) + 1
            batch = []
            while k < len(events) and int(events[k][0] // window) == w:
                batch.append(events[k])
                k += 1
            # a set that arrives in this window leaves in the next one at the earliest
            leaves, carried = carried, []
            for _, _, kind, s in batch:
                if kind != "arrive":
                    (leaves if s.id in sent else carried).append((kind, s))
            per_set: dict[int, list[tuple[str, pt.GpuSet]]] = defaultdict(list)
            for kind, s in leaves:
                per_set[s.id].append((kind, s))
            async with anyio.create_task_group() as tg:
                for steps in per_set.values():
                    tg.start_soon(self._leave_all, lane, steps)
            async with anyio.create_task_group() as tg:
                for _, _, kind, s in batch:
                    if kind == "arrive":
                        sent.add(s.id)
                        lane.replayed.append((s.id, s.size, s.held))
                        tg.start_soon(self._arrive, lane, s)
            used = self.seen.used_per_node(lane)
            free = [pt.GPUS_PER_NODE - used.get(n, 0) for n in lane.nodes]
            lane.outcome.timeline.append(((w + 0.5) * window, lane.running, lane.held_idle,
                                          pt.largest_placeable(free)))
        lane.seconds = time.monotonic() - started

    async def _arrive(self, lane: Lane, s: pt.GpuSet) -> None:
        from kubernetes_asyncio.client import ApiException

        name = f"s{s.id}"
        if lane.system in ("a", "e") and s.held:
            for dev in _held_names(s):
                await self.custom.create_namespaced_custom_object(
                    DEV_GROUP, DEV_VERSION, lane.ns, "gpudevices",
                    {"apiVersion": f"{DEV_GROUP}/{DEV_VERSION}", "kind": "GPUDevice",
                     "metadata": {"name": dev}, "spec": {"class": lane.cls}})
        try:
            made = await self._create_vmi(lane, name, s)
        except ApiException as exc:
            lane.counts["refused" if exc.status in (400, 403, 422) else f"error_{exc.status}"] += 1
            if lane.system in ("a", "e") and s.held:
                await self._delete_held(lane, s)
            return
        uid = made["metadata"]["uid"]
        lane.vmi_uid[s.id] = uid

        def outcome() -> bool:
            got = self.seen.pod_of(lane.ns, uid)
            return got is not None and (bool(got[1]["node"]) or got[1]["unschedulable"])
        await _until(outcome, self.deadline)
        got = self.seen.pod_of(lane.ns, uid)
        if got is not None and got[1]["node"]:
            lane.placed[s.id] = got[1]["node"]
            lane.outcome.started.add(s.id)
            lane.running += s.size
            if lane.system in ("a", "e"):
                pin = (made["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
                lane.counts["pin_agrees"] += pin == got[1]["node"]
            return
        lane.counts["unschedulable" if got is not None else "no_launcher_pod"] += 1
        await self._stop_vmi(lane, s)
        if lane.system in ("a", "e"):  # admitted, yet its Pod never bound: withdraw it whole
            lane.counts["admitted_not_bound"] += 1
            if s.held:
                await self._delete_held(lane, s)

    async def _create_vmi(self, lane: Lane, name: str, s: pt.GpuSet) -> dict:
        """Create the VMI; a denial naming a held device "not found" (the webhook's informer
        has not seen the tenant's brand-new GPUDevice yet) is retried for up to 5 s, counted
        as `retried_device_not_found`: a harness race, not a placement refusal."""
        from kubernetes_asyncio.client import ApiException

        deadline = time.monotonic() + 5
        while True:
            try:
                return await self.custom.create_namespaced_custom_object(
                    VMI_GROUP, VMI_VERSION, lane.ns, "virtualmachineinstances", _vmi(name, lane, s))
            except ApiException as exc:
                if not (s.held and exc.status == 422 and "not found" in str(exc.body)
                        and time.monotonic() < deadline):
                    raise
                lane.counts["retried_device_not_found"] += 1
                await anyio.sleep(0.25)

    async def _leave_all(self, lane: Lane, steps: list[tuple[str, pt.GpuSet]]) -> None:
        for kind, s in steps:  # a set's stop before its release
            await self._leave(lane, kind, s)

    async def _leave(self, lane: Lane, kind: str, s: pt.GpuSet) -> None:
        if s.id not in lane.placed:
            return
        if kind == "stop":
            node = lane.placed[s.id]
            await self._stop_vmi(lane, s)
            lane.running -= s.size
            if s.idle:
                lane.held_idle += s.size
                if lane.system in ("b", "c"):
                    await self._placeholder(lane, s, node)
                return
        else:
            lane.held_idle -= s.size
            if lane.system in ("b", "c"):
                await self._delete_pod(lane.ns, f"idle-{s.id}")
        if lane.system in ("a", "e") and s.held:
            await self._delete_held(lane, s)
        elif lane.system in ("a", "e"):  # H2 deletes the template devices
            vmi = f"s{s.id}"
            ok = await _until(lambda: not any(ns == lane.ns and t == vmi
                                              for (ns, _), (_, t) in self.seen.devices.items()),
                              self.release_timeout)
            lane.counts["release_timeout"] += not ok
        lane.placed.pop(s.id)

    async def _stop_vmi(self, lane: Lane, s: pt.GpuSet) -> None:
        from kubernetes_asyncio.client import ApiException

        name, uid = f"s{s.id}", lane.vmi_uid.get(s.id, "")
        for attempt in ("delete", "unfinalize"):
            try:
                if attempt == "delete":
                    await self.custom.delete_namespaced_custom_object(
                        VMI_GROUP, VMI_VERSION, lane.ns, "virtualmachineinstances", name,
                        grace_period_seconds=0)
                else:
                    await self.custom.patch_namespaced_custom_object(
                        VMI_GROUP, VMI_VERSION, lane.ns, "virtualmachineinstances", name,
                        {"metadata": {"finalizers": None}},
                        _content_type="application/merge-patch+json")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        got = self.seen.pod_of(lane.ns, uid)
        if got is not None:
            await self._delete_pod(lane.ns, got[0])
        ok = await _until(lambda: self.seen.pod_of(lane.ns, uid) is None, self.release_timeout)
        lane.counts["pod_gone_timeout"] += not ok

    async def _delete_pod(self, ns: str, name: str) -> None:
        from kubernetes_asyncio.client import ApiException

        try:
            await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
        await _until(lambda: (ns, name) not in self.seen.pods, self.release_timeout)

    async def _delete_held(self, lane: Lane, s: pt.GpuSet) -> None:
        from kubernetes_asyncio.client import ApiException

        names = _held_names(s)
        deadline = time.monotonic() + self.release_timeout
        for dev in names:
            while True:  # refused (403) while still attached, until H2 clears the attachment
                try:
                    await self.custom.delete_namespaced_custom_object(
                        DEV_GROUP, DEV_VERSION, lane.ns, "gpudevices", dev)
                    break
                except ApiException as exc:
                    if exc.status == 404:
                        break
                    if exc.status != 403 or time.monotonic() > deadline:
                        raise
                    await anyio.sleep(0.2)
        ok = await _until(lambda: not any((lane.ns, d) in self.seen.devices for d in names),
                          self.release_timeout)
        lane.counts["release_timeout"] += not ok

    async def _placeholder(self, lane: Lane, s: pt.GpuSet, node: str) -> None:
        """(b, c) an idle held set: a Pod bound to `node` requesting the set's GPUs."""
        await self.core.create_namespaced_pod(lane.ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"idle-{s.id}", "labels": {"pk-bench/idle": "true"}},
            "spec": {"nodeName": node, "containers": [{
                "name": "hold", "image": "bench/none",
                "resources": {"requests": {lane.res: str(s.size)},
                              "limits": {lane.res: str(s.size)}}}]}})
        await _until(lambda: (lane.ns, f"idle-{s.id}") in self.seen.pods, self.release_timeout)


# -- the run -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """The run's sizes: `nodes` per lane, `arrivals` scored per load, `loads`, `per_window`
    arrivals per window on average, `deadline` s for a launcher Pod to bind."""

    nodes: int
    arrivals: int
    loads: tuple[float, ...]
    per_window: float = 4.0
    deadline: float = 20.0
    warmup: float = 2.0


QUICK = Plan(nodes=6, arrivals=30, loads=(0.85,), per_window=3.0, warmup=1.0)
FULL = Plan(nodes=24, arrivals=300, loads=pt.LOADS, per_window=6.0)


def run(out: Path, *, quick: bool = False, seed: int = 1, simulate_only: bool = False,
        plan: Plan | None = None, systems: tuple[str, ...] = ("a", "b", "c", "e")) -> dict:
    """Run the benchmark (or, with `simulate_only`, the simulation alone) on a local cluster
    of its own; write packing.json and packing.png into `out`; return the report. Raises
    localcluster.controlplane.ControlPlaneError when the cluster cannot start."""
    plan = plan or (QUICK if quick else FULL)
    out.mkdir(parents=True, exist_ok=True)
    traces, report = prepare(plan, seed=seed, quick=quick, simulate_only=simulate_only)
    if not simulate_only:
        with LocalCluster(controllers=1, controller_args=CONTROLLER_ARGS,
                          log_dir=out / "logs") as lc:
            replay_on(lc, plan, traces, report, log_dir=out / "logs", systems=systems)
    return finish(report, out)


def prepare(plan: Plan, *, seed: int, quick: bool = False, simulate_only: bool = False
            ) -> tuple[dict[float, pt.Trace], dict]:
    """The traces (load -> Trace) and the report so far: plan, machine, per load the trace's
    digest, the simulation and the bound (d). Pure but for the load average."""
    traces = {}
    for load in plan.loads:
        raw = pt.make_trace(seed=seed, nodes=plan.nodes, load=load, arrivals=plan.arrivals,
                            warmup=plan.warmup)
        traces[load] = pt.quantize(raw, plan.per_window * raw.end / len(raw.sets))
    report: dict = {
        "benchmark": "packing", "quick": quick, "seed": seed, "simulation_only": simulate_only,
        "plan": {"nodes_per_lane": plan.nodes, "gpus_per_node": pt.GPUS_PER_NODE,
                 "scored_arrivals": plan.arrivals, "loads": list(plan.loads),
                 "arrivals_per_window": plan.per_window, "deadline_s": plan.deadline,
                 "warmup_mean_lives": plan.warmup, "held_share": 0.3, "idle_share": 0.5,
                 "sizes": dict(zip(map(str, pt.SIZES), pt.SIZE_WEIGHTS))},
        "systems": SYSTEMS, "commit": commit(), "load_before": os.getloadavg(),
        "machine": machine(), "loads": {}}
    for load, tr in traces.items():
        bound = pt.simulate(tr, "repack")
        report["loads"][str(load)] = {
            "trace": {"digest": trace_digest(tr), "sets": len(tr.sets),
                      "window_s": round(tr.window, 3),
                      "scored": sum(s.scored for s in tr.sets), "trace_seconds": round(tr.end, 1),
                      "arrivals_digest": arrivals_digest(tr)},
            "simulation": {"note": "pure simulation of placement policies on this trace, no cluster",
                           **pt.simulate_all(tr)},
            "systems": {"d": {**pt.score(tr, bound), "timeline": _timeline(tr, bound)}}}
    return traces, report


def finish(report: dict, out: Path) -> dict:
    """Targets, load after; write packing.json and packing.png into `out`; the report."""
    out.mkdir(parents=True, exist_ok=True)
    report["load_after"] = os.getloadavg()
    report["targets"] = _targets(report)
    (out / "packing.json").write_text(json.dumps(report, indent=1))
    _plot(report, out / "packing.png")
    return report


def arrivals_digest(trace: pt.Trace) -> str:
    """The digest a lane's replay must reproduce: sha256 of the (id, size, held) of every
    arrival in trace order, 16 hex digits."""
    return hashlib.sha256(repr([(s.id, s.size, s.held) for s in trace.sets]).encode()).hexdigest()[:16]


def _timeline(trace: pt.Trace, outcome: pt.Outcome) -> list[list]:
    """For the plot: [time, running GPUs, held idle GPUs, None] from the sets started, and
    [time, None, None, largest placeable] from the outcome's samples."""
    rows = [[t, u, h, None] for t, u, h in pt.usage_timeline(trace, outcome.started)]
    rows += [[t, None, None, big] for t, _, _, big in outcome.timeline]
    return sorted(rows, key=lambda r: (r[0], r[1] is None))


def replay_on(lc: LocalCluster, plan: Plan, traces: dict[float, pt.Trace], report: dict, *,
              log_dir: Path, prefix: str = "pk-",
              systems: tuple[str, ...] = ("a", "b", "c", "e")) -> None:
    """Replay every lane on the running `lc` (its controllers restarted with the defrag flags
    for (e) when available) with KubeVirt's harness started here, kube-scheduler carrying the
    MostAllocated profile; adds each lane's figures to `report`. Every object it makes is
    named `prefix`…, so a shared control plane (the e2e session's) keeps them apart.
    `systems`: which of a, b, c, e to replay (the others are left out of the report)."""
    from localcluster.kubevirt import KUBEVIRT_CR, NAMESPACE, KubeVirt

    systems = [k for k in "abc" if k in systems] + (
        ["e"] if "e" in systems and defrag_available() else [])
    lanes = {}
    for sys_ in systems:
        for load, tr in traces.items():
            lid = f"{prefix}{sys_}{round(load * 100)}"
            lanes[(sys_, load)] = Lane(sys_, tr, lid, f"{lid}.bench.example.com/gpu", lid,
                                       [f"{lid}-{i:03d}" for i in range(plan.nodes)])
    report["replayed_systems"] = systems
    profile = {"schedulerName": MOST_ALLOCATED, "pluginConfig": [{
        "name": "NodeResourcesFit", "args": {"scoringStrategy": {
            "type": "MostAllocated",
            "resources": [{"name": ln.res, "weight": 1} for ln in lanes.values() if ln.system == "c"]}}}]}
    version = json.loads(lc.cp.kubectl("version", "-o", "json").stdout)
    report["versions"] = {"kube-apiserver": version["serverVersion"]["gitVersion"]}
    kv = KubeVirt(lc.cp, permitted=tuple(ln.res for ln in lanes.values()),
                  log_dir=log_dir / "kubevirt", scheduler_profiles=(profile,))
    kv.start()
    try:
        anyio.run(_measure, lc, plan, lanes, report, prefix)
    finally:
        kv.stop()
        lc.cp.kubectl("delete", "kubevirt", KUBEVIRT_CR, "-n", NAMESPACE, "--ignore-not-found",
                      "--wait=false", check=False)


async def _measure(lc: LocalCluster, plan: Plan, lanes: dict, report: dict, prefix: str) -> None:
    from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
    from kubernetes_asyncio.config import load_kube_config

    cfg = Configuration()
    await load_kube_config(config_file=str(lc.cp.admin_kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 64
    api = ApiClient(cfg)
    seen = Seen()
    res_of = {ln.ns: ln.res for ln in lanes.values()}
    try:
        fleet = Fleet(api)
        await _setup(fleet, lanes)
        async with anyio.create_task_group() as watches:
            custom, core = CustomObjectsApi(api), CoreV1Api(api)
            watches.start_soon(watch_namespaced, custom.list_cluster_custom_object,
                               (DEV_GROUP, DEV_VERSION, "gpudevices"),
                               lambda k, o: _device_event(seen, k, o), prefix)
            watches.start_soon(watch_namespaced, core.list_pod_for_all_namespaces, (),
                               lambda k, o: _pod_event(res_of, seen, k, o), prefix)
            rep = Replayer(api, seen, deadline=plan.deadline)
            first = [ln for ln in lanes.values() if ln.system != "e"]
            async with anyio.create_task_group() as tg:
                for ln in first:
                    tg.start_soon(rep.lane, ln, ln.trace.window)
            second = [ln for ln in lanes.values() if ln.system == "e"]
            if second:
                await _restart_with_defrag(lc)
                async with anyio.create_task_group() as tg:
                    for ln in second:
                        tg.start_soon(rep.lane, ln, ln.trace.window)
            watches.cancel_scope.cancel()
    finally:
        await api.close()
    for (sys_, load), ln in lanes.items():
        entry = report["loads"][str(load)]["systems"]
        entry[sys_] = {**pt.score(ln.trace, ln.outcome), "counts": dict(ln.counts),
                       "started_sets": len(ln.outcome.started),
                       "replay_seconds": round(ln.seconds, 1),
                       "replayed_digest": hashlib.sha256(repr(ln.replayed).encode()).hexdigest()[:16],
                       "timeline": _timeline(ln.trace, ln.outcome)}
    for load in report["loads"].values():
        if defrag_available():
            continue
        load["systems"].setdefault("e", {"available": False, "why":
                                         "this tree's controller has no --defrag-interval/"
                                         "--defrag-max-moves (issue 21 item 2 not merged)"})


async def _setup(fleet: Fleet, lanes: dict) -> None:
    """Per lane: namespace (a tenant for a, e), GPUClass (a, e), nodes; waits for each class's
    KubeVirtPermitted=True (the webhook's cache has seen the KubeVirt CR)."""
    limit = anyio.Semaphore(16)

    async def node(name: str, res: str, system: str) -> None:
        async with limit:
            await fleet.node(name, {res: pt.GPUS_PER_NODE}, kwok=True,
                             labels={"pk-bench/system": system})
    for ln in lanes.values():
        if ln.system in ("a", "e"):
            await fleet.gpu_class(ln.cls, ln.res)
            await fleet.tenant(ln.ns)
        else:
            await fleet.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ln.ns}})
    async with anyio.create_task_group() as tg:
        for ln in lanes.values():
            for n in ln.nodes:
                tg.start_soon(node, n, ln.res, ln.system)
    for ln in lanes.values():
        if ln.system not in ("a", "e"):
            continue

        def permitted(got: dict) -> bool:
            return any(c["type"] == "KubeVirtPermitted" and c["status"] == "True"
                       for c in (got.get("status") or {}).get("conditions") or [])
        deadline = time.monotonic() + 60
        while not permitted(await fleet.custom.get_cluster_custom_object(
                DEV_GROUP, DEV_VERSION, "gpuclasses", ln.cls)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"GPUClass {ln.cls} not KubeVirtPermitted within 60 s")
            await anyio.sleep(0.5)


async def _restart_with_defrag(lc: LocalCluster) -> None:
    lc.controller_args = tuple(lc.controller_args) + DEFRAG_ARGS
    for i in range(len(lc.replicas)):
        lc.kill_replica(i, signal.SIGTERM)
        lc.start_replica(i)
    for i in range(len(lc.replicas)):
        await anyio.to_thread.run_sync(lc.wait_ready, i)
    await anyio.sleep(0)


# -- targets and plot ------------------------------------------------------------------------

def _fig(report: dict, load: str, system: str, key: str, size: str | None = None):
    s = report["loads"].get(load, {}).get("systems", {}).get(system) or {}
    if not s or s.get("available") is False:
        return None
    return s[key][size] if size else s[key]


def _targets(report: dict) -> dict:
    """Issue 21's targets, each {value, target, met} (met None when a figure is missing)."""
    def t(value, target: str, met) -> dict:
        return {"value": value, "target": target, "met": met}
    out = {}
    a8, b8 = _fig(report, "0.85", "a", "sets_started", "8"), _fig(report, "0.85", "b", "sets_started", "8")
    out["load 0.85: gpu-binder 8-GPU sets"] = t(a8, ">= 0.97", None if a8 is None else a8 >= 0.97)
    out["load 0.85: gpu-binder / default kube-scheduler, 8-GPU sets"] = t(
        None if a8 is None or b8 is None else (round(a8 / b8, 2) if b8 else "inf"), ">= 10",
        None if a8 is None or b8 is None else (b8 == 0 and a8 > 0) or (b8 > 0 and a8 / b8 >= 10))
    a, d, c = (_fig(report, "0.95", k, "demand_started") for k in "adc")
    out["load 0.95: demand within 3 points of the bound"] = t(
        None if a is None else round(d - a, 4), "bound - gpu-binder <= 0.03",
        None if a is None else d - a <= 0.03)
    out["load 0.95: demand >= MostAllocated"] = t(
        None if a is None or c is None else [a, c], "gpu-binder >= MostAllocated",
        None if a is None or c is None else a >= c)
    gaps = []
    for load in report["loads"]:
        e8, a8_, d8 = (_fig(report, load, k, "sets_started", "8") for k in "ead")
        if None not in (e8, a8_, d8) and d8 > a8_:
            gaps.append((e8 - a8_) / (d8 - a8_))
    out["defrag closes >= half the 8-GPU gap"] = t(
        [round(g, 2) for g in gaps] or None, ">= 0.5 at every load with a gap",
        None if not gaps else all(g >= 0.5 for g in gaps))
    return out


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = list(report["loads"])
    fig, axes = plt.subplots(len(loads), 2, figsize=(12, 3.2 * len(loads)), squeeze=False)
    gpus = report["plan"]["nodes_per_lane"] * report["plan"]["gpus_per_node"]
    for row, load in zip(axes, loads):
        for key, s in report["loads"][load]["systems"].items():
            tl = s.get("timeline") if isinstance(s, dict) else None
            if not tl:
                continue
            label = f"({key}) {SYSTEMS[key]}"
            use = [p for p in tl if p[1] is not None]
            big = [p for p in tl if p[3] is not None]
            row[0].step([p[0] for p in use], [p[1] / gpus for p in use], where="post",
                        label=label, lw=1)
            row[1].step([p[0] for p in big], [p[3] for p in big], where="post", label=label, lw=1)
        row[0].set_title(f"load {load}: GPU utilisation (running VMs)")
        row[1].set_title(f"load {load}: largest placeable set")
        row[0].set_ylim(0, 1.05)
        row[1].set_yticks(list(pt.SIZES) + [0])
        for ax in row:
            ax.set_xlabel("trace time (s; mean VM life 100)")
            ax.axvline(report["plan"]["warmup_mean_lives"] * pt.MEAN_LIFE, color="grey", ls=":")
        row[0].legend(fontsize=7, loc="lower right")
    if report["simulation_only"]:
        fig.suptitle("simulation only (no cluster): the bound (d); see the report's simulation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary(report: dict) -> list[str]:
    """The report as Markdown table rows (header first): per load and system, demand started,
    8- and 4-GPU sets started, mean utilisation, time an 8-GPU set fits; the simulation's rows
    are marked "sim"."""
    def pct(v) -> str:
        return "–" if v is None else f"{100 * v:.1f} %"
    rows = ["| load | system | GPU demand started | 8-GPU sets | 4-GPU sets | mean utilisation "
            "| time an 8-GPU set fits |", "|---|---|---|---|---|---|---|"]
    for load, entry in report["loads"].items():
        for key in "abcde":
            fig = entry["systems"].get(key)
            if fig is None:
                continue
            if fig.get("available") is False:
                rows.append(f"| {load} | ({key}) {SYSTEMS[key]} | not available: {fig['why']} "
                            "| | | | |")
                continue
            rows.append(f"| {load} | ({key}) {SYSTEMS[key]} | {pct(fig['demand_started'])} | "
                        f"{pct(fig['sets_started']['8'])} | {pct(fig['sets_started']['4'])} | "
                        f"{pct(fig['mean_utilisation'])} | {pct(fig['time_8_placeable'])} |")
        for policy, fig in entry["simulation"].items():
            if policy == "note":
                continue
            rows.append(f"| {load} | sim: {policy} | {pct(fig['demand_started'])} | "
                        f"{pct(fig['sets_started']['8'])} | {pct(fig['sets_started']['4'])} | "
                        f"{pct(fig['mean_utilisation'])} | {pct(fig['time_8_placeable'])} |")
    return rows
