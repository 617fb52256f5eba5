"""P5 at the webhook (docs/contract.md §3c P5, `VMIAdmission._in_line`): a bare VMI W1 refuses
for room takes its place in the leader's line. On the leader (`line` answers True) W1's refusal
stands after the line is told; on a follower (False: no coordinator here) the set goes on to
the binder the way every decision reaches the leader (W3 writes its bindRequest, the binder's
refusal enters the leader's line), and the tenant gets W1's refusal all the same (the answer
does not depend on the replica), unless the binder nominates for it (P4: its 503); a webhook
without `line` refuses as before, writing nothing.
On the in-memory store and a scripted client: no API server."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.webhook import steps
from k8s.webhook.admission import VMIAdmission
from k8s.webhook.steps import Denied
from model.reasons import BinderRefused, Code
from tests.actors.test_line_w1 import review, world
from tests.support.webhook_cache import StoreCache
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def admission(store, client, monkeypatch, bodies: list, line, binder=Code.NO_ELIGIBLE_NODE) -> VMIAdmission:
    async def attached(api, attempt, request, plan, written) -> None:
        bodies.append(request)  # W3 (2)/(3): the bindRequest the leader's binder decides

    async def refused(waiter, attempt, names, timeout, bind_timeout) -> str:  # the binder's answer
        raise Denied(BinderRefused(attempt.namespace, attempt.vmi, f"the binder: {binder.value}", binder,
                                   7 if binder is Code.PREEMPTION_NOMINATED else None))
    monkeypatch.setattr(steps, "attach_all", attached)
    monkeypatch.setattr(steps, "wait_result", refused)
    client.script("get", errors.NotFound("read VMI t/big", 404, 'virtualmachineinstances "big" not found',
                                         reason="NotFound", details={"name": "big"}))
    return VMIAdmission(client, StoreCache(store), bind_timeout=5.0,  # type: ignore[arg-type]
                        grace=timedelta(seconds=30), line=line)


async def test_P5_on_a_follower_a_bare_vmi_refused_for_room_at_W1_goes_on_to_the_binder(monkeypatch):
    leader = await admission(world(8, busy=1), ScriptedClient(), monkeypatch, [], lambda e: True).handle(
        review("big", 8))
    store, client, bodies, told = world(8, busy=1), ScriptedClient(), [], []
    adm = admission(store, client, monkeypatch, bodies, lambda e: told.append(e) or False)
    answer = await adm.handle(review("big", 8))
    assert [e.identity.vmi for e in told] == ["big", "big"]  # W1 on the cache, then after the live read
    assert len(bodies) == 1 and bodies[0]["vmi"] == "big"    # its bindRequest written: the leader decides
    # the binder refused it for room too: W1's refusal, word for word the leader's answer
    assert answer["allowed"] is False and answer["status"] == leader["status"]
    assert answer["status"]["code"] == 403 and "the binder" not in answer["status"]["message"]
    assert "needs 8" in answer["status"]["message"]
    assert adm.rejected == {("t", Code.SET_NEEDS): 1}  # counted as W1's refusal, once


async def test_P5_on_a_follower_a_nomination_by_the_binder_is_the_answer(monkeypatch):
    store, client, bodies = world(8, busy=1), ScriptedClient(), []
    adm = admission(store, client, monkeypatch, bodies, lambda e: False, binder=Code.PREEMPTION_NOMINATED)
    answer = await adm.handle(review("big", 8))
    assert answer["status"]["code"] == 503 and answer["status"]["details"] == {"retryAfterSeconds": 7}
    assert answer["status"]["message"] == "the binder: preemption_nominated"


async def test_P5_on_the_leader_W1_s_refusal_stands_once_the_line_is_told(monkeypatch):
    store, client, bodies, told = world(8, busy=1), ScriptedClient(), [], []
    adm = admission(store, client, monkeypatch, bodies, lambda e: told.append(e) or True)
    answer = await adm.handle(review("big", 8))
    assert [e.identity.vmi for e in told] == ["big"] and bodies == []
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert [c.method for c in client.calls] == ["create_event"]  # no read, no write but W5's Event


async def test_P5_without_a_line_W1_refuses_for_room_as_before_and_writes_nothing(monkeypatch):
    store, client, bodies = world(8, busy=1), ScriptedClient(), []
    adm = admission(store, client, monkeypatch, bodies, None)
    answer = await adm.handle(review("big", 8))
    assert answer["allowed"] is False and answer["status"]["code"] == 403 and bodies == []
    assert [c.method for c in client.calls] == ["create_event"]
