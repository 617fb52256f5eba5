"""`bench core`'s report: its head (`facts`), issue 14's targets (`targets`), the table it
prints (`print_table`) and its figure (`plot`)."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import head_sha
from bench.core_workload import CLASSES, GPUS, H100, L40S, TENANTS, Fleet

TARGETS = {"nodes": 1000, "concurrency": 50, "decisions_per_s": 2000.0, "ratio": 0.5,
           "p99_ms": 20.0, "rss_nodes": 5000, "rss_devices": 40000, "rss_mib": 500.0}


def facts(seed: int, quick: bool) -> dict[str, Any]:
    """The report's head: seed, start time, HEAD's commit, versions, machine (the load at
    start), the workload and the definitions of the figures."""
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    try:
        import psutil

        memory = round(psutil.virtual_memory().total / 2**30, 2)
        physical = psutil.cpu_count(logical=False)
    except ImportError:
        memory, physical = None, None
    return {
        "benchmark": "core",
        "seed": seed,
        "quick": quick,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": head_sha(),
        "versions": {"python": platform.python_version(), "implementation": platform.python_implementation(),
                     **{d: version(d) for d in ("gpu-binder", "anyio", "structlog", "tenacity")},
                     "event_loop": "asyncio (anyio default backend)"},
        "machine": {"platform": platform.platform(), "machine": platform.machine(),
                    "processor": platform.processor() or None, "cpu_count": os.cpu_count(),
                    "physical_cores": physical, "memory_gib": memory,
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
        "workload": {"gpus_per_node": GPUS, "resources": [H100, L40S], "classes": {
                         c: {"resource": r, "onCordon": o.value} for c, (r, o) in CLASSES.items()},
                     "tenants": TENANTS, "set_sizes": "1-8 uniform", "node_selector_share": 0.1,
                     "fleet": asdict(Fleet(0)),
                     "binder_config": "BinderConfig() defaults", "logging": "WARNING, discarded",
                     "gc": "actors.heap.settle_heap() once the fleet is loaded and the binder "
                           "started (gc.freeze, young threshold 10,000), as the controller does "
                           "once its cache has synced"},
        "definitions": {
            "concurrency": "closed loop: requests outstanding at once (clients)",
            "latency": "actors: request written -> last member's result written; "
                       "bare: one decide + apply_decision",
            "decisions_per_s": "requests answered after the warm-up / wall time from the "
                               "warm-up's last answer to the last answer (bare: / summed decide + apply time)",
            "ratio": "actor decisions/s / bare decisions/s of the same fleet and stream",
            "ratio_with_upkeep": "actor decisions/s / bare.with_upkeep decisions/s: the bare loop "
                                 "also timing the snapshot's upkeep of the request's devices (added "
                                 "before the decision, stopped VMs' removed after), which the actor "
                                 "side does too",
            "cpu_ms_per_request": "process CPU time over the measured window / measured requests",
            "rss": "ru_maxrss of the point's own process (fleet + binder + run)",
        },
    }


def targets(fleets: list[dict], rss: dict | None) -> dict[str, Any]:
    """Issue 14's targets at TARGETS' point, each {at, target, value, met}."""
    t = TARGETS
    out: dict[str, Any] = {}
    point = next((r for f in fleets if f["nodes"] == t["nodes"] for r in f["actors"]
                  if r["concurrency"] == t["concurrency"]), None)
    if point is not None:
        where = f"{t['nodes']} nodes, concurrency {t['concurrency']}"
        best = max((r for f in fleets if f["nodes"] == t["nodes"] for r in f["actors"]),
                   key=lambda r: r["decisions_per_s"])
        out["decisions_per_s"] = {"at": where, "target": f">= {t['decisions_per_s']}",
                                  "value": point["decisions_per_s"],
                                  "met": point["decisions_per_s"] >= t["decisions_per_s"],
                                  "best_over_concurrency": {"concurrency": best["concurrency"],
                                                            "value": best["decisions_per_s"]}}
        out["ratio"] = {"at": where, "target": f">= {t['ratio']}", "value": point["ratio"],
                        "met": point["ratio"] >= t["ratio"]}
        out["p99_ms"] = {"at": where, "target": f"< {t['p99_ms']}", "value": point["p99_ms"],
                         "met": point["p99_ms"] < t["p99_ms"]}
    if rss is not None:
        out["rss_mib"] = {"at": f"{rss['nodes']} nodes, {rss['devices']} devices",
                          "target": f"< {t['rss_mib']}", "value": rss["rss_peak_mib"],
                          "met": rss["rss_peak_mib"] < t["rss_mib"]}
    return out


def print_table(report: dict) -> None:
    """The report's figures and targets as text on stdout."""
    print(f"{'nodes':>6} {'conc':>5} {'actors/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'bare/s':>8} "
          f"{'bare p99 µs':>11} {'ratio':>6} {'bare+upkeep/s':>13} {'ratio':>6}")
    for f in report["fleets"]:
        b = f["bare"]
        for r in f["actors"]:
            print(f"{f['nodes']:6d} {r['concurrency']:5d} {r['decisions_per_s']:9.0f} {r['p50_ms']:8.2f} "
                  f"{r['p99_ms']:8.2f} {b['decisions_per_s']:8.0f} {b['p99_us']:11.1f} {r['ratio']:6.2f} "
                  f"{b['with_upkeep']['decisions_per_s']:13.0f} {r['ratio_with_upkeep']:6.2f}")
    rss = report.get("rss_point")
    if rss:
        print(f"RSS {rss['nodes']} nodes × {rss['gpus_per_node']} GPUs, {rss['devices']} devices: "
              f"{rss['rss_peak_mib']:.0f} MiB peak")
    for name, t in report["targets"].items():
        print(f"target {name} ({t['at']}): {t['value']} {t['target']}: {'met' if t['met'] else 'NOT met'}")


def plot(report: dict, path: Path) -> None:
    """Decisions/s and p99 by concurrency per fleet (nothing when matplotlib is missing)."""
    try:
        import matplotlib
    except ImportError:  # the plot is optional
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, f in enumerate(report["fleets"]):
        color = colors[i % len(colors)]
        cs = [r["concurrency"] for r in f["actors"]]
        ax1.plot(cs, [r["decisions_per_s"] for r in f["actors"]], marker="o", color=color,
                 label=f"{f['nodes']} nodes, actors")
        ax1.plot(cs, [f["bare"]["decisions_per_s"]] * len(cs), linestyle="--", color=color,
                 label=f"{f['nodes']} nodes, bare")
        ax2.plot(cs, [r["p99_ms"] for r in f["actors"]], marker="o", color=color, label=f"{f['nodes']} nodes")
    ax1.axhline(TARGETS["decisions_per_s"], color="grey", linewidth=0.8, linestyle=":")
    ax2.axhline(TARGETS["p99_ms"], color="grey", linewidth=0.8, linestyle=":")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (outstanding requests)")
    ax1.set_ylabel("set decisions per second")
    ax1.set_title("actor binder (solid) vs bare decide loop (dashed)")
    ax1.legend(fontsize=7, ncol=2)
    ax2.set_ylabel("p99 latency, request written → last result (ms)")
    ax2.set_title("actor binder p99 latency")
    ax2.legend(fontsize=7)
    rss = report.get("rss_point")
    sub = (f"; {rss['nodes']} nodes, {rss['devices']} devices: {rss['rss_peak_mib']:.0f} MiB peak RSS"
           if rss else "")
    fig.suptitle(f"gpu-binder core, seed {report['seed']}, {report['machine']['cpu_count']} cores{sub}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
