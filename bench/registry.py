"""The benchmarks of `gpu-binder bench`, in the order its help lists them: each module's
`BENCHMARK` (`bench.common.Benchmark`: its flags and its run). The modules import what a run
needs only when it runs, so this list is cheap to build."""

from __future__ import annotations

from bench import contention, core, e2e, fairness, floor, health, packing, scale, soak
from bench.common import Benchmark

BENCHMARKS: tuple[Benchmark, ...] = (core.BENCHMARK, e2e.BENCHMARK, floor.BENCHMARK,
                                     packing.BENCHMARK,
                                     contention.BENCHMARK, fairness.BENCHMARK, scale.BENCHMARK,
                                     soak.BENCHMARK, health.BENCHMARK)
