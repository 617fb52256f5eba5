"""The counts of a snapshot (`model.snapshot.Snapshot`'s private index): Bound devices per
node and resource and per tenant and resource, what reservations in flight hold, and the
placeable nodes bucketed by free units per resource, built once and carried over
copy-on-write as devices and holds change; and the read-only view of a snapshot's devices by
key. Pure; see `model.snapshot` for the conventions (Bound, used, placeable)."""

from __future__ import annotations

import bisect
from typing import Iterator, Mapping, Sequence

from model.hold import Hold
from model.types import GPUDevice


class Index:
    """Counts of one snapshot. `by_free[res][f]` lists, sorted, the schedulable nodes that
    advertise `res` and have exactly `f` units free. Never mutated once made."""

    __slots__ = ("used", "tenant_bound", "reserved", "tenant_reserved", "by_free", "tenant_pc")

    def __init__(self, used, tenant_bound, reserved, tenant_reserved, by_free, tenant_pc=None) -> None:
        self.used: dict[tuple[str, str], int] = used
        self.tenant_bound: dict[tuple[str, str], int] = tenant_bound
        self.reserved: dict[tuple[str, str], int] = reserved
        self.tenant_reserved: dict[tuple[str, str], int] = tenant_reserved
        self.by_free: dict[str, dict[int, tuple[str, ...]]] = by_free
        self.tenant_pc: dict[tuple[str, str], dict[str | None, int]] = {} if tenant_pc is None else tenant_pc
        """Bound devices per (namespace, resource) per recorded PriorityClass (None: none
        recorded), only for the namespaces with a budget scoped on PriorityClass
        (`st.scoped_ns`, P1): empty, and never looked at per device, when there is none."""

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
    def build(cls, st, by_ns: Mapping[str, Mapping[str, GPUDevice]],
              reservations: Sequence[Hold]) -> Index:
        used: dict[tuple[str, str], int] = dict(st.foreign)
        tenant: dict[tuple[str, str], int] = {}
        class_res = st.class_res
        for ns, devices in by_ns.items():
            for d in devices.values():
                node, res = d.bound_node, class_res.get(d.class_name)
                if node is not None and res is not None:
                    used[(node, res)] = used.get((node, res), 0) + 1
                    tenant[(ns, res)] = tenant.get((ns, res), 0) + 1
        tenant_pc: dict[tuple[str, str], dict[str | None, int]] = {}
        for ns in st.scoped_ns:  # P1: only tenants with a scoped budget, counted per class
            for d in by_ns.get(ns, {}).values():
                res = class_res.get(d.class_name)
                if d.bound_node is not None and res is not None:
                    per = tenant_pc.setdefault((ns, res), {})
                    pc = priority_class_of(d)
                    per[pc] = per.get(pc, 0) + 1
        reserved, tenant_reserved = cls.reservation_counts(reservations)
        by_free: dict[str, dict[int, tuple[str, ...]]] = {}
        for res, names in st.advertising.items():
            buckets: dict[int, list[str]] = {}
            for name in names:  # sorted, so every bucket is sorted
                if name not in st.unplaceable:
                    f = st.alloc[name][res] - used.get((name, res), 0) - reserved.get((name, res), 0)
                    buckets.setdefault(f, []).append(name)
            by_free[res] = {f: tuple(v) for f, v in buckets.items()}
        return cls(used, tenant, reserved, tenant_reserved, by_free, tenant_pc)

    def derive(self, st, changes: Sequence[tuple[GPUDevice | None, GPUDevice | None]],
               reservations: Sequence[Hold] | None,
               added: Sequence[Hold] | None = None) -> Index:
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
        tenant_pc = self._with_classes(st, changes) if st.scoped_ns else self.tenant_pc
        return Index(used, tenant, reserved, tenant_reserved, by_free, tenant_pc)

    def _with_classes(self, st, changes: Sequence[tuple[GPUDevice | None, GPUDevice | None]]
                      ) -> dict[tuple[str, str], dict[str | None, int]]:
        """`tenant_pc` after `changes` (P1): -1 for a device Bound before in a namespace with
        a scoped budget, +1 for one Bound after, each under its recorded PriorityClass
        (copied only where a count moves)."""
        scoped, class_res = st.scoped_ns, st.class_res
        deltas: dict[tuple[str, str, str | None], int] = {}
        for old, new in changes:
            for d, sign in ((old, -1), (new, 1)):
                if d is None or d.namespace not in scoped or d.bound_node is None:
                    continue
                res = class_res.get(d.class_name)
                if res is not None:
                    key = (d.namespace, res, priority_class_of(d))
                    deltas[key] = deltas.get(key, 0) + sign
        out = self.tenant_pc
        copied: set[tuple[str, str]] = set()
        for (ns, res, pc), n in deltas.items():
            if not n:
                continue
            if not copied:
                out = dict(out)
            if (ns, res) not in copied:
                out[(ns, res)] = dict(out.get((ns, res), {}))
                copied.add((ns, res))
            out[(ns, res)][pc] = out[(ns, res)].get(pc, 0) + n
        return out

    @staticmethod
    def _bound_deltas(st, changes: Sequence[tuple[GPUDevice | None, GPUDevice | None]]
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

    def _rebucketed(self, st, touched: set[tuple[str, str]],
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


    def with_nodes(self, before, after, changed: set[str]) -> Index:
        """The index after the nodes `changed` changed (added, replaced or gone) from
        `before` to `after` (the snapshot's `_Static`s; classes the same): each one's foreign
        units moved in `used`, and it left every free bucket and, when placeable and
        advertising a resource in `after`, entered the bucket of its free units there. The
        device and reservation counts are kept. Equal to `Index.build` on `after` (what
        `tests/model/test_snapshot_nodes.py` checks). Costs a copy of `used` and of each
        resource's bucket map, and a bisection per changed node and resource: no pass over
        the fleet."""
        used = dict(self.used)
        for node in changed:
            keys = {r for st in (before, after) if node in st.nodes
                    for r, q in st.nodes[node].foreign if q}
            for res in keys:
                delta = after.foreign.get((node, res), 0) - before.foreign.get((node, res), 0)
                if delta:
                    n = used.get((node, res), 0) + delta
                    if n:
                        used[(node, res)] = n
                    else:
                        used.pop((node, res), None)
        by_free = dict(self.by_free)
        resources = set(before.advertising) | set(after.advertising)
        for res in resources:
            if res not in after.advertising:
                by_free.pop(res, None)
                continue
            buckets = dict(by_free.get(res, {}))
            for node in changed:   # out of the bucket `Index.build` put it in on `before`
                if node not in before.nodes or node in before.unplaceable:
                    continue
                alloc = before.alloc[node].get(res, 0)
                if alloc <= 0:
                    continue
                f = alloc - self.used.get((node, res), 0) - self.reserved.get((node, res), 0)
                names = buckets.get(f, ())
                i = bisect.bisect_left(names, node)
                if i < len(names) and names[i] == node:
                    kept = names[:i] + names[i + 1:]
                    if kept:
                        buckets[f] = kept
                    else:
                        del buckets[f]
            for node in sorted(changed):
                if node not in after.nodes or node in after.unplaceable:
                    continue
                alloc = after.alloc[node].get(res, 0)
                if alloc <= 0:
                    continue
                f = alloc - used.get((node, res), 0) - self.reserved.get((node, res), 0)
                names = buckets.get(f, ())
                i = bisect.bisect_left(names, node)
                buckets[f] = names[:i] + (node,) + names[i:]
            by_free[res] = buckets
        return Index(used, self.tenant_bound, self.reserved, self.tenant_reserved, by_free,
                     self.tenant_pc)

    def owned(self) -> Index:
        """A copy whose reservation counts and free buckets `reserve_in_place` may change
        (the device counts stay shared: they are never changed in place)."""
        return Index(self.used, self.tenant_bound, dict(self.reserved), dict(self.tenant_reserved),
                      {res: dict(b) for res, b in self.by_free.items()}, self.tenant_pc)

    def reserve_in_place(self, st, r: Hold) -> None:
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


def priority_class_of(device: GPUDevice) -> str | None:
    """The PriorityClass recorded for `device`'s set (`bindRequest.priorityClassName`, P1):
    what budgets scoped on PriorityClass count it under; None when it records none (no
    bindRequest, or a set of no class)."""
    br = device.status.bind_request
    return None if br is None else br.priority.class_name


class DeviceMap(Mapping[tuple[str, str], GPUDevice]):
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


__all__ = ["DeviceMap", "Index", "priority_class_of"]
