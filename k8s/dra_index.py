"""What the cache knows of Dynamic Resource Allocation (docs/contract.md §3b, DR1 and DR2): the
ResourceSlices, ResourceClaims and DeviceClasses the informers hold, indexed incrementally so
a change recomputes only the nodes it touches, and turned into the device-mode fields of each
`model.types.Node`:

- `class_devices`: per device-mode GPUClass, the node's devices (current pool generation,
  node-local) that match its DeviceClass's selectors and its own (DR1);
- `taken_devices`: the node's devices some claim's `status.allocation` lists or a
  NoSchedule/NoExecute device taint covers, its slice's own or a DeviceTaintRule's (DR2; tenants cannot write allocations), and
  `foreign_claimed` those a claim the binder did not make allocates (`model.claim`'s
  managed-by label: a set's own claim does not take its recorded device from it, another's
  does);
- `allocatable[<dc>.deviceclass.resource.k8s.io/devices]`: the node's devices of the
  DeviceClass, and `foreign` of that key: those taken that no Bound GPUDevice records there
  (so the count index, budgets and lost capacity work as in count mode).

No I/O: the cache feeds objects in and asks for a node's fields; `classes` problems (a
DeviceClass that does not exist, a selector that does not compile) are reported per class so
the cache can put them on the GPUClass (`GPUClass.problem`). A malformed slice or claim is
left out and logged by the caller (`SliceError`), never fatal.

Memory (a replica under 350 MiB at 1,000 HGX nodes, `bench dra-memory`): a slice is parsed once, at
the informer's ingest (`parse_slice`), and that one `ResourceSlice` is both what the
informer keeps and what the index holds; `parse_slice` also shares what boards of one kind
repeat (attribute names, (name, value) pairs, a device's whole attribute tuple) through a
bounded table. Selector verdicts are remembered per attribute tuple, so a fleet of identical
boards evaluates each selector once per device position, not once per device
(`bench.dra_memory` measures the bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import Any, Iterable, Mapping

from model.claim import Claim
from model.device.cel import Selector, SelectorError, matches_all
from model.device.dra import (DeviceRef, ResourceSlice, SliceDevice, SliceError,
                              parse_resource_slice, pool_devices)
from model.device.boards import Boards
from model.device.records import recorded_names
from model.device.seam import device_classes, serves_devices
from model.device.taint_rules import TaintRule
from model.types import GPUClass, GPUDevice, dra_resource_name

PoolKey = tuple[str, str]
"""(driver, pool)."""

ERRORS_MAX = 1_000
"""Most selector errors kept between two `drain_errors` calls (the rest are dropped)."""

MATCH_CACHE_MAX = 200_000
"""Most remembered selector verdicts (distinct attribute tuple × class); past it the memo
starts over (a fleet of 1,000 identical HGX boards with three classes needs 24)."""

SHARE_MAX = 100_000
"""Most entries of the table that shares equal names, attribute pairs and attribute tuples
between slices (1,000 HGX boards: about 1,100, mostly their node names, each shared by its
pool, its devices and their refs); past it the table starts over, so what it alone keeps
alive stays bounded (about 15-20 MiB at the very worst: slices of all-distinct attributes
coming and going) and later slices share among themselves again."""


@dataclass(frozen=True, slots=True)
class DeviceClassInfo:
    """A DeviceClass as the binder uses it: its name and compiled CEL selectors; `problem`
    the text of the first selector that does not compile (then it matches nothing)."""

    name: str
    selectors: tuple[Selector, ...]
    problem: str | None = None


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClassInfo:
    """A `resource.k8s.io/v1` DeviceClass dict → DeviceClassInfo (selectors compiled once).
    A selector that does not compile is the class's `problem`, not an exception."""
    name = str((obj.get("metadata") or {}).get("name") or "?")
    compiled: list[Selector] = []
    for i, sel in enumerate(((obj.get("spec") or {}).get("selectors")) or ()):
        expression = ((sel or {}).get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            return DeviceClassInfo(name, (), f"DeviceClass {name}: selectors[{i}] has no CEL expression")
        try:
            compiled.append(Selector.compile(expression))
        except SelectorError as err:
            return DeviceClassInfo(name, (), f"DeviceClass {name}: {err}")
    return DeviceClassInfo(name, tuple(compiled))


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """The device-mode fields of one node (see the module docstring)."""

    class_devices: tuple[tuple[str, tuple[SliceDevice, ...]], ...] = ()
    taken_devices: frozenset[str] = frozenset()
    allocatable: tuple[tuple[str, int], ...] = ()
    foreign: tuple[tuple[str, int], ...] = ()
    foreign_claimed: frozenset[str] = frozenset()


class DraIndex:
    """The incremental index. Feed it with `put_slice`/`remove_slice`, `put_claim`/
    `remove_claim`, `put_device_class`/`remove_device_class`; each returns the node names whose
    fields may have changed. `set_classes` takes the device-mode GPUClasses (all nodes may
    change). `node_fields(node, bound)` computes one node's fields, `bound` being the Bound
    GPUDevices on it (their `status.device` records excuse their own devices from `foreign`).
    `class_problem(cls)` says why a device-mode class cannot serve (None when it can)."""

    def __init__(self) -> None:
        self._slices: dict[str, ResourceSlice] = {}
        self._pool_slices: dict[PoolKey, set[str]] = {}
        self._pool_nodes: dict[PoolKey, set[str]] = {}     # nodes of the current generation
        self._node_devices: dict[str, dict[DeviceRef, SliceDevice]] = {}
        self._claims: dict[tuple[str, str], tuple[DeviceRef, ...]] = {}
        self._not_ours: set[tuple[str, str]] = set()   # claims the binder did not make
        self._allocated_not_ours: dict[DeviceRef, int] = {}
        self._ours_by_ns: dict[DeviceRef, dict[str, int]] = {}  # the binder's, per namespace
        self._allocated: dict[DeviceRef, int] = {}
        self._device_classes: dict[str, DeviceClassInfo] = {}
        self._classes: dict[str, GPUClass] = {}
        # GPUClass name → (its own selector expressions, compiled once: `_own_selectors`)
        self._class_selectors: dict[str, tuple[tuple[str, ...], tuple[Selector, ...] | str]] = {}
        # (class, driver, id of an attribute tuple) → (that tuple, verdict); the tuple is
        # kept so its id is not reused while the entry lives
        self._match_cache: dict[tuple[str, str, int], tuple[tuple, bool]] = {}
        # the sharing table (parse_slice): strings, pairs per type of value, attribute tuples
        self._strings: dict[str, str] = {}
        self._pairs: dict[type, dict[tuple[str, Any], tuple[str, Any]]] = {}
        self._tuples: dict[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]] = {}
        # the topology view of a node's devices of a class -> its one Board (layouts
        # worked out once for every node whose devices look the same)
        self._boards = Boards(BOARDS_MAX)
        self.errors: list[tuple[str, str, str]] = []
        self._rules: dict[str, TaintRule] = {}   # DeviceTaintRules (and the binder's marks)

    # -- slices -----------------------------------------------------------------------------
    def parse_slice(self, obj: Mapping[str, Any]) -> ResourceSlice:
        """A `resource.k8s.io/v1` ResourceSlice dict parsed (`model.device.dra.parse_resource_slice`)
        with what boards of one kind repeat shared with the slices seen before: strings,
        (name, value) attribute pairs and whole attribute tuples (the module docstring's
        memory). When the index holds a slice of that name that is the same, that held value
        is returned (a relist makes no second copy). The cache's informer calls it at ingest
        and keeps the result. Raises SliceError for a malformed slice."""
        parsed = parse_resource_slice(obj)
        if self._shared_count() >= SHARE_MAX:
            self._strings.clear()
            self._pairs.clear()
            self._tuples.clear()
        text = self._text
        parsed = replace(parsed, driver=text(parsed.driver), pool=text(parsed.pool),
                         node=None if parsed.node is None else text(parsed.node),
                         devices=tuple(replace(
                             d, ref=DeviceRef(text(d.ref.driver), text(d.ref.pool),
                                              text(d.ref.device)),
                             node=text(d.node), attributes=self._attributes(d.attributes))
                             for d in parsed.devices))
        held = self._slices.get(parsed.name)
        return held if held is not None and _same_slice(held, parsed) else parsed

    def _shared_count(self) -> int:
        return len(self._strings) + len(self._tuples) + sum(map(len, self._pairs.values()))

    def _text(self, value: str) -> str:
        return self._strings.setdefault(value, value)

    def _attributes(self, attributes: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
        """`attributes` made of shared pairs, and itself shared. Pairs are shared per type
        of value (0 and False are equal in Python, never the same attribute value); a kept
        tuple is taken only when it is made of the very same pairs (so of the same types),
        else this one is used unshared."""
        pairs = []
        for name, value in attributes:
            table = self._pairs.setdefault(type(value), {})
            pair = (self._text(name), self._text(value) if isinstance(value, str) else value)
            pairs.append(table.setdefault(pair, pair))
        mine = tuple(pairs)
        kept = self._tuples.setdefault(mine, mine)
        return kept if all(a is b for a, b in zip(kept, mine)) else mine

    def put_slice(self, obj: Mapping[str, Any] | ResourceSlice) -> set[str]:
        """A ResourceSlice was added or changed: its dict (parsed here) or the value
        `parse_slice` made of it at ingest. Raises SliceError for a malformed dict (the caller
        logs it and calls `remove_slice` with its name). A slice the same as the one held
        (a relist) changes nothing."""
        parsed = obj if isinstance(obj, ResourceSlice) else self.parse_slice(obj)
        old = self._slices.get(parsed.name)
        if old is not None and (old is parsed or _same_slice(old, parsed)):
            return set()
        self._slices[parsed.name] = parsed
        pools = {(parsed.driver, parsed.pool)}
        if old is not None:
            pools.add((old.driver, old.pool))
            if (old.driver, old.pool) != (parsed.driver, parsed.pool):
                self._pool_slices.get((old.driver, old.pool), set()).discard(old.name)
        self._pool_slices.setdefault((parsed.driver, parsed.pool), set()).add(parsed.name)
        return self._rebuild_pools(pools)

    def remove_slice(self, name: str) -> set[str]:
        """A ResourceSlice was deleted (or is malformed now)."""
        old = self._slices.pop(name, None)
        if old is None:
            return set()
        key = (old.driver, old.pool)
        self._pool_slices.get(key, set()).discard(name)
        return self._rebuild_pools({key})

    def _rebuild_pools(self, pools: Iterable[PoolKey]) -> set[str]:
        """Re-derive the devices of `pools` from their slices (`model.device.dra.pool_devices`: the
        highest generation's, DR1)."""
        touched: set[str] = set()
        for key in pools:
            for node in self._pool_nodes.pop(key, set()):
                devices = self._node_devices.get(node, {})
                for ref in [r for r in devices if (r.driver, r.pool) == key]:
                    del devices[ref]
                if not devices:
                    self._node_devices.pop(node, None)
                touched.add(node)
            names = self._pool_slices.get(key, set())
            if not names:
                self._pool_slices.pop(key, None)
                continue
            current = pool_devices(self._slices[n] for n in names)
            for node, devices in current.items():
                self._node_devices.setdefault(node, {}).update((d.ref, d) for d in devices)
            self._pool_nodes[key] = set(current)
            touched |= set(current)
        return touched

    # -- claims -----------------------------------------------------------------------------
    def put_claim(self, key: tuple[str, str], claim: Claim) -> set[str]:
        """A ResourceClaim was added or changed (`model.claim.parse_claim`): its allocation's
        devices are taken (DR2); one the binder made (`Claim.managed`: a set's own claim, not
        a foreign consumer of its recorded devices) is counted per namespace. Raises
        SliceError for an allocation that cannot be read (`Claim.problem`; the caller logs it
        and removes the claim)."""
        if claim.problem is not None:
            raise SliceError(claim.problem)
        refs = claim.allocated
        ours = claim.managed
        old = self._claims.get(key, ())
        if refs == old and (key in self._not_ours) != ours:
            return set()
        self._drop_claim(key)
        if refs:
            self._claims[key] = refs
            for ref in refs:
                self._allocated[ref] = self._allocated.get(ref, 0) + 1
            if not ours:
                self._not_ours.add(key)
                for ref in refs:
                    self._allocated_not_ours[ref] = self._allocated_not_ours.get(ref, 0) + 1
            else:  # by namespace: the binder's claim of a set is in the set's namespace
                for ref in refs:
                    by_ns = self._ours_by_ns.setdefault(ref, {})
                    by_ns[key[0]] = by_ns.get(key[0], 0) + 1
        return self._nodes_of(old + refs)

    def remove_claim(self, key: tuple[str, str]) -> set[str]:
        """A ResourceClaim was deleted."""
        return self._nodes_of(self._drop_claim(key))

    def _drop_claim(self, key: tuple[str, str]) -> tuple[DeviceRef, ...]:
        old = self._claims.pop(key, ())
        ours = key not in self._not_ours
        self._not_ours.discard(key)
        for ref in old:
            into = [(self._allocated, ref)]
            if not ours:
                into.append((self._allocated_not_ours, ref))
            elif ref in self._ours_by_ns:
                into.append((self._ours_by_ns[ref], key[0]))
            for counts, k in into:
                n = counts.get(k, 0) - 1
                if n > 0:
                    counts[k] = n
                else:
                    counts.pop(k, None)
            if ours and not self._ours_by_ns.get(ref, True):
                del self._ours_by_ns[ref]
        return old

    def _nodes_of(self, refs: Iterable[DeviceRef]) -> set[str]:
        """The nodes currently publishing `refs`' pools."""
        out: set[str] = set()
        for ref in refs:
            out |= self._pool_nodes.get((ref.driver, ref.pool), set())
        return out

    # -- device taint rules (DR2) -------------------------------------------------------------
    def put_rule(self, rule: TaintRule) -> set[str]:
        """A DeviceTaintRule (or a mark standing for one, HL2) was added or changed: its
        taint covers the devices its selector picks, as their slices' own taints do."""
        old = self._rules.get(rule.name)
        if old == rule:
            return set()
        self._rules[rule.name] = rule
        return self._rule_nodes(rule, old)

    def remove_rule(self, name: str) -> set[str]:
        """A DeviceTaintRule (or mark) was deleted."""
        old = self._rules.pop(name, None)
        return set() if old is None else self._rule_nodes(old)

    def rules(self) -> tuple[TaintRule, ...]:
        """The rules held, by name."""
        return tuple(self._rules[n] for n in sorted(self._rules))

    def rules_selecting_nothing(self) -> tuple[str, ...]:
        """The names (sorted) of the rules held that select no device published now: no
        selector, or one no current device matches. They taint nothing (DR2); `top` says
        so (issue 41 "Bad input")."""
        published = [ref for devices in self._node_devices.values() for ref in devices]
        return tuple(n for n in sorted(self._rules)
                     if not any(self._rules[n].matches(ref) for ref in published))

    def _rule_nodes(self, *rules: TaintRule | None) -> set[str]:
        """The nodes publishing a device one of `rules` selects."""
        live = [r for r in rules if r is not None and r.selects]
        return {node for node, devices in self._node_devices.items()
                if any(r.matches(ref) for ref in devices for r in live)}

    def _with_rules(self, device: SliceDevice) -> SliceDevice:
        extra = tuple(r.taint for r in self._rules.values() if r.matches(device.ref))
        return replace(device, taints=device.taints + extra) if extra else device

    # -- classes ----------------------------------------------------------------------------
    def put_device_class(self, obj: Mapping[str, Any]) -> set[str]:
        """A DeviceClass was added or changed: every node may change."""
        info = parse_device_class(obj)
        self._device_classes[info.name] = info
        self._match_cache.clear()
        return set(self._node_devices)

    def remove_device_class(self, name: str) -> set[str]:
        """A DeviceClass was deleted."""
        self._device_classes.pop(name, None)
        self._match_cache.clear()
        return set(self._node_devices)

    def set_classes(self, classes: Iterable[GPUClass]) -> set[str]:
        """The GPUClasses now (device-mode ones are kept); returns every node with devices
        when the device-mode set changed, else nothing."""
        classes = list(classes)
        named = {c.name for c in classes}
        for gone in [n for n in self._class_selectors if n not in named]:
            del self._class_selectors[gone]
        wanted = {n: c for n, c in device_classes(classes).items() if c.problem is None}
        if wanted == self._classes:
            return set()
        self._classes = wanted
        for c in wanted.values():
            self._own_selectors(c)
        self._match_cache.clear()
        return set(self._node_devices)

    def _own_selectors(self, cls: GPUClass) -> tuple[Selector, ...] | str:
        """GPUClass `cls`'s own selectors compiled, or the problem of the first that does not
        compile (`spec.selectors: …`); compiled once per class and expressions (`class_problem`
        and `set_classes` both ask)."""
        held = self._class_selectors.get(cls.name)
        if held is not None and held[0] == cls.selectors:
            return held[1]
        compiled: tuple[Selector, ...] | str
        try:
            compiled = tuple(Selector.compile(e) for e in cls.selectors)
        except SelectorError as err:
            compiled = f"spec.selectors: {err}"
        self._class_selectors[cls.name] = (cls.selectors, compiled)
        return compiled

    def class_problem(self, cls: GPUClass) -> str | None:
        """Why device-mode class `cls` cannot serve (DR1 bad input): its DeviceClass does not
        exist or has a selector that does not compile, or its own selector does not compile;
        None when it can (and for count-mode classes)."""
        if not serves_devices(cls) or cls.device_class_name is None:
            return None
        info = self._device_classes.get(cls.device_class_name)
        if info is None:
            return f"DeviceClass {cls.device_class_name} does not exist"
        if info.problem:
            return info.problem
        own = self._own_selectors(cls)
        return own if isinstance(own, str) else None

    # -- answers ----------------------------------------------------------------------------
    def devices(self, node: str) -> tuple[SliceDevice, ...]:
        """Every device of `node`'s current pool generations (sorted by ref), each with the
        taints of the DeviceTaintRules that select it added to its own."""
        found = sorted(self._node_devices.get(node, {}).values(), key=lambda d: d.ref)
        if self._rules:
            found = [self._with_rules(d) for d in found]
        return tuple(found)

    def nodes(self) -> set[str]:
        """Nodes that publish devices now."""
        return set(self._node_devices)

    def _matches(self, what: str, selectors: tuple[Selector, ...], device: SliceDevice) -> bool:
        """Whether `selectors` match `device`, remembered per (class, driver, attribute
        tuple): the CEL view reads nothing else (`SliceDevice.cel_view`), and `parse_slice`
        makes equal attribute tuples one object."""
        attributes = device.attributes
        key = (what, device.ref.driver, id(attributes))
        hit = self._match_cache.get(key)
        if hit is not None and hit[0] is attributes:
            return hit[1]
        if len(self._match_cache) >= MATCH_CACHE_MAX:  # slices replaced many times over
            self._match_cache.clear()
        verdict = matches_all(selectors, device.cel_view())
        self._match_cache[key] = (attributes, verdict.matched)
        if verdict.error is not None and len(self.errors) < ERRORS_MAX:
            self.errors.append((what.split(":", 1)[1], str(device.ref), verdict.error))
        return verdict.matched

    def _foreign_claimed(self, devices: Iterable[SliceDevice], bound: Iterable[GPUDevice]) -> frozenset[str]:
        """The devices some claim other than the recording set's own allocates: a claim the
        binder did not make, or one it made in another namespace than the GPUDevice that
        records the device (a tenant may copy our labels onto a claim of its own under
        `rawResourceNames: allowed`; the binder's claim of a set is in the set's namespace)."""
        if not self._allocated_not_ours and not self._ours_by_ns:
            return frozenset()
        recorders: dict[str, set[str]] = {}
        for dev in bound:
            if dev.status.device is not None:
                recorders.setdefault(dev.status.device.device, set()).add(dev.namespace)
        out = set()
        for d in devices:
            if d.ref in self._allocated_not_ours:
                out.add(d.ref.device)
            elif d.ref in self._ours_by_ns and not set(self._ours_by_ns[d.ref]) <= recorders.get(
                    d.ref.device, set()):
                out.add(d.ref.device)
        return frozenset(out)

    def drain_errors(self) -> list[tuple[str, str, str]]:
        """The selector run-time errors seen since the last call (each once per class and
        set of device attributes while its verdict is remembered): (DeviceClass or GPUClass
        name, the first device seen with those attributes, the CEL error). Such a device
        does not match (as Kubernetes' allocator treats it)."""
        out, self.errors = self.errors, []
        return out

    def node_fields(self, node: str, bound: Iterable[GPUDevice]) -> NodeDevices:
        """The device-mode fields of `node` (module docstring). `bound`: the Bound GPUDevices
        on it (their records excuse their own devices from `foreign`)."""
        devices = self.devices(node)
        if not devices or not self._classes:
            return NodeDevices()
        taken = frozenset(d.ref.device for d in devices
                          if d.ref in self._allocated or d.tainted)
        recorded = recorded_names(bound)
        per_class: list[tuple[str, tuple[SliceDevice, ...]]] = []
        counts: dict[str, tuple[int, int]] = {}
        for name in sorted(self._classes):
            cls = self._classes[name]
            info = self._device_classes.get(cls.device_class_name or "")
            own = self._own_selectors(cls)
            if info is None or info.problem or isinstance(own, str):
                continue
            of_class = [d for d in devices if self._matches("dc:" + info.name, info.selectors, d)]
            res = dra_resource_name(info.name)
            if res not in counts:
                foreign = sum(1 for d in of_class
                              if d.ref.device in taken and d.ref.device not in recorded)
                counts[res] = (len(of_class), foreign)
            mine = tuple(d for d in of_class if not own or self._matches("gc:" + name, own, d))
            per_class.append((name, self._boards.device_set(mine)))
        return NodeDevices(
            class_devices=tuple(per_class),
            taken_devices=taken,
            foreign_claimed=self._foreign_claimed(devices, bound),
            allocatable=tuple(sorted((r, n) for r, (n, _) in counts.items())),
            foreign=tuple(sorted((r, f) for r, (_, f) in counts.items() if f)))


BOARDS_MAX = 4_096
"""Most boards `DraIndex` keeps by the look of the devices (boards of one profile whose uuids
follow the PCI address share one; boards with uuids of their own have one each, a few KiB
with their layouts); past it the table starts over (a Node keeps its own)."""


def _same_slice(a: ResourceSlice, b: ResourceSlice) -> bool:
    """Whether two parsed slices say the same: equal fields, and each device's attribute
    tuple the same shared object (`DraIndex.parse_slice`; equal values of another type,
    0 for False, are a change)."""
    return ((a.name, a.driver, a.pool, a.generation, a.slice_count, a.node)
            == (b.name, b.driver, b.pool, b.generation, b.slice_count, b.node)
            and len(a.devices) == len(b.devices)
            and all(x.ref == y.ref and x.node == y.node and x.attributes is y.attributes
                    and x.taints == y.taints for x, y in zip(a.devices, b.devices)))


__all__ = ["DeviceClassInfo", "DraIndex", "NodeDevices", "SliceError", "parse_device_class"]
