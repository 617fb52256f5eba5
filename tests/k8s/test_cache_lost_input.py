"""HL3 bad input at the cache (`k8s.cache.ClusterCache`): a slice device without attributes
at all, a topology attribute of the wrong type, and a slice naming a node that does not
exist are each classified (never a crash, never free) and told in one JSON log line naming
the node and the device, once (not on every refresh of the node)."""

from __future__ import annotations

import copy

from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, PARTITION_ATTRIBUTE, resource_slice
from model.lost import State, walk
from tests.k8s.test_cache_foreign import cache, event, node_obj, stamped
from tests.support.logs import captured_logs

DEVICE_CLASS_OBJ = {"metadata": {"name": DEVICE_CLASS}, "spec": {}}  # no selectors: every device
GPU_CLASS = {"metadata": {"name": "hgx"},
             "spec": {"deviceClassName": DEVICE_CLASS,
                      "topology": {"matchAttribute": PARTITION_ATTRIBUTE}}}


def _slice(node: str) -> dict:
    s = copy.deepcopy(resource_slice(node, HGX_H100_8))
    devices = s["spec"]["devices"]
    devices[0]["attributes"] = {}                                   # no attributes at all
    for k in [k for k in devices[1]["attributes"] if k.startswith("partition")]:
        devices[1]["attributes"][k] = {"int": "one"}                # the wrong type
    devices[2]["attributes"]["partition2"] = ["a", "list"]          # not an attribute at all
    return stamped(s)


def test_HL3_bad_slice_input_is_classified_and_logged_once_per_device():
    c = cache()
    with captured_logs() as logs:
        event(c.device_classes, stamped(DEVICE_CLASS_OBJ))
        event(c.classes, stamped(GPU_CLASS))
        event(c.nodes, stamped(node_obj("n1")))
        event(c.slices, _slice("n1"))
        event(c.slices, _slice("ghost"))            # names a node that does not exist
        event(c.nodes, stamped(node_obj("n1", 5)))  # a refresh of n1: nothing logged again
    snap = c.view.snapshot()
    states = {ident[2]: s for ident, s, _ in walk(snap) if ident[1] == "n1"}
    assert len(states) == 8
    assert states["gpu-vfio-0"] is State.LOST and states["gpu-vfio-1"] is State.LOST
    assert states["gpu-vfio-2"] is State.FREE   # partition2 dropped: partition1/4/8 remain
    assert "ghost" not in snap.nodes and all(i[1] != "ghost" for i, _, _ in walk(snap))
    bad = [(e["event"], e["node"], e.get("device"), e.get("attributes")) for e in logs
           if e.get("node") in ("n1", "ghost")]
    assert bad == [
        ("device published without attributes: in no group of a class with a topology "
         "constraint (lost, attribute-lost)", "n1", "gpu-vfio-0", None),
        ("device attributes of the wrong type left out", "n1", "gpu-vfio-1",
         ["partition1", "partition2", "partition4", "partition8"]),
        ("device attributes of the wrong type left out", "n1", "gpu-vfio-2", ["partition2"]),
        ("ResourceSlice names a node that does not exist; its devices are not counted",
         "ghost", None, None)]
    ghost = next(e for e in logs if e.get("node") == "ghost")
    assert ghost["count"] == 8 and ghost["devices"][0] == "gpu.nvidia.com/ghost/gpu-vfio-0"
    # the node appears: its devices count, and no line says otherwise
    with captured_logs() as logs:
        event(c.nodes, stamped(node_obj("ghost")))
    assert [e for e in logs if e.get("node") == "ghost" and "ResourceSlice" in e["event"]] == []
    assert any(i[1] == "ghost" for i, _, _ in walk(c.view.snapshot()))
