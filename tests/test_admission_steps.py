"""The webhook's concurrent W3 steps (k8s/admission.py `_each`): every device written, a
bounded number at once, and the first failure raised as it is (Denied before an API error)."""

from __future__ import annotations

import anyio
import pytest

from k8s import errors
from k8s.admission import STEP_PARALLEL, Denied, _each

pytestmark = pytest.mark.anyio


async def test_every_item_is_done_and_no_more_than_the_bound_at_once() -> None:
    done: list[int] = []
    running = peak = 0

    async def write(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.001)
        running -= 1
        done.append(i)

    await _each(write, list(range(20)))
    assert sorted(done) == list(range(20))
    assert peak == STEP_PARALLEL


async def test_a_denial_is_raised_as_it_is_before_an_api_error() -> None:
    async def write(name: str) -> None:
        if name == "api":
            raise errors.Conflict("patch GPUDevice t/api", 409, "conflict")
        if name == "taken":  # fails in the same step as "api": both are in the group
            raise Denied("GPU device taken is attached to VMI other")
        await anyio.sleep(1)  # cancelled by the failures

    with anyio.fail_after(0.5):
        with pytest.raises(Denied, match="attached to VMI other"):
            await _each(write, ["api", "slow", "taken"])


async def test_one_item_runs_inline_and_its_error_is_not_wrapped() -> None:
    async def write(name: str) -> None:
        raise errors.Conflict(f"patch GPUDevice t/{name}", 409, "conflict")

    with pytest.raises(errors.Conflict):
        await _each(write, ["only"])
