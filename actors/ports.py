"""The small Protocols the actors depend on, and nothing else.

`ClusterView` is the informer cache as the binder reads it (synchronous, in memory,
possibly a little behind the API server); `ChangeFeed` says which keys changed (level
based: a change names a key, the receiver re-reads the view); `StatusWriter` writes the
binder's fields of GPUDevice status (B8); `Clock` gives monotonic and UTC time;
`NodeDirectory` finds the node actor of a node; `NominationWriter` records a nomination (P4)
before the refusal that announces it. The Kubernetes adapter implements the first three and
the last, `fakes.memory_store.MemoryStore` is the fake beside it.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, NamedTuple, Mapping, Protocol, Sequence, runtime_checkable

import anyio

from actors.errors import WriteError
from model.decide import Rule
from model.device.dra import DeviceRef
from model.nomination import Nomination
from model.reasons import Code
from model.types import Budget, DeviceKey, GPUClass, GPUDevice, Namespace, Node, Result

if TYPE_CHECKING:
    from actors.runtime import ActorRef
    from actors.workqueue import WorkQueue
    from model.snapshot import Snapshot

ChangeKind = Literal["node", "device", "class", "budget", "namespace", "priority_class",
                     "nomination"]


class Change(NamedTuple):
    """"This key changed; read the view." `key` is a node/class/namespace name, a device
    (namespace, name), the namespace of a budget, or a PriorityClass name (P1). Carries no
    object on purpose. Immutable;
    a tuple so that hashing it (every change is a key of a coalescing queue) is cheap."""

    kind: ChangeKind
    key: str | DeviceKey


@runtime_checkable
class ClusterView(Protocol):
    """What the binder knows of the cluster: an informer cache with a few indexes.

    Every method is synchronous and cheap, never blocks and never raises for a missing
    object (it returns None or an empty value). Two reads may see different versions of
    the cluster; one object read is always internally consistent, and a later read of the
    same object never shows an older version (per-object order, as a watch gives).
    """

    def node(self, name: str) -> Node | None:
        """The Node, or None when it is gone (deleted or never seen)."""

    def nodes(self) -> Mapping[str, Node]:
        """Every Node by name."""

    def classes(self) -> Mapping[str, GPUClass]:
        """Every GPUClass by name."""

    def device(self, key: DeviceKey) -> GPUDevice | None:
        """The GPUDevice, or None when it is gone."""

    def devices(self) -> Mapping[DeviceKey, GPUDevice]:
        """Every GPUDevice by (namespace, name)."""

    def devices_on(self, node: str) -> tuple[GPUDevice, ...]:
        """The devices Bound to `node` (index on `status.nodeName` of Bound devices)."""

    def request_members(self, namespace: str, request_id: str) -> tuple[GPUDevice, ...]:
        """The devices of `namespace` whose `status.bindRequest.id` is `request_id`
        (index on the id); empty when the request is gone (withdrawn)."""

    def budgets(self) -> tuple[Budget, ...]:
        """Every tenant budget (the smallest quota per namespace and resource; then each
        budget scoped on PriorityClass, P1)."""

    def namespaces(self) -> Mapping[str, Namespace]:
        """Every namespace by name (their labels decide entitlement)."""

    def snapshot(self) -> Snapshot:
        """A model Snapshot of the current view, without reservations."""

    def following(self) -> bool:
        """True while the view follows the API server for devices and classes (their
        informers listed, and no list or watch failed since). False while one relists
        after an outage: the view still holds what it had, and none of what was made
        meanwhile, so "not found" is no answer then."""


@runtime_checkable
class ChangeFeed(Protocol):
    """Notifications of changed keys."""

    def subscribe(self) -> AbstractAsyncContextManager[WorkQueue[Change]]:
        """An async context manager yielding a `actors.workqueue.WorkQueue` of the `Change`s
        made after the subscription started: coalescing (a change of a key already waiting
        is not queued twice; one made while the consumer processes that key comes again
        after its `done`), nothing dropped while subscribed. The consumer takes changes with
        `get`/`get_nowait` and hands each back with `done`. Leaving the context unsubscribes
        (and shuts the queue down)."""


WriteOp = Literal["answer", "move"]
"""The kinds of binder write (names for fault injection and history): `answer` writes a
request's member (B1, B7); `move` a defragmenting move of an idle held device (D2)."""


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """One binder write of one member of a request (B1, B7, B8), as a value:
    `status.bindRequest.{node, result, message, code}` (`code`: the refusal's
    `model.reasons.Code`, None when Succeeded) and, when `bound_at` is set, the placement
    (`phase = Bound`, `nodeName = node`, `boundAt`), all in one write. `node` is None for
    Refused (then `bound_at` is None too). `expect_version` is the device's resourceVersion
    the decision saw (None: unknown); a writer may use it to make the compare-and-set of
    the node without reading the device first.

    Device mode (DR2, DR4): with `device` the write also records `status.device` (with the
    placement, or alone for a member already Bound on `node`: re-pointed, a status write, not
    a move); `clear_device` clears it (null: the member lands on a node without a chosen
    device). Neither: `status.device` is not touched (count mode's writes are unchanged).
    A defragmenting `move` in device mode (D2, DR4) carries `device` (the device to record)
    and `from_device` (the record it expects to find: otherwise RequestWithdrawn); with
    `node == from_node` it is a re-point (the record alone changes)."""

    key: DeviceKey
    request_id: str
    result: Result
    message: str
    node: str | None = None
    bound_at: datetime | None = None
    expect_version: str | None = None
    op: WriteOp = "answer"
    from_node: str | None = None
    code: Code | None = None
    device: DeviceRef | None = None
    clear_device: bool = False
    from_device: DeviceRef | None = None


@runtime_checkable
class StatusWriter(Protocol):
    """Writes the binder's fields of a GPUDevice's status (B8), one device per write.

    Every write is idempotent (writing what is already there is a no-op), checks that the
    device still carries `request_id` as `status.bindRequest.id`, and fails with:
    `RequestWithdrawn` when it does not (nothing written), `NotFound` when the device is
    gone, `WriteConflict` on an optimistic-concurrency conflict (nothing written),
    `TransientWriteError` when it cannot tell whether the write applied (retry is safe).
    Cancellation: the write may or may not have been applied.

    The coordinator writes a request through `write_many`, one write per member; `answer`
    is the same write one at a time, and `write_each` builds `write_many` from it.
    """

    async def answer(self, write: StatusWrite) -> None:
        """Write `write` on its device in one write (see `StatusWrite`): the decided node,
        the placement when `bound_at` is set, and the result. The first such write of a
        request is the durable record that it is decided for `node` (B7). Compare-and-set
        on the node: when the device already records another node for this request (a
        decision made by an earlier leader that this view did not show yet), raises
        `WriteConflict` and writes nothing, so a request is never decided twice."""

    async def write_many(self, writes: Sequence[StatusWrite]) -> list[WriteError | None]:
        """Make every write of `writes` (independent writes, typically one per member of a
        request; they may run concurrently and land in any order). Returns one outcome per
        write, in order: None (applied, or already so) or the `WriteError` it failed with;
        never raises a `WriteError` itself. Cancellation: any subset may have been applied."""


async def write_each(
    writer: StatusWriter, writes: Sequence[StatusWrite], *, limit: int = 16,
    limiter: anyio.CapacityLimiter | None = None,
) -> list[WriteError | None]:
    """`StatusWriter.write_many` built from `writer.answer`: at most `limit` (>= 1) writes
    run at once (one after the other when 1), or, with `limiter`, as many as it lets
    through (share one limiter between calls to bound them together). Returns the
    outcomes in the order of `writes`; a non-`WriteError` exception propagates."""
    outcomes: list[WriteError | None] = [None] * len(writes)

    async def one(i: int, w: StatusWrite) -> None:
        try:
            await writer.answer(w)
        except WriteError as exc:
            outcomes[i] = exc

    if limiter is None:
        if limit <= 1 or len(writes) <= 1:
            for i, w in enumerate(writes):
                await one(i, w)
            return outcomes
        limiter = anyio.CapacityLimiter(limit)

    async def bounded(i: int, w: StatusWrite) -> None:
        async with limiter:
            await one(i, w)

    async with anyio.create_task_group() as tg:
        for i, w in enumerate(writes):
            tg.start_soon(bounded, i, w)
    return outcomes


@runtime_checkable
class NominationWriter(Protocol):
    """Records nominations (docs/contract.md §3c P4) in the API, where a leader change keeps
    them: one `GPUNomination` per preemptor, named `Nomination.name`.

    The status pipeline puts a nomination before it writes the refusal that announces it
    (`preemption_nominated`), so a refusal a tenant sees always has its nomination; the
    leader's preemption worker deletes nominations that expired or whose preemptor is gone
    or admitted."""

    async def put(self, nomination: Nomination) -> None:
        """Create the nomination's object, or find it in place: idempotent. One of the same
        name with another content (an older nomination of the same preemptor, not deleted
        yet) is replaced; one made later (`created`) never is: `RequestWithdrawn` (the
        decision is superseded). Raises `TransientWriteError` when it cannot tell whether the
        object was written (a retry is safe). Cancellation: it may or may not be written."""

    async def delete(self, name: str) -> None:
        """Delete nomination `name`; gone already is success. Raises `TransientWriteError`
        (a retry is safe)."""


@runtime_checkable
class Clock(Protocol):
    """Time for actors: `monotonic()` for deadlines (seconds, same scale as the event
    loop's timers), `now()` for timestamps written to the API (timezone-aware UTC)."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...


class SystemClock:
    """The real clock: `time.monotonic()` (what asyncio's loop uses) and UTC wall time."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


@runtime_checkable
class DecisionObserver(Protocol):
    """Told of every decision the coordinator makes (metrics). Must not block or raise."""

    def decided(self, rule: Rule, result: Result, code: Code | None, seconds: float) -> None:
        """`rule` is the Decision's rule (`model.decide.Rule`: B1, B5a, B5b, B6, refused, or
        ledgers for a refusal by the node actors); `code` the refusal's
        (`model.reasons.Code`; None when Succeeded); `seconds` covers decide, prepare and
        commit of the request."""


@runtime_checkable
class DefragObserver(Protocol):
    """Told of every defragmentation round the coordinator runs (metrics; D4). An observer
    of decisions may also be one (the coordinator checks). Must not block or raise."""

    def defragmented(self, moves: int, largest: Mapping[str, int]) -> None:
        """`moves` handed to the status pipeline by the round (0: nothing helped, or the
        round was given up); `largest` the largest placeable set per class after them
        (devices, by class name)."""


@runtime_checkable
class NodeDirectory(Protocol):
    """Finds node actors. The supervisor implements it; the coordinator uses it."""

    def node_actor(self, node: str) -> ActorRef | None:
        """The node actor of `node`, or None when it has none (node gone or not started).
        The reference stays valid across restarts of the actor."""

    def node_actors(self) -> Mapping[str, ActorRef]:
        """Every node actor by node name."""
