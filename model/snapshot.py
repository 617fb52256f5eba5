"""The cluster as the binder and the webhook see it: an immutable `Snapshot` of nodes, GPU
classes, devices, budgets, namespaces and in-flight reservations (`model.hold.Hold`s: what
decided requests still take), with the capacity, budget
and entitlement questions every decision asks, and `check_order` (W1 for one device; the
whole set is `model.check.check_set`).

A Snapshot is built once (`Snapshot.build`) and never changes; `with_device`,
`with_reservation` and friends return a new one that shares everything untouched. Counting is
done through a private index (Bound devices per node and resource, per tenant and resource,
and schedulable nodes bucketed by free units per resource) built lazily on the first question
and carried over copy-on-write by `with_*`, so a decision never scans every device and looks
at nodes in tightest-fit order.

Conventions: a device is *Bound* when its phase is Bound and it names a node (a Bound device
without `nodeName` counts as Pending); a device whose class is unknown counts against no
resource. Units are devices (one unit of an extended resource per GPUDevice). *Used* units of
a node are its Bound devices plus its `Node.foreign` units (Pods outside the binder, §2).
A node is *placeable* when it is not cordoned, Ready and carries `kubevirt.io/schedulable=true`
(the request-independent part of B3); only placeable nodes are in the free buckets.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping, Sequence

from model.device.dra import device_set
from model.hold import Hold
from model.reasons import BudgetExhausted, ClassNotFound, ClassProblem, DeviceNotFound, NoFreeUnit, NotEntitled, Reason
from model.types import (
    Budget,
    DeviceKey,
    GPUClass,
    GPUDevice,
    Namespace,
    Node,
    Taint,
    Toleration,
    labels_include,
    untolerated,
)



@dataclass(frozen=True, slots=True)
class Order:
    """One device a VMI asks for (W1): a held device by name (`device`), or a new template
    device of `class_name` (`device` None). For a held device that exists, its own class
    governs and `class_name` is ignored. `tolerations` are the VMI's (B3: a node with a taint
    they do not tolerate has no room for it)."""

    namespace: str
    class_name: str
    device: str | None = None
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """Answer of `check_order`/`check_set`: admitted, or not with a typed `reason`
    (`model.reasons`); `node` is a node where the order (or set) fits, chosen
    deterministically (tightest fit, then name)."""

    admitted: bool
    reason: Reason | None = None
    node: str | None = None


class _Static:
    """What `with_*` never changes: nodes, classes, namespaces, budgets, and caches derived
    from them only (memoised on first use, shared by every snapshot of one build)."""

    __slots__ = ("nodes", "classes", "namespaces", "budgets", "alloc", "labels", "class_res",
                 "advertising", "cordoned", "unplaceable", "foreign", "tainted", "views", "_serving", "_entitled",
                 "device_mode")

    def __init__(self, nodes: Iterable[Node], classes: Iterable[GPUClass],
                 namespaces: Iterable[Namespace], budgets: Iterable[Budget]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.classes = {c.name: c for c in classes}
        self.namespaces = {n.name: n for n in namespaces}
        self.budgets: dict[tuple[str, str], int] = {}
        for b in budgets:
            key = (b.namespace, b.resource_name)
            self.budgets[key] = min(b.hard, self.budgets.get(key, b.hard))
        self.alloc = {name: dict(n.allocatable) for name, n in self.nodes.items()}
        self.labels = {name: dict(n.labels) for name, n in self.nodes.items()}
        self.class_res = {c.name: c.resource_name for c in self.classes.values()}
        adv: dict[str, list[str]] = {}
        for name in sorted(self.nodes):
            for res, q in self.alloc[name].items():
                if q > 0:
                    adv.setdefault(res, []).append(name)
        self.advertising = {res: tuple(names) for res, names in adv.items()}
        self.cordoned = frozenset(name for name, n in self.nodes.items() if n.unschedulable)
        self.unplaceable = frozenset(name for name, n in self.nodes.items()
                                     if n.unschedulable or not n.ready or not n.kubevirt_schedulable)
        self.foreign = {(name, res): q for name, n in self.nodes.items() for res, q in n.foreign if q}
        self.tainted = {name: tuple(t for t in n.taints if t.effect in ("NoSchedule", "NoExecute"))
                        for name, n in self.nodes.items()
                        if any(t.effect in ("NoSchedule", "NoExecute") for t in n.taints)}
        self.views = (MappingProxyType(self.nodes), MappingProxyType(self.classes),
                      MappingProxyType(self.namespaces), MappingProxyType(self.budgets))
        self._serving: dict[str, frozenset[str]] = {}
        self._entitled: dict[tuple[str, str], bool] = {}
        self.device_mode = any(c.device_mode for c in self.classes.values())
        """Some class is of device mode (DR1): the records (DR2) are worth carrying over."""

    def serving(self, class_name: str) -> frozenset[str]:
        """Nodes serving the class (allocatable > 0 and labels ⊇ nodeSelector), cordon aside;
        a device-mode class also needs devices of its own on the node (`Node.devices_of`:
        classes on one DeviceClass share its count key, DR1)."""
        found = self._serving.get(class_name)
        if found is None:
            c = self.classes.get(class_name)
            found = frozenset() if c is None else frozenset(
                n for n in self.advertising.get(c.resource_name, ())
                if labels_include(self.labels[n], c.node_selector)
                and (not c.device_mode or self.nodes[n].devices_of(c.name)))
            self._serving[class_name] = found
        return found

    def entitled(self, namespace: str, class_name: str) -> bool:
        key = (namespace, class_name)
        ok = self._entitled.get(key)
        if ok is None:
            c = self.classes.get(class_name)
            ns = self.namespaces.get(namespace)
            ok = c is not None and (c.namespace_selector is None
                                    or c.namespace_selector.matches(ns.labels if ns else ()))
            self._entitled[key] = ok
        return ok


class _Index:
    """Counts of one snapshot. `by_free[res][f]` lists, sorted, the schedulable nodes that
    advertise `res` and have exactly `f` units free. Never mutated once made."""

    __slots__ = ("used", "tenant_bound", "reserved", "tenant_reserved", "by_free")

    def __init__(self, used, tenant_bound, reserved, tenant_reserved, by_free) -> None:
        self.used: dict[tuple[str, str], int] = used
        self.tenant_bound: dict[tuple[str, str], int] = tenant_bound
        self.reserved: dict[tuple[str, str], int] = reserved
        self.tenant_reserved: dict[tuple[str, str], int] = tenant_reserved
        self.by_free: dict[str, dict[int, tuple[str, ...]]] = by_free

    @staticmethod
    def reservation_counts(reservations: Sequence[Hold]):
        reserved: dict[tuple[str, str], int] = {}
        per_request: dict[tuple[str, str, str], int] = {}
        for r in reservations:
            for res, n in r.needs:
                reserved[(r.node, res)] = reserved.get((r.node, res), 0) + n
            for res, n in r.budget_needs:
                key = (r.request_id, r.namespace, res)
                per_request[key] = max(n, per_request.get(key, 0))
        tenant: dict[tuple[str, str], int] = {}
        for (_, ns, res), n in per_request.items():
            tenant[(ns, res)] = tenant.get((ns, res), 0) + n
        return reserved, tenant

    @classmethod
    def build(cls, st: _Static, by_ns: Mapping[str, Mapping[str, GPUDevice]],
              reservations: Sequence[Hold]) -> _Index:
        used: dict[tuple[str, str], int] = dict(st.foreign)
        tenant: dict[tuple[str, str], int] = {}
        class_res = st.class_res
        for ns, devices in by_ns.items():
            for d in devices.values():
                node, res = d.bound_node, class_res.get(d.class_name)
                if node is not None and res is not None:
                    used[(node, res)] = used.get((node, res), 0) + 1
                    tenant[(ns, res)] = tenant.get((ns, res), 0) + 1
        reserved, tenant_reserved = cls.reservation_counts(reservations)
        by_free: dict[str, dict[int, tuple[str, ...]]] = {}
        for res, names in st.advertising.items():
            buckets: dict[int, list[str]] = {}
            for name in names:  # sorted, so every bucket is sorted
                if name not in st.unplaceable:
                    f = st.alloc[name][res] - used.get((name, res), 0) - reserved.get((name, res), 0)
                    buckets.setdefault(f, []).append(name)
            by_free[res] = {f: tuple(v) for f, v in buckets.items()}
        return cls(used, tenant, reserved, tenant_reserved, by_free)

    def derive(self, st: _Static, changes: Sequence[tuple[GPUDevice | None, GPUDevice | None]],
               reservations: Sequence[Hold] | None,
               added: Sequence[Hold] | None = None) -> _Index:
        """The index after `changes` (old, new device pairs) and, when not None, with the
        reservations replaced by `reservations`. `added`, when given, says `reservations` are
        the current ones plus `added`, whose request ids are new (none is current, none is
        repeated): their counts are then added instead of recounting every reservation.
        Copies only the dicts it touches."""
        d_used, d_tenant = self._bound_deltas(st, changes)
        used, tenant, touched = self._with_bound(d_used, d_tenant)
        if added is not None:
            reserved, tenant_reserved = self._with_added(added, touched)
        elif reservations is not None:
            reserved, tenant_reserved = self.reservation_counts(reservations)
            touched |= {k for k in reserved.keys() | self.reserved.keys()
                        if reserved.get(k, 0) != self.reserved.get(k, 0)}
        else:
            reserved, tenant_reserved = self.reserved, self.tenant_reserved
        by_free = self._rebucketed(st, touched, used, reserved)
        return _Index(used, tenant, reserved, tenant_reserved, by_free)

    @staticmethod
    def _bound_deltas(st: _Static, changes: Sequence[tuple[GPUDevice | None, GPUDevice | None]]
                      ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """How `changes` move the Bound counts: per (node, resource) and per (namespace,
        resource), +1 for a device Bound after, -1 for one Bound before (nothing for one
        that stays on the same node with the same class)."""
        d_used: dict[tuple[str, str], int] = {}
        d_tenant: dict[tuple[str, str], int] = {}
        class_res = st.class_res
        for old, new in changes:
            was = old.bound_node if old is not None else None
            now = new.bound_node if new is not None else None
            if was is None:
                if now is None:
                    continue  # Pending (or absent) before and after: counts nothing
            elif was == now and old.class_name == new.class_name:  # type: ignore[union-attr]
                continue  # same node, same class (same key, so same tenant): no count changes
            else:
                res = class_res.get(old.class_name)  # type: ignore[union-attr]
                if res is not None:
                    key = (was, res)
                    d_used[key] = d_used.get(key, 0) - 1
                    key = (old.namespace, res)  # type: ignore[union-attr]
                    d_tenant[key] = d_tenant.get(key, 0) - 1
            if now is not None:
                res = class_res.get(new.class_name)  # type: ignore[union-attr]
                if res is not None:
                    key = (now, res)
                    d_used[key] = d_used.get(key, 0) + 1
                    key = (new.namespace, res)  # type: ignore[union-attr]
                    d_tenant[key] = d_tenant.get(key, 0) + 1
        return d_used, d_tenant

    def _with_bound(self, d_used: dict[tuple[str, str], int], d_tenant: dict[tuple[str, str], int]
                    ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int],
                               set[tuple[str, str]]]:
        """`used` and `tenant_bound` with the deltas applied (copied only when one moves),
        and the (node, resource) keys whose Bound count moved."""
        used, tenant = self.used, self.tenant_bound
        touched = {k for k, v in d_used.items() if v}
        if touched:
            used = dict(used)
            for k in touched:
                used[k] = used.get(k, 0) + d_used[k]
        if any(d_tenant.values()):
            tenant = dict(tenant)
            for k, v in d_tenant.items():
                tenant[k] = tenant.get(k, 0) + v
        return used, tenant, touched

    def _with_added(self, added: Sequence[Hold], touched: set[tuple[str, str]]
                    ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """`reserved` and `tenant_reserved` plus the holds `added` (of new request ids);
        adds the (node, resource) keys they reserve on to `touched`."""
        reserved, tenant_reserved = dict(self.reserved), dict(self.tenant_reserved)
        for r in added:
            for res, n in r.needs:
                key = (r.node, res)
                reserved[key] = reserved.get(key, 0) + n
                if n:
                    touched.add(key)
            slots: dict[str, int] = {}  # as `reservation_counts`: the largest per resource
            for res, n in r.budget_needs:
                slots[res] = max(n, slots.get(res, 0))
            for res, n in slots.items():
                key = (r.namespace, res)
                tenant_reserved[key] = tenant_reserved.get(key, 0) + n
        return reserved, tenant_reserved

    def _rebucketed(self, st: _Static, touched: set[tuple[str, str]],
                    used: dict[tuple[str, str], int], reserved: dict[tuple[str, str], int]
                    ) -> dict[str, dict[int, tuple[str, ...]]]:
        """`by_free` with every placeable node of `touched` moved from the bucket of its free
        units before to the one after (copied only where a node moves)."""
        by_free = self.by_free
        copied: set[str] = set()
        for node, res in touched:
            if node not in st.nodes or node in st.unplaceable:
                continue
            alloc = st.alloc[node].get(res, 0)
            if alloc <= 0:
                continue
            before = alloc - self.used.get((node, res), 0) - self.reserved.get((node, res), 0)
            after = alloc - used.get((node, res), 0) - reserved.get((node, res), 0)
            if before == after:
                continue
            if not copied:
                by_free = dict(by_free)
            if res not in copied:
                by_free[res] = dict(by_free[res])
                copied.add(res)
            buckets = by_free[res]
            old = buckets[before]
            i = bisect.bisect_left(old, node)
            if len(old) == 1:
                del buckets[before]
            else:
                buckets[before] = old[:i] + old[i + 1:]
            new = buckets.get(after, ())
            j = bisect.bisect_left(new, node)
            buckets[after] = new[:j] + (node,) + new[j:]
        return by_free


    def owned(self) -> _Index:
        """A copy whose reservation counts and free buckets `reserve_in_place` may change
        (the device counts stay shared: they are never changed in place)."""
        return _Index(self.used, self.tenant_bound, dict(self.reserved), dict(self.tenant_reserved),
                      {res: dict(b) for res, b in self.by_free.items()})

    def reserve_in_place(self, st: _Static, r: Hold) -> None:
        """Count hold `r` (of a request with no hold counted yet) into this index, changing
        it: what `derive(..., added=(r,))` gives, without copying. Only for an index made by
        `owned` that nobody else reads while it changes."""
        reserved, used, by_free = self.reserved, self.used, self.by_free
        for res, n in r.needs:
            if not n:
                continue
            key = (r.node, res)
            before_held = reserved.get(key, 0)
            reserved[key] = before_held + n
            node = r.node
            if node not in st.nodes or node in st.unplaceable:
                continue
            alloc = st.alloc[node].get(res, 0)
            if alloc <= 0:
                continue
            before = alloc - used.get(key, 0) - before_held
            after = before - n
            buckets = by_free[res]
            old = buckets[before]
            if len(old) == 1:
                del buckets[before]
            else:
                i = bisect.bisect_left(old, node)
                buckets[before] = old[:i] + old[i + 1:]
            new = buckets.get(after, ())
            j = bisect.bisect_left(new, node)
            buckets[after] = new[:j] + (node,) + new[j:]
        slots: dict[str, int] = {}  # as `reservation_counts`: the largest per resource
        for res, n in r.budget_needs:
            slots[res] = max(n, slots.get(res, 0))
        tenant_reserved = self.tenant_reserved
        for res, n in slots.items():
            key = (r.namespace, res)
            tenant_reserved[key] = tenant_reserved.get(key, 0) + n


class _DeviceMap(Mapping[tuple[str, str], GPUDevice]):
    """Read-only view of a snapshot's devices keyed by (namespace, name)."""

    __slots__ = ("_by_ns",)

    def __init__(self, by_ns: Mapping[str, Mapping[str, GPUDevice]]) -> None:
        self._by_ns = by_ns

    def __getitem__(self, key: tuple[str, str]) -> GPUDevice:
        ns, name = key
        return self._by_ns[ns][name]

    def get(self, key: tuple[str, str], default: GPUDevice | None = None) -> GPUDevice | None:  # type: ignore[override]
        """The device of `key`, else `default` (no exception raised and caught on a miss)."""
        inner = self._by_ns.get(key[0])
        return default if inner is None else inner.get(key[1], default)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for ns, devices in self._by_ns.items():
            for name in devices:
                yield (ns, name)

    def __len__(self) -> int:
        return sum(len(d) for d in self._by_ns.values())

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        return key[1] in self._by_ns.get(key[0], {})


class Snapshot:
    """An immutable view of the cluster for one decision (DESIGN.md §2, §3, §6 model).

    Build once with `Snapshot.build`; derive new snapshots with `with_device(s)`,
    `without_device`, `with_reservation`, `without_reservation` (cheap: copy-on-write of the
    touched entries). Safe to share between threads and tasks.
    """

    __slots__ = ("_st", "_by_ns", "_reservations", "_idx", "_rec", "_held", "_memo")

    def __init__(self, st: _Static, by_ns: dict[str, dict[str, GPUDevice]],
                 reservations: tuple[Hold, ...], idx: _Index | None,
                 rec: _Records | None = None, memo: dict | None = None) -> None:
        """Private: use `Snapshot.build`."""
        self._st = st
        self._by_ns = by_ns
        self._reservations = reservations
        self._idx = idx
        self._rec = rec
        self._held: dict[str, list[Hold]] | None = None  # holds naming devices, by node (lazy)
        self._memo = memo

    @classmethod
    def build(cls, *, nodes: Iterable[Node] = (), classes: Iterable[GPUClass] = (),
              devices: Iterable[GPUDevice] = (), budgets: Iterable[Budget] = (),
              namespaces: Iterable[Namespace] = (),
              reservations: Iterable[Hold] = ()) -> Snapshot:
        """A snapshot of these objects. Later duplicates (same name or key) win; several
        budgets of one tenant and resource keep the smallest. O(1) beyond copying the
        inputs: the index is built on the first question."""
        by_ns: dict[str, dict[str, GPUDevice]] = {}
        for d in devices:
            by_ns.setdefault(d.namespace, {})[d.name] = d
        return cls(_Static(nodes, classes, namespaces, budgets), by_ns, tuple(reservations), None,
                   memo={})

    # --- read-only views --------------------------------------------------------------

    @property
    def nodes(self) -> Mapping[str, Node]:
        """Nodes by name (a gone node is simply absent)."""
        return self._st.views[0]

    @property
    def classes(self) -> Mapping[str, GPUClass]:
        """GPUClasses by name."""
        return self._st.views[1]

    @property
    def namespaces(self) -> Mapping[str, Namespace]:
        """Namespaces by name (only those given to `build`)."""
        return self._st.views[2]

    @property
    def budgets(self) -> Mapping[tuple[str, str], int]:
        """Budgets by (namespace, resource name): the smallest hard of each."""
        return self._st.views[3]

    @property
    def devices(self) -> Mapping[tuple[str, str], GPUDevice]:
        """GPUDevices by (namespace, name)."""
        return _DeviceMap(self._by_ns)

    @property
    def reservations(self) -> tuple[Hold, ...]:
        """Holds in flight, in the order they were added."""
        return self._reservations

    def device(self, namespace: str, name: str) -> GPUDevice | None:
        """The device, or None when there is none of that name in `namespace`."""
        return self._by_ns.get(namespace, {}).get(name)

    def devices_in(self, namespace: str) -> Mapping[str, GPUDevice]:
        """The devices of one tenant namespace by name (empty when it has none)."""
        return MappingProxyType(self._by_ns.get(namespace, {}))

    # --- counting ---------------------------------------------------------------------

    def _index(self) -> _Index:
        idx = self._idx
        if idx is None:
            idx = self._idx = _Index.build(self._st, self._by_ns, self._reservations)
        return idx

    def allocatable(self, node: str, resource: str) -> int:
        """`status.allocatable[resource]` of `node`; 0 when the node is gone or lacks it."""
        return self._st.alloc.get(node, {}).get(resource, 0)

    def used(self, node: str, resource: str) -> int:
        """Units of `resource` used on `node`: its Bound devices whose class has `resource`
        plus the node's foreign units (Pods outside the binder, §2)."""
        return self._index().used.get((node, resource), 0)

    def foreign(self, node: str, resource: str) -> int:
        """Units of `resource` that Pods outside the binder request on `node` (§2 capacity)."""
        return self._st.foreign.get((node, resource), 0)

    def reserved(self, node: str, resource: str) -> int:
        """Units of `resource` held on `node` by reservations in flight."""
        return self._index().reserved.get((node, resource), 0)

    def free(self, node: str, resource: str) -> int:
        """allocatable − used − reserved; negative means lost capacity (or over-reservation)."""
        idx = self._index()
        key = (node, resource)
        return self.allocatable(node, resource) - idx.used.get(key, 0) - idx.reserved.get(key, 0)

    def lost_capacity(self, node: str, resource: str) -> bool:
        """True when `node` has more used units of `resource` (Bound devices plus foreign
        Pods) than allocatable (§2)."""
        return self.used(node, resource) > self.allocatable(node, resource)

    def tenant_usage(self, namespace: str, resource: str) -> int:
        """The tenant's Bound devices of `resource` plus budget slots its reservations hold."""
        return sum(self.tenant_counts(namespace, resource))

    def tenant_counts(self, namespace: str, resource: str) -> tuple[int, int]:
        """`tenant_usage` in its two parts: (Bound devices, budget slots held by
        reservations, i.e. being bound)."""
        idx = self._index()
        key = (namespace, resource)
        return idx.tenant_bound.get(key, 0), idx.tenant_reserved.get(key, 0)

    def budget_of(self, namespace: str, resource: str) -> int | None:
        """The tenant's budget of `resource` (smallest quota), or None for no cap."""
        return self._st.budgets.get((namespace, resource))

    def entitled(self, namespace: str, class_name: str) -> bool:
        """True when the class exists and its namespaceSelector (None: all) matches the
        namespace's labels; a namespace absent from the snapshot has no labels."""
        return self._st.entitled(namespace, class_name)

    def serves(self, node_name: str, class_name: str) -> bool:
        """True when the node exists, advertises the class's resource (allocatable > 0) and
        carries the class's nodeSelector labels. A cordon does not matter here."""
        return node_name in self._st.serving(class_name)

    def serving_nodes(self, class_name: str) -> frozenset[str]:
        """Every node serving `class_name` (see `serves`), cordoned ones included."""
        return self._st.serving(class_name)

    def advertising_nodes(self, resource: str) -> tuple[str, ...]:
        """Nodes with allocatable[resource] > 0, sorted by name."""
        return self._st.advertising.get(resource, ())

    def cordoned_nodes(self) -> frozenset[str]:
        """Names of the cordoned nodes (`spec.unschedulable`)."""
        return self._st.cordoned

    def unplaceable_nodes(self) -> frozenset[str]:
        """Names of the nodes that fail the request-independent part of B3: cordoned, not
        Ready, or without `kubevirt.io/schedulable=true`."""
        return self._st.unplaceable

    def untolerated_taints(self, node: str, tolerations: tuple[Toleration, ...]) -> list[Taint]:
        """The NoSchedule/NoExecute taints of `node` none of `tolerations` tolerates (B3:
        kube-scheduler would not place the launcher Pod there); empty for a gone node."""
        taints = self._st.tainted.get(node)
        return untolerated(taints, tolerations) if taints else []

    def has_hard_taints(self, node: str) -> bool:
        """True when `node` carries a NoSchedule or NoExecute taint."""
        return node in self._st.tainted

    def free_buckets(self, resource: str) -> Mapping[int, tuple[str, ...]]:
        """Placeable nodes (see `unplaceable_nodes`) advertising `resource`, grouped by free
        units (each group sorted by name). Read-only; for decisions that walk nodes in
        tightest-fit order. Taints are not looked at here."""
        return self._index().by_free.get(resource, {})

    def node_labels(self, node: str) -> Mapping[str, str]:
        """The labels of `node` as a mapping (empty when gone)."""
        return self._st.labels.get(node, {})

    # --- W1 ---------------------------------------------------------------------------

    def tightest_node(self, class_name: str, need: int = 1, exclude: frozenset[str] = frozenset(),
                      tolerations: tuple[Toleration, ...] | None = None) -> str | None:
        """A placeable node serving `class_name` with at least `need` free units of its
        resource, least free first, then by name; None when there is none. With
        `tolerations` given, a node with a NoSchedule/NoExecute taint they do not tolerate is
        skipped (B3)."""
        res = self._st.class_res.get(class_name)
        if res is None:
            return None
        serving = self._st.serving(class_name)
        buckets = self.free_buckets(res)
        tainted = self._st.tainted
        for f in sorted(k for k in buckets if k >= need):
            for name in buckets[f]:
                if name in serving and name not in exclude:
                    if (tolerations is not None and name in tainted
                            and untolerated(tainted[name], tolerations)):
                        continue
                    return name
        return None

    def check_order(self, order: Order) -> Verdict:
        """W1 for one device of one tenant. Refuses (`model.reasons`), in this order: a held
        device that does not exist (`DeviceNotFound`), a class that does not exist
        (`ClassNotFound`), a class the tenant is not entitled to (`NotEntitled`), a class that
        cannot serve (`ClassProblem`, DR1), no budget
        room when the device is not already Bound (`BudgetExhausted`, adds 1), and no room
        (`NoFreeUnit`):
        admitted when the held device is Bound on a node that serves its class with nothing
        over allocatable there (node = that node), or some schedulable node serving the class
        has a free unit (node = the tightest such node, then by name)."""
        ns, class_name = order.namespace, order.class_name
        device = None
        if order.device is not None:
            device = self.device(ns, order.device)
            if device is None:
                return Verdict(False, DeviceNotFound(order.device))
            class_name = device.class_name
        cls = self._st.classes.get(class_name)
        if cls is None:
            return Verdict(False, ClassNotFound(class_name))
        if not self.entitled(ns, class_name):
            return Verdict(False, NotEntitled(ns, class_name))
        if cls.problem is not None:
            return Verdict(False, ClassProblem(class_name, cls.problem))
        res = cls.resource_name
        bound = device.bound_node if device is not None else None
        if bound is None:
            budget = self.budget_of(ns, res)
            bound, reserved = self.tenant_counts(ns, res)
            if budget is not None and bound + reserved + 1 > budget:
                return Verdict(False, BudgetExhausted(ns, res, bound, budget, 1, reserved))
        elif self.serves(bound, class_name) and self.free(bound, res) >= 0:
            return Verdict(True, node=bound)
        node = self.tightest_node(class_name, 1, tolerations=order.tolerations)
        if node is None:
            return Verdict(False, NoFreeUnit(class_name, res))
        return Verdict(True, node=node)

    # --- deriving ---------------------------------------------------------------------

    def with_devices(self, devices: Iterable[GPUDevice]) -> Snapshot:
        """A snapshot with each device added, or replacing the one of the same key."""
        by_ns = dict(self._by_ns)
        copied: set[str] = set()
        changes: list[tuple[GPUDevice | None, GPUDevice | None]] = []
        for d in devices:
            if d.namespace not in copied:
                by_ns[d.namespace] = dict(by_ns.get(d.namespace, {}))
                copied.add(d.namespace)
            inner = by_ns[d.namespace]
            changes.append((inner.get(d.name), d))
            inner[d.name] = d
        return self._derive(by_ns, changes, None)

    def with_changes(self, devices: Iterable[GPUDevice], gone: Iterable[tuple[str, str]]) -> Snapshot:
        """`with_devices(devices)` then `without_devices(gone)` in one step (one copy of
        each touched namespace, one index update): what a view applies after a batch of
        watch events. A key in both is removed."""
        by_ns = dict(self._by_ns)
        copied: set[str] = set()
        changes: list[tuple[GPUDevice | None, GPUDevice | None]] = []
        for d in devices:
            ns = d.namespace
            if ns not in copied:
                by_ns[ns] = dict(by_ns.get(ns, {}))
                copied.add(ns)
            inner = by_ns[ns]
            changes.append((inner.get(d.name), d))
            inner[d.name] = d
        for ns, name in gone:
            inner = by_ns.get(ns)
            if inner is None or name not in inner:
                continue
            if ns not in copied:
                inner = by_ns[ns] = dict(inner)
                copied.add(ns)
            changes.append((inner.pop(name), None))
        if not changes:
            return self
        return self._derive(by_ns, changes, None)

    def with_device(self, device: GPUDevice) -> Snapshot:
        """A snapshot with `device` added, or replacing the one of the same key."""
        return self.with_devices((device,))

    def without_devices(self, keys: Iterable[tuple[str, str]]) -> Snapshot:
        """A snapshot without the devices of these (namespace, name) keys; keys of no device
        are ignored (itself when none is present)."""
        by_ns = self._by_ns
        copied: set[str] = set()
        changes: list[tuple[GPUDevice | None, GPUDevice | None]] = []
        for ns, name in keys:
            old = by_ns.get(ns, {}).get(name)
            if old is None:
                continue
            if not copied:
                by_ns = dict(by_ns)
            if ns not in copied:
                by_ns[ns] = dict(by_ns[ns])
                copied.add(ns)
            del by_ns[ns][name]
            changes.append((old, None))
        return self._derive(by_ns, changes, None) if changes else self

    def without_device(self, namespace: str, name: str) -> Snapshot:
        """A snapshot without that device (itself when there is none)."""
        return self.without_devices(((namespace, name),))

    def with_reservation(self, reservation: Hold) -> Snapshot:
        """A snapshot with `reservation` added, replacing one of the same request and node."""
        rid = reservation.request_id
        if not any(r.request_id == rid for r in self._reservations):  # a new request: add it
            return self._derive(self._by_ns, (), self._reservations + (reservation,), (reservation,))
        kept = tuple(r for r in self._reservations
                     if (r.request_id, r.node) != (rid, reservation.node))
        return self._derive(self._by_ns, (), kept + (reservation,))

    def with_reservations(self, reservations: Iterable[Hold]) -> Snapshot:
        """The snapshot `with_reservation` gives for each of `reservations` in turn (one
        step when they are of distinct requests, none of them reserved already)."""
        new = tuple(reservations)
        if not new:
            return self
        ids = {r.request_id for r in self._reservations}
        fresh = {r.request_id for r in new}
        if len(fresh) == len(new) and ids.isdisjoint(fresh):
            return self._derive(self._by_ns, (), self._reservations + new, new)
        snap = self
        for r in new:
            snap = snap.with_reservation(r)
        return snap

    def without_reservation(self, request_id: str) -> Snapshot:
        """A snapshot without any reservation of `request_id` (itself when there is none)."""
        kept = tuple(r for r in self._reservations if r.request_id != request_id)
        if len(kept) == len(self._reservations):
            return self
        return self._derive(self._by_ns, (), kept)

    def with_nodes(self, nodes: Iterable[Node]) -> Snapshot:
        """A snapshot whose nodes are exactly `nodes` (leave a gone node out); devices,
        classes, budgets, namespaces and reservations are kept. The index is rebuilt on the
        first question, so this costs one pass over the devices then."""
        st = _Static(nodes, self._st.classes.values(), self._st.namespaces.values(), ())
        st.budgets.update(self._st.budgets)
        return Snapshot(st, self._by_ns, self._reservations, None, self._rec, {})

    def _derive(self, by_ns, changes, reservations, added=None) -> Snapshot:
        idx = self._idx
        if idx is not None:
            idx = idx.derive(self._st, changes, reservations, added)
        rec = self._rec
        if rec is None and self._st.device_mode:
            rec = self._records()  # once here, not once per derived snapshot that asks
        if rec is not None and changes:
            rec = _derive_records(rec, changes)
        memo = self._memo
        if memo is not None:
            touched = _touched_nodes(changes, self._reservations, reservations, added)
            if touched:
                memo = {k: v for k, v in memo.items() if k[0] not in touched}
        return Snapshot(self._st, by_ns, self._reservations if reservations is None else reservations,
                        idx, rec, memo)

    # --- device mode (DR2) ------------------------------------------------------------

    def _records(self) -> _Records:
        rec = self._rec
        if rec is None:
            rec = {}
            for devices in self._by_ns.values():
                for d in devices.values():
                    _add_record(rec, d)
            self._rec = rec
        return rec

    def recorded_devices(self, node: str) -> Mapping[str, tuple[DeviceKey, ...]]:
        """Device mode (DR2): the names of `node`'s devices that Bound GPUDevices on it record
        (`status.device`), each with the keys of the devices recording it (one, unless a bug
        or a hand edit recorded it twice). Empty in count mode."""
        return MappingProxyType(self._records().get(node, {}))

    def node_memo(self) -> dict:
        """Device mode: a memo for answers that depend only on one node (its devices, taken
        devices and taints), the records on it and the reservations naming its devices, keyed
        by tuples whose first item is the node's name (e.g. `model.decide`'s group choice for
        a new set). A snapshot derived by `with_*`/`without_*` keeps the entries of the nodes
        whose records and holds did not change (sharing the memo when none did: an entry is
        true of both, whichever fills it); `with_nodes` and `Snapshot.build` start empty."""
        memo = self._memo
        if memo is None:
            memo = self._memo = {}
        return memo

    def _holds_on(self, node: str) -> list[Hold]:
        """The reservations naming devices of `node` (`Hold.devices`), indexed on first use."""
        held = self._held
        if held is None:
            held = {}
            for r in self._reservations:
                if r.devices:
                    held.setdefault(r.node, []).append(r)
            self._held = held
        return held.get(node, [])

    def held_devices(self, node: str, exclude_request: str | None = None) -> frozenset[str]:
        """Device mode (DR2): names of `node`'s devices held by reservations in flight
        (`Hold.devices`), except those of request `exclude_request`."""
        out: set[str] = set()
        for r in self._holds_on(node):
            if r.request_id != exclude_request:
                out.update(ref.device for _, ref in r.devices)
        return frozenset(out)

    def free_devices(self, node: str, class_name: str, request_id: str | None = None,
                     own: Iterable[DeviceKey] = ()) -> frozenset[str]:
        """Device mode (DR2): the names of the devices of `class_name` on `node`
        (`Node.devices_of`) free for request `request_id` whose members are `own`: not
        tainted NoSchedule/NoExecute, not in `Node.taken_devices`, not recorded by a Bound
        GPUDevice on the node other than `own`, not held by another request's reservation.
        A device recorded by one of `own` is free for it even when a claim the binder made
        allocates it (its own claim, DR5), not when another does (`Node.foreign_claimed`).
        Empty for a gone node or a count-mode class.

        Set operations on the node's `model.dra.DeviceSet` (its names worked out once per
        node): a decision asks this of every eligible node."""
        n = self._st.nodes.get(node)
        if n is None:
            return frozenset()
        devices = n.devices_of(class_name)
        if not devices:
            return frozenset()
        out = device_set(devices).untainted
        recorded = self._records().get(node)
        mine: frozenset[str] | set[str] = frozenset()
        if recorded:
            own_keys = own if isinstance(own, (set, frozenset)) else set(own)
            if own_keys:
                mine = {name for name, keys in recorded.items() if any(k in own_keys for k in keys)}
                others = {name for name, keys in recorded.items()
                          if any(k not in own_keys for k in keys)}
                out = out - others
            else:
                out = out.difference(recorded)
        if self._holds_on(node):
            out = out - self.held_devices(node, request_id)
        taken = n.taken_devices
        if taken:
            # a set's own claim does not take its recorded device from it; another's does
            out = out - (taken - (mine - n.foreign_claimed) if mine else taken)
        return out

    def __repr__(self) -> str:
        return (f"<Snapshot nodes={len(self._st.nodes)} classes={len(self._st.classes)} "
                f"devices={len(self.devices)} reservations={len(self._reservations)}>")


_Records = dict[str, dict[str, tuple[tuple[str, str], ...]]]
"""Per node, the device names Bound GPUDevices on it record, with their keys (DR2)."""


def _touched_nodes(changes, before: tuple[Hold, ...], after: tuple[Hold, ...] | None,
                   added: Sequence[Hold] | None) -> set[str]:
    """The nodes whose records (device `changes`) or device holds (`before` → `after`, with
    `added` the holds only added, when known) differ: their `Snapshot.node_memo` entries go."""
    out: set[str] = set()
    for old, new in changes:
        for d in (old, new):
            if d is not None and d.status.device is not None and d.bound_node is not None:
                out.add(d.bound_node)
    if after is not None:
        if added is not None:
            moved: Iterable[Hold] = added
        else:
            was, now = {id(h) for h in before}, {id(h) for h in after}
            moved = [h for h in after if id(h) not in was] + [h for h in before if id(h) not in now]
        out.update(h.node for h in moved if h.devices)
    return out


def _add_record(rec: _Records, d: GPUDevice) -> None:
    ref = d.status.device
    node = d.bound_node
    if ref is None or node is None:
        return
    on = rec.setdefault(node, {})
    on[ref.device] = on.get(ref.device, ()) + (d.key,)


def _derive_records(rec: _Records, changes) -> _Records:
    """`rec` after `changes` (old, new device pairs), copying only the touched nodes."""
    out = rec
    for old, new in changes:
        o = old is not None and old.status.device is not None and old.bound_node is not None
        n = new is not None and new.status.device is not None and new.bound_node is not None
        if not o and not n:
            continue
        if out is rec:
            out = dict(rec)
        if o:
            node, name = old.bound_node, old.status.device.device
            on = out[node] = dict(out.get(node, {}))
            keys = tuple(k for k in on.get(name, ()) if k != old.key)
            if keys:
                on[name] = keys
            else:
                on.pop(name, None)
        if n:
            node = new.bound_node
            out[node] = dict(out.get(node, {}))
            _add_record(out, new)
    return out


class Reserving:
    """A planner's working snapshot: `snapshot` answers every question; `add(hold)` counts
    one more hold, in place when its request has none counted yet (no copy of the counts
    per hold, which `with_reservation` makes), else through `with_reservation`. For a loop
    that decides, adds the decision's hold, and decides the next request on the result
    (`model.plan.plan_batch`). Each `snapshot` is valid until the next `add`: keep only the
    last one (its counts are the maker's; `start` is never changed)."""

    __slots__ = ("snapshot", "_ids")

    def __init__(self, start: Snapshot) -> None:
        self.snapshot = self._own(start)
        self._ids = {r.request_id for r in start.reservations}

    @staticmethod
    def _own(snap: Snapshot) -> Snapshot:
        return Snapshot(snap._st, snap._by_ns, snap._reservations, snap._index().owned(), snap._rec,
                        None if snap._memo is None else dict(snap._memo))

    def add(self, hold: Hold) -> None:
        """`snapshot = snapshot.with_reservation(hold)`, in place when it can be."""
        snap = self.snapshot
        rid = hold.request_id
        if rid in self._ids:
            self.snapshot = self._own(snap.with_reservation(hold))
            return
        assert snap._idx is not None
        snap._idx.reserve_in_place(snap._st, hold)
        snap._reservations = snap._reservations + (hold,)
        if hold.devices:
            snap._held = None  # indexed again on the next question
            if snap._memo is not None:  # a new dict: snapshots derived before this hold keep theirs
                snap._memo = {k: v for k, v in snap._memo.items() if k[0] != hold.node}
        self._ids.add(rid)
