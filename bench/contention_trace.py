"""The contention benchmark's trace (`gpu-binder bench contention`, issue 39 item 6), pure:
a seeded churn of GPU sets of two tiers at an offered load above 1.

A lane is `nodes` HGX boards of 8 GPUs. Sets arrive as a Poisson process over
`warmup + span` seconds of wall time (the trace's unit is the wall second: latencies are
what the benchmark measures); a set asks for 1, 2, 4 or 8 GPUs (50/25/15/10 %, as
`bench.packing_trace`), is of tier `on-demand` with probability `on_demand_share`, else
`preemptible`, and once started runs for an exponential `life` (mean `mean_life` s). A set
that waits still wants its whole life: it runs `life` seconds from its start (a preempted
set, restarted, runs what is left of it). The offered load ρ is GPU time asked over the
lane's: λ = ρ · 8 · nodes / (E[size] · mean_life), and the lives drawn are then scaled by
one factor so that the sets arriving in the scored span offer exactly ρ (`offered`). Arrivals
before `warmup` fill the lane and are not scored.

No I/O, no clock: the same arguments give the same trace, so every lane of a run replays
the same sets in the same order.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from bench.packing_trace import GPUS_PER_NODE, SIZE_WEIGHTS, SIZES

ON_DEMAND, PREEMPTIBLE = "on-demand", "preemptible"
TIERS = (ON_DEMAND, PREEMPTIBLE)
"""The tiers, highest first."""
PRIORITY = {ON_DEMAND: 1000, PREEMPTIBLE: 100}
"""Each tier's PriorityClass value (both `preemptionPolicy: PreemptLowerPriority`)."""


@dataclass(frozen=True, slots=True)
class CSet:
    """One VM's GPU set: asks at `arrive` (s from the trace's start) for `size` GPUs, of
    `tier`, and runs `life` s once started; `scored` when it arrived after the warm-up."""

    id: int
    arrive: float
    size: int
    tier: str
    life: float
    scored: bool

    @property
    def priority(self) -> int:
        return PRIORITY[self.tier]


@dataclass(frozen=True, slots=True)
class CTrace:
    """A seeded trace (module docstring): its parameters and its sets in arrival order."""

    seed: int
    nodes: int
    load: float
    mean_life: float
    warmup: float
    span: float
    on_demand_share: float
    sets: tuple[CSet, ...]

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def end(self) -> float:
        """The trace's end (s): warm-up plus the scored span; every set arrives before it.
        A lane's drain follows it (`bench.contention`)."""
        return self.warmup + self.span

    def digest(self) -> str:
        """sha256 over the sets (id, arrive, size, tier, life), 16 hex digits."""
        h = hashlib.sha256()
        for s in self.sets:
            h.update(f"{s.id},{s.arrive:.6f},{s.size},{s.tier},{s.life:.6f};".encode())
        return h.hexdigest()[:16]


def make_trace(*, seed: int, nodes: int, load: float, mean_life: float, span: float,
               warmup: float, on_demand_share: float = 0.3) -> CTrace:
    """The trace of the module docstring. Pure. Raises ValueError for a non-positive
    `nodes`, `load`, `mean_life` or `span`, a negative `warmup`, or a share outside [0, 1]."""
    if nodes < 1 or load <= 0 or mean_life <= 0 or span <= 0 or warmup < 0:
        raise ValueError("nodes, load, mean_life and span must be positive, warmup >= 0")
    if not 0 <= on_demand_share <= 1:
        raise ValueError(f"on_demand_share lies in [0, 1], got {on_demand_share}")
    rng = random.Random(f"contention/{seed}/{nodes}/{load}")
    mean_size = sum(s * w for s, w in zip(SIZES, SIZE_WEIGHTS))
    rate = load * nodes * GPUS_PER_NODE / (mean_size * mean_life)
    t, sets = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= warmup + span:
            break
        size = rng.choices(SIZES, SIZE_WEIGHTS)[0]
        tier = ON_DEMAND if rng.random() < on_demand_share else PREEMPTIBLE
        life = rng.expovariate(1 / mean_life)
        sets.append(CSet(len(sets), t, size, tier, life, t >= warmup))
    # calibrated: lives scaled so that the scored span offers exactly `load` (a short
    # trace's Poisson draw alone can miss it by half)
    asked = sum(s.size * s.life for s in sets if s.scored)
    k = load * nodes * GPUS_PER_NODE * span / asked if asked else 1.0
    sets = [CSet(s.id, s.arrive, s.size, s.tier, s.life * k, s.scored) for s in sets]
    return CTrace(seed, nodes, load, mean_life, warmup, span, on_demand_share, tuple(sets))


def offered(trace: CTrace) -> float:
    """The trace's realised offered load over the scored span: GPU-seconds asked by the
    sets arriving in it ÷ the lane's GPU-seconds."""
    asked = sum(s.size * s.life for s in trace.sets if s.scored)
    return asked / (trace.gpus * trace.span)
