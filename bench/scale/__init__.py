"""A large populated cluster with KubeVirt in the loop (`gpu-binder bench scale`, issue 22).

`populate(lc, kv, fleet, spec)` builds, on a running `LocalCluster` with KubeVirt's harness
(`localcluster.kubevirt.KubeVirt`: virt-api, virt-controller, kube-scheduler, KWOK), the
population `ScaleSpec` describes: KWOK nodes of two GPU models, a few of them cordoned,
tainted or not Ready, one GPUClass per model, tenant namespaces, held GPUDevices, and running
VMIs made through the real path (our webhook admits and pins each VMI, virt-controller makes
its virt-launcher Pod, kube-scheduler binds it, KWOK runs it). The measurements
(`measure_on`, `run`) then time a fresh replica's start-up, admissions one at a time and in
bursts, and a leader failover on it, at `--nodes` and at `--baseline-nodes` for ratios.

Used by the benchmark here and by the soak (`bench.soak`). Every object `populate` makes
is named with `spec.prefix`, so a shared control plane (an e2e session's) keeps them apart.

Modules: `workload` (the spec, the records, the plan; pure), `population` (building it
through the real path, and the process and API-server figures read meanwhile), `measure`
(the measurements, `measure_on`, `run`), `report` (targets, plot, summary). The names below
are their public ones, re-exported.
"""

from bench.scale.measure import CONTROLLER_ARGS, Measure, latency_summary, measure_on, on_pin, run
from bench.scale.population import (admit, apiserver_latency, apiserver_writes, cluster_pids,
                                    memory, populate, wait_permitted)
from bench.scale.report import max_hwm, plot, summary, targets
from bench.scale.workload import (QUICK_PLAN, TAINT, Plan, Population, ScaleSpec, VmiRecord,
                                  plan_vmis, problem_nodes)

__all__ = ["CONTROLLER_ARGS", "QUICK_PLAN", "TAINT", "Measure", "Plan", "Population",
           "ScaleSpec", "VmiRecord", "admit", "apiserver_latency", "apiserver_writes",
           "cluster_pids", "latency_summary", "max_hwm", "measure_on", "memory", "on_pin",
           "plan_vmis", "populate", "plot", "problem_nodes", "run", "summary", "targets",
           "wait_permitted"]
