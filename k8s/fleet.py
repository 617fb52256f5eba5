"""Creating a GPU fleet on an API server: Nodes with extended-resource allocatable,
GPUClasses, tenant namespaces with the tenant role and budgets, held devices. Used by the
demo, the e2e tests and the benchmark (the admin's side; the controller never calls it).
"""

from __future__ import annotations

from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi, RbacAuthorizationV1Api

from model.types import GROUP, VERSION

MERGE = "application/merge-patch+json"


class Fleet:
    """Admin helpers over one ApiClient. Every method creates (or patches) and returns the
    API's answer; errors propagate as kubernetes_asyncio ApiException."""

    def __init__(self, api: ApiClient) -> None:
        self.core = CoreV1Api(api)
        self.custom = CustomObjectsApi(api)
        self.rbac = RbacAuthorizationV1Api(api)

    async def node(self, name: str, allocatable: dict[str, int], *,
                   labels: dict[str, str] | None = None, cordoned: bool = False) -> None:
        """A Node (no kubelet: its status is written here) advertising `allocatable`."""
        labels = {"kubernetes.io/hostname": name, **(labels or {})}
        await self.core.create_node({"apiVersion": "v1", "kind": "Node",
                                     "metadata": {"name": name, "labels": labels},
                                     "spec": {"unschedulable": cordoned}})
        await self.set_allocatable(name, allocatable)

    async def set_allocatable(self, name: str, allocatable: dict[str, int]) -> None:
        """Write `status.capacity` and `status.allocatable` of a Node."""
        res = {k: str(v) for k, v in allocatable.items()}
        await self.core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res}},
                                          _content_type=MERGE)

    async def cordon(self, name: str, cordoned: bool = True) -> None:
        await self.core.patch_node(name, {"spec": {"unschedulable": cordoned}},
                                   _content_type=MERGE)

    async def gpu_class(self, name: str, resource: str, *, on_cordon: str = "Move",
                        node_selector: dict[str, str] | None = None,
                        namespace_selector: dict | None = None) -> None:
        spec: dict = {"resourceName": resource, "onCordon": on_cordon}
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
        VMI-editor ClusterRoles for `user`, and a ResourceQuota `gpu-budget` with `budgets`."""
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
                "spec": {"hard": {f"requests.{r}": str(n) for r, n in budgets.items()}}})

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
