"""The scale benchmark's report: issue 22's targets in it (`targets`), its figure (`plot`)
and its Markdown rows (`summary`). Pure but for writing the figure."""

from __future__ import annotations

from bench.scale.growth import rows as growth_rows


def max_hwm(part: dict) -> float | None:
    """The highest VmHWM (MiB) of a size's replicas: read with the memory, after the
    bursts and in the fresh replica's start-up; None when none was read."""
    vals = [m["hwm_mib"] for key in ("memory", "memory_after_bursts")
            for m in (part.get(key) or {}).values()]
    if part.get("startup"):
        vals.append(part["startup"]["after_5s"]["hwm_mib"])
    return max(vals) if vals else None


def parts(report: dict) -> list[tuple[str, dict]]:
    """(label, part) of every measured cluster: count mode's sizes by node count, then device
    mode's as `<nodes> device` (issue 32)."""
    return ([(n, p) for n, p in report["sizes"].items()]
            + [(f"{n} device", p) for n, p in (report.get("device_sizes") or {}).items()])


DEVICE_TARGETS = (("p99_1", "device mode: 1-GPU admission p99, quiet", 500, "ms"),
                  ("rss", "device mode: replica peak RSS (VmHWM)", 350, "MiB"))
"""Issue 32's scale targets in device mode at `nodes` (1,000 HGX nodes, 8,000 devices)."""


def targets(report: dict) -> dict:
    """Issue 22's targets at `nodes`, each {value, target, met, ratio_to_baseline}: 1-GPU
    quiet p99 < 500 ms, 8-GPU quiet p99 < 1000 ms, replica peak RSS (VmHWM, every replica)
    < 300 MiB, failover (kill to the next admission answered) < 15 s (not given when only
    device mode ran); then, when device mode ran, issue 32's (DEVICE_TARGETS) with
    `count_mode`, count mode's figure at the same size, and `ratio_to_count`."""
    top = report["sizes"].get(str(report["nodes"])) or {}
    base = report["sizes"].get(str(report["baseline_nodes"])) or {}
    dev = (report.get("device_sizes") or {}).get(str(report["nodes"])) or {}

    def fig(part: dict, key: str):
        if not part:
            return None
        if key == "p99_1":
            return (part.get("quiet") or {}).get("1", {}).get("p99_ms")
        if key == "p99_8":
            return (part.get("quiet") or {}).get("8", {}).get("p99_ms")
        if key == "rss":
            return max_hwm(part)
        return (part.get("failover") or {}).get("to_next_admitted_s")

    def entry(v, limit: float, unit: str) -> dict:
        return {"value": v, "unit": unit, "target": f"< {limit} {unit}",
                "met": None if v is None else v < limit}

    out = {}
    for key, name, limit, unit in (("p99_1", "1-GPU admission p99, quiet", 500, "ms"),
                                   ("p99_8", "8-GPU admission p99, quiet", 1000, "ms"),
                                   ("rss", "replica peak RSS (VmHWM)", 300, "MiB"),
                                   ("failover", "failover to the next admitted VMI", 15, "s")):
        if dev and not top:
            break
        v, b = fig(top, key), fig(base, key)
        out[name] = {**entry(v, limit, unit), "baseline": b,
                     "ratio_to_baseline": round(v / b, 2) if v and b else None}
    for key, name, limit, unit in DEVICE_TARGETS if dev else ():
        v, c = fig(dev, key), fig(top, key)
        out[name] = {**entry(v, limit, unit), "count_mode": c,
                     "ratio_to_count": round(v / c, 2) if v and c else None}
    return out


def plot(report: dict, path) -> None:
    """Four panels: quiet and burst admission p50/p99 per size, replica memory and
    start-up per size, and the failover's answers over time since the kill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = parts(report)
    sizes = [n for n, _ in measured]
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    width = 0.8 / max(1, len(sizes))
    for j, (n, part) in enumerate(measured):
        q = part.get("quiet") or {}
        xs = list(q)
        for p, alpha in (("p99_ms", 0.5), ("p50_ms", 1.0)):
            ax[0][0].bar([k + j * width for k in range(len(xs))], [q[x][p] or 0 for x in xs],
                         width, alpha=alpha, color=f"C{j}",
                         label=f"{n} nodes {p[:3]}")
        ax[0][0].set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(xs))],
                            [f"{x} GPU" for x in xs])
        b = part.get("bursts") or {}
        bx = list(b)
        for p, alpha in (("p99_ms", 0.5), ("p50_ms", 1.0)):
            ax[0][1].bar([k + j * width for k in range(len(bx))], [b[x][p] or 0 for x in bx],
                         width, alpha=alpha, color=f"C{j}", label=f"{n} nodes {p[:3]}")
        ax[0][1].set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(bx))],
                            [f"burst {x}" for x in bx])
        mem = {**{f"{k}": v for k, v in (part.get("memory_after_bursts") or {}).items()},
               "fresh": (part.get("startup") or {}).get("after_5s", {})}
        names = list(mem)
        ax[1][0].bar([k + j * width for k in range(len(names))],
                     [mem[x].get("hwm_mib", 0) for x in names], width, alpha=0.5, color=f"C{j}",
                     label=f"{n} nodes VmHWM")
        ax[1][0].bar([k + j * width for k in range(len(names))],
                     [mem[x].get("rss_mib", 0) for x in names], width, color=f"C{j}",
                     label=f"{n} nodes VmRSS (start-up {(part.get('startup') or {}).get('to_ready_s')} s)")
        ax[1][0].set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(names))], names,
                            fontsize=7)
        fo = part.get("failover") or {}
        for a in fo.get("answers") or []:
            ax[1][1].scatter(a["t_s"], j + (0.15 if a["probe"] else -0.15),
                             marker="o" if a["admitted"] else "x",
                             color="C2" if a["admitted"] else "C3", s=18)
        if fo.get("to_new_leader_s") is not None:
            ax[1][1].scatter(fo["to_new_leader_s"], j, marker="|", s=300, color="k")
    ax[0][0].axhline(500, color="grey", ls=":")
    ax[0][0].axhline(1000, color="grey", ls="--")
    ax[0][0].set_title("quiet cluster: one admission at a time (ms; targets 500 / 1000 at p99)")
    ax[0][1].set_title("bursts of 1-GPU creates at once (ms)")
    ax[1][0].axhline(300, color="grey", ls=":")
    if report.get("device_sizes"):
        ax[1][0].axhline(350, color="grey", ls="--")
    ax[1][0].set_title("replica memory (MiB; target VmHWM < 300, device mode < 350)")
    ax[1][1].axvline(15, color="grey", ls=":")
    ax[1][1].set_yticks(range(len(sizes)), [f"{n} nodes" for n in sizes])
    ax[1][1].set_title("failover: answers after kill -9 (o admitted, x refused; | new Lease)")
    ax[1][1].set_xlabel("seconds since the kill (lower: burst, upper: probes)")
    for a in (ax[0][0], ax[0][1], ax[1][0]):
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary(report: dict) -> list[str]:
    """Markdown rows (header first): per size the population time, quiet p50/p99 per GPU
    count, bursts, memory, start-up, failover; then the targets; then, when a mode was
    measured at two sizes or more, the growth section's rows (`growth.rows`)."""
    rows = ["| nodes | VMIs running | devices | populate s | quiet 1/4/8 GPU p50/p99 ms | "
            "burst p50/p99 ms | replica VmHWM MiB | start-up s | failover s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for n, part in parts(report):
        pop = part["population"]
        q = " · ".join(f"{v['p50_ms']}/{v['p99_ms']}" for v in part["quiet"].values())
        b = " · ".join(f"{k}: {v['p50_ms']}/{v['p99_ms']}" for k, v in part["bursts"].items())
        rows.append(f"| {n} | {pop['vmis_running']} | {pop['gpudevices']} | {pop['seconds']['total']} "
                    f"| {q} | {b} | {max_hwm(part)} | {part['startup']['to_ready_s']} "
                    f"| {part['failover']['to_next_admitted_s']} |")
    for name, t in report["targets"].items():
        met = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        if "count_mode" in t:
            ratio = (f"; {t['ratio_to_count']}× count mode's {t['count_mode']}"
                     if t["count_mode"] is not None else "; count mode not run")
        else:
            ratio = (f"; {t['ratio_to_baseline']}× the baseline's {t['baseline']}"
                     if t["baseline"] is not None else "; no baseline run")
        rows.append(f"target {name}: {t['value']} {t['unit']} ({t['target']}{ratio}): {met}")
    return rows + growth_rows(report)
