"""The one shared, read-only cluster cache: informers for every kind the binder, the
webhook and housekeeping read, and their conversion into `model` values.

Objects that fail to parse are skipped and logged once per resourceVersion as one JSON
line naming the object and the field, so one malformed GPUDevice never blocks the rest.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import anyio
import structlog
from anyio.abc import TaskStatus
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from k8s.informer import Informer, Key
from model.parse import (ParseError, parse_budgets, parse_gpu_class, parse_gpu_device,
                         parse_namespace, parse_node)
from model.snapshot import Snapshot
from model.types import GROUP, VERSION, GPUDevice

log = structlog.get_logger("gpu_binder.cache")

SETTINGS_NAME = "gpu-settings"


class _Parsed:
    """Memo of parse results by (key, resourceVersion); failures are logged once."""

    def __init__(self, kind: str, fn: Callable[[dict], Any]) -> None:
        self.kind, self.fn = kind, fn
        self._memo: dict[Key, tuple[str, Any]] = {}

    def __call__(self, informer: Informer) -> list[Any]:
        out, seen = [], set()
        for obj in informer.items():
            meta = obj.get("metadata") or {}
            k = (meta.get("namespace") or "", meta.get("name") or "")
            rv = meta.get("resourceVersion") or ""
            seen.add(k)
            hit = self._memo.get(k)
            if hit is None or hit[0] != rv:
                try:
                    value = self.fn(obj)
                except ParseError as exc:
                    log.error("skipping malformed object", kind=self.kind,
                              namespace=k[0] or None, name=k[1], error=str(exc))
                    value = None
                hit = (rv, value)
                self._memo[k] = hit
            if hit[1] is not None:
                if isinstance(hit[1], list):
                    out.extend(hit[1])
                else:
                    out.append(hit[1])
        for gone in set(self._memo) - seen:
            del self._memo[gone]
        return out


class ClusterCache:
    """Informers for GPUDevices, GPUClasses, Nodes, Namespaces, ResourceQuotas, VMIs and the
    settings ConfigMap. Start with `await tg.start(cache.run)`: returns once every informer
    has listed. `snapshot()` builds a `model.Snapshot` from the cached objects."""

    def __init__(self, api: ApiClient, *, settings_namespace: str = "cozy-system",
                 watch_timeout: int = 240) -> None:
        core, custom = CoreV1Api(api), CustomObjectsApi(api)
        p = functools.partial
        self.devices = Informer("gpudevices", p(custom.list_cluster_custom_object, GROUP,
                                                VERSION, "gpudevices"),
                                watch_timeout=watch_timeout)
        self.classes = Informer("gpuclasses", p(custom.list_cluster_custom_object, GROUP,
                                                VERSION, "gpuclasses"),
                                watch_timeout=watch_timeout)
        self.vmis = Informer("virtualmachineinstances",
                             p(custom.list_cluster_custom_object, "kubevirt.io", "v1",
                               "virtualmachineinstances"), watch_timeout=watch_timeout)
        self.nodes = Informer("nodes", core.list_node, watch_timeout=watch_timeout)
        self.namespaces = Informer("namespaces", core.list_namespace, watch_timeout=watch_timeout)
        self.quotas = Informer("resourcequotas", core.list_resource_quota_for_all_namespaces,
                               watch_timeout=watch_timeout)
        self.settings = Informer("settings-configmap",
                                 p(core.list_namespaced_config_map, settings_namespace,
                                   field_selector=f"metadata.name={SETTINGS_NAME}"),
                                 watch_timeout=watch_timeout)
        self.settings_namespace = settings_namespace
        self._p_devices = _Parsed("GPUDevice", parse_gpu_device)
        self._p_classes = _Parsed("GPUClass", parse_gpu_class)
        self._p_nodes = _Parsed("Node", parse_node)
        self._p_namespaces = _Parsed("Namespace", parse_namespace)
        self._p_quotas = _Parsed("ResourceQuota", parse_budgets)

    @property
    def informers(self) -> tuple[Informer, ...]:
        """Every informer of the cache."""
        return (self.devices, self.classes, self.vmis, self.nodes, self.namespaces,
                self.quotas, self.settings)

    async def run(self, *, task_status: TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every informer; report started once all have synced. Runs until cancelled."""
        async with anyio.create_task_group() as tg:
            for inf in self.informers:
                await tg.start(inf.run)
            task_status.started()

    # -- model views -----------------------------------------------------------------
    def device_values(self) -> list[GPUDevice]:
        """Every parseable GPUDevice."""
        return self._p_devices(self.devices)

    def snapshot(self) -> Snapshot:
        """The cluster as model values (no reservations)."""
        return Snapshot.build(
            nodes=self._p_nodes(self.nodes), classes=self._p_classes(self.classes),
            devices=self._p_devices(self.devices), budgets=self._p_quotas(self.quotas),
            namespaces=self._p_namespaces(self.namespaces))

    def vmi_keys(self) -> set[tuple[str, str]]:
        """(namespace, name) of every VMI that exists now."""
        return self.vmis.keys()
