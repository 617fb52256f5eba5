"""Creating a GPU fleet on an API server: Nodes with extended-resource allocatable,
GPUClasses, tenant namespaces with the tenant role and budgets, held devices. Used by the
demo, the e2e tests and the benchmark (the admin's side; the controller never calls it).
"""

from __future__ import annotations

from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi, RbacAuthorizationV1Api

from datetime import datetime, timezone

from model.types import DRA_QUOTA_SUFFIX, GROUP, KUBEVIRT_SCHEDULABLE_LABEL, VERSION

MERGE = "application/merge-patch+json"
KUBEVIRT_NODE_LABELS = {KUBEVIRT_SCHEDULABLE_LABEL: "true", "machine-type.node.kubevirt.io/q35": "true"}
"""Labels KubeVirt requires of a node for a launcher Pod (virt-handler sets them on real nodes)."""
KUBELET_LABELS = {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}
"""Labels a kubelet puts on its Node; virt-controller selects `kubernetes.io/arch` of the VMI."""
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
"""The annotation that hands a Node to KWOK (`localcluster.kubevirt`)."""
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
LAUNCHER_CAPACITY = {"cpu": "64", "memory": "256Gi", "pods": "250", "ephemeral-storage": "500Gi",
                     "devices.kubevirt.io/kvm": "1k", "devices.kubevirt.io/tun": "1k",
                     "devices.kubevirt.io/vhost-net": "1k"}
"""What a Node offers besides GPUs, so kube-scheduler can place launcher Pods on it."""


def quota_key(resource: str) -> str:
    """The ResourceQuota `spec.hard` key of a budget of `resource`: `requests.<resource>` for
    an extended resource, the key itself for a DeviceClass's DRA devices (DR1,
    `<dc>.deviceclass.resource.k8s.io/devices`, Kubernetes' own quota key)."""
    return resource if resource.endswith(DRA_QUOTA_SUFFIX) else f"requests.{resource}"


def _conditions(ready: bool) -> list[dict]:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [{"type": "Ready", "status": "True" if ready else "False",
             "reason": "KubeletReady" if ready else "KubeletNotReady",
             "message": "written by gpu-binder's fleet helper", "lastHeartbeatTime": now,
             "lastTransitionTime": now}]


class Fleet:
    """Admin helpers over one ApiClient. Every method creates (or patches) and returns the
    API's answer; errors propagate as kubernetes_asyncio ApiException."""

    def __init__(self, api: ApiClient) -> None:
        self.core = CoreV1Api(api)
        self.custom = CustomObjectsApi(api)
        self.rbac = RbacAuthorizationV1Api(api)

    async def node(self, name: str, allocatable: dict[str, int], *,
                   labels: dict[str, str] | None = None, cordoned: bool = False,
                   ready: bool = True, kubevirt: bool = True, kwok: bool = False,
                   taints: list[dict] | None = None) -> None:
        """A Node advertising `allocatable` as KubeVirt runs VMs on it: KubeVirt's labels
        (`kubevirt.io/schedulable=true`, the q35 machine type; not with `kubevirt=False`) and
        what a launcher Pod requests besides GPUs (cpu, memory, pods, ephemeral-storage,
        `devices.kubevirt.io/*`, which virt-handler would advertise). No kubelet: its status
        is written here, with a Ready condition (False with `ready=False`); `kwok=True` also
        lets KWOK manage it (heartbeats, Pod phases). Once Ready, the not-ready taint every
        new Node gets (TaintNodesByCondition; no node controller runs to lift it) is
        removed and `taints` set instead (B3)."""
        labels = {"kubernetes.io/hostname": name, **KUBELET_LABELS,
                  **(KUBEVIRT_NODE_LABELS if kubevirt else {}), **(labels or {})}
        meta: dict = {"name": name, "labels": labels}
        if kwok:
            meta["annotations"] = {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}
        await self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": meta,
                                     "spec": {"unschedulable": cordoned}})
        await self.set_allocatable(name, allocatable, ready=ready)
        if ready:
            await self.set_taints(name, taints or [])
        elif taints:
            await self.set_taints(name, [*taints, NOT_READY_TAINT])

    async def set_taints(self, name: str, taints: list[dict]) -> None:
        """Replace `spec.taints` of a Node."""
        await self.core.patch_node(name, {"spec": {"taints": taints}}, _content_type=MERGE)

    async def set_allocatable(self, name: str, allocatable: dict[str, int], *,
                              ready: bool | None = None) -> None:
        """Write `status.capacity` and `status.allocatable` of a Node: `allocatable` over
        what a launcher Pod needs besides GPUs (LAUNCHER_CAPACITY); with `ready` given, the
        Ready condition too."""
        res = {**LAUNCHER_CAPACITY, **{k: str(v) for k, v in allocatable.items()}}
        status: dict = {"capacity": res, "allocatable": res}
        if ready is not None:
            status["conditions"] = _conditions(ready)
        await self.core.patch_node_status(name, {"status": status}, _content_type=MERGE)

    async def cordon(self, name: str, cordoned: bool = True) -> None:
        await self.core.patch_node(name, {"spec": {"unschedulable": cordoned}},
                                   _content_type=MERGE)

    async def gpu_class(self, name: str, resource: str | None = None, *, on_cordon: str = "Move",
                        node_selector: dict[str, str] | None = None,
                        namespace_selector: dict | None = None,
                        device_mode: dict | None = None) -> None:
        """A GPUClass: count mode over extended `resource`, or (DR1) device mode with the
        `device_mode` spec fields (`deviceClassName`, `selectors`, `topology`)."""
        spec: dict = {**({"resourceName": resource} if resource else {}), **(device_mode or {}),
                      "onCordon": on_cordon}
        if node_selector:
            spec["nodeSelector"] = node_selector
        if namespace_selector:
            spec["namespaceSelector"] = namespace_selector
        await self.custom.create_cluster_custom_object(GROUP, VERSION, "gpuclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUClass",
            "metadata": {"name": name}, "spec": spec})

    async def tenant(self, name: str, *, labels: dict[str, str] | None = None,
                     budgets: dict[str, int] | None = None, user: str | None = None) -> None:
        """A tenant namespace (label gpu.cozystack.io/tenant), RoleBindings of the tenant and
        VMI-editor ClusterRoles for `user`, and a ResourceQuota `gpu-budget` with `budgets`
        (by resource name; `quota_key` makes the quota's keys)."""
        labels = {"gpu.cozystack.io/tenant": "true", **(labels or {})}
        await self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": name, "labels": labels}})
        for binding, role in (("gpu-tenant", "gpu-binder:tenant"),
                              ("vmi-editor", "gpu-binder-testing:vmi-editor")):
            if not user:
                break
            await self.rbac.create_namespaced_role_binding(name, {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"kind": "User", "name": user,
                              "apiGroup": "rbac.authorization.k8s.io"}]})
        if budgets:
            await self.core.create_namespaced_resource_quota(name, {
                "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu-budget"},
                "spec": {"hard": {quota_key(r): str(n) for r, n in budgets.items()}}})

    async def device(self, namespace: str, name: str, class_name: str) -> dict:
        """A held GPUDevice (Pending until the binder places it)."""
        return await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "gpudevices", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                "metadata": {"name": name}, "spec": {"class": class_name}})

    async def get_device(self, namespace: str, name: str) -> dict:
        return await self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                              "gpudevices", name)

    async def set_status(self, namespace: str, name: str, status: dict,
                         field_manager: str = "gpu-binder-tests") -> dict:
        """Merge-patch a device's status (as the webhook or a test would)."""
        return await self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "gpudevices", name, {"status": status},
            _content_type=MERGE, field_manager=field_manager)
