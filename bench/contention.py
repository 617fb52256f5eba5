"""Who goes first under contention (`gpu-binder bench contention [--quick]`, issue 39 item 6):
one seeded churn trace of two tiers at offered load 1.1 (`bench.contention_trace`) replayed
in one run, on one API server, on HGX pools in device mode (KWOK nodes publishing the
ResourceSlices NVIDIA's DRA driver would, as `bench packing --hgx`), side by side on
separate node pools (lanes):

- **(a) gpu-binder with preemption and the line**: bare VMIs through our webhook, of a
  device-mode GPUClass over the lane's boards, `spec.priorityClassName` naming the tier's
  PriorityClass (P1). Isolates nothing: the system as shipped.
- **(b) kube-scheduler's DRA allocator alone**: the same sets as Pods with a
  ResourceClaimTemplate of N count-1 requests sharing `gpu.nvidia.com/partitionN` (the form
  NVIDIA documents), the same PriorityClasses, kube-scheduler's own preemption on (its
  default). What a cluster without the binder does.
- **(c) gpu-binder without preemption**: as (a), its GPUClass `spec.preemption: Never`, so
  no running set of the lane ever yields (P2) while the same PriorityClasses still order the
  line. Isolates what preemption costs and buys: utilisation (a within 3 points of c) and
  the on-demand tier's wait.
- **(d) gpu-binder without the line**: as (a), on boards of its own, but its binder's line
  (P5) is off (`--line-enabled=false`): freed room goes to whoever asks first. One
  controller serves one cluster, so (d) runs second: after (a)-(c) end, a second local
  cluster made the same way, its replica started with the same arguments plus
  `--line-enabled=false`, replays the same seeded trace on lane (d) alone
  (`report["lanes_on_second_cluster"]`). Isolates what the line buys: (a)'s 8-GPU maximum
  wait against (d)'s. Skipped by `--lanes a,b,c` (the default with `--quick`).

There is no KubeVirt in the path (as `bench e2e`): the driver plays virt-controller and a
VM's `runStrategy: Always`. An admitted VMI gets a launcher Pod made by the driver as
virt-controller makes it (the VMI's node pin, tolerations, priorityClassName and claim;
label `kubevirt.io/created-by`), which kube-scheduler binds and whose claim it allocates; a
set *starts* when that Pod is bound and its claim allocated. A create refused (no room,
403; behind in line or nominated, 503 with Retry-After; busy, 429) is retried every
`retry` s (or the Retry-After, when shorter), as a VM's controller keeps retrying. A VMI the
binder deletes (a victim) has its launcher Pod deleted, as kubelet would, and is created
again under its name, as KubeVirt does for a VM with `runStrategy: Always`; its wait counts
again (a re-wait). In (b) a Pod kube-scheduler deletes for preemption is made again likewise.
A started set runs its life (`bench.contention_trace`; a restarted one what is left of it),
then its VMI and Pod (or its Pod) are deleted.

After the trace's end (`CTrace.end`, warm-up plus the scored span; every set arrives before
it) each lane *drains*: no set arrives any more, but started sets run out their lives and are
deleted, waiting sets keep retrying and victims are created again, all as before, until every
scored set is running or done (`drained`: it has started at least once and no wait of it is open),
or until the cap, `Plan.drain` s after the trace's end (`--drain`; 0 stops every lane at the
trace's end, as before the drain was made). Each lane ends on its own; its end, how long its
drain took and whether the cap ended it are reported (`drain_s`, `drain_capped`). What is
scored stays the trace's: the sets that arrived after the warm-up, utilisation over the
scored span and GPU-hours over the trace, so they compare with runs before the drain; the
waits of those sets count wherever they end, in the drain too, so a wait is a lower bound
("≥") only when the cap ended its lane before it started. Inversions and preemptions are
checked over the whole lane, drain included (the same binder, the same rules), and the
report says how many fell in the drain (`bench.contention_metrics`).

The GPUNominations are watched; each is checked against a brute-force minimum on the lane's
runs at that moment (`bench.contention_metrics`). Writes `contention.json` into `--out`. A
benchmark, not a test: it never fails on a target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from bench import contention_report as cr, packing_hgx as ph
from bench.common import (CREATED_BY, DEV_GROUP, DEV_VERSION, VMI_GROUP, VMI_VERSION, VMIS,
                          BadArgs, Benchmark, add_out, add_quick, add_seed, admin_client,
                          at_least, commit, gpu_vmi, machine, poll_until, share, targets_lines,
                          watch_namespaced)
from bench.contention_metrics import LaneLog, Nominated, Run, Wait
from bench.contention_trace import PRIORITY, TIERS, CSet, CTrace, make_trace, offered
from bench.packing_replay import (LANE_LABEL, Replayer, Seen, claim_event, claim_template,
                                  device_event, pod_event)
from model.types import TEMPLATE_FOR_LABEL

if TYPE_CHECKING:  # the cluster's harness is imported when the benchmark runs
    from localcluster.cluster import LocalCluster

LANES = {"a": "gpu-binder: preemption and the line",
         "b": "kube-scheduler's DRA allocator alone (its own preemption on)",
         "c": "gpu-binder without preemption (GPUClass spec.preemption: Never)",
         "d": "gpu-binder without the line"}
BINDER_LANES = ("a", "c", "d")
SECOND_CLUSTER = ("d",)
"""Lanes whose binder runs with other settings than (a)'s: each runs on a second cluster,
after the first's lanes end (one controller serves one cluster)."""
NO_LINE = ("lane (d) was not asked for (--quick, or --lanes without d): its second cluster, "
           "a binder with the line off, did not run")
PREFIX = "ct-"
CONTROLLER_NS = "cozy-system"
LOAD = 1.1


def priority_class(tier: str, prefix: str = PREFIX) -> str:
    """The PriorityClass of `tier` (value `PRIORITY[tier]`), named `<prefix><tier>` (`bench
    soak --priorities` uses its own prefix)."""
    return f"{prefix}{tier}"


def priority_class_object(tier: str, prefix: str = PREFIX,
                          what: str = "gpu-binder bench contention") -> dict:
    """The PriorityClass `priority_class(tier, prefix)` as the API takes it: value
    `PRIORITY[tier]`, `preemptionPolicy: PreemptLowerPriority`, `what` in its description."""
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": priority_class(tier, prefix)}, "value": PRIORITY[tier],
            "preemptionPolicy": "PreemptLowerPriority",
            "description": f"{what}: the {tier} tier"}


async def make_priority_classes(api, prefix: str = PREFIX, what: str = "gpu-binder bench contention",
                                exist_ok: bool = False) -> list[str]:
    """Create every tier's PriorityClass (`priority_class_object`) through `api` (a
    kubernetes_asyncio ApiClient); `exist_ok`: one already there (409, a session's cluster
    another run made them on) is kept. Returns their names, highest tier first. Raises the
    ApiException of any other failure."""
    from kubernetes_asyncio.client import ApiException, SchedulingV1Api

    sched = SchedulingV1Api(api)
    for tier in TIERS:
        try:
            await sched.create_priority_class(priority_class_object(tier, prefix, what))
        except ApiException as exc:
            if not (exist_ok and exc.status == 409):
                raise
    return [priority_class(t, prefix) for t in TIERS]


@dataclass(frozen=True)
class Plan:
    """The run's sizes: `nodes` HGX boards per lane, the trace (`mean_life`, scored `span`,
    `warmup`, all s; `on_demand_share`), `retry` s between a refused create and the next,
    `min_runtime` the controller's `--preemption-min-runtime` (P2), `recreate_delay`, `drain`
    (s after the trace's end a lane may run on: module docstring)."""

    nodes: int
    mean_life: float
    span: float
    warmup: float
    on_demand_share: float = 0.3
    retry: float = 2.0
    min_runtime: float = 10.0
    recreate_delay: float = 0.0
    """s between a victim's VMI (or Pod) being gone and its creation again (0: at once, as
    KubeVirt's VM controller does for `runStrategy: Always`)."""
    drain: float = 0.0
    """The drain's cap: s after the trace's end a lane may run on until every scored set is
    running or done (`drained`); 0 stops it at the trace's end."""
    reserve_after: float | None = None
    """The binders' `--line-reserve-after` (s; P5: a head of the line waiting longer
    reserves the node where it would start soonest); None: the controller's default (5
    minutes, chosen for VMs that live hours; the plans keep it). Lane (d) has no line: the
    setting does nothing there. Scaled with the trace's lives (a third of a mean life, 30 s)
    it made the 8-GPU maximum wait longer, not shorter (docs/benchmarks.md, 2026-12-07)."""


QUICK = Plan(nodes=2, mean_life=30.0, span=90.0, warmup=30.0, min_runtime=5.0, drain=180.0)
"""A few minutes here: 2 boards a lane, about 30 sets; a drain of at most 6 mean lives (its
trace's longest life is 157 s: with a cap of 120 s, lanes (a) and (c) of a quick run ended
with an 8-GPU set waiting, its boards held until about 240 and 270 s, 120 and 150 s after
the trace's end)."""
FULL = Plan(nodes=6, mean_life=90.0, span=600.0, warmup=90.0, min_runtime=15.0, drain=900.0)
"""About 14 minutes here, start-up included, and a drain of a few minutes (at most 15): 6
boards a lane, about 150 sets. The cap is 10 mean lives: a board empties once its last
running set ends, the longest of a few exponential residual lives (mean 90 s whatever a set
has run: about 230 s for 7 sets), and no arrival refills it; in the run of 2026-12-06 22:00
UTC every board's sets at the trace's end were done within 335 s, and the longest life of a
set still waiting then was 337 s. `reserve_after` stays the controller's 5 minutes: at 30 s
(a third of a mean life) the 8-GPU maximum wait of lane (a) went 242.6 -> 319.4 s, when each
batch chose the reservation afresh (since 2026-12-07 a holder keeps it: `--reserve-after 30`
runs that; docs/benchmarks.md)."""


def drained(scored: Iterable[int], *, running: Container[int], over: Container[int]) -> bool:
    """Whether a lane's drain may end: each of the `scored` sets (ids) is `running` (it
    started and runs now) or `over` (its replay ended: its life run out, or the driver
    failed on it). A set waiting, for its first start or again after it was preempted, holds
    the drain open. Pure."""
    return all(i in running or i in over for i in scored)


def controller_args(plan: Plan, *, line: bool = True) -> tuple[str, ...]:
    """The controller's arguments for `plan`; `line` False adds `--line-enabled=false` (P5
    off: lane d's binder), the rest the same."""
    from bench.packing import CONTROLLER_ARGS

    # its clients retry every refused create (403 included), the case --line-bare-vmis is for
    return (*CONTROLLER_ARGS, f"--preemption-min-runtime={plan.min_runtime:g}", "--line-bare-vmis=true",
            *(() if plan.reserve_after is None else (f"--line-reserve-after={plan.reserve_after:g}",)),
            *(() if line else ("--line-enabled=false",)))


def run(out: Path, *, plan: Plan, seed: int = 1, quick: bool = False,
        lanes: tuple[str, ...] = ("a", "b", "c", "d")) -> dict:
    """Run the benchmark on a local cluster of its own (one controller replica, device
    mode's cluster side, kube-scheduler out of cluster) for `lanes` but (d), then, when (d)
    is asked for, on a second such cluster whose replica has the line off (P5,
    `--line-enabled=false`) for lane (d) alone, the same trace (`_on_cluster`); write
    contention.json into `out`; return the report (`results` per lane, computed alike;
    `lanes_on_second_cluster`). Every process it starts is stopped before it returns. Raises
    localcluster.controlplane.ControlPlaneError when a cluster cannot start."""
    out.mkdir(parents=True, exist_ok=True)
    trace = make_trace(seed=seed, nodes=plan.nodes, load=LOAD, mean_life=plan.mean_life,
                       span=plan.span, warmup=plan.warmup, on_demand_share=plan.on_demand_share)
    report: dict = {
        "benchmark": "contention", "quick": quick, "seed": seed, "commit": commit(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "load_before": os.getloadavg(),
        "plan": {**plan.__dict__, "load": LOAD, "gpus_per_lane": trace.gpus,
                 "priorities": PRIORITY},
        "trace": {"digest": trace.digest(), "sets": len(trace.sets),
                  "scored": sum(s.scored for s in trace.sets),
                  "offered_load": round(offered(trace), 3)},
        "lanes": {k: LANES[k] for k in lanes}, "results": {}}
    started = time.monotonic()
    first = tuple(k for k in lanes if k not in SECOND_CLUSTER)
    second = tuple(k for k in lanes if k in SECOND_CLUSTER)
    logs: dict[str, LaneLog] = {}
    if first:
        got, version = _on_cluster(out / "logs", plan, trace, first, controller_args(plan))
        logs.update(got)
        report["versions"] = {"kube-apiserver": version}
    if second:  # after the first cluster stopped: one controller serves one cluster
        report["second_cluster"] = {
            "lanes": list(second), "controller_args": list(controller_args(plan, line=False)),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_before": os.getloadavg()}
        got, version = _on_cluster(out / "logs-second", plan, trace, second,
                                   controller_args(plan, line=False))
        logs.update(got)
        report["second_cluster"]["load_after"] = os.getloadavg()
        report.setdefault("versions", {"kube-apiserver": version})
        report["lanes_on_second_cluster"] = list(second)
    report["results"] = cr.results(trace, {k: logs[k] for k in lanes}, min_runtime=plan.min_runtime)
    report["logs"] = {k: cr.raw(log) for k, log in logs.items()}
    if "d" not in lanes:
        report["results"]["d"] = {"available": False, "why": NO_LINE}
    report["seconds"] = round(time.monotonic() - started, 1)
    report["load_after"] = os.getloadavg()
    report["targets"] = cr.targets(report)
    (out / "contention.json").write_text(json.dumps(report, indent=1))
    return report


def _on_cluster(log_dir: Path, plan: Plan, trace: CTrace, keys: tuple[str, ...],
                args: tuple[str, ...]) -> tuple[dict[str, LaneLog], str]:
    """`keys`' lanes replaying `trace` on a local cluster of their own, its one controller
    replica started with `args`, kube-scheduler out of cluster, logs in `log_dir`; (lane ->
    its log, the API server's version). Everything it starts is stopped before it returns.
    Raises localcluster.controlplane.ControlPlaneError when the cluster cannot start."""
    from bench.e2e import _start_scheduler, _stop
    from localcluster.cluster import LocalCluster

    with LocalCluster(controllers=1, controller_args=args, log_dir=log_dir, dra=True) as lc:
        version = json.loads(lc.cp.kubectl("version", "-o", "json").stdout)
        sched = _start_scheduler(lc, log_dir)
        try:
            logs = anyio.run(_measure, lc, plan, trace, keys)
        finally:
            _stop(sched)
    return logs, version["serverVersion"]["gitVersion"]


# -- one lane on the cluster --------------------------------------------------------------------

@dataclass
class Lane:
    """One lane: its key (a, b, c, d), namespace, class, nodes and what its driver recorded."""

    key: str
    ns: str
    nodes: tuple[str, ...]
    log: LaneLog
    running: dict[str, anyio.Event] = field(default_factory=dict)
    """uid (VMI's, or (b) the Pod's created-by label) of a running set -> set when it is
    deleted under the driver (a victim)."""
    stopping: set[str] = field(default_factory=set)
    """uids the driver itself deletes."""
    open_runs: dict[int, tuple[str, tuple[int, ...], float, float]] = field(default_factory=dict)
    open_waits: dict[int, tuple[float, bool, float | None]] = field(default_factory=dict)
    releases: dict[int, list[float]] = field(default_factory=dict)
    """Set id -> when its VMI's template GPUDevices were all gone (binder lanes)."""
    over: set[int] = field(default_factory=set)
    """Ids of the sets whose replay ended (life run out, or the driver failed on it)."""

    @property
    def by_binder(self) -> bool:
        return self.key in BINDER_LANES

    def count(self, what: str, n: int = 1) -> None:
        self.log.counts[what] = self.log.counts.get(what, 0) + n


class Driver(Replayer):
    """Replays the trace on every lane in real time through one ApiClient and the shared
    watch caches (module docstring), then drains each lane (`lane_`); `t()` is seconds since
    the trace began. A `bench.packing_replay.Replayer` for its API clients, watch cache
    (`seen`) and Pod deletion (grace 0, then awaited in the cache)."""

    def __init__(self, api, plan: Plan, trace: CTrace, lanes: dict[str, Lane]) -> None:
        super().__init__(api, Seen(), deadline=trace.end + plan.drain, release_timeout=60.0)
        self.plan, self.trace, self.lanes = plan, trace, lanes
        self.by_ns = {ln.ns: ln for ln in lanes.values()}
        self.t0 = time.monotonic()

    def t(self) -> float:
        return time.monotonic() - self.t0

    # -- the watches -------------------------------------------------------------------------

    def on_pod(self, kind: str, obj: dict) -> None:
        pod_event({}, self.seen, kind, obj)
        lane = self.by_ns.get(obj["metadata"]["namespace"])
        if lane is None or lane.by_binder:
            return
        uid = (obj["metadata"].get("labels") or {}).get(CREATED_BY, "")
        if kind == "DELETED" or obj["metadata"].get("deletionTimestamp"):
            self._gone(lane, uid)

    def on_vmi(self, kind: str, obj: dict) -> None:
        lane = self.by_ns.get(obj["metadata"]["namespace"])
        if lane is not None and (kind == "DELETED" or obj["metadata"].get("deletionTimestamp")):
            self._gone(lane, obj["metadata"]["uid"])

    def _gone(self, lane: Lane, uid: str) -> None:
        ev = lane.running.get(uid)
        if ev is not None and uid not in lane.stopping:
            ev.set()

    def on_device(self, kind: str, obj: dict) -> None:
        """A GPUDevice: when the last template device of a binder lane's VMI goes, the
        binder's record let that set's GPUs go (H2): a release."""
        device_event(self.seen, kind, obj)
        lane = self.by_ns.get(obj["metadata"]["namespace"])
        vmi = (obj["metadata"].get("labels") or {}).get(TEMPLATE_FOR_LABEL, "")
        if (kind == "DELETED" and lane is not None and vmi[1:].isdigit()
                and not any(ns == lane.ns and t == vmi for (ns, _), (_, t) in self.seen.devices.items())):
            lane.releases.setdefault(int(vmi[1:]), []).append(self.t())

    def on_claim(self, kind: str, obj: dict) -> None:
        """A ResourceClaim into `seen.claims`; an allocation that shrinks (a set losing part
        of its devices while it runs) is a partial stop."""
        before = self.seen.claims.get((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        claim_event(self.seen, kind, obj)
        after = self.seen.claims.get((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        lane = self.by_ns.get(obj["metadata"]["namespace"])
        if lane is not None and before and after and len(after[1]) < len(before[1]):
            lane.count("partial_stops")  # a running set's claim lost some of its devices

    def on_nomination(self, kind: str, obj: dict) -> None:
        from model.nomination import parse_nomination
        from model.parse import ParseError

        try:
            n = parse_nomination(obj)
        except ParseError:  # counted, not fatal to the run
            for lane in self.lanes.values():
                lane.count("nomination_unreadable")
            return
        lane = self.by_ns.get(n.namespace)
        if lane is None:
            return
        sid = int(n.vmi[1:])
        noms = lane.log.nominations
        if kind == "DELETED":
            noms[:] = [replace(o, gone=self.t()) if o.set_id == sid and o.gone is None else o
                       for o in noms]
            return
        victims = tuple(int(v.vmi[1:]) for v in n.victims if v.vmi[1:].isdigit())
        gpus = tuple(sorted(ph.NAMES.index(d.device) for d in n.devices if d.device in ph.NAMES))
        noms.append(Nominated(self.t(), sid, self.trace.sets[sid].size, n.priority, n.node,
                              victims, gpus))

    # -- a lane --------------------------------------------------------------------------------

    async def lane_(self, lane: Lane) -> None:
        """Every set of the trace on `lane` (`set_`) from its arrival until, after the trace's
        end, the lane is `drained` or the cap (`Plan.drain` s after the trace's end) is
        reached; then the lane's sets still replaying are cancelled (their runs and waits
        left open for `close`). Writes the lane's end (s since the trace began) and whether
        the cap ended it into its log."""
        scored = [s.id for s in self.trace.sets if s.scored]
        cap = self.trace.end + self.plan.drain
        async with anyio.create_task_group() as tg:
            for s in self.trace.sets:
                tg.start_soon(self.set_, lane, s)
            await anyio.sleep(max(0.0, self.trace.end - self.t()))
            while not drained(scored, running=lane.open_runs, over=lane.over):
                if self.t() >= cap:
                    lane.log.drain_capped = True
                    break
                await anyio.sleep(min(0.25, max(0.0, cap - self.t())))
            lane.log.end = self.t()
            tg.cancel_scope.cancel()

    # -- a set ---------------------------------------------------------------------------------

    async def set_(self, lane: Lane, s: CSet) -> None:
        """Set `s` on `lane` from its arrival to its life's end or the lane's end (cancelled);
        its id is in `lane.over` once its life ran out or its replay failed. A call the API
        fails (not a refusal: a timeout, a 5xx on a delete) ends the set's replay, counted as
        `driver_error_<type>`, and leaves the run going."""
        try:
            await self._set(lane, s)
        except Exception as exc:  # noqa: BLE001 — one set's failure is counted, not fatal
            lane.count(f"driver_error_{type(exc).__name__}")
            lane.over.add(s.id)

    async def _set(self, lane: Lane, s: CSet) -> None:
        await anyio.sleep(max(0.0, s.arrive - self.t()))
        remaining, first, k = s.life, True, 0
        begin = self.t()
        while True:
            lane.open_waits[s.id] = (begin, first, None)
            got = await (self._admit(lane, s) if lane.by_binder else self._pod(lane, s, k))
            if got is None:
                return
            uid, pod, decided = got
            lane.open_waits[s.id] = (begin, first, decided)
            placed = await self._bound(lane, pod)
            if placed is None:
                return
            decided = decided if decided is not None else self.t()  # (b): bound = decided
            lane.log.waits.append(Wait(s.id, begin, decided, first))
            del lane.open_waits[s.id]
            start = self.t()
            node, gpus = placed
            lane.open_runs[s.id] = (node, gpus, start, decided)
            victim = lane.running[uid] = anyio.Event()
            with anyio.move_on_after(remaining):
                await victim.wait()
            del lane.open_runs[s.id]
            stop = self.t()
            lane.log.runs.append(Run(s.id, node, gpus, start, stop, victim.is_set(), decided))
            if not victim.is_set():
                lane.over.add(s.id)  # its life ran out: nothing more of it to wait for
                lane.stopping.add(uid)
                await self._delete(lane, s, pod)
                return
            lane.count("victims_seen")
            await self._delete_pod(lane.ns, pod)  # as kubelet would: the VM is gone
            remaining -= stop - start
            first, k, begin = False, k + 1, self.t()
            await anyio.sleep(self.plan.recreate_delay)

    async def _admit(self, lane: Lane, s: CSet) -> tuple[str, str, float] | None:
        """Create the set's VMI until admitted: (its uid, its launcher Pod's name, when it was
        admitted), after creating that Pod; cancelled at the lane's end."""
        from kubernetes_asyncio.client import ApiException

        body = gpu_vmi(f"s{s.id}", cls=lane.ns, size=s.size, labels={"ct-bench/set": str(s.id)})
        body["spec"]["priorityClassName"] = priority_class(s.tier)
        while True:
            try:
                made = await self.custom.create_namespaced_custom_object(
                    VMI_GROUP, VMI_VERSION, lane.ns, VMIS, body)
                break
            except ApiException as exc:
                lane.count(f"refused_{exc.status}_{_reason(exc)}")
                wait = self.plan.retry
                after = (exc.headers or {}).get("Retry-After")
                if after and after.isdigit():
                    wait = min(wait, float(after))
                await anyio.sleep(wait)
        decided = self.t()
        uid = made["metadata"]["uid"]
        spec = made["spec"]
        claims = spec.get("resourceClaims") or []
        name = f"virt-launcher-s{s.id}-{uid[:5]}"
        await self.core.create_namespaced_pod(lane.ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {CREATED_BY: uid}},
            "spec": {"nodeSelector": spec.get("nodeSelector") or {},
                     "tolerations": spec.get("tolerations") or [],
                     "priorityClassName": priority_class(s.tier),
                     "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": c["name"], "resourceClaimName": c["resourceClaimName"]}
                                        for c in claims if c.get("resourceClaimName")],
                     "containers": [{"name": "compute", "image": "bench/none", "resources": {
                         "claims": [{"name": c["name"]} for c in claims]}}]}})
        return uid, name, decided

    async def _pod(self, lane: Lane, s: CSet, k: int) -> tuple[str, str, None]:
        """(b): the set's Pod (its k-th incarnation) asking kube-scheduler for a claim from
        the lane's template of its size; (its created-by key, its name, None)."""
        name = f"p{s.id}-{k}"
        await self.core.create_namespaced_pod(lane.ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {CREATED_BY: name, "ct-bench/set": str(s.id)}},
            "spec": {"nodeSelector": {LANE_LABEL: lane.ns},
                     "priorityClassName": priority_class(s.tier),
                     "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": f"gpu-{s.size}"}],
                     "containers": [{"name": "compute", "image": "bench/none",
                                     "resources": {"claims": [{"name": "gpus"}]}}]}})
        return name, name, None

    async def _bound(self, lane: Lane, pod: str) -> tuple[str, tuple[int, ...]] | None:
        """(node, GPU indices) once the launcher Pod `pod` is bound and every claim of it is
        allocated; waits until the lane's end (cancelled) otherwise."""
        key = (lane.ns, pod)

        def placed() -> bool:
            p = self.seen.pods.get(key)
            return bool(p and p["node"] and p["claims"]
                        and all(self.seen.claims.get((lane.ns, c)) for c in p["claims"]))
        while not placed():
            await anyio.sleep(0.05)
        p = self.seen.pods[key]
        gpus = sorted(ph.NAMES.index(d) for c in p["claims"] for d in self.seen.claims[(lane.ns, c)][1])
        return p["node"], tuple(gpus)

    async def _delete(self, lane: Lane, s: CSet, pod: str) -> None:
        from kubernetes_asyncio.client import ApiException

        if lane.by_binder:
            try:
                await self.custom.delete_namespaced_custom_object(
                    VMI_GROUP, VMI_VERSION, lane.ns, VMIS, f"s{s.id}", grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        await self._delete_pod(lane.ns, pod)

    def close(self) -> dict[str, LaneLog]:
        """After every lane ended: each lane's runs still running stop at its end (`lane_`;
        the trace's end when it has none), its waits still waiting are recorded unfinished;
        every lane's log."""
        for lane in self.lanes.values():
            end = self.trace.end if lane.log.end is None else lane.log.end
            lane.log.runs[:] = [replace(r, held_until=next(
                (t for t in lane.releases.get(r.set_id, ()) if t >= r.stop), None))
                for r in lane.log.runs]
            for sid, (node, gpus, start, decided) in lane.open_runs.items():
                lane.log.runs.append(Run(sid, node, gpus, start, max(start, end), False, decided))
            for sid, (begin, first, decided) in lane.open_waits.items():
                lane.log.waits.append(Wait(sid, begin, decided, first))
                if decided is not None:  # admitted, its launcher Pod never bound
                    lane.count("admitted_not_bound_at_end")
        return {k: ln.log for k, ln in self.lanes.items()}


def _reason(exc) -> str:
    """The denial's reason word (the Status `reason`, e.g. Forbidden), "" when none."""
    try:
        return str(json.loads(exc.body).get("reason") or "")
    except (TypeError, ValueError, AttributeError):
        return ""


async def _measure(lc: LocalCluster, plan: Plan, trace: CTrace,
                   keys: tuple[str, ...]) -> dict[str, LaneLog]:
    from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

    from localcluster.fleet import Fleet

    api = await admin_client(lc, 64)
    try:
        fleet = Fleet(api)
        lanes = {k: Lane(k, f"{PREFIX}{k}", tuple(f"{PREFIX}{k}-{i:02d}" for i in range(plan.nodes)),
                         LaneLog(tuple(f"{PREFIX}{k}-{i:02d}" for i in range(plan.nodes))))
                 for k in keys}
        await _setup(fleet, lanes)
        driver = Driver(api, plan, trace, lanes)
        custom, core = CustomObjectsApi(api), CoreV1Api(api)
        async with anyio.create_task_group() as watches:
            watches.start_soon(watch_namespaced, core.list_pod_for_all_namespaces, (),
                               driver.on_pod, PREFIX, driver.seen.on_list("pods"))
            watches.start_soon(watch_namespaced, custom.list_cluster_custom_object,
                               ("resource.k8s.io", "v1", "resourceclaims"), driver.on_claim,
                               PREFIX, driver.seen.on_list("resourceclaims"))
            watches.start_soon(watch_namespaced, custom.list_cluster_custom_object,
                               (VMI_GROUP, VMI_VERSION, VMIS), driver.on_vmi, PREFIX)
            watches.start_soon(watch_namespaced, custom.list_cluster_custom_object,
                               (DEV_GROUP, DEV_VERSION, "gpudevices"), driver.on_device, PREFIX)
            watches.start_soon(watch_namespaced, custom.list_cluster_custom_object,
                               (DEV_GROUP, DEV_VERSION, "gpunominations"), driver.on_nomination,
                               CONTROLLER_NS)
            await anyio.sleep(1.0)  # the watches listed
            driver.t0 = time.monotonic()
            async with anyio.create_task_group() as tg:  # each lane to its drain's end
                for lane in lanes.values():
                    tg.start_soon(driver.lane_, lane)
            watches.cancel_scope.cancel()
        return driver.close()
    finally:
        await api.close()


async def _setup(fleet, lanes: dict[str, Lane]) -> None:
    """The PriorityClasses; per lane its namespace (a tenant for the binder's lanes), its
    GPUClass (device mode over its boards by LANE_LABEL; (c) `spec.preemption: Never`; (d) as
    (a), its binder's line off by the controller's arguments) or
    (b) its ResourceClaimTemplates, and its boards; waits for each GPUClass to be Ready."""
    from localcluster.dra_profiles import HGX_H100_8
    from localcluster.dra_world import HGX_CLASS, dra_node

    await make_priority_classes(fleet.core.api_client)
    for lane in lanes.values():
        if lane.by_binder:
            spec = {**HGX_CLASS.spec(), **({"preemption": "Never"} if lane.key == "c" else {})}
            await fleet.gpu_class(lane.ns, device_mode=spec, node_selector={LANE_LABEL: lane.ns})
            await fleet.tenant(lane.ns)
        else:
            await fleet.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": lane.ns}})
            for size in (1, 2, 4, 8):
                await fleet.custom.create_namespaced_custom_object(
                    "resource.k8s.io", "v1", lane.ns, "resourceclaimtemplates", claim_template(size))
        for n in lane.nodes:
            await dra_node(fleet, n, HGX_H100_8, labels={LANE_LABEL: lane.ns})
    for lane in lanes.values():
        if not lane.by_binder:
            continue

        async def ready(cls: str = lane.ns) -> bool:
            got = await fleet.custom.get_cluster_custom_object(DEV_GROUP, DEV_VERSION,
                                                               "gpuclasses", cls)
            return any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (got.get("status") or {}).get("conditions") or [])
        if not await poll_until(ready, 60, 0.5):
            raise RuntimeError(f"GPUClass {lane.ns} not Ready within 60 s")


# -- the command line -----------------------------------------------------------------------

def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_quick(p, "2 boards a lane, a 30 s mean life, 90 s scored after 30 s of fill: a few "
                 "minutes")
    add_seed(p)
    p.add_argument("--nodes", type=at_least(1), default=None,
                   help="HGX boards per lane (default: 6; with --quick 2)")
    p.add_argument("--span", type=at_least(10), default=None,
                   help="seconds of scored arrivals after the fill (default: 600; with "
                        "--quick 90)")
    p.add_argument("--drain", type=float, default=None,
                   help="the drain's cap: seconds after the trace's end (warm-up plus span, "
                        "its arrivals over) a lane may run on until every scored set is "
                        "running or done; 0 stops at the trace's end (default: 900; with "
                        "--quick 180)")
    p.add_argument("--recreate-delay", type=float, default=0.0,
                   help="seconds between a victim's VMI (or Pod) being gone and its creation "
                        "again; 0 is what KubeVirt's VM controller does for runStrategy "
                        "Always (default: %(default)s)")
    p.add_argument("--reserve-after", type=float, default=None,
                   help="the binders' --line-reserve-after, seconds (P5: a head of the line "
                        "waiting longer reserves a node); default: the controller's (5 minutes)")
    p.add_argument("--on-demand-share", type=share, default=None,
                   help="the trace's share of on-demand sets, in [0, 1] (default 0.3); 0 is one "
                        "tier: nothing is preempted, so lanes a and d compare the line alone "
                        "(issue 39 item 6's 8-GPU target, judged within one priority)")
    p.add_argument("--lanes", default=None,
                   help="the lanes to run, comma separated: a gpu-binder with preemption and "
                        "the line, b kube-scheduler's DRA allocator alone, c gpu-binder "
                        "without preemption, d gpu-binder without the line (--line-enabled="
                        "false; on a second cluster after the first: about as long again as "
                        "one lane's trace, start-up included; leave d out to skip it) (default: "
                        "a,b,c,d; with --quick a,b,c)")


def run_lanes(text: str | None, *, quick: bool) -> tuple[str, ...]:
    """The lanes `--lanes` names, in order (None: a,b,c,d; with `quick` a,b,c, so that a
    quick run stays one cluster). Raises BadArgs for an unknown lane or none."""
    given = text if text is not None else ("a,b,c" if quick else "a,b,c,d")
    lanes = tuple(dict.fromkeys(k.strip() for k in given.split(",") if k.strip()))
    if not lanes or set(lanes) - set(LANES):
        raise BadArgs(f"gpu-binder bench: --lanes takes a,b,c,d (at least one), got {given!r}")
    return lanes


def _run(args: argparse.Namespace) -> int:
    """The plan the flags give (BadArgs for a refused value, before anything starts), run;
    its summary and targets printed."""
    plan = QUICK if args.quick else FULL
    if args.nodes:
        plan = replace(plan, nodes=args.nodes)
    if args.span:
        plan = replace(plan, span=float(args.span))
    if not 0 <= args.recreate_delay < math.inf:     # NaN fails too
        raise BadArgs(f"gpu-binder bench: --recreate-delay takes finite seconds >= 0, got "
                      f"{args.recreate_delay}")
    plan = replace(plan, recreate_delay=args.recreate_delay)
    if args.drain is not None:
        if not 0 <= args.drain < math.inf:   # NaN fails too: its loop would spin uncapped
            raise BadArgs(f"gpu-binder bench: --drain takes finite seconds >= 0, got {args.drain}")
        plan = replace(plan, drain=args.drain)
    if args.reserve_after is not None:
        from k8s.config import MAX_SECONDS

        if not 0 <= args.reserve_after < math.inf:
            raise BadArgs(f"gpu-binder bench: --reserve-after takes finite seconds >= 0, got "
                          f"{args.reserve_after}")
        if args.reserve_after > MAX_SECONDS:   # the controller would refuse it after the cluster started
            raise BadArgs(f"gpu-binder bench: --reserve-after takes at most {MAX_SECONDS:g} seconds "
                          f"(the controller's --line-reserve-after), got {args.reserve_after:g}")
        plan = replace(plan, reserve_after=args.reserve_after)
    if args.on_demand_share is not None:
        plan = replace(plan, on_demand_share=args.on_demand_share)
    lanes = run_lanes(args.lanes, quick=args.quick)
    out = Path(args.out)
    report = run(out, plan=plan, seed=args.seed, quick=args.quick, lanes=lanes)
    print("\n".join(cr.summary(report)))
    for line in targets_lines(report):
        print(line)
    print(f"report: {out}/contention.json")
    return 0


BENCHMARK = Benchmark("contention", "a two-tier churn trace at offered load 1.1 on HGX pools: "
                                    "gpu-binder with preemption and the line, kube-scheduler's "
                                    "DRA allocator alone, gpu-binder without preemption; then "
                                    "gpu-binder without the line on a second cluster",
                      _arguments, _run)
