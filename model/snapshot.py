"""The cluster as the binder and the webhook see it: an immutable `Snapshot` of nodes, GPU
classes, devices, budgets, namespaces and in-flight reservations (`model.hold.Hold`s: what
decided requests still take), with the capacity, budget and entitlement questions every
decision asks, and `check_order` (W1 for one device; the whole set is `model.check.check_set`).

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
from typing import Iterable, Mapping

from model.counts import DeviceMap, Index
from model.device.records import NodeMemo, Records, free_devices, held_names, holds_by_node, records_of, touched_nodes
from model.device.seam import CountMode, mode_of
from model.hold import Hold
from model.priority import PriorityClassInfo, PriorityScope
from model.nomination import Nomination
from model.reasons import BudgetExhausted, ClassNotFound, ClassProblem, DeviceNotFound, NoFreeUnit, NotEntitled, Reason
from model.types import (Budget, DeviceKey, GPUClass, GPUDevice, Namespace, Node, Taint, Toleration,
                         labels_include, untolerated)


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


def _swap(members: frozenset[str], changed: set[str], now_in: set[str]) -> frozenset[str]:
    """`members` with the names of `changed` replaced by those of them in `now_in`; the same
    object when nothing moves (most node changes leave a node's cordon and placeability)."""
    if all((n in members) == (n in now_in) for n in changed):
        return members
    return frozenset((members - changed) | now_in)


class _Static:
    """What `with_*` never changes: nodes, classes, namespaces, budgets, and caches derived
    from them only (memoised on first use, shared by every snapshot of one build)."""

    __slots__ = ("nodes", "classes", "namespaces", "budgets", "alloc", "labels", "class_res",
                 "advertising", "cordoned", "unplaceable", "foreign", "tainted", "views", "_serving", "_entitled",
                 "mode", "scoped", "scoped_ns", "priority_classes")

    def __init__(self, nodes: Iterable[Node], classes: Iterable[GPUClass],
                 namespaces: Iterable[Namespace], budgets: Iterable[Budget]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.classes = {c.name: c for c in classes}
        self.namespaces = {n.name: n for n in namespaces}
        self.budgets: dict[tuple[str, str], int] = {}
        scoped: dict[tuple[str, str], list[tuple[int, PriorityScope]]] = {}
        for b in budgets:
            key = (b.namespace, b.resource_name)
            if b.scope is not None:
                scoped.setdefault(key, []).append((b.hard, b.scope))
                continue
            self.budgets[key] = min(b.hard, self.budgets.get(key, b.hard))
        self.scoped: dict[tuple[str, str], tuple[tuple[int, PriorityScope], ...]] = {
            k: tuple(v) for k, v in scoped.items()}
        """Budgets scoped on PriorityClass by (namespace, resource): (hard, scope) each (P1)."""
        self.scoped_ns = frozenset(ns for ns, _ in self.scoped)
        self.priority_classes: Mapping[str, PriorityClassInfo] = MappingProxyType({})
        """The namespaces with a scoped budget: the only ones whose Bound devices the index
        also counts per recorded PriorityClass (`model.counts.Index.tenant_pc`)."""
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
        self.mode: CountMode = mode_of(self.classes.values())
        """The device-mode seam (`model.device.seam`; count mode's null object when no class
        is of device mode, DR1)."""

    @classmethod
    def with_nodes(cls, old: _Static, nodes: dict[str, Node], changed: set[str]) -> _Static:
        """`old` after the nodes `changed` changed: `nodes` is the whole new node map (a
        name of `changed` missing from it is gone). Equal to `_Static(nodes.values(), ...)`
        with `old`'s classes, namespaces and budgets, but the node tables are copied and only
        the changed nodes' entries worked out again; classes, namespaces, budgets, the mode
        and the per-namespace answers are shared (they do not depend on nodes). What a node
        watch event costs on a large fleet (`Snapshot.with_node_changes`): dict copies, no
        pass over every node in Python."""
        st = cls.__new__(cls)
        st.nodes = nodes
        st.classes, st.namespaces, st.budgets = old.classes, old.namespaces, old.budgets
        st.scoped, st.scoped_ns, st.priority_classes = old.scoped, old.scoped_ns, old.priority_classes
        st.mode, st.class_res = old.mode, old.class_res
        st.alloc, st.labels = dict(old.alloc), dict(old.labels)
        foreign, tainted = dict(old.foreign), dict(old.tainted)
        cordoned, unplaceable = set(), set()
        adv_touched: set[str] = set()
        for name in changed:
            was, now = old.nodes.get(name), nodes.get(name)
            if was is not None:
                for res, q in was.foreign:
                    foreign.pop((name, res), None)
                adv_touched.update(r for r, q in was.allocatable if q > 0)
            tainted.pop(name, None)
            if now is None:
                st.alloc.pop(name, None)
                st.labels.pop(name, None)
                continue
            st.alloc[name] = dict(now.allocatable)
            st.labels[name] = dict(now.labels)
            adv_touched.update(r for r, q in now.allocatable if q > 0)
            foreign.update(((name, res), q) for res, q in now.foreign if q)
            hard = tuple(t for t in now.taints if t.effect in ("NoSchedule", "NoExecute"))
            if hard:
                tainted[name] = hard
            if now.unschedulable:
                cordoned.add(name)
            if now.unschedulable or not now.ready or not now.kubevirt_schedulable:
                unplaceable.add(name)
        st.foreign, st.tainted = foreign, tainted
        st.cordoned = _swap(old.cordoned, changed, cordoned)
        st.unplaceable = _swap(old.unplaceable, changed, unplaceable)
        adv = dict(old.advertising)
        for res in adv_touched:
            kept = list(adv.get(res, ()))   # sorted: remove and insert by bisection
            for name in changed:
                i = bisect.bisect_left(kept, name)
                if i < len(kept) and kept[i] == name:
                    del kept[i]
                if st.alloc.get(name, {}).get(res, 0) > 0:
                    bisect.insort(kept, name)
            if kept:
                adv[res] = tuple(kept)
            else:
                adv.pop(res, None)
        st.advertising = adv
        st.views = (MappingProxyType(nodes),) + old.views[1:]
        st._entitled = old._entitled
        st._serving = {}
        for name_, found in old._serving.items():
            c = st.classes.get(name_)
            if c is None:
                continue
            add = {n for n in changed if n in nodes and st.alloc[n].get(c.resource_name, 0) > 0
                   and labels_include(st.labels[n], c.node_selector) and st.mode.serves(nodes[n], c.name)}
            st._serving[name_] = _swap(found, changed, add)
        return st

    def serving(self, class_name: str) -> frozenset[str]:
        """Nodes serving the class (allocatable > 0 and labels ⊇ nodeSelector), cordon aside;
        a device-mode class also needs devices of its own on the node (`CountMode.serves`:
        classes on one DeviceClass share its count key, DR1)."""
        found = self._serving.get(class_name)
        if found is None:
            c = self.classes.get(class_name)
            found = frozenset() if c is None else frozenset(
                n for n in self.advertising.get(c.resource_name, ())
                if labels_include(self.labels[n], c.node_selector)
                and self.mode.serves(self.nodes[n], c.name))
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


class Snapshot:
    """An immutable view of the cluster for one decision (docs/contract.md §2, §3, §6 model).

    Build once with `Snapshot.build`; derive new snapshots with `with_device(s)`,
    `without_device`, `with_reservation`, `without_reservation` (cheap: copy-on-write of the
    touched entries). Safe to share between threads and tasks.
    """

    __slots__ = ("_st", "_by_ns", "_reservations", "_idx", "_rec", "_held", "_memo", "_noms", "_stop")

    def __init__(self, st: _Static, by_ns: dict[str, dict[str, GPUDevice]],
                 reservations: tuple[Hold, ...], idx: Index | None,
                 rec: Records | None = None, memo: NodeMemo | None = None,
                 noms: tuple[Nomination, ...] = (), stop: frozenset[VMIKey] = frozenset()) -> None:
        """Private: use `Snapshot.build`."""
        self._noms, self._stop = noms, stop
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
              reservations: Iterable[Hold] = (),
              priority_classes: Iterable[PriorityClassInfo] = (),
              nominations: Iterable[Nomination] = (), stopping: Iterable[VMIKey] = ()) -> Snapshot:
        """A snapshot of these objects. Later duplicates (same name or key) win; several
        budgets of one tenant and resource keep the smallest (those scoped on PriorityClass
        are kept each, P1). O(1) beyond copying the inputs: the index is built on the first
        question. `nominations` (P4) are carried as they are: they hold nothing until a
        decision counts them (`model.nomination.nomination_holds`, with its `now`); `stopping`
        the VMIs being deleted (P2: no victim)."""
        by_ns: dict[str, dict[str, GPUDevice]] = {}
        for d in devices:
            by_ns.setdefault(d.namespace, {})[d.name] = d
        st = _Static(nodes, classes, namespaces, budgets)
        pcs = {pc.name: pc for pc in priority_classes}
        if pcs:
            st.priority_classes = MappingProxyType(pcs)
        return cls(st, by_ns, tuple(reservations), None, memo=NodeMemo(), noms=tuple(nominations),
                   stop=frozenset(stopping))

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
    def priority_classes(self) -> Mapping[str, PriorityClassInfo]:
        """The cluster's PriorityClasses by name (P1: `model.priority.resolve_priority`)."""
        return self._st.priority_classes

    @property
    def budgets(self) -> Mapping[tuple[str, str], int]:
        """Budgets by (namespace, resource name): the smallest hard of each."""
        return self._st.views[3]

    @property
    def devices(self) -> Mapping[tuple[str, str], GPUDevice]:
        """GPUDevices by (namespace, name)."""
        return DeviceMap(self._by_ns)

    @property
    def nominations(self) -> tuple[Nomination, ...]:
        """Every nomination the view shows (P4), live or expired, in the order given."""
        return self._noms

    def nomination_for(self, namespace: str, vmi: str) -> Nomination | None:
        """The nomination whose preemptor is VMI `namespace/vmi` (one per preemptor), or None."""
        return next((n for n in self._noms if n.is_for(namespace, vmi)), None)

    def with_nominations(self, nominations: Iterable[Nomination]) -> Snapshot:
        """A snapshot whose nominations are exactly `nominations`; everything else shared."""
        return Snapshot(self._st, self._by_ns, self._reservations, self._idx, self._rec, self._memo,
                        tuple(nominations), self._stop)

    @property
    def stopping(self) -> frozenset[VMIKey]:
        """(namespace, name) of the VMIs being deleted (their sets hold on; P2: no victim)."""
        return self._stop

    def with_stopping(self, stopping: Iterable[VMIKey]) -> Snapshot:
        """A snapshot whose VMIs being deleted are exactly `stopping`; everything else shared."""
        return Snapshot(self._st, self._by_ns, self._reservations, self._idx, self._rec, self._memo,
                        self._noms, frozenset(stopping))

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

    def _index(self) -> Index:
        idx = self._idx
        if idx is None:
            idx = self._idx = Index.build(self._st, self._by_ns, self._reservations)
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

    def scoped_budgets(self, namespace: str, resource: str) -> tuple[tuple[int, PriorityScope], ...]:
        """The tenant's budgets of `resource` scoped on PriorityClass (P1): (hard, scope)
        each, in no particular order; empty when it has none."""
        return self._st.scoped.get((namespace, resource), ())

    def scoped_budget_refusal(self, namespace: str, resource: str, priority_class: str | None,
                              pending: int, bound_classes: Iterable[str | None] = ()
                              ) -> BudgetExhausted | None:
        """P1: the first budget of `resource` scoped on PriorityClass that a set of
        `priority_class` (its recorded class; None: none) takes over, as a BudgetExhausted
        naming the scope; None when each has room or none applies. A scoped budget applies
        when its scope matches `priority_class` and counts the tenant's Bound devices
        recorded under a matching class plus such sets' reserved slots. The set adds its
        `pending` members of `resource` and its Bound members recorded under a class the
        scope does not match (`bound_classes`, one per Bound member); adding nothing (a
        move) checks nothing."""
        scoped = self._st.scoped.get((namespace, resource))
        if not scoped:
            return None
        bound_classes = tuple(bound_classes)
        counts = None
        for hard, scope in scoped:
            if not scope.matches(priority_class):
                continue
            adds = pending + sum(1 for c in bound_classes if not scope.matches(c))
            if not adds:
                continue
            if counts is None:
                counts = self._index().tenant_pc.get((namespace, resource), {})
            bound = sum(n for c, n in counts.items() if scope.matches(c))
            reserved = self._scoped_reserved(namespace, resource, scope)
            if bound + reserved + adds > hard:
                return BudgetExhausted(namespace, resource, bound, hard, adds, reserved, scope.describe())
        return None

    def scoped_usage(self, namespace: str, resource: str, scope: PriorityScope) -> int:
        """What counts against a budget of `resource` scoped on `scope` (P1), as
        `scoped_budget_refusal` counts it; 0 when the tenant has no scoped budget of it."""
        if not self._st.scoped.get((namespace, resource)):
            return 0
        counts = self._index().tenant_pc.get((namespace, resource), {})
        return (sum(n for c, n in counts.items() if scope.matches(c))
                + self._scoped_reserved(namespace, resource, scope))

    def _scoped_reserved(self, namespace: str, resource: str, scope: PriorityScope) -> int:
        """Budget slots of `resource` held by the tenant's reservations in flight whose set's
        recorded class matches `scope` (the largest per request, as the index counts them;
        a hold's class is the one its landing members record for its request)."""
        per_request: dict[str, int] = {}
        for r in self._reservations:
            if r.namespace != namespace:
                continue
            n = next((n for res, n in r.budget_needs if res == resource), 0)
            if not n or not scope.matches(self._hold_class(r)):
                continue
            per_request[r.request_id] = max(n, per_request.get(r.request_id, 0))
        return sum(per_request.values())

    def _hold_class(self, hold: Hold) -> str | None:
        """The PriorityClass recorded for `hold`'s request on its landing members (None:
        none, or no member carries the request)."""
        inner = self._by_ns.get(hold.namespace, {})
        for (_, name), _res in hold.landing:
            d = inner.get(name)
            br = d.status.bind_request if d is not None else None
            if br is not None and br.id == hold.request_id:
                return br.priority.class_name
        return None

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
        st.scoped, st.scoped_ns = self._st.scoped, self._st.scoped_ns
        st.priority_classes = self._st.priority_classes
        return Snapshot(st, self._by_ns, self._reservations, None, self._rec, NodeMemo(), self._noms, self._stop)

    def with_node_changes(self, nodes: Iterable[Node], gone: Iterable[str] = ()) -> Snapshot:
        """A snapshot with each of `nodes` added or replacing the node of its name and the
        nodes named in `gone` left out; devices, classes, budgets, namespaces, reservations
        and nominations are kept. What a view applies after node watch events (a Pod, a
        claim or a slice changed what a node has): the index is carried over with only the
        changed nodes recounted (`Index.with_nodes`), and the device-mode memo keeps the
        entries of every other node, so the next decision does not start over on a large
        fleet. Equal to `Snapshot.build` of the same objects."""
        old = self._st
        merged = dict(old.nodes)
        changed: set[str] = set()
        for n in nodes:
            if merged.get(n.name) != n:
                merged[n.name] = n
                changed.add(n.name)
        for name in gone:
            if merged.pop(name, None) is not None:
                changed.add(name)
        if not changed:
            return self
        st = _Static.with_nodes(old, merged, changed)
        idx = self._idx.with_nodes(old, st, changed) if self._idx is not None else None
        memo = self._memo.without(changed) if self._memo is not None else None
        return Snapshot(st, self._by_ns, self._reservations, idx, self._rec, memo, self._noms, self._stop)

    def _derive(self, by_ns, changes, reservations, added=None) -> Snapshot:
        idx = self._idx
        if idx is not None:
            idx = idx.derive(self._st, changes, reservations, added)
        rec = self._st.mode.carry(self._rec, self._records, changes)
        memo = self._memo
        if memo is not None:
            touched = touched_nodes(changes, self._reservations, reservations, added)
            if touched:
                memo = memo.without(touched)
        return Snapshot(self._st, by_ns, self._reservations if reservations is None else reservations,
                        idx, rec, memo, self._noms, self._stop)

    # --- device mode (DR2): what the seam reads -----------------------------------------

    @property
    def mode(self) -> CountMode:
        """The device-mode seam of this snapshot's classes (`model.device.seam`)."""
        return self._st.mode

    def _records(self) -> Records:
        rec = self._rec
        if rec is None:
            rec = self._rec = records_of(self._by_ns)
        return rec

    def recorded_devices(self, node: str) -> Mapping[str, tuple[DeviceKey, ...]]:
        """Device mode (DR2): the names of `node`'s devices that Bound GPUDevices on it record,
        each with the keys of the devices recording it (one, unless a bug or a hand edit
        recorded it twice). Empty in count mode."""
        return MappingProxyType(self._records().get(node, {}))

    def with_own_memo(self) -> Snapshot:
        """This snapshot with a copy of its device-mode memo (`NodeMemo.copy`), for a reader
        in another thread: the memo is filled by whoever reads and shared with the snapshots
        derived from this one, which iterate it (`NodeMemo.without`); filled by a worker
        while the event loop derives, it raised RuntimeError ("dictionary changed size
        during iteration"). Call it on the thread that owns this snapshot."""
        return Snapshot(self._st, self._by_ns, self._reservations, self._idx, self._rec,
                        None if self._memo is None else self._memo.copy(), self._noms,
                        self._stop)

    @property
    def memo(self) -> NodeMemo:
        """Device mode: the memo of answers that depend only on one node, the records on it
        and the holds naming its devices (`model.device.records.NodeMemo`). A snapshot
        derived by `with_*`/`without_*` keeps the entries of the nodes whose records and
        holds did not change; `with_nodes` and `Snapshot.build` start empty."""
        memo = self._memo
        if memo is None:
            memo = self._memo = NodeMemo()
        return memo

    def _holds_on(self, node: str) -> list[Hold]:
        """The reservations naming devices of `node` (`Hold.devices`), indexed on first use."""
        held = self._held
        if held is None:
            held = self._held = holds_by_node(self._reservations)
        return held.get(node, [])

    def held_devices(self, node: str, exclude_request: str | None = None) -> frozenset[str]:
        """Device mode (DR2): names of `node`'s devices held by reservations in flight
        (`Hold.devices`), except those of request `exclude_request`."""
        return held_names(self._holds_on(node), exclude_request)

    def free_devices(self, node: str, class_name: str, request_id: str | None = None,
                     own: Iterable[DeviceKey] = ()) -> frozenset[str]:
        """Device mode (DR2): the names of the devices of `class_name` on `node` free for
        request `request_id` whose members are `own` (`model.device.records.free_devices`:
        not tainted or lost, HL3, taken by a claim, recorded by another device or held by
        another request). Empty for a gone node or a count-mode class."""
        n = self._st.nodes.get(node)
        if n is None or not n.devices_of(class_name):
            return frozenset()
        return free_devices(n, class_name, self._records().get(node), self._holds_on(node),
                            request_id, own, self._st.mode.matches.get(class_name))

    def __repr__(self) -> str:
        return (f"<Snapshot nodes={len(self._st.nodes)} classes={len(self._st.classes)} "
                f"devices={len(self.devices)} reservations={len(self._reservations)}>")


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
                        None if snap._memo is None else snap._memo.copy(), snap._noms, snap._stop)

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
            if snap._memo is not None:  # a new memo: snapshots derived before this hold keep theirs
                snap._memo = snap._memo.without((hold.node,))
        self._ids.add(rid)
