"""H4 benchmark: stop -> start latency of a VirtualMachine that keeps its GPU set, over N
cycles, while another tenant fills the fleet (not a timed test: it reports, it asserts
nothing about time).

It runs the e2e scenario `tests/e2e/test_vm_keep.py::…20_times…` (the shared KubeVirt,
virt-controller, virt-api, kube-scheduler, KWOK nodes, two controller replicas) through
pytest with `GPU_BINDER_KEEP_CYCLES=N` and `GPU_BINDER_KEEP_REPORT=<json>`, then prints the
distribution of each figure (per cycle: start request -> VMI admitted, -> launcher Pod
bound; stop request -> set kept) with the machine's load (`uptime`) before and after, and
writes `keep.json` into the output folder.

    /tmp/heavy .venv/bin/python -m bench.keep --cycles 20 --out bench-results
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

from bench.common import commit, machine, percentile

TEST = "tests/e2e/test_vm_keep.py::test_H4_vm_stopped_and_started_20_times_keeps_its_set_while_another_tenant_fills_the_fleet"


def loadavg() -> list[float]:
    """The machine's load averages [1, 5, 15 min] (what bench-results' table reads)."""
    return [round(x, 2) for x in os.getloadavg()]


def summary(values: list[float]) -> dict:
    """min, p50, p90, p99, max and mean (seconds) of `values`."""
    vs = sorted(values)
    return {"n": len(vs), "min": vs[0], "p50": percentile(vs, 50), "p90": percentile(vs, 90),
            "p99": percentile(vs, 99), "max": vs[-1], "mean": sum(vs) / len(vs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args(argv)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    before = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "keep.json"
        env = {**os.environ, "GPU_BINDER_KEEP_CYCLES": str(args.cycles),
               "GPU_BINDER_KEEP_REPORT": str(report)}
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                             TEST], env=env).returncode
        if rc != 0 or not report.exists():
            print(f"the scenario failed (pytest exit {rc}); no figures", file=sys.stderr)
            return 1
        got = json.loads(report.read_text())
    after = loadavg()
    figures = {k: summary(got[k]) for k in ("start_to_admitted", "start_to_launcher_bound",
                                            "stop_to_kept")}
    out = {"benchmark": "keep", "started_at": started, "commit": commit(),
           "machine": machine(), "load_before": before, "load_after": after,
           "cycles": got["cycles"], "node": got["node"],
           "other_tenant_refusals": got["other_tenant_refusals"], "figures": figures,
           "raw": {k: got[k] for k in figures}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "keep.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"H4 keep: {got['cycles']} stop/start cycles, the same node ({got['node']}) and devices "
          "every time, the fleet full of another tenant's VMIs")
    print(f"{'figure (s)':<26}{'min':>7}{'p50':>7}{'p90':>7}{'max':>7}{'mean':>7}")
    for k, f in figures.items():
        print(f"{k:<26}{f['min']:>7.2f}{f['p50']:>7.2f}{f['p90']:>7.2f}{f['max']:>7.2f}{f['mean']:>7.2f}")
    print(f"load before: {before}")
    print(f"load after:  {after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
