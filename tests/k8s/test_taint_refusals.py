"""HL1 (docs/contract.md §3b DR2): a set refused because the devices with room are
under a device taint says which DeviceTaintRule (or the binder's own suspect mark) and which
taint key keep them from it, from the cache's real DRA index to the refusal the binder and
the webhook write: a set short of room, an idle held device whose GPU is tainted, a
ResourceSlice's own taint, and the marks of the gpu-suspects ConfigMap."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

from k8s.cache import ClusterCache
from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, device_class, resource_slice
from model.admission import check
from model.parse import VMIAsk
from model.decide import Request, decide
from model.device.dra import DeviceRef
from model.health_mark import MARKS_CONFIGMAP, SUSPECT_KEY
from model.reasons import Code, NoDeviceGroup, NoEligibleNode, NoRoom, TaintedDevices
from model.serialize import device_status_to_dict
from model.types import DeviceStatus, Phase, Result, dra_resource_name

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
NODE = "hgx-1"
DRIVER = "gpu.nvidia.com"
RES = dra_resource_name(DEVICE_CLASS)
RV = iter(range(1, 10_000))


def event(informer, obj: dict) -> None:
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = str(next(RV))
    informer._apply("MODIFIED", obj)


def world() -> ClusterCache:
    """One HGX node of 8 GPUs and the device-mode class `hgx` (pairs share partition2)."""
    cache = ClusterCache(object())
    event(cache.slices, resource_slice(NODE, HGX_H100_8))
    event(cache.nodes, {"metadata": {"name": NODE, "labels": {"kubevirt.io/schedulable": "true"}},
                        "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    event(cache.classes, {"metadata": {"name": "hgx"}, "spec": {
        "deviceClassName": DEVICE_CLASS, "topology": {"matchAttribute": "gpu.nvidia.com/partition{size}"}}})
    event(cache.device_classes, device_class())
    return cache


def claim_on(*devices: int) -> dict:
    """An administrator's claim allocating GPUs `devices` of the node (a foreign consumer)."""
    return {"metadata": {"name": "admin", "namespace": "ops"}, "status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-vfio-{i}"}
                    for i in devices]}}}}


def rule(name: str, *devices: int, key: str = "example.com/xid", effect: str = "NoSchedule") -> list[dict]:
    """DeviceTaintRules, one per device, named `name-<i>`."""
    return [{"metadata": {"name": f"{name}-{i}"}, "spec": {
        "deviceSelector": {"driver": DRIVER, "pool": NODE, "device": f"gpu-vfio-{i}"},
        "taint": {"key": key, "value": "79", "effect": effect}}} for i in devices]


def gpudevice(name: str, device: int | None = None) -> dict:
    """A GPUDevice of class hgx in t: Pending, or idle held Bound on the node recording GPU `device`."""
    obj = {"metadata": {"namespace": "t", "name": name, "uid": f"d-{name}"}, "spec": {"class": "hgx"}}
    if device is not None:
        obj["status"] = device_status_to_dict(DeviceStatus(
            phase=Phase.BOUND, node_name=NODE, device=DeviceRef(DRIVER, NODE, f"gpu-vfio-{device}")))
    return obj


def node_problems(reason) -> tuple:
    (nodes,) = [r for r in reason.reasons if isinstance(r, NoEligibleNode)]
    ((_, problems),) = [(p.node, p.problems) for p in nodes.nodes]
    return problems


def test_a_set_short_of_room_names_the_rules_and_the_key_that_took_the_free_devices():
    cache = world()
    event(cache.claims, claim_on(0, 1, 2, 3, 4, 5))
    for r in rule("xid", 6, 7):
        event(cache.taint_rules, r)
    for name in ("a", "b"):
        event(cache.devices, gpudevice(name))
    d = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    assert d.result is Result.REFUSED
    (room,) = node_problems(d.reason)
    assert isinstance(room, NoRoom) and room.free == 0
    assert room.foreign == 6  # the claim's; the tainted two are named, not counted as Pods'
    assert room.tainted == (TaintedDevices(("gpu-vfio-6",), "example.com/xid", "NoSchedule", "xid-6"),
                            TaintedDevices(("gpu-vfio-7",), "example.com/xid", "NoSchedule", "xid-7"))
    text = d.reason.render()
    assert "gpu-vfio-6 tainted example.com/xid:NoSchedule by DeviceTaintRule xid-6" in text
    assert "(6 used by Pods outside the binder; " in text


def test_W1_denial_of_a_set_short_of_room_names_the_rule_too():
    cache = world()
    event(cache.claims, claim_on(0, 1, 2, 3, 4, 5))
    for r in rule("xid", 6, 7, effect="NoExecute"):
        event(cache.taint_rules, r)
    verdict = check(cache.view.snapshot(), "t", "vm", VMIAsk((), (("hgx", 2),)),
                    set(), NOW, timedelta(minutes=1))
    assert verdict.reason.code in (Code.SET_NEEDS, Code.NO_ROOM_FOR_SET)
    assert "tainted example.com/xid:NoExecute by DeviceTaintRule xid-7" in verdict.reason.render()


def test_an_idle_held_device_on_a_tainted_gpu_names_the_rule_and_the_held_device():
    """b records GPU 7, which a rule taints; GPU 6 (a's) has no free partner: no pair on
    the node, and the refusal says why GPU 7 is not b's any more."""
    cache = world()
    event(cache.claims, claim_on(0, 1, 2, 3, 4, 5))
    event(cache.taint_rules, rule("xid", 7)[0])
    event(cache.devices, gpudevice("a", 6))
    event(cache.devices, gpudevice("b", 7))
    d = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    assert d.result is Result.REFUSED
    (group,) = node_problems(d.reason)
    assert isinstance(group, NoDeviceGroup)
    assert group.tainted == (TaintedDevices(("gpu-vfio-7",), "example.com/xid", "NoSchedule", "xid-7",
                                            (("b", "gpu-vfio-7"),)),)
    assert ("(gpu-vfio-7 of held device b tainted example.com/xid:NoSchedule by DeviceTaintRule xid-7)"
            in d.reason.render())


def test_a_slice_taint_and_the_binders_configmap_mark_are_named_as_such():
    cache = world()
    event(cache.claims, claim_on(0, 1, 2, 3, 4, 5))
    event(cache.slices, resource_slice(NODE, HGX_H100_8, generation=2,
                                       taints={6: [{"key": "gpu.nvidia.com/xid", "value": "48",
                                                    "effect": "NoExecute"}]}))
    mark = {"driver": DRIVER, "pool": NODE, "device": "gpu-vfio-7", "node": NODE, "class": "hgx",
            "suspectedAt": "2026-12-06T11:00:00Z", "evidence": []}
    event(cache.suspect_marks, {"metadata": {"name": MARKS_CONFIGMAP, "namespace": "cozy-system"},
                                "data": {"gpu-suspect-hgx-1-gpu-vfio-7-0": json.dumps(mark)}})
    for name in ("a", "b"):
        event(cache.devices, gpudevice(name))
    d = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    (room,) = node_problems(d.reason)
    assert [(t.devices, t.key, t.rule) for t in room.tainted] == [
        (("gpu-vfio-6",), "gpu.nvidia.com/xid", ""),
        (("gpu-vfio-7",), SUSPECT_KEY, "ConfigMap:gpu-suspect-hgx-1-gpu-vfio-7-0")]
    text = d.reason.render()
    assert "gpu-vfio-6 tainted gpu.nvidia.com/xid:NoExecute by its ResourceSlice" in text
    assert "by gpu-binder's suspect mark gpu-suspect-hgx-1-gpu-vfio-7-0 (a ConfigMap entry" in text


def test_a_refusal_without_any_taint_reads_as_before():
    cache = world()
    event(cache.claims, claim_on(0, 1, 2, 3, 4, 5, 6, 7))
    for name in ("a", "b"):
        event(cache.devices, gpudevice(name))
    d = decide(cache.view.snapshot(), Request("r1", "t", "vm", ("a", "b")))
    (room,) = node_problems(d.reason)
    assert room == NoRoom(RES, 2, 0, 8) and room.tainted == ()
    assert d.reason.render().endswith(
        "hgx-1: needs 2 × vfio.gpu.nvidia.com devices, has 0 free (8 used by Pods outside the binder)")
