"""The scale benchmark's population on a running cluster, through the real path
(`populate`, each VMI created by `admit`), and the figures of the processes and the API
server it reads meanwhile (`cluster_pids`, `memory`, `apiserver_writes`,
`apiserver_latency`; pure: `latency_of`, `latency_between`, `request_counts`,
`requests_per_s` on kube-apiserver's /metrics text)."""

from __future__ import annotations

import re
import time
from collections import Counter

import anyio

from bench.common import (DEV_GROUP, DEV_VERSION, VMI_GROUP, VMI_VERSION, VMIS, LauncherPods,
                          apiserver_metrics, cpu_seconds, error_text, gpu_vmi, memory_mib,
                          poll_until)
from bench.scale.workload import TAINT, Population, ScaleSpec, VmiRecord, plan_vmis, problem_nodes
from localcluster.dra_profiles import HGX_H100_8
from localcluster.dra_world import HGX_CLASS, dra_node
from localcluster.fleet import Fleet


def say(text: str) -> None:
    """A progress line on stderr (the benchmark runs for minutes)."""
    import sys

    print(f"[bench scale {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- process figures -------------------------------------------------------------------------

def cluster_pids(lc, kv=None) -> dict[str, int]:
    """name -> pid of every process of the cluster: the control plane's (etcd,
    kube-apiserver), kube-controller-manager when it runs (device mode's resourceclaim
    controller), KubeVirt's harness (virt-api, virt-controller, kube-scheduler, kwok) and
    each live replica (its identity)."""
    pids = {n: p.pid for n, p in lc.cp.procs.items() if p.poll() is None}
    cc = getattr(lc, "claim_controller", None)
    if cc is not None and cc.proc is not None and cc.proc.poll() is None:
        pids["kube-controller-manager"] = cc.proc.pid
    kv = kv or lc.kubevirt
    if kv is not None:
        pids.update({n: p.pid for n, p in kv.procs.items() if p.poll() is None})
    pids.update({r.identity: r.proc.pid for r in lc.replicas if r.alive})
    return pids


def memory(pid: int) -> dict[str, float]:
    """{"rss_mib": VmRSS, "hwm_mib": VmHWM} of `pid` from /proc/<pid>/status, MiB to a
    tenth (0 when the process is gone)."""
    got = memory_mib(pid)
    return {"rss_mib": round(got.get("VmRSS", 0.0), 1), "hwm_mib": round(got.get("VmHWM", 0.0), 1)}


async def apiserver_writes(api) -> dict[str, int]:
    """kube-apiserver's write requests served so far (create, update, patch, apply, delete;
    any code), per resource, from its /metrics `apiserver_request_total`."""
    text = await apiserver_metrics(api)
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
    """kube-apiserver's own request latency so far for what an admission costs
    (`latency_of` its /metrics text, read with `api`)."""
    return latency_of(await apiserver_metrics(api))


def latency_of(text: str) -> dict[str, tuple[float, int]]:
    """From kube-apiserver's /metrics text, its own request latency so far for what an
    admission costs: "<verb> <resource>[/<subresource>]" -> (seconds summed, requests), from
    `apiserver_request_duration_seconds` (GPUDevice and VMI requests, any verb)."""
    out: dict[str, list] = {}
    for line in text.splitlines():
        for suffix, slot in (("_sum{", 0), ("_count{", 1)):
            if not line.startswith("apiserver_request_duration_seconds" + suffix):
                continue
            res = re.search(r'resource="([^"]*)"', line)
            if not res or res.group(1) not in ("gpudevices", "virtualmachineinstances"):
                continue
            key = _verb_resource(line, res.group(1))
            out.setdefault(key, [0.0, 0])[slot] += float(line.rsplit(" ", 1)[1])
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def _verb_resource(line: str, resource: str) -> str:
    """"<verb> <resource>[/<subresource>]" of one of kube-apiserver's request samples; a
    request for no resource is "<verb> <path>" (kube-apiserver gives the path of /metrics,
    /healthz and the like as its subresource), or "<verb> (non-resource)" without one."""
    sub = re.search(r'subresource="([^"]*)"', line)
    sub_text = sub.group(1) if sub else ""
    m = re.search(r'verb="([^"]*)"', line)
    verb = m.group(1) if m else "?"
    if not resource:
        return f"{verb} {sub_text or '(non-resource)'}"
    return f"{verb} {resource}" + (f"/{sub_text}" if sub_text else "")


def latency_between(before: dict[str, tuple[float, int]],
                    after: dict[str, tuple[float, int]]) -> dict[str, dict]:
    """Between two `latency_of` readings, per "<verb> <resource>[/<sub>]" that served any:
    {"requests", "mean_ms" (to 0.1)}."""
    out = {}
    for k, (s1, n1) in after.items():
        s0, n0 = before.get(k, (0.0, 0))
        if n1 - n0 > 0:
            out[k] = {"requests": n1 - n0, "mean_ms": round(1000 * (s1 - s0) / (n1 - n0), 1)}
    return out


def request_counts(text: str) -> dict[str, int]:
    """From kube-apiserver's /metrics text, the requests it has served so far, every
    resource, verb and code: "<verb> <resource>[/<subresource>]" -> requests
    (`apiserver_request_total`)."""
    out: Counter = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        res = re.search(r'resource="([^"]*)"', line)
        key = _verb_resource(line, res.group(1) if res else "?")
        out[key] += int(float(line.rsplit(" ", 1)[1]))
    return dict(out)


def requests_per_s(before: dict[str, int], after: dict[str, int], seconds: float,
                   top: int = 12) -> dict[str, float]:
    """Between two `request_counts` readings `seconds` apart: requests a second per
    "<verb> <resource>[/<sub>]" (to 0.01), the `top` busiest first (ties by name), those
    that served none left out, and "total" (every request). {} when `seconds` is not
    positive."""
    if seconds <= 0:
        return {}
    d = {k: v - before.get(k, 0) for k, v in after.items()}
    busy = sorted(((-n, k) for k, n in d.items() if n > 0))[:top]
    out = {k: round(-n / seconds, 2) for n, k in busy}
    out["total"] = round(sum(n for n in d.values() if n > 0) / seconds, 2)
    return out


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
                VMI_GROUP, VMI_VERSION, rec.namespace, VMIS,
                gpu_vmi(rec.name, held=rec.held, cls=rec.cls, size=rec.size,
                        labels={"scale-bench/size": str(rec.size)}))
        except ApiException as exc:
            rec.admit_ms = round((time.perf_counter() - t0) * 1000, 1)
            msg = error_text(exc, "create")
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


async def wait_permitted(fleet: Fleet, cls: str, timeout: float = 90.0,
                         condition: str = "KubeVirtPermitted") -> None:
    """Wait until GPUClass `cls` shows `condition`=True (KubeVirtPermitted: the leader's
    housekeeping has seen the KubeVirt CR permitting its resource; a device-mode class has
    none, its `Ready` says the leader's cache found its DeviceClass, DR1). Raises
    TimeoutError."""
    async def permitted() -> bool:
        got = await fleet.custom.get_cluster_custom_object(DEV_GROUP, DEV_VERSION, "gpuclasses",
                                                           cls)
        return any(c["type"] == condition and c["status"] == "True"
                   for c in (got.get("status") or {}).get("conditions") or [])
    if not await poll_until(permitted, timeout, 0.5):
        raise TimeoutError(f"GPUClass {cls} not {condition} within {timeout:.0f} s")


async def populate(lc, kv, fleet: Fleet, spec: ScaleSpec) -> Population:
    """Build `spec`'s population on `lc` (a started LocalCluster whose replicas serve the
    webhook) with `kv` (a started localcluster.kubevirt.KubeVirt on the same control plane)
    through `fleet` (an admin Fleet). Returns the Population, with its own phase durations.

    Phases: (1) `kv`'s KubeVirt CR is made to permit the models' resources, the GPUClasses
    and tenants are created, then every node (concurrently, at most `spec.concurrency`
    writes in flight); waits until every class is KubeVirtPermitted (device mode: the
    device-mode class and HGX nodes publishing their slices, ScaleSpec; waits until the class
    is Ready); (2) the held GPUDevices
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
    device = spec.mode == "device"
    if not device:
        kv.set_permitted(tuple(sorted(set(kv.permitted) | set(spec.classes.values()))))
    for cls, res in spec.classes.items():
        if device:
            await fleet.gpu_class(cls, device_mode=HGX_CLASS.spec())
        else:
            await fleet.gpu_class(cls, res)
    pop.tenants = [f"{spec.prefix}t{k:02d}" for k in range(spec.tenants)]
    problems = problem_nodes(spec)
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
            if device:
                await dra_node(fleet, name, HGX_H100_8, **kw)
            else:
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
        await wait_permitted(fleet, cls, condition="Ready" if device else "KubeVirtPermitted")
    pop.seconds["nodes"] = time.monotonic() - t
    say(f"{spec.nodes} nodes, {len(spec.classes)} classes, {spec.tenants} tenants in "
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
    say(f"{sum(len(v.held) for v in pop.vmis) + idle} held devices in {pop.seconds['devices']:.1f} s")

    # (3) VMIs through the real path
    t = time.monotonic()
    pods = LauncherPods(fleet.custom.api_client, spec.prefix)
    async with anyio.create_task_group() as watches:
        watches.start_soon(pods.watch)

        async def one(rec: VmiRecord) -> None:
            async with limit:
                await admit(fleet, rec, pop.counts)
            pop.counts["answered"] += 1
            if pop.counts["answered"] % 250 == 0:
                say(f"{pop.counts['answered']}/{len(pop.vmis)} VMIs answered, "
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
    say(f"{len(pop.admitted)} of {len(pop.vmis)} VMIs admitted in {pop.seconds['vmis']:.1f} s")

    pop.seconds["total"] = time.monotonic() - t_all
    w1 = await apiserver_writes(fleet.custom.api_client)
    pop.writes = {k: w1[k] - w0.get(k, 0) for k in sorted(w1) if w1[k] - w0.get(k, 0)}
    pop.cpu_s = {n: cpu_seconds(p) - cpu0[n] for n, p in pids.items()}
    return pop
