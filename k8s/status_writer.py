"""The binder's StatusWriter on the real API server (B7, B8).

Each member of a request costs one write: one JSON Patch on the `status` subresource
under field manager `gpu-binder-binder` carrying the decided node, the placement and the
result together, led by a `test` of `status.bindRequest.id`: a request withdrawn or
replaced meanwhile is never resurrected (the API server answers 422 and nothing is
written). A defragmenting move (`op="move"`, D2) reads the device, checks it is still idle
on its old node and patches the placement led by a `test` of the resourceVersion read, then
records a `GPUDeviceMoved` Event on the device (from, to, why; D4, best effort; device mode:
the devices too, `GPUDeviceRepointed` for a re-point within the node). Device mode:
a placement write carries `status.device` (the chosen device, or null to clear a record from
another node), a re-point within the node writes it alone with the result (DR2, DR4). API errors are translated into the actor port's `WriteError`s; every call has a
timeout shorter than the Lease's renew deadline.
"""

from __future__ import annotations

from typing import Sequence

import anyio
import structlog

from actors import errors as port
from actors.ports import StatusWrite, write_each
from k8s import errors as api_errors
from k8s import events
from k8s.client import GPU_DEVICES, KubeClient
from model.device.dra import DeviceRef
from model.serialize import format_time
from model.types import GROUP, VERSION

log = structlog.get_logger("gpu_binder.status_writer")

BINDER_FIELD_MANAGER = "gpu-binder-binder"


class ApiStatusWriter:
    """`actors.ports.StatusWriter` over `client` (`k8s.client.KubeClient`, whose timeout
    bounds each API call; its writes here carry `field_manager`); `parallel` (>= 1) bounds
    the writes in flight at once over every `write_many` call of this writer together (a
    set's members are patched concurrently: one round trip per step, not per member, and
    retries cannot multiply the load)."""

    def __init__(self, client: KubeClient, *, parallel: int = 8,
                 field_manager: str = BINDER_FIELD_MANAGER) -> None:
        self._client = client.using(field_manager=field_manager)
        self._limiter = anyio.CapacityLimiter(max(1, parallel))
        self.writes = 0

    async def write_many(self, writes: Sequence[StatusWrite]) -> list[port.WriteError | None]:
        """Each write as its own patch (each bounded by the client's timeout), at most `parallel` of
        this writer's at once; outcomes in order."""
        return await write_each(self, writes, limiter=self._limiter)

    async def _patch(self, key: tuple[str, str], request_id: str | None, ops: list[dict]) -> None:
        body = ops if request_id is None else [
            {"op": "test", "path": "/status/bindRequest/id", "value": request_id}, *ops]
        ns, name = key
        try:
            await self._client.patch_status(GPU_DEVICES, ns, name, body)
            self.writes += 1
        except api_errors.ApiError as err:
            if isinstance(err, api_errors.NotFound):
                raise port.NotFound(str(err), key=key) from err
            if isinstance(err, api_errors.Invalid):
                log.info("status patch rejected", namespace=ns, device=name,
                         request_id=request_id, ops=[o["path"] for o in ops],
                         reason=err.message[:300])
                # the `test` failed (id replaced) or the path is gone (request cleared)
                raise port.RequestWithdrawn(
                    f"GPUDevice {ns}/{name} no longer carries request {request_id}: "
                    f"{err.message}", key=key) from err
            if isinstance(err, api_errors.Conflict):
                raise port.WriteConflict(str(err), key=key) from err
            raise port.TransientWriteError(str(err), key=key) from err

    async def answer(self, w: StatusWrite) -> None:
        """Write the decided node, the placement (when `w.bound_at` is set) and the result
        of one member in one patch (B1, B7). Compare-and-set on the node: with
        `w.expect_version`, the patch tests that resourceVersion (no read); when that test
        fails, or without it, the device is read first: another node already recorded for
        this request → WriteConflict, nothing written; the patch then tests the version
        read. Already so → no write."""
        ns, name = w.key
        if w.op == "move":
            return await self._move(w)
        ops = _answer_ops(w)
        if w.expect_version is not None:
            try:
                await self._patch(w.key, w.request_id, [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": w.expect_version},
                    *ops])
                return
            except port.RequestWithdrawn:  # the id or the version moved: read and decide
                pass
        raw = await self._read(w.key)
        status = raw.get("status") or {}
        br = status.get("bindRequest") or {}
        if br.get("id") != w.request_id:
            raise port.RequestWithdrawn(f"GPUDevice {ns}/{name} no longer carries request "
                                        f"{w.request_id}", key=w.key)
        if br.get("node") and br["node"] != w.node:
            raise port.WriteConflict(f"GPUDevice {ns}/{name}: request {w.request_id} already "
                                     f"decided for node {br['node']}", key=w.key)
        placed = w.bound_at is None or (status.get("phase") == "Bound"
                                        and status.get("nodeName") == w.node)
        if (w.device is not None or w.clear_device) and \
                (status.get("device") or None) != _device_dict(w.device):
            placed = False  # status.device differs (DR2, DR4): write it
        if placed and (br.get("node"), br.get("result"), br.get("message"), br.get("code")) == (
                w.node, w.result.value, w.message[:32000], w.code.value if w.code else None):
            return
        rv = raw["metadata"]["resourceVersion"]
        try:
            await self._patch(w.key, w.request_id, [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *ops])
        except port.RequestWithdrawn as exc:  # the id or the resourceVersion moved: re-read
            raise port.WriteConflict(str(exc), key=w.key) from exc


    async def _read(self, key: tuple[str, str]) -> dict:
        ns, name = key
        try:
            return await self._client.get_status(GPU_DEVICES, ns, name)
        except api_errors.NotFound as err:
            raise port.NotFound(str(err), key=key) from err
        except api_errors.ApiError as err:
            raise port.TransientWriteError(str(err), key=key) from err

    async def _move(self, w: StatusWrite) -> None:
        """A defragmenting move (D1, D2): read the device; already Bound idle on `w.node`
        (device mode: recording `w.device`): nothing to do; not Bound idle (no attachment,
        no request) on `w.from_node` (device mode: recording `w.from_device`):
        RequestWithdrawn, nothing written; else patch phase, nodeName and boundAt (device
        mode: and `status.device`; a re-point, `w.node == w.from_node`, the record alone) with
        a `test` of the resourceVersion read (a change in between: WriteConflict, retried
        from the read), then the Event."""
        raw = await self._read(w.key)
        status = raw.get("status") or {}
        idle = not status.get("attachedTo") and not status.get("bindRequest") \
            and status.get("phase") == "Bound"
        ns, name = w.key
        record = status.get("device") or None
        if idle and status.get("nodeName") == w.node and (
                w.device is None or record == _device_dict(w.device)):
            return
        if not idle or status.get("nodeName") != w.from_node or (
                w.device is not None and record != _device_dict(w.from_device)):
            raise port.RequestWithdrawn(f"GPUDevice {ns}/{name} is no longer idle on "
                                        f"{w.from_node}"
                                        + (f" recording {w.from_device}" if w.device else ""),
                                        key=w.key)
        assert w.bound_at is not None and w.node is not None
        ops = [{"op": "test", "path": "/metadata/resourceVersion",
                "value": raw["metadata"]["resourceVersion"]}]
        if w.node != w.from_node:
            ops += [{"op": "add", "path": "/status/nodeName", "value": w.node},
                    {"op": "add", "path": "/status/boundAt", "value": format_time(w.bound_at)}]
        if w.device is not None:  # DR2/DR4: the device recorded there
            ops.append({"op": "add", "path": "/status/device", "value": _device_dict(w.device)})
        try:
            await self._patch(w.key, None, ops)
        except port.RequestWithdrawn as exc:  # the version moved: read again (a retry)
            raise port.WriteConflict(str(exc), key=w.key) from exc
        await self._event(w, raw)

    async def _event(self, w: StatusWrite, raw: dict) -> None:
        """A Normal Event `GPUDeviceMoved` on the device (D4; `GPUDeviceRepointed` for a
        re-point within its node, DR4). Best effort: logged."""
        ns, name = w.key
        body = events.event_body(
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice", "name": name,
             "namespace": ns, "uid": (raw.get("metadata") or {}).get("uid")},
            reason="GPUDeviceRepointed" if w.node == w.from_node else "GPUDeviceMoved",
            message=w.message, warning=False, instance="binder",
            when=w.bound_at)
        await events.record(self._client, body, device=f"{ns}/{name}")


def _device_dict(ref: DeviceRef | None) -> dict | None:
    """`status.device` as the API stores it (`model.serialize.device_status_to_dict`)."""
    return None if ref is None else {"driver": ref.driver, "pool": ref.pool, "device": ref.device}


def _answer_ops(w: StatusWrite) -> list[dict]:
    """The JSON Patch operations of one binder write (after its tests)."""
    ops: list[dict] = []
    if w.bound_at is not None:
        ops += [{"op": "add", "path": "/status/phase", "value": "Bound"},
                {"op": "add", "path": "/status/nodeName", "value": w.node},
                {"op": "add", "path": "/status/boundAt", "value": format_time(w.bound_at)}]
    if w.device is not None or w.clear_device:
        # device mode (DR2): the exact device with the placement; null clears a record the
        # member had on another node (JSON Patch `add` replaces; null is the cleared field)
        ops.append({"op": "add", "path": "/status/device", "value": _device_dict(w.device)})
    if w.node is not None:
        ops.append({"op": "add", "path": "/status/bindRequest/node", "value": w.node})
    ops += [{"op": "add", "path": "/status/bindRequest/result", "value": w.result.value},
            {"op": "add", "path": "/status/bindRequest/message", "value": w.message[:32000]}]
    if w.code is not None:  # the refusal typed beside its message (older replicas: absent)
        ops.append({"op": "add", "path": "/status/bindRequest/code", "value": w.code.value})
    return ops
