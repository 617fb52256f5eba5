"""The operator's view of device mode (docs/contract.md §3b DR2, DR3): per node and
device-mode class, which devices are free and how they sit in the class's groups (Fabric
Manager partitions, PCIe roots), and the largest set placeable there respecting topology.
`model.explain` (explain, top) and `model.defrag` (the largest placeable set it ranks and
the metrics export) read it. Pure: values in, values out; count-mode classes get nothing here.

Naming groups. A group is shown by its members' GPU module ids when every member carries
`<domain>/gpuModuleID` (the domain of the class's `matchAttribute`, `gpu.nvidia.com` for
NVIDIA's driver): Fabric Manager defines partitions over module ids (its user guide's
tables, `nvidia-smi -q`'s "Module ID", `fmpm -l`), so a partition reads as a contiguous
range, `{1-4}`, `{5,6}`, which an operator can check against those tools; the device names
are in PCI order, which partitions do not follow (on `hgx-h100-8` the pair of modules {1,2}
is gpu-vfio-3 and gpu-vfio-0), so by name a partition looks scattered. Without module ids
(PCIe cards) a group is shown by its attribute value and its device names, compressed
(`pci0000:16 gpu-vfio-{0,1}`). The devices a placement takes are always named by device
name (what the binder records and the claim selects), with their module ids beside them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from model.device.dra import DeviceRef
from model.device.match import MODULE_ID, MatchAttribute
from model.device.ports import DeviceKey, DeviceView, SnapshotView
from model.device.topology import AttributeValue, Board, Device, natural_key



# --- names ------------------------------------------------------------------------------------


def _ranges(numbers: Iterable[int]) -> str:
    """1,2,3,4 → "1-4"; 1,2 → "1,2"; 1,2,3,6 → "1-3,6" (runs of three or more as ranges)."""
    nums = sorted(set(numbers))
    out: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{nums[i]}-{nums[j]}")
        else:
            out.extend(str(n) for n in nums[i:j + 1])
        i = j + 1
    return ",".join(out)


def compress_names(names: Sequence[str]) -> str:
    """Device names sharing a prefix and ending in a number as `prefix{ranges}`
    (`gpu-vfio-{0,1}`, `gpu-vfio-{0-3}`); one name as is; otherwise `{a, b}`."""
    if len(names) == 1:
        return names[0]
    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if all(parts) and len({p.group(1) for p in parts}) == 1:  # type: ignore[union-attr]
        return f"{parts[0].group(1)}{{{_ranges(int(p.group(2)) for p in parts)}}}"  # type: ignore[union-attr]
    return "{" + ", ".join(sorted(names, key=natural_key)) + "}"


def module_attribute(match: MatchAttribute | None) -> str | None:
    """`<domain>/gpuModuleID` for a matchAttribute with a domain, else None."""
    return match.module_attribute if match is not None else None


def attribute_noun(match: MatchAttribute | None) -> str:
    """What a group of the class is called: the matchAttribute's id without `{size}`
    (`gpu.nvidia.com/partition{size}` → "partition", `resource.kubernetes.io/pcieRoot` →
    "pcieRoot"); "node" without a constraint."""
    return "node" if match is None else match.noun


def modules_of(devices: Sequence[Device], match: MatchAttribute | None) -> tuple[int, ...] | None:
    """The module ids of `devices` (sorted) when every one carries an integer one, else None."""
    attr = module_attribute(match)
    if attr is None or not devices:
        return None
    ids = [d.attribute(attr) for d in devices]
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        return None
    return tuple(sorted(ids))  # type: ignore[arg-type]


def group_label(devices: Sequence[Device], match: MatchAttribute | None,
                value: AttributeValue | None = None) -> str:
    """How a group is shown (see the module docstring): `{1-4}` by module ids, else the
    attribute value (for an unsized attribute) and the compressed device names."""
    modules = modules_of(devices, match)
    if modules is not None:
        return "{" + _ranges(modules) + "}"
    names = compress_names(sorted((d.name for d in devices), key=natural_key))
    sized = match is not None and match.sized
    return names if sized or value is None else f"{value} {names}"


def devices_label(names: Sequence[str], devices: Sequence[Device], match: MatchAttribute | None) -> str:
    """Chosen device names, with their module ids when they all have one:
    "gpu-vfio-4, gpu-vfio-5 (modules 5,7)"."""
    by = {d.name: d for d in devices}
    chosen = sorted(names, key=natural_key)
    text = ", ".join(chosen)
    modules = modules_of([by[n] for n in chosen if n in by], match) if all(
        n in by for n in chosen) else None
    if modules is not None:
        text += f" (module{'s' if len(modules) != 1 else ''} {_ranges(modules)})"
    return text


# --- groups on a node -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupState:
    """One group of a class's resolved attribute on a node: its `value`, how it is shown
    (`label`), its `devices` and those `free` for the set (names, natural order)."""

    value: AttributeValue
    label: str
    devices: tuple[str, ...]
    free: tuple[str, ...]

    @property
    def used(self) -> int:
        """Devices of the group not free for the set (records, claims, taints, holds)."""
        return len(self.devices) - len(self.free)

    def render(self) -> str:
        """"{1-4} 1 used", "{5-8} free"."""
        return f"{self.label} {'free' if not self.used else f'{self.used} used'}"


@dataclass(frozen=True, slots=True)
class ClassOnNode:
    """A device-mode class on one node for a share of `count` devices (DR2, DR3): the
    class's `devices` there, those `free` for the set, the resolved `attribute` (None
    without a constraint), its `groups` (sorted by label; empty without a constraint), and
    `room` when some group (or, unconstrained, the node) has `count` free. `match` is
    the class's matchAttribute; `missing` when no device carries the resolved attribute;
    `sizes` the sizes of a sized attribute that exist on the node; `by_module` when the
    groups are labelled by module ids."""

    node: str
    class_name: str
    count: int
    match: MatchAttribute | None
    attribute: str | None
    devices: int
    free: tuple[str, ...]
    groups: tuple[GroupState, ...]
    room: bool
    missing: bool = False
    sizes: tuple[int, ...] = ()
    by_module: bool = False

    def render(self) -> str:
        """E.g. "5 free, no free partition of 4: modules {1-4} 1 used, {5-8} 2 used";
        "7 free, a free partition of 4: modules {5-8} free"; "3 free, no pcieRoot with 3
        free: pci0000:16 gpu-vfio-{0,1} 1 used, pci0000:b0 gpu-vfio-{2,3} free"."""
        head = f"{len(self.free)} free"
        noun = attribute_noun(self.match)
        if self.attribute is None:
            return head
        if self.missing:
            sizes = f" (sizes: {', '.join(map(str, self.sizes))})" if self.sizes else ""
            return f"{head}, no {noun} of {self.count}{sizes}"
        if self.match is not None and self.match.sized:
            what = f"{'a' if self.room else 'no'} free {noun} of {self.count}"
        else:
            what = f"{'a' if self.room else 'no'} {noun} with {self.count} free"
        shown = [g for g in self.groups if len(g.devices) > 1]
        if not shown:  # groups of one device (partition1): the free count says it all
            return f"{head}, {what}"
        if self.room:  # only the groups with room matter then
            shown = [g for g in shown if len(g.free) >= self.count]
        prefix = "modules " if self.by_module else ""
        return f"{head}, {what}: {prefix}{', '.join(g.render() for g in shown)}"


def _groups(board: Board, match: MatchAttribute, count: int) -> list[tuple[AttributeValue, list[Device]]]:
    """The groups of `board`'s devices sharing `match` resolved for `count` (each value with
    its devices, in device order): the `Layout`'s one grouping."""
    by_name = board.by_name
    return [(g.value, [by_name[x] for x in g.names]) for g in board.layout(match, count).groups]


def class_on_node(snap: SnapshotView, node: str, class_name: str, count: int,
                  request_id: str | None = None, own: Iterable[DeviceKey] = ()) -> ClassOnNode | None:
    """The state of device-mode class `class_name` on `node` for a share of `count` devices
    of request `request_id` whose members are `own` (free as `Snapshot.free_devices` says,
    DR2; groups of the class's matchAttribute resolved for `count`, DR3). None for a
    count-mode or unknown class, a gone node, or a node without the class's devices."""
    n = snap.nodes.get(node)
    if class_name not in snap.mode.matches or n is None or count < 1:
        return None
    board = n.devices_of(class_name).board
    if not board.devices:
        return None
    free = snap.free_devices(node, class_name, request_id, own)
    match = snap.mode.matches[class_name]
    free_names = tuple(sorted(free, key=natural_key))
    if match is None:
        return ClassOnNode(node, class_name, count, None, None, len(board.devices), free_names,
                           (), len(free) >= count)
    grouped = _groups(board, match, count)
    groups = []
    by_module = bool(grouped) and all(modules_of(m, match) is not None for _, m in grouped)
    for value, members in grouped:
        names = tuple(sorted((d.name for d in members), key=natural_key))
        groups.append(GroupState(value, group_label(members, match, value), names,  # type: ignore[arg-type]
                                 tuple(x for x in names if x in free)))
    groups.sort(key=lambda g: natural_key(g.label))
    room = any(len(g.free) >= count for g in groups)
    missing = not groups
    sizes = match.sizes_present(board.devices) if missing else ()
    return ClassOnNode(node, class_name, count, match, match.resolve(count), len(board.devices),
                       free_names, tuple(groups), room, missing, sizes, by_module)


# --- the largest set placeable (top, metrics, defragmentation's profile) ----------------------


def largest_device_set(snap: SnapshotView, node: str, class_name: str) -> int:
    """The largest number n of new devices of device-mode class `class_name` one set can
    take on `node` now, room and topology alone (DR3; eligibility of the node is the
    caller's, `model.explain.largest_placeable`): n free units of the class's resource
    (reservations in flight counted), and n free devices (DR2) sharing the attribute
    resolved for n. For `partition{size}`: the largest size n that exists with a group of
    it having n free devices (an entirely free partition); for an unsized attribute the
    most free devices of one group; without a constraint the free devices. Capped by the
    free units. 0 for a count-mode or unknown class or a gone node.

    Not monotone: on HGX a node may place 4 and not 3 (no partition of 3). The figure before
    the cap is remembered on the snapshot (`NodeMemo.sizes`): defragmentation asks it of
    every node it might touch, for every step it weighs.
    """
    n = snap.nodes.get(node)
    if class_name not in snap.mode.matches or n is None:
        return 0
    units = snap.free(node, snap.classes[class_name].resource_name)
    if units < 1:
        return 0
    memo = snap.memo
    found = memo.sizes(node, class_name)
    if found is None:
        found = placeable_sizes(n.devices_of(class_name).board, snap.mode.matches[class_name],
                                snap.free_devices(node, class_name))
        memo.put_sizes(node, class_name, found)
    return capped(found, units)


def placeable_sizes(board: Board, match: MatchAttribute | None,
                    free: frozenset[str]) -> int | tuple[int, ...]:
    """`largest_device_set` before the cap by free units, for a node's devices of a class
    (`board`) with matchAttribute `match` of which `free` are free: for a sized attribute the
    sizes with a group of that many free devices, else the most free devices of one group
    (of the node without a constraint). The groups come from the board's layouts
    (`Board.layout`, worked out once per matchAttribute and size), as bit masks
    (`Layout.masks`): a free set is one mask, a group's free devices one AND. `capped` turns
    it into the figure."""
    if match is None:
        return len(free)
    base = board.layout(match, 1)
    bits = base.bits
    mask = 0
    for x in free:
        mask |= bits.get(x, 0)
    if not match.sized:
        return max((bin(mask & m).count("1") for m in base.masks), default=0)
    return tuple(size for size in (base.sizes if board.devices else ())
                 if any(bin(mask & m).count("1") >= size
                        for m in board.layout(match, size).masks))


def capped(sizes: int | tuple[int, ...], units: int) -> int:
    """The largest set `placeable_sizes` allows with `units` free units (0 below 1)."""
    if units < 1:
        return 0
    if isinstance(sizes, int):
        return min(sizes, units)
    return max((size for size in sizes if size <= units), default=0)


@dataclass(frozen=True, slots=True)
class Blocks:
    """For `top`: a device-mode class on a node, its groups per size. For a sized
    attribute, per size that exists `(size, whole free groups, groups)`; for an unsized
    one, one row per group `(label, free, devices)`; none without a constraint."""

    node: str
    class_name: str
    match: MatchAttribute | None
    sized: tuple[tuple[int, int, int], ...] = ()
    unsized: tuple[tuple[str, int, int], ...] = ()

    def render(self) -> str:
        """"whole free partitions by size: 8: 0/1, 4: 0/2, 2: 1/4, 1: 5/8" or "pcieRoot
        free: pci0000:16 gpu-vfio-{0,1} 1/2, pci0000:b0 gpu-vfio-{2,3} 2/2"; "" when there is
        nothing to show."""
        noun = attribute_noun(self.match)
        if self.sized:
            return (f"whole free {noun}s by size: "
                    + ", ".join(f"{s}: {w}/{g}" for s, w, g in sorted(self.sized, reverse=True)))
        if self.unsized:
            return f"{noun} free: " + ", ".join(f"{lbl} {f}/{n}" for lbl, f, n in self.unsized)
        return ""


def blocks(snap: SnapshotView, node: str, class_name: str) -> Blocks | None:
    """The `Blocks` of a device-mode class on `node` for a new set (DR2: free as
    `Snapshot.free_devices` says); None for a count-mode or unknown class or a gone node."""
    n = snap.nodes.get(node)
    if class_name not in snap.mode.matches or n is None:
        return None
    match = snap.mode.matches[class_name]
    if match is None:
        return Blocks(node, class_name, None)
    board = n.devices_of(class_name).board
    free = snap.free_devices(node, class_name)
    if match.sized:
        rows = []
        for size in match.sizes_present(board.devices):
            grouped = _groups(board, match, size)
            whole = sum(1 for _, g in grouped if all(d.name in free for d in g))
            rows.append((size, whole, len(grouped)))
        return Blocks(node, class_name, match, sized=tuple(rows))
    rows2 = sorted(((group_label(g, match, v), sum(1 for d in g if d.name in free), len(g))
                    for v, g in _groups(board, match, 1)), key=lambda r: natural_key(r[0]))
    return Blocks(node, class_name, match, unsized=tuple(rows2))


# --- a set's view (explain, what-if) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """For `explain`: a node serving a device-mode class of the set: per such class its
    state for the set's share (`ClassOnNode`), and `takes` per class the devices a
    placement there would take (or keep, B5/B6), rendered with their module ids (empty
    where the set is not placed, or the binder does not say: `explain` asks it for every
    eligible node). `devices` are those devices per member."""

    node: str
    classes: tuple[ClassOnNode, ...]
    takes: tuple[tuple[str, str], ...] = ()
    devices: tuple[tuple[DeviceKey, DeviceRef], ...] = ()

    def lines(self) -> list[str]:
        """One line per class ("h100x: 5 free, no free partition of 4: …"), then what a
        placement takes ("h100x takes gpu-vfio-4, … (modules 5-8)")."""
        return ([f"{c.class_name}: {c.render()}" for c in self.classes]
                + [f"{c} takes {what}" for c, what in self.takes])


def takes(snap: SnapshotView, node: str, chosen: Sequence[tuple[DeviceKey, DeviceRef]]
          ) -> tuple[tuple[str, str], ...]:
    """Per class (sorted), the chosen devices of `node` rendered with their module ids
    (`devices_label`); members unknown to `snap` are left out."""
    n = snap.nodes.get(node)
    if n is None:
        return ()
    by_class: dict[str, list[str]] = {}
    for key, ref in chosen:
        d = snap.device(*key)
        if d is not None:
            by_class.setdefault(d.class_name, []).append(ref.device)
    out = []
    for c, names in sorted(by_class.items()):
        out.append((c, devices_label(names, n.devices_of(c).devices, snap.mode.matches.get(c))))
    return tuple(out)


def set_view(snap: SnapshotView, request_id: str, members: Sequence[DeviceView],
             chosen: dict[str, tuple[tuple[DeviceKey, DeviceRef], ...]]) -> tuple[NodeDevices, ...]:
    """The device-mode view of a set (`members`, of request `request_id`) on every node with
    devices of one of its device-mode classes, by node name; `chosen` per node the devices a
    placement there takes. Empty for a set without device-mode classes."""
    counts: dict[str, int] = {}
    for m in members:
        if m.class_name in snap.mode.matches:
            counts[m.class_name] = counts.get(m.class_name, 0) + 1
    if not counts:
        return ()
    own = [m.key for m in members]
    out = []
    for node in sorted(snap.nodes):
        classes = tuple(v for c, k in sorted(counts.items())
                        if (v := class_on_node(snap, node, c, k, request_id, own)) is not None)
        if classes:
            got = chosen.get(node, ())
            out.append(NodeDevices(node, classes, takes(snap, node, got), tuple(got)))
    return tuple(out)


def recorded_choice(members: Sequence[DeviceView], node: str) -> tuple[tuple[DeviceKey, DeviceRef], ...]:
    """The members' records on `node` (what B5/B6 keep: their placement names no devices)."""
    return tuple((m.key, m.status.device) for m in members
                 if m.bound_node == node and m.status.device is not None)


__all__ = ["NodeDevices", "recorded_choice", "set_view", "takes", "Blocks", "ClassOnNode", "GroupState", "MODULE_ID", "attribute_noun", "blocks",
           "class_on_node", "compress_names", "devices_label", "group_label",
           "largest_device_set", "module_attribute", "modules_of", "placeable_sizes", "capped"]
