"""HL2 (docs/contract.md §3b): failed starts as evidence per device, what never counts, and
when a device is suspected (model/health.py, model/health_mark.py)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.device.dra import DeviceRef
from model.device.taint_rules import parse_taint_rule
from model.health import (Evidence, Excuse, FailedStart, HealthSettings, Target, judge_start,
                          targets_of)
from model.health_mark import (SUSPECT_KEY, find_mark, mark_entry, parse_marks, parse_rule_mark,
                               rule_body, rule_name)
from model.types import Attachment, DeviceStatus, GPUClass, GPUDevice, Phase

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=timezone.utc)
REF = DeviceRef("gpu.nvidia.com", "hgx-node-01", "gpu-vfio-3")
DEV = Target("hgx-node-01", "hgx-h100", REF)
S = HealthSettings()


def vmi(name="vm-a", uid="u-a", phase="Scheduled", *, transitions=(), deleting=False,
        conditions=()):
    meta = {"name": name, "namespace": "tenant", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T09:00:00Z"
    return {"metadata": meta,
            "status": {"phase": phase, "conditions": list(conditions),
                       "phaseTransitionTimestamps": [
                           {"phase": p, "phaseTransitionTimestamp": t} for p, t in transitions]}}


def pod(phase="Failed", *, reason=None, waiting=None, terminated=None, deleting=False, name="virt-launcher-vm-a-x"):
    meta = {"name": name, "namespace": "tenant"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T09:00:00Z"
    status = {"phase": phase}
    if reason:
        status["reason"] = reason
    cs = {}
    if waiting:
        cs.setdefault("state", {})["waiting"] = {"reason": waiting}
    if terminated:
        cs.setdefault("state", {})["terminated"] = {"reason": terminated}
    if cs:
        status["containerStatuses"] = [cs]
    return {"metadata": meta, "status": status}


def failure(name, at, uid=None):
    return FailedStart("tenant", name, uid or f"uid-{name}", at, "launcher Pod Failed (Error)")


# -- judge_start: what counts ------------------------------------------------------------------
def test_a_launcher_pod_failed_before_running_is_a_failed_start():
    got = judge_start(vmi(), [pod(terminated="Error")], T0)
    assert isinstance(got, FailedStart)
    assert (got.namespace, got.vmi, got.uid, got.at) == ("tenant", "vm-a", "u-a", T0)
    assert got.why == "launcher Pod virt-launcher-vm-a-x Failed (Error)"


def test_a_vmi_failed_before_running_is_a_failed_start_at_its_transition():
    got = judge_start(vmi(phase="Failed", transitions=[("Scheduled", "2026-12-06T08:58:00Z"),
                                                       ("Failed", "2026-12-06T08:59:00Z")],
                          conditions=[{"type": "Synchronized", "reason": "VFIOError"}]), [], T0)
    assert isinstance(got, FailedStart)
    assert got.at == T0 - timedelta(minutes=1)
    assert got.why == "VMI Failed (VFIOError)"


def test_nothing_failed_is_no_verdict():
    assert judge_start(vmi(), [pod("Running")], T0) is None
    assert judge_start(vmi(), [], T0) is None


# -- judge_start: each failure that is not the GPU's ---------------------------------------------
@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_an_image_pull_error_never_counts(reason):
    assert judge_start(vmi(phase="Failed"), [pod(waiting=reason)], T0) is Excuse.IMAGE_PULL
    assert judge_start(vmi(), [pod(waiting=reason)], T0) is Excuse.IMAGE_PULL


def test_a_vmi_failed_for_its_image_by_its_condition_never_counts():
    got = judge_start(vmi(phase="Failed", conditions=[{"type": "Synchronized",
                                                       "reason": "ImagePullBackOff"}]), [], T0)
    assert got is Excuse.IMAGE_PULL


def test_a_vmi_deleted_while_starting_never_counts():
    assert judge_start(vmi(phase="Failed", deleting=True), [pod()], T0) is Excuse.DELETED
    assert judge_start(vmi(), [pod(deleting=True)], T0) is Excuse.DELETED


def evicted_pod(reason="DeletionByDeviceTaintManager", status="True"):
    """A launcher Pod as kube-controller-manager's device-taint eviction leaves it (HL1): its
    condition DisruptionTarget, deleting, not Failed."""
    p = pod("Running", deleting=True)
    p["status"]["conditions"] = [{"type": "Ready", "status": "True"},
                                 {"type": "DisruptionTarget", "status": status, "reason": reason}]
    return p


@pytest.mark.parametrize("reason", ["DeletionByDeviceTaintManager", "PreemptionByScheduler",
                                    "EvictionByEvictionAPI", "DeletionByPodGC"])
def test_a_vmi_failed_after_kubernetes_disrupted_its_launcher_never_counts(reason):
    # HL1: a NoExecute taint on one GPU of the set; the VMI fails once its Pod is gone
    got = judge_start(vmi(phase="Failed", conditions=[{"type": "Ready", "reason": "PodNotExists"}]),
                      [evicted_pod(reason)], T0)
    assert got is Excuse.DISRUPTED
    # without the disruption it counts, as before (a Pod merely being deleted is not enough)
    plain = pod("Running", deleting=True)
    assert isinstance(judge_start(vmi(phase="Failed"), [plain], T0), FailedStart)
    assert isinstance(judge_start(vmi(phase="Failed"), [evicted_pod(reason, "False")], T0), FailedStart)


@pytest.mark.parametrize("reason", ["OutOfcpu", "OutOfmemory", "NodeAffinity",
                                    "UnexpectedAdmissionError", "Evicted"])
def test_a_pod_the_kubelet_refused_never_counts(reason):
    assert judge_start(vmi(), [pod(reason=reason)], T0) is Excuse.REFUSED


def test_a_vmi_that_ran_then_failed_never_counts():
    ran = [("Scheduled", "2026-12-06T08:00:00Z"), ("Running", "2026-12-06T08:01:00Z"),
           ("Failed", "2026-12-06T08:59:00Z")]
    assert judge_start(vmi(phase="Failed", transitions=ran), [pod()], T0) is Excuse.RAN
    assert judge_start(vmi(phase="Running"), [pod()], T0) is Excuse.RAN


def test_an_admission_refusal_leaves_no_vmi_so_nothing_to_count():
    # a VMI the webhook refused is never created: no VMI, no launcher Pod, no targets
    assert Evidence().suspects(T0, S) == ()


# -- targets ---------------------------------------------------------------------------------------
def _device(name, cls, *, vmi_name="vm-a", uid="u-a", node="hgx-node-01", record=REF):
    return GPUDevice("tenant", name, cls, status=DeviceStatus(
        phase=Phase.BOUND, node_name=node, attached_to=Attachment(vmi_name, T0, uid=uid),
        device=record))


CLASSES = {"hgx-h100": GPUClass("hgx-h100", "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices",
                                device_class_name="vfio.gpu.nvidia.com"),
           "a100": GPUClass("a100", "nvidia.com/A100")}


def test_targets_are_the_recorded_devices_in_device_mode_and_node_class_in_count_mode():
    f = FailedStart("tenant", "vm-a", "u-a", T0, "x")
    devices = [_device("d1", "hgx-h100"), _device("d2", "a100", record=None),
               _device("d3", "hgx-h100", record=None),               # no record: unknown GPU
               _device("d4", "hgx-h100", vmi_name="other"),          # another VMI's
               _device("d5", "hgx-h100", uid="u-old")]               # another incarnation's
    assert targets_of(devices, CLASSES, f) == (Target("hgx-node-01", "a100"), DEV)


# -- evidence and suspects ---------------------------------------------------------------------
def test_three_different_vmis_within_the_window_make_a_suspect():
    ev = Evidence()
    for i, name in enumerate(("a", "b")):
        ev = ev.record([DEV], failure(name, T0 + timedelta(minutes=i)))
    assert ev.suspects(T0 + timedelta(minutes=5), S) == ()
    ev = ev.record([DEV], failure("c", T0 + timedelta(minutes=10)))
    (s,) = ev.suspects(T0 + timedelta(minutes=10), S)
    assert s.target == DEV and [f.vmi for f in s.evidence] == ["a", "b", "c"]


def test_one_vmi_failing_repeatedly_counts_once():
    ev = Evidence()
    for i in range(5):  # the same VM's VMI recreated (new uid) and failing each time
        ev = ev.record([DEV], failure("a", T0 + timedelta(minutes=i), uid=f"u{i}"))
    ev = ev.record([DEV], failure("b", T0 + timedelta(minutes=6)))
    assert ev.suspects(T0 + timedelta(minutes=7), S) == ()


def test_failures_older_than_the_window_do_not_count():
    ev = Evidence()
    ev = ev.record([DEV], failure("a", T0))
    ev = ev.record([DEV], failure("b", T0 + timedelta(minutes=20)))
    ev = ev.record([DEV], failure("c", T0 + timedelta(minutes=31)))
    assert ev.suspects(T0 + timedelta(minutes=31), S) == ()
    assert ev.suspects(T0 + timedelta(minutes=25), HealthSettings(2)) != ()


def test_a_clear_forgets_the_failures_so_far():
    ev = Evidence()
    for i, name in enumerate("abc"):
        ev = ev.record([DEV], failure(name, T0 + timedelta(minutes=i)))
    ev = ev.clear(DEV, T0 + timedelta(minutes=3))
    assert ev.suspects(T0 + timedelta(minutes=4), S) == ()
    ev = ev.record([DEV], failure("a", T0 + timedelta(minutes=2)))  # seen late: before the clear
    assert ev.prune(T0 + timedelta(minutes=4), S).failures == {}


def test_settings_are_checked():
    with pytest.raises(ValueError):
        HealthSettings(0)
    with pytest.raises(ValueError):
        HealthSettings(3, timedelta(0))


names = st.sampled_from(["a", "b", "c", "d", "e"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(names, st.integers(0, 90)), max_size=20), st.integers(1, 4),
       st.integers(0, 120))
def test_suspected_iff_enough_different_vmis_in_the_window(events, n, at_min):
    """Brute force: a target is suspected exactly when at least n different VMI names have a
    failure in [now - window, now]; the same failures in any order give the same answer."""
    cfg = HealthSettings(n, timedelta(minutes=30))
    now = T0 + timedelta(minutes=at_min)
    ev = Evidence()
    for name, m in events:
        ev = ev.record([DEV], failure(name, T0 + timedelta(minutes=m), uid=f"{name}{m}"))
    rev = Evidence()
    for name, m in reversed(events):
        rev = rev.record([DEV], failure(name, T0 + timedelta(minutes=m), uid=f"{name}{m}"))
    inside = {name for name, m in events if now - cfg.window <= T0 + timedelta(minutes=m)}
    expect = len(inside) >= n
    assert bool(ev.suspects(now, cfg)) == expect
    assert bool(rev.suspects(now, cfg)) == expect
    if expect:
        assert {f.vmi for f in ev.suspects(now, cfg)[0].evidence} == inside


excused = st.sampled_from([
    (vmi(phase="Failed"), [pod(waiting="ErrImagePull")]),
    (vmi(), [pod(waiting="ImagePullBackOff")]),
    (vmi(phase="Failed", deleting=True), [pod()]),
    (vmi(), [pod(deleting=True)]),
    (vmi(), [pod(reason="OutOfmemory")]),
    (vmi(phase="Failed", transitions=[("Running", "2026-12-06T08:00:00Z")]), [pod()]),
    (vmi(phase="Failed"), [evicted_pod()]),
])


@settings(max_examples=50, deadline=None)
@given(st.lists(excused, min_size=1, max_size=10))
def test_non_gpu_failures_never_make_a_suspect(cases):
    """However many, failures that are not the GPU's add nothing to the evidence."""
    ev = Evidence()
    for i, (v, pods) in enumerate(cases):
        got = judge_start(v, pods, T0 + timedelta(seconds=i))
        assert isinstance(got, Excuse)
    assert ev.suspects(T0, HealthSettings(1)) == ()


# -- the mark ------------------------------------------------------------------------------------
def _suspect():
    ev = Evidence()
    for i, name in enumerate("abc"):
        ev = ev.record([DEV], failure(name, T0 + timedelta(minutes=i)))
    return ev.suspects(T0 + timedelta(minutes=3), S)[0]


def test_the_rule_selects_exactly_the_device_and_reads_back():
    body = rule_body(_suspect(), T0 + timedelta(minutes=3))
    assert body["apiVersion"] == "resource.k8s.io/v1beta2" and body["kind"] == "DeviceTaintRule"
    assert body["spec"] == {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "hgx-node-01",
                                               "device": "gpu-vfio-3"},
                            "taint": {"key": SUSPECT_KEY, "value": "failed-starts", "effect": "NoSchedule"}}
    assert body["metadata"]["name"] == rule_name(REF)
    assert body["metadata"]["name"].startswith("gpu-suspect-hgx-node-01-gpu-vfio-3-")
    mark = parse_rule_mark(body)
    assert mark is not None and mark.device == REF and mark.node == "hgx-node-01"
    assert mark.class_name == "hgx-h100" and [f.vmi for f in mark.evidence] == ["a", "b", "c"]
    rule = parse_taint_rule(body)
    assert rule.matches(REF) and not rule.matches(DeviceRef("gpu.nvidia.com", "hgx-node-01", "gpu-vfio-4"))
    assert find_mark((mark,), "hgx-node-01/gpu-vfio-3") == mark
    assert find_mark((mark,), str(REF)) == mark and find_mark((mark,), "gpu-vfio-3") is None


def test_a_rule_not_ours_is_no_mark_and_a_rule_without_selector_selects_nothing():
    other = {"metadata": {"name": "r"}, "spec": {"taint": {"key": "k", "effect": "NoExecute"}}}
    assert parse_rule_mark(other) is None
    assert not parse_taint_rule(other).matches(REF)
    everything = {"metadata": {"name": "r"}, "spec": {"deviceSelector": {}, "taint": {"key": "k"}}}
    assert parse_taint_rule(everything).matches(REF)


def test_the_configmap_entry_reads_back_as_a_mark():
    key, value = mark_entry(_suspect(), T0)
    (mark,) = parse_marks({"data": {key: value, "junk": "not json"}})
    assert mark.kind == "ConfigMap" and mark.device == REF and len(mark.evidence) == 3
    assert json.loads(value)["suspectedAt"] == "2026-12-06T09:00:00Z"
    assert mark.taint_rule().matches(REF)


def test_rule_names_are_dns_subdomains_and_keep_refs_apart():
    a = rule_name(DeviceRef("d", "Pool_1", "GPU 1"))
    b = rule_name(DeviceRef("d", "pool-1", "gpu-1"))
    assert a != b and len(a) <= 253
    assert all(c.islower() or c.isdigit() or c in "-." for c in a)
