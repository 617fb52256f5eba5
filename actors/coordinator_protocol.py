"""What the coordinator (actors/coordinator.py, docs/contract.md §6) is told and answers, and
its settings: `Examine`, `Resync`, `GetStatus` -> `CoordinatorStatus`, `GetLine` ->
`LineState`, `VMsWaiting` and `RefusedAtW1` (P5), and `CoordinatorConfig`. Values only: the supervisor's router, the
benchmarks and the tests speak to the coordinator with these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from model.line import Entry, Identity, Line, LineSettings
from model.nominate import NominationSettings


@dataclass(frozen=True, slots=True)
class Examine:
    """Request `request_id` of `namespace` changed: read it from the view and act if it is
    complete and lacks a result. Level based: sending it twice is harmless. `seen_at`: wall
    time (epoch seconds, the Clock's `now()`) at which the router found it complete in the
    view (None: not said); the coordinator logs the first since its last decision as the
    `decision` line's `seen_at` (`bench floor`'s split of the webhook's wait)."""

    namespace: str
    request_id: str
    seen_at: float | None = None


@dataclass(frozen=True, slots=True)
class Resync:
    """Scan every device for complete requests lacking a result (level-based safety net)."""


@dataclass(frozen=True, slots=True)
class GetStatus:
    """Reply: `CoordinatorStatus` (asks the pipeline for its part)."""


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    """Counters of this incarnation (coordinator and pipeline). `in_flight` requests hold a
    reservation (writes running, stalled, or done but not yet seen in the view); `writing`
    have writes running; `succeeded`/`refused`/`withdrawn`/`gave_up` count ended writes;
    `defrag_moves` the defragmenting moves handed to the pipeline (D2)."""

    owner: str
    pending: int
    deferred: int
    in_flight: int
    writing: int
    decided: int
    succeeded: int
    refused: int
    recovered: int
    withdrawn: int
    gave_up: int
    defrag_moves: int = 0


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Timeouts and bounds of the coordinator (seconds unless named otherwise); its
    pipeline's are `actors.status_pipeline.PipelineConfig`.

    `ask_timeout` bounds one prepare/commit round and one question to the pipeline;
    `max_rounds` decide-and-prepare rounds before a request every node actor refused is
    answered Refused; `requeue_delay` between rounds; `stalled_delay` before a request whose
    writes gave up is tried again; `resync_interval` between full scans; `poison_delay`
    before a request on which `model.decide` raised is tried again; `batch_size` requests
    decided on one snapshot; `defrag_interval` between defragmentation rounds (D1-D5; 0:
    off, the default: D3 "off unless the operator turns it on"); `missing_grace` how long a
    refusal only for devices or classes the view does not hold waits for the view to follow
    the API server, `missing_retry` between its tries (`Coordinator._awaits_view`);
    `defrag_max_moves` the
    most moves one round makes (D3); `preemption` the settings of nominating (P2's
    `preemption.minRuntime`, P4's `preemption.nominationTTL`; `model.nominate`)."""

    ask_timeout: float = 5.0
    max_rounds: int = 3
    requeue_delay: float = 0.05
    stalled_delay: float = 1.0
    resync_interval: float = 30.0
    poison_delay: float = 30.0
    batch_size: int = 64
    missing_grace: float = 1.0
    missing_retry: float = 0.25
    line: LineSettings = LineSettings()
    """P5's waiting line (`model.line.LineSettings`: `line.reserveAfter`, `line.retryGrace`,
    `line.maxPerNamespace`, `line.enabled`)."""

    defrag_interval: float = 0.0
    defrag_max_moves: int = 4
    preemption: NominationSettings = NominationSettings()


@dataclass(frozen=True, slots=True)
class VMsWaiting:
    """From the waiting-VM loop (`k8s.vm_waiting`, P5): `entries` the VMs it found waiting for
    room, refused at W1 before the coordinator saw them (each enters the line, or keeps its
    place: `model.line_plan.refresh`); `gone` the VMs it found running or stopped (they leave
    it). Level based: sent every round, twice is harmless."""

    entries: tuple[Entry, ...]
    gone: tuple[Identity, ...] = ()


@dataclass(frozen=True, slots=True)
class RefusedAtW1:
    """From the leader's webhook (`k8s.webhook.admission`, P5): a bare VMI (no VirtualMachine
    owner) that W1 refused for room, before any bindRequest is written, so before the
    coordinator saw it (`model.line_plan.w1_entry`: keyed by (namespace, vmi), its shape and
    priority). It enters the line at the coordinator's now, or keeps its place and first
    refusal (`model.line.Line.refused`, its namespace capped at `LineSettings.per_namespace`);
    it stays while its client retries (`LineSettings.retry_grace`). Told, never asked:
    dropped when the mailbox is full (the next retry tells again)."""

    entry: Entry


@dataclass(frozen=True, slots=True)
class GetLine:
    """Reply: `LineState`, the waiting line as the last batch left it (P5)."""


@dataclass(frozen=True, slots=True)
class LineState:
    """The leader's waiting line (`model.line.Line`) and the nodes reserved at the last batch
    (`model.line.reservation`: identity -> node). Empty on a new leader, which rebuilds it as
    sets are refused again (bare VMIs with their published first refusals, `model.line_memory`;
    docs/contract.md P5, *Failover keeps the published places*)."""

    line: Line
    reservations: Mapping[Identity, str]


__all__ = ["CoordinatorConfig", "CoordinatorStatus", "Examine", "GetLine", "GetStatus", "LineState",
           "RefusedAtW1", "Resync", "VMsWaiting"]
