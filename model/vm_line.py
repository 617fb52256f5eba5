"""The waiting line applied to the nudge of waiting VirtualMachines (docs/contract.md §3c P5,
docs/virtualmachines.md): `k8s.vm_waiting` tells a waiting VM `GPUSetReady=True` when room
for its set appears (`model.vm.plan_waiting`); `vm_held_back` says when that room is not the
VM's to take because a set ahead of it in the line can use it (or the node is reserved for
one), so the VM is not nudged (its retry would only be refused `behind_in_line`) and the
room stays for the set ahead. The verdict is the coordinator's own (`model.line.may_place`)
on the same kind of snapshot, for the VM's set placed where the binder would place it.

`vm_entries`: W1 refuses a VM's VMI for room before the coordinator sees it, so such a VM
would never wait in the line; the waiting-VM loop, which judges every waiting VM, hands the
coordinator their entries (and the VMs that no longer wait) instead.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

from model.admission import LauncherDefaults, node_selector_of
from model.decide import decide
from model.explain import set_request
from model.housekeeping import VMIs
from model.line import Allowed, Entry, Identity, Line, LineSettings, entry, may_place, shape_of_ask, waits_for_room
from model.parse import ParseError, parse_tolerations, parse_vmi_request
from model.priority import DEFAULT_PRIORITY, Priority, resolve_priority
from model.reasons import Code, Reason
from model.serialize import parse_time
from model.snapshot import Snapshot
from model.types import Result
from model.vm import CONDITION, Waiting, asks_gpus, reason_name, vmi_of_vm, wants_vmi

_LINE_REASONS = frozenset(reason_name(c.value) for c in (Code.BEHIND_IN_LINE, Code.NODE_RESERVED))


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
    (`reservations`: the nodes reserved for the sets at the front, `model.line.reservation`);
    None when the line lets it start, nobody waits, or its template does not parse (then it
    is not nudged anyway). The VM's own place is its entry's when it waits (its VMI has the
    VM's name), else that of a set of its template's priority refused after everyone
    waiting. Pure; never raises."""
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


def refused_since(vm: Mapping[str, Any]) -> datetime | None:
    """When the VM's waiting began as its status says: the `lastTransitionTime` of its
    `GPUSetReady` condition while False, else of virt-controller's `Failure` condition with
    reason FailedCreate (its first denied create); None when neither says (never the VM's
    creation: a VM created long ago and started now has not waited since then)."""
    status = vm.get("status") if isinstance(vm.get("status"), Mapping) else {}
    conds = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    for c in conds:
        if c.get("type") == CONDITION and c.get("status") == "False":
            return parse_time(c.get("lastTransitionTime"))
    for c in conds:
        if c.get("type") == "Failure" and c.get("reason") == "FailedCreate" and c.get("status") == "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def runs_or_rests(vm: Mapping[str, Any], live: bool) -> bool:
    """True for a VM that asks for GPUs and waits for nothing (`vm_entries`' `gone`): its VMI
    exists (`live`), or it wants none (`model.vm.wants_vmi`)."""
    return asks_gpus(vm) and (live or not wants_vmi(vm))


def running_identity(namespace: str, name: str, vm: Mapping[str, Any]) -> Identity:
    """The line identity of VM `namespace/name` (its VMI's name, the VM's uid)."""
    return Identity(namespace, name, (vm.get("metadata") or {}).get("uid") or None)


def vm_entries(snapshot: Snapshot,
               vms: Sequence[Mapping[str, Any]] | Mapping[tuple[str, str], Mapping[str, Any]],
               plan: Sequence[Waiting], *,
               vmis: VMIs, now: datetime, launcher: LauncherDefaults = LauncherDefaults(),
               line: Line | None = None,
               running: Sequence[Identity] | None = None) -> tuple[list[Entry], list[Identity]]:
    """The line entries of the waiting VMs of `plan` (`model.vm.plan_waiting` of `vms`) that
    wait for room: refused for room only (`model.line.waits_for_room` of their explanation's
    reason: W1's refusal, or the binder's) or held back by the line itself; each as its VMI
    (the VM's name) with the VM's uid, its template's shape and priority (P1), first refused
    when its `GPUSetReady` turned False, else when virt-controller recorded its first
    FailedCreate (`refused_since`; `now` when neither says). A VM nudged
    now, or refused for anything else (budget, entitlement, a class problem, a size no node
    has, bad annotations), makes none. And the VMs that wait for nothing: those whose VMI
    runs (`vmis.live`) or that want none (`model.vm.wants_vmi`), and the VMs of `line`'s
    entries (those with a VM uid) that `vms` lacks or shows under another uid (deleted, or
    re-created: another set). Pure; never raises.

    `vms` is a sequence of VMs, or a mapping of them by (namespace, name); `running` (None:
    worked out here from every VM of `vms`) the VMs of the second kind, as the caller keeps
    them (`k8s.vm_waiting`, from the informers' events: issue 40, a round no longer reads
    every VM): then `vms` must be the mapping, and only the keys of `plan` and `line` are
    looked up in it. The same line follows either way (`model.line_plan.refresh` does not
    depend on the order of `gone`)."""
    if isinstance(vms, Mapping):
        by_key = vms
    else:
        by_key = {(str((vm.get("metadata") or {}).get("namespace")), str((vm.get("metadata") or {}).get("name"))): vm
                  for vm in vms}
    entries: list[Entry] = []
    for w in plan:
        e, vm = w.explanation, by_key.get(w.key)
        if e is None or vm is None or w.nudge or w.held:
            continue
        if not ((e.reason is not None and waits_for_room(e.reason)) or w.condition.reason in _LINE_REASONS):
            continue
        vmi = vmi_of_vm(vm)
        try:
            ask = parse_vmi_request(vmi["metadata"]["annotations"])
            tolerations = parse_tolerations(vmi["spec"].get("tolerations"))
        except ParseError:
            continue
        if ask is None:
            continue
        ns, name = w.key
        uid = (vm.get("metadata") or {}).get("uid")
        shape = shape_of_ask(snapshot, ns, ask, node_selector_of(vmi, launcher), tolerations)
        entries.append(entry(Identity(ns, name, uid if isinstance(uid, str) and uid else None), shape,
                             template_priority(snapshot, vmi), refused_since(vm) or now))
    gone = [running_identity(ns, name, vm) for (ns, name), vm in by_key.items()
            if runs_or_rests(vm, (ns, name) in vmis.live)] if running is None else list(running)
    for e in line or ():
        vm = by_key.get(e.identity.key)
        if e.identity.vm_uid is not None and (vm is None or (vm.get("metadata") or {}).get("uid") != e.identity.vm_uid):
            gone.append(e.identity)
    return entries, gone


__all__ = ["refused_since", "running_identity", "runs_or_rests", "template_priority", "vm_entries",
           "vm_held_back"]
