"""Analyse one profile_run.py output dir: python analyse.py DIR"""
import collections
import json
import re
import sys
from datetime import datetime
from pathlib import Path

D = Path(sys.argv[1])


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


rep = json.loads((D / "fairness.json").read_text())
drv = json.loads((D / "probe-driver.json").read_text())
bw = drv["b_wall"]
print("ratio", rep["ratio_p99"], "alone p99", rep["b_alone"]["p99_s"], "busy p99",
      rep["b_under_flood"]["p99_s"], "load", rep["load_before"], rep.get("load_after"))
print("busy each", rep["b_under_flood"]["each_s"])
print("busy in_webhook", rep["b_under_flood"]["in_webhook_s"])

# audit
audit = collections.defaultdict(dict)
for line in (D / "audit.log").read_text().splitlines():
    e = json.loads(line)
    name = (e.get("objectRef") or {}).get("name")
    if not name:
        continue
    audit[name][e["stage"]] = e
    audit[name]["received"] = ts(e["requestReceivedTimestamp"])
    if e["stage"] == "ResponseComplete":
        audit[name]["complete"] = ts(e["stageTimestamp"])
        audit[name]["ann"] = e.get("annotations", {})

# replica logs
probe, admitted, lags, denied_a = {}, {}, [], []
for path in sorted((D / "logs").glob("controller-*.log")):
    rep_i = path.stem
    for line in path.read_text(errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        ev = e.get("event")
        if ev == "probe review":
            probe[e["vmi"]] = dict(e, replica=rep_i)
        elif ev == "VMI admitted" and e.get("namespace") == "tenant-b":
            admitted[e["vmi"]] = dict(e, replica=rep_i)
        elif ev == "probe loop lag":
            for t, lag in e["lags"]:
                lags.append((t, lag, rep_i))
            e["_rep"] = rep_i
            lags.append(("hs", e.get("handshakes", []), rep_i))
        elif ev == "VMI denied" and e.get("namespace") == "tenant-a":
            denied_a.append((ts(e["timestamp"]), rep_i))

flood0 = drv.get("flood_phase_start")
print("\nflood phase start (B's busy loop start)", flood0)
if denied_a:
    print("A's denials logged: first", round(min(t for t, _ in denied_a) - flood0, 3),
          "last", round(max(t for t, _ in denied_a) - flood0, 3), "n", len(denied_a))

print("\nper B create (seconds relative to client send):")
hdr = "name  total  S->R(apisrv recv)  R->arrive(replica)  arrive->decoded  stages...  done->C  C->E"
print(hdr)
for prefix in ("alone", "busy"):
    for i in range(10):
        n = f"{prefix}-{i}"
        if n not in bw:
            continue
        s, e, st = bw[n]
        a = audit.get(n, {})
        p = probe.get(n, {})
        r, c = a.get("received"), a.get("complete")
        parts = [f"{n:8s} {e - s:.3f}"]
        parts.append(f"S->R {r - s:.3f}" if r else "S->R ?")
        if p and r:
            parts.append(f"R->arr {p['arrived'] - r:.3f}")
            prev = p["arrived"]
            for stage, t in p["stages"]:
                parts.append(f"{stage} {t - prev:.3f}")
                prev = t
            parts.append(f"->done {p['done'] - prev:.3f}")
            if c:
                parts.append(f"done->C {c - p['done']:.3f}")
        if c:
            parts.append(f"C->E {e - c:.3f}")
        parts.append(p.get("replica", "?"))
        if prefix == "busy" and flood0:
            parts.append(f"sent@{s - flood0:+.3f}")
        print("  ".join(parts))
        if a.get("ann", {}).get("apiserver.latency.k8s.io/total"):
            print("     latency annotations:", {k.split("/")[-1]: v for k, v in a["ann"].items()
                                               if "latency" in k})

# loop lag during the flood window
if flood0:
    print("\nloop lags > 10 ms within the first 2 s of the flood phase, per replica:")
    for rep_i in sorted({x[2] for x in lags}):
        ls = [(t - flood0, lag) for t, lag, r in lags if r == rep_i and t != "hs"
              and 0 <= t - flood0 <= 2.0]
        hs = [t - flood0 for t0, hsl, r in lags if r == rep_i and t0 == "hs" for t in hsl
              if 0 <= t - flood0 <= 2.0]
        print(rep_i, "n", len(ls), "sum", round(sum(l for _, l in ls), 3), "max",
              max((l for _, l in ls), default=0), "handshakes in window", len(hs))
        print("   ", [(round(t, 3), round(l, 3)) for t, l in ls][:40])
        print("    handshakes at", [round(t, 3) for t in sorted(hs)][:60])

# APF dump_requests
p = D / "apf-dump-requests.json"
if p.exists():
    rows = json.loads(p.read_text())
    print("\nAPF dump_requests polls:", len(rows))
    for row in rows:
        lines = row["text"].splitlines()
        b = [x for x in lines if "tenant-b" in x]
        a = [x for x in lines if "tenant-a" in x]
        t = row["t"] - flood0 if flood0 else row["t"]
        print(f"  t{t:+.3f} ({row['t_done'] - row['t']:.3f} s): {len(a)} of A waiting, "
              f"{len(b)} of B waiting", b[:2])
    if rows:
        print("  header:", rows[0]["text"].splitlines()[:1])


# metrics
def metrics(tag):
    out = {}
    f = D / f"metrics-{tag}.txt"
    if not f.exists():
        return out
    for line in f.read_text().splitlines():
        if line.startswith("#"):
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


m0, m1, mm = metrics("before"), metrics("after"), metrics("during")
print("\nflowcontrol metrics (after - before), priority level gpu-binder-vmi-creates:")
for k in sorted(m1):
    if "gpu-binder-vmi-creates" not in k:
        continue
    if any(x in k for x in ("request_wait_duration_seconds", "dispatched", "rejected",
                            "request_execution_seconds_sum", "request_execution_seconds_count")):
        d = m1[k] - m0.get(k, 0)
        if d:
            print(f"  {k} {d:g}")
print("during (B's first create + 60 ms):")
for k in sorted(mm):
    if "gpu-binder-vmi-creates" in k and any(x in k for x in (
            "current_inqueue", "current_executing", "current_r", "request_concurrency_in_use",
            "current_inqueue_seats")):
        print(f"  {k} {mm[k]:g}")
print("webhook admission duration (after - before):")
for k in sorted(m1):
    if k.startswith("apiserver_admission_webhook_admission_duration_seconds") and (
            "_sum" in k or "_count" in k or 'le="0.1"' in k or 'le="0.25"' in k or 'le="0.5"' in k):
        d = m1[k] - m0.get(k, 0)
        if d:
            print(f"  {k} {d:g}")
