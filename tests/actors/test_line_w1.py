"""P5 for bare VMIs W1 refuses for room (docs/contract.md §3c P5): the webhook refuses such a
set before any bindRequest is written, so before the coordinator sees it; the leader's webhook
tells its coordinator (`RefusedAtW1`, `Binder.refused_at_w1`) and the set waits in the line
keyed by (namespace, vmi) with its priority and first refusal, answered 503 with Retry-After,
while its client retries (`line.retryGrace` without an attempt, and its place is gone). A smaller set that would take the room it waits for is then refused
`behind_in_line`, and the head's retry is admitted; refusals for anything else never enter; a
tenant's entries are bounded (`line.maxPerNamespace`).

The real webhook (`VMIAdmission`, W1 on its cache: the in-memory store) beside the real binder
on the same store, on fake time. bench contention lane (c)'s two inversions came from this gap."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta

import anyio
import orjson
import pytest

from actors.coordinator_protocol import RefusedAtW1
from fakes.kube_client import ScriptedClient
from k8s.webhook.admission import VMIAdmission
from k8s.webhook.review import decode
from model.line import DEFAULT_PER_NAMESPACE, DEFAULT_RETRY_GRACE, RETRY_AFTER, Identity, LineSettings
from model.priority import Priority
from model.reasons import Code
from model.types import Result
from tests.actors.test_line import H100, ask, fleet, line_of, new_set
from tests.support.binder import check_invariants, fast_config, quiet_logging, running_binder
from tests.timing import eventually
from tests.support.webhook_cache import StoreCache

pytestmark = pytest.mark.anyio

SPOT = Priority(100, class_name="spot")
ON_DEMAND = Priority(1000, class_name="on-demand")


def webhook(store, binder, told: list | None = None) -> VMIAdmission:
    """The leader's webhook: W1 on `store`, its line the binder's coordinator (as
    `k8s.controller.Controller.refused_at_w1` wires it); `told` records what it tells."""
    def line(e) -> bool:
        if told is not None:
            told.append(e)
        return binder.refused_at_w1(RefusedAtW1(e))
    return VMIAdmission(ScriptedClient(), StoreCache(store), bind_timeout=5.0,  # type: ignore[arg-type]
                        grace=timedelta(seconds=30), line=line)


_UIDS = itertools.count()


def review(vmi: str, n: int, *, pc: str | None = "spot", dry_run: bool = False, owner: str | None = None,
           ns: str = "t", cls: str = "h100"):
    """An AdmissionReview of creating `vmi`, with a uid of its own (each of a client's
    attempts reaches the webhook as a new review: `Entry.attempt`)."""
    meta: dict = {"name": vmi, "namespace": ns, "annotations": {"gpu.cozystack.io/templates": f"{cls}={n}"}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": vmi,
                                    "uid": owner, "controller": True}]
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"u-{vmi}-{next(_UIDS)}", "operation": "CREATE", "namespace": ns, "name": vmi, "dryRun": dry_run,
        "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
        "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
                   "spec": {"priorityClassName": pc} if pc else {}},
        "userInfo": {"username": "tenant"}}}
    return decode(orjson.dumps(doc))


def world(units: int = 8, busy: int = 1):
    s = fleet(units, busy)
    s.add_priority_class("spot", 100)
    s.add_priority_class("on-demand", 1000)
    return s


async def in_line(binder, want: list[str]) -> None:
    async def probe() -> bool:
        return [e.identity.vmi for e in (await line_of(binder)).line] == want
    await eventually(probe, timeout=5, what=f"the line {want}")


async def test_P5_a_bare_vmi_refused_at_W1_waits_and_a_later_smaller_set_cannot_take_its_room() -> None:
    quiet_logging()
    s = world(8, busy=1)
    async with running_binder(s) as binder:
        adm = webhook(s, binder)
        refused = await adm.handle(review("big", 8))           # 7 free, it needs 8: W1 refuses
        assert (refused["allowed"], refused["status"]["code"]) == (False, 503)  # it waits: retry
        await in_line(binder, ["big"])
        assert not (await line_of(binder)).line.entries[0].retried   # one attempt: not yet a place
        assert (await adm.handle(review("big", 8)))["status"]["code"] == 503   # its client retries

        async def real() -> bool:
            return (await line_of(binder)).line.entries[0].retried
        await eventually(real, timeout=5, what="big's place real after its retry")
        (big_entry,) = (await line_of(binder)).line
        assert big_entry.identity == Identity("t", "big") and big_entry.priority.value == 100
        assert big_entry.shape.templates == (("h100", 8),)
        s.delete_device(("o", "busy-0"))                         # room frees: the big set could start now
        small = new_set(s, "small", 1)                           # a later, smaller set of the same priority
        assert await ask(s, binder, "small", small, SPOT) == (Result.REFUSED, Code.BEHIND_IN_LINE)
        msg = s.device(("t", "small-h100-0")).status.bind_request.message
        assert "t/big (priority 100 spot" in msg
        # the big set's retry (W1 finds room now, W3 writes its request) is admitted and leaves
        big = new_set(s, "big", 8)
        assert await ask(s, binder, "big", big, SPOT) == (Result.SUCCEEDED, None)
        await in_line(binder, ["small"])
    assert check_invariants(s) == []


async def test_P5_a_lower_priority_set_cannot_take_the_room_either_and_a_retry_keeps_the_place() -> None:
    quiet_logging()
    s = world(8, busy=1)
    async with running_binder(s) as binder:
        adm = webhook(s, binder)
        assert (await adm.handle(review("big", 8, pc="on-demand")))["allowed"] is False
        await in_line(binder, ["big"])
        first = (await line_of(binder)).line.entries[0].first_refused
        await anyio.sleep(DEFAULT_RETRY_GRACE.total_seconds() - 1)  # its client retries within the grace
        assert (await adm.handle(review("big", 8, pc="on-demand")))["allowed"] is False

        async def refreshed() -> bool:
            (e,) = (await line_of(binder)).line
            return e.last_seen > first
        await eventually(refreshed, timeout=5, what="the retry seen")
        (e,) = (await line_of(binder)).line
        assert e.first_refused == first and e.priority.value == 1000    # its place kept
        s.delete_device(("o", "busy-0"))
        small = new_set(s, "small", 2)
        assert (await ask(s, binder, "small", small, SPOT))[1] is Code.BEHIND_IN_LINE
    assert check_invariants(s) == []


async def test_P5_a_bare_vmi_whose_client_stopped_retrying_leaves_after_the_ttl() -> None:
    quiet_logging()
    s = world(8, busy=1)
    async with running_binder(s) as binder:
        adm = webhook(s, binder)
        assert (await adm.handle(review("big", 8)))["allowed"] is False
        await in_line(binder, ["big"])
        await anyio.sleep(DEFAULT_RETRY_GRACE.total_seconds() + 2)      # no retry: its client gave up
        await in_line(binder, [])
        s.delete_device(("o", "busy-0"))
        small = new_set(s, "small", 1)
        assert await ask(s, binder, "small", small, SPOT) == (Result.SUCCEEDED, None)


async def test_P5_refusals_for_anything_but_room_and_dry_runs_and_vms_never_enter() -> None:
    quiet_logging()
    s = world(8, busy=1)
    s.add_budget("t", H100, 4)
    async with running_binder(s) as binder:
        told: list = []
        adm = webhook(s, binder, told)
        over = await adm.handle(review("over", 8))               # budget 4: refused for the budget
        assert over["allowed"] is False and over["status"]["code"] == 403
        assert "budget" in over["status"]["message"].lower()
        bad = await adm.handle(review("typo", 1, cls="h1000"))   # a class that does not exist
        assert bad["allowed"] is False
        huge = await adm.handle(review("huge", 9))                # a size no node has
        assert huge["allowed"] is False
        assert told == []
    s2 = world(8, busy=5)
    async with running_binder(s2) as binder:
        told = []
        adm = webhook(s2, binder, told)
        dry = await adm.handle(review("dry", 4, dry_run=True))   # 3 free: for room, but a dry run
        vm = await adm.handle(review("vm", 4, owner="vm-uid"))   # for room, but a VM's VMI
        assert dry["allowed"] is False and vm["allowed"] is False
        assert told == []
        assert len((await line_of(binder)).line) == 0


async def test_P5_a_tenant_cannot_grow_the_line_past_its_bound_and_others_still_enter() -> None:
    quiet_logging()
    s = world(8, busy=8)
    s.add_namespace("u")
    cfg = fast_config()
    cfg = replace(cfg, coordinator=replace(cfg.coordinator, line=LineSettings(per_namespace=2)))
    async with running_binder(s, config=cfg) as binder:
        adm = webhook(s, binder)
        for i in range(5):                                        # a hostile tenant's flood
            assert (await adm.handle(review(f"flood-{i}", 1)))["allowed"] is False
        assert (await adm.handle(review("other", 1, ns="u")))["allowed"] is False
        await in_line(binder, ["flood-0", "flood-1", "other"])
        # the tenant's own set of higher priority takes the place of its last
        assert (await adm.handle(review("vip", 1, pc="on-demand")))["allowed"] is False
        await in_line(binder, ["vip", "flood-0", "other"])


async def test_P5_a_place_not_retried_within_the_grace_holds_back_nobody_even_before_a_resync() -> None:
    """A bare VMI's place is real only while its client retries (`line.retryGrace`, 10 s: five
    Retry-After periods). An abandoned create (kubectl's after its retries, or a client that
    never retries) stops holding back the sets behind it once the grace has passed, at the
    next decision: the coordinator tidies before each batch, not only at its resync (an hour
    here). Before: its place held for 2 minutes (tests/e2e/test_vm_keep_devices.py's 15 s)."""
    quiet_logging()
    s = world(8, busy=1)
    cfg = fast_config()
    cfg = replace(cfg, coordinator=replace(cfg.coordinator, resync_interval=3600.0))
    async with running_binder(s, config=cfg) as binder:
        adm = webhook(s, binder)
        assert (await adm.handle(review("big", 8)))["status"]["code"] == 503
        await in_line(binder, ["big"])
        await anyio.sleep(RETRY_AFTER)                           # its client retries once: a real place
        assert (await adm.handle(review("big", 8)))["status"]["code"] == 503
        s.delete_device(("o", "busy-0"))                         # room frees; then big's client stops
        await anyio.sleep(DEFAULT_RETRY_GRACE.total_seconds() - RETRY_AFTER)
        early = new_set(s, "early", 1)
        assert await ask(s, binder, "early", early, SPOT) == (Result.REFUSED, Code.BEHIND_IN_LINE)
        await anyio.sleep(RETRY_AFTER + 1)                       # the grace passed without an attempt
        late = new_set(s, "late", 1)
        assert await ask(s, binder, "late", late, SPOT) == (Result.SUCCEEDED, None)
        assert [e.identity.vmi for e in (await line_of(binder)).line] == ["early"]
    assert check_invariants(s) == []


async def test_P5_attacker_a_flood_of_bare_creates_holds_at_most_its_bound_and_only_while_retried() -> None:
    """A tenant flooding bare creates refused for room: each is answered 503 (retry), the
    tenant holds at most `line.maxPerNamespace` places (the default, 100), another tenant's
    set still enters; when the flood stops retrying, every one of its places is gone within
    the grace, and the other tenant's set, which kept retrying, is the whole line."""
    quiet_logging()
    s = world(8, busy=8)
    s.add_namespace("u")
    async with running_binder(s) as binder:
        adm = webhook(s, binder)
        for i in range(DEFAULT_PER_NAMESPACE + 20):
            got = await adm.handle(review(f"flood-{i}", 1))
            assert got["status"]["code"] == 503, got
            if i % 10 == 9:
                await anyio.sleep(0.01)                          # (a full mailbox drops a tell)
        assert (await adm.handle(review("other", 1, ns="u")))["status"]["code"] == 503
        want = [f"flood-{i}" for i in range(DEFAULT_PER_NAMESPACE)]

        async def bounded() -> bool:
            line = (await line_of(binder)).line
            return sorted(e.identity.vmi for e in line if e.identity.namespace == "t") == sorted(want) \
                and any(e.identity.namespace == "u" for e in line)
        await eventually(bounded, timeout=5, what="the flood capped at its bound, the other tenant in")
        for _ in range(2 * round(DEFAULT_RETRY_GRACE.total_seconds() / RETRY_AFTER)):
            await anyio.sleep(RETRY_AFTER)                       # only the other tenant retries
            assert (await adm.handle(review("other", 1, ns="u")))["status"]["code"] == 503
        await in_line(binder, ["other"])
    assert check_invariants(s) == []
