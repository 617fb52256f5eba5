"""The pin's consumers in device mode, without the binder yet (docs/contract.md §3b, DR5): a VMI that
takes its GPUs from a pre-created ResourceClaim (one count-1 request per device, pinned by
`uuid`, constrained by `matchAttribute: gpu.nvidia.com/partition{size}`) and carries a node pin
gets a launcher Pod from virt-controller (`GPUsWithDRA` on), and kube-scheduler's allocator can
only confirm that choice: it allocates exactly the pinned devices and binds the Pod on the pin
when they form one partition, and leaves the Pod unschedulable when they do not. This is the
mechanism DR5's claim relies on; the binder making such claims is the device-mode back end."""

from __future__ import annotations

import copy

import pytest
import yaml

from localcluster.dra_profiles import (DEVICE_CLASS, HGX_H100_8, device_class, gpu_uuid,
                                       resource_slice)
from tests.e2e.conftest import FIXTURES, unique
from tests.e2e.helpers import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
RESOURCE = "resource.k8s.io"


@pytest.fixture(scope="module")
def kubevirt(kubevirt_shared):
    return kubevirt_shared


def pinned_claim(name: str, indices: list[int]) -> dict:
    """A claim of one count-1 request per GPU, each pinned by its uuid (CEL sees attributes,
    not device names; a passthrough GPU's uuid repeats on every node of the profile, so the
    VMI's node pin picks the node), all sharing one partition of the set's size."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {
                "requests": [{"name": f"gpu-{k}", "exactly": {
                    "deviceClassName": DEVICE_CLASS, "count": 1,
                    "selectors": [{"cel": {"expression":
                        f"device.attributes['gpu.nvidia.com'].uuid == '{gpu_uuid(HGX_H100_8, i)}'"}}]}}
                    for k, i in enumerate(indices)],
                "constraints": [{"matchAttribute": f"gpu.nvidia.com/partition{len(indices)}"}]}}}


def claim_vmi(name: str, claim: str, node: str, count: int) -> dict:
    """KubeVirt's own vmi-gpu example taking `count` GPUs from `claim`, pinned to `node`."""
    v = copy.deepcopy(yaml.safe_load((FIXTURES / "vmi-gpu.yaml").read_text()))
    v["apiVersion"] = "kubevirt.io/v1"
    v["metadata"] = {"name": name}
    v["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
    v["spec"]["domain"]["devices"]["gpus"] = [
        {"name": f"gpu{k}", "claimName": "gpus", "requestName": f"gpu-{k}"} for k in range(count)]
    v["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return v


async def launcher(fleet, ns: str, uid: str) -> dict | None:
    pods = await fleet.core.list_namespaced_pod(ns, label_selector=f"kubevirt.io/created-by={uid}")
    return pods.items[0].to_dict() if len(pods.items) == 1 else None


@pytest.fixture
async def hgx_node(fleet, control_plane):
    """A KWOK node publishing one hgx-h100-8 pool, and a tenant namespace."""
    node, ns = unique("hgx"), unique("dra")
    await fleet.node(node, {}, kwok=True)
    if control_plane.kubectl("get", "deviceclass", DEVICE_CLASS, check=False).returncode != 0:
        await fleet.custom.create_cluster_custom_object(RESOURCE, "v1", "deviceclasses", device_class())
    await fleet.custom.create_cluster_custom_object(RESOURCE, "v1", "resourceslices",
                                                    resource_slice(node, HGX_H100_8))
    await fleet.core.create_namespace({"metadata": {"name": ns}})
    return node, ns


async def claim_and_vmi(fleet, ns: str, node: str, claim: str, indices: list[int]) -> dict:
    """Create the pinned claim of GPUs `indices` of `node` and a VMI taking them; the VMI."""
    await fleet.custom.create_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims",
                                                       pinned_claim(claim, indices))
    return await fleet.custom.create_namespaced_custom_object(
        "kubevirt.io", "v1", ns, "virtualmachineinstances", claim_vmi("vm", claim, node, len(indices)))


async def test_DR5_scheduler_allocates_exactly_the_pinned_partition_and_binds_on_the_pin(kubevirt, fleet, hgx_node):
    node, ns = hgx_node
    # modules 1 and 2 are GPUs 3 and 0 in PCI order (the profile's module-id order)
    made = await claim_and_vmi(fleet, ns, node, "set", [3, 0])

    async def bound():
        pod = await launcher(fleet, ns, made["metadata"]["uid"])
        return pod if pod and pod["spec"].get("node_name") else None
    try:
        pod = await eventually(bound, timeout=60, what="launcher Pod bound")
    except AssertionError as exc:
        seen = await launcher(fleet, ns, made["metadata"]["uid"])
        claim = await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", "set")
        raise AssertionError(f"{exc}; launcher Pod status: {(seen or {}).get('status')}; "
                             f"claim status: {claim.get('status')}") from None
    assert pod["spec"]["node_name"] == node
    assert [c["resource_claim_name"] for c in pod["spec"]["resource_claims"]] == ["set"]
    claim = await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", "set")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted((r["request"], r["pool"], r["device"]) for r in results) == [
        ("gpu-0", node, "gpu-vfio-3"), ("gpu-1", node, "gpu-vfio-0")]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]


async def test_DR3_two_gpus_of_different_partitions_are_left_unschedulable(kubevirt, fleet, hgx_node):
    node, ns = hgx_node
    # GPUs 0 and 1 are modules 2 and 4: partition2 ids 3 and 4, no pair
    made = await claim_and_vmi(fleet, ns, node, "split", [0, 1])

    async def unschedulable():
        pod = await launcher(fleet, ns, made["metadata"]["uid"])
        conds = ((pod or {}).get("status") or {}).get("conditions") or []
        return [c for c in conds if c["type"] == "PodScheduled" and c["reason"] == "Unschedulable"]
    (cond,) = await eventually(unschedulable, timeout=60, what="launcher Pod Unschedulable")
    assert "cannot allocate all claims" in cond["message"]
    claim = await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", "split")
    assert not (claim.get("status") or {}).get("allocation")
