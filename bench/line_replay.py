"""The contention trace replayed in memory through the real model (issue 39, P5's 8-GPU
target): `python -m bench.line_replay [--seeds 20] [--reserve-after S]... [--out DIR]`.

`bench contention` replays one seeded trace (`bench.contention_trace`) on a cluster, so its
"8-GPU maximum wait with the line ≤ ½ of without" is one seed's maximum over about ten sets.
This replays the same traces, for many seeds, in fake time through the binder's own pure
decision code, with the line (lane (a) of `bench.contention`: preemption and the line) and
without it (lane (d): preemption, `line.enabled` false), so that the ratio can be judged as a
distribution. Pure apart from the CLI's output: no cluster, no clock, no I/O in `replay`.

To tell the line's own effect from preemption's, `Settings.preemption` off replays both
lanes with nominating off (`model.nominate.NominationSettings.enabled`, the controller's
`preemption.enabled`): no set is ever preempted, a set refused for room waits in the line
(lane a) or retries (lane d) until room frees. The issue's motivation for the line is an
8-GPU VM waiting behind a stream of small VMs that keep taking the room it needs; with
preemption on, the longest 8-GPU waits may instead be preemptible sets that on-demand sets
preempt (P3: a board of one set is one victim) or overtake (P5: priority first). So each
lane's 8-GPU maximum wait is also given per tier (on-demand, preemptible), with the re-waits
of 8-GPU sets (their asks again after a preemption of them, `Wait.first` False) counted per
set (`lane`, `SeedResult`, `summary`; `--preemption off|both` on the command line).

Each round (every `retry` s of fake time) does what the coordinator does for one batch
(`actors.coordinator._decide_batch`, `_in_line`): runs whose life is over end (their devices
deleted, H2); arrivals come; then every waiting set asks once (a fresh bind request per
attempt, as the driver's retry every 2 s makes one), in an order shuffled by the seed (the
cluster's retries come in no set order), through `model.plan.plan_batch` with preemption
(`model.nominate`, P2-P4) and, with the line, `model.line_plan.tidy`,
`model.line.reservation`, `model.line_plan.ripening_reservations` and
`model.line_plan.gate_batch` on the nodes reserved then. A `Place` starts its set at once
(`model.decide.apply_decision`; the set leaves the line, `model.line_plan.leaves`); a fresh
`Nominate` is recorded and its victims stop at once, each created again at once (a re-wait
from then, asking from the next round, for the rest of its life; the preemptor starts at its next ask,
on the nominated node: `model.nominate.on_nominated_node`); a nomination is dropped when its
preemptor starts or it expires. A request the gate sends back to be decided again
(`Gated.again`) is, in a batch of its own in the same round (the coordinator requeues it).

The rounds above are `Settings.asks` "rounds", the lane with the line's. With "own" (`_own`;
the lane without the line's since 2026-12-07, `ASKS_WITHOUT_LINE`) each set asks on its own
instead, as `bench contention`'s driver makes its creates: at its arrival, then `retry` s
after each refusal, each ask decided alone (a batch of one, through the same `_batch`), a
run's end freeing its room at that instant and a victim asking again at once, each answer
up to `Settings.latency` s late (the next ask `retry` s after it); asks at one instant go in
an order shuffled by the seed (`Settings.order` picks another shuffle and other latencies,
to see how much of one seed's figures is the ask order's luck).

What it simplifies against the cluster run (`bench contention`): count mode (a node is 8
units of one resource, no device groups: a 4-GPU set fits any 4 free units, where device mode
needs an aligned half board, DR3); in rounds, every ask of a round is decided in one batch,
asks every `retry` s exactly (a shuffled batch per round, not one request at a time); an
ask is decided at the instant it is made (own asks: its answer's latency only delays the
next); no W1 step (W1's refusal for room and the binder's enter the line alike);
a victim stops and a started set counts at once (no grace, no launcher Pod, no kube-scheduler,
no API latency); sets are VMs (their line entries `retried` from the first refusal). The
trace, tiers, priorities, `preemption.minRuntime` and the drain are the benchmark's
(`bench.contention.FULL`).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import statistics
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bench.common import commit, file_path, finite_at_least, int_between, machine, share
from bench.contention_metrics import LaneLog, Run, Wait, max_wait_censored, utilisation
from bench.contention_trace import PRIORITY, TIERS, CSet, CTrace, make_trace
from model.decide import apply_decision
from model.line import RESERVING, Identity, Line, LineSettings, reservation
from model.line_plan import gate_batch, leaves, ripening_reservations, tidy
from model.nominate import NominationSettings, Preempting
from model.nomination import nomination_holds
from model.plan import Action, Nominate, Place, plan_batch
from model.preemption import PreemptionSettings
from model.priority import Priority
from model.snapshot import Snapshot
from model.types import Attachment, BindRequest, DeviceStatus, GPUClass, GPUDevice, Node, OnCordon

Observer = Callable[[float, Line, Mapping[Identity, str], Sequence[Action], Snapshot], None]
"""`replay`'s debugging hook (see there)."""

T0 = datetime(2026, 12, 7, tzinfo=timezone.utc)
"""The fake clock's zero: the trace's second t is T0 + t."""
NS = "ct"
CLASS = "gpu"
RESOURCE = "nvidia.com/gpu"
GPUS = 8
MAX_SEEDS = 1000   # seeds a run takes: each trace is built up front, and a seed replays in ~4 s


@dataclass(frozen=True)
class Settings:
    """One replay's settings: `line` on (lane a) or off (lane d); `reserve_after` (s,
    `line.reserveAfter`); `min_runtime` (s, `preemption.minRuntime`); `retry` (s between a
    set's asks, one round); `drain` (s after the trace's end the replay may run on, as
    `bench.contention.Plan.drain`); `reserving` (`model.line.LineSettings.reserving`: how
    many sets at the front of a class's line may each reserve, 1 the head alone);
    `keep_reservations` and `preemption` (below)."""

    line: bool = True
    reserve_after: float = 300.0
    reserving: int = RESERVING
    min_runtime: float = 15.0
    retry: float = 2.0
    drain: float = 900.0
    keep_reservations: bool = True
    """False: each batch chooses the line's reservations afresh (`model.line.reservation`
    without `kept`), as the binder did before 2026-12-07: the ablation that shows what
    keeping them buys."""
    asks: str = "rounds"
    """When the waiting sets ask (`ASKS`): "rounds", every waiting set once each `retry` s,
    all in one shuffled batch (arrivals and ends counted at the round); "own", as the
    cluster's driver does, each set on its own: at its arrival, then `retry` s after each
    refusal, decided alone (a batch of one), a run's end freeing its room at that instant
    and a victim created again asking at once (`_own`)."""
    latency: float = 0.0
    """With asks "own": the most s an ask's answer takes (each a uniform draw from the
    shuffle's stream), the next ask `retry` s after the answer, as the driver's retries
    drift by the admission's round trip (about 0.03 s on the cluster); 0 none."""
    order: int = 0
    """Which shuffle of the asks at one instant (0: the seed's own, as before this field):
    another value replays the same trace with the same rules in another ask order, to see
    how much of one seed's figures is that order's luck."""
    preemption: bool = True
    """False: nominating off (P2-P4 never act, `NominationSettings.enabled`; nor do the
    line's ripening reservations, which exist for preemptors): no set is ever preempted, and
    a set refused for room waits in the line (P5) or, the line off, retries until room
    frees. Both lanes off measure the line's own effect on the 8-GPU waits (issue 39)."""


@dataclass
class _Set:
    s: CSet
    left: float  # life still to run (s)
    attempt: int = 0
    run: tuple[str, float] | None = None  # (node, start)


def _at(t: float) -> datetime:
    return T0 + timedelta(seconds=t)


def _priority(tier: str) -> Priority:
    return Priority(PRIORITY[tier], class_name=f"ct-{tier}")


def _names(s: CSet) -> tuple[str, ...]:
    return tuple(f"s{s.id}-g{i}" for i in range(s.size))


def _asking(s: CSet, attempt: int, t: float) -> tuple[str, list[GPUDevice]]:
    """The template devices of set `s` carrying its `attempt`-th bind request, made at `t`."""
    vmi, rid, names = f"s{s.id}", f"r{s.id}-{attempt}", _names(s)
    br = BindRequest(rid, vmi, names, _at(t), priority=_priority(s.tier))
    att = Attachment(vmi, _at(t), admission=rid, owner=f"vm-{s.id}")
    return rid, [GPUDevice(NS, n, CLASS, template_for=vmi, status=DeviceStatus(attached_to=att, bind_request=br))
                 for n in names]


def fleet(nodes: int) -> Snapshot:
    """`nodes` schedulable nodes of `GPUS` units each, one GPUClass over them (count mode)."""
    ns = [Node(f"n{i}", (("kubevirt.io/schedulable", "true"),), ((RESOURCE, GPUS),), False)
          for i in range(nodes)]
    return Snapshot.build(nodes=ns, classes=[GPUClass(CLASS, RESOURCE, OnCordon.MOVE, (), None)])


def _lane_start(trace: CTrace, settings: Settings):
    """What both ask models start a lane from: the seeded rng, the line's and the
    nominations' settings, an empty fleet of `trace.nodes` boards, its log and every set
    of the trace unstarted. Pure."""
    rng = _rng(trace, settings)
    line_settings = LineSettings(reserve_after=timedelta(seconds=settings.reserve_after),
                                 enabled=settings.line, reserving=settings.reserving)
    nom = NominationSettings(PreemptionSettings(timedelta(seconds=settings.min_runtime)),
                             enabled=settings.preemption)
    log = LaneLog(tuple(f"n{i}" for i in range(trace.nodes)))
    return (rng, line_settings, nom, fleet(trace.nodes), log,
            {s.id: _Set(s, s.life) for s in trace.sets})


def _rng(trace: CTrace, settings: Settings) -> random.Random:
    """The replay's shuffle of the asks: the seed's, and `settings.order`'s when not 0."""
    return random.Random(f"line-replay/{trace.seed}" + (f"/{settings.order}" if settings.order else ""))


ASKS = ("rounds", "own")
"""`Settings.asks`' choices."""
ASKS_WITHOUT_LINE = "own"
"""`Settings.asks` of the lane without the line (`without_line`, the CLI): each set on its
own, as lane (d) of `bench contention` asks (rounds until 2026-12-07, `eb8c049`)."""
LATENCY = 0.03
"""`Settings.latency` with it (s): the median answer to a create on the cluster's lanes,
`bench-results/contention-one-tier.json`."""


def replay(trace: CTrace, settings: Settings = Settings(), observe: Observer | None = None) -> LaneLog:
    """The lane log of `trace` replayed as the module docstring says (`Wait`s and `Run`s in
    the trace's seconds; `Run.gpus` are indices 0..size-1: count mode records no device;
    `LaneLog.end` the last round's (or ask's) time, `drain_capped` when the drain's cap
    ended it with a scored set waiting), the sets asking as `settings.asks` says. `observe`,
    when given, is called after the line gates each batch (t in s, the line, the nodes
    reserved, the gated actions, the snapshot the batch was planned on): a debugging hook.
    Deterministic for one trace and settings. Pure. Raises ValueError for an unknown
    `settings.asks`."""
    if settings.asks not in ASKS:
        raise ValueError(f"Settings.asks takes one of {ASKS}, got {settings.asks!r}")
    if settings.asks == "own":
        return _own(trace, settings, observe)
    rng, line_settings, nom, snap, log, sets = _lane_start(trace, settings)
    arrivals = list(trace.sets)
    waiting: dict[int, Wait] = {}
    line = Line()
    held: dict = {}  # "line": the line's reservations at the last batch (`model.line.reservation`)
    ends: dict[int, float] = {}
    t = 0.0
    cap = trace.end + settings.drain
    while True:
        # 1. runs over
        gone = []
        for sid, end in sorted(ends.items(), key=lambda x: x[1]):
            if end <= t:
                st = sets[sid]
                assert st.run is not None
                log.runs.append(Run(sid, st.run[0], tuple(range(st.s.size)), st.run[1], end))
                gone += [(NS, n) for n in _names(st.s)]
                st.run = None
                del ends[sid]
        if gone:
            snap = snap.with_changes((), gone)
        # 2. arrivals
        while arrivals and arrivals[0].arrive <= t:
            s = arrivals.pop(0)
            waiting[s.id] = Wait(s.id, s.arrive, None)
        if t >= trace.end and (t >= cap or not any(sets[i].s.scored for i in waiting)):
            break  # drained: every scored set running or done (`bench.contention`), or the cap
        # 3. every waiting set asks once; a request the line's gate sends back to be decided
        # again (`Gated.again`) is, in a batch of its own (the coordinator requeues it)
        order = sorted(waiting)
        rng.shuffle(order)
        batch, fresh = [], []
        for sid in order:
            st = sets[sid]
            st.attempt += 1
            rid, members = _asking(st.s, st.attempt, t)
            fresh += members
            batch.append((NS, rid, members))
        if fresh:
            snap = snap.with_devices(fresh)
        now = _at(t)
        for _ in range(MAX_AGAIN):
            if not batch:
                break
            snap, line, batch = _batch(snap, line, batch, t, now, settings, line_settings, nom, sets, ends,
                                       waiting, log, observe, held)
        t = round(t + settings.retry, 6)
    for sid, w in waiting.items():
        log.waits.append(w)
    for sid, st in sets.items():
        if st.run is not None:
            log.runs.append(Run(sid, st.run[0], tuple(range(st.s.size)), st.run[1], t))
    log.end = t
    log.drain_capped = t >= cap and any(sets[i].s.scored and w.first for i, w in waiting.items())
    return log


def _own(trace: CTrace, settings: Settings, observe: Observer | None) -> LaneLog:
    """`replay` with each set asking on its own (`Settings.asks` "own"), as the cluster's
    driver makes its creates (`bench.contention.Driver._admit`): a set asks at its arrival,
    and again `retry` s after each answer that does not start it; each ask is one
    coordinator batch of its own (`_batch`, with the line's gate when on); a run's end frees
    its devices at that instant (before any ask at the same instant); a victim is created
    again at once and asks at once. Asks at the same instant go in an order shuffled by the
    seed. Pure."""
    rng, line_settings, nom, snap, log, sets = _lane_start(trace, settings)
    waiting: dict[int, Wait] = {}
    line = Line()
    held: dict = {}
    ends: dict[int, float] = {}
    END, ASK = 0, 1  # at one instant runs end first
    events: list[tuple[float, int, float, int]] = [(s.arrive, ASK, rng.random(), s.id) for s in trace.sets]
    heapq.heapify(events)
    t = 0.0
    cap = trace.end + settings.drain
    while events:
        t, kind, _, sid = heapq.heappop(events)
        if t >= trace.end and (t >= cap or not any(sets[i].s.scored for i in waiting)):
            break  # drained, or the cap (as `replay`'s rounds)
        st = sets[sid]
        if kind == END:
            if ends.get(sid) != t:
                continue  # a run stopped before (a victim)
            assert st.run is not None
            log.runs.append(Run(sid, st.run[0], tuple(range(st.s.size)), st.run[1], t))
            snap = snap.with_changes((), [(NS, n) for n in _names(st.s)])
            st.run = None
            del ends[sid]
            continue
        if st.run is not None:
            continue  # started meanwhile
        waiting.setdefault(sid, Wait(sid, st.s.arrive, None))
        st.attempt += 1
        rid, members = _asking(st.s, st.attempt, t)
        snap = snap.with_devices(members)
        now = _at(t)
        before = set(waiting)
        batch = [(NS, rid, members)]
        for _ in range(MAX_AGAIN):
            if not batch:
                break
            snap, line, batch = _batch(snap, line, batch, t, now, settings, line_settings, nom, sets, ends,
                                       waiting, log, observe, held)
        if sid in ends:
            heapq.heappush(events, (ends[sid], END, 0.0, sid))
        else:
            answer = settings.latency * rng.random() if settings.latency else 0.0
            heapq.heappush(events, (round(t + answer + settings.retry, 6), ASK, rng.random(), sid))
        for vid in sorted(set(waiting) - before):  # victims, created again at once
            heapq.heappush(events, (t, ASK, rng.random(), vid))
    for sid, w in waiting.items():
        log.waits.append(w)
    for sid, st in sets.items():
        if st.run is not None:
            log.runs.append(Run(sid, st.run[0], tuple(range(st.s.size)), st.run[1], t))
    log.end = t
    log.drain_capped = t >= cap and any(sets[i].s.scored and w.first for i, w in waiting.items())
    return log


MAX_AGAIN = 8
"""Most batches one round decides (the first, then those of requests sent back)."""


def _batch(snap: Snapshot, line: Line, batch: list, t: float, now: datetime, settings: Settings,
           line_settings: LineSettings, nom: NominationSettings, sets: dict[int, _Set],
           ends: dict[int, float], waiting: dict[int, Wait], log: LaneLog,
           observe: Observer | None, held: dict) -> tuple[Snapshot, Line, list]:
    """One coordinator batch (`actions.coordinator._decide_batch`, `_in_line`) carried out at
    once: (snapshot, line, the batch entries to decide again)."""
    actions, _ = plan_batch(snap, (), batch, Preempting(now, nom), now=now)
    again: frozenset = frozenset()
    if settings.line:
        line = tidy(line, now, line_settings)
        holds = [h for h in nomination_holds(snap.nominations, now, snap.devices_in) if not h.empty]
        work = snap.with_reservations(holds)
        last = held.get("line") if settings.keep_reservations else None
        kept = reservation(line, work, now, line_settings, last) if line else {}
        held["line"] = kept
        reserved = ripening_reservations(line, work, now, nom, kept) if line else {}
        gated = gate_batch(line, snap, holds, actions, now, reservations=reserved, settings=line_settings)
        line, again = gated.line, gated.again
        if observe is not None:
            observe(t, line, reserved, gated.actions, snap)
        actions = gated.actions
    noms = list(snap.nominations)
    redo = []
    for a, entry in zip(actions, batch):
        sid = int(a.request.vmi[1:])
        if (a.request.namespace, a.request.id) in again:
            redo.append(entry)
        elif isinstance(a, Place):
            snap = apply_decision(snap, a.request, a.decision, now=now)
            st = sets[sid]
            st.run = (a.decision.node or "", t)
            ends[sid] = t + st.left
            w = waiting.pop(sid)
            log.waits.append(replace(w, decided=t))
            if settings.line:
                line, _ = leaves(line, snap, a.request)
            noms = [n for n in noms if not n.is_for(NS, a.request.vmi)]
        elif isinstance(a, Nominate) and a.nominated.fresh:
            n = a.nominated.nomination
            noms.append(n)
            vgone = []
            for v in n.victims:
                vid = int(v.vmi[1:])
                vs = sets[vid]
                if vs.run is None:
                    continue
                node, start = vs.run
                log.runs.append(Run(vid, node, tuple(range(vs.s.size)), start, t, preempted=True))
                vs.left -= t - start
                vs.run = None
                del ends[vid]
                vgone += [(NS, x) for x in _names(vs.s)]
                waiting[vid] = Wait(vid, t, None, first=False)  # created again at once: asks next round
            snap = snap.with_changes((), vgone)
    snap = snap.with_nominations([n for n in noms if n.live(now)])
    return snap, line, redo


@dataclass(frozen=True)
class Lane:
    """One replay's 8-GPU figures (issue 39, P5's target), from its `LaneLog` (`figures`):
    `max_wait` the 8-GPU maximum wait (s; first asks of scored sets,
    `bench.contention_metrics.max_wait_censored`, None when no such set asked) and
    `censored` whether it is a lower bound; `by_tier` tier (`TIERS`) -> that tier's 8-GPU
    maximum wait and whether it is a lower bound; `rewaits` tier -> {set id: how many times
    that scored 8-GPU set asked again after a preemption of it} (sets never preempted left
    out: with preemption off it is empty); `longest_rewait` tier -> the longest of those
    waits again (s, None when none) and whether it is a lower bound; `utilisation` the mean
    share of the GPUs running sets held over the scored span (`bench.contention_metrics.
    utilisation`: the line must not buy its waits with idle GPUs). The maximum counts
    first asks only, as `bench contention`'s target: a re-wait is not in it, though a set
    re-waiting holds its place in line ahead of sets refused after it."""

    max_wait: float | None
    censored: bool = False
    by_tier: Mapping[str, tuple[float | None, bool]] = field(default_factory=dict)
    rewaits: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    longest_rewait: Mapping[str, tuple[float | None, bool]] = field(default_factory=dict)
    utilisation: float | None = None
    waits: tuple[tuple[int, int, float, float | None], ...] = ()
    """Each scored set's first wait: (set id, size, asked at, decided at; None: never
    started), in set order: the per-set figures to set beside a cluster lane's."""

    def longest_tier(self) -> str | None:
        """The tier whose 8-GPU maximum wait is the lane's (the higher tier on a tie), None
        when no 8-GPU set asked."""
        if self.max_wait is None:
            return None
        return next((t for t in TIERS if self.by_tier.get(t, (None, False))[0] == self.max_wait), None)


def figures(trace: CTrace, log: LaneLog) -> Lane:
    """`Lane`'s figures of `log`, a replay (or a cluster lane) of `trace`. Pure."""
    sets = {s.id: s for s in trace.sets}
    rewaits: dict[str, dict[int, int]] = {t: {} for t in TIERS}
    for w in log.waits:
        s = sets[w.set_id]
        if s.scored and s.size == 8 and not w.first:
            rewaits[s.tier][s.id] = rewaits[s.tier].get(s.id, 0) + 1
    first = sorted((w.set_id, sets[w.set_id].size, w.begin, w.decided) for w in log.waits
                   if w.first and sets[w.set_id].scored)
    return Lane(*max_wait_censored(trace, log, 8), utilisation=utilisation(trace, log), waits=tuple(first),
                by_tier={t: max_wait_censored(trace, log, 8, tier=t) for t in TIERS},
                rewaits={t: dict(sorted(r.items())) for t, r in rewaits.items()},
                longest_rewait={t: max_wait_censored(trace, log, 8, tier=t, first=False) for t in TIERS})


def lane(trace: CTrace, settings: Settings) -> Lane:
    """`trace` replayed under `settings` (`replay`), its 8-GPU figures (`figures`)."""
    return figures(trace, replay(trace, settings))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


@dataclass(frozen=True)
class SeedResult:
    """One seed's 8-GPU maximum waits (s; `bench.contention_metrics.max_wait_censored`) with
    the line and without it, whether each is a lower bound (a set never started before the
    drain's cap), and their ratio (None when either is missing or zero); `lanes` the two
    replays' `Lane` figures (with the line, without it: per tier, re-waits), None when only
    the maxima are known."""

    seed: int
    with_line: float | None
    without_line: float | None
    censored: tuple[bool, bool] = (False, False)
    lanes: tuple[Lane, Lane] | None = None

    @classmethod
    def of(cls, seed: int, with_line: Lane, without_line: Lane) -> SeedResult:
        """The result of seed `seed` from its two lanes' figures."""
        return cls(seed, with_line.max_wait, without_line.max_wait,
                   (with_line.censored, without_line.censored), (with_line, without_line))

    @property
    def ratio(self) -> float | None:
        return _ratio(self.with_line, self.without_line)

    def tier(self, tier: str) -> tuple[float | None, float | None]:
        """`tier`'s 8-GPU maximum waits (s) with the line and without it (None: no such set
        asked, or no `lanes`)."""
        if self.lanes is None:
            return None, None
        a, d = self.lanes
        return a.by_tier.get(tier, (None, False))[0], d.by_tier.get(tier, (None, False))[0]

    def tier_ratio(self, tier: str) -> float | None:
        """`tier`'s 8-GPU maximum wait with the line over without it (None as `ratio`)."""
        return _ratio(*self.tier(tier))


def trace_of(seed: int, on_demand_share: float = 0.3) -> CTrace:
    """Seed `seed`'s trace at `bench.contention.FULL`'s sizes (6 boards, mean life 90 s,
    600 s scored after a 90 s warm-up, load 1.1, `on_demand_share` on-demand, default 30 %);
    seed 1 at the default is the one `bench contention` replays. A share of 0 is one tier
    (nothing can be preempted): the issue's case of an 8-GPU set behind a stream of small
    ones of its own priority. Raises ValueError for a share outside [0, 1]."""
    return make_trace(seed=seed, nodes=6, load=1.1, mean_life=90.0, span=600.0, warmup=90.0,
                      on_demand_share=on_demand_share)


def without_line(trace: CTrace, preemption: bool = True) -> tuple[float | None, bool]:
    """The 8-GPU maximum wait of `trace` replayed with the line off (lane d), with
    `preemption` on (as `bench contention`) or off."""
    return max_wait_censored(trace, replay(trace, Settings(line=False, preemption=preemption,
                                                           asks=ASKS_WITHOUT_LINE, latency=LATENCY)), 8)


def with_line(trace: CTrace, settings: Settings) -> tuple[float | None, bool]:
    """The 8-GPU maximum wait of `trace` replayed with the line (lane a) under `settings`."""
    return max_wait_censored(trace, replay(trace, settings), 8)


def _ratios(pairs: Sequence[tuple[float | None, float | None]]) -> dict:
    """Over (with the line, without it) maxima: the ratios' count, median, quartiles, min and
    max, how many meet the target (<= 0.5), and the median maxima (s); {"ratios": 0} when
    no pair has both."""
    ratios = sorted(r for a, b in pairs if (r := _ratio(a, b)) is not None)
    if not ratios:
        return {"ratios": 0}
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {"ratios": len(ratios), "median": round(statistics.median(ratios), 3),
            "q1": round(q[0], 3), "q3": round(q[2], 3), "min": round(ratios[0], 3), "max": round(ratios[-1], 3),
            "met": sum(1 for r in ratios if r <= 0.5),
            "median_with_line_s": round(statistics.median(a for a, _ in pairs if a), 1),
            "median_without_line_s": round(statistics.median(b for _, b in pairs if b), 1)}


def _rewait_summary(lanes: Sequence[Lane], tier: str) -> dict:
    """Over one side's lanes (one a seed), `tier`'s 8-GPU re-waits: `sets` preempted at
    least once (summed over the seeds), `rewaits` in all, `most` of one set in one seed,
    and the median over seeds with one of the longest re-wait (s; None when none)."""
    counts = [n for x in lanes for n in x.rewaits.get(tier, {}).values()]
    longest = [w for x in lanes if (w := x.longest_rewait.get(tier, (None, False))[0]) is not None]
    return {"sets": len(counts), "rewaits": sum(counts), "most": max(counts, default=0),
            "median_longest_s": round(statistics.median(longest), 1) if longest else None}


def summary(results: list[SeedResult]) -> dict:
    """Over the seeds: the ratios' median, quartiles, min and max, how many meet the target
    (≤ 0.5), and the median maximum waits with and without the line (s). When the results
    carry their `lanes`, also `tiers`: the same per tier (each tier's 8-GPU maximum with the
    line over its maximum without it) and in how many seeds the lane's maximum was that
    tier's (`longest_with_line`, `longest_without_line`); `rewaits_8gpu`: per side
    (`with_line`, `without_line`) and tier, `_rewait_summary`'s counts; and `utilisation`:
    each side's mean `Lane.utilisation` over the seeds and the mean change with the line, in
    points."""
    out = {"seeds": len(results)}
    out |= _ratios([(r.with_line, r.without_line) for r in results])
    if out["ratios"] == 0:
        return out
    lanes = [r.lanes for r in results if r.lanes is not None]
    if lanes:
        out["tiers"] = {t: _ratios([r.tier(t) for r in results if r.lanes is not None])
                        | {"longest_with_line": sum(1 for a, _ in lanes if a.longest_tier() == t),
                           "longest_without_line": sum(1 for _, d in lanes if d.longest_tier() == t)}
                        for t in TIERS}
        out["rewaits_8gpu"] = {side: {t: _rewait_summary([x[i] for x in lanes], t) for t in TIERS}
                               for i, side in enumerate(("with_line", "without_line"))}
        used = [(a.utilisation, d.utilisation) for a, d in lanes
                if a.utilisation is not None and d.utilisation is not None]
        if used:
            out["utilisation"] = {"with_line": round(statistics.mean(a for a, _ in used), 4),
                                  "without_line": round(statistics.mean(d for _, d in used), 4),
                                  "change_points": round(100 * statistics.mean(a - d for a, d in used), 2)}
    return out


def _seed_doc(r: SeedResult, set_waits: bool = False) -> dict:
    """One seed's figures as `line-replay.json` keeps them; with `set_waits`, each lane's
    per-set first waits too (`Lane.waits`, times to 0.01 s)."""
    doc: dict = {"seed": r.seed, "with_line_s": r.with_line, "without_line_s": r.without_line,
                 "ratio": None if r.ratio is None else round(r.ratio, 3), "censored": list(r.censored)}
    if r.lanes is not None:
        a, d = r.lanes
        doc["utilisation"] = [a.utilisation, d.utilisation]
        doc["by_tier"] = {t: {"with_line_s": a.by_tier[t][0], "without_line_s": d.by_tier[t][0],
                              "ratio": None if (x := r.tier_ratio(t)) is None else round(x, 3),
                              "censored": [a.by_tier[t][1], d.by_tier[t][1]]} for t in TIERS}
        doc["rewaits_8gpu"] = {side: {t: {str(k): n for k, n in x.rewaits[t].items()} for t in TIERS}
                               for side, x in (("with_line", a), ("without_line", d))}
        doc["longest_rewait_8gpu_s"] = {side: {t: x.longest_rewait[t][0] for t in TIERS}
                                        for side, x in (("with_line", a), ("without_line", d))}
        if set_waits:
            doc["set_waits"] = {side: [[i, z, round(b, 2), None if e is None else round(e, 2)]
                                       for i, z, b, e in x.waits]
                                for side, x in (("with_line", a), ("without_line", d))}
    return doc


PREEMPTION = {"on": (True,), "off": (False,), "both": (True, False)}
"""`--preemption`'s choices: the `Settings.preemption` values each runs, in order."""


def main(argv: list[str] | None = None) -> int:
    """The CLI (module docstring): for each `--preemption` setting (on, as `bench
    contention`, by default) and each `--reserve-after`, the seeds replayed with the line
    keeping its reservations and choosing them afresh, against the line off with the same
    preemption setting; prints each variant's summary over the seeds (each seed's figures
    are in the JSON), and with `--out` writes `line-replay.json` there."""
    p = argparse.ArgumentParser(prog="python -m bench.line_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int_between(1, MAX_SEEDS), default=20,
                   help=f"how many seeds, at most {MAX_SEEDS} (every seed's trace is built "
                        f"first; default 20)")
    p.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1, bench contention's)")
    p.add_argument("--reserve-after", type=finite_at_least(0), action="append",
                   help="line.reserveAfter (s), repeatable (default: 300 and 30)")
    p.add_argument("--reserving", type=int_between(1, 16), action="append",
                   help=f"how many sets at the front of each class's line may each reserve a node "
                        f"(1: the head alone), repeatable (default {RESERVING}, the controller's)")
    p.add_argument("--keep", choices=("both", "kept"), default="both",
                   help="reservations chosen afresh each batch and kept (both, the default), or "
                        "kept only (the controller's rule)")
    p.add_argument("--preemption", choices=tuple(PREEMPTION), default="on",
                   help="preemption in both lanes: on (as bench contention), off (no set is ever "
                        "preempted: the line's own effect), or both, one after the other "
                        "(default on)")
    p.add_argument("--on-demand-share", type=share, default=0.3,
                   help="the trace's share of on-demand sets, in [0, 1] (default 0.3, as bench "
                        "contention; 0: one tier, the line's own case)")
    p.add_argument("--asks-with-line", choices=ASKS, default="rounds",
                   help="when the sets ask in the lane with the line: rounds (every waiting set "
                        "each 2 s, one shuffled batch) or own (each set at its arrival and 2 s "
                        "after each refusal, decided alone, as the cluster's driver) (default "
                        "rounds)")
    p.add_argument("--asks-without-line", choices=ASKS, default=ASKS_WITHOUT_LINE,
                   help=f"the same for the lane without the line (default {ASKS_WITHOUT_LINE})")
    p.add_argument("--latency", type=finite_at_least(0), default=LATENCY,
                   help=f"with own asks, the most seconds an ask's answer takes (a uniform draw; "
                        f"the next ask 2 s after it) (default {LATENCY:g}, the cluster's median)")
    p.add_argument("--set-waits", action="store_true",
                   help="write each seed's per-set first waits of both lanes into the JSON")
    p.add_argument("--out", type=file_path, help="folder for line-replay.json")
    a = p.parse_args(argv)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = list(os.getloadavg())
    sha = commit()  # the code run: HEAD may move during a run of minutes
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    traces = {seed: trace_of(seed, on_demand_share=a.on_demand_share) for seed in seeds}
    variants = []
    for pre in PREEMPTION[a.preemption]:
        off = {seed: lane(tr, Settings(line=False, preemption=pre, asks=a.asks_without_line, latency=a.latency))
               for seed, tr in traces.items()}
        for ra in a.reserve_after or [300.0, 30.0]:
            for n in a.reserving or [RESERVING]:
                for keep in (False, True) if a.keep == "both" else (True,):
                    results = [SeedResult.of(seed, lane(tr, Settings(reserve_after=ra, reserving=n,
                                                                     asks=a.asks_with_line, latency=a.latency,
                                                                     keep_reservations=keep, preemption=pre)),
                                             off[seed])
                               for seed, tr in traces.items()]
                    s = summary(results)
                    name = (f"{'' if pre else 'preemption off, '}reserveAfter {ra:g} s, {n} reserving, "
                            f"reservations {'kept' if keep else 'chosen afresh'}")
                    print(name, json.dumps(s), flush=True)
                    variants.append({"preemption": pre, "reserve_after_s": ra, "reserving": n,
                                     "keep_reservations": keep, "summary": s,
                                     "seeds": [_seed_doc(r, a.set_waits) for r in results]})
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        doc = {"benchmark": "line-replay", "commit": sha, "started": started, "machine": machine(),
               "load_before": load_before, "load_after": list(os.getloadavg()),
               "trace": {"nodes": 6, "load": 1.1, "mean_life": 90.0, "span": 600.0, "warmup": 90.0,
                         "on_demand_share": a.on_demand_share},
               "settings": {"min_runtime_s": Settings().min_runtime, "retry_s": Settings().retry,
                            "asks": {"with_line": a.asks_with_line, "without_line": a.asks_without_line},
                            "latency_s": a.latency,
                            "drain_s": Settings().drain, "preemption": list(PREEMPTION[a.preemption])},
               "variants": variants}
        (a.out / "line-replay.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
