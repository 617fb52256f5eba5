"""The Kubernetes side of HL2 (docs/contract.md §3b) with the scripted client: a
DeviceTaintRule's taint reaches the binder's devices (DR2); the leader's health worker
(`k8s.health.Health`) marks a device after 3 different VMIs failed to start on it (a rule
selecting exactly it, Events on the node and the GPUDevice, the metric), never for failures
that are not the GPU's, falls back to its ConfigMap where rules are not served, reports a
count-mode suspect without marking, and forgets the evidence once the mark is lifted."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

import pytest

from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.cache import ClusterCache, trim_pod
from k8s.client import DEVICE_TAINT_RULES
from k8s.health import Health
from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, device_class, resource_slice
from model.health import HealthSettings
from model.health_mark import MARKS_CONFIGMAP, SUSPECT_KEY, rule_body, rule_name
from model.device.dra import DeviceRef
from model.serialize import device_status_to_dict
from model.types import ADMISSION_ANNOTATION, Attachment, DeviceStatus, Phase

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
NODE = "hgx-1"
REF = DeviceRef("gpu.nvidia.com", NODE, "gpu-vfio-3")
RV = iter(range(1, 10_000))


def event(informer, obj: dict | None, key=None) -> None:
    if obj is None:
        informer._apply("DELETED", {"metadata": {"namespace": key[0] or None, "name": key[1]}})
    else:
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(next(RV))
        informer._apply("MODIFIED", obj)


def vmi_obj(name: str, phase: str = "Scheduled", *, deleting: bool = False) -> dict:
    meta = {"namespace": "t", "name": name, "uid": f"uid-{name}",
            "annotations": {ADMISSION_ANNOTATION: f"adm-{name}"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T11:59:00Z"
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}}, "status": {"phase": phase}}


def launcher(name: str, phase: str = "Failed", *, waiting: str | None = None) -> dict:
    status: dict = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": "compute", "state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"namespace": "t", "name": f"virt-launcher-{name}-abcde",
                         "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": f"uid-{name}"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "compute"}]}, "status": status}


def gpudevice(vmi: str, device: str = "gpu-vfio-3") -> dict:
    status = DeviceStatus(phase=Phase.BOUND, node_name=NODE,
                          attached_to=Attachment(vmi, NOW - timedelta(minutes=5), f"adm-{vmi}", f"uid-{vmi}"),
                          device=DeviceRef("gpu.nvidia.com", NODE, device))
    return {"metadata": {"namespace": "t", "name": f"{vmi}-hgx-0", "uid": f"d-{vmi}"},
            "spec": {"class": "hgx"}, "status": device_status_to_dict(status)}


def world() -> ClusterCache:
    cache = ClusterCache(object())
    node = {"metadata": {"name": NODE, "labels": {"kubevirt.io/schedulable": "true"}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    hgx = {"metadata": {"name": "hgx"}, "spec": {
        "deviceClassName": DEVICE_CLASS, "topology": {"matchAttribute": "gpu.nvidia.com/partition{size}"}}}
    event(cache.slices, resource_slice(NODE, HGX_H100_8))
    event(cache.nodes, node)
    event(cache.classes, hgx)
    event(cache.device_classes, device_class())
    return cache


def fail(cache: ClusterCache, name: str, **kw) -> None:
    event(cache.devices, gpudevice(name))
    event(cache.vmis, vmi_obj(name, **{k: v for k, v in kw.items() if k == "deleting"}))
    event(cache.pods, launcher(name, **{k: v for k, v in kw.items() if k == "waiting"}))


def test_a_device_taint_rule_taints_exactly_its_device_for_the_binder():
    cache = world()
    assert "gpu-vfio-3" not in cache.view.node(NODE).taken_devices
    rule = {"metadata": {"name": "broken"}, "spec": {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-vfio-3"},
        "taint": {"key": "example.com/broken", "effect": "NoSchedule"}}}
    event(cache.taint_rules, rule)
    n = cache.view.node(NODE)
    assert n.taken_devices == {"gpu-vfio-3"}
    assert "gpu-vfio-3" not in n.devices_of("hgx").untainted
    assert len(n.devices_of("hgx").untainted) == 7
    event(cache.taint_rules, None, ("", "broken"))
    assert cache.view.node(NODE).taken_devices == frozenset()
    # a rule with no selector selects nothing; an empty one every device
    event(cache.taint_rules, {"metadata": {"name": "none"}, "spec": {"taint": {"key": "k", "effect": "NoSchedule"}}})
    assert cache.view.node(NODE).taken_devices == frozenset()
    event(cache.taint_rules, {"metadata": {"name": "all"}, "spec": {"deviceSelector": {},
                                                                     "taint": {"key": "k", "effect": "NoExecute"}}})
    assert len(cache.view.node(NODE).taken_devices) == 8
    # an effect that keeps nothing off (None) takes nothing
    event(cache.taint_rules, {"metadata": {"name": "all"}, "spec": {"deviceSelector": {},
                                                                     "taint": {"key": "k", "effect": "None"}}})
    assert cache.view.node(NODE).taken_devices == frozenset()


def test_trim_pod_keeps_how_a_launcher_failed_and_is_idempotent():
    raw = launcher("a", waiting="ErrImagePull")
    raw["metadata"]["deletionTimestamp"] = "2026-12-06T11:00:00Z"
    raw["status"]["reason"] = "OutOfcpu"
    raw["status"]["containerStatuses"][0]["image"] = "x"
    once = trim_pod(copy.deepcopy(raw))
    assert once["status"] == {"phase": "Failed", "reason": "OutOfcpu", "containerStatuses": [
        {"state": {"waiting": {"reason": "ErrImagePull"}}}]}
    assert once["metadata"]["deletionTimestamp"] == "2026-12-06T11:00:00Z"
    assert trim_pod(copy.deepcopy(once)) == once
    other = {"metadata": {"name": "p", "namespace": "t", "labels": {}}, "spec": {"nodeName": NODE},
             "status": {"phase": "Failed", "reason": "OutOfcpu"}}
    assert trim_pod(other)["status"] == {"phase": "Failed"}


async def test_three_different_vmis_failing_mark_the_device():
    cache = world()
    client = ScriptedClient()
    seen: list[dict] = []
    counted: list[str] = []
    worker = Health(client, cache, HealthSettings(), on_suspected=seen.append,
                    on_failed_start=counted.append, now=lambda: NOW)
    await _start(worker)
    for name in ("a", "b"):
        fail(cache, name)
    await worker.round()
    assert client.of("create") == [] and seen[-1] == {}
    fail(cache, "c")
    await worker.round()
    assert counted == ["hgx", "hgx", "hgx"]
    (create,) = client.of("create")
    res, ns, body = create[:3]
    assert res == DEVICE_TAINT_RULES and ns is None
    assert body["metadata"]["name"] == rule_name(REF)
    assert body["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-vfio-3"}
    assert body["spec"]["taint"] == {"key": SUSPECT_KEY, "value": "failed-starts", "effect": "NoSchedule"}
    evidence = json.loads(body["metadata"]["annotations"][SUSPECT_KEY])
    assert [e["vmi"] for e in evidence["evidence"]] == ["a", "b", "c"]
    await worker.round()  # the rule not in the cache yet: written once, not lifted
    assert len(client.of("create")) == 1 and worker.evidence.suspects(NOW, HealthSettings()) != ()
    events = [b for _, b in client.of("create_event")]
    kinds = sorted(e["involvedObject"]["kind"] for e in events)
    assert kinds == ["GPUDevice", "GPUDevice", "GPUDevice", "Node"]
    assert all(e["reason"] == "GPUSuspected" and e["type"] == "Warning" for e in events)
    # the rule appears in the cache: no second create, the metric counts it, placements avoid it
    event(cache.taint_rules, rule_body(worker.evidence.suspects(NOW, HealthSettings())[0], NOW))
    await worker.round()
    assert len(client.of("create")) == 1 and seen[-1] == {"hgx": 1}
    assert "gpu-vfio-3" in cache.view.node(NODE).taken_devices
    # lifted (an operator's `health clear`): the evidence so far no longer counts
    event(cache.taint_rules, None, ("", rule_name(REF)))
    await worker.round()
    assert worker.evidence.suspects(NOW, HealthSettings()) == () and seen[-1] == {}
    assert "gpu-vfio-3" not in cache.view.node(NODE).taken_devices


async def _start(worker: Health) -> None:
    """What `run` does before its loop: listen to the informers."""
    worker.cache.vmis.add_listener(worker._on_vmi)
    worker.cache.pods.add_listener(worker._on_pod)


@pytest.mark.parametrize("how", [{"waiting": "ErrImagePull"}, {"waiting": "ImagePullBackOff"},
                                 {"deleting": True}])
async def test_failures_that_are_not_the_gpus_never_mark(how):
    cache = world()
    client = ScriptedClient()
    worker = Health(client, cache, HealthSettings(), now=lambda: NOW)
    await _start(worker)
    for name in "abcde":
        fail(cache, name, **how)
    await worker.round()
    assert client.of("create") == [] and worker.failed_starts == 0


async def test_one_vmi_failing_again_and_again_counts_once():
    cache = world()
    client = ScriptedClient()
    worker = Health(client, cache, HealthSettings(), now=lambda: NOW)
    await _start(worker)
    for i in range(4):
        v = vmi_obj("a")
        v["metadata"]["uid"] = f"uid-a{i}"
        p = launcher("a")
        p["metadata"]["labels"]["kubevirt.io/created-by"] = f"uid-a{i}"
        p["metadata"]["name"] += str(i)
        d = gpudevice("a")
        d["status"]["attachedTo"]["uid"] = f"uid-a{i}"
        event(cache.devices, d)
        event(cache.vmis, v)
        event(cache.pods, p)
        await worker.round()
    assert client.of("create") == [] and worker.failed_starts == 4


async def test_where_rules_are_not_served_the_mark_is_the_configmap_entry():
    cache = world()
    client = ScriptedClient()
    client.script("create", errors.NotFound("create DeviceTaintRule", 404, "the server could not find the requested resource"))
    worker = Health(client, cache, HealthSettings(), now=lambda: NOW)
    await _start(worker)
    for name in "abc":
        fail(cache, name)
    await worker.round()
    (cm,) = client.of("create_config_map")
    body = cm[1]
    assert body["metadata"]["name"] == MARKS_CONFIGMAP and list(body["data"]) == [rule_name(REF)]
    node_event = [b for _, b in client.of("create_event") if b["involvedObject"]["kind"] == "Node"][0]
    assert "kube-scheduler cannot see this mark" in node_event["message"]
    # the binder honours the entry itself
    event(cache.suspect_marks, {**body, "metadata": {**body["metadata"], "namespace": "cozy-system"}})
    assert "gpu-vfio-3" in cache.view.node(NODE).taken_devices
    assert [m.kind for m in cache.suspects()] == ["ConfigMap"]


async def test_a_count_mode_suspect_is_reported_on_its_node_never_marked():
    cache = world()
    event(cache.classes, {"metadata": {"name": "a100"}, "spec": {"resourceName": "nvidia.com/A100"}})
    client = ScriptedClient()
    seen: list[dict] = []
    worker = Health(client, cache, HealthSettings(), on_suspected=seen.append, now=lambda: NOW)
    await _start(worker)
    for name in "abc":
        d = gpudevice(name)
        d["spec"]["class"] = "a100"
        del d["status"]["device"]
        event(cache.devices, d)
        event(cache.vmis, vmi_obj(name, "Failed"))
    await worker.round()
    await worker.round()
    assert client.of("create") == [] and seen[-1] == {"a100": 1}
    (ev,) = [b for _, b in client.of("create_event")]
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "namespace": "", "uid": NODE}
    assert "count mode" in ev["message"]


async def test_a_vmi_deleted_after_it_failed_still_counts_one_deleted_before_does_not():
    cache = world()
    worker = Health(ScriptedClient(), cache, HealthSettings(), now=lambda: NOW)
    await _start(worker)
    fail(cache, "a")                                         # failed, then deleted
    event(cache.vmis, vmi_obj("a", "Failed", deleting=True))
    event(cache.devices, gpudevice("b"))                     # deleted, then its Pod failed
    event(cache.vmis, vmi_obj("b", deleting=True))
    event(cache.pods, launcher("b"))
    assert worker.failed_starts == 1
    assert [f.vmi for fs in worker.evidence.failures.values() for f in fs] == ["a"]


async def test_a_launcher_evicted_for_a_noexecute_device_taint_never_counts_after_it_is_gone():
    """HL1: kube-controller-manager's device-taint eviction marks the launcher Pod
    DisruptionTarget and deletes it; the VMI fails afterwards (PodNotExists, no Pod left in
    the cache). Not the GPUs' failure: nothing counted, on any GPU of the set; the Pod's last
    state is forgotten with its VMI. A Pod deleted without a disruption leaves the VMI's
    failure counted, as before."""
    cache = world()
    worker = Health(ScriptedClient(), cache, HealthSettings(), now=lambda: NOW)
    await _start(worker)
    for name, disruption in (("a", True), ("b", False)):
        event(cache.devices, gpudevice(name))
        event(cache.vmis, vmi_obj(name))
        pod = launcher(name, "Running")
        event(cache.pods, pod)
        pod["metadata"]["deletionTimestamp"] = "2026-12-06T11:59:30Z"
        if disruption:
            pod["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                            "reason": "DeletionByDeviceTaintManager",
                                            "message": "Device Taint manager: deleting due to NoExecute taint"}]
        event(cache.pods, pod)
        event(cache.pods, None, ("t", pod["metadata"]["name"]))
        failed = vmi_obj(name, "Failed")
        failed["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "PodNotExists"}]
        event(cache.vmis, failed)
    assert worker.failed_starts == 1
    assert [f.vmi for fs in worker.evidence.failures.values() for f in fs] == ["b"]
    assert list(worker._disrupted) == ["uid-a"]
    event(cache.vmis, None, ("t", "a"))
    assert worker._disrupted == {}
