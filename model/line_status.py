"""The waiting line as the API shows it (docs/contract.md §3c P5, docs/api.md): a bounded
summary of each class's line in its GPUClass's `status.line`, written by the leader from its
coordinator's `model.line.Line`, read back by `gpu-binder top` and `explain` (which read the
cluster, not the leader's memory). As Kueue's ClusterQueue `pendingWorkloadsStatus`: the
length, the oldest wait and the first `SHOWN` sets, never the whole line.

- `ClassLine`, `Shown`: one class's summary and one set in it.
- `summarize`: the summary of every class that has a line (a `Line` and its reservations).
- `line_to_status` / `parse_line_status` / `published_lines`: the API shape (`status.line`)
  and back, one class or every class of raw GPUClass objects (tolerant: a malformed summary
  reads as none, never an error: it only informs).
- `place_in`: what `explain` says of a set from the published summaries (`Published`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from model.line import MAX_AHEAD_SHOWN, Entry, Identity, Line
from model.reasons import InLine, LinePlace, Waiter
from model.serialize import format_time, parse_time

SHOWN = 20
"""The most sets a class's `status.line` lists (head first); `length` counts them all."""

VM_KIND = "VirtualMachine"
VMI_KIND = "VirtualMachineInstance"


@dataclass(frozen=True, slots=True)
class Shown:
    """One set in a published line: `position` (1: the head), VMI `namespace/name` and
    `kind` (`VM_KIND` when a VirtualMachine owns it: the VMI has the VM's name; else
    `VMI_KIND`), its `priority` (a PriorityClass value) and `priority_class` (None: no class
    applied), `gpus` the devices of its whole set, `since` when it was first refused for room
    (UTC), `reserved` the node reserved for it (`line.reserveAfter`; None: none)."""

    position: int
    namespace: str
    name: str
    kind: str
    priority: int
    priority_class: str | None
    gpus: int
    since: datetime
    reserved: str | None = None

    def waiter(self) -> Waiter:
        """How messages name this set (`model.reasons.Waiter`)."""
        return Waiter(self.namespace, self.name, self.priority, self.priority_class, self.since)


@dataclass(frozen=True, slots=True)
class ClassLine:
    """The summary of the line of class `class_name`: `length` sets wait, the longest since
    `oldest` (the earliest first refusal, UTC; not always the head's: priority goes first),
    and `shown` the first of them (at most `SHOWN`), head first."""

    class_name: str
    length: int
    oldest: datetime
    shown: tuple[Shown, ...]

    def find(self, namespace: str, name: str) -> Shown | None:
        """The set `namespace/name` among `shown`, None when not shown."""
        return next((s for s in self.shown if (s.namespace, s.name) == (namespace, name)), None)


def _gpus(e: Entry) -> int:
    return len(e.shape.held) + sum(n for _, n in e.shape.templates)


def summarize(line: Line, reservations: Mapping[Identity, str] | None = None,
              shown: int = SHOWN) -> dict[str, ClassLine]:
    """The summary of each class that has a line (`Line.classes`), by class name: its length,
    oldest first refusal and first `shown` entries with their positions and reservations
    (`reservations`, from `model.line.reservation`). Classes nobody waits in are absent."""
    reserved = {ident.key: node for ident, node in (reservations or {}).items()}
    out: dict[str, ClassLine] = {}
    for c in line.classes:
        es = line.of_class(c)
        listed = tuple(
            Shown(i, e.identity.namespace, e.identity.vmi,
                  VM_KIND if e.identity.vm_uid is not None else VMI_KIND, e.priority.value,
                  e.priority.class_name, _gpus(e), e.first_refused, reserved.get(e.identity.key))
            for i, e in enumerate(es[:shown], 1))
        out[c] = ClassLine(c, len(es), min(e.first_refused for e in es), listed)
    return out


def line_to_status(summary: ClassLine) -> dict:
    """`summary` as the API's `status.line` (camelCase; times RFC 3339 'Z'; every key always
    present, `reservedNode` and `priorityClassName` only when set, so that a merge patch of
    the whole object leaves nothing of an earlier one behind)."""
    entries = []
    for s in summary.shown:
        item: dict[str, Any] = {"position": s.position, "namespace": s.namespace, "name": s.name,
                                "kind": s.kind, "priority": s.priority, "gpus": s.gpus,
                                "since": format_time(s.since)}
        if s.priority_class:
            item["priorityClassName"] = s.priority_class
        if s.reserved:
            item["reservedNode"] = s.reserved
        entries.append(item)
    return {"length": summary.length, "oldestSince": format_time(summary.oldest),
            "entries": entries}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def published_lines(classes: Iterable[Any]) -> dict[str, ClassLine]:
    """The line of each class as its GPUClass's `status.line` says, from the raw GPUClass
    objects `classes` (`parse_line_status`); a class with none, or a malformed one, is left
    out."""
    out = {}
    for raw in classes:
        meta = raw.get("metadata") if isinstance(raw, Mapping) else None
        status = raw.get("status") if isinstance(raw, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if isinstance(name, str) and isinstance(status, Mapping):
            got = parse_line_status(name, status.get("line"))
            if got is not None:
                out[name] = got
    return out


def parse_line_status(class_name: str, value: Any) -> ClassLine | None:
    """A GPUClass's `status.line` (as `line_to_status` writes it) read back; None when absent,
    empty or malformed (it only informs: a reader then says nothing of the line). Entries
    that do not parse are left out."""
    if not isinstance(value, Mapping):
        return None
    length, oldest = _int(value.get("length")), parse_time(value.get("oldestSince"))
    if length is None or length < 1 or oldest is None:
        return None
    shown = []
    for raw in value.get("entries") or []:
        if not isinstance(raw, Mapping):
            continue
        pos, prio, gpus, since = (_int(raw.get("position")), _int(raw.get("priority")),
                                  _int(raw.get("gpus")), parse_time(raw.get("since")))
        ns, name, kind = raw.get("namespace"), raw.get("name"), raw.get("kind")
        if (pos is None or prio is None or gpus is None or since is None
                or not isinstance(ns, str) or not isinstance(name, str)):
            continue
        pc, node = raw.get("priorityClassName"), raw.get("reservedNode")
        shown.append(Shown(pos, ns, name, kind if kind in (VM_KIND, VMI_KIND) else VMI_KIND, prio,
                           pc if isinstance(pc, str) and pc else None, gpus, since,
                           node if isinstance(node, str) and node else None))
    return ClassLine(class_name, length, oldest, tuple(sorted(shown, key=lambda s: s.position)))


@dataclass(frozen=True, slots=True)
class Beyond:
    """The set is not among the `shown` sets published of the `length` waiting in the line
    of class `class_name`: it waits further back, or not at all."""

    class_name: str
    length: int
    shown: int

    def render(self) -> str:
        return (f"not among the first {self.shown} of the {self.length} sets waiting in the line "
                f"of class {self.class_name} (the status lists the first {self.shown}): further "
                "back, or not waiting")

    __str__ = render


@dataclass(frozen=True, slots=True)
class Published:
    """What the published lines say of one set (`place_in`): `place` its place where it is
    listed (`model.reasons.LinePlace`, None when listed in none), `beyond` the lines of its
    classes that list others but not it, `empty` its classes nobody waits in."""

    place: LinePlace | None
    beyond: tuple[Beyond, ...] = ()
    empty: tuple[str, ...] = ()


def place_in(lines: Mapping[str, ClassLine], namespace: str, name: str,
             classes: tuple[str, ...]) -> Published:
    """The place of set `namespace/name` in the published lines of its `classes`: for each
    class listing it, its position of the length and the sets listed ahead (head first, at
    most `model.line.MAX_AHEAD_SHOWN` named, the rest counted), and the node reserved for it;
    for each class whose line does not list it, `Beyond`; classes with no line, `empty`."""
    found: list[InLine] = []
    beyond: list[Beyond] = []
    empty: list[str] = []
    me: Shown | None = None
    for c in classes:
        cl = lines.get(c)
        if cl is None:
            empty.append(c)
            continue
        s = cl.find(namespace, name)
        if s is None:
            beyond.append(Beyond(c, cl.length, len(cl.shown)))
            continue
        me = me or s
        ahead = [x for x in cl.shown if x.position < s.position]
        named = tuple(x.waiter() for x in ahead[:MAX_AHEAD_SHOWN])
        found.append(InLine(c, s.position, cl.length, named, s.position - 1 - len(named)))
    if me is None:
        return Published(None, tuple(beyond), tuple(empty))
    place = LinePlace(me.waiter(), tuple(found), me.reserved)
    return Published(place, tuple(beyond), tuple(empty))


__all__ = ["Beyond", "ClassLine", "Published", "SHOWN", "Shown", "VMI_KIND", "VM_KIND", "line_to_status",
           "parse_line_status", "place_in", "published_lines", "summarize"]
