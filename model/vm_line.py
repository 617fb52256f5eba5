"""The waiting line applied to the nudge of waiting VirtualMachines (docs/contract.md §3c P5,
docs/virtualmachines.md): `k8s.vm_waiting` tells a waiting VM `GPUSetReady=True` when room
for its set appears (`model.vm.plan_waiting`); `vm_held_back` says when that room is not the
VM's to take because a set ahead of it in the line can use it (or the node is reserved for
one), so the VM is not nudged (its retry would only be refused `behind_in_line`) and the
room stays for the set ahead. The verdict is the coordinator's own (`model.line.may_place`)
on the same kind of snapshot, for the VM's set placed where the binder would place it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Any, Mapping

from model.admission import LauncherDefaults, node_selector_of
from model.decide import decide
from model.explain import set_request
from model.line import Allowed, Identity, Line, LineSettings, may_place
from model.parse import ParseError, parse_tolerations, parse_vmi_request
from model.priority import DEFAULT_PRIORITY, Priority, resolve_priority
from model.reasons import Reason
from model.snapshot import Snapshot
from model.types import Result
from model.vm import vmi_of_vm


def template_priority(snapshot: Snapshot, vmi: Mapping[str, Any]) -> Priority:
    """The priority a VMI made from a VM's template would record (P1: its
    `spec.priorityClassName` against the snapshot's PriorityClasses; the default when the
    class does not exist: such a VM is refused for that, not for room)."""
    spec = vmi.get("spec") if isinstance(vmi.get("spec"), Mapping) else {}
    name = spec.get("priorityClassName")
    got = resolve_priority(name if isinstance(name, str) and name else None, snapshot.priority_classes)
    return got if isinstance(got, Priority) else DEFAULT_PRIORITY


def vm_held_back(line: Line, reservations: Mapping[Identity, str], snapshot: Snapshot,
                 vm: Mapping[str, Any], node: str, *, launcher: LauncherDefaults = LauncherDefaults(),
                 settings: LineSettings = LineSettings()) -> Reason | None:
    """Why VM `vm`'s set may not start on `node` now although it fits there (`snapshot`, with
    the room given to VMs before it): the line's refusal (`BehindInLine`, `NodeReserved`)
    when `model.line.may_place` holds it back for the binder's placement of it on `node`
    (`reservations`: the nodes reserved for heads, `model.line.reservation`); None when the
    line lets it start, nobody waits, or its template does not parse (then it is not nudged
    anyway). The VM's own place is its entry's when it waits (its VMI has the VM's name),
    else that of a set of its template's priority refused after everyone waiting. Pure;
    never raises."""
    if not line and not reservations:
        return None
    vmi = vmi_of_vm(vm)
    meta = vmi["metadata"]
    try:
        ask = parse_vmi_request(meta["annotations"])
        tolerations = parse_tolerations(vmi["spec"].get("tolerations"))
    except ParseError:
        return None
    if ask is None:
        return None
    snap, request = set_request(snapshot, meta["namespace"], meta["name"], ask,
                                node_selector_of(vmi, launcher), tolerations)
    decision = decide(snap, request, limit=None)
    if decision.result is not Result.SUCCEEDED:
        return None
    placement = next((p for p in decision.placements if p.node == node), decision.placements[0])
    verdict = may_place(line, snap, request, placement, priority=template_priority(snapshot, vmi),
                        reservations=reservations, settings=settings)
    return None if isinstance(verdict, Allowed) else verdict.reason()


__all__ = ["template_priority", "vm_held_back"]
