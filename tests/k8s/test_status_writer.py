"""`k8s.status_writer.ApiStatusWriter` built through its constructor on a
`fakes.kube_client.ScriptedClient`: the one patch of a binder write (B1, B7, B8) and how the
client's typed errors become the actor port's `WriteError`s. tests/e2e run it against a
real API server."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from actors import errors as port
from actors.ports import StatusWrite
from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.client import GPU_DEVICES
from k8s.status_writer import BINDER_FIELD_MANAGER, ApiStatusWriter
from model.types import Result

pytestmark = pytest.mark.anyio
KEY = ("t", "gpu-0")
AT = datetime(2026, 12, 4, tzinfo=timezone.utc)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _write(**kw) -> StatusWrite:
    return StatusWrite(KEY, "r1", Result.SUCCEEDED, "bound on n1", node="n1", bound_at=AT, **kw)


async def test_a_write_with_the_version_seen_is_one_patch_led_by_its_tests():
    client = ScriptedClient()
    writer = ApiStatusWriter(client)
    await writer.answer(_write(expect_version="7"))
    (call,) = client.calls
    res, ns, name, ops = call.args
    assert (call.method, call.field_manager, res, ns, name) == (
        "patch_status", BINDER_FIELD_MANAGER, GPU_DEVICES, "t", "gpu-0")
    assert ops[:2] == [{"op": "test", "path": "/status/bindRequest/id", "value": "r1"},
                       {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}]
    assert {o["path"]: o["value"] for o in ops[2:]} == {
        "/status/phase": "Bound", "/status/nodeName": "n1",
        "/status/boundAt": "2026-12-04T00:00:00Z", "/status/bindRequest/node": "n1",
        "/status/bindRequest/result": "Succeeded", "/status/bindRequest/message": "bound on n1"}
    assert writer.writes == 1


async def test_the_clients_errors_become_the_ports_write_errors():
    client = ScriptedClient()
    failed_test = errors.Invalid("patch", 422, "test failed")
    client.script("patch_status", failed_test, errors.NotFound("patch", 404, "gone"),
                  errors.Conflict("patch", 409, "modified"),
                  errors.Unavailable("patch", 0, "timeout"))
    client.script("get_status", {"metadata": {"resourceVersion": "8"},
                                 "status": {"bindRequest": {"id": "r2"}}})
    writer = ApiStatusWriter(client)
    with pytest.raises(port.RequestWithdrawn, match="no longer carries request r1"):
        await writer.answer(_write(expect_version="7"))   # the test failed: read; r2 now
    outcomes = await writer.write_many([_write(), _write(), _write()])
    # without a version seen, each reads first (scripted reads are used up: {} then)
    assert [type(o) for o in outcomes] == [port.RequestWithdrawn] * 3
    client.script("get_status", *[{"metadata": {"resourceVersion": "8"},
                                   "status": {"bindRequest": {"id": "r1"}}}] * 3)
    outcomes = await writer.write_many([_write(), _write(), _write()])
    assert [type(o) for o in outcomes] == [port.NotFound, port.WriteConflict,
                                           port.TransientWriteError]
    assert writer.writes == 0


async def test_DR2_device_mode_writes_status_device_with_the_placement_or_alone_or_clears_it():
    from model.device.dra import DeviceRef
    gpu = DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-3")
    client = ScriptedClient()
    writer = ApiStatusWriter(client)
    await writer.answer(_write(expect_version="7", device=gpu))
    await writer.answer(StatusWrite(KEY, "r1", Result.SUCCEEDED, "re-pointed", node="n1",
                                    expect_version="8", device=gpu))
    await writer.answer(_write(expect_version="9", clear_device=True))
    placed, repointed, cleared = ({o["path"]: o["value"] for o in c.args[3][2:]} for c in client.calls)
    want = {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-vfio-3"}
    assert placed["/status/device"] == want and placed["/status/nodeName"] == "n1"
    assert repointed["/status/device"] == want and "/status/nodeName" not in repointed
    assert cleared["/status/device"] is None
    # count mode: no status.device op at all (the first test's exact ops)


async def test_D2_DR4_a_device_mode_move_and_a_re_point_write_the_record_with_their_tests():
    """A defragmenting move in device mode (`op="move"`): read, then one patch led by the
    resourceVersion read, carrying nodeName, boundAt and `status.device`; a re-point (same
    node) carries `status.device` alone; a device no longer recording the expected GPU is
    RequestWithdrawn with nothing written; one recording the target already is a no-op."""
    from model.device.dra import DeviceRef
    was = DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-0")
    to_n2 = DeviceRef("gpu.nvidia.com", "n2", "gpu-vfio-5")
    to_n1 = DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-6")

    def idle(rv: str, node: str, rec: DeviceRef) -> dict:
        return {"metadata": {"resourceVersion": rv, "uid": "u"},
                "status": {"phase": "Bound", "nodeName": node,
                           "device": {"driver": rec.driver, "pool": rec.pool, "device": rec.device}}}

    def move(node: str, to: DeviceRef) -> StatusWrite:
        return StatusWrite(KEY, "defrag-1", Result.SUCCEEDED, "defragmentation: ...", node=node,
                           bound_at=AT, op="move", from_node="n1", device=to, from_device=was)

    client = ScriptedClient()
    client.script("get_status", idle("5", "n1", was), idle("6", "n1", was),
                  idle("7", "n1", to_n1), idle("8", "n1", DeviceRef("gpu.nvidia.com", "n1", "gpu-vfio-2")))
    writer = ApiStatusWriter(client)
    await writer.answer(move("n2", to_n2))
    await writer.answer(move("n1", to_n1))
    await writer.answer(move("n1", to_n1))          # already recorded: nothing written
    with pytest.raises(port.RequestWithdrawn, match="recording gpu.nvidia.com/n1/gpu-vfio-0"):
        await writer.answer(move("n2", to_n2))      # re-pointed meanwhile: nothing written
    patches = [c.args[3] for c in client.calls if c.method == "patch_status"]
    assert len(patches) == 2 and writer.writes == 2
    moved, repointed = patches
    assert moved[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "5"}
    assert {o["path"]: o["value"] for o in moved[1:]} == {
        "/status/nodeName": "n2", "/status/boundAt": "2026-12-04T00:00:00Z",
        "/status/device": {"driver": "gpu.nvidia.com", "pool": "n2", "device": "gpu-vfio-5"}}
    assert repointed[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "6"}
    assert {o["path"]: o["value"] for o in repointed[1:]} == {
        "/status/device": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-vfio-6"}}
    reasons = [c.args[1]["reason"] for c in client.calls if c.method == "create_event"]
    assert reasons == ["GPUDeviceMoved", "GPUDeviceRepointed"]
