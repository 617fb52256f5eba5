"""The scale benchmark's measurements on a populated cluster (`Measure`: replica memory, a
fresh replica's start-up, an idle window, quiet admissions, bursts, a leader failover), one
size's part of the report (`measure_on`) and the benchmark on clusters of its own (`run`);
the pure figures of a window (`quiet_inside`, `idle_figures`)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import anyio

from bench import floor_report as fr
from bench.common import (DEV_GROUP, DEV_VERSION, VMI_GROUP, VMI_VERSION, VMIS, LauncherPods,
                          Samples, admin_client, apiserver_metrics, commit, delta, machine,
                          percentile, replica_roles, replica_samples)
from bench.proc_cpu import cpu_cores, cpu_per_admission, cpu_snapshot
from bench.scale.growth import grew, growth
from bench.scale.growth import plot as plot_growth
from bench.scale.population import (admit, cluster_pids, latency_between, latency_of, memory,
                                    populate, request_counts, requests_per_s, say)
from bench.scale.report import plot, targets
from bench.scale.workload import Plan, Population, ScaleSpec, VmiRecord
from localcluster.fleet import Fleet


def latency_summary(recs: list[VmiRecord], seconds: float | None = None) -> dict:
    """{asked, admitted, refused, p50_ms, p99_ms, max_ms, refusals (first 3)} of `recs`'s
    answers (admitted ones' latencies), and admissions/s over `seconds` when given."""
    lat = [r.admit_ms for r in recs if r.admitted]
    out = {"asked": len(recs), "admitted": len(lat), "refused": sum(1 for r in recs if not r.admitted),
           "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "max_ms": max(lat) if lat else None,
           "refusals": [r.refusal for r in recs if not r.admitted][:3]}
    if seconds:
        out["seconds"] = round(seconds, 2)
        out["admissions_per_s"] = round(len(lat) / seconds, 2)
    return out



@dataclass(slots=True)
class Reading:
    """What a window's figures are taken between (`Measure.reading`): the replicas' summed
    samples (`replica_samples`), kube-apiserver's request latency (`latency_of`) and request
    counts (`request_counts`), each named process's CPU seconds (`cpu_snapshot`) and the
    monotonic clock (s) when the CPU was read."""

    samples: Samples
    latency: dict[str, tuple[float, int]]
    requests: dict[str, int]
    cpu: dict[str, float | None]
    t: float


def quiet_inside(before: Reading, after: Reading, recs: list[VmiRecord], mode: str,
                 roles: dict[str, str]) -> dict:
    """What a quiet window's admissions (`recs`, mode `mode`) cost inside, from two `Reading`s
    around it: the replicas' "webhook_mean_ms", "decision_mean_ms", "decisions"
    (`floor_report.replica_means`), "housekeeping_rounds" (the leader's), "client_mean_ms"
    (the admitted ones' latency as this client saw it), "apiserver" (`latency_between`: the
    admission's GPUDevice and VMI calls as kube-apiserver timed them), "phases"
    (`floor_report.phase_means`: mode → phase → {n, mean_ms}), "phase_ms" (`mode`'s phases
    as ms per admission, `floor_report.per_admission_ms`: they and "own", the webhook's time
    between its steps, sum to "total") and "cpu" (`cpu_per_admission` over the window's wall
    time with the replicas' `roles`, and "process_cores": `cpu_cores`' per process)."""
    d = delta(before.samples, after.samples)
    phases = fr.phase_means(d)
    admitted = sum(r.admitted for r in recs)
    seconds = after.t - before.t
    return {**fr.replica_means(d), "housekeeping_rounds": _rounds(d),
            "client_mean_ms": round(sum(r.admit_ms for r in recs if r.admitted)
                                    / max(1, admitted), 1),
            "apiserver": latency_between(before.latency, after.latency),
            "phases": phases, "phase_ms": fr.per_admission_ms(phases.get(mode, {})),
            "cpu": {**cpu_per_admission(before.cpu, after.cpu, admitted, seconds, roles),
                    "process_cores": cpu_cores(before.cpu, after.cpu, seconds, roles)["cores"]}}


def idle_figures(before: Reading, after: Reading, roles: dict[str, str]) -> dict:
    """A window with no admission, from two `Reading`s around it: `cpu_cores` (each
    process's background cores at this fleet size, the replicas by `roles`),
    "apiserver_requests_per_s" (`requests_per_s`: what kube-apiserver served meanwhile, the
    busiest first) and "replicas" (`floor_report.replica_means`: decisions and reviews, none
    expected; and the leader's "housekeeping_rounds")."""
    d = delta(before.samples, after.samples)
    return {**cpu_cores(before.cpu, after.cpu, after.t - before.t, roles),
            "apiserver_requests_per_s": requests_per_s(before.requests, after.requests,
                                                       after.t - before.t),
            "replicas": {**fr.replica_means(d), "housekeeping_rounds": _rounds(d)}}


def _rounds(d: Samples) -> int:
    """The leader's housekeeping rounds in a delta of the replicas' samples
    (`gpu_binder_housekeeping_rounds`, counted while leading)."""
    return int(sum(v for (name, _), v in d.items()
                   if name == "gpu_binder_housekeeping_rounds_total"))


class Measure:
    """The measurements on a populated cluster (`run` calls them in order). Each new VMI is
    named `<prefix><tag><k>`, spread round-robin over the population's tenants and classes."""

    def __init__(self, lc, fleet: Fleet, pop: Population, pods: LauncherPods,
                 plan: Plan) -> None:
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

    def pids(self) -> dict[str, int]:
        """The processes a window's CPU is counted over: the cluster's (`cluster_pids`) and
        this one ("bench": the clients and the launcher Pods' watch)."""
        return {**cluster_pids(self.lc), "bench": os.getpid()}

    async def reading(self, pids: dict[str, int], *, cpu_first: bool) -> Reading:
        """A `Reading` of `pids` and the replicas' and kube-apiserver's /metrics; the CPU
        and the clock read after the scrapes at a window's start (`cpu_first` False) and
        before them at its end, so the scrapes' own CPU stays out of the window."""
        cpu = t = None
        if cpu_first:
            cpu, t = cpu_snapshot(pids), time.monotonic()
        got = await replica_samples(self.lc)
        text = await apiserver_metrics(self.fleet.custom.api_client)
        if not cpu_first:
            cpu, t = cpu_snapshot(pids), time.monotonic()
        return Reading(got, latency_of(text), request_counts(text), cpu, t)

    async def idle(self, seconds: float) -> dict:
        """`seconds` with no admission (a measured window of that length, nothing awaited in
        it): `idle_figures`, each process's background cores at this fleet size."""
        pids, roles = self.pids(), await replica_roles(self.lc)
        before = await self.reading(pids, cpu_first=False)
        await anyio.sleep(seconds)
        return idle_figures(before, await self.reading(pids, cpu_first=True), roles)

    async def quiet(self) -> dict:
        """Admissions one at a time (each VMI's launcher Pod awaited bound before the next;
        the GPU count's VMIs released, `release`, before the next count): per GPU count,
        latency_summary, how many launcher Pods bound on their pin, `inside` (`quiet_inside`:
        what of the client's latency our webhook, its phases, the binder and kube-apiserver
        account for, and each process's CPU per admission and cores over the same
        admissions) and the release."""
        out = {}
        mode = self.pop.spec.mode
        for size, n in self.plan.quiet.items():
            recs = []
            pids, roles = self.pids(), await replica_roles(self.lc)
            before = await self.reading(pids, cpu_first=False)
            for _ in range(n):
                rec = self._new(f"q{size}-", size)
                await admit(self.fleet, rec, self.pop.counts)
                await self._bound([rec])
                recs.append(rec)
            after = await self.reading(pids, cpu_first=True)
            released = await self.release(recs)
            out[str(size)] = {**latency_summary(recs), **on_pin(recs),
                              "inside": quiet_inside(before, after, recs, mode, roles),
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
        return {**latency_summary(recs, took), **on_pin(recs), "release": await self.release(recs)}

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
                "none_lost": {"unanswered": lost, **on_pin(everyone),
                              "refused_vmis_in_api": leftover["in_api"],
                              "devices_attached_to_refused": leftover["attached"],
                              "attachments_cleared_after_s": leftover["cleared_s"]},
                "ok": not lost and on_pin(everyone)["off_pin_or_unbound"] == 0
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


def on_pin(recs: list[VmiRecord]) -> dict:
    """{bound_on_pin, off_pin_or_unbound}: of `recs`' admitted VMIs, how many have their
    launcher Pod on the node the webhook pinned (B3) and how many not (or not bound)."""
    adm = [r for r in recs if r.admitted]
    ok = sum(1 for r in adm if r.node and r.node == r.pin)
    return {"bound_on_pin": ok, "off_pin_or_unbound": len(adm) - ok}


async def settle(plan: Plan, *, poll_s: float = 5.0) -> dict:
    """Wait until the 1-minute load average is at most `plan.settle_load`, or
    `plan.settle_s` seconds passed (bounded): {"waited_s", "load_before", "load_at_quiet"
    (1-minute load, 2 decimals), "settled" (the load was reached)}."""
    t0, before = time.monotonic(), os.getloadavg()[0]
    while os.getloadavg()[0] > plan.settle_load and time.monotonic() - t0 < plan.settle_s:
        await anyio.sleep(min(poll_s, max(0.0, plan.settle_s - (time.monotonic() - t0))))
    now = os.getloadavg()[0]
    return {"waited_s": round(time.monotonic() - t0, 1), "load_before": round(before, 2),
            "load_at_quiet": round(now, 2), "settled": now <= plan.settle_load}


CONTROLLER_ARGS = ("--attachment-grace=30",)
"""The replicas' flags: defaults (the default Lease: 10 s, renew deadline 7 s, retry 1 s)
but a 30 s attachment grace, so the failover's none-lost check sees a killed webhook's
leftovers cleared (H1) within the run."""



async def measure_on(lc, spec: ScaleSpec, plan: Plan) -> dict:
    """Populate `lc` (started with KubeVirt) with `spec`, then measure (module docstring):
    replica memory, a fresh replica's start-up, the settle wait, an idle window of
    `plan.idle_s` (`Measure.idle`), quiet admissions, bursts, failover. Returns that size's
    part of the report."""
    api = await admin_client(lc, 128)
    try:
        fleet = Fleet(api)
        pop = await populate(lc, lc.kubevirt, fleet, spec)
        out: dict = {"population": pop.summary(), "load_after_population": os.getloadavg()}
        pods = LauncherPods(api, spec.prefix)
        async with anyio.create_task_group() as watches:
            watches.start_soon(pods.watch)
            m = Measure(lc, fleet, pop, pods, plan)
            await anyio.sleep(2)
            out["memory"] = m.memory()
            say("memory read; start-up")
            out["startup"] = await m.startup()
            out["settle"] = await settle(plan)
            say(f"idle for {plan.idle_s} s")
            out["idle"] = await m.idle(plan.idle_s)
            say(f"quiet admissions (load {out['settle']['load_at_quiet']} after "
                f"{out['settle']['waited_s']} s)")
            out["quiet"] = await m.quiet()
            out["bursts"] = {str(n): await m.burst(n) for n in plan.bursts}
            out["memory_after_bursts"] = m.memory()
            say("failover")
            out["failover"] = await m.failover()
            watches.cancel_scope.cancel()
        out["counts"] = dict(pop.counts)
        return out
    finally:
        await api.close()


def _measure_cluster(sp: ScaleSpec, plan: Plan, logs, kwok_args: tuple[str, ...]) -> dict:
    """One size's part of the report: a LocalCluster of its own (two replicas with
    CONTROLLER_ARGS, KubeVirt's harness; in device mode with NVIDIA's DeviceClass,
    kube-controller-manager's resourceclaim-controller and `GPUsWithDRA`) populated with `sp`
    and measured (`measure_on`), with its wall time."""
    from localcluster.cluster import LocalCluster
    from localcluster.kubevirt import GPUS_WITH_DRA, KubeVirt

    t0 = time.monotonic()
    device = sp.mode == "device"
    say(f"{sp.nodes} nodes ({sp.mode} mode): starting the cluster; load {os.getloadavg()}")
    with LocalCluster(controllers=2, controller_args=CONTROLLER_ARGS, log_dir=logs,
                      dra=device) as lc:
        lc.kubevirt = KubeVirt(lc.cp, log_dir=logs / "kubevirt", kwok_args=kwok_args,
                               feature_gates=(GPUS_WITH_DRA,) if device else ())
        lc.kubevirt.start()
        part = anyio.run(measure_on, lc, sp, plan)
    part["wall_s"] = round(time.monotonic() - t0, 1)
    return part


def run(out, *, nodes: int = 1000, baseline_nodes: int | None = 100, vmis: int | None = None,
        plan: Plan | None = None, spec: ScaleSpec | None = None, log_dir=None,
        kwok_args: tuple[str, ...] = (), modes: tuple[str, ...] = ("count",),
        sizes: tuple[int, ...] | None = None) -> dict:
    """The benchmark: for `baseline_nodes` (None: skipped) then `nodes`, a LocalCluster of
    its own (two replicas with CONTROLLER_ARGS, KubeVirt's harness) populated with `spec`
    (default ScaleSpec) scaled to that many nodes (`vmis`: VMIs at `nodes`, scaled for the
    baseline) and measured (`measure_on`); `kwok_args`: extra KWOK flags (KWOK's defaults:
    a 40 s node Lease renewed every 10 s). With "device" in `modes` (issue 32) the same
    spec at `nodes` in device mode (HGX boards publishing ResourceSlices, ScaleSpec.mode) on
    a cluster of its own, into `device_sizes` (no baseline); without "count" only that.

    With `sizes` (node counts, ascending; `nodes` and `baseline_nodes` are then ignored)
    every mode of `modes` is measured at every size instead, smallest size first, the
    modes in the order given at each size, each on a cluster of its own (`vmis`: VMIs at
    the largest size, scaled for the others); `nodes` and `baseline_nodes` in the report are
    then the largest and the smallest size (None with one size), for `targets`.

    The report's `growth` section (`bench.scale.growth.growth`) gives per mode and size the
    quiet 1-GPU p50/p99 and the leader's VmHWM. Writes scale.json and scale.png into `out`,
    and growth.png when a mode was measured at two sizes or more; returns the report.
    scale.json is also written after each cluster (the parts measured so far, no targets),
    so a run that fails late keeps what it measured. Raises ControlPlaneError when a
    cluster cannot start."""
    from dataclasses import replace
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan or Plan()
    base = spec or ScaleSpec()
    if sizes:
        nodes, baseline_nodes = max(sizes), (min(sizes) if len(set(sizes)) > 1 else None)
    top = base.scaled(nodes, **({"vmis": vmis} if vmis else {}))
    report: dict = {"benchmark": "scale", "commit": commit(), "nodes": nodes,
                    "baseline_nodes": baseline_nodes, "modes": list(modes),
                    "node_sizes": sorted(set(sizes)) if sizes else None, "plan": asdict(plan),
                    "machine": machine(),
                    "controller_args": list(CONTROLLER_ARGS), "kwok_args": list(kwok_args),
                    "load_before": os.getloadavg(),
                    "sizes": {}, "device_sizes": {}}
    logs = Path(log_dir or out / "logs")

    def measured(key: str, label: str, sp: ScaleSpec, logs_at) -> None:
        report[key][label] = _measure_cluster(sp, plan, logs_at, kwok_args)
        (out / "scale.json").write_text(json.dumps(report, indent=1))
    if sizes:
        for n in sorted(set(sizes)):
            sp = top if n == nodes else top.scaled(n)
            for mode in modes:
                key, tag = ("sizes", "") if mode == "count" else ("device_sizes", "-device")
                measured(key, str(n), replace(sp, mode=mode), logs / f"{n}{tag}")
    else:
        counted = [top] + ([top.scaled(baseline_nodes)]
                           if baseline_nodes and baseline_nodes != nodes else [])
        if "count" not in modes:
            counted = []
        for sp in sorted(counted, key=lambda s: s.nodes):
            measured("sizes", str(sp.nodes), sp, logs / f"{sp.nodes}")
        if "device" in modes:
            measured("device_sizes", str(nodes), replace(top, mode="device"),
                     logs / f"{nodes}-device")
    report["load_after"] = os.getloadavg()
    report["targets"] = targets(report)
    report["growth"] = growth(report)
    (out / "scale.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "scale.png")
    if grew(report):
        plot_growth(report, out / "growth.png")
    return report
