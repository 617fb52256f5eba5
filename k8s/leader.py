"""Leader election on a coordination.k8s.io/v1 Lease, as a small loop inside an anyio task group.

Only the leader runs the binder and housekeeping. `LeaderElector.run(lead)` campaigns; when
it holds the Lease it runs `lead()` in a cancel scope next to a renew loop. If the Lease
cannot be renewed for `renew_deadline` seconds (shorter than `lease_duration`), `lead()` is
cancelled *before* another replica can take the Lease. On shutdown a held Lease is released
(holder cleared), so a successor need not wait for it to expire. Every API call has a
timeout shorter than the renew deadline, so one hung request cannot lose leadership silently.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Awaitable, Callable

import anyio
import structlog
from anyio.abc import TaskStatus
from k8s import errors
from k8s.client import KubeClient
from model.serialize import parse_time

log = structlog.get_logger("gpu_binder.leader")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _micro(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Lease name/namespace and durations in seconds (lease > renew_deadline > retry). No
    defaults: the operator's settings (`k8s.config.Config`) hold them. Raises ValueError
    when the durations are out of order."""

    namespace: str
    name: str
    lease_duration: float
    renew_deadline: float
    retry_period: float

    def __post_init__(self) -> None:
        if not (self.lease_duration > self.renew_deadline > self.retry_period > 0):
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0 "
                             f"(got {self.lease_duration}, {self.renew_deadline}, "
                             f"{self.retry_period})")


class LeaderElector:
    """Campaigns for and holds one Lease for `identity`.

    `is_leader` is True only while `lead()` may run. `transitions` counts how often this
    replica became leader. `previous_renew` is the `renewTime` the Lease carried when this
    replica last took it (its previous holder's last renewal, or its release; None when this
    replica created the Lease or the time did not parse): how recent what that holder
    published is (P5's read-back line, `model.line_memory.trust_published`). Raises nothing
    but cancellation out of `run`; API errors are logged and retried every `retry_period`.
    `client`'s Lease calls are made with the timeout `retry_period`.
    """

    def __init__(self, client: KubeClient, identity: str, config: LeaseConfig) -> None:
        self.api = client.using(timeout=config.retry_period)
        self.identity = identity
        self.cfg = config
        self.is_leader = False
        self.transitions = 0
        self._last_renew = -math.inf
        self._observed_record: tuple | None = None
        self._observed_at = -math.inf
        self.previous_renew: dt.datetime | None = None

    # -- API -----------------------------------------------------------------------------
    async def _read(self) -> dict | None:
        return await self.api.read_lease(self.cfg.namespace, self.cfg.name)

    def _spec(self, prior: dict | None, acquiring: bool) -> dict:
        now = _now()
        spec = dict((prior or {}).get("spec") or {})
        if acquiring:
            spec["acquireTime"] = _micro(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if prior else 0)
        spec.update(holderIdentity=self.identity, renewTime=_micro(now),
                    leaseDurationSeconds=int(self.cfg.lease_duration))
        return spec

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        lease = await self._read()
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                    "spec": self._spec(None, True)}
            try:
                await self.api.create_lease(self.cfg.namespace, body)
            except (errors.AlreadyExists, errors.Conflict):  # someone else created it first
                return False
            self.previous_renew = None
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.cfg.lease_duration)
        # as client-go does: time the holder by when *we* last saw its record change, on our
        # own monotonic clock, so clock skew between replicas cannot shorten a lease
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"))
        now = anyio.current_time()
        if record != self._observed_record:
            self._observed_record, self._observed_at = record, now
        expired = not holder or now - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return False
        body = dict(lease)
        body["spec"] = self._spec(lease, acquiring=holder != self.identity)
        try:
            await self.api.replace_lease(self.cfg.namespace, self.cfg.name, body)
        except (errors.AlreadyExists, errors.Conflict):  # lost a race: the next round reads
            return False
        if not self.is_leader:  # taking it (from another holder, a release, or our former self)
            self.previous_renew = parse_time(spec.get("renewTime"))
        return True

    async def release(self) -> None:
        """Clear the holder if this replica holds the Lease (best effort, bounded)."""
        with anyio.move_on_after(self.cfg.retry_period, shield=True):
            try:
                lease = await self._read()
                if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    lease["spec"]["holderIdentity"] = ""
                    lease["spec"]["leaseDurationSeconds"] = 1
                    await self.api.replace_lease(self.cfg.namespace, self.cfg.name, lease)
                    log.info("lease released", lease=self.cfg.name, identity=self.identity)
            except Exception as exc:  # noqa: BLE001 - shutdown path, log and go
                log.warning("lease release failed", lease=self.cfg.name, error=repr(exc)[:200])

    # -- loop ----------------------------------------------------------------------------
    async def _attempt(self) -> bool:
        try:
            ok = await self._try_acquire_or_renew()
        except Exception as exc:  # noqa: BLE001 - API down: not leader this round
            log.warning("lease attempt failed", lease=self.cfg.name, error=repr(exc)[:200])
            return False
        if ok:
            self._last_renew = anyio.current_time()
        return ok

    async def run(self, lead: Callable[[], Awaitable[None]], *,
                  task_status: TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Campaign forever; run `lead()` while holding the Lease. Returns only if `lead`
        returns on its own; cancellation releases a held Lease."""
        task_status.started()
        try:
            while True:
                while not await self._attempt():
                    await anyio.sleep(self.cfg.retry_period)
                self.is_leader = True
                self.transitions += 1
                log.info("became leader", lease=self.cfg.name, identity=self.identity)
                finished = await self._lead(lead)
                self.is_leader = False
                if finished:
                    return
                log.warning("stopped leading: lease not renewed within the deadline",
                            lease=self.cfg.name, identity=self.identity)
                await anyio.sleep(self.cfg.retry_period)
        finally:
            was = self.is_leader
            self.is_leader = False
            if was:
                await self.release()

    async def _lead(self, lead: Callable[[], Awaitable[None]]) -> bool:
        """Run lead() beside the renew loop; True if lead() returned, False if renewal lapsed."""
        result = {"finished": False}
        async with anyio.create_task_group() as tg:
            async def renew() -> None:
                while True:
                    await anyio.sleep(self.cfg.retry_period)
                    left = self._last_renew + self.cfg.renew_deadline - anyio.current_time()
                    with anyio.move_on_after(max(left, 0.05)):
                        await self._attempt()
                    if anyio.current_time() - self._last_renew > self.cfg.renew_deadline:
                        tg.cancel_scope.cancel()
                        return

            async def leading() -> None:
                await lead()
                result["finished"] = True
                tg.cancel_scope.cancel()

            tg.start_soon(renew)
            tg.start_soon(leading)
        return result["finished"]
