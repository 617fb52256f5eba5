"""What every housekeeping worker shares: the field manager its writes carry, its logger, and
the live reads that confirm a destructive step (never taken on the cache's word alone)."""

from __future__ import annotations

from typing import Awaitable, Callable, Sequence, TypeVar

import anyio
import structlog

from k8s import errors
from k8s.client import VMIS, VMS, KubeClient
from model.housekeeping import VMIRecord
from model.types import ADMISSION_ANNOTATION

log = structlog.get_logger("gpu_binder.housekeeping")

FIELD_MANAGER = "gpu-binder-housekeeping"

T = TypeVar("T")


async def each_bounded(items: Sequence[T], fn: Callable[[T], Awaitable[None]],
                       concurrency: int) -> None:
    """`await fn(item)` for every item of `items`, at most `concurrency` at once (≥ 1), in
    the order given as workers free up; returns when every call has returned. For actions
    that are independent of each other (each confirmed by its own live read and written
    with its own preconditions): a backlog of them after a leader change drains at the API
    server's pace times `concurrency`, not one call at a time (the device soak's orphan
    claims, 2026-12-07: a 268-claim pass took 122 s serially). `fn` handles its own
    errors; one that raises cancels the rest (a task group's rule)."""
    pending = iter(items)

    async def worker() -> None:
        for item in pending:   # a shared iterator: each item is taken once
            await fn(item)

    async with anyio.create_task_group() as tg:
        for _ in range(max(1, min(concurrency, len(items)))):
            tg.start_soon(worker)


async def live_vmi(client: KubeClient, ns: str, name: str) -> VMIRecord | None:
    """VMI `ns/name` as the API server has it now (uid, admission annotation); None when it
    does not exist. Raises ApiError when that cannot be told."""
    try:
        raw = await client.get(VMIS, ns, name)
    except errors.NotFound as err:
        if err.names(name):
            return None
        raise
    meta = raw.get("metadata") or {}
    adm = (meta.get("annotations") or {}).get(ADMISSION_ANNOTATION)
    return VMIRecord(ns, name, str(meta.get("uid") or ""), adm or None)


async def live_vm_keeps(client: KubeClient, ns: str, name: str, owner: str | None) -> bool:
    """H4: whether VirtualMachine `ns/name` exists now (a live read) with uid `owner` and is
    not being deleted. Raises ApiError when that cannot be told."""
    try:
        raw = await client.get(VMS, ns, name)
    except errors.NotFound as err:
        if err.names(name):
            return False
        raise
    meta = raw.get("metadata") or {}
    return bool(owner) and meta.get("uid") == owner and not meta.get("deletionTimestamp")
