"""B3 as kube-scheduler sees it (Ready, NoSchedule/NoExecute taints against the VMI's
tolerations, KubeVirt's `kubevirt.io/schedulable=true`) and W1's `check_set` agreeing with
the binder on all of it. Foreign Pods in the capacity (§2, W7) are in test_foreign.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from model.check import check_set, judge_set
from model.reasons import (ClassNotPermitted, LostCapacity, NodeProblems, NoEligibleNode, NoFreeUnit,
                           NoRoom, NotKubevirtSchedulable, NotReady, SelectorMismatch, SetRefused,
                           DeviceAt, TaintsNotTolerated)
from model.decide import Request, decide
from model.parse import parse_gpu_device, parse_node, parse_tolerations
from model.serialize import device_status_to_dict
from model.snapshot import Order
from model.types import BindRequest, DeviceStatus, Phase, Result, Taint, Toleration
from tests.support.world import H, NS, dev, node, world

NOT_READY = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")
GPU_TAINT = Taint("gpu", "reserved", "NoSchedule")


def per_node(*lines) -> tuple[NoEligibleNode]:
    """The per-node reasons of a refusal of (node, problem, ...) lines, every node shown."""
    return (NoEligibleNode(tuple(NodeProblems(n, tuple(ps)) for n, *ps in lines)),)


def req(*names: str, tolerations: tuple[Toleration, ...] = ()) -> Request:
    return Request("r1", NS, "vm-1", names, tolerations=tolerations)


def test_B3_not_ready_node_is_not_eligible_and_the_refusal_says_so():
    s = world([replace(node("node-1", 4), ready=False), node("node-2", 1)], [dev("gpu-a"), dev("gpu-b")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert d.result is Result.REFUSED
    assert d.reason.reasons == per_node(("node-2", NoRoom(H, needs=2, free=1)), ("node-1", NotReady()))
    ok = world([replace(node("node-1", 4), ready=False), node("node-2", 2)], [dev("gpu-a"), dev("gpu-b")])
    assert decide(ok, req("gpu-a", "gpu-b")).node == "node-2"


def test_B3_node_without_kubevirt_schedulable_label_is_not_eligible():
    bare = replace(node("node-1", 4), labels=())
    wrong = node("node-2", 4, **{"kubevirt.io/schedulable": "false"})
    d = decide(world([bare, wrong], [dev("gpu-a")]), req("gpu-a"))
    assert d.result is Result.REFUSED
    lacks = NotKubevirtSchedulable("kubevirt.io/schedulable")
    assert d.reason.reasons == per_node(("node-1", lacks), ("node-2", lacks))


def test_B3_untolerated_taint_makes_a_node_ineligible_a_tolerated_one_does_not():
    tainted = replace(node("node-1", 1), taints=(GPU_TAINT, Taint("soft", "", "PreferNoSchedule")))
    s = world([tainted, node("node-2", 4)], [dev("gpu-a")])
    assert decide(s, req("gpu-a")).node == "node-2"  # tighter node-1 skipped: taint not tolerated
    only = world([tainted], [dev("gpu-a")])
    d = decide(only, req("gpu-a"))
    assert d.result is Result.REFUSED
    assert d.reason.reasons == per_node(("node-1", TaintsNotTolerated(("gpu=reserved:NoSchedule",))))
    for tol in (Toleration("gpu", "Equal", "reserved", "NoSchedule"), Toleration("gpu", "Exists"),
                Toleration("", "Exists")):
        assert decide(s, req("gpu-a", tolerations=(tol,))).node == "node-1", tol
    for tol in (Toleration("gpu", "Equal", "other"), Toleration("gpu", "Exists", effect="NoExecute"),
                Toleration("", "Equal"), Toleration("gpu", "Bogus")):
        assert decide(s, req("gpu-a", tolerations=(tol,))).node == "node-2", tol


def test_B3_a_set_bound_on_a_not_ready_node_is_moved_not_kept():
    s = world([replace(node("node-1", 2), ready=False, taints=(NOT_READY,)), node("node-2", 2)],
              [dev("gpu-a", "node-1"), dev("gpu-b", "node-1")])
    d = decide(s, req("gpu-a", "gpu-b"))
    assert (d.result, d.rule, d.node) == (Result.SUCCEEDED, "B1", "node-2")


def test_capacity_counts_pods_outside_the_binder_as_used():
    busy = replace(node("node-1", 4), foreign=((H, 3),))
    s = world([busy, node("node-2", 2)], [dev("gpu-a"), dev("gpu-b")])
    assert (s.used("node-1", H), s.foreign("node-1", H), s.free("node-1", H)) == (3, 3, 1)
    assert decide(s, req("gpu-a", "gpu-b")).node == "node-2"
    full = world([busy], [dev("gpu-a"), dev("gpu-b")])
    d = decide(full, req("gpu-a", "gpu-b"))
    assert d.reason.reasons == per_node(("node-1", NoRoom(H, needs=2, free=1, foreign=3)))
    lost = world([replace(node("node-1", 2), foreign=((H, 2),))], [dev("gpu-a", "node-1")])
    assert lost.lost_capacity("node-1", H)
    assert decide(lost, req("gpu-a")).reason.reasons == per_node(
        ("node-1", LostCapacity(H, bound=1, foreign=2, allocatable=2)))


@pytest.mark.parametrize("bad, tol, why", [
    (replace(node("node-1", 4), ready=False), (), NotReady()),
    (replace(node("node-1", 4), labels=()), (), NotKubevirtSchedulable("kubevirt.io/schedulable")),
    (replace(node("node-1", 4), taints=(GPU_TAINT,)), (), TaintsNotTolerated(("gpu=reserved:NoSchedule",))),
    (replace(node("node-1", 4), foreign=((H, 4),)), (), NoRoom(H, needs=1, free=0, foreign=4)),
], ids=["not-ready", "not-kubevirt-schedulable", "taint", "foreign-pods"])
def test_W1_check_set_agrees_with_B3_and_capacity(bad, tol, why):
    s = world([bad], [])
    v = check_set(s, NS, [Order(NS, "h100")], tolerations=tol)
    assert v == type(v)(False, NoFreeUnit("h100", H))  # the per-device check says it first
    judged = judge_set(s, NS, [Order(NS, "h100")], tolerations=tol)  # and the binder why
    assert judged.reason.reasons == per_node(("node-1", why))
    good = world([node("node-1", 4)], [])
    assert check_set(good, NS, [Order(NS, "h100")]).node == "node-1"


def test_W1_check_set_honours_tolerations_and_node_selector():
    s = world([replace(node("node-1", 1), taints=(GPU_TAINT,)), node("node-2", 4, zone="b")], [])
    assert check_set(s, NS, [Order(NS, "h100")]).node == "node-2"
    tol = (Toleration("gpu", "Exists"),)
    assert check_set(s, NS, [Order(NS, "h100")], tolerations=tol).node == "node-1"
    v = check_set(s, NS, [Order(NS, "h100")], node_selector=(("zone", "a"),))
    zone = SelectorMismatch((("zone", "a"),))
    assert not v.admitted and v.reason == SetRefused((DeviceAt("new h100 #1"),), per_node(
        ("node-1", TaintsNotTolerated(("gpu=reserved:NoSchedule",)), zone), ("node-2", zone)))


def test_parse_node_reads_ready_condition_and_taints():
    obj = {"metadata": {"name": "n1", "labels": {"kubevirt.io/schedulable": "true"}},
           "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                               {"key": "gpu", "value": "x", "effect": "NoExecute"}]},
           "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                     {"type": "Ready", "status": "True"}],
                      "allocatable": {H: "4"}}}
    n = parse_node(obj)
    assert n.ready and n.kubevirt_schedulable and n.placement_reasons() == []
    assert n.taints == (NOT_READY, Taint("gpu", "x", "NoExecute"))
    obj["status"]["conditions"][1]["status"] = "Unknown"
    assert not parse_node(obj).ready
    del obj["status"]["conditions"]
    assert parse_node(obj).placement_reasons() == [NotReady()]


def test_bind_request_tolerations_round_trip_and_bad_operator_is_a_parse_error():
    tol = (Toleration("gpu", "Exists", effect="NoSchedule"), Toleration("a", "Equal", "b"))
    br = BindRequest("r1", "vm-1", ("gpu-a",), tolerations=tol)
    st = DeviceStatus(Phase.PENDING, None, None, None, br)
    obj = {"metadata": {"name": "gpu-a", "namespace": NS}, "spec": {"class": "h100"},
           "status": device_status_to_dict(st)}
    assert parse_gpu_device(obj).status.bind_request.tolerations == tol
    with pytest.raises(ValueError, match=r"spec.tolerations\[0\].operator: must be Equal or Exists"):
        parse_tolerations([{"key": "a", "operator": "Gt"}])


def test_W1_class_kubevirt_does_not_permit_is_refused_before_room_is_checked():
    from datetime import datetime, timedelta, timezone

    from model.admission import Refusal, check
    from model.parse import VMIAsk, parse_permitted_host_devices

    s = world([node("node-1", 4)], [])
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    ask = VMIAsk((), (("h100", 1),))
    cr = {"spec": {"configuration": {"permittedHostDevices": {
        "pciHostDevices": [{"pciVendorSelector": "10DE:2330", "resourceName": "nvidia.com/L40S"}],
        "mediatedDevices": [{"mdevNameSelector": "x", "resourceName": "nvidia.com/GRID"}]}}}}
    permitted = parse_permitted_host_devices(cr)
    assert permitted == {"nvidia.com/L40S", "nvidia.com/GRID"}
    got = check(s, NS, "vm-1", ask, set(), now, timedelta(minutes=2), permitted=permitted)
    assert got == Refusal(ClassNotPermitted("h100", H))
    assert check(s, NS, "vm-1", ask, set(), now, timedelta(minutes=2), permitted=permitted | {H}).node == "node-1"
    assert check(s, NS, "vm-1", ask, set(), now, timedelta(minutes=2), permitted=None).node == "node-1"
    assert parse_permitted_host_devices({"spec": "junk"}) == frozenset()


# -- the launcher Pod's nodeSelector (B3: kubernetes.io/arch and KubeVirt's own selectors) ----

KUBEVIRT_CR = {"metadata": {"name": "kubevirt"},
               "spec": {"configuration": {"developerConfiguration": {
                   "nodeSelectors": {"pool": "vms", "bad": 3}}}},
               "status": {"defaultArchitecture": "amd64"}}


def test_B3_launcher_selector_adds_the_default_architecture_and_kubevirts_node_selectors():
    from model.admission import LauncherDefaults, launcher_defaults, node_selector_of

    d = launcher_defaults([KUBEVIRT_CR])
    assert d == LauncherDefaults("amd64", (("pool", "vms"),))
    vm = {"spec": {"nodeSelector": {"zone": "a"}}}
    assert node_selector_of(vm, d) == (("kubernetes.io/arch", "amd64"), ("pool", "vms"), ("zone", "a"))
    assert node_selector_of(vm) == (("zone", "a"),)  # no KubeVirt CR: only the VMI's own


def test_B3_launcher_selector_the_vmis_architecture_and_own_selector_win():
    from model.admission import launcher_defaults, node_selector_of

    d = launcher_defaults([KUBEVIRT_CR])
    assert dict(node_selector_of({"spec": {"architecture": "ARM64"}}, d))["kubernetes.io/arch"] == "arm64"
    own = {"spec": {"nodeSelector": {"kubernetes.io/arch": "s390x", "pool": "big"}}}
    assert node_selector_of(own, d) == (("kubernetes.io/arch", "s390x"), ("pool", "big"))


def test_B3_launcher_defaults_of_malformed_or_missing_crs_add_nothing():
    from model.admission import LauncherDefaults, launcher_defaults

    assert launcher_defaults([]) == LauncherDefaults()
    assert launcher_defaults([{"status": {"defaultArchitecture": 7}, "spec": []}, "junk"]) == LauncherDefaults()


def test_B3_node_of_another_architecture_is_not_eligible_and_the_refusal_says_so():
    from model.admission import launcher_defaults, node_selector_of

    sel = node_selector_of({"spec": {}}, launcher_defaults([KUBEVIRT_CR]))
    arm, amd = {"kubernetes.io/arch": "arm64"}, {"kubernetes.io/arch": "amd64", "pool": "vms"}
    s = world([node("node-1", 1, **arm), node("node-2", 4, **amd)], [dev("gpu-a")])
    d = decide(s, replace(req("gpu-a"), node_selector=sel))
    assert d.result is Result.SUCCEEDED and d.node == "node-2"  # node-1 fits tighter (B4)
    s2 = world([node("node-1", 1, **arm)], [dev("gpu-a")])
    d2 = decide(s2, replace(req("gpu-a"), node_selector=sel))
    assert d2.result is Result.REFUSED
    assert d2.reason.reasons == per_node(
        ("node-1", SelectorMismatch((("kubernetes.io/arch", "amd64"), ("pool", "vms")))))
    s3 = world([node("node-1", 1, pool="vms", **arm)], [dev("gpu-a")])  # names only what fails
    assert decide(s3, replace(req("gpu-a"), node_selector=sel)).reason.reasons == per_node(
        ("node-1", SelectorMismatch((("kubernetes.io/arch", "amd64"),))))


def test_W1_a_device_mode_class_needs_no_permitted_host_device():
    """DR1/DR5: KubeVirt takes DRA GPUs from the VMI's claims, not from permittedHostDevices,
    so a device-mode class is never refused as not permitted (its quota key is no host
    device), while a count-mode class beside it still is."""
    from datetime import datetime, timedelta, timezone

    from model.admission import AdmissionPlan, check
    from model.parse import VMIAsk
    from model.snapshot import Snapshot
    from model.types import Namespace
    from tests.support.dra_worlds import CLASS, device_class, dra_node

    s = Snapshot.build(nodes=[dra_node("hgx-1")], classes=[device_class()],
                       namespaces=[Namespace(NS)])
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    got = check(s, NS, "vm-1", VMIAsk((), ((CLASS, 2),)), set(), now, timedelta(minutes=2),
                permitted=frozenset({"nvidia.com/L40S"}))
    assert isinstance(got, AdmissionPlan) and got.node == "hgx-1", got
