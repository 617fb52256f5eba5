"""What Dynamic Resource Allocation says a node has and what is taken (docs/contract.md §3b, DR1 and
DR2), as pure values: ResourceSlices read into pools of the current generation, devices by
node with their qualified attributes and taints, and the devices every ResourceClaim's
allocation lists.

Pure: parsers take the plain dicts the API returns (resource.k8s.io/v1) and return frozen
values; nothing here reads the API or the clock. Selector matching (CEL) is `model.device.cel`'s.

Shapes followed (Kubernetes v1.36 `resource.k8s.io/v1`): a ResourceSlice's `spec.driver`,
`spec.pool{name, generation, resourceSliceCount}`, `spec.nodeName` (node-local slices; slices
with `nodeSelector`/`allNodes` are not node-local and not GPUs of one node, so skipped), and
`spec.devices[]{name, attributes{id: {string|int|bool|version}}, taints[]{key, value,
effect}}`. An attribute id without a domain belongs to the driver's domain
(`type` of driver `gpu.nvidia.com` is `gpu.nvidia.com/type`); `resource.kubernetes.io/pcieRoot`
keeps its own. A claim's `status.allocation.devices.results[]{request, driver, pool, device}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from model.device.match import MatchAttribute
from model.device.topology import AttributeValue, Board, Device

HARD_DEVICE_TAINTS = ("NoSchedule", "NoExecute")
"""Device taint effects that keep kube-scheduler's allocator off a device (DR2)."""


class SliceError(ValueError):
    """A ResourceSlice or claim object without the fields the API guarantees (a driver, a
    pool with a non-negative generation, device names): the message names the object."""


@dataclass(frozen=True, slots=True, order=True)
class DeviceRef:
    """A device as an allocation result names it: driver, pool, device name."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """One taint on a device (`key`, `value`, `effect`), and `rule`: the name of the
    DeviceTaintRule that puts it there ("ConfigMap:<name>" for the binder's own mark where
    rules are not served, HL2; "" for the ResourceSlice's own taint), so a refusal can name
    what excluded the device. `rule` says where the taint comes from, not what it is: it
    takes no part in equality."""

    key: str
    value: str = ""
    effect: str = ""
    rule: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device of a node-local slice: its `ref`, the `node`, the attributes with qualified
    names (sorted pairs), its taints, and the attributes that could not be read."""

    ref: DeviceRef
    node: str
    attributes: tuple[tuple[str, AttributeValue], ...]
    taints: tuple[DeviceTaint, ...] = ()
    malformed: tuple[str, ...] = ()
    """HL3 bad input: the attribute ids whose value was not of its type (left out of
    `attributes`; the cache logs them, naming the node and device)."""

    @property
    def tainted(self) -> bool:
        """Whether a NoSchedule/NoExecute taint keeps the allocator off this device (DR2)."""
        return any(t.effect in HARD_DEVICE_TAINTS for t in self.taints)

    def as_device(self) -> Device:
        """The topology view of this device (name and attributes) for `model.device.topology`."""
        return Device(self.ref.device, self.attributes)

    def cel_view(self) -> dict[str, Any]:
        """The object a DeviceClass's or request's CEL selector sees as `device`:
        `driver`, `attributes[domain][id]`, `capacity` (empty: not read here)."""
        attributes: dict[str, dict[str, AttributeValue]] = {}
        for qualified, value in self.attributes:
            domain, _, ident = qualified.rpartition("/")
            attributes.setdefault(domain, {})[ident] = value
        return {"driver": self.ref.driver, "attributes": attributes, "capacity": {}}


class DeviceSet(tuple):
    """One node's devices of a class (`Node.devices_of`, a tuple of `SliceDevice`s sorted by
    ref) with what every decision reads of them, worked out once and kept with them: their
    topology view with its layouts (`board`, `model.device.topology.Board`), their names,
    those no hard taint covers (DR2), and each by name. The DRA index makes them when it
    builds a Node (sharing one board between nodes whose devices look the same); a Node made
    from a plain tuple gets one too (`of`)."""

    def __new__(cls, devices: Iterable[SliceDevice] = (), board: Board | None = None) -> "DeviceSet":
        out = super().__new__(cls, devices)
        out.board = board if board is not None else Board(d.as_device() for d in out)
        return out

    board: Board

    @staticmethod
    def of(devices: "tuple[SliceDevice, ...] | DeviceSet") -> "DeviceSet":
        """`devices` as a DeviceSet (itself when it is one)."""
        return devices if isinstance(devices, DeviceSet) else DeviceSet(devices)

    @property
    def devices(self) -> tuple[Device, ...]:
        """The topology view (name and attributes) of each device, in order."""
        return self.board.devices

    @property
    def names(self) -> frozenset[str]:
        """The devices' names."""
        return self.board.names

    @property
    def untainted(self) -> frozenset[str]:
        """The names of the devices no NoSchedule/NoExecute taint covers (DR2)."""
        found = self.__dict__.get("_untainted")
        if found is None:
            found = self.__dict__["_untainted"] = frozenset(d.ref.device for d in self if not d.tainted)
        return found

    def without_attribute(self, match: "MatchAttribute | None") -> frozenset[str]:
        """HL3: the names of the devices that carry no attribute of the class's topology
        `match` (`MatchAttribute.carried_by`: in no group of it, never free for a set; NVIDIA
        dra-driver-nvidia-gpu#1331 republishes a GPU so); empty without a constraint.
        Remembered per matchAttribute."""
        if match is None:
            return frozenset()
        memo = self.__dict__.setdefault("_without", {})
        found = memo.get(match.text)
        if found is None:
            found = memo[match.text] = frozenset(
                d.ref.device for d in self if not match.carried_by(d.attributes))
        return found

    def by_name(self, name: str) -> SliceDevice | None:
        """The device named `name`, or None."""
        index = self.__dict__.get("_by_name")
        if index is None:
            index = self.__dict__["_by_name"] = {d.ref.device: d for d in self}
        return index.get(name)


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """One parsed slice: its `name`, the driver, the pool with its generation and slice count,
    the node (None when not node-local) and its devices."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str | None
    devices: tuple[SliceDevice, ...]


_ATTRIBUTE_TYPES: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("string", str), ("int", int), ("bool", bool), ("version", str))


def _attribute_value(raw: Any) -> AttributeValue | None:
    """The one value of a DeviceAttribute (`string`, `int`, `bool` or `version`), None when
    it has none of the type its key says (HL3 bad input: `{"int": "4"}`, `{"string": 3}`,
    a list, not a mapping at all): the attribute is then left out, as if not published."""
    if not isinstance(raw, Mapping):
        return None
    for key, kind in _ATTRIBUTE_TYPES:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, kind) and (key != "int" or not isinstance(value, bool)):
            return value
        return None
    return None


def qualify(driver: str, ident: str) -> str:
    """An attribute id as a qualified name: ids without a domain belong to the driver."""
    return ident if "/" in ident else f"{driver}/{ident}"


def parse_resource_slice(obj: Mapping[str, Any]) -> ResourceSlice:
    """Read a `resource.k8s.io/v1` ResourceSlice dict. Raises SliceError (naming the slice)
    when the driver, the pool, its generation or a device name is missing or malformed."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "?")
    spec = obj.get("spec") or {}
    driver = spec.get("driver")
    pool = spec.get("pool") or {}
    generation = pool.get("generation", 0)
    count = pool.get("resourceSliceCount", 1)
    if not isinstance(driver, str) or not driver:
        raise SliceError(f"ResourceSlice {name}: spec.driver is missing")
    if not isinstance(pool.get("name"), str) or not pool.get("name"):
        raise SliceError(f"ResourceSlice {name}: spec.pool.name is missing")
    if not isinstance(generation, int) or generation < 0 or not isinstance(count, int) or count < 1:
        raise SliceError(f"ResourceSlice {name}: spec.pool generation {generation!r} or "
                         f"resourceSliceCount {count!r} is not valid")
    node = spec.get("nodeName") or None
    devices = []
    for raw in spec.get("devices") or ():
        device_name = raw.get("name")
        if not isinstance(device_name, str) or not device_name:
            raise SliceError(f"ResourceSlice {name}: a device has no name")
        attributes, malformed = [], []
        raw_attributes = raw.get("attributes") or {}
        if not isinstance(raw_attributes, Mapping):
            raw_attributes, malformed = {}, ["attributes"]
        for ident, value in raw_attributes.items():
            parsed = _attribute_value(value or {})
            if parsed is not None:
                attributes.append((qualify(driver, str(ident)), parsed))
            elif value:
                malformed.append(str(ident))
        taints = tuple(DeviceTaint(str(t.get("key", "")), str(t.get("value", "") or ""),
                                   str(t.get("effect", "") or ""))
                       for t in raw.get("taints") or ())
        devices.append(SliceDevice(DeviceRef(driver, pool["name"], device_name), node or "",
                                   tuple(sorted(attributes)), taints, tuple(malformed)))
    return ResourceSlice(name, driver, pool["name"], generation, count, node, tuple(devices))


def pool_devices(slices: Iterable[ResourceSlice]) -> dict[str, tuple[SliceDevice, ...]]:
    """DR1, the one pool gathering (the DRA index applies it to each pool that changes; the
    bench and the demo to the slices they read): per (driver, pool), only the slices of its
    highest generation count, and of those the node-local ones; their devices by node,
    sorted by ref. Every node such a slice names is a key, even with no devices. A device
    name listed twice in one pool keeps its first listing, slices taken by name (the API
    server allows it across slices; the allocator treats it as one). A pool whose current
    generation has fewer slices than it announced (being rewritten) counts as far as it is
    published. A device no current slice lists is absent: a record naming it is lost
    capacity, never a free device (DR2)."""
    current: dict[tuple[str, str], list[ResourceSlice]] = {}
    for s in slices:
        key = (s.driver, s.pool)
        kept = current.get(key)
        if kept is None or s.generation > kept[0].generation:
            current[key] = [s]
        elif s.generation == kept[0].generation:
            kept.append(s)
    by_node: dict[str, dict[DeviceRef, SliceDevice]] = {}
    for group in current.values():
        for s in sorted(group, key=lambda s: s.name):
            if s.node is None:
                continue
            devices = by_node.setdefault(s.node, {})
            for device in s.devices:
                devices.setdefault(device.ref, device)
    return {node: tuple(sorted(devs.values(), key=lambda d: d.ref))
            for node, devs in by_node.items()}
