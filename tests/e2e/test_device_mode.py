"""Device mode end to end (docs/contract.md §3b, issue 32's acceptance): the binder places whole
Fabric Manager partitions of HGX nodes whose GPUs are DRA devices in ResourceSlices, the
webhook writes one ResourceClaim per VMI, and kube-scheduler's allocator, given that claim,
allocates exactly the devices on the binder's record for the launcher Pod on the pinned node.

Real kube-apiserver, kube-scheduler, kube-controller-manager (resourceclaim-controller),
KubeVirt (virt-api, virt-controller, `GPUsWithDRA`) and KWOK; the slices are
`localcluster.dra_profiles`' hgx-h100-8 as NVIDIA's driver publishes them; no driver Prepare.
Each test has a device-mode class of its own whose `nodeSelector` takes only its own nodes
(other tests' HGX nodes publish the same uuids: a passthrough GPU's uuid repeats per PCI
address), and a tenant of its own.

Written against the planned interfaces (devmode plan): GPUDevice `status.device {driver,
pool, device}`, the VMI's `spec.resourceClaims` and `gpus[].claimName/requestName`, the
claim's `status.allocation.devices.results`.
"""

from __future__ import annotations

import signal
from datetime import datetime, timezone

import anyio
import pytest
from kubernetes_asyncio.client import ApiException

from localcluster.dra_profiles import DRIVER, HGX_H100_8, module_index, resource_slice
from localcluster.dra_world import DEVICE_BUDGET_KEY, HGX_CLASS, dra_node, group_formed
from model.device.dra import parse_resource_slice, pool_devices
from localcluster.fleet import Fleet
from model.claim import MANAGED_BY, MANAGED_BY_LABEL
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas, unique
from tests.e2e.helpers import class_rv, device_rv, eventually, leader_index, node_rv, replicas_saw
from tests.e2e.test_dra_kubevirt import RESOURCE, pinned_claim
from tests.support.faults import armed_hang_after_claim
from tests.support.kubevirt_vmis import (  # noqa: F401 (kubevirt: a fixture)
    bound_launcher, create, kubevirt, launcher_pod, pin, vmi)

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
WORLD_LABEL = "gpu-binder.test/world"
BROKEN = {"key": "gpu.example.com/broken", "value": "xid-79", "effect": "NoSchedule"}


BIND_TIMEOUT, GRACE = 12, 16


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas as conftest's `system`, with a bind timeout of 12 s and an attachment
    grace of 16 s: room for KubeVirt's webhooks on two busy cores, and a grace short enough
    for the tests that wait for housekeeping to pass it (H1/H2 of claims)."""
    args = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + (f"--bind-timeout={BIND_TIMEOUT}", f"--attachment-grace={GRACE}"))


@pytest.fixture(scope="module")
def dra(system, kubevirt):
    """This module's replicas with device mode's cluster side: NVIDIA's DeviceClass and
    kube-controller-manager's resourceclaim-controller (stopped with the replicas)."""
    system.start_dra()
    return system


async def world(fleet, system, nodes: dict[str, dict], *, labelled: bool = True, on_cordon: str = "Move"):
    """A device-mode class of its own (HGX_CLASS's spec, `nodeSelector` on this world's label,
    `on_cordon`), HGX nodes of its own (short name -> `dra_node` keyword arguments;
    `labelled=False` leaves them out of the class until `join`), and a tenant with a budget of
    32 devices. Waits until every replica's informers saw the class and the nodes. Returns
    (class, {short: node}, tenant, label)."""
    label = unique("world")
    cls = unique("hgx")
    await fleet.gpu_class(cls, device_mode=HGX_CLASS.spec(), node_selector={WORLD_LABEL: label},
                          on_cordon=on_cordon)
    names = {}
    for short, kw in nodes.items():
        names[short] = unique(short)
        labels = {WORLD_LABEL: label} if labelled else {}
        await dra_node(fleet, names[short], HGX_H100_8, labels=labels, **kw)
    tenant = unique("t")
    await fleet.tenant(tenant, budgets={DEVICE_BUDGET_KEY: 32})
    marks = {"gpuclasses": await class_rv(fleet, cls)}
    for n in names.values():
        marks["nodes"] = max(int(marks.get("nodes", 0)), int(await node_rv(fleet, n)))
    await replicas_saw(system, marks, what="the device-mode world")
    return cls, names, tenant, label


async def join(fleet, system, node: str, label: str) -> None:
    """Put `node` into the world of `label` (its class's nodeSelector) and wait until the
    replicas saw it."""
    await fleet.core.patch_node(node, {"metadata": {"labels": {WORLD_LABEL: label}}},
                                _content_type="application/merge-patch+json")
    await replicas_saw(system, {"nodes": await node_rv(fleet, node)}, what=f"node {node} joining")


async def admin_claim(fleet, node: str, modules: list[int], *, ns: str | None = None,
                      labels: dict[str, str] | None = None) -> list[str]:
    """An administrator's claim (not the binder's) on `node`'s GPUs of `modules`, allocated
    by kube-scheduler for a Pod of the administrator's own pinned there; returns the devices
    its allocation lists (foreign use, DR2). `ns` (existing) and `labels` make it someone
    else's: with `fleet` on a tenant's client, a tenant's own claim and Pod in its namespace."""
    name = unique("foreign")
    if ns is None:
        ns = unique("admin")
        await fleet.core.create_namespace({"metadata": {"name": ns}})
    claim = pinned_claim(name, [module_index(HGX_H100_8, m) for m in modules])
    if labels:
        claim["metadata"]["labels"] = labels
    await fleet.custom.create_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", claim)
    await fleet.core.create_namespaced_pod(ns, {
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                 "containers": [{"name": "c", "image": "none", "resources": {"claims": [{"name": "gpus"}]}}]}})

    async def allocated():
        claim = await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", name)
        return (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
    results = await eventually(allocated, timeout=60, what=f"the administrator's claim {ns}/{name} allocated")
    assert {r["pool"] for r in results} == {node}
    return sorted(r["device"] for r in results)


def devices_of(node: str, names) -> list:
    """The `model.device.dra.SliceDevice`s `names` of `node`'s hgx-h100-8 slice, as published."""
    devices = pool_devices([parse_resource_slice(resource_slice(node, HGX_H100_8))])[node]
    return [d for d in devices if d.ref.device in set(names)]


async def recorded(fleet, ns: str, made: dict) -> list[str]:
    """The devices on the binder's record for an admitted VMI: each of its GPUDevices'
    `status.device` (DR2), all on the VMI's pinned node and driver."""
    names = []
    for g in made["spec"]["domain"]["devices"]["gpus"]:
        dev = await fleet.custom.get_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", ns,
                                                              "gpudevices", g["name"])
        ref = dev["status"]["device"]
        assert (ref["driver"], ref["pool"]) == (DRIVER, pin(made)), (g["name"], ref)
        names.append(ref["device"])
    return sorted(names)


async def check_admitted_set(fleet, ns: str, made: dict, size: int) -> list[str]:
    """DR5/DR6 for one admitted VMI of `size` GPUs: one claim, one `gpus[]` entry per request,
    the launcher Pod bound on the pin, the claim's allocation exactly the record, and the
    record one partition of `size` (DR3). Returns the recorded devices."""
    claims = made["spec"].get("resourceClaims") or []
    assert len(claims) == 1 and claims[0].get("resourceClaimName"), made["spec"]
    gpus = made["spec"]["domain"]["devices"]["gpus"]
    assert len(gpus) == size and {g["claimName"] for g in gpus} == {claims[0]["name"]}
    assert len({g["requestName"] for g in gpus}) == size       # one device per request
    record = await recorded(fleet, ns, made)
    assert len(set(record)) == size
    assert group_formed(devices_of(pin(made), record), HGX_CLASS.match_attribute) is not None, record
    claim_name = claims[0]["resourceClaimName"]
    claim = await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", claim_name)
    requests = claim["spec"]["devices"]["requests"]
    assert len(requests) == size and all(r["exactly"]["count"] == 1 for r in requests)
    assert claim["spec"]["devices"]["constraints"] == [
        {"matchAttribute": f"{DRIVER}/partition{size}"}] or size == 1
    pod = await bound_launcher(fleet, ns, made)
    assert pod["spec"]["nodeName"] == pin(made)
    claim = await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", claim_name)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted((r["driver"], r["pool"], r["device"]) for r in results) == [
        (DRIVER, pin(made), d) for d in record]
    return record


async def admitted_naming(fleet, tenant: str, cls: str, name: str, size: int, held: str,
                          node: str) -> dict:
    """VMI `name` of `size` GPUs of `cls` naming the held devices `held` (comma separated),
    created by `tenant` and admitted pinned to `node`; returns it as the API server made it."""
    body = vmi(name, cls, size)
    body["metadata"]["annotations"] = {"gpu.cozystack.io/devices": held}
    made, why = await create(fleet, tenant, body)
    assert made is not None, why
    assert pin(made) == node
    return made


async def held_and_idle(fleet, system, cls: str, tenant: str, node: str) -> str:
    """A held device `held-a` of `cls` whose one-GPU VMI `vm-held` was admitted on `node`
    (checked as `check_admitted_set`) and then deleted: waits until H2 cleared its attachment
    and the VMI's claim is gone, and that it stays Bound on `node` recording the same GPU.
    Returns that GPU's name."""
    await fleet.device(tenant, "held-a", cls)
    await replicas_saw(system, {"gpudevices": await device_rv(fleet, tenant, "held-a")}, what="held-a")
    made = await admitted_naming(fleet, tenant, cls, "vm-held", 1, "held-a", node)
    [kept] = await check_admitted_set(fleet, tenant, made, 1)
    claim_name = made["spec"]["resourceClaims"][0]["resourceClaimName"]
    await fleet.custom.delete_namespaced_custom_object("kubevirt.io", "v1", tenant,
                                                       "virtualmachineinstances", "vm-held")

    async def released():
        dev = await fleet.custom.get_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant,
                                                              "gpudevices", "held-a")
        st = dev.get("status") or {}
        if st.get("attachedTo") is None and await get_claim(fleet, tenant, claim_name) is None:
            return st
        return None

    st = await eventually(released, timeout=60, what="held-a released and the VMI's claim deleted")
    assert (st["phase"], st["nodeName"], st["device"]["device"]) == ("Bound", node, kept)
    return kept


@pytest.mark.parametrize("size", [1, 2, 4, 8])
async def test_DR6_a_set_of_each_size_gets_one_claim_allocated_exactly_as_recorded_in_one_partition(
        dra, fleet, size):
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    made, why = await create(fleet, tenant, vmi(f"vm-{size}", cls, size))
    assert made is not None, why
    assert pin(made) == nodes["hgx"]
    await check_admitted_set(fleet, tenant, made, size)


async def test_DR3_five_free_without_a_free_partition_of_four_refuses_with_the_reason_another_node_takes_it(
        dra, fleet):
    # node a: module 1 tainted, modules 5 and 6 an administrator's: 5 free, {1-4} and {5-8} broken
    cls, nodes, tenant, label = await world(fleet, dra, {
        "a": {"device_taints": {module_index(HGX_H100_8, 1): [BROKEN]}}})
    await admin_claim(fleet, nodes["a"], [5, 6])
    refused, why = await create(fleet, tenant, vmi("vm-4", cls, 4))
    assert refused is None
    assert nodes["a"] in why and "partition" in why and "4" in why, why
    b = unique("b")
    await dra_node(fleet, b, HGX_H100_8)
    await join(fleet, dra, b, label)
    made, why = await create(fleet, tenant, vmi("vm-4-again", cls, 4))
    assert made is not None, why
    assert pin(made) == b
    record = await check_admitted_set(fleet, tenant, made, 4)
    assert group_formed(devices_of(b, record), HGX_CLASS.match_attribute).startswith(f"{DRIVER}/partition4=")


async def test_DR2_an_administrators_claim_and_a_tainted_device_are_never_handed_out(dra, fleet):
    # modules 1 and 2 an administrator's, module 3 tainted: 5 of 8 free
    cls, nodes, tenant, _ = await world(fleet, dra, {
        "hgx": {"device_taints": {module_index(HGX_H100_8, 3): [BROKEN]}}})
    foreign = await admin_claim(fleet, nodes["hgx"], [1, 2])
    tainted = f"gpu-vfio-{module_index(HGX_H100_8, 3)}"
    handed: list[str] = []
    for i in range(5):
        made, why = await create(fleet, tenant, vmi(f"vm-{i}", cls, 1))
        assert made is not None, (i, why)
        handed += await check_admitted_set(fleet, tenant, made, 1)
    assert len(set(handed)) == 5
    assert not set(handed) & {*foreign, tainted}, (handed, foreign, tainted)
    refused, why = await create(fleet, tenant, vmi("vm-5", cls, 1))
    assert refused is None and nodes["hgx"] in why, why


async def test_DR4_a_held_device_gathers_with_a_template_into_one_partition_and_a_deleted_vmi_leaves_no_claim(
        dra, fleet):
    """A held device keeps its exact device when its VMI goes (H2 clears the attachment, the
    record stays); the VMI's claim is deleted once the VMI is gone and the grace passed (DR5,
    H2: no orphan claim); a new VMI asking for that held device plus one template device gets
    both in one partition of 2, the held one re-pointed if its pair is not free (DR4)."""
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    await held_and_idle(fleet, dra, cls, tenant, nodes["hgx"])  # its record stays, claim gone
    second = vmi("vm-pair", cls, 1)
    second["metadata"]["annotations"]["gpu.cozystack.io/devices"] = "held-a"
    made, why = await create(fleet, tenant, second)
    assert made is not None, why
    assert pin(made) == nodes["hgx"]
    record = await check_admitted_set(fleet, tenant, made, 2)
    assert group_formed(devices_of(nodes["hgx"], record), HGX_CLASS.match_attribute) \
        .startswith(f"{DRIVER}/partition2=")


TAKERS = ["administrator", "tenant-with-our-label"]


async def taker_of(fleet, control_plane, tenant_client, tmp_path, who: str) -> tuple:
    """Who takes an idle held device's GPU (DR2): an administrator (its own namespace, no
    managed-by label), or another tenant copying the binder's managed-by label onto a claim of
    its own, made with the tenant's own credentials (a Role letting it create claims and
    Pods, as a platform's tenant-admin may: under this module's `rawResourceNames: allowed`
    the policy admits it). Returns (fleet to make the claim with, its namespace, its labels)."""
    if who == "administrator":
        ns = unique("admin")
        await fleet.core.create_namespace({"metadata": {"name": ns}})
        return fleet, ns, None
    settings = await fleet.core.read_namespaced_config_map("gpu-settings", "cozy-system")
    assert settings.data["rawResourceNames"] == "allowed", settings.data
    ns = unique("t")
    user = f"user-{ns}"
    await fleet.tenant(ns, budgets={DEVICE_BUDGET_KEY: 32}, user=user)
    await fleet.rbac.create_namespaced_role(ns, {
        "metadata": {"name": "claims"},
        "rules": [{"apiGroups": [RESOURCE], "resources": ["resourceclaims"], "verbs": ["create", "get"]},
                  {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}]})
    await fleet.rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "claims"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]})
    path = await anyio.to_thread.run_sync(control_plane.write_user_kubeconfig,
                                          tmp_path / f"{ns}.kubeconfig", user)
    return Fleet(await tenant_client(path)), ns, {MANAGED_BY_LABEL: MANAGED_BY}


@pytest.mark.parametrize("who", TAKERS)
async def test_DR2_a_held_devices_gpu_taken_while_idle_re_points_it_on_its_node(
        dra, fleet, control_plane, tenant_client, tmp_path, who):
    """DR2/DR4/DR6: a held device's VMI goes (its record stays, the binder's claim is deleted);
    while it is idle a claim that is not the set's own takes exactly its recorded GPU (an
    administrator's, or another tenant's carrying our managed-by label in its own namespace)
    and kube-scheduler allocates it. The tenant's VMI asking for that held device again is
    admitted on the same node with the record re-pointed to another GPU, never the taken one,
    and its launcher Pod is bound with a claim allocated exactly as the new record; the
    taker's allocation is untouched."""
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    node = nodes["hgx"]
    kept = await held_and_idle(fleet, dra, cls, tenant, node)

    as_taker, taker_ns, labels = await taker_of(fleet, control_plane, tenant_client, tmp_path, who)
    module = HGX_H100_8.gpus[int(kept.rsplit("-", 1)[1])].module_id
    assert await admin_claim(as_taker, node, [module], ns=taker_ns, labels=labels) == [kept]
    [taken] = (await fleet.custom.list_namespaced_custom_object(RESOURCE, "v1", taker_ns,
                                                                "resourceclaims"))["items"]
    await replicas_saw(dra, {"resourceclaims": taken["metadata"]["resourceVersion"]},
                       what="the taker's allocation")

    made = await admitted_naming(fleet, tenant, cls, "vm-back", 1, "held-a", node)
    assert [g["name"] for g in made["spec"]["domain"]["devices"]["gpus"]] == ["held-a"]
    [moved] = await check_admitted_set(fleet, tenant, made, 1)
    assert moved != kept, (moved, kept)
    after = await get_claim(as_taker, taker_ns, taken["metadata"]["name"])
    assert [r["device"] for r in after["status"]["allocation"]["devices"]["results"]] == [kept]


async def test_HL1_a_held_devices_gpu_tainted_while_idle_by_a_rule_re_points_it_on_its_node(dra, fleet):
    """HL1 (DR2/DR4/DR6): a held device's VMI goes (its record stays); while it is idle the
    administrator taints exactly its recorded GPU with a DeviceTaintRule (NoSchedule, the
    DRADeviceTaintRules API). The tenant's VMI asking for that held device again is
    admitted on the same node with the record re-pointed to another GPU (not moved, not
    answered "already placed" on the tainted one), and kube-scheduler allocates its launcher
    Pod's claim exactly as the new record: never the tainted GPU."""
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    node = nodes["hgx"]
    kept = await held_and_idle(fleet, dra, cls, tenant, node)
    rule = await fleet.custom.create_cluster_custom_object(RESOURCE, "v1beta2", "devicetaintrules", {
        "apiVersion": f"{RESOURCE}/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": unique("xid")},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": node, "device": kept},
                 "taint": {"key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}}})
    await replicas_saw(dra, {"devicetaintrules": rule["metadata"]["resourceVersion"]},
                       what="the DeviceTaintRule on the held device's GPU")

    made = await admitted_naming(fleet, tenant, cls, "vm-back", 1, "held-a", node)
    [moved] = await check_admitted_set(fleet, tenant, made, 1)
    assert moved != kept, (moved, kept)
    dev = await fleet.get_device(tenant, "held-a")
    assert (dev["status"]["nodeName"], dev["status"]["device"]["device"]) == (node, moved)
    assert "already placed" not in dev["status"]["bindRequest"]["message"], dev["status"]["bindRequest"]


async def test_B5b_a_held_set_whose_record_broke_on_its_cordoned_node_is_re_pointed_there(dra, fleet):
    """B5(b) in device mode (DR2-DR4): two held devices of an onCordon Stay class record a
    partition of 2; their VMI goes (H2: the records stay), the node is cordoned and one
    recorded GPU gets a NoSchedule device taint. The VMI asking for them again is admitted on
    the cordoned node (B5(b), though another node has room) with its records re-pointed to a
    whole free pair of that node, not the tainted GPU; once the cordon lifts, the launcher
    Pod's claim is allocated exactly as recorded."""
    cls, nodes, tenant, _ = await world(fleet, dra, {"a": {}, "b": {}}, on_cordon="Stay")
    for name in ("held-a", "held-b"):
        await fleet.device(tenant, name, cls)
        await replicas_saw(dra, {"gpudevices": await device_rv(fleet, tenant, name)}, what=name)
    first = vmi("vm-held", cls, 2)
    first["metadata"]["annotations"] = {"gpu.cozystack.io/devices": "held-a,held-b"}
    made, why = await create(fleet, tenant, first)
    assert made is not None, why
    home = pin(made)
    before = await check_admitted_set(fleet, tenant, made, 2)
    claim_name = made["spec"]["resourceClaims"][0]["resourceClaimName"]
    await fleet.custom.delete_namespaced_custom_object("kubevirt.io", "v1", tenant,
                                                       "virtualmachineinstances", "vm-held")

    async def released():
        claims = await fleet.custom.list_namespaced_custom_object(RESOURCE, "v1", tenant, "resourceclaims")
        if claim_name in [c["metadata"]["name"] for c in claims["items"]]:
            return None
        for name in ("held-a", "held-b"):
            dev = await fleet.custom.get_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant,
                                                                  "gpudevices", name)
            if (dev.get("status") or {}).get("attachedTo") is not None:
                return None
        return True
    await eventually(released, timeout=60, what="the held set released and the VMI's claim deleted")
    await fleet.cordon(home)
    broken = before[0]
    body = resource_slice(home, HGX_H100_8, taints={int(broken.rsplit("-", 1)[1]): [BROKEN]})
    old = await fleet.custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                       body["metadata"]["name"])
    body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
    new = await fleet.custom.replace_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                           body["metadata"]["name"], body)
    await replicas_saw(dra, {"nodes": await node_rv(fleet, home),
                             "resourceslices": new["metadata"]["resourceVersion"]},
                       what="the cordon and the device taint")
    made = await admitted_naming(fleet, tenant, cls, "vm-back", 2, "held-a,held-b", home)
    record = await recorded(fleet, tenant, made)
    assert broken not in record and len(set(record)) == 2, (broken, record)
    assert group_formed(devices_of(home, record), HGX_CLASS.match_attribute) is not None, record
    dev = await fleet.custom.get_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant,
                                                          "gpudevices", "held-a")
    message = dev["status"]["bindRequest"]["message"]
    assert f"kept on cordoned node {home} (B5b" in message and "devices" in message, message
    await fleet.cordon(home, False)
    assert await check_admitted_set(fleet, tenant, made, 2) == record


# -- faults: a leader killed mid-admission; the binder's claim deleted by someone else -------

async def get_claim(fleet, ns: str, name: str) -> dict | None:
    """ResourceClaim `ns/name`, None when it does not exist."""
    try:
        return await fleet.custom.get_namespaced_custom_object(RESOURCE, "v1", ns, "resourceclaims", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def test_H1_a_leader_killed_between_the_claim_and_its_answer_leaves_no_orphan_and_the_retry_is_admitted(
        dra, fleet, tmp_path):
    """DR5, H1: the leader, alone answering the webhook, is killed once its webhook has made
    the VMI's claim and before it answers (a fault point: `tests.support.faults`); the API
    server's call fails, so the VMI is not created. After the grace the new leader clears the
    set (H1) and deletes the claim; the tenant's retry of the same name is admitted with a
    claim allocated exactly as recorded, and no device is on two records."""
    cls, _, tenant, _ = await world(fleet, dra, {"hgx": {}})
    name, mark = "vm-killed", tmp_path / "claim-made"
    leader = await leader_index(dra)
    armed = 1 - leader
    await anyio.to_thread.run_sync(armed_hang_after_claim, dra, armed, tenant, name, mark)
    await anyio.to_thread.run_sync(dra.kill_replica, leader, signal.SIGTERM)   # gives the Lease up
    assert await leader_index(dra) == armed
    answer: dict = {}

    async def create_it():
        answer["made"], answer["why"] = await create(fleet, tenant, vmi(name, cls, 2))

    async def claim_made():
        return mark.exists()
    async with anyio.create_task_group() as tg:
        tg.start_soon(create_it)
        await eventually(claim_made, timeout=30, what="the armed leader made the claim")
        await anyio.to_thread.run_sync(dra.kill_replica, armed, signal.SIGKILL)
    assert answer["made"] is None, answer
    assert 'failed calling webhook "vmi.gpu.cozystack.io"' in answer["why"], answer["why"]
    claim = await get_claim(fleet, tenant, f"{name}-gpus")
    assert claim is not None and mark.read_text().split()[1] == f"{tenant}/{name}-gpus"
    made_at = datetime.fromisoformat(claim["metadata"]["annotations"]["gpu.cozystack.io/claimed-at"])
    for i in (leader, armed):
        dra.start_replica(i)
    for i in (leader, armed):
        await anyio.to_thread.run_sync(dra.wait_ready, i)

    async def cleaned():
        devs = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant, "gpudevices")
        return not devs["items"] and await get_claim(fleet, tenant, f"{name}-gpus") is None
    await eventually(cleaned, timeout=GRACE + 30, interval=0.5,
                     what="the set released and the orphan claim deleted by the new leader (H1)")
    assert (datetime.now(timezone.utc) - made_at).total_seconds() >= GRACE - 1   # not before the grace
    made, why = await create(fleet, tenant, vmi(name, cls, 2))
    assert made is not None, why
    record = await check_admitted_set(fleet, tenant, made, 2)
    devs = await fleet.custom.list_namespaced_custom_object("gpu.cozystack.io", "v1alpha1", tenant, "gpudevices")
    assert sorted(d["status"]["device"]["device"] for d in devs["items"]) == record   # one record each


async def test_DR6_a_claim_deleted_before_the_launcher_pod_took_it_is_made_again_from_the_record(dra, fleet):
    """DR6, H1: an administrator deletes the binder's claim of an admitted VMI whose launcher
    Pod is not scheduled yet (its node has no memory for it). The VMI is not left
    half-admitted: housekeeping makes the claim again from the binder's record (the same
    spec, a Warning Event `GPUClaimRestored` on the VMI), and once the node has room the
    launcher Pod gets exactly the recorded devices, which never changed."""
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    node = nodes["hgx"]
    await fleet.set_allocatable(node, {"memory": "1Mi"})    # no room for a launcher Pod yet
    made, why = await create(fleet, tenant, vmi("vm-lost", cls, 2))
    assert made is not None, why
    record = await recorded(fleet, tenant, made)
    claim_name = made["spec"]["resourceClaims"][0]["resourceClaimName"]
    first = await get_claim(fleet, tenant, claim_name)

    async def unschedulable():
        pod = await launcher_pod(fleet, tenant, made["metadata"]["uid"])
        conds = ((pod or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)
    await eventually(unschedulable, timeout=60, what="the launcher Pod unschedulable (no memory)")
    taken = (await get_claim(fleet, tenant, claim_name)).get("status") or {}
    assert not taken.get("allocation") and not taken.get("reservedFor"), taken
    await fleet.custom.delete_namespaced_custom_object(RESOURCE, "v1", tenant, "resourceclaims", claim_name)

    async def restored():
        got = await get_claim(fleet, tenant, claim_name)
        return got if got and got["metadata"]["uid"] != first["metadata"]["uid"] else None
    again = await eventually(restored, timeout=30, what="the claim made again from the record (DR6)")
    assert again["spec"] == first["spec"]
    assert again["metadata"]["labels"] == first["metadata"]["labels"]
    events = await fleet.core.list_namespaced_event(tenant, field_selector="reason=GPUClaimRestored")
    assert [(e.involved_object.name, e.type) for e in events.items] == [("vm-lost", "Warning")]
    await fleet.set_allocatable(node, {})                   # room for the launcher Pod
    assert await check_admitted_set(fleet, tenant, made, 2) == record
