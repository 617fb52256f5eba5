"""The bench registry (`bench.common.Benchmark`, `bench.registry.BENCHMARKS`): every benchmark
module offers its flags and its run; `gpu-binder bench` lists the registry's, `python -m
bench.NAME` runs a module's own through the same `Benchmark`, and listing them imports no
cluster harness (so `gpu-binder --help` stays fast)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import Benchmark, quantile
from bench.registry import BENCHMARKS

REPO = Path(__file__).resolve().parents[2]
MODULES = ("admission_path", "core", "defrag_round", "device_decide", "dra_memory", "event_cost", "keep",
           "model_decide", "results_table")
"""The benchmarks run as `python -m bench.NAME` (core also as `gpu-binder bench core`)."""


def test_the_command_lines_benchmarks_are_the_registrys_in_order():
    assert [b.name for b in BENCHMARKS] == ["core", "e2e", "floor", "packing", "contention", "fairness",
                                         "scale", "soak", "health"]
    assert all(isinstance(b, Benchmark) and b.help for b in BENCHMARKS)


@pytest.mark.parametrize("name", MODULES)
def test_python_dash_m_goes_through_the_modules_benchmark(name, capsys):
    benchmark = importlib.import_module(f"bench.{name}").BENCHMARK
    assert benchmark.name == name
    with pytest.raises(SystemExit) as exc:
        benchmark.main(["--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m bench.{name} ")


def test_a_refused_value_of_a_module_run_is_exit_2_naming_the_flag(capsys):
    from bench.defrag_round import BENCHMARK

    assert BENCHMARK.main(["--fill", "1.5"]) == 2
    assert "--fill must be between 0 and 1, got 1.5" in capsys.readouterr().err


def test_listing_the_benchmarks_imports_no_cluster_harness():
    code = ("import sys, cli.main; cli.main.build_parser(); "
            "print(sorted(m for m in ('kubernetes_asyncio', 'localcluster.fleet', "
            "'localcluster.cluster', 'bench.scale.measure', 'bench.soak.driver', "
            "'bench.health.driver') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_lazy_names_of_scale_and_soak_are_still_theirs():
    from bench.scale import populate, run as scale_run
    from bench.soak import run as soak_run, soak_on

    assert (scale_run.__module__, populate.__module__) == ("bench.scale.measure",
                                                          "bench.scale.population")
    assert (soak_run.__module__, soak_on.__module__) == ("bench.soak.driver", "bench.soak.driver")
    with pytest.raises(AttributeError):
        importlib.import_module("bench.scale").no_such_name


def test_one_quantile_nearest_rank():
    samples = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert [quantile(samples, q) for q in (0.2, 0.5, 0.99, 1.0)] == [1.0, 3.0, 5.0, 5.0]
    with pytest.raises(ValueError):
        quantile([], 0.5)
