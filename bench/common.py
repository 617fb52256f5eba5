"""What the benchmarks share: `Benchmark` (a benchmark's flags and its run, for `gpu-binder
bench` and `python -m bench.NAME` alike) and its flag helpers, the checkout's commit and the
machine a report names, the quantile, an admin API client, list-then-watch of one kind, the
launcher Pods of VMIs by uid, KubeVirt's own GPU VMI as a request body, an API error's text
(through k8s/errors), the kube-apiserver's /metrics text, Prometheus text as samples and
their deltas, the replicas' samples, roles and own webhook and decision timings, a process's
CPU and memory from /proc, polling until a condition holds, and a fleet of 8-GPU nodes per
mode. Pure helpers and thin I/O; no benchmark's logic."""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Iterable

import anyio

VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"
DEV_GROUP, DEV_VERSION = "gpu.cozystack.io", "v1alpha1"
CREATED_BY = "kubevirt.io/created-by"
"""The label virt-controller puts on a launcher Pod: the uid of the VMI it runs."""


# -- the registry: a benchmark's flags and its run ------------------------------------------

class BadArgs(Exception):
    """A benchmark's flag value refused before anything starts (the message names the
    flag): exit code 2, as argparse's usage errors."""


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One benchmark as the command line offers it: `name` (`gpu-binder bench NAME`, or
    `python -m bench.NAME`), `help` (one line, also the description of its `--help`),
    `add_arguments(parser)` (every flag it reads, each help naming its default) and
    `run(args)` → exit code (0 done; BadArgs for a refused value). The module defining it
    imports what the run needs only when it runs, so listing the benchmarks stays fast."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

    def main(self, argv: list[str] | None = None) -> int:
        """`python -m bench.NAME [flags]`: the same flags and run as the registry gives the
        command line; returns the exit code (2 for a refused value, as argparse's)."""
        parser = argparse.ArgumentParser(prog=f"python -m bench.{self.name}",
                                         description=self.help)
        self.add_arguments(parser)
        try:
            return int(self.run(parser.parse_args(argv)) or 0)
        except BadArgs as exc:
            print(exc, file=sys.stderr)
            return 2


def at_least(minimum: int):
    """An argparse type: an int >= `minimum` (a clear usage error, exit 2, otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def int_between(minimum: int, maximum: int):
    """An argparse type: an int in [`minimum`, `maximum`] (a clear usage error, exit 2,
    otherwise): for counts whose every unit costs a run's time or memory up front."""
    at_min = at_least(minimum)

    def parse(text: str) -> int:
        value = at_min(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value
    parse.__name__ = f"integer in [{minimum}, {maximum}]"
    return parse


def finite_at_least(minimum: float):
    """An argparse type: a finite float >= `minimum` (nan, inf and less are a clear usage
    error, exit 2)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"takes a finite number >= {minimum:g}, got {text!r}")
        return value
    parse.__name__ = f"number >= {minimum:g}"
    return parse


def share(text: str) -> float:
    """An argparse type: a share, a finite float in [0, 1] (anything else exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:      # NaN fails too
        raise argparse.ArgumentTypeError(f"takes a share in [0, 1], got {text!r}")
    return value


def file_path(text: str) -> Path:
    """An argparse type: a non-empty path (an empty one would name the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("takes a path, got ''")
    return Path(text)


def ints_at_least(text: str, flag: str, minimum: int) -> tuple[int, ...]:
    """A comma-separated list of integers >= `minimum` given to `flag`. Raises BadArgs."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < minimum:
        raise BadArgs(f"gpu-binder bench: {flag} takes integers >= {minimum} separated by commas, "
                      f"got {text!r}")
    return values


def add_out(p: argparse.ArgumentParser) -> None:
    """`--out DIR` of the `gpu-binder bench` benchmarks (`check_out` judges it before the run)."""
    p.add_argument("--out", default="bench-out",
                   help="directory for the JSON report (and the PNG plot where it draws "
                        "one); refused before the run unless it is, or can be made, a "
                        "writable directory (default: %(default)s)")


def check_out(prog: str, out: str | Path) -> Path:
    """`--out DIR` of `prog` ("gpu-binder bench soak") as a Path, once it can take the report;
    checked before anything starts, writing nothing. Raises BadArgs, one line naming the flag,
    the path and why: `out` exists and is not a directory; the nearest of its ancestors that
    exists is not one (`/etc/hostname/x`: the run would make `out` at its end and fail
    there); the directory written in (`out`, or that ancestor) is not writable; or the OS
    refuses to look (an ancestor that cannot be searched). A failure after the check (a full
    disk) is not foreseen."""
    path = Path(out)
    try:
        if path.exists() or path.is_symlink():      # a dangling symlink cannot be made either
            if not path.is_dir():
                raise BadArgs(f"{prog}: --out {path} exists and is not a directory")
            home = path
        else:
            home = next((p for p in path.absolute().parents if p.exists() or p.is_symlink()),
                        Path(path.absolute().anchor))
            if not home.is_dir():
                raise BadArgs(f"{prog}: --out {path}: {home} is not a directory")
    except OSError as exc:
        raise BadArgs(f"{prog}: --out {path}: cannot look at {exc.filename}: "
                      f"{exc.strerror}") from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise BadArgs(f"{prog}: --out {path}: {home} is not writable")
    return path


def add_quick(p: argparse.ArgumentParser, text: str) -> None:
    """`--quick`: `text` says what the short run leaves out."""
    p.add_argument("--quick", action="store_true", help=f"{text} (default: the full run)")


def add_seed(p: argparse.ArgumentParser) -> None:
    """`--seed N` of a seeded workload."""
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the generated workload (default: %(default)s)")


def add_modes(p: argparse.ArgumentParser, text: str) -> None:
    """`--modes count,device`: `text` says what each mode does in this benchmark."""
    p.add_argument("--modes", default="count",
                   help="count (GPUs as an extended resource) and/or device (HGX boards "
                        "publishing DRA ResourceSlices, a device-mode GPUClass; "
                        f"docs/device-mode.md), comma separated; {text} "
                        "(default: %(default)s)")


def modes(text: str) -> tuple[str, ...]:
    """`--modes`' value: count and/or device, in the order given. Raises BadArgs."""
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not values or set(values) - {"count", "device"}:
        raise BadArgs(f"gpu-binder bench: --modes takes count and/or device separated by "
                      f"commas, got {text!r}")
    return values


def positive_ints(text: str, flag: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers given to `flag`. Raises BadArgs."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise BadArgs(f"gpu-binder bench: {flag} takes positive integers separated by commas, "
                      f"got {text!r}")
    return values


def targets_lines(report: dict) -> list[str]:
    """"target NAME: value (target): met" for each of `report["targets"]`."""
    lines = []
    for name, t in report["targets"].items():
        met = {True: "met", False: "NOT met", None: "not available"}[t["met"]]
        lines.append(f"target {name}: {t['value']} ({t['target']}): {met}")
    return lines


# -- what a report names --------------------------------------------------------------------

def commit() -> str:
    """The checkout's `git describe --always --dirty`, or "unknown" outside a git checkout."""
    import subprocess

    from localcluster.paths import REPO_ROOT

    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def head_sha() -> str | None:
    """The checkout's HEAD commit (40 hex digits), None outside a git checkout."""
    import subprocess

    from localcluster.paths import REPO_ROOT

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine() -> dict:
    """{cpus, python, platform} of this machine, as every report records it."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def percentile(values: list[float], p: float) -> float | None:
    """The `p`-th percentile (0-100) of `values` (any order): the value at index
    round(p/100 · (n-1)) of the sorted values; None when `values` is empty."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(p / 100 * (len(values) - 1)))))]


def quantile(samples: list[float], q: float) -> float:
    """The nearest-rank quantile `q` (0 < q <= 1) of `samples` (any order): the value at
    rank ceil(q · n) of the sorted samples. Raises ValueError when `samples` is empty. The
    one quantile of the benchmarks' p50/p99 figures (`percentile` is the older rule of the
    reports that kept it: the rounded index)."""
    if not samples:
        raise ValueError("quantile of no samples")
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# -- the API --------------------------------------------------------------------------------

async def admin_client(lc, pool: int):
    """A kubernetes_asyncio ApiClient as the admin of LocalCluster `lc`, with `pool`
    connections at most (close it: `await client.close()` or `async with`)."""
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.config import load_kube_config

    cfg = Configuration()
    await load_kube_config(config_file=str(lc.cp.admin_kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return ApiClient(cfg)


def error_text(exc: BaseException, what: str = "request") -> str:
    """The API's message of a failed call (k8s.errors.translate: the Status `message`, its
    causes appended; the reason or the exception's repr when the body is not a Status)."""
    from k8s.errors import translate

    return translate(exc, what).message


async def apiserver_metrics(api) -> str:
    """kube-apiserver's /metrics text, read with `api` (an admin ApiClient)."""
    resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"],
                              _preload_content=False)
    try:
        return (await resp.read()).decode()
    finally:
        resp.release()


async def watch_namespaced(list_fn, args: tuple, on_event: Callable[[str, dict], None],
                           prefix: str, on_list: Callable[[str, int], None] | None = None) -> None:
    """List then watch `list_fn(*args)` forever, calling `on_event(type, object dict)` for
    each object in a namespace starting with `prefix`. It lists again whenever the watch
    ends: the server closed it ("stream ended": its timeout, or a watcher it found too slow
    under load), "410 Gone", or an error object in the stream ("Status"). A list after the
    first replaces what was reported: an object reported before and not listed now is
    reported DELETED (it went while no watch ran; without this a cache built from the
    events kept it for ever: issue 33's release waits that ran out at 60 s).
    `on_list(why, items)`, when given, is told of every list ("start" the first) with the
    number of objects listed. Raises the ApiException of any other failure (the caller
    decides whether to list again)."""
    import json

    from kubernetes_asyncio import watch
    from kubernetes_asyncio.client import ApiException

    known: dict[tuple[str, str], dict] = {}  # what on_event was last told, by (ns, name)

    def report(kind: str, obj: dict) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            known.pop(key, None)
        else:
            known[key] = obj
        on_event(kind, obj)

    why = "start"
    while True:
        listed = await list_fn(*args, _preload_content=False)
        body = json.loads(await listed.read())
        listed.release()
        items = [obj for obj in body.get("items") or []
                 if obj["metadata"]["namespace"].startswith(prefix)]
        if on_list is not None:
            on_list(why, len(items))
        now = {(obj["metadata"]["namespace"], obj["metadata"]["name"]) for obj in items}
        for key in [k for k in known if k not in now]:
            report("DELETED", known[key])
        for obj in items:
            report("ADDED", obj)
        rv = body["metadata"]["resourceVersion"]
        why = "stream ended"
        try:
            async with watch.Watch().stream(list_fn, *args, resource_version=rv,
                                            timeout_seconds=600) as stream:
                async for ev in stream:
                    obj = ev["raw_object"]
                    if obj.get("kind") == "Status":
                        why = "Status"
                        break
                    if obj["metadata"]["namespace"].startswith(prefix):
                        report(ev["type"], obj)
        except ApiException as exc:
            if exc.status != 410:
                raise
            why = "410 Gone"


class LauncherPods:
    """The launcher Pods in namespaces starting with `prefix`, by the uid of the VMI that
    made them (label CREATED_BY): `by_uid` uid -> (node or "", phase). Run `watch()` in a
    task group; `bound(uid, timeout)` waits for a node. `relist`: after a failed list or
    watch (an API server restarting) list again a second later instead of raising."""

    def __init__(self, api, prefix: str, *, relist: bool = False) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        self.core, self.prefix, self.relist = CoreV1Api(api), prefix, relist
        self.by_uid: dict[str, tuple[str, str]] = {}
        self._waiting: dict[str, anyio.Event] = {}

    def on_event(self, kind: str, obj: dict) -> None:
        """One watch event of a Pod (type, object dict)."""
        uid = (obj["metadata"].get("labels") or {}).get(CREATED_BY)
        if not uid:
            return
        if kind == "DELETED":
            self.by_uid.pop(uid, None)
            return
        node = obj["spec"].get("nodeName") or ""
        self.by_uid[uid] = (node, (obj.get("status") or {}).get("phase") or "")
        if node and uid in self._waiting:
            self._waiting.pop(uid).set()

    async def watch(self) -> None:
        """Forever; raises a failed list's or watch's ApiException unless `relist`."""
        while True:
            try:
                await watch_namespaced(self.core.list_pod_for_all_namespaces, (),
                                       self.on_event, self.prefix)
            except Exception:   # noqa: BLE001 — the API server restarting; list again
                if not self.relist:
                    raise
                await anyio.sleep(1)

    def node(self, uid: str) -> str:
        """The node the launcher Pod of VMI `uid` is bound to, "" if none (yet)."""
        return self.by_uid.get(uid, ("", ""))[0]

    async def bound(self, uid: str, timeout: float) -> str:
        """The node the launcher Pod of VMI `uid` is bound to, "" if none within `timeout` s."""
        if not self.node(uid):
            ev = self._waiting.setdefault(uid, anyio.Event())
            with anyio.move_on_after(timeout):
                await ev.wait()
        return self.node(uid)


# -- Prometheus samples, and the replicas' -----------------------------------------------------

Key = tuple[str, tuple[tuple[str, str], ...]]
"""A sample's name and its labels, sorted: ("x_total", (("phase", "attach"),))."""
Samples = dict[Key, float]


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition (name with its _total/_sum/_count/_bucket
    suffix, labels sorted) → value. Raises ValueError for text the parser refuses."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def added(parts: Iterable[Samples]) -> Samples:
    """The samples of several processes summed (the replicas' counters together)."""
    out: Samples = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


def delta(before: Samples, after: Samples) -> Samples:
    """after − before per sample (a sample absent before counts from 0; gauges are
    subtracted too, so read counters and histograms only)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


async def replica_samples(lc) -> Samples:
    """The live replicas' /metrics samples of LocalCluster `lc`, summed (`samples`,
    `added`); read in a worker thread. Raises what `lc.metrics` raises (a replica not
    answering within 5 s)."""
    parts = []
    for i, r in enumerate(lc.replicas):
        if r.alive:
            parts.append(samples(await anyio.to_thread.run_sync(lc.metrics, i)))
    return added(parts)


async def replica_roles(lc) -> dict[str, str]:
    """{replica identity: "leader" or "follower"} of LocalCluster `lc`, from the Lease
    (empty when none holds it); read in a worker thread (kubectl)."""
    leader = await anyio.to_thread.run_sync(lc.leader)
    if leader is None:
        return {}
    return {r.identity: "leader" if r.identity == leader else "follower" for r in lc.replicas}


async def replica_timings(lc) -> dict[str, float]:
    """The replicas' own timings so far, summed over the live replicas of LocalCluster `lc`:
    {admission_s, admissions, decision_s, decisions} (gpu_binder_admission_seconds: the
    webhook's time per VMI; gpu_binder_decision_seconds: the binder's decision loop)."""
    out = {"admission_s": 0.0, "admissions": 0.0, "decision_s": 0.0, "decisions": 0.0}
    names = {"gpu_binder_admission_seconds_sum": "admission_s",
             "gpu_binder_admission_seconds_count": "admissions",
             "gpu_binder_decision_seconds_sum": "decision_s",
             "gpu_binder_decision_seconds_count": "decisions"}
    for i, r in enumerate(lc.replicas):
        if not r.alive:
            continue
        text = await anyio.to_thread.run_sync(lc.metrics, i)
        for line in text.splitlines():
            key = line.split(" ", 1)[0].split("{", 1)[0]
            if key in names:
                out[names[key]] += float(line.rsplit(" ", 1)[1])
    return out


def timings_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """{webhook_mean_ms, decision_mean_ms} over what happened between two `replica_timings`
    readings (None when nothing did)."""
    d = {k: after[k] - before[k] for k in before}
    return {"webhook_mean_ms": round(1000 * d["admission_s"] / d["admissions"], 1)
            if d["admissions"] else None,
            "decision_mean_ms": round(1000 * d["decision_s"] / d["decisions"], 2)
            if d["decisions"] else None}


# -- request bodies -------------------------------------------------------------------------

_BASE: dict | None = None


def base_vmi() -> dict:
    """A fresh copy of KubeVirt's own vmi-gpu example (parsed once)."""
    import yaml

    from localcluster.paths import KUBEVIRT_FIXTURES

    global _BASE
    if _BASE is None:
        _BASE = yaml.safe_load((KUBEVIRT_FIXTURES / "vmi-gpu.yaml").read_text())
    return copy.deepcopy(_BASE)


def gpu_vmi(name: str, *, held: tuple[str, ...] = (), cls: str = "", size: int = 0,
            labels: dict[str, str] | None = None) -> dict:
    """KubeVirt's own vmi-gpu example named `name`, its own GPU entry removed (ours replace
    it), asking for the held GPUDevices `held` by name, or else `size` template devices of
    GPUClass `cls`; `labels` on its metadata when given."""
    v = base_vmi()
    v["apiVersion"] = f"{VMI_GROUP}/{VMI_VERSION}"
    v["metadata"] = {"name": name, **({"labels": labels} if labels else {})}
    del v["spec"]["domain"]["devices"]["gpus"]
    v["metadata"]["annotations"] = (
        {"gpu.cozystack.io/devices": ",".join(held)} if held
        else {"gpu.cozystack.io/templates": f"{cls}={size}"})
    return v


# -- processes and waiting ------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (and its waited-for children), seconds; 0.0 when it is gone
    (`bench.proc_cpu.cpu_seconds`, which reads it)."""
    from bench.proc_cpu import cpu_seconds as read

    got = read(pid, children=True)
    return 0.0 if got is None else got


def memory_mib(pid: int) -> dict[str, float]:
    """{"VmRSS": …, "VmHWM": …} of `pid` from /proc/<pid>/status, MiB, unrounded; {} when
    the process is gone."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        return {}
    return out


async def poll_until(probe: Callable[[], Awaitable[object]], timeout: float,
                     interval: float) -> bool:
    """Await `probe()` every `interval` s until it is truthy (True) or `timeout` s pass
    (False); wall time (a real cluster)."""
    deadline = time.monotonic() + timeout
    while True:
        if await probe():
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(interval)


async def mode_fleet(fleet, nodes: int, modes: tuple[str, ...], *, res: str,
                     class_of: dict[str, str], node_prefix: dict[str, str],
                     ready: Callable[[str], Awaitable[None]] | None = None) -> None:
    """The count-mode GPU class `class_of["count"]` (resource `res`) and, with "device" in
    `modes`, the device-mode class `class_of["device"]` (localcluster's HGX class); then per
    mode `nodes` nodes of 8 GPUs named `node_prefix[mode]-NNN` (16 made at once): count mode
    `res` allocatable (then `ready(name)` when given), device mode an HGX board's
    ResourceSlice. Raises what the API calls raise."""
    from localcluster.dra_profiles import HGX_H100_8
    from localcluster.dra_world import HGX_CLASS, dra_node

    assert HGX_CLASS.name == class_of["device"]
    await fleet.gpu_class(class_of["count"], res)
    if "device" in modes:
        await fleet.gpu_class(class_of["device"], device_mode=HGX_CLASS.spec())
    limit = anyio.Semaphore(16)

    async def make(mode: str, i: int) -> None:
        async with limit:
            name = f"{node_prefix[mode]}-{i:03d}"
            if mode == "device":
                await dra_node(fleet, name, HGX_H100_8)
                return
            await fleet.node(name, {res: 8})
            if ready is not None:
                await ready(name)
    async with anyio.create_task_group() as tg:
        for mode in modes:
            for i in range(nodes):
                tg.start_soon(make, mode, i)


def rows_report(benchmark: str, started: str, load_before: tuple[float, ...], rows: list,
                out: "Path | None") -> dict:
    """The report of a benchmark that measures `rows` in this process (no cluster): its
    name, commit, start time (ISO, UTC), machine, the load before and now, and the rows;
    printed load line, written as JSON to `out` when given. Returns the report."""
    import json

    report = {"benchmark": benchmark, "commit": commit(), "started": started,
              "machine": machine(), "load_before": [round(x, 2) for x in load_before],
              "load_after": [round(x, 2) for x in os.getloadavg()], "rows": rows}
    print(f"load {report['load_before']} -> {report['load_after']}")
    if out:
        out.write_text(json.dumps(report, indent=1) + "\n")
    return report
