"""bench.client_cpu's flags: the ways of calling and the counts are checked before any
control plane starts (the measurement itself runs on one: the lead's runs, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.client_cpu import BENCHMARK, WAYS, _ways


def test_the_ways_are_a_subset_of_the_known_ones():
    assert _ways("client") == ("client",)
    assert _ways(" kubernetes-asyncio , client") == ("kubernetes-asyncio", "client")
    assert set(WAYS) == {"client", "kubernetes-asyncio"}


@pytest.mark.parametrize("argv", [["--via", "urllib3"], ["--via", ","], ["--calls", "0"],
                                  ["--rounds", "0"], ["--concurrency", "0"],
                                  # '' named the working directory: IsADirectoryError after the run
                                  ["--out", ""]])
def test_refused_flags_exit_2_before_anything_starts(argv, capsys):
    with pytest.raises(SystemExit) as out:
        BENCHMARK.main(argv)
    assert out.value.code == 2
    assert "usage: python -m bench.client_cpu" in capsys.readouterr().err
