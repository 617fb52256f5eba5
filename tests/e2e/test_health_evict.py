"""HL1's VM cases end to end (docs/contract.md §3b, docs/device-mode.md "A held device on a
tainted GPU"): a `NoExecute` taint on a running VM's GPU stops that VM and, with `runStrategy:
Always`, it starts again on healthy devices of a valid group, its budget unchanged; and a set
kept for a stopped VM (H4) whose GPU is tainted `NoSchedule` meanwhile is not started as it is
(kube-scheduler would never allocate its claim) but re-pointed to healthy devices when the VM
starts again.

Real kube-apiserver (DRADeviceTaintRules, `resource.k8s.io/v1beta2` served), kube-scheduler,
kube-controller-manager (resourceclaim-controller and device-taint-eviction-controller,
`localcluster.claimcontroller`), KubeVirt (virt-api, virt-controller, `GPUsWithDRA`) and KWOK.
Nobody stops the VM but kube-controller-manager: its eviction controller deletes the launcher
Pod whose claim holds the tainted GPU, virt-controller fails the VMI whose Pod is gone and,
the VM's runStrategy being Always, makes a new VMI, which our webhook admits. The harness has
no virt-handler: the test clears the VM's start failure as virt-handler's report of a Running
VMI would (`tests.e2e.test_vm_path.clear_start_failure`), nothing else. Without virt-handler
the VMI is never `Running`, so the eviction is a failure before Running: the leader's health
worker must excuse it (the launcher Pod's `DisruptionTarget` condition, HL2), not count it
against the GPUs of the set.
"""

from __future__ import annotations

import pytest

from cli.tools import read_cluster
from localcluster.dra_profiles import DRIVER
from localcluster.dra_world import DEVICE_BUDGET_KEY
from model.explain import top
from model.types import GROUP, VERSION
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas, unique
from tests.e2e.helpers import class_rv, eventually, leader_index, replicas_saw, scrape
from tests.e2e.test_device_mode import check_admitted_set, world
from tests.e2e.test_dra_kubevirt import RESOURCE
from tests.e2e.test_vm_keep import kept, next_admitted_vmi, stop
from tests.e2e.test_vm_path import create_vm, set_run, started, vm_body
from tests.support.kubevirt_vmis import (  # noqa: F401 (kubevirt: a fixture)
    bound_launcher, kubevirt, launcher_pod, pin)

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]

BIND_TIMEOUT, GRACE = 12, 16


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas as test_device_mode's and test_health's (the same arguments: the session
    may share them)."""
    args = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + (f"--bind-timeout={BIND_TIMEOUT}", f"--attachment-grace={GRACE}"))


@pytest.fixture(scope="module")
def dra(system, kubevirt):
    """Device mode's cluster side: the DeviceClass and kube-controller-manager with both DRA
    controllers."""
    system.start_dra()
    return system


async def budget(control_plane, ns: str) -> tuple[int, int | None]:
    """(used, hard) of the tenant's device budget, as `gpu-binder top` computes it from the
    cluster (the binder's own count of Bound and being-bound devices)."""
    c = await read_cluster(str(control_plane.admin_kubeconfig))
    [t] = [t for t in top(c.snapshot, c.live_vmis).tenants
           if (t.namespace, t.resource) == (ns, DEVICE_BUDGET_KEY)]
    return t.used, t.hard


async def evicted(fleet, ns: str, pod: dict) -> str:
    """Wait until launcher Pod `pod` is gone and kube-controller-manager's eviction controller
    said it deleted it (Event `DeviceTaintManagerEviction` on that Pod's uid); the Event's
    source component."""
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]

    async def gone():
        got = await fleet.core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}")
        if any(p.metadata.uid == uid for p in got.items):
            return None
        events = await fleet.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        return next((e.source.component for e in events.items
                     if e.reason == "DeviceTaintManagerEviction" and e.involved_object.uid == uid), None)
    return await eventually(gone, timeout=60, what=f"launcher Pod {ns}/{name} evicted for the NoExecute taint")


async def taint_rule(fleet, node: str, gpu: str, effect: str, name: str) -> dict:
    """A DeviceTaintRule tainting GPU `gpu` of `node`'s pool with `effect` (the object made)."""
    return await fleet.custom.create_cluster_custom_object(RESOURCE, "v1beta2", "devicetaintrules", {
        "apiVersion": f"{RESOURCE}/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": unique(name)},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": node, "device": gpu},
                 "taint": {"key": "gpu.example.com/xid", "value": "79", "effect": effect}}})


async def test_HL1_a_noexecute_taint_on_a_running_vms_gpu_evicts_it_and_it_restarts_on_healthy_gpus_same_budget(
        dra, fleet, control_plane):
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    node = nodes["hgx"]
    # the tenant may hold 2 devices: the restart must not count the evicted set twice
    await fleet.core.patch_namespaced_resource_quota(
        "gpu-budget", tenant, {"spec": {"hard": {DEVICE_BUDGET_KEY: "2"}}})
    await create_vm(fleet, tenant, vm_body("vm", templates=f"{cls}=2"))
    made = await started(fleet, tenant, "vm", timeout=90, as_handler=True)
    first = await check_admitted_set(fleet, tenant, made, 2)
    pod = await bound_launcher(fleet, tenant, made)
    assert await budget(control_plane, tenant) == (2, 2)

    # the administrator taints one of its GPUs NoExecute (a DeviceTaintRule)
    gpu = first[0]
    rule = await taint_rule(fleet, node, gpu, "NoExecute", "xid-noexec")
    try:
        await replicas_saw(dra, {"devicetaintrules": rule["metadata"]["resourceVersion"]},
                           what="the NoExecute DeviceTaintRule")
        # kube-controller-manager deletes the launcher Pod; KubeVirt makes the VM's next VMI
        source = await evicted(fleet, tenant, pod)
        assert source == "device-taint-eviction-controller", source
        again = await started(fleet, tenant, "vm", uid=made["metadata"]["uid"], timeout=120,
                              as_handler=True)
        # admitted by our webhook, its launcher bound, its claim allocated exactly as the
        # new record: one partition of 2 of the class's nodes, never the tainted GPU
        assert pin(again) in nodes.values()
        second = await check_admitted_set(fleet, tenant, again, 2)
        assert gpu not in second, (gpu, second)
        new_pod = await launcher_pod(fleet, tenant, again["metadata"]["uid"])
        assert new_pod is not None and new_pod["metadata"]["uid"] != pod["metadata"]["uid"]
        claim = await fleet.custom.get_namespaced_custom_object(
            RESOURCE, "v1", tenant, "resourceclaims", again["spec"]["resourceClaims"][0]["resourceClaimName"])
        assert all(r["device"] != gpu for r in claim["status"]["allocation"]["devices"]["results"]), claim
        assert await budget(control_plane, tenant) == (2, 2)
        # the eviction is no failed start (HL2): the old VMI failed once its Pod was gone,
        # which the leader's informer showed before the new VMI; nothing counted against the
        # tainted GPU nor its healthy partner
        await replicas_saw(dra, {"virtualmachineinstances": again["metadata"]["resourceVersion"]},
                           what="the new VMI")
        metrics = await scrape(dra, await leader_index(dra))
        assert metrics.get(("gpu_binder_failed_starts_total", (("class", cls),)), 0) == 0
        print(f"evicted from {node} {first} (tainted {gpu}); restarted on {pin(again)} {second}")
    finally:
        await fleet.custom.delete_cluster_custom_object(RESOURCE, "v1beta2", "devicetaintrules",
                                                        rule["metadata"]["name"])


async def test_HL1_a_set_kept_for_a_stopped_vm_on_a_gpu_tainted_meanwhile_starts_re_pointed_on_healthy_gpus(
        dra, fleet, control_plane):
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    node = nodes["hgx"]
    await fleet.custom.patch_cluster_custom_object(
        GROUP, VERSION, "gpuclasses", cls, {"spec": {"keepSetFor": "10m"}},
        _content_type="application/merge-patch+json")
    await replicas_saw(dra, {"gpuclasses": await class_rv(fleet, cls)}, what="keepSetFor")
    await fleet.core.patch_namespaced_resource_quota(
        "gpu-budget", tenant, {"spec": {"hard": {DEVICE_BUDGET_KEY: "2"}}})
    await create_vm(fleet, tenant, vm_body("vm", templates=f"{cls}=2"))
    made = await started(fleet, tenant, "vm", timeout=90, as_handler=True)
    first = await check_admitted_set(fleet, tenant, made, 2)
    names = [f"vm-{cls}-0", f"vm-{cls}-1"]
    await stop(fleet, tenant, "vm", made)
    await kept(fleet, tenant, names, node)          # H4: the set waits for the VM, its records kept
    # meanwhile the administrator marks one of its GPUs broken (NoSchedule: nothing runs on it)
    gpu = first[1]
    rule = await taint_rule(fleet, node, gpu, "NoSchedule", "xid-kept")
    try:
        await replicas_saw(dra, {"devicetaintrules": rule["metadata"]["resourceVersion"]},
                           what="the NoSchedule DeviceTaintRule")
        await set_run(fleet, tenant, "vm", "Always")
        again = await next_admitted_vmi(fleet, tenant, "vm", made["metadata"]["uid"])
        # not W4's short cut onto the tainted GPU (its claim would never be allocated): the
        # binder re-pointed the set on its node, one partition of 2 without the tainted GPU,
        # and kube-scheduler allocated exactly that and bound the launcher Pod
        assert pin(again) == node
        second = await check_admitted_set(fleet, tenant, again, 2)
        assert gpu not in second, (gpu, second)
        claim = await fleet.custom.get_namespaced_custom_object(
            RESOURCE, "v1", tenant, "resourceclaims", again["spec"]["resourceClaims"][0]["resourceClaimName"])
        assert sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"]) == sorted(second)
        assert await budget(control_plane, tenant) == (2, 2)
        print(f"kept on {node} {first} (tainted {gpu}); started re-pointed to {second}")
    finally:
        await fleet.custom.delete_cluster_custom_object(RESOURCE, "v1beta2", "devicetaintrules",
                                                        rule["metadata"]["name"])
