"""The GPUClasses' status conditions the leader writes: `Ready` (DR1: whether the class can
serve, `model.housekeeping.ready_condition`) on every class and `KubeVirtPermitted`
(`model.housekeeping.kubevirt_condition`) on count-mode classes (a device-mode class's GPUs
come from claims, not permittedHostDevices). Their words are `ClassCondition.render()`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from k8s import errors
from k8s.cache import ClusterCache
from k8s.client import GPU_CLASSES, KubeClient
from k8s.housekeeping.common import log
from model.device.seam import device_classes
from model.housekeeping import (KUBEVIRT_CONDITION, READY_CONDITION, kubevirt_condition,
                                ready_condition)


def merged_conditions(conds: list[dict], wanted: dict[str, tuple[str, str, str]],
                      generation: object, now: str) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """A class's `conds` with each `wanted` condition (type → (status, reason, message)) put
    in, and the (type, status, reason) of those that changed. A condition unchanged (status,
    reason, message, observedGeneration `generation`) is kept as it is; a changed one keeps
    its `lastTransitionTime` while its status stays, else gets `now`."""
    out, changed = [c for c in conds if c.get("type") not in wanted], []
    for ctype, (status, reason, message) in wanted.items():
        have = next((c for c in conds if c.get("type") == ctype), None)
        if have is not None and (have.get("status"), have.get("reason"), have.get("message"),
                                 have.get("observedGeneration")) == (status, reason, message,
                                                                     generation):
            out.append(have)
            continue
        when = (have.get("lastTransitionTime") if have is not None and have.get("status") == status
                else now)
        cond = {"type": ctype, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": when}
        if isinstance(generation, int):
            cond["observedGeneration"] = generation
        out.append(cond)
        changed.append((ctype, status, reason))
    return out, changed


class ClassConditions:
    """Writes the GPUClasses' conditions (`ensure`)."""

    def __init__(self, client: KubeClient, cache: ClusterCache) -> None:
        self._client = client
        self.cache = cache

    async def ensure(self) -> None:
        """Each GPUClass's conditions, merge-patched into its status when the cache shows one
        differs; a failed write is logged and retried next round."""
        permitted = self.cache.permitted_resources()
        classes = self.cache.view.classes()
        device = device_classes(classes.values())
        for raw in self.cache.classes.items():
            meta = raw.get("metadata") or {}
            name = meta.get("name")
            cls = classes.get(name) if isinstance(name, str) else None
            if cls is None:
                continue  # not parsed (logged by the cache)
            wanted = {READY_CONDITION: ready_condition(cls).as_tuple()}
            if name not in device and cls.resource_name:
                wanted[KUBEVIRT_CONDITION] = kubevirt_condition(cls.resource_name,
                                                                permitted).as_tuple()
            conds = [c for c in (raw.get("status") or {}).get("conditions") or []
                     if isinstance(c, dict)]
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            out, changed = merged_conditions(conds, wanted, meta.get("generation"), now)
            if not changed:
                continue
            try:
                await self._client.patch_status(
                    GPU_CLASSES, None, name, {"status": {"conditions": out}},
                    what=f"patch GPUClass {name} status")
                for ctype, status, reason in changed:
                    log.info("GPUClass condition written", gpu_class=name, condition=ctype,
                             status=status, reason=reason)
            except errors.ApiError as err:  # retried next round
                log.warning("GPUClass condition write failed", gpu_class=name,
                            error=str(err)[:300])
