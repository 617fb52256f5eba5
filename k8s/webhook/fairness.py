"""A fair share of the webhook's concurrency per tenant that lends what is idle.

`TenantGate` admits at most `capacity` admissions at once in this replica. It is
work-conserving: a tenant (a namespace) alone may hold every slot; its share, `per_tenant`
slots, binds only while another tenant waits. An admission that finds no free slot waits in
its tenant's line (FIFO); a freed slot goes to the least recently served waiting tenant
holding fewer than its share, or, when every waiting tenant holds its share or more (the
gate is full of them), to the least recently served waiting tenant (the slot is lent: no
slot stays idle while anyone waits). So while tenant B waits, tenant A is never granted a
slot that takes it past its share, and B's turns come round-robin with the other tenants'.
An admission waits until the deadline its caller gives (the review's own, bounded by the
bind timeout), at most `max_wait` seconds when set; a line of `queue` > 0 admissions turns
one more away at once. Turned away, it gets `Busy` (the webhook answers 429, retryable:
`model.reasons.TenantBusy`). Pure bookkeeping on anyio Events: no I/O, no tasks of its own;
time is the event loop's (`anyio.move_on_after`).
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import anyio


class Busy(Exception):
    """`tenant` could not get a slot: its line is full (`waited` 0.0), or the admission
    waited `waited` seconds, until its deadline, without a slot; `in_flight` its tenant's
    slots then, `waiting` its tenant's line. Retry later."""

    def __init__(self, tenant: str, in_flight: int, waiting: int, waited: float) -> None:
        super().__init__(f"tenant {tenant}: {in_flight} admissions in flight, {waiting} waiting")
        self.tenant, self.in_flight, self.waiting, self.waited = tenant, in_flight, waiting, waited


@dataclass(frozen=True, slots=True)
class GateStatistics:
    """What the gate holds now: `in_flight` admissions holding a slot, `waiting` in lines,
    and per tenant with either, `tenants` {namespace: (in flight, waiting)}. Since the start:
    `peak_per_tenant`, the most slots one tenant held at once (up to `capacity`: a tenant
    alone borrows idle slots); `peak_contended`, the most slots one tenant held just after a
    grant made while another tenant waited (above `per_tenant` only when every tenant
    waiting then held its share or more: a slot lent rather than left idle); `lent`, grants
    that took a tenant past its share."""

    in_flight: int
    waiting: int
    tenants: dict[str, tuple[int, int]]
    peak_per_tenant: int = 0
    peak_contended: int = 0
    lent: int = 0


@dataclass(slots=True)
class _Waiter:
    event: anyio.Event = field(default_factory=anyio.Event)
    granted: bool = False


@dataclass(slots=True)
class _State:
    in_flight: int = 0
    by_tenant: dict[str, int] = field(default_factory=dict)          # tenant -> slots held
    lines: dict[str, deque[_Waiter]] = field(default_factory=dict)   # tenant -> its line
    served: dict[str, int] = field(default_factory=dict)  # tenant -> serial of its last grant
    serial: int = 0
    peak: int = 0            # the most slots one tenant held at once, ever
    peak_contended: int = 0  # the same, counted only at grants while another tenant waited
    lent: int = 0            # grants past the tenant's share


class TenantGate:
    """At most `capacity` admissions at once; `per_tenant`, a tenant's share, binds while
    other tenants wait (see the module docstring). `queue` (0: no limit) caps a tenant's line;
    `max_wait` (None: no cap of its own) caps each wait besides the caller's deadline.
    Raises ValueError unless 1 <= per_tenant <= capacity, queue >= 0 and max_wait is None
    or > 0."""

    def __init__(self, capacity: int, per_tenant: int, queue: int = 0,
                 max_wait: float | None = None) -> None:
        if (not 1 <= per_tenant <= capacity or queue < 0
                or (max_wait is not None and not max_wait > 0)):
            raise ValueError("TenantGate: need 1 <= per_tenant <= capacity, queue >= 0, "
                             "max_wait None or > 0")
        self.capacity, self.per_tenant, self.queue, self.max_wait = (capacity, per_tenant,
                                                                     queue, max_wait)
        self._s = _State()

    # -- entering and leaving -------------------------------------------------------------

    def enter_nowait(self, tenant: str) -> None:
        """Take a slot for `tenant` now. Raises `anyio.WouldBlock` when it would have to
        wait: no slot is free, or others of the tenant wait already (its line is FIFO), or
        the tenant holds its share while another tenant waits."""
        s = self._s
        if s.in_flight >= self.capacity or s.lines.get(tenant) or (
                s.by_tenant.get(tenant, 0) >= self.per_tenant and s.lines):
            raise anyio.WouldBlock
        self._grant(tenant)

    async def enter(self, tenant: str, deadline: float = math.inf) -> None:
        """`enter_nowait`, else wait in `tenant`'s line until `deadline` (event-loop time,
        `anyio.current_time()`), and at most `max_wait` seconds when set. Raises `Busy` when
        the line is full (at once) or the wait is over without a slot. Cancellation: either
        you hold a slot or you get the cancellation and hold none (a slot granted meanwhile
        is handed on)."""
        try:
            self.enter_nowait(tenant)
            return
        except anyio.WouldBlock:
            pass
        s = self._s
        line = s.lines.get(tenant, ())
        if self.queue and len(line) >= self.queue:
            raise Busy(tenant, s.by_tenant.get(tenant, 0), len(line), 0.0)
        started = anyio.current_time()
        until = deadline if self.max_wait is None else min(deadline, started + self.max_wait)
        waiter = _Waiter()
        s.lines.setdefault(tenant, deque()).append(waiter)
        try:
            with anyio.move_on_after(max(0.0, until - started)):
                await waiter.event.wait()
        except BaseException:  # cancelled: a slot granted meanwhile goes on to the next
            with anyio.CancelScope(shield=True):
                if waiter.granted:
                    self.leave(tenant)
                else:
                    self._withdraw(tenant, waiter)
            raise
        if not waiter.granted:
            self._withdraw(tenant, waiter)
            raise Busy(tenant, s.by_tenant.get(tenant, 0), len(s.lines.get(tenant, ())),
                       anyio.current_time() - started)

    def leave(self, tenant: str) -> None:
        """Give back a slot of `tenant`; the freed slot goes to the next line in turn.
        Raises ValueError when `tenant` holds none (a bug of the caller)."""
        s = self._s
        held = s.by_tenant.get(tenant, 0)
        if held <= 0:
            raise ValueError(f"TenantGate: leave({tenant!r}) without a slot")
        s.in_flight -= 1
        if held == 1:
            del s.by_tenant[tenant]
            if tenant not in s.lines:
                s.served.pop(tenant, None)  # idle: no claim to remember
        else:
            s.by_tenant[tenant] = held - 1
        self._hand_on()

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, deadline: float = math.inf) -> AsyncIterator[None]:
        """`async with gate.slot(ns, deadline):` — `enter`, then `leave` on the way out
        (raises as `enter`)."""
        await self.enter(tenant, deadline)
        try:
            yield
        finally:
            self.leave(tenant)

    # -- looking --------------------------------------------------------------------------

    def statistics(self) -> GateStatistics:
        """A frozen count (see `GateStatistics`)."""
        s = self._s
        names = set(s.by_tenant) | set(s.lines)
        return GateStatistics(
            in_flight=s.in_flight, waiting=sum(len(line) for line in s.lines.values()),
            tenants={t: (s.by_tenant.get(t, 0), len(s.lines.get(t, ()))) for t in sorted(names)},
            peak_per_tenant=s.peak, peak_contended=s.peak_contended, lent=s.lent)

    # -- internals ------------------------------------------------------------------------

    def _grant(self, tenant: str) -> None:
        s = self._s
        s.in_flight += 1
        s.by_tenant[tenant] = held = s.by_tenant.get(tenant, 0) + 1
        s.peak = max(s.peak, held)
        if held > self.per_tenant:
            s.lent += 1
        if any(t != tenant for t in s.lines):
            s.peak_contended = max(s.peak_contended, held)
        s.serial += 1
        s.served[tenant] = s.serial  # served now: last in turn

    def _withdraw(self, tenant: str, waiter: _Waiter) -> None:
        s = self._s
        line = s.lines.get(tenant)
        if line is not None:
            with contextlib.suppress(ValueError):
                line.remove(waiter)
            if not line:
                del s.lines[tenant]

    def _hand_on(self) -> None:
        """Grant free slots to the first waiter of a line: the least recently served tenant
        under its share, else (every waiting tenant holds its share) the least recently
        served one — a slot is never left idle while an admission waits."""
        s = self._s
        while s.in_flight < self.capacity and s.lines:
            under = [t for t in s.lines if s.by_tenant.get(t, 0) < self.per_tenant]
            tenant = min(under or s.lines, key=lambda t: s.served.get(t, 0))
            line = s.lines[tenant]
            waiter = line.popleft()
            if not line:
                del s.lines[tenant]
            waiter.granted = True
            self._grant(tenant)
            waiter.event.set()


class EventBudget:
    """Per-tenant token buckets for the Warning Events of denials (a flood of refused creates
    must not become a flood of Event writes on the API server, as client-go's event spam
    filter): `burst` Events at once per tenant, refilled at `per_second`. `clock` gives
    monotonic seconds (default the event loop's). Raises ValueError unless burst >= 1 and
    per_second > 0."""

    def __init__(self, burst: int = 10, per_second: float = 1.0,
                 clock: Callable[[], float] | None = None) -> None:
        if burst < 1 or per_second <= 0:
            raise ValueError("EventBudget: need burst >= 1 and per_second > 0")
        self.burst, self.per_second = burst, per_second
        self._now = clock or anyio.current_time
        self._tokens: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)
        self.dropped = 0

    def take(self, tenant: str) -> bool:
        """True when `tenant` may write one more Event now (a token is spent); False when its
        bucket is empty (counted in `dropped`). Never raises."""
        now = self._now()
        tokens, at = self._tokens.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_second)
        if tokens < 1.0:
            self._tokens[tenant] = (tokens, now)
            self.dropped += 1
            return False
        if tokens - 1.0 + 1e-9 >= self.burst - 1 and len(self._tokens) > 4096:
            self._forget_full(now)
        self._tokens[tenant] = (tokens - 1.0, now)
        return True

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (they hold nothing a fresh one would not)."""
        for tenant, (tokens, at) in list(self._tokens.items()):
            if tokens + (now - at) * self.per_second >= self.burst:
                del self._tokens[tenant]
