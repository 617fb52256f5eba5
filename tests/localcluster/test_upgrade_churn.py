"""The upgrade churn's reading of answers (`localcluster.upgrade`): a bare VMI refused for
room that waits in the line (P5) is answered 503 by the webhook, and the churn counts that
as a refusal, not as an outage a tenant must never see while the replicas are steady."""

from __future__ import annotations

from localcluster.upgrade import WAITS_IN_LINE, classify, refusal_key
from model.line import DEFAULT_RETRY_GRACE, RETRY_AFTER
from model.reasons import NoRoom, WaitsInLine


def test_the_churn_knows_the_webhooks_words_for_a_set_waiting_in_the_line():
    words = WaitsInLine(NoRoom("example.com/gpu", 1, 0), RETRY_AFTER,
                        int(DEFAULT_RETRY_GRACE.total_seconds())).render()
    assert WAITS_IN_LINE in words
    message = f'admission webhook "vmi.gpu.cozystack.io" denied the request: {words}'
    assert refusal_key(message).startswith("needs ×")
    assert classify(503, "etcd leader changed") == "503"    # any other 503 stays an outage
