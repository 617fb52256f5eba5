"""The actor binder on the in-memory store against a bare sequential loop over the model
(`gpu-binder bench core [--quick] [--out DIR] [--seed N]`, or `python -m bench.core …`: the
same `BENCHMARK`).

Fleets of 10, 100, 1,000 and 5,000 nodes × 8 GPUs (half H100, half L40S; three zones),
50 tenants with budgets, 40 % of every fleet Bound to held devices at the start. One seeded
stream of requests per fleet: a tenant asks for a set of 1–8 new template devices of one
class (h100 Move, h100-stay Stay, l40s), one request in ten with a zone nodeSelector.

- **actors**: the `Binder` (supervisor, one NodeActor per node, the Coordinator with
  two-phase reservation and status writes) on a `MemoryStore`, production configuration,
  driven by a closed loop of C clients (C = concurrency, outstanding requests): each
  creates its template devices, writes the request as the webhook does (`store.request`),
  waits until every member has a result, then writes its next request. Latency = request
  written → last result written; decisions/s = requests answered / wall time.
- **bare**: the same stream through `model.decide.decide` + `model.decide.apply_decision` on one
  `Snapshot`, one request after the other (the logic's own limit); latency = one decide +
  apply. `bare.with_upkeep` also times what the bare loop does outside that: adding the
  request's devices (carrying the request) to the snapshot before, removing the stopped
  VMs' devices after; the actor side does that work too (its view's snapshot takes every
  device change), so `ratio_with_upkeep` = actors ÷ that is the like-for-like figure;
  `ratio` (actors ÷ decide + apply) is kept as it was.

A Succeeded VM keeps running until the template GPUs of running VMs exceed 30 % of the
fleet, then the oldest stop (their template devices are deleted, as housekeeping does, H2);
a refused request's templates are deleted at once (the webhook's clean-up, W5), so the fleet
stays about 70 % full for any run length. The first `warmup` answers of a run are not
measured. Both runs apply the controller's collector policy once the fleet is loaded
(`actors.heap.settle_heap`: freeze it, raise the young threshold). Every fleet runs in its own subprocess (its RSS is its own); so does the RSS
point: 5,000 nodes × 8 GPUs with 40,000 devices (90 % Bound) and the binder running,
answering requests at concurrency 50. Writes `core.json` (seed, versions, fleet and machine
facts, every point) and `core.png`. A benchmark, not a test: it never fails on a target.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from actors.heap import restore_heap, settle_heap
from actors.logging import configure_logging
from actors.ports import SystemClock
from bench.common import Benchmark, add_out, add_quick, add_seed, quantile
from bench.core_report import TARGETS, facts, plot, print_table, targets
from bench.core_workload import (GPUS, NOW, Ask, Fleet, Lifecycle, build_store,
                                 request_names, request_stream)
from model.decide import Request, apply_decision, decide
from model.snapshot import Snapshot
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Result
from supervisor import Binder, BinderConfig

FLEETS = (10, 100, 1000, 5000)
CONCURRENCY = (1, 10, 50, 200)
QUICK_FLEETS = (10, 1000)
QUICK_CONCURRENCY = (1, 50)
RUN_TIMEOUT = 600.0
"""Seconds one actor run may take before it fails (a request never answered)."""


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


# -- the two runs ---------------------------------------------------------------------------


def _summary(latencies: list[float], answered_at: list[float], outcomes: list[bool],
             warmup: int) -> dict[str, Any]:
    """decisions/s over the answers after `warmup`, latency percentiles (ms) of those."""
    lat = sorted(latencies[warmup:])
    times = sorted(answered_at)
    measured = len(lat)
    window = times[-1] - times[warmup - 1] if warmup > 0 else times[-1]
    ok = sum(outcomes[warmup:])
    return {
        "requests": measured,
        "decisions_per_s": round(measured / window, 1) if window > 0 else None,
        "p50_ms": round(quantile(lat, 0.5) * 1e3, 3),
        "p99_ms": round(quantile(lat, 0.99) * 1e3, 3),
        "mean_ms": round(statistics.fmean(lat) * 1e3, 3),
        "max_ms": round(lat[-1] * 1e3, 3),
        "succeeded": ok,
        "refused": measured - ok,
    }


def bare_loop(fleet: Fleet, asks: list[Ask], seed: int, warmup: int) -> dict[str, Any]:
    """`decide` + `apply_decision`, one request after the other, on one Snapshot; the
    template devices of each request are added (and stopped VMs removed) outside the
    timing."""
    store = build_store(fleet, seed)
    snap = store.snapshot()
    del store
    heap = settle_heap()  # the same heap policy as the actor runs
    life = Lifecycle(int(fleet.capacity * fleet.running))
    latencies: list[float] = []
    outcomes: list[bool] = []
    clock = 0.0
    answered_at: list[float] = []
    upkept: list[float] = []  # decide + apply + the snapshot's upkeep of the request's devices
    upkept_at: list[float] = []
    up_clock = 0.0
    pauses = _GCPauses()
    with pauses:
        for i, ask in enumerate(asks):
            pauses.on = i >= warmup
            snap, dt, upkeep, ok = _bare_step(snap, i, ask, life)
            clock += dt
            latencies.append(dt)
            answered_at.append(clock)
            outcomes.append(ok)
            up_clock += dt + upkeep
            upkept.append(dt + upkeep)
            upkept_at.append(up_clock)
    restore_heap(heap)
    out = _summary(latencies, answered_at, outcomes, warmup)
    out["p50_us"] = round(out["p50_ms"] * 1e3, 1)
    out["p99_us"] = round(out["p99_ms"] * 1e3, 1)
    out["gc"] = pauses.figures()
    up = _summary(upkept, upkept_at, outcomes, warmup)
    out["with_upkeep"] = {k: up[k] for k in ("decisions_per_s", "p50_ms", "p99_ms", "mean_ms")}
    return out


def _bare_step(snap: Snapshot, i: int, ask: Ask, life: Lifecycle) -> tuple[Snapshot, float, float, bool]:
    """One request of the bare loop: its devices added, then decide + apply (timed: `dt`),
    then the VMs that stop removed; `upkeep` = the seconds of the adding and removing."""
    rid, vmi, names = request_names(i, ask)
    br = BindRequest(rid, vmi, tuple(names), NOW, ask.selector)
    status = DeviceStatus(attached_to=Attachment(vmi, NOW), bind_request=br)
    devices = [GPUDevice(ask.tenant, n, ask.class_name, vmi, status, created_at=NOW) for n in names]
    t0 = time.perf_counter()
    snap = snap.with_devices(devices)
    upkeep = time.perf_counter() - t0
    req = Request(rid, ask.tenant, vmi, tuple(names), ask.selector, NOW)
    t0 = time.perf_counter()
    decision = decide(snap, req)
    snap = apply_decision(snap, req, decision, now=NOW)
    dt = time.perf_counter() - t0
    ok = decision.result is Result.SUCCEEDED
    gone = life.answered(ok, [(ask.tenant, n) for n in names])
    if gone:
        t0 = time.perf_counter()
        snap = snap.without_devices(gone)
        upkeep += time.perf_counter() - t0
    return snap, dt, upkeep, ok


async def actor_loop(fleet: Fleet, asks: list[Ask], concurrency: int, seed: int, warmup: int,
                     *, config: BinderConfig | None = None, profiler: Any = None) -> dict[str, Any]:
    """The Binder on a MemoryStore answering `asks` for a closed loop of `concurrency`
    clients. With `profiler` (a pyinstrument Profiler), only the measured part is profiled."""
    store = build_store(fleet, seed)
    gc.collect()
    binder = Binder(store, store, store, SystemClock(), config or BinderConfig())
    waiting: dict[str, list[Any]] = {}  # request id -> [members without a result, Event]

    def on_write(rec: Any) -> None:
        if rec.op == "answer":
            w = waiting.get(rec.request_id)
            if w is not None:
                w[0] -= 1
                if w[0] == 0:
                    w[1].set()

    store.on_write = on_write
    life = Lifecycle(int(fleet.capacity * fleet.running))
    latencies: list[float] = []
    answered_at: list[float] = []
    outcomes: list[bool] = []
    stream = iter(enumerate(asks))
    pauses = _GCPauses()
    pauses.on = warmup == 0
    cpu_start = [time.process_time()]

    async def client() -> None:
        for i, ask in stream:  # shared: each client takes the next request
            rid, vmi, names = request_names(i, ask)
            for n in names:
                store.add_device(ask.tenant, n, ask.class_name, template_for=vmi)
            done = anyio.Event()
            waiting[rid] = [len(names), done]
            t0 = time.perf_counter()
            store.request(ask.tenant, vmi, names, request_id=rid, node_selector=dict(ask.selector))
            await done.wait()  # bounded: the whole run is (RUN_TIMEOUT)
            t1 = time.perf_counter()
            del waiting[rid]
            latencies.append(t1 - t0)
            answered_at.append(t1)
            if len(answered_at) == warmup:  # measured from here on
                cpu_start[0] = time.process_time()
                pauses.on = True
                if profiler is not None:
                    profiler.start()
            br = store.device((ask.tenant, names[0])).status.bind_request  # type: ignore[union-attr]
            ok = br.result is Result.SUCCEEDED
            outcomes.append(ok)
            for key in life.answered(ok, [(ask.tenant, n) for n in names]):
                store.delete_device(key)

    t_boot = time.perf_counter()
    with pauses:
        async with anyio.create_task_group() as tg:
            await tg.start(binder.run)
            boot = time.perf_counter() - t_boot
            heap = settle_heap()  # as the controller does once its cache has synced
            cpu_start[0] = time.process_time()
            with anyio.fail_after(RUN_TIMEOUT):  # one bound for every answer of the run
                async with anyio.create_task_group() as clients:
                    for _ in range(concurrency):
                        clients.start_soon(client)
            pauses.on = False
            if profiler is not None and profiler.is_running:
                profiler.stop()
            cpu = time.process_time() - cpu_start[0]
            restore_heap(heap)  # the next point of this process starts from a plain heap
            coord = await binder.coordinator.ask(_get_status()) if binder.coordinator else None
            sup = binder.statistics()
            tg.cancel_scope.cancel()
    out = _summary(latencies, answered_at, outcomes, warmup)
    out.update({
        "concurrency": concurrency,
        "cpu_seconds": round(cpu, 3),
        "cpu_ms_per_request": round(cpu * 1e3 / max(1, len(latencies) - warmup), 3),
        "startup_s": round(boot, 3),
        "status_writes": store.writes_attempted,
        "restarts": sup.restarts if sup else 0,
        "rss_mib": round(_rss_now(), 1),
        "gc": pauses.figures(),
    })
    if coord is not None:
        out["coordinator"] = {k: getattr(coord, k) for k in ("decided", "succeeded", "refused", "gave_up")}
    return out


def _get_status() -> Any:
    from actors.coordinator_protocol import GetStatus

    return GetStatus()


class _GCPauses:
    """Collector pauses while `on`: count and seconds per generation, the longest pause
    (a generation-2 collection of a large heap is what the p99 of a big fleet sees)."""

    def __init__(self) -> None:
        self.on = False
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = 0.0
        self._t0 = 0.0

    def __enter__(self) -> _GCPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.on:
            pause = time.perf_counter() - self._t0
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += pause
            self.longest = max(self.longest, pause)

    def figures(self) -> dict[str, Any]:
        return {"collections": self.count, "seconds": [round(x, 4) for x in self.seconds],
                "longest_ms": round(self.longest * 1e3, 2)}


def _rss_now() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        return float("nan")


def _rss_peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- points (each in its own process) --------------------------------------------------------


def fleet_point(nodes: int, levels: list[int], n_requests: int, warmup: int, seed: int) -> dict:
    """Bare loop and actor runs at each concurrency level for one fleet size."""
    fleet = Fleet(nodes)
    asks = request_stream(n_requests + warmup, seed)
    bare = bare_loop(fleet, asks, seed, warmup)
    gc.collect()
    rows = []
    for c in levels:
        row = anyio.run(actor_loop, fleet, asks, c, seed, warmup)
        row["ratio"] = round(row["decisions_per_s"] / bare["decisions_per_s"], 3)
        row["ratio_with_upkeep"] = round(row["decisions_per_s"] / bare["with_upkeep"]["decisions_per_s"], 3)
        rows.append(row)
        gc.collect()
        print(f"  {nodes:5d} nodes  c={c:3d}  {row['decisions_per_s']:8.0f}/s  "
              f"p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  ratio {row['ratio']:.2f} "
              f"({row['ratio_with_upkeep']:.2f} with upkeep)  "
              f"(bare {bare['decisions_per_s']:.0f}/s)", file=sys.stderr, flush=True)
    return {"nodes": nodes, "gpus_per_node": GPUS, "devices_at_start": int(fleet.capacity * fleet.fill),
            "bare": bare, "actors": rows, "rss_peak_mib": round(_rss_peak(), 1)}


def rss_point(nodes: int, devices: int, n_requests: int, concurrency: int, seed: int) -> dict:
    """`devices` devices on `nodes` × 8 GPUs (90 % of the GPUs Bound, the rest Pending) and
    the binder running, answering `n_requests` at `concurrency`; peak RSS of this process."""
    base = _rss_peak()
    bound = int(nodes * GPUS * 0.9)
    fleet = Fleet(nodes, fill=bound / (nodes * GPUS), pending=max(0, devices - bound), running=0.05)
    asks = request_stream(n_requests, seed)
    row = anyio.run(actor_loop, fleet, asks, concurrency, seed, min(50, n_requests // 5))
    return {"nodes": nodes, "gpus_per_node": GPUS, "devices": bound + fleet.pending,
            "bound_at_start": bound, "concurrency": concurrency, "requests": n_requests,
            "rss_peak_mib": round(_rss_peak(), 1), "rss_interpreter_mib": round(base, 1),
            "decisions_per_s": row["decisions_per_s"], "p99_ms": row["p99_ms"],
            "startup_s": row["startup_s"]}


def _subprocess(point: dict) -> dict:
    """`point` ({"fleet"|"rss": nodes, …} as `point_process` reads it) measured in a
    process of its own (its RSS is its own); its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "point.json"
        cmd = [sys.executable, "-c", "import sys; from bench.core import point_process; "
               "point_process(sys.argv[1])", json.dumps({**point, "out": str(path)})]
        subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parent.parent)
        return json.loads(path.read_text())


def point_process(spec: str) -> None:
    """The child of `_subprocess`: one point in this process, `spec` its JSON ({"fleet":
    nodes} or {"rss": nodes, "devices": n}, with "levels", "requests", "warmup", "seed" and
    "out", the file the figures are written to)."""
    configure_logging(stream=_Discard(), level=logging.WARNING, cache=True)  # type: ignore[arg-type]
    p = json.loads(spec)
    if "fleet" in p:
        point = fleet_point(p["fleet"], p["levels"], p["requests"], p["warmup"], p["seed"])
    else:
        point = rss_point(p["rss"], p["devices"], p["requests"], p["levels"][0], p["seed"])
    Path(p["out"]).write_text(json.dumps(point))


def run(out: Path, *, quick: bool = False, seed: int = 1) -> dict:
    """Run the benchmark; write `<out>/core.json` and `<out>/core.png`; return the report."""
    configure_logging(stream=_Discard(), level=logging.WARNING, cache=True)  # type: ignore[arg-type]
    fleets_n = QUICK_FLEETS if quick else FLEETS
    levels = QUICK_CONCURRENCY if quick else CONCURRENCY
    n_requests, warmup = (300, 50) if quick else (2000, 200)
    report = facts(seed, quick)
    report["workload"].update({"requests_per_point": n_requests, "warmup_requests": warmup})
    fleets = []
    for nodes in fleets_n:
        print(f"fleet {nodes} nodes × {GPUS} GPUs", file=sys.stderr, flush=True)
        fleets.append(_subprocess({"fleet": nodes, "levels": list(levels), "requests": n_requests,
                                   "warmup": warmup, "seed": seed}))
    rss = _subprocess({"rss": TARGETS["rss_nodes"], "devices": TARGETS["rss_devices"],
                       "requests": 200 if quick else 1000, "levels": [50], "warmup": 0,
                       "seed": seed})
    print(f"  RSS: {rss['nodes']} nodes, {rss['devices']} devices, binder running: "
          f"{rss['rss_peak_mib']:.0f} MiB peak", file=sys.stderr, flush=True)
    report["fleets"] = fleets
    report["rss_point"] = rss
    report["targets"] = targets(fleets, rss)
    out.mkdir(parents=True, exist_ok=True)
    (out / "core.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "core.png")
    print_table(report)
    return report


def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_quick(p, "fewer requests")
    add_seed(p)


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    run(out, quick=args.quick, seed=args.seed)
    print(f"report: {out}/core.json, plot: {out}/core.png")
    return 0


BENCHMARK = Benchmark("core", "the actor system against the bare model in one process, on "
                              "an in-memory store", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
