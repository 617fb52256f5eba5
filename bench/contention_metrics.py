"""The contention benchmark's figures (`gpu-binder bench contention`), pure: what one lane
did, as the driver recorded it (`LaneLog`), turned into start latencies, GPU-hours,
utilisation, priority inversions and the check of every preemption against a brute-force
minimum. No I/O, no clock: every time is seconds from the trace's start.

A set's *wait* begins when it first asks (its create; for a preempted set, when its VMI or
Pod was deleted under it) and ends when its launcher Pod is bound with its claim allocated
(`Run.start`); a wait that never ends is *censored* at the lane's end (`lane_end`). A *run*
occupies its GPUs (indices 0-7 of an `hgx-h100-8` board in PCI order,
`bench.packing_hgx.NAMES`) on its node from `start` until `stop`.

A lane ends after the trace's end (`CTrace.end`, the last arrival before it): its *drain*
(`bench.contention`), no set arriving, ends when every scored set is running or done, or at a
cap (`LaneLog.end`, `LaneLog.drain_capped`). What is scored stays the trace's: the scored sets
are those that arrived after the warm-up, utilisation is over the scored span and GPU-hours
over the trace (a run's time in the drain counts in neither); the waits of scored sets count
whenever they end, in the drain included, and only a wait still open at the lane's end is a
lower bound. Inversions and preemptions are checked over the whole lane, its drain included
(the binder and its rules are the same then); `lane_figures` says how many fell in the drain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from bench.common import quantile
from bench.contention_trace import TIERS, CTrace
from bench.packing_hgx import dra_choice
from bench.packing_trace import GPUS_PER_NODE, SIZES

_ALL = frozenset(range(GPUS_PER_NODE))


@dataclass(frozen=True, slots=True)
class Wait:
    """Set `set_id` waited from `begin`; `decided` when its placement was taken (the
    binder's admission, or kube-scheduler's bind), None when never; `first` its first ask
    (False: the wait of a preempted set, asked again)."""

    set_id: int
    begin: float
    decided: float | None
    first: bool = True


@dataclass(frozen=True, slots=True)
class Run:
    """Set `set_id` ran on `node` with GPUs `gpus` from `start` (launcher Pod bound, claim
    allocated) to `stop` (its life over, preempted, or the trace's end); `preempted` when
    it was stopped for another set (its VMI deleted by the binder, its Pod by
    kube-scheduler). Its GPUs count as taken from `taken` (device checks: inversions, the
    brute force) until `freed`, as running from `start` to `stop` (utilisation, GPU-hours)."""

    set_id: int
    node: str
    gpus: tuple[int, ...]
    start: float
    stop: float
    preempted: bool = False
    held_from: float | None = None
    """When its GPUs were taken (the binder's admission; None: at `start`)."""
    held_until: float | None = None
    """When the binder's record let them go (its template GPUDevices deleted, H2; None: at
    `stop`)."""

    @property
    def taken(self) -> float:
        """When the run's GPUs stopped being free: `held_from`, else `start`."""
        return self.start if self.held_from is None else min(self.held_from, self.start)

    @property
    def freed(self) -> float:
        """When the run's GPUs were free again: `held_until`, else `stop`."""
        return self.stop if self.held_until is None else max(self.held_until, self.stop)


@dataclass(frozen=True, slots=True)
class Nominated:
    """A GPUNomination the lane saw at `t` (each version seen is one): preemptor `set_id` of
    `size` GPUs and priority `priority`, promised `node`, with `victims` (set ids)."""

    t: float
    set_id: int
    size: int
    priority: int
    node: str
    victims: tuple[int, ...]
    devices: tuple[int, ...] = ()
    """The GPUs (indices) it holds for its preemptor on `node`."""
    gone: float | None = None
    """When the lane saw it deleted (None: never)."""


@dataclass(slots=True)
class LaneLog:
    """What the driver recorded of one lane: its `nodes`, every `Wait`, every `Run`, every
    `Nominated`, and `counts` (anything counted along the way: `partial_stops`, a set whose
    claim lost devices while its Pod stayed)."""

    nodes: tuple[str, ...]
    waits: list[Wait] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    nominations: list[Nominated] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    end: float | None = None
    """When the lane stopped (s from the trace's start): the trace's end plus its drain; None
    when it stopped at the trace's end (no drain, as before the drain was made)."""
    drain_capped: bool = False
    """The drain's cap ended the lane (`Plan.drain`): some scored set still waited then."""


def lane_end(trace: CTrace, log: LaneLog) -> float:
    """When the lane stopped (s): `log.end`, else the trace's end; never before the trace's
    end. A wait still open then is censored there."""
    return trace.end if log.end is None else max(log.end, trace.end)


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


# -- latency, GPU-hours, utilisation -------------------------------------------------------

def waits_by(trace: CTrace, log: LaneLog, *, first: bool) -> dict[tuple[str, int], list[float]]:
    """(tier, size) -> the scored sets' waits (s) that ended, first asks or (first=False)
    the asks again of preempted sets."""
    sets = {s.id: s for s in trace.sets}
    out: dict[tuple[str, int], list[float]] = {}
    for w in log.waits:
        s = sets[w.set_id]
        if s.scored and w.first == first and w.decided is not None:
            start = _start_after(log, w)
            if start is not None:
                out.setdefault((s.tier, s.size), []).append(start - w.begin)
    return out


def _start_after(log: LaneLog, w: Wait) -> float | None:
    """The start of the run that ended wait `w` (the first run of its set at or after the
    wait's begin), None when none."""
    got = [r.start for r in log.runs if r.set_id == w.set_id and r.start >= w.begin]
    return min(got) if got else None


def latency_table(trace: CTrace, log: LaneLog) -> dict[str, dict[str, dict]]:
    """tier -> size (str, and "all") -> {sets, started, not_started, p50_s, p99_s (and
    whether each is censored), started_p99_s, max_wait_s, max_wait_censored, rewaits,
    rewait_p99_s}: start latency from the first ask to launcher bound over the scored sets,
    a start in the drain included, a set never started counted as waiting until the lane's
    end (`lane_end`; censored: a lower bound, so a censored p99 says "at least");
    `started_p99_s` over the started ones alone; re-waits of preempted sets apart."""
    sets = {s.id: s for s in trace.sets}
    first = waits_by(trace, log, first=True)
    again = waits_by(trace, log, first=False)
    censored: dict[tuple[str, int], list[float]] = {}
    end = lane_end(trace, log)
    started_ids = {r.set_id for r in log.runs}
    for w in log.waits:
        s = sets[w.set_id]
        if s.scored and w.first and w.set_id not in started_ids:
            censored.setdefault((s.tier, s.size), []).append(end - w.begin)
    out: dict[str, dict[str, dict]] = {}
    for tier in TIERS:
        row: dict[str, dict] = {}
        for size in (*SIZES, 0):
            keys = [(tier, z) for z in SIZES] if size == 0 else [(tier, size)]
            lat = [x for k in keys for x in first.get(k, [])]
            cen = [x for k in keys for x in censored.get(k, [])]
            re = [x for k in keys for x in again.get(k, [])]
            n = sum(1 for s in trace.sets if s.scored and s.tier == tier
                    and (size == 0 or s.size == size))
            both = sorted([(x, False) for x in lat] + [(x, True) for x in cen])
            q50, q99 = (_quantile(both, q) for q in (0.5, 0.99))
            row["all" if size == 0 else str(size)] = {
                "sets": n, "started": len(lat), "not_started": len(cen),
                "p50_s": q50[0], "p50_censored": q50[1],
                "p99_s": q99[0], "p99_censored": q99[1],
                "started_p99_s": _r(quantile(lat, 0.99)) if lat else None,
                "max_wait_s": _r(max(lat + cen)) if lat or cen else None,
                "max_wait_censored": bool(cen) and max(cen) >= max(lat, default=0),
                "rewaits": len(re), "rewait_p99_s": _r(quantile(re, 0.99)) if re else None}
        out[tier] = row
    return out


def _quantile(both: list[tuple[float, bool]], q: float) -> tuple[float | None, bool]:
    """`bench.common.quantile` of (wait, censored) pairs sorted by wait: (the wait rounded,
    whether it is a censored one: a lower bound); (None, False) for none."""
    if not both:
        return None, False
    x = quantile([w for w, _ in both], q)
    return _r(x), next(c for w, c in both if w == x)


def max_wait(trace: CTrace, log: LaneLog, size: int) -> float | None:
    """The longest wait (s) of a scored set of `size` GPUs, any tier, a start in the drain
    included, a set never started counted until the lane's end (`lane_end`); None when no
    such set asked."""
    return max_wait_censored(trace, log, size)[0]


def max_wait_censored(trace: CTrace, log: LaneLog, size: int, *, tier: str | None = None,
                      first: bool = True) -> tuple[float | None, bool]:
    """`max_wait` and whether it is a lower bound (the longest wait is of a set never started,
    counted until the lane's end: it would have waited longer; after a drain only when its
    cap ended the lane); (None, False) when no such set asked. `tier` (one of `TIERS`) keeps
    that tier's sets alone (None: any); `first` False measures the asks again of preempted
    sets instead of first asks."""
    sets = {s.id: s for s in trace.sets}
    end = lane_end(trace, log)
    got: list[tuple[float, bool]] = []
    for w in log.waits:
        s = sets[w.set_id]
        if s.scored and w.first == first and s.size == size and (tier is None or s.tier == tier):
            start = _start_after(log, w)
            got.append(((start if start is not None else end) - w.begin, start is None))
    if not got:
        return None, False
    longest = max(x for x, _ in got)
    return _r(longest), any(c for x, c in got if x == longest)


def _clip(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def gpu_hours(trace: CTrace, log: LaneLog) -> dict[str, dict[str, float]]:
    """tier -> size (str, and "all") -> GPU-hours the lane's runs served over the whole
    trace (warm-up included, the drain after it not), rounded to 4 places."""
    sets = {s.id: s for s in trace.sets}
    out = {tier: {str(z): 0.0 for z in SIZES} | {"all": 0.0} for tier in TIERS}
    for r in log.runs:
        s = sets[r.set_id]
        h = s.size * _clip(r.start, r.stop, 0.0, trace.end) / 3600
        out[s.tier][str(s.size)] += h
        out[s.tier]["all"] += h
    return {t: {k: round(v, 4) for k, v in row.items()} for t, row in out.items()}


def utilisation(trace: CTrace, log: LaneLog) -> float | None:
    """Mean share of the lane's GPUs held by running sets over the scored span (the drain
    after it not counted)."""
    used = sum(len(r.gpus) * _clip(r.start, r.stop, trace.warmup, trace.end) for r in log.runs)
    return round(used / (trace.gpus * trace.span), 4) if trace.span > 0 else None


# -- the lane's devices over time ------------------------------------------------------------

def _timeline(log: LaneLog) -> list[tuple[float, int, Run]]:
    """Every run's taking of its GPUs (order 1) and its stop (order 0: a stop at the same
    instant first)."""
    ev = [(r.taken, 1, r) for r in log.runs] + [(r.freed, 0, r) for r in log.runs]
    ev.sort(key=lambda e: (e[0], e[1], e[2].set_id))
    return ev


def inversions(trace: CTrace, log: LaneLog) -> list[dict]:
    """P6's priority inversions: a run of a lower tier starting at `t` on node N while a
    scored set of a higher tier was waiting (it asked before the run's placement was
    decided and was not placed by then) whose size fits one whole partition of the GPUs
    free on N just before the run took its own (those included) and that could start
    nowhere once the run took them (P5's backfill, exactly: a set ahead that still fits
    elsewhere, on N or another node, does not hold the run back): one entry per such run,
    {t, set, tier, node, waiting: [ids]}. The runs' devices are known from their claims'
    allocations, so a set admitted but not yet bound counts as free here."""
    sets = {s.id: s for s in trace.sets}
    decided = {}  # (set id, start) -> the decision of the wait that run ended
    for w in log.waits:
        start = _start_after(log, w) if w.decided is not None else None
        if start is not None:
            decided[(w.set_id, start)] = w.decided
    used: dict[str, dict[int, int]] = {n: {} for n in log.nodes}
    out = []
    for t, kind, r in _timeline(log):
        node = used.setdefault(r.node, {})
        if kind == 0:
            for g in r.gpus:
                if node.get(g) == r.set_id:
                    del node[g]
            continue
        s = sets[r.set_id]
        at = decided.get((r.set_id, r.start), r.taken)
        free = _ALL.difference(node)
        after = [free.difference(r.gpus)] + [_ALL.difference(g) for n, g in used.items() if n != r.node]
        ahead = []
        for w in log.waits:
            ws = sets[w.set_id]
            if (ws.scored and ws.priority > s.priority and w.begin < at
                    and (w.decided is None or w.decided > at)
                    and dra_choice(free, ws.size) is not None
                    and all(dra_choice(f, ws.size) is None for f in after)):
                ahead.append(w.set_id)
        if ahead:
            out.append({"t": round(t, 2), "set": r.set_id, "tier": s.tier, "node": r.node,
                        "waiting": sorted(set(ahead))})
        node.update({g: r.set_id for g in r.gpus})
    return out


def brute_force_minimum(free: dict[str, frozenset[int]], running: dict[str, list[tuple[int, int, tuple[int, ...]]]],
                        size: int) -> tuple[int, int, int] | None:
    """P3's order by exhaustion: over every node and every subset of its eligible victims
    (`running[node]`: (set id, priority, GPUs)), the least (highest victim priority, victims,
    victim GPUs) whose GPUs with the node's `free` ones hold a whole partition of `size`;
    None when no subset of any node frees one. Exponential in the victims of one node (at
    most 8 on a board)."""
    best = None
    for node in sorted(set(free) | set(running)):
        cands, base = running.get(node, []), free.get(node, frozenset())
        for k in range(0, len(cands) + 1):
            for chosen in combinations(cands, k):
                gpus = base.union(g for _, _, gs in chosen for g in gs)
                if dra_choice(frozenset(gpus), size) is None:
                    continue
                key = (max((p for _, p, _ in chosen), default=0), k,
                       sum(len(gs) for _, _, gs in chosen))
                if best is None or key < best:
                    best = key
    return best


def preemption_check(trace: CTrace, log: LaneLog, min_runtime: float) -> list[dict]:
    """Every nomination against `brute_force_minimum` on the lane's runs at its moment
    (sets of lower priority than the preemptor that had run `min_runtime` s; GPUs other
    nominations hold are not free): {t, preemptor, size, node, victims, victim_priority,
    brute_force: (priority, victims, GPUs) or None, room_was_free (the brute force needs no
    victim: the lane's claims showed room), minimal: the nomination's (highest victim
    priority, victims) no more than the brute force's}. A nomination seen again (the same
    preemptor and victims) counts once."""
    sets = {s.id: s for s in trace.sets}
    seen = set()
    out = []
    for n in sorted(log.nominations, key=lambda n: n.t):
        key = (n.set_id, n.victims)
        if key in seen:
            continue
        seen.add(key)
        live = [r for r in log.runs if r.taken <= n.t < r.freed]
        held = [o for o in log.nominations if o.set_id != n.set_id and o.t <= n.t
                and (o.gone is None or n.t < o.gone)]  # other preemptors' rooms
        free = {node: _ALL.difference(g for r in live if r.node == node for g in r.gpus)
                .difference(g for o in held if o.node == node for g in o.devices)
                for node in log.nodes}
        cands: dict[str, list] = {}
        for r in live:
            p = sets[r.set_id].priority
            if p < n.priority and n.t - r.start >= min_runtime and r.set_id != n.set_id:
                cands.setdefault(r.node, []).append((r.set_id, p, r.gpus))
        bf = brute_force_minimum(free, cands, n.size)
        vp = max((sets[v].priority for v in n.victims if v in sets), default=0)
        out.append({"t": round(n.t, 2), "preemptor": n.set_id, "size": n.size, "node": n.node,
                    "victims": list(n.victims), "victim_priority": vp,
                    "brute_force": list(bf) if bf else None,
                    "room_was_free": bf is not None and bf[1] == 0,
                    "minimal": bf is None or (vp, len(n.victims)) <= bf[:2]})
    return out


def stops_without_nomination(log: LaneLog, slack: float = 5.0) -> int:
    """Runs stopped for another set (`Run.preempted`) that no nomination seen by then (or
    within `slack` s after: the two watches race) named as a victim (P6)."""
    named = {(v, n.t) for n in log.nominations for v in n.victims}
    return sum(1 for r in log.runs if r.preempted
               and not any(v == r.set_id and t <= r.stop + slack for v, t in named))


def waiting_at_end(trace: CTrace, log: LaneLog) -> list[int]:
    """The scored sets (ids, sorted) whose wait was still open at the lane's end: never
    started, or preempted and not started again."""
    scored = {s.id for s in trace.sets if s.scored}
    return sorted({w.set_id for w in log.waits
                   if w.set_id in scored and _start_after(log, w) is None})


def lane_figures(trace: CTrace, log: LaneLog, *, min_runtime: float) -> dict:
    """Every figure of one lane: latency per tier and size, GPU-hours, utilisation, the
    8-GPU maximum wait (s; `max_wait_8_censored`: a lower bound), the drain (`drain_s` after
    the trace's end, None when the lane stopped there; `drain_capped`: its cap ended it;
    `waiting_at_end`: scored sets whose wait was open then), inversions, preemptions against
    the brute force, victims (`*_in_drain`: how many of them after the trace's end) and the
    driver's counts."""
    checks = preemption_check(trace, log, min_runtime)
    inv = inversions(trace, log)
    victims = sum(len(c["victims"]) for c in checks)
    wait_8, wait_8_censored = max_wait_censored(trace, log, 8)
    return {"latency": latency_table(trace, log), "gpu_hours": gpu_hours(trace, log),
            "utilisation": utilisation(trace, log), "max_wait_8_s": wait_8,
            "max_wait_8_censored": wait_8_censored,
            "drain_s": None if log.end is None else _r(lane_end(trace, log) - trace.end, 1),
            "drain_capped": log.drain_capped,
            "waiting_at_end": len(waiting_at_end(trace, log)),
            "preemptions_in_drain": sum(c["t"] > trace.end for c in checks),
            "inversions_in_drain": sum(i["t"] > trace.end for i in inv),
            "preemptions": len(checks), "victims": victims,
            "victims_stopped": sum(r.preempted for r in log.runs),
            "victims_per_preemption": round(victims / len(checks), 2) if checks else None,
            "minimal_share": (round(sum(c["minimal"] for c in checks) / len(checks), 4)
                              if checks else None),
            "not_minimal": [c for c in checks if not c["minimal"]],
            "inversions": len(inv), "inversion_examples": inv[:10],
            "partial_stops": log.counts.get("partial_stops", 0),
            "stops_without_nomination": stops_without_nomination(log),
            "counts": dict(log.counts)}


__all__ = ["LaneLog", "Nominated", "Run", "Wait", "brute_force_minimum", "gpu_hours",
           "inversions", "lane_end", "lane_figures", "latency_table", "max_wait",
           "max_wait_censored", "preemption_check", "stops_without_nomination", "utilisation",
           "waiting_at_end", "waits_by"]
