"""The soak's report: the RSS judgement over the steady stretch (`rss_trend`), which part of
the replicas' memory grew over it (`heap_parts_trend`), what the replicas' informers and
heaps held over it (`cache_change`, `heap_reports`, `heap_change`),
the report of a run (`soak_report`), issue 22's targets in it (`targets`), its human lines
(`summary`) and its figure (`plot`). Pure but for reading the replicas' logs and the
tracemalloc snapshots they name, and writing the figure."""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.soak.workload import schedule_digest

RSS_TARGET_MIB = 300.0         # issue 22's target for a replica's RSS
RSS_SLOPE_MAX_MIB_PER_MIN = round(RSS_TARGET_MIB / (24 * 60), 3)
RSS_SLOPE_WHY = (f"{RSS_SLOPE_MAX_MIB_PER_MIN} MiB/min = the whole {RSS_TARGET_MIB:g} MiB RSS "
                 f"target added in 24 h: a replica growing faster would need a restart (or "
                 f"twice its memory) within a day; slower growth is below what a steady "
                 f"stretch of minutes resolves (the slope's standard error there is ~0.05-0.1 "
                 f"MiB/min against the GC's sawtooth)")


def _fit(ts: list[float], ys: list[float]) -> tuple[float, float, float, float]:
    """Least squares y = a + b·t over ≥ 3 points with distinct t: (a, b, standard error of b,
    residual standard deviation), in the units of y and t."""
    n = len(ts)
    tm, ym = statistics.fmean(ts), statistics.fmean(ys)
    sxx = sum((t - tm) ** 2 for t in ts)
    b = sum((t - tm) * (y - ym) for t, y in zip(ts, ys)) / sxx
    a = ym - b * tm
    sd = math.sqrt(sum((y - a - b * t) ** 2 for t, y in zip(ts, ys)) / (n - 2))
    return a, b, sd / math.sqrt(sxx), sd


def _verdict(lo: float, hi: float, threshold: float) -> str:
    """A slope's verdict from its ± 2 SE bounds `lo`, `hi` against `threshold` (MiB/min)."""
    return "flat" if hi <= threshold else "growing" if lo > threshold else "inconclusive"


def _run_verdict(verdicts: list[str]) -> str | None:
    """The run's verdict from its processes': "growing" if any grows, "flat" if all are,
    "inconclusive" otherwise, None for none."""
    if not verdicts:
        return None
    return ("growing" if "growing" in verdicts else
            "flat" if set(verdicts) == {"flat"} else "inconclusive")


WARM_MIN_WINDOW_S = 300.0     # the shortest warmed stretch a process is judged over
WARM_WHY = "warming up until {until:.0f} s (first turnover of its listed VMIs)"
TRACEMALLOC_WHY = ("not judged: the replicas ran with tracemalloc (--tracemalloc, "
                   "PYTHONTRACEMALLOC=1), whose own tables grow with every allocation it traces")


def tombstone_ttl() -> float:
    """`k8s.cache.TOMBSTONE_TTL` (s a replica remembers a deleted VMI's incarnation), imported
    on first use: k8s.cache imports the Kubernetes client, which `gpu-binder --help` (it
    lists this benchmark) does without."""
    from k8s.cache import TOMBSTONE_TTL

    return TOMBSTONE_TTL


def warmup_window(first_s: float, *, restarts_s: Sequence[float] = (), live: int | None = None,
                  deletes_per_s: float | None = None) -> dict:
    """When a replica process is past its warm-up (issue 41 item 5): the window of the soak
    (s into the churn) in which its RSS grows without a leak. Pure.

    A replica that has just started or relisted holds its listed objects in compact hash
    tables; as the churn replaces the VMIs it listed (the soak deletes oldest first) every
    per-object map's table grows once (up to ~2x) and the VMI tombstones fill up to the
    delete rate x `k8s.cache.TOMBSTONE_TTL` (bench.heap_turnover --churn at 1,000 nodes,
    traced: 54.85 MiB listed, 59.53 after the 2,000 listed VMIs were replaced, 59.71 after
    2,000 more). So the warm-up begins at the process's first RSS sample `first_s`, or at
    the latest kube-apiserver restart in `restarts_s` after it (its informers may relist),
    whichever is later, and lasts W = max(TOMBSTONE_TTL, `live` VMIs / `deletes_per_s`): the
    tombstones' TTL or the time the churn takes to replace every VMI it listed, W =
    TOMBSTONE_TTL when `live` or `deletes_per_s` is unknown (None) or the rate is not
    positive. Returns {from_s, until_s, length_s} (rounded to 0.1 s)."""
    begin = max([first_s, *(t for t in restarts_s if t >= first_s)])
    turnover = (live / deletes_per_s if live is not None and deletes_per_s
                and deletes_per_s > 0 else 0.0)
    length = max(tombstone_ttl(), turnover)
    return {"from_s": round(begin, 1), "until_s": round(begin + length, 1),
            "length_s": round(length, 1)}


def _slope_fit(pts: list[tuple[float, float]], end: float, threshold: float) -> dict:
    """The least-squares fit of `pts` [(t s, MiB)] (≥ 3, distinct t) as rss_trend reports
    it: slope and its SE in MiB/min, ± 2 SE bounds, verdict against `threshold`, the level
    fitted at `end`."""
    a, b, se, sd = _fit([t for t, _ in pts], [m for _, m in pts])
    slope, se = b * 60, se * 60
    lo, hi = slope - 2 * se, slope + 2 * se
    level = a + b * end
    verdict = _verdict(lo, hi, threshold)
    return {"from_s": pts[0][0], "samples": len(pts), "span_s": round(pts[-1][0] - pts[0][0], 1),
            "slope_mib_per_min": round(slope, 3), "se_mib_per_min": round(se, 3),
            "ci95_mib_per_min": [round(lo, 3), round(hi, 3)], "resid_sd_mib": round(sd, 2),
            "level_mib": round(level, 1), "peak_mib": round(max(m for _, m in pts), 1),
            "hours_to_target": (round(max(0.0, RSS_TARGET_MIB - level) / slope / 60, 1)
                                if slope > 0 and verdict != "flat" else None),
            "fit": [round(a, 3), round(b, 6)], "verdict": verdict}


def _whole(fit: dict) -> dict:
    """The whole-stretch part of a `_slope_fit` as rss_trend reports it beside the judged one."""
    return {k: fit[k] for k in ("from_s", "samples", "span_s", "slope_mib_per_min",
                                "se_mib_per_min", "ci95_mib_per_min", "level_mib", "verdict")}


def rss_trend(samples: list[tuple[float, int, int, float]], start: float, end: float, *,
              every: float = 10.0, threshold: float = RSS_SLOPE_MAX_MIB_PER_MIN,
              restarts_s: Sequence[float] = (), live: int | None = None,
              deletes_per_s: float | None = None, tracemalloc: bool = False) -> dict:
    """The RSS judgement over the steady stretch [`start`, `end`] s of `samples` [(t s,
    replica index, pid, RSS MiB)] taken every `every` s, each process judged only past its
    warm-up (issue 41 item 5, `warmup_window` from `restarts_s`, the kube-apiserver
    restarts' times, `live` VMIs and the stretch's `deletes_per_s`). Pure.

    Considered: each process (replica, pid) alive through the whole stretch — a sample at or
    before `start` and one at or after `end - 1.5·every`, at least 5 samples in the stretch
    spanning ≥ 60 s. Judged: those of them whose warmed stretch [max(`start`, warm-up's
    end), `end`] is ≥ WARM_MIN_WINDOW_S long with ≥ 5 samples, fitted over it; the others
    are excluded with why "warming up until T s (first turnover of its listed VMIs)". Its
    verdict against `threshold` (MiB/min): "flat" when slope + 2 SE ≤ threshold, "growing"
    when slope − 2 SE > threshold, else "inconclusive". The run's verdict: "growing" if any
    judged process grows, "flat" if every judged one is flat, "inconclusive" otherwise, None
    when none was judged (`not_judged` says why). With `tracemalloc` (the replicas ran with
    PYTHONTRACEMALLOC=1) nothing is judged: tracemalloc's own tables grow.

    Each considered process's fit over the whole stretch is reported beside its judged one
    (`whole_stretch`, in the excluded entry for one not judged), never in its place, and the
    run's verdict over those fits as `whole_stretch_verdict`. Returns {from_s, to_s,
    threshold_mib_per_min, threshold_why, warmup: {length_s, ttl_s, live, deletes_per_s,
    restarts_s, min_window_s}, processes: [{replica, pid, warmup: {from_s, until_s,
    length_s}, from_s (the judged fit's start), samples, span_s, slope_mib_per_min,
    se_mib_per_min, ci95_mib_per_min: [lo, hi], resid_sd_mib, level_mib (fitted at `end`),
    peak_mib, hours_to_target (None when not growing), fit: [a MiB, b MiB/s], verdict,
    whole_stretch: {from_s, samples, span_s, slope_mib_per_min, se_mib_per_min,
    ci95_mib_per_min, level_mib, verdict}}], excluded: [{replica, pid, first_s, last_s, why,
    and for a considered process warmup and whole_stretch}], verdict, not_judged,
    whole_stretch_verdict, peak_mib}."""
    by: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for t, i, pid, mib in samples:
        by.setdefault((i, pid), []).append((t, mib))
    restarts = sorted(t for t in restarts_s if t <= end)
    judged, excluded, wholes = [], [], []
    for (i, pid), pts in sorted(by.items()):
        pts.sort()
        first, last = pts[0][0], pts[-1][0]
        why = ("started after the stretch began" if first > start else
               "gone before the stretch ended" if last < end - 1.5 * every else "")
        fit = [(t, m) for t, m in pts if start <= t <= end]
        if not why and (len(fit) < 5 or fit[-1][0] - fit[0][0] < 60):
            why = "too few samples in the stretch"
        row = {"replica": i, "pid": pid, "first_s": first, "last_s": last}
        if why:
            excluded.append({**row, "why": why})
            continue
        whole = _whole(_slope_fit(fit, end, threshold))
        wholes.append(whole["verdict"])
        warm = warmup_window(first, restarts_s=restarts, live=live, deletes_per_s=deletes_per_s)
        warmed = [(t, m) for t, m in fit if t >= warm["until_s"]]
        if tracemalloc:
            why = TRACEMALLOC_WHY
        elif end - max(start, warm["until_s"]) < WARM_MIN_WINDOW_S or len(warmed) < 5:
            why = WARM_WHY.format(until=warm["until_s"])
        if why:
            excluded.append({**row, "why": why, "warmup": warm, "whole_stretch": whole})
            continue
        judged.append({"replica": i, "pid": pid, "warmup": warm,
                       **_slope_fit(warmed, end, threshold), "whole_stretch": whole})
    verdict = _run_verdict([p["verdict"] for p in judged])
    length = warmup_window(0.0, live=live, deletes_per_s=deletes_per_s)["length_s"]
    return {"from_s": start, "to_s": end, "threshold_mib_per_min": threshold,
            "threshold_why": RSS_SLOPE_WHY,
            "warmup": {"length_s": length, "ttl_s": tombstone_ttl(), "live": live,
                       "deletes_per_s": (round(deletes_per_s, 3)
                                         if deletes_per_s is not None else None),
                       "restarts_s": restarts, "min_window_s": WARM_MIN_WINDOW_S},
            "processes": judged, "excluded": excluded, "verdict": verdict,
            "not_judged": (TRACEMALLOC_WHY if tracemalloc else
                           None if judged else
                           "no process past its warm-up for "
                           f"{WARM_MIN_WINDOW_S:.0f} s of the stretch" if wholes else
                           "no process alive through the stretch"),
            "whole_stretch_verdict": _run_verdict(wholes),
            "peak_mib": round(max(m for *_, m in samples), 1) if samples else None}


def judge_inputs(report: dict) -> dict:
    """What `rss_trend` judges a saved or fresh soak report by, from its `steady`, `events`,
    `spec` and `heap_over_steady`: {start, end, every, restarts_s (the "restart-apiserver"
    events' `at`), live (steady.live_max), deletes_per_s (steady.operations.delete over the
    stretch), tracemalloc (spec.tracemalloc; in reports from before that field, True when a
    heap report over the stretch carries tracemalloc's traced figures), missing: [what the
    report lacks and what was assumed instead]}. Pure."""
    missing = []
    steady = report.get("steady") or {}
    spec = report.get("spec") or {}
    old = report.get("rss_trend") or {}
    start = steady.get("from_s", old.get("from_s"))
    end = steady.get("to_s", old.get("to_s"))
    if not steady:
        missing.append("steady (the stretch taken from rss_trend; live VMIs and delete rate "
                       f"unknown: warm-up = the tombstone TTL, {tombstone_ttl():g} s)")
    live = steady.get("live_max")
    deletes = (steady.get("operations") or {}).get("delete")
    if steady and live is None:
        missing.append("steady.live_max (warm-up = the tombstone TTL)")
    if steady and deletes is None:
        missing.append("steady.operations.delete (warm-up = the tombstone TTL)")
    rate = deletes / (end - start) if deletes is not None and end and end > start else None
    if "events" not in report:
        missing.append("events (no kube-apiserver restart known)")
    restarts = [e["at"] for e in report.get("events") or [] if e.get("kind") == "restart-apiserver"]
    if "tracemalloc" in spec:
        traced = bool(spec["tracemalloc"])
    else:
        traced = any("traced_mib" in h for h in report.get("heap_over_steady") or [])
        missing.append("spec.tracemalloc (inferred from the heap reports: "
                       f"{'tracemalloc snapshots' if traced else 'no tracemalloc figures'})")
    return {"start": start, "end": end, "every": spec.get("rss_every", 10.0),
            "restarts_s": restarts, "live": live, "deletes_per_s": rate, "tracemalloc": traced,
            "missing": missing}


def heap_parts_trend(samples: list[tuple[float, int, int, dict[str, int]]], start: float,
                     end: float, *, every: float = 10.0,
                     threshold: float = RSS_SLOPE_MAX_MIB_PER_MIN,
                     restarts_s: Sequence[float] = (), live: int | None = None,
                     deletes_per_s: float | None = None) -> dict:
    """Which part of each replica's memory grew over the steady stretch [`start`, `end`] s:
    `samples` [(t s, replica, pid, {part: bytes, pymalloc_blocks: count})] (the replicas'
    `gpu_binder_heap_bytes` and `gpu_binder_heap_pymalloc_blocks`, actors.heap.heap_parts)
    taken every `every` s, each part fitted as `rss_trend` fits RSS (same processes judged:
    alive through the stretch, ≥ 5 samples of the part spanning ≥ 60 s, past their warm-up
    by `restarts_s`, `live` and `deletes_per_s` and fitted over the same warmed stretch;
    same verdicts against `threshold` MiB/min). Pure. Returns {from_s, to_s, threshold_mib_per_min,
    processes: [{replica, pid, samples, parts: {part: {slope_mib_per_min, se_mib_per_min,
    level_mib, verdict}}, pymalloc_blocks_per_min (None without that figure), growing:
    [parts whose verdict is "growing", steepest first]}]}, the parts of each process in
    order of slope, steepest first."""
    by_part: dict[str, list[tuple[float, int, int, float]]] = {}
    blocks: list[tuple[float, int, int, float]] = []
    for t, i, pid, parts in samples:
        for part, n in parts.items():
            if part == "pymalloc_blocks":
                blocks.append((t, i, pid, float(n)))
            else:
                by_part.setdefault(part, []).append((t, i, pid, n / 2**20))
    procs: dict[tuple[int, int], dict] = {}
    warm = {"restarts_s": restarts_s, "live": live, "deletes_per_s": deletes_per_s}
    for part, pts in sorted(by_part.items()):
        for p in rss_trend(pts, start, end, every=every, threshold=threshold,
                           **warm)["processes"]:
            row = procs.setdefault((p["replica"], p["pid"]), {
                "replica": p["replica"], "pid": p["pid"], "samples": p["samples"], "parts": {},
                "pymalloc_blocks_per_min": None})
            row["parts"][part] = {k: p[k] for k in ("slope_mib_per_min", "se_mib_per_min",
                                                     "level_mib", "verdict")}
    for p in rss_trend(blocks, start, end, every=every, **warm)["processes"]:
        if (p["replica"], p["pid"]) in procs:
            procs[p["replica"], p["pid"]]["pymalloc_blocks_per_min"] = p["slope_mib_per_min"]
    for row in procs.values():
        row["parts"] = dict(sorted(row["parts"].items(),
                                   key=lambda kv: -kv[1]["slope_mib_per_min"]))
        row["growing"] = [k for k, v in row["parts"].items() if v["verdict"] == "growing"]
    return {"from_s": start, "to_s": end, "threshold_mib_per_min": threshold,
            "processes": [procs[k] for k in sorted(procs)]}


def refusal_part(recs) -> dict:
    """The refusals of `recs` (`bench.soak.driver.Rec`s) by reason (`refusals_by_reason`):
    `refusal_reasons` (counts), `refusal_examples` (one whole refusal a reason) and, when
    the creates have tiers (`--priorities`), `refusal_reasons_by_tier`."""
    refused = [r for r in recs if r.outcome == "refused"]
    reasons, examples = refusals_by_reason([r.refusal for r in refused])
    out = {"refusal_reasons": reasons, "refusal_examples": examples}
    tiers = sorted({r.tier for r in refused if r.tier})
    if tiers:
        out["refusal_reasons_by_tier"] = {
            t: refusals_by_reason([r.refusal for r in refused if r.tier == t])[0] for t in tiers}
    return out


def soak_report(soak) -> dict:
    """The report of a finished `bench.soak.driver.Soak` run: the schedule, the creates'
    outcomes and answer times, the refusals by reason, the violations, the disturbances
    (`events`), the steady stretch, the RSS judgement (`rss_trend`, each replica past its
    warm-up: `judge_inputs`) and samples, the slope of
    each part of the replicas' memory (`heap_parts_trend`) and its samples, the informers' objects and the replicas' heap reports over the steady stretch; in device
    mode its `device` part (`device_part`)."""
    out = Counter(r.outcome for r in soak.recs)
    answers = sorted(r.answer_s for r in soak.recs if r.outcome in ("admitted", "refused"))
    steady = soak.steady()
    judge = judge_inputs({"steady": steady, "events": soak.events, "spec": asdict(soak.spec)})
    warm = {k: judge[k] for k in ("restarts_s", "live", "deletes_per_s")}
    trend = rss_trend(soak.rss, soak.spec.steady_from, soak.spec.seconds,
                      every=soak.spec.rss_every, tracemalloc=judge["tracemalloc"], **warm)
    return {
        "seed": soak.spec.seed, "schedule": schedule_digest(soak.ops),
        "spec": asdict(soak.spec), "operations": dict(Counter(o.kind for o in soak.ops)),
        "population": soak.population,
        "churn_s": getattr(soak, "churn_s", None),
        "creates": len(soak.recs), "admitted": out["admitted"], "refused": out["refused"],
        "admissions_lost": out["lost"], "gave_up": out["gave up"],
        "by_tier": {t: dict(Counter(r.outcome for r in soak.recs if r.tier == t))
                    for t in sorted({r.tier for r in soak.recs if r.tier})},
        "lost": [asdict(r) for r in soak.recs if r.outcome == "lost"][:20],
        **refusal_part(soak.recs),
        "answer_p50_s": answers[len(answers) // 2] if answers else None,
        "answer_p99_s": answers[int(len(answers) * .99)] if answers else None,
        "violations": len(soak.tally.seen), "violations_by_kind": soak.tally.by_kind(),
        "p6": p6_part(soak.tally.by_kind(), soak.counts, list(soak.p6.nominations.values()),
                      len(soak.p6.victims_gone), soak.p6.judged, soak.spec.priorities),
        "violation_list": [v.to_dict() for v in soak.tally.violations][:50],
        "samples": soak.tally.samples, "counts": dict(soak.counts),
        "events": soak.events, "final": soak.final,
        "steady": steady, "rss_trend": trend, "rss_peak_mib": trend["peak_mib"],
        "rss_samples": soak.rss, "violation_timeline": soak.samples,
        "cache_samples": soak.cached,
        "heap_parts_samples": getattr(soak, "heap_parts", []),
        "heap_parts_trend": heap_parts_trend(getattr(soak, "heap_parts", []),
                                             trend["from_s"], trend["to_s"],
                                             every=soak.spec.rss_every, **warm),
        "cache_over_steady": cache_change(soak.cached, trend["from_s"], trend["to_s"]),
        "heap_over_steady": heap_change(heap_reports(
            [r.log_path for r in soak.lc.replicas])),
        **({"device": {**device_part(soak.tally.by_kind(), soak.counts, soak.evictions,
                                     soak.claims_seen, list(soak.taint_unsure.values())),
                       "taint_rules": [{"name": t.name, "device": "/".join(t.ref),
                                        "effect": t.effect, "made": t.made.isoformat(),
                                        "removed": t.removed and t.removed.isoformat()}
                                       for t in soak.taints.values()]}}
           if getattr(soak.spec, "mode", "count") == "device" else {}),
    }


P6_KINDS = {"stopped_only_victims_of_live_nominations": "vmi-gone-not-victim",
            "nominated_room_for_nobody_else": "nominated-room-taken",
            "no_lower_priority_start_on_room_a_waiting_set_could_use": "lower-priority-start"}
"""§3c P6's three invariants as the soak checks them, and the violation kind of each
(`localcluster.invariants`: STOPPED_NOT_VICTIM, NOMINATED_TAKEN, LINE_INVERSION)."""


def p6_part(by_kind: dict[str, int], counts: dict, nominations: list[dict], victims_gone: int,
            line_judged: dict, priorities: bool) -> dict:
    """§3c P6 in a report, each invariant's violations beside what it was checked over, so
    that 0 violations over 0 preemptions reads as not exercised: `preemptions` (the distinct
    GPUNominations seen: one per preemptor and creation, `nominations` as
    `P6Check.note_nomination` keeps them), the victims they named and those seen gone
    (`victims_gone`), the preemptors answered as nominated and admitted and on which node
    (`counts`), the sets `check_line_order` judged (`line_judged`: the number of waiting sets
    each was judged against, False not judged for want of an early enough read or, device
    mode, of the DRA objects judging needs, None started
    before the first read), those started while a higher-priority set waited, and the creates'
    503s in line; `exercised` False (no preemption, no set started while a higher one waited,
    or without `priorities`) and `note` saying what did not run. Pure."""
    victims = {v for n in nominations for v in n["victims"]}
    counted = [v for v in line_judged.values() if isinstance(v, int) and not isinstance(v, bool)]
    judged, contested = len(counted), sum(1 for v in counted if v > 0)
    unjudged = sum(1 for v in line_judged.values() if v is False)
    over = {"stopped_only_victims_of_live_nominations":
            f"{victims_gone} victims seen gone, of {len(victims)} named",
            "nominated_room_for_nobody_else": f"{len(nominations)} nominations",
            "no_lower_priority_start_on_room_a_waiting_set_could_use":
            (f"{contested} sets started while a higher-priority set waited in line, of "
             f"{judged} judged ({unjudged} not: no read early enough, or device mode "
             "without the DRA objects), "
             f"{counts.get('waits_in_line', 0)} 503s in line" if priorities
             else "not checked (run with --priorities)")}
    notes = []
    if not nominations:
        notes.append("0 preemptions: the checks of the first two invariants ran over none")
    if not priorities:
        notes.append("without --priorities nothing waits with a higher priority: the third "
                     "invariant is not checked")
    elif not contested:
        notes.append("no set started while a higher-priority set waited in line: the third "
                     "invariant ran over none")
    return {"preemptions": len(nominations), "victims_named": len(victims),
            "victims_seen_gone": victims_gone,
            "victims_per_preemption": round(sum(len(n["victims"]) for n in nominations)
                                            / len(nominations), 2) if nominations else None,
            "preemptors": {k: counts.get(f"preemptors_{k}", 0)
                           for k in ("nominated", "admitted", "on_nominated_node", "elsewhere")},
            "line": {"sets_judged": judged, "sets_started_while_higher_waited": contested,
                     "sets_not_judged": unjudged, "waits_in_line": counts.get("waits_in_line", 0)},
            "invariants": {name: {"violations": by_kind.get(kind, 0), "checked_over": over[name]}
                           for name, kind in P6_KINDS.items()},
            "exercised": bool(nominations) and priorities and contested > 0,
            "note": "; ".join(notes) or None,
            "nominations": nominations[:20]}


DEVICE_KINDS = ("orphan-claim", "missing-claim", "placed-on-tainted-device",
                "tenant-over-device-budget", "device-recorded-twice")
"""The violation kinds device mode adds to §7's (`bench.soak.device`) and DR6's
(`localcluster.invariants.DOUBLE_RECORDED`), reported one by one (0 when none)."""


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else None


def device_part(by_kind: dict[str, int], counts: dict, evictions: list[dict],
                claims_seen: list[tuple[float, int, int, float]],
                unsure: list[dict] = ()) -> dict:
    """Device mode's figures: each of DEVICE_KINDS' distinct violations (`by_kind`, 0 when
    absent), the DeviceTaintRules made and removed (`counts`: taints_NoSchedule,
    taints_NoExecute, untaints; NoExecute skipped with no running VMI, or with no record),
    the NoExecute evictions ([{at, vmi, device, evicted, evicted_s}]: how many the eviction
    controller carried out, p50/p99/max seconds from the rule to the launcher Pod gone, those
    not seen gone), and our claims per sample ((t, claims, without their VMI, the oldest of
    those s): min, max, last; the most without their VMI, and the oldest, s), and the
    placements on a tainted device that their windows cannot judge (`unsure`,
    `bench.soak.device.check_taints`: not violations, listed). Pure."""
    done = [e["evicted_s"] for e in evictions if e["evicted"]]
    return {
        "violations": {k: by_kind.get(k, 0) for k in DEVICE_KINDS},
        "taints": {k: counts.get(k, 0) for k in ("taints_NoSchedule", "taints_NoExecute",
                                                   "untaints", "noexecute_skipped",
                                                   "noexecute_no_record")},
        "tainted_unsure": {"count": len(unsure), "placements": list(unsure)[:20]},
        "evictions": {"asked": len(evictions), "evicted": len(done),
                      "not_evicted": [e for e in evictions if not e["evicted"]][:20],
                      "p50_s": _pct(done, .5), "p99_s": _pct(done, .99),
                      "max_s": max(done) if done else None,
                      "vmis_deleted_after": counts.get("evicted", 0)},
        "claims": {"samples": len(claims_seen),
                   "min": min((c[1] for c in claims_seen), default=None),
                   "max": max((c[1] for c in claims_seen), default=None),
                   "last": claims_seen[-1][1] if claims_seen else None,
                   "without_vmi_max": max((c[2] for c in claims_seen), default=None),
                   "without_vmi_oldest_s": max((c[3] for c in claims_seen), default=None)}}


_REFUSED_HEAD = re.compile(r"refused \S+ request \S+(?: for now)?: ")
"""The binder's own head of a refusal written on a set (`model.reasons.SetRefused.render`)."""


def refusal_reason(refusal: str) -> str:
    """'403: admission webhook "…" denied the request: <reason>' -> '403: <reason>', what the
    report counts refusals by: the binder's head ("refused <vmi> request <id>: ") and the
    set's devices ("devices …; ", "4 new h100 devices; ") left out, every run of digits
    (names, counts, ids) written "#", so that one cause is one key; its first 120
    characters. '429: <text>' (no webhook) stays as it is, digits aside."""
    status, _, message = refusal.partition(": ")
    message = message.rpartition("denied the request: ")[2]
    head = _REFUSED_HEAD.match(message)
    if head is not None:
        devices, sep, rest = message[head.end():].partition("; ")
        message = rest if sep else devices
    return f"{status}: {re.sub(r'[0-9]+', '#', message)}"[:120]


def refusals_by_reason(refusals: Sequence[str], top: int = 12) -> tuple[dict, dict]:
    """`refusals` (each "<status>: <text>") counted by `refusal_reason`, the `top` most
    common (most first), and one whole refusal of each (its first 300 characters) as an
    example of what the key stands for."""
    counts: Counter = Counter()
    examples: dict[str, str] = {}
    for r in refusals:
        key = refusal_reason(r)
        counts[key] += 1
        examples.setdefault(key, r[:300])
    keys = counts.most_common(top)
    return dict(keys), {k: examples[k] for k, _ in keys}


def heap_reports(logs: list[Path]) -> list[dict]:
    """The `heap report` lines (JSON) of the replicas' logs, in order, each with the index
    of the log it came from as `replica`."""
    out = []
    for i, path in enumerate(logs):
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if '"heap report"' in line:
                try:
                    out.append({**json.loads(line), "replica": i})
                except ValueError:
                    pass
    return out


def heap_change(reports: list[dict], top: int = 12) -> list[dict]:
    """For each process with two heap reports or more (alive at the steady stretch's start
    and end, when the soak sent SIGUSR2): its first and last (gc's objects, traced MiB) and,
    when both wrote a tracemalloc snapshot, the `top` source lines whose allocations grew
    most between them ([file:line, KiB, blocks]). `gc_frozen` is [first, last] too: objects
    frozen at start-up (`settle_heap`) that die are replaced by unfrozen ones, so a rise in
    `gc_objects` with a like fall in `gc_frozen` is turnover, not growth."""
    import tracemalloc

    by: dict[tuple[int, int], list[dict]] = {}
    for r in reports:
        by.setdefault((r["replica"], r.get("pid")), []).append(r)
    out = []
    for (replica, pid), mine in by.items():
        if len(mine) < 2:
            continue
        first, last = mine[0], mine[-1]
        row = {"replica": replica, "pid": pid,
               "gc_objects": [first["gc_objects"], last["gc_objects"]],
               "gc_frozen": [first.get("gc_frozen"), last.get("gc_frozen")]}
        if first.get("snapshot") and last.get("snapshot"):
            row["traced_mib"] = [round(first["traced_bytes"] / 2**20, 1),
                                 round(last["traced_bytes"] / 2**20, 1)]
            try:
                a = tracemalloc.Snapshot.load(first["snapshot"])
                b = tracemalloc.Snapshot.load(last["snapshot"])
            except OSError as exc:
                row["top_growth"] = f"cannot read the snapshots: {exc}"
            else:
                row["top_growth"] = [
                    [str(d.traceback[0]), round(d.size_diff / 1024, 1), d.count_diff]
                    for d in b.compare_to(a, "lineno")[:top]]
        out.append(row)
    return out


def cache_change(samples: list[tuple[float, int, int, dict[str, int]]], start: float,
                 end: float) -> list[dict]:
    """For each process sampled at least twice within the steady stretch [`start`, `end`] s,
    its informers' objects at the first and the last of those samples, in order of replica
    and first sample: [{replica, pid, first_s, last_s, first: {informer: n}, last: {…}}].
    Pure."""
    by: dict[tuple[int, int], list[tuple[float, dict[str, int]]]] = {}
    for t, i, pid, held in sorted(samples, key=lambda x: x[0]):
        if start <= t <= end:
            by.setdefault((i, pid), []).append((t, held))
    return [{"replica": i, "pid": pid, "first_s": pts[0][0], "last_s": pts[-1][0],
             "first": pts[0][1], "last": pts[-1][1]}
            for (i, pid), pts in sorted(by.items(), key=lambda kv: (kv[0][0], kv[1][0][0]))
            if len(pts) >= 2]



def targets(report: dict) -> dict:
    """Issue 22's soak targets in a report: 0 violations, 0 admissions lost, replica RSS flat
    over the steady stretch (`rss_trend`'s verdict: each replica past its warm-up, issue 41
    item 5; `met` None with the reason as its value when none was judged or with
    tracemalloc), peak RSS under RSS_TARGET_MIB (not judged with tracemalloc either: its
    tables hold a copy of every traced allocation's traceback); in
    device mode 0 of each device kind (orphan and missing claims, placements on a tainted
    device, device budgets, DR6), each already counted in `violations`; with `--priorities`
    that P6 was exercised (`p6_part`: preemptions seen and sets judged against the line)."""
    trend = report["rss_trend"]
    return {
        "violations": {"value": report["violations"], "target": 0,
                       "met": report["violations"] == 0},
        "admissions_lost": {"value": report["admissions_lost"], "target": 0,
                            "met": report["admissions_lost"] == 0},
        "rss_flat": {"value": {f"replica-{p['replica']} pid {p['pid']}":
                               f"{p['slope_mib_per_min']} ± {2 * p['se_mib_per_min']:.3f} "
                               f"over {p['from_s']:.0f}-{trend['to_s']:.0f} s"
                               for p in trend["processes"]}
                     or trend.get("not_judged") or "no process judged",
                     "target": f"slope + 2 SE <= {trend['threshold_mib_per_min']} MiB/min "
                               f"over {trend['from_s']:.0f}-{trend['to_s']:.0f} s, each "
                               "replica past its warm-up",
                     "met": None if trend["verdict"] in (None, "inconclusive")
                     else trend["verdict"] == "flat"},
        "rss_peak": ({"value": f"{report['rss_peak_mib']} MiB, {TRACEMALLOC_WHY}",
                      "target": f"< {RSS_TARGET_MIB:g} MiB", "met": None}
                     if trend.get("not_judged") == TRACEMALLOC_WHY else
                     {"value": report["rss_peak_mib"], "target": f"< {RSS_TARGET_MIB:g} MiB",
                      "met": None if report["rss_peak_mib"] is None
                      else report["rss_peak_mib"] < RSS_TARGET_MIB}),
        **{f"device_{kind.replace('-', '_')}": {"value": n, "target": 0, "met": n == 0}
           for kind, n in (report.get("device") or {}).get("violations", {}).items()},
        **({"p6_exercised": {"value": f"{report['p6']['preemptions']} preemptions, "
                                      f"{report['p6']['line']['sets_started_while_higher_waited']} "
                                      "sets started while a higher-priority set waited",
                             "target": "> 0 of each (--priorities)",
                             "met": report["p6"]["exercised"]}}
           if (report.get("spec") or {}).get("priorities") and report.get("p6") else {})}



def p6_lines(p6: dict | None) -> list[str]:
    """The human lines of a report's `p6` part (none without one)."""
    if not p6:
        return []
    return [f"P6: {p6['preemptions']} preemptions, {p6['victims_named']} victims named "
            f"({p6['victims_seen_gone']} seen gone; per preemption "
            f"{p6['victims_per_preemption']}), preemptors {p6['preemptors']}; "
            + "; ".join(f"{k.replace('_', ' ')}: {v['violations']} violations over "
                        f"{v['checked_over']}" for k, v in p6["invariants"].items())
            + (f" — NOT EXERCISED: {p6['note']}" if not p6["exercised"] else "")]


def _ws(w: dict) -> str:
    """A whole-stretch fit as the RSS lines show it."""
    return (f"whole stretch {w['slope_mib_per_min']} ± {2 * w['se_mib_per_min']:.3f}, "
            f"{w['verdict']}")


def rss_lines(report: dict) -> list[str]:
    """The human lines of a report's RSS judgement (`rss_trend`): the steady stretch, the
    warm-up rule's figures, each judged process (its warmed stretch, slope ± 2 SE, verdict,
    level; its whole-stretch fit beside it), each one not judged with why, the run's
    verdict and the peak."""
    tr = report["rss_trend"]
    st = report.get("steady") or {}
    w = tr.get("warmup") or {}
    out = [f"steady stretch {tr['from_s']:.0f}-{tr['to_s']:.0f} s: live "
           f"{st.get('live_min')}-{st.get('live_max')}, ops {st.get('operations')}"]
    if w:
        out.append(f"warm-up (issue 41 item 5): {w['length_s']:.0f} s = max(tombstone TTL "
                   f"{w['ttl_s']:g} s, {w['live']} live VMIs / {w['deletes_per_s']} deletes/s) "
                   f"from each process's first sample or the latest kube-apiserver restart "
                   f"after it ({w['restarts_s']}); judged when >= {w['min_window_s']:.0f} s "
                   "of the stretch are past it")
    out.append("RSS over it (MiB/min, ± 2 SE): " + (", ".join(
        f"replica-{p['replica']} pid {p['pid']} {p['slope_mib_per_min']} ± "
        f"{2 * p['se_mib_per_min']:.3f} over {p.get('from_s', tr['from_s']):.0f}-"
        f"{tr['to_s']:.0f} s ({p['verdict']}, level {p['level_mib']} MiB"
        + (f"; {_ws(p['whole_stretch'])}" if p.get("whole_stretch") else "") + ")"
        for p in tr["processes"]) or "none judged")
        + f"; threshold {tr['threshold_mib_per_min']}: {tr['verdict']}"
        + (f" ({tr['not_judged']})" if tr.get("not_judged") else "")
        + (f"; whole stretch: {tr['whole_stretch_verdict']}"
           if tr.get("whole_stretch_verdict") else "")
        + f"; peak RSS {tr['peak_mib']} MiB")
    out += [f"not judged: replica-{x['replica']} pid {x['pid']} (first sample {x['first_s']} s): "
            f"{x['why']}" + (f" ({_ws(x['whole_stretch'])})" if x.get("whole_stretch") else "")
            for x in tr.get("excluded", []) if x.get("whole_stretch")]
    return out


def summary(report: dict) -> list[str]:
    """Human lines of a report."""
    return [f"soak seed {report['seed']} schedule {report['schedule']}: "
            f"{report['creates']} creates, {report['admitted']} admitted, "
            f"{report['refused']} refused, {report['counts'].get('deleted', 0)} deleted, "
            f"{report['counts'].get('held_moves', 0)} held-device moves",
            f"violations {report['violations']} {report['violations_by_kind']}, "
            f"admissions lost {report['admissions_lost']}, samples {report['samples']}",
            *p6_lines(report.get("p6")),
            f"events {[(e['at'], e['kind'], e.get('takeover_s', e.get('outage_s'))) for e in report['events']]}",
            *rss_lines(report)] + [
            f"informers' objects (and connections) over it, replica-{c['replica']} pid "
            f"{c['pid']}: " + ", ".join(
                f"{k} {c['first'].get(k)} -> {c['last'].get(k)}" for k in sorted(c["last"]))
            for c in report.get("cache_over_steady", [])] + [
            f"memory by part over it (MiB/min, ± 2 SE; level MiB), replica-{h['replica']} pid "
            f"{h['pid']}: " + ", ".join(
                f"{k} {v['slope_mib_per_min']} ± {2 * v['se_mib_per_min']:.3f} "
                f"({v['level_mib']})" for k, v in h["parts"].items())
            + (f"; pymalloc blocks {h['pymalloc_blocks_per_min']:+.0f}/min"
               if h.get("pymalloc_blocks_per_min") is not None else "")
            + f"; growing: {', '.join(h['growing']) or 'none'}"
            for h in (report.get("heap_parts_trend") or {}).get("processes", [])] + [
            f"heap over it, replica-{h['replica']} pid {h['pid']}: gc objects "
            f"{h['gc_objects'][0]} -> {h['gc_objects'][1]} (frozen "
            f"{h['gc_frozen'][0]} -> {h['gc_frozen'][1]})"
            + (f", traced {h['traced_mib'][0]} -> {h['traced_mib'][1]} MiB" if "traced_mib" in h
               else "")
            for h in report.get("heap_over_steady", [])] + ([
            f"device mode: violations {report['device']['violations']}, taints "
            f"{report['device']['taints']} (placements their windows cannot judge: "
            f"{report['device'].get('tainted_unsure', {}).get('count', 0)}), NoExecute evictions "
            f"{report['device']['evictions']['evicted']}/{report['device']['evictions']['asked']}"
            f" (p50 {report['device']['evictions']['p50_s']} s, p99 "
            f"{report['device']['evictions']['p99_s']} s), claims of ours "
            f"{report['device']['claims']}"] if report.get("device") else [])


def plot(report: dict, path: Path) -> None:
    """RSS per replica process over time (the steady stretch shaded, each judged process's
    fit over its warmed stretch drawn, kills and the API-server restart marked), and below the
    VMIs held as admitted with the running count of distinct violations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = report["rss_trend"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True,
                               gridspec_kw={"height_ratios": [3, 2]})
    by: dict = {}
    for t, i, pid, mib in report["rss_samples"]:
        by.setdefault((i, pid), []).append((t, mib))
    judged = {(p["replica"], p["pid"]): p for p in tr["processes"]}
    for (i, pid), pts in sorted(by.items()):
        p = judged.get((i, pid))
        label = f"replica {i} pid {pid}" + (
            f": {p['slope_mib_per_min']:+.3f} ± {2 * p['se_mib_per_min']:.3f} MiB/min "
            f"({p['verdict']})" if p else "")
        line, = a.plot([q[0] for q in pts], [q[1] for q in pts], lw=1.2 if p else 0.8,
                       label=label)
        if p:
            a0, b0 = p["fit"]
            t0 = p.get("from_s", tr["from_s"])
            a.plot([t0, tr["to_s"]], [a0 + b0 * t0, a0 + b0 * tr["to_s"]],
                   color=line.get_color(), ls=":", lw=2)
    for ax in (a, b):
        ax.axvspan(tr["from_s"], tr["to_s"], color="green", alpha=0.08)
        for e in report["events"]:
            ax.axvline(e["at"], color="red" if e["kind"] == "kill-leader" else "purple",
                       ls="--", lw=0.8)
    a.axhline(RSS_TARGET_MIB, color="grey", lw=0.6)
    a.set_ylabel("RSS (MiB)")
    a.set_title(f"soak seed {report['seed']} ({report['schedule']}): "
                f"{report['spec']['nodes']} nodes; RSS over the steady stretch (green, "
                f"dotted: fits past each replica's warm-up): "
                f"{tr['verdict'] or 'not judged'} at <= {tr['threshold_mib_per_min']} MiB/min; "
                f"peak {tr['peak_mib']} MiB\n(red: leader kill -9, purple: kube-apiserver "
                f"restart, grey: {RSS_TARGET_MIB:g} MiB target)", fontsize=9)
    a.legend(fontsize=7, loc="lower right")
    tl = report["violation_timeline"]
    b.plot([x[0] for x in tl], [x[2] for x in tl], label="VMIs held as admitted")
    b.plot([x[0] for x in tl], [x[1] for x in tl], label="distinct violations", color="red")
    b.set_xlabel("s into the churn")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def rejudge(report: dict) -> list[str]:
    """Re-judge a saved soak report in place by the current rule (issue 41 item 5): its
    `rss_trend` from `rss_samples` and `judge_inputs`, its `heap_parts_trend` from
    `heap_parts_samples` over the same warmed stretch (when it has them), `rss_peak_mib` and
    `targets`, noting it in `rss_rejudged` ({by, missing}). Returns what the report lacked
    and what was assumed instead (`judge_inputs`' `missing`, plus the parts' samples).
    KeyError when it has no `rss_samples` or no stretch."""
    got = judge_inputs(report)
    if got["start"] is None or got["end"] is None:
        raise KeyError("no steady stretch (steady or rss_trend from_s/to_s)")
    warm = {k: got[k] for k in ("restarts_s", "live", "deletes_per_s")}
    trend = rss_trend([tuple(x) for x in report["rss_samples"]], got["start"], got["end"],
                      every=got["every"], tracemalloc=got["tracemalloc"], **warm)
    report["rss_trend"], report["rss_peak_mib"] = trend, trend["peak_mib"]
    missing = list(got["missing"])
    if "heap_parts_samples" in report:
        report["heap_parts_trend"] = heap_parts_trend(
            [tuple(x) for x in report["heap_parts_samples"]], got["start"], got["end"],
            every=got["every"], **warm)
    else:
        missing.append("heap_parts_samples (no heap_parts_trend)")
    report["targets"] = targets(report)
    report["rss_rejudged"] = {"by": "python -m bench.soak.rejudge (each replica past "
                                    "its warm-up, issue 41 item 5)", "missing": missing}
    return missing


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.soak.rejudge --rejudge FILE.json [--write]` (`bench.soak.rejudge`, so
    the package's own import of this module does not run it twice): re-judge saved soak
    reports (`rejudge`), print each one's RSS lines (`rss_lines`), what it lacked and its
    rss_flat target, and with `--write` write each back (indent 1, as the soak writes it).
    2 when a file cannot be read or judged (one line on stderr naming it and why: not
    found, not JSON, not a JSON object, a part missing or of another shape)."""
    import argparse

    from bench.common import targets_lines

    ap = argparse.ArgumentParser(prog="python -m bench.soak.rejudge",
                                 description="Re-judge saved soak reports' RSS by the current "
                                             "rule (each replica past its warm-up)")
    ap.add_argument("--rejudge", nargs="+", required=True, metavar="FILE.json",
                    help="soak.json files to re-judge")
    ap.add_argument("--write", action="store_true", help="write each re-judged file back")
    args = ap.parse_args(argv)
    rc = 0
    for name in args.rejudge:
        path = Path(name)
        try:
            report = json.loads(path.read_text())
            if not isinstance(report, dict):
                raise ValueError(f"not a soak report: the file holds a JSON "
                                 f"{type(report).__name__}, not an object")
            missing = rejudge(report)
        except OSError as exc:
            print(f"{path}: cannot re-judge: {exc.strerror or exc}", file=sys.stderr)
            rc = 2
            continue
        except json.JSONDecodeError as exc:
            print(f"{path}: cannot re-judge: not JSON: {exc.msg} (line {exc.lineno}, column "
                  f"{exc.colno})", file=sys.stderr)
            rc = 2
            continue
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            # a JSON object that is not a soak report as this code reads one
            why = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            print(f"{path}: cannot re-judge: {type(exc).__name__}: {why}", file=sys.stderr)
            rc = 2
            continue
        print(f"{path}:")
        for line in rss_lines(report) + [x for x in targets_lines(report)
                                         if x.startswith("target rss_")]:
            print(f"  {line}")
        if missing:
            print(f"  missing: {'; '.join(missing)}")
        if args.write:
            path.write_text(json.dumps(report, indent=1))
            print(f"  written: {path}")
    return rc

