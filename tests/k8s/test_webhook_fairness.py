"""`k8s.webhook.fairness`: the fair share of the webhook's concurrency per tenant (issue 23),
work-conserving (issue 31: a tenant alone uses every slot), and the per-tenant Event budget, on fake loop time (tests/timing.FAKE_TIME): a wait for a turn
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


async def test_a_tenant_alone_uses_every_slot_and_waits_only_for_a_free_one():
    """Issue 31: work-conserving; a share binds only while another tenant waits."""
    gate = TenantGate(capacity=8, per_tenant=2)
    release, order = anyio.Event(), []
    async with anyio.create_task_group() as tg:
        for _ in range(11):
            tg.start_soon(_hold, gate, "a", order, release)
        await eventually(lambda: gate.statistics().waiting == 3, what="a's three beyond 8")
        assert gate.statistics().tenants == {"a": (8, 3)}  # all 8 slots, not its share of 2
        assert gate.statistics().lent == 6                  # 6 of them past its share
        with pytest.raises(anyio.WouldBlock):  # full: even another tenant waits now
            gate.enter_nowait("b")
        release.set()
    assert order == ["a"] * 11
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.tenants) == (0, 0, {})
    assert (stats.peak_per_tenant, stats.peak_contended) == (8, 0)  # nobody else ever waited


async def test_a_full_line_is_turned_away_at_once_when_a_queue_is_set():
    gate = TenantGate(capacity=2, per_tenant=1, queue=3)
    release, order = anyio.Event(), []
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(_hold, gate, "a", order, release)
        await eventually(lambda: gate.statistics().waiting == 3, what="a's line full")
        with pytest.raises(Busy) as busy:  # a sixth: the line is full, turned away at once
            await gate.enter("a")
        assert (busy.value.in_flight, busy.value.waiting, busy.value.waited) == (2, 3, 0.0)
        release.set()
    assert order == ["a"] * 5


async def test_two_tenants_b_gets_the_freed_slots_and_a_is_held_to_its_share_while_b_waits():
    gate = TenantGate(capacity=4, per_tenant=2)
    done = {t: [anyio.Event() for _ in range(8)] for t in "ab"}
    grants: list[tuple[str, dict]] = []  # (tenant, the gate's tenants just after its grant)
    n = {"a": 0, "b": 0}

    async def one(tenant: str) -> None:
        async with gate.slot(tenant):
            i = n[tenant]
            n[tenant] += 1
            grants.append((tenant, gate.statistics().tenants))
            await done[tenant][i].wait()

    async with anyio.create_task_group() as tg:
        for _ in range(8):  # a's flood: 4 in flight (all the slots: nobody else asks), 4 wait
            tg.start_soon(one, "a")
        await eventually(lambda: gate.statistics().tenants == {"a": (4, 4)}, what="a's flood")
        for _ in range(3):  # b arrives: the gate is full, b waits
            tg.start_soon(one, "b")
        await eventually(lambda: gate.statistics().waiting == 7, what="b waiting")
        assert gate.statistics().tenants == {"a": (4, 4), "b": (0, 3)}
        # a's admissions finish one by one: the first two freed slots go to b (under its
        # share), none to a (at or above its share while b waits)
        for i in range(2):
            done["a"][i].set()
            await eventually(lambda: n["b"] == i + 1, what=f"b's turn {i + 1}")
        assert gate.statistics().tenants == {"a": (2, 4), "b": (2, 1)}
        done["a"][2].set()  # a under its share now: its next turn, b (at its share) waits
        await eventually(lambda: n["a"] == 5, what="a's turn")
        assert gate.statistics().tenants == {"a": (2, 3), "b": (2, 1)}
        done["b"][0].set()  # b's freed slot: b's (under its share again) third
        await eventually(lambda: n["b"] == 3, what="b's third turn")
        for t in "ab":  # the rest finish: a alone again takes what is free
            for e in done[t]:
                e.set()
    after_b_came = grants[4:]
    assert [t for t, _ in after_b_came] == ["b", "b", "a", "b", "a", "a", "a"]
    for tenant, held in after_b_came[:4]:  # while b waited: nobody past its share by a grant
        assert held[tenant][0] <= 2, (tenant, held)
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.peak_contended) == (0, 0, 2)


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
    assert gate.statistics() == GateStatistics(0, 0, {}, peak_per_tenant=1, peak_contended=1)


async def test_leave_without_a_slot_is_a_bug():
    with pytest.raises(ValueError):
        TenantGate(capacity=1, per_tenant=1, queue=0, max_wait=1).leave("a")
    with pytest.raises(ValueError):
        TenantGate(capacity=1, per_tenant=2, queue=0, max_wait=1)


async def test_a_wait_lasts_until_the_callers_deadline():
    gate = TenantGate(capacity=1, per_tenant=1)  # no max_wait: the deadline bounds it
    gate.enter_nowait("a")
    entered: list[str] = []

    async def waits(deadline: float) -> None:
        try:
            await gate.enter("b", deadline)
            entered.append("b")
        except Busy as busy:
            entered.append(f"busy after {busy.waited:g} s")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waits, anyio.current_time() + 7.5)
        await advance(7.4)
        assert entered == [] and gate.statistics().waiting == 1  # still in its line
        await advance(0.2)
        assert entered == ["busy after 7.5 s"] and gate.statistics().waiting == 0
        tg.start_soon(waits, anyio.current_time() + 7.5)
        await advance(3)
        gate.leave("a")  # freed before the deadline: b's
        await eventually(lambda: entered[-1] == "b", what="b's turn")
        gate.leave("b")
    assert gate.statistics() == GateStatistics(0, 0, {}, peak_per_tenant=1)


@pytest.mark.parametrize("seed", range(6))
async def test_random_arrivals_deadlines_and_cancellations_leak_no_slot(seed):
    """A seeded schedule: three tenants, 60 admissions arriving at random, each holding its
    slot a random time, a random deadline, every fifth cancelled at a random moment. Checked
    against the test's own count at every quiet moment: the gate's per-tenant (in flight,
    waiting) is what the tasks hold and wait for; no admission waits while a slot is free;
    nobody gains a slot past its share while another tenant waits under its share; at the
    end nothing is held and every admission got a slot, Busy at its deadline, or its
    cancellation."""
    import random

    rng = random.Random(seed)
    cap, share = 5, 2
    gate = TenantGate(capacity=cap, per_tenant=share)
    held = {t: 0 for t in "abc"}
    waiting = {t: 0 for t in "abc"}
    outcome: list[str] = []

    async def one(tenant: str, at: float, hold: float, patience: float,
                  scope: anyio.CancelScope) -> None:
        await anyio.sleep(at)
        waiting[tenant] += 1
        entered = False
        start = anyio.current_time()
        with scope:
            try:
                await gate.enter(tenant, start + patience)
                entered = True
            except Busy as busy:
                assert busy.waited == pytest.approx(patience, abs=0.01)  # looptime: ms steps
                outcome.append("busy")
            finally:
                waiting[tenant] -= 1
            if entered:
                held[tenant] += 1
                try:
                    await anyio.sleep(hold)
                    outcome.append("done")
                finally:
                    held[tenant] -= 1
                    gate.leave(tenant)
        if scope.cancelled_caught:
            outcome.append("cancelled")

    async def cancel_later(scope: anyio.CancelScope, at: float) -> None:
        await anyio.sleep(at)
        scope.cancel()

    async def watch() -> None:
        seen = None
        while True:
            stats = gate.statistics()
            now = {t: v for t, v in ((t, (held[t], waiting[t])) for t in "abc") if v != (0, 0)}
            assert stats.tenants == now
            assert stats.waiting == 0 or stats.in_flight == cap  # work-conserving
            if seen is not None:
                starved = [t for t in "abc" if seen[t][1] and seen[t][0] < share
                           and waiting[t] and held[t] < share]
                for u in "abc":
                    if starved and [t for t in starved if t != u] and held[u] > seen[u][0]:
                        assert held[u] <= share, (u, seen, now)
            seen = {t: (held[t], waiting[t]) for t in "abc"}
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        async with anyio.create_task_group() as admissions:
            for i in range(60):
                scope = anyio.CancelScope()
                at = rng.uniform(0, 20)
                admissions.start_soon(one, rng.choice("aab" if i < 40 else "abc"), at,
                                      rng.uniform(0.5, 4), rng.uniform(0.5, 6), scope)
                if i % 5 == 0:
                    admissions.start_soon(cancel_later, scope, at + rng.uniform(0, 5))
        tg.cancel_scope.cancel()
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.tenants) == (0, 0, {})
    assert len(outcome) == 60 and set(outcome) <= {"done", "busy", "cancelled"}
    assert outcome.count("done") > 20 and outcome.count("busy") > 0
    assert stats.peak_per_tenant > share and stats.lent > 0  # a tenant alone borrowed


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
        "message": "tenant t-a has 4 GPU admissions in progress at this busy gpu-binder "
                   "replica and 16 more wait for a turn of its fair share; too many requests, "
                   "retry after 1 s",
        "details": {"retryAfterSeconds": 1}}  # issue 31: the API server's Retry-After
    assert denial.retryable and Code.TENANT_BUSY.category.value == "throttled"
    waited = refusal_denial(Refusal(TenantBusy("t-a", 4, 2, 5.0, retry_after=2)))
    assert "this one waited 5.0 s for a turn" in waited.message
    assert waited.status()["details"] == {"retryAfterSeconds": 2}
