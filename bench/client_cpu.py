"""Our process's CPU per API call on the admission's hot path (issue 40 item 5).

`python -m bench.client_cpu` starts a local control plane (etcd and kube-apiserver, our CRDs;
no replicas), builds the API client as a replica does (`k8s.controller.make_api_client` on
the admin's kubeconfig) and, per round and per way of calling (`--via`), makes `--calls`
status patches of GPUDevices (JSON merge patches that change the status each time: real
writes) and as many GETs, `--concurrency` at a time. It reads this process's CPU (utime +
stime of all its threads, `bench.proc_cpu`) and the wall clock around each batch and
reports CPU ms and wall ms per call, each way's median over the rounds, with the load
average before and after (the machine's other work does not count in our CPU, but it
slows the API server's answers). The ways:

- `client`: `k8s.client.KubeClient`, the production code's client (since issue 40 item 5 its
  raw path: the ApiClient's aiohttp session, orjson, no kubernetes_asyncio models);
- `kubernetes-asyncio`: the same calls through kubernetes_asyncio's generated
  `CustomObjectsApi` (`ApiClient.call_api`: parameters sanitised, the body serialised and
  the answer decoded by the standard json module), bounded the same way: what
  `KubeClient` did before.

The rounds alternate the ways, so both meet the same load. /proc counts in clock ticks
(10 ms): a batch of N calls is good to about 10 ÷ N ms a call. Prints one line per way and
call and writes the report to `--out` (JSON) when given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio

from bench.common import Benchmark, at_least, commit, file_path, machine
from bench.proc_cpu import cpu_seconds
from model.types import GROUP, VERSION

WAYS = ("client", "kubernetes-asyncio")
NAMESPACE = "client-cpu"
MERGE = "application/merge-patch+json"
FIELD_MANAGER = "bench-client-cpu"


def _ways(text: str) -> tuple[str, ...]:
    """An argparse type: a comma-separated subset of WAYS."""
    got = tuple(w.strip() for w in text.split(",") if w.strip())
    bad = [w for w in got if w not in WAYS]
    if bad or not got:
        raise argparse.ArgumentTypeError(f"ways are {', '.join(WAYS)}; not {text!r}")
    return got


def _calls(api: Any, way: str, timeout: float = 5.0) -> tuple[Callable[[str, dict], Awaitable],
                                                               Callable[[str], Awaitable]]:
    """(patch_status(name, merge patch), get(name)) of GPUDevices in NAMESPACE, made `way`."""
    if way == "client":
        from k8s.client import GPU_DEVICES, KubeClient

        client = KubeClient(api, timeout=timeout, field_manager=FIELD_MANAGER)

        async def patch(name: str, body: dict) -> Any:
            return await client.patch_status(GPU_DEVICES, NAMESPACE, name, body)

        async def get(name: str) -> Any:
            return await client.get(GPU_DEVICES, NAMESPACE, name)
        return patch, get
    from kubernetes_asyncio.client import CustomObjectsApi

    custom = CustomObjectsApi(api)

    async def patch(name: str, body: dict) -> Any:  # as KubeClient._call made it
        with anyio.fail_after(timeout):
            return await custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, NAMESPACE, "gpudevices", name, body, _content_type=MERGE,
                field_manager=FIELD_MANAGER, _request_timeout=timeout)

    async def get(name: str) -> Any:
        with anyio.fail_after(timeout):
            return await custom.get_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "gpudevices", name, _request_timeout=timeout)
    return patch, get


async def _batch(calls: int, concurrency: int, one: Callable[[int], Awaitable]) -> dict:
    """Run `one(i)` for i in range(calls), `concurrency` at a time; {"cpu_ms": this
    process's CPU ms a call, "wall_ms": wall ms a call}."""
    pid = os.getpid()
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()

    async def worker(w: int) -> None:
        for i in range(w, calls, concurrency):
            await one(i)
    async with anyio.create_task_group() as tg:
        for w in range(concurrency):
            tg.start_soon(worker, w)
    cpu1, t1 = cpu_seconds(pid), time.perf_counter()
    return {"cpu_ms": round((cpu1 - cpu0) * 1000 / calls, 3),
            "wall_ms": round((t1 - t0) * 1000 / calls, 3)}


async def measure(kubeconfig: Path, ways: tuple[str, ...], calls: int, rounds: int,
                  concurrency: int) -> dict:
    """{way: {"patch_status": {"cpu_ms", "wall_ms"}, "get": …}}: the medians over `rounds`
    of each batch's per-call figures (also every round's, under "rounds"), on the control
    plane of `kubeconfig`, whose NAMESPACE holds GPUDevices dev-0 … dev-(concurrency-1)."""
    from k8s.controller import make_api_client

    api = await make_api_client(str(kubeconfig))
    names = [f"dev-{w}" for w in range(concurrency)]
    got: dict[str, list[dict]] = {w: [] for w in ways}
    try:
        for _ in range(rounds):
            for way in ways:
                patch, get = _calls(api, way)
                await patch(names[0], {"status": {"phase": "Pending"}})   # the pool warm
                writes = await _batch(calls, concurrency, lambda i: patch(
                    names[i % concurrency],
                    {"status": {"phase": "Bound", "nodeName": f"node-{i // concurrency % 2}"}}))
                reads = await _batch(calls, concurrency, lambda i: get(names[i % concurrency]))
                got[way].append({"patch_status": writes, "get": reads})
    finally:
        await api.close()
    out: dict = {}
    for way, runs in got.items():
        out[way] = {call: {k: round(statistics.median(r[call][k] for r in runs), 3)
                           for k in ("cpu_ms", "wall_ms")} for call in ("patch_status", "get")}
        out[way]["rounds"] = runs
    return out


def _uptime() -> str:
    """`uptime`'s line, or the load average when it cannot be run."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=at_least(1), default=500,
                   help="status patches and GETs per batch (default: %(default)s)")
    p.add_argument("--rounds", type=at_least(1), default=3,
                   help="batches per way; the report gives their median (default: %(default)s)")
    p.add_argument("--concurrency", type=at_least(1), default=1,
                   help="calls in flight at once, each on a GPUDevice of its own "
                        "(default: %(default)s)")
    p.add_argument("--via", type=_ways, default=WAYS,
                   help=f"ways of calling, comma-separated, of {', '.join(WAYS)} "
                        "(default: both)")
    p.add_argument("--out", type=file_path, default=None,
                   help="also write the report to this JSON file (default: none)")


def _run(args: argparse.Namespace) -> int:
    from localcluster.controlplane import ControlPlane
    from localcluster.paths import MANIFESTS

    started = datetime.now(UTC).isoformat(timespec="seconds")
    with ControlPlane() as cp:
        cp.kubectl("apply", "--server-side", "--field-manager=bench", "-f", str(MANIFESTS / "crds"))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                   f"crd/gpudevices.{GROUP}")
        cp.kubectl("create", "namespace", NAMESPACE)
        for w in range(args.concurrency):
            cp.kubectl("apply", "--server-side", "--field-manager=bench", "-f", "-",
                       input=json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                                         "metadata": {"name": f"dev-{w}", "namespace": NAMESPACE},
                                         "spec": {"class": "bench"}}))
        before = _uptime()
        got = anyio.run(measure, cp.admin_kubeconfig, args.via, args.calls, args.rounds,
                        args.concurrency)
        after = _uptime()
    for way in args.via:
        for call in ("patch_status", "get"):
            f = got[way][call]
            print(f"{way:18s} {call:12s} {f['cpu_ms']:7.3f} ms CPU a call "
                  f"({f['wall_ms']:.3f} ms wall)")
    print(f"before: {before}\nafter:  {after}")
    if args.out:
        args.out.write_text(json.dumps({
            "benchmark": "client_cpu", "commit": commit(), "machine": machine(),
            "started": started, "calls": args.calls, "rounds": args.rounds,
            "concurrency": args.concurrency, "uptime_before": before, "uptime_after": after,
            "ways": got}, indent=1) + "\n")
    return 0


BENCHMARK = Benchmark("client_cpu", "our process's CPU ms per GPUDevice status patch and GET, "
                                    "KubeClient against kubernetes_asyncio's generated calls, "
                                    "on a local control plane", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
