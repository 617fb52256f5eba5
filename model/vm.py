"""VirtualMachines (`kubevirt.io/v1`), the path Cozystack's users take: virt-controller
creates the VMI from the VM's `spec.template`, so our webhook judges a VMI named as the VM,
and a refusal reaches the user through the VM. This module is the pure part: the VMI a VM
would start, whether a VM wants a VMI now, and the `GPUSetReady` condition and the order in
which the binder shows waiting VMs that room has appeared for (`k8s.vm_waiting` writes them);
what preemption tells a preemptor's and a victim's VM is `model.vm_preemption`'s.
No I/O, no wall clock (time comes in as an argument).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Mapping, Sequence

from model.admission import ANNOTATION_PREFIX, LauncherDefaults, node_selector_of, unknown_annotations
from model.explain import Explanation, explain, set_request
from model.housekeeping import VMIs
from model.nomination import hold_id, nomination_holds
from model.parse import ParseError, parse_tolerations, parse_vmi_request
from model.reasons import Reason
from model.snapshot import Snapshot
from model.types import Phase
from model.vm_preemption import Preempted, preempted_victims, preemption_condition

CONDITION = "GPUSetReady"
"""The VM status condition the binder writes on a VM waiting for its GPU set: `False` with
the binder's reason while the set cannot be placed, `True` once it can (virt-controller
re-reconciles the VM on that write and creates the VMI). virt-controller drops it once the
VMI exists (it keeps only conditions the VMI carries), so it shows only while waiting."""
ROOM_REASON = "RoomAvailable"
STARTING_STRATEGIES = frozenset({"Always", "RerunOnFailure"})
"""Run strategies under which virt-controller creates a VMI whenever none exists."""


def run_strategy(vm: Mapping[str, Any]) -> str:
    """The VM's run strategy as virt-controller reads it: `spec.runStrategy`, else
    `spec.running` true → "Always", false or absent → "Halted"."""
    spec = vm.get("spec") if isinstance(vm.get("spec"), Mapping) else {}
    rs = spec.get("runStrategy")
    if isinstance(rs, str) and rs:
        return rs
    return "Always" if spec.get("running") is True else "Halted"


def wants_vmi(vm: Mapping[str, Any]) -> bool:
    """True when virt-controller would create a VMI for the VM while none exists: run
    strategy Always or RerunOnFailure, or Manual with a pending Start request; never while
    the VM is being deleted."""
    meta = vm.get("metadata") if isinstance(vm.get("metadata"), Mapping) else {}
    if meta.get("deletionTimestamp"):
        return False
    rs = run_strategy(vm)
    if rs in STARTING_STRATEGIES:
        return True
    if rs == "Manual":
        status = vm.get("status") if isinstance(vm.get("status"), Mapping) else {}
        reqs = status.get("stateChangeRequests") or []
        return bool(reqs) and isinstance(reqs[0], Mapping) and reqs[0].get("action") == "Start"
    return False


def _template(vm: Mapping[str, Any]) -> Mapping[str, Any]:
    """The VM's `spec.template` ({} when absent or not a mapping)."""
    spec = vm.get("spec") if isinstance(vm.get("spec"), Mapping) else {}
    return spec.get("template") if isinstance(spec.get("template"), Mapping) else {}


def _template_annotations(tmpl: Mapping[str, Any]) -> dict:
    """The annotations of a VM's template, as the VMI would carry them (a shallow copy)."""
    tmeta = tmpl.get("metadata") if isinstance(tmpl.get("metadata"), Mapping) else {}
    return dict(tmeta.get("annotations") or {})


def vmi_of_vm(vm: Mapping[str, Any]) -> dict:
    """The VMI virt-controller creates from the VM (as its `SetupVMIFromVM`): named and
    namespaced as the VM, with the template's labels, annotations and spec (a deep copy).
    What instancetypes and preferences would add is not applied."""
    meta = vm.get("metadata") if isinstance(vm.get("metadata"), Mapping) else {}
    tmpl = _template(vm)
    tmeta = tmpl.get("metadata") if isinstance(tmpl.get("metadata"), Mapping) else {}
    tspec = tmpl.get("spec") if isinstance(tmpl.get("spec"), Mapping) else {}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "labels": dict(tmeta.get("labels") or {}),
                         "annotations": _template_annotations(tmpl)},
            "spec": copy.deepcopy(dict(tspec))}


def asks_gpus(vm: Mapping[str, Any]) -> bool:
    """True when the VM's template carries a `gpu.cozystack.io/` annotation (the webhook's
    business once virt-controller creates the VMI). Reads the template's annotations only:
    no VMI is built (`vmi_of_vm` deep-copies the template's spec; the waiting-VM rounds ask
    this of every VM, issue 40)."""
    ann = _template_annotations(_template(vm))
    return any(isinstance(k, str) and k.startswith(ANNOTATION_PREFIX) for k in ann)


@dataclass(frozen=True, slots=True)
class Condition:
    """A `GPUSetReady` condition: `status` "True" or "False", `reason` CamelCase (the
    binder's reason code, or `ROOM_REASON`), `message` the binder's words."""

    status: str
    reason: str
    message: str


def reason_name(code: str) -> str:
    """A reason code ("no_room") as a condition reason ("NoRoom")."""
    return "".join(p[:1].upper() + p[1:] for p in code.split("_"))


@dataclass(frozen=True, slots=True)
class Waiting:
    """One VM that wants a VMI and has none, judged now: `key` (namespace, name), `since`
    (when it began waiting: its GPUSetReady False transition, else its creation), the
    explanation of its template's set (None when its annotations do not parse: `condition`
    then says why), `condition` the one it should show, `nudge` True when room for its set
    appeared and it is among the waiting VMs the room is given to (in `order`), `held` True
    when it was given room a moment ago (`plan_waiting`'s `given`) and does not fit now: its
    set still counts as placed and its condition is not to be written yet (its VMI CREATE
    may be in flight, its own devices half written)."""

    key: tuple[str, str]
    since: datetime | None
    explanation: Explanation | None
    condition: Condition
    nudge: bool = False
    held: bool = False


def current_condition(vm: Mapping[str, Any]) -> dict | None:
    """The VM's GPUSetReady condition as stored (a dict), or None."""
    status = vm.get("status") if isinstance(vm.get("status"), Mapping) else {}
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CONDITION:
            return dict(c)
    return None


def _since(vm: Mapping[str, Any]) -> datetime | None:
    cond = current_condition(vm)
    stamp = (cond or {}).get("lastTransitionTime") if (cond or {}).get("status") == "False" else None
    stamp = stamp or (vm.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def refused_before(vm: Mapping[str, Any]) -> bool:
    """True when the VM waits on a refusal: it shows our GPUSetReady condition already, or
    virt-controller's `Failure` condition with reason FailedCreate (its VMI CREATE was denied).
    A VM virt-controller has not tried yet is not shown anything (it may well start)."""
    if current_condition(vm) is not None:
        return True
    status = vm.get("status") if isinstance(vm.get("status"), Mapping) else {}
    return any(isinstance(c, Mapping) and c.get("type") == "Failure"
               and c.get("reason") == "FailedCreate" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _preempting(snapshot: Snapshot, key: tuple[str, str], now: datetime) -> bool:
    """True when a live nomination names VMI `key` as its preemptor (P4)."""
    n = snapshot.nomination_for(*key)
    return n is not None and n.live(now)


def judge_vm(snapshot: Snapshot, vm: Mapping[str, Any], *, vmis: VMIs, now: datetime,
             grace: timedelta, launcher: LauncherDefaults = LauncherDefaults(),
             permitted: frozenset[str] | None = None) -> tuple[Explanation | None, Condition]:
    """Explain the VMI the VM would start (`vmi_of_vm`) as `model.explain.explain` does for
    a VMI CREATE now (W1, then B1-B6), and the GPUSetReady condition that says it: False with
    the denial's reason and words, or True when it would be admitted. Annotations that do
    not parse give (None, a False condition naming the field). Pure; never raises."""
    vmi = vmi_of_vm(vm)
    meta = vmi["metadata"]
    ns, name = meta["namespace"], meta["name"]
    unknown = unknown_annotations(meta["annotations"])
    if unknown is not None:
        return None, Condition("False", reason_name(unknown.reason.code.value), unknown.message)
    try:
        ask = parse_vmi_request(meta["annotations"])
        tolerations = parse_tolerations(vmi["spec"].get("tolerations"))
    except ParseError as exc:
        return None, Condition("False", "InvalidAnnotations",
                               f"spec.template: {exc.field}: {exc.problem}")
    if ask is None:
        return None, Condition("True", ROOM_REASON, "the template asks for no GPU device")
    e = explain(snapshot, ns, name, ask, live_vmis=vmis, now=now, grace=grace,
                node_selector=node_selector_of(vmi, launcher), tolerations=tolerations,
                permitted=permitted, vmi_object=vmi)
    if e.admitted:
        return e, Condition("True", ROOM_REASON,
                            f"room for the GPU set on node {e.node}: virt-controller starts "
                            "the VM on its next try")
    assert e.reason is not None
    return e, Condition("False", reason_name(e.reason.code.value), e.reason.render())


def _placed(snapshot: Snapshot, vm: Mapping[str, Any], node: str) -> Snapshot:
    """`snapshot` with the VM's set (its template's devices, `set_request`) Bound on `node`:
    the room given away. A VM whose annotations do not parse is left out (the snapshot
    unchanged)."""
    vmi = vmi_of_vm(vm)
    meta = vmi["metadata"]
    try:
        ask = parse_vmi_request(meta["annotations"])
    except ParseError:
        return snapshot
    if ask is None:
        return snapshot
    snap, request = set_request(snapshot, meta["namespace"], meta["name"], ask)
    out = []
    for name in request.devices:
        d = snap.device(meta["namespace"], name)
        if d is not None:
            out.append(replace(d, status=replace(d.status, phase=Phase.BOUND, node_name=node)))
    return snapshot.with_devices(out)


def _line_says(held_back: Callable[[Snapshot, Mapping[str, Any], str], Reason | None],
               snapshot: Snapshot, vm: Mapping[str, Any], e: Explanation | None) -> Condition | None:
    """The False condition of a VM whose set fits on `e.node` but that the line holds back
    (`held_back`'s reason), None when it may start."""
    assert e is not None and e.node is not None
    why = held_back(snapshot, vm, e.node)
    return None if why is None else Condition("False", reason_name(why.code.value), why.render())


def order(waiting: Iterable[tuple[Mapping[str, Any], datetime | None]]) -> list:
    """Waiting VMs (vm, since) oldest first, then by namespace and name: the order in which
    room is given (see `plan_waiting`)."""
    def key(item):
        vm, since = item
        meta = vm.get("metadata") or {}
        return (since is None, since.timestamp() if since else 0.0,
                str(meta.get("namespace")), str(meta.get("name")))
    return sorted(waiting, key=key)


def plan_waiting(snapshot: Snapshot, vms: Sequence[Mapping[str, Any]], *, vmis: VMIs,
                 now: datetime, grace: timedelta, launcher: LauncherDefaults = LauncherDefaults(),
                 permitted: frozenset[str] | None = None,
                 given: Mapping[tuple[str, str], str] | None = None,
                 preempted: Mapping[tuple[str, str], Preempted] | None = None,
                 held_back: Callable[[Snapshot, Mapping[str, Any], str], Reason | None] | None = None,
                 ) -> list[Waiting]:
    """The waiting VMs and the room given to them, in the documented order.

    Candidates: every VM of `vms` that asks for GPUs, wants a VMI (`wants_vmi`) and has none
    (not in `vmis.live`). They are judged in `order` (oldest waiting first, then namespace
    and name); each one whose set fits the snapshot left by the VMs before it counts as
    placed (its set Bound on its chosen node) for the VMs after it, so a younger VM is told
    there is room only if room remains after every older VM that fits. A VM that fits but
    has not been refused yet (`refused_before`: virt-controller has not tried, or its VMI is
    being created right now and the caches have not seen it) takes its room too, but is not
    returned (it is not waiting).

    `given` (key → node): VMs nudged a moment ago. Their sets count as placed on that node
    whatever the snapshot shows yet: first for those whose VMI is live (the device and VMI
    caches lag each other: the VMI may be seen before the devices the webhook wrote for
    it), and in its turn for one still waiting that does not fit now (its VMI CREATE may be
    in flight: its own devices written, not yet Bound): it comes out `held`.

    P4: the live nominations' holds count (`model.nomination.nomination_holds`: their room
    is their preemptors'), each VM judged without its own nomination's hold; a VM that does
    not fit and waits on preemption shows it (`model.vm_preemption.preemption_condition`:
    a preemptor the victims still to stop, a victim known from the nominations or from
    `preempted` (the leader's memory of victims) its preemptor and both priorities).

    A preemptor (its VMI named by a live nomination) counts as refused before: its create
    was answered 503 with Retry-After, which virt-controller's client waits out inside the
    call, so the VM shows no `Failure` condition meanwhile.

    `held_back(snapshot, vm, node)` (P5, `model.vm_line.vm_held_back` over the leader's
    waiting line): a VM whose set fits but that it holds back (a set ahead of it in the line
    can use the room, or the node is reserved) is not given the room: no nudge, and its
    condition says the line's refusal.

    Returns a `Waiting` per candidate refused before, in that order (`nudge` True for those
    given room). Pure; never raises."""
    snap = snapshot.with_reservations(
        h for h in nomination_holds(snapshot.nominations, now, snapshot.devices_in) if not h.empty)
    known = {**(preempted or {}), **preempted_victims(snapshot.nominations)}
    by_key: dict[tuple[str, str], Mapping[str, Any]] = {}
    candidates = []
    for vm in vms:
        meta = vm.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        by_key[key] = vm
        if key in vmis.live or not wants_vmi(vm) or not asks_gpus(vm):
            continue
        candidates.append((vm, _since(vm)))
    for key, node in sorted((given or {}).items()):
        if key in vmis.live and key in by_key:
            snap = _placed(snap, by_key[key], node)
    out: list[Waiting] = []
    for vm, since in order(candidates):
        meta = vm.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        e, cond = judge_vm(snap.without_reservation(hold_id(*key)), vm, vmis=vmis, now=now,
                           grace=grace, launcher=launcher, permitted=permitted)
        nudge = e is not None and e.admitted and e.node is not None
        held_in_line = False
        if nudge and held_back is not None:  # P5: room a set ahead in line can use is not the VM's
            why = _line_says(held_back, snap, vm, e)
            if why is not None:
                nudge, cond, held_in_line = False, why, True
        if not nudge and not held_in_line and cond.status == "False":
            said = preemption_condition(key, e, current_condition(vm), snapshot.nominations,
                                        known, vmis, now)
            if said is not None:
                cond = Condition("False", *said)
        held = False
        if nudge:
            assert e is not None and e.node is not None
            snap = _placed(snap, vm, e.node)
        elif key in (given or {}):
            snap, held = _placed(snap, vm, (given or {})[key]), True
        if refused_before(vm) or _preempting(snapshot, key, now):
            out.append(Waiting(key, since, e, cond, nudge, held))
    return out
