"""The seam between the count-mode core and device mode (docs/contract.md §3b, DR1-DR4).

A snapshot carries one mode object (`mode_of`; `serves_devices` is the one place that asks
whether a class is of device mode, `device_classes` the device-mode classes of a list, for
readers without a snapshot), and the core (`model.snapshot`, `model.decide`, `model.defrag`) calls it at a
few named points, never reading a device record itself:

- `serves(node, class_name)`: a device-mode class also needs devices of its own on a node;
- `carry(records, build, changes)`: the records (DR2) carried to a derived snapshot;
- `for_set(snap, request_id, members, class_names)`: the set's device questions on a node —
  choose a group, whether its records still hold, the devices it records
  (`model.device.choice.SetDevices`);
- `size_missing` / `size_nowhere`: DR3's sizes no node has (W1, explain);
- `movable(device)` and `largest(snap, node, class_name)`: what defragmentation may move and
  how large a set a node's free groups take; `defrag_steps`: the device-mode steps of a
  round (`model.device.defrag`).

`CountMode` is the null object (no class of device mode): every answer is count mode's.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from model.device.choice import NO_DEVICES, NoDevices, SetDevices, size_missing
from model.device.defrag import device_steps
from model.device.match import MatchAttribute
from model.device.ports import DeviceView, NodeView, SnapshotView
from model.device.records import Records, derive_records
from model.device.view import largest_device_set


class CountMode:
    """No class is of device mode: nodes serve by their units, no record is carried, a set
    has no device questions, every idle held device may move."""

    __slots__ = ()

    device_classes: frozenset[str] = frozenset()
    """The device-mode classes (none)."""

    matches: Mapping[str, MatchAttribute | None] = MappingProxyType({})
    """Every device-mode class's matchAttribute (None: no constraint), by class name."""

    def serves(self, node: NodeView, class_name: str) -> bool:
        """Whether `node` (a `model.types.Node`) has what `class_name` needs beyond units."""
        return True

    def carry(self, records: Records | None, build: Callable[[], Records],
              changes: Sequence[tuple[Any, Any]]) -> Records | None:
        """The records of a snapshot derived by `changes` (old, new GPUDevice pairs) from
        one whose records are `records` (None: not worked out; `build` works them out):
        count mode carries them only when asked for already."""
        return derive_records(records, changes) if records is not None and changes else records

    def for_set(self, snap: SnapshotView, request_id: str, members: Sequence[DeviceView],
                class_names: Iterable[str]) -> NoDevices:
        """The set's device questions (`model.device.choice`): none in count mode."""
        return NO_DEVICES

    def size_missing(self, snap: SnapshotView, node: str, counts: Mapping[str, int]) -> Any:
        """DR3: the `NoDeviceGroup` of the first device-mode class of `counts` whose sized
        matchAttribute no device of `node` carries for its count; None when none."""
        return None

    def size_nowhere(self, snap: SnapshotView, counts: Mapping[str, int]) -> bool:
        """DR3: some device-mode class of `counts` asks a size no node serving it has."""
        return False

    def movable(self, device: DeviceView) -> bool:
        """D1 in device mode: an idle held device of a device-mode class moves its record
        (`status.device`), so it must have one."""
        return True

    def largest(self, snap: SnapshotView, node: str, class_name: str) -> int:
        """The largest set of device-mode `class_name` `node`'s free groups take (DR3)."""
        return 0

    def defrag_steps(self, *args: Any, **kwargs: Any) -> Iterable:
        """The device-mode candidate steps of a defragmentation round: none."""
        return ()


COUNT_MODE = CountMode()


class DeviceMode(CountMode):
    """Some classes are of device mode (`device_classes`, with their matchAttributes in
    `matches`)."""

    __slots__ = ("device_classes", "matches")

    def __init__(self, matches: dict[str, MatchAttribute | None]) -> None:
        self.matches = matches  # type: ignore[misc]
        self.device_classes = frozenset(matches)  # type: ignore[misc]

    def serves(self, node: NodeView, class_name: str) -> bool:
        return class_name not in self.matches or bool(node.devices_of(class_name))

    def carry(self, records: Records | None, build: Callable[[], Records],
              changes: Sequence[tuple[Any, Any]]) -> Records | None:
        if records is None:
            records = build()  # once here, not once per derived snapshot that asks
        return derive_records(records, changes) if changes else records

    def for_set(self, snap: SnapshotView, request_id: str, members: Sequence[DeviceView],
                class_names: Iterable[str]) -> NoDevices:
        classes = [c for c in class_names if c in self.matches]
        if not classes:
            return NO_DEVICES
        return SetDevices(snap, request_id, members, classes, self.matches)

    def size_missing(self, snap: SnapshotView, node: str, counts: Mapping[str, int]) -> Any:
        return size_missing(snap, node, {c: k for c, k in counts.items() if c in self.matches},
                            self.matches)

    def size_nowhere(self, snap: SnapshotView, counts: Mapping[str, int]) -> bool:
        for c, count in counts.items():
            if c not in self.matches:
                continue
            nodes = snap.serving_nodes(c)
            if nodes and all(size_missing(snap, n, {c: count}, self.matches) is not None
                             for n in nodes):
                return True
        return False

    def movable(self, device: DeviceView) -> bool:
        return device.class_name not in self.matches or device.status.device is not None

    def largest(self, snap: SnapshotView, node: str, class_name: str) -> int:
        return largest_device_set(snap, node, class_name)

    def defrag_steps(self, *args: Any, **kwargs: Any) -> Iterable:
        """`model.device.defrag.device_steps` (its arguments)."""
        return device_steps(*args, **kwargs)


C = TypeVar("C")
"""A `model.types.GPUClass` (`model.device` does not import `model.types`, which imports it)."""


def serves_devices(cls: Any) -> bool:
    """DR1: whether GPUClass `cls` (`model.types.GPUClass`) is of device mode (it names a
    DeviceClass: its sets take devices, recorded in `status.device`, and a ResourceClaim),
    not of count mode (units of an extended resource). The one test of a class's mode:
    `device_classes` and `mode_of` ask it, and so does every reader outside a snapshot."""
    return cls.device_mode


def device_classes(classes: Iterable[C]) -> dict[str, C]:
    """The device-mode classes among `classes` (`model.types.GPUClass`es, `serves_devices`),
    by name, in their order (the last of a name wins). A class that cannot serve
    (`problem`) is among them when it names a DeviceClass."""
    return {c.name: c for c in classes if serves_devices(c)}  # type: ignore[attr-defined]


def mode_of(classes: Iterable[Any]) -> CountMode:
    """The mode object of a snapshot of `classes` (`model.types.GPUClass`es): `DeviceMode`
    when some class is of device mode (DR1, `device_classes`), else `COUNT_MODE`."""
    matches = {name: MatchAttribute.of(c.match_attribute)
               for name, c in device_classes(classes).items()}
    return DeviceMode(matches) if matches else COUNT_MODE


__all__ = ["COUNT_MODE", "CountMode", "DeviceMode", "device_classes", "mode_of", "serves_devices"]
