"""The soak's report: the RSS judgement over the steady stretch (`rss_trend`), which part of
the replicas' memory grew over it (`heap_parts_trend`), what the replicas' informers and
heaps held over it (`cache_change`, `heap_reports`, `heap_change`),
the report of a run (`soak_report`), issue 22's targets in it (`targets`), its human lines
(`summary`) and its figure (`plot`). Pure but for reading the replicas' logs and the
tracemalloc snapshots they name, and writing the figure."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
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


def _late(fit: list[tuple[float, float]], mid: float, threshold: float) -> dict | None:
    """The fit of `fit`'s samples at or after `mid` s (rss_trend's `late`); None for < 5."""
    pts = [(t, m) for t, m in fit if t >= mid]
    if len(pts) < 5:
        return None
    _, b, se, _ = _fit([t for t, _ in pts], [m for _, m in pts])
    slope, se = b * 60, se * 60
    lo, hi = slope - 2 * se, slope + 2 * se
    return {"from_s": round(mid, 1), "samples": len(pts), "slope_mib_per_min": round(slope, 3),
            "se_mib_per_min": round(se, 3), "ci95_mib_per_min": [round(lo, 3), round(hi, 3)],
            "verdict": _verdict(lo, hi, threshold)}


def rss_trend(samples: list[tuple[float, int, int, float]], start: float, end: float, *,
              every: float = 10.0, threshold: float = RSS_SLOPE_MAX_MIB_PER_MIN) -> dict:
    """The RSS judgement over the steady stretch [`start`, `end`] s of `samples` [(t s,
    replica index, pid, RSS MiB)] taken every `every` s. Pure.

    Judged: each process (replica, pid) alive through the whole stretch — a sample at or
    before `start` and one at or after `end - 1.5·every` — fitted on its samples within the
    stretch (at least 5 spanning ≥ 60 s). Its verdict against `threshold` (MiB/min): "flat"
    when slope + 2 SE ≤ threshold, "growing" when slope − 2 SE > threshold, else
    "inconclusive". The run's verdict: "growing" if any process grows, "flat" if every judged
    one is flat, "inconclusive" otherwise, None when no process was judged. Processes not
    alive through it are listed with why (`excluded`). Returns {from_s, to_s,
    threshold_mib_per_min, threshold_why, processes: [{replica, pid, samples, span_s,
    slope_mib_per_min, se_mib_per_min, ci95_mib_per_min: [lo, hi], resid_sd_mib,
    level_mib (fitted at `end`), peak_mib, hours_to_target (None when not growing),
    verdict, late}], excluded: [{replica, pid, first_s, last_s, why}], verdict, late_verdict,
    peak_mib}.

    `late` is the same fit over the stretch's second half only ({from_s, samples,
    slope_mib_per_min, se_mib_per_min, ci95_mib_per_min, verdict}, None with fewer than 5
    samples): a process whose heap is still turning over its start-up objects grows early in
    the stretch and levels off, which the whole-stretch slope cannot tell from a leak (issue
    41 item 5). `late_verdict` is the run's verdict over the `late` fits. Reported beside
    the whole-stretch verdict, never in its place: the target is judged on the whole stretch."""
    by: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for t, i, pid, mib in samples:
        by.setdefault((i, pid), []).append((t, mib))
    judged, excluded = [], []
    for (i, pid), pts in sorted(by.items()):
        pts.sort()
        first, last = pts[0][0], pts[-1][0]
        why = ("started after the stretch began" if first > start else
               "gone before the stretch ended" if last < end - 1.5 * every else "")
        fit = [(t, m) for t, m in pts if start <= t <= end]
        if not why and (len(fit) < 5 or fit[-1][0] - fit[0][0] < 60):
            why = "too few samples in the stretch"
        if why:
            excluded.append({"replica": i, "pid": pid, "first_s": first, "last_s": last,
                             "why": why})
            continue
        a, b, se, sd = _fit([t for t, _ in fit], [m for _, m in fit])
        slope, se = b * 60, se * 60
        lo, hi = slope - 2 * se, slope + 2 * se
        level = a + b * end
        verdict = _verdict(lo, hi, threshold)
        judged.append({
            "replica": i, "pid": pid, "samples": len(fit),
            "span_s": round(fit[-1][0] - fit[0][0], 1),
            "slope_mib_per_min": round(slope, 3), "se_mib_per_min": round(se, 3),
            "ci95_mib_per_min": [round(lo, 3), round(hi, 3)],
            "resid_sd_mib": round(sd, 2), "level_mib": round(level, 1),
            "peak_mib": round(max(m for _, m in fit), 1),
            "hours_to_target": (round(max(0.0, RSS_TARGET_MIB - level) / slope / 60, 1)
                                if slope > 0 and verdict != "flat" else None),
            "fit": [round(a, 3), round(b, 6)],
            "verdict": verdict,
            "late": _late(fit, (start + end) / 2, threshold)})
    late = [p["late"] for p in judged]
    return {"from_s": start, "to_s": end, "threshold_mib_per_min": threshold,
            "threshold_why": RSS_SLOPE_WHY, "processes": judged, "excluded": excluded,
            "verdict": _run_verdict([p["verdict"] for p in judged]),
            "late_verdict": (_run_verdict([x["verdict"] for x in late])
                             if judged and None not in late else None),
            "peak_mib": round(max(m for *_, m in samples), 1) if samples else None}


def heap_parts_trend(samples: list[tuple[float, int, int, dict[str, int]]], start: float,
                     end: float, *, every: float = 10.0,
                     threshold: float = RSS_SLOPE_MAX_MIB_PER_MIN) -> dict:
    """Which part of each replica's memory grew over the steady stretch [`start`, `end`] s:
    `samples` [(t s, replica, pid, {part: bytes, pymalloc_blocks: count})] (the replicas'
    `gpu_binder_heap_bytes` and `gpu_binder_heap_pymalloc_blocks`, actors.heap.heap_parts)
    taken every `every` s, each part fitted as `rss_trend` fits RSS (same processes judged:
    alive through the stretch, ≥ 5 samples of the part spanning ≥ 60 s; same verdicts
    against `threshold` MiB/min). Pure. Returns {from_s, to_s, threshold_mib_per_min,
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
    for part, pts in sorted(by_part.items()):
        for p in rss_trend(pts, start, end, every=every, threshold=threshold)["processes"]:
            row = procs.setdefault((p["replica"], p["pid"]), {
                "replica": p["replica"], "pid": p["pid"], "samples": p["samples"], "parts": {},
                "pymalloc_blocks_per_min": None})
            row["parts"][part] = {k: p[k] for k in ("slope_mib_per_min", "se_mib_per_min",
                                                     "level_mib", "verdict")}
    for p in rss_trend(blocks, start, end, every=every)["processes"]:
        if (p["replica"], p["pid"]) in procs:
            procs[p["replica"], p["pid"]]["pymalloc_blocks_per_min"] = p["slope_mib_per_min"]
    for row in procs.values():
        row["parts"] = dict(sorted(row["parts"].items(),
                                   key=lambda kv: -kv[1]["slope_mib_per_min"]))
        row["growing"] = [k for k, v in row["parts"].items() if v["verdict"] == "growing"]
    return {"from_s": start, "to_s": end, "threshold_mib_per_min": threshold,
            "processes": [procs[k] for k in sorted(procs)]}


def soak_report(soak) -> dict:
    """The report of a finished `bench.soak.driver.Soak` run: the schedule, the creates'
    outcomes and answer times, the refusals by reason, the violations, the disturbances
    (`events`), the steady stretch, the RSS judgement (`rss_trend`) and samples, the slope of
    each part of the replicas' memory (`heap_parts_trend`) and its samples, the informers' objects and the replicas' heap reports over the steady stretch; in device
    mode its `device` part (`device_part`)."""
    out = Counter(r.outcome for r in soak.recs)
    answers = sorted(r.answer_s for r in soak.recs if r.outcome in ("admitted", "refused"))
    trend = rss_trend(soak.rss, soak.spec.steady_from, soak.spec.seconds,
                      every=soak.spec.rss_every)
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
        "refusal_reasons": dict(Counter(refusal_reason(r.refusal)
                                        for r in soak.recs if r.outcome == "refused")
                                .most_common(8)),
        "answer_p50_s": answers[len(answers) // 2] if answers else None,
        "answer_p99_s": answers[int(len(answers) * .99)] if answers else None,
        "violations": len(soak.tally.seen), "violations_by_kind": soak.tally.by_kind(),
        "p6": p6_part(soak.tally.by_kind(), soak.counts, list(soak.p6.nominations.values()),
                      len(soak.p6.victims_gone), soak.p6.judged, soak.spec.priorities),
        "violation_list": [v.to_dict() for v in soak.tally.violations][:50],
        "samples": soak.tally.samples, "counts": dict(soak.counts),
        "events": soak.events, "final": soak.final,
        "steady": soak.steady(), "rss_trend": trend, "rss_peak_mib": trend["peak_mib"],
        "rss_samples": soak.rss, "violation_timeline": soak.samples,
        "cache_samples": soak.cached,
        "heap_parts_samples": getattr(soak, "heap_parts", []),
        "heap_parts_trend": heap_parts_trend(getattr(soak, "heap_parts", []),
                                             trend["from_s"], trend["to_s"],
                                             every=soak.spec.rss_every),
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
    each was judged against, False not judged for want of an early enough read, None started
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
             f"{judged} judged ({unjudged} not: no read early enough), "
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


def refusal_reason(refusal: str) -> str:
    """'403: admission webhook "…" denied the request: <reason>' -> '403: <reason>' (its
    first 80 characters): what the report counts refusals by."""
    status, _, message = refusal.partition(": ")
    return f"{status}: {message.rpartition('denied the request: ')[2]}"[:80]


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
    over the steady stretch (`rss_trend`'s verdict), peak RSS under RSS_TARGET_MIB; in
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
                               f"{p['slope_mib_per_min']} ± {2 * p['se_mib_per_min']:.3f}"
                               for p in trend["processes"]} or None,
                     "target": f"slope + 2 SE <= {trend['threshold_mib_per_min']} MiB/min "
                               f"over {trend['from_s']:.0f}-{trend['to_s']:.0f} s",
                     "met": None if trend["verdict"] in (None, "inconclusive")
                     else trend["verdict"] == "flat"},
        "rss_peak": {"value": report["rss_peak_mib"], "target": f"< {RSS_TARGET_MIB:g} MiB",
                     "met": None if report["rss_peak_mib"] is None
                     else report["rss_peak_mib"] < RSS_TARGET_MIB},
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


def summary(report: dict) -> list[str]:
    """Human lines of a report."""
    tr = report["rss_trend"]
    st = report.get("steady") or {}
    return [f"soak seed {report['seed']} schedule {report['schedule']}: "
            f"{report['creates']} creates, {report['admitted']} admitted, "
            f"{report['refused']} refused, {report['counts'].get('deleted', 0)} deleted, "
            f"{report['counts'].get('held_moves', 0)} held-device moves",
            f"violations {report['violations']} {report['violations_by_kind']}, "
            f"admissions lost {report['admissions_lost']}, samples {report['samples']}",
            *p6_lines(report.get("p6")),
            f"events {[(e['at'], e['kind'], e.get('takeover_s', e.get('outage_s'))) for e in report['events']]}",
            f"steady stretch {tr['from_s']:.0f}-{tr['to_s']:.0f} s: live "
            f"{st.get('live_min')}-{st.get('live_max')}, ops {st.get('operations')}",
            "RSS over it (MiB/min, ± 2 SE): " + (", ".join(
                f"replica-{p['replica']} pid {p['pid']} {p['slope_mib_per_min']} ± "
                f"{2 * p['se_mib_per_min']:.3f} ({p['verdict']}, level {p['level_mib']} MiB"
                + (f"; second half {p['late']['slope_mib_per_min']} ± "
                   f"{2 * p['late']['se_mib_per_min']:.3f}, {p['late']['verdict']}"
                   if p.get("late") else "") + ")"
                for p in tr["processes"]) or "no process alive through it")
            + f"; threshold {tr['threshold_mib_per_min']}: {tr['verdict']}"
            + (f" (second half: {tr['late_verdict']})" if tr.get("late_verdict") else "")
            + "; "
              f"peak RSS {tr['peak_mib']} MiB"] + [
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
    fit over it drawn, kills and the API-server restart marked), and below the VMIs held as
    admitted with the running count of distinct violations."""
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
            a.plot([tr["from_s"], tr["to_s"]], [a0 + b0 * tr["from_s"], a0 + b0 * tr["to_s"]],
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
                f"dotted: fits): {tr['verdict']} at <= {tr['threshold_mib_per_min']} MiB/min; "
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
