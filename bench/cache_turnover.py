"""A young follower's RSS while the soak's churn turns its informer cache over (issue 41
item 5), in one process, no cluster: the real `k8s.cache.ClusterCache` (its informers'
list path, their ingest transforms, the watch's orjson decode, the listeners that build the
view's model values), fed a count-mode soak population (1,000 nodes: 8,000 GPUDevices,
2,000 VMIs and their launcher Pods) and then the soak's churn, with the metrics scrape's
fleet figures (`model.explain.top` in a fresh worker thread, as anyio runs it once its idle
worker expired) every 10 simulated seconds.

Run `python -m bench.cache_turnover [--nodes 1000] [--minutes 24] [--trim-every S]
[--hold S] [--bursts N] [--conns N] [--no-freeze] [--unfreeze-below N] [--relist-at S]
[--no-scrape] [--trace] [--out FILE]`, and under `MALLOC_ARENA_MAX=2`,
`MALLOC_MMAP_THRESHOLD_=131072` or `PYTHONMALLOC=malloc` in its environment to try those.
Not a test; seeded. Simulated time: each simulated second brings `--rate` VMI creates and
as many deletes (each VMI with its launcher Pod and its held GPUDevices: ADDED, a few
MODIFIED, DELETED) and `--admissions` webhook reviews, as fast as the CPU goes (30 simulated
minutes: about 17 s of CPU). `--hold` keeps each review with the snapshot it read for that
long, `--bursts` adds bursts of admissions, and `--conns` models TLS connections as the
allocator sees them (16 held for the watches, more opened in the bursts and closed within a
minute). Every simulated minute, after a full collection, it records VmRSS, pymalloc's
arenas (`sys._debugmallocstats`), glibc's heap (`mallinfo2`: in use, free inside it,
mmapped), the objects the garbage collector tracks and has frozen, and where the resident
memory lives (`parts`: `actors.heap.heap_parts`, the replica's `gpu_binder_heap_bytes`, MiB).

What it showed on 2026-12-07 (30 simulated minutes, `bench-results/cache-turnover*.json`):
the cache turning over alone adds ~3 MiB of live data in its first pass (pymalloc's arenas
107 -> 108: freed start-up objects' blocks are reused, so arenas pinned by the frozen start-up
heap explain about 1 MiB, not the soak's 12), and leaves ~20 MiB free but resident inside
glibc's heap from the list. With bursts of connections and admissions RSS steps up at each
burst and never comes back (166.6 -> 178.5 MiB, seed 2), as the soak's follower did; with
`malloc_trim(0)` every 60 s it comes back after each (171.3 at the end; 30 trims, 5 ms of CPU
in all). `MALLOC_MMAP_THRESHOLD_=131072` does about as well; `MALLOC_ARENA_MAX=2`, no
`gc.freeze` (or unfreezing later), a relist after start-up and `PYTHONMALLOC=malloc` do not
help (`bench-results/cache-turnover-mitigations.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import orjson

from actors.heap import heap_parts, malloc_trimmer, restore_heap, settle_heap
from bench.common import at_least, commit, machine
from k8s.cache import ClusterCache
from k8s.informer import OrjsonWatch

H100, L40S = "h100.scale.example.com/gpu", "l40s.scale.example.com/gpu"
CLASSES = {"h100": H100, "l40s": L40S}
SIZES = [(1, 0.5), (2, 0.25), (4, 0.15), (8, 0.1)]
TENANTS = 20


def managed(n: int) -> list[dict]:
    """`n` managedFields entries as the API server adds them (every transform drops them)."""
    return [{"manager": f"mgr-{i}", "operation": "Update", "apiVersion": "v1",
             "time": "2026-12-07T02:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {".": {}, f"f:l{i}": {}}},
                          "f:status": {"f:conditions": {".": {}, 'k:{"type":"Ready"}': {}}}}}
            for i in range(n)]


class World:
    """The cluster's objects (raw, as the API server would send them) and a resourceVersion
    counter; the churn's events come from here."""

    def __init__(self, nodes: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rv = 1000
        self.objs: dict[str, dict[tuple[str, str], dict]] = {
            k: {} for k in ("nodes", "gpudevices", "virtualmachineinstances", "pods",
                            "namespaces", "gpuclasses", "resourcequotas", "priorityclasses")}
        self.vmis: dict[tuple[str, str], list[str]] = {}   # VMI -> its held devices
        self.serial = 0
        self.nodes = [f"soak-n{i:04d}" for i in range(nodes)]
        for i, n in enumerate(self.nodes):
            self.put("nodes", "node", n, i)
        for t in range(TENANTS):
            ns = f"soak-t{t:02d}"
            self.put("namespaces", "namespace", ns)
            self.put("resourcequotas", "quota", ns)
        for name in CLASSES:
            self.put("gpuclasses", "gpu_class", name)
        # the held devices (those of the VMIs) and idle ones: nodes x 8 in all
        for _ in range(2 * nodes):   # the soak's 2,000 VMIs at 1,000 nodes
            self.new_vmi(events=None)
        for k in range(max(0, nodes * 8 - sum(len(d) for d in self.vmis.values()))):
            ns = f"soak-t{k % TENANTS:02d}"
            cls = list(CLASSES)[k % 2]
            self.put("gpudevices", "device", ns, f"soak-idle{k:05d}", cls, None, None)

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def put(self, kind: str, build: str, *args) -> dict:
        """Store how to build an object (`build` method, args, a new resourceVersion) and
        return it built: the world's own objects stay out of the heap's figures (a dict or
        the JSON bytes per object would double or blur them)."""
        rv = self.next_rv()
        obj = self.build((build, args, rv))
        m = obj["metadata"]
        self.objs[kind][(m.get("namespace") or "", m["name"])] = (build, args, rv)
        return obj

    def build(self, stored: tuple) -> dict:
        build, args, rv = stored
        obj = getattr(self, build)(*args)
        obj["metadata"]["resourceVersion"] = rv
        obj["metadata"]["creationTimestamp"] = "2026-12-07T02:00:00Z"
        return obj

    @staticmethod
    def namespace(ns: str) -> dict:
        return {"metadata": {"name": ns, "uid": f"ns-{ns}", "labels": {
            "kubernetes.io/metadata.name": ns}, "managedFields": managed(1)},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    @staticmethod
    def quota(ns: str) -> dict:
        return {"metadata": {"name": "gpu", "namespace": ns, "uid": f"q-{ns}"},
                "spec": {"hard": {f"requests.{H100}": "200", f"requests.{L40S}": "200"}}}

    @staticmethod
    def gpu_class(name: str) -> dict:
        return {"metadata": {"name": name, "uid": f"c-{name}"},
                "spec": {"resourceName": CLASSES[name]}}

    def node(self, name: str, i: int) -> dict:
        cls, res = list(CLASSES.items())[i % 2]
        labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                  "kubernetes.io/os": "linux", "kubernetes.io/role": "agent",
                  "node-role.kubernetes.io/agent": "", "type": "kwok",
                  "kubevirt.io/schedulable": "true", "scale-bench/model": cls}
        conds = [{"type": t, "status": "False" if t != "Ready" else "True",
                  "lastHeartbeatTime": "2026-12-07T02:00:00Z",
                  "lastTransitionTime": "2026-12-07T02:00:00Z",
                  "reason": f"Kubelet{t}", "message": f"kubelet reports {t} for {name}"}
                 for t in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure",
                           "NetworkUnavailable")]
        alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti",
                 res: "8", "devices.kubevirt.io/kvm": "1k", "devices.kubevirt.io/tun": "1k"}
        return {"metadata": {"name": name, "uid": f"node-{i:08d}", "labels": labels,
                             "annotations": {"kwok.x-k8s.io/node": "fake",
                                             "node.alpha.kubernetes.io/ttl": "0",
                                             "kubevirt.io/heartbeat": "2026-12-07T02:00:00Z"},
                             "managedFields": managed(4)},
                "spec": {}, "status": {"allocatable": alloc, "capacity": dict(alloc),
                                       "conditions": conds,
                                       "addresses": [{"type": "InternalIP",
                                                      "address": f"10.0.{i // 250}.{i % 250}"}],
                                       "nodeInfo": {"architecture": "amd64",
                                                    "kubeletVersion": "fake",
                                                    "operatingSystem": "linux",
                                                    "machineID": f"{i:032x}"},
                                       "images": [{"names": [f"img-{j}"], "sizeBytes": j}
                                                  for j in range(5)]}}

    def device(self, ns: str, name: str, cls: str, vmi: str | None, node: str | None) -> dict:
        status: dict = {"phase": "Pending"}
        if vmi:
            status["attachedTo"] = {"vmi": vmi, "since": "2026-12-07T02:00:00Z",
                                    "admission": f"adm-{vmi}", "uid": f"uid-{vmi}"}
        if node:
            status.update(phase="Bound", nodeName=node, boundAt="2026-12-07T02:00:01Z")
        return {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
                "metadata": {"name": name, "namespace": ns, "uid": f"dev-{name}",
                             "generation": 1, "labels": {"soak/held": "1"},
                             "managedFields": managed(3)},
                "spec": {"class": cls}, "status": status}

    def vmi(self, ns: str, name: str, cls: str, size: int, phase: str, node: str | None) -> dict:
        res = CLASSES[cls]
        status: dict = {"phase": phase, "conditions": [
            {"type": t, "status": "True", "lastProbeTime": None,
             "lastTransitionTime": "2026-12-07T02:00:00Z"}
            for t in ("Ready", "LiveMigratable", "StorageLiveMigratable")],
            "guestOSInfo": {}, "qosClass": "Burstable", "launcherContainerImageVersion":
            "quay.io/kubevirt/virt-launcher:v1.4.0", "migrationMethod": "BlockMigration",
            "migrationTransport": "Unix", "currentCPUTopology": {"cores": 1, "sockets": 1,
                                                                 "threads": 1},
            "memory": {"guestAtBoot": "128Mi", "guestCurrent": "128Mi",
                       "guestRequested": "128Mi"},
            "volumeStatus": [{"name": "containerdisk", "target": ""}]}
        if node:
            status.update(nodeName=node, activePods={f"pod-{name}": node},
                          interfaces=[{"name": "default", "ipAddress": "10.244.0.1"}])
        return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                             "generation": 3, "finalizers": ["kubevirt.io/virtualMachineControllerFinalize",
                                                             "foregroundDeleteVirtualMachine"],
                             "labels": {"kubevirt.io/nodeName": node or "", "soak": "1"},
                             "annotations": {"gpu.cozystack.io/admission": f"adm-{name}",
                                             "gpu.cozystack.io/templates": f"{cls}={size}",
                                             "kubevirt.io/latest-observed-api-version": "v1",
                                             "kubevirt.io/storage-observed-api-version": "v1"},
                             "managedFields": managed(5)},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node} if node else {},
                         "domain": {"devices": {"gpus": [{"name": f"g{i}", "deviceName": res}
                                                         for i in range(size)],
                                                "disks": [{"name": "containerdisk",
                                                           "disk": {"bus": "virtio"}}],
                                                "interfaces": [{"name": "default",
                                                                "masquerade": {}}]},
                                    "resources": {"requests": {"memory": "128Mi"}},
                                    "machine": {"type": "q35"},
                                    "firmware": {"uuid": f"{hash(name) & 0xffffffff:032x}"},
                                    "features": {"acpi": {"enabled": True}}},
                         "volumes": [{"name": "containerdisk", "containerDisk": {
                             "image": "quay.io/kubevirt/cirros-container-disk-demo"}}],
                         "evictionStrategy": "None", "terminationGracePeriodSeconds": 0},
                "status": status}

    def pod(self, ns: str, vmi: str, cls: str, size: int, node: str, phase: str) -> dict:
        res = CLASSES[cls]
        env = [{"name": f"ENV_{i}", "value": f"value-{i}-{vmi}"} for i in range(8)]
        ctr = {"name": "compute", "image": "quay.io/kubevirt/virt-launcher:v1.4.0",
               "command": ["/usr/bin/virt-launcher-monitor", "--qemu-timeout", "259s",
                           "--name", vmi, "--uid", f"uid-{vmi}", "--namespace", ns],
               "env": env, "resources": {"limits": {res: str(size), "devices.kubevirt.io/kvm": "1"},
                                         "requests": {res: str(size), "cpu": "100m",
                                                      "memory": "294Mi"}},
               "volumeMounts": [{"name": f"v{i}", "mountPath": f"/var/run/v{i}"} for i in range(8)],
               "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"virt-launcher-{vmi}-abcde", "namespace": ns,
                             "uid": f"pod-{vmi}", "generateName": f"virt-launcher-{vmi}-",
                             "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by":
                                        f"uid-{vmi}", "vm.kubevirt.io/name": vmi},
                             "annotations": {"kubevirt.io/domain": vmi,
                                             "kubectl.kubernetes.io/default-container": "compute"},
                             "ownerReferences": [{"apiVersion": "kubevirt.io/v1",
                                                  "kind": "VirtualMachineInstance", "name": vmi,
                                                  "uid": f"uid-{vmi}", "controller": True}],
                             "managedFields": managed(4)},
                "spec": {"nodeName": node, "containers": [ctr], "volumes": [
                    {"name": f"v{i}", "emptyDir": {}} for i in range(8)],
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                     "effect": "NoExecute", "tolerationSeconds": 300}]},
                "status": {"phase": phase, "qosClass": "Burstable", "podIP": "10.244.0.1",
                           "conditions": [{"type": t, "status": "True",
                                           "lastTransitionTime": "2026-12-07T02:00:00Z"}
                                          for t in ("Initialized", "Ready", "ContainersReady",
                                                    "PodScheduled")],
                           "containerStatuses": [{"name": "compute", "ready": True,
                                                  "restartCount": 0, "image": ctr["image"],
                                                  "state": {"running": {"startedAt":
                                                                        "2026-12-07T02:00:00Z"}}}]}}

    def new_vmi(self, events: list | None, like: tuple[str, str, int] | None = None) -> None:
        """One VMI (its held devices, its Pod): created, admitted, scheduled, running; its
        events appended to `events` (None: population, no events). `like`: its (namespace,
        class, size), else drawn; the node is drawn either way."""
        r = self.rng
        self.serial += 1
        if like is None:
            ns = f"soak-t{r.randrange(TENANTS):02d}"
            cls = r.choice(list(CLASSES))
            size = r.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0]
        else:
            ns, cls, size = like
        name = f"soak-vm{self.serial:05d}"
        node = r.choice(self.nodes)
        devs = [f"{name}-{cls}-{i}" for i in range(size)]
        self.vmis[(ns, name)] = devs

        def emit(kind: str, t: str, build: str, *args) -> None:
            o = self.put(kind, build, *args)
            if events is not None:
                events.append((kind, orjson.dumps({"type": t, "object": o})))
        for d in devs:
            emit("gpudevices", "ADDED", "device", ns, d, cls, None, None)
        for d in devs:
            emit("gpudevices", "MODIFIED", "device", ns, d, cls, name, None)
        emit("virtualmachineinstances", "ADDED", "vmi", ns, name, cls, size, "Pending", None)
        for d in devs:
            emit("gpudevices", "MODIFIED", "device", ns, d, cls, name, node)
        emit("pods", "ADDED", "pod", ns, name, cls, size, node, "Pending")
        for ph in ("Scheduling", "Scheduled"):
            emit("virtualmachineinstances", "MODIFIED", "vmi", ns, name, cls, size, ph, node)
        for _ in range(3):
            emit("pods", "MODIFIED", "pod", ns, name, cls, size, node, "Running")
        for _ in range(2):
            emit("virtualmachineinstances", "MODIFIED", "vmi", ns, name, cls, size, "Running", node)

    def delete_vmi(self, events: list, key: tuple[str, str] | None = None) -> None:
        """VMI `key` (None: a random one), its Pod and its held devices go."""
        key = self.rng.choice(list(self.vmis)) if key is None else key
        devs = self.vmis.pop(key)
        ns, name = key
        vmi = self.build(self.objs["virtualmachineinstances"].pop(key))
        pod_key = (ns, f"virt-launcher-{name}-abcde")
        pod = self.objs["pods"].pop(pod_key, None)
        pod = None if pod is None else self.build(pod)
        vmi["metadata"]["resourceVersion"] = self.next_rv()
        events.append(("virtualmachineinstances", orjson.dumps({"type": "DELETED", "object": vmi})))
        if pod is not None:
            pod["metadata"]["resourceVersion"] = self.next_rv()
            events.append(("pods", orjson.dumps({"type": "DELETED", "object": pod})))
        for d in devs:
            dev = self.build(self.objs["gpudevices"].pop((ns, d)))
            dev["metadata"]["resourceVersion"] = self.next_rv()
            events.append(("gpudevices", orjson.dumps({"type": "DELETED", "object": dev})))

    def page(self, kind: str, limit: int, first: int) -> bytes:
        """The list of `kind` from item `first` on, as the API server pages it (JSON)."""
        stored = list(self.objs[kind].values())[first:first + limit + 1]
        more = len(stored) > limit
        return orjson.dumps({"metadata": {"resourceVersion": str(self.rv),
                                          "continue": f"c{first + limit}" if more else None},
                             "items": [self.build(x) for x in stored[:limit]]})


class _Resp:
    """What `k8s.errors.read_json` reads of a raw response."""
    status, reason, headers = 200, "OK", {}

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        return None


def lister(world: World, kind: str):
    """A kubernetes_asyncio list call over `world`'s `kind`, pages and continue tokens."""
    async def list_fn(*, limit: int, _continue: str | None = None, **_: object) -> _Resp:
        return _Resp(world.page(kind, limit, 0 if _continue is None else int(_continue[1:])))
    return list_fn


INFORMERS = {"nodes": "nodes", "gpudevices": "devices", "virtualmachineinstances": "vmis",
             "pods": "pods", "namespaces": "namespaces", "gpuclasses": "classes",
             "resourcequotas": "quotas", "priorityclasses": "priority_classes"}


def relist(cache: ClusterCache, world: World) -> None:
    """Every informer lists `world` through its own list path (`Informer._list`)."""
    async def go() -> None:
        for kind, attr in INFORMERS.items():
            inf = getattr(cache, attr)
            inf._list_fn = lister(world, kind)
            inf.resource_version = await inf._list()
    asyncio.run(go())


# -- measuring ----------------------------------------------------------------------------

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = _MallInfo2


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pymalloc() -> dict:
    """pymalloc's arenas now and at most, and the bytes in its allocated and free blocks
    (from `sys._debugmallocstats`, which prints to the C stderr); {} under PYTHONMALLOC=malloc."""
    with tempfile.TemporaryFile("w+") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    out = {}
    for key, pat in (("arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
                     ("arenas_max", r"# arenas highwater mark\s*=\s*([\d,]+)"),
                     ("used_mib", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
                     ("free_blocks_mib", r"# bytes in available blocks\s*=\s*([\d,]+)"),
                     ("free_pools", r"# unused pools\s*=\s*([\d,]+)")):
        m = re.search(pat, text)
        if m:
            v = int(m.group(1).replace(",", ""))
            out[key] = round(v / 2**20, 2) if key.endswith("_mib") else v
    return out


def glibc() -> dict:
    """glibc's heap (`mallinfo2`), MiB: in use, free inside its arenas, mmapped chunks."""
    m = LIBC.mallinfo2()
    return {"heap_mib": round(m.arena / 2**20, 2), "in_use_mib": round(m.uordblks / 2**20, 2),
            "free_mib": round(m.fordblks / 2**20, 2), "mmap_mib": round(m.hblkhd / 2**20, 2)}


def sample(t: float, cpu0: float, extra: dict) -> dict:
    gc.collect()   # garbage in cycles is not held (as `heap_report` does)
    parts = {k: v if k == "pymalloc_blocks" else round(v / 2**20, 2)
             for k, v in heap_parts().items()}
    return {"t_min": round(t / 60, 1), "rss_mib": round(rss_mib(), 1), "parts": parts,
            **pymalloc(), **glibc(),
            "gc_objects": len(gc.get_objects()), "gc_frozen": gc.get_freeze_count(),
            "cpu_s": round(time.process_time() - cpu0, 1), **extra}


def run(nodes: int, minutes: float, *, rate: float = 2.0, seed: int = 1,
        trim_every: float | None = None, freeze: bool = True, unfreeze_below: int | None = None,
        relist_at: float | None = None, scrape: bool = True, admissions: float = 1.5,
        hold: float = 0.0, bursts: int = 0, trace: bool = False, conns: int = 0) -> dict:
    """The figures (module docstring): {"listed": sample, "samples": [sample per simulated
    minute], "trims": count, "trim_cpu_s": seconds}."""
    from model.explain import top

    import k8s.cache as cache_module
    clock = [0.0]   # simulated seconds: the VMI tombstones' TTL runs on them
    real_time = cache_module.time
    cache_module.time = SimpleNamespace(monotonic=lambda: clock[0], time=time.time)
    trim = malloc_trimmer() if trim_every is not None else None
    if trim_every is not None and trim is None:
        raise SystemExit("--trim-every: this C library has no malloc_trim")
    if trace:
        tracemalloc.start(1)
    try:
        return _run(clock, nodes, minutes, rate, seed, trim_every, trim, freeze, unfreeze_below,
                    relist_at, scrape, admissions, hold, bursts, trace, conns, top)
    finally:
        cache_module.time = real_time
        if trace:
            tracemalloc.stop()


def _run(clock, nodes, minutes, rate, seed, trim_every, trim, freeze, unfreeze_below, relist_at,
         scrape, admissions, hold, bursts, trace, conns, top) -> dict:
    world = World(nodes, seed)
    cache = ClusterCache(object())
    cpu0 = time.process_time()
    relist(cache, world)
    thresholds = settle_heap() if freeze else None
    out: dict = {"listed": sample(0, cpu0, {}), "samples": [], "trims": 0, "trim_cpu_s": 0.0}
    first = tracemalloc.take_snapshot() if trace else None
    watch = OrjsonWatch(return_type="object")
    informers = {kind: getattr(cache, attr) for kind, attr in INFORMERS.items()}
    carry = 0.0
    trim_cpu = 0.0
    last_trim = 0.0
    unfrozen = False
    relisted = False
    rng = random.Random(seed + 1)
    total = int(minutes * 60)
    # bursts of admissions (the soak's follower: 85-96 a minute for a few minutes, 12-28
    # otherwise), each 120 s at 3x the rate, holding what they read 4x as long
    burst_at = sorted(rng.uniform(300, max(301, total - 120)) for _ in range(bursts))
    in_flight: list[tuple[float, object]] = []   # (until, what an admission holds)
    # TLS connections as the allocator sees them: asyncio's 256 KiB read buffer and
    # OpenSSL's record buffers (malloc'd, beyond pymalloc's 512 bytes); 16 for the watches,
    # and in a burst `conns` more, each closed after 15-60 s (the pool's idle expiry)
    def connection() -> tuple:
        return (bytearray(256 * 1024), bytearray(17 * 1024 + 320), bytearray(17 * 1024 + 320),
                bytearray(rng.randrange(2000, 40000)))
    watches = [connection() for _ in range(16)] if conns else []
    extra: list[tuple[float, tuple]] = []
    adm_carry = 0.0
    try:
        for second in range(1, int(minutes * 60) + 1):
            clock[0] = float(second)
            carry += rate
            events: list = []
            while carry >= 1:
                carry -= 1
                world.new_vmi(events)
                world.delete_vmi(events)
            for kind, line in events:
                ev = watch.unmarshal_event(line, None)
                informers[kind]._apply(ev["type"], ev["raw_object"])
            # the webhook's reviews: a VMI decoded; with `hold`, each admission keeps the
            # review and the snapshot it judged on while it waits for the binder
            burst = any(b <= second < b + 120 for b in burst_at)
            adm_carry += admissions * (3 if burst else 1)
            while adm_carry >= 1:
                adm_carry -= 1
                review = orjson.loads(orjson.dumps({"request": {"object": world.vmi(
                    "soak-t00", f"review-{second}", "h100", 2, "Pending", None)}}))
                if hold > 0:
                    span = hold * (4 if burst else 1) * rng.uniform(0.5, 1.5)
                    in_flight.append((second + span, (review, cache.view.snapshot())))
                del review
            in_flight = [x for x in in_flight if x[0] > second]
            if conns:
                if burst and rng.random() < conns / 60:
                    extra.append((second + rng.uniform(15, 60), connection()))
                elif rng.random() < 0.05:   # one now and then outside the bursts
                    extra.append((second + rng.uniform(15, 60), connection()))
                extra = [x for x in extra if x[0] > second]
            if scrape and second % 10 == 0:   # a scrape's fleet figures, in a worker thread
                snap, live = cache.view.snapshot().with_own_memo(), cache.vmi_keys()
                box: list = []
                th = threading.Thread(target=lambda: box.append(top(snap, live)))
                th.start()
                th.join()
                del snap, live, box
            if relist_at is not None and not relisted and second >= relist_at:
                relisted = True
                relist(cache, world)
            if (unfreeze_below is not None and not unfrozen
                    and gc.get_freeze_count() < unfreeze_below):
                unfrozen = True
                gc.unfreeze()
            if trim_every is not None and second - last_trim >= trim_every:
                last_trim = second
                c = time.process_time()
                trim()
                trim_cpu += time.process_time() - c
                out["trims"] += 1
            if second % 60 == 0:
                out["samples"].append(sample(second, cpu0, {"in_flight": len(in_flight), "burst": burst,
                                                            "connections": len(watches) + len(extra),
                                                            "devices": len(informers["gpudevices"]._cache),
                                                            "vmis": len(informers["virtualmachineinstances"]._cache),
                                                            "pods": len(informers["pods"]._cache)}))
        out["trim_cpu_s"] = round(trim_cpu, 3)
        if first is not None:
            del events, in_flight
            gc.collect()
            stats = tracemalloc.take_snapshot().compare_to(first, "lineno")
            out["traced_growth"] = [{"where": str(st.traceback), "kib": round(st.size_diff / 1024, 1),
                                     "blocks": st.count_diff} for st in stats[:20]]
            out["traced_total_kib"] = round(sum(st.size_diff for st in stats) / 1024, 1)
        return out
    finally:
        if thresholds is not None:
            restore_heap(thresholds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cache_turnover",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=at_least(1), default=1000)
    p.add_argument("--minutes", type=float, default=24.0, help="simulated minutes of churn")
    p.add_argument("--rate", type=float, default=2.0, help="VMI creates (and deletes) a second")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--trim-every", type=float, default=None,
                   help="malloc_trim(0) every this many simulated seconds")
    p.add_argument("--no-freeze", action="store_true", help="no gc.freeze after the list")
    p.add_argument("--unfreeze-below", type=int, default=None,
                   help="gc.unfreeze once fewer objects than this are frozen")
    p.add_argument("--relist-at", type=float, default=None,
                   help="every informer lists again at this simulated second")
    p.add_argument("--no-scrape", action="store_true", help="no fleet figures in a worker thread")
    p.add_argument("--admissions", type=float, default=1.5, help="webhook reviews a second")
    p.add_argument("--hold", type=float, default=0.0,
                   help="seconds an admission holds its review and snapshot (0: none)")
    p.add_argument("--bursts", type=int, default=0,
                   help="bursts of admissions (120 s, 3x the rate, 4x the hold), seeded times")
    p.add_argument("--conns", type=int, default=0,
                   help="model TLS connections: 16 held, and about this many opened a minute in a burst")
    p.add_argument("--trace", action="store_true",
                   help="tracemalloc: what grew from the list to the end, by line")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    load_before = list(os.getloadavg())
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    got = run(args.nodes, args.minutes, rate=args.rate, seed=args.seed, trim_every=args.trim_every,
              freeze=not args.no_freeze, unfreeze_below=args.unfreeze_below,
              relist_at=args.relist_at, scrape=not args.no_scrape, admissions=args.admissions,
              hold=args.hold, bursts=args.bursts, trace=args.trace, conns=args.conns)
    env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "PYTHONMALLOC"}
    report = {"benchmark": "cache_turnover", "commit": commit(), "machine": machine(),
              "started": started, "load_before": load_before, "load_after": list(os.getloadavg()),
              "args": {k: v for k, v in vars(args).items() if k != "out"}, "env": env, **got}
    for s in [got["listed"], *got["samples"]]:
        print(json.dumps(s))
    print(f"trims {got['trims']}, {got['trim_cpu_s']} s CPU")
    for g in got.get("traced_growth", []):
        print(f"{g['kib']:10.1f} KiB {g['blocks']:8d} blocks  {g['where']}")
    if "traced_total_kib" in got:
        print(f"traced growth in all: {got['traced_total_kib']} KiB")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
