"""The ResourceClaim of an admitted device-mode set and the VMI's wiring to it (model/claim.py,
DR5), exact objects; ownership (a tenant's claim of the name is never ours); housekeeping's
judgement of the claims the binder made (H1/H2)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.dra_profiles import HGX_H100_8, gpu_uuid
from model.admission import AdmissionPlan
from model.claim import (ClaimMember, ClaimRecord, DeleteClaim, build_claim, claim_name,
                         claim_record, claim_vmi_patch, members_of, parse_claim, same_spec,
                         stale_claims, stamp_ops, uuid_selector)
from model.housekeeping_reasons import ClaimOfReleasedKeep, ClaimUnused, Rule
from model.reasons import DeviceUnrecorded
from model.snapshot import Snapshot
from model.types import DeviceStatus, GPUClass, GPUDevice, Phase
from tests.support.dra_worlds import (DEVICE_CLASS, DRIVER, RES, device_class, dra_node, recorded,
                                      ref)

NOW = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
H100 = device_class()
L40S = device_class("l40s", "resource.kubernetes.io/pcieRoot")


def sel(uuid: str) -> list[dict]:
    return [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'}}]


def test_DR5_claim_of_a_pair_pins_each_device_by_uuid_and_constrains_the_partition():
    members = [ClaimMember("gpu-a", H100, ref("n1", 3), gpu_uuid(HGX_H100_8, 3)),
               ClaimMember("vm-h100x-0", H100, ref("n1", 0), gpu_uuid(HGX_H100_8, 0))]
    claim = build_claim("t1", "vm", members, "adm-1", NOW)
    assert claim == {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "vm-gpus", "namespace": "t1",
                     "labels": {"app.kubernetes.io/managed-by": "gpu-binder",
                                "gpu.cozystack.io/claim-for": "vm"},
                     "annotations": {"gpu.cozystack.io/claim-for": "vm",
                                     "gpu.cozystack.io/admission": "adm-1",
                                     "gpu.cozystack.io/claimed-at": "2026-12-04T10:00:00Z"}},
        "spec": {"devices": {
            "requests": [
                {"name": "gpu-0", "exactly": {"deviceClassName": DEVICE_CLASS,
                                              "allocationMode": "ExactCount", "count": 1,
                                              "selectors": sel(gpu_uuid(HGX_H100_8, 3))}},
                {"name": "gpu-1", "exactly": {"deviceClassName": DEVICE_CLASS,
                                              "allocationMode": "ExactCount", "count": 1,
                                              "selectors": sel(gpu_uuid(HGX_H100_8, 0))}}],
            "constraints": [{"matchAttribute": "gpu.nvidia.com/partition2"}]}}}


def test_DR5_two_classes_each_constrain_only_their_own_requests_and_a_class_without_attribute_none():
    plain = GPUClass("plain", RES, device_class_name=DEVICE_CLASS)
    members = [ClaimMember("a", H100, ref("n1", 0), "u0"), ClaimMember("b", L40S, ref("n1", 4), "u4"),
               ClaimMember("c", H100, ref("n1", 1), "u1"), ClaimMember("d", plain, ref("n1", 5), "u5"),
               ClaimMember("e", L40S, ref("n1", 6), "u6")]
    spec = build_claim("t1", "vm", members, "adm", NOW)["spec"]
    assert [r["name"] for r in spec["devices"]["requests"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert spec["devices"]["constraints"] == [
        {"requests": ["gpu-0", "gpu-2"], "matchAttribute": "gpu.nvidia.com/partition2"},
        {"requests": ["gpu-1", "gpu-4"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    alone = build_claim("t1", "vm", [ClaimMember("d", plain, ref("n1", 5), "u5")], "adm", NOW)
    assert "constraints" not in alone["spec"]["devices"]


def test_DR5_one_device_keeps_its_size_one_constraint():
    spec = build_claim("t1", "vm", [ClaimMember("a", H100, ref("n1", 0), "u0")], "adm", NOW)["spec"]
    assert spec["devices"]["constraints"] == [{"matchAttribute": "gpu.nvidia.com/partition1"}]


def test_claim_name_is_deterministic_and_fits_253_characters():
    assert claim_name("vm") == "vm-gpus"
    long = "v" * 253
    name = claim_name(long)
    assert len(name) == 253 and name == claim_name(long) and name != claim_name("v" * 252 + "w")
    labels = build_claim("t1", long, [ClaimMember("a", H100, ref("n1", 0), "u0")], "x", NOW)["metadata"]
    assert len(labels["labels"]["gpu.cozystack.io/claim-for"]) == 63
    assert labels["annotations"]["gpu.cozystack.io/claim-for"] == long


def test_a_uuid_that_is_not_a_plain_token_never_reaches_cel():
    assert uuid_selector("gpu.nvidia.com", "GPU-1234abcd") == 'device.attributes["gpu.nvidia.com"].uuid == "GPU-1234abcd"'
    assert uuid_selector("example.com", "u") == 'device.attributes["example.com"].uuid == "u"'
    with pytest.raises(ValueError):
        uuid_selector("gpu.nvidia.com", 'x" || true || "')


def _snap(*devices: GPUDevice, classes=(H100,)) -> Snapshot:
    return Snapshot.build(nodes=[dra_node("n1", classes=tuple(c.name for c in classes))],
                          classes=list(classes), devices=list(devices))


def test_DR5_members_are_read_from_the_records_and_the_nodes_slices_in_plan_order():
    snap = _snap(recorded("t1", "held", "n1", 3), recorded("t1", "vm-h100x-0", "n1", 0))
    plan = AdmissionPlan("t1", "vm", ("held",), (("vm-h100x-0", "h100x"),), "n1")
    assert members_of(snap, plan, "n1") == (
        ClaimMember("held", H100, ref("n1", 3), gpu_uuid(HGX_H100_8, 3)),
        ClaimMember("vm-h100x-0", H100, ref("n1", 0), gpu_uuid(HGX_H100_8, 0)))


def test_DR5_a_member_without_its_record_on_the_node_or_with_a_vanished_device_is_retryable():
    bare = GPUDevice("t1", "held", "h100x", status=DeviceStatus(Phase.BOUND, "n1"))
    plan = AdmissionPlan("t1", "vm", ("held",), (), "n1")
    got = members_of(_snap(bare), plan, "n1")
    assert got == DeviceUnrecorded("held", "n1", None) and got.category.value == "unavailable"
    elsewhere = recorded("t1", "held", "n2", 3)
    assert members_of(_snap(elsewhere), plan, "n1") == DeviceUnrecorded("held", "n1", None)
    gone = GPUDevice("t1", "held", "h100x", status=DeviceStatus(
        Phase.BOUND, "n1", device=ref("n1", 42)))
    assert members_of(_snap(gone), plan, "n1") == DeviceUnrecorded("held", "n1", "gpu.nvidia.com/n1/gpu-vfio-42")


def test_a_count_mode_set_has_no_claim():
    count = GPUClass("h100", "nvidia.com/H100")
    snap = Snapshot.build(nodes=[dra_node("n1")], classes=[count],
                          devices=[GPUDevice("t1", "g", "h100", status=DeviceStatus(Phase.BOUND, "n1"))])
    assert members_of(snap, AdmissionPlan("t1", "vm", ("g",), (), "n1"), "n1") is None


def test_DR5_vmi_patch_wires_the_claim_replaces_entries_of_its_devices_keeps_others_and_pins():
    members = [ClaimMember("gpu-a", H100, ref("n1", 3), "u3"), ClaimMember("gpu-b", H100, ref("n1", 0), "u0")]
    vmi = {"metadata": {"name": "vm", "annotations": {"x": "y"}},
           "spec": {"nodeSelector": {"zone": "z1"},
                    "resourceClaims": [{"name": "nic", "resourceClaimName": "nic-claim"},
                                       {"name": "gpu-binder", "resourceClaimName": "forged"}],
                    "domain": {"devices": {"gpus": [
                        {"name": "gpu-a", "deviceName": "something"},             # our device's name
                        {"name": "x", "claimName": "gpu-binder", "requestName": "gpu-9"},  # our claim's
                        {"name": "count", "deviceName": "nvidia.com/H100"},       # a count-mode resource
                        {"name": "vgpu", "deviceName": "nvidia.com/GRID"}]}}}}   # not ours: kept
    ops = claim_vmi_patch(vmi, "vm", members, "n1", ("nvidia.com/H100",), "adm-1")
    assert ops == [
        {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1admission", "value": "adm-1"},
        {"op": "add", "path": "/spec/resourceClaims", "value": [
            {"name": "nic", "resourceClaimName": "nic-claim"},
            {"name": "gpu-binder", "resourceClaimName": "vm-gpus"}]},
        {"op": "add", "path": "/spec/domain/devices/gpus", "value": [
            {"name": "vgpu", "deviceName": "nvidia.com/GRID"},
            {"name": "gpu-a", "claimName": "gpu-binder", "requestName": "gpu-0"},
            {"name": "gpu-b", "claimName": "gpu-binder", "requestName": "gpu-1"}]},
        {"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": "n1"}]


def test_DR5_vmi_patch_of_a_vmi_without_spec_builds_it_whole():
    ops = claim_vmi_patch({"metadata": {"name": "vm"}}, "vm",
                          [ClaimMember("g", H100, ref("n1", 0), "u0")], "n1", ())
    assert ops == [{"op": "add", "path": "/spec", "value": {
        "domain": {"devices": {"gpus": [{"name": "g", "claimName": "gpu-binder", "requestName": "gpu-0"}]}},
        "nodeSelector": {"kubernetes.io/hostname": "n1"},
        "resourceClaims": [{"name": "gpu-binder", "resourceClaimName": "vm-gpus"}]}}]


def test_ownership_needs_our_label_and_the_annotation_naming_the_vmi():
    ours = parse_claim(build_claim("t1", "vm", [ClaimMember("g", H100, ref("n1", 0), "u0")], "a", NOW))
    assert ours.is_for("vm") and not ours.is_for("other")
    tenant = parse_claim({"metadata": {"name": "vm-gpus",
                                       "labels": {"app.kubernetes.io/managed-by": "gpu-binder"}}})
    assert not tenant.is_for("vm")                     # the label alone is not enough
    assert not parse_claim({"metadata": {"name": "vm-gpus", "annotations": {
        "gpu.cozystack.io/claim-for": "vm"}}}).is_for("vm")   # nor the annotation alone
    assert claim_record(tenant) is None                # never judged by housekeeping


def test_a_stored_spec_with_the_servers_defaults_is_the_same_and_another_device_is_not():
    m = [ClaimMember("g", H100, ref("n1", 0), "u0")]
    spec = build_claim("t1", "vm", m, "a", NOW)["spec"]
    stored = {"spec": {"devices": {"requests": [{"name": "gpu-0", "exactly": {
        "deviceClassName": DEVICE_CLASS, "count": 1, "selectors": sel("u0")}}],
        "constraints": [{"matchAttribute": "gpu.nvidia.com/partition1"}]}}}
    assert same_spec(parse_claim(stored), spec)
    other = build_claim("t1", "vm", [ClaimMember("g", H100, ref("n1", 1), "u1")], "a", NOW)
    assert not same_spec(parse_claim(other), spec)


def test_W4_stamp_tests_the_version_read_and_restarts_the_clock():
    raw = {"metadata": {"resourceVersion": "41", "annotations": {}}}
    assert stamp_ops(parse_claim(raw), "adm-2", NOW) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
        {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1admission", "value": "adm-2"},
        {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1claimed-at",
         "value": "2026-12-04T10:00:00Z"}]


def _record(vmi: str, age: float, **kw) -> ClaimRecord:
    return ClaimRecord("t1", f"{vmi}-gpus", f"uid-{vmi}", "7", vmi, NOW - timedelta(seconds=age), **kw)


def test_H1_H2_a_claim_is_deleted_only_without_its_vmi_and_attachments_after_the_grace():
    grace = timedelta(seconds=120)
    claims = [_record("gone", 121), _record("young", 119), _record("live", 500),
              _record("attached", 500), _record("deleting", 500, deleting=True)]
    got = stale_claims(claims, attached={("t1", "attached")}, live={("t1", "live")}, now=NOW,
                       grace=grace)
    assert got == [DeleteClaim(claims[0], Rule.H1_H2, ClaimUnused("gone", 121))]


def test_H1_the_clock_is_the_last_confirmation_else_the_creation():
    raw = build_claim("t1", "vm", [ClaimMember("g", H100, ref("n1", 0), "u0")], "a", NOW)
    raw["metadata"].update(uid="u", resourceVersion="3", creationTimestamp="2026-12-04T09:00:00Z")
    assert claim_record(parse_claim(raw)) == ClaimRecord("t1", "vm-gpus", "u", "3", "vm", NOW,
                                                         admission="a")
    del raw["metadata"]["annotations"]["gpu.cozystack.io/claimed-at"]
    assert claim_record(parse_claim(raw)).since == NOW - timedelta(hours=1)


def test_H4_the_claim_of_a_released_keep_goes_at_once_unless_confirmed_since_or_still_held():
    grace = timedelta(seconds=120)
    claims = [_record("vm", 10, admission="adm-1"),            # its keep released: at once
              _record("newer", 10, admission="adm-3"),         # confirmed by a newer admission
              _record("restarted", 10, admission="adm-2"),     # its VMI runs again
              _record("still", 10, admission="adm-4")]         # devices still attached
    got = stale_claims(claims, attached={("t1", "still")}, live={("t1", "restarted")}, now=NOW,
                       grace=grace, released={("t1", "adm-1"), ("t1", "adm-2"), ("t1", "adm-4"),
                                              ("t2", "adm-3")})
    assert got == [DeleteClaim(claims[0], Rule.H4, ClaimOfReleasedKeep("vm"))]


# -- DR6: the claim of an admitted VMI, made again from the record --------------------------

def _admitted(name: str, index: int, *, admission: str = "adm-1", devices=("held", "vm-h100x-0"),
              result=None, node: str = "n1", vmi: str = "vm") -> GPUDevice:
    """A member of VMI `vm`'s set as a finished admission leaves it: attached by `admission`,
    the request Succeeded on `node`, Bound there with its record."""
    from model.types import Attachment, BindRequest, Result
    br = BindRequest("req-1", vmi, tuple(devices), result=result or Result.SUCCEEDED, node=node)
    return GPUDevice("t1", name, "h100x", status=DeviceStatus(
        Phase.BOUND, node, None, Attachment(vmi, NOW, admission), br, ref(node, index)))


def _unrecorded(d: GPUDevice) -> GPUDevice:
    """`d` without its `status.device` record (count mode, or the record not written yet)."""
    from dataclasses import replace
    return replace(d, status=replace(d.status, device=None))


def _live(admission: str | None = "adm-1"):
    from model.housekeeping import VMIRecord
    return {("t1", "vm"): VMIRecord("t1", "vm", "uid-1", admission)}


def test_DR6_a_live_admitted_vmi_without_its_claim_is_restored_in_the_requests_order():
    from model.claim import RestoreClaim, missing_claims
    devs = [_admitted("vm-h100x-0", 0), _admitted("held", 1)]
    assert missing_claims(devs, _live(), set(), {"h100x"}) == [
        RestoreClaim("t1", "vm", "uid-1", "adm-1", "n1", ("held", "vm-h100x-0"))]
    # its claim there (ours or not), no VMI, a VMI not admitted by us, a count-mode class: none
    assert missing_claims(devs, _live(), {("t1", "vm-gpus")}, {"h100x"}) == []
    assert missing_claims(devs, {}, set(), {"h100x"}) == []
    assert missing_claims(devs, _live(None), set(), {"h100x"}) == []
    assert missing_claims(devs, _live(), set(), {"other"}) == []


def test_DR6_a_set_whose_record_does_not_hold_whole_is_never_restored():
    from model.claim import missing_claims
    from model.types import Result
    cases = {
        "another admission's attachment": [_admitted("vm-h100x-0", 0), _admitted("held", 1, admission="adm-0")],
        "a member missing": [_admitted("held", 1)],
        "refused": [_admitted("vm-h100x-0", 0, result=Result.REFUSED), _admitted("held", 1, result=Result.REFUSED)],
        "two nodes": [_admitted("vm-h100x-0", 0), _admitted("held", 1, node="n2")],
        "a member not recorded": [_admitted("vm-h100x-0", 0), _unrecorded(_admitted("held", 1))],
        "no member recorded": [_unrecorded(_admitted("vm-h100x-0", 0)), _unrecorded(_admitted("held", 1))],
    }
    for what, devs in cases.items():
        assert missing_claims(devs, _live(), set(), {"h100x"}) == [], what


def test_DR6_the_live_vmi_must_be_the_same_incarnation_alive_and_wired_as_recorded():
    from model.claim import RestoreClaim, claim_entry, gpu_entries, restorable_into
    members = [ClaimMember("held", H100, ref("n1", 1), "u1"), ClaimMember("vm-h100x-0", H100, ref("n1", 0), "u0")]
    r = RestoreClaim("t1", "vm", "uid-1", "adm-1", "n1", ("held", "vm-h100x-0"))
    vmi = {"metadata": {"name": "vm", "uid": "uid-1"},   # as the admission wired it (DR5)
           "spec": {"resourceClaims": [claim_entry("vm")],
                    "domain": {"devices": {"gpus": [{"name": "x", "deviceName": "other"},
                                                    *gpu_entries(members)]}}}}
    assert restorable_into(vmi, r, members) is None
    assert restorable_into({**vmi, "metadata": {"uid": "uid-2"}}, r, members) == "another incarnation of the VMI"
    assert "deleted" in restorable_into({**vmi, "metadata": {"uid": "uid-1", "deletionTimestamp": "x"}}, r, members)
    assert "finished" in restorable_into({**vmi, "status": {"phase": "Failed"}}, r, members)
    swapped = list(reversed(members))          # the same devices on each other's requests
    assert restorable_into(vmi, r, swapped) == "the VMI's gpus entries are not the record's"
    assert restorable_into({**vmi, "spec": {**vmi["spec"], "resourceClaims": []}}, r, members) \
        == "the VMI does not name the claim"


def test_DR6_devices_without_a_record_are_skipped_before_anything_else_is_read_of_them():
    """Housekeeping hands `missing_claims` every device each round; one without
    `status.device` (every count-mode device) costs a single attribute read: its attachment,
    request and class are not looked at (an object without them does not fail)."""
    from types import SimpleNamespace

    from model.claim import RestoreClaim, missing_claims
    count_mode = [SimpleNamespace(status=SimpleNamespace(device=None)) for _ in range(3)]
    devs = [count_mode[0], _admitted("vm-h100x-0", 0), *count_mode[1:], _admitted("held", 1)]
    assert missing_claims(devs, _live(), set(), {"h100x"}) == [
        RestoreClaim("t1", "vm", "uid-1", "adm-1", "n1", ("held", "vm-h100x-0"))]


def test_a_claim_read_back_is_parsed_once_into_every_field_its_readers_use():
    """`parse_claim`: the one reading of a claim's metadata, status and spec (the DRA index,
    housekeeping and the webhook read the `Claim`); total: a claim missing everything reads
    as nobody's, unallocated, not held."""
    from model.claim import Claim
    from model.device.dra import DeviceRef

    raw = build_claim("t1", "vm", [ClaimMember("g", H100, ref("n1", 0), "u0")], "adm-1", NOW)
    raw["metadata"].update(uid="u", resourceVersion="9", deletionTimestamp="2026-12-04T10:01:00Z")
    raw["status"] = {"reservedFor": [{"resource": "pods", "name": "virt-launcher-vm-x"}],
                     "allocation": {"devices": {"results": [
                         {"request": "gpu-0", "driver": DRIVER, "pool": "n1", "device": "gpu-vfio-0"}]}}}
    claim = parse_claim(raw)
    assert claim == Claim("t1", "vm-gpus", "u", "9", managed=True, vmi="vm", admission="adm-1",
                          since=NOW, deleting=True, in_use=True,
                          allocated=(DeviceRef(DRIVER, "n1", "gpu-vfio-0"),),
                          spec_digest=claim.spec_digest)
    assert same_spec(claim, raw["spec"]) and claim.is_for("vm")
    assert parse_claim({}) == Claim("", "", spec_digest=parse_claim({}).spec_digest)
    assert not parse_claim({"metadata": {"labels": "not a map"}, "status": []}).managed


def _fresh(value):
    """An equal copy of `value` that is another object where Python allows it (strings of two
    characters or more, datetimes, tuples of DeviceRefs): what a second decode of the same
    JSON gives."""
    from model.device.dra import DeviceRef

    if isinstance(value, str):
        return "".join(list(value))
    if isinstance(value, datetime):
        return datetime.fromisoformat(value.isoformat())
    if isinstance(value, tuple):
        return tuple(DeviceRef(_fresh(r.driver), _fresh(r.pool), _fresh(r.device)) for r in value)
    return value


def _claim_fields():
    import dataclasses

    from model.claim import Claim

    return [f.name for f in dataclasses.fields(Claim)]


def test_a_claim_shared_with_the_one_held_keeps_its_changes_and_takes_only_equal_parts():
    """`shared_with` (the cache's ingest of a watched claim): a field the new claim changed is
    the new claim's own object, nothing of the old one in it; a field equal to the old
    claim's is the old claim's object (`is`: one copy held); the value is the new claim."""
    import orjson

    from model.claim import shared_with

    listed = build_claim("t1", "vm", [ClaimMember("g", H100, ref("n1", 0), "u0"),
                                      ClaimMember("h", H100, ref("n1", 1), "u1")], "adm-1", NOW)
    listed["metadata"].update(uid="uid-1", resourceVersion="100")
    listed["status"] = {"allocation": {"devices": {"results": [
        {"request": f"gpu-{i}", "driver": DRIVER, "pool": "n1", "device": f"gpu-vfio-{i}"}
        for i in range(2)]}}}
    watched = build_claim("t1", "vm", [ClaimMember("g", H100, ref("n1", 0), "u0"),
                                       ClaimMember("h", H100, ref("n1", 1), "u1")], "adm-2",
                          NOW + timedelta(minutes=1))              # re-confirmed by adm-2
    watched["metadata"].update(uid="uid-1", resourceVersion="101")
    watched["status"] = {"reservedFor": [{"resource": "pods", "name": "virt-launcher-vm-x"}],
                         "allocation": {"devices": {"results": [
                             {"request": f"gpu-{i}", "driver": DRIVER, "pool": "n1",
                              "device": f"gpu-vfio-{i + 2}"} for i in range(2)]}}}
    old, new = (parse_claim(orjson.loads(orjson.dumps(o))) for o in (listed, watched))
    assert new.name is not old.name and new.uid is not old.uid   # two decodes: two copies
    got = shared_with(new, old)
    assert got == new
    changed = {"resource_version", "admission", "since", "in_use", "allocated"}
    assert {f for f in _claim_fields() if getattr(new, f) != getattr(old, f)} == changed
    for f in changed:
        assert getattr(got, f) is getattr(new, f), f
    for f in ("namespace", "name", "uid", "vmi", "spec_digest"):
        assert getattr(got, f) is getattr(old, f), f
    assert shared_with(new, None) is new


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_shared_with_takes_exactly_the_equal_fields_of_the_old_claim(data):
    """Any two claims: the result equals the new one; each field equal to the old claim's
    is the old claim's object, each other field the new claim's (resourceVersion and the
    claimed-at time included: a relist delivers a claim unchanged)."""
    from model.claim import Claim, shared_with
    from model.device.dra import DeviceRef

    later = NOW + timedelta(seconds=5)
    pools = {"namespace": ["t1", "t2"], "name": ["vm-gpus", "vm2-gpus"],
             "uid": ["", "uid-1", "uid-2"], "resource_version": ["", "100", "101"],
             "managed": [False, True], "vmi": [None, "vm", "vm2"],
             "admission": [None, "adm-1", "adm-2"], "since": [None, NOW, later],
             "deleting": [False, True], "in_use": [False, True],
             "allocated": [(), (DeviceRef(DRIVER, "n1", "gpu-vfio-0"),),
                           (DeviceRef(DRIVER, "n1", "gpu-vfio-0"), DeviceRef(DRIVER, "n1", "gpu-vfio-1"))],
             "problem": [None, "ResourceClaim vm-gpus: an allocation result lacks driver"],
             "spec_digest": ["", "ab" * 32, "cd" * 32]}
    assert set(pools) == set(_claim_fields())
    old = Claim(**{f: _fresh(data.draw(st.sampled_from(v), label=f"old.{f}")) for f, v in pools.items()})
    new = Claim(**{f: _fresh(data.draw(st.sampled_from(v), label=f"new.{f}")) for f, v in pools.items()})
    got = shared_with(new, old)
    assert got == new
    for f in _claim_fields():
        source = old if getattr(new, f) == getattr(old, f) else new
        assert getattr(got, f) is getattr(source, f), f
