"""HL2 end to end (docs/contract.md §3b, docs/device-mode.md "A GPU that fails its VMs"): three
different VMIs whose launcher Pods fail before they run, all on one GPU of a KWOK HGX node,
make the leader write a DeviceTaintRule `gpu.cozystack.io/suspect` (NoSchedule) selecting
exactly that device; kube-scheduler's allocator and the binder then keep off it;
`gpu-binder health` lists it with its evidence and `gpu-binder health clear` lifts it (and
a clear of a device not suspected exits 2).

Real kube-apiserver (DRADeviceTaintRules, `resource.k8s.io/v1beta2` served), kube-scheduler,
kube-controller-manager (resourceclaim-controller), KubeVirt (virt-api, virt-controller,
`GPUsWithDRA`) and KWOK. The failure is the test's: it sets the launcher Pod's phase to
`Failed` (what QEMU failing to open a GPU fallen off the bus shows), since no virt-launcher
runs here. The three VMIs take the same GPU by naming one held GPUDevice, which keeps its
exact device between them (B6).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest
from kubernetes_asyncio.client import ApiException

from localcluster.dra_profiles import DRIVER
from localcluster.paths import REPO_ROOT
from model.health_mark import SUSPECT_KEY
from tests.e2e.conftest import FAST_CONTROLLER_ARGS, controller_replicas, unique
from tests.e2e.helpers import device_rv, eventually, leader_index, replicas_saw, scrape
from tests.e2e.test_device_mode import admitted_naming, recorded, world
from tests.e2e.test_dra_kubevirt import RESOURCE, pinned_claim
from tests.support.kubevirt_vmis import (  # noqa: F401 (kubevirt: a fixture)
    VMI_GROUP, VMI_VERSION, VMIS, bound_launcher, create, kubevirt, pin, vmi)

pytestmark = [pytest.mark.anyio, pytest.mark.kubevirt]

BIND_TIMEOUT, GRACE = 12, 16


@pytest.fixture(scope="module")
def system(control_plane, tmp_path_factory):
    """Two replicas as test_device_mode's (the same arguments: the session may share them);
    health.failedStarts 3 and health.window 30 min are the defaults."""
    args = tuple(a for a in FAST_CONTROLLER_ARGS if not a.startswith(("--bind-timeout", "--attachment-grace")))
    yield from controller_replicas(control_plane, tmp_path_factory,
                                   args + (f"--bind-timeout={BIND_TIMEOUT}", f"--attachment-grace={GRACE}"))


@pytest.fixture(scope="module")
def dra(system, kubevirt):
    system.start_dra()
    return system


async def fail_start(fleet, ns: str, made: dict) -> None:
    """The VMI's launcher Pod, once bound and Running (KWOK's doing; no virt-launcher runs),
    fails before the VMI ever ran."""
    pod = await bound_launcher(fleet, ns, made, timeout=90)
    name = pod["metadata"]["name"]

    async def running():  # KWOK has written its status: nothing overwrites the failure below
        return (await fleet.core.read_namespaced_pod(name, ns)).status.phase == "Running"
    await eventually(running, timeout=60, what=f"launcher Pod {ns}/{name} Running")
    await fleet.core.patch_namespaced_pod_status(
        pod["metadata"]["name"], ns,
        {"status": {"phase": "Failed", "reason": "Error",
                    "message": "qemu: vfio: failed to open /dev/vfio/42 (GPU has fallen off the bus)"}},
        _content_type="application/merge-patch+json")


async def counted(system, cls: str, n: int) -> None:
    """Wait until the leader has counted `n` failed starts against GPUs of `cls` (its
    `gpu_binder_failed_starts_total`): the failure was judged before the VMI goes."""
    async def probe():
        leader = await leader_index(system)
        got = await scrape(system, leader)
        return got.get(("gpu_binder_failed_starts_total", (("class", cls),)), 0) >= n
    await eventually(probe, timeout=30, what=f"the leader counted {n} failed starts on {cls}")


async def released(fleet, ns: str, device: str) -> None:
    """Wait until H2 cleared GPUDevice `device`'s attachment (its VMI deleted)."""
    async def probe():
        dev = await fleet.get_device(ns, device)
        return (dev.get("status") or {}).get("attachedTo") is None
    await eventually(probe, timeout=60, what=f"{device}'s attachment cleared")


async def suspect_rules(fleet) -> list[dict]:
    got = await fleet.custom.list_cluster_custom_object(RESOURCE, "v1beta2", "devicetaintrules",
                                                        label_selector=f"{SUSPECT_KEY}=true")
    return got.get("items") or []


def cli(control_plane, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "cli.main", "health", *argv, "--kubeconfig",
                           str(control_plane.admin_kubeconfig)], capture_output=True, text=True,
                          timeout=60, env=env)


async def pod_scheduled(fleet, ns: str, name: str) -> str | None:
    """The Pod's PodScheduled condition: "True", "False" (unschedulable) or None (not yet)."""
    pod = await fleet.core.read_namespaced_pod(name, ns)
    for c in pod.status.conditions or ():
        if c.type == "PodScheduled":
            return c.status
    return None


async def test_HL2_three_failed_starts_on_one_gpu_taint_it_for_the_scheduler_and_the_binder(
        dra, fleet, control_plane):
    cls, nodes, tenant, _ = await world(fleet, dra, {"hgx": {}})
    node = nodes["hgx"]
    await fleet.device(tenant, "held-a", cls)
    await replicas_saw(dra, {"gpudevices": await device_rv(fleet, tenant, "held-a")}, what="held-a")
    gpus = []
    for i in range(3):
        made = await admitted_naming(fleet, tenant, cls, f"vm-{i}", 1, "held-a", node)
        gpus += await recorded(fleet, tenant, made)
        await fail_start(fleet, tenant, made)
        await counted(dra, cls, i + 1)
        if i < 2:  # the next VMI (another VM) takes the same held device, so the same GPU
            await fleet.custom.delete_namespaced_custom_object(VMI_GROUP, VMI_VERSION, tenant, VMIS, f"vm-{i}")
            await released(fleet, tenant, "held-a")
    assert len(set(gpus)) == 1, gpus
    gpu = gpus[0]

    # the leader marks exactly that device
    async def marked():
        return [r for r in await suspect_rules(fleet)
                if r["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": gpu}]
    [rule] = await eventually(marked, timeout=30, what=f"a DeviceTaintRule on {node}/{gpu}")
    taint = {k: v for k, v in rule["spec"]["taint"].items() if k != "timeAdded"}  # the server's stamp
    assert taint == {"key": SUSPECT_KEY, "value": "failed-starts", "effect": "NoSchedule"}
    evidence = json.loads(rule["metadata"]["annotations"][SUSPECT_KEY])
    assert sorted(e["vmi"] for e in evidence["evidence"]) == ["vm-0", "vm-1", "vm-2"]
    assert (evidence["node"], evidence["class"]) == (node, cls)

    async def warned():
        got = await fleet.core.list_event_for_all_namespaces(field_selector="reason=GPUSuspected")
        kinds = {e.involved_object.kind for e in got.items
                 if (e.involved_object.kind, e.involved_object.name) == ("Node", node)
                 or (e.involved_object.kind, e.involved_object.namespace) == ("GPUDevice", tenant)}
        return kinds == {"Node", "GPUDevice"}
    await eventually(warned, timeout=20, what="GPUSuspected Events on the node and the GPUDevice")
    leader = await leader_index(dra)
    metrics = await scrape(dra, leader)
    assert metrics.get(("gpu_binder_devices_suspected", (("class", cls),))) == 1

    # kube-scheduler keeps off it: an administrator's claim pinned to that GPU is not allocated
    admin_ns = unique("admin")
    await fleet.core.create_namespace({"metadata": {"name": admin_ns}})
    await fleet.custom.create_namespaced_custom_object(
        RESOURCE, "v1", admin_ns, "resourceclaims", pinned_claim("on-suspect", [int(gpu.rsplit("-", 1)[1])]))
    await fleet.core.create_namespaced_pod(admin_ns, {
        "metadata": {"name": "on-suspect"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": "on-suspect"}],
                 "containers": [{"name": "c", "image": "none", "resources": {"claims": [{"name": "gpus"}]}}]}})
    await eventually(lambda: _equals(pod_scheduled(fleet, admin_ns, "on-suspect"), "False"), timeout=60,
                     what="the administrator's Pod on the suspected GPU unschedulable")

    # the binder keeps off it: a new set on the node gets another GPU
    made, why = await create(fleet, tenant, vmi("vm-after", cls, 1))
    assert made is not None, why
    assert pin(made) == node
    [other] = await recorded(fleet, tenant, made)
    assert other != gpu

    # the operator's view, then the lift
    listed = await anyio.to_thread.run_sync(lambda: cli(control_plane, "--json"))
    assert listed.returncode == 0, listed.stderr
    [mine] = [s for s in json.loads(listed.stdout) if s["device"]["pool"] == node]
    assert mine["device"]["device"] == gpu and len(mine["evidence"]) == 3
    cleared = await anyio.to_thread.run_sync(lambda: cli(control_plane, "clear", f"{node}/{gpu}"))
    assert cleared.returncode == 0, cleared.stderr
    assert await marked() == []
    await eventually(lambda: _equals(pod_scheduled(fleet, admin_ns, "on-suspect"), "True"), timeout=60,
                     what="the administrator's Pod scheduled once the suspicion is lifted")

    async def recorded_who():
        got = await fleet.core.list_event_for_all_namespaces(field_selector="reason=GPUSuspicionCleared")
        return [e.message for e in got.items if e.involved_object.name == node]
    [said] = await eventually(recorded_who, timeout=20, what="GPUSuspicionCleared on the node")
    assert "lifted by" in said and gpu in said
    again = await anyio.to_thread.run_sync(lambda: cli(control_plane, "clear", f"{node}/{gpu}"))
    assert again.returncode == 2
    [line] = again.stderr.strip().splitlines()
    assert line.startswith(f"gpu-binder health: {node}/{gpu} is not suspected (suspected: "), line


async def _equals(awaitable, want) -> bool:
    try:
        return await awaitable == want
    except ApiException:
        return False
