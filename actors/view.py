"""`IndexedView`: a mutable, indexed set of model values that implements the `ClusterView`
and `ChangeFeed` ports. The Kubernetes informer cache feeds it from watch events; the
in-memory store (`fakes.memory_store.MemoryStore`) builds on it. Devices are indexed by
bound node and by bind-request id. The model `Snapshot` is kept up to date incrementally for
device and node changes: they are collected and applied in one step each
(`Snapshot.with_changes`, then `Snapshot.with_node_changes`) by the next `snapshot()`; after
a class, budget or namespace change it is rebuilt lazily.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable, Mapping

from actors.ports import Change, ChangeKind
from actors.workqueue import WorkQueue
from model.priority import PriorityClassInfo
from model.nomination import Nomination
from model.snapshot import Snapshot
from model.types import Budget, DeviceKey, GPUClass, GPUDevice, Namespace, Node, RequestKey


def _always() -> bool:
    return True


class IndexedView:
    """ClusterView + ChangeFeed over model values. Not thread-safe; one event loop.

    Writers call `put_*`/`remove_*` (each emits one `Change`); readers use the ClusterView
    methods. `subscribe()` gives a coalescing `WorkQueue` of `Change`s (one entry per key
    however often it changes before it is taken); see `actors.ports.ChangeFeed`.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._classes: dict[str, GPUClass] = {}
        self._namespaces: dict[str, Namespace] = {}
        self._budgets: dict[tuple[str, str], Budget] = {}
        self._scoped: dict[str, tuple[Budget, ...]] = {}  # budgets scoped on PriorityClass (P1)
        self._priority_classes: dict[str, PriorityClassInfo] = {}
        self._devices: dict[DeviceKey, GPUDevice] = {}
        self._on_node: dict[str, dict[DeviceKey, GPUDevice]] = {}
        self._by_request: dict[RequestKey, dict[DeviceKey, GPUDevice]] = {}
        self._snap: Snapshot | None = None
        self._pending: dict[DeviceKey, GPUDevice | None] = {}  # device changes not yet in _snap
        self._pending_nodes: set[str] = set()  # nodes changed since _snap (applied after devices)
        self._subscribers: list[WorkQueue[Change]] = []
        self._nominations: dict[str, Nomination] = {}  # by object name (P4)
        self._stopping: set[tuple[str, str]] = set()   # VMIs being deleted (P2: no victim)
        self._following: Callable[[], bool] = _always

    def follow_with(self, fn: Callable[[], bool]) -> None:
        """Let `fn()` say whether the view follows the API server (`following`); the
        informer cache passes its informers' health. Default: always."""
        self._following = fn

    def following(self) -> bool:
        """See `actors.ports.ClusterView.following`."""
        return self._following()

    # -- ClusterView -----------------------------------------------------------------
    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def nodes(self) -> Mapping[str, Node]:
        return dict(self._nodes)

    def classes(self) -> Mapping[str, GPUClass]:
        return dict(self._classes)

    def device(self, key: DeviceKey) -> GPUDevice | None:
        return self._devices.get(key)

    def devices(self) -> Mapping[DeviceKey, GPUDevice]:
        return dict(self._devices)

    def devices_on(self, node: str) -> tuple[GPUDevice, ...]:
        return tuple(self._on_node.get(node, {}).values())

    def request_members(self, namespace: str, request_id: str) -> tuple[GPUDevice, ...]:
        return tuple(self._by_request.get((namespace, request_id), {}).values())

    def budgets(self) -> tuple[Budget, ...]:
        """The smallest unscoped budget per (namespace, resource), then every budget scoped
        on PriorityClass (P1)."""
        return tuple(self._budgets.values()) + tuple(b for bs in self._scoped.values() for b in bs)

    def priority_classes(self) -> Mapping[str, PriorityClassInfo]:
        """The cluster's PriorityClasses by name (P1)."""
        return dict(self._priority_classes)

    def namespaces(self) -> Mapping[str, Namespace]:
        return dict(self._namespaces)

    def snapshot(self) -> Snapshot:
        if self._snap is not None and self._pending:
            puts = [d for d in self._pending.values() if d is not None]
            gone = [k for k, d in self._pending.items() if d is None]
            self._snap = self._snap.with_changes(puts, gone)
            self._pending.clear()
        if self._snap is not None and self._pending_nodes:
            names = self._pending_nodes
            self._snap = self._snap.with_node_changes(
                [self._nodes[n] for n in names if n in self._nodes],
                [n for n in names if n not in self._nodes])
            self._pending_nodes = set()
        if self._snap is None:
            self._snap = Snapshot.build(
                nodes=self._nodes.values(), classes=self._classes.values(),
                devices=self._devices.values(), budgets=self.budgets(),
                namespaces=self._namespaces.values(),
                priority_classes=self._priority_classes.values(),
                nominations=self._nominations.values(), stopping=self._stopping)
        return self._snap

    def nominations(self) -> Mapping[str, Nomination]:
        """Every nomination (P4) by object name, live or expired (also on `snapshot()`)."""
        return dict(self._nominations)

    # -- ChangeFeed ------------------------------------------------------------------
    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[WorkQueue[Change]]:
        queue: WorkQueue[Change] = WorkQueue()
        self._subscribers.append(queue)
        try:
            yield queue
        finally:
            self._subscribers.remove(queue)
            queue.shutdown()

    def subscriptions(self) -> int:
        """Subscriptions open now (a wait that ended left none behind)."""
        return len(self._subscribers)

    def emit(self, kind: ChangeKind, key: str | DeviceKey) -> None:
        """Tell every subscriber that `key` of `kind` changed."""
        change = Change(kind, key)
        for queue in self._subscribers:
            queue.add(change)

    # -- writers ---------------------------------------------------------------------
    def put_node(self, node: Node) -> None:
        """Add or replace a Node."""
        if self._nodes.get(node.name) != node:
            self._nodes[node.name] = node
            self._node_changed(node.name)

    def remove_node(self, name: str) -> None:
        """Forget a Node (it is gone)."""
        if self._nodes.pop(name, None) is not None:
            self._node_changed(name)

    def _node_changed(self, name: str) -> None:
        """A node changed: the next `snapshot()` applies it to the current snapshot
        (`Snapshot.with_node_changes`: the other nodes' counts and device-mode answers are
        kept; a Pod, a claim or a slice changes one node at a time), then emit."""
        if self._snap is not None:
            self._pending_nodes.add(name)
        self.emit("node", name)

    def put_class(self, cls: GPUClass) -> None:
        """Add or replace a GPUClass."""
        if self._classes.get(cls.name) != cls:
            self._classes[cls.name] = cls
            self._changed("class", cls.name)

    def remove_class(self, name: str) -> None:
        """Forget a GPUClass."""
        if self._classes.pop(name, None) is not None:
            self._changed("class", name)

    def put_namespace(self, ns: Namespace) -> None:
        """Add or replace a Namespace."""
        if self._namespaces.get(ns.name) != ns:
            self._namespaces[ns.name] = ns
            self._changed("namespace", ns.name)

    def remove_namespace(self, name: str) -> None:
        """Forget a Namespace."""
        if self._namespaces.pop(name, None) is not None:
            self._changed("namespace", name)

    def set_budgets(self, namespace: str, budgets: list[Budget]) -> None:
        """Replace every budget of `namespace` (the smallest hard per resource is kept of
        those on every set; those scoped on PriorityClass are kept each, P1)."""
        fresh: dict[tuple[str, str], Budget] = {}
        scoped = tuple(b for b in budgets if b.scope is not None)
        for b in budgets:
            if b.scope is not None:
                continue
            k = (namespace, b.resource_name)
            if k not in fresh or b.hard < fresh[k].hard:
                fresh[k] = b
        old = {k: v for k, v in self._budgets.items() if k[0] == namespace}
        if old != fresh or self._scoped.get(namespace, ()) != scoped:
            for k in old:
                del self._budgets[k]
            self._budgets.update(fresh)
            if scoped:
                self._scoped[namespace] = scoped
            else:
                self._scoped.pop(namespace, None)
            self._changed("budget", namespace)

    def put_priority_class(self, pc: PriorityClassInfo) -> None:
        """Add or replace a PriorityClass (P1)."""
        if self._priority_classes.get(pc.name) != pc:
            self._priority_classes[pc.name] = pc
            self._changed("priority_class", pc.name)

    def remove_priority_class(self, name: str) -> None:
        """Forget a PriorityClass."""
        if self._priority_classes.pop(name, None) is not None:
            self._changed("priority_class", name)
    def put_nomination(self, nomination: Nomination) -> None:
        """Add or replace a nomination (P4); the snapshot carries it from the next
        `snapshot()` (devices and counts are kept: nothing is rebuilt)."""
        if self._nominations.get(nomination.name) != nomination:
            self._nominations[nomination.name] = nomination
            self._nominations_changed(nomination.name)

    def remove_nomination(self, name: str) -> None:
        """Forget a nomination (deleted)."""
        if self._nominations.pop(name, None) is not None:
            self._nominations_changed(name)

    def set_stopping(self, namespace: str, vmi: str, stopping: bool) -> None:
        """Whether VMI `namespace/vmi` is being deleted (`metadata.deletionTimestamp`; False
        also when it is gone): `Snapshot.stopping` from the next `snapshot()` (P2: such a
        set is no victim). Nothing is rebuilt; no change is emitted (no decision waits on it)."""
        key = (namespace, vmi)
        if (key in self._stopping) == stopping:
            return
        (self._stopping.add if stopping else self._stopping.discard)(key)
        if self._snap is not None:
            self._snap = self._snap.with_stopping(self._stopping)

    def _nominations_changed(self, name: str) -> None:
        if self._snap is not None:
            self._snap = self._snap.with_nominations(self._nominations.values())
        self.emit("nomination", name)

    def put_device(self, dev: GPUDevice) -> None:
        """Add or replace a GPUDevice, keeping the indexes current (and the snapshot, at the
        next `snapshot()`)."""
        key = (dev.namespace, dev.name)
        node = dev.bound_node
        br = dev.status.bind_request
        old = self._devices.get(key)
        if old is not None:  # `_unindex`, inlined (the hot path of every write and event)
            was = old.bound_node
            if was is not None:
                bucket = self._on_node.get(was)
                if bucket is not None:
                    bucket.pop(key, None)
                    if not bucket and was != node:
                        del self._on_node[was]
            obr = old.status.bind_request
            if obr is not None:
                bucket = self._by_request.get((key[0], obr.id))
                if bucket is not None:
                    bucket.pop(key, None)
                    if not bucket and (br is None or br.id != obr.id):
                        del self._by_request[(key[0], obr.id)]
        self._devices[key] = dev
        if node is not None:
            self._on_node.setdefault(node, {})[key] = dev
        if br is not None:
            self._by_request.setdefault((key[0], br.id), {})[key] = dev
        if self._snap is not None:
            self._pending[key] = dev
        change = Change("device", key)
        for queue in self._subscribers:
            queue.add(change)

    def remove_device(self, key: DeviceKey) -> None:
        """Forget a GPUDevice (deleted)."""
        if key not in self._devices:
            return
        self._unindex(key)
        del self._devices[key]
        if self._snap is not None:
            self._pending[key] = None
        self.emit("device", key)

    # -- internals -------------------------------------------------------------------
    def _changed(self, kind: ChangeKind, key: str) -> None:
        """A node, class, namespace or budget changed: drop the snapshot, then emit."""
        self._snap = None
        self._pending.clear()
        self._pending_nodes = set()
        self.emit(kind, key)

    def _unindex(self, key: DeviceKey) -> None:
        old = self._devices.get(key)
        if old is None:
            return
        if old.bound_node is not None:
            bucket = self._on_node.get(old.bound_node)
            if bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del self._on_node[old.bound_node]
        br = old.status.bind_request
        if br is not None:
            bucket = self._by_request.get((key[0], br.id))
            if bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del self._by_request[(key[0], br.id)]
