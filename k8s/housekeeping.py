"""Housekeeping on the real API server (leader only): H1, H2 and the settings ConfigMap (H3).

Decisions come from the pure `model.housekeeping.plan`; this module carries them out with
field manager `gpu-binder-housekeeping`. Clearing an attachment is a JSON Patch that
`test`s the attached VMI first, and a template is deleted with a uid precondition, so an
action planned from a slightly stale cache never undoes a newer admission.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import anyio
import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from k8s import errors
from k8s.cache import SETTINGS_NAME, ClusterCache
from model.housekeeping import ClearAttachment, DeleteTemplate, plan
from model.settings import format_resource_names, resource_names
from model.types import GROUP, VERSION

log = structlog.get_logger("gpu_binder.housekeeping")

FIELD_MANAGER = "gpu-binder-housekeeping"


def desired_settings(cache: ClusterCache, raw_policy: str) -> dict[str, str]:
    """H3: the settings ConfigMap's `data` for the GPUClasses in the cache."""
    names = resource_names(cache.view.classes().values())
    return {"resourceNames": format_resource_names(names), "rawResourceNames": raw_policy}


class Housekeeper:
    """Runs H1–H3 every `period` seconds and whenever devices, VMIs, classes or the settings
    ConfigMap change. `grace` is `attachmentGrace`. Errors are logged per action and the
    action is retried on the next round."""

    def __init__(self, api: ApiClient, cache: ClusterCache, *, grace: timedelta,
                 raw_policy: str, period: float = 5.0, timeout: float = 5.0) -> None:
        self._custom = CustomObjectsApi(api)
        self._core = CoreV1Api(api)
        self.cache = cache
        self.grace = grace
        self.raw_policy = raw_policy
        self.period = period
        self.timeout = timeout
        self._seen_vmis: set[tuple[str, str]] = set()
        self.actions_done = 0

    async def run(self) -> None:
        """Loop until cancelled."""
        informers = (self.cache.devices, self.cache.vmis, self.cache.classes,
                     self.cache.settings)
        subs = [inf.subscribe() for inf in informers]
        self._seen_vmis = self.cache.vmi_keys()
        try:
            while True:
                await self.round()
                with anyio.move_on_after(self.period):
                    async with anyio.create_task_group() as tg:
                        async def wait(sub) -> None:
                            await sub.changed()
                            tg.cancel_scope.cancel()
                        for s in subs:
                            tg.start_soon(wait, s)
                await anyio.sleep(0.2)  # coalesce bursts
        finally:  # leadership lost or shutdown: stop being marked
            for inf, sub in zip(informers, subs):
                inf.unsubscribe(sub)

    async def round(self, now: datetime | None = None) -> None:
        """One pass of H1, H2 and H3."""
        now = now or datetime.now(timezone.utc)
        live = self.cache.vmi_keys()
        deleted = self._seen_vmis - live
        for action in plan(self.cache.view.devices().values(), live, deleted, now, self.grace):
            await self._do(action)
        self._seen_vmis = live
        await self.ensure_settings()

    async def _do(self, action: ClearAttachment | DeleteTemplate) -> None:
        ns, name = action.device
        try:
            raw = self.cache.devices.get(action.device) or {}
            if isinstance(action, DeleteTemplate):
                # uid and resourceVersion as planned: a template an admission refreshed
                # since (a re-created VMI of the same name) is not deleted
                pre = {"uid": action.uid} if action.uid else {}
                rv = (raw.get("metadata") or {}).get("resourceVersion")
                if rv:
                    pre["resourceVersion"] = rv
                body = {"preconditions": pre} if pre else {}
                await self._custom.delete_namespaced_custom_object(
                    GROUP, VERSION, ns, "gpudevices", name, body=body,
                    _request_timeout=self.timeout)
            else:
                now_att = (self.cache.view.device(action.device) or None)
                now_att = now_att.status.attached_to if now_att else None
                if now_att is None or now_att.since != action.since:
                    log.info("housekeeping action moot: attachment changed since planned",
                             rule=action.rule, namespace=ns, device=name)
                    return
                ops = [{"op": "test", "path": "/status/attachedTo/vmi", "value": action.vmi}]
                since = ((raw.get("status") or {}).get("attachedTo") or {}).get("since")
                if since:  # the attachment as planned, not one refreshed meanwhile
                    ops.append({"op": "test", "path": "/status/attachedTo/since",
                                "value": since})
                ops.append({"op": "remove", "path": "/status/attachedTo"})
                dev = self.cache.view.device(action.device)
                br = dev.status.bind_request if dev else None
                if br is not None and br.vmi == action.vmi:
                    ops += [{"op": "test", "path": "/status/bindRequest/id", "value": br.id},
                            {"op": "remove", "path": "/status/bindRequest"}]
                await self._custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, "gpudevices", name, ops,
                    _content_type="application/json-patch+json", field_manager=FIELD_MANAGER,
                    _request_timeout=self.timeout)
            self.actions_done += 1
            log.info("housekeeping", rule=action.rule, action=type(action).__name__,
                     namespace=ns, device=name, reason=action.reason)
        except Exception as exc:  # noqa: BLE001 - per-action; retried next round
            err = errors.translate(exc, f"{type(action).__name__} {ns}/{name}")
            if isinstance(err, (errors.NotFound, errors.Invalid, errors.Conflict)):
                log.info("housekeeping action moot", rule=action.rule, namespace=ns,
                         device=name, reason=err.message[:200])
            else:
                log.warning("housekeeping action failed", rule=action.rule, namespace=ns,
                            device=name, error=str(err)[:300])

    async def ensure_settings(self) -> None:
        """H3: create the settings ConfigMap, or replace its data when the cache shows drift."""
        want = desired_settings(self.cache, self.raw_policy)
        have = self.cache.settings.get((self.cache.settings_namespace, SETTINGS_NAME))
        if have is not None and (have.get("data") or {}) == want:
            return
        meta = {"name": SETTINGS_NAME, "namespace": self.cache.settings_namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpu-binder"}}
        try:
            if have is None:
                await self._core.create_namespaced_config_map(
                    self.cache.settings_namespace,
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": want},
                    field_manager=FIELD_MANAGER, _request_timeout=self.timeout)
            else:  # replace: data becomes exactly `want`, extra keys included (H3)
                body = dict(have)
                body["metadata"] = {**have["metadata"], "labels": {
                    **(have["metadata"].get("labels") or {}), **meta["labels"]}}
                body["data"] = want
                await self._core.replace_namespaced_config_map(
                    SETTINGS_NAME, self.cache.settings_namespace, body,
                    field_manager=FIELD_MANAGER, _request_timeout=self.timeout)
            log.info("settings ConfigMap written", rule="H3", namespace=self.cache.settings_namespace,
                     drift=have is not None, **want)
        except Exception as exc:  # noqa: BLE001 - retried next round
            log.warning("settings ConfigMap write failed", rule="H3",
                        error=str(errors.translate(exc, "apply ConfigMap gpu-settings"))[:300])
