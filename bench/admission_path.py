"""What one quiet admission costs the leader replica, by fleet size and by what the fleet holds
(issue 40 items 2 and 3: nothing on an admission's path should grow with the fleet).

Run `python -m bench.admission_path [--nodes 100,1000] [--sets 0,600] [--modes device,count]
[--samples 40] [--profile N] [--out FILE]`. Not a test, no API server: one process is the
leader replica of `gpu-binder controller`, wired as `k8s.controller.Controller` wires it (the
`ClusterCache`, `VMIAdmission`, the `Binder` on the cache's view with `ApiStatusWriter`, the
`Housekeeper`, `VMWaiting`, `Preemption`, `LineStatus`, `Health`, the `Metrics` observer),
over `LoopbackClient`: an in-memory API that keeps every object it is written and hands each
write at once to the cache's informer, as a watch would. The fleet is
`bench.housekeeping_cost`'s population at `--nodes` nodes × 8 GPUs with `--sets` running VMIs
on it (each with its VirtualMachine; in device mode its devices recording their GPUs and its
ResourceClaim allocated), so `--sets 600` holds about 1,200 records, and no idle held devices;
`--bare`: the running VMIs have no VirtualMachine (`bench scale` and `bench floor` make bare VMIs).

Each sample is one quiet 1-GPU admission of a bare VMI (a template device of the one class),
then what follows it in a cluster: the VMI created with the webhook's patch, in device mode
its claim allocated (kube-scheduler), its launcher Pod bound, the VMI Running; then the
leader's loops settle (their coalesced rounds run). Per sample: the webhook's answer (wall ms
on this loop) and the process's CPU time (ms) for the whole sample, admission and what follows
(`time.process_time`). `--profile N` writes a cProfile of the samples of the N-th size/fill
(`--profile-out`). The figures are CPU time on a shared machine: the report records
`os.getloadavg()` before and after.
"""

from __future__ import annotations

import argparse
import cProfile
import copy
import json
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import anyio
import orjson

from actors.heap import restore_heap, settle_heap
from bench.common import (Benchmark, at_least, file_path, finite_at_least, ints_at_least, modes,
                          rows_report)

SETTLE = 0.5
"""Seconds of loop time after a sample's last write for the leader's loops (their 0.2 s
coalesced rounds) to run."""


def _now_ts() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- JSON Patch (RFC 6902), what the binder's writers use --------------------------------


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _walk(doc: Any, path: str) -> tuple[Any, str]:
    parts = [_unescape(t) for t in path.split("/")[1:]]
    cur = doc
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur, parts[-1]


def apply_patch(doc: dict, ops: list[dict]) -> dict:
    """`ops` (add, replace, remove, test) applied to a deep copy of `doc`. Raises KeyError,
    IndexError or TypeError for a path that does not exist, ValueError for a failed test."""
    out = copy.deepcopy(doc)
    for op in ops:
        parent, last = _walk(out, op["path"])
        kind = op["op"]
        if kind == "test":
            got = parent[int(last)] if isinstance(parent, list) else parent[last]
            if got != op["value"]:
                raise ValueError(f"test of {op['path']} failed")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(copy.deepcopy(op["value"]))
                elif kind == "add":
                    parent.insert(int(last), copy.deepcopy(op["value"]))
                else:
                    parent[int(last)] = copy.deepcopy(op["value"])
            else:
                if kind == "replace" and last not in parent:
                    raise KeyError(op["path"])
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise ValueError(f"op {kind} not supported")
    return out


def _merge(doc: dict, patch: dict) -> dict:
    out = copy.deepcopy(doc)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class LoopbackClient:
    """`k8s.client.KubeClient`'s methods over objects kept in memory: each write gets the next
    resourceVersion and is handed at once (a copy) to the informer of its kind
    (`informers`: plural → `k8s.informer.Informer`, as its watch would deliver it). `calls`
    counts the calls by method and plural. Errors are `k8s.errors`' as the real client raises
    them (NotFound with the object's name, AlreadyExists, Invalid for a failed test, Conflict
    for a failed precondition)."""

    def __init__(self, informers: dict[str, Any], *, timeout: float = 5.0,
                 field_manager: str = "bench") -> None:
        self.informers = informers
        self.timeout = timeout
        self.field_manager = field_manager
        self.objects: dict[str, dict[tuple[str, str], dict]] = {p: {} for p in informers}
        self.calls: Counter = Counter()
        self._rv = [10_000_000]

    def using(self, *, field_manager: str | None = None,
              timeout: float | None = None) -> "LoopbackClient":
        other = copy.copy(self)
        other.field_manager = field_manager or self.field_manager
        other.timeout = self.timeout if timeout is None else timeout
        return other

    def seed(self, plural: str, obj: dict) -> None:
        """Keep `obj` as the API's object (already delivered to the informer)."""
        meta = obj["metadata"]
        self.objects[plural][(meta.get("namespace") or "", meta["name"])] = copy.deepcopy(obj)

    def _next_rv(self) -> str:
        self._rv[0] += 1
        return str(self._rv[0])

    def _deliver(self, plural: str, kind: str, obj: dict) -> None:
        inf = self.informers.get(plural)
        if inf is not None:
            inf._apply(kind, copy.deepcopy(obj))

    def _stored(self, res, ns: str | None, name: str) -> dict:
        from k8s import errors

        got = self.objects.setdefault(res.plural, {}).get((ns or "", name))
        if got is None:
            raise errors.NotFound(f"read {res.plural} {ns}/{name}", 404, "not found",
                                  reason="NotFound", details={"name": name})
        return got

    async def _turn(self, method: str, res) -> None:
        self.calls[(method, getattr(res, "plural", res))] += 1
        await anyio.lowlevel.checkpoint()

    async def get(self, res, ns: str | None, name: str) -> dict:
        await self._turn("get", res)
        return copy.deepcopy(self._stored(res, ns, name))

    async def get_status(self, res, ns: str, name: str) -> dict:
        await self._turn("get_status", res)
        return copy.deepcopy(self._stored(res, ns, name))

    def _write(self, res, ns: str | None, name: str, new: dict) -> dict:
        new.setdefault("metadata", {})["resourceVersion"] = self._next_rv()
        self.objects[res.plural][(ns or "", name)] = new
        self._deliver(res.plural, "MODIFIED", new)
        return copy.deepcopy(new)

    async def _patched(self, res, ns: str | None, name: str, body: list[dict] | dict) -> dict:
        from k8s import errors

        old = self._stored(res, ns, name)
        try:
            new = apply_patch(old, body) if isinstance(body, list) else _merge(old, body)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise errors.Invalid(f"patch {res.plural} {ns}/{name}", 422, str(exc),
                                 reason="Invalid") from None
        return self._write(res, ns, name, new)

    async def patch_status(self, res, ns: str | None, name: str, body: list[dict] | dict, *,
                           what: str | None = None) -> dict:
        await self._turn("patch_status", res)
        return await self._patched(res, ns, name, body)

    async def patch(self, res, ns: str, name: str, body: list[dict], *,
                    what: str | None = None) -> dict:
        await self._turn("patch", res)
        return await self._patched(res, ns, name, body)

    async def create(self, res, ns: str | None, body: dict, *, what: str | None = None) -> dict:
        from k8s import errors

        await self._turn("create", res)
        name = body["metadata"]["name"]
        store = self.objects.setdefault(res.plural, {})
        if (ns or "", name) in store:
            raise errors.AlreadyExists(f"create {res.plural} {ns}/{name}", 409, "exists",
                                       reason="AlreadyExists", details={"name": name})
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        if ns:
            meta["namespace"] = ns
        meta.setdefault("uid", f"uid-{res.plural}-{ns}-{name}-{self._rv[0]}")
        meta.setdefault("creationTimestamp", _now_ts())
        meta["resourceVersion"] = self._next_rv()
        store[(ns or "", name)] = obj
        self._deliver(res.plural, "ADDED", obj)
        return copy.deepcopy(obj)

    async def delete(self, res, ns: str | None, name: str, *, uid: str | None = None,
                     resource_version: str | None = None, what: str | None = None) -> None:
        from k8s import errors

        await self._turn("delete", res)
        old = self._stored(res, ns, name)
        meta = old["metadata"]
        if (uid and meta.get("uid") != uid) or (resource_version and
                                                meta.get("resourceVersion") != resource_version):
            raise errors.Conflict(f"delete {res.plural} {ns}/{name}", 409, "precondition",
                                  reason="Conflict")
        del self.objects[res.plural][(ns or "", name)]
        self._deliver(res.plural, "DELETED", old)

    async def create_event(self, ns: str, body: dict) -> None:
        await self._turn("create_event", "events")

    async def create_config_map(self, ns: str, body: dict, *, what: str | None = None) -> dict:
        await self._turn("create_config_map", "configmaps")
        return body

    async def replace_config_map(self, ns: str, name: str, body: dict, *,
                                 what: str | None = None) -> dict:
        await self._turn("replace_config_map", "configmaps")
        return body

    def lister(self, res):
        async def list_fn(**_: Any) -> Any:
            raise RuntimeError("the loopback client lists nothing")
        return list_fn


async def _idle_run(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """An informer's `run` that never lists (the world was delivered by hand)."""
    task_status.started()
    await anyio.sleep_forever()


class Replica:
    """The leader replica of `k8s.controller.Controller` over a `bench.housekeeping_cost`
    world and a `LoopbackClient` (module doc)."""

    def __init__(self, nodes: int, mode: str, sets: int, seed: int = 1, *, vms: bool = True) -> None:
        from bench.housekeeping_cost import _World
        from k8s.client import (GPU_CLASSES, GPU_DEVICES, RESOURCE_CLAIMS, VMIS, VMS)

        self.mode = mode
        self.world = w = _World(nodes, mode, seed, sets=sets, idle=False, vm_templates=True)
        c = w.cache
        if not vms:  # bare VMIs, as `bench scale` and `bench floor` make them: no VM at all
            for key in w.vms.keys():
                w.vms._apply("DELETED", w.vms.get(key))
        for inf in (*c.informers, w.vms):
            inf.run = _idle_run  # type: ignore[method-assign]
            inf._healthy = True
        self.client = LoopbackClient({GPU_DEVICES.plural: c.devices, GPU_CLASSES.plural: c.classes,
                                      VMIS.plural: c.vmis, VMS.plural: w.vms,
                                      RESOURCE_CLAIMS.plural: c.claims, "pods": c.pods})
        for plural, inf in ((GPU_DEVICES.plural, c.devices), (GPU_CLASSES.plural, c.classes),
                            (VMIS.plural, c.vmis), (VMS.plural, w.vms)):
            for obj in inf.items():
                self.client.seed(plural, obj)
        for claim in w.raw_claims.values():
            self.client.seed(RESOURCE_CLAIMS.plural, claim)
        self.class_name = "hgx" if mode == "device" else "h100"
        self.on_measure: Callable[[], None] | None = None
        """Called once, before the first measured sample (after the warm-up)."""
        self.counts = w.counts

    async def run(self, samples: int, settle: float, profile: cProfile.Profile | None,
                  ) -> list[dict]:
        """Start the leader's parts, then `samples` quiet admissions (module doc); each
        sample's figures. `measured_decisions` is then the binder's decision spans over the measured
        samples (`gpu_binder_decision_seconds`: count, seconds summed)."""
        out: list[dict] = []
        async with anyio.create_task_group() as tg:
            admission = await self.start_leader(tg)
            await anyio.sleep(max(settle, 1.0))  # the first rounds (each judges everything)
            for i in range(samples + 2):  # the first two warm up
                if i == 2:
                    if self.on_measure is not None:
                        self.on_measure()
                    before = self.decisions()
                cpu0 = time.process_time()
                if profile is not None and i >= 2:
                    profile.enable()
                t0 = anyio.current_time()
                answer = await admission.handle(self._review(i))
                answered = anyio.current_time() - t0
                if answer.get("allowed"):
                    await self._follow(i, answer)
                await anyio.sleep(settle)
                if profile is not None and i >= 2:
                    profile.disable()
                cpu = time.process_time() - cpu0
                if i >= 2:
                    out.append({"allowed": bool(answer.get("allowed")),
                                "answer_ms": round(answered * 1e3, 3),
                                "cpu_ms": round(cpu * 1e3, 3)})
            after = self.decisions()
            self.measured_decisions = (after[0] - before[0], after[1] - before[1])
            tg.cancel_scope.cancel()
        self.calls = dict(self.client.calls)
        return out

    def decisions(self) -> tuple[float, float]:
        """The binder's decisions so far: (count, seconds summed), from the leader's metrics
        (`gpu_binder_decision_seconds`: from a batch's snapshot to its last reservation)."""
        get = self.metrics.registry.get_sample_value
        return (get("gpu_binder_decision_seconds_count") or 0.0,
                get("gpu_binder_decision_seconds_sum") or 0.0)

    async def start_leader(self, tg) -> Any:
        """Start the leader's parts (module doc) in task group `tg`; returns the webhook
        (`k8s.webhook.admission.VMIAdmission`). `self.metrics` is the leader's registry."""
        from actors.ports import SystemClock
        from k8s.client import VMIS
        from k8s.config import Config
        from k8s.controller import binder_config, tenant_gate, w1_line
        from k8s.health import Health
        from k8s.housekeeping import Housekeeper
        from k8s.line_status import LineStatus, ReadBack
        from k8s.metrics import Metrics, Observed
        from k8s.nominations import ApiNominations
        from k8s.preemption import Preemption
        from k8s.rounds import RoundLoop
        from k8s.status_writer import ApiStatusWriter
        from k8s.vm_waiting import VMWaiting
        from k8s.webhook.admission import VMIAdmission
        from model.health import HealthSettings
        from supervisor.binder import Binder

        cfg = Config()
        cache, client = self.world.cache, self.client
        grace = timedelta(seconds=cfg.attachment_grace)
        binder: Binder | None = None

        def refused_at_w1(entry) -> bool:
            from actors.coordinator_protocol import RefusedAtW1
            return binder is not None and binder.refused_at_w1(RefusedAtW1(entry))

        admission = VMIAdmission(client, cache, bind_timeout=cfg.bind_timeout, grace=grace,
                                 gate=tenant_gate(cfg), record_wait=cfg.webhook_record_wait,
                                 preemption=binder_config(cfg).coordinator.preemption,
                                 line=w1_line(cfg, refused_at_w1),
                                 line_grace=timedelta(seconds=cfg.line_retry_grace))
        leading = client.using(timeout=min(5.0, cfg.renew_deadline / 2))
        writer = ApiStatusWriter(leading)
        nominations = ApiNominations(leading, cfg.settings_namespace)

        async def line():
            return await binder.line()
        published = LineStatus(leading, cache, line)
        read_back = ReadBack(cache, published, trusted=False)
        metrics = Metrics(lambda: Observed(True, None, binder, cache), admission)
        binder = Binder(cache.view, cache.view, writer, SystemClock(), binder_config(cfg),
                        observer=metrics, nominations=nominations, published=read_back)
        preemption = Preemption(leading, cache, nominations, period=cfg.housekeeping_period)
        import functools
        waiting = VMWaiting(leading, cache, grace=grace, line=functools.partial(binder.line, 1.0),
                            waiting=binder.vms_waiting)
        waiting.vms = self.world.vms  # the world's VMs (its own informer would list an API)
        waiting._loop = RoundLoop(waiting.round, period=waiting._loop.period,
                                  coalesce=waiting._loop.coalesce, sources=(
            waiting.vms, cache.vmis, cache.devices, cache.nodes, cache.quotas, cache.classes,
            cache.kubevirts, cache.pods, cache.nominations))
        health = Health(leading, cache, HealthSettings(cfg.health_failed_starts,
                                                       timedelta(seconds=cfg.health_window)),
                        period=cfg.housekeeping_period)
        keeper = Housekeeper(leading, cache, grace=grace, raw_policy=cfg.raw_resource_names,
                             period=cfg.housekeeping_period,
                             answer_window=timedelta(seconds=cfg.bind_timeout), vms=waiting.vms)
        self.metrics = metrics
        await tg.start(binder.run)
        tg.start_soon(keeper.run)
        tg.start_soon(waiting.run)
        tg.start_soon(preemption.run)
        tg.start_soon(published.run)
        tg.start_soon(health.run)
        return admission

    def _review(self, i: int):
        from k8s.webhook.review import decode

        name, ns = f"q-{i:04d}", "t00"
        doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": f"review-{i}", "operation": "CREATE", "namespace": ns, "name": name,
            "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
            "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                       "metadata": {"name": name, "namespace": ns, "annotations": {
                           "gpu.cozystack.io/templates": f"{self.class_name}=1"}},
                       "spec": {"domain": {"devices": {}}}},
            "userInfo": {"username": "tenant"}}}
        return decode(orjson.dumps(doc))

    async def _follow(self, i: int, answer: dict) -> None:
        """What follows an admission in a cluster: the VMI created as patched, its claim
        allocated (device mode), its launcher Pod bound, the VMI Running."""
        import base64

        from k8s.client import RESOURCE_CLAIMS, VMIS, Resource

        name, ns = f"q-{i:04d}", "t00"
        vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
               "metadata": {"name": name, "namespace": ns, "annotations": {
                   "gpu.cozystack.io/templates": f"{self.class_name}=1"}},
               "spec": {"domain": {"devices": {}}}}
        patch = orjson.loads(base64.b64decode(answer["patch"])) if answer.get("patch") else []
        vmi = apply_patch(vmi, patch)
        made = await self.client.create(VMIS, ns, vmi)
        node = (made.get("spec") or {}).get("nodeSelector", {}).get("kubernetes.io/hostname")
        uid = made["metadata"]["uid"]
        claims = self.client.objects.get(RESOURCE_CLAIMS.plural, {})
        for (cns, cname), claim in list(claims.items()):
            if cns != ns or not cname.startswith(name) or claim.get("status"):
                continue
            results = [{"request": r["name"], "driver": "gpu.nvidia.com", "pool": node,
                        "device": self._recorded(ns, name, k)}
                       for k, r in enumerate(claim["spec"]["devices"]["requests"])]
            await self.client.patch_status(RESOURCE_CLAIMS, ns, cname, {"status": {
                "allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": f"virt-launcher-{name}"}]}})
        pods = Resource("", "v1", "pods", "Pod")
        await self.client.create(pods, ns, {
            "metadata": {"name": f"virt-launcher-{name}-abcde", "labels": {
                "kubevirt.io": "virt-launcher", "kubevirt.io/created-by": uid}},
            "spec": {"nodeName": node, "containers": [{"resources": {}}]},
            "status": {"phase": "Running"}})
        await self.client.patch_status(VMIS, ns, name, {"status": {"phase": "Running",
                                                                   "nodeName": node}})

    def _recorded(self, ns: str, vmi: str, k: int) -> str | None:
        """The GPU the set's k-th template device records (the claim's k-th request's)."""
        from k8s.client import GPU_DEVICES
        from model.admission import template_name

        dev = self.client.objects[GPU_DEVICES.plural].get((ns, template_name(vmi, self.class_name, k)))
        rec = ((dev or {}).get("status") or {}).get("device") or {}
        return rec.get("device")


def measure(nodes: int, mode: str, sets: int, samples: int, settle: float,
            profile: cProfile.Profile | None = None,
            on_measure: Callable[[], None] | None = None, vms: bool = True) -> dict:
    """One size and fill: the population's counts and the samples' medians (module doc);
    `on_measure` is called before the first measured sample; `vms` False: the running VMIs
    are bare (no VirtualMachine)."""
    t0 = time.perf_counter()
    rep = Replica(nodes, mode, sets, vms=vms)
    rep.on_measure = on_measure
    built = round(time.perf_counter() - t0, 1)
    heap = settle_heap()  # as the controller does once its cache has synced
    try:
        got = anyio.run(rep.run, samples, settle, profile)
    finally:
        restore_heap(heap)
    allowed = [s for s in got if s["allowed"]]
    return {"nodes": nodes, "mode": mode, "sets": sets, **rep.counts,
            "records": sum(1 for o in rep.world.cache.devices.items()
                           if (o.get("status") or {}).get("device")),
            "build_s": built, "samples": len(got), "admitted": len(allowed),
            "answer_ms_p50": round(statistics.median(s["answer_ms"] for s in got), 3),
            "cpu_ms_p50": round(statistics.median(s["cpu_ms"] for s in got), 3),
            "cpu_ms_mean": round(statistics.fmean(s["cpu_ms"] for s in got), 3),
            "decisions": int(rep.measured_decisions[0]),
            "decision_ms_mean": round(1e3 * rep.measured_decisions[1] / rep.measured_decisions[0], 3)
            if rep.measured_decisions[0] else None,
            "calls": {f"{m} {p}": n for (m, p), n in sorted(rep.calls.items())}}


_DEVNULL = None


def _quiet() -> None:
    from actors.logging import configure_logging

    global _DEVNULL
    if _DEVNULL is None:
        _DEVNULL = open(os.devnull, "w")  # noqa: SIM115 - kept open for the process
    configure_logging(stream=_DEVNULL, level=20)


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", default="100,1000", help="fleet sizes, comma-separated, each at "
                    "least 1 (default: %(default)s)")
    ap.add_argument("--sets", default="0,600", help="running VMIs populated at each size, "
                    "comma-separated (default: %(default)s)")
    ap.add_argument("--modes", default="device,count", help="count and/or device, "
                    "comma-separated (default: %(default)s)")
    ap.add_argument("--samples", type=at_least(1), default=30, help="quiet admissions per point "
                    "(default: %(default)s)")
    ap.add_argument("--settle", type=finite_at_least(0), default=SETTLE, help="seconds after "
                    "each sample (default: %(default)s)")
    ap.add_argument("--bare", action="store_true", help="the running VMIs have no "
                    "VirtualMachine (as bench scale and bench floor make them)")
    ap.add_argument("--profile", type=at_least(0), default=0, help="cProfile the N-th point "
                    "(1-based; 0: none)")
    ap.add_argument("--profile-out", type=file_path, default=Path("admission_path.prof"),
                    help="where --profile's stats go (default: %(default)s)")
    ap.add_argument("--out", type=file_path, help="also write the figures to this JSON file")


def _run(args: argparse.Namespace) -> int:
    # every value checked before the first point is built (BadArgs: one line, exit 2)
    point_modes = modes(args.modes)
    sizes = ints_at_least(args.nodes, "--nodes", 1)
    fills = ints_at_least(args.sets, "--sets", 0)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    _quiet()
    rows = []
    n = 0
    for mode in point_modes:
        for nodes in sizes:
            for sets in fills:
                n += 1
                prof = cProfile.Profile() if args.profile == n else None
                row = measure(nodes, mode, sets, args.samples, args.settle, prof, vms=not args.bare)
                row["bare"] = args.bare
                row["load_after"] = [round(x, 2) for x in os.getloadavg()]
                rows.append(row)
                print(f"{mode:6s} {nodes:5d} nodes, {row['gpudevices']} GPUDevices, "
                      f"{row['records']} records, {row['claims']} claims: answer p50 "
                      f"{row['answer_ms_p50']} ms, CPU p50 {row['cpu_ms_p50']} ms "
                      f"(mean {row['cpu_ms_mean']}), decision mean {row['decision_ms_mean']} ms, "
                      f"{row['admitted']}/{row['samples']} admitted, "
                      f"load {row['load_after']}", flush=True)
                if prof is not None:
                    prof.dump_stats(str(args.profile_out))
                    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    rows_report("admission_path", started, load_before, rows, args.out)
    return 0


BENCHMARK = Benchmark("admission_path", "what one quiet admission costs the leader replica, "
                                        "by fleet size and fill (no API server)", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
