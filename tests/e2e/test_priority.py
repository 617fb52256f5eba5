"""A hostile tenant against P1 (docs/contract.md §3c; docs/security.md "Priority"): a VMI's
priority comes from Kubernetes' own PriorityClasses, resolved by the webhook at admission and
recorded in its devices' `status.bindRequest`, through the real API server, the shipped
webhook configuration, RBAC and policies, and two controller replicas.

The tenant names a PriorityClass that does not exist (refused as Kubernetes refuses such a
Pod, naming it, nothing written), names one a ResourceQuota scoped on PriorityClass forbids it
(refused as over budget), and, once admitted, tries to raise the recorded priority: by
writing the device's status (forbidden) and by editing the VMI's `spec.priorityClassName`
(nothing recorded changes).
"""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.client import ApiException, CustomObjectsApi, SchedulingV1Api

from tests.e2e.conftest import TENANT_GROUP, unique
from tests.e2e.helpers import eventually, housekeeping_rounds, make_pool, replicas_saw

pytestmark = pytest.mark.anyio
GROUP, VERSION = "gpu.cozystack.io", "v1alpha1"
VMI_GROUP, VMI_VERSION, VMIS = "kubevirt.io", "v1", "virtualmachineinstances"


def vmi_body(name: str, cls: str, count: int, priority_class: str | None) -> dict:
    spec: dict = {"domain": {"devices": {}}}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "annotations": {"gpu.cozystack.io/templates": f"{cls}={count}"}},
            "spec": spec}


async def priority_class(fleet, system, name: str, value: int) -> None:
    """A PriorityClass, in every replica's cache."""
    made = await SchedulingV1Api(fleet.core.api_client).create_priority_class({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": name}, "value": value, "description": "gpu-binder e2e (P1)"})
    await replicas_saw(system, {"priorityclasses": made.metadata.resource_version}, what=name)


async def attacker(fleet, control_plane, tmp_path, tenant_client, system):
    """A pool of one 4-unit node, its tenant, and a user of that tenant with the tenant role
    and VMI create/update/patch/delete (as KubeVirt's `kubevirt.io:edit` gives): (class,
    resource, tenant, the user's CustomObjectsApi)."""
    user = unique("user")
    res, cls, _, tenant, _ = await make_pool(fleet, {"a": 4}, seen_by=system, user=user)
    kc = control_plane.write_user_kubeconfig(tmp_path / f"{user}.kubeconfig", user, (TENANT_GROUP,),
                                             namespace=tenant)
    return cls, res, tenant, CustomObjectsApi(await tenant_client(kc))


async def create_as(api: CustomObjectsApi, ns: str, body: dict) -> tuple[int, str]:
    """The tenant's create: (201, "") when admitted, else (status, message) as it is told."""
    try:
        await api.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS, body)
        return 201, ""
    except ApiException as exc:
        return exc.status, (json.loads(exc.body).get("message", "") if exc.body else str(exc))


async def devices(fleet, ns: str) -> dict[str, dict]:
    got = await fleet.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpudevices")
    return {d["metadata"]["name"]: d for d in got["items"]}


async def vmi_exists(fleet, ns: str, name: str) -> bool:
    try:
        await fleet.custom.get_namespaced_custom_object(VMI_GROUP, VMI_VERSION, ns, VMIS, name)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


async def test_P1_a_priority_class_that_does_not_exist_is_refused_naming_it_and_nothing_is_written(
        system, fleet, control_plane, tmp_path, tenant_client):
    cls, _, tenant, api = await attacker(fleet, control_plane, tmp_path, tenant_client, system)
    missing = unique("no-such-class")
    status, message = await create_as(api, tenant, vmi_body("vm", cls, 2, missing))
    assert status == 403, message
    assert f"no PriorityClass with name {missing} was found" in message
    assert await devices(fleet, tenant) == {}            # no template device created
    assert not await vmi_exists(fleet, tenant, "vm")


async def test_P1_a_quota_scoped_on_a_priority_class_forbids_the_tenant_that_class(
        system, fleet, control_plane, tmp_path, tenant_client):
    cls, res, tenant, api = await attacker(fleet, control_plane, tmp_path, tenant_client, system)
    on_demand, spot = unique("on-demand"), unique("spot")
    await priority_class(fleet, system, on_demand, 100_000)
    await priority_class(fleet, system, spot, 10)
    quota = await fleet.core.create_namespaced_resource_quota(tenant, {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-on-demand"},
        "spec": {"hard": {f"requests.{res}": "0"},
                 "scopeSelector": {"matchExpressions": [
                     {"scopeName": "PriorityClass", "operator": "In", "values": [on_demand]}]}}})
    await replicas_saw(system, {"resourcequotas": quota.metadata.resource_version}, what="the quota")
    status, message = await create_as(api, tenant, vmi_body("vm-od", cls, 2, on_demand))
    assert status == 403, message
    assert f"PriorityClass In ({on_demand})" in message and "allows 0" in message
    assert await devices(fleet, tenant) == {}
    assert not await vmi_exists(fleet, tenant, "vm-od")
    # the same set at a class the quota does not forbid is admitted
    status, message = await create_as(api, tenant, vmi_body("vm-spot", cls, 2, spot))
    assert status == 201, message


async def test_P1_an_admitted_priority_is_recorded_and_the_tenant_cannot_change_it(
        system, fleet, control_plane, tmp_path, tenant_client):
    cls, _, tenant, api = await attacker(fleet, control_plane, tmp_path, tenant_client, system)
    low, high = unique("batch"), unique("urgent")
    await priority_class(fleet, system, low, 500)
    await priority_class(fleet, system, high, 900_000)
    status, message = await create_as(api, tenant, vmi_body("vm", cls, 2, low))
    assert status == 201, message
    have = await devices(fleet, tenant)
    assert len(have) == 2
    for d in have.values():
        br = d["status"]["bindRequest"]
        assert (br["priority"], br["preemptionPolicy"], br["priorityClassName"]) == (
            500, "PreemptLowerPriority", low), br
    name, dev = sorted(have.items())[0]
    # 1. the status subresource is the binder's: the tenant cannot write it
    with pytest.raises(ApiException) as raised:
        await api.patch_namespaced_custom_object_status(
            GROUP, VERSION, tenant, "gpudevices", name,
            {"status": {"bindRequest": {**dev["status"]["bindRequest"], "priority": 900_000,
                                        "priorityClassName": high}}})
    assert raised.value.status == 403
    # 2. the VMI's spec is the tenant's, but the priority was resolved once, at admission
    try:
        await api.patch_namespaced_custom_object(  # a JSON Patch: the client's default type
            VMI_GROUP, VMI_VERSION, tenant, VMIS, "vm",
            [{"op": "add", "path": "/spec/priorityClassName", "value": high}])
        edited = True
    except ApiException as exc:  # a policy may refuse the edit: then nothing changed either
        edited = False
        assert exc.status in (403, 422), exc
    if edited:
        async def shows_it() -> bool:
            got = await fleet.custom.get_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS, "vm")
            return got["spec"].get("priorityClassName") == high
        await eventually(shows_it, what="the edited VMI")
    await housekeeping_rounds(system, 2)  # every replica had rounds to react, if it would
    for n, d in (await devices(fleet, tenant)).items():
        br = d["status"]["bindRequest"]
        assert (br["priority"], br["priorityClassName"]) == (500, low), (n, br)
        assert br["id"] == have[n]["status"]["bindRequest"]["id"]
