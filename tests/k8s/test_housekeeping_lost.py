"""HL3's Events (`k8s.housekeeping.lost.LostDevices`, the leader's housekeeping): a lost
device is told once (a Warning `GPUDeviceLost` on its node and on each GPUDevice recording
it, one log line), not again in later rounds while the loss lasts, again after it ended and
came back; nothing is written to the record. The API calls go to the scripted client."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from actors.view import IndexedView
from fakes.kube_client import ScriptedClient
from k8s.housekeeping.lost import LOST_REASON, LostDevices
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node, recorded
from tests.support.logs import captured_logs

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 6, 10, tzinfo=timezone.utc)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _without(name: str):
    n1 = dra_node("n1")
    devs = tuple(d for d in n1.devices_of(CLASS) if d.ref.device != name)
    return replace(n1, allocatable=((RES, len(devs)),), class_devices=((CLASS, devs),))


async def test_HL3_a_loss_is_told_once_on_node_and_record_and_again_after_it_returns():
    view = IndexedView()
    view.put_class(device_class())
    view.put_node(_without("gpu-vfio-3"))
    view.put_device(recorded("t", "d0", "n1", 3))
    client = ScriptedClient()
    worker = LostDevices(client, SimpleNamespace(view=view))  # type: ignore[arg-type]
    with captured_logs() as logs:
        await worker.tell(NOW)
        await worker.tell(NOW)   # the same loss: not told again
    sent = [body for _, body in client.of("create_event")]
    assert [(b["involvedObject"]["kind"], b["involvedObject"]["name"], b["reason"], b["type"])
            for b in sent] == [("Node", "n1", LOST_REASON, "Warning"),
                               ("GPUDevice", "d0", LOST_REASON, "Warning")]
    assert [ns for ns, _ in client.of("create_event")] == ["default", "t"]
    assert sent[0]["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1",
                                         "uid": "n1"}
    assert sent[0]["message"] == sent[1]["message"]
    assert sent[1]["message"].startswith(
        "device gpu-vfio-3 of node n1 (class h100x) is lost: no longer published for the class")
    lines = [x for x in logs if x.get("event") == "device lost"]
    assert [(x["node"], x["device"], x["reason"], x["recorded_by"]) for x in lines] == [
        ("n1", "gpu-vfio-3", "left-slices", ["t/d0"])]
    assert worker.lost_now == 1 and worker.told == 1
    assert [c.method for c in client.calls] == ["create_event", "create_event"]  # no write
    view.put_node(dra_node("n1"))  # the device returns
    await worker.tell(NOW)
    assert worker.lost_now == 0 and len(client.of("create_event")) == 2
    view.put_node(_without("gpu-vfio-3"))  # lost again: told again
    await worker.tell(NOW)
    assert len(client.of("create_event")) == 4 and worker.told == 2
