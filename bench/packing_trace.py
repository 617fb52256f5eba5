"""The packing benchmark's pure half: a seeded churn trace, the perfect-repacking bound, a
policy simulation and the figures every system is scored by (`gpu-binder bench packing`).

No I/O, no clock: a trace is a value made from a seed, and every function here is a function
of its arguments, so the cluster replay (`bench.packing`) and the simulation see the very same
sets in the same order.

**Trace.** A fleet of `nodes` × 8 GPUs. Sets arrive as a Poisson process; a set asks for 1, 2,
4 or 8 GPUs (50/25/15/10 %) and runs for an exponential lifetime (mean `MEAN_LIFE` trace
seconds). A share `held_share` of sets uses *held* devices (the tenant's own GPUDevices, which
outlive the VM); of those, a share `idle_share` stays held *idle* (Bound, attached to nothing)
after the VM stops, for an exponential time of mean `idle_mean` × MEAN_LIFE, and is then
deleted; every other set gives its GPUs back when its VM stops. The offered load ρ is the GPU
time asked for, idle holds included, over the fleet's: λ = ρ · 8 · nodes / (E[size] · E[occupancy]).
Arrivals before `warmup` × MEAN_LIFE fill the fleet and are not scored.

**Bound (d).** The perfect repacker admits a set iff the GPUs of every live set (running or held
idle) plus the new one fit the fleet's total. Since 1, 2, 4 and 8 each divide the next and 8,
first-fit decreasing packs any multiset of them whose sum is at most 8 · nodes into the nodes
exactly, so "fits the total" is precisely "some repacking of all live sets makes room": at every
instant no placement can admit a set the bound refuses. Over a whole trace a system can still
admit a set the bound refused (an earlier refusal of its own left room), so the bound's shares
are an upper bound per instant, and in practice, not a theorem, over a trace.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

GPUS_PER_NODE = 8
SIZES = (1, 2, 4, 8)
SIZE_WEIGHTS = (0.50, 0.25, 0.15, 0.10)
MEAN_LIFE = 100.0
"""Mean VM lifetime, in trace seconds (the trace's unit of time)."""
LOADS = (0.70, 0.85, 0.95)


@dataclass(frozen=True, slots=True)
class GpuSet:
    """One VM's GPU set in a trace.

    `arrive` ≤ `stop` ≤ `release` (trace seconds): the VM asks at `arrive`, stops at `stop`; its
    GPUs are given back at `release` (= `stop` unless the set is held and left idle). `held`: the
    set uses held devices (the tenant's GPUDevices) instead of template ones. `scored`: it arrived
    after the warm-up, so it counts in the shares."""

    id: int
    arrive: float
    size: int
    stop: float
    release: float
    held: bool
    scored: bool

    @property
    def idle(self) -> bool:
        """Held and left idle after its VM stops (release > stop)."""
        return self.release > self.stop


@dataclass(frozen=True, slots=True)
class Trace:
    """A seeded trace: the parameters it was made from and its sets, in arrival order (times
    in trace seconds)."""

    seed: int
    nodes: int
    load: float
    held_share: float
    idle_share: float
    idle_mean: float
    warmup: float
    sets: tuple[GpuSet, ...]
    window: float = 0.0
    """Trace seconds per replay window once `quantize`d (0: not quantized)."""

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def end(self) -> float:
        """Trace time of the last arrival (the scored window ends there)."""
        return self.sets[-1].arrive if self.sets else 0.0

    def events(self) -> list[tuple[float, int, str, GpuSet]]:
        """Every event in time order as (time, order, kind, set), kind one of "arrive",
        "stop" (the VM stops; an idle held set keeps its GPUs), "release" (an idle held set's
        devices are deleted). Only events up to the last arrival. At equal times releases and
        stops come before arrivals (order 0, 1 < 2)."""
        out: list[tuple[float, int, str, GpuSet]] = []
        end = self.end
        for s in self.sets:
            out.append((s.arrive, 2, "arrive", s))
            if s.stop <= end:
                out.append((s.stop, 1, "stop", s))
            if s.idle and s.release <= end:
                out.append((s.release, 0, "release", s))
        out.sort(key=lambda e: (e[0], e[1], e[3].id))
        return out


def make_trace(*, seed: int, nodes: int, load: float, arrivals: int, held_share: float = 0.3,
               idle_share: float = 0.5, idle_mean: float = 1.0, warmup: float = 2.0) -> Trace:
    """A trace of `arrivals` scored sets after a warm-up of `warmup` × MEAN_LIFE trace seconds,
    on `nodes` × 8 GPUs at offered load `load` (0 < load). Pure: the same arguments give the
    same trace. Raises ValueError on a non-positive size, load or share outside [0, 1]."""
    if nodes < 1 or arrivals < 1 or load <= 0:
        raise ValueError("nodes, arrivals and load must be positive")
    if not (0 <= held_share <= 1 and 0 <= idle_share <= 1) or idle_mean < 0:
        raise ValueError("held_share and idle_share lie in [0, 1], idle_mean ≥ 0")
    rng = random.Random(f"packing/{seed}/{nodes}/{load}")
    mean_size = sum(s * w for s, w in zip(SIZES, SIZE_WEIGHTS))
    mean_occupancy = MEAN_LIFE * (1 + held_share * idle_share * idle_mean)
    rate = load * nodes * GPUS_PER_NODE / (mean_size * mean_occupancy)
    t, sets, scored, i = 0.0, [], 0, 0
    start = warmup * MEAN_LIFE
    while scored < arrivals:
        t += rng.expovariate(rate)
        size = rng.choices(SIZES, SIZE_WEIGHTS)[0]
        stop = t + rng.expovariate(1 / MEAN_LIFE)
        held = rng.random() < held_share
        idle = held and rng.random() < idle_share and idle_mean > 0
        release = stop + rng.expovariate(1 / (idle_mean * MEAN_LIFE)) if idle else stop
        sets.append(GpuSet(i, t, size, stop, release, held, t >= start))
        scored += t >= start
        i += 1
    return Trace(seed, nodes, load, held_share, idle_share, idle_mean, start, tuple(sets))


def quantize(trace: Trace, window: float) -> Trace:
    """`trace` with every time moved to the middle of its window of `window` trace seconds
    (window k is [k·window, (k+1)·window)), a stop at least one window after its arrival and
    an idle set's release at least one after its stop: the order in which the cluster replay
    applies events (a window's stops and releases, then its arrivals), made the trace's own, so
    the bound, the simulation and every system see one and the same sequence. Pure; raises
    ValueError when `window` is not positive."""
    if window <= 0:
        raise ValueError("window must be positive")

    def k(t: float) -> int:
        return int(t // window)

    def mid(i: int) -> float:
        return (i + 0.5) * window
    sets = []
    for s in trace.sets:
        a = k(s.arrive)
        st = max(k(s.stop), a + 1)
        rel = max(k(s.release), st + 1) if s.idle else st
        sets.append(GpuSet(s.id, mid(a), s.size, mid(st), mid(rel), s.held, s.scored))
    warm = min((x.arrive for x in sets if x.scored), default=trace.warmup)
    return Trace(trace.seed, trace.nodes, trace.load, trace.held_share, trace.idle_share,
                 trace.idle_mean, warm, tuple(sets), window)


def largest_placeable(free: list[int] | tuple[int, ...]) -> int:
    """The largest set size of SIZES that fits on one node with `free` units (0 when none)."""
    top = max(free, default=0)
    return max((s for s in SIZES if s <= top), default=0)


@dataclass(slots=True)
class Outcome:
    """What one system did on a trace: the ids started, and a timeline of samples (trace
    time, GPUs used by running VMs, GPUs held idle, largest placeable set) for the plot."""

    started: set[int] = field(default_factory=set)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)


def score(trace: Trace, outcome: Outcome) -> dict:
    """The figures of one system on `trace`, every share in [0, 1]: `demand_started` (GPUs of
    scored sets started ÷ GPUs asked), `sets_started` per size, `mean_utilisation` (running
    VMs' GPUs ÷ fleet GPUs, averaged over the scored window's trace time; exact from the sets
    started, each running from its arrival to its stop), `mean_held_idle` (the same for idle
    held devices), and from the sampled timeline (step-wise between samples)
    `mean_largest_placeable` and `time_8_placeable` (share of scored time in which an 8-GPU
    set fits on one node)."""
    scored = [s for s in trace.sets if s.scored]
    asked = sum(s.size for s in scored)
    got = sum(s.size for s in scored if s.id in outcome.started)
    per_size = {}
    for size in SIZES:
        of = [s for s in scored if s.size == size]
        per_size[str(size)] = round(sum(s.id in outcome.started for s in of) / len(of), 4) if of else None
    span = trace.end - trace.warmup
    used = idle = largest = eight = 0.0
    for s in trace.sets:  # exact: a started set runs from arrive to stop, idles to release
        if s.id in outcome.started:
            used += s.size * _overlap(s.arrive, s.stop, trace.warmup, trace.end)
            idle += s.size * _overlap(s.stop, s.release, trace.warmup, trace.end)
    samples = sorted(outcome.timeline)
    for k, (t, _, _, big) in enumerate(samples):
        t0 = max(t, trace.warmup)
        t1 = min(samples[k + 1][0] if k + 1 < len(samples) else trace.end, trace.end)
        if t1 <= t0:
            continue
        largest += big * (t1 - t0)
        eight += (big >= 8) * (t1 - t0)
    gpus = trace.gpus
    return {"demand_started": round(got / asked, 4) if asked else None,
            "sets_started": per_size,
            "mean_utilisation": round(used / (gpus * span), 4) if span > 0 else None,
            "mean_held_idle": round(idle / (gpus * span), 4) if span > 0 else None,
            "mean_largest_placeable": round(largest / span, 3) if span > 0 else None,
            "time_8_placeable": round(eight / span, 4) if span > 0 else None,
            "scored_sets": len(scored), "scored_gpus": asked}


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def usage_timeline(trace: Trace, started: set[int]) -> list[tuple[float, int, int]]:
    """(trace time, GPUs of running started sets, GPUs held idle) after every event up to the
    last arrival: the utilisation curve of a system that started `started`."""
    running = idle = 0
    out = [(0.0, 0, 0)]
    for t, _, kind, s in trace.events():
        if s.id not in started:
            continue
        if kind == "arrive":
            running += s.size
        elif kind == "stop":
            running -= s.size
            idle += s.size if s.idle else 0
        else:
            idle -= s.size
        out.append((t, running, idle))
    return out


# -- simulation (no cluster) --------------------------------------------------------------

POLICIES = ("tightest", "spread", "defrag", "repack")
"""Simulated placement policies: `tightest` (B4's tightest fit: the node left with the fewest
free units, then the lowest index), `spread` (the node with the most free units: LeastAllocated
over the GPUs), `defrag` (tightest, and when a set fits nowhere, idle held sets may move:
they and the new set are re-placed by first-fit decreasing, other sets stay), `repack` (the bound)."""


def simulate(trace: Trace, policy: str) -> Outcome:
    """Replay `trace` under `policy` (one of POLICIES) in event order, one set at a time, with
    no cluster: a set is started iff the policy places it when it arrives. Raises ValueError
    on an unknown policy. This is a simulation, not a measurement of the system."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    return replay(trace, CountPlacer(trace.nodes, policy))


def replay(trace: Trace, placer) -> Outcome:
    """Replay `trace` in event order against `placer`, which owns the fleet's state: its
    `place(s) -> bool` (started or refused, at arrival), `idle(s)` (a held set's VM stopped,
    its devices kept), `release(s)` (its GPUs given back) and `largest() -> int` (the largest
    set placeable now). The loop every simulated policy shares (this module's count policies,
    `bench.packing_hgx`'s device-level ones)."""
    live: dict[int, GpuSet] = {}    # placed sets not yet released
    out = Outcome()
    running = held_idle = 0
    for t, _, kind, s in trace.events():
        if kind == "arrive":
            if placer.place(s):
                live[s.id] = s
                out.started.add(s.id)
                running += s.size
        elif s.id in live:
            if kind == "stop":
                running -= s.size
                if s.idle:
                    placer.idle(s)
                    held_idle += s.size
                    out.timeline.append((t, running, held_idle, placer.largest()))
                    continue
            else:
                held_idle -= s.size
            live.pop(s.id)
            placer.release(s)
        out.timeline.append((t, running, held_idle, placer.largest()))
    return out


class CountPlacer:
    """A count policy of POLICIES over `nodes` × 8 free units (the `replay` protocol)."""

    def __init__(self, nodes: int, policy: str) -> None:
        self.policy = policy
        self.free = [GPUS_PER_NODE] * nodes
        self.where: dict[int, int] = {}      # set id -> node (not kept by `repack`)
        self.live: dict[int, GpuSet] = {}
        self.idle_ids: set[int] = set()

    def place(self, s: GpuSet) -> bool:
        free, policy = self.free, self.policy
        if policy == "repack":
            ok = sum(free) >= s.size
            if ok:
                free[0] -= s.size  # only the total matters to the bound
        else:
            node = _place(free, s.size, policy)
            if node is None and policy == "defrag":
                ok = _defrag_place(free, self.where, self.live, self.idle_ids, s)
            else:
                ok = node is not None
                if ok:
                    free[node] -= s.size
                    self.where[s.id] = node
        if ok:
            self.live[s.id] = s
        return ok

    def idle(self, s: GpuSet) -> None:
        self.idle_ids.add(s.id)

    def release(self, s: GpuSet) -> None:
        self.idle_ids.discard(s.id)
        self.live.pop(s.id)
        self.free[self.where.pop(s.id, 0)] += s.size

    def largest(self) -> int:
        return _largest(self.free, self.policy)


def _largest(free: list[int], policy: str) -> int:
    if policy == "repack":
        return max((s for s in SIZES if s <= sum(free)), default=0)
    return largest_placeable(free)


def _place(free: list[int], size: int, policy: str) -> int | None:
    fits = [i for i, f in enumerate(free) if f >= size]
    if not fits:
        return None
    if policy == "spread":
        return min(fits, key=lambda i: (-free[i], i))
    return min(fits, key=lambda i: (free[i], i))


def _defrag_place(free: list[int], where: dict[int, int], live: dict[int, GpuSet],
                  idle: set[int], s: GpuSet) -> bool:
    """Lift every idle held set, place them and `s` by first-fit decreasing (tightest) around
    the sets that stay; on success commit (moves done), else leave everything as it was."""
    trial = list(free)
    for i in idle:
        trial[where[i]] += live[i].size
    placed: dict[int, int] = {}
    for item in sorted([*(live[i] for i in idle), s], key=lambda g: (-g.size, g.id)):
        node = _place(trial, item.size, "tightest")
        if node is None:
            return False
        trial[node] -= item.size
        placed[item.id] = node
    free[:] = trial
    where.update(placed)
    return True


def simulate_all(trace: Trace) -> dict[str, dict]:
    """`score` of every policy of POLICIES on `trace` (the simulation's report)."""
    return {p: score(trace, simulate(trace, p)) for p in POLICIES}
