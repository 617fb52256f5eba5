"""Shared pytest configuration.

- `anyio_backend`: anyio's own pytest plugin runs `@pytest.mark.anyio` tests on asyncio
  (session scoped, so session-scoped async fixtures work). tests/actors, tests/supervisor
  and the Lease, housekeeping and admission-step modules of tests/k8s override it with
  `tests.timing.FAKE_TIME` (fake loop time, looptime); e2e tests run on real time.
- `--chaos-seeds=N`: how many seeds the `chaos` tests run (default 200); each seed is one
  schedule (tests/actors/test_chaos.py), replayed the same way every time.
"""

from __future__ import annotations

import pytest

DEFAULT_CHAOS_SEEDS = 200


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-seeds",
        type=int,
        default=DEFAULT_CHAOS_SEEDS,
        help=f"number of seeds for @pytest.mark.chaos tests (default {DEFAULT_CHAOS_SEEDS})",
    )
    parser.addoption(
        "--chaos-first-seed",
        type=int,
        default=0,
        help="first chaos seed (rerun one failure with --chaos-first-seed=S --chaos-seeds=1)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chaos_seed" in metafunc.fixturenames:
        first = metafunc.config.getoption("--chaos-first-seed")
        count = metafunc.config.getoption("--chaos-seeds")
        metafunc.parametrize("chaos_seed", range(first, first + count))


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
