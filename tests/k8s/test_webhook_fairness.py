"""`k8s.webhook.fairness`: the fair share of the webhook's concurrency per tenant (issue 23)
and the per-tenant Event budget, on fake loop time (tests/timing.FAKE_TIME): a wait for a turn
runs out only when nothing else could happen first, never because the machine is slow."""

from __future__ import annotations

import anyio
import pytest

from fakes.clock import ManualClock
from k8s.webhook.fairness import Busy, EventBudget, GateStatistics, TenantGate
from tests.timing import FAKE_TIME, advance, eventually


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


pytestmark = pytest.mark.anyio


async def _hold(gate: TenantGate, tenant: str, order: list[str], release: anyio.Event) -> None:
    async with gate.slot(tenant):
        order.append(tenant)
        await release.wait()


async def test_a_tenant_holds_at_most_its_share_and_the_rest_wait_in_its_line():
    gate = TenantGate(capacity=8, per_tenant=2, queue=3, max_wait=10)
    release, order = anyio.Event(), []
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(_hold, gate, "a", order, release)
        await eventually(lambda: gate.statistics().waiting == 3, what="a's line full")
        assert gate.statistics().tenants == {"a": (2, 3)}
        with pytest.raises(Busy) as busy:  # a sixth: the line is full, turned away at once
            await gate.enter("a")
        assert (busy.value.in_flight, busy.value.waiting, busy.value.waited) == (2, 3, 0.0)
        gate.enter_nowait("b")  # another tenant is not held up by a's line
        gate.leave("b")
        release.set()
    assert order == ["a"] * 5
    assert gate.statistics().in_flight == 0 and gate.statistics().tenants == {}
    assert gate.statistics().peak_per_tenant == 2  # a's share, reached and never passed


async def test_freed_slots_go_round_robin_over_the_tenants_waiting():
    gate = TenantGate(capacity=1, per_tenant=1, queue=10, max_wait=10)
    order: list[str] = []
    gate.enter_nowait("x")  # the one slot is taken: everyone below waits


    async def one(tenant: str) -> None:
        async with gate.slot(tenant):
            order.append(tenant)

    async with anyio.create_task_group() as tg:
        for _ in range(4):  # a's burst arrives first ...
            tg.start_soon(one, "a")
        await eventually(lambda: gate.statistics().waiting == 4, what="a's burst waiting")
        for _ in range(2):  # ... then b's two
            tg.start_soon(one, "b")
        await eventually(lambda: gate.statistics().waiting == 6, what="b waiting")
        gate.leave("x")
    assert order == ["a", "b", "a", "b", "a", "a"]


async def test_a_wait_for_a_turn_is_bounded_and_then_busy():
    gate = TenantGate(capacity=1, per_tenant=1, queue=4, max_wait=2.0)
    gate.enter_nowait("a")
    with pytest.raises(Busy) as busy:
        await gate.enter("b")
    assert busy.value.waited == pytest.approx(2.0)
    assert gate.statistics().waiting == 0  # the line keeps no trace of it
    gate.leave("a")
    gate.enter_nowait("b")  # the slot is free again


async def test_a_waiter_cancelled_after_its_turn_came_hands_the_slot_on():
    gate = TenantGate(capacity=1, per_tenant=1, queue=4, max_wait=10)
    gate.enter_nowait("a")
    got: list[str] = []
    b_scope = anyio.CancelScope()

    async def waits(tenant: str, scope: anyio.CancelScope) -> None:
        with scope:
            async with gate.slot(tenant):
                got.append(tenant)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waits, "b", b_scope)
        await eventually(lambda: gate.statistics().waiting == 1, what="b waiting")
        tg.start_soon(waits, "c", anyio.CancelScope())
        await eventually(lambda: gate.statistics().waiting == 2, what="c waiting")
        gate.leave("a")  # b's turn: granted, but b has not run since ...
        assert gate.statistics().tenants == {"b": (1, 0), "c": (0, 1)}
        b_scope.cancel()  # ... and b is cancelled before it resumes: b either holds the
        # slot and gives it back, or never held it; either way c gets it and nothing leaks
        await eventually(lambda: "c" in got, what="c got the slot")
    assert got in (["c"], ["b", "c"])
    assert gate.statistics() == GateStatistics(0, 0, {}, peak_per_tenant=1)


async def test_leave_without_a_slot_is_a_bug():
    with pytest.raises(ValueError):
        TenantGate(capacity=1, per_tenant=1, queue=0, max_wait=1).leave("a")
    with pytest.raises(ValueError):
        TenantGate(capacity=1, per_tenant=2, queue=0, max_wait=1)


async def test_nothing_is_granted_to_a_full_tenant_even_when_slots_are_free():
    gate = TenantGate(capacity=4, per_tenant=1, queue=4, max_wait=5)
    gate.enter_nowait("a")
    entered: list[str] = []

    async def waits() -> None:
        try:
            await gate.enter("a")
            entered.append("a")
        except Busy:
            entered.append("busy")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waits)
        await advance(4.9)
        assert entered == []  # three slots free, but a already holds its share
        gate.leave("a")
        await eventually(lambda: entered == ["a"], what="a's second turn")
        gate.leave("a")


def test_event_budget_is_a_burst_then_a_steady_rate_per_tenant():
    clock = ManualClock()
    budget = EventBudget(burst=3, per_second=0.5, clock=clock.monotonic)
    assert [budget.take("a") for _ in range(4)] == [True, True, True, False]
    assert budget.take("b")  # a's flood does not spend b's budget
    clock.advance(1.9)
    assert not budget.take("a")
    clock.advance(0.2)  # 2 s: one Event more
    assert budget.take("a") and not budget.take("a")
    clock.advance(60)  # refills up to the burst, no further
    assert [budget.take("a") for _ in range(4)] == [True, True, True, False]
    assert budget.dropped == 4


def test_a_turn_refused_is_a_retryable_429_that_says_when_to_retry():
    from k8s.webhook.review import refusal_denial
    from model.admission import Refusal
    from model.reasons import Code, TenantBusy

    denial = refusal_denial(Refusal(TenantBusy("t-a", 4, 16, 0.0, retry_after=1)))
    assert denial.status() == {
        "code": 429, "reason": "TooManyRequests",
        "message": "tenant t-a has 4 GPU admissions in progress at this gpu-binder replica "
                   "(its fair share) and 16 more wait for a turn; too many requests, retry "
                   "after 1 s"}
    assert denial.retryable and Code.TENANT_BUSY.category.value == "throttled"
    waited = refusal_denial(Refusal(TenantBusy("t-a", 4, 2, 5.0, retry_after=1)))
    assert "waited 5.0 s for a turn" in waited.message
