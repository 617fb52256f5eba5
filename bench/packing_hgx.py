"""The packing benchmark on HGX boards in device mode (issue 33 part 1), its pure half: the
board's devices as NVIDIA's DRA driver publishes them, which GPUs each system takes, whether
a set forms a Fabric Manager partition, and the device-level simulation of the three systems
on the trace of `bench.packing_trace` (no I/O, no clock).

A node is an `hgx-h100-8` board (`localcluster.dra_profiles`): GPUs `gpu-vfio-0`…`7` in PCI
order, each carrying `gpu.nvidia.com/partition{1,2,4,8}` by module id, so PCI order is not
partition order. A set of N GPUs has NVLink only when its GPUs share `partitionN` (DR3).

Simulated systems (`HGX_POLICIES`; the same seeded, quantized trace as the cluster replay):
- **binder** (a): gpu-binder in device mode, DR4: on every node the group
  `model.device.topology.choose_devices` takes (buddy best fit), nodes ranked as
  `model.decide._candidates` ranks them for a new set: tightest group, then fewest free units
  left on the node, then node name. Held idle sets keep their recorded devices.
- **dra** (b): kube-scheduler's DRA allocator alone, each VMI's claim N count-1 requests with
  `matchAttribute: gpu.nvidia.com/partitionN`. On a node the allocator walks the slice's
  devices in order and backtracks, so it takes the N lowest-index free GPUs of the partition
  holding the lowest-index free GPU among partitions with N free (`dra_choice`). The node:
  kube-scheduler has no DRA score, and its default scores see every launcher Pod as the same
  cpu and memory, so it spreads by Pod count: the feasible node with the fewest Pods, ties
  drawn at random (seeded), as kube-scheduler draws among equal scores. A model of the
  scheduler, not the scheduler, and a poor one: the measured kube-scheduler keeps far more
  boards whole (76-84 % of 8-GPU sets started on the 24-node traces, against the model's
  3-7 %, and 31-62 % for a uniformly random feasible node), as its default profile did in
  count mode (docs/benchmarks.md); only the cluster replay's (b) counts. An idle held set
  keeps its VMI (and so its Pod and claim) until its release: without a binder the only way
  to keep devices is to keep a Pod holding their claim.
- **count** (c): gpu-binder in count mode (tightest node by free units, B4) on the same
  boards advertised as an extended resource; the device plugin then takes the lowest-index
  free GPUs of the node (kubelet's device manager without a preferred allocation). An idle
  held set keeps its count on the binder's books but no GPU: kubelet frees a device when its
  Pod goes, so the next Pod on the node may take it.
- **repack** (d): the perfect-repacking bound of `bench.packing_trace` (buddy-aligned sizes
  repack exactly into partitions too).
"""

from __future__ import annotations

import random
from functools import lru_cache

from bench import packing_trace as pt
from localcluster.dra_profiles import HGX_H100_8, PARTITION_ATTRIBUTE, resource_slice
from model.device.dra import parse_resource_slice, pool_devices
from model.device.match import MatchAttribute
from model.device.topology import Board, GroupChoice, choose_devices, resolve_attribute

HGX_POLICIES = ("binder", "dra", "count", "repack")
SYSTEM_OF = {"binder": "a", "dra": "b", "count": "c", "repack": "d"}
"""The report's system key of each simulated policy."""


def board() -> tuple:
    """The `model.device.topology.Device`s of one hgx-h100-8 node, in PCI (slice) order, read from
    the very slice the local cluster publishes."""
    devices = pool_devices([parse_resource_slice(resource_slice("n", HGX_H100_8))])["n"]
    return tuple(d.as_device() for d in devices)


BOARD = board()
NAMES = tuple(d.name for d in BOARD)
assert len(BOARD) == pt.GPUS_PER_NODE
LAYOUTS = Board(BOARD)
"""The board's layouts, worked out once for the whole replay (as a node keeps them)."""
_ALL = frozenset(range(pt.GPUS_PER_NODE))
PARTITION = MatchAttribute(PARTITION_ATTRIBUTE)
"""The class's matchAttribute (`partition{size}`, DR3) the choices agree on."""


def partition_of(indices) -> int | None:
    """The `partitionN` id the GPUs at `indices` (PCI order) share, N = their number; None
    when they do not form one partition (DR3; a single GPU is its own partition)."""
    attribute = resolve_attribute(PARTITION, len(indices))
    values = {BOARD[i].attribute(attribute) for i in indices}
    return values.pop() if len(values) == 1 and None not in values else None


def _groups(size: int) -> dict[int, tuple[int, ...]]:
    attribute = resolve_attribute(PARTITION, size)
    out: dict[int, list[int]] = {}
    for i, d in enumerate(BOARD):
        out.setdefault(d.attribute(attribute), []).append(i)
    return {v: tuple(m) for v, m in out.items()}


@lru_cache(maxsize=None)
def dra_choice(free: frozenset[int], size: int) -> tuple[int, ...] | None:
    """The GPUs (indices) kube-scheduler's allocator gives a claim of `size` count-1 requests
    with `matchAttribute: partition{size}` on a node whose free GPUs are `free`: the first
    solution of its walk in slice order (module docstring); None when no partition has room."""
    best = None
    for members in _groups(size).values():
        avail = sorted(i for i in members if i in free)
        if len(avail) >= size and (best is None or avail[0] < best[0]):
            best = avail
    return tuple(best[:size]) if best else None


@lru_cache(maxsize=None)
def binder_choice(free: frozenset[int], size: int) -> GroupChoice | None:
    """gpu-binder's DR3/DR4 choice on a node whose free GPUs are `free`
    (`model.device.topology.choose_devices`); None when no partition has room."""
    got = choose_devices(LAYOUTS, [NAMES[i] for i in free], size, PARTITION)
    return got if isinstance(got, GroupChoice) else None


def lowest_free(free: frozenset[int], size: int) -> tuple[int, ...]:
    """The GPUs a device plugin takes without a preference: the `size` lowest-index free."""
    return tuple(sorted(free)[:size])


class HgxPlacer:
    """One device-level policy of HGX_POLICIES (but `repack`) over `nodes` boards, in the
    `bench.packing_trace.replay` protocol; `taken[s.id]` the GPU indices each started set got
    (for `count`, the device plugin's pick) and `node_of[s.id]` its node."""

    def __init__(self, nodes: int, policy: str, seed: int = 1) -> None:
        if policy not in HGX_POLICIES or policy == "repack":
            raise ValueError(f"unknown device-level policy {policy!r}")
        self.policy = policy
        self.used: list[dict[int, int]] = [{} for _ in range(nodes)]  # node -> {gpu: set id}
        self.count_free = [pt.GPUS_PER_NODE] * nodes                   # (c): the binder's books
        self.pods = [0] * nodes                                         # (b): Pods per node
        self.node_of: dict[int, int] = {}
        self.taken: dict[int, tuple[int, ...]] = {}
        self.rng = random.Random(f"packing-hgx/{seed}")

    def _free(self, n: int) -> frozenset[int]:
        return _ALL.difference(self.used[n])

    def place(self, s: pt.GpuSet) -> bool:
        nodes = range(len(self.used))
        if self.policy == "binder":
            ranked = [((c.fit, len(f) - s.size, n), n, tuple(NAMES.index(d) for d in c.devices))
                      for n in nodes for f in [self._free(n)]
                      if len(f) >= s.size and (c := binder_choice(f, s.size)) is not None]
            if not ranked:
                return False
            _, node, gpus = min(ranked)
        elif self.policy == "dra":
            fits = [(self.pods[n], n, g) for n in nodes
                    if (g := dra_choice(self._free(n), s.size)) is not None]
            if not fits:
                return False
            fewest = min(p for p, _, _ in fits)
            _, node, gpus = self.rng.choice([f for f in fits if f[0] == fewest])
            self.pods[node] += 1
        else:
            fits = [n for n in nodes if self.count_free[n] >= s.size]
            if not fits:
                return False
            node = min(fits, key=lambda n: (self.count_free[n], n))
            gpus = lowest_free(self._free(node), s.size)
        self.count_free[node] -= s.size
        self.node_of[s.id] = node
        self.taken[s.id] = gpus
        self.used[node].update({g: s.id for g in gpus})
        return True

    def idle(self, s: pt.GpuSet) -> None:
        if self.policy == "count":  # its Pod is gone: kubelet frees the GPUs, the books keep them
            self._unuse(s)

    def release(self, s: pt.GpuSet) -> None:
        self._unuse(s)
        node = self.node_of.pop(s.id)
        self.count_free[node] += s.size
        if self.policy == "dra":
            self.pods[node] -= 1

    def _unuse(self, s: pt.GpuSet) -> None:
        used = self.used[self.node_of[s.id]]
        for g in self.taken[s.id]:
            if used.get(g) == s.id:
                del used[g]

    def largest(self) -> int:
        if self.policy == "count":
            return pt.largest_placeable(self.count_free)
        return largest_partition([self._free(n) for n in range(len(self.used))])


def largest_partition(frees: list[frozenset[int]]) -> int:
    """The largest set size for which some node (its free GPU indices in `frees`) has a whole
    free partition; 0 when none."""
    for size in sorted(pt.SIZES, reverse=True):
        if any(dra_choice(f, size) for f in frees):
            return size
    return 0


def partitions(trace: pt.Trace, taken: dict[int, tuple[int, ...]] | dict[int, bool]) -> dict:
    """Of the scored multi-GPU sets started (`taken`: set id -> the GPU indices it got, or
    -> whether they form a partition), how many and which share form a valid partition
    (DR3), overall and per size."""
    def ok(v) -> bool:
        return v if isinstance(v, bool) else partition_of(v) is not None
    multi = [s for s in trace.sets if s.scored and s.size > 1 and s.id in taken]
    per = {}
    for size in pt.SIZES[1:]:
        of = [s for s in multi if s.size == size]
        per[str(size)] = round(sum(ok(taken[s.id]) for s in of) / len(of), 4) if of else None
    valid = sum(ok(taken[s.id]) for s in multi)
    return {"valid_partition": round(valid / len(multi), 4) if multi else None,
            "valid_partition_by_size": per, "multi_gpu_started": len(multi),
            "invalid_partition_sets": len(multi) - valid}


def simulate_hgx(trace: pt.Trace, policy: str, seed: int = 1) -> tuple[pt.Outcome, dict]:
    """Replay `trace` under one of HGX_POLICIES on HGX boards: (outcome, {set id: GPU indices
    taken}); the bound (`repack`) takes no named GPUs (its sets count as whole partitions:
    aligned sizes repack exactly)."""
    if policy == "repack":
        out = pt.simulate(trace, "repack")
        return out, {i: True for i in out.started}
    placer = HgxPlacer(trace.nodes, policy, seed)
    return pt.replay(trace, placer), placer.taken


def simulate_hgx_all(trace: pt.Trace, seed: int = 1) -> dict[str, dict]:
    """`score` and `partitions` of every HGX policy on `trace`, keyed by policy (the report's
    simulation in HGX mode; `SYSTEM_OF` names the system each stands for)."""
    out = {}
    for policy in HGX_POLICIES:
        outcome, taken = simulate_hgx(trace, policy, seed)
        out[policy] = {"system": SYSTEM_OF[policy], **pt.score(trace, outcome),
                       **partitions(trace, taken)}
    return out
