"""k8s.dra_index: the cache's incremental view of ResourceSlices, claims and DeviceClasses
turned into each node's device-mode fields (DR1, DR2), with canned objects of the shapes
NVIDIA's driver publishes (localcluster.dra_profiles)."""

from __future__ import annotations

import pytest

from k8s.dra_index import DraIndex, SliceError
from localcluster.dra_profiles import DEVICE_CLASS, HGX_H100_8, L40S_4, device_class, resource_slice
from model.claim import parse_claim
from model.device.dra import DeviceRef, DeviceSet
from model.device.match import MatchAttribute
from model.types import DeviceStatus, GPUClass, GPUDevice, Node, Phase, dra_resource_name

RES = dra_resource_name(DEVICE_CLASS)
HGX = GPUClass("hgx", RES, device_class_name=DEVICE_CLASS,
               selectors=('device.attributes["gpu.nvidia.com"].productName.startsWith("GH100")',),
               match_attribute="gpu.nvidia.com/partition{size}")
L40S = GPUClass("l40s", RES, device_class_name=DEVICE_CLASS,
                selectors=('device.attributes["gpu.nvidia.com"].productName == "AD102GL [L40S]"',))


def claim(*devices: tuple[str, str], request: str = "gpu") -> dict:
    """A claim whose allocation lists `devices` ((pool, device) of driver gpu.nvidia.com)."""
    return {"metadata": {"name": "c", "namespace": "t"},
            "status": {"allocation": {"devices": {"results": [
                {"request": request, "driver": "gpu.nvidia.com", "pool": p, "device": d}
                for p, d in devices]}}}}


def bound(node: str, device: str) -> GPUDevice:
    return GPUDevice("t", f"dev-{device}", "hgx", status=DeviceStatus(
        Phase.BOUND, node, None, device=DeviceRef("gpu.nvidia.com", node, device)))


def world() -> DraIndex:
    idx = DraIndex()
    idx.put_device_class(device_class())
    idx.set_classes([HGX, L40S])
    idx.put_slice(resource_slice("hgx-1", HGX_H100_8))
    idx.put_slice(resource_slice("l40s-1", L40S_4))
    return idx


def names(fields, cls: str) -> list[str]:
    return [d.ref.device for c, devs in fields.class_devices if c == cls for d in devs]


def test_each_class_gets_the_devices_its_deviceclass_and_own_selectors_match():
    idx = world()
    hgx = idx.node_fields("hgx-1", [])
    assert names(hgx, "hgx") == [f"gpu-vfio-{i}" for i in range(8)]
    assert names(hgx, "l40s") == []
    assert hgx.allocatable == ((RES, 8),) and hgx.foreign == () and hgx.taken_devices == frozenset()
    l40s = idx.node_fields("l40s-1", [])
    assert names(l40s, "l40s") == [f"gpu-vfio-{i}" for i in range(4)] and names(l40s, "hgx") == []
    assert l40s.allocatable == ((RES, 4),)


def test_DR2_a_claims_allocation_and_a_hard_taint_take_devices_and_records_excuse_their_own():
    idx = world()
    assert idx.put_claim(("t", "c"), parse_claim(claim(("hgx-1", "gpu-vfio-2"), ("hgx-1", "gpu-vfio-3")))) == {"hgx-1"}
    fields = idx.node_fields("hgx-1", [bound("hgx-1", "gpu-vfio-2")])
    assert fields.taken_devices == {"gpu-vfio-2", "gpu-vfio-3"}
    assert fields.foreign == ((RES, 1),)  # gpu-vfio-2 is the binder's own record
    idx.put_slice(resource_slice("hgx-1", HGX_H100_8, generation=2,
                                 taints={5: [{"key": "health", "value": "xid", "effect": "NoExecute"}],
                                         6: [{"key": "soft", "effect": "PreferNoSchedule"}]}))
    fields = idx.node_fields("hgx-1", [])
    assert fields.taken_devices == {"gpu-vfio-2", "gpu-vfio-3", "gpu-vfio-5"}
    assert fields.foreign == ((RES, 3),)
    assert idx.remove_claim(("t", "c")) == {"hgx-1"}
    assert idx.node_fields("hgx-1", []).taken_devices == {"gpu-vfio-5"}


def test_DR2_a_claim_the_binder_did_not_make_is_told_apart_and_follows_its_changes():
    """`foreign_claimed`: the devices a claim other than the recording set's own allocates: one
    without the binder's managed-by label (an administrator's), or one with it in another
    namespace than the recording GPUDevice's (a tenant copying our labels); the binder's own
    claims take devices (`taken_devices`) but are not in it. A label change, a new allocation
    and a deletion each move it, and nothing is left behind."""
    from model.claim import MANAGED_BY, MANAGED_BY_LABEL
    idx = world()
    raw = claim(("hgx-1", "gpu-vfio-1"))
    raw["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    ours = parse_claim(raw)
    assert idx.put_claim(("t", "ours"), ours) == {"hgx-1"}
    assert idx.put_claim(("t", "ours"), ours) == set()  # unchanged
    assert idx.put_claim(("admin", "theirs"), parse_claim(claim(("hgx-1", "gpu-vfio-4")))) == {"hgx-1"}
    rec = [bound("hgx-1", "gpu-vfio-1")]  # a device of namespace t records gpu-vfio-1
    fields = idx.node_fields("hgx-1", rec)
    assert fields.taken_devices == {"gpu-vfio-1", "gpu-vfio-4"}
    assert fields.foreign_claimed == {"gpu-vfio-4"}
    relabelled = parse_claim(claim(("hgx-1", "gpu-vfio-1")))  # same allocation, label gone
    assert idx.put_claim(("t", "ours"), relabelled) == {"hgx-1"}
    assert idx.node_fields("hgx-1", rec).foreign_claimed == {"gpu-vfio-1", "gpu-vfio-4"}
    assert idx.put_claim(("t", "ours"), ours) == {"hgx-1"}
    assert idx.remove_claim(("admin", "theirs")) == {"hgx-1"}
    fields = idx.node_fields("hgx-1", [bound("hgx-1", "gpu-vfio-1")])  # t's device records it
    assert (fields.taken_devices, fields.foreign_claimed) == ({"gpu-vfio-1"}, frozenset())
    # our labels on a claim in another namespace than the recording device's: foreign
    assert idx.put_claim(("mallory", "copy"), parse_claim({**raw, "metadata": {
        "name": "copy", "namespace": "mallory", "labels": {MANAGED_BY_LABEL: MANAGED_BY}}}))
    fields = idx.node_fields("hgx-1", [bound("hgx-1", "gpu-vfio-1")])
    assert fields.foreign_claimed == {"gpu-vfio-1"}
    assert idx.remove_claim(("mallory", "copy")) == {"hgx-1"}
    assert idx.node_fields("hgx-1", [bound("hgx-1", "gpu-vfio-1")]).foreign_claimed == frozenset()
    assert idx.remove_claim(("t", "ours")) == {"hgx-1"}
    assert idx._ours_by_ns == {} and idx._allocated_not_ours == {}  # nothing left behind


def test_DR1_only_the_highest_pool_generation_counts_and_a_vanished_device_is_gone():
    idx = world()
    smaller = resource_slice("hgx-1", HGX_H100_8, generation=3)
    smaller["spec"]["devices"] = smaller["spec"]["devices"][:6]
    smaller["metadata"]["name"] = "hgx-1-new"
    assert idx.put_slice(smaller) == {"hgx-1"}
    assert names(idx.node_fields("hgx-1", []), "hgx") == [f"gpu-vfio-{i}" for i in range(6)]
    assert idx.node_fields("hgx-1", []).allocatable == ((RES, 6),)
    assert idx.remove_slice("hgx-1-new") == {"hgx-1"}  # the old generation counts again
    assert idx.node_fields("hgx-1", []).allocatable == ((RES, 8),)
    assert idx.remove_slice("hgx-1-gpu.nvidia.com") == {"hgx-1"}
    assert idx.node_fields("hgx-1", []).class_devices == () and "hgx-1" not in idx.nodes()


def test_DR1_class_problems_name_what_is_wrong():
    idx = DraIndex()
    assert idx.class_problem(HGX) == f"DeviceClass {DEVICE_CLASS} does not exist"
    idx.put_device_class(device_class())
    assert idx.class_problem(HGX) is None
    bad = GPUClass("bad", RES, device_class_name=DEVICE_CLASS, selectors=("device.driver ==",))
    assert idx.class_problem(bad).startswith("spec.selectors: CEL selector 'device.driver ==' does not compile")
    broken = device_class()
    broken["spec"]["selectors"][0]["cel"]["expression"] = "((("
    idx.put_device_class(broken)
    assert idx.class_problem(HGX).startswith(f"DeviceClass {DEVICE_CLASS}: CEL selector '(((' does not compile")
    assert idx.class_problem(GPUClass("count", "nvidia.com/H100")) is None


def test_malformed_objects_raise_slice_error_and_leave_the_rest():
    idx = world()
    with pytest.raises(SliceError, match="spec.driver is missing"):
        idx.put_slice({"metadata": {"name": "x"}, "spec": {"pool": {"name": "p"}}})
    with pytest.raises(SliceError, match="lacks driver, pool or device"):
        idx.put_claim(("t", "bad"), parse_claim({"metadata": {"name": "bad"}, "status": {
            "allocation": {"devices": {"results": [{"device": "d"}]}}}}))
    assert idx.node_fields("hgx-1", []).allocatable == ((RES, 8),)


def test_a_claim_on_a_pool_no_node_publishes_touches_no_node():
    idx = world()
    assert idx.put_claim(("t", "c"), parse_claim(claim(("elsewhere", "gpu-vfio-0")))) == set()
    assert idx.put_claim(("t", "c"), parse_claim(claim(("elsewhere", "gpu-vfio-0")))) == set()  # unchanged
    assert idx.node_fields("hgx-1", []).taken_devices == frozenset()


# -- through ClusterCache's informers (events in the order the watches may deliver them) ------

def test_the_cache_fills_node_fields_and_class_problems_from_informer_events():
    from model.serialize import device_status_to_dict
    from tests.k8s.test_cache_foreign import cache, event, stamped

    c = cache()
    node = {"metadata": {"name": "hgx-1", "labels": {"kubevirt.io/schedulable": "true"}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    hgx = {"metadata": {"name": "hgx"}, "spec": {
        "deviceClassName": DEVICE_CLASS, "topology": {"matchAttribute": "gpu.nvidia.com/partition{size}"}}}
    event(c.slices, stamped(resource_slice("hgx-1", HGX_H100_8)))
    event(c.nodes, stamped(node))
    event(c.classes, stamped(hgx))
    assert c.view.classes()["hgx"].problem == f"DeviceClass {DEVICE_CLASS} does not exist"
    assert c.view.node("hgx-1").class_devices == ()
    event(c.device_classes, stamped(device_class()))
    assert c.view.classes()["hgx"].problem is None
    n = c.view.node("hgx-1")
    assert [d.ref.device for d in n.devices_of("hgx")] == [f"gpu-vfio-{i}" for i in range(8)]
    assert n.allocatable_of(RES) == 8 and n.foreign == ()
    event(c.claims, stamped(claim(("hgx-1", "gpu-vfio-0"), ("hgx-1", "gpu-vfio-1"))))
    assert c.view.node("hgx-1").taken_devices == {"gpu-vfio-0", "gpu-vfio-1"}
    assert dict(c.view.node("hgx-1").foreign) == {RES: 2}
    # the binder's own record on the node excuses its device from foreign (DR2)
    dev = bound("hgx-1", "gpu-vfio-0")
    event(c.devices, stamped({"metadata": {"name": dev.name, "namespace": "t"}, "spec": {"class": "hgx"},
                              "status": device_status_to_dict(dev.status)}))
    assert dict(c.view.node("hgx-1").foreign) == {RES: 1}
    event(c.claims, None, ("t", "c"))
    assert c.view.node("hgx-1").taken_devices == frozenset() and c.view.node("hgx-1").foreign == ()
    event(c.device_classes, None, ("", DEVICE_CLASS))
    assert c.view.classes()["hgx"].problem == f"DeviceClass {DEVICE_CLASS} does not exist"
    assert c.view.node("hgx-1").class_devices == () and c.view.node("hgx-1").allocatable_of(RES) == 0


def test_DR1_the_ready_condition_says_the_problem_or_the_mode():
    from dataclasses import replace

    from model.housekeeping import ready_condition
    from model.housekeeping_reasons import CannotServe, ServesDevices, ServesUnits

    assert ready_condition(HGX) == ServesDevices(DEVICE_CLASS, HGX.match_attribute)
    assert HGX.match_attribute
    assert ready_condition(GPUClass("h100", "nvidia.com/H100")) == ServesUnits("nvidia.com/H100")
    missing = replace(HGX, problem=f"DeviceClass {DEVICE_CLASS} does not exist")
    assert ready_condition(missing) == CannotServe(f"DeviceClass {DEVICE_CLASS} does not exist")


def test_a_selector_run_time_error_is_no_match_and_is_reported_once():
    idx = DraIndex()
    idx.put_device_class(device_class())
    odd = GPUClass("odd", RES, device_class_name=DEVICE_CLASS,
                   selectors=('device.attributes["gpu.nvidia.com"].noSuchAttribute == 1',))
    idx.set_classes([odd])
    idx.put_slice(resource_slice("hgx-1", HGX_H100_8))
    assert names(idx.node_fields("hgx-1", []), "odd") == []
    errors = idx.drain_errors()
    assert len(errors) == 8 and {e[0] for e in errors} == {"odd"}
    assert errors[0][1] == "gpu.nvidia.com/hgx-1/gpu-vfio-0" and "noSuchAttribute" in errors[0][2]
    idx.node_fields("hgx-1", [])
    assert idx.drain_errors() == []  # remembered verdicts are not re-evaluated


# -- memory: one parsed copy, shared between boards (issue 32; bench.dra_memory has the bytes) --

def test_a_slice_is_parsed_once_at_ingest_and_identical_boards_share_their_attributes():
    from tests.k8s.test_cache_foreign import cache, event, stamped

    c = cache()
    event(c.device_classes, stamped(device_class()))
    event(c.classes, stamped({"metadata": {"name": "hgx"}, "spec": {"deviceClassName": DEVICE_CLASS}}))
    for node in ("hgx-1", "hgx-2"):
        event(c.nodes, stamped({"metadata": {"name": node}, "spec": {},
                                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
        event(c.slices, stamped(resource_slice(node, HGX_H100_8)))
    kept = c.slices.get(("", "hgx-1-gpu.nvidia.com"))
    assert set(kept) == {"metadata", "parsed", "error"} and kept["error"] is None  # no raw devices
    held = c.dra.devices("hgx-1")
    assert all(a is b for a, b in zip(kept["parsed"].devices, held, strict=True))
    assert all(a is b for a, b in zip(c.view.node("hgx-1").devices_of("hgx"), held, strict=True))
    other = c.dra.devices("hgx-2")
    assert [d.ref.device for d in other] == [f"gpu-vfio-{i}" for i in range(8)]
    assert all(a.attributes is b.attributes for a, b in zip(held, other))
    assert held[0].attributes is not held[1].attributes  # another PCI address, another tuple
    # a relist brings the same slice again: the informer keeps the value the index holds
    event(c.slices, stamped(resource_slice("hgx-1", HGX_H100_8)))
    again = c.slices.get(("", "hgx-1-gpu.nvidia.com"))
    assert again["parsed"] is kept["parsed"] and c.dra.devices("hgx-1")[0] is held[0]
    assert c.dra.put_slice(resource_slice("hgx-1", HGX_H100_8)) == set()


def test_sharing_never_takes_0_for_False_nor_their_verdicts():
    idx = DraIndex()
    idx.put_device_class(device_class())
    flag = GPUClass("flag", RES, device_class_name=DEVICE_CLASS,
                    selectors=('device.attributes["gpu.nvidia.com"].flag == false',))
    idx.set_classes([flag])

    def board(node: str, value: dict) -> dict:
        obj = resource_slice(node, HGX_H100_8)
        for d in obj["spec"]["devices"]:
            d["attributes"]["flag"] = dict(value)
        return obj

    idx.put_slice(board("a", {"bool": False}))
    idx.put_slice(board("b", {"int": 0}))
    a, b = idx.devices("a")[0], idx.devices("b")[0]
    assert a.attributes == b.attributes and a.attributes is not b.attributes
    assert dict(a.attributes)["gpu.nvidia.com/flag"] is False
    assert type(dict(b.attributes)["gpu.nvidia.com/flag"]) is int
    assert len(names(idx.node_fields("a", []), "flag")) == 8
    assert names(idx.node_fields("b", []), "flag") == []  # CEL: int 0 == false is false
    assert idx.put_slice(board("a", {"int": 0})) == {"a"}  # the same value of another type changed
    assert names(idx.node_fields("a", []), "flag") == []


def test_the_sharing_table_starts_over_past_its_bound_and_answers_stay_the_same(monkeypatch):
    import k8s.dra_index as dra_index

    monkeypatch.setattr(dra_index, "SHARE_MAX", 40)  # one HGX board fills it: every slice starts over
    idx = world()
    for i in (2, 3):
        idx.put_slice(resource_slice(f"hgx-{i}", HGX_H100_8))
    two, three = idx.devices("hgx-2"), idx.devices("hgx-3")
    assert [d.attributes for d in two] == [d.attributes for d in three]
    assert not any(a.attributes is b.attributes for a, b in zip(two, three))
    for node in ("hgx-1", "hgx-2", "hgx-3"):
        fields = idx.node_fields(node, [])
        assert names(fields, "hgx") == [f"gpu-vfio-{k}" for k in range(8)]
        assert fields.allocatable == ((RES, 8),)


def test_a_malformed_slice_is_kept_as_its_reason_logged_and_left_out():
    from structlog.testing import capture_logs

    from k8s.cache import ingest_slice
    from tests.k8s.test_cache_foreign import cache, event, stamped

    c = cache()
    event(c.device_classes, stamped(device_class()))
    event(c.slices, stamped(resource_slice("hgx-1", HGX_H100_8)))
    assert c.dra.nodes() == {"hgx-1"}
    bad = stamped(resource_slice("hgx-1", HGX_H100_8))
    bad["spec"]["devices"][3] = "not a device"
    with capture_logs() as logs:
        event(c.slices, bad)
    kept = c.slices.get(("", "hgx-1-gpu.nvidia.com"))
    assert kept["parsed"] is None and "malformed" in kept["error"]
    assert ingest_slice(kept, c.dra.parse_slice) is kept  # the watch may hand it back
    assert [(e["kind"], e["name"]) for e in logs if e["event"] == "skipping malformed object"] == [
        ("ResourceSlice", "hgx-1-gpu.nvidia.com")]
    assert c.dra.nodes() == set()


# -- a claim parsed once; one pool gathering; selectors compiled once (issue 38) ------------

def test_a_claim_is_parsed_once_at_ingest_and_the_index_reads_that_value():
    """The claim informer keeps name, namespace, resourceVersion and the parsed `Claim`
    (`k8s.cache.ingest_claim`), nothing of the tenant's labels or the spec; a claim with an
    allocation that cannot be read is logged and left out of the DRA index."""
    from structlog.testing import capture_logs

    from k8s.cache import ingest_claim
    from model.claim import MANAGED_BY, MANAGED_BY_LABEL, Claim
    from tests.k8s.test_cache_foreign import cache, event, stamped

    c = cache()
    event(c.device_classes, stamped(device_class()))
    event(c.classes, stamped({"metadata": {"name": "hgx"}, "spec": {"deviceClassName": DEVICE_CLASS}}))
    event(c.nodes, stamped({"metadata": {"name": "hgx-1"}, "spec": {},
                            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
    event(c.slices, stamped(resource_slice("hgx-1", HGX_H100_8)))
    raw = stamped(claim(("hgx-1", "gpu-vfio-0")))
    raw["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY, "tenant": "label"}
    event(c.claims, raw)
    kept = c.claims.get(("t", "c"))
    assert set(kept) == {"metadata", "parsed"} and isinstance(kept["parsed"], Claim)
    assert kept["metadata"] == {"name": "c", "namespace": "t",
                                "resourceVersion": raw["metadata"]["resourceVersion"]}
    assert kept["parsed"] == parse_claim(raw) and kept["parsed"].managed
    assert ingest_claim(kept) is kept  # the watch may hand it back
    assert c.view.node("hgx-1").taken_devices == {"gpu-vfio-0"}
    assert ("t", "c") not in c.dra._not_ours  # the binder's: counted by namespace, not foreign
    bad = stamped(claim(("hgx-1", "gpu-vfio-1")))
    del bad["status"]["allocation"]["devices"]["results"][0]["pool"]
    with capture_logs() as logs:
        event(c.claims, bad)
    assert c.claims.get(("t", "c"))["parsed"].problem is not None
    assert [(e["kind"], e["name"]) for e in logs if e["event"] == "skipping malformed object"] == [
        ("ResourceClaim", "c")]
    assert c.view.node("hgx-1").taken_devices == frozenset()


def test_the_index_gathers_pools_by_the_one_rule_the_bench_and_demo_use():
    """`DraIndex` applies `model.device.dra.pool_devices` pool by pool as slices come and go; the
    result is the function's over all the slices it holds (current generation, node-local,
    first listing of a name by slice name)."""
    from model.device.dra import parse_resource_slice, pool_devices

    idx = DraIndex()
    old = resource_slice("hgx-1", HGX_H100_8)
    new = resource_slice("hgx-1", HGX_H100_8, generation=2)
    new["metadata"]["name"], new["spec"]["devices"] = "hgx-1-new", new["spec"]["devices"][2:]
    twin = resource_slice("hgx-1", HGX_H100_8, generation=2)
    twin["metadata"]["name"], twin["spec"]["devices"] = "hgx-1-twin", twin["spec"]["devices"][:3]
    other = resource_slice("l40s-1", L40S_4)
    held = [old, new, twin, other]
    for obj in held:
        idx.put_slice(obj)
    expected = pool_devices(parse_resource_slice(o) for o in held)
    assert {n: idx.devices(n) for n in idx.nodes()} == expected
    assert [d.ref.device for d in expected["hgx-1"]] == [f"gpu-vfio-{i}" for i in range(8)]
    idx.remove_slice("hgx-1-new")
    expected = pool_devices(parse_resource_slice(o) for o in (old, twin, other))
    assert {n: idx.devices(n) for n in idx.nodes()} == expected
    assert [d.ref.device for d in expected["hgx-1"]] == ["gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-2"]


def test_a_classs_own_selectors_are_compiled_once(monkeypatch):
    """`class_problem` (the cache asks it for every class on each class change),
    `set_classes` and `node_fields` share one compilation per class and expressions; a
    changed expression is compiled again, a class gone is forgotten."""
    from dataclasses import replace

    from model.device.cel import Selector

    compiled: list[str] = []
    real = Selector.compile

    def counting(expression):
        compiled.append(expression)
        return real(expression)

    idx = DraIndex()
    idx.put_device_class(device_class())
    monkeypatch.setattr(Selector, "compile", staticmethod(counting))
    for _ in range(3):
        assert idx.class_problem(HGX) is None and idx.class_problem(L40S) is None
    idx.set_classes([HGX, L40S])
    idx.put_slice(resource_slice("hgx-1", HGX_H100_8))
    assert names(idx.node_fields("hgx-1", []), "hgx") == [f"gpu-vfio-{i}" for i in range(8)]
    assert sorted(compiled) == sorted(HGX.selectors + L40S.selectors)
    wider = replace(HGX, selectors=('device.attributes["gpu.nvidia.com"].productName.startsWith("G")',))
    assert idx.class_problem(wider) is None
    idx.set_classes([wider, L40S])
    assert compiled[-1] == wider.selectors[0] and len(compiled) == 3
    idx.set_classes([L40S])
    assert set(idx._class_selectors) == {"l40s"}


def test_a_nodes_devices_keep_their_layouts_and_equal_boards_share_one():
    idx = world()
    idx.put_slice(resource_slice("hgx-2", HGX_H100_8))
    one = dict(idx.node_fields("hgx-1", []).class_devices)["hgx"]
    two = dict(idx.node_fields("hgx-2", []).class_devices)["hgx"]
    assert isinstance(one, DeviceSet) and one != two  # each node's own devices
    assert one.board is two.board  # which look the same: one board, its layouts worked out once
    match = MatchAttribute.of(HGX.match_attribute)
    assert one.board.layout(match, 4) is two.board.layout(match, 4)
    assert Node("hgx-1", class_devices=(("hgx", one),)).devices_of("hgx") is one
