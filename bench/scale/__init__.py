"""A large populated cluster with KubeVirt in the loop (`gpu-binder bench scale`, issue 22).

`populate(lc, kv, fleet, spec)` builds, on a running `LocalCluster` with KubeVirt's harness
(`localcluster.kubevirt.KubeVirt`: virt-api, virt-controller, kube-scheduler, KWOK), the
population `ScaleSpec` describes: KWOK nodes of two GPU models, a few of them cordoned,
tainted or not Ready, one GPUClass per model, tenant namespaces, held GPUDevices, and running
VMIs made through the real path (our webhook admits and pins each VMI, virt-controller makes
its virt-launcher Pod, kube-scheduler binds it, KWOK runs it). The measurements
(`measure_on`, `run`) then time a fresh replica's start-up, admissions one at a time and in
bursts, and a leader failover on it, at `--nodes` and at `--baseline-nodes` for ratios, or
at each of `--sizes` in every mode of `--modes`, for how the figures grow with the fleet.

Used by the benchmark here and by the soak (`bench.soak`). Every object `populate` makes
is named with `spec.prefix`, so a shared control plane (an e2e session's) keeps them apart.

Modules: `workload` (the spec, the records, the plan; pure), `population` (building it
through the real path, and the process and API-server figures read meanwhile), `measure`
(the measurements, `measure_on`, `run`), `report` (targets, plot, summary), `growth` (the
figures per size and mode, their target and figure; `--sizes`). The names below are their
public ones, re-exported.
"""

import argparse
import dataclasses
import importlib
import math
from pathlib import Path
from typing import Any

from bench.common import Benchmark, add_modes, add_out, add_quick, at_least, modes
from bench.scale.growth import grew, node_sizes
from bench.scale.report import max_hwm, plot, summary, targets
from bench.scale.workload import (QUICK_PLAN, TAINT, Plan, Population, ScaleSpec, VmiRecord,
                                  plan_vmis, problem_nodes)

_LAZY = {**dict.fromkeys(("CONTROLLER_ARGS", "Measure", "latency_summary", "measure_on", "on_pin",
                          "run"), "measure"),
         **dict.fromkeys(("admit", "apiserver_latency", "apiserver_writes", "cluster_pids",
                          "memory", "populate", "wait_permitted"), "population")}
"""The names of the modules that drive a cluster, imported on first use (the cluster's
harness is heavy to import; `gpu-binder --help` lists this benchmark without it)."""

__all__ = ["BENCHMARK", "CONTROLLER_ARGS", "QUICK_PLAN", "TAINT", "Measure", "Plan", "Population",
           "ScaleSpec", "VmiRecord", "admit", "apiserver_latency", "apiserver_writes",
           "cluster_pids", "latency_summary", "max_hwm", "measure_on", "memory", "on_pin",
           "plan_vmis", "populate", "plot", "problem_nodes", "run", "summary", "targets",
           "wait_permitted"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"bench.scale.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'bench.scale' has no attribute {name!r}")


# -- the command line -----------------------------------------------------------------------

def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_quick(p, "20 nodes and a shorter plan, a baseline of 10 (with --sizes: the shorter "
                 "plan at those sizes)")
    p.add_argument("--nodes", type=at_least(1), default=None,
                   help="nodes of the large cluster (default: 1000; with --quick 20)")
    p.add_argument("--vmis", type=at_least(1), default=None,
                   help="running VMIs on the large cluster (default: 2 per node)")
    p.add_argument("--baseline-nodes", type=at_least(0), default=None,
                   help="nodes of the baseline cluster measured in the same run for the "
                        "ratios, 0 for none (default: 100; with --quick 10)")
    p.add_argument("--sizes", default=None,
                   help="node counts separated by commas, e.g. 100,300,1000: every mode of "
                        "--modes measured at every size, each on a cluster of its own, and "
                        "how the quiet 1-GPU latency and the leader's memory grow from the "
                        "smallest to the largest (growth.png); replaces --nodes and "
                        "--baseline-nodes (default: none, --nodes and --baseline-nodes)")
    add_modes(p, "without --sizes, device measures the device-mode fleet at --nodes only, "
                 "without a baseline; with --sizes, at every size")
    p.add_argument("--settle-load", type=settle_load, default=None,
                   help="before each size's quiet admissions wait (at most 300 s) until the "
                        "machine's 1-minute load is at most this: lower makes the quiet "
                        "figures of different sizes comparable on a small machine, at a minute "
                        "or two more per size (default: 2; --quick does not wait)")


def settle_load(text: str) -> float:
    """An argparse type for `--settle-load`: a finite load average above 0 (else exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"takes a finite load average above 0, got {text!r}")
    return value


def _run(args: argparse.Namespace) -> int:
    chosen = modes(args.modes)
    sizes = (None if args.sizes is None
             else node_sizes(args.sizes, nodes=args.nodes, baseline_nodes=args.baseline_nodes))
    from bench.scale.measure import run

    out = Path(args.out)
    plan = QUICK_PLAN if args.quick else None
    if args.settle_load is not None:
        plan = dataclasses.replace(plan or Plan(), settle_load=args.settle_load)
    report = run(out, nodes=args.nodes or (20 if args.quick else 1000),
                 baseline_nodes=(10 if args.quick else 100) if args.baseline_nodes is None
                 else args.baseline_nodes or None, vmis=args.vmis,
                 plan=plan, modes=chosen, sizes=sizes)
    print("\n".join(summary(report)))
    print(f"report: {out}/scale.json, plot: {out}/scale.png"
          + (f", growth: {out}/growth.png" if grew(report) else ""))
    return 0


BENCHMARK = Benchmark("scale", "a populated KWOK cluster with KubeVirt: start-up, memory, "
                               "admissions quiet and in bursts, leader failover",
                      _arguments, _run)
