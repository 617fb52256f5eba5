"""Hostile tenants against capacity accounting (issue 23, items 1 and 3; docs/contract.md §4 W7, last
sentences), with KubeVirt, kube-scheduler and KWOK in the loop.

The binder excuses a launcher Pod's GPUs only up to the devices its own status records
attach to that VMI on that node (never from VMI annotations, `gpus` entries or Pod labels),
and counts a Pod's GPUs as kube-scheduler does (containers plus sidecars, the maximum with
each regular init container, overhead). Each test compares the binder's verdicts with
kube-scheduler's own placement in the same run: a launcher Pod kube-scheduler leaves
Pending for "Insufficient" must never be one of a VMI the binder admitted.
"""

from __future__ import annotations

import copy
from contextlib import asynccontextmanager

import pytest
from kubernetes_asyncio.client import CustomObjectsApi

from model.reasons import NodeProblems, NoRoom
from tests.e2e.conftest import TENANT_GROUP, unique
from tests.e2e.helpers import eventually, namespace_rv, replicas_saw
from tests.support.kubevirt_vmis import (BASE_VMI, VMI_GROUP, VMI_VERSION, VMIS, create,  # noqa: F401
                                         kubevirt, pin, pool, system, vmi)

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]
__all__ = ["kubevirt", "system"]  # the module's fixtures, shared with test_kubevirt.py
WEBHOOK = "gpu-binder"
W7_POLICY = "gpu-binder-admitted-vmis"  # k8s/manifests/policies/admitted-vmis.yaml


def no_room(node: str, res: str, needs: int, free: int, foreign: int) -> str:
    """The line of a W1 denial saying `node` has `free` of `res` (`foreign` used by Pods
    outside the binder) for a set needing `needs`."""
    return str(NodeProblems(node, (NoRoom(res, needs=needs, free=free, foreign=foreign),)))


async def attacker(fleet, control_plane, tmp_path, ns: str, tenant_client) -> CustomObjectsApi:
    """A user of tenant `ns` with the tenant role and VMI create/update/patch/delete there
    (as KubeVirt's `kubevirt.io:edit` gives): the client it attacks with."""
    user = unique("user")
    for binding, role in (("gpu-tenant", "gpu-binder:tenant"),
                          ("vmi-editor", "gpu-binder-testing:vmi-editor")):
        await fleet.rbac.create_namespaced_role_binding(ns, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]})
    kc = control_plane.write_user_kubeconfig(tmp_path / f"{user}.kubeconfig", user, (TENANT_GROUP,),
                                             namespace=ns)
    return CustomObjectsApi(await tenant_client(kc))


async def other_tenant(system, fleet) -> str:
    """A second tenant namespace, in every replica's cache (W1 reads its labels)."""
    ns = unique("t")
    await fleet.tenant(ns)
    await replicas_saw(system, {"namespaces": await namespace_rv(fleet, ns)}, what=ns)
    return ns


async def placement(fleet, ns: str, selector: str, *, timeout: float = 60) -> tuple[str, str]:
    """kube-scheduler's verdict on the one Pod matching label `selector` in `ns`: ("bound",
    node) once it has a nodeName, ("pending", message) once its PodScheduled condition is
    False for lack of a resource ("Insufficient ...")."""
    async def probe():
        pods = (await fleet.core.list_namespaced_pod(ns, label_selector=selector)).items
        if len(pods) != 1:
            return None
        p = pods[0]
        if p.spec.node_name:
            return "bound", p.spec.node_name
        for c in (p.status.conditions or []) if p.status else []:
            if c.type == "PodScheduled" and c.status == "False" and "Insufficient" in (c.message or ""):
                return "pending", c.message
        return None
    return await eventually(probe, timeout=timeout, what=f"kube-scheduler's verdict on {ns}/{selector}")


async def launcher_placement(fleet, ns: str, made: dict) -> tuple[str, str]:
    """`placement` of the virt-launcher Pod of the VMI `made`."""
    return await placement(fleet, ns, f"kubevirt.io/created-by={made['metadata']['uid']}")


async def bound_launcher_rv(fleet, ns: str, made: dict) -> str:
    """The resourceVersion of `made`'s launcher Pod once kube-scheduler bound it on its pin
    (AssertionError when it stays Pending)."""
    assert await launcher_placement(fleet, ns, made) == ("bound", pin(made))
    pods = await fleet.core.list_namespaced_pod(
        ns, label_selector=f"kubevirt.io/created-by={made['metadata']['uid']}")
    return pods.items[0].metadata.resource_version


async def assert_runs_where_pinned(fleet, ns: str, made: dict | None, msg: str) -> None:
    """The binder admitted `made` and kube-scheduler bound its launcher Pod on the pin."""
    assert made is not None, msg
    got = await launcher_placement(fleet, ns, made)
    assert got == ("bound", pin(made)), f"admitted {made['metadata']['name']}, yet kube-scheduler: {got}"


async def assert_refused(fleet, ns: str, made: dict | None, msg: str, line: str) -> None:
    """The binder refused the VMI with `line`; when it admitted it instead, the failure says
    what kube-scheduler then did with its launcher Pod."""
    if made is not None:
        got = await launcher_placement(fleet, ns, made)
        pytest.fail(f"admitted {made['metadata']['name']} on {pin(made)}; kube-scheduler: {got}")
    assert line in msg, msg


def raw_vmi(name: str, res: str, count: int, node: str) -> dict:
    """KubeVirt's vmi-gpu example with `count` raw `gpus` entries of `res` and a pin on
    `node`, without any gpu.cozystack.io annotation (never sent to the binder's webhook;
    allowed while `rawResourceNames=allowed`)."""
    v = copy.deepcopy(BASE_VMI)
    v["apiVersion"] = "kubevirt.io/v1"
    v["metadata"] = {"name": name}
    v["spec"]["domain"]["devices"]["gpus"] = [{"name": f"gpu{i}", "deviceName": res} for i in range(count)]
    v["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return v


@asynccontextmanager
async def vmi_updates_unjudged(fleet):
    """While inside, no webhook of gpu-binder's configuration sees a VMI UPDATE (its rules
    narrowed to CREATE, restored on exit). On this branch the shipped configuration already
    judges CREATE only, so this changes nothing; with W7's UPDATE judging in place it lets
    the test put the annotation there anyway, to show the *accounting* does not depend on
    the annotation being absent."""
    from kubernetes_asyncio.client import AdmissionregistrationV1Api

    api = AdmissionregistrationV1Api(fleet.core.api_client)
    saved = await api.read_mutating_webhook_configuration(WEBHOOK)
    body = api.api_client.sanitize_for_serialization(saved)
    narrowed = copy.deepcopy(body)
    for hook in narrowed["webhooks"]:
        for rule in hook.get("rules") or []:
            rule["operations"] = ["CREATE"]
    if narrowed != body:
        await api.replace_mutating_webhook_configuration(WEBHOOK, narrowed)
    try:
        yield
    finally:
        if narrowed != body:
            fresh = await api.read_mutating_webhook_configuration(WEBHOOK)
            body["metadata"]["resourceVersion"] = fresh.metadata.resource_version
            await api.replace_mutating_webhook_configuration(WEBHOOK, body)


@asynccontextmanager
async def w7_policy_suspended(fleet, ns: str, vmi: str):
    """While inside, the W7 policy (`gpu-binder-admitted-vmis`) only audits: its binding's
    validationActions are [Audit] until a server-side dry run adding a gpu.cozystack.io
    annotation to VMI `ns/vmi` passes; on exit [Deny] again, until that dry run is denied.
    The accounting tests put the tenant's edit through anyway, to show the count does not
    depend on the edit being refused."""
    from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiException

    api = AdmissionregistrationV1Api(fleet.core.api_client)
    merge = "application/merge-patch+json"

    async def dry_run_passes() -> bool:
        try:
            await fleet.custom.patch_namespaced_custom_object(
                VMI_GROUP, VMI_VERSION, ns, VMIS, vmi,
                {"metadata": {"annotations": {"gpu.cozystack.io/probe": "x"}}},
                dry_run="All", _content_type=merge)
            return True
        except ApiException as exc:
            if exc.status == 403 and W7_POLICY in (exc.body or ""):
                return False
            raise

    async def actions(which: str, passes: bool) -> None:
        await api.patch_validating_admission_policy_binding(
            W7_POLICY, {"spec": {"validationActions": [which]}}, _content_type=merge)

        async def effective() -> bool:
            return await dry_run_passes() is passes
        await eventually(effective, timeout=20, what=f"W7 policy binding {which} in effect")

    await actions("Audit", True)
    try:
        yield
    finally:
        await actions("Deny", False)


async def test_W7_removing_our_annotations_from_a_running_vmi_blocks_no_other_tenant(
        system, kubevirt, fleet, control_plane, tmp_path, tenant_client):
    """Attacker (issue 23, 1): tenant A's admitted 2-GPU VM runs on a 4-GPU node; A strips
    `gpu.cozystack.io/templates` from the VMI. Its launcher Pod's GPUs are still its Bound
    devices (the binder's attachment with the VMI's uid), so they are not counted again:
    tenant B is still admitted on the 2 units that are physically free, and kube-scheduler
    binds B's launcher Pod there."""
    res, cls, nodes, a = await pool(fleet, kubevirt, {"n": {"units": 4}})
    api = await attacker(fleet, control_plane, tmp_path, a, tenant_client)
    made = await api.create_namespaced_custom_object(VMI_GROUP, VMI_VERSION, a, VMIS, vmi("a-vm", cls, 2))
    pod_rv = await bound_launcher_rv(fleet, a, made)
    async with w7_policy_suspended(fleet, a, "a-vm"):  # W7 refuses it: the count must not care
        patched = await api.patch_namespaced_custom_object(VMI_GROUP, VMI_VERSION, a, VMIS, "a-vm", [
            {"op": "remove", "path": "/metadata/annotations/gpu.cozystack.io~1templates"}])
    assert not any(k.startswith("gpu.cozystack.io/") and k != "gpu.cozystack.io/admission"
                   for k in patched["metadata"].get("annotations") or {}), patched["metadata"]
    await replicas_saw(system, {"virtualmachineinstances": patched["metadata"]["resourceVersion"],
                                "pods": pod_rv}, what="the stripped VMI and its bound launcher Pod")
    b = await other_tenant(system, fleet)
    made_b, msg = await create(fleet, b, vmi("b-vm", cls, 2))
    await assert_runs_where_pinned(fleet, b, made_b, msg)
    assert pin(made_b) == nodes["n"]
    # and nothing more: the node is full, counted as 4 Bound devices, no Pod outside the binder
    made_c, msg = await create(fleet, b, vmi("c-vm", cls, 1))
    await assert_refused(fleet, b, made_c, msg, no_room(nodes["n"], res, 1, 0, 0))


async def test_W7_our_annotation_added_to_a_raw_gpu_vmi_later_excuses_nothing(system, kubevirt, fleet):
    """Attacker (issue 23, 2): tenant A runs a VMI with 2 raw `gpus` entries and a pin on a
    2-GPU node, created without our annotations (so never judged by the binder), and adds
    `gpu.cozystack.io/templates` afterwards. No device of the binder is attached to it, so its
    launcher Pod's 2 GPUs stay counted: tenant B is refused (the node is full), before and
    after the edit; kube-scheduler agrees (a 1-GPU Pod pinned there stays Pending).

    The annotation is written by the admin client with the gpu-binder webhook's rules narrowed
    to CREATE (`vmi_updates_unjudged`) and the W7 policy auditing only
    (`w7_policy_suspended`): the test is about the accounting, whether or not an admission
    check (W7) would deny the edit."""
    res, cls, nodes, a = await pool(fleet, kubevirt, {"n": {"units": 2}})
    raw, msg = await create(fleet, a, raw_vmi("raw-vm", res, 2, nodes["n"]))
    assert raw is not None, msg
    pod_rv = await bound_launcher_rv(fleet, a, raw)
    await replicas_saw(system, {"pods": pod_rv}, what="the raw VMI's bound launcher Pod")
    b = await other_tenant(system, fleet)
    full = no_room(nodes["n"], res, 1, 0, 2)
    made, msg = await create(fleet, b, vmi("b-vm-0", cls, 1))
    await assert_refused(fleet, b, made, msg, full)
    async with vmi_updates_unjudged(fleet), w7_policy_suspended(fleet, a, "raw-vm"):
        patched = await fleet.custom.patch_namespaced_custom_object(
            VMI_GROUP, VMI_VERSION, a, VMIS, "raw-vm",
            {"metadata": {"annotations": {"gpu.cozystack.io/templates": f"{cls}=2"}}},
            _content_type="application/merge-patch+json")
    await replicas_saw(system, {"virtualmachineinstances": patched["metadata"]["resourceVersion"]},
                       what="the annotation added to the raw VMI")
    for i in (1, 2):  # the issue saw 2 more VMIs admitted here
        made, msg = await create(fleet, b, vmi(f"b-vm-{i}", cls, 1))
        await assert_refused(fleet, b, made, msg, full)
    await fleet.core.create_namespaced_pod(b, gpu_pod("probe", res, nodes["n"], containers=[1]))
    got = await placement(fleet, b, "probe=probe")
    assert got[0] == "pending" and f"Insufficient {res}" in got[1], got


def gpu_pod(name: str, res: str, node: str, *, containers: list[int], init: tuple[int, ...] = (),
            sidecars: tuple[int, ...] = (), runtime_class: str | None = None) -> dict:
    """A Pod pinned (nodeSelector) to `node` for kube-scheduler to place: one container per
    entry of `containers` with that many `res` (0: cpu only), then init containers — first
    the restartable ones (`restartPolicy: Always`, sidecars) of `sidecars`, then the
    regular ones of `init`. Requests default to limits (only limits are written)."""
    def box(kind: str, i: int, n: int, *, sidecar: bool = False) -> dict:
        c = {"name": f"{kind}-{i}", "image": "example.invalid/gpu",
             "resources": {"limits": {res: str(n)} if n else {"cpu": "10m"}}}
        if sidecar:
            c["restartPolicy"] = "Always"
        return c
    spec = {"nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [box("main", i, n) for i, n in enumerate(containers)],
            "initContainers": [box("sidecar", i, n, sidecar=True) for i, n in enumerate(sidecars)]
            + [box("init", i, n) for i, n in enumerate(init)]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"probe": name}},
            "spec": spec}


async def test_W7_pod_shapes_count_as_kube_scheduler_counts_them(system, kubevirt, fleet):
    """Attacker (issue 23, 3): raw GPU Pods on an 8-GPU node whose GPUs sit in a sidecar, in
    a regular init container after a sidecar, and in the Pod overhead of a RuntimeClass.
    kube-scheduler counts them as 2 + 3 + 2 = 7 (`resource.PodRequests`); the binder counts
    the same 7, so it refuses a 2-GPU VMI (which kube-scheduler would leave Pending) and
    admits a 1-GPU one that kube-scheduler binds; then both agree the node is full."""
    res, cls, nodes, a = await pool(fleet, kubevirt, {"n": {"units": 8}})
    n = nodes["n"]
    from kubernetes_asyncio.client import NodeV1Api

    rc = unique("gpu-overhead")
    await NodeV1Api(fleet.core.api_client).create_runtime_class({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": rc},
        "handler": "runc", "overhead": {"podFixed": {res: "1"}}})
    shapes = {"sidecar": gpu_pod("sidecar", res, n, containers=[1], sidecars=(1,)),        # 1 + 1
              "init-after-sidecar": gpu_pod("init-after-sidecar", res, n, containers=[0],
                                            sidecars=(1,), init=(2,)),                     # max(1, 2 + 1)
              "overhead": gpu_pod("overhead", res, n, containers=[1], runtime_class=rc)}  # 1 + 1
    for name, body in shapes.items():
        await fleet.core.create_namespaced_pod(a, body)
    rvs = []
    for name in shapes:
        assert await placement(fleet, a, f"probe={name}") == ("bound", n), name
        rvs.append(int((await fleet.core.read_namespaced_pod(name, a)).metadata.resource_version))
    await replicas_saw(system, {"pods": max(rvs)}, what="the three GPU Pods bound")
    b = await other_tenant(system, fleet)
    made, msg = await create(fleet, b, vmi("two", cls, 2))
    await assert_refused(fleet, b, made, msg, no_room(n, res, 2, 1, 7))
    made, msg = await create(fleet, b, vmi("one", cls, 1))
    await assert_runs_where_pinned(fleet, b, made, msg)
    made, msg = await create(fleet, b, vmi("three", cls, 1))
    await assert_refused(fleet, b, made, msg, no_room(n, res, 1, 0, 7))
    await fleet.core.create_namespaced_pod(b, gpu_pod("probe", res, n, containers=[1]))
    got = await placement(fleet, b, "probe=probe")
    assert got[0] == "pending" and f"Insufficient {res}" in got[1], got
