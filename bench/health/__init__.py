"""Health (issue 41 item 4, docs/contract.md §3b HL1–HL3): a device-mode fleet of HGX H100
boards on KWOK (`bench.scale.populate`'s, with KubeVirt, kube-scheduler and
kube-controller-manager's claim and device-taint eviction controllers) under a seeded churn
of VMs (runStrategy Always) and VMIs, into which the run injects at seeded times:

- a `NoExecute` DeviceTaintRule on a GPU of a running VM: the eviction controller deletes
  its launcher Pod, KubeVirt starts the VM again, our webhook places it on healthy devices;
  timed from the rule written to the launcher Pod gone (the eviction controller's own delay)
  and to the next launcher Pod bound with its claim allocated;
- a `NoSchedule` DeviceTaintRule on a GPU of a running VM (it keeps running);
- a broken device: `failed_starts` (3) one-GPU VMIs naming one held GPUDevice (so one GPU,
  B6) fail to start in turn (launcher Pod `Failed`); the binder must suspect that GPU after
  the third (HL2) and no healthy one;
- attribute loss: a GPU of a running VM republished without `gpuModuleID`/`partitionN`
  (dra-driver-nvidia-gpu#1331): the leader must report it lost (HL3).

Figures: the restart's p50/p99 and the share the eviction controller's delay takes,
suspects found vs injected, placements made on a tainted, suspected or lost device (every
claim allocated in the run against the marks at its creation), losses reported vs injected;
the targets `bench.common.targets_lines` prints.

`gpu-binder bench health --nodes N --minutes M --seed S --out DIR`. Modules: `workload`
(the spec and the seeded schedule, pure), `report` (the figures and targets, pure), `driver`
(the run on a cluster, imported on first use).
"""

import argparse
import importlib
from pathlib import Path
from typing import Any

from bench.common import BadArgs, Benchmark, add_out, add_seed, at_least, targets_lines
from bench.health.report import (BEYOND_EVICTION_P99_S, on_marked, restart_figures,
                                 suspect_figures, summary, targets)
from bench.health.workload import INJECTIONS, HealthSpec, Op, pick, schedule

MAX_MINUTES = 10.0

_DRIVER = ("CONTROLLER_ARGS", "HealthRun", "health_on", "run")
"""The names of `driver`, imported on first use (it drives a cluster)."""

__all__ = ["BENCHMARK", "BEYOND_EVICTION_P99_S", "CONTROLLER_ARGS", "INJECTIONS", "MAX_MINUTES",
           "HealthRun", "HealthSpec", "Op", "health_on", "on_marked", "pick", "restart_figures",
           "run", "schedule", "summary", "suspect_figures", "targets"]


def __getattr__(name: str) -> Any:
    if name in _DRIVER:
        return getattr(importlib.import_module("bench.health.driver"), name)
    raise AttributeError(f"module 'bench.health' has no attribute {name!r}")


def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_seed(p)
    p.add_argument("--nodes", type=at_least(1), default=100,
                   help="KWOK HGX H100 boards of 8 GPUs (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=4.0,
                   help=f"minutes of churn and injections, in (2, {MAX_MINUTES:g}] "
                        "(default: %(default)s)")


def _run(args: argparse.Namespace) -> int:
    """1 when a target is not met."""
    from bench.health.driver import run

    if not 2 < args.minutes <= MAX_MINUTES:   # also refuses nan
        raise BadArgs(f"gpu-binder bench health: --minutes is in (2, {MAX_MINUTES:g}], "
                      f"got {args.minutes}")
    try:
        report = run(Path(args.out), nodes=args.nodes, minutes=args.minutes, seed=args.seed)
    except ValueError as exc:   # the schedule does not fit
        raise BadArgs(f"gpu-binder bench health: {exc}") from None
    for line in targets_lines(report):
        print(line)
    print(f"report: {args.out}/health.json")
    return 0 if all(t["met"] is not False for t in report["targets"].values()) else 1


BENCHMARK = Benchmark("health", "device mode, HGX boards on KWOK under VM churn: NoExecute and "
                                "NoSchedule taints, broken devices and attribute loss "
                                "injected; restart time after NoExecute, suspects found, "
                                "placements on marked devices, losses reported (HL1-HL3)",
                      _arguments, _run)
