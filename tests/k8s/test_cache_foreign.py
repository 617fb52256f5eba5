"""`ClusterCache`'s foreign units (§2 capacity, W7) as informer events drive them: the
Pod projection keeps what kube-scheduler's effective requests read (sidecars, overhead), and
a launcher Pod is excused from the binder's own records only, so editing a VMI's annotations
changes nothing in a node's count, in whatever order the informers deliver the objects."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from k8s.cache import ClusterCache, trim_pod
from model.serialize import device_status_to_dict
from model.types import Attachment, DeviceStatus, Phase
from tests.support.world import NOW

H = "nvidia.com/H100"
NS = "tenant-a"


def cache() -> ClusterCache:
    """A cache whose informers are never run: the tests deliver events themselves."""
    return ClusterCache(object())  # the API client is only stored


def event(informer, obj: dict | None, key: tuple[str, str] | None = None) -> None:
    """One watch event into `informer`, as its watch loop delivers it (ingest transform,
    cache, listeners); `obj` None deletes `key`."""
    if obj is None:
        informer._apply("DELETED", {"metadata": {"namespace": key[0] or None, "name": key[1]}})
    else:
        informer._apply("MODIFIED", obj)


_rv = iter(range(1, 10**9))


def stamped(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = str(next(_rv))
    return obj


def node_obj(name: str = "node-1", units: int = 4) -> dict:
    return {"metadata": {"name": name, "labels": {"kubevirt.io/schedulable": "true"}},
            "spec": {}, "status": {"allocatable": {H: str(units)},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


CLASS = {"metadata": {"name": "h100"}, "spec": {"resourceName": H}}


def device_obj(name: str, *, vmi: str | None = "vm-1", uid: str | None = None,
               node: str | None = "node-1") -> dict:
    att = Attachment(vmi, NOW, "adm-1", uid) if vmi else None
    st_ = DeviceStatus(Phase.BOUND if node else Phase.PENDING, node, NOW if node else None, att)
    return {"metadata": {"name": name, "namespace": NS, "uid": f"dev-{name}"},
            "spec": {"class": "h100"}, "status": device_status_to_dict(st_)}


def vmi_obj(name: str = "vm-1", uid: str = "uid-1", *, annotations: dict | None = None,
            gpus: int = 2) -> dict:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid,
                         "annotations": annotations if annotations is not None else
                         {"gpu.cozystack.io/templates": "h100=2", "gpu.cozystack.io/admission": "adm-1"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "node-1"},
                     "domain": {"devices": {"gpus": [{"name": f"g{i}", "deviceName": H}
                                                     for i in range(gpus)]}}}}


def pod_obj(name: str, gpus: int, *, created_by: str | None = None, sidecar: int = 0,
            overhead: int = 0) -> dict:
    spec = {"nodeName": "node-1", "containers": [
        {"name": "compute", "image": "x", "resources": {"limits": {H: str(gpus)}, "requests": {H: str(gpus)}}}]}
    if sidecar:
        spec["initContainers"] = [{"name": "side", "image": "x", "restartPolicy": "Always",
                                   "resources": {"limits": {H: str(sidecar)}}}]
    if overhead:
        spec["overhead"] = {H: str(overhead)}
    labels = {"kubevirt.io/created-by": created_by} if created_by else {}
    return {"metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": spec, "status": {"phase": "Running"}}


def foreign(c: ClusterCache, node: str = "node-1") -> dict[str, int]:
    return dict(c.view.node(node).foreign)


def admitted(c: ClusterCache, *, linked: bool = False) -> None:
    """vm-1 admitted with 2 devices Bound on node-1, its launcher Pod running there."""
    for obj in (node_obj(), CLASS, device_obj("gpu-0", uid="uid-1" if linked else None),
                device_obj("gpu-1", uid="uid-1" if linked else None), vmi_obj(),
                pod_obj("virt-launcher-vm-1", 2, created_by="uid-1")):
        deliver(c, obj)


def deliver(c: ClusterCache, obj: dict) -> None:
    """`obj` (a Node, GPUClass, GPUDevice, VMI or Pod of this module) into its informer."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    informer = (c.nodes if "allocatable" in status else c.classes if "resourceName" in spec
                else c.devices if "class" in spec else c.vmis if "domain" in spec else c.pods)
    event(informer, stamped(obj))


def test_trim_pod_keeps_what_effective_requests_read_and_nothing_a_tenant_could_bloat():
    raw = pod_obj("p", 1, sidecar=1, overhead=1)
    raw["spec"]["initContainers"][0]["env"] = [{"name": "X", "value": "y" * 1000}]
    raw["spec"]["volumes"] = [{"name": "v"}]
    got = trim_pod(raw)
    assert got["spec"]["initContainers"] == [{"resources": {"limits": {H: "1"}}, "restartPolicy": "Always"}]
    assert got["spec"]["overhead"] == {H: "1"}
    assert "volumes" not in got["spec"] and "env" not in str(got)


def test_W7_sidecar_and_overhead_units_are_foreign_as_kube_scheduler_counts_them():
    c = cache()
    event(c.nodes, stamped(node_obj()))
    event(c.pods, stamped(pod_obj("raw", 1, sidecar=1, overhead=1)))
    assert foreign(c) == {H: 3}


def test_W7_removing_adding_or_editing_vmi_annotations_changes_nothing_in_the_count():
    """Issue 23, 1: the launcher Pod of an admitted VMI stays excused when the tenant strips
    every gpu.cozystack.io annotation, before housekeeping recorded the uid and after."""
    for linked in (False, True):
        c = cache()
        admitted(c, linked=linked)
        assert foreign(c) == {}
        for annotations in ({}, {"gpu.cozystack.io/devices": "gpu-9"},
                            {"gpu.cozystack.io/admission": "forged", "gpu.cozystack.io/templates": "h100=8"}):
            event(c.vmis, stamped(vmi_obj(annotations=annotations)))
            assert foreign(c) == {}, (linked, annotations)


def test_W7_annotation_added_to_a_raw_gpu_vmi_excuses_nothing():
    """Issue 23, 2: no device of the binder is attached to a VMI created without it, so its
    launcher Pod's GPUs stay foreign once our annotation is added."""
    c = cache()
    event(c.nodes, stamped(node_obj(units=2)))
    event(c.classes, stamped(CLASS))
    event(c.vmis, stamped(vmi_obj("raw-vm", "raw-uid", annotations={})))
    event(c.pods, stamped(pod_obj("virt-launcher-raw-vm", 2, created_by="raw-uid")))
    assert foreign(c) == {H: 2}
    event(c.vmis, stamped(vmi_obj("raw-vm", "raw-uid", annotations={"gpu.cozystack.io/templates": "h100=2"})))
    assert foreign(c) == {H: 2}


def test_W7_excuses_follow_the_devices_and_the_vmi_incarnation():
    c = cache()
    admitted(c)
    event(c.devices, stamped(device_obj("gpu-1", vmi=None)))        # released: 1 unit counted again
    assert foreign(c) == {H: 1}
    event(c.devices, stamped(device_obj("gpu-1", node="node-2")))   # Bound elsewhere: still counted
    assert foreign(c) == {H: 1}
    event(c.devices, stamped(device_obj("gpu-1")))
    assert foreign(c) == {}
    event(c.vmis, None, (NS, "vm-1"))                                # VMI gone, uid never recorded
    assert foreign(c) == {H: 2}
    event(c.vmis, stamped(vmi_obj(uid="uid-2")))                     # a new incarnation of the name
    assert foreign(c) == {H: 2}                                      # excuses nothing for uid-1's Pod
    event(c.devices, stamped(device_obj("gpu-0", uid="uid-1")))      # a recorded uid wins
    assert foreign(c) == {H: 1}
    event(c.classes, None, ("", "h100"))                             # class gone: nothing excused
    assert foreign(c) == {H: 2}


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(6)), st.booleans())
def test_W7_the_count_does_not_depend_on_the_order_informers_deliver_objects(order, linked):
    """`read_once` lists every informer concurrently: however the lists interleave, the
    node's foreign units come out the same."""
    c = cache()
    objs = [node_obj(), CLASS, device_obj("gpu-0", uid="uid-1" if linked else None),
            device_obj("gpu-1", uid="uid-1" if linked else None), vmi_obj(),
            pod_obj("virt-launcher-vm-1", 3, created_by="uid-1")]
    for i in order:
        deliver(c, objs[i])
    assert foreign(c) == {H: 1}
