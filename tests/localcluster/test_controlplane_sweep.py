"""A control plane's work directory left behind by a SIGKILLed owner (etcd data, the PKI with
its CA key, the admin kubeconfig) is removed by the next ControlPlane; live owners' and
unrecorded directories are kept (localcluster.controlplane.sweep_stale_workdirs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from localcluster.controlplane import OWNER_FILE, _process_start_ticks, sweep_stale_workdirs


def _workdir(root, name, owner=None):
    d = root / f"gpu-binder-cp-{name}"
    (d / "pki").mkdir(parents=True)
    (d / "pki" / "ca.key").write_text("secret")
    if owner is not None:
        (d / OWNER_FILE).write_text(json.dumps(owner))
    return d


def test_a_killed_owners_dir_is_swept_and_live_or_unrecorded_dirs_are_kept(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    dead_owner = {"pid": victim.pid, "start": _process_start_ticks(victim.pid)}
    assert dead_owner["start"] is not None
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    me = {"pid": os.getpid(), "start": _process_start_ticks(os.getpid())}
    killed = _workdir(tmp_path, "killed", dead_owner)
    recycled = _workdir(tmp_path, "recycled", {"pid": os.getpid(), "start": me["start"] + 1})
    live = _workdir(tmp_path, "live", me)
    unrecorded = _workdir(tmp_path, "unrecorded")
    garbled = _workdir(tmp_path, "garbled")
    (garbled / OWNER_FILE).write_text("{not json")
    other = tmp_path / "not-ours"
    other.mkdir()

    removed = sweep_stale_workdirs(tmp_path)

    assert sorted(p.name for p in removed) == ["gpu-binder-cp-killed", "gpu-binder-cp-recycled"]
    assert not killed.exists() and not recycled.exists()
    assert live.exists() and unrecorded.exists() and garbled.exists() and other.exists()
    assert sweep_stale_workdirs(tmp_path) == []


def test_a_control_plane_records_its_owner_and_its_stop_removes_the_dir(tmp_path, monkeypatch):
    from localcluster import controlplane

    monkeypatch.setattr(controlplane.tempfile, "tempdir", str(tmp_path))
    cp = controlplane.ControlPlane(binaries=controlplane.Binaries(
        etcd=tmp_path / "etcd", kube_apiserver=tmp_path / "kube-apiserver", kubectl=tmp_path / "kubectl"))
    owner = json.loads((cp.dir / OWNER_FILE).read_text())
    assert cp.dir.parent == tmp_path
    assert owner == {"pid": os.getpid(), "start": _process_start_ticks(os.getpid())}
    assert sweep_stale_workdirs(tmp_path) == []  # its owner (this process) runs
    cp.stop()
    assert not cp.dir.exists()
