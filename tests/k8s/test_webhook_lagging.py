"""W1 on a lagging cache (`VMIAdmission._lagging`; docs/contract.md §4 W1, B1(b)): after an API
outage each informer relists on its own backoff, so a class or a held device made meanwhile
may not be in the cache yet. While the cache does not follow the API server
(`ClusterView.following`), a refusal only for an object it does not hold is a 503 to retry
(`NotSynced(relisting=True)`), never a 422 "not found"; once it follows, the 422 stands. A
refusal for anything else is never turned into a retry. On the in-memory store, no API server."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fakes.kube_client import ScriptedClient
from k8s.webhook.admission import VMIAdmission
from model.reasons import ClassNotFound, Code, NotSynced
from tests.actors.test_line_w1 import review, world
from tests.support.webhook_cache import StoreCache
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def webhook(following: bool):
    store = world(8, busy=1)
    store.follow_with(lambda: following)
    return VMIAdmission(ScriptedClient(), StoreCache(store), bind_timeout=5.0,  # type: ignore[arg-type]
                        grace=timedelta(seconds=30))


async def test_W1_a_class_missing_while_the_cache_relists_is_a_503_to_retry():
    adm = webhook(following=False)
    answer = await adm.handle(review("vm", 1, cls="made-meanwhile"))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 503
    assert answer["status"]["message"] == NotSynced(relisting=True).render()
    assert adm.rejected == {("t", Code.NOT_SYNCED): 1}


async def test_W1_a_class_missing_from_a_following_cache_is_refused_422():
    adm = webhook(following=True)
    answer = await adm.handle(review("vm", 1, cls="made-meanwhile"))
    assert answer["status"]["code"] == 422  # bad input
    assert ClassNotFound("made-meanwhile").render() in answer["status"]["message"]
    assert adm.rejected == {("t", Code.CLASS_NOT_FOUND): 1}


async def test_W1_other_refusals_are_not_retries_while_the_cache_relists():
    adm = webhook(following=False)
    answer = await adm.handle(review("big", 8, pc=None))  # 7 free of 8: no room, a 403 as ever
    assert answer["status"]["code"] == 403
    assert Code.NOT_SYNCED not in {c for _, c in adm.rejected}
