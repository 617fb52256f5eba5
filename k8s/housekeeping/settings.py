"""H3 on the API server: the settings ConfigMap `gpu-settings`, the parameter of the shipped
ValidatingAdmissionPolicies, kept as the GPUClasses say.

Their bindings say `parameterNotFoundAction: Deny`: while the ConfigMap is missing they deny
every Pod, VMI, ResourceClaim and ResourceClaimTemplate they match (kubernetes#133827: never
`Allow`, which silently stops enforcing `rawResourceNames: denied`). An absence H3 repairs or
cannot repair is told by a Warning Event `PolicyParameterMissing` on it (best effort).
"""

from __future__ import annotations

from datetime import datetime, timezone

from k8s import errors, events
from k8s.cache import SETTINGS_NAME, ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping.common import log
from model.housekeeping_reasons import ParameterMissingEvent, Rule
from model.settings import device_class_names, format_resource_names, resource_names


def desired_settings(cache: ClusterCache, raw_policy: str) -> dict[str, str]:
    """H3: the settings ConfigMap's `data` for the GPUClasses in the cache: the count-mode
    resource names, the managed DeviceClasses (`deviceClassNames`, DR5: the claims policy
    refuses tenants' claims and claim templates on them under `denied`) and the policy."""
    classes = cache.view.classes().values()
    return {"resourceNames": format_resource_names(resource_names(classes)),
            "deviceClassNames": format_resource_names(device_class_names(classes)),
            "rawResourceNames": raw_policy}


class SettingsWorker:
    """H3 (`ensure`). `raw_policy` is the operator's `rawResourceNames`. `settings_present`
    is what H3 last found (None before its first look; False while the ConfigMap is missing
    and could not be created), `settings_recreated` counts the times H3 found it missing and
    created it."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, raw_policy: str) -> None:
        self._client = client
        self.cache = cache
        self.raw_policy = raw_policy
        self.settings_present: bool | None = None
        self.settings_recreated = 0

    async def ensure(self) -> None:
        """H3: create the settings ConfigMap, or replace its data when the cache shows drift.
        A create answered AlreadyExists means the cache was behind: it is present. A failed
        write is logged and retried next round."""
        want = desired_settings(self.cache, self.raw_policy)
        have = self.cache.settings.get((self.cache.settings_namespace, SETTINGS_NAME))
        if have is not None and (have.get("data") or {}) == want:
            self.settings_present = True
            return
        meta = {"name": SETTINGS_NAME, "namespace": self.cache.settings_namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpu-binder"}}
        try:
            if have is None:
                await self._create(meta, want)
            else:  # replace: data becomes exactly `want`, extra keys included (H3)
                self.settings_present = True
                body = dict(have)
                body["metadata"] = {**have["metadata"], "labels": {
                    **(have["metadata"].get("labels") or {}), **meta["labels"]}}
                body["data"] = want
                await self._client.replace_config_map(
                    self.cache.settings_namespace, SETTINGS_NAME, body,
                    what="apply ConfigMap gpu-settings")
            log.info("settings ConfigMap written", rule=Rule.H3,
                     namespace=self.cache.settings_namespace, drift=have is not None, **want)
        except errors.ApiError as err:  # retried next round
            log.warning("settings ConfigMap write failed", rule=Rule.H3, error=str(err)[:300])

    async def _create(self, meta: dict, want: dict[str, str]) -> None:
        """Create the missing settings ConfigMap; keep `settings_present` and
        `settings_recreated` and tell an absence by an Event (see the module). Raises the
        create's error (translated) unless it is AlreadyExists."""
        try:
            await self._client.create_config_map(
                self.cache.settings_namespace,
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": want},
                what="create ConfigMap gpu-settings")
        except errors.ApiError as err:  # sorted here
            if isinstance(err, errors.AlreadyExists):
                self.settings_present = True  # the cache is behind; drift is seen next round
                return
            if self.settings_present is not False:  # once per absence
                await self._parameter_event(str(err)[:300])
            self.settings_present = False
            raise
        self.settings_recreated += 1
        self.settings_present = True
        await self._parameter_event(None)

    async def _parameter_event(self, error: str | None) -> None:
        """A Warning Event `PolicyParameterMissing` about ConfigMap gpu-settings (the
        policies' parameter; `ParameterMissingEvent`: created, or not for `error`), logged
        as well; best effort (a failure is logged)."""
        ns = self.cache.settings_namespace
        ev = ParameterMissingEvent(ns, SETTINGS_NAME, error)
        log.warning("policy parameter missing", rule=Rule.H3, namespace=ns, name=SETTINGS_NAME,
                    message=ev.detail())
        involved = {"apiVersion": "v1", "kind": "ConfigMap", "name": SETTINGS_NAME,
                    "namespace": ns}
        body = events.event_body(
            involved, reason=ev.reason, warning=ev.warning, instance="housekeeping",
            when=datetime.now(timezone.utc), message=ev.render())
        await events.record(self._client, body, rule=Rule.H3, namespace=ns, name=SETTINGS_NAME)
