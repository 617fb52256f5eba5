"""The contention benchmark's report (`gpu-binder bench contention`), pure: every lane's
figures (`bench.contention_metrics.lane_figures`), the issue's targets beside them, and the
summary lines printed at the end of a run."""

from __future__ import annotations

from bench.contention_metrics import LaneLog, lane_figures
from bench.contention_trace import ON_DEMAND, TIERS, CTrace
from bench.packing_trace import SIZES

TARGETS = {"on_demand_p99_s": 30.0, "victims_minimal": 0.99, "inversions": 0,
           "partial_stops": 0, "utilisation_points": 3.0, "wait_8_ratio": 0.5}
"""Issue 39 item 6's targets: lane (a)'s on-demand start p99 (s), its share of preemptions
whose victims are the brute-force minimum, its inversions and partial stops, its
utilisation within so many points of (c)'s, its 8-GPU maximum wait over (d)'s (lane d: the
line off, `--line-enabled=false`, on a second cluster)."""


def results(trace: CTrace, logs: dict[str, LaneLog], *, min_runtime: float) -> dict[str, dict]:
    """lane -> `lane_figures`."""
    return {k: lane_figures(trace, log, min_runtime=min_runtime) for k, log in logs.items()}


def raw(log: LaneLog) -> dict:
    """The lane's log as the report keeps it (times to 0.01 s): waits [set, begin, decided,
    first], runs [set, node, GPUs, held from, start, stop, held until, preempted],
    nominations [t, set, node, victims, GPUs held, gone], the lane's `end` (None: the
    trace's) and `drain_capped`."""
    def r(x):
        return None if x is None else round(x, 2)
    return {"end": r(log.end), "drain_capped": log.drain_capped,
            "waits": [[w.set_id, r(w.begin), r(w.decided), w.first] for w in log.waits],
            "runs": [[x.set_id, x.node, list(x.gpus), r(x.held_from), r(x.start), r(x.stop),
                      r(x.held_until), x.preempted] for x in log.runs],
            "nominations": [[r(n.t), n.set_id, n.node, list(n.victims), list(n.devices), r(n.gone)]
                            for n in log.nominations]}


def _target(value, target: str, met) -> dict:
    return {"value": value, "target": target, "met": met}


def targets(report: dict) -> dict[str, dict]:
    """Each target: {value, target, met (None when a lane it needs did not run or measured
    nothing)}."""
    res = report.get("results") or {}
    a, b, c, d = (res.get(k) or {} for k in "abcd")
    out = {}
    row = ((a.get("latency") or {}).get(ON_DEMAND) or {}).get("all", {})
    brow = ((b.get("latency") or {}).get(ON_DEMAND) or {}).get("all", {})
    p99, cens = row.get("p99_s"), row.get("p99_censored")
    limit = TARGETS["on_demand_p99_s"]
    out["on_demand_p99"] = _target(
        f"{_p(row)} s (kube-scheduler alone: {_p(brow)} s)" if b else _p(row),
        f"<= {limit:g} s",  # a censored p99 is a lower bound: met unknown unless above
        None if p99 is None or (cens and p99 <= limit) else p99 <= limit)
    share = a.get("minimal_share")
    out["victims_minimal"] = _target(
        f"{share} of {a.get('preemptions', 0)} preemptions" if a else None,
        f">= {TARGETS['victims_minimal']}", None if share is None else share >= TARGETS["victims_minimal"])
    for name in ("inversions", "partial_stops"):
        v = a.get(name)
        out[name] = _target(v, f"== {TARGETS[name]}", None if v is None else v == TARGETS[name])
    # Issue 39's "within 3 points of the run without preemption" bounds what preemption
    # costs (killed work, devices held idle for a preemptor): one-sided. Serving more GPU
    # time than (c) is not a cost; the signed difference is shown either way.
    ua, uc = a.get("utilisation"), c.get("utilisation")
    diff = round(100 * (ua - uc), 2) if ua is not None and uc is not None else None
    out["utilisation_vs_no_preemption"] = _target(
        f"{ua} vs {uc} ({diff:+.2f} points)" if diff is not None else None,
        f"at most {TARGETS['utilisation_points']:g} points below",
        None if diff is None else diff >= -TARGETS["utilisation_points"])
    out["max_wait_8_with_line"] = _wait_8_target(a, d)
    return out


def _wait_8_target(a: dict, d: dict) -> dict:
    """Lane (a)'s 8-GPU maximum wait against lane (d)'s (gpu-binder without the line, P5 off,
    run on a second cluster after the first): met when a's <= `TARGETS["wait_8_ratio"]` x d's.
    A wait of a set never started (by the lane's end: the drain's cap) is a lower bound
    ("≥"): a's such a wait above the bound fails, at or below it is not known; d's such a
    wait at or above twice a's meets it, below it is not known; both lower bounds: not
    known. None when a lane did not run or no 8-GPU set asked. The value names each lane's
    drain (`_drains`) when they had one."""
    r = TARGETS["wait_8_ratio"]
    wa, ca = a.get("max_wait_8_s"), bool(a.get("max_wait_8_censored"))
    wd, cd = d.get("max_wait_8_s"), bool(d.get("max_wait_8_censored"))
    shown_a = f"{'≥' if ca else ''}{wa}"
    if d.get("available") is False:
        return _target(f"{shown_a} s with the line; without: not run ({d.get('why')})",
                       f"<= {r} x without the line", None)
    if wa is None or wd is None:
        return _target(None, f"<= {r} x without the line", None)
    fits = wa <= r * wd
    if ca and cd:
        met = None
    elif ca:      # a's true wait >= wa: above the bound fails for sure, else not known
        met = False if not fits else None
    elif cd:      # d's true wait >= wd: a fits under the bound for sure, else not known
        met = True if fits else None
    else:
        met = fits
    return _target(f"{shown_a} s with the line vs {'≥' if cd else ''}{wd} s without"
                   + _drains(a, d), f"<= {r} x without the line", met)


def _drains(a: dict, d: dict) -> str:
    """"; drain X s with, Y s without" for lanes (a) and (d) (`_drain`); "" when neither
    had a drain (a report made before it)."""
    if a.get("drain_s") is None and d.get("drain_s") is None:
        return ""
    return f"; drain {_drain(a)} with, {_drain(d)} without"


def _drain(f: dict) -> str:
    """A lane's drain: "X s", then " (capped, N scored set(s) waiting)" when its cap ended
    the lane; "none" for a lane without one."""
    if f.get("drain_s") is None:
        return "none"
    if not f.get("drain_capped"):
        return f"{f['drain_s']} s"
    n = f.get("waiting_at_end", 0)
    return f"{f['drain_s']} s (capped, {n} scored set{'' if n == 1 else 's'} waiting)"


def _p(row: dict, q: str = "p99") -> str:
    """A quantile of a latency row, "≥" before a censored one."""
    return f"{'≥' if row.get(f'{q}_censored') else ''}{row.get(f'{q}_s')}"


def _cell(row: dict) -> str:
    if not row.get("sets"):
        return "-"
    p50, p99 = _p(row, "p50"), _p(row)
    mx = row.get("max_wait_s")
    cens = "≥" if row.get("max_wait_censored") else ""
    return (f"{row['started']}/{row['sets']} p50 {p50} p99 {p99} max {cens}{mx}"
            + (f" (+{row['not_started']} waiting)" if row.get("not_started") else ""))


def summary(report: dict) -> list[str]:
    """The lines a run prints: the plan (the drain's cap), every lane's latency per tier and
    size, GPU-hours, utilisation, its drain, preemptions and inversions (how many in the
    drain), and the load before and after."""
    plan, tr = report["plan"], report["trace"]
    lines = [f"contention{' (quick)' if report.get('quick') else ''}: {plan['nodes']} HGX boards "
             f"a lane, offered load {plan['load']} (realised {tr['offered_load']}), "
             f"{tr['scored']} scored of {tr['sets']} sets, mean life {plan['mean_life']:g} s, "
             f"seed {report['seed']}, trace {tr['digest']}"
             + (f", drain cap {plan['drain']:g} s" if plan.get("drain") is not None else "")
             + "; load "
             f"{_load(report.get('load_before'))} -> {_load(report.get('load_after'))}"]
    for k, f in (report.get("results") or {}).items():
        name = (report.get("lanes") or {}).get(k, "")
        if f.get("available") is False:
            lines.append(f"({k}) {name or 'gpu-binder without the line'}: not run: {f['why']}")
            continue
        if k in (report.get("lanes_on_second_cluster") or ()):
            name = f"{name} [second cluster, after the first]"
        drain = "" if f.get("drain_s") is None else f"drain {_drain(f)}, "
        lines.append(f"({k}) {name}: utilisation {f['utilisation']}, 8-GPU max wait "
                     f"{'≥' if f.get('max_wait_8_censored') else ''}{f['max_wait_8_s']} s, "
                     f"{drain}preemptions {f['preemptions']}{_in_drain(f, 'preemptions')} "
                     f"(victims {f['victims']}, stopped {f['victims_stopped']}, minimal "
                     f"{f['minimal_share']}), inversions {f['inversions']}"
                     f"{_in_drain(f, 'inversions')}, partial stops {f['partial_stops']}, stops "
                     f"without nomination {f['stops_without_nomination']}")
        for tier in TIERS:
            row = f["latency"][tier]
            cells = "; ".join(f"{z}: {_cell(row[str(z)])}" for z in SIZES)
            lines.append(f"    {tier}: all {_cell(row['all'])} | {cells} | GPU-h "
                         f"{f['gpu_hours'][tier]['all']} | re-waits {row['all']['rewaits']} "
                         f"p99 {row['all']['rewait_p99_s']}")
    return lines


def _in_drain(f: dict, what: str) -> str:
    """" (N in the drain)" when some of a lane's `what` fell after the trace's end."""
    n = f.get(f"{what}_in_drain")
    return f" ({n} in the drain)" if n else ""


def _load(v) -> str:
    return " / ".join(f"{x:.2f}" for x in v) if v else "?"
