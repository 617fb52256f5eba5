"""`gpu-binder bench scale --sizes 100,300,1000 --modes count,device` without a cluster: the
`--sizes` value, the growth section (quiet 1-GPU p50/p99 and the leader's VmHWM per mode and
size, p50 at the largest ÷ at the smallest against 1.2, RSS per 1,000 devices), its rows and
figure, and `run` measuring every mode at every size on a cluster of its own (the cluster
replaced by a recorded part). The figures here are the documented 1,000-node runs' and
made-up smaller ones; nothing is timed."""

from __future__ import annotations

import json

import pytest

from bench.common import BadArgs
from bench.scale import growth as g
from bench.scale.report import summary


def _part(p50: float, p99: float, leader_hwm: float, devices: int, *, load: float = 1.5,
          leader_after: str = "replica-0") -> dict:
    """One size's part as `measure_on` writes it (the fields the growth section reads, and
    the summary's)."""
    def mem(leader: str, hwm: float) -> dict:
        return {"replica-0": {"leader": leader == "replica-0", "rss_mib": hwm - 5, "hwm_mib": hwm},
                "replica-1": {"leader": leader == "replica-1", "rss_mib": hwm - 9,
                              "hwm_mib": hwm - 1}}
    return {"population": {"vmis_running": devices // 4, "gpudevices": devices,
                           "seconds": {"total": 30.0}},
            "load_after_population": [load, 1.0, 0.5],
            "quiet": {"1": {"asked": 60, "admitted": 60, "p50_ms": p50, "p99_ms": p99},
                      "4": {"p50_ms": 150.0, "p99_ms": 300.0},
                      "8": {"p50_ms": 200.0, "p99_ms": 400.0}},
            "bursts": {"20": {"p50_ms": 300.0, "p99_ms": 600.0}},
            "memory": mem("replica-0", leader_hwm - 10),
            "memory_after_bursts": mem(leader_after, leader_hwm),
            "startup": {"to_ready_s": 4.2, "after_5s": {"rss_mib": 100.0, "hwm_mib": 110.0}},
            "failover": {"to_next_admitted_s": 9.5, "to_new_leader_s": 8.0, "answers": []}}


def _report() -> dict:
    report = {"nodes": 1000, "baseline_nodes": 100, "modes": ["count", "device"],
              "sizes": {"100": _part(81.0, 129.0, 144.0, 800),
                        "1000": _part(107.0, 244.0, 259.0, 8000),   # 2026-12-02's figures
                        "300": _part(90.0, 150.0, 180.0, 2400)},
              "device_sizes": {"100": _part(200.0, 300.0, 160.0, 800),
                               "1000": _part(240.7, 448.3, 299.9, 8000)}}   # 2026-12-04's
    report["growth"] = g.growth(report)
    return report


@pytest.mark.parametrize("text, sizes", [
    ("100,300,1000", (100, 300, 1000)),
    ("1000, 100,300,100", (100, 300, 1000)),   # ascending, each once
    ("10,20", (10, 20)),
    ("50", (50,)),
])
def test_sizes_are_node_counts_ascending_each_once(text, sizes):
    assert g.node_sizes(text) == sizes


@pytest.mark.parametrize("text", ["", "100,x", "0,100", "100,-3", ","])
def test_a_bad_sizes_value_is_refused_naming_the_flag(text):
    with pytest.raises(BadArgs, match="--sizes takes positive integers separated by commas"):
        g.node_sizes(text)


@pytest.mark.parametrize("given, named", [
    ({"nodes": 1000}, "--nodes"),
    ({"baseline_nodes": 0}, "--baseline-nodes"),
    ({"nodes": 20, "baseline_nodes": 10}, "--nodes, --baseline-nodes"),
])
def test_sizes_replace_nodes_and_baseline_nodes_so_either_beside_them_is_refused(given, named):
    with pytest.raises(BadArgs) as exc:
        g.node_sizes("100,1000", **given)
    assert str(exc.value) == ("gpu-binder bench scale: --sizes replaces --nodes and "
                              f"--baseline-nodes; got {named} beside it")


def test_growth_per_mode_and_size_with_the_ratios_and_the_rss_per_1000_devices():
    count = _report()["growth"]["count"]
    assert list(count["sizes"]) == ["100", "300", "1000"]   # by node count, not as text
    assert count["sizes"]["300"] == {"devices": 2400, "p50_ms": 90.0, "p99_ms": 150.0,
                                     "admitted": 60, "asked": 60, "leader_hwm_mib": 180.0,
                                     "load": 1.5}
    assert (count["smallest"], count["largest"]) == (100, 1000)
    assert (count["p50_ratio"], count["p99_ratio"]) == (1.32, 1.89)   # 107/81, 244/129
    assert count["p50_target"] == {"value": 1.32, "target": "<= 1.2x", "met": False}
    assert count["rss_per_1000_devices_mib"] == 16.0                   # (259-144) / 7.2
    device = _report()["growth"]["device"]
    assert list(device["sizes"]) == ["100", "1000"]
    assert device["rss_per_1000_devices_mib"] == 19.4                  # (299.9-160) / 7.2
    # 240.7/200 = 1.2035: shown as 1.2, but not met (met is decided on the unrounded ratio)
    assert device["p50_target"] == {"value": 1.2, "target": "<= 1.2x", "met": False}


def test_exactly_the_limit_is_met():
    report = {"sizes": {"100": _part(100.0, 200.0, 150.0, 800),
                        "1000": _part(120.0, 200.0, 150.0, 8000)}}
    got = g.growth(report)["count"]
    assert got["p50_target"]["met"] is True
    assert (got["p99_ratio"], got["rss_per_1000_devices_mib"]) == (1.0, 0.0)


def test_the_leader_is_whichever_replica_held_the_lease_when_read():
    part = _part(81.0, 129.0, 144.0, 800, leader_after="replica-1")
    # after the bursts replica-1 led (VmHWM 143); before them replica-0 (134)
    assert g.leader_hwm(part) == 143.0
    assert g.leader_hwm({"memory": {"r": {"leader": False, "hwm_mib": 9.0}}}) is None


def test_one_size_or_a_missing_figure_gives_none_not_an_error():
    report = {"sizes": {"20": _part(81.0, 129.0, 144.0, 160)},
              "device_sizes": {"10": _part(81.0, 129.0, 144.0, 80),
                               "20": {**_part(81.0, 129.0, 144.0, 80), "quiet": {"1": {
                                   "p50_ms": None, "p99_ms": None}}}}}
    got = g.growth(report)
    assert (got["count"]["p50_ratio"], got["count"]["p50_target"]["met"],
            got["count"]["rss_per_1000_devices_mib"]) == (None, None, None)
    dev = got["device"]   # every 1-GPU admission refused at 20; the same device count
    assert (dev["p50_ratio"], dev["p99_ratio"], dev["p50_target"]["met"],
            dev["rss_per_1000_devices_mib"]) == (None, None, None, None)
    assert g.growth({"sizes": {}, "device_sizes": {}}) == {}


def test_rows_only_when_a_mode_has_two_sizes():
    assert g.rows({"growth": g.growth({"sizes": {"20": _part(81.0, 129.0, 144.0, 160)}})}) == []
    assert g.rows({}) == []   # a report from before the growth section


def test_summary_ends_with_the_growth_rows_and_the_figure_is_drawn(tmp_path):
    report = _report()
    report["targets"] = {}
    rows = summary(report)
    report["sizes"]["100"]["quiet"]["1"].update(admitted=7, asked=8)   # a full fleet refuses
    report["growth"] = g.growth(report)
    rows = summary(report)
    at = rows.index("| growth: mode | nodes | devices | quiet 1-GPU p50/p99 ms | "
                    "admitted/asked | leader VmHWM MiB | load |")
    assert rows[at + 2:at + 7] == ["| count | 100 | 800 | 81.0/129.0 | 7/8 | 144.0 | 1.5 |",
                                   "| count | 300 | 2400 | 90.0/150.0 | 60/60 | 180.0 | 1.5 |",
                                   "| count | 1000 | 8000 | 107.0/244.0 | 60/60 | 259.0 | 1.5 |",
                                   "| device | 100 | 800 | 200.0/300.0 | 60/60 | 160.0 | 1.5 |",
                                   "| device | 1000 | 8000 | 240.7/448.3 | 60/60 | 299.9 | 1.5 |"]
    assert rows[at + 7:] == [
        "growth count mode: quiet 1-GPU p50 at 1000 nodes ÷ at 100: 1.32 (<= 1.2x): NOT met; "
        "p99 1.89; RSS per 1,000 devices 16.0 MiB (leader VmHWM 144.0 -> 259.0 MiB, "
        "800 -> 8000 devices)",
        "growth device mode: quiet 1-GPU p50 at 1000 nodes ÷ at 100: 1.2 (<= 1.2x): NOT met; "
        "p99 1.49; RSS per 1,000 devices 19.4 MiB (leader VmHWM 160.0 -> 299.9 MiB, "
        "800 -> 8000 devices)"]
    g.plot(report, tmp_path / "growth.png")
    assert (tmp_path / "growth.png").stat().st_size > 10_000


def test_run_measures_every_mode_at_every_size_on_a_cluster_of_its_own(tmp_path, monkeypatch):
    """`run(sizes=...)`: one cluster per (size, mode), smallest size first and the modes in
    the order given; the spec scaled from the largest; nodes/baseline_nodes the largest and
    the smallest for the targets; growth section, scale.json and growth.png written."""
    from bench.scale import measure

    clusters = []

    def fake(sp, plan, logs, kwok_args):
        clusters.append((sp.nodes, sp.mode, sp.vmis, logs.name))
        return _part(100.0 + sp.nodes / 10, 200.0, 100.0 + sp.nodes / 10, sp.nodes * 8)
    monkeypatch.setattr(measure, "_measure_cluster", fake)
    report = measure.run(tmp_path, sizes=(20, 10), vmis=30, modes=("device", "count"),
                         plan=measure.Plan(quiet={1: 2}, bursts=(2,)))
    assert clusters == [(10, "device", 15, "10-device"), (10, "count", 15, "10"),
                        (20, "device", 30, "20-device"), (20, "count", 30, "20")]
    assert (report["nodes"], report["baseline_nodes"], report["node_sizes"]) == (20, 10, [10, 20])
    assert list(report["sizes"]) == list(report["device_sizes"]) == ["10", "20"]
    assert report["growth"]["count"]["p50_ratio"] == 1.01            # 102 / 101
    assert report["growth"]["device"]["rss_per_1000_devices_mib"] == 12.5  # 1 MiB / 80 devices
    assert "1-GPU admission p99, quiet" in report["targets"]          # count mode's at 20
    assert "device mode: 1-GPU admission p99, quiet" in report["targets"]
    assert json.loads((tmp_path / "scale.json").read_text())["growth"] == report["growth"]
    assert (tmp_path / "growth.png").stat().st_size > 10_000


def test_run_without_sizes_measures_as_before(tmp_path, monkeypatch):
    """No `sizes`: count mode at baseline_nodes then nodes, device mode at nodes only; one
    size per mode measured at 20, so no growth figure beyond count mode's two sizes."""
    from bench.scale import measure

    clusters = []

    def fake(sp, plan, logs, kwok_args):
        clusters.append((sp.nodes, sp.mode))
        return _part(100.0, 200.0, 150.0, sp.nodes * 8)
    monkeypatch.setattr(measure, "_measure_cluster", fake)
    report = measure.run(tmp_path, nodes=20, baseline_nodes=10, modes=("count", "device"),
                         plan=measure.Plan(quiet={1: 2}, bursts=(2,)))
    assert clusters == [(10, "count"), (20, "count"), (20, "device")]
    assert (report["node_sizes"], list(report["device_sizes"])) == (None, ["20"])
    assert report["growth"]["device"]["p50_ratio"] is None
    report = measure.run(tmp_path / "one", nodes=20, baseline_nodes=None, modes=("count",),
                         plan=measure.Plan(quiet={1: 2}, bursts=(2,)))
    assert not (tmp_path / "one" / "growth.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "100,x"], "--sizes takes positive integers separated by commas, got '100,x'"),
    (["--sizes", "10,20", "--nodes", "5"], "--sizes replaces --nodes and --baseline-nodes"),
    (["--sizes", "10,20", "--modes", "count,dra"], "--modes takes count and/or device"),
])
def test_the_command_line_refuses_a_bad_sizes_before_anything_starts(capsys, tmp_path, argv,
                                                                     message):
    from cli.main import main

    assert main(["bench", "scale", "--quick", *argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.anyio
async def test_the_quiet_admissions_wait_for_the_load_to_settle_and_say_at_what_load(monkeypatch):
    """`measure.settle`: polls the 1-minute load until it is at most `Plan.settle_load`
    (returns at once when it is), gives up after `Plan.settle_s` (bounded) and reports the
    load it began at and the one the quiet admissions start at; the growth point reads that
    load, not the one after population."""
    from bench.scale import measure

    loads = iter([7.5, 7.5, 4.0, 1.9, 1.9])
    monkeypatch.setattr(measure.os, "getloadavg", lambda: (next(loads), 1.0, 1.0))
    got = await measure.settle(measure.Plan(settle_load=2.0, settle_s=30.0), poll_s=0.001)
    assert (got["load_before"], got["load_at_quiet"], got["settled"]) == (7.5, 1.9, True)
    monkeypatch.setattr(measure.os, "getloadavg", lambda: (9.0, 1.0, 1.0))
    got = await measure.settle(measure.Plan(settle_load=2.0, settle_s=0.05), poll_s=0.01)
    assert (got["load_at_quiet"], got["settled"]) == (9.0, False) and got["waited_s"] < 5
    part = {**_part(100.0, 200.0, 150.0, 800, load=8.9), "settle": {"load_at_quiet": 1.7}}
    assert g._point(part)["load"] == 1.7
    assert g._point(_part(100.0, 200.0, 150.0, 800, load=8.9))["load"] == 8.9


def _named(part: dict, *, webhook: float, rounds: tuple[int, int], phases: dict, api: dict,
           cpu: dict, cores: dict, idle: dict, idle_rps: dict) -> dict:
    """`part` with the figures `where` reads: the quiet 1-GPU `inside` as `measure.quiet`
    writes it (`quiet_inside`) and the idle window (`idle_figures`); `rounds`: the leader's
    housekeeping rounds over the quiet admissions and in the idle window."""
    part["quiet"]["1"]["inside"] = {
        "webhook_mean_ms": webhook, "decision_mean_ms": 1.3, "client_mean_ms": webhook + 20,
        "housekeeping_rounds": rounds[0],
        "apiserver": {k: {"requests": 60, "mean_ms": v} for k, v in api.items()},
        "phase_ms": phases, "cpu": {"ms_per_admission": cpu, "process_cores": cores}}
    part["idle"] = {"seconds": 10.0, "cores": idle, "apiserver_requests_per_s": idle_rps,
                    "replicas": {"decisions": 0, "housekeeping_rounds": rounds[1]}}
    return part


def _named_report() -> dict:
    """Device mode at 100 and 1,000 boards; replica-0 led at 100, replica-1 at 1,000."""
    small = _named(_part(47.7, 84.9, 137.8, 800), webhook=30.8, rounds=(120, 2),
                   phases={"wait-result": 12.0, "attach": 6.0, "own": 4.0, "total": 30.8},
                   api={"POST gpudevices": 3.8, "WATCH virtualmachineinstances": 90000.0},
                   cpu={"replica-0 (leader)": 8.6, "replica-1 (follower)": 1.0,
                        "kube-apiserver": 20.0, "total": 29.6},
                   cores={"replica-0 (leader)": 0.1, "kube-apiserver": 0.3, "total": 0.4},
                   idle={"replica-0 (leader)": 0.01, "kube-apiserver": 0.05, "kwok": 0.02,
                         "total": 0.08},
                   idle_rps={"PUT leases": 10.0, "total": 10.5})
    large = _named(_part(60.6, 204.0, 265.3, 8000), webhook=50.6, rounds=(150, 3),
                   phases={"wait-result": 20.0, "attach": 7.5, "own": 12.0, "total": 50.6},
                   api={"POST gpudevices": 6.3, "GET virtualmachineinstances": 5.8},
                   cpu={"replica-1 (leader)": 11.3, "replica-0 (follower)": 1.1,
                        "kube-apiserver": 24.0, "total": 36.4},
                   cores={"replica-1 (leader)": 0.12, "kube-apiserver": 0.5, "total": 0.62},
                   idle={"replica-1 (leader)": 0.04, "kube-apiserver": 0.45, "kwok": 0.2,
                         "total": 0.69},
                   idle_rps={"PUT leases": 100.0, "PATCH nodes/status": 3.0, "total": 103.5})
    report = {"device_sizes": {"100": small, "1000": large}}
    report["growth"] = g.growth(report)
    return report


def test_where_the_growth_went_per_phase_and_per_process_smallest_against_largest():
    """Issue 40 item 3: the p50 grew 47.7 -> 60.6 ms at 100 -> 1,000 boards; `where` names
    it per webhook phase (ms per admission), kube-apiserver call, and process (CPU per
    admission, cores over the admissions, background cores idle), the replicas matched by
    role (the leader at 1,000 boards was the other replica), the largest change first."""
    w = _named_report()["growth"]["device"]["where"]
    assert w["p50_ms"] == {"small": 47.7, "large": 60.6, "delta": 12.9}
    assert list(w["inside"].items()) == [
        ("housekeeping_rounds", {"small": 120, "large": 150, "delta": 30}),
        ("client_mean_ms", {"small": 50.8, "large": 70.6, "delta": 19.8}),
        ("webhook_mean_ms", {"small": 30.8, "large": 50.6, "delta": 19.8}),
        ("idle_housekeeping_rounds", {"small": 2, "large": 3, "delta": 1}),
        ("decision_mean_ms", {"small": 1.3, "large": 1.3, "delta": 0.0})]
    assert list(w["phases"].items()) == [
        ("total", {"small": 30.8, "large": 50.6, "delta": 19.8}),
        ("own", {"small": 4.0, "large": 12.0, "delta": 8.0}),
        ("wait-result", {"small": 12.0, "large": 20.0, "delta": 8.0}),
        ("attach", {"small": 6.0, "large": 7.5, "delta": 1.5})]
    assert w["apiserver"] == {"POST gpudevices": {"small": 3.8, "large": 6.3, "delta": 2.5},
                              "GET virtualmachineinstances": {"small": None, "large": 5.8,
                                                              "delta": None}}
    assert list(w["cpu_ms_per_admission"]) == ["total", "kube-apiserver", "leader", "follower"]
    assert w["cpu_ms_per_admission"]["leader"] == {"small": 8.6, "large": 11.3, "delta": 2.7}
    assert w["quiet_cores"]["leader"] == {"small": 0.1, "large": 0.12, "delta": 0.02}
    assert list(w["idle_cores"].items())[:3] == [
        ("total", {"small": 0.08, "large": 0.69, "delta": 0.61}),
        ("kube-apiserver", {"small": 0.05, "large": 0.45, "delta": 0.4}),
        ("kwok", {"small": 0.02, "large": 0.2, "delta": 0.18})]
    assert w["idle_cores"]["leader"] == {"small": 0.01, "large": 0.04, "delta": 0.03}
    assert w["idle_requests_per_s"]["PUT leases"] == {"small": 10.0, "large": 100.0,
                                                      "delta": 90.0}


def test_the_text_report_prints_where_the_p50_growth_went():
    rows = g.rows(_named_report())
    at = next(i for i, r in enumerate(rows) if r.startswith("growth device mode: quiet"))
    assert rows[at + 1:] == [
        "growth device mode, where the p50 growth went (100 -> 1000 nodes): p50 47.7 -> 60.6 "
        "ms (+12.9)",
        "  means ms and housekeeping rounds: housekeeping_rounds 120 -> 150 (+30), "
        "client_mean_ms 50.8 -> 70.6 (+19.8), webhook_mean_ms 30.8 -> 50.6 (+19.8), "
        "idle_housekeeping_rounds 2 -> 3 (+1), decision_mean_ms 1.3 -> 1.3 (+0)",
        "  webhook phases, ms per admission: total 30.8 -> 50.6 (+19.8), own 4 -> 12 (+8), "
        "wait-result 12 -> 20 (+8), attach 6 -> 7.5 (+1.5)",
        "  kube-apiserver mean ms per call: POST gpudevices 3.8 -> 6.3 (+2.5), "
        "GET virtualmachineinstances - -> 5.8 (-)",
        "  CPU ms per quiet admission: total 29.6 -> 36.4 (+6.8), kube-apiserver 20 -> 24 "
        "(+4), leader 8.6 -> 11.3 (+2.7), follower 1 -> 1.1 (+0.1)",
        "  cores busy over the quiet admissions: total 0.4 -> 0.62 (+0.22), kube-apiserver "
        "0.3 -> 0.5 (+0.2), leader 0.1 -> 0.12 (+0.02)",
        "  background cores, idle: total 0.08 -> 0.69 (+0.61), kube-apiserver 0.05 -> 0.45 "
        "(+0.4), kwok 0.02 -> 0.2 (+0.18), leader 0.01 -> 0.04 (+0.03)",
        "  kube-apiserver requests/s, idle: total 10.5 -> 103.5 (+93), PUT leases 10 -> 100 "
        "(+90), PATCH nodes/status - -> 3 (-)"]


def test_an_older_report_without_the_figures_has_empty_sections_and_no_lines():
    report = _report()   # parts without `inside` or `idle`, as before issue 40 item 3
    w = report["growth"]["count"]["where"]
    assert w["p50_ms"] == {"small": 81.0, "large": 107.0, "delta": 26.0}
    assert all(w[k] == {} for k in w if k != "p50_ms")
    assert g.where_lines("count", report["growth"]["count"]) == []
    one = g.growth({"sizes": {"20": _part(81.0, 129.0, 144.0, 160)}})["count"]
    assert one["where"] is None and g.where_lines("count", one) == []
