"""Whether anything grows with the fleet: per mode, the quiet 1-GPU admission's p50/p99 and
the leader's peak RSS (VmHWM) at each measured node count (`growth`), the target on them
(p50 at the largest size <= 1.2x p50 at the smallest) and the RSS each 1,000 devices cost,
where the growth went (`where`: per phase and per process, smallest against largest size),
their Markdown rows (`rows`) and their figure (`plot`); and `--sizes`' value
(`node_sizes`). Pure but for drawing the figure."""

from __future__ import annotations

from bench.common import BadArgs, positive_ints

P50_GROWTH_LIMIT = 1.2
"""The target: quiet 1-GPU p50 at the largest size <= this many times p50 at the smallest."""

MODE_PARTS = (("count", "sizes"), ("device", "device_sizes"))
"""Mode -> the report's key holding that mode's parts (node count as a string -> part)."""


def node_sizes(text: str, *, nodes: int | None = None,
               baseline_nodes: int | None = None) -> tuple[int, ...]:
    """`--sizes`' value: node counts (each >= 1) separated by commas, returned ascending and
    each once ("1000,100,100" -> (100, 1000)). `nodes` and `baseline_nodes` are the other
    flags' values (None when not given): `--sizes` replaces both, so either beside it is
    refused. Raises BadArgs naming the flag."""
    if nodes is not None or baseline_nodes is not None:
        given = ", ".join(f for f, v in (("--nodes", nodes), ("--baseline-nodes", baseline_nodes))
                          if v is not None)
        raise BadArgs(f"gpu-binder bench scale: --sizes replaces --nodes and --baseline-nodes; "
                      f"got {given} beside it")
    return tuple(sorted(set(positive_ints(text, "--sizes"))))


def leader_hwm(part: dict) -> float | None:
    """The leader's VmHWM (MiB) in one size's part: the highest of the replicas marked leader
    in the memory read after population and after the bursts (the leader's peak so far);
    None when no leader was read."""
    vals = [m["hwm_mib"] for key in ("memory", "memory_after_bursts")
            for m in (part.get(key) or {}).values() if m.get("leader")]
    return max(vals) if vals else None


def _point(part: dict) -> dict:
    """One size's figures: devices (the population's GPUDevices), quiet 1-GPU p50/p99 (ms,
    of the admitted ones) and how many were admitted of how many asked (a full fleet refuses
    most: then the percentiles stand on few), the leader's VmHWM (MiB), the 1-minute load
    when the quiet admissions began (`measure.settle`; in older reports, after population)."""
    one = (part.get("quiet") or {}).get("1") or {}
    settled = (part.get("settle") or {}).get("load_at_quiet")
    load = [settled] if settled is not None else part.get("load_after_population")
    return {"devices": (part.get("population") or {}).get("gpudevices"),
            "p50_ms": one.get("p50_ms"), "p99_ms": one.get("p99_ms"),
            "admitted": one.get("admitted"), "asked": one.get("asked"),
            "leader_hwm_mib": leader_hwm(part), "load": round(load[0], 2) if load else None}


def _ratio(big, small) -> float | None:
    """big ÷ small unrounded; None when either is missing (or small is 0)."""
    return big / small if big is not None and small else None


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def growth(report: dict) -> dict:
    """Per measured mode ("count", "device"): {"sizes": {nodes (str): {devices, p50_ms,
    p99_ms, admitted, asked, leader_hwm_mib, load}} ascending by node count, "smallest", "largest" (node
    counts), "p50_ratio" and "p99_ratio" (largest ÷ smallest, to 0.01), "p50_target"
    {value (the ratio), target, met (on the unrounded ratio)}, "rss_per_1000_devices_mib"
    ((VmHWM at largest − at smallest) ÷ (devices at largest − at smallest) × 1000, MiB to
    0.1), "where" (`where`: the quiet 1-GPU admission's figures at the smallest and the
    largest size and their change, per phase and per process)}. A figure that cannot be
    computed (one size only, a missing value, no device difference) is None, and so is `met`
    then ("where" is None with one size). Modes with no measured size are left out."""
    out = {}
    for mode, key in MODE_PARTS:
        measured = report.get(key) or {}
        if not measured:
            continue
        points = {n: _point(measured[n]) for n in sorted(measured, key=int)}
        small, big = min(measured, key=int), max(measured, key=int)
        s, b = points[small], points[big]
        several = small != big
        p50 = _ratio(b["p50_ms"], s["p50_ms"]) if several else None   # met on the unrounded
        rss = None
        if several and None not in (b["leader_hwm_mib"], s["leader_hwm_mib"], b["devices"],
                                     s["devices"]) and b["devices"] != s["devices"]:
            rss = round((b["leader_hwm_mib"] - s["leader_hwm_mib"])
                        / ((b["devices"] - s["devices"]) / 1000), 1)
        out[mode] = {"sizes": points, "smallest": int(small), "largest": int(big),
                     "where": where(measured[small], measured[big]) if several else None,
                     "p50_ratio": _round(p50),
                     "p99_ratio": _round(_ratio(b["p99_ms"], s["p99_ms"])) if several else None,
                     "p50_target": {"value": _round(p50), "target": f"<= {P50_GROWTH_LIMIT}x",
                                    "met": None if p50 is None else p50 <= P50_GROWTH_LIMIT},
                     "rss_per_1000_devices_mib": rss}
    return out


def _by_role(figures: dict) -> dict:
    """Per-process figures with a replica's "NAME (ROLE)" keyed by its role alone ("leader",
    "follower"; summed when two share one), so sizes measured on clusters of their own
    match whichever replica led; "total" and other names as they are."""
    out: dict = {}
    for name, v in (figures or {}).items():
        key = name[name.rindex(" (") + 2:-1] if name.endswith(")") and " (" in name else name
        out[key] = v if key not in out else (None if v is None or out[key] is None
                                             else out[key] + v)
    return out


def deltas(small: dict, large: dict, digits: int = 2) -> dict[str, dict]:
    """Per name in either of two figure maps (a name one lacks is None there): {"small",
    "large", "delta" (large − small, to `digits`; None when either is missing)}, the largest
    change (absolute) first, then the ones without one, each group by name."""
    out = {}
    for name in {*small, *large}:
        a, b = small.get(name), large.get(name)
        out[name] = {"small": a, "large": b,
                     "delta": None if a is None or b is None else round(b - a, digits)}
    return dict(sorted(out.items(), key=lambda kv: (kv[1]["delta"] is None,
                                                    -abs(kv[1]["delta"] or 0.0), kv[0])))


def where(small: dict, large: dict) -> dict:
    """Where the quiet 1-GPU admission's growth went between two sizes' parts, each figure
    as `deltas` (small → large): "p50_ms"; "inside" (the client's mean, the webhook's, the
    binder's decision, ms; the leader's housekeeping rounds over the quiet admissions and
    in the idle window); "phases" (the webhook's phases, ms per admission, "own" its time
    between them, "total" the whole review); "apiserver" (kube-apiserver's mean ms per call
    of the admission's GPUDevice and VMI requests; watches left out); "cpu_ms_per_admission"
    and "quiet_cores" (per process over the quiet admissions, the replicas by role);
    "idle_cores" (per process in the idle window before them: the background at that size)
    and "idle_requests_per_s" (what kube-apiserver served meanwhile). A figure an older
    report lacks makes its section empty."""
    def quiet(part: dict) -> dict:
        return ((part.get("quiet") or {}).get("1") or {})

    def inside(part: dict) -> dict:
        return quiet(part).get("inside") or {}

    def api(part: dict) -> dict:
        return {k: v["mean_ms"] for k, v in (inside(part).get("apiserver") or {}).items()
                if not k.startswith("WATCH")}

    def cpu(part: dict, key: str) -> dict:
        return _by_role((inside(part).get("cpu") or {}).get(key) or {})

    def idle(part: dict, key: str) -> dict:
        return (part.get("idle") or {}).get(key) or {}

    def means(part: dict) -> dict:
        got = inside(part)
        out = {k: got[k] for k in ("client_mean_ms", "webhook_mean_ms", "decision_mean_ms",
                                   "housekeeping_rounds") if k in got}
        rounds = ((part.get("idle") or {}).get("replicas") or {}).get("housekeeping_rounds")
        if rounds is not None:
            out["idle_housekeeping_rounds"] = rounds
        return out

    lo, hi = inside(small), inside(large)
    return {"p50_ms": deltas({"p50": quiet(small).get("p50_ms")},
                             {"p50": quiet(large).get("p50_ms")}, 1)["p50"],
            "inside": deltas(means(small), means(large)),
            "phases": deltas(lo.get("phase_ms") or {}, hi.get("phase_ms") or {}),
            "apiserver": deltas(api(small), api(large), 1),
            "cpu_ms_per_admission": deltas(cpu(small, "ms_per_admission"),
                                           cpu(large, "ms_per_admission"), 1),
            "quiet_cores": deltas(cpu(small, "process_cores"), cpu(large, "process_cores"), 3),
            "idle_cores": deltas(_by_role(idle(small, "cores")), _by_role(idle(large, "cores")),
                                 3),
            "idle_requests_per_s": deltas(idle(small, "apiserver_requests_per_s"),
                                          idle(large, "apiserver_requests_per_s"))}


WHERE_LINES = (("inside", "means ms and housekeeping rounds", 5),
               ("phases", "webhook phases, ms per admission", 13),
               ("apiserver", "kube-apiserver mean ms per call", 8),
               ("cpu_ms_per_admission", "CPU ms per quiet admission", 12),
               ("quiet_cores", "cores busy over the quiet admissions", 12),
               ("idle_cores", "background cores, idle", 12),
               ("idle_requests_per_s", "kube-apiserver requests/s, idle", 8))
"""The text report's lines of `where`: section, its title, at most how many figures."""


def _g(v) -> str:
    return "-" if v is None else f"{v:g}"


def _signed(v) -> str:
    return "-" if v is None else f"{v:+g}"


def where_lines(mode: str, m: dict) -> list[str]:
    """The text lines of one mode's `where` ("where the p50 growth went"): the p50, then one
    line per section that has figures (WHERE_LINES), each figure "name small -> large
    (+delta)" largest change first; none when no section has figures (an older report)."""
    w = m.get("where") or {}
    if not any(w.get(key) for key, _, _ in WHERE_LINES):
        return []
    p = w["p50_ms"]
    out = [f"growth {mode} mode, where the p50 growth went ({m['smallest']} -> {m['largest']} "
           f"nodes): p50 {_g(p['small'])} -> {_g(p['large'])} ms "
           f"({_signed(p['delta'])})"]
    for key, title, most in WHERE_LINES:
        got = list((w.get(key) or {}).items())
        if not got:
            continue
        shown = ", ".join(f"{name} {_g(f['small'])} -> {_g(f['large'])} ({_signed(f['delta'])})"
                          for name, f in got[:most])
        out.append(f"  {title}: {shown}" + (f", … {len(got) - most} more" if len(got) > most
                                            else ""))
    return out


def grew(report: dict) -> bool:
    """Whether the report's growth section has a mode measured at two sizes or more (then the
    summary has its rows and the run draws its figure)."""
    return any(len(g["sizes"]) > 1 for g in (report.get("growth") or {}).values())


def rows(report: dict) -> list[str]:
    """Markdown rows of the report's growth section (none when `grew` is False): a table of
    mode, nodes, devices, quiet 1-GPU p50/p99 and admitted/asked, leader VmHWM and load per
    size, then per mode
    the p50 target, the p99 ratio and the RSS per 1,000 devices, and where the p50 growth
    went (`where_lines`)."""
    if not grew(report):
        return []
    g = report["growth"]
    out = ["| growth: mode | nodes | devices | quiet 1-GPU p50/p99 ms | admitted/asked "
           "| leader VmHWM MiB | load |",
           "|---|---|---|---|---|---|---|"]
    for mode, m in g.items():
        for n, p in m["sizes"].items():
            out.append(f"| {mode} | {n} | {p['devices']} | {p['p50_ms']}/{p['p99_ms']} "
                       f"| {p.get('admitted')}/{p.get('asked')} | {p['leader_hwm_mib']} "
                       f"| {p['load']} |")
    for mode, m in g.items():
        if len(m["sizes"]) < 2:
            continue
        t = m["p50_target"]
        met = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        lo, hi = m["sizes"][str(m["smallest"])], m["sizes"][str(m["largest"])]
        out.append(f"growth {mode} mode: quiet 1-GPU p50 at {m['largest']} nodes ÷ at "
                   f"{m['smallest']}: {m['p50_ratio']} ({t['target']}): {met}; p99 "
                   f"{m['p99_ratio']}; RSS per 1,000 devices {m['rss_per_1000_devices_mib']} MiB "
                   f"(leader VmHWM {lo['leader_hwm_mib']} -> {hi['leader_hwm_mib']} MiB, "
                   f"{lo['devices']} -> {hi['devices']} devices)")
        out += where_lines(mode, m)
    return out


def plot(report: dict, path) -> None:
    """Two panels against node count: the quiet 1-GPU p50 (solid) and p99 (dashed) per mode,
    with each mode's target (1.2x its p50 at the smallest size, dotted); and the leader's
    VmHWM per mode, labelled with its RSS per 1,000 devices."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, mem) = plt.subplots(1, 2, figsize=(12, 4.5))
    for j, (mode, m) in enumerate((report.get("growth") or {}).items()):
        xs = [int(n) for n in m["sizes"]]
        pts = list(m["sizes"].values())
        for key, ls in (("p50_ms", "-"), ("p99_ms", "--")):
            got = [(x, p[key]) for x, p in zip(xs, pts) if p[key] is not None]
            if got:
                lat.plot(*zip(*got), ls, marker="o", color=f"C{j}", label=f"{mode} {key[:3]}")
        first = pts[0]["p50_ms"]
        if first is not None and len(xs) > 1:
            lat.hlines(P50_GROWTH_LIMIT * first, xs[0], xs[-1], colors=f"C{j}", linestyles=":",
                       label=f"{mode} target: {P50_GROWTH_LIMIT}× p50 at {xs[0]}")
        got = [(x, p["leader_hwm_mib"]) for x, p in zip(xs, pts) if p["leader_hwm_mib"] is not None]
        if got:
            mem.plot(*zip(*got), "-", marker="o", color=f"C{j}",
                     label=f"{mode}: {m['rss_per_1000_devices_mib']} MiB per 1,000 devices")
    lat.set_title("quiet 1-GPU admission (ms)")
    mem.set_title("leader's peak RSS, VmHWM (MiB)")
    for a in (lat, mem):
        a.set_xlabel("nodes (8 GPUs each)")
        a.set_ylim(bottom=0)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
