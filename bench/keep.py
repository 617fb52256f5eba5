"""H4 benchmark: stop -> start latency of a VirtualMachine that keeps its GPU set, over N
cycles, while another tenant fills the fleet (not a timed test: it reports, it asserts
nothing about time).

It runs the e2e scenario `tests/e2e/test_vm_keep.py::…20_times…` (the shared KubeVirt,
virt-controller, virt-api, kube-scheduler, KWOK nodes, two controller replicas) through
pytest with `GPU_BINDER_KEEP_CYCLES=N` and `GPU_BINDER_KEEP_REPORT=<json>`, then prints the
distribution of each figure (per cycle: start request -> VMI admitted, -> launcher Pod
bound; stop request -> set kept) with the machine's load (`uptime`) before and after, and
writes `keep.json` into the output folder.

`--mode device` runs device mode's scenario instead (`tests/e2e/test_vm_keep_devices.py`,
HGX nodes, kube-scheduler allocating the VM's claim; `GPU_BINDER_KEEP_DEVICE_CYCLES`,
`GPU_BINDER_KEEP_DEVICE_REPORT`), writes `keep-device.json`, and adds, from the test's
per-cycle record of node, allocated devices and pinned uuids, whether every start was on the
first start's node with its devices and uuids.

    /tmp/heavy .venv/bin/python -m bench.keep --cycles 20 --out bench-results
    /tmp/heavy .venv/bin/python -m bench.keep --mode device --cycles 20 --out bench-results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bench.common import Benchmark, commit, machine, percentile

TEST = "tests/e2e/test_vm_keep.py::test_H4_vm_stopped_and_started_20_times_keeps_its_set_while_another_tenant_fills_the_fleet"
DEVICE_TEST = ("tests/e2e/test_vm_keep_devices.py::"
               "test_H4_device_mode_vm_keeps_its_claim_and_exact_devices_across_5_stops_while_another_tenant_fills")
MODES = {  # mode: (test, its cycles variable, its report variable, the output file)
    "count": (TEST, "GPU_BINDER_KEEP_CYCLES", "GPU_BINDER_KEEP_REPORT", "keep.json"),
    "device": (DEVICE_TEST, "GPU_BINDER_KEEP_DEVICE_CYCLES", "GPU_BINDER_KEEP_DEVICE_REPORT",
               "keep-device.json"),
}
FIGURES = ("start_to_admitted", "start_to_launcher_bound", "stop_to_kept")


def loadavg() -> list[float]:
    """The machine's load averages [1, 5, 15 min] (what bench-results' table reads)."""
    return [round(x, 2) for x in os.getloadavg()]


def summary(values: list[float]) -> dict:
    """min, p50, p90, p99, max and mean (seconds) of `values`."""
    vs = sorted(values)
    return {"n": len(vs), "min": vs[0], "p50": percentile(vs, 50), "p90": percentile(vs, 90),
            "p99": percentile(vs, 99), "max": vs[-1], "mean": sum(vs) / len(vs)}


def same_every_cycle(got: dict) -> bool:
    """H4 in device mode, from the test's report: every cycle's start on the first start's
    node, with its allocated devices and its pinned uuids (and at least one cycle)."""
    first = got["first"]
    return bool(got["per_cycle"]) and all(
        (c["node"], c["allocated"], c["uuids"]) == (first["node"], first["allocated"], first["uuids"])
        for c in got["per_cycle"])


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cycles", type=int, default=20,
                    help="stop/start cycles of the VM (default: %(default)s)")
    ap.add_argument("--out", default="bench-results",
                    help="directory of keep.json / keep-device.json (default: %(default)s)")
    ap.add_argument("--mode", choices=sorted(MODES), default="count",
                    help="count or device: the scenario run (default: %(default)s)")


def _run(args: argparse.Namespace) -> int:
    """1 when the scenario failed (no figures)."""
    test, cycles_var, report_var, out_name = MODES[args.mode]
    started = datetime.now(UTC).isoformat(timespec="seconds")
    before = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "keep.json"
        env = {**os.environ, cycles_var: str(args.cycles), report_var: str(report)}
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                             test], env=env).returncode
        if rc != 0 or not report.exists():
            print(f"the scenario failed (pytest exit {rc}); no figures", file=sys.stderr)
            return 1
        got = json.loads(report.read_text())
    after = loadavg()
    figures = {k: summary(got[k]) for k in FIGURES}
    out = {"benchmark": "keep", "mode": args.mode, "started_at": started, "commit": commit(),
           "machine": machine(), "load_before": before, "load_after": after,
           "cycles": got["cycles"], "node": got["node"],
           "other_tenant_refusals": got["other_tenant_refusals"], "figures": figures,
           "raw": {k: got[k] for k in figures}}
    if args.mode == "device":
        same = same_every_cycle(got)
        out.update(same_node_and_uuids_every_cycle=same, first=got["first"],
                   per_cycle=got["per_cycle"])
        print(f"H4 keep, device mode: {got['cycles']} stop/start cycles, the fleet full of another "
              f"tenant's VMIs; first start on {got['first']['node']}, devices "
              f"{[d for _, d in got['first']['allocated']]}, uuids {got['first']['uuids']}")
        print(f"same node and same uuids in every cycle: {'yes' if same else 'no'}")
    else:
        print(f"H4 keep: {got['cycles']} stop/start cycles, the same node ({got['node']}) and devices "
              "every time, the fleet full of another tenant's VMIs")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / out_name).write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'figure (s)':<26}{'min':>7}{'p50':>7}{'p90':>7}{'max':>7}{'mean':>7}")
    for k, f in figures.items():
        print(f"{k:<26}{f['min']:>7.2f}{f['p50']:>7.2f}{f['p90']:>7.2f}{f['max']:>7.2f}{f['mean']:>7.2f}")
    print(f"load before: {before}")
    print(f"load after:  {after}")
    return 0



BENCHMARK = Benchmark("keep", "H4: stop -> start latency of a VirtualMachine that keeps its "
                              "GPU set, while another tenant fills the fleet", _arguments, _run)


if __name__ == "__main__":
    sys.exit(BENCHMARK.main())
