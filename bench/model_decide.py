"""Micro-benchmark of the pure model: `decide` on a fleet of 1,000 nodes × 8 GPUs.

Run `python -m bench.model_decide [--nodes 1000] [--gpus 8] [--decisions 20000] [--seed 1]
[--rounds 3] [--profile]`. Not a test. The fleet has three GPU families (H100, L40S, A100, one zone label);
four classes (h100 Move, h100-stay Stay, l40s, a100 with a nodeSelector); 50 tenants, each
holding 24 devices (some Bound, some Pending) under a budget. Each step stops a running VM
when too many run (its template devices are deleted, held devices stay Bound), then asks for
a set of 1–8 devices of one family — held devices of the tenant not in use plus new template
devices — through `decide`, and carries the decision out with `apply_decision`. Reports
decisions/s of `decide` alone and of `decide` + `apply_decision`, and the rules seen; timings are CPU time of this process, best of `--rounds` identical runs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from datetime import datetime, timezone

from bench.common import Benchmark
from model.decide import Request, apply_decision, decide
from model.snapshot import Snapshot
from model.types import Budget, DeviceStatus, GPUClass, GPUDevice, Namespace, Node, OnCordon, Phase, Result

FAMILIES = {
    "nvidia.com/H100": ("h100", "h100-stay"),
    "nvidia.com/L40S": ("l40s",),
    "nvidia.com/A100": ("a100",),
}
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def fleet(n_nodes: int, gpus: int, rng: random.Random) -> tuple[Snapshot, dict[str, list[str]]]:
    """The starting snapshot (about half full) and each tenant's held device names."""
    resources = list(FAMILIES)
    nodes = []
    for i in range(n_nodes):
        res = resources[0] if i < n_nodes * 0.4 else resources[1] if i < n_nodes * 0.7 else resources[2]
        nodes.append(Node(f"node-{i:04d}", (("kubevirt.io/schedulable", "true"), ("topology.kubernetes.io/zone", f"z{i % 3}")),
                          ((res, gpus), ("cpu", 64)), unschedulable=rng.random() < 0.02))
    classes = [GPUClass("h100", "nvidia.com/H100"),
               GPUClass("h100-stay", "nvidia.com/H100", OnCordon.STAY),
               GPUClass("l40s", "nvidia.com/L40S"),
               GPUClass("a100", "nvidia.com/A100", node_selector=(("topology.kubernetes.io/zone", "z1"),))]
    by_res = {r: [n.name for n in nodes if n.allocatable[0][0] == r] for r in resources}
    fill = {n.name: 0 for n in nodes}
    devices, held, budgets, namespaces = [], {}, [], []
    for t in range(50):
        ns = f"tenant-{t:02d}"
        namespaces.append(Namespace(ns))
        held[ns] = []
        for r in resources:
            budgets.append(Budget(ns, r, n_nodes * gpus // 60))
        for k in range(24):
            res = rng.choice(resources)
            cls = rng.choice(FAMILIES[res])
            name = f"held-{k:02d}"
            node = rng.choice(by_res[res])
            if rng.random() < 0.7 and fill[node] < gpus and (cls != "a100" or node.endswith(("1", "4", "7"))):
                fill[node] += 1
                status = DeviceStatus(Phase.BOUND, node, NOW)
            else:
                status = DeviceStatus()
            devices.append(GPUDevice(ns, name, cls, status=status))
            held[ns].append(name)
    snap = Snapshot.build(nodes=nodes, classes=classes, devices=devices, budgets=budgets, namespaces=namespaces)
    return snap, held


def run(n_nodes: int, gpus: int, decisions: int, seed: int) -> tuple[float, float]:
    """One simulated run; prints what it saw and returns (seconds in decide, seconds in
    apply_decision), CPU time of this process (other load on the machine does not count)."""
    rng = random.Random(seed)
    snap, held = fleet(n_nodes, gpus, rng)
    in_use: set[tuple[str, str]] = set()
    running: list[tuple[str, list[str], list[str]]] = []
    target = n_nodes * gpus // 10  # VMs kept running
    rules: Counter[str] = Counter()
    sizes: Counter[int] = Counter()
    t_decide = t_apply = 0.0
    for step in range(decisions):
        while len(running) > target:
            ns, names, tpls = running.pop(rng.randrange(len(running)))
            in_use.difference_update((ns, n) for n in names)
            snap = snap.without_devices((ns, name) for name in tpls)
        ns = rng.choice(list(held))
        res = rng.choice(list(FAMILIES))
        size = rng.randint(1, 8)
        free_held = [n for n in held[ns] if (ns, n) not in in_use
                     and snap.device(ns, n).class_name in FAMILIES[res]]
        names = rng.sample(free_held, min(len(free_held), rng.randint(0, size)))
        tpls = [GPUDevice(ns, f"vm-{step}-{i}", rng.choice(FAMILIES[res]), template_for=f"vm-{step}")
                for i in range(size - len(names))]
        snap = snap.with_devices(tpls)
        request = Request(f"r{step}", ns, f"vm-{step}", tuple(names) + tuple(t.name for t in tpls))
        t0 = time.process_time()
        decision = decide(snap, request)
        t1 = time.process_time()
        snap = apply_decision(snap, request, decision, now=NOW)
        t2 = time.process_time()
        t_decide += t1 - t0
        t_apply += t2 - t1
        rules[decision.rule] += 1
        sizes[len(request.devices)] += 1
        if decision.result is Result.SUCCEEDED:
            in_use.update((ns, n) for n in request.devices)
            running.append((ns, list(request.devices), [t.name for t in tpls]))
        else:
            snap = snap.without_devices((ns, t.name) for t in tpls)
    used = sum(snap.used(n, r) for n in snap.nodes for r in FAMILIES)
    print(f"fleet: {n_nodes} nodes × {gpus} GPUs, {len(snap.devices)} devices at the end, "
          f"{used} GPUs bound ({100 * used / (n_nodes * gpus):.0f}%)")
    print(f"rules: {dict(sorted(rules.items()))}; set sizes 1–8: {[sizes[k] for k in range(1, 9)]}")
    report("this run", decisions, t_decide, t_apply)
    return t_decide, t_apply


def report(label: str, decisions: int, t_decide: float, t_apply: float) -> None:
    print(f"{label}: decide {decisions / t_decide:,.0f} decisions/s ({1e6 * t_decide / decisions:.1f} µs each); "
          f"decide + apply_decision {decisions / (t_decide + t_apply):,.0f} decisions/s "
          f"({1e6 * (t_decide + t_apply) / decisions:.1f} µs each)")


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1000, help="nodes (default: %(default)s)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default: %(default)s)")
    p.add_argument("--decisions", type=int, default=20000,
                   help="steps of a run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fleet and the steps "
                   "(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3,
                   help="identical runs; the best is reported (default: %(default)s)")
    p.add_argument("--profile", action="store_true",
                   help="one run under pyinstrument (default: off)")


def _run(a: argparse.Namespace) -> int:
    if a.profile:
        from pyinstrument import Profiler

        with Profiler() as prof:
            run(a.nodes, a.gpus, a.decisions, a.seed)
        prof.print()
        return 0
    runs = [run(a.nodes, a.gpus, a.decisions, a.seed) for _ in range(a.rounds)]
    report(f"best of {a.rounds}", a.decisions, min(r[0] for r in runs), min(r[1] for r in runs))
    return 0


BENCHMARK = Benchmark("model_decide", "the pure model: decide on 1,000 nodes x 8 GPUs",
                      _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
