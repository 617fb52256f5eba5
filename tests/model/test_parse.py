"""Parsers of `model.parse` and the settings data of `model.settings`: good objects become
model values, malformed ones raise ParseError naming the object and the field."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.parse import ParseError, VMIAsk, parse_budgets, parse_gpu_class, parse_gpu_device, parse_namespace, parse_node, parse_quantity_int, parse_vmi_request
from model.serialize import device_status_to_dict
from model.priority import ClassPreemption, PreemptionPolicy, Priority
from model.reasons import Code
from model.settings import RAW_ALLOWED, RAW_DENIED, format_resource_names, resource_names
from model.types import (
    Attachment,
    BindRequest,
    Budget,
    DeviceStatus,
    GPUClass,
    LabelSelector,
    OnCordon,
    Phase,
    Result,
    SelectorRequirement,
)

H = "nvidia.com/H100"
T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def device_obj(**status) -> dict:
    return {"metadata": {"name": "gpu-1", "namespace": "tenant-a", "resourceVersion": "7",
                         "labels": {"gpu.cozystack.io/template-for": "vm-1"}},
            "spec": {"class": "h100"}, "status": status}


def test_parse_gpu_class_full_and_defaults():
    c = parse_gpu_class({"metadata": {"name": "h100"}, "spec": {
        "resourceName": H, "onCordon": "Stay", "nodeSelector": {"gpu": "h100"},
        "namespaceSelector": {"matchLabels": {"tier": "gold"},
                              "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}}})
    assert c == GPUClass("h100", H, OnCordon.STAY, (("gpu", "h100"),),
                         LabelSelector((("tier", "gold"),), (SelectorRequirement("env", "NotIn", ("dev",)),)))
    assert parse_gpu_class({"metadata": {"name": "x"}, "spec": {"resourceName": H}}) == GPUClass("x", H)


def test_parse_node_keeps_integer_quantities_only():
    n = parse_node({"metadata": {"name": "node-1", "labels": {"zone": "a"}},
                    "spec": {"unschedulable": True},
                    "status": {"allocatable": {H: "4", "cpu": "3500m", "memory": "16Gi", "pods": 110}}})
    assert n.allocatable_of(H) == 4 and n.allocatable_of("cpu") == 0 and n.unschedulable
    assert n.labels == (("zone", "a"),)
    assert parse_node({"metadata": {"name": "bare"}}).allocatable == ()


def test_parse_namespace():
    assert parse_namespace({"metadata": {"name": "t", "labels": {"a": "b"}}}).labels == (("a", "b"),)


def test_parse_gpu_device_full_status():
    d = parse_gpu_device(device_obj(
        phase="Bound", nodeName="node-1", boundAt="2026-01-02T03:04:05Z",
        attachedTo={"vmi": "vm-1", "since": "2026-01-02T05:04:05+02:00"},
        bindRequest={"id": "r1", "vmi": "vm-1", "devices": ["gpu-1"], "requestedAt": "2026-01-02T03:04:05.25Z",
                     "nodeSelector": {"zone": "a"}, "result": "Succeeded", "message": "ok", "node": "node-1"}))
    assert d.key == ("tenant-a", "gpu-1") and d.template_for == "vm-1" and d.resource_version == "7"
    assert d.bound_node == "node-1" and d.status.bound_at == T
    assert d.status.attached_to == Attachment("vm-1", T)
    assert d.status.bind_request == BindRequest("r1", "vm-1", ("gpu-1",), T + timedelta(microseconds=250000),
                                                (("zone", "a"),), Result.SUCCEEDED, "ok", "node-1")
    assert d.status.bound_at.tzinfo is timezone.utc


@pytest.mark.parametrize("obj, message", [
    ({"metadata": {"name": "gpu-1", "namespace": "tenant-a"}, "spec": {}},
     "GPUDevice tenant-a/gpu-1: spec.class: required"),
    ({"metadata": {"name": "gpu-1", "namespace": "tenant-a"}},
     "GPUDevice tenant-a/gpu-1: spec: required"),
    ({"metadata": {"namespace": "tenant-a"}, "spec": {"class": "h100"}},
     "GPUDevice tenant-a/<unnamed>: metadata.name: required"),
    ({"metadata": {"name": "gpu-1"}, "spec": {"class": "h100"}},
     "GPUDevice <no namespace>/gpu-1: metadata.namespace: required"),
    (device_obj(phase="Lost"), "GPUDevice tenant-a/gpu-1: status.phase: must be Pending or Bound, got 'Lost'"),
    (device_obj(phase="Bound"), "GPUDevice tenant-a/gpu-1: status.nodeName: required when phase is Bound"),
    (device_obj(boundAt="yesterday"), "GPUDevice tenant-a/gpu-1: status.boundAt: not an RFC 3339 time: 'yesterday'"),
    (device_obj(boundAt="2026-01-02T03:04:05"),
     "GPUDevice tenant-a/gpu-1: status.boundAt: RFC 3339 time without a zone: '2026-01-02T03:04:05'"),
    (device_obj(attachedTo={"vmi": "vm-1"}), "GPUDevice tenant-a/gpu-1: status.attachedTo.since: required"),
    (device_obj(bindRequest={"vmi": "v", "devices": ["gpu-1"]}), "GPUDevice tenant-a/gpu-1: status.bindRequest.id: required"),
    (device_obj(bindRequest={"id": "r", "vmi": "v", "devices": "gpu-1"}),
     "GPUDevice tenant-a/gpu-1: status.bindRequest.devices: required: a list of device names"),
    (device_obj(bindRequest={"id": "r", "vmi": "v", "devices": ["gpu-1"], "priority": "high"}),
     "GPUDevice tenant-a/gpu-1: status.bindRequest.priority: must be a 32-bit integer, got 'high'"),
    (device_obj(bindRequest={"id": "r", "vmi": "v", "devices": ["gpu-1"], "priority": 2**31}),
     "GPUDevice tenant-a/gpu-1: status.bindRequest.priority: must be a 32-bit integer, got 2147483648"),
    (device_obj(bindRequest={"id": "r", "vmi": "v", "devices": ["gpu-1"], "preemptionPolicy": "Always"}),
     "GPUDevice tenant-a/gpu-1: status.bindRequest.preemptionPolicy: must be PreemptLowerPriority or Never, got 'Always'"),
    (device_obj(bindRequest={"id": "r", "vmi": "v", "devices": ["gpu-1"], "result": "Maybe"}),
     "GPUDevice tenant-a/gpu-1: status.bindRequest.result: must be Succeeded or Refused, got 'Maybe'"),
    ({"metadata": {"name": "g", "namespace": "t", "labels": {"a": 1}}, "spec": {"class": "h"}},
     "GPUDevice t/g: metadata.labels[a]: keys and values must be strings"),
    ("not an object", "GPUDevice: (object): must be an object, got str"),
])
def test_parse_gpu_device_malformed_names_object_and_field(obj, message):
    with pytest.raises(ParseError) as err:
        parse_gpu_device(obj)
    assert str(err.value) == message


@pytest.mark.parametrize("spec, message", [
    ({"resourceName": H, "keepSetFor": "soon"},
     "GPUClass h100: spec.keepSetFor: not a duration like 30m or 1h30m: 'soon'"),
    ({"deviceClassName": "vfio.gpu.nvidia.com", "selectors": [{"cel": {}}]},
     "GPUClass h100: spec.selectors[0].cel.expression: required"),
    ({"resourceName": H, "onCordon": "Drain"}, "GPUClass h100: spec.onCordon: must be Move or Stay, got 'Drain'"),
    ({"resourceName": H, "preemption": "Sometimes"},
     "GPUClass h100: spec.preemption: must be LowerPriority or Never, got 'Sometimes'"),
    ({"resourceName": H, "nodeSelector": ["a"]}, "GPUClass h100: spec.nodeSelector: must be an object, got list"),
    ({"resourceName": H, "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
     "GPUClass h100: spec.namespaceSelector.matchExpressions[0].operator: unknown operator 'Near'"),
    ({"resourceName": H, "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
     "GPUClass h100: spec.namespaceSelector.matchExpressions[0].values: required for operator In"),
])
def test_parse_gpu_class_malformed(spec, message):
    with pytest.raises(ParseError) as err:
        parse_gpu_class({"metadata": {"name": "h100"}, "spec": spec})
    assert str(err.value) == message
    assert err.value.what == "GPUClass h100"


@pytest.mark.parametrize("spec, problem", [
    ({}, "sets neither spec.resourceName nor spec.deviceClassName: exactly one is required (DR1)"),
    ({"resourceName": H, "deviceClassName": "vfio.gpu.nvidia.com"},
     "sets both spec.resourceName and spec.deviceClassName: exactly one is allowed (DR1)"),
    ({"resourceName": H, "topology": {"matchAttribute": "gpu.nvidia.com/partition{size}"}},
     "spec.selectors and spec.topology need spec.deviceClassName (device mode, DR1)"),
])
def test_a_class_with_both_or_neither_mode_parses_with_its_problem(spec, problem):
    """DR1: readable but unable to serve; the problem text is what its VMIs are refused with."""
    cls = parse_gpu_class({"metadata": {"name": "h100"}, "spec": spec})
    assert cls.problem == problem


def test_a_device_mode_class_counts_under_its_deviceclass_quota_key():
    cls = parse_gpu_class({"metadata": {"name": "hgx"}, "spec": {
        "deviceClassName": "vfio.gpu.nvidia.com",
        "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "H100"'}}],
        "topology": {"matchAttribute": "gpu.nvidia.com/partition{size}"}, "keepSetFor": "1h30m"}})
    assert (cls.device_mode, cls.problem) == (True, None)
    assert cls.resource_name == "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    assert cls.selectors == ('device.attributes["gpu.nvidia.com"].productName == "H100"',)
    assert cls.match_attribute == "gpu.nvidia.com/partition{size}"
    assert cls.keep_set_for.total_seconds() == 5400
    budgets = parse_budgets({"metadata": {"name": "q", "namespace": "t"}, "spec": {"hard": {
        "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4", "cpu": "8"}}})
    assert [(b.resource_name, b.hard) for b in budgets] == [(cls.resource_name, 4)]


def test_the_device_record_round_trips():
    obj = {"metadata": {"name": "g", "namespace": "t"}, "spec": {"class": "hgx"},
           "status": {"phase": "Bound", "nodeName": "n1",
                      "device": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-vfio-3"}}}
    dev = parse_gpu_device(obj)
    assert str(dev.status.device) == "gpu.nvidia.com/n1/gpu-vfio-3"
    assert device_status_to_dict(dev.status) == obj["status"]


def test_parse_node_malformed():
    with pytest.raises(ParseError, match=r"^Node node-1: spec.unschedulable: must be a boolean$"):
        parse_node({"metadata": {"name": "node-1"}, "spec": {"unschedulable": "yes"}})
    with pytest.raises(ParseError, match=r"^Node <unnamed>: metadata.name: required$"):
        parse_node({"metadata": {}})


def test_parse_budgets_extended_resources_only():
    quota = {"metadata": {"name": "q", "namespace": "tenant-a"},
             "spec": {"hard": {"requests.nvidia.com/H100": "2", "requests.cpu": "4", "pods": "10",
                               "requests.nvidia.com/L40S": 1, "limits.nvidia.com/H100": "9"}}}
    assert parse_budgets(quota) == [Budget("tenant-a", H, 2), Budget("tenant-a", "nvidia.com/L40S", 1)]
    with pytest.raises(ParseError) as err:
        parse_budgets({"metadata": {"name": "q", "namespace": "tenant-a"},
                       "spec": {"hard": {"requests.nvidia.com/H100": "1500m"}}})
    assert str(err.value) == ("ResourceQuota tenant-a/q: spec.hard[requests.nvidia.com/H100]: "
                              "must be a whole, non-negative number, got '1500m'")


@pytest.mark.parametrize("q, n", [("4", 4), (4, 4), ("2k", 2000), ("1Ki", 1024), ("3500m", None),
                                  ("4000m", 4), ("1e3", 1000), ("x", None), (True, None), (None, None)])
def test_parse_quantity_int(q, n):
    assert parse_quantity_int(q) == n


# --- VMI annotations --------------------------------------------------------------------------

D = "gpu.cozystack.io/devices"
TP = "gpu.cozystack.io/templates"


def test_parse_vmi_request_ok():
    assert parse_vmi_request(None) is None
    assert parse_vmi_request({"other": "x"}) is None
    assert parse_vmi_request({D: "gpu-a, gpu-b", TP: "h100=2,l40s=1"}) == VMIAsk(("gpu-a", "gpu-b"), (("h100", 2), ("l40s", 1)))
    assert parse_vmi_request({TP: "h100=1"}) == VMIAsk((), (("h100", 1),))


@pytest.mark.parametrize("annotations, message", [
    ({D: "gpu-a,,gpu-b"}, f"VMI: metadata.annotations[{D}]: empty entry in 'gpu-a,,gpu-b'"),
    ({D: ""}, f"VMI: metadata.annotations[{D}]: is empty"),
    ({D: "gpu-a,gpu-a"}, f"VMI: metadata.annotations[{D}]: device gpu-a listed twice"),
    ({D: "GPU_A"}, f"VMI: metadata.annotations[{D}]: invalid device name 'GPU_A': not a DNS-1123 subdomain"),
    ({TP: "h100=0"}, f"VMI: metadata.annotations[{TP}]: count of class h100 must be a positive integer, got '0'"),
    ({TP: "h100=-1"}, f"VMI: metadata.annotations[{TP}]: count of class h100 must be a positive integer, got '-1'"),
    ({TP: "h100=two"}, f"VMI: metadata.annotations[{TP}]: count of class h100 must be a positive integer, got 'two'"),
    ({TP: "h100"}, f"VMI: metadata.annotations[{TP}]: entry 'h100' is not <class>=<count>"),
    ({TP: "h100=1,h100=2"}, f"VMI: metadata.annotations[{TP}]: class h100 listed twice"),
    ({TP: "=1"}, f"VMI: metadata.annotations[{TP}]: invalid class name '': not a DNS-1123 subdomain"),
    ({D: "gpu-a", TP: "h100=64"}, "VMI: metadata.annotations: asks for 65 devices, more than 64"),
    ({D: "a" * 4097}, f"VMI: metadata.annotations[{D}]: longer than 4096 bytes"),
])
def test_parse_vmi_request_malformed(annotations, message):
    with pytest.raises(ParseError) as err:
        parse_vmi_request(annotations)
    assert str(err.value) == message


# --- the inverse ------------------------------------------------------------------------------


def test_device_status_to_dict_camel_case_z_times_omits_none():
    status = DeviceStatus(Phase.BOUND, "node-1", T, Attachment("vm-1", T),
                          BindRequest("r1", "vm-1", ("gpu-1",), T.replace(microsecond=5), (), Result.REFUSED, "no"))
    assert device_status_to_dict(status) == {
        "phase": "Bound", "nodeName": "node-1", "boundAt": "2026-01-02T03:04:05Z",
        "attachedTo": {"vmi": "vm-1", "since": "2026-01-02T03:04:05Z"},
        "bindRequest": {"id": "r1", "vmi": "vm-1", "devices": ["gpu-1"],
                        "requestedAt": "2026-01-02T03:04:05.000005Z", "result": "Refused", "message": "no"}}
    assert device_status_to_dict(DeviceStatus()) == {"phase": "Pending"}


names = st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                     timezones=st.just(timezone.utc))


@st.composite
def statuses(draw) -> DeviceStatus:
    bound = draw(st.booleans())
    br = draw(st.none() | st.builds(
        BindRequest, names, names, st.lists(names, min_size=1, max_size=3).map(tuple), st.none() | times,
        st.dictionaries(names, names, max_size=2).map(lambda m: tuple(sorted(m.items()))),
        st.none() | st.sampled_from(Result), st.none() | st.text(max_size=20), st.none() | names,
        code=st.none() | st.sampled_from(Code),
        priority=st.builds(Priority, st.integers(-(2**31), 2**31 - 1), st.sampled_from(PreemptionPolicy),
                           st.none() | names)))
    return DeviceStatus(Phase.BOUND if bound else Phase.PENDING, draw(names) if bound else draw(st.none() | names),
                        draw(st.none() | times), draw(st.none() | st.builds(Attachment, names, times)), br)


@settings(max_examples=500, derandomize=False, print_blob=True)
@given(statuses())
def test_device_status_round_trips_through_the_api_shape(status):
    obj = {"metadata": {"name": "g", "namespace": "t"}, "spec": {"class": "c"}, "status": device_status_to_dict(status)}
    assert parse_gpu_device(obj).status == status


def test_bind_request_code_is_read_typed_and_an_absent_or_unknown_one_is_none():
    """`bindRequest.code` (the refusal's reason code beside its message): read as a `Code`;
    absent (a replica older than the field) or unknown (a newer replica's code) reads as
    None, never as a malformed device, so the readers fall back to a policy refusal."""
    br = {"id": "r1", "vmi": "vm-1", "devices": ["gpu-1"], "result": "Refused", "message": "no"}
    read = lambda **extra: parse_gpu_device(device_obj(bindRequest={**br, **extra})).status.bind_request
    assert read(code="ledgers_refused").code is Code.LEDGERS_REFUSED
    assert read().code is None
    assert read(code="some_code_of_a_newer_replica").code is None
    assert read(code="ledgers_refused").message == "no"
    out = device_status_to_dict(DeviceStatus(bind_request=read(code="budget_exhausted")))
    assert out["bindRequest"]["code"] == "budget_exhausted"
    assert "code" not in device_status_to_dict(DeviceStatus(bind_request=read()))["bindRequest"]


def test_settings_resource_names():
    classes = [GPUClass("b", "nvidia.com/L40S"), GPUClass("a", H), GPUClass("c", H)]
    assert resource_names(classes) == (H, "nvidia.com/L40S")
    assert format_resource_names(resource_names(classes)) == "nvidia.com/H100,nvidia.com/L40S"
    assert format_resource_names([]) == ""
    assert (RAW_ALLOWED, RAW_DENIED) == ("allowed", "denied")


def test_settings_keep_the_resource_of_a_class_naming_both_modes():
    # newcomer: a class naming both resourceName and deviceClassName (it cannot serve) left
    # its extended resource out of data.resourceNames: tenants could request it raw
    both = parse_gpu_class({"metadata": {"name": "both"}, "spec": {
        "resourceName": "nvidia.com/GH100_H100", "deviceClassName": "vfio.gpu.nvidia.com"}})
    device = parse_gpu_class({"metadata": {"name": "dev"}, "spec": {
        "deviceClassName": "vfio.gpu.nvidia.com"}})
    assert both.problem and both.device_mode
    assert resource_names([both, device]) == ("nvidia.com/GH100_H100",)


def test_a_recorded_priority_is_read_typed_and_its_absence_is_the_default():
    """P1: `bindRequest.priority`/`preemptionPolicy`/`priorityClassName` as the webhook
    records them; absent (a replica older than the fields) reads as 0, PreemptLowerPriority."""
    br = {"id": "r1", "vmi": "vm-1", "devices": ["gpu-1"]}
    read = lambda **extra: parse_gpu_device(device_obj(bindRequest={**br, **extra})).status.bind_request.priority
    assert read(priority=-5, preemptionPolicy="Never", priorityClassName="spot") == Priority(
        -5, PreemptionPolicy.NEVER, "spot")
    assert read(priority=10).may_preempt is True
    assert read() == Priority(0, PreemptionPolicy.PREEMPT_LOWER, None)


def test_a_class_may_refuse_to_yield():
    """P2: `spec.preemption` Never; absent is LowerPriority."""
    cls = lambda **spec: parse_gpu_class({"metadata": {"name": "h100"}, "spec": {"resourceName": H, **spec}})
    assert cls(preemption="Never").preemption is ClassPreemption.NEVER
    assert cls().preemption is ClassPreemption.LOWER_PRIORITY
