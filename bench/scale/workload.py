"""The scale benchmark's workload: the population to build (`ScaleSpec`, its VMIs
`plan_vmis`, its problem nodes `problem_nodes`), what became of each VMI (`VmiRecord`) and of
the population (`Population`), and how many samples each measurement takes (`Plan`). Pure."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, field

from bench.common import percentile

TAINT = {"key": "gpu.example.com/reserved", "value": "team-x", "effect": "NoSchedule"}
"""The taint of the spec's tainted nodes (no VMI here tolerates it)."""


@dataclass(frozen=True)
class ScaleSpec:
    """What `populate` builds.

    - `nodes` KWOK nodes of `gpus_per_node` GPUs, alternating between the `models`
      ((short name, extended resource) pairs; one GPUClass per model, named
      `<prefix><short>`); of them `cordoned`, `tainted` (TAINT, NoSchedule) and `not_ready`
      (Ready=False, not KWOK-managed) nodes, disjoint, spread over the fleet;
    - `tenants` tenant namespaces `<prefix>t<k>` (no budget quota);
    - `vmis` VMIs, round-robin over the tenants, of sizes drawn (seeded by `seed`) from
      `sizes` ((GPU count, weight) pairs) and a class drawn uniformly from the models; a share
      `held_share` of them asks for held devices (`gpu.cozystack.io/devices`, devices created
      first by the tenant), the rest for template devices (`gpu.cozystack.io/templates`);
    - then held, never attached GPUDevices (Pending) until the tenants' namespaces hold
      `devices` GPUDevices in all (None: `nodes * gpus_per_node`), none if already past;
    - `concurrency`: writes in flight at once (one anyio.Semaphore for every create);
      `vmi_timeout`: seconds an admitted VMI's launcher Pod has to be bound (from its
      admission: on 2 cores the launcher Pods lag the admissions by minutes at 1,000 nodes).

    - `mode` "device" (issue 32, docs/contract.md §3b): every node is instead an HGX H100 board
      publishing its ResourceSlice (`localcluster.dra_world.dra_node`) and the one GPUClass
      `<prefix>hgx` is in device mode (`HGX_CLASS`'s spec: whole Fabric Manager partitions);
      `models` is then unused. The cluster needs NVIDIA's DeviceClass and KubeVirt with
      `GPUsWithDRA` (`LocalCluster(dra=True)`).

    Defaults are issue 22's 1,000-node cluster; `scaled(n)` keeps the proportions at n nodes.
    """

    nodes: int = 1000
    gpus_per_node: int = 8
    models: tuple[tuple[str, str], ...] = (("h100", "h100.scale.example.com/gpu"),
                                           ("l40s", "l40s.scale.example.com/gpu"))
    cordoned: int = 10
    tainted: int = 10
    not_ready: int = 10
    vmis: int = 2000
    tenants: int = 20
    sizes: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.25), (4, 0.15), (8, 0.10))
    held_share: float = 0.25
    devices: int | None = None
    concurrency: int = 24
    vmi_timeout: float = 600.0
    prefix: str = "sc-"
    seed: int = 1
    mode: str = "count"

    def scaled(self, nodes: int, **changes) -> ScaleSpec:
        """This spec at `nodes` nodes: VMIs, cordoned/tainted/not-Ready counts and devices in
        the same proportion (at least 1 of each problem node, 1 VMI), then `changes`."""
        from dataclasses import replace

        f = nodes / self.nodes
        kw = {"nodes": nodes, "vmis": max(1, round(self.vmis * f)),
              "cordoned": max(1, round(self.cordoned * f)) if self.cordoned else 0,
              "tainted": max(1, round(self.tainted * f)) if self.tainted else 0,
              "not_ready": max(1, round(self.not_ready * f)) if self.not_ready else 0,
              "devices": None if self.devices is None else round(self.devices * f)}
        return replace(self, **{**kw, **changes})

    @property
    def classes(self) -> dict[str, str]:
        """GPUClass name -> extended resource name (device mode: the one class -> its DRA
        resource key, `model.types.dra_resource_name`)."""
        if self.mode == "device":
            from localcluster.dra_profiles import DEVICE_CLASS
            from model.types import dra_resource_name

            return {f"{self.prefix}hgx": dra_resource_name(DEVICE_CLASS)}
        return {f"{self.prefix}{short}": res for short, res in self.models}


@dataclass
class VmiRecord:
    """One VMI `populate` (or a measurement) asked for and what became of it."""

    namespace: str
    name: str
    cls: str
    size: int
    held: tuple[str, ...] = ()
    """The held GPUDevices it names (empty: template devices)."""
    admitted: bool = False
    refusal: str = ""
    """The API's message when not admitted."""
    uid: str = ""
    pin: str = ""
    """The node the webhook pinned it to (spec.nodeSelector kubernetes.io/hostname)."""
    node: str = ""
    """The node kube-scheduler bound its launcher Pod to ("" until bound)."""
    admit_ms: float = 0.0
    """Create call to answer, ms (webhooks of ours and virt-api's in the path)."""
    bound_lag_s: float | None = None
    """Seconds from the admission's answer to the launcher Pod seen bound (populate only)."""


@dataclass
class Population:
    """What `populate` made: `nodes` (name -> class), the problem nodes, `tenants`, every VMI
    (`vmis`, admitted or not), `held_idle` (held GPUDevices never attached, (namespace, name)),
    `seconds` per phase (nodes, devices, vmis, total; wall clock), `counts` (retries,
    refusals, launcher Pods not bound in time), and `writes` (kube-apiserver write requests
    per resource during `populate`, from its /metrics) and `cpu_s` (CPU seconds each process
    of the cluster spent during `populate`)."""

    spec: ScaleSpec
    nodes: dict[str, str] = field(default_factory=dict)
    cordoned: list[str] = field(default_factory=list)
    tainted: list[str] = field(default_factory=list)
    not_ready: list[str] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    vmis: list[VmiRecord] = field(default_factory=list)
    held_idle: list[tuple[str, str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    writes: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def admitted(self) -> list[VmiRecord]:
        """The VMIs admitted, in the order asked."""
        return [v for v in self.vmis if v.admitted]

    @property
    def devices(self) -> int:
        """GPUDevices made: the admitted VMIs' devices and the idle held ones."""
        return sum(v.size for v in self.vmis if v.admitted or v.held) + len(self.held_idle)

    def summary(self) -> dict:
        """JSON-ready figures (no per-VMI list): counts, phase seconds, writes, CPU."""
        adm = self.admitted
        return {"spec": {**asdict(self.spec), "models": [list(m) for m in self.spec.models],
                         "sizes": [list(s) for s in self.spec.sizes]},
                "nodes": len(self.nodes), "cordoned": len(self.cordoned),
                "tainted": len(self.tainted), "not_ready": len(self.not_ready),
                "tenants": len(self.tenants), "vmis_asked": len(self.vmis),
                "vmis_admitted": len(adm),
                "vmis_running": sum(1 for v in adm if v.node and v.node == v.pin),
                "gpus_in_use": sum(v.size for v in adm), "gpudevices": self.devices,
                "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
                "vmis_per_s": round(len(adm) / self.seconds["vmis"], 2)
                if self.seconds.get("vmis") else None,
                "launcher_bound_lag_s": {
                    p: percentile([v.bound_lag_s for v in adm if v.bound_lag_s is not None], q)
                    for p, q in (("p50", 50), ("p99", 99), ("max", 100))},
                "counts": dict(self.counts), "apiserver_writes": self.writes,
                "cpu_seconds": {k: round(v, 1) for k, v in self.cpu_s.items()}}


def plan_vmis(spec: ScaleSpec, tenants: list[str]) -> list[VmiRecord]:
    """The spec's VMIs, deterministic in `spec.seed`: round-robin tenants, seeded sizes and
    classes, the held ones naming devices `<vmi>-h<k>`; larger sets first (a fleet filled
    small-first may leave no empty node for the 8-GPU sets it still has to place)."""
    rng = random.Random(spec.seed)
    sizes, weights = zip(*spec.sizes)
    classes = list(spec.classes)
    out = []
    for i in range(spec.vmis):
        size = rng.choices(sizes, weights)[0]
        cls = rng.choice(classes)
        ns = tenants[i % len(tenants)]
        name = f"{spec.prefix}vm{i:05d}"
        held = tuple(f"{name}-h{k}" for k in range(size)) if rng.random() < spec.held_share else ()
        out.append(VmiRecord(ns, name, cls, size, held))
    return sorted(out, key=lambda v: -v.size)


def problem_nodes(spec: ScaleSpec) -> dict[int, str]:
    """node index -> "cordoned" | "tainted" | "not_ready", spread evenly over the fleet."""
    kinds = ["cordoned"] * spec.cordoned + ["tainted"] * spec.tainted + ["not_ready"] * spec.not_ready
    if len(kinds) > spec.nodes:
        raise ValueError(f"{len(kinds)} problem nodes asked of a {spec.nodes}-node fleet")
    step = spec.nodes / max(1, len(kinds))
    return {int(k * step + step / 2): kind for k, kind in enumerate(kinds)}


@dataclass
class Plan:
    """How many samples each measurement takes: `quiet` admissions one at a time per GPU
    count (1, 4, 8), `bursts` sizes, `failover_burst` VMIs in flight when the leader is
    killed, `bind_timeout` s each admitted VMI's launcher Pod has to bind. Before the quiet
    admissions the run waits up to `settle_s` seconds for the machine's 1-minute load to
    fall to `settle_load` (the population's own writes leave it at 6-9 on 2 cores, and a
    "quiet" admission measured then is the population's tail, not the fleet's size), then
    measures `idle_s` seconds with no admission (each process's background CPU at that
    fleet size)."""

    quiet: dict[int, int] = field(default_factory=lambda: {1: 60, 4: 30, 8: 30})
    bursts: tuple[int, ...] = (20, 50)
    failover_burst: int = 20
    bind_timeout: float = 90.0
    settle_load: float = 2.0
    settle_s: float = 300.0
    idle_s: float = 10.0


QUICK_PLAN = Plan(quiet={1: 8, 4: 4, 8: 4}, bursts=(10,), failover_burst=10, settle_s=0.0,
                  idle_s=5.0)
