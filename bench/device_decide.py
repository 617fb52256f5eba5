"""Micro-benchmark of the pure model in device mode (issue 32): the binder's named-device
decision (`decide`) and the webhook's W1 check (`model.check.check_set`) on a fleet of 1,000
HGX H100 boards.

Run `python -m bench.device_decide [--nodes 1000] [--decisions 2000] [--fill 0.5] [--seed 1]
[--rounds 3] [--cold | --node-changes] [--profile]`. Not a test. Each node publishes the slice of
`localcluster.dra_profiles.HGX_H100_8` (8 GPUs, `gpu.nvidia.com/partition{1,2,4,8}` by module
id), read by `model.device.dra.parse_resource_slice`; one device-mode class constrained by
`gpu.nvidia.com/partition{size}` (DR3). The fleet starts with about `--fill` of its GPUs
recorded by held devices of 20 tenants (random GPUs, so partitions are broken), a few GPUs
allocated by foreign claims and one in 200 tainted. Each step stops a running VM when too many
run (its template devices are deleted), then asks for a set of 1, 2, 4 or 8 new template
devices (sizes drawn 8:4:2:1, as VMIs ask), judges it as the webhook does (`check_set`, W1),
decides it (`decide`, DR3/DR4: every eligible node's group choice) and carries the decision
out (`apply_decision`, the records). Reports per set size the mean CPU time of `decide` and of
`check_set`, and per step the snapshot's upkeep (its derivations, as the view makes them),
the best of `--rounds` identical runs (CPU time of this process: other load on
the machine does not count), and the rules seen.

The snapshot is derived from step to step as the view derives it, so its node memo
(`Snapshot.memo`: a new set's group choice per node, and the ranking of the nodes by it)
keeps the nodes the step did not touch. With `--node-changes` one random board's taken
devices change before each step (`Snapshot.with_node_changes`, untimed), as a claim's
allocation or release changes a node in the view. With `--cold` it is built anew before
each step (untimed), as the view does after a class, budget or namespace change, its counts
and records indexed outside the timing: every node's choice is then worked out again, the
figure to expect for the first decision after such a change.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import datetime, timezone

from bench.common import Benchmark
from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, PARTITION_ATTRIBUTE, resource_slice
from model.check import check_set
from model.decide import Request, apply_decision, decide
from model.device.boards import Boards
from model.device.dra import DeviceRef, parse_resource_slice
from model.snapshot import Order, Snapshot
from model.types import (KUBEVIRT_SCHEDULABLE_LABEL, DeviceStatus, GPUClass, GPUDevice, Namespace, Node,
                         Phase, Result, dra_resource_name)

CLASS = "hgx-h100"
RES = dra_resource_name(DEVICE_CLASS)
DRIVER = "gpu.nvidia.com"
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SIZES = (1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 8)
"""Set sizes drawn per step (8:4:2:1 for 1, 2, 4, 8 GPUs)."""


def fleet(n_nodes: int, fill: float, rng: random.Random) -> Snapshot:
    """The starting snapshot: `n_nodes` HGX boards, about `fill` of their GPUs recorded by
    held devices, 1 % allocated by foreign claims, 0.5 % tainted."""
    nodes, devices = [], []
    boards = Boards()  # as the DRA index builds Nodes: one board for boards that look the same
    for i in range(n_nodes):
        name = f"hgx-{i:04d}"
        taints = {j: [{"key": "health", "effect": "NoSchedule"}] for j in range(8)
                  if rng.random() < 0.005}
        slice_devices = tuple(sorted(parse_resource_slice(resource_slice(name, HGX_H100_8, taints=taints)).devices,
                                     key=lambda d: d.ref))
        taken = frozenset(d.ref.device for d in slice_devices if rng.random() < 0.01 or d.tainted)
        nodes.append(Node(name, labels=((KUBEVIRT_SCHEDULABLE_LABEL, "true"),),
                          allocatable=((RES, len(slice_devices)),),
                          foreign=((RES, len(taken)),) if taken else (),
                          class_devices=((CLASS, boards.device_set(slice_devices)),),
                          taken_devices=taken))
        for j in range(8):
            gpu = f"gpu-vfio-{j}"
            if gpu not in taken and rng.random() < fill:
                devices.append(GPUDevice(f"tenant-{i % 20:02d}", f"held-{i}-{j}", CLASS, status=DeviceStatus(
                    Phase.BOUND, name, NOW, device=DeviceRef(DRIVER, name, gpu))))
    cls = GPUClass(CLASS, RES, device_class_name=DEVICE_CLASS, match_attribute=PARTITION_ATTRIBUTE)
    return Snapshot.build(nodes=nodes, classes=[cls], devices=devices,
                          namespaces=[Namespace(f"tenant-{t:02d}") for t in range(20)])


def run(n_nodes: int, decisions: int, fill: float, seed: int,
        cold: bool = False, node_changes: bool = False) -> tuple[dict[int, tuple[int, float, float]], float]:
    """One simulated run; prints what it saw and returns per set size (count, seconds in
    decide, seconds in check_set), and the mean seconds per step spent deriving the snapshot
    as the view does (`with_node_changes`, `with_devices`, `apply_decision`,
    `without_devices`: the upkeep every Pod, claim and status change costs), CPU time of
    this process."""
    rng = random.Random(seed)
    snap = fleet(n_nodes, fill, rng)
    target = int(n_nodes * 8 * 0.1) // 2  # VMs kept running (their sets average 2 GPUs)
    running: list[tuple[str, list[str]]] = []
    rules: Counter[str] = Counter()
    per_size: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    upkeep = 0.0
    for step in range(decisions):
        u0 = time.process_time()
        while len(running) > target:
            ns, names = running.pop(rng.randrange(len(running)))
            snap = snap.without_devices((ns, n) for n in names)
        ns = f"tenant-{rng.randrange(20):02d}"
        size = rng.choice(SIZES)
        if node_changes:
            n = snap.nodes[f"hgx-{rng.randrange(n_nodes):04d}"]
            flip = frozenset({f"gpu-vfio-{rng.randrange(8)}"}) - set(snap.recorded_devices(n.name))
            snap = snap.with_node_changes([replace(n, taken_devices=n.taken_devices ^ flip)])
        upkeep += time.process_time() - u0
        if cold:
            snap = Snapshot.build(nodes=snap.nodes.values(), classes=snap.classes.values(),
                                  devices=snap.devices.values(), namespaces=snap.namespaces.values())
            first = next(iter(snap.nodes))
            snap.used(first, RES), snap.recorded_devices(first)  # its counts and records, untimed
        t0 = time.process_time()
        verdict = check_set(snap, ns, [Order(ns, CLASS)] * size)
        t1 = time.process_time()
        tpls = [GPUDevice(ns, f"vm-{step}-{i}", CLASS, template_for=f"vm-{step}") for i in range(size)]
        u1 = time.process_time()
        snap = snap.with_devices(tpls)
        request = Request(f"r{step}", ns, f"vm-{step}", tuple(t.name for t in tpls))
        t2 = time.process_time()
        decision = decide(snap, request)
        t3 = time.process_time()
        snap = apply_decision(snap, request, decision, now=NOW)
        upkeep += (t2 - u1) + (time.process_time() - t3)
        got = per_size[size]
        got[0] += 1
        got[1] += t3 - t2
        got[2] += t1 - t0
        rules[f"{decision.rule}/{decision.result.value}"] += 1
        assert verdict.admitted == (decision.result is Result.SUCCEEDED), (verdict, decision)
        if decision.result is Result.SUCCEEDED:
            running.append((ns, [t.name for t in tpls]))
        else:
            snap = snap.without_devices((ns, t.name) for t in tpls)
    used = sum(snap.used(n, RES) for n in snap.nodes)
    print(f"fleet: {n_nodes} HGX nodes × 8 GPUs, {used} GPUs used at the end "
          f"({100 * used / (n_nodes * 8):.0f}%); rules: {dict(sorted(rules.items()))}")
    out = {s: (int(c), d, w) for s, (c, d, w) in sorted(per_size.items())}
    report("this run", out, upkeep / decisions)
    return out, upkeep / decisions


def report(label: str, per_size: dict[int, tuple[int, float, float]], upkeep: float) -> None:
    parts = [f"{s} GPU{'s' if s > 1 else ''} ({c}): decide {1e3 * d / c:.2f} ms, check_set {1e3 * w / c:.2f} ms"
             for s, (c, d, w) in per_size.items() if c]
    print(f"{label}: " + "; ".join(parts) + f"; snapshot upkeep {1e3 * upkeep:.2f} ms per step")


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1000, help="HGX boards (default: %(default)s)")
    p.add_argument("--decisions", type=int, default=2000,
                   help="steps of a run (default: %(default)s)")
    p.add_argument("--fill", type=float, default=0.5,
                   help="share of GPUs held at the start (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fleet and the steps "
                   "(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3,
                   help="identical runs; the best is reported (default: %(default)s)")
    p.add_argument("--cold", action="store_true",
                   help="build the snapshot anew before each step (default: derived)")
    p.add_argument("--node-changes", action="store_true",
                   help="change one board's taken devices before each step (default: none)")
    p.add_argument("--profile", action="store_true",
                   help="one run under pyinstrument (default: off)")


def _run(a: argparse.Namespace) -> int:
    if a.profile:
        from pyinstrument import Profiler

        with Profiler() as prof:
            run(a.nodes, a.decisions, a.fill, a.seed, a.cold, a.node_changes)
        prof.print()
        return 0
    done = [run(a.nodes, a.decisions, a.fill, a.seed, a.cold, a.node_changes) for _ in range(a.rounds)]
    runs = [r for r, _ in done]
    best = {s: (runs[0][s][0], min(r[s][1] for r in runs), min(r[s][2] for r in runs)) for s in runs[0]}
    report(f"best of {a.rounds}", best, min(u for _, u in done))
    return 0


BENCHMARK = Benchmark("device_decide", "the pure model in device mode: decide and W1's "
                                       "check_set on 1,000 HGX boards", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
