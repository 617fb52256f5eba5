"""The waiting line (docs/contract.md §3c P5): sets refused for room wait in a line per
class, higher priority first, then first refused first; freed room goes to the head that
fits it, and a later set may start only on devices no set ahead of it can use now
(backfill); a head that has waited longer than `line.reserveAfter` reserves the node where
it would start soonest, and so does the set next behind it (`RESERVING`).

- `waits_for_room`: which refusals enter the line (room, never budget, entitlement, a class
  problem, a size no node has, a policy of the node).
- `Identity`, `Shape`, `Entry`, `Line`: the line as a value (copy-on-write, like
  `model.snapshot.Snapshot`): `refused`, `started`, `gone`, `expire` (a bare VMI's place is
  kept only while its client retries: `RETRY_AFTER`, `LineSettings.retry_grace`), `capped` (a
  tenant's bound, `LineSettings.per_namespace`), and the order.
- `may_place`: may a set start on the node its decision chose (`Allowed`), or does a set
  ahead of it go first (`Behind`), or is the node reserved (`Reserved`)?
- `reservation`: the nodes reserved for the sets at the front of a line that waited long
  (`Line.fronts`; `soonest` is the one rule).
- `line_place`: what `explain` shows of a waiting set (`model.reasons.LinePlace`).

Pure: no I/O, no wall clock (every time is an argument, UTC). Sets are re-decided by
`model.decide` on the snapshot given, never by a re-implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Iterable, Iterator, Mapping

from model.admission import with_templates
from model.decide import Decision, Placement, Request, Rule, apply_decision, assess, decide, placed
from model.parse import VMIAsk
from model.priority import DEFAULT_PRIORITY, Priority
from model.reasons import (BehindInLine, BinderRefused, CannotPlace, Code, InLine, LinePlace,
                           NoDeviceGroup, NoEligibleNode, NodeReserved, Reason, SetNeeds,
                           SetRefused, Waiter, new_device_class)
from model.snapshot import Snapshot
from model.types import GPUDevice, Labels, Result, Toleration, labels_include

DEFAULT_RESERVE_AFTER = timedelta(minutes=5)
"""`line.reserveAfter`'s default: a head waiting longer gets a reservation (P5). Five
minutes: in a busy fleet room frees naturally within minutes and backfill keeps the GPUs
busy meanwhile; past that, a large set's node stops taking small sets so that the room it
needs can gather there (docs/contract.md §3c, P5's choices)."""

RESERVING = 2
"""Default of `LineSettings.reserving`: how many sets at the front of each class's line (its
head and the set next behind it) reserve a node once each has waited longer than
`line.reserveAfter` (P5, `reservation`). Two, measured (docs/benchmarks.md, *One tier*): with
the head alone, large sets behind a reserved head gather their room one node at a time, each
starting only once the one ahead of it has; a second reservation gathers the next node's room
meanwhile. In the in-memory replay of bench contention's traces at one priority (40 seeds)
it took the median ratio of the 8-GPU maximum waits with and without the line from 0.533 to
0.458 at `reserveAfter` 7.5 s (the default scaled to the trace's lives) and 0.498 to 0.441
at 30 s, with the GPUs as busy as without the line (utilisation 0.1 and 1.2 points above
the line off). Three were about the same (0.446 and 0.457): two is the fewest that gathers
a second board at once."""

RETRY_AFTER = 2
"""Seconds: the `Retry-After` of every 503 that answers a set waiting in the line (a bare VMI's
refusal for room at W1 that put it there, `behind_in_line`, `node_reserved`; the webhook's
`details.retryAfterSeconds`). client-go (kubectl, every Go client, KubeVirt's controllers)
sleeps it out and retries the create by itself (up to 10 times), so a waiting set asks again
about this often, and its room is judged again within about this long of coming free."""

RETRY_PERIODS = 5
"""How many `RETRY_AFTER` periods a bare VMI's entry is kept without a new attempt
(`DEFAULT_RETRY_GRACE`): room for a slow retry or two (a follower sends each on to the
binder, W3), not for a client that stopped."""

DEFAULT_RETRY_GRACE = timedelta(seconds=RETRY_PERIODS * RETRY_AFTER)
"""`line.retryGrace`'s default (10 s): how long a bare VMI's entry stays without a new
attempt (`Line.expire`, `model.line_plan.tidy`). Its place is real only while its client
retries: a client honouring the 503's `Retry-After` asks every `RETRY_AFTER` seconds, so one
silent for `RETRY_PERIODS` periods has stopped (kubectl after its 10 retries, a client that
does not retry at all), and its entry no longer holds back the sets behind it. A
VirtualMachine's entry never expires by it: KubeVirt retries for as long as the VM wants to
run, and it leaves by `started` / `gone` (or `model.line_plan.VM_TTL`)."""

DEFAULT_PER_NAMESPACE = 100
"""`line.maxPerNamespace`'s default: the most entries one namespace (tenant) keeps in the line
(`LineSettings.per_namespace`, `Line.refused` and `Line.capped`). A tenant can make any number
of sets that are refused for room (a create costs it nothing while it is refused), so without a
bound one tenant could grow the leader's line, and the work each decision does on it, without
end. A hundred waiting sets is more than a tenant's budget lets start at once on any fleet the
binder serves, and keeps the line's cost per decision bounded by namespaces × 100."""

MAX_DECIDED = 16
"""Default bound on the sets ahead `may_place` judges per call (`LineSettings.max_decided`):
one B3 check of the node and, when it fits there, one decision after the placement each. A
further set ahead that passes the cheap count check (its classes served and its units free
on the node) refuses the set unchecked (`Behind.unchecked`): erring on the side of P6, since
such a set could well start there now, and will at its next retry."""

MAX_AHEAD_SHOWN = 10
"""Most sets ahead `line_place` names per class line (the rest are counted)."""

LINE_REQUEST_PREFIX = "(line) "
"""Request ids of the entries `may_place` and `reservation` re-decide: "(line) <ns>/<vmi>",
never a real (generated) id."""

_FAR = datetime.max.replace(tzinfo=timezone.utc)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


# --- which refusals wait ------------------------------------------------------------------------

ROOM_CODES = frozenset({Code.NO_ROOM, Code.LOST_CAPACITY, Code.NO_FREE_UNIT,
                        Code.NO_ROOM_FOR_SET, Code.LEDGERS_REFUSED})
"""Codes that by themselves say "no room now" (P5): a node short of units (`NoRoom`,
`LostCapacity`), W1's per-device `NoFreeUnit` and set-level `NoRoomForSet`, and the node
actors' `LedgersRefused` (the room was taken between the model and the ledgers). Three more
wait depending on their data (`waits_for_room`): `NoDeviceGroup`, `SetNeeds` and the
composites (`NoEligibleNode`, `SetRefused`, `CannotPlace`, `BinderRefused`). Every other code
is a policy, an invalid request or a transient failure of the webhook: no room frees it."""

INFORMATIONAL_CODES = frozenset({Code.KEPT_FOR_VM})
"""Codes a room refusal of W1 (`CannotPlace`) carries to inform, not to refuse (H4's sets
kept for stopped VMs): they neither make nor break a wait."""


def waits_for_room(outcome: Reason | object) -> bool:
    """True when `outcome` (a `model.reasons` reason, a decision's `Outcome`, W1's
    `CannotPlace`, or the webhook's `BinderRefused`) refuses a set only for room, so that
    the set waits in the line of its classes (P5). The rule, by code:

    - `ROOM_CODES`: yes;
    - `NoDeviceGroup` (DR3): yes unless `missing` (a size no device of the node has);
    - `SetNeeds` (W1): yes unless `largest` is set (no node serving the class has that many
      at all) or `most_free` is None (no node serving it is eligible: cordons, taints,
      the node selector; policy);
    - `NoEligibleNode`: yes when some node it lists fails on room only (each of its problems
      waits): a node that would take the set once room frees. Nodes failing also on a cordon,
      a taint, the selector or a class they do not serve do not count;
    - `SetRefused`, `CannotPlace`: yes when every reason waits (H4's `KeptForVM` aside) and
      there is at least one;
    - `BinderRefused` (the binder's refusal read back by the webhook): by the code written
      beside it, `no_eligible_node` and `ledgers_refused` waiting (W1 had found room just
      before, so the set-level problems are excluded); no code (an older replica): no.
    - anything else (budget, entitlement, a class problem, no node serving the class, a
      node's cordon alone, the webhook's own checks, a Succeeded outcome): no."""
    if isinstance(outcome, NoDeviceGroup):
        return not outcome.missing
    if isinstance(outcome, SetNeeds):
        return outcome.largest is None and outcome.most_free is not None
    if isinstance(outcome, NoEligibleNode):
        return any(n.problems and all(waits_for_room(p) for p in n.problems) for n in outcome.nodes)
    if isinstance(outcome, (SetRefused, CannotPlace)):
        reasons = [r for r in outcome.reasons if r.code not in INFORMATIONAL_CODES]
        return bool(reasons) and all(waits_for_room(r) for r in reasons)
    if isinstance(outcome, BinderRefused):
        return outcome.refused in (Code.NO_ELIGIBLE_NODE, Code.LEDGERS_REFUSED)
    code = getattr(outcome, "code", None)
    return isinstance(code, Code) and code in ROOM_CODES


# --- the line as a value ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LineSettings:
    """The line's settings (P5): `reserve_after` (`line.reserveAfter`; a head waiting longer
    reserves a node), `reserving` (how many sets at the front of each class's line may each
    reserve one, `RESERVING`; 1: the head alone), `retry_grace` (`line.retryGrace`: a bare
    VMI's entry leaves after this long without a new attempt, `Line.expire`), `max_decided` (sets
    ahead `may_place` judges per call, `MAX_DECIDED`), `per_namespace` (`line.maxPerNamespace`:
    the most entries one namespace keeps, its first in line order, `DEFAULT_PER_NAMESPACE`),
    `enabled` (`line.enabled`: False turns P5 off, the coordinator keeps no line, gates no
    batch and reserves no node; freed room goes to whoever asks first, as before P5).
    Raises ValueError for a negative time, or a `max_decided`, `per_namespace` or
    `reserving` below 1."""

    reserve_after: timedelta = DEFAULT_RESERVE_AFTER
    retry_grace: timedelta = DEFAULT_RETRY_GRACE
    max_decided: int = MAX_DECIDED
    per_namespace: int = DEFAULT_PER_NAMESPACE
    enabled: bool = True
    reserving: int = RESERVING

    def __post_init__(self) -> None:
        if self.reserve_after < timedelta(0) or self.retry_grace < timedelta(0):
            raise ValueError("line.reserveAfter and line.retryGrace must not be negative")
        if self.max_decided < 1:
            raise ValueError(f"max_decided must be at least 1, got {self.max_decided}")
        if self.per_namespace < 1:
            raise ValueError(f"line.maxPerNamespace must be at least 1, got {self.per_namespace}")
        if self.reserving < 1:
            raise ValueError(f"reserving must be at least 1, got {self.reserving}")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who waits: VMI `namespace/vmi`, and `vm_uid` the uid of the VirtualMachine that owns
    it (None: a bare VMI, or not known to the caller). One entry per (namespace, vmi)."""

    namespace: str
    vmi: str
    vm_uid: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, vmi): an entry's key in the line."""
        return (self.namespace, self.vmi)

    def same(self, other: Identity) -> bool:
        """The same VMI name, and the same VM unless one of the uids is unknown (a VM deleted
        and re-created under the name is another set)."""
        return (self.key == other.key
                and (self.vm_uid is None or other.vm_uid is None or self.vm_uid == other.vm_uid))


@dataclass(frozen=True, slots=True)
class Shape:
    """What a waiting set asks for, enough to decide it again (`model.decide.Request`):
    `held` (device name, its class) in annotation order, `templates` (class, count) of new
    devices, the launcher's `node_selector` and the VMI's `tolerations` (B3)."""

    held: tuple[tuple[str, str], ...] = ()
    templates: tuple[tuple[str, int], ...] = ()
    node_selector: Labels = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def classes(self) -> tuple[str, ...]:
        """The set's classes, first seen first: the lines it waits in."""
        return tuple(dict.fromkeys([c for _, c in self.held] + [c for c, n in self.templates if n > 0]))


def shape_of_ask(snapshot: Snapshot, namespace: str, ask: VMIAsk, node_selector: Labels = (),
                 tolerations: tuple[Toleration, ...] = ()) -> Shape:
    """The shape of a VMI's set as the webhook reads it (`VMIAsk`, in `namespace`); a held
    device missing from `snapshot` is left out (its set is refused for it, not for room)."""
    held = tuple((name, d.class_name) for name in ask.held
                 if (d := snapshot.device(namespace, name)) is not None)
    return Shape(held, tuple((c, n) for c, n in ask.templates if n > 0), node_selector, tolerations)


def shape_of(snapshot: Snapshot, request: Request) -> Shape:
    """The shape of `request`'s set on `snapshot` (the binder's refused request, or W1's
    judged one): members that are template devices (`template_for` its VMI, or W1's "new
    <class> #n", `model.reasons.new_device_name`) counted per class, the others held;
    members missing from `snapshot` are left out."""
    held: list[tuple[str, str]] = []
    templates: dict[str, int] = {}
    for name in request.devices:
        d = snapshot.device(request.namespace, name)
        if d is None:
            continue
        if d.template_for == request.vmi or (d.template_for is None and new_device_class(name) is not None):
            templates[d.class_name] = templates.get(d.class_name, 0) + 1
        else:
            held.append((name, d.class_name))
    return Shape(tuple(held), tuple(templates.items()), request.node_selector, request.tolerations)


@dataclass(frozen=True, slots=True)
class Entry:
    """A set waiting for room (P5): who (`identity`), what it asks (`shape`), its
    `priority` (P1, `BindRequest.priority`), when it was first refused for room and when
    last (`first_refused`, `last_seen`; UTC). `retried` False: a bare VMI refused once, its
    client not seen retrying yet; such an entry keeps its first refusal (so its place once it
    retries) but holds back nobody (`may_place`) and reserves nothing until its client's
    next attempt (`Line.refused`) shows the place is wanted: a create never retried (a client
    that does not retry, a test's single probe) costs the sets behind it nothing. `attempt`:
    which create attempt made the latest refusal (the AdmissionReview's uid at W1, the bind
    request's id at the binder; "" when unknown): a refusal of another attempt is the
    client's retry, however soon or late it comes, and the same attempt refused again (W1
    judges twice per review; a batch may decide a request again, seconds later on a loaded
    machine) never is."""

    identity: Identity
    shape: Shape
    priority: Priority
    first_refused: datetime
    last_seen: datetime
    retried: bool = True
    attempt: str = ""

    @property
    def order_key(self) -> tuple[int, datetime, str, str, str]:
        """The line's order: higher priority first, then first refused first, then the
        identity (namespace, vmi, VM uid), so that the order is total and deterministic."""
        i = self.identity
        return (-self.priority.value, self.first_refused, i.namespace, i.vmi, i.vm_uid or "")

    def waiter(self) -> Waiter:
        """How messages name this set (`model.reasons.Waiter`)."""
        p = self.priority
        return Waiter(self.identity.namespace, self.identity.vmi, p.value, p.class_name,
                      self.first_refused)


def entry(identity: Identity, shape: Shape, priority: Priority, now: datetime) -> Entry:
    """A set refused for room at `now`, as it enters the line (first refused = last seen = `now`)."""
    return Entry(identity, shape, priority, now, now)


class Line:
    """The waiting line of every class (P5), an immutable value: `entries` in line order
    (`Entry.order_key`), at most one per (namespace, vmi). A class's line (`of_class`) is
    the entries with that class, in the same order; a set of several classes waits in each.
    Every change (`refused`, `started`, `gone`, `expire`) returns a new Line (the same one
    when nothing changed) and leaves this one as it was.

    Raises ValueError when built with two entries of one (namespace, vmi)."""

    __slots__ = ("_entries", "_by_key", "_by_class")

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        ordered = sorted(entries, key=_order)
        by_key: dict[tuple[str, str], Entry] = {}
        by_class: dict[str, list[Entry]] = {}
        for e in ordered:
            if e.identity.key in by_key:
                raise ValueError(f"two entries of {e.identity.namespace}/{e.identity.vmi} in one line")
            by_key[e.identity.key] = e
            for c in e.shape.classes:
                by_class.setdefault(c, []).append(e)
        self._entries = tuple(ordered)
        self._by_key = by_key
        self._by_class = {c: tuple(es) for c, es in by_class.items()}

    # --- reading -----------------------------------------------------------------------------

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every entry, in line order."""
        return self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Line) and self._entries == other._entries

    def __hash__(self) -> int:
        return hash(self._entries)

    def __repr__(self) -> str:
        return f"Line({len(self._entries)} entries, classes {sorted(self._by_class)})"

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes that have a line (some set waits in them), sorted."""
        return tuple(sorted(self._by_class))

    def of_class(self, class_name: str) -> tuple[Entry, ...]:
        """The line of `class_name`, head first (empty when nobody waits)."""
        return self._by_class.get(class_name, ())

    def find(self, identity: Identity) -> Entry | None:
        """The entry of `identity` (`Identity.same`), None when it does not wait."""
        e = self._by_key.get(identity.key)
        return e if e is not None and e.identity.same(identity) else None

    def position(self, identity: Identity, class_name: str) -> int | None:
        """Where `identity` waits in the line of `class_name` (1: the head), None when not there."""
        e = self.find(identity)
        if e is None:
            return None
        for i, x in enumerate(self.of_class(class_name), 1):
            if x is e:
                return i
        return None

    def fronts(self, count: int) -> tuple[Entry, ...]:
        """The first `count` entries that are `retried` of each class's line (an entry at the
        front of several once), in line order: the sets that may reserve (`reservation`).
        Entries not retried yet are passed over (they hold back nobody, `may_place`).
        Raises ValueError for a `count` below 1."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        found: dict[tuple[str, str], Entry] = {}
        for es in self._by_class.values():
            n = 0
            for e in es:
                if n == count:
                    break
                if e.retried:
                    found[e.identity.key] = e
                    n += 1
        return tuple(sorted(found.values(), key=_order))

    def heads(self) -> tuple[Entry, ...]:
        """The head of each class's line (an entry heading several once), in line order."""
        found = {id(es[0]): es[0] for es in self._by_class.values()}
        return tuple(sorted(found.values(), key=_order))

    # --- changes ---------------------------------------------------------------------------

    def refused(self, new: Entry, now: datetime, limit: int | None = None) -> Line:
        """`new`'s set refused for room (again) at `now`. When it waits already (`find`),
        its first-refused time stays (so does its position, unless its priority changed: it
        then moves to its new priority's place, still by that time), `last_seen` becomes
        `now` and its shape and priority become `new`'s (a VM uid learnt is kept). Else it
        enters with `new`'s first-refused time (normally `now`: `entry`; a caller rebuilding
        the line after a leader change passes the time it recorded) and `last_seen` `now`;
        an entry of the same name but another VM leaves (another set). With `limit`
        (`LineSettings.per_namespace`), the namespace of `new` then keeps its first `limit`
        entries in line order (`capped`): a new entry behind that many of its tenant's does
        not enter (the line is returned as it was), one ahead of them enters and the
        tenant's last leaves. A refusal of another create attempt than the waiting set's last
        (`Entry.attempt`) marks it `retried` (its client retries: its place now holds back the
        sets behind it), as does a `new` that is `retried` itself; a refusal whose attempt or
        the waiting set's is unknown ("") is no retry (every caller of the product knows its
        attempt: a time rule misjudged one attempt's refusals seconds apart as a retry)."""
        old = self._by_key.get(new.identity.key)
        if old is not None and old.identity.same(new.identity):
            ident = new.identity if new.identity.vm_uid is not None else old.identity
            again = bool(old.attempt and new.attempt and new.attempt != old.attempt)
            e = Entry(ident, new.shape, new.priority, old.first_refused, max(old.last_seen, now),
                      old.retried or new.retried or again, new.attempt or old.attempt)
        else:
            e = replace(new, last_seen=now)
        rest = [x for x in self._entries if x is not old]
        line = Line(rest + [e])
        if limit is None:
            return line
        line = line.capped(limit, (new.identity.namespace,))
        return self if old is None and line.find(e.identity) is None else line

    def capped(self, limit: int, namespaces: Iterable[str] | None = None) -> Line:
        """The line with each namespace's first `limit` entries in line order and none of
        its others (`namespaces`: only those are capped; None: every one). The same Line when
        none has more. Raises ValueError for a `limit` below 1."""
        if limit < 1:
            raise ValueError(f"a namespace's limit in the line must be at least 1, got {limit}")
        only = None if namespaces is None else frozenset(namespaces)
        seen: dict[str, int] = {}
        kept: list[Entry] = []
        for e in self._entries:
            ns = e.identity.namespace
            if only is None or ns in only:
                seen[ns] = seen.get(ns, 0) + 1
                if seen[ns] > limit:
                    continue
            kept.append(e)
        return self if len(kept) == len(self._entries) else Line(kept)

    def started(self, identity: Identity) -> Line:
        """The set of `identity` started (its admission was admitted): it leaves the line."""
        return self._without(identity)

    def gone(self, identity: Identity) -> Line:
        """The set of `identity` stopped asking (its VM was stopped or deleted, or its
        VMI's create is no longer retried): it leaves the line."""
        return self._without(identity)

    def expire(self, now: datetime, ttl: timedelta) -> Line:
        """The line without the bare VMIs' entries (no VM uid) last refused more than `ttl`
        (`LineSettings.retry_grace`) before `now`: their clients stopped retrying. A VM's
        entry stays (`DEFAULT_RETRY_GRACE`)."""
        kept = [e for e in self._entries if e.identity.vm_uid is not None or now - e.last_seen <= ttl]
        return self if len(kept) == len(self._entries) else Line(kept)

    def _without(self, identity: Identity) -> Line:
        e = self.find(identity)
        return self if e is None else Line(x for x in self._entries if x is not e)


def _order(e: Entry) -> tuple[int, datetime, str, str, str]:
    return e.order_key


# --- deciding an entry again -------------------------------------------------------------------


def entry_request(snapshot: Snapshot, e: Entry) -> tuple[Snapshot, Request]:
    """The snapshot and request the binder would judge for `e`'s set now (as `explain`
    does): held devices by name, template devices under their W3 names
    (`model.admission.template_name`) added as Pending devices when they do not exist; the
    request id is `LINE_REQUEST_PREFIX` + "<namespace>/<vmi>"."""
    ns, vmi = e.identity.key
    snap, names = with_templates(snapshot, ns, vmi, [n for n, _ in e.shape.held], e.shape.templates)
    return snap, Request(f"{LINE_REQUEST_PREFIX}{ns}/{vmi}", ns, vmi, names,
                         e.shape.node_selector, None, e.shape.tolerations)


def placeable(snapshot: Snapshot, e: Entry) -> bool:
    """True when `e`'s set would be placed now on `snapshot` (`model.decide.decide`
    Succeeded)."""
    snap, request = entry_request(snapshot, e)
    return decide(snap, request, limit=1).result is Result.SUCCEEDED


def fits_on(snapshot: Snapshot, e: Entry, node: str) -> bool:
    """True when `e`'s set could be placed now on `node` (no set-level problem, `node`
    eligible for the whole set, B3: `model.decide.assess` on that node alone)."""
    snap, request = entry_request(snapshot, e)
    a = assess(snap, request, (node,), with_decision=False)
    return not a.set_problems and node in a.nodes and not a.nodes[node]


def _units_free_for(snap: Snapshot, e: Entry, node: str, unplaceable: frozenset[str]) -> bool:
    """The cheap necessary part of `fits_on`: `node` placeable, serving every class of the
    set, matching its node selector, with its units free (members Bound elsewhere and new
    ones count). False also when a class or a held device is unknown (the set is then
    refused for that, whatever the room)."""
    if node not in snap.nodes or node in unplaceable:
        return False
    classes = snap.classes
    need: dict[str, int] = {}
    for c, n in e.shape.templates:
        if c not in classes or not snap.serves(node, c):
            return False
        need[classes[c].resource_name] = need.get(classes[c].resource_name, 0) + n
    for name, c in e.shape.held:
        if c not in classes or not snap.serves(node, c):
            return False
        d = snap.device(e.identity.namespace, name)
        if d is None:
            return False  # refused for it whatever the room
        if d.bound_node != node:
            need[classes[c].resource_name] = need.get(classes[c].resource_name, 0) + 1
    sel = e.shape.node_selector
    if sel and not labels_include(snap.node_labels(node), sel):
        return False
    return all(snap.free(node, r) >= n for r, n in need.items())


# --- who may start --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Allowed:
    """The set may start where its decision put it (P5)."""


ALLOWED = Allowed()


@dataclass(frozen=True, slots=True)
class Behind:
    """The set may not start on `node`: `entry`, at `position` in the line of `class_name`
    (one of the set's classes), could start now on `node` and nowhere once the set took its
    place (or, `unchecked`, it is the first set ahead past `LineSettings.max_decided` that
    could use the node). `reason()` is the typed refusal."""

    entry: Entry
    class_name: str
    position: int
    node: str
    unchecked: bool = False

    def reason(self) -> BehindInLine:
        return BehindInLine(self.class_name, self.position, self.entry.waiter(), self.node,
                            self.unchecked)


@dataclass(frozen=True, slots=True)
class Reserved:
    """The set may not start on `node`: it is reserved for `holder` (a set at the front of
    its line, `Line.fronts`, that waited longer than `line.reserveAfter`, ahead of the set),
    in the line of `class_name` (the first of its classes whose line it heads, else its
    first). `reason()` is the typed refusal."""

    node: str
    holder: Entry
    class_name: str

    def reason(self) -> NodeReserved:
        return NodeReserved(self.node, self.class_name, self.holder.waiter())


Verdict = Allowed | Behind | Reserved
"""What `may_place` answers."""


def request_priority(snapshot: Snapshot, request: Request) -> Priority:
    """The priority `request`'s members record (`status.bindRequest.priority` of the first
    member carrying the request; P1), the default (0) when none does (W1's judged sets)."""
    for name in request.devices:
        d = snapshot.device(request.namespace, name)
        br = d.status.bind_request if d is not None else None
        if br is not None and br.id == request.id:
            return br.priority
    return DEFAULT_PRIORITY


def may_place(line: Line, snapshot: Snapshot, request: Request, placement: Placement, *,
              priority: Priority | None = None,
              reservations: Mapping[Identity, str] | None = None,
              settings: LineSettings = LineSettings()) -> Verdict:
    """P5 for `request` about to be placed by `placement` (a `model.decide.Decision`'s, on
    node N = `placement.node`): `Allowed`, or why not.

    The set's own place: its entry's when it waits (same namespace and VMI), else that of a
    set of its `priority` (None: `request_priority`) refused after everyone waiting. Ahead
    of it: the entries in the lines of its classes with a smaller `Entry.order_key`.

    1. `Reserved` when N is reserved (`reservations`, from `reservation`) for another set
       ahead of it and the placement takes units there (a set kept where it is takes none);
       a set ahead of the holder (a higher priority) is not held back by it.
    2. `Behind` for the first entry E ahead, in line order, that could be placed on N now
       (`fits_on`) and nowhere once the placement is carried out (`apply_decision`, then
       `placeable`). In the same tenant, an E placeable now elsewhere that the placement
       would leave over budget blocks too (the tenant's earlier set goes first). E that fits
       on N but still fits elsewhere after does not block: backfill.
    3. Else `Allowed`.

    Cost: nothing when the line is empty and nothing is reserved; else a cheap count check
    (`_units_free_for`) per entry ahead, and the full judgement of at most
    `settings.max_decided` of them (`MAX_DECIDED`: past it, `Behind(..., unchecked=True)`).
    The snapshot is taken without the request's own reservations. Pure; never raises."""
    node = placement.node
    if (not line and not reservations) or not (placement.moves or placement.needs or placement.devices):
        return ALLOWED  # nobody waits, or the set is kept where it is (B6, B5): it takes nothing
    snap = snapshot.without_reservation(request.id)
    me = line.find(Identity(request.namespace, request.vmi))
    if me is not None:
        my_key = me.order_key
    else:
        p = priority if priority is not None else request_priority(snap, request)
        my_key = (-p.value, _FAR, request.namespace, request.vmi, "")
    if reservations:
        for ident, at in reservations.items():
            if at != node or ident.key == (request.namespace, request.vmi):
                continue
            holder = line.find(ident)
            if holder is not None and holder.order_key < my_key:
                return Reserved(node, holder, _headed_class(line, holder))
    classes = _request_classes(snap, request)
    ahead = _ahead(line, classes, my_key, (request.namespace, request.vmi))
    if not ahead:
        return ALLOWED
    budgeted = {r for r, n in placement.budget_needs
                if n > 0 and snap.budget_of(request.namespace, r) is not None}
    unplaceable = snap.unplaceable_nodes()
    after: Snapshot | None = None
    judged = 0
    for e, cls in ahead:
        near = _units_free_for(snap, e, node, unplaceable)
        budget = (bool(budgeted) and e.identity.namespace == request.namespace
                  and bool(budgeted & _resources(snap, e)))
        if not near and not budget:
            continue
        if judged >= settings.max_decided:
            return Behind(e, cls, _pos(line, e, cls), node, unchecked=True)
        judged += 1
        if not (near and fits_on(snap, e, node)) and not (budget and placeable(snap, e)):
            continue
        if after is None:
            after = _carried_out(snap, request, placement)
        if not placeable(after, e):
            return Behind(e, cls, _pos(line, e, cls), node)
    return ALLOWED


def _carried_out(snap: Snapshot, request: Request, placement: Placement) -> Snapshot:
    """`snap` once `placement` of `request` is carried out (`apply_decision`; the time of
    binding does not matter to a decision)."""
    decision = Decision(request.id, Result.SUCCEEDED, placement.node, (placement,), Rule.B1,
                        placed(request, placement))
    return apply_decision(snap, request, decision, now=request.requested_at or _EPOCH)


def _request_classes(snap: Snapshot, request: Request) -> tuple[str, ...]:
    return tuple(dict.fromkeys(d.class_name for n in request.devices
                               if (d := snap.device(request.namespace, n)) is not None))


def _resources(snap: Snapshot, e: Entry) -> set[str]:
    return {snap.classes[c].resource_name for c in e.shape.classes if c in snap.classes}


def _ahead(line: Line, classes: Iterable[str], key: tuple, own: tuple[str, str]) -> list[tuple[Entry, str]]:
    """The entries ahead of `key` in the lines of `classes`, in line order, each with the
    first of `classes` it waits in; `own` (the set itself) and entries not `retried` yet left
    out."""
    found: dict[tuple[str, str], tuple[Entry, str]] = {}
    for c in classes:
        for e in line.of_class(c):
            if e.order_key >= key:
                break
            if e.retried and e.identity.key != own and e.identity.key not in found:
                found[e.identity.key] = (e, c)
    return sorted(found.values(), key=lambda x: x[0].order_key)


def _pos(line: Line, e: Entry, class_name: str) -> int:
    pos = line.position(e.identity, class_name)
    assert pos is not None
    return pos


def _headed_class(line: Line, e: Entry) -> str:
    """The first of `e`'s classes whose line it heads (else its first class)."""
    for c in e.shape.classes:
        es = line.of_class(c)
        if es and es[0] is e:
            return c
    return e.shape.classes[0] if e.shape.classes else ""


# --- reservations ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Soonest:
    """Where a set would start soonest (`soonest`): `node`, `missing` units (0: it fits
    there now), `moves` its members not Bound there."""

    node: str
    missing: int
    moves: int


def soonest(snapshot: Snapshot, e: Entry, exclude: frozenset[str] = frozenset()) -> Soonest | None:
    """The node where `e`'s set would start soonest, of the nodes not in `exclude`: among
    the nodes it fails on for room only (every B3 problem waits, `waits_for_room`; the
    eligible ones included, missing 0) where its units would be there if the binder's sets
    on it stopped (what it needs of each resource ≤ allocatable − units of Pods outside the
    binder), the one with the fewest units missing (per resource what it needs there beyond
    what is free; in device mode also, per class, its size beyond the largest free group),
    then the fewest moves, then the smallest node (its allocatable of the set's resources),
    then the name. None when there is none, or the set has a set-level problem (budget,
    class, entitlement: room would not help)."""
    snap, request = entry_request(snapshot, e)
    a = assess(snap, request, with_decision=False)
    if a.set_problems or not a.nodes:
        return None
    ns = e.identity.namespace
    members = [d for n in request.devices if (d := snap.device(ns, n)) is not None]
    res_of = {c: snap.classes[c].resource_name for c in e.shape.classes}
    best: tuple[int, int, int, str] | None = None
    for node, problems in a.nodes.items():
        if node in exclude or not all(waits_for_room(p) for p in problems):
            continue
        need: dict[str, int] = {}
        moves = 0
        for m in members:
            if m.bound_node != node:
                need[res_of[m.class_name]] = need.get(res_of[m.class_name], 0) + 1
                moves += m.bound_node is not None
        if any(n > snap.allocatable(node, r) - snap.foreign(node, r) for r, n in need.items()):
            continue
        missing = sum(max(0, n - snap.free(node, r)) for r, n in need.items())
        missing += sum(p.count - p.largest for p in problems if isinstance(p, NoDeviceGroup))
        size = sum(snap.allocatable(node, r) for r in need)
        key = (missing, moves, size, node)
        if best is None or key < best:
            best = key
    return None if best is None else Soonest(best[3], best[0], best[1])


def reservation(line: Line, snapshot: Snapshot, now: datetime,
                settings: LineSettings = LineSettings(),
                kept: Mapping[Identity, str] | None = None) -> dict[Identity, str]:
    """The nodes reserved now (P5), in line order over the entries that hold one:

    - an entry that held node N at the last batch (`kept`, this function's answer then) and
      still waits keeps N until it starts ("takes no new set until it starts"), whether it
      is still at the front of its line or a set of higher priority came ahead of it
      meanwhile, as long as N is still a node room would make it fit on (`soonest` on N
      alone; not when a cordon, a taint or a class change took N from it, nor when an entry
      ahead of it took N first). Re-choosing every batch would move the reservation whenever
      another node's sets happened to end first, and every move opens the node it leaves to
      backfill, throwing away the room gathered there (bench contention, docs/contract.md
      §3c P5);
    - each of the first `settings.reserving` sets of a class's line (`Line.fronts`: the head,
      and by default the set next behind it, `RESERVING`) that has waited longer than
      `settings.reserve_after` since it was first refused and holds none gets the node where
      it would start soonest (`soonest`) among the nodes no entry ahead of it reserved. Such
      a set with no such node (a set-level problem, or no node that room would make fit)
      reserves none.

    Entries not `retried` yet reserve nothing. Pure; never raises."""
    out: dict[Identity, str] = {}
    taken: set[str] = set()
    held = {ident.key: (ident, node) for ident, node in (kept or {}).items()}
    fronts = {e.identity.key for e in line.fronts(settings.reserving)}
    nodes = frozenset(snapshot.nodes)
    for e in line:
        if not e.retried or now - e.first_refused <= settings.reserve_after:
            continue
        was = held.get(e.identity.key)
        if was is not None and was[0].same(e.identity) and was[1] not in taken:
            if soonest(snapshot, e, nodes - {was[1]}) is not None:
                out[e.identity] = was[1]
                taken.add(was[1])
                continue
        if e.identity.key not in fronts:
            continue
        found = soonest(snapshot, e, frozenset(taken))
        if found is not None:
            out[e.identity] = found.node
            taken.add(found.node)
    return out


# --- what explain shows ------------------------------------------------------------------------


def line_place(line: Line, identity: Identity,
               reservations: Mapping[Identity, str] | None = None) -> LinePlace | None:
    """What `explain` says of `identity`'s set when it waits (None when it does not): its
    place in the line of each of its classes with the sets ahead (head first, at most
    `MAX_AHEAD_SHOWN` named), and the node reserved for it (`reservations`, from
    `reservation`)."""
    e = line.find(identity)
    if e is None:
        return None
    lines = []
    for c in e.shape.classes:
        es = line.of_class(c)
        pos = next(i for i, x in enumerate(es) if x is e)
        ahead = tuple(x.waiter() for x in es[:min(pos, MAX_AHEAD_SHOWN)])
        lines.append(InLine(c, pos + 1, len(es), ahead, pos - len(ahead)))
    reserved = None
    for ident, node in (reservations or {}).items():
        if ident.same(e.identity):
            reserved = node
    return LinePlace(e.waiter(), tuple(lines), reserved)
