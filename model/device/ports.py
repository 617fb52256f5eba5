"""What device mode reads of the core's values, as Protocols (`model.device` imports none of
`model.snapshot`, `model.types` or `model.hold`, which import it): a snapshot, a node, a
GPUDevice and a hold as the seam sees them. Structural only; nothing here is instantiated."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

from model.device.dra import DeviceRef, DeviceSet

DeviceKey = tuple[str, str]
"""(namespace, name) of a GPUDevice (`model.types.DeviceKey`)."""


class NodeView(Protocol):
    """A `model.types.Node`: its devices per device-mode class and those taken (DR2)."""

    name: str
    taken_devices: frozenset[str]
    foreign_claimed: frozenset[str]

    def devices_of(self, class_name: str) -> DeviceSet: ...


class DeviceView(Protocol):
    """A `model.types.GPUDevice`: its key, class, node and record (`status.device`)."""

    key: DeviceKey
    class_name: str
    bound_node: str | None
    status: Any


class HoldView(Protocol):
    """A `model.hold.Hold`: the request, its node and the devices it names there."""

    request_id: str
    node: str
    devices: tuple[tuple[DeviceKey, DeviceRef], ...]


class SnapshotView(Protocol):
    """A `model.snapshot.Snapshot`: what the seam asks of it."""

    @property
    def nodes(self) -> Mapping[str, NodeView]: ...

    @property
    def classes(self) -> Mapping[str, Any]: ...

    @property
    def reservations(self) -> tuple[HoldView, ...]: ...

    @property
    def mode(self) -> Any: ...

    @property
    def memo(self) -> Any: ...

    def device(self, namespace: str, name: str) -> DeviceView | None: ...

    def free(self, node: str, resource: str) -> int: ...

    def free_buckets(self, resource: str) -> Mapping[int, tuple[str, ...]]: ...

    def serving_nodes(self, class_name: str) -> frozenset[str]: ...

    def free_devices(self, node: str, class_name: str, request_id: str | None = None,
                     own: Iterable[DeviceKey] = ()) -> frozenset[str]: ...

    def recorded_devices(self, node: str) -> Mapping[str, tuple[DeviceKey, ...]]: ...


__all__ = ["DeviceKey", "DeviceView", "HoldView", "NodeView", "SnapshotView"]
