"""helm for the e2e tests of the chart: the CLI built by tools/build-helm.sh with homes of
its own (the session fixture `helm`; a test module imports it), rendering charts/gpu-binder,
and the chart settings matching conftest's fast controller timings."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from localcluster.controlplane import built_dir
from tests.e2e.conftest import REPO

CHART = REPO / "charts" / "gpu-binder"
BUILD = REPO / "tools" / "build-helm.sh"
NS = "cozy-system"
RELEASE = "gpu-binder"


class Helm:
    """The built helm CLI with its own config/cache/data homes (nothing under ~)."""

    def __init__(self, binary: Path, home: Path, crds: Path) -> None:
        self.binary = binary
        self.cert_manager_crds = crds
        self.env = dict(os.environ, HELM_CACHE_HOME=str(home / "cache"),
                        HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))

    def run(self, *args: str, check: bool = True, kubeconfig: Path | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        cmd = [str(self.binary), *args]
        if kubeconfig:
            cmd.append(f"--kubeconfig={kubeconfig}")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, input=input,
                              timeout=180)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stderr}{proc.stdout[-2000:]}")
        return proc

    def template(self, values: dict, *, namespace: str = NS,
                 check: bool = True) -> subprocess.CompletedProcess:
        """`helm template` of the chart (CRDs included) with `values`."""
        return self.run("template", RELEASE, str(CHART), f"--namespace={namespace}",
                        "--include-crds", "--values=-", input=yaml.safe_dump(values),
                        check=check)

    def objects(self, values: dict | None = None, *, namespace: str = NS) -> list[dict]:
        """The rendered objects."""
        return [d for d in yaml.safe_load_all(self.template(values or {},
                                                            namespace=namespace).stdout) if d]


@pytest.fixture(scope="session")
def helm(tmp_path_factory) -> Helm:
    """helm built by tools/build-helm.sh (a cold build takes minutes; cached by version)."""
    out = built_dir(BUILD, "GPU_BINDER_HELM_DIR")
    return Helm(out / "helm", tmp_path_factory.mktemp("helm-home"), out / "cert-manager-crds")


# conftest.FAST_CONTROLLER_ARGS as chart settings
FAST_SETTINGS = {"leaseDuration": 4, "renewDeadline": 3, "retryPeriod": 0.5,
                 "attachmentGrace": 8, "bindTimeout": 6, "housekeepingPeriod": 1}
