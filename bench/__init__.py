"""Benchmarks (not tests): the pure model's decision rate, the actor binder against a bare
loop, end-to-end admissions on a real control plane, the API's floor beside them, packing,
contention, fairness, scale and the soak.
Only the command line (`gpu-binder bench …`) and the tests import this package.

Layout: one benchmark a module or a package; a large one split by job into its workload (what
it runs, pure), its driver (what it does to a cluster) and its report (targets, summary,
figure): `core` / `core_workload` / `core_report`, `floor` / `floor_report`, `packing` /
`packing_replay` / `packing_report` (with `packing_trace`), `contention` / `contention_metrics` /
`contention_report` (with `contention_trace`), `scale/` (workload, population, measure, report),
`soak/` (workload, driver, report). `common` holds what several share; `results_table`
generates bench-results/README.md's table.

Each benchmark module offers `BENCHMARK` (`common.Benchmark`: its flags and its run);
`registry.BENCHMARKS` are those of `gpu-binder bench`, and `python -m bench.NAME` runs a
module's own through `Benchmark.main`. A module imports the cluster's harness only when it
runs, so listing the benchmarks stays fast.
"""
