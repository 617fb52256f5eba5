"""An in-memory cluster: the fake `ClusterView`, `ChangeFeed`, `StatusWriter` and
`NominationWriter` beside the Kubernetes adapter, for tests and bench/. No Kubernetes.

It behaves like an API server plus informer cache that is never behind: every write is
applied atomically and is visible to the next read. It also keeps the VMIs a test says exist
(`add_vmi`: name, uid, admission), so the leader's victim deletions (§3c P4) can be played
against it (`delete_vmi`, recorded as op `vmi-deleted`). Faults are injected from a seeded
random generator (`Faults`): write errors before the write, conflicts, *ambiguous*
errors (applied, then reported as failed), and latency; or one at a time with
`fail_next`. Every applied write is appended to `history`, which tests read to check the
invariants of docs/contract.md §7 (unless built with `keep_history=False`, as bench/ does: a long
run would keep a record per write); `on_write` observes each one as it happens.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence

import anyio

from actors.errors import NotFound, RequestWithdrawn, TransientWriteError, WriteConflict, WriteError
from actors.ports import Clock, StatusWrite, SystemClock, WriteOp
from actors.view import IndexedView
from model.device.dra import DeviceRef
from model.nomination import Nomination
from model.priority import (DEFAULT_PRIORITY, ClassPreemption, PreemptionPolicy, Priority,
                            PriorityClassInfo, PriorityScope)
from model.types import (
    Attachment,
    BindRequest,
    Budget,
    DeviceKey,
    DeviceStatus,
    GPUClass,
    GPUDevice,
    LabelSelector,
    Namespace,
    Node,
    OnCordon,
    Phase,
    KUBEVIRT_SCHEDULABLE_LABEL,
    Result,
    Taint,
    Toleration,
    freeze_labels,
)

@dataclass(slots=True)  # not frozen: made on every write, and a frozen __init__ costs twice
class WriteRecord:
    """One applied write (treat as read-only). `op` is `answer` (the binder's one write per
    member: node, result, message, and the placement when `moved`), `move` (a
    defragmenting move, D2: `from_node` to `node`, `message` why), or `request`/`withdraw`
    (the webhook's writes) or `node`/`device` (test setup after start), `nomination` /
    `nomination-deleted` (key: the nomination's name), `vmi-deleted` (key "<ns>/<name>",
    `request_id` the deleted incarnation's uid, `message` who deleted it). `from_node` is
    where the device was Bound before the write (None: Pending); `moved` says the write
    changed its placement (to `node`)."""

    seq: int
    op: str
    key: DeviceKey | str
    request_id: str | None = None
    node: str | None = None
    result: Result | None = None
    message: str | None = None
    from_node: str | None = None
    moved: bool = False


@dataclass(slots=True)
class Faults:
    """Random faults of StatusWriter calls, drawn from the store's seeded generator.

    `error_rate`: TransientWriteError, nothing applied. `conflict_rate`: WriteConflict,
    nothing applied. `ambiguous_rate`: applied, then TransientWriteError. `latency`: each
    call waits uniform [0, latency] seconds before applying (0: one checkpoint)."""

    error_rate: float = 0.0
    conflict_rate: float = 0.0
    ambiguous_rate: float = 0.0
    latency: float = 0.0


@dataclass(slots=True)
class _Injected:
    op: str | None
    key: DeviceKey | None
    error: type[WriteError]
    times: int
    applied: bool


class MemoryStore(IndexedView):
    """The fake cluster (see the module docstring): an `IndexedView` (the ClusterView and
    ChangeFeed, its indexes and snapshot) that is also the StatusWriter. Setup methods are
    synchronous and emit change notifications like watch events would: one per call, even
    when nothing changed."""

    def __init__(
        self,
        *,
        seed: int = 0,
        faults: Faults | None = None,
        clock: Clock | None = None,
        keep_history: bool = True,
    ) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.keep_history = keep_history
        self._seq = 0
        self.faults = faults or Faults()
        self.clock: Clock = clock or SystemClock()
        self.history: list[WriteRecord] = []
        self.on_write: Callable[[WriteRecord], None] | None = None
        self.writes_attempted = 0
        self.writes_failed = 0
        self._injected: list[_Injected] = []
        self.events: list[tuple[DeviceKey, str, str]] = []
        """Events the binder recorded on devices: (device, reason, message); a defragmenting
        move records `GPUDeviceMoved` (D4)."""
        self._vmis: dict[tuple[str, str], tuple[str, str | None]] = {}  # (ns, name) -> (uid, admission)
        self._uids = 0
        self.deleted_vmis: list[tuple[str, str, str, str | None, str]] = []
        """Every VMI `delete_vmi` deleted, in order: (namespace, name, uid, admission, by)."""

    # -- setup (as the API server would see objects appear and change) --------------------

    def add_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        self._namespaces[name] = Namespace(name, freeze_labels(labels))
        self._changed("namespace", name)

    def add_class(
        self,
        name: str,
        resource_name: str,
        *,
        on_cordon: OnCordon = OnCordon.MOVE,
        node_selector: Mapping[str, str] | None = None,
        namespace_selector: LabelSelector | None = None,
        preemption: ClassPreemption = ClassPreemption.LOWER_PRIORITY,
    ) -> None:
        self._classes[name] = GPUClass(
            name, resource_name, on_cordon, freeze_labels(node_selector), namespace_selector,
            preemption=preemption,
        )
        self._changed("class", name)

    def add_node(
        self,
        name: str,
        allocatable: Mapping[str, int],
        *,
        labels: Mapping[str, str] | None = None,
        unschedulable: bool = False,
        ready: bool = True,
        taints: Sequence[Taint] = (),
        foreign: Mapping[str, int] | None = None,
    ) -> None:
        """A Node as KubeVirt would run VMs on it: `kubernetes.io/hostname` and
        `kubevirt.io/schedulable=true` labels (`labels` may override either), Ready unless
        `ready` is False; `foreign` units used by Pods outside the binder (§2)."""
        labels = {"kubernetes.io/hostname": name, KUBEVIRT_SCHEDULABLE_LABEL: "true", **(labels or {})}
        self._nodes[name] = Node(
            name, freeze_labels(labels), tuple(sorted(allocatable.items())), unschedulable,
            ready, tuple(taints), tuple(sorted((foreign or {}).items())),
        )
        self._changed("node", name)

    def cordon(self, name: str, unschedulable: bool = True) -> None:
        """Set `spec.unschedulable` of the node."""
        self._nodes[name] = replace(self._nodes[name], unschedulable=unschedulable)
        self._changed("node", name)

    def set_allocatable(self, name: str, resource: str, units: int) -> None:
        """Change one resource of the node's `status.allocatable` (lower it to lose capacity)."""
        alloc = dict(self._nodes[name].allocatable)
        alloc[resource] = units
        self._nodes[name] = replace(self._nodes[name], allocatable=tuple(sorted(alloc.items())))
        self._changed("node", name)

    def delete_node(self, name: str) -> None:
        """The Node object is deleted (its devices keep their `nodeName`)."""
        del self._nodes[name]
        self._changed("node", name)

    def add_budget(self, namespace: str, resource: str, hard: int,
                   scope: PriorityScope | None = None) -> None:
        """A ResourceQuota's budget; with `scope`, one scoped on PriorityClass (P1), kept
        beside the others of the namespace."""
        if scope is None:
            self._budgets[(namespace, resource)] = Budget(namespace, resource, hard)
            self._changed("budget", namespace)
            return
        self._scoped[namespace] = self._scoped.get(namespace, ()) + (Budget(namespace, resource, hard, scope),)
        self._changed("budget", namespace)

    def add_priority_class(self, name: str, value: int, *, global_default: bool = False,
                           policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER) -> None:
        """A PriorityClass as the API server serves it (P1)."""
        self.put_priority_class(PriorityClassInfo(name, value, global_default, policy))

    def add_device(
        self,
        namespace: str,
        name: str,
        class_name: str,
        *,
        node: str | None = None,
        template_for: str | None = None,
        device: DeviceRef | None = None,
    ) -> DeviceKey:
        """Create a device, Bound to `node` when given (recording `device` there, device
        mode), else Pending."""
        status = DeviceStatus()
        if node is not None:
            status = DeviceStatus(phase=Phase.BOUND, node_name=node, bound_at=self.clock.now(),
                                  device=device)
        dev = GPUDevice(namespace, name, class_name, template_for, status,
                        created_at=self.clock.now())
        self.put_device(dev)
        return dev.key

    def delete_device(self, key: DeviceKey) -> None:
        if key in self._devices:
            self.remove_device(key)
        else:
            self.emit("device", key)  # one Change per call, even for a missing device

    def request(
        self,
        namespace: str,
        vmi: str,
        devices: Sequence[str],
        *,
        request_id: str | None = None,
        node_selector: Mapping[str, str] | None = None,
        only: Iterable[str] | None = None,
        tolerations: Sequence[Toleration] = (),
        priority: Priority = DEFAULT_PRIORITY,
        admission: str | None = None,
    ) -> str:
        """Write what the webhook writes (W3 steps 2 and 3): `attachedTo` (of admission
        `admission`) and the same `bindRequest` (of `priority`, P1) on each device of
        `devices` (or only on `only`, to make a partial request). Returns the request id.
        Raises KeyError for a missing device."""
        request_id = request_id or uuid.uuid4().hex[:12]
        now = self.clock.now()
        br = BindRequest(request_id, vmi, tuple(devices), now, freeze_labels(node_selector),
                         tolerations=tuple(tolerations), priority=priority)
        targets = list(devices) if only is None else list(only)
        for name in targets:
            dev = self._devices[(namespace, name)]
            st = dev.status
            self.put_device(_with_status(dev, DeviceStatus(st.phase, st.node_name, st.bound_at,
                                                           Attachment(vmi, now, admission), br, st.device)))
            self._record("request", (namespace, name), request_id)
        return request_id

    def withdraw(self, namespace: str, request_id: str) -> int:
        """Clear `bindRequest` and `attachedTo` on every device carrying `request_id` (the
        webhook cleaning up after a timeout, W5, or housekeeping, H1). Returns how many."""
        members = list(self._by_request.get((namespace, request_id), {}).values())
        for dev in members:
            st = dev.status
            self.put_device(_with_status(dev, DeviceStatus(st.phase, st.node_name, st.bound_at,
                                                           None, None, st.device)))
            self._record("withdraw", dev.key, request_id)
        return len(members)

    # -- VMIs (only what the leader's victim deletions read: §3c P4) ------------------------

    def add_vmi(self, namespace: str, name: str, admission: str | None = None) -> str:
        """A VMI `namespace/name` exists from now on, admitted as `admission` (its
        `gpu.cozystack.io/admission`), replacing an earlier incarnation of the name. Returns
        its uid (new for every call)."""
        self._uids += 1
        uid = f"uid-{self._uids}"
        self._vmis[(namespace, name)] = (uid, admission)
        return uid

    def vmi(self, namespace: str, name: str) -> tuple[str, str | None] | None:
        """(uid, admission) of the live VMI `namespace/name`; None when there is none."""
        return self._vmis.get((namespace, name))

    def delete_vmi(self, namespace: str, name: str, uid: str | None = None, *, by: str = "binder") -> bool:
        """Delete the VMI `namespace/name`, only when its uid is `uid` (a precondition, as
        the binder's delete carries; None: any). True when deleted; recorded in `history` as
        op `vmi-deleted` (request_id: the uid, message: `by`). The devices are left as they
        are: what housekeeping does after (H2) is the caller's to play."""
        found = self._vmis.get((namespace, name))
        if found is None or (uid is not None and found[0] != uid):
            return False
        del self._vmis[(namespace, name)]
        self.deleted_vmis.append((namespace, name, found[0], found[1], by))
        self._record("vmi-deleted", f"{namespace}/{name}", found[0], message=by)  # type: ignore[arg-type]
        return True

    # -- fault injection -----------------------------------------------------------------

    def fail_next(
        self,
        error: type[WriteError] = TransientWriteError,
        *,
        op: WriteOp | None = None,
        key: DeviceKey | None = None,
        times: int = 1,
        applied: bool = False,
    ) -> None:
        """Make the next `times` matching StatusWriter calls raise `error`; with `applied`,
        the write is applied first (an ambiguous failure)."""
        self._injected.append(_Injected(op, key, error, times, applied))

    # -- NominationWriter (P4) ---------------------------------------------------------------

    async def put(self, nomination: Nomination) -> None:
        """Create or replace the nomination (idempotent; one made later is never replaced:
        RequestWithdrawn, as `k8s.nominations.ApiNominations.put`); an injected fault of op
        `nomination` (key None) raises before (or, `applied`, after) it is stored. Recorded in
        `history` as op `nomination` with the preemptor as key."""
        await anyio.sleep(0)
        inj = self._take_injected("nomination", None)  # type: ignore[arg-type]
        if inj is not None and not inj.applied:
            raise inj.error(f"injected {inj.error.__name__} on nomination {nomination.name}")
        there = self._nominations.get(nomination.name)
        if there is not None and there.created > nomination.created:
            raise RequestWithdrawn(f"nomination {nomination.name}: a later one is recorded")
        if there != nomination:
            self.put_nomination(nomination)
            self._record("nomination", nomination.name, None, node=nomination.node)
        if inj is not None:
            raise inj.error(f"injected {inj.error.__name__} on nomination {nomination.name} (applied)")

    async def delete(self, name: str) -> None:
        """Delete the nomination (gone already: nothing happens). Recorded as op
        `nomination-deleted`."""
        await anyio.sleep(0)
        if name in self._nominations:
            self.remove_nomination(name)
            self._record("nomination-deleted", name, None)

    # -- StatusWriter --------------------------------------------------------------------

    async def answer(self, write: StatusWrite) -> None:
        await self._write_one(write)

    async def write_many(self, writes: Sequence[StatusWrite]) -> list[WriteError | None]:
        """Every write in turn, each with its own faults: one checkpoint for the call, or
        with `Faults.latency` one wait per write (other tasks run between the writes)."""
        latency = self.faults.latency
        if latency <= 0:
            await anyio.sleep(0)
        outcomes: list[WriteError | None] = []
        for w in writes:
            if latency > 0:
                await anyio.sleep(self.rng.uniform(0, latency))
            try:
                self._apply(w)
            except WriteError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        return outcomes

    async def _write_one(self, w: StatusWrite) -> None:
        (error,) = await self.write_many((w,))
        if error is not None:
            raise error

    def _apply(self, w: StatusWrite) -> None:
        """Count, inject faults, check the request id, apply (see the module docstring)."""
        self.writes_attempted += 1
        op, key, f = w.op, w.key, self.faults
        injected = self._take_injected(op, key) if self._injected else None
        if injected is not None and not injected.applied:
            self.writes_failed += 1
            raise injected.error(f"injected {injected.error.__name__} on {op} {key}", key=key)
        if injected is None and (f.error_rate or f.conflict_rate):
            roll = self.rng.random()
            if roll < f.error_rate:
                self.writes_failed += 1
                raise TransientWriteError(f"injected transient error on {op} {key}", key=key)
            if roll < f.error_rate + f.conflict_rate:
                self.writes_failed += 1
                raise WriteConflict(f"injected conflict on {op} {key}", key=key)
        dev = self._devices.get(key)
        if dev is None:
            raise NotFound(f"device {key[0]}/{key[1]} not found", key=key)
        if op == "move":
            self._move(dev, w)
        else:
            self._answer(dev, w)
        if injected is not None:
            self.writes_failed += 1
            raise injected.error(f"injected ambiguous {injected.error.__name__} on {op} {key}", key=key)
        if f.ambiguous_rate and self.rng.random() < f.ambiguous_rate:
            self.writes_failed += 1
            raise TransientWriteError(f"injected ambiguous error on {op} {key} (applied)", key=key)

    def _move(self, dev: GPUDevice, w: StatusWrite) -> None:
        """A defragmenting move (D1, D2): only while the device is still idle on
        `w.from_node` (device mode: recording `w.from_device`); already on `w.node`
        (recording `w.device`) is a no-op. A re-point (`w.node == w.from_node`) changes the
        record alone (DR4). The Event goes to `events`."""
        key, st = dev.key, dev.status
        idle = st.attached_to is None and st.bind_request is None
        if idle and dev.bound_node == w.node and (w.device is None or st.device == w.device):
            return
        if dev.bound_node != w.from_node or not idle or (
                w.device is not None and st.device != w.from_device):
            raise RequestWithdrawn(f"device {key[0]}/{key[1]} is no longer idle on {w.from_node}",
                                   key=key)
        repoint = w.node == w.from_node
        self.put_device(_with_status(dev, DeviceStatus(
            Phase.BOUND, w.node, st.bound_at if repoint else w.bound_at, None, None, w.device)))
        self._record("move", key, w.request_id, node=w.node, message=w.message,
                     from_node=dev.bound_node, moved=not repoint)
        self.events.append((key, "GPUDeviceRepointed" if repoint else "GPUDeviceMoved",
                            w.message))

    def _answer(self, dev: GPUDevice, w: StatusWrite) -> None:
        key = dev.key
        br = dev.status.bind_request
        if br is None or br.id != w.request_id:
            raise RequestWithdrawn(
                f"device {key[0]}/{key[1]} no longer carries request {w.request_id}", key=key
            )
        if br.node is not None and br.node != w.node:
            raise WriteConflict(f"request {w.request_id} already decided for {br.node}", key=key)
        moved = w.bound_at is not None and dev.bound_node != w.node
        st = dev.status
        # status.device (DR2): set by a placement write (None clears it) or a re-point (DR4)
        device = w.device if w.device is not None or w.clear_device else st.device
        if moved or device != st.device or (br.result, br.message, br.node, br.code) != (
                w.result, w.message, w.node, w.code):
            answered = replace(br, result=w.result, message=w.message, node=w.node, code=w.code)
            if moved:
                status = DeviceStatus(Phase.BOUND, w.node, w.bound_at, st.attached_to, answered, device)
            else:
                status = DeviceStatus(st.phase, st.node_name, st.bound_at, st.attached_to, answered,
                                      device)
            self.put_device(_with_status(dev, status))
            self._record(w.op, key, w.request_id, node=w.node, result=w.result, message=w.message,
                         from_node=dev.bound_node, moved=moved)

    def _take_injected(self, op: str, key: DeviceKey) -> _Injected | None:
        for inj in self._injected:
            if (inj.op is None or inj.op == op) and (inj.key is None or inj.key == key):
                inj.times -= 1
                if inj.times <= 0:
                    self._injected.remove(inj)
                return inj
        return None

    # -- internals -----------------------------------------------------------------------

    def _record(self, op: str, key: DeviceKey, request_id: str | None, *, node: str | None = None,
                result: Result | None = None, message: str | None = None,
                from_node: str | None = None, moved: bool = False) -> None:
        self._seq += 1
        if not self.keep_history and self.on_write is None:
            return
        rec = WriteRecord(self._seq, op, key, request_id, node, result, message, from_node, moved)
        if self.keep_history:
            self.history.append(rec)
        if self.on_write is not None:
            self.on_write(rec)

    # -- helpers for tests ---------------------------------------------------------------

    def used(self, node: str, resource: str) -> int:
        """Bound devices on `node` whose class has `resource` (what invariant 1 counts)."""
        return sum(
            1 for d in self._on_node.get(node, {}).values()
            if (c := self._classes.get(d.class_name)) is not None and c.resource_name == resource
        )

    def tenant_bound(self, namespace: str, resource: str) -> int:
        """Bound devices of the tenant of `resource` (what invariant 4 counts)."""
        return sum(
            1 for d in self._devices.values()
            if d.namespace == namespace and d.bound_node is not None
            and (c := self._classes.get(d.class_name)) is not None and c.resource_name == resource
        )


# Writes build new values with the constructors: `dataclasses.replace` costs several times
# more, and the store is on the benchmark's hot path. `test_memory_store_copies_every_field`
# checks these keep every field.


def _with_status(dev: GPUDevice, status: DeviceStatus) -> GPUDevice:
    return GPUDevice(dev.namespace, dev.name, dev.class_name, dev.template_for, status,
                     dev.resource_version, dev.uid, dev.created_at, dev.deleting)


__all__ = ["Faults", "MemoryStore", "WriteRecord"]
