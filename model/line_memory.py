"""The waiting line read back after a failover (docs/contract.md §3c P5, *Failover keeps the
published places*): a new leader's coordinator (or one its supervisor restarted) starts with
an empty line; a waiting VM's place comes back from its status (`model.vm_line`), a bare
VMI's from the summary the leader published in its GPUClass's `status.line`
(`model.line_status`: the first `SHOWN` sets of each class with their first refusal).

- `Recalled`: the first refusals of the bare VMIs (kind VMI) the summaries list, by
  (namespace, name), usable until a deadline.
- `recalled`: read at a coordinator's start, usable for `line.retryGrace` from then.
- `recall`: the line with those first refusals given to the bare VMIs refused again (each
  used once), or the line as it is once the deadline passed.
- `trust_published`: whether the summaries a previous leader left are recent enough to be
  read (its Lease renewed shortly before this replica took it).

Pure: no I/O, no wall clock (every time is an argument, UTC).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Mapping

from model.line import Entry, Identity, Line
from model.line_status import VMI_KIND, ClassLine

_NEVER = datetime.min.replace(tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class Recalled:
    """What a coordinator remembers of the published line (P5): `since` the first refusal the
    summaries gave each bare VMI, by (namespace, VMI name), and `until` the last moment one
    may be used (UTC). Empty (falsy) when nothing is left to use."""

    since: Mapping[tuple[str, str], datetime] = field(default_factory=dict)
    until: datetime = _NEVER

    def __bool__(self) -> bool:
        return bool(self.since)


NOTHING = Recalled()
"""Nothing to recall (P5 off, no summary, or all of it used or past its deadline)."""


def recalled(lines: Mapping[str, ClassLine], start: datetime, grace: timedelta) -> Recalled:
    """The first refusals `lines` (`model.line_status.published_lines` of the GPUClasses,
    read at a coordinator's `start`) give the bare VMIs they list (kind `VMI_KIND`; a VM's
    place comes back from its own status, `model.vm_line.vm_entries`), usable until `start` +
    `grace` (`line.retryGrace`: the coordinator takes its start for the last attempt it saw
    of each, so a set not refused again within the grace it gives any waiting bare VMI has
    stopped, and its place is gone as it would be in a running line). A set listed in the
    lines of several classes: the latest of its times (never earlier than any summary
    says). Sets past the first `SHOWN` of a class are not published: they are not here."""
    since: dict[tuple[str, str], datetime] = {}
    for cl in lines.values():
        for s in cl.shown:
            if s.kind != VMI_KIND:
                continue
            key = (s.namespace, s.name)
            since[key] = max(since.get(key, s.since), s.since)
    return Recalled(since, start + grace) if since else NOTHING


def recall(memory: Recalled, line: Line, now: datetime) -> tuple[Line, Recalled]:
    """`line` with each bare VMI's entry (no VM uid) that `memory` lists under its
    (namespace, VMI name) first refused at the remembered time, unless its own first refusal
    is earlier (so never later than its refusal now, never earlier than the summary said;
    its place among equal priorities is the published one), and `memory` without those
    names: each is used once, so a set that leaves the line later and is refused again
    enters anew. Past `memory.until` (`now` after it) the line as it is and `NOTHING`: an old
    summary gives no new create of the same name an old place. The same Line when nothing
    changed. Pure; never raises."""
    if not memory:
        return line, memory
    if now > memory.until:
        return line, NOTHING
    used: set[tuple[str, str]] = set()
    earlier: dict[tuple[str, str], Entry] = {}
    for key, since in memory.since.items():  # a few per class (SHOWN): never a pass over the line
        e = line.find(Identity(*key))
        if e is None or e.identity.vm_uid is not None:
            continue
        used.add(key)
        if since < e.first_refused:
            earlier[key] = replace(e, first_refused=since)
    if not used:
        return line, memory
    left = {k: t for k, t in memory.since.items() if k not in used}
    new = Line(earlier.get(e.identity.key, e) for e in line) if earlier else line
    return new, Recalled(left, memory.until) if left else NOTHING


def trust_published(previous_renew: datetime | None, now: datetime, lease_duration: timedelta,
                    grace: timedelta) -> bool:
    """Whether a new leader may read back the summaries the last one published (`recalled`):
    True when the Lease it took was last renewed (`previous_renew`, the previous holder's
    `renewTime`, or its release) at most `lease_duration` + `grace` (`line.retryGrace`)
    before `now`: the previous leader published until it stopped leading, at most its renew
    deadline after that renewal, and a takeover comes a Lease duration after it. False when
    it is older (every replica was down meanwhile: the summary is stale, the clients it
    lists long gone) or unknown (`None`: this replica created the Lease)."""
    return previous_renew is not None and now - previous_renew <= lease_duration + grace


__all__ = ["NOTHING", "Recalled", "recall", "recalled", "trust_published"]
