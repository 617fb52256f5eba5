"""The actor binder on the in-memory store against a bare sequential loop over the model
(`gpu-binder bench core`, or `python -m bench.core [--quick] [--seed N] [--out DIR]`).

For each size (requests; nodes grow with them, 4 GPUs each, so about half the requests fit)
one seeded workload is judged twice: by a *bare loop* (`decide` + `apply_decision` on one
Snapshot, one request after the other: the ceiling of the pure model) and by the *actor
system* (Binder: supervisor, node actors, coordinator with two-phase reservation, status
writes with retries) on a `MemoryStore`, all requests written at once as the webhook would,
timed until every request is answered. The actor run is repeated with 1 ms of latency per
status write (an API server is slower than memory): writes of different requests overlap,
the decision loop does not wait for them. Writes `core.json` and `core.png`.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from datetime import datetime, timezone
from pathlib import Path

import anyio

from actors.coordinator import CoordinatorConfig
from actors.logging import configure_logging
from actors.memory_store import Faults, MemoryStore
from actors.ports import SystemClock
from model.decide import apply_decision, decide, find_requests
from model.types import Result
from supervisor import Binder, BinderConfig, SupervisorConfig

RES = {"h100": "nvidia.com/H100", "l40s": "nvidia.com/L40S"}
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def workload(n_requests: int, seed: int, latency: float = 0.0) -> tuple[MemoryStore, list[tuple]]:
    """A store with n_requests/10 nodes (≥ 10) and 20 tenants, and the requests to write:
    (namespace, vmi, device names); template devices already exist, Pending."""
    rng = random.Random(seed)
    s = MemoryStore(seed=seed, faults=Faults(latency=latency))
    for cls, res in RES.items():
        s.add_class(cls, res)
    for i in range(max(10, n_requests // 10)):
        s.add_node(f"node-{i:04d}", {RES["h100"]: 4, RES["l40s"]: 4})
    tenants = [f"tenant-{t:02d}" for t in range(20)]
    for t in tenants:
        s.add_namespace(t)
        s.add_budget(t, RES["h100"], max(4, n_requests // 8))
    requests = []
    for n in range(n_requests):
        t = rng.choice(tenants)
        names = []
        for j in range(rng.choice([1, 2, 2, 3, 4])):
            name = f"tpl-{n}-{j}"
            s.add_device(t, name, rng.choice(list(RES)), template_for=f"vm-{n}")
            names.append(name)
        requests.append((t, f"vm-{n}", names))
    return s, requests


def bare_loop(store: MemoryStore, requests: list[tuple]) -> dict:
    """decide + apply_decision, one request after the other, on one Snapshot."""
    for t, vmi, names in requests:
        store.request(t, vmi, names, request_id=f"r-{vmi}")
    snap = store.snapshot()
    pending, _ = find_requests(snap.devices.values())
    started = time.perf_counter()
    ok = 0
    for req in pending:
        decision = decide(snap, req)
        snap = apply_decision(snap, req, decision, now=NOW)
        ok += decision.result is Result.SUCCEEDED
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "requests_per_s": len(pending) / seconds, "succeeded": ok,
            "refused": len(pending) - ok}


async def actor_run(store: MemoryStore, requests: list[tuple]) -> dict:
    """All requests written at once; the Binder answers them; timed until all are answered."""
    config = BinderConfig(
        supervisor=SupervisorConfig(),
        coordinator=CoordinatorConfig(resync_interval=5.0, settle_poll=0.005),
    )
    binder = Binder(store, store, store, SystemClock(), config)
    members = sum(len(names) for _, _, names in requests)
    answered: set = set()
    done = anyio.Event()

    def on_write(rec) -> None:
        if rec.op == "write_result":
            answered.add(rec.key)
            if len(answered) == members:
                done.set()

    store.on_write = on_write
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        started = time.perf_counter()
        cpu = time.process_time()
        for t, vmi, names in requests:
            store.request(t, vmi, names, request_id=f"r-{vmi}")
        with anyio.fail_after(600):
            await done.wait()
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        stats = binder.statistics()
        tg.cancel_scope.cancel()
    results = {}
    for t, vmi, names in requests:
        results[vmi] = store.device((t, names[0])).status.bind_request.result
    ok = sum(1 for r in results.values() if r is Result.SUCCEEDED)
    return {"seconds": seconds, "cpu_seconds": cpu, "requests_per_s": len(requests) / seconds,
            "succeeded": ok, "refused": len(requests) - ok, "status_writes": store.writes_attempted,
            "restarts": stats.restarts if stats else 0}


def run(out: Path, *, quick: bool = False, seed: int = 1) -> dict:
    configure_logging(stream=_Discard(), level=40)  # type: ignore[arg-type]
    sizes = [100, 300] if quick else [100, 300, 1000, 2000]
    rows = []
    for size in sizes:
        bare = bare_loop(*workload(size, seed))
        actors = anyio.run(actor_run, *workload(size, seed))
        slow = anyio.run(actor_run, *workload(size, seed, latency=0.001))
        rows.append({"requests": size, "nodes": max(10, size // 10), "bare": bare,
                     "actors": actors, "actors_1ms_writes": slow})
        print(f"{size:5d} requests: bare {bare['requests_per_s']:8.0f}/s  "
              f"actors {actors['requests_per_s']:7.0f}/s  "
              f"actors+1ms writes {slow['requests_per_s']:7.0f}/s  "
              f"(succeeded bare {bare['succeeded']}, actors {actors['succeeded']})")
    report = {"benchmark": "core", "seed": seed, "python": platform.python_version(),
              "machine": platform.machine(), "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "core.json").write_text(json.dumps(report, indent=2))
    _plot(rows, out / "core.png")
    return report


def _plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:  # the plot is optional
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["requests"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("bare", "bare loop (decide + apply)"), ("actors", "actor binder"),
                       ("actors_1ms_writes", "actor binder, 1 ms per write")):
        ax.plot(x, [r[key]["requests_per_s"] for r in rows], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("requests (nodes = requests / 10)")
    ax.set_ylabel("requests answered per second")
    ax.set_title("gpu-binder core: actors on the in-memory store vs the bare model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    run(Path(args.out), quick=args.quick, seed=args.seed)


if __name__ == "__main__":
    main()
