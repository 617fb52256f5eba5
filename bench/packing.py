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

**HGX pools in device mode** (`--hgx`, issue 33; `bench.packing_hgx`): the same trace on
`hgx-h100-8` boards (KWOK nodes publishing the slices NVIDIA's DRA driver would, device mode's
cluster side from `LocalCluster(dra=True)`, KubeVirt with `GPUsWithDRA`), replayed against
(a) gpu-binder in device mode (a device-mode GPUClass per lane selecting its nodes by
LANE_LABEL; started = launcher Pod bound and its claim allocated), (b) kube-scheduler's DRA
allocator alone (each VMI names a ResourceClaimTemplate of N count-1 requests sharing
`gpu.nvidia.com/partitionN` and is pinned to its lane's nodes by LANE_LABEL; refused =
Unschedulable; an idle held set keeps its VMI until its release), (c) gpu-binder in count
mode on boards advertised as an extended resource, the GPUs a device plugin takes modelled
as the node's lowest-index free ones, and (d) the bound. Every started set's GPUs (the
claim's allocation, or the device plugin's pick) are checked for a whole partition; writes
`packing-hgx.json` and `packing-hgx.png`.

**Figures** per lane (`bench.packing_trace.score`): share of GPU demand started, share of sets
started per size, mean GPU utilisation (running VMs' GPUs ÷ fleet GPUs over trace time), the
largest placeable set sampled after every window from the watched Bound devices (a, e) or
bound Pods (b, c). `--simulate` runs the policy simulation only (no cluster), labelled so.
Writes `packing.json` and `packing.png` into the output folder. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from bench import packing_hgx as ph, packing_trace as pt
from bench.common import (DEV_GROUP, DEV_VERSION, BadArgs, Benchmark, add_out, add_quick,
                          add_seed, admin_client, at_least, commit, machine, poll_until,
                          targets_lines, watch_namespaced)
from bench.packing_replay import (HGX_SYSTEMS, LANE_LABEL, MOST_ALLOCATED, SYSTEMS, Lane,
                                  Replayer, Seen, claim_event, claim_template, device_event,
                                  pod_event)
from bench.packing_report import plot, summary, targets

if TYPE_CHECKING:  # the cluster's harness is imported when the benchmark runs
    from localcluster.cluster import LocalCluster
    from localcluster.fleet import Fleet

__all__ = ["CONTROLLER_ARGS", "DEFRAG_ARGS", "FULL", "HGX_SYSTEMS", "MOST_ALLOCATED", "QUICK", "QUICK_HGX", "SYSTEMS", "Plan",
           "arrivals_digest", "defrag_available", "finish", "plot", "out_stem", "prepare", "replay_on", "run",
           "summary", "targets", "trace_digest"]

CONTROLLER_ARGS = ("--housekeeping-period=1", "--attachment-grace=30", "--bind-timeout=15")
DEFRAG_ARGS = ("--defrag-interval=1", "--defrag-max-moves=8")


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
QUICK_HGX = Plan(nodes=4, arrivals=16, loads=(0.85,), per_window=4.0, warmup=1.0)
"""The HGX pools' quick form (`make test`): a few windows of one load, kept short."""


def run(out: Path, *, quick: bool = False, seed: int = 1, simulate_only: bool = False,
        plan: Plan | None = None, systems: tuple[str, ...] = ("a", "b", "c", "e"),
        hgx: bool = False) -> dict:
    """Run the benchmark (or, with `simulate_only`, the simulation alone) on a local cluster
    of its own; write packing.json and packing.png (`hgx`: packing-hgx.*, the HGX pools in
    device mode, issue 33) into `out`; return the report. Raises
    localcluster.controlplane.ControlPlaneError when the cluster cannot start."""
    plan = plan or (QUICK if quick else FULL)
    out.mkdir(parents=True, exist_ok=True)
    traces, report = prepare(plan, seed=seed, quick=quick, simulate_only=simulate_only, hgx=hgx)
    if not simulate_only:
        from localcluster.cluster import LocalCluster

        with LocalCluster(controllers=1, controller_args=CONTROLLER_ARGS,
                          log_dir=out / "logs", dra=hgx) as lc:
            replay_on(lc, plan, traces, report, log_dir=out / "logs", systems=systems, hgx=hgx)
    return finish(report, out)


def prepare(plan: Plan, *, seed: int, quick: bool = False, simulate_only: bool = False,
            hgx: bool = False) -> tuple[dict[float, pt.Trace], dict]:
    """The traces (load -> Trace) and the report so far: plan, machine, per load the trace's
    digest, the simulation and the bound (d); with `hgx`, the device-level simulation
    (`bench.packing_hgx`) and every figure's partition share. Pure but for the load average."""
    traces = {}
    for load in plan.loads:
        raw = pt.make_trace(seed=seed, nodes=plan.nodes, load=load, arrivals=plan.arrivals,
                            warmup=plan.warmup)
        traces[load] = pt.quantize(raw, plan.per_window * raw.end / len(raw.sets))
    report: dict = {
        "benchmark": "packing", "mode": "hgx" if hgx else "count", "quick": quick, "seed": seed, "simulation_only": simulate_only,
        "plan": {"nodes_per_lane": plan.nodes, "gpus_per_node": pt.GPUS_PER_NODE,
                 "scored_arrivals": plan.arrivals, "loads": list(plan.loads),
                 "arrivals_per_window": plan.per_window, "deadline_s": plan.deadline,
                 "warmup_mean_lives": plan.warmup, "held_share": 0.3, "idle_share": 0.5,
                 "sizes": dict(zip(map(str, pt.SIZES), pt.SIZE_WEIGHTS))},
        "systems": HGX_SYSTEMS if hgx else SYSTEMS, "commit": commit(), "load_before": os.getloadavg(),
        "machine": machine(), "loads": {}}
    for load, tr in traces.items():
        bound = pt.simulate(tr, "repack")
        extra = ph.partitions(tr, {i: True for i in bound.started}) if hgx else {}
        sim = ph.simulate_hgx_all(tr, seed) if hgx else pt.simulate_all(tr)
        report["loads"][str(load)] = {
            "trace": {"digest": trace_digest(tr), "sets": len(tr.sets),
                      "window_s": round(tr.window, 3),
                      "scored": sum(s.scored for s in tr.sets), "trace_seconds": round(tr.end, 1),
                      "arrivals_digest": arrivals_digest(tr)},
            "simulation": {"note": "pure simulation of placement policies on this trace, no cluster",
                           **sim},
            "systems": {"d": {**pt.score(tr, bound), **extra, "timeline": _timeline(tr, bound)}}}
    return traces, report


def finish(report: dict, out: Path) -> dict:
    """Targets, load after; write packing.json and packing.png (packing-hgx.* for the HGX
    pools) into `out`; the report."""
    out.mkdir(parents=True, exist_ok=True)
    report["load_after"] = os.getloadavg()
    report["targets"] = targets(report)
    stem = out_stem(report)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    plot(report, out / f"{stem}.png")
    return report


def out_stem(report: dict) -> str:
    """The report's file name without suffix: packing, or packing-hgx for the HGX pools."""
    return "packing-hgx" if report.get("mode") == "hgx" else "packing"


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
              systems: tuple[str, ...] = ("a", "b", "c", "e"), hgx: bool = False,
              kubevirt=None) -> None:
    """Replay every lane on the running `lc` (its controllers restarted with the defrag flags
    for (e) when available) with KubeVirt's harness started here, kube-scheduler carrying the
    MostAllocated profile; adds each lane's figures to `report`. Every object it makes is
    named `prefix`…, so a shared control plane (the e2e session's) keeps them apart.
    `systems`: which of a, b, c, e to replay (the others are left out of the report).
    `hgx`: the HGX pools of issue 33 instead (`HGX_SYSTEMS` a, b, c; `lc` must run device
    mode's cluster side, `LocalCluster.start_dra`): KubeVirt with `GPUsWithDRA`, or the
    running `kubevirt` harness when given (it must have the gate; it is left running)."""
    from localcluster.kubevirt import GPUS_WITH_DRA, KUBEVIRT_CR, NAMESPACE, KubeVirt

    if hgx:
        systems = [k for k in "abc" if k in systems]
    else:
        systems = [k for k in "abc" if k in systems] + (
            ["e"] if "e" in systems and defrag_available() else [])
    lanes = {}
    for sys_ in systems:
        for load, tr in traces.items():
            lid = f"{prefix}{sys_}{round(load * 100)}"
            lanes[(sys_, load)] = Lane(sys_, tr, lid, f"{lid}.bench.example.com/gpu", lid,
                                       [f"{lid}-{i:03d}" for i in range(plan.nodes)],
                                       mode="hgx" if hgx else "count")
    report["replayed_systems"] = systems
    profile = {"schedulerName": MOST_ALLOCATED, "pluginConfig": [{
        "name": "NodeResourcesFit", "args": {"scoringStrategy": {
            "type": "MostAllocated",
            "resources": [{"name": ln.res, "weight": 1} for ln in lanes.values() if ln.system == "c"]}}}]}
    version = json.loads(lc.cp.kubectl("version", "-o", "json").stdout)
    report["versions"] = {"kube-apiserver": version["serverVersion"]["gitVersion"]}
    permitted = tuple(ln.res for ln in lanes.values() if not ln.claims)
    kv = kubevirt
    if kv is None:
        kv = KubeVirt(lc.cp, permitted=permitted, log_dir=log_dir / "kubevirt",
                      scheduler_profiles=() if hgx else (profile,),
                      feature_gates=(GPUS_WITH_DRA,) if hgx else ())
        kv.start()
    else:
        kv.set_permitted(kv.permitted + permitted)
    try:
        anyio.run(_measure, lc, plan, lanes, report, prefix)
    finally:
        if kubevirt is None:
            kv.stop()
            lc.cp.kubectl("delete", "kubevirt", KUBEVIRT_CR, "-n", NAMESPACE, "--ignore-not-found",
                          "--wait=false", check=False)


async def _measure(lc: LocalCluster, plan: Plan, lanes: dict, report: dict, prefix: str) -> None:
    from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

    from localcluster.fleet import Fleet

    api = await admin_client(lc, 64)
    seen = Seen()
    t0 = time.monotonic()
    res_of = {ln.ns: ln.res for ln in lanes.values()}
    try:
        fleet = Fleet(api)
        await _setup(fleet, lanes)
        async with anyio.create_task_group() as watches:
            custom, core = CustomObjectsApi(api), CoreV1Api(api)
            watches.start_soon(watch_namespaced, custom.list_cluster_custom_object,
                               (DEV_GROUP, DEV_VERSION, "gpudevices"),
                               lambda k, o: device_event(seen, k, o), prefix,
                               seen.on_list("gpudevices"))
            watches.start_soon(watch_namespaced, core.list_pod_for_all_namespaces, (),
                               lambda k, o: pod_event(res_of, seen, k, o), prefix,
                               seen.on_list("pods"))
            if any(ln.claims for ln in lanes.values()):
                watches.start_soon(watch_namespaced, custom.list_cluster_custom_object,
                                   ("resource.k8s.io", "v1", "resourceclaims"),
                                   lambda k, o: claim_event(seen, k, o), prefix,
                                   seen.on_list("resourceclaims"))
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
                       "timeline": _timeline(ln.trace, ln.outcome),
                       "release_timeouts": [{**t, "started": round(t["started"] - t0, 1)}
                                            for t in ln.timeouts],
                       **(ph.partitions(ln.trace, ln.taken) if ln.mode == "hgx" else {}),
                       "started_ids": sorted(ln.outcome.started)}
    # every list of the harness's watches, seconds after the replay began: a relist after
    # the first follows a watch the server closed (`bench.common.watch_namespaced`)
    report["watch_lists"] = [[round(t - t0, 1), res, why, n] for t, res, why, n in seen.lists]
    for load in report["loads"].values():
        if defrag_available() or report.get("mode") == "hgx":
            continue
        load["systems"].setdefault("e", {"available": False, "why":
                                         "this tree's controller has no --defrag-interval/"
                                         "--defrag-max-moves (issue 21 item 2 not merged)"})


async def _setup(fleet: Fleet, lanes: dict) -> None:
    """Per lane: namespace (a tenant for gpu-binder's lanes), GPUClass (gpu-binder's lanes:
    count mode over the lane's resource, or on the HGX pools' (a) device mode over its nodes
    by LANE_LABEL), (b) on the HGX pools its ResourceClaimTemplates, nodes (KWOK; HGX a, b:
    `dra_node`s publishing hgx-h100-8 slices); waits for each class's KubeVirtPermitted=True
    (count mode: the webhook's cache has seen the KubeVirt CR) or Ready=True (device mode)."""
    from localcluster.dra_profiles import HGX_H100_8
    from localcluster.dra_world import HGX_CLASS, dra_node

    limit = anyio.Semaphore(16)

    async def node(name: str, ln: Lane) -> None:
        labels = {"pk-bench/system": ln.system, LANE_LABEL: ln.ns}
        async with limit:
            if ln.claims:
                await dra_node(fleet, name, HGX_H100_8, labels=labels)
            else:
                await fleet.node(name, {ln.res: pt.GPUS_PER_NODE}, kwok=True, labels=labels)
    for ln in lanes.values():
        if ln.by_binder:
            if ln.claims:
                await fleet.gpu_class(ln.cls, device_mode=HGX_CLASS.spec(),
                                      node_selector={LANE_LABEL: ln.ns})
            else:
                await fleet.gpu_class(ln.cls, ln.res)
            await fleet.tenant(ln.ns)
        else:
            await fleet.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ln.ns}})
        if ln.dra_alone:
            for size in pt.SIZES:
                await fleet.custom.create_namespaced_custom_object(
                    "resource.k8s.io", "v1", ln.ns, "resourceclaimtemplates", claim_template(size))
    async with anyio.create_task_group() as tg:
        for ln in lanes.values():
            for n in ln.nodes:
                tg.start_soon(node, n, ln)
    for ln in lanes.values():
        if not ln.by_binder:
            continue
        want = "Ready" if ln.claims else "KubeVirtPermitted"

        async def ready(cls: str = ln.cls, want: str = want) -> bool:
            got = await fleet.custom.get_cluster_custom_object(DEV_GROUP, DEV_VERSION,
                                                               "gpuclasses", cls)
            return any(c["type"] == want and c["status"] == "True"
                       for c in (got.get("status") or {}).get("conditions") or [])
        if not await poll_until(ready, 60, 0.5):
            raise RuntimeError(f"GPUClass {ln.cls} not {want} within 60 s")


async def _restart_with_defrag(lc: LocalCluster) -> None:
    lc.controller_args = tuple(lc.controller_args) + DEFRAG_ARGS
    for i in range(len(lc.replicas)):
        lc.kill_replica(i, signal.SIGTERM)
        lc.start_replica(i)
    for i in range(len(lc.replicas)):
        await anyio.to_thread.run_sync(lc.wait_ready, i)
    await anyio.sleep(0)


# -- the command line -----------------------------------------------------------------------

def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_quick(p, "6 nodes a lane, 30 scored arrivals, load 0.85 (with --hgx: 4 nodes, 16 "
                 "arrivals)")
    add_seed(p)
    p.add_argument("--simulate", action="store_true",
                   help="the policy simulation only (tightest fit, spread, defrag, repack "
                        "on the same traces), no cluster (default: off)")
    p.add_argument("--hgx", action="store_true",
                   help="HGX pools (hgx-h100-8 boards) in device mode: a "
                        "gpu-binder in device mode, b kube-scheduler's DRA allocator "
                        "alone, c gpu-binder in count mode with a device plugin's pick, d "
                        "the bound; writes packing-hgx.json/png (default: off)")
    p.add_argument("--nodes", type=at_least(1), default=None,
                   help="nodes of 8 GPUs per system and load (default: 24; with --quick "
                        "6, with --quick --hgx 4)")
    p.add_argument("--arrivals", type=at_least(1), default=None,
                   help="scored arrivals per load, after the warm-up (default: 300; with "
                        "--quick 30)")
    p.add_argument("--systems", default="a,b,c,e",
                   help="the systems to replay, comma separated: a gpu-binder, b "
                        "kube-scheduler default, c MostAllocated, e gpu-binder with "
                        "defragmentation; with --hgx a, b and c are --hgx's three and e is "
                        "left out; the bound (d) is always computed (default: %(default)s)")
    p.add_argument("--loads", default="",
                   help="the offered loads to replay, comma separated, each between 0 "
                        "and 1 (default: 0.70,0.85,0.95; with --quick 0.85)")


def _run(args: argparse.Namespace) -> int:
    """The plan the flags give (BadArgs for a refused value, before anything starts), run;
    its summary and targets printed."""
    out = Path(args.out)
    plan = (QUICK_HGX if args.hgx else QUICK) if args.quick else FULL
    if args.nodes:
        plan = replace(plan, nodes=args.nodes)
    if args.arrivals:
        plan = replace(plan, arrivals=args.arrivals)
    if args.loads:
        try:
            loads = tuple(float(x) for x in args.loads.split(","))  # an empty item: refused
        except ValueError:
            loads = ()
        if not loads or any(not 0 < x < 1 for x in loads):
            raise BadArgs(f"gpu-binder bench: --loads takes offered loads between 0 and 1, "
                          f"comma separated, got {args.loads!r}")
        plan = replace(plan, loads=loads)
    systems = tuple(k for k in args.systems.split(",") if k)
    if not systems or set(systems) - set("abce"):
        raise BadArgs(f"gpu-binder bench: --systems takes a,b,c,e, got {args.systems!r}")
    report = run(out, quick=args.quick, seed=args.seed, simulate_only=args.simulate,
                 plan=plan, systems=systems, hgx=args.hgx)
    print("\n".join(summary(report)))
    for line in targets_lines(report):
        print(line)
    stem = "packing-hgx" if args.hgx else "packing"
    print(f"report: {out}/{stem}.json, plot: {out}/{stem}.png")
    return 0


BENCHMARK = Benchmark("packing", "one churn trace per load replayed against gpu-binder, "
                                 "kube-scheduler (default and MostAllocated) and the repacking "
                                 "bound; with --hgx, HGX boards in device mode", _arguments, _run)
