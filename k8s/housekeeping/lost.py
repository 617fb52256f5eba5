"""HL3 on the API server (docs/device-mode.md, "Nothing lost silently"): the leader tells
each lost device of a device-mode class (`model.lost`: recorded but no longer published, or
published without the class's topology attribute) once, as a Warning Event `GPUDeviceLost`
on every GPUDevice recording it and on its node, and one JSON log line. A loss told is
remembered while it lasts (deduplicated across rounds); when it ends (the device returns,
or its set is placed again) it is forgotten, so a new loss is told again. A new leader tells
the losses it finds once more (the memory is the leader's). Nothing here writes a record:
the record on a lost device is kept.
"""

from __future__ import annotations

from datetime import datetime

from k8s import events
from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping.common import log
from model.device.lost import LostDevice
from model.lost import lost_devices
from model.types import GROUP, VERSION

LOST_REASON = "GPUDeviceLost"
"""The Event reason of a lost device (Warning)."""


def node_event(loss: LostDevice, instance: str, when: datetime) -> dict:
    """The Event on the node of `loss`: in namespace `default`, about the cluster-scoped Node
    (its name as uid, as the kubelet and `kubectl describe node` have it)."""
    body = events.event_body({"apiVersion": "v1", "kind": "Node", "name": loss.node,
                              "namespace": "default"},
                             reason=LOST_REASON, message=loss.render(), warning=True,
                             instance=instance, when=when)
    body["involvedObject"] = {"apiVersion": "v1", "kind": "Node", "name": loss.node,
                              "uid": loss.node}
    return body


def device_event(loss: LostDevice, namespace: str, name: str, instance: str,
                 when: datetime) -> dict:
    """The Event on GPUDevice `namespace/name`, which records the lost device."""
    return events.event_body({"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
                              "name": name, "namespace": namespace},
                             reason=LOST_REASON, message=loss.render(), warning=True,
                             instance=instance, when=when)


class LostDevices:
    """Tells the lost devices (`tell`, each housekeeping round). `told` counts the losses
    told; `lost_now` how many devices are lost as of the last round (None before one)."""

    def __init__(self, client: KubeClient, cache: ClusterCache) -> None:
        self._client = client
        self.cache = cache
        self._nodes: set[tuple[str, str, str]] = set()             # (node, device, reason)
        self._records: set[tuple[str, str, str, str, str]] = set()  # + the GPUDevice's key
        self.told = 0
        self.lost_now: int | None = None

    async def tell(self, now: datetime) -> None:
        """One Event on the node and on each recording GPUDevice per loss not told yet, and
        one log line; losses that ended are forgotten. Best effort (an Event not written is
        logged by `k8s.events.record`, not retried)."""
        lost = lost_devices(self.cache.view.snapshot())
        self.lost_now = len({x.key for x in lost})
        nodes, records = set(), set()
        for loss in lost:
            key = loss.key
            nodes.add(key)
            fresh = key not in self._nodes
            if fresh:
                self._nodes.add(key)
                self.told += 1
                log.warning("device lost", node=loss.node, device=loss.device,
                            gpu_class=loss.class_name, reason=loss.reason.value,
                            recorded_by=[f"{ns}/{n}" for ns, n in loss.records] or None)
                await events.record(self._client, node_event(loss, "housekeeping", now),
                                    node=loss.node, device=loss.device)
            for ns, name in loss.records:
                rkey = (*key, ns, name)
                records.add(rkey)
                if rkey not in self._records:
                    self._records.add(rkey)
                    await events.record(self._client,
                                        device_event(loss, ns, name, "housekeeping", now),
                                        namespace=ns, name=name, device=loss.device)
        for key3 in self._nodes - nodes:
            log.info("device no longer lost", node=key3[0], device=key3[1], reason=key3[2])
        self._nodes &= nodes
        self._records &= records


__all__ = ["LOST_REASON", "LostDevices", "device_event", "node_event"]
