"""HL3 over the fleet (docs/device-mode.md, "Nothing lost silently"): every device of a
device-mode class, published or recorded, in exactly one state (`State`), the totals per class that add up, and the lost
devices (`model.device.lost`) that `top`, `explain`, the metric
`gpu_binder_devices_lost{class,reason}` and the leader's Events tell.

The states of a device of device-mode class C, first that applies:

- *published* devices (those C's nodes publish for it, `Node.devices_of`, on nodes that
  exist): `lost` (`attribute-lost`: without C's topology attribute), `tainted`
  (`NoSchedule`/`NoExecute`), `used` (a GPUDevice attached to a live VMI records it; or,
  recorded by none, a claim allocates it or an admission in flight holds it), `held`
  (recorded only by GPUDevices attached to no live VMI: idle, kept for a stopped VM, or
  awaiting their VMI), else `free` (exactly `Snapshot.free_devices` of a new set);
- *recorded but unpublished* devices (a Bound GPUDevice of C records a device its node does
  not publish for C, or its node is gone; one per (node, device name)): `lost`
  (`left-slices`).

So, per class: free + used + held + lost + tainted = published + unpublished
(`ClassDevices.adds_up`; the property tests check it on random fleets). A device published
on a node that does not exist (a slice naming an unknown node) is on no node of the
snapshot: it is in neither term (the cache logs it). Capacity figures elsewhere (`top`'s
FREE, `explain`, the line, `largest_device_set`) take `Snapshot.free_devices`, which never
counts a lost device; `top`'s FREE is moreover capped by the free units of the class's
DeviceClass, and a Bound GPUDevice whose device left the slices keeps its unit (so that the
device's return moves nothing). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable, Iterator, Mapping, Sequence

from model.device.lost import LossReason, LostDevice, record_loss
from model.device.match import MatchAttribute
from model.snapshot import Snapshot
from model.types import DeviceKey, GPUDevice, Node


class State(StrEnum):
    """The state of a device of a device-mode class (module docstring)."""

    FREE = "free"
    USED = "used"
    HELD = "held"
    LOST = "lost"
    TAINTED = "tainted"


DeviceId = tuple[str, str, str]
"""(class, node, device name)."""


@dataclass(frozen=True, slots=True)
class ClassDevices:
    """The totals of one device-mode class: `published` devices, `unpublished` recorded
    ones (lost, left-slices), and how many of them are `free`, `used`, `held`, `tainted`
    and lost per reason (`lost_by`: (reason value, count) for every `LossReason`)."""

    class_name: str
    published: int
    unpublished: int
    free: int
    used: int
    held: int
    tainted: int
    lost_by: tuple[tuple[str, int], ...]

    @property
    def lost(self) -> int:
        """Lost devices, whatever the reason."""
        return sum(n for _, n in self.lost_by)

    def lost_of(self, reason: LossReason) -> int:
        """Lost devices for `reason`."""
        return dict(self.lost_by).get(reason.value, 0)

    @property
    def adds_up(self) -> bool:
        """free + used + held + lost + tainted = published + unpublished."""
        return (self.free + self.used + self.held + self.lost + self.tainted
                == self.published + self.unpublished)

    def render(self) -> str:
        """"8 published + 1 recorded unpublished = 3 free + 2 used + 1 held + 2 lost
        (left-slices 1, attribute-lost 1) + 1 tainted"."""
        unpublished = f" + {self.unpublished} recorded unpublished" if self.unpublished else ""
        reasons = ", ".join(f"{r} {n}" for r, n in self.lost_by if n)
        lost = f"{self.lost} lost" + (f" ({reasons})" if reasons else "")
        ok = "" if self.adds_up else " (DOES NOT ADD UP: a bug, please report)"
        return (f"{self.published} published{unpublished} = {self.free} free + {self.used} used"
                f" + {self.held} held + {lost} + {self.tainted} tainted{ok}")


@dataclass(frozen=True, slots=True)
class FleetDevices:
    """`classify`'s answer: per device-mode class its totals (by name), and every lost
    device (by class, node, device)."""

    classes: tuple[ClassDevices, ...]
    lost: tuple[LostDevice, ...]


def _live(d: GPUDevice, live: frozenset[DeviceKey] | set[DeviceKey] | None) -> bool:
    att = d.status.attached_to
    if att is None:
        return False
    return live is None or (d.namespace, att.vmi) in live


def walk(snap: Snapshot, live: Iterable[DeviceKey] | None = None
         ) -> Iterator[tuple[DeviceId, State, LostDevice | None]]:
    """Every device of every device-mode class with its state (module docstring) and, when
    lost, its `LostDevice`: the published ones by class, node and name, then the recorded
    unpublished ones. `live`: the (namespace, name) of the VMIs that exist (None: every
    attached GPUDevice counts as running)."""
    live_set = None if live is None else (live if isinstance(live, (set, frozenset)) else set(live))
    matches = snap.mode.matches
    if not matches:
        return
    recorders, unpublished = _records(snap)
    for c in sorted(matches):
        match = matches[c]
        text = None if match is None else match.text
        for node_name in sorted(snap.nodes):
            node = snap.nodes[node_name]
            devices = node.devices_of(c)
            if not devices:
                continue
            bare = devices.without_attribute(match)
            held = snap.held_devices(node_name)
            for sd in devices:
                name = sd.ref.device
                ident = (c, node_name, name)
                by = recorders.get((node_name, name), ())
                if name in bare:
                    keys = tuple(sorted(x.key for x in by))
                    yield ident, State.LOST, LostDevice(c, node_name, name, sd.ref,
                                                        LossReason.ATTRIBUTE_LOST, keys, text)
                elif sd.tainted:
                    yield ident, State.TAINTED, None
                elif by:
                    used = any(_live(x, live_set) for x in by)
                    yield ident, State.USED if used else State.HELD, None
                elif name in node.taken_devices or name in held:
                    yield ident, State.USED, None
                else:
                    yield ident, State.FREE, None
    for ident, loss in _left_slices(snap, unpublished):
        yield ident, State.LOST, loss


def _records(snap: Snapshot) -> tuple[dict[tuple[str, str], list[GPUDevice]],
                                      dict[DeviceId, list[GPUDevice]]]:
    """The Bound GPUDevices recording a device, by (node, device name), and those of a
    device-mode class whose record left the slices, by (class, node, device name)."""
    matches = snap.mode.matches
    recorders: dict[tuple[str, str], list[GPUDevice]] = {}
    unpublished: dict[DeviceId, list[GPUDevice]] = {}
    for d in snap.devices.values():
        rec = d.status.device
        if d.bound_node is None or rec is None:
            continue
        recorders.setdefault((d.bound_node, rec.device), []).append(d)
        if d.class_name in matches and record_loss(snap.nodes.get(d.bound_node), d.class_name,
                                                   matches[d.class_name], rec) is LossReason.LEFT_SLICES:
            unpublished.setdefault((d.class_name, d.bound_node, rec.device), []).append(d)
    return recorders, unpublished


def _left_slices(snap: Snapshot, unpublished: dict[DeviceId, list[GPUDevice]]
                 ) -> Iterator[tuple[DeviceId, LostDevice]]:
    """The `left-slices` losses of `unpublished` (`_records`), sorted."""
    matches = snap.mode.matches
    for ident in sorted(unpublished):
        by = unpublished[ident]
        match = matches[ident[0]]
        yield ident, LostDevice(ident[0], ident[1], ident[2], by[0].status.device,
                                LossReason.LEFT_SLICES, tuple(sorted(x.key for x in by)),
                                None if match is None else match.text)


@dataclass(frozen=True, slots=True)
class NodeLosses:
    """The lost devices one node contributes (`node_losses`): `attribute` (class, its
    attribute-lost devices there in the node's order) per class with any, sorted by class;
    `unpublished` ((class, node, device name), the GPUDevices Bound there recording it,
    by key) per left-slices device, sorted."""

    attribute: tuple[tuple[str, tuple[LostDevice, ...]], ...] = ()
    unpublished: tuple[tuple[DeviceId, tuple[GPUDevice, ...]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.attribute or self.unpublished)


def node_losses(name: str, node: Node | None, matches: Mapping[str, MatchAttribute | None],
                bound: Iterable[GPUDevice]) -> NodeLosses:
    """What node `name` (`node`, None when it does not exist) contributes to `lost_devices`:
    its published devices of each device-mode class (`matches`: class → its matchAttribute)
    that lack the class's attribute, with the GPUDevices recording them, and the devices
    recorded by the GPUDevices Bound there (`bound`: those whose `bound_node` is `name`)
    that it does not publish for their class. Reads nothing else: a node's losses change
    only with it, its Bound GPUDevices or `matches`."""
    recorders: dict[str, list[GPUDevice]] = {}
    unpublished: dict[DeviceId, list[GPUDevice]] = {}
    for d in sorted(bound, key=lambda d: d.key):
        rec = d.status.device
        if rec is None:
            continue
        recorders.setdefault(rec.device, []).append(d)
        if d.class_name in matches and record_loss(node, d.class_name, matches[d.class_name],
                                                   rec) is LossReason.LEFT_SLICES:
            unpublished.setdefault((d.class_name, name, rec.device), []).append(d)
    attribute = []
    for c in sorted(matches) if node is not None else ():
        match = matches[c]
        devices = node.devices_of(c)
        bare = devices.without_attribute(match) if devices else frozenset()
        if bare:
            attribute.append((c, tuple(
                LostDevice(c, name, sd.ref.device, sd.ref, LossReason.ATTRIBUTE_LOST,
                           tuple(x.key for x in recorders.get(sd.ref.device, ())), str(match))
                for sd in devices if sd.ref.device in bare)))
    return NodeLosses(tuple(attribute), tuple((i, tuple(by)) for i, by in sorted(unpublished.items())))


def assemble(losses: Mapping[str, NodeLosses], matches: Mapping[str, MatchAttribute | None]
             ) -> tuple[LostDevice, ...]:
    """`lost_devices` from each node's `NodeLosses` (`losses`: node name → its losses; a
    node without any may be left out): the attribute-lost by class, then node; then the
    left-slices by (class, node, device)."""
    out = []
    nodes = sorted(losses)
    for c in sorted(matches):
        for name in nodes:
            out += [x for cc, found in losses[name].attribute if cc == c for x in found]
    for ident, by in sorted((u for nl in losses.values() for u in nl.unpublished),
                            key=lambda u: u[0]):
        match = matches[ident[0]]
        out.append(LostDevice(ident[0], ident[1], ident[2], by[0].status.device,
                              LossReason.LEFT_SLICES, tuple(x.key for x in by),
                              None if match is None else match.text))
    return tuple(out)


def bound_by_node(devices: Iterable[GPUDevice]) -> dict[str, list[GPUDevice]]:
    """The Bound GPUDevices recording a device (`status.device`), by the node they are
    Bound on."""
    out: dict[str, list[GPUDevice]] = {}
    for d in devices:
        if d.bound_node is not None and d.status.device is not None:
            out.setdefault(d.bound_node, []).append(d)
    return out


def lost_devices(snap: Snapshot) -> tuple[LostDevice, ...]:
    """Every lost device (`classify(snap).lost`, in its order) without the states of the
    others: O(nodes × device-mode classes + GPUDevices), one `node_losses` per node (the
    leader's Events keep those per node and work out again only the nodes that changed,
    `k8s.housekeeping.lost`). A device recorded by several GPUDevices names the smallest
    key's record."""
    matches = snap.mode.matches
    if not matches:
        return ()
    bound = bound_by_node(snap.devices.values())
    losses = {}
    for name in set(snap.nodes) | set(bound):
        found = node_losses(name, snap.nodes.get(name), matches, bound.get(name, ()))
        if found:
            losses[name] = found
    return assemble(losses, matches)


def classify(snap: Snapshot, live: Iterable[DeviceKey] | None = None) -> FleetDevices:
    """The totals per device-mode class and the lost devices (`walk`); empty in count mode."""
    counts: dict[str, dict[str, int]] = {c: {} for c in sorted(snap.mode.matches)}
    lost: list[LostDevice] = []
    for (c, _, _), state, loss in walk(snap, live):
        got = counts[c]
        if loss is None:
            got[state.value] = got.get(state.value, 0) + 1
        else:
            lost.append(loss)
            got[loss.reason.value] = got.get(loss.reason.value, 0) + 1
            if loss.reason is LossReason.LEFT_SLICES:
                got["unpublished"] = got.get("unpublished", 0) + 1
    out = []
    for c, got in counts.items():
        published = sum(len(n.devices_of(c)) for n in snap.nodes.values())
        out.append(ClassDevices(c, published, got.get("unpublished", 0), got.get("free", 0),
                                got.get("used", 0), got.get("held", 0), got.get("tainted", 0),
                                tuple((r.value, got.get(r.value, 0)) for r in LossReason)))
    return FleetDevices(tuple(out), tuple(lost))


def lost_members(snap: Snapshot, members: Sequence[GPUDevice]) -> tuple[LostDevice, ...]:
    """`explain`: the lost devices the set's `members` record (each member whose record is
    lost, `model.device.lost.record_loss`), in the members' order."""
    matches = snap.mode.matches
    out = []
    for m in members:
        rec = m.status.device
        if m.class_name not in matches or m.bound_node is None or rec is None:
            continue
        match = matches[m.class_name]
        why = record_loss(snap.nodes.get(m.bound_node), m.class_name, match, rec)
        if why is not None:
            out.append(LostDevice(m.class_name, m.bound_node, rec.device, rec, why, (m.key,),
                                  None if match is None else match.text))
    return tuple(out)


__all__ = ["ClassDevices", "DeviceId", "FleetDevices", "NodeLosses", "State", "assemble", "bound_by_node",
           "classify", "lost_devices", "lost_members", "node_losses",
           "walk"]
