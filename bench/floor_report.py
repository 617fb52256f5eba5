"""The pure side of `bench floor` (bench/floor.py): Prometheus text read into samples and
their deltas (`samples`, `added`, `delta`: bench.common's, named here too), the replicas'
phase means (`gpu_binder_admission_phase_seconds`) and their share of each admission
(`per_admission_ms`), the API Priority and Fairness counters per priority level, latency
figures, the ratios of our admission to the API's floor, the issue's targets (issue 40 item 2)
and the summary lines (the shares that give a priority level its seats: bench/apf.py); and
the split of the webhook's `wait-result` from the replicas' log lines (`log_entries`,
`wait_split`). No I/O, no clock."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from typing import Iterable, Mapping

from bench.common import Key, Samples, added, delta, quantile, samples  # noqa: F401 - re-exported

PHASE = "gpu_binder_admission_phase_seconds"
TARGETS = {1: {"p50": 1.5, "p99": 3.0}, 4: {"p50": 2.0}, 8: {"p50": 2.0}}
"""Issue 40 item 2: quiet admission ÷ the floor, per GPUs per VMI: at most these."""


def _sum_count(d: Samples, name: str, **match: str) -> tuple[float, float]:
    total = n = 0.0
    for (sample, labels), value in d.items():
        have = dict(labels)
        if any(have.get(k) != v for k, v in match.items()):
            continue
        if sample == f"{name}_sum":
            total += value
        elif sample == f"{name}_count":
            n += value
    return total, n


def _mean_ms(total: float, n: float) -> float | None:
    return round(1000 * total / n, 2) if n > 0 else None


def phase_means(d: Samples) -> dict[str, dict[str, dict]]:
    """From a delta of the replicas' samples: mode → phase → {"n": observations, "mean_ms"}
    of `gpu_binder_admission_phase_seconds` (only the phases observed), plus under each
    mode "own" → the mean of `total` minus the sum of the other phases' means per admission
    (the webhook's time between its steps; None without a total)."""
    out: dict[str, dict[str, dict]] = {}
    for (sample, labels), _ in d.items():
        if sample != f"{PHASE}_count":
            continue
        have = dict(labels)
        mode, phase = have.get("mode", ""), have.get("phase", "")
        total, n = _sum_count(d, PHASE, mode=mode, phase=phase)
        if n > 0:
            out.setdefault(mode, {})[phase] = {"n": int(n), "mean_ms": _mean_ms(total, n)}
    for mode, phases in out.items():
        total = phases.get("total")
        if total is None:
            continue
        inside = sum(p["n"] * p["mean_ms"] for name, p in phases.items() if name != "total")
        phases["own"] = {"n": total["n"],
                         "mean_ms": round(total["mean_ms"] - inside / total["n"], 2)}
    return out


def per_admission_ms(phases: dict[str, dict]) -> dict[str, float | None]:
    """One mode's part of `phase_means` (phase → {"n", "mean_ms"}) as ms per admitted
    review: each phase's mean × its observations ÷ `total`'s (a phase met in only some
    reviews, a retried take-over, counts for what it added to the average review); `total`
    and `own` as they are, so the phases and `own` sum to `total` (to the rounding, 0.01
    ms). {} when `total` was not observed."""
    total = phases.get("total")
    if not total or not total["n"]:
        return {}
    out: dict[str, float | None] = {}
    for name, p in phases.items():
        if p["mean_ms"] is None or name in ("total", "own"):
            out[name] = p["mean_ms"]
        else:
            out[name] = round(p["mean_ms"] * p["n"] / total["n"], 2)
    return out


def replica_means(d: Samples) -> dict[str, float | None]:
    """From a delta of the replicas' samples: {"webhook_mean_ms" (gpu_binder_admission_seconds,
    every review), "decision_mean_ms" (gpu_binder_decision_seconds, the binder's decision
    from its batch's start), "decisions"}."""
    hook = _sum_count(d, "gpu_binder_admission_seconds")
    dec = _sum_count(d, "gpu_binder_decision_seconds")
    return {"webhook_mean_ms": _mean_ms(*hook), "decision_mean_ms": _mean_ms(*dec),
            "decisions": int(dec[1])}


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound (seconds) of the first bucket holding the `q` quantile of a
    histogram given as (le, cumulative count) pairs in any order; None for no observations,
    inf when it lies past the last finite bound."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    return next(le for le, n in ordered if n >= rank)


def apf(d: Samples) -> dict[str, dict]:
    """From a delta of kube-apiserver's samples, per priority level that dispatched or
    rejected anything: {"dispatched", "rejected", "waited_mean_ms" (the queue wait of the
    requests it dispatched, apiserver_flowcontrol_request_wait_duration_seconds with
    execute="true"), "waited_p99_ms" (the bucket bound holding the 99th percentile; None:
    no observation)}."""
    levels: dict[str, dict] = {}

    def level(name: str) -> dict:
        return levels.setdefault(name, {"dispatched": 0, "rejected": 0})
    wait = "apiserver_flowcontrol_request_wait_duration_seconds"
    buckets: dict[str, dict[float, float]] = {}
    for (sample, labels), value in d.items():
        have = dict(labels)
        pl = have.get("priority_level")
        if pl is None or value == 0:
            continue
        if sample == "apiserver_flowcontrol_dispatched_requests_total":
            level(pl)["dispatched"] += int(value)
        elif sample == "apiserver_flowcontrol_rejected_requests_total":
            level(pl)["rejected"] += int(value)
        elif sample == f"{wait}_bucket" and have.get("execute") == "true":
            le = float(have["le"])
            per = buckets.setdefault(pl, {})
            per[le] = per.get(le, 0.0) + value
    for pl, lv in levels.items():
        lv["waited_mean_ms"] = _mean_ms(*_sum_count(d, wait, priority_level=pl, execute="true"))
        p99 = bucket_quantile(list(buckets.get(pl, {}).items()), 0.99)
        lv["waited_p99_ms"] = None if p99 is None else (
            p99 if math.isinf(p99) else round(1000 * p99, 2))
    return dict(sorted(levels.items()))


def seats_of(level: str, gauges: Samples) -> int | None:
    """The seats kube-apiserver gives priority level `level` now
    (apiserver_flowcontrol_nominal_limit_seats), None when it does not say."""
    for (sample, labels), value in gauges.items():
        if sample == "apiserver_flowcontrol_nominal_limit_seats" and \
                dict(labels).get("priority_level") == level:
            return int(value)
    return None


def latency(seconds: list[float]) -> dict:
    """{n, p50_ms, p99_ms, mean_ms} of latencies in seconds (nearest-rank quantiles,
    `bench.common.quantile`); figures None for no samples."""
    if not seconds:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}
    return {"n": len(seconds), "p50_ms": round(1000 * quantile(seconds, 0.5), 1),
            "p99_ms": round(1000 * quantile(seconds, 0.99), 1),
            "mean_ms": round(1000 * statistics.fmean(seconds), 1)}


def step_means(steps: list[dict[str, float]]) -> dict[str, float]:
    """The floor's steps (name → seconds, one dict per sample) as mean ms per step."""
    names = list(dict.fromkeys(n for s in steps for n in s))
    return {n: round(1000 * statistics.fmean(s.get(n, 0.0) for s in steps), 2) for n in names}


def ratio(ours: float | None, floor: float | None) -> float | None:
    """ours ÷ floor, two decimals; None when either is missing or the floor is 0."""
    if ours is None or not floor:
        return None
    return round(ours / floor, 2)


def ratios(row: dict) -> dict:
    """A row's {"quiet_p50", "quiet_p99", "busy_p50", "busy_p99"}: our latency ÷ the floor's
    (the busy level, at concurrency 20, against the floor measured quiet)."""
    floor, quiet, busy = row["floor"], row["quiet"], row.get("busy") or {}
    return {"quiet_p50": ratio(quiet["p50_ms"], floor["p50_ms"]),
            "quiet_p99": ratio(quiet["p99_ms"], floor["p99_ms"]),
            "busy_p50": ratio(busy.get("p50_ms"), floor["p50_ms"]),
            "busy_p99": ratio(busy.get("p99_ms"), floor["p99_ms"])}


def targets(rows: list[dict]) -> dict:
    """Issue 40 item 2 per mode and set size run: quiet p50 (and for 1 GPU p99) ÷ the
    floor's, at most `TARGETS`; {name: {target, value, met}} (met None without a value)."""
    out = {}
    for row in rows:
        for q, limit in TARGETS.get(row["gpus"], {}).items():
            value = row["ratio"][f"quiet_{q}"]
            out[f"{row['mode']}_{row['gpus']}gpu_quiet_{q}"] = {
                "target": f"<= {limit}", "value": value,
                "met": None if value is None else value <= limit}
    return out


def _ms(value) -> str:
    return "-" if value is None else f"{value:g}"


def summary_lines(report: dict) -> list[str]:
    """One line per level of `report` (floor.json): each mode and size's floor and our
    quiet and busy latency with the ratios and the largest phases (and the quiet level's
    split of wait-result, `split_text`, when the row has one); each seat count's
    p99 and rate; the load before and after."""
    lines = []
    for row in report.get("rows", []):
        f, q, b, r = row["floor"], row["quiet"], row.get("busy") or {}, row["ratio"]
        phases = (row.get("quiet_inside") or {}).get("phases", {}).get(row["mode"], {})
        top = sorted(((p["mean_ms"] or 0.0, name) for name, p in phases.items()
                      if name != "total"), reverse=True)[:4]
        lines.append(
            f"{row['mode']} {row['gpus']}-GPU: floor p50 {_ms(f['p50_ms'])} p99 "
            f"{_ms(f['p99_ms'])} ms; ours quiet p50 {_ms(q['p50_ms'])} p99 {_ms(q['p99_ms'])} "
            f"ms (x{_ms(r['quiet_p50'])}, x{_ms(r['quiet_p99'])}); at 20 p50 "
            f"{_ms(b.get('p50_ms'))} p99 {_ms(b.get('p99_ms'))} ms "
            f"{_ms(b.get('admissions_per_s'))}/s; quiet phases "
            + ", ".join(f"{name} {ms:g}" for ms, name in top) + " ms"
            + split_text(row.get("quiet_wait_split")))
    for s in report.get("seats", []):
        lines.append(f"{s['mode']} 1-GPU at 20, {s['seats_target']} seats (shares "
                     f"{s['shares']}, server says {_ms(s.get('seats'))}): p50 "
                     f"{_ms(s['p50_ms'])} p99 {_ms(s['p99_ms'])} ms, "
                     f"{_ms(s['admissions_per_s'])} admissions/s, VMI-create level waited "
                     f"mean {_ms(s.get('apf_waited_mean_ms'))} ms")
    before, after = report.get("load_before"), report.get("load_after")
    if before and after:
        lines.append("load (1, 5, 15 min) before " + " ".join(f"{x:.2f}" for x in before)
                     + ", after " + " ".join(f"{x:.2f}" for x in after))
    return lines


# -- the split of wait-result from the replicas' logs (issue 40 item 1) --------------------------

SPLIT_EVENTS = ("VMI admitted", "decision", "writes_finished")
"""The log lines `wait_split` joins: the webhook's (any replica) and the leader's."""
WAIT_PARTS = ("to_leader", "queue", "decision", "status_write", "back", "unexplained")
"""The parts of one admission's `wait-result`, each between two wall instants (epoch s):
`to_leader` the webhook's attach patches returned (`VMI admitted`'s `attached_at`) to the
leader's router finding the request complete in its informer's cache (`decision`'s
`seen_at`: the watch delivery to the leader, its cache and router); `queue` to the start of
the batch that decided it (`batch_at`: the coordinator's mailbox and work queue); `decision`
to the flight registered at the status pipeline (`writes_finished`'s `flown_at`: the plan,
the two-phase reservation on the node actors, the hand-off); `status_write` to the writes'
end (`finished_at`); `back` to the result seen by the webhook's replica (`result_at`: the
watch delivery to it, its cache and waiter); `unexplained` the webhook's `wait-result` phase
(`wait_result_s`, its own monotonic clock) minus the five: what they do not cover (near 0
when the instants tile the wait; a part may be negative when a watch delivers before the
writer's own answer returns)."""
UNJOINED = ("no_webhook_line", "no_webhook_instants", "no_decision_line", "leader_changed",
            "not_seen", "no_writes_line", "no_leader_instants")
"""Why an admission could not be split (`wait_split`'s `unjoined` keys): no `VMI admitted`
line for it (a log rotated or lost, a W4 take-over), one without the instants (an older
replica); no `decision` line for its request id, or lines of it on two replicas (a leader
change mid-level); its decision without `seen_at` (queued by a resync or the coordinator's
start, or decided again only); no `writes_finished` line with outcome `done` on the deciding
replica, or one without the instants."""


def log_entries(text: str) -> list[dict]:
    """The lines of one replica's log `text` (its stdout: one JSON object a line) whose
    `event` is one of SPLIT_EVENTS, in order; every other line (not JSON included) skipped."""
    out = []
    for line in text.splitlines():
        if not any(f'"{e}"' in line for e in SPLIT_EVENTS):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") in SPLIT_EVENTS:
            out.append(entry)
    return out


def _split_one(admitted: dict | None, decisions: list[tuple[str, dict]],
               writes: list[tuple[str, dict]]) -> dict[str, float] | str:
    """One admission's parts (seconds, WAIT_PARTS and "wait"), or why not (UNJOINED)."""
    if admitted is None:
        return "no_webhook_line"
    try:
        attached, result = float(admitted["attached_at"]), float(admitted["result_at"])
        wait = float(admitted["wait_result_s"])
    except (KeyError, TypeError, ValueError):
        return "no_webhook_instants"
    if not decisions:
        return "no_decision_line"
    leaders = {r for r, _ in decisions} | {r for r, _ in writes}
    if len(leaders) > 1:
        return "leader_changed"
    first = decisions[0][1]
    if first.get("seen_at") is None:
        return "not_seen"
    done = [w for _, w in writes if w.get("outcome") == "done"]
    if not done:
        return "no_writes_line"
    last = done[-1]
    try:
        seen, batch = float(first["seen_at"]), float(first["batch_at"])
        flown, finished = float(last["flown_at"]), float(last["finished_at"])
    except (KeyError, TypeError, ValueError):
        return "no_leader_instants"
    parts = {"to_leader": seen - attached, "queue": batch - seen, "decision": flown - batch,
             "status_write": finished - flown, "back": result - finished}
    parts["unexplained"] = wait - sum(parts.values())
    parts["wait"] = wait
    return parts


def _mean_p50(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"mean_ms": None, "p50_ms": None}
    return {"mean_ms": round(1000 * statistics.fmean(seconds), 2),
            "p50_ms": round(1000 * quantile(seconds, 0.5), 2)}


def wait_split(logs: Mapping[str, list[dict]], namespace: str, vmis: Iterable[str]) -> dict:
    """The webhook's `wait-result` of the admitted VMIs `vmis` of `namespace`, split by the
    replicas' log lines (`logs`: replica name → its `log_entries`): each VMI's `VMI admitted`
    line (on whichever replica answered it) gives its request id, and that id the leader's
    `decision` and `writes_finished` lines (WAIT_PARTS says which instants bound each part;
    every instant is wall time, epoch seconds: the replicas share the machine's clock).

    {"admissions": VMIs asked, "joined": VMIs split, "unjoined": {reason (UNJOINED): VMIs}
    (only reasons met), "wait_result": {"mean_ms", "p50_ms"} of the joined VMIs' phase,
    "parts": {part: {"mean_ms", "p50_ms"}} over the same VMIs}. The parts' means add up to
    wait_result's mean (to the rounding, 0.01 ms each); their p50s need not. Figures None
    when nothing joined."""
    admitted: dict[str, dict] = {}
    decisions: dict[str, list[tuple[str, dict]]] = {}
    writes: dict[str, list[tuple[str, dict]]] = {}
    for replica, entries in logs.items():
        for e in entries:
            event, rid = e.get("event"), e.get("request_id")
            if event == "VMI admitted" and e.get("namespace") == namespace and "vmi" in e:
                admitted[e["vmi"]] = e
            elif event == "decision" and rid is not None:
                decisions.setdefault(rid, []).append((replica, e))
            elif event == "writes_finished" and rid is not None:
                writes.setdefault(rid, []).append((replica, e))
    names = list(vmis)
    joined: list[dict[str, float]] = []
    unjoined: Counter[str] = Counter()
    for vmi in names:
        line = admitted.get(vmi)
        rid = line.get("request_id") if line is not None else None
        got = _split_one(line, decisions.get(rid, []) if rid else [],
                         writes.get(rid, []) if rid else [])
        if isinstance(got, str):
            unjoined[got] += 1
        else:
            joined.append(got)
    return {"admissions": len(names), "joined": len(joined),
            "unjoined": {r: unjoined[r] for r in UNJOINED if unjoined[r]},
            "wait_result": _mean_p50([j["wait"] for j in joined]),
            "parts": {p: _mean_p50([j[p] for j in joined]) for p in WAIT_PARTS}}


def split_text(split: dict | None) -> str:
    """`wait_split`'s answer in a few words for a summary line ("" for None)."""
    if not split:
        return ""
    parts = split["parts"]
    words = {"to_leader": "to leader", "status_write": "write"}
    text = ", ".join(f"{words.get(p, p)} {_ms(parts[p]['mean_ms'])}" for p in WAIT_PARTS)
    unjoined = sum(split["unjoined"].values())
    return (f"; wait-result {_ms(split['wait_result']['mean_ms'])} ms mean = {text} ms "
            f"({split['joined']} of {split['admissions']} joined, {unjoined} unjoined)")
