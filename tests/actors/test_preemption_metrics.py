"""The coordinator tells its observer of each preemption it decides (P4, docs/metrics.md):
a fresh nomination is one preemption of the preemptor's classes with its victims counted; a
nomination reused on the preemptor's retry is not counted again."""

from __future__ import annotations

import anyio
import pytest

from fakes.clock import LoopClock
from model.reasons import Code
from model.types import Result
from supervisor import Binder
from tests.actors.test_preemption import ON_DEMAND, SPOT, add_set, config, full_store, result
from tests.support.binder import quiet_logging, settle

pytestmark = pytest.mark.anyio


class Seen:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, ...], int]] = []

    def decided(self, rule, result, code, seconds) -> None:
        pass

    def preempted(self, classes, victims) -> None:
        self.calls.append((tuple(classes), victims))


async def test_P4_a_fresh_nomination_is_one_preemption_of_its_classes_with_its_victims_counted_once():
    quiet_logging()
    s = full_store()
    seen = Seen()
    binder = Binder(s, s, s, LoopClock(), config(), observer=seen, nominations=s)
    async with anyio.create_task_group() as tg:
        await tg.start(binder.run)
        add_set(s, "spot", "a", 2, SPOT), add_set(s, "spot", "b", 2, SPOT)
        await settle(s, binder)
        await anyio.sleep(1)  # the sets run a while (min runtime 0)
        rid = add_set(s, "p", "vm-9", 4, ON_DEMAND)
        await settle(s, binder)
        assert result(s, "p", rid)[:2] == (Result.REFUSED, Code.PREEMPTION_NOMINATED)
        assert seen.calls == [(("h100",), 2)]
        again = add_set(s, "p", "vm-9", 4, ON_DEMAND)  # the retry, victims still running: reused
        await settle(s, binder)
        assert result(s, "p", again)[:2] == (Result.REFUSED, Code.PREEMPTION_NOMINATED)
        assert seen.calls == [(("h100",), 2)]
        tg.cancel_scope.cancel()
