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
from typing import Iterable

from k8s import events
from k8s.cache import ClusterCache
from k8s.client import KubeClient
from k8s.housekeeping.common import log
from model.device.lost import LostDevice
from model.lost import NodeLosses, assemble, bound_by_node, node_losses
from model.types import DeviceKey, Node
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
    told; `lost_now` how many devices are lost as of the last round (None before one).

    The lost devices are `model.lost.lost_devices` of the view's snapshot, kept per node
    (`model.lost.node_losses`) and worked out again only for the nodes whose value changed
    and those where a changed GPUDevice is or was Bound with a record (a round's cost
    follows the changes, not the fleet)."""

    def __init__(self, client: KubeClient, cache: ClusterCache) -> None:
        self._client = client
        self.cache = cache
        self._nodes: set[tuple[str, str, str]] = set()             # (node, device, reason)
        self._records: set[tuple[str, str, str, str, str]] = set()  # + the GPUDevice's key
        self.told = 0
        self.lost_now: int | None = None
        self._matches: dict | None = None
        self._seen: dict[str, Node] = {}            # node → its value as last worked out
        self._bound_at: dict[DeviceKey, str] = {}   # recording device → the node it is Bound on
        self._losses: dict[str, NodeLosses] = {}    # node → its losses (none: left out)
        self._node_map: object = None               # the snapshot's node mapping last seen

    def lost(self, changed: Iterable[DeviceKey] | None = None) -> tuple[LostDevice, ...]:
        """`model.lost.lost_devices` of the view's snapshot now, from the nodes that changed
        and the nodes of the GPUDevices `changed` since the last call (None: not known, every
        node)."""
        snap = self.cache.view.snapshot()
        matches = dict(snap.mode.matches)
        if not matches:
            self._matches, self._seen, self._bound_at, self._losses = matches, {}, {}, {}
            return ()
        view = self.cache.view
        if changed is None or matches != self._matches:
            self._matches, self._losses = matches, {}
            self._seen = dict(snap.nodes)
            bound = bound_by_node(snap.devices.values())
            self._bound_at = {d.key: n for n, ds in bound.items() for d in ds}
            dirty = set(snap.nodes) | set(bound)
        else:  # the snapshot's node mapping is the same object until a node changes
            dirty = set()
            if snap.nodes is not self._node_map:
                dirty = {n for n, node in snap.nodes.items() if self._seen.get(n) is not node}
                dirty |= self._seen.keys() - snap.nodes.keys()
            for key in changed:
                was = self._bound_at.pop(key, None)
                if was is not None:
                    dirty.add(was)
                d = view.device(key)
                if d is not None and d.bound_node is not None and d.status.device is not None:
                    self._bound_at[key] = d.bound_node
                    dirty.add(d.bound_node)
        self._node_map = snap.nodes
        for name in dirty:
            node = snap.nodes.get(name)
            if node is None:
                self._seen.pop(name, None)
            else:
                self._seen[name] = node
            found = node_losses(name, node, matches, view.devices_on(name))
            if found:
                self._losses[name] = found
            else:
                self._losses.pop(name, None)
        return assemble(self._losses, matches)

    async def tell(self, now: datetime, changed: Iterable[DeviceKey] | None = None) -> None:
        """One Event on the node and on each recording GPUDevice per loss not told yet, and
        one log line; losses that ended are forgotten. Best effort (an Event not written is
        logged by `k8s.events.record`, not retried). `changed`: the GPUDevices changed since
        the last call (`lost`)."""
        lost = self.lost(changed)
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
