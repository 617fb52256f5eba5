"""`gpu-binder bench scale`'s report with a device-mode fleet (issue 32) without a cluster:
the device-mode spec's one class and its VMIs, the device-mode targets (1-GPU quiet p99 <
500 ms, replica VmHWM < 350 MiB) beside count mode's with the ratio to count mode, a
device-only report without count mode's targets, and every measured cluster in the summary
and the plot. The runs themselves are the benchmark's (docs/benchmarks.md, Scale)."""

from __future__ import annotations

from bench import scale
from bench.scale.report import parts


def _part(p99_1: float, hwm: float) -> dict:
    mem = {"replica-0": {"leader": True, "rss_mib": hwm - 5, "hwm_mib": hwm},
           "replica-1": {"leader": False, "rss_mib": hwm - 20, "hwm_mib": hwm - 10}}
    return {"population": {"vmis_running": 40, "gpudevices": 160, "seconds": {"total": 30.0}},
            "quiet": {"1": {"p50_ms": p99_1 / 2, "p99_ms": p99_1},
                      "4": {"p50_ms": 150.0, "p99_ms": 300.0},
                      "8": {"p50_ms": 200.0, "p99_ms": 400.0}},
            "bursts": {"10": {"p50_ms": 300.0, "p99_ms": 600.0}},
            "memory": mem, "memory_after_bursts": mem,
            "startup": {"to_ready_s": 4.2, "after_5s": {"rss_mib": 100.0, "hwm_mib": 110.0}},
            "failover": {"to_next_admitted_s": 9.5, "to_new_leader_s": 8.0,
                         "answers": [{"t_s": 9.5, "probe": True, "admitted": True}]}}


def _report(count: bool = True) -> dict:
    report = {"nodes": 20, "baseline_nodes": 10, "modes": ["count", "device"],
              "sizes": {"10": _part(100.0, 150.0), "20": _part(200.0, 250.0)} if count else {},
              "device_sizes": {"20": _part(300.0, 340.0)}}
    report["targets"] = scale.targets(report)
    return report


def test_device_mode_spec_is_one_device_mode_class_over_the_dra_quota_key():
    spec = scale.ScaleSpec(mode="device").scaled(20)
    assert spec.mode == "device" and spec.nodes == 20
    assert spec.classes == {"sc-hgx": "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices"}
    vmis = scale.plan_vmis(spec, ["t0", "t1"])
    assert len(vmis) == 40 and {v.cls for v in vmis} == {"sc-hgx"}
    assert {v.size for v in vmis} <= {1, 2, 4, 8}   # every size is a Fabric Manager partition


def test_device_targets_beside_count_mode_with_the_ratio_to_it():
    t = _report()["targets"]
    assert t["device mode: 1-GPU admission p99, quiet"] == {
        "value": 300.0, "unit": "ms", "target": "< 500 ms", "met": True, "count_mode": 200.0,
        "ratio_to_count": 1.5}
    rss = t["device mode: replica peak RSS (VmHWM)"]
    assert (rss["value"], rss["target"], rss["met"], rss["count_mode"]) == (340.0, "< 350 MiB", True, 250.0)
    assert t["1-GPU admission p99, quiet"]["ratio_to_baseline"] == 2.0   # count mode's, as before


def test_device_only_report_has_only_the_device_targets():
    t = _report(count=False)["targets"]
    assert set(t) == {"device mode: 1-GPU admission p99, quiet",
                      "device mode: replica peak RSS (VmHWM)"}
    assert t["device mode: replica peak RSS (VmHWM)"]["count_mode"] is None


def test_summary_and_plot_show_every_measured_cluster(tmp_path):
    report = _report()
    assert [n for n, _ in parts(report)] == ["10", "20", "20 device"]
    rows = scale.summary(report)
    assert rows[4].startswith("| 20 device | 40 | 160 | 30.0 | 150.0/300.0 ·")
    assert ("target device mode: 1-GPU admission p99, quiet: 300.0 ms (< 500 ms; 1.5× count "
            "mode's 200.0): met") in rows
    scale.plot(report, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").stat().st_size > 10_000
