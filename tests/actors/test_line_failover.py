"""P5 across a failover (docs/contract.md §3c P5, *Failover keeps the published places*): a
new leader's coordinator, or one its supervisor restarted, starts with an empty line; it
reads back the summary the leader published in each GPUClass's `status.line`, and a bare VMI
listed there that is refused again within `line.retryGrace` of its start keeps its first
refusal, so its place among equal priorities: B, refused before A on the old leader, is
ahead of A on the new one although A's client retried first. A listed set refused only after
that grace enters anew.

The real webhook (`VMIAdmission`) and binder on the in-memory store, on fake time; the
summary goes through the API's shape (`line_to_status` -> `published_lines`), as the leader's
`k8s.line_status.LineStatus` writes it and `k8s.line_status.ReadBack` reads it."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest

from model.line import DEFAULT_RETRY_GRACE, RETRY_AFTER
from model.line_status import line_to_status, published_lines, summarize
from supervisor.binder import COORDINATOR
from tests.actors.test_line import line_of
from tests.actors.test_line_w1 import in_line, review, webhook, world
from tests.support.binder import check_invariants, quiet_logging, running_binder
from tests.timing import eventually

pytestmark = pytest.mark.anyio


async def status_lines(binder) -> list[dict]:
    """The GPUClasses as the leader's `LineStatus` leaves them: each class's `status.line`."""
    state = await line_of(binder)
    return [{"metadata": {"name": c}, "status": {"line": line_to_status(cl)}}
            for c, cl in summarize(state.line, state.reservations).items()]


async def wait_in_line(adm, binder, names: list[str]) -> None:
    """Each of `names` in turn is refused for room at W1 (503: it waits), a second apart."""
    for name in names:
        assert (await adm.handle(review(name, 1)))["status"]["code"] == 503
        await anyio.sleep(1)
    await in_line(binder, sorted(names, key=names.index))


async def test_P5_a_new_leader_keeps_the_published_order_of_bare_vmis_refused_again() -> None:
    quiet_logging()
    s = world(8, busy=8)                                          # no room: everyone waits
    async with running_binder(s) as old:
        await wait_in_line(webhook(s, old), old, ["c", "b", "a"])  # c, then b, then a (all spot)
        before = {e.identity.vmi: e.first_refused for e in (await line_of(old)).line}
        classes = await status_lines(old)
    await anyio.sleep(15)                                         # the Lease expires: a new leader
    async with running_binder(s, published=lambda: published_lines(classes)) as new:
        adm = webhook(s, new)
        assert len((await line_of(new)).line) == 0                # it starts with an empty line
        assert (await adm.handle(review("a", 1)))["status"]["code"] == 503   # a's client first
        await in_line(new, ["a"])
        assert (await adm.handle(review("b", 1)))["status"]["code"] == 503   # then b's
        await in_line(new, ["b", "a"])                            # b is still ahead of a
        got = {e.identity.vmi: e.first_refused for e in (await line_of(new)).line}
        assert got == {"a": before["a"], "b": before["b"]}
        for _ in range(round(DEFAULT_RETRY_GRACE / timedelta(seconds=RETRY_AFTER)) + 1):
            await anyio.sleep(RETRY_AFTER)                        # a and b keep retrying
            for name in ("a", "b"):
                assert (await adm.handle(review(name, 1)))["status"]["code"] == 503
        assert (await adm.handle(review("c", 1)))["status"]["code"] == 503  # c after the grace:
        await in_line(new, ["b", "a", "c"])                       # a new place, behind them
        (c,) = [e for e in (await line_of(new)).line if e.identity.vmi == "c"]
        assert c.first_refused > before["c"]
    assert check_invariants(s) == []


async def test_P5_a_restarted_coordinator_reads_back_the_published_line_too() -> None:
    quiet_logging()
    s = world(8, busy=8)
    classes: list[dict] = []
    async with running_binder(s, published=lambda: published_lines(classes)) as binder:
        adm = webhook(s, binder)
        await wait_in_line(adm, binder, ["b", "a"])
        classes[:] = await status_lines(binder)                   # what the leader published
        before = {e.identity.vmi: e.first_refused for e in (await line_of(binder)).line}
        assert binder.supervisor.kill(COORDINATOR)

        async def restarted() -> bool:
            state = await binder.line(timeout=1.0)
            return state is not None and len(state.line) == 0
        await eventually(restarted, timeout=5, what="a new coordinator with an empty line")
        await anyio.sleep(RETRY_AFTER)
        for name in ("a", "b"):                                   # a's client retries first
            assert (await adm.handle(review(name, 1)))["status"]["code"] == 503
            await anyio.sleep(0.5)
        await in_line(binder, ["b", "a"])
        assert {e.identity.vmi: e.first_refused for e in (await line_of(binder)).line} == before
    assert check_invariants(s) == []
