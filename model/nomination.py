"""The nomination (docs/contract.md §3c P4): a preemptor, the node and room it is promised,
the victims stopped to free it, and until when the promise holds, as a pure value; its
`GPUNomination` object (parsed and built here, written and read by `k8s/`); and the hold it
makes (`nomination_holds`: the room counted as taken for every request but its preemptor's,
the way `model.hold.Hold` counts a request in flight).

A plan may also move idle held devices off the nominated node (`RoomMove`, D1-D5 "where they
help", `model.preemption`): the nomination records them (`spec.moves`), so a new leader still
carries them out, and holds each move's place on its target node until the device is there
(`Nomination.holds`).

One nomination per preemptor VMI (namespace, name): its object's name is derived from them
(`nomination_name`), so a new leader's decision finds it and reuses it instead of making a
second one. Victims are named by VMI incarnation: namespace, name, the admission id the VMI
was admitted with (`gpu.cozystack.io/admission`; W7: fixed once admitted) and its uid when
known, so a VMI recreated under the same name is never taken for the victim.

Pure: no clock (every `now` is an argument), no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping

from model.device.dra import DeviceRef
from model.hold import Hold, outstanding
from model.parse import ParseError
from model.serialize import format_time
from model.types import GPUDevice, Result

GROUP = "gpu.cozystack.io"
VERSION = "v1alpha1"
KIND = "GPUNomination"
PLURAL = "gpunominations"
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_TTL = timedelta(minutes=2)
"""`preemption.nominationTTL`'s default: how long a nomination holds its room (P4)."""

DEFAULT_RETRY_AFTER = 30
"""Seconds the preemptor is told to wait (Retry-After) when no grace is known: KubeVirt's
default `terminationGracePeriodSeconds` of a VMI."""

HOLD_PREFIX = "nomination:"
"""`Hold.request_id` of a nomination's hold: never a real (uuid) request id."""


def nomination_name(namespace: str, vmi: str) -> str:
    """The object name of the nomination of preemptor `namespace/vmi`: "<namespace>.<vmi>"
    (a DNS subdomain: both parts are DNS names), cut and suffixed with a hash when over 253
    characters. Deterministic: the same preemptor always names the same object."""
    name = f"{namespace}.{vmi}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[:240].rstrip('.-')}-{digest}"


def hold_id(namespace: str, vmi: str) -> str:
    """The `Hold.request_id` of the nomination of preemptor `namespace/vmi` (what
    `model.decide` leaves out when it decides that preemptor's own request)."""
    return f"{HOLD_PREFIX}{namespace}/{vmi}"


@dataclass(frozen=True, slots=True)
class Victim:
    """One set stopped for a nomination: VMI `namespace/vmi` admitted as `admission` (its
    `gpu.cozystack.io/admission` annotation; None when unknown), `uid` the VMI's uid when the
    nomination names one (None from `model.nominate`: the incarnation is told by `admission`,
    and the delete's uid precondition is the uid of the live VMI carrying it, `sweep`), of
    `priority` (value), started at `started` (UTC)."""

    namespace: str
    vmi: str
    admission: str | None
    uid: str | None
    priority: int
    started: datetime

    @property
    def name(self) -> str:
        """"<namespace>/<vmi>", as Events and messages name it."""
        return f"{self.namespace}/{self.vmi}"


@dataclass(frozen=True, slots=True)
class RoomMove:
    """One D-move of a preemption plan (§3c P3 with §3a D1-D5): the idle held device
    `namespace/name` of class `class_name` (count-mode resource or device-mode units
    `resource`) goes from `from_node` (the plan's node) to `to_node`, so that the set's room on
    the plan's node is made with fewer victims. Device mode (DR2, DR4): `from_device` the
    record it leaves, `to_device` the device it records (both None in count mode);
    `from_node == to_node` is a re-point (a status write on the same node)."""

    namespace: str
    name: str
    class_name: str
    resource: str
    from_node: str
    to_node: str
    from_device: DeviceRef | None = None
    to_device: DeviceRef | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name) of the moved device."""
        return (self.namespace, self.name)

    @property
    def repoint(self) -> bool:
        """Device mode (DR4): the device stays on its node and records another device of it."""
        return self.from_node == self.to_node and self.to_device is not None

    def render(self, preemptor: str) -> str:
        """The Event's and the log's text, e.g. "preemption: moved t/g (h100) from n1 to n2 to
        make room on n1 for p/vm-9"; device mode names the devices ("... from n1 (gpu-vfio-1)
        to n2 (gpu-vfio-5) ..." or "preemption: re-pointed t/g (hgx) on n1 from gpu-vfio-1 to
        gpu-vfio-5 to make room on n1 for p/vm-9")."""
        why = f"to make room on {self.from_node} for {preemptor}"
        what = f"{self.namespace}/{self.name} ({self.class_name})"
        if self.repoint:
            return (f"preemption: re-pointed {what} on {self.from_node} from "
                    f"{_ref_name(self.from_device)} to {_ref_name(self.to_device)} {why}")
        if self.to_device is not None:
            return (f"preemption: moved {what} from {self.from_node} ({_ref_name(self.from_device)}) "
                    f"to {self.to_node} ({_ref_name(self.to_device)}) {why}")
        return f"preemption: moved {what} from {self.from_node} to {self.to_node} {why}"


def _ref_name(ref: DeviceRef | None) -> str:
    return ref.device if ref is not None else "no device"


@dataclass(frozen=True, slots=True)
class Nomination:
    """A nomination (P4): preemptor VMI `namespace/vmi` of priority `priority` (value) is
    promised `units` (per resource, sorted; count mode) and `devices` (device mode, the
    exact devices of `node`) on `node` once `victims` stopped; made at `created`, holding
    until `expires` (UTC). `retry_after` the seconds the preemptor's create is told to wait.
    `name` the object's name (`nomination_name`). `moves` the idle held devices the plan
    moves off `node` (or re-points on it) to make the room (`RoomMove`; empty: none, as every
    nomination recorded before moves existed)."""

    namespace: str
    vmi: str
    priority: int
    node: str
    units: tuple[tuple[str, int], ...]
    devices: tuple[DeviceRef, ...]
    victims: tuple[Victim, ...]
    created: datetime
    expires: datetime
    retry_after: int = DEFAULT_RETRY_AFTER
    moves: tuple[RoomMove, ...] = ()

    @property
    def name(self) -> str:
        return nomination_name(self.namespace, self.vmi)

    @property
    def preemptor(self) -> str:
        """"<namespace>/<vmi>"."""
        return f"{self.namespace}/{self.vmi}"

    def live(self, now: datetime) -> bool:
        """True while the nomination holds its room: `now` before `expires`."""
        return now < self.expires

    def is_for(self, namespace: str, vmi: str) -> bool:
        """True when `namespace/vmi` is this nomination's preemptor."""
        return self.namespace == namespace and self.vmi == vmi

    def hold(self) -> Hold:
        """The room as a `Hold` on `node` (no budget slots: the preemptor's budget is its
        own business when it is decided): `units`, and in device mode its `devices`, named
        against placeholder member keys (only the device names are read), and the device each
        re-point of `moves` records (DR4: it stays on `node`)."""
        chosen = tuple(((self.namespace, f"{HOLD_PREFIX}{i}"), ref) for i, ref in enumerate(self.devices))
        chosen += tuple((m.key, m.to_device) for m in self.moves if m.repoint and m.to_device is not None)
        return Hold(hold_id(self.namespace, self.vmi), self.namespace, self.node, self.units, (), (), chosen)

    def holds(self, device: Callable[[tuple[str, str]], GPUDevice | None] | None = None) -> tuple[Hold, ...]:
        """Every hold of the nomination: `hold()` on `node`, then one per other node a move of
        `moves` goes to (by node name): a unit of each moved device's resource there and, in
        device mode, the device it will record, its moved devices as the hold's `landing`.
        With `device` (a lookup by (namespace, name)), each move hold is what it still takes
        (`model.hold.outstanding`: a device Bound there, recording its device, or gone, holds
        nothing any more). All share `hold()`'s request id (`hold_id`): one hold per node."""
        out = [self.hold()]
        to: dict[str, list[RoomMove]] = {}
        for m in self.moves:
            if not m.repoint and m.to_node != self.node:
                to.setdefault(m.to_node, []).append(m)
        for node in sorted(to):
            ms = to[node]
            needs: dict[str, int] = {}
            for m in ms:
                needs[m.resource] = needs.get(m.resource, 0) + 1
            h = Hold(hold_id(self.namespace, self.vmi), self.namespace, node, tuple(sorted(needs.items())), (),
                     tuple((m.key, m.resource) for m in ms),
                     tuple((m.key, m.to_device) for m in ms if m.to_device is not None))
            out.append(outstanding(h, device) if device is not None else h)
        return tuple(out)


def admitted(nomination: Nomination, devices: Mapping[str, GPUDevice]) -> bool:
    """True when the preemptor has a set admitted, on the nominated node or on any other: a
    device of its namespace (`devices`, by name) attached to its VMI, Bound on a node, its
    request Succeeded. Its hold then counts nothing: on its node the set's own devices count
    there; on another node (room came free there first) the held room is nobody's, and the
    nomination is dropped rather than left to expire."""
    for d in devices.values():
        att, br = d.status.attached_to, d.status.bind_request
        if (att is not None and att.vmi == nomination.vmi and d.bound_node is not None
                and br is not None and br.result is Result.SUCCEEDED):
            return True
    return False


def yielding(nominations: Iterable[Nomination], now: datetime) -> frozenset[tuple[str, str]]:
    """(namespace, VMI) of every victim of a nomination live at `now` (P4): sets being
    stopped for a preemptor, whose room is not theirs to take back (W4's take-over, H4's
    keep)."""
    return frozenset((v.namespace, v.vmi) for n in nominations if n.live(now) for v in n.victims)


def spent(nomination: Nomination, nominations: Iterable[Nomination], now: datetime) -> bool:
    """True when `nomination`'s preemptor is a victim of another of `nominations` live at
    `now` and made no earlier (`created`): when `nomination` was made its preemptor VMI was
    being refused (not running), when the other was made a VMI of that name was running (only
    running sets are victims), so it was admitted since and is being stopped: `nomination` is
    done whatever its expiry. A nomination made after the other (a VMI of the name created
    again once stopped, refused, nominated anew) is not spent by it. Without this, a
    preemptor admitted on its room, then stopped as a victim, would see its nomination hold
    that room again once its set is gone (`admitted` no longer true) while another preemptor
    is promised it: the room promised twice until the first expires (found by the chaos test:
    a leader killed between the stop and the deletion of the done nomination)."""
    return any(m is not nomination and m.live(now) and m.created >= nomination.created
               and any(v.namespace == nomination.namespace and v.vmi == nomination.vmi for v in m.victims)
               for m in nominations)


def nomination_holds(nominations: Iterable[Nomination], now: datetime,
                     devices_in: Any = None) -> tuple[Hold, ...]:
    """The holds of the nominations live at `now` (P4, P6: their room is placed for nobody
    but their preemptor), leaving out those whose preemptor is admitted on its node
    (`admitted`; `devices_in(namespace)` gives a namespace's devices by name, e.g.
    `Snapshot.devices_in`; None: not looked at) and the `spent` ones. A nomination with
    moves has one hold per node (`Nomination.holds`; with `devices_in`, a move hold counts
    only what its device has not landed yet)."""
    nominations = tuple(nominations)
    out = []
    for n in nominations:
        if not n.live(now) or spent(n, nominations, now):
            continue
        if devices_in is not None and admitted(n, devices_in(n.namespace)):
            continue
        if not n.moves:
            out.append(n.hold())
            continue
        lookup = None if devices_in is None else (lambda k: devices_in(k[0]).get(k[1]))
        out.extend(n.holds(lookup))
    return tuple(out)


# --- the leader's sweep: victims to stop, nominations to delete ---------------------------------


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop victim `victim` of `nomination`: delete VMI `namespace/vmi` whose uid is `uid`
    (the live incarnation the nomination names: a delete with that uid as precondition)."""

    nomination: Nomination
    victim: Victim
    uid: str


@dataclass(frozen=True, slots=True)
class Drop:
    """Delete `nomination`: `why` is "expired" (its hold released), "admitted" (its
    preemptor's set is admitted, on its node or another) or "preempted" (its preemptor is a
    victim of another live nomination: `spent`)."""

    nomination: Nomination
    why: str


@dataclass(frozen=True, slots=True)
class Sweep:
    """One round of the preemption worker: `stops` (victims still running, of live
    nominations), `drops` (nominations to delete), `waiting` (per live nomination, the number
    of its victims still running)."""

    stops: tuple[Stop, ...] = ()
    drops: tuple[Drop, ...] = ()
    waiting: tuple[tuple[Nomination, int], ...] = ()


def done(nomination: Nomination, nominations: Iterable[Nomination], now: datetime,
         devices_in: Callable[[str], Mapping[str, GPUDevice]]) -> str | None:
    """Why `nomination` is done at `now` (the `Drop.why` the leader deletes it with), None
    while it holds: "expired" (not `live`), "admitted" (`admitted`, on its node or another:
    `devices_in(namespace)` gives a namespace's devices by name) or "preempted" (`spent` among
    `nominations`). Its victims are stopped only while it holds (P6): the preemption worker
    asks again right before each delete, since a round's plan ages while it runs (a preemptor
    admitted on a node whose room came free first, mid-round, had its victim stopped for
    nothing). Pure."""
    if not nomination.live(now):
        return "expired"
    if admitted(nomination, devices_in(nomination.namespace)):
        return "admitted"
    if spent(nomination, nominations, now):
        return "preempted"
    return None


def sweep(nominations: Iterable[Nomination], now: datetime,
          vmi: Callable[[str, str], tuple[str, str | None] | None],
          devices_in: Callable[[str], Mapping[str, GPUDevice]]) -> Sweep:
    """What the leader does now for `nominations` (P4): drop the expired ones, those whose
    preemptor is admitted on its node (`admitted`) and the `spent` ones; for every other, stop
    each victim whose
    VMI still runs as the incarnation named (`vmi(namespace, name)` gives the live VMI's
    (uid, admission annotation), None when there is none; a VMI of another admission or uid
    is another incarnation: never stopped). Only a victim of a live nomination is ever
    stopped (P6). Pure; idempotent (a stopped victim's VMI is gone, a dropped nomination too)."""
    stops: list[Stop] = []
    drops: list[Drop] = []
    waiting: list[tuple[Nomination, int]] = []
    nominations = sorted(nominations, key=lambda n: n.name)
    for n in nominations:
        why = done(n, nominations, now, devices_in)
        if why is not None:
            drops.append(Drop(n, why))
            continue
        running = 0
        for v in n.victims:
            found = vmi(v.namespace, v.vmi)
            if found is None:
                continue
            uid, admission = found
            if (v.uid is not None and uid != v.uid) or (v.admission is not None and admission != v.admission):
                continue  # another incarnation of the name: not a victim
            running += 1
            stops.append(Stop(n, v, uid))
        waiting.append((n, running))
    return Sweep(tuple(stops), tuple(drops), tuple(waiting))


# --- the GPUNomination object -------------------------------------------------------------------


def nomination_body(n: Nomination, namespace: str) -> dict:
    """The `GPUNomination` object of `n`, in the controller's `namespace`."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": n.name, "namespace": namespace,
                     "labels": {"gpu.cozystack.io/preemptor-namespace": n.namespace}},
        "spec": {
            "preemptor": {"namespace": n.namespace, "vmi": n.vmi, "priority": n.priority},
            "node": n.node,
            "units": [{"resource": r, "count": c} for r, c in n.units],
            "devices": [{"driver": d.driver, "pool": d.pool, "device": d.device} for d in n.devices],
            "victims": [_victim_body(v) for v in n.victims],
            "created": format_time(n.created),
            "expires": format_time(n.expires),
            "retryAfterSeconds": n.retry_after,
            **({"moves": [_move_body(m) for m in n.moves]} if n.moves else {}),
        },
    }


def _ref_body(d: DeviceRef) -> dict:
    return {"driver": d.driver, "pool": d.pool, "device": d.device}


def _move_body(m: RoomMove) -> dict:
    out: dict[str, Any] = {"namespace": m.namespace, "name": m.name, "class": m.class_name,
                           "resource": m.resource, "fromNode": m.from_node, "toNode": m.to_node}
    if m.from_device is not None:
        out["fromDevice"] = _ref_body(m.from_device)
    if m.to_device is not None:
        out["toDevice"] = _ref_body(m.to_device)
    return out


def _victim_body(v: Victim) -> dict:
    out: dict[str, Any] = {"namespace": v.namespace, "vmi": v.vmi, "priority": v.priority,
                           "started": format_time(v.started)}
    if v.admission is not None:
        out["admission"] = v.admission
    if v.uid is not None:
        out["uid"] = v.uid
    return out


def parse_nomination(obj: Any) -> Nomination:
    """A `GPUNomination` object as a `Nomination`. Raises `model.parse.ParseError` naming
    the field for anything malformed (a missing preemptor, node or expiry, a count that is
    not a positive integer, a device without driver, pool or name, a time not RFC 3339, a
    move without its device, class, resource or nodes). An object without `spec.moves` (one
    written before moves existed) has no moves."""
    if not isinstance(obj, Mapping):
        raise ParseError(KIND, "(object)", f"must be an object, got {type(obj).__name__}")
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    what = f"{KIND} {meta.get('namespace', '<no namespace>')}/{meta.get('name', '<unnamed>')}"
    spec = _obj(what, obj.get("spec"), "spec")
    pre = _obj(what, spec.get("preemptor"), "spec.preemptor")
    units = []
    for i, u in enumerate(_list(what, spec.get("units"), "spec.units")):
        f = f"spec.units[{i}]"
        u = _obj(what, u, f)
        count = u.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ParseError(what, f"{f}.count", "must be a positive integer")
        units.append((_text(what, u.get("resource"), f"{f}.resource"), count))
    devices = [_ref(what, d, f"spec.devices[{i}]")
               for i, d in enumerate(_list(what, spec.get("devices"), "spec.devices"))]
    moves = []
    for i, m in enumerate(_list(what, spec.get("moves"), "spec.moves")):
        f = f"spec.moves[{i}]"
        m = _obj(what, m, f)
        moves.append(RoomMove(_text(what, m.get("namespace"), f"{f}.namespace"),
                              _text(what, m.get("name"), f"{f}.name"),
                              _text(what, m.get("class"), f"{f}.class"),
                              _text(what, m.get("resource"), f"{f}.resource"),
                              _text(what, m.get("fromNode"), f"{f}.fromNode"),
                              _text(what, m.get("toNode"), f"{f}.toNode"),
                              _opt_ref(what, m.get("fromDevice"), f"{f}.fromDevice"),
                              _opt_ref(what, m.get("toDevice"), f"{f}.toDevice")))
    victims = []
    for i, v in enumerate(_list(what, spec.get("victims"), "spec.victims")):
        f = f"spec.victims[{i}]"
        v = _obj(what, v, f)
        victims.append(Victim(_text(what, v.get("namespace"), f"{f}.namespace"),
                              _text(what, v.get("vmi"), f"{f}.vmi"),
                              _opt_text(what, v.get("admission"), f"{f}.admission"),
                              _opt_text(what, v.get("uid"), f"{f}.uid"),
                              _int(what, v.get("priority", 0), f"{f}.priority"),
                              _time(what, v.get("started"), f"{f}.started")))
    retry = _int(what, spec.get("retryAfterSeconds", DEFAULT_RETRY_AFTER), "spec.retryAfterSeconds")
    return Nomination(_text(what, pre.get("namespace"), "spec.preemptor.namespace"),
                      _text(what, pre.get("vmi"), "spec.preemptor.vmi"),
                      _int(what, pre.get("priority", 0), "spec.preemptor.priority"),
                      _text(what, spec.get("node"), "spec.node"),
                      tuple(sorted(units)), tuple(devices), tuple(victims),
                      _time(what, spec.get("created"), "spec.created"),
                      _time(what, spec.get("expires"), "spec.expires"), max(1, retry), tuple(moves))


def _opt_ref(what: str, value: Any, field: str) -> DeviceRef | None:
    return None if value is None else _ref(what, value, field)


def _ref(what: str, value: Any, field: str) -> DeviceRef:
    d = _obj(what, value, field)
    return DeviceRef(_text(what, d.get("driver"), f"{field}.driver"), _text(what, d.get("pool"), f"{field}.pool"),
                     _text(what, d.get("device"), f"{field}.device"))


def _obj(what: str, value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ParseError(what, field, "required, an object")
    return value


def _list(what: str, value: Any, field: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ParseError(what, field, f"must be a list, got {type(value).__name__}")
    return value


def _text(what: str, value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ParseError(what, field, "required, a non-empty string")
    return value


def _opt_text(what: str, value: Any, field: str) -> str | None:
    return None if value is None else _text(what, value, field)


def _int(what: str, value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParseError(what, field, "must be an integer")
    return value


def _time(what: str, value: Any, field: str) -> datetime:
    text = _text(what, value, field)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ParseError(what, field, f"not an RFC 3339 time: {text!r}") from None
    if when.tzinfo is None:
        raise ParseError(what, field, f"RFC 3339 time without a zone: {text!r}")
    return when.astimezone(timezone.utc)


__all__ = ["yielding", "API_VERSION", "DEFAULT_RETRY_AFTER", "DEFAULT_TTL", "HOLD_PREFIX", "KIND", "PLURAL",
           "Drop", "Nomination", "RoomMove", "Stop", "Sweep", "Victim", "admitted", "done", "sweep", "hold_id", "nomination_body", "nomination_holds",
           "nomination_name", "parse_nomination", "spent"]
