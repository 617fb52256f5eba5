"""End-to-end admission benchmark on a real control plane (`gpu-binder bench e2e`).

Starts the whole system (`k8s.localcluster.LocalCluster`: etcd, kube-apiserver, two
controller replicas, webhook registered), creates a fleet, then for each concurrency level
creates VMIs through the API server (webhook in the path) from that many concurrent
clients, timing every admission. In the same run it measures the API server's raw
GPUDevice status-patch rate (the write ceiling) and counts, from kube-apiserver's own
`apiserver_request_total`, how many GPUDevice writes one admission costs, so the report
shows admissions/s × writes per admission as a share of that ceiling.
Writes `e2e.json` and `e2e.png` into the output folder.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import statistics
import time
from pathlib import Path

import anyio

from k8s.fleet import Fleet
from k8s.localcluster import LocalCluster

RES = "nvidia.com/GH100_H100"


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100 * (len(values) - 1)))))
    return values[k]


async def _writes(api) -> int:
    """GPUDevice write requests served so far (create, patch, update, delete)."""
    resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"],
                              _preload_content=False)
    text = (await resp.read()).decode()
    resp.release()
    total = 0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="gpudevices"' in line \
                and re.search(r'verb="(POST|PATCH|PUT|DELETE|APPLY|CREATE|UPDATE)"', line):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def _raw_patch_rate(fleet: Fleet, ns: str, devices: list[str], count: int,
                          concurrency: int) -> float:
    """Status merge-patches per second of GPUDevices at `concurrency` (the write ceiling)."""
    done = 0
    limit = anyio.Semaphore(concurrency)
    started = time.perf_counter()

    async def one(i: int) -> None:
        nonlocal done
        async with limit:
            await fleet.set_status(ns, devices[i % len(devices)],
                                   {"attachedTo": {"vmi": f"probe-{i}",
                                                   "since": "2026-01-01T00:00:00Z"}})
            done += 1
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    return done / (time.perf_counter() - started)


async def _level(fleet: Fleet, ns: str, concurrency: int, count: int, tag: str,
                 cls: str) -> dict:
    from kubernetes_asyncio.client import ApiException

    latencies: list[float] = []
    refused: list[str] = []
    queue = list(range(count))
    started = time.perf_counter()

    async def worker() -> None:
        while queue:
            i = queue.pop()
            vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                   "metadata": {"name": f"{tag}-{i}",
                                "annotations": {"gpu.cozystack.io/templates": f"{cls}=1"}},
                   "spec": {"domain": {"devices": {}}}}
            t0 = time.perf_counter()
            try:
                await fleet.custom.create_namespaced_custom_object(
                    "kubevirt.io", "v1", ns, "virtualmachineinstances", vmi)
                latencies.append(time.perf_counter() - t0)
            except ApiException as exc:
                refused.append(str(exc.body)[:200])
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    elapsed = time.perf_counter() - started
    return {"concurrency": concurrency, "vmis": count, "admitted": len(latencies),
            "refused": len(refused), "first_refusal": refused[0] if refused else None,
            "seconds": round(elapsed, 3),
            "admissions_per_s": round(len(latencies) / elapsed, 2),
            "p50_ms": round(_pct(latencies, 50) * 1000, 1),
            "p99_ms": round(_pct(latencies, 99) * 1000, 1),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None}


def run(out: Path, *, quick: bool = False, seed: int = 1) -> dict:
    """Run the benchmark; write e2e.json and e2e.png into `out`; return the report."""
    from kubernetes_asyncio.config import new_client_from_config

    out.mkdir(parents=True, exist_ok=True)
    levels = [1, 10, 20] if quick else [1, 5, 10, 20, 50]
    per_level = 20 if quick else 60
    nodes = 20 if quick else 50
    random.seed(seed)
    report: dict = {"benchmark": "e2e", "quick": quick, "seed": seed, "nodes": nodes,
                    "gpus_per_node": 8, "vmis_per_level": per_level,
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()}}
    with LocalCluster(controllers=2, log_dir=out / "logs") as lc:
        version = json.loads(lc.cp.kubectl("version", "-o", "json").stdout)
        report["versions"] = {"kube-apiserver": version["serverVersion"]["gitVersion"],
                              "kubectl": version["clientVersion"]["gitVersion"],
                              "python": platform.python_version()}

        async def main() -> None:
            api = await new_client_from_config(config_file=str(lc.cp.admin_kubeconfig))
            try:
                fleet = Fleet(api)
                await fleet.gpu_class("h100", RES)
                for i in range(nodes):
                    await fleet.node(f"bench-node-{i:03d}", {RES: 8})
                await fleet.tenant("bench")
                await fleet.tenant("bench-raw")
                probes = [f"probe-{i}" for i in range(20)]
                for p in probes:
                    await fleet.device("bench-raw", p, "h100")
                await anyio.sleep(1.0)
                ceiling = await _raw_patch_rate(fleet, "bench-raw", probes, 600 if not quick else 300, 20)
                report["raw_status_patch_per_s"] = round(ceiling, 1)
                report["levels"] = []
                for c in levels:
                    w0 = await _writes(api)
                    lvl = await _level(fleet, "bench", c, per_level, f"c{c}", "h100")
                    w1 = await _writes(api)
                    lvl["gpudevice_writes"] = w1 - w0
                    lvl["writes_per_admission"] = round((w1 - w0) / max(lvl["admitted"], 1), 2)
                    lvl["share_of_write_ceiling"] = round(
                        lvl["admissions_per_s"] * lvl["writes_per_admission"] / ceiling, 3)
                    report["levels"].append(lvl)
                    print(f"concurrency {c:>3}: {lvl['admissions_per_s']:>6} admissions/s, "
                          f"p50 {lvl['p50_ms']} ms, p99 {lvl['p99_ms']} ms, "
                          f"{lvl['writes_per_admission']} writes/admission, "
                          f"{lvl['share_of_write_ceiling'] * 100:.0f}% of the write ceiling "
                          f"({ceiling:.0f} patches/s)", flush=True)
            finally:
                await api.close()

        anyio.run(main)
    report["targets"] = _targets(report)
    (out / "e2e.json").write_text(json.dumps(report, indent=2))
    _plot(report, out / "e2e.png")
    for name, t in report["targets"].items():
        print(f"target {name} ({t['at']}): {t['value']} {t['target']}: "
              f"{'met' if t['met'] else 'NOT met'}", flush=True)
    return report


TARGETS = {"concurrency": 20, "share_of_write_ceiling": 0.6, "p99_ms": 1000.0}


def _targets(report: dict) -> dict:
    """The issue's e2e targets at concurrency 20 (absent when that level was not run)."""
    lvl = next((r for r in report.get("levels", []) if r["concurrency"] == TARGETS["concurrency"]), None)
    if lvl is None:
        return {}
    at = f"concurrency {TARGETS['concurrency']}"
    share, p99 = lvl["share_of_write_ceiling"], lvl["p99_ms"]
    return {
        "share_of_write_ceiling": {"at": at, "target": f">= {TARGETS['share_of_write_ceiling']}",
                                   "value": share, "met": share >= TARGETS["share_of_write_ceiling"]},
        "p99_ms": {"at": at, "target": f"< {TARGETS['p99_ms']:.0f}", "value": p99,
                   "met": p99 < TARGETS["p99_ms"]},
    }


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lv = report["levels"]
    xs = [r["concurrency"] for r in lv]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(xs, [r["admissions_per_s"] for r in lv], "o-", label="admissions/s")
    a.plot(xs, [report["raw_status_patch_per_s"] / max(r["writes_per_admission"], 1) for r in lv],
           "--", label="write ceiling / writes per admission")
    a.set_xlabel("concurrent clients")
    a.set_ylabel("per second")
    a.set_title("admissions through the API server")
    a.legend()
    b.plot(xs, [r["p50_ms"] for r in lv], "o-", label="p50")
    b.plot(xs, [r["p99_ms"] for r in lv], "s-", label="p99")
    b.axhline(1000, color="grey", ls=":", label="1 s target (p99 @ 20)")
    b.set_xlabel("concurrent clients")
    b.set_ylabel("admission latency (ms)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
