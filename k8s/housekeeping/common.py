"""What every housekeeping worker shares: the field manager its writes carry, its logger, and
the live reads that confirm a destructive step (never taken on the cache's word alone)."""

from __future__ import annotations

import structlog

from k8s import errors
from k8s.client import VMIS, VMS, KubeClient
from model.housekeeping import VMIRecord
from model.types import ADMISSION_ANNOTATION

log = structlog.get_logger("gpu_binder.housekeeping")

FIELD_MANAGER = "gpu-binder-housekeeping"


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
