"""`actors.workqueue.WorkQueue(fair_by=...)`: keys handed out round-robin over their groups
(the coordinator's tenants, issue 23), on a manual clock: no sleeps."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.workqueue import WorkQueue
from fakes.clock import ManualClock


def _tenant(key: tuple[str, str]) -> str:
    return key[0]


def _drain(q: WorkQueue) -> list:
    out = []
    while True:
        try:
            key = q.get_nowait()
        except anyio.WouldBlock:
            return out
        out.append(key)
        q.done(key)


def test_one_tenants_burst_does_not_make_anothers_request_wait_behind_it():
    q: WorkQueue[tuple[str, str]] = WorkQueue(ManualClock(), fair_by=_tenant)
    q.add_all(("a", f"r{i}") for i in range(100))
    q.add(("b", "r0"))
    q.add(("b", "r1"))
    got = [q.get_nowait() for _ in range(5)]
    assert got == [("a", "r0"), ("b", "r0"), ("a", "r1"), ("b", "r1"), ("a", "r2")]


def test_fifo_within_a_tenant_and_a_new_tenant_goes_first():
    q: WorkQueue[tuple[str, str]] = WorkQueue(ManualClock(), fair_by=_tenant)
    q.add_all([("a", "1"), ("a", "2"), ("b", "1")])
    assert q.get_nowait() == ("a", "1")
    q.add(("c", "1"))  # b and c never served: before a, in queue order
    assert [q.get_nowait() for _ in range(3)] == [("b", "1"), ("c", "1"), ("a", "2")]


def test_deferred_keys_join_their_tenants_turn_when_due():
    clock = ManualClock()
    q: WorkQueue[tuple[str, str]] = WorkQueue(clock, fair_by=_tenant)
    q.add_all([("a", "1"), ("a", "2"), ("a", "3")])
    q.add_after(("b", "1"), 1.0)
    assert q.get_nowait() == ("a", "1")
    clock.advance(1.0)
    assert q.get_nowait() == ("b", "1")
    assert q.get_nowait() == ("a", "2")


def test_without_fair_by_the_queue_stays_fifo():
    q: WorkQueue[tuple[str, str]] = WorkQueue(ManualClock())
    q.add_all([("a", "1"), ("a", "2"), ("b", "1")])
    assert _drain(q) == [("a", "1"), ("a", "2"), ("b", "1")]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 30)), max_size=80))
def test_every_key_comes_out_once_and_no_tenant_waits_two_turns_of_another(adds):
    q: WorkQueue[tuple[str, int]] = WorkQueue(ManualClock(), fair_by=_tenant)
    q.add_all(adds)
    out = _drain(q)
    assert sorted(out) == sorted(set(adds))  # coalesced, nothing lost
    for t in "abcd":  # FIFO within a tenant
        mine = [k for k in out if k[0] == t]
        assert mine == sorted(set(k for k in adds if k[0] == t),
                              key=[k for k in dict.fromkeys(adds)].index)
    # while a tenant still had keys waiting, no other tenant was served twice in between
    for i, key in enumerate(out):
        left = {k[0] for k in out[i:]}
        window = out[i:i + len(left)]
        assert len({k[0] for k in window}) == len(window), (out, i)


@pytest.mark.anyio
async def test_a_waiting_get_takes_the_fair_key():
    q: WorkQueue[tuple[str, str]] = WorkQueue(fair_by=_tenant)
    q.add_all([("a", "1"), ("a", "2")])
    assert await q.get(timeout=1) == ("a", "1")
    q.add(("b", "1"))
    assert await q.get(timeout=1) == ("b", "1")
