"""The health benchmark's report arithmetic, pure: the restart times after a NoExecute taint
(`restart_figures`), the placements made on a marked device (`on_marked`), the suspects found
against the broken devices injected (`suspect_figures`), the targets (`targets`, issue 41
item 4) and the summary lines (`summary`)."""

from __future__ import annotations

from bench.common import quantile

BEYOND_EVICTION_P99_S = 30.0
"""Issue 41 item 4: p99 of the restart after a NoExecute taint, less the eviction
controller's own delay, at most this many seconds."""

TIME_SLACK_S = 1.0
"""The API's timestamps are whole seconds: a claim counts as made after a mark when its
creationTimestamp is at least this much later than the mark's (one made in the same second
may have been placed before the mark was seen: it is reported apart, `raced`)."""


def _q(values: list[float], q: float) -> float | None:
    return round(quantile(values, q), 2) if values else None


def restart_figures(samples: list[dict]) -> dict:
    """From the NoExecute samples ({"eviction_s": taint written -> launcher Pod gone, or None
    when it never went; "running_s": taint written -> the VM's next launcher Pod bound with
    its claim allocated, or None when it never ran again in the run}): how many, how many
    evicted and ran again, and p50/p99/max of `running_s`, of `eviction_s` (the eviction
    controller's own delay) and of `beyond_s` = running_s - eviction_s per sample, seconds
    (nearest rank, `bench.common.quantile`; None when no sample)."""
    done = [s for s in samples if s.get("running_s") is not None and s.get("eviction_s") is not None]
    out = {"injected": len(samples),
           "evicted": sum(1 for s in samples if s.get("eviction_s") is not None),
           "ran_again": len(done)}
    for key, values in (("running_s", [s["running_s"] for s in done]),
                        ("eviction_s", [s["eviction_s"] for s in samples
                                        if s.get("eviction_s") is not None]),
                        ("beyond_s", [s["running_s"] - s["eviction_s"] for s in done])):
        out[key] = {"p50": _q(values, 0.5), "p99": _q(values, 0.99),
                    "max": round(max(values), 2) if values else None}
    return out


def on_marked(claims: list[dict], marks: list[dict]) -> dict:
    """The placements made on a marked device: each claim {"ns", "name", "created" (epoch s
    of its creationTimestamp), "devices": [[pool, device], …] its allocation} against each
    mark {"pool", "device", "since" (epoch s of the rule's creationTimestamp or the slice
    change), "kind"} on one of its devices. A claim created at least TIME_SLACK_S after the
    mark is a placement on it (`placed`); one created before is the set the mark lands on
    (not a placement); one in between is `raced`. Returns {"placed": [...], "raced": [...],
    "exposed": n}, each entry {"claim": "ns/name", "device": "pool/device", "kind",
    "after_s"}; `exposed` counts the (claim, mark) pairs of claims made at least TIME_SLACK_S
    after a mark on the mark's node (a placement that could have taken the marked device:
    how much the 0 is worth)."""
    by_device: dict[tuple[str, str], list[dict]] = {}
    for m in marks:
        by_device.setdefault((m["pool"], m["device"]), []).append(m)
    placed, raced = [], []
    exposed = sum(1 for c in claims for m in marks
                  if c["created"] - m["since"] >= TIME_SLACK_S
                  and any(pool == m["pool"] for pool, _ in c["devices"]))
    for c in claims:
        for pool, device in c["devices"]:
            for m in by_device.get((pool, device), ()):
                after = c["created"] - m["since"]
                if after < 0:
                    continue
                entry = {"claim": f"{c['ns']}/{c['name']}", "device": f"{pool}/{device}",
                         "kind": m["kind"], "after_s": round(after, 1)}
                (placed if after >= TIME_SLACK_S else raced).append(entry)
    return {"placed": placed, "raced": raced, "exposed": exposed}


def suspect_figures(broken: list[dict], suspected: list[list[str]], failed_starts: int) -> dict:
    """The broken devices injected ({"pool", "device", "suspected_after": the failed start
    after which its mark was first seen, or None}) against the devices suspected at the end
    (`suspected`: [pool, device] of every suspect mark): injected, found, how many were
    suspected exactly after their `failed_starts`-th failure (`on_time`), and the suspected
    devices that were not injected broken (`healthy_suspected`, "pool/device")."""
    injected = {(b["pool"], b["device"]) for b in broken if b.get("device")}
    marked = {tuple(s) for s in suspected}
    return {"injected": len(injected), "found": len(injected & marked),
            "on_time": sum(1 for b in broken if b.get("device")
                           and b.get("suspected_after") == failed_starts),
            "suspected_after": [b.get("suspected_after") for b in broken],
            "healthy_suspected": sorted(f"{p}/{d}" for p, d in marked - injected)}


def targets(report: dict) -> dict:
    """Issue 41 item 4's targets in a report: restart p99 beyond the eviction controller's
    delay ≤ BEYOND_EVICTION_P99_S (every injected VM ran again), every broken device
    suspected after its `failed_starts`-th failed start, no healthy device suspected, no
    placement on a tainted or suspected device, every attribute loss reported."""
    r, s, lost = report["restart"], report["suspects"], report["lost"]
    p99 = r["beyond_s"]["p99"]
    n = report["spec"]["failed_starts"]
    return {
        "restart_beyond_eviction_p99_s": {
            "value": p99, "target": f"<= {BEYOND_EVICTION_P99_S:g} s, all {r['injected']} ran again",
            "met": None if p99 is None else p99 <= BEYOND_EVICTION_P99_S
            and r["ran_again"] == r["injected"]},
        "broken_suspected_after_failed_start_n": {
            "value": f"{s['on_time']}/{s['injected']} (after {s['suspected_after']})",
            "target": f"every injected broken device, after its failed start {n}",
            "met": None if not s["injected"] else s["on_time"] == s["injected"]},
        "healthy_suspected": {"value": len(s["healthy_suspected"]), "target": 0,
                              "met": not s["healthy_suspected"]},
        "placements_on_marked": {"value": len(report["placements"]["placed"]), "target": 0,
                                 "met": not report["placements"]["placed"]},
        "lost_reported": {"value": f"{lost['reported']}/{lost['injected']}",
                          "target": "every injected attribute loss",
                          "met": None if not lost["injected"]
                          else lost["reported"] == lost["injected"]}}


def summary(report: dict) -> list[str]:
    """Human lines of a report."""
    r, s, lost, p = report["restart"], report["suspects"], report["lost"], report["placements"]
    return [f"health seed {report['seed']} schedule {report['schedule']}: {report['nodes']} HGX "
            f"nodes, {report['counts']}",
            f"NoExecute: {r['injected']} injected, {r['evicted']} evicted, {r['ran_again']} ran "
            f"again; taint -> running p50/p99 {r['running_s']['p50']}/{r['running_s']['p99']} s, "
            f"of which eviction {r['eviction_s']['p50']}/{r['eviction_s']['p99']} s, beyond "
            f"{r['beyond_s']['p50']}/{r['beyond_s']['p99']} s",
            f"broken devices: {s['found']}/{s['injected']} suspected, after failed starts "
            f"{s['suspected_after']} (marked {[b.get('mark_s') for b in report.get('broken', [])]} s "
            f"after the last); healthy suspected {len(s['healthy_suspected'])}",
            f"NoSchedule: {report['noschedule']['injected']} injected, "
            f"{report['noschedule']['vm_kept']} VMs kept running",
            f"placements on a tainted or suspected device: {len(p['placed'])} "
            f"(same second as the mark: {len(p['raced'])}; claims made on a marked device's node "
            f"after the mark: {p.get('exposed')})",
            f"attribute loss: {lost['reported']} reported of {lost['injected']} injected",
            f"load {report['load_before']} -> {report['load_after']}, commit {report['commit']}"]
