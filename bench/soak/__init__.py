"""Soak (issue 22 item 2): a KWOK fleet with KubeVirt and kube-scheduler running, under seeded
churn — VMI creates (1/2/4/8 GPUs, template or held devices) and deletes as tenants, node
cordons and uncordons (held devices then move: B4/B5), a kill -9 of the leader every few
minutes and one kube-apiserver restart in the first part of the run, then a *steady stretch*
(the last `steady_share` of it: the same churn, the live set constant, nothing killed) — while
the invariants of docs/contract.md §7 (`localcluster.invariants`) are checked every few seconds and once
more after settling.

Figures: invariant violations (by kind), admissions lost (a create that got neither an answer
nor, if admitted, a bound launcher Pod on its pin), creates/admitted/refused/deleted, held-device
moves, leader takeovers, the API-server restart's outage, each replica's RSS every ~10 s, and
the RSS trend (`rss_trend`): for each replica process alive through the whole steady stretch
and past its warm-up (`warmup_window`, issue 41 item 5) for at least 300 s of it, the
least-squares slope of its RSS over the stretch past its warm-up (MiB/min, ± 2 standard
errors) judged against RSS_SLOPE_MAX_MIB_PER_MIN, its whole-stretch fit beside it; saved
reports are re-judged by `python -m bench.soak.rejudge --rejudge FILE.json [--write]`.

The population: `population="scale"` (the bench) is `bench.scale.populate`'s — two GPU
models, cordoned, tainted and not-Ready nodes, 2 running VMIs per node made through the real
path, held devices up to 8 per node (idle ones included) — with a ResourceQuota budget per
tenant added; `population="own"` (the shortened soak of `make test`) is nodes of one class and
a few held devices per tenant, the live set reached by the churn's first creates.

The operations are a pure function of the spec (`schedule(spec)`): the same seed gives the
same schedule (times, kinds, tenants, sizes, classes, nodes; its digest is printed); outcomes
(admitted or refused, which node) depend on the cluster.

`gpu-binder bench soak --nodes N --minutes M --seed S --out DIR` runs it on its own cluster
(`run`); `tests/e2e/test_soak.py` runs a short one on the session's (`soak_on`).

Device mode (`--mode device`, issue 41 item 5): the population is `bench.scale`'s device mode
(HGX boards publishing ResourceSlices, every admitted set placed as a ResourceClaim), and
DeviceTaintRules are injected at a seeded rate (NoSchedule on a node's GPU; NoExecute on a
running VMI's GPU: kube-controller-manager's eviction controller deletes its launcher Pod, the
soak then deletes the VMI); checked besides §7 and DR6: no orphan claim, no missing claim, no
placement on a tainted device, no tenant over its device budget (`bench.soak.device`).

Modules: `workload` (the spec and the seeded schedule, pure), `driver` (the churn, the
samplers, `soak_on`, `run`), `report` (the RSS judgement, the report, targets, summary,
plot), `device` (device mode's checks and taint rules). The names below are their public ones, re-exported.
"""

import argparse
import importlib
from pathlib import Path
from typing import Any

from bench.common import BadArgs, Benchmark, add_out, add_seed, targets_lines
from bench.soak.report import (RSS_SLOPE_MAX_MIB_PER_MIN, RSS_SLOPE_WHY, RSS_TARGET_MIB,
                               cache_change, heap_change, heap_parts_trend, heap_reports,
                               judge_inputs, plot, refusal_reason, rejudge, rss_lines, rss_trend,
                               soak_report, summary, targets, warmup_window)
from bench.soak.report import DEVICE_KINDS, P6_KINDS, device_part, p6_part
from bench.soak.workload import (MAX_CREATE_RATE, MAX_MINUTES, SIZES, Op, SoakSpec,
                                 deletion_order, schedule, schedule_digest, taints)

_DRIVER = ("SOAK_ARGS", "Rec", "Soak", "cache_objects", "replica_figures", "run", "soak_on")
"""The names of `driver`, imported on first use (it drives a cluster; the harness is heavy to
import, and `gpu-binder --help` lists this benchmark without it)."""

__all__ = ["BENCHMARK", "DEVICE_KINDS", "MAX_CREATE_RATE", "RSS_SLOPE_MAX_MIB_PER_MIN", "RSS_SLOPE_WHY",
           "RSS_TARGET_MIB", "SIZES", "SOAK_ARGS", "Op", "Rec", "Soak", "SoakSpec",
           "cache_change", "cache_objects", "deletion_order", "heap_change", "heap_parts_trend",
           "heap_reports", "judge_inputs", "plot", "refusal_reason", "rejudge", "replica_figures",
           "rss_lines", "rss_trend", "run", "warmup_window",
           "schedule", "schedule_digest", "soak_on",
           "soak_report", "summary", "taints", "targets", "device_part", "P6_KINDS", "p6_part"]


def __getattr__(name: str) -> Any:
    if name in _DRIVER:
        return getattr(importlib.import_module("bench.soak.driver"), name)
    raise AttributeError(f"module 'bench.soak' has no attribute {name!r}")


# -- the command line -----------------------------------------------------------------------

def _arguments(p: argparse.ArgumentParser) -> None:
    add_out(p)
    add_seed(p)
    p.add_argument("--nodes", type=int, default=None,   # range: run's ValueError, one line
                   help="KWOK nodes of 8 GPUs, at least 1 (default: 1000)")
    p.add_argument("--minutes", type=float, default=None,
                   help="minutes of churn, at most 60 (default: 20)")
    p.add_argument("--steady-share", type=float, default=0.45,
                   help="the steady stretch's share of the run, in [0.2, 0.8]: the "
                        "disturbances come before it (default: %(default)s)")
    p.add_argument("--create-rate", type=float, default=2.0,
                   help="VMI creates per second, at most 50, each preceded by a delete once "
                        "the population runs (default: %(default)s)")
    p.add_argument("--mode", choices=("count", "device"), default="count",
                   help="count: extended resources on Nodes (the default); device: HGX boards "
                        "publishing ResourceSlices, sets placed as ResourceClaims, "
                        "DeviceTaintRules injected (NoSchedule, and NoExecute on running VMIs' "
                        "GPUs), claims and taints checked too (issue 41)")
    p.add_argument("--priorities", action="store_true",
                   help="a priority mix (issue 39, docs/contract.md §3c P6): bench contention's "
                        "PriorityClasses, 30%% of creates on-demand, the rest preemptible, "
                        "larger sets and budgets so the fleet runs full: on-demand creates "
                        "preempt, the others wait in line; P6's three invariants checked and "
                        "preemptions, victims and nominations reported (default: off, the "
                        "schedule of before)")
    p.add_argument("--tracemalloc", action="store_true",
                   help="run the replicas with PYTHONTRACEMALLOC=1 and report the source "
                        "lines whose allocations grew over the steady stretch (slower; "
                        "default: off)")


def _run(args: argparse.Namespace) -> int:
    """1 when the soak found a violation or lost an admission."""
    from bench.soak.driver import run

    out = Path(args.out)
    minutes = 20.0 if args.minutes is None else args.minutes
    if not 0 < minutes <= MAX_MINUTES:   # also refuses nan and inf
        raise BadArgs(f"gpu-binder bench soak: --minutes is in (0, {MAX_MINUTES:g}], "
                      f"got {minutes}")
    if not 0.2 <= args.steady_share <= 0.8:
        raise BadArgs(f"gpu-binder bench soak: --steady-share is in [0.2, 0.8], "
                      f"got {args.steady_share}")
    try:
        report = run(out, nodes=1000 if args.nodes is None else args.nodes, minutes=minutes,
                     seed=args.seed, create_rate=args.create_rate, tracemalloc=args.tracemalloc,
                     mode=args.mode, steady_share=args.steady_share,
                     priorities=args.priorities)
    except ValueError as exc:   # a value out of its range, or the schedule does not fit
        raise BadArgs(f"gpu-binder bench soak: {exc}") from None
    for line in targets_lines(report):
        print(line)
    print(f"report: {out}/soak.json, plot: {out}/soak.png")
    return 0 if report["violations"] == 0 and report["admissions_lost"] == 0 else 1


BENCHMARK = Benchmark("soak", "scale's population under seeded churn (creates, deletes, "
                              "cordons, held-device moves; a leader kill -9 every 2.5 min and "
                              "one kube-apiserver restart before the steady stretch (the last "
                              "--steady-share of the run), whose replica RSS trend is judged), docs/contract.md §7 "
                              "checked throughout and at the end", _arguments, _run)
