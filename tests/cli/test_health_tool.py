"""`gpu-binder health` and `health clear DEVICE` (cli/health.py, HL2): the list with its
evidence, who cleared (the kubeconfig context's user), and a device that is not suspected
(exit 2, one clear line). The API calls are replaced at `_marks`/`_clear`; the e2e test
(tests/e2e/test_health.py) runs them against a real API server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

import cli.health as health
from cli.main import main
from model.device.dra import DeviceRef
from model.health import Evidence, FailedStart, HealthSettings, Target
from model.health_mark import mark_entry, parse_marks, parse_rule_mark, rule_body

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=timezone.utc)
REF = DeviceRef("gpu.nvidia.com", "hgx-node-01", "gpu-vfio-3")

def _suspect():
    ev = Evidence()
    for i, name in enumerate("abc"):
        ev = ev.record([Target("hgx-node-01", "hgx-h100", REF)],
                       FailedStart("t", f"vm-{name}", f"u-{name}", T0 + timedelta(minutes=i),
                                   f"launcher Pod virt-launcher-vm-{name}-x Failed (Error)"))
    return ev.suspects(T0 + timedelta(minutes=3), HealthSettings())[0]


def _rule():
    body = rule_body(_suspect(), T0 + timedelta(minutes=3))
    body["metadata"]["uid"] = "rule-uid"
    return body


@pytest.fixture
def cluster(monkeypatch):
    """The rule as the API server would list it; the clears made, recorded."""
    rule = _rule()
    cleared: list[tuple] = []

    async def marks(api, namespace):
        return (parse_rule_mark(rule),), {rule["metadata"]["name"]: rule}, None

    async def clear(api, mark, rules, cm, namespace, user, context):
        cleared.append((mark.name, rules[mark.name]["metadata"]["uid"], user, context))

    monkeypatch.setattr(health, "_marks", marks)
    monkeypatch.setattr(health, "_clear", clear)
    return cleared


def test_health_lists_each_suspect_with_its_evidence(capsys, kubeconfig, cluster):
    assert main(["health", "--kubeconfig", kubeconfig]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu.nvidia.com/hgx-node-01/gpu-vfio-3  node hgx-node-01  class hgx-h100  "
                             "suspected 2026-12-06T09:03:00Z  (DeviceTaintRule gpu-suspect-")
    assert out[1] == "  t/vm-a  2026-12-06T09:00:00Z  launcher Pod virt-launcher-vm-a-x Failed (Error)"
    assert len(out) == 5 and out[4] == "  lift: gpu-binder health clear hgx-node-01/gpu-vfio-3"


def test_health_json(capsys, kubeconfig, cluster):
    assert main(["health", "--kubeconfig", kubeconfig, "--json"]) == 0
    (s,) = json.loads(capsys.readouterr().out)
    assert s["device"] == {"driver": "gpu.nvidia.com", "pool": "hgx-node-01", "device": "gpu-vfio-3"}
    assert [e["vmi"] for e in s["evidence"]] == ["vm-a", "vm-b", "vm-c"]
    assert s["mark"]["kind"] == "DeviceTaintRule"


def test_clear_lifts_the_mark_and_names_who(capsys, kubeconfig, cluster):
    assert main(["health", "clear", "hgx-node-01/gpu-vfio-3", "--kubeconfig", kubeconfig]) == 0
    (done,) = cluster
    assert done[1:] == ("rule-uid", "alice", "ops")
    assert capsys.readouterr().out.startswith("cleared hgx-node-01/gpu-vfio-3 (DeviceTaintRule gpu-suspect-")


def test_clear_of_a_device_not_suspected_is_exit_2_one_line(capsys, kubeconfig, cluster):
    assert main(["health", "clear", "hgx-node-01/gpu-vfio-4", "--kubeconfig", kubeconfig]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu-binder health: hgx-node-01/gpu-vfio-4 is not suspected "
                   "(suspected: hgx-node-01/gpu-vfio-3)"]
    assert cluster == []


@pytest.mark.parametrize("argv, says", [
    (["health", "clear"], "health clear: give the DEVICE to lift"),
    (["health", "--timeout", "0"], "--timeout must be > 0 seconds"),
])
def test_bad_input_is_exit_2_before_the_cluster(capsys, kubeconfig, cluster, argv, says):
    assert main([*argv, "--kubeconfig", kubeconfig]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("device", [
    "a/b/c/d", "hgx-node-01//gpu-vfio-3", "/gpu-vfio-3", "hgx-node-01/", " ", "hgx-node-01/gpu vfio",
    "hgx-node-01/gpu-vfio-3 ", "HGX-node-01/gpu-vfio-3", "hgx-node-01/" + "g" * 64, "n" * 254,
    "hgx-node-01/gpu_vfio_3", "hgx-node-01/gpu-vfio-3-", "hgx-node-01./gpu-vfio-3",
])
def test_clear_of_a_malformed_device_is_refused_before_the_cluster(capsys, tmp_path, monkeypatch, device):
    """A DEVICE that cannot name a device (newcomer: `health clear a/b/c/d` was looked up):
    exit 2, one line naming it and what a device name looks like, before the kubeconfig is
    read (here it does not exist) or any API call."""
    async def no_api(*_):
        raise AssertionError("the cluster was asked")

    monkeypatch.setattr(health, "_marks", no_api)
    monkeypatch.setattr(health, "_clear", no_api)
    assert main(["health", "clear", device, "--kubeconfig", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    shown = device if len(device) <= 80 else device[:80] + "…"
    assert err == (f"gpu-binder health: health clear: DEVICE {shown!r} cannot name a device: give "
                   f"node/device, pool/device or driver/pool/device (lowercase DNS names: a-z, "
                   f"0-9, '-', '.'; the device at most 63 characters, e.g. "
                   f"hgx-node-01/gpu-vfio-3) or the rule's name (`gpu-binder health` lists them)\n")


@pytest.mark.parametrize("device", [
    "hgx-node-01/gpu-vfio-3", "hgx-node-01/gpu-vfio-4", "gpu.nvidia.com/hgx-node-01/gpu-vfio-3",
    "gpu-suspect-hgx-node-01-gpu-vfio-3-9f7fb160", "hgx-node-01/" + "g" * 63,
])
def test_a_well_formed_device_name_is_looked_up(kubeconfig, cluster, capsys, device):
    """The forms `find_mark` reads pass the check: the suspected one is cleared, another is
    "not suspected" (exit 2, its own message), never refused as malformed."""
    code = main(["health", "clear", device, "--kubeconfig", kubeconfig])
    err = capsys.readouterr().err
    assert "cannot name a device" not in err
    assert (code, len(cluster)) in ((0, 1), (2, 0)), (code, err)
    if code == 2:
        assert err == f"gpu-binder health: {device} is not suspected (suspected: hgx-node-01/gpu-vfio-3)\n"


def test_an_unknown_action_is_a_usage_error(capsys, kubeconfig):
    with pytest.raises(SystemExit) as exc:
        main(["health", "lift", "x", "--kubeconfig", kubeconfig])
    assert exc.value.code == 2


def test_nothing_suspected_says_so_and_where_count_mode_is(capsys, kubeconfig, monkeypatch):
    async def none(api, namespace):
        return (), {}, None

    monkeypatch.setattr(health, "_marks", none)
    assert main(["health", "--kubeconfig", kubeconfig]) == 0
    assert "no suspected GPUs" in capsys.readouterr().out


def test_a_configmap_mark_says_kube_scheduler_cannot_see_it():
    key, value = mark_entry(_suspect(), T0)
    text = health.render_health(parse_marks({"data": {key: value}}))
    assert "kube-scheduler cannot see it" in text.splitlines()[0]


def test_the_user_is_the_current_contexts(kubeconfig, tmp_path):
    assert health.kubeconfig_user(kubeconfig) == ("alice", "ops")
    path = tmp_path / "k"
    path.write_text("current-context: gone\ncontexts: []\n")
    assert health.kubeconfig_user(str(path)) == ("unknown", "gone")
