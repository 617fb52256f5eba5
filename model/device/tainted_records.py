"""HL1, taints honoured on records (docs/device-mode.md, "A held device on a tainted GPU"):
which of a set's records name a device now under a NoSchedule/NoExecute device taint (from
its ResourceSlice or a DeviceTaintRule), and which records a placement takes off one.

DR2 already keeps every new placement off a tainted device, and B6/B5 keep a set as it is
only when its records still hold (`SetDevices.records_hold`: a tainted device is not free),
so an idle record on a tainted device is re-pointed within its node, or the set moved, at
its next placement. What is here serves the other readers: W4's short cut
(`model.admission.already_admitted`: a set kept for a stopped VM, H4, whose record is
tainted is not admitted as it is but decided again), `explain` (`Explanation.tainted`) and
the coordinator's log line when a placement takes a record off a tainted device
(`off_taint`). A record on a device its node no longer publishes is HL3's (`model.device.lost`),
not named here. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

from model.device.dra import HARD_DEVICE_TAINTS, DeviceRef, DeviceTaint
from model.device.ports import DeviceKey, DeviceView, NodeView, SnapshotView
from model.reasons import RecordTainted


def record_taint(node: NodeView | None, class_name: str, ref: DeviceRef) -> DeviceTaint | None:
    """The NoSchedule/NoExecute taint on the device `ref` that a GPUDevice of device-mode
    class `class_name` records on `node` (the first by rule, key and effect when several),
    None when it carries none, or when `node` (None: gone) does not publish it for the class
    (lost, HL3)."""
    if node is None:
        return None
    published = node.devices_of(class_name).by_name(ref.device)
    if published is None or published.ref != ref or not published.tainted:
        return None
    hard = [t for t in published.taints if t.effect in HARD_DEVICE_TAINTS]
    return min(hard, key=lambda t: (t.rule, t.key, t.effect))


def _record_tainted(snap: SnapshotView, m: DeviceView,
                    live: Collection[DeviceKey] | None) -> RecordTainted | None:
    """`m`'s record as a `RecordTainted` when it names a tainted device of its node."""
    rec, node = m.status.device, m.bound_node
    if rec is None or node is None or m.class_name not in snap.mode.matches:
        return None
    taint = record_taint(snap.nodes.get(node), m.class_name, rec)
    if taint is None:
        return None
    att = m.status.attached_to
    running = (att is not None and att.kept_until is None
               and (live is None or (m.key[0], att.vmi) in live))
    return RecordTainted(m.key[1], node, rec.device, taint.key, taint.effect, taint.rule, running)


def tainted_records(snap: SnapshotView, members: Iterable[DeviceView],
                    live: Collection[DeviceKey] | None = None) -> tuple[RecordTainted, ...]:
    """The `members` (GPUDevices of one set) of a device-mode class, Bound, whose record
    (`status.device`) names a device of their node under a NoSchedule/NoExecute taint, in
    the members' order. `running` says a member is attached to a live VMI: `live` the
    (namespace, name) of the VMIs that exist (None: every attachment counts as live; a
    keep, `attachedTo.keptUntil`, never does). Empty in count mode."""
    if not snap.mode.matches:
        return ()
    return tuple(r for m in members if (r := _record_tainted(snap, m, live)) is not None)


@dataclass(frozen=True, slots=True)
class OffTaint:
    """A placement taking a record off a tainted device: `record` says which member, where
    and which taint (`RecordTainted`); `to_node` and `to_device` what it records after
    (`to_device` None: it lands without a chosen device). `repoint`: the same node (a
    status write, DR4), else a move."""

    record: RecordTainted
    to_node: str
    to_device: str | None

    @property
    def repoint(self) -> bool:
        return self.to_node == self.record.node


def off_taint(snap: SnapshotView, members: Iterable[DeviceView], node: str,
              chosen: Mapping[DeviceKey, DeviceRef]) -> tuple[OffTaint, ...]:
    """HL1, for the log: the `members` of a set placed on `node` with the devices `chosen`
    (a `Placement.devices` as a mapping) whose record names a tainted device
    (`tainted_records`) and which the placement re-points within their node or moves, in
    the members' order. Empty when no record is tainted (and at once in count mode)."""
    if not snap.mode.matches:
        return ()
    out = []
    for m in members:
        r = _record_tainted(snap, m, None)
        if r is None:
            continue
        to = chosen.get(m.key)
        if node == r.node and to is not None and to.device == r.recorded:
            continue  # kept on it (never by `decide`: a tainted device is not free)
        out.append(OffTaint(r, node, None if to is None else to.device))
    return tuple(out)


__all__ = ["OffTaint", "off_taint", "record_taint", "tainted_records"]
