"""NodeActor: the only owner of one node's free capacity (docs/contract.md §6).

Its ledger, per resource: `allocatable` and `bound` (re-read from the ClusterView, level
based), plus one `model.hold.Hold` per request id: prepared (reserved, expiring after
`prepare_ttl`) or committed (decided, writes in flight; kept until released, until the view
shows every member that lands here as Bound here, or, as a safety net, until `commit_ttl`).
A hold only counts what has not landed yet (`model.hold.outstanding`, the rule the
coordinator and the snapshot use too), so capacity is never counted twice while writes
progress.

Two-phase protocol, spoken by the Coordinator: `Prepare` → `Prepared(incarnation, …)` or
`PrepareRefused(reason)`; `Commit(incarnation)` → `Committed` or `CommitRefused` (e.g. the
ledger was rebuilt: every (re)start has a fresh incarnation number and starts without
holds); `Abort`; `Release`. A refusal's reason is a typed value of `model.reasons` (rendered
only at the edges). Every decision is one JSON log line carrying `node=<name>`.

Device mode (DR2): a hold may name devices of the node (`Hold.devices`); the ledger refuses
a prepare naming one that another lease holds, that a Bound device outside the request
records (`status.device`), or that a claim allocates or a taint covers
(`Node.taken_devices`) with `DevicesTaken`. Commit, abort, release and expiry free the
names with the hold; a member stops holding its name once the view shows it recorded. A hold
that only re-points members already Bound here (no units, nothing lands: B5(a)/(b) keeping a
set on its cordoned node, DR4) is not refused for the node's placement problems (cordon …).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import structlog

from actors.ports import Clock, ClusterView
from actors.runtime import Actor, ActorContext
from model.hold import Hold, outstanding
from model.reasons import (DevicesTaken, LedgerRebuilt, NodeGone, NodeUnfit, NoRoom, NoReservation, Reason,
                           Short)
from model.device.records import taken_names
from model.device.topology import natural_key
from model.types import Node

_log = structlog.get_logger("gpu_binder.node")


def _info_enabled() -> bool:
    """Whether INFO lines are emitted (a filtering logger below INFO drops them): a hot
    path skips computing the fields of a line that would be dropped."""
    check = getattr(_log, "is_enabled_for", None)
    return True if check is None else bool(check(logging.INFO))

_incarnations = itertools.count(1)
"""Process-wide: no two NodeActor incarnations share a number, whatever their node."""


# -- messages and replies ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepare:
    """Reserve `hold` (its `needs` on this node) for its request. Members of `hold.landing`
    stop counting once the view shows them landed (`model.hold.outstanding`). `owner`
    identifies the coordinator incarnation. Re-preparing a request replaces its hold.
    Reply: `Prepared` or `PrepareRefused`."""

    hold: Hold
    owner: str = ""

    @property
    def request_id(self) -> str:
        return self.hold.request_id


@dataclass(frozen=True, slots=True)
class Prepared:
    node: str
    request_id: str
    incarnation: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class PrepareRefused:
    """The hold was not taken: the node is unfit (`NodeUnfit`: gone, cordoned, not Ready …),
    its ledger is short of free units (`Short`: one `NoRoom` per resource), or (device mode,
    DR2) a named device is not free (`DevicesTaken`)."""

    node: str
    request_id: str
    reason: NodeUnfit | Short | DevicesTaken


@dataclass(frozen=True, slots=True)
class Commit:
    """Turn the prepared hold into a committed one; refused when `incarnation` is not the
    ledger's (it was rebuilt since the prepare) or the hold is gone (expired, aborted).
    Reply: `Committed` or `CommitRefused`. Idempotent."""

    request_id: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class Committed:
    node: str
    request_id: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class CommitRefused:
    """The hold was not committed: the ledger was rebuilt since the prepare
    (`LedgerRebuilt`) or the hold is gone (`NoReservation`: expired or aborted)."""

    node: str
    request_id: str
    reason: LedgerRebuilt | NoReservation


@dataclass(frozen=True, slots=True)
class Claim:
    """`hold` committed without a capacity check: the decision was already made (B7
    recovery after a coordinator restart). Reply: `Committed`."""

    hold: Hold
    owner: str = ""

    @property
    def request_id(self) -> str:
        return self.hold.request_id


@dataclass(frozen=True, slots=True)
class Abort:
    """Drop the hold of `request_id` (no-op when there is none). Reply: True if one was
    dropped."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Release:
    """The coordinator is done with `request_id` (its writes finished and the view shows
    them, or it stopped). Drops the hold. Reply: True if one was dropped."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Adopt:
    """A new coordinator incarnation `owner` took over: drop holds of every other owner
    (their decisions are re-made or recovered by the new one)."""

    owner: str


@dataclass(frozen=True, slots=True)
class NodeChanged:
    """The Node object changed (allocatable, cordon, labels, deleted): re-read it."""


@dataclass(frozen=True, slots=True)
class DevicesChanged:
    """Classes (their resource names) changed: re-read what is Bound here. Device changes
    need no message: every prepare, claim and ledger read re-reads the view."""


@dataclass(frozen=True, slots=True)
class GetLedger:
    """Reply: the `Ledger` now."""


@dataclass(frozen=True, slots=True)
class Ledger:
    """A frozen view of the ledger. `held` = units held by holds and not landed yet
    (prepared + committed); `free` = allocatable − bound − foreign − held (negative:
    overcommitted, e.g. allocatable lowered under bound devices; foreign = `Node.foreign`,
    Pods outside the binder)."""

    node: str
    incarnation: int
    exists: bool
    unschedulable: bool
    allocatable: Mapping[str, int]
    bound: Mapping[str, int]
    prepared: Mapping[str, int]
    committed: Mapping[str, int]
    free: Mapping[str, int]
    holds: tuple[str, ...]
    held_devices: tuple[str, ...] = ()
    """Device mode (DR2): names of this node's devices the holds take (not recorded yet)."""


# -- configuration ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeActorConfig:
    """`prepare_ttl`: a prepared hold neither committed nor aborted expires after it.
    `commit_ttl`: safety net for a committed hold nobody releases. `sweep_interval`: how
    often expiry is checked when no message arrives (it is also checked on every message)."""

    prepare_ttl: float = 10.0
    commit_ttl: float = 300.0
    sweep_interval: float = 1.0


@dataclass(slots=True)
class _Lease:
    """How the ledger keeps one `Hold`: for which coordinator incarnation (`owner`),
    prepared or committed, until when. The capacity itself is the hold's."""

    hold: Hold
    owner: str
    committed: bool
    expires_at: float


_UNREAD: Any = object()
"""`_State.node` before the first read of the Node."""


@dataclass(slots=True)
class _State:
    node: Node | None = _UNREAD  # the Node object the fields below were read from
    exists: bool = False
    unschedulable: bool = False
    problems: list[Reason] = field(default_factory=list)  # Node.placement_reasons (B3)
    allocatable: dict[str, int] = field(default_factory=dict)
    foreign: dict[str, int] = field(default_factory=dict)
    bound: dict[str, int] = field(default_factory=dict)
    holds: dict[str, _Lease] = field(default_factory=dict)


class NodeActor(Actor):
    """The actor of node `node` (see the module docstring). Build one per incarnation."""

    def __init__(
        self,
        node: str,
        view: ClusterView,
        clock: Clock,
        config: NodeActorConfig | None = None,
    ) -> None:
        self.node = node
        self.name = f"node:{node}"
        self._view = view
        self._clock = clock
        self._cfg = config or NodeActorConfig()
        self.tick_interval = self._cfg.sweep_interval
        self.incarnation = next(_incarnations)
        self._st = _State()

    def log_context(self) -> Mapping[str, Any]:
        return {"actor": "node", "node": self.node}

    def reservations(self) -> int:
        return len(self._st.holds)

    async def on_start(self, ctx: ActorContext) -> None:
        self._read_node()
        self._read_bound()
        _log.info("rebuild", incarnation=self.incarnation, **self._ledger_fields())

    def wants_tick(self) -> bool:
        """Ticks only expire and settle holds: none wanted while there are none."""
        return bool(self._st.holds)

    async def on_tick(self) -> None:
        """Expire holds whose time is up; drop committed holds whose members all landed
        here (the coordinator releases them too; this covers a lost `Release`)."""
        self._sweep()
        if self._st.holds:
            self._read_bound()
            self._settle()

    async def receive(self, message: Any) -> Any:
        self._sweep()
        match message:
            case Prepare():
                return self._prepare(message)
            case Commit():
                return self._commit(message)
            case Abort(request_id):
                return self._drop(request_id, "abort")
            case Release(request_id):
                return self._drop(request_id, "release")
            case Claim():
                return self._claim(message)
            case Adopt(owner):
                return self._adopt(owner)
            case NodeChanged():
                return self._node_changed()
            case DevicesChanged():
                self._read_bound()
                return None
            case GetLedger():
                self._read_bound()
                return self.ledger()
        raise TypeError(f"{self.name}: unexpected message {message!r}")

    # -- reading the view -----------------------------------------------------------------

    def _read_node(self) -> None:
        st = self._st
        node = self._view.node(self.node)
        if node is st.node:  # model values are immutable: the same object, the same fields
            return
        st.node = node
        st.exists = node is not None
        st.unschedulable = bool(node and node.unschedulable)
        st.problems = node.placement_reasons() if node else []
        st.allocatable = dict(node.allocatable) if node else {}
        st.foreign = dict(node.foreign) if node else {}

    def _read_bound(self) -> None:
        classes = self._view.classes()
        bound: dict[str, int] = {}
        for dev in self._view.devices_on(self.node):
            c = classes.get(dev.class_name)
            if c is not None:
                bound[c.resource_name] = bound.get(c.resource_name, 0) + 1
        self._st.bound = bound

    def _outstanding(self, lease: _Lease) -> dict[str, int]:
        """Units of the lease's hold not landed here yet (`model.hold.outstanding`)."""
        return dict(outstanding(lease.hold, self._view.device).needs)

    def _held(self, *, exclude: str | None = None) -> tuple[dict[str, int], dict[str, int]]:
        prepared: dict[str, int] = {}
        committed: dict[str, int] = {}
        for rid, hold in self._st.holds.items():
            if rid == exclude:
                continue
            into = committed if hold.committed else prepared
            for res, n in self._outstanding(hold).items():
                if n > 0:
                    into[res] = into.get(res, 0) + n
        return prepared, committed

    # -- the protocol ---------------------------------------------------------------------

    def _prepare(self, msg: Prepare) -> Prepared | PrepareRefused:
        st = self._st
        self._read_node()
        self._read_bound()
        needs = {res: n for res, n in msg.hold.needs if n > 0}
        named = msg.hold.devices
        reason: NodeUnfit | Short | DevicesTaken | None = None
        # B5(a)/(b), DR4: a hold that only re-points members already Bound here (no units, nothing
        # lands) is a status write on a set kept here, taken whatever the node's placement problems
        repoint_only = bool(named) and not needs and not msg.hold.landing
        if (needs or named) and not st.exists:
            reason = NodeUnfit((NodeGone(),))
        elif (needs or named) and st.problems and not repoint_only:
            reason = NodeUnfit(tuple(st.problems))
        else:
            prepared, committed = self._held(exclude=msg.request_id)
            short = []
            for res, n in sorted(needs.items()):
                free = (st.allocatable.get(res, 0) - st.bound.get(res, 0) - st.foreign.get(res, 0)
                        - prepared.get(res, 0) - committed.get(res, 0))
                if n > free:
                    short.append(NoRoom(res, n, max(free, 0)))
            if short:
                reason = Short(tuple(short))
            elif named:
                taken = self._taken_names(msg.hold)
                if taken:
                    reason = DevicesTaken(taken)
        if reason is not None:
            _log.info("prepare", outcome="refused", request_id=msg.request_id,
                      needs=needs, reason=reason.render(), incarnation=self.incarnation)
            return PrepareRefused(self.node, msg.request_id, reason)
        expires_at = self._clock.monotonic() + self._cfg.prepare_ttl
        hold = _Lease(msg.hold, msg.owner, False, expires_at)
        st.holds[msg.request_id] = hold
        if _info_enabled():
            for res, n in self._outstanding(hold).items():  # the ledger's free, without recounting
                if n > 0:
                    prepared[res] = prepared.get(res, 0) + n
            _log.info("prepare", outcome="reserved", request_id=msg.request_id, needs=needs,
                      incarnation=self.incarnation, ttl=self._cfg.prepare_ttl,
                      free=self._free(prepared, committed))
        return Prepared(self.node, msg.request_id, self.incarnation, expires_at)

    def _taken_names(self, hold: Hold) -> tuple[str, ...]:
        """Device mode (DR2): the devices `hold` names that are not free on this node
        (`model.device.records.taken_names`: taken by a claim or a taint, recorded by a
        Bound device here that is not a member of the hold's request, or held by another
        request's lease not recorded by its member yet)."""
        own = {key for key, _ in hold.devices} | {key for key, _ in hold.landing}
        return taken_names([ref.device for _, ref in hold.devices], self._st.node,
                           self._view.devices_on(self.node), own,
                           self._held_names(exclude=hold.request_id))

    def _held_names(self, *, exclude: str | None = None) -> set[str]:
        """Names of this node's devices the leases hold (members not recording them yet)."""
        out: set[str] = set()
        for rid, lease in self._st.holds.items():
            if rid != exclude and lease.hold.devices:
                out |= outstanding(lease.hold, self._view.device).device_names
        return out

    def _commit(self, msg: Commit) -> Committed | CommitRefused:
        hold = self._st.holds.get(msg.request_id)
        reason: LedgerRebuilt | NoReservation | None = None
        if msg.incarnation != self.incarnation:
            reason = LedgerRebuilt(self.incarnation, msg.incarnation)
        elif hold is None:
            reason = NoReservation()
        if reason is not None:
            _log.info("commit", outcome="refused", request_id=msg.request_id,
                      reason=reason.render(), incarnation=self.incarnation)
            return CommitRefused(self.node, msg.request_id, reason)
        assert hold is not None
        if not hold.committed:
            hold.committed = True
            hold.expires_at = self._clock.monotonic() + self._cfg.commit_ttl
            _log.info("commit", outcome="committed", request_id=msg.request_id,
                      needs=dict(hold.hold.needs), incarnation=self.incarnation)
        return Committed(self.node, msg.request_id, self.incarnation)

    def _claim(self, msg: Claim) -> Committed:
        needs = {res: n for res, n in msg.hold.needs if n > 0}
        expires_at = self._clock.monotonic() + self._cfg.commit_ttl
        self._st.holds[msg.request_id] = _Lease(msg.hold, msg.owner, True, expires_at)
        self._read_node()
        self._read_bound()
        _log.info("claim", request_id=msg.request_id, needs=needs, incarnation=self.incarnation,
                  **(self._free_field() if _info_enabled() else {}))
        return Committed(self.node, msg.request_id, self.incarnation)

    def _drop(self, request_id: str, event: str) -> bool:
        hold = self._st.holds.pop(request_id, None)
        _log.info(event, request_id=request_id, released=hold is not None,
                  committed=bool(hold and hold.committed), incarnation=self.incarnation)
        return hold is not None

    def _adopt(self, owner: str) -> list[str]:
        dropped = [rid for rid, h in self._st.holds.items() if h.owner != owner]
        for rid in dropped:
            del self._st.holds[rid]
        _log.info("adopt", owner=owner, dropped=dropped, incarnation=self.incarnation)
        return dropped

    def _node_changed(self) -> Ledger:
        self._read_node()
        self._read_bound()
        ledger = self.ledger()
        over = sorted(res for res, f in ledger.free.items() if f < 0)
        _log.info("node_changed", exists=ledger.exists, unschedulable=ledger.unschedulable,
                  allocatable=dict(ledger.allocatable), overcommitted=over,
                  incarnation=self.incarnation)
        return ledger

    def _sweep(self) -> None:
        """Drop prepared and committed holds whose time is up."""
        now = self._clock.monotonic()
        for rid, hold in list(self._st.holds.items()):
            if hold.expires_at <= now:
                del self._st.holds[rid]
                _log.info("expire", request_id=rid, committed=hold.committed,
                          needs=dict(hold.hold.needs), incarnation=self.incarnation)

    def _settle(self) -> None:
        """Drop committed holds whose members all landed here (writes observed)."""
        for rid, hold in list(self._st.holds.items()):
            if (hold.committed and (hold.hold.landing or hold.hold.devices)
                    and outstanding(hold.hold, self._view.device).empty):
                del self._st.holds[rid]
                _log.info("release", request_id=rid, released=True, committed=True,
                          reason="observed", incarnation=self.incarnation)

    # -- views ----------------------------------------------------------------------------

    def ledger(self) -> Ledger:
        st = self._st
        prepared, committed = self._held()
        return Ledger(self.node, self.incarnation, st.exists, st.unschedulable,
                      dict(st.allocatable), dict(st.bound), prepared, committed,
                      self._free(prepared, committed), tuple(sorted(st.holds)),
                      tuple(sorted(self._held_names(), key=natural_key)))

    def _free(self, prepared: Mapping[str, int], committed: Mapping[str, int]) -> dict[str, int]:
        """`Ledger.free` given the units held (prepared, committed), sorted by resource."""
        st = self._st
        resources = set(st.allocatable) | set(st.bound) | set(prepared) | set(committed)
        return {r: st.allocatable.get(r, 0) - st.bound.get(r, 0) - st.foreign.get(r, 0)
                - prepared.get(r, 0) - committed.get(r, 0) for r in sorted(resources)}

    def _ledger_fields(self) -> dict[str, Any]:
        led = self.ledger()
        return {"exists": led.exists, "unschedulable": led.unschedulable,
                "allocatable": dict(led.allocatable), "bound": dict(led.bound)}

    def _free_field(self) -> dict[str, Any]:
        return {"free": dict(self.ledger().free)}
