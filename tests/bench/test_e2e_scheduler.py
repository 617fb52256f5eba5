"""bench e2e's kube-scheduler (`bench.e2e.scheduler_command`) runs with the feature gates the
local cluster gives kube-apiserver, kube-controller-manager and its own kube-scheduler
(`localcluster.controlplane.FEATURE_GATES`), so the benchmark's scheduler honours
DeviceTaintRules (HL1/HL2) as the product's test cluster does. Pure: no process started."""

from __future__ import annotations

from pathlib import Path

from bench.e2e import scheduler_command
from localcluster.controlplane import FEATURE_GATES


def test_the_benchmarks_scheduler_gets_the_local_clusters_feature_gates():
    cmd = scheduler_command(Path("/bin/kube-scheduler"), Path("/tmp/w/kube-scheduler.yaml"))
    assert cmd[0] == "/bin/kube-scheduler"
    assert "--config=/tmp/w/kube-scheduler.yaml" in cmd and "--secure-port=0" in cmd
    (gates,) = [a for a in cmd if a.startswith("--feature-gates=")]
    assert gates == f"--feature-gates={FEATURE_GATES}"
    assert "DRADeviceTaintRules=true" in gates.split("=", 1)[1].split(",")
