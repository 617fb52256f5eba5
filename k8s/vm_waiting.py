"""Waiting VirtualMachines (leader only): say on the VM why it does not start, and let
virt-controller know when room for its GPU set appears.

virt-controller creates a VM's VMI; when our webhook denies that CREATE, it records a
`Failure` condition (reason FailedCreate, the message of the *first* denial only: it never
rewrites the message while the reason stays) and a FailedCreate Event, and retries with its
work queue's exponential back-off (5 ms doubling, capped at 1000 s; `Forget` only after a
success). So a VM that has waited long would start up to ~17 minutes after room appears.

`VMWaiting` watches VMs (an informer of its own: only the leader needs it) and, in rounds
triggered by changes of VMs, VMIs, devices, nodes, quotas, classes, KubeVirt CRs, launcher
Pods and GPUNominations, plans
with the pure `model.vm.plan_waiting` and writes the VM status condition `GPUSetReady`:
False with the binder's reason and words while the set cannot be placed, True
(`RoomAvailable`) once it can. Every write of the VM's status is a VM update event, on which
virt-controller re-queues the VM at once (its update handler adds the key without the rate
limiter): the True write is the nudge that makes the waiting VM start within a second or
two, without a tenant-visible write to the VM's metadata or spec. virt-controller removes
the condition itself once the VMI exists (it keeps only conditions the VMI carries); for a
VM stopped while waiting this module removes it. Each change of the condition's status or
reason is also an Event on the VM (`GPUSetWaiting` Warning, `GPUSetRoomAvailable` Normal).

Preemption (P4, `model.vm_preemption`): a preemptor's VM says how many victims still run; a
victim's VM waiting for room again names its preemptor and both priorities. The victims
are read from the nominations and remembered here after their nomination is gone (the
preemptor admitted) until their VM runs another VMI, is gone, or `remember` seconds passed
(by then its `Preempted` condition is written, and kept while it waits for room).

Each write of ours costs one webhook call (virt-controller re-queues the VM and is refused
again, unless it was the nudge); Events cost none (virt-controller's VM controller watches
no Events). So writes are bounded and the binder never drives a retry storm: nothing is
written when nothing changed; a VM's status is written at most once per `min_interval`
seconds and at most `max_writes` times per `window` seconds (room that flickers cannot make
a VM flap True/False faster); a waiting VM whose status and reason stay the same has its
message refreshed at most once per `refresh_interval` seconds. The nudge goes only to VMs
whose set fits, oldest waiting first (`model.vm.plan_waiting`); a set given by a nudge
counts as placed for `hold` seconds so that a younger VM is not told of the same room while
the caches have seen the older VM's VMI but not yet its devices. Each write is a JSON
Patch that `test`s the VM's resourceVersion as cached (field manager
`gpu-binder-vm-waiting`), so it never overwrites a newer status of virt-controller's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, Awaitable, Callable, Sequence

import anyio
import structlog

from actors.coordinator_protocol import LineState, VMsWaiting
from k8s import errors, events
from k8s.cache import ClusterCache
from k8s.client import VMS, KubeClient
from k8s.informer import Informer, Key
from k8s.rounds import RoundLoop
from model.admission import ANNOTATION_PREFIX
from model.serialize import format_time
from model.line import Identity
from model.vm import (CONDITION, Condition, Waiting, asks_gpus, current_condition, plan_waiting,
                      wants_vmi)
from model.vm_preemption import Preempted, preempted_victims, restarted
from model.vm_line import running_identity, runs_or_rests, vm_entries, vm_held_back

log = structlog.get_logger("gpu_binder.vm_waiting")

FIELD_MANAGER = "gpu-binder-vm-waiting"


def slim_vm(obj: dict) -> dict:
    """What the VM informer keeps of a VM: identity and times, the run strategy, the
    template's `gpu.cozystack.io/` annotations and spec without volumes (cloud-init user
    data), and the status fields read here (conditions, stateChangeRequests,
    printableStatus)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    tmpl = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    tmeta = tmpl.get("metadata") if isinstance(tmpl.get("metadata"), dict) else {}
    tspec = dict(tmpl.get("spec")) if isinstance(tmpl.get("spec"), dict) else {}
    tspec.pop("volumes", None)
    ann = tmeta.get("annotations") if isinstance(tmeta.get("annotations"), dict) else {}
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    return {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion",
                                               "creationTimestamp", "deletionTimestamp")},
        "spec": {"runStrategy": spec.get("runStrategy"), "running": spec.get("running"),
                 "template": {"metadata": {"annotations": {
                     k: v for k, v in ann.items() if isinstance(k, str)
                     and k.startswith(ANNOTATION_PREFIX)}}, "spec": tspec}},
        "status": {k: status[k] for k in ("conditions", "stateChangeRequests", "printableStatus")
                   if k in status},
    }


class _ByKey(Mapping):
    """An informer's objects as a read-only mapping by key (no copy)."""

    def __init__(self, informer: Informer) -> None:
        self._informer = informer

    def __getitem__(self, key: Key) -> dict:
        got = self._informer.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def get(self, key: Key, default: Any = None) -> Any:
        got = self._informer.get(key)
        return default if got is None else got

    def __iter__(self) -> Iterator[Key]:
        return iter(self._informer.keys())

    def __len__(self) -> int:
        return len(self._informer.keys())


class VMIndex:
    """What a round reads of every VM, kept up to date from the VM and VMI informers' events
    (each event re-judges one key: O(1)) while `VMWaiting.run` listens, so that a round's
    cost follows the VMs that wait, not the fleet (issue 40: each admission's changes made
    a round that read every VM three times, 8 ms at 600 running VMs). Per VM key:
    `idle` the VMs that ask for GPUs, want a VMI (`model.vm.wants_vmi`) and have none:
    `model.vm.plan_waiting`'s candidates; `running` the line identities of those that ask
    for GPUs and run or want none (`model.vm_line.runs_or_rests`: `vm_entries`' `gone`);
    `shown` the VMs carrying our condition (`model.vm.current_condition`). Built from the
    informers' caches at `__init__` (once per leadership)."""

    def __init__(self, vms: Informer, vmis: Informer) -> None:
        self._vms, self._vmis = vms, vmis
        self.idle: dict[Key, dict] = {}
        self.running: dict[Key, Identity] = {}
        self.shown: dict[Key, dict] = {}
        self.updates = 0
        for key in vms.keys():
            self.update(key)

    def changed(self, key: Key, obj: dict | None) -> None:
        """An informer listener (VMs and VMIs: a VM's VMI has its key)."""
        self.update(key)

    def update(self, key: Key) -> None:
        """Judge VM `key` again from the informers' caches now."""
        self.updates += 1
        self.idle.pop(key, None)
        self.running.pop(key, None)
        self.shown.pop(key, None)
        vm = self._vms.get(key)
        if vm is None:
            return
        if current_condition(vm) is not None:
            self.shown[key] = vm
        live = self._vmis.get(key) is not None
        if runs_or_rests(vm, live):
            self.running[key] = running_identity(key[0], key[1], vm)
        elif not live and wants_vmi(vm) and asks_gpus(vm):
            self.idle[key] = vm


def write_due(old: dict | None, new: Condition | None, ages: Sequence[float],
              min_interval: float, refresh_interval: float, *, max_writes: int = 4,
              window: float = 60.0) -> float:
    """Seconds until the condition `new` (None: remove it) may be written over the stored
    `old` (a condition dict or None); `ages` are the seconds since this VM's earlier writes
    (any order). inf when nothing would change. Else the latest of: `min_interval` after
    the last write (`refresh_interval` when only the message changed: same status and
    reason), and, once `max_writes` writes lie within the last `window` seconds, the moment
    the oldest of them leaves it (so never more than `max_writes` writes, hence
    virt-controller re-queues, per VM per `window`). 0: now."""
    if new is None:
        wanted = old is not None
    else:
        wanted = old is None or (old.get("status"), old.get("reason"), old.get("message")) != (
            new.status, new.reason, new.message)
    if not wanted:
        return float("inf")
    same = (old is not None and new is not None and old.get("status") == new.status
            and old.get("reason") == new.reason)
    since_last = min(ages, default=float("inf"))
    recent = sorted(a for a in ages if a < window)
    due = (refresh_interval if same else min_interval) - since_last
    if len(recent) >= max_writes:
        due = max(due, window - recent[max_writes - 1])
    return max(0.0, due)


class VMWaiting:
    """Shows why waiting VMs wait and nudges virt-controller when room appears (module doc).

    `client` makes its API calls (its timeout bounds each; writes carry field manager
    `gpu-binder-vm-waiting`); `grace` is attachmentGrace (W1's liveness of attachments);
    `period` the longest time between rounds; `coalesce` the delay from the first change of
    a burst to its round (`k8s.rounds.RoundLoop`); `min_interval`, `max_writes` per `window`,
    `refresh_interval` bound the writes per VM and `hold` keeps a nudged VM's room (seconds;
    module doc). Counters: `rounds`, `writes`, `nudges` (True writes), `write_errors`.
    Errors are logged and retried on a later round; `run` returns only when cancelled."""

    def __init__(self, client: KubeClient, cache: ClusterCache, *, grace: timedelta,
                 period: float = 5.0, coalesce: float = 0.2,
                 min_interval: float = 2.0, refresh_interval: float = 60.0,
                 max_writes: int = 4, window: float = 60.0, hold: float = 10.0,
                 remember: float = 3600.0,
                 line: Callable[[], Awaitable[LineState | None]] | None = None,
                 waiting: Callable[[VMsWaiting], None] | None = None) -> None:
        self._client = client.using(field_manager=FIELD_MANAGER)
        self.cache = cache
        self.grace = grace
        self.min_interval = min_interval
        self.refresh_interval = refresh_interval
        self.max_writes = max_writes
        self.window = window
        self.hold = hold
        self.remember = remember
        self._line = line  # P5: the coordinator's waiting line (`Binder.line`), None: not known
        self._waiting = waiting  # P5: hands the coordinator the VMs waiting (`Binder.vms_waiting`)
        self.vms = Informer("virtualmachines", client.lister(VMS), transform=slim_vm)
        self._writes: dict[Key, list[float]] = {}  # monotonic times of the last writes
        self._given: dict[Key, tuple[float, str]] = {}  # nudged: (monotonic time, node)
        self._preempted: dict[Key, tuple[float, Preempted]] = {}  # victims: (first seen, what)
        self._loop = RoundLoop(self.round, period=period, coalesce=coalesce, sources=(
            self.vms, self.cache.vmis, self.cache.devices, self.cache.nodes, self.cache.quotas,
            self.cache.classes, self.cache.kubevirts, self.cache.pods, self.cache.nominations))
        self.rounds = self.writes = self.nudges = self.write_errors = 0
        self.index: VMIndex | None = None  # while `listening`: what a round reads of every VM

    async def run(self) -> None:
        """List and watch VMs, then a round now, after every change (coalesced) and at least
        every `period` seconds, until cancelled."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.vms.run)
            try:
                with self.listening():
                    await self._loop.run()
            finally:
                tg.cancel_scope.cancel()

    @contextmanager
    def listening(self) -> Iterator[None]:
        """While the block runs, rounds read the VMs through a `VMIndex` kept from the VM and
        VMI informers' events (`run` listens); without it a round reads every VM. The same
        plans, writes and line either way."""
        index = VMIndex(self.vms, self.cache.vmis)
        self.vms.add_listener(index.changed)
        self.cache.vmis.add_listener(index.changed)
        self.index = index
        try:
            yield
        finally:
            self.index = None
            self.vms.remove_listener(index.changed)
            self.cache.vmis.remove_listener(index.changed)

    def _vms_for_plan(self) -> list[dict]:
        """The VMs `plan_waiting` reads: every VM, or with the index only the candidates
        (`VMIndex.idle`) and the VMs nudged a moment ago (`_given`: it looks those up), which
        is the same plan (a VM of neither kind is read for nothing else)."""
        index = self.index
        if index is None:
            return self.vms.items()
        out = list(index.idle.values())
        for key in self._given:
            vm = self.vms.get(key)
            if vm is not None and key not in index.idle:
                out.append(vm)
        return out

    def plan(self, now: datetime, line: LineState | None = None) -> list[Waiting]:
        """`model.vm.plan_waiting` over the cached VMs and the cache's snapshot, with the
        sets given to VMs nudged within the last `hold` seconds (their VMI may be cached
        before their devices are), the victims remembered (`remembered`), and no nudge
        for room a set ahead in the waiting `line` can use (P5, `model.vm_line.vm_held_back`)."""
        mono = time.monotonic()
        for key in [k for k, (t, _) in self._given.items() if mono - t >= self.hold]:
            del self._given[key]
        snap, vmis = self.cache.view.snapshot(), self.cache.vmi_state()
        return plan_waiting(snap, self._vms_for_plan(),
                            vmis=vmis, now=now, grace=self.grace,
                            launcher=self.cache.launcher_defaults(),
                            permitted=self.cache.permitted_resources(),
                            given={k: node for k, (_, node) in self._given.items()},
                            preempted=self.remembered(snap.nominations, vmis, mono),
                            held_back=None if line is None else partial(
                                vm_held_back, line.line, line.reservations,
                                launcher=self.cache.launcher_defaults()))

    def remembered(self, nominations, vmis, mono: float) -> dict[Key, Preempted]:
        """The victims of `nominations` and of those seen before (P4), less those whose VM
        runs another VMI (`model.vm_preemption.restarted`), is gone, or was first seen
        `remember` seconds ago or more."""
        for key, p in preempted_victims(nominations).items():
            first = self._preempted.get(key)
            self._preempted[key] = (first[0] if first and first[1].victim == p.victim else mono, p)
        for key in [k for k, (t, p) in self._preempted.items()
                    if mono - t >= self.remember or restarted(p, vmis) or self.vms.get(k) is None]:
            del self._preempted[key]
        return {k: p for k, (_, p) in self._preempted.items()}

    async def round(self, now: datetime | None = None) -> None:
        """One pass: write each waiting VM's condition when it changed (within the rate
        bounds), and remove the condition from VMs that no longer wait and have no VMI.
        Skipped while the VM, VMI or device informer is unhealthy."""
        now = now or datetime.now(timezone.utc)
        if not (self.vms.healthy and self.cache.healthy(self.cache.vmis, self.cache.devices)):
            return
        line = await self._line() if self._line is not None else None
        planned = self.plan(now, line)
        self._hand_line(planned, now, line)
        plans = {w.key: w for w in planned}
        live = self.cache.vmi_state().live
        for key, w in plans.items():
            vm = self.vms.get(key)
            if w.held:  # nudged a moment ago, its start may be under way: judged after `hold`
                self._loop.kick(after=self.hold)
                continue
            if vm is not None:
                node = w.explanation.node if w.nudge and w.explanation is not None else None
                await self._show(key, vm, w.condition, now, node)
        shown = self.vms.items() if self.index is None else list(self.index.shown.values())
        for vm in shown:
            key = (vm["metadata"]["namespace"], vm["metadata"]["name"])
            if key not in plans and key not in live and current_condition(vm) is not None:
                await self._show(key, vm, None, now)
        self.rounds += 1

    def _hand_line(self, planned: list[Waiting], now: datetime, line: LineState | None) -> None:
        """P5: W1 refuses a VM's VMI for room before the coordinator sees it, so the VMs found
        waiting for room (and those found running or stopped) go to the coordinator's line
        (`model.vm_line.vm_entries`, `VMsWaiting`)."""
        if self._waiting is None:
            return
        index = self.index
        entries, gone = vm_entries(self.cache.view.snapshot(),
                                   self.vms.items() if index is None else _ByKey(self.vms), planned,
                                   vmis=self.cache.vmi_state(), now=now,
                                   launcher=self.cache.launcher_defaults(),
                                   line=line.line if line is not None else None,
                                   running=None if index is None else tuple(index.running.values()))
        self._waiting(VMsWaiting(tuple(entries), tuple(gone)))

    def _due(self, key: Key, old: dict | None, new: Condition | None) -> float:
        mono = time.monotonic()
        ages = [mono - t for t in self._writes.get(key, ())]
        return write_due(old, new, ages, self.min_interval, self.refresh_interval,
                         max_writes=self.max_writes, window=self.window)

    def _wrote(self, key: Key) -> None:
        mono = time.monotonic()
        keep = max(self.window, self.refresh_interval, self.min_interval)
        for k in [k for k, ts in self._writes.items() if mono - ts[-1] >= keep]:
            del self._writes[k]  # VMs long unwritten (or gone): nothing bounds them any more
        self._writes[key] = [t for t in self._writes.get(key, ()) if mono - t < self.window]
        self._writes[key].append(mono)

    async def _show(self, key: Key, vm: dict, new: Condition | None, now: datetime,
                    node: str | None = None) -> None:
        old = current_condition(vm)
        due = self._due(key, old, new)
        if due == float("inf"):
            return
        if due > 0:
            self._loop.kick(after=due)
            return
        status = vm.get("status") or {}
        conds = [c for c in status.get("conditions") or [] if c.get("type") != CONDITION]
        if new is not None:
            changed = old is None or old.get("status") != new.status
            conds.append({"type": CONDITION, "status": new.status, "reason": new.reason,
                          "message": new.message[:1024],
                          "lastTransitionTime": format_time(now) if changed
                          else old.get("lastTransitionTime") or format_time(now),
                          "lastProbeTime": None})
        ns, name = key
        ops: list[dict] = [{"op": "test", "path": "/metadata/resourceVersion",
                            "value": vm["metadata"]["resourceVersion"]}]
        ops.append({"op": "add", "path": "/status/conditions", "value": conds} if status
                   else {"op": "add", "path": "/status", "value": {"conditions": conds}})
        self._wrote(key)
        try:
            await self._client.patch_status(
                VMS, ns, name, ops, what=f"write the {CONDITION} condition of VM {ns}/{name}")
        except errors.ApiError as err:  # retried on a later round
            self.write_errors += 1
            if not isinstance(err, (errors.Invalid, errors.Conflict, errors.NotFound)):
                log.warning("VM condition not written", vm=f"{ns}/{name}", error=str(err)[:300])
            self._loop.kick(after=self.min_interval)
            return
        self.writes += 1
        log.info("VM condition written", vm=f"{ns}/{name}", condition=CONDITION,
                 status=new.status if new else None, reason=new.reason if new else None)
        if new is not None and (old is None or (old.get("status"), old.get("reason"))
                                != (new.status, new.reason)):
            if new.status == "True":
                self.nudges += 1
                if node is not None:
                    self._given[key] = (time.monotonic(), node)
            await self._event(vm, new, now)

    async def _event(self, vm: dict, cond: Condition, now: datetime) -> None:
        """An Event on the VM for a change of the condition's status or reason (best
        effort: a failure is logged). Events do not re-queue the VM in virt-controller (its
        VM controller watches no Events)."""
        meta = vm["metadata"]
        ns, name = meta["namespace"], meta["name"]
        waiting = cond.status == "False"
        body = events.event_body(
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name,
             "namespace": ns, "uid": meta.get("uid")},
            reason="GPUSetWaiting" if waiting else "GPUSetRoomAvailable", message=cond.message,
            warning=waiting, instance="vm-waiting", when=now)
        await events.record(self._client, body, vm=f"{ns}/{name}")
