"""Device-mode choice on one node (docs/contract.md §3b, DR3 and DR4): which named devices of a node
take a class's share of a set, so that they all share the class's `matchAttribute` value and
the aligned blocks that stay free are as large as possible (buddy best fit).

Pure: values in, values out (a node's groups and the choices made on them are remembered
on its `Board`, which changes no answer). A node's devices of one class come in as `Device` values (name
and attributes, as a ResourceSlice lists them); what is free for this set comes in as a set of
names (the caller has taken out the binder's records, every claim's allocation and tainted
devices, DR2). Nothing here knows about Kubernetes objects or the ledger.

Vocabulary: the *attribute* is the class's `spec.topology.matchAttribute` with `{size}`
replaced by the number of this class's devices in the set (`gpu.nvidia.com/partition{size}`
→ `gpu.nvidia.com/partition4`). A *group* is the devices of the node sharing one value of
it. A group's *enclosing group* is, for a sized attribute, the group of the next larger size
that exists on the node containing it (partition2 {2,3} → partition4 {0-3}); for an unsized
attribute (`resource.kubernetes.io/pcieRoot`) the whole node.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from model.device.match import SIZE_PLACEHOLDER, MatchAttribute

AttributeValue = str | int | bool
"""A device attribute's value as DRA types them (string, int, bool; versions are strings)."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a node as a ResourceSlice publishes it: `name` (unique within the
    node's pool), `attributes` as sorted (qualified name, value) pairs, qualified names
    as DRA's CEL sees them (`gpu.nvidia.com/partition2`, `resource.kubernetes.io/pcieRoot`)."""

    name: str
    attributes: tuple[tuple[str, AttributeValue], ...] = ()

    @staticmethod
    def of(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> "Device":
        """Build a Device from a plain mapping (sorted into the frozen form)."""
        return Device(name, tuple(sorted((attributes or {}).items())))

    def attribute(self, qualified: str) -> AttributeValue | None:
        """The value of `qualified` on this device, or None when the device lacks it."""
        for key, value in self.attributes:
            if key == qualified:
                return value
        return None


@dataclass(frozen=True, slots=True)
class GroupChoice:
    """The devices chosen on one node for one class's share of a set (DR3, DR4).

    `devices`: the chosen names, in natural order (`gpu-2` before `gpu-10`), exactly the count
    asked for. `group`: the shared attribute value (None when the class has no constraint).
    `left_in_enclosing`: free devices left after the choice in each enclosing group, the
    nearest first (partition2 → its partition4, then its partition8; an unsized attribute: the
    node): buddy best fit, lower means an already broken block was used. `left_in_group`: free devices of the
    chosen group left. `kept`: how many of the set's own current devices (`keep`) the choice
    keeps, so fewer held devices are re-pointed. `fit` orders choices: lower is tighter."""

    devices: tuple[str, ...]
    group: AttributeValue | None
    left_in_enclosing: tuple[int, ...]
    left_in_group: int
    kept: int

    @property
    def fit(self) -> tuple[tuple[int, ...], int, int]:
        """The DR4 tightness key of this choice, lower first: (free left in the enclosing
        groups, nearest first; free left in the group; re-pointed devices as a negative keep
        count)."""
        return (self.left_in_enclosing, self.left_in_group, -self.kept)


@dataclass(frozen=True, slots=True)
class NoGroup:
    """No group on this node has room for the count asked (B3 in device mode).

    `attribute`: the resolved attribute name (None without a constraint). `largest_free`:
    the most free devices any one group of it has here (for an unconstrained class: the free
    devices). `attribute_missing`: no device of this node carries the attribute at all (a
    size no partition has, DR3). `sizes`: for a sized attribute, the sizes that do exist on
    this node (sorted), so the refusal can name them."""

    attribute: str | None
    count: int
    largest_free: int
    attribute_missing: bool
    sizes: tuple[int, ...] = ()


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders embedded numbers by value: `gpu-2` < `gpu-10`."""
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in re.split(r"(\d+)", name) if part != "")


def resolve_attribute(match: MatchAttribute | None, count: int) -> str | None:
    """The qualified attribute a share of `count` devices must agree on (DR3,
    `MatchAttribute.resolve`: `{size}` replaced by `count`); None (no constraint) stays None.
    Raises ValueError for a count below 1."""
    if count < 1:
        raise ValueError(f"a set takes at least one device of a class, got {count}")
    return None if match is None else match.resolve(count)


def sizes_present(match: MatchAttribute, devices: Iterable[Device]) -> tuple[int, ...]:
    """`MatchAttribute.sizes_present` of `match` over `devices` (sorted; () unsized)."""
    return match.sizes_present(devices)


def _enclosing_levels(match: MatchAttribute | None, count: int, devices: Sequence[Device],
                      group_members: Sequence[Device]) -> list[list[Device]]:
    """The enclosing groups of `group_members`, nearest first (see the module docstring): for
    a sized attribute, for each larger size that exists on the node, the devices sharing that
    size's value with the group's devices; otherwise (or with no larger size) the node."""
    if match is None or not match.sized:
        return [list(devices)]
    levels = []
    for size in (n for n in match.sizes_present(devices) if n > count):
        attribute = match.resolve(size)
        values = {d.attribute(attribute) for d in group_members} - {None}
        levels.append([d for d in devices if d.attribute(attribute) in values])
    return levels or [list(devices)]


@dataclass(frozen=True, slots=True)
class _Group:
    """One group of a `Layout`: its attribute `value`, its members' names in device order
    (`names`) and in the order a choice takes them (`ordered`: natural name order, ties in
    device order), and its enclosing groups' members' names, nearest first (`levels`)."""

    value: AttributeValue | None
    names: tuple[str, ...]
    ordered: tuple[str, ...]
    levels: tuple[tuple[str, ...], ...]


class Layout:
    """What `choose_devices` needs of one node's devices of a class for one count, worked out
    once (DR3, DR4): the resolved `attribute`, the groups in device order with their
    enclosing groups, the sizes that exist; and the choices already made on it, by the free
    and keep names (`choose`). Made by `Board.layout`, which keeps it with the board (the
    slice's devices change far less often than decisions are made). Choices depend only on
    the layout and the names, so a layout shared by calls answers each the same. `groups`
    is the one grouping of a node's devices by attribute value (the operator's view reads
    it too, `model.device.view`)."""

    __slots__ = ("attribute", "groups", "names", "sizes", "natural", "bits", "masks", "_choices")

    def __init__(self, devices: Sequence[Device], match: MatchAttribute | None, count: int) -> None:
        attribute = match.resolve(count) if match is not None else resolve_attribute(None, count)
        self.attribute = attribute
        self.names = frozenset(d.name for d in devices)
        self.natural = {d.name: natural_key(d.name) for d in devices}
        members: dict[AttributeValue | None, list[Device]] = {}
        for device in devices:
            value = device.attribute(attribute) if attribute is not None else None
            if attribute is not None and value is None:
                continue
            members.setdefault(value, []).append(device)
        key = self.natural.__getitem__
        self.groups = tuple(
            _Group(value, tuple(d.name for d in group),
                   tuple(sorted((d.name for d in group), key=key)),
                   tuple(tuple(d.name for d in level)
                         for level in _enclosing_levels(match, count, devices, group)))
            for value, group in members.items())
        self.sizes = match.sizes_present(devices) if match is not None else ()
        # each device's bit (device order, the same in every layout of these devices) and
        # each group's mask: "is a group entirely free" is one AND (`model.device.view`)
        self.bits = {d.name: 1 << i for i, d in enumerate(devices)}
        self.masks = tuple(sum(self.bits[x] for x in g.names) for g in self.groups)
        self._choices: dict[tuple[frozenset[str], frozenset[str]], GroupChoice | NoGroup] = {}

    def choose(self, free: frozenset[str], keep: frozenset[str], count: int) -> GroupChoice | NoGroup:
        """`choose_devices` on this layout (the names already checked), remembered by
        (`free`, `keep`)."""
        found = self._choices.get((free, keep))
        if found is None:
            if len(self._choices) >= CHOICES_PER_LAYOUT:
                self._choices.clear()
            found = self._choices[(free, keep)] = self._choose(free, keep, count)
        return found

    def _choose(self, free: frozenset[str], keep: frozenset[str], count: int) -> GroupChoice | NoGroup:
        natural = self.natural
        best: tuple[tuple, GroupChoice] | None = None
        largest_free = 0
        for group in self.groups:
            n_free = sum(1 for x in group.names if x in free)
            largest_free = max(largest_free, n_free)
            if n_free < count:
                continue
            ordered = [x for x in group.ordered if x in free]
            if keep:
                ordered = [x for x in ordered if x in keep] + [x for x in ordered if x not in keep]
            chosen = ordered[:count]
            choice = GroupChoice(
                devices=tuple(sorted(chosen, key=natural.__getitem__)),
                group=group.value,
                left_in_enclosing=tuple(sum(1 for x in level if x in free) - count
                                        for level in group.levels),
                left_in_group=n_free - count,
                kept=sum(1 for x in chosen if x in keep),
            )
            key = (choice.fit, natural_key(str(group.value)))
            if best is None or key < best[0]:
                best = (key, choice)
        if best is not None:
            return best[1]
        return NoGroup(attribute=self.attribute, count=count, largest_free=largest_free,
                       attribute_missing=self.attribute_missing, sizes=self.sizes)

    @property
    def attribute_missing(self) -> bool:
        """No device of these carries the resolved attribute (a size no partition has,
        DR3): no choice of free devices can ever succeed on this layout."""
        return self.attribute is not None and not self.groups


LAYOUTS_PER_BOARD = 64
"""Most layouts one `Board` keeps (one per matchAttribute and count asked: an HGX board
asked for sets of 1, 2, 4 and 8 of one class keeps 4); past it its memo starts over."""

CHOICES_PER_LAYOUT = 512
"""Most choices one `Layout` remembers; past it its memo starts over (an 8-GPU board has
256 free sets)."""


class Board:
    """One node's devices of a class as topology sees them (`devices`, in slice order), with
    the `Layout` of each matchAttribute and count asked, worked out once and kept here
    (`layout`). A board lives with the node's device set (`model.device.dra.DeviceSet`, made
    by the DRA index, which shares one board between nodes whose devices are equal), so the
    memo dies with the devices it describes: no module-level cache."""

    __slots__ = ("devices", "names", "by_name", "_layouts")

    def __init__(self, devices: Iterable[Device]) -> None:
        self.devices = tuple(devices)
        self.names = frozenset(d.name for d in self.devices)
        self.by_name = {d.name: d for d in self.devices}
        self._layouts: dict[tuple[MatchAttribute | None, int], Layout] = {}

    def layout(self, match: MatchAttribute | None, count: int) -> Layout:
        """The `Layout` of these devices for `match` and `count`, made on first use. Raises
        ValueError for a count below 1."""
        key = (match, count)
        found = self._layouts.get(key)
        if found is None:
            if len(self._layouts) >= LAYOUTS_PER_BOARD:
                self._layouts.clear()
            found = self._layouts[key] = Layout(self.devices, match, count)
        return found


def layout(devices: Sequence[Device] | Board, match: MatchAttribute | None, count: int) -> Layout:
    """The `Layout` of `devices` for `match` and `count`: the board's own (remembered there)
    when `devices` is a `Board`, else one made for this call. Raises ValueError for a count
    below 1."""
    board = devices if isinstance(devices, Board) else Board(devices)
    return board.layout(match, count)


def choose_devices(devices: Sequence[Device] | Board, free: Iterable[str], count: int,
                   match: MatchAttribute | None, keep: Iterable[str] = ()) -> GroupChoice | NoGroup:
    """Choose `count` free devices of one node for one class's share of a set (DR3, DR4).

    `devices`: every device of the class on the node (free or not); `free`: the names free for
    this set, which must include the set's own current devices on this node (`keep`: held
    members recorded here, which may be re-pointed, DR4). `match`: the class's
    `spec.topology.matchAttribute` (`MatchAttribute`; None: no constraint).

    With a constraint every chosen device shares the resolved attribute's value; devices
    lacking the attribute are never chosen. Among groups with room: the tightest enclosing
    groups first, nearest level first (fewest free left in each after the choice: a block
    already broken is used before a whole one is broken), then the tightest group, then the most `keep` devices
    kept, then the group's value; within the group, `keep` devices first, then natural name
    order. Without a constraint the whole node is one group.

    Given a `Board`, the node's groups are worked out once per matchAttribute and count
    (`Board.layout`) and each choice is remembered there: the same question costs a lookup.

    Returns a `GroupChoice`, or `NoGroup` when no group has `count` free devices. Raises
    ValueError for a count below 1 or a free/keep name that is not a device of `devices`."""
    lay = layout(devices, match, count)
    free_set = free if isinstance(free, frozenset) else frozenset(free)
    keep_set = keep if isinstance(keep, frozenset) else frozenset(keep)
    if not free_set <= lay.names or not keep_set <= lay.names:
        unknown = (free_set | keep_set) - lay.names
        raise ValueError(f"not devices of this node: {sorted(unknown, key=natural_key)}")
    if not keep_set <= free_set:
        raise ValueError("the set's own devices (keep) must be counted as free for it")
    return lay.choose(free_set, keep_set, count)


@dataclass(frozen=True, slots=True)
class ClassShare:
    """One class's share of a set on a node: `count` devices of `devices` (that class's
    devices on the node: their `Board`, or the devices), constrained by `match`, with the
    set's own current devices of this class on the node in `keep`."""

    name: str
    devices: Board | tuple[Device, ...]
    count: int
    match: MatchAttribute | None = None
    keep: tuple[str, ...] = ()


ORDERS_TRIED = 24
"""Most class orders `choose_set` tries on one node (every order of up to four classes)."""


def choose_set(shares: Sequence[ClassShare], free: Iterable[str]) \
        -> tuple[dict[str, GroupChoice], None] | tuple[None, tuple[str, NoGroup]]:
    """Choose devices on one node for every class of a set (DR3 per class: each class's
    devices share its own attribute; classes never share a device).

    Classes are taken largest count first (then by name), each from what the previous left
    free; when that order finds no group for some class, the other orders are tried in turn
    (at most `ORDERS_TRIED`), so two classes selecting overlapping devices are placed when
    any order fits them. Each class's choice within an order is its own buddy best fit, so a
    node where only a different choice inside a class would fit is still reported as no room
    (refused, never placed wrongly). Returns ({class: choice}, None) from the first order
    that fits, or (None, (class, why)) for the first order's first class with no group.
    Raises ValueError as `choose_devices`."""
    remaining = frozenset(free)
    first = sorted(shares, key=lambda s: (-s.count, s.name)) if len(shares) > 1 else list(shares)
    chosen, failed = _choose_in_order(first, remaining)
    if chosen is not None or len(first) < 2:
        return chosen, failed
    for order in itertools.islice(itertools.permutations(first), 1, ORDERS_TRIED):
        other, _ = _choose_in_order(order, remaining)
        if other is not None:
            return other, None
    return None, failed


def _choose_in_order(shares: Sequence[ClassShare], remaining: frozenset[str]) \
        -> tuple[dict[str, GroupChoice], None] | tuple[None, tuple[str, NoGroup]]:
    """`choose_set` for one order of the classes."""
    chosen: dict[str, GroupChoice] = {}
    for share in shares:
        board = share.devices if isinstance(share.devices, Board) else Board(share.devices)
        outcome = choose_devices(board, remaining & board.names, share.count, share.match,
                                 keep=frozenset(k for k in share.keep if k in remaining))
        if isinstance(outcome, NoGroup):
            return None, (share.name, outcome)
        chosen[share.name] = outcome
        remaining = remaining - frozenset(outcome.devices)
    return chosen, None
