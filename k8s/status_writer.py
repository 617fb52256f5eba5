"""The binder's StatusWriter on the real API server (B7, B8).

Each write is one JSON Patch on the `status` subresource under field manager
`gpu-binder-binder`, led by a `test` of `status.bindRequest.id`: a request withdrawn or
replaced meanwhile is never resurrected (the API server answers 422 and nothing is
written). API errors are translated into the actor port's `WriteError`s; every call has a
timeout shorter than the Lease's renew deadline.
"""

from __future__ import annotations

from datetime import datetime
from typing import Sequence

import anyio
import structlog
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from actors import errors as port
from actors.ports import StatusWrite, write_each
from k8s import errors as api_errors
from model.parse import format_time
from model.types import GROUP, VERSION, Result

log = structlog.get_logger("gpu_binder.status_writer")

BINDER_FIELD_MANAGER = "gpu-binder-binder"
JSON_PATCH = "application/json-patch+json"


class ApiStatusWriter:
    """`actors.ports.StatusWriter` over kubernetes_asyncio. `timeout` is per API call,
    seconds; `parallel` (>= 1) bounds the writes in flight at once over every
    `write_many` call of this writer together (a set's members are patched concurrently:
    one round trip per step, not per member, and retries cannot multiply the load)."""

    def __init__(self, api: ApiClient, *, timeout: float = 5.0, parallel: int = 8,
                 field_manager: str = BINDER_FIELD_MANAGER) -> None:
        self._api = CustomObjectsApi(api)
        self._timeout = timeout
        self._limiter = anyio.CapacityLimiter(max(1, parallel))
        self._manager = field_manager
        self.writes = 0

    async def write_many(self, writes: Sequence[StatusWrite]) -> list[port.WriteError | None]:
        """Each write as its own patch (each bounded by `timeout`), at most `parallel` of
        this writer's at once; outcomes in order."""
        return await write_each(self, writes, limiter=self._limiter)

    async def _patch(self, key: tuple[str, str], request_id: str, ops: list[dict]) -> None:
        body = [{"op": "test", "path": "/status/bindRequest/id", "value": request_id}, *ops]
        ns, name = key
        try:
            await self._api.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, "gpudevices", name, body, _content_type=JSON_PATCH,
                field_manager=self._manager, _request_timeout=self._timeout)
            self.writes += 1
        except Exception as exc:  # translated below; cancellation is not an Exception
            err = api_errors.translate(exc, f"patch status of GPUDevice {ns}/{name}")
            if isinstance(err, api_errors.NotFound):
                raise port.NotFound(str(err), key=key) from exc
            if isinstance(err, api_errors.Invalid):
                log.info("status patch rejected", namespace=ns, device=name,
                         request_id=request_id, ops=[o["path"] for o in ops],
                         reason=err.message[:300])
                # the `test` failed (id replaced) or the path is gone (request cleared)
                raise port.RequestWithdrawn(
                    f"GPUDevice {ns}/{name} no longer carries request {request_id}: "
                    f"{err.message}", key=key) from exc
            if isinstance(err, api_errors.Conflict):
                raise port.WriteConflict(str(err), key=key) from exc
            raise port.TransientWriteError(str(err), key=key) from exc

    async def record_decision(self, key: tuple[str, str], request_id: str, node: str) -> None:
        """Write `status.bindRequest.node` (B7's durable record of the decided node),
        compare-and-set: read the device, then patch with a `test` of its resourceVersion.
        Another node already recorded for this request → WriteConflict, nothing written."""
        ns, name = key
        try:
            raw = await self._api.get_namespaced_custom_object_status(
                GROUP, VERSION, ns, "gpudevices", name, _request_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - translated
            err = api_errors.translate(exc, f"read GPUDevice {ns}/{name}")
            if isinstance(err, api_errors.NotFound):
                raise port.NotFound(str(err), key=key) from exc
            raise port.TransientWriteError(str(err), key=key) from exc
        br = (raw.get("status") or {}).get("bindRequest") or {}
        if br.get("id") != request_id:
            raise port.RequestWithdrawn(f"GPUDevice {ns}/{name} no longer carries request "
                                        f"{request_id}", key=key)
        if br.get("node") == node:
            return
        if br.get("node"):
            raise port.WriteConflict(f"GPUDevice {ns}/{name}: request {request_id} already "
                                     f"decided for node {br['node']}", key=key)
        rv = raw["metadata"]["resourceVersion"]
        try:
            await self._patch(key, request_id, [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "add", "path": "/status/bindRequest/node", "value": node}])
        except port.RequestWithdrawn as exc:  # the id or the resourceVersion moved: re-read
            raise port.WriteConflict(str(exc), key=key) from exc

    async def bind(self, key: tuple[str, str], request_id: str, node: str,
                   bound_at: datetime) -> None:
        """Write `status.phase = Bound`, `status.nodeName`, `status.boundAt` (B1)."""
        await self._patch(key, request_id, [
            {"op": "add", "path": "/status/phase", "value": "Bound"},
            {"op": "add", "path": "/status/nodeName", "value": node},
            {"op": "add", "path": "/status/boundAt", "value": format_time(bound_at)},
        ])

    async def write_result(self, key: tuple[str, str], request_id: str, result: Result,
                           message: str, node: str | None) -> None:
        """Write `status.bindRequest.{result,message,node}` (B1); `node` None for Refused."""
        ops = [
            {"op": "add", "path": "/status/bindRequest/result", "value": result.value},
            {"op": "add", "path": "/status/bindRequest/message", "value": message[:32000]},
        ]
        if node is not None:
            ops.append({"op": "add", "path": "/status/bindRequest/node", "value": node})
        await self._patch(key, request_id, ops)
