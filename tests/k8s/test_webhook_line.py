"""P5 at the webhook (docs/contract.md §3c P5, `VMIAdmission._in_line`): a bare VMI W1 refuses
for room takes its place in the leader's line. On the leader (`line` answers True) W1's refusal
stands after the line is told; on a follower (False: no coordinator here) the set goes on to
the binder the way every decision reaches the leader (W3 writes its bindRequest, the binder's
refusal enters the leader's line), and the tenant gets W1's refusal all the same (the answer
does not depend on the replica), unless the binder nominates for it (P4: its 503); a webhook
without `line` refuses as before, writing nothing.
A set that waits so is answered 503 with Retry-After (`WaitsInLine`: W1's words, then the
line's), so that a client honouring it keeps retrying and its place is real; a refusal for
anything else stays as it was.
On the in-memory store and a scripted client: no API server."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.webhook import steps
from k8s.webhook.admission import VMIAdmission
from k8s.webhook.steps import Denied
from model.line import RETRY_AFTER
from model.reasons import BinderRefused, Code
from tests.actors.test_line import H100
from tests.actors.test_line_w1 import review, world
from tests.support.webhook_cache import StoreCache
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def admission(store, client, monkeypatch, bodies: list, line, binder=Code.NO_ELIGIBLE_NODE,
              **kw) -> VMIAdmission:
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
                        grace=timedelta(seconds=30), line=line, **kw)


async def test_P5_on_a_follower_a_bare_vmi_refused_for_room_at_W1_goes_on_to_the_binder(monkeypatch):
    leader = await admission(world(8, busy=1), ScriptedClient(), monkeypatch, [], lambda e: True).handle(
        review("big", 8))
    store, client, bodies, told = world(8, busy=1), ScriptedClient(), [], []
    adm = admission(store, client, monkeypatch, bodies, lambda e: told.append(e) or False)
    answer = await adm.handle(review("big", 8))
    assert [e.identity.vmi for e in told] == ["big", "big"]  # W1 on the cache, then after the live read
    assert len(bodies) == 1 and bodies[0]["vmi"] == "big"    # its bindRequest written: the leader decides
    # the binder refused it for room too: W1's refusal, word for word the leader's answer
    # (503 with Retry-After: it waits in the line while its client retries)
    assert answer["allowed"] is False and answer["status"] == leader["status"]
    assert answer["status"]["code"] == 503 and "the binder" not in answer["status"]["message"]
    assert answer["status"]["details"] == {"retryAfterSeconds": 2}
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
    assert answer["allowed"] is False and answer["status"]["code"] == 503
    assert [c.method for c in client.calls] == ["create_event"]  # no read, no write but W5's Event


async def test_P5_without_a_line_W1_refuses_for_room_as_before_and_writes_nothing(monkeypatch):
    store, client, bodies = world(8, busy=1), ScriptedClient(), []
    adm = admission(store, client, monkeypatch, bodies, None)
    answer = await adm.handle(review("big", 8))
    assert answer["allowed"] is False and answer["status"]["code"] == 403 and bodies == []
    assert [c.method for c in client.calls] == ["create_event"]


async def test_P5_on_the_leader_a_bare_vmi_put_in_the_line_is_answered_503_with_retry_after(monkeypatch):
    """W1's refusal for room of a bare VMI that entered the line is a 503 whose
    `details.retryAfterSeconds` (kube-apiserver's Retry-After, which client-go and kubectl
    honour by retrying) is the line's period, with W1's words and the grace; counted under
    W1's own code. Before: 403 (never retried, so an abandoned create kept a place)."""
    store, client = world(8, busy=1), ScriptedClient()
    adm = admission(store, client, monkeypatch, [], lambda e: True, line_grace=timedelta(seconds=12))
    answer = await adm.handle(review("big", 8))
    status = answer["status"]
    assert (status["code"], status["reason"]) == (503, "ServiceUnavailable")
    assert status["details"] == {"retryAfterSeconds": RETRY_AFTER} and RETRY_AFTER == 2
    assert "needs 8" in status["message"]
    assert status["message"].endswith("the set waits in the line for room: retry after 2 s (its place is "
                                      "kept while the create is retried, lost after 12 s without one)")
    assert adm.rejected == {("t", Code.SET_NEEDS): 1}


async def test_P5_a_refusal_that_is_not_for_room_stays_403_with_the_line_on(monkeypatch):
    """The line changes only refusals for room: a budget refusal (W1) and a VM's VMI (its
    place comes from the waiting-VM loop) are answered as before, the line not told."""
    store, client, told = world(8, busy=1), ScriptedClient(), []
    store.add_budget("t", H100, 4)
    adm = admission(store, client, monkeypatch, [], lambda e: told.append(e) or True)
    over = await adm.handle(review("big", 8))
    assert over["status"]["code"] == 403 and "details" not in over["status"] and told == []


async def test_P5_on_a_follower_the_binder_s_refusal_for_something_else_is_W1_s_403(monkeypatch):
    """A follower sends the set on to the binder; when the binder refuses it for something room
    will not change (here its budget), the answer is W1's refusal as before, 403: it does not
    wait. When the binder holds it behind the line, it waits: 503."""
    store, client = world(8, busy=1), ScriptedClient()
    adm = admission(store, client, monkeypatch, [], lambda e: False, binder=Code.BUDGET_EXHAUSTED)
    answer = await adm.handle(review("big", 8))
    assert answer["status"]["code"] == 403 and "needs 8" in answer["status"]["message"]
    store, client = world(8, busy=1), ScriptedClient()
    adm = admission(store, client, monkeypatch, [], lambda e: False, binder=Code.BEHIND_IN_LINE)
    answer = await adm.handle(review("big", 8))
    assert answer["status"]["code"] == 503 and answer["status"]["details"] == {"retryAfterSeconds": 2}


async def test_P5_a_bare_vmi_W1_found_room_for_and_the_binder_refused_for_room_waits_in_line(monkeypatch):
    """W1 finds room (7 free, 4 asked), the binder does not (the room was taken meanwhile, or
    is held for a live nomination W1 does not count): the binder's refusal for room put the set
    in the leader's line, so the answer is the binder's words as a wait, 503 with Retry-After,
    on any replica. Before: the binder's 403, which client-go never retries, so the set's place
    lapsed (the priorities soak's refusals of preemptible sets)."""
    for line in (lambda e: True, lambda e: False):   # the leader, a follower: the same answer
        store, client, bodies = world(8, busy=1), ScriptedClient(), []
        adm = admission(store, client, monkeypatch, bodies, line, line_grace=timedelta(seconds=12))
        answer = await adm.handle(review("big", 4))
        assert len(bodies) == 1 and bodies[0]["vmi"] == "big"   # W1 passed: the binder decided
        status = answer["status"]
        assert (answer["allowed"], status["code"], status["reason"]) == (False, 503, "ServiceUnavailable")
        assert status["details"] == {"retryAfterSeconds": RETRY_AFTER}
        assert status["message"] == ("the binder: no_eligible_node; the set waits in the line for room: retry "
                                     "after 2 s (its place is kept while the create is retried, lost after "
                                     "12 s without one)")


async def test_P5_a_binder_refusal_after_W1_found_room_stays_403_unless_a_bare_vmi_waits(monkeypatch):
    """The binder's refusal of a set W1 found room for stays as written when it is not for room
    (a budget), when the VMI is a VM's (KubeVirt retries it; its place comes from the waiting-VM
    loop) and when the webhook has no line (P5 off)."""
    cases = [(Code.BUDGET_EXHAUSTED, None, lambda e: True), (Code.NO_ELIGIBLE_NODE, "vm-uid", lambda e: True),
             (Code.NO_ELIGIBLE_NODE, None, None)]
    for code, owner, line in cases:
        store, client, bodies = world(8, busy=1), ScriptedClient(), []
        adm = admission(store, client, monkeypatch, bodies, line, binder=code)
        answer = await adm.handle(review("big", 4, owner=owner))
        assert len(bodies) == 1, (code, owner)
        assert (answer["status"]["code"], answer["status"]["message"]) == (403, f"the binder: {code.value}")
        assert "details" not in answer["status"]
