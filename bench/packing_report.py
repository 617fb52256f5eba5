"""The packing benchmark's report: issue 21's targets (`targets`), the figure (`plot`) and
the Markdown rows (`summary`). Pure but for writing the figure."""

from __future__ import annotations

from pathlib import Path

from bench import packing_trace as pt
from bench.packing_replay import SYSTEMS


def figure(report: dict, load: str, system: str, key: str, size: str | None = None):
    """Figure `key` (of `size` when given) of `system` at `load`; None when the system did
    not run or is not available."""
    s = report["loads"].get(load, {}).get("systems", {}).get(system) or {}
    if not s or s.get("available") is False:
        return None
    return s[key][size] if size else s[key]


def _t(value, target: str, met) -> dict:
    return {"value": value, "target": target, "met": met}


def targets(report: dict) -> dict:
    """Issue 21's targets (issue 33's for the HGX pools, `hgx_targets`), each {value,
    target, met} (met None when a figure is missing)."""
    if report.get("mode") == "hgx":
        return hgx_targets(report)
    t = _t
    out = {}
    a8, b8 = figure(report, "0.85", "a", "sets_started", "8"), figure(report, "0.85", "b", "sets_started", "8")
    out["load 0.85: gpu-binder 8-GPU sets"] = t(a8, ">= 0.97", None if a8 is None else a8 >= 0.97)
    out["load 0.85: gpu-binder / default kube-scheduler, 8-GPU sets"] = t(
        None if a8 is None or b8 is None else (round(a8 / b8, 2) if b8 else "inf"), ">= 10",
        None if a8 is None or b8 is None else (b8 == 0 and a8 > 0) or (b8 > 0 and a8 / b8 >= 10))
    a, d, c = (figure(report, "0.95", k, "demand_started") for k in "adc")
    out["load 0.95: demand within 3 points of the bound"] = t(
        None if a is None else round(d - a, 4), "bound - gpu-binder <= 0.03",
        None if a is None else d - a <= 0.03)
    out["load 0.95: demand >= MostAllocated"] = t(
        None if a is None or c is None else [a, c], "gpu-binder >= MostAllocated",
        None if a is None or c is None else a >= c)
    gaps = []
    for load in report["loads"]:
        e8, a8_, d8 = (figure(report, load, k, "sets_started", "8") for k in "ead")
        if None not in (e8, a8_, d8) and d8 > a8_:
            gaps.append((e8 - a8_) / (d8 - a8_))
    out["defrag closes >= half the 8-GPU gap"] = t(
        [round(g, 2) for g in gaps] or None, ">= 0.5 at every load with a gap",
        None if not gaps else all(g >= 0.5 for g in gaps))
    return out


def hgx_targets(report: dict) -> dict:
    """Issue 33's targets on the HGX pools, each {value, target, met}: (a) and (b) every
    admitted multi-GPU set a valid partition at every load; at 0.85 (a) starts >= 97 % of
    8-GPU sets and >= 1.5x (b)'s share; at 0.95 (a)'s GPU demand within 3 points of the
    bound; (c)'s invalid share measured (met when measured)."""
    out = {}
    for key in "ab":
        shares = {load: figure(report, load, key, "valid_partition") for load in report["loads"]}
        got = [v for v in shares.values() if v is not None]
        out[f"({key}) every admitted multi-GPU set a valid partition"] = _t(
            shares, "1.0 at every load", all(v == 1.0 for v in got) if got else None)
    a8, b8 = figure(report, "0.85", "a", "sets_started", "8"), figure(report, "0.85", "b", "sets_started", "8")
    out["load 0.85: (a) 8-GPU sets"] = _t(a8, ">= 0.97", None if a8 is None else a8 >= 0.97)
    out["load 0.85: (a) / (b), 8-GPU sets"] = _t(
        None if a8 is None or b8 is None else (round(a8 / b8, 2) if b8 else "inf"), ">= 1.5",
        None if a8 is None or b8 is None else (b8 == 0 and a8 > 0) or (b8 > 0 and a8 / b8 >= 1.5))
    a, d = figure(report, "0.95", "a", "demand_started"), figure(report, "0.95", "d", "demand_started")
    out["load 0.95: (a) demand within 3 points of the bound"] = _t(
        None if a is None or d is None else round(d - a, 4), "bound - (a) <= 0.03",
        None if a is None or d is None else d - a <= 0.03)
    c = {load: figure(report, load, "c", "valid_partition") for load in report["loads"]}
    out["(c) invalid partitions measured"] = _t(
        {k: None if v is None else round(1 - v, 4) for k, v in c.items()}, "measured and reported",
        None if all(v is None for v in c.values()) else True)
    return out


def plot(report: dict, path: Path) -> None:
    """Per load: GPU utilisation and the largest placeable set over trace time, per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = list(report["loads"])
    hgx = report.get("mode") == "hgx"
    fig, axes = plt.subplots(len(loads), 3 if hgx else 2, figsize=(18 if hgx else 12, 3.2 * len(loads)),
                             squeeze=False)
    gpus = report["plan"]["nodes_per_lane"] * report["plan"]["gpus_per_node"]
    for row, load in zip(axes, loads):
        for key, s in report["loads"][load]["systems"].items():
            tl = s.get("timeline") if isinstance(s, dict) else None
            if not tl:
                continue
            label = f"({key}) {report['systems'][key]}"
            use = [p for p in tl if p[1] is not None]
            big = [p for p in tl if p[3] is not None]
            row[0].step([p[0] for p in use], [p[1] / gpus for p in use], where="post",
                        label=label, lw=1)
            row[1].step([p[0] for p in big], [p[3] for p in big], where="post", label=label, lw=1)
        row[0].set_title(f"load {load}: GPU utilisation (running VMs)")
        row[1].set_title(f"load {load}: largest placeable set")
        row[0].set_ylim(0, 1.05)
        row[1].set_yticks(list(pt.SIZES) + [0])
        for ax in row[:2]:
            ax.set_xlabel("trace time (s; mean VM life 100)")
            ax.axvline(report["plan"]["warmup_mean_lives"] * pt.MEAN_LIFE, color="grey", ls=":")
        row[0].legend(fontsize=7, loc="lower right")
        if hgx:
            _bars(row[2], report, load)
    if report["simulation_only"]:
        fig.suptitle("simulation only (no cluster): the bound (d); see the report's simulation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def _bars(ax, report: dict, load: str) -> None:
    """HGX: per system, GPU demand started, 8-GPU sets started and the share of admitted
    multi-GPU sets forming a valid partition, as grouped bars."""
    keys = [k for k in "abcd" if k in report["loads"][load]["systems"]]
    figures = (("GPU demand", "demand_started", None), ("8-GPU sets", "sets_started", "8"),
               ("valid partitions", "valid_partition", None))
    for i, (label, key, size) in enumerate(figures):
        vals = [figure(report, load, k, key, size) or 0 for k in keys]
        ax.bar([j + 0.27 * (i - 1) for j in range(len(keys))], vals, width=0.27, label=label)
    ax.set_xticks(range(len(keys)), [f"({k})" for k in keys])
    ax.set_ylim(0, 1.05)
    ax.set_title(f"load {load}: started and valid partitions per system")
    ax.legend(fontsize=7, loc="lower left")


def summary(report: dict) -> list[str]:
    """The report as Markdown table rows (header first): per load and system, demand started,
    8- and 4-GPU sets started, mean utilisation, time an 8-GPU set fits; the simulation's rows
    are marked "sim". The HGX pools: `hgx_summary`."""
    if report.get("mode") == "hgx":
        return hgx_summary(report)
    pct = _pct
    rows = ["| load | system | GPU demand started | 8-GPU sets | 4-GPU sets | mean utilisation "
            "| time an 8-GPU set fits |", "|---|---|---|---|---|---|---|"]
    for load, entry in report["loads"].items():
        for key in "abcde":
            fig = entry["systems"].get(key)
            if fig is None:
                continue
            if fig.get("available") is False:
                rows.append(f"| {load} | ({key}) {SYSTEMS[key]} | not available: {fig['why']} "
                            "| | | | |")
                continue
            rows.append(f"| {load} | ({key}) {SYSTEMS[key]} | {pct(fig['demand_started'])} | "
                        f"{pct(fig['sets_started']['8'])} | {pct(fig['sets_started']['4'])} | "
                        f"{pct(fig['mean_utilisation'])} | {pct(fig['time_8_placeable'])} |")
        for policy, fig in entry["simulation"].items():
            if policy == "note":
                continue
            rows.append(f"| {load} | sim: {policy} | {pct(fig['demand_started'])} | "
                        f"{pct(fig['sets_started']['8'])} | {pct(fig['sets_started']['4'])} | "
                        f"{pct(fig['mean_utilisation'])} | {pct(fig['time_8_placeable'])} |")
    return rows


def hgx_summary(report: dict) -> list[str]:
    """The HGX report as Markdown table rows (header first): per load and system (then the
    simulation's, marked "sim"), GPU demand started, 8-, 4- and 2-GPU sets started, the share
    of admitted multi-GPU sets forming a valid partition, mean utilisation."""
    rows = ["| load | system | GPU demand started | 8-GPU sets | 4-GPU sets | 2-GPU sets "
            "| valid partitions | mean utilisation |", "|---|---|---|---|---|---|---|---|"]
    for load, entry in report["loads"].items():
        named = [(f"({k}) {report['systems'][k]}", entry["systems"][k])
                 for k in "abcd" if k in entry["systems"]]
        named += [(f"sim: ({fig['system']}) {policy}", fig)
                  for policy, fig in entry["simulation"].items() if policy != "note"]
        for name, fig in named:
            sets = fig["sets_started"]
            rows.append(f"| {load} | {name} | {_pct(fig['demand_started'])} | {_pct(sets['8'])} | "
                        f"{_pct(sets['4'])} | {_pct(sets['2'])} | {_pct(fig.get('valid_partition'))}"
                        f" ({fig.get('invalid_partition_sets', 0)} invalid) | "
                        f"{_pct(fig['mean_utilisation'])} |")
    return rows
