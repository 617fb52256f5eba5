"""A relative log folder (`bench contention`'s default `--out bench-out`) works: the harness's
processes run with their log folder as working directory (`spawn_logged`'s cwd), so every path
they are given must name the file from there, not from the caller's working directory.

On the old code `gpu-binder bench contention` (default `--out bench-out`) stopped at once:
kube-controller-manager "stat bench-out/logs/kube-controller-manager.kubeconfig: no such file or
directory"."""
from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from localcluster import claimcontroller
from localcluster.cluster import LocalCluster
from localcluster.kubevirt import KubeVirt


class _Spawned(Exception):
    """Raised by the fake spawn_logged to stop start() once the arguments are seen."""


def _fake_cp(tmp_path: Path) -> SimpleNamespace:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    kcm = bindir / "kube-controller-manager"
    kcm.write_text("#!/bin/sh\n")
    kcm.chmod(0o755)

    def write_user_kubeconfig(path: Path, user: str) -> Path:
        Path(path).write_text(f"user: {user}\n")
        return Path(path)

    return SimpleNamespace(
        dir=tmp_path / "cp",
        binaries=SimpleNamespace(kube_apiserver=str(bindir / "kube-apiserver")),
        kubectl=lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout="token\n", stderr=""),
        write_user_kubeconfig=write_user_kubeconfig,
        server="https://127.0.0.1:1",
        ca=SimpleNamespace(cert_pem=base64.b64encode(b"ca")),
    )


def test_claim_controller_kubeconfig_found_from_its_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bench-out/logs").mkdir(parents=True)
    seen = {}

    def spawn(directory, name, args):
        seen.update(directory=Path(directory), args=args)
        raise _Spawned

    monkeypatch.setattr(claimcontroller, "spawn_logged", spawn)
    cc = claimcontroller.ClaimController(_fake_cp(tmp_path), Path("bench-out/logs"))
    with pytest.raises(_Spawned):
        cc.start()
    (kubeconfig,) = [a.split("=", 1)[1] for a in seen["args"] if a.startswith("--kubeconfig=")]
    # the child opens it relative to its cwd, `directory`
    assert (seen["directory"] / kubeconfig).is_file()
    assert os.path.isabs(kubeconfig)


def test_kubevirt_token_kubeconfig_found_from_its_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kv = KubeVirt(_fake_cp(tmp_path), bins=SimpleNamespace(), log_dir=Path("bench-out/logs/kubevirt"))
    path = kv._token_kubeconfig("kubevirt-controller")
    assert (kv.dir / path).is_file()       # as virt-controller, started in kv.dir, reads it
    assert kv.dir == tmp_path / "bench-out/logs/kubevirt"


def test_cluster_log_dir_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = LocalCluster(control_plane=_fake_cp(tmp_path), log_dir=Path("bench-out/logs"))
    # the replicas run in the source tree: their --log-dir must not be relative to it
    assert c.log_dir == tmp_path / "bench-out/logs"
