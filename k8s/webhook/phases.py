"""Where one admission's time goes (issue 40): a recorder per review, its phases timed where
`k8s.webhook.admission` calls the steps, handed to a `PhaseObserver` (the replica's
metrics: `gpu_binder_admission_phase_seconds{phase,mode}`) once the VMI is admitted.

The recorder lives in a context variable set by `recording()` for one review, so a step
wrapped in `phase(name)` adds its seconds to that review's recorder and to no other (anyio
tasks copy the context they start in); outside `recording()`, `phase` costs one lookup and
records nothing. No I/O: two `time.perf_counter()` readings per phase. A review may also
`mark` wall instants (epoch seconds, read by the caller's clock) for its log line: the
webhook marks its wait for the binder's result (`bench floor` joins them with the leader's).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

PHASES = ("precheck", "turn", "live-read", "judge", "take-over", "template-create", "attach",
          "wait-result", "record-wait", "claim", "patch-build", "total")
"""The phases `k8s.webhook.admission` records, in the order an admission meets them
(docs/metrics.md): `precheck` W1 on the cache and the tenant's budget in flight (no I/O);
`turn` the wait for a turn of the tenant's fair share (`TenantGate`); `live-read` W1's GET
of the VMI's name (`steps.check_name_free`); `judge` W1 again on the snapshot after it;
`take-over` W4's re-keying writes (an admitted set retried); `template-create` W3 (1),
`steps.create_templates` (the template GPUDevices created, with whatever that step waits
for); `attach` W3 (2)+(3), `steps.attach_all` (each device's attachment+request JSON Patch,
with the reads it makes); `wait-result` W3 (4), the wait on the
informer for the binder's results (its decision and status write, and two watch
deliveries, inside); `record-wait` device mode, the wait on the cache for the members'
records (DR5); `claim` device mode, the ResourceClaim created (DR5) and the VMI's patch
built; `patch-build` count mode, the VMI's JSONPatch built; `total` the whole review in
`VMIAdmission.handle` (the rest of it, between the phases, is the webhook's own time)."""
MODES = ("count", "device")
"""An admitted set's mode: `device` when its claim was wired (DR5), else `count`."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """One admitted review's phases: `mode` (one of MODES), `seconds` (phase name →
    seconds, summed when a phase ran more than once; only the phases met) and `total`
    (seconds of the whole review)."""

    mode: str
    seconds: tuple[tuple[str, float], ...]
    total: float


@dataclass(slots=True)
class Recorder:
    """The phases of one review so far (`recording()` makes it): `clock` returns seconds
    (monotonic), `started` its reading at the start, `seconds` per phase name, `mode` once
    `set_mode` said it (None: not admitted with a patch, nothing to observe), `marks` the
    wall instants `mark` noted (name → epoch seconds; not observed as phases)."""

    clock: Callable[[], float] = time.perf_counter
    started: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    mode: str | None = None
    marks: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` to phase `name` (a phase met twice, e.g. a retried read, sums)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def finish(self) -> Recorded | None:
        """The review's `Recorded` (`total` up to now), None when no mode was set."""
        if self.mode is None:
            return None
        total = self.clock() - self.started
        return Recorded(self.mode, tuple(self.seconds.items()), total)


class PhaseObserver(Protocol):
    """Told of every admitted review's phases (k8s.metrics.Metrics)."""

    def admission_phases(self, recorded: Recorded) -> None: ...


_CURRENT: ContextVar[Recorder | None] = ContextVar("gpu_binder_admission_phases", default=None)


@contextmanager
def recording(clock: Callable[[], float] = time.perf_counter) -> Iterator[Recorder]:
    """A fresh `Recorder` for the review run inside (`clock`: seconds, monotonic); the
    previous one (normally none) is back afterwards. Raises nothing of its own."""
    rec = Recorder(clock, clock())
    token = _CURRENT.set(rec)
    try:
        yield rec
    finally:
        _CURRENT.reset(token)


class phase:  # noqa: N801 - used as a statement, like contextlib's context managers
    """`with phase("attach"): ...` (or `async with`): the seconds spent inside are added to
    phase `name` of the review being recorded (none: nothing recorded), whether the body
    returns, raises or is cancelled. Not reentrant: one `phase` object per `with`."""

    __slots__ = ("name", "rec", "t0")

    def __init__(self, name: str) -> None:
        self.name = name
        self.rec = _CURRENT.get()
        self.t0 = 0.0

    def __enter__(self) -> None:
        if self.rec is not None:
            self.t0 = self.rec.clock()

    def __exit__(self, *exc: object) -> None:
        if self.rec is not None:
            self.rec.add(self.name, self.rec.clock() - self.t0)

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


def mark(name: str, wall: float) -> None:
    """Note wall instant `name` (epoch seconds, e.g. `datetime.timestamp()` of the webhook's
    clock) of the review being recorded; a later mark of the same name replaces it. Nothing
    recorded: no effect."""
    rec = _CURRENT.get()
    if rec is not None:
        rec.marks[name] = wall


def marked(*phases: str) -> dict[str, float]:
    """The review being recorded: its marks (`mark`) and, for each of `phases` it met, that
    phase's seconds so far as `<phase>_s` (dashes as underscores), for its log line; {}
    outside `recording()`."""
    rec = _CURRENT.get()
    if rec is None:
        return {}
    out = dict(rec.marks)
    for name in phases:
        if name in rec.seconds:
            out[name.replace("-", "_") + "_s"] = rec.seconds[name]
    return out


def set_mode(mode: str) -> None:
    """Say the review being recorded was admitted in `mode` (one of MODES; its phases are
    then observed). Raises ValueError for another mode; nothing recorded: no effect."""
    if mode not in MODES:
        raise ValueError(f"mode is one of {MODES}, got {mode!r}")
    rec = _CURRENT.get()
    if rec is not None:
        rec.mode = mode
