"""What one housekeeping round costs the leader's event loop, by fleet size (issue 40 item 3:
nothing grows with the fleet).

Run `python -m bench.housekeeping_cost [--nodes 100,1000] [--modes count,device]
[--rounds 20] [--out FILE]`. Not a test, no API server. A `k8s.cache.ClusterCache` whose
informers never run gets, as its watches would deliver them, `bench scale`'s population at
each size: nodes × 8 GPUs (count mode: one count-mode GPUClass; device mode: NVIDIA's
DeviceClass, one HGX device-mode class and one `hgx-h100-8` ResourceSlice per node), 2 VMIs
per node of 1/2/4/8 GPUs (weights 8:4:2:1 as 0.5/0.25/0.15/0.10), a quarter on held devices
and the rest on template devices, each owned by a VirtualMachine (H4's informer has one per
VMI), every set Bound, attached and linked (its VMI's uid recorded on one device), in device
mode each device recording its GPU and each VMI with its ResourceClaim; then idle held
GPUDevices (Pending) up to one per GPU. Steady state: a round finds nothing to do.

A `k8s.housekeeping.Housekeeper` over that cache (API calls answered at once by
`fakes.kube_client.ScriptedClient`) runs `--rounds` rounds in each of three scenarios:
`quiet` (nothing changes between rounds: the periodic round), `churn` (before each round one
VMI and the GPUDevices of its set are delivered again with a new resourceVersion, as an
admission's writes are: the round a change kicks), and `sweep` (the rounds that judge the
whole fleet, however incremental the others are). Per scenario: the CPU time of a round
(`time.process_time`, ms: median and max) and the longest stretch the round held the event
loop without a checkpoint (a task beside it awaiting `anyio.sleep(0)` in a loop records the
longest gap between its turns, in the process's CPU time, ms: what the webhook and the
coordinator on the same loop wait, less what other processes take of the core). The
figures are CPU time on a shared machine: the report records `os.getloadavg()` before and
after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import anyio

from bench.common import Benchmark, rows_report

GPUS = 8
SIZES = ((1, 0.5), (2, 0.25), (4, 0.15), (8, 0.10))
TENANTS = 20
GRACE = timedelta(seconds=30)
LONG_AGO = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _ts(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class _World:
    """The population of one size and mode, delivered into `cache` (`_apply`, as a watch
    would), and the churn (`touch`)."""

    def __init__(self, nodes: int, mode: str, seed: int = 1, *, sets: int | None = None,
                 idle: bool = True, vm_templates: bool = False) -> None:
        from k8s.cache import ClusterCache
        from k8s.informer import Informer

        async def _never(**_):  # the informers never list: everything comes by `_apply`
            raise RuntimeError("no API server in this benchmark")

        self.mode = mode
        self.cache = ClusterCache(object())  # the API client is only stored
        self.vms = Informer("virtualmachines", _never)
        self.rv = 1
        self.churn = False
        self.vm_templates = vm_templates  # each VM's spec.template with the VMI's annotations
        self.raw_claims: dict[tuple[str, str], dict] = {}  # as made (the informer keeps less)
        self.sets: list[tuple[dict, list[dict], dict]] = []  # (VMI, its devices, its VM)
        rng = random.Random(seed)
        self._build(nodes, rng, 2 * nodes if sets is None else sets, idle)
        for inf in (*self.cache.informers, self.vms):
            inf._healthy = True
        self._settle()

    def _settle(self) -> None:
        """The settings ConfigMap (H3) and the class's conditions as housekeeping writes
        them, so that a round writes nothing."""
        from k8s.cache import SETTINGS_NAME
        from k8s.housekeeping.class_conditions import merged_conditions
        from k8s.housekeeping.settings import desired_settings
        from model.housekeeping import READY_CONDITION, ready_condition

        c = self.cache
        c.settings._apply("ADDED", {"metadata": {"name": SETTINGS_NAME, "resourceVersion": "1",
                                                 "namespace": c.settings_namespace},
                                    "data": desired_settings(c, "denied")})
        for raw in c.classes.items():
            cls = c.view.classes()[raw["metadata"]["name"]]
            conds, _ = merged_conditions([], {READY_CONDITION: ready_condition(cls).as_tuple()},
                                         1, _ts(LONG_AGO))
            c.classes._apply("MODIFIED", {**raw, "metadata": {**raw["metadata"], "resourceVersion": "2"},
                                          "status": {"conditions": conds}})

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _build(self, nodes: int, rng: random.Random, sets: int, idle: bool) -> None:
        from localcluster.dra_profiles import HGX_H100_8, device_class, gpu_uuid, resource_slice
        from localcluster.dra_world import HGX_CLASS
        from model.claim import ClaimMember, build_claim
        from model.device.dra import DeviceRef
        from model.parse import parse_gpu_class
        from model.types import ADMISSION_ANNOTATION, GROUP, TEMPLATE_FOR_LABEL, VERSION

        c = self.cache
        device = self.mode == "device"
        cls_name = "hgx" if device else "h100"
        res = "h100.scale.example.com/gpu"
        spec = HGX_CLASS.spec() if device else {"resourceName": res}
        raw_class = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUClass",
                     "metadata": {"name": cls_name, "generation": 1, "resourceVersion": "1"},
                     "spec": spec}
        if device:
            c.device_classes._apply("ADDED", {**device_class(), "metadata": {
                "name": device_class()["metadata"]["name"], "resourceVersion": "1"}})
        c.classes._apply("ADDED", raw_class)
        gpu_class = parse_gpu_class(raw_class)
        c.kubevirts._apply("ADDED", {"metadata": {"name": "kubevirt", "namespace": "kubevirt",
                                                  "resourceVersion": "1"},
                                     "spec": {"configuration": {"permittedHostDevices": {
                                         "pciHostDevices": [{"resourceName": res}]}}}})
        names = [f"n{i:04d}" for i in range(nodes)]
        for name in names:
            alloc = {"cpu": "64"} if device else {"cpu": "64", res: str(GPUS)}
            c.nodes._apply("ADDED", {"metadata": {"name": name, "resourceVersion": "1", "labels": {
                "kubevirt.io/schedulable": "true", "kubernetes.io/hostname": name}},
                "spec": {}, "status": {"allocatable": alloc,
                                       "conditions": [{"type": "Ready", "status": "True"}]}})
            if device:
                c.slices._apply("ADDED", {**resource_slice(name, HGX_H100_8),
                                          "metadata": {"name": f"{name}-gpu", "resourceVersion": "1"}})
        free = {n: list(range(GPUS)) for n in names}
        weights = [w for _, w in SIZES]
        made = 0
        node_i = 0
        for v in range(sets):
            size = rng.choices([s for s, _ in SIZES], weights)[0]
            while node_i < len(names) and len(free[names[node_i]]) < size:
                node_i += 1
            if node_i >= len(names):
                break
            node = names[node_i]
            picked, free[node] = free[node][:size], free[node][size:]
            ns = f"t{v % TENANTS:02d}"
            vmi, adm, uid, owner = f"vm-{v:05d}", f"adm-{v:05d}", f"uid-vmi-{v}", f"uid-vm-{v}"
            held = rng.random() < 0.25
            devs = []
            for j, index in enumerate(picked):
                dname = f"{vmi}-gpu-{j}" if not held else f"held-{v:05d}-{j}"
                att = {"vmi": vmi, "since": _ts(LONG_AGO), "admission": adm, "owner": owner}
                if j == 0:
                    att["uid"] = uid
                status = {"phase": "Bound", "nodeName": node, "boundAt": _ts(LONG_AGO),
                          "attachedTo": att,
                          "bindRequest": {"id": adm, "vmi": vmi, "devices": [
                              f"{vmi}-gpu-{k}" if not held else f"held-{v:05d}-{k}"
                              for k in range(size)],
                              "requestedAt": _ts(LONG_AGO), "result": "Succeeded", "node": node}}
                if device:
                    status["device"] = {"driver": "gpu.nvidia.com", "pool": node,
                                        "device": f"gpu-vfio-{index}"}
                labels = {} if held else {TEMPLATE_FOR_LABEL: vmi}
                devs.append({"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                             "metadata": {"name": dname, "namespace": ns, "uid": f"uid-{ns}-{dname}",
                                          "resourceVersion": "1", "labels": labels,
                                          "creationTimestamp": _ts(LONG_AGO)},
                             "spec": {"class": cls_name}, "status": status})
            raw_vmi = {"metadata": {"name": vmi, "namespace": ns, "uid": uid, "resourceVersion": "1",
                                    "annotations": {ADMISSION_ANNOTATION: adm}},
                       "spec": {"nodeSelector": {"kubernetes.io/hostname": node}},
                       "status": {"phase": "Running", "nodeName": node}}
            raw_vm = {"metadata": {"name": vmi, "namespace": ns, "uid": owner, "resourceVersion": "1"},
                      "spec": {"runStrategy": "Always"}, "status": {"ready": True}}
            if self.vm_templates:  # as bench scale makes them: the VMI's annotations, a domain
                ann = ({"gpu.cozystack.io/devices": ",".join(d["metadata"]["name"] for d in devs)}
                       if held else {"gpu.cozystack.io/templates": f"{cls_name}={size}"})
                raw_vm["spec"]["template"] = {"metadata": {"annotations": ann}, "spec": {
                    "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                               "resources": {"requests": {"memory": "1Gi"}}},
                    "volumes": [{"name": "root", "containerDisk": {"image": "quay.io/x/y:1"}}]}}
            for d in devs:
                c.devices._apply("ADDED", d)
            c.vmis._apply("ADDED", raw_vmi)
            self.vms._apply("ADDED", raw_vm)
            if device:
                members = [ClaimMember(d["metadata"]["name"], gpu_class,
                                       DeviceRef("gpu.nvidia.com", node, d["status"]["device"]["device"]),
                                       gpu_uuid(HGX_H100_8, int(d["status"]["device"]["device"].rsplit("-", 1)[1])))
                           for d in devs]
                claim = build_claim(ns, vmi, members, adm, LONG_AGO)
                claim["metadata"].update(uid=f"uid-claim-{v}", resourceVersion="1")
                claim["status"] = {"allocation": {"devices": {"results": [
                    {"request": f"gpu-{k}", "driver": "gpu.nvidia.com", "pool": node,
                     "device": m.ref.device} for k, m in enumerate(members)]}},
                    "reservedFor": [{"resource": "pods", "name": f"virt-launcher-{vmi}"}]}
                c.claims._apply("ADDED", claim)
                self.raw_claims[(ns, claim["metadata"]["name"])] = claim
            self.sets.append((raw_vmi, devs, raw_vm))
            made += len(devs)
        i = 0
        while idle and made < nodes * GPUS:  # idle held devices, never attached (Pending)
            ns = f"t{i % TENANTS:02d}"
            c.devices._apply("ADDED", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                "metadata": {"name": f"idle-{i:05d}", "namespace": ns, "uid": f"uid-idle-{i}",
                             "resourceVersion": "1", "labels": {},
                             "creationTimestamp": _ts(LONG_AGO)},
                "spec": {"class": cls_name}, "status": {"phase": "Pending"}})
            made += 1
            i += 1

    def touch(self, rng: random.Random) -> None:
        """One set's VMI and devices delivered again with a new resourceVersion (what an
        admission's writes look like to the cache; the content is the same)."""
        vmi, devs, _ = rng.choice(self.sets)
        for d in devs:
            d["metadata"]["resourceVersion"] = self._next_rv()
            self.cache.devices._apply("MODIFIED", d)
        vmi["metadata"]["resourceVersion"] = self._next_rv()
        self.cache.vmis._apply("MODIFIED", vmi)

    @property
    def counts(self) -> dict[str, int]:
        c = self.cache
        return {"gpudevices": len(c.devices.keys()), "vmis": len(c.vmis.keys()),
                "vms": len(self.vms.keys()), "claims": len(c.claims.keys())}


async def _measure(world: _World, rounds: int, sweep: bool = False) -> dict[str, list[float]]:
    """CPU ms and longest loop stretch ms of each of `rounds` rounds (see the module); with
    `sweep`, each round is one that judges the whole fleet (`Housekeeper.round(full=True)`
    when the keeper has it, else an ordinary round)."""
    from fakes.kube_client import ScriptedClient
    from k8s.housekeeping import Housekeeper

    keeper = Housekeeper(ScriptedClient(), world.cache, grace=GRACE, raw_policy="denied",
                         answer_window=timedelta(seconds=10), vms=world.vms)
    full = sweep and "full" in Housekeeper.round.__code__.co_varnames
    rng = random.Random(7)
    listening = getattr(keeper, "listening", contextlib.nullcontext)  # as `Housekeeper.run`
    with listening():
        await keeper.round()  # the first round of a leader: judged whole, whatever follows
        return await _rounds(keeper, world, rounds, sweep, full, rng)


async def _rounds(keeper, world: _World, rounds: int, sweep: bool, full: bool,
                  rng: random.Random) -> dict[str, list[float]]:
    cpu: list[float] = []
    stretch: list[float] = []
    for _ in range(rounds):
        if world.churn:
            world.touch(rng)
        longest = 0.0
        done = False

        async def ticker() -> None:
            nonlocal longest
            last = time.process_time()
            while not done:
                await anyio.sleep(0)
                now = time.process_time()
                longest = max(longest, now - last)
                last = now

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(0)
            t0 = time.process_time()
            if full:
                await keeper.round(full=True)
            else:
                await keeper.round()
            cpu.append((time.process_time() - t0) * 1000)
            done = True
        stretch.append(longest * 1000)
    return {"cpu_ms": cpu, "stretch_ms": stretch}


def _summary(got: dict[str, list[float]]) -> dict:
    return {"cpu_ms_median": round(statistics.median(got["cpu_ms"]), 2),
            "cpu_ms_max": round(max(got["cpu_ms"]), 2),
            "longest_stretch_ms": round(max(got["stretch_ms"]), 2)}


_DEVNULL = None


def _quiet() -> None:
    """The binder's log lines below ERROR discarded (a round logs nothing in steady state)."""
    from actors.logging import configure_logging

    global _DEVNULL
    if _DEVNULL is None:
        _DEVNULL = open(os.devnull, "w")  # noqa: SIM115 - kept open for the process
    configure_logging(stream=_DEVNULL, level=40)


def measure(nodes: int, mode: str, rounds: int = 20) -> dict:
    """The figures of one size and mode (module docstring): the population's counts and,
    per scenario (`quiet`, `churn`, `sweep`), the round's CPU ms (median, max) and the
    longest stretch on the loop (ms)."""
    t0 = time.perf_counter()
    world = _World(nodes, mode)
    built_s = round(time.perf_counter() - t0, 1)
    out: dict = {"nodes": nodes, "mode": mode, **world.counts, "build_s": built_s}
    for scenario in ("quiet", "churn", "sweep"):
        world.churn = scenario == "churn"
        got = anyio.run(_measure, world, rounds, scenario == "sweep")
        out[scenario] = _summary(got)
    return out


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", default="100,1000",
                    help="fleet sizes, comma-separated node counts (default: %(default)s)")
    ap.add_argument("--modes", default="count,device",
                    help="count, device or both, comma-separated (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=20,
                    help="rounds measured per scenario (default: %(default)s)")
    ap.add_argument("--out", type=Path, help="also write the figures to this JSON file "
                    "(default: none)")


def _run(args: argparse.Namespace) -> int:
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    _quiet()
    rows = []
    for mode in args.modes.split(","):
        for n in (int(x) for x in args.nodes.split(",")):
            row = measure(n, mode, args.rounds)
            rows.append(row)
            print(f"{mode:6s} {n:5d} nodes ({row['gpudevices']} GPUDevices, {row['vmis']} VMIs, "
                  f"{row['claims']} claims): " + " · ".join(
                      f"{s} {row[s]['cpu_ms_median']} ms CPU (max {row[s]['cpu_ms_max']}), "
                      f"longest stretch {row[s]['longest_stretch_ms']} ms"
                      for s in ("quiet", "churn", "sweep")), flush=True)
    rows_report("housekeeping_cost", started, load_before, rows, args.out)
    return 0


BENCHMARK = Benchmark("housekeeping_cost", "what one housekeeping round costs the event loop, "
                                           "by fleet size (no API server)", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
