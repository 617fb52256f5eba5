"""The waiting line's words (docs/contract.md §3c P5, `model.line`): why a set may not start
yet although it fits (`BehindInLine`: a set ahead of it in its class's line could start
now on the devices it would take; `NodeReserved`: the node is reserved for a head that
has waited longer than `line.reserveAfter`; `WaitsInLine`: W1's refusal for room of a bare
VMI that put it in the line, retryable), and what `explain` says of a waiting set
(`LinePlace`: its place in each of its classes' lines, the sets ahead, its reservation),
which is not a reason to refuse and has no code. A set in these messages is a `Waiter`.

Pure; imports only `model.reasons.codes`. Plain data (names, priority values, times), so
it needs nothing of `model.line`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import ClassVar

from model.reasons.codes import Code, Reason


def _stamp(t: datetime) -> str:
    """RFC 3339 in UTC, to the second ("2026-12-04T10:00:00Z")."""
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Waiter:
    """A set in a waiting line as messages name it: VMI `namespace/vmi`, its priority
    `priority` (a PriorityClass value, P1) from `priority_class` (None: no class applied),
    and `since`, when it was first refused for room (UTC)."""

    namespace: str
    vmi: str
    priority: int
    priority_class: str | None
    since: datetime

    def render(self) -> str:
        cls = f" {self.priority_class}" if self.priority_class else ""
        return (f"{self.namespace}/{self.vmi} (priority {self.priority}{cls}, "
                f"waiting since {_stamp(self.since)})")

    __str__ = render


@dataclass(frozen=True, slots=True)
class BehindInLine(Reason):
    """P5: `ahead`, at `position` (1: the head) in the line of class `class_name`, could
    start now on node `node` and could start nowhere once this set took its place there: it
    goes first. `unchecked`: more sets ahead could use `node` than one decision judges
    (`model.line.LineSettings.max_decided`); `ahead` is the first not judged."""
    code: ClassVar[Code] = Code.BEHIND_IN_LINE
    class_name: str
    position: int
    ahead: Waiter
    node: str
    unchecked: bool = False

    def render(self) -> str:
        if self.unchecked:
            return (f"more sets waiting ahead in the line of class {self.class_name} could use "
                    f"node {self.node} than one decision checks, from {self.ahead} at position "
                    f"{self.position}; they go first; retry")
        return (f"{self.ahead} waits ahead at position {self.position} in the line of class "
                f"{self.class_name} and could start now on node {self.node}, where this set "
                "would take its room; it goes first; retry")


@dataclass(frozen=True, slots=True)
class NodeReserved(Reason):
    """P5: node `node` is reserved for `holder`, ahead of the set in the line of class
    `class_name` (its head or the set next behind the head, `model.line.RESERVING`; or a holder
    that kept the node after a set of higher priority joined the line ahead of it), which has waited longer than
    `line.reserveAfter` or whose preemption victims on the node have not run
    `preemption.minRuntime` yet (P2): the node takes no new set behind it until it starts."""
    code: ClassVar[Code] = Code.NODE_RESERVED
    node: str
    class_name: str
    holder: Waiter

    def render(self) -> str:
        return (f"node {self.node} is reserved for {self.holder}, ahead of this set in the line of "
                f"class {self.class_name} (waiting longer than line.reserveAfter, or until its "
                f"preemption victims there have run preemption.minRuntime); retry")


@dataclass(frozen=True, slots=True)
class WaitsInLine(Reason):
    """P5 at W1: `refusal` (W1's typed refusal of a bare VMI, for room only) put the set in
    the leader's waiting line (or kept its place there). Unavailable (503) with `retry_after`
    (seconds, `model.line.RETRY_AFTER`) as the answer's `Retry-After`, so that a client that
    honours it (client-go, kubectl) asks again by itself: the place is kept only while the
    attempts come (`grace`, seconds: `line.retryGrace`, at most that long without one). The
    words are `refusal`'s, then the line's."""
    code: ClassVar[Code] = Code.WAITS_IN_LINE
    refusal: Reason
    retry_after: int
    grace: int

    def render(self) -> str:
        return (f"{self.refusal.render()}; the set waits in the line for room: retry after "
                f"{self.retry_after} s (its place is kept while the create is retried, lost after "
                f"{self.grace} s without one)")


@dataclass(frozen=True, slots=True)
class InLine:
    """A set's place in the line of class `class_name`: `position` (1: the head) of
    `length`; `ahead` the first sets ahead of it, head first (at most
    `model.line.MAX_AHEAD_SHOWN`), and `more` ahead not shown."""

    class_name: str
    position: int
    length: int
    ahead: tuple[Waiter, ...] = ()
    more: int = 0

    def render(self) -> str:
        head = f"position {self.position} of {self.length} in the line of class {self.class_name}"
        if not self.ahead:
            return head + " (the head)"
        more = f" and {self.more} more" if self.more else ""
        return f"{head}, behind {', '.join(w.render() for w in self.ahead)}{more}"

    __str__ = render


@dataclass(frozen=True, slots=True)
class LinePlace:
    """What `explain` says of a set waiting for room (P5): the set (`waiter`), its place in
    the line of each of its classes (`lines`, in the set's class order), and `reserved`, the
    node reserved for it (None: none). Not a reason to refuse: no code."""

    waiter: Waiter
    lines: tuple[InLine, ...]
    reserved: str | None = None

    def render(self) -> str:
        text = f"{self.waiter} waits for room: " + "; ".join(i.render() for i in self.lines)
        if self.reserved is not None:
            text += f"; node {self.reserved} is reserved for it"
        return text

    __str__ = render
