"""P5's waiting line enforced by the coordinator (docs/contract.md §3c P5) through the whole
actor system on the in-memory store: a set refused for room waits; a smaller set that would
take the room a waiting set of higher priority could use now is refused `behind_in_line`;
the head is admitted once room frees; two sets of equal priority never block each other;
the line's length and the wait of a set that started reach the observer; a restarted
coordinator (a new leader) starts with an empty line."""

from __future__ import annotations

import anyio
import pytest

from actors.coordinator_protocol import GetLine, LineState
from fakes.memory_store import MemoryStore
from model.decide import Rule
from model.line import RETRY_AFTER, Identity
from model.priority import Priority
from model.reasons import Code
from model.types import Result
from supervisor import COORDINATOR
from tests.support.binder import check_invariants, kill_child, quiet_logging, results_of, running_binder, settle
from tests.timing import eventually

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"
ON_DEMAND = Priority(1000, class_name="on-demand")
SPOT = Priority(0, class_name="spot")


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


class Seen:
    """An observer of decisions and of the line (what `k8s.metrics.Metrics` is told)."""

    def __init__(self) -> None:
        self.lengths: list[dict[str, int]] = []
        self.left: list[tuple[Priority, tuple[str, ...], float]] = []

    def decided(self, rule: Rule, result: Result, code: Code | None, seconds: float) -> None:
        pass

    def line_changed(self, lengths) -> None:
        self.lengths.append(dict(lengths))

    def left_line(self, priority, classes, seconds) -> None:
        self.left.append((priority, tuple(classes), seconds))


def fleet(units: int, busy: int) -> MemoryStore:
    """Tenant `t`, class h100, node n1 with `units` H100, `busy` of them Bound to other sets
    (devices o/busy-<i>)."""
    s = MemoryStore()
    s.add_namespace("t")
    s.add_namespace("o")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: units})
    for i in range(busy):
        s.add_device("o", f"busy-{i}", "h100", node="n1")
    return s


def new_set(s: MemoryStore, vmi: str, n: int) -> list[str]:
    names = [f"{vmi}-h100-{i}" for i in range(n)]
    for name in names:
        s.add_device("t", name, "h100", template_for=vmi)
    return names


async def ask(s: MemoryStore, binder, vmi: str, names: list[str],
              priority: Priority) -> tuple[Result, Code | None]:
    """`vmi` asks for `names` (a create, or its retry: a new request id) and gets its answer."""
    rid = s.request("t", vmi, names, priority=priority)
    await settle(s, binder)
    (result,) = {v[0] for v in results_of(s, "t", rid).values()}
    return result, s.device(("t", names[0])).status.bind_request.code


async def line_of(binder) -> LineState:
    return await binder.coordinator.ask(GetLine(), timeout=2.0)


async def test_P5_a_1_gpu_set_is_refused_behind_a_waiting_8_gpu_set_then_the_head_starts() -> None:
    s = fleet(8, busy=1)
    seen = Seen()
    async with running_binder(s, observer=seen) as binder:
        big, small = new_set(s, "big", 8), new_set(s, "small", 1)
        assert (await ask(s, binder, "big", big, ON_DEMAND))[0] is Result.REFUSED  # 7 free: waits
        await anyio.sleep(RETRY_AFTER)  # its client retries after the 503's Retry-After: a real place
        assert (await ask(s, binder, "big", big, ON_DEMAND))[0] is Result.REFUSED
        state = await line_of(binder)
        assert [e.identity for e in state.line] == [Identity("t", "big")]
        assert seen.lengths[-1] == {"h100": 1}
        s.delete_device(("o", "busy-0"))  # room frees: 8 free, the big set could start now
        result, code = await ask(s, binder, "small", small, SPOT)
        assert (result, code) == (Result.REFUSED, Code.BEHIND_IN_LINE)
        state = await line_of(binder)
        assert [e.identity.vmi for e in state.line] == ["big", "small"]  # the small set waits too
        msg = s.device(("t", "small-h100-0")).status.bind_request.message
        assert "t/big (priority 1000 on-demand" in msg
        # the big set's retry is admitted, and leaves the line
        assert await ask(s, binder, "big", big, ON_DEMAND) == (Result.SUCCEEDED, None)
        assert [e.identity.vmi for e in (await line_of(binder)).line] == ["small"]
        assert [(p, c) for p, c, _ in seen.left] == [(ON_DEMAND, ("h100",))]
        assert seen.left[0][2] >= 0
        # no room now for the small set: refused for room, still waiting at the head
        result, code = await ask(s, binder, "small", small, SPOT)
        assert result is Result.REFUSED and code is not Code.BEHIND_IN_LINE
    assert check_invariants(s) == []


async def test_P5_backfill_a_small_set_starts_where_the_waiting_set_cannot_start_now() -> None:
    s = fleet(8, busy=2)
    async with running_binder(s) as binder:
        big, small = new_set(s, "big", 8), new_set(s, "small", 1)
        assert (await ask(s, binder, "big", big, ON_DEMAND))[0] is Result.REFUSED
        # 6 free: the big set cannot start now whatever the small one does
        assert await ask(s, binder, "small", small, SPOT) == (Result.SUCCEEDED, None)
    assert check_invariants(s) == []


async def test_P5_two_equal_priority_sets_never_block_each_other_in_a_cycle() -> None:
    s = fleet(4, busy=4)
    async with running_binder(s) as binder:
        a, b = new_set(s, "a", 4), new_set(s, "b", 4)
        assert (await ask(s, binder, "a", a, SPOT))[0] is Result.REFUSED  # a refused first
        assert (await ask(s, binder, "b", b, SPOT))[0] is Result.REFUSED
        await anyio.sleep(RETRY_AFTER)  # both clients retry after the Retry-After: real places
        assert (await ask(s, binder, "a", a, SPOT))[0] is Result.REFUSED
        assert (await ask(s, binder, "b", b, SPOT))[0] is Result.REFUSED
        assert [e.identity.vmi for e in (await line_of(binder)).line] == ["a", "b"]
        for i in range(4):
            s.delete_device(("o", f"busy-{i}"))
        # b retries first: a, ahead of it, could start now: b waits; a is never held back by b
        assert await ask(s, binder, "b", b, SPOT) == (Result.REFUSED, Code.BEHIND_IN_LINE)
        assert await ask(s, binder, "a", a, SPOT) == (Result.SUCCEEDED, None)
        assert [e.identity.vmi for e in (await line_of(binder)).line] == ["b"]
        for name in a:  # a stops: its room frees, and b, now the head, starts
            s.delete_device(("t", name))
        assert await ask(s, binder, "b", b, SPOT) == (Result.SUCCEEDED, None)
        assert len((await line_of(binder)).line) == 0
    assert check_invariants(s) == []


async def test_P5_a_new_coordinator_starts_with_an_empty_line_rebuilt_by_the_next_refusals() -> None:
    """docs/contract.md P5 *Wired in*: the line is not in the API; a restarted coordinator (as a
    new leader) starts empty, and positions follow the next refusals (priority first)."""
    s = fleet(4, busy=4)
    async with running_binder(s) as binder:
        a, b = new_set(s, "a", 4), new_set(s, "b", 4)
        assert (await ask(s, binder, "a", a, SPOT))[0] is Result.REFUSED
        assert (await ask(s, binder, "b", b, SPOT))[0] is Result.REFUSED
        assert [e.identity.vmi for e in (await line_of(binder)).line] == ["a", "b"]
        old = binder.coordinator.statistics().restarts
        assert kill_child(binder, COORDINATOR)
        await eventually(lambda: binder.coordinator.statistics().restarts > old
                         and binder.coordinator.statistics().running, what="coordinator restarted")
        await settle(s, binder)
        assert len((await line_of(binder)).line) == 0
        # b retries first after the restart: it is now ahead of a
        assert (await ask(s, binder, "b", b, SPOT))[0] is Result.REFUSED
        assert (await ask(s, binder, "a", a, SPOT))[0] is Result.REFUSED
        assert [e.identity.vmi for e in (await line_of(binder)).line] == ["b", "a"]
    assert check_invariants(s) == []
