"""The words of housekeeping's findings, written once (model/housekeeping_reasons.py): each
`render()` is what an operator reads in the leader's log lines, Events and conditions, so
these are pinned here verbatim and nowhere else; every other test compares codes and data."""

from datetime import datetime, timezone

import pytest

from model import housekeeping_reasons as r

UNTIL = datetime(2026, 11, 30, 8, 30, tzinfo=timezone.utc)


@pytest.mark.parametrize("reason, text", [
    (r.VmiExists("vm-a"), "VMI vm-a exists"),
    (r.VmiExists("vm-a", "u1"), "VMI vm-a (uid u1) exists"),
    (r.VmiDeleted("vm-a"), "VMI vm-a was deleted"),
    (r.VmiDeleted("vm-a", "u1"), "VMI vm-a (uid u1) was deleted"),
    (r.VmiNotYetSeen("vm-a"), "VMI vm-a has not appeared yet"),
    (r.VmiNeverAppeared("vm-b", 121), "VMI vm-b has not appeared 121 s after attachment"),
    (r.NewIncarnationInFlight("vm-a"),
     "VMI vm-a exists as another incarnation (an admission of a new one in flight)"),
    (r.AnotherIncarnation("vm-a", "a2", "a1"),
     "VMI vm-a exists as another incarnation (admission a2, not a1)"),
    (r.AnotherIncarnation("vm-a", None, "a1"),
     "VMI vm-a exists as another incarnation (admission none, not a1)"),
    (r.RequestRefused("vm-a"), "the request of VMI vm-a was refused"),
    (r.RefusalBeingRead("vm-a"),
     "the request of VMI vm-a was refused; its webhook may still be reading the answer"),
    (r.UidRecorded(), "VMI seen: its uid recorded"),
    (r.OrphanTemplate(500), "template device with no attachment, 500 s old"),
    (r.YieldedTemplate("vm-a"),
     "template device of VMI vm-a, which yielded to a preemptor, with no attachment"),
    (r.KeepNotKnown("vm1"),
     "VMI vm1 is gone; whether VirtualMachine vm1 keeps its set is not known yet"),
    (r.KeepStarts("vm1", 1800), "VMI vm1 is gone; VirtualMachine vm1 keeps its set for 1800 s"),
    (r.Kept("vm1", UNTIL), "kept for VirtualMachine vm1 until 2026-11-30T08:30:00Z"),
    (r.KeptVmDeleted("vm1", "vm-uid-1"),
     "VirtualMachine vm1 (uid vm-uid-1) was deleted: its kept set is released"),
    (r.KeptVmDeleting("vm1"), "VirtualMachine vm1 is being deleted: its kept set is released"),
    (r.KeepRanOut("vm1", UNTIL), "the set kept for VirtualMachine vm1 ran out at 2026-11-30T08:30:00Z"),
    (r.ClaimUnused("gone", 121),
     "VMI gone does not exist and no device is attached to it, 121 s after the claim was made"),
    (r.ClaimOfReleasedKeep("vm"),
     "the set kept for VirtualMachine vm was released and no VMI of its name exists"),
])
def test_each_finding_renders_its_words_once(reason, text):
    assert reason.render() == text == str(reason)
    assert isinstance(reason.code, r.HousekeepingCode)


def test_every_code_has_one_reason_type():
    codes = [cls.code for cls in vars(r).values()
             if isinstance(cls, type) and issubclass(cls, r.HousekeepingReason)
             and cls is not r.HousekeepingReason]
    assert sorted(codes) == sorted(r.HousekeepingCode)


def test_rules_show_as_the_contract_names_them():
    assert [str(x) for x in r.Rule] == ["H1", "H2", "H1/H2", "H3", "H4", "DR6"]


def test_the_kept_condition_and_the_class_conditions_render_the_words_written_to_status():
    kept = r.KeptCondition(("n1",), ("vm1-h100-0", "vm1-h100-1", "vm1-l40s-0"),
                           datetime(2026, 11, 30, 8, 29, tzinfo=timezone.utc))
    assert kept.render() == (
        "GPU set kept on node n1 (devices vm1-h100-0, vm1-h100-1, vm1-l40s-0) until "
        "2026-11-30T08:29:00Z (GPUClass keepSetFor): the next VMI of this VirtualMachine starts "
        "there with the same devices; deleting the VirtualMachine releases them")
    assert r.KeptCondition((), ("d",), UNTIL).render().startswith("GPU set kept on node (none) ")
    assert r.CannotServe("DeviceClass x does not exist").as_tuple() == (
        "False", "CannotServe", "DeviceClass x does not exist")
    assert r.ServesDevices("vfio.gpu.nvidia.com", "gpu.nvidia.com/partition{size}").as_tuple() == (
        "True", "DeviceMode", "devices of DeviceClass vfio.gpu.nvidia.com in the nodes' "
        "ResourceSlices, sets share gpu.nvidia.com/partition{size}")
    assert r.ServesDevices("vfio.gpu.nvidia.com").render() == (
        "devices of DeviceClass vfio.gpu.nvidia.com in the nodes' ResourceSlices")
    assert r.ServesUnits("nvidia.com/H100").as_tuple() == (
        "True", "CountMode", "units of extended resource nvidia.com/H100")
    assert r.NoKubeVirt().as_tuple() == (
        "Unknown", "NoKubeVirt", "no KubeVirt CR found; permittedHostDevices cannot be checked")
    assert r.Permitted("nvidia.com/H100").as_tuple() == (
        "True", "Permitted",
        "nvidia.com/H100 is in the KubeVirt CR's spec.configuration.permittedHostDevices")
    assert r.NotPermitted("nvidia.com/H100").as_tuple() == (
        "False", "NotPermitted",
        "nvidia.com/H100 is not in the KubeVirt CR's spec.configuration.permittedHostDevices: "
        "KubeVirt would not start a VMI asking for it, so the webhook denies such VMIs")


def test_the_events_render_the_words_an_operator_reads():
    until = datetime(2026, 11, 30, 8, 30, 0, 250000, tzinfo=timezone.utc)
    kept = r.SetKeptEvent("t1", "vm1", ("g0", "g1"), ("n1",), until)
    assert (kept.reason, kept.warning) == ("GPUSetKept", False)
    assert kept.render() == (
        "GPU set of VirtualMachine t1/vm1 (devices g0, g1 on node n1) kept until "
        "2026-11-30T08:30:00.250000Z (keepSetFor): its next VMI starts there with the same "
        "devices; deleting the VM releases them")
    released = r.SetReleasedEvent("t1", "vm1", ("g0", "g1"), r.KeepRanOut("vm1", UNTIL))
    assert (released.reason, released.warning) == ("GPUSetReleased", False)
    assert released.render() == (
        "GPU set of VirtualMachine t1/vm1 (devices g0, g1) released: the set kept for "
        "VirtualMachine vm1 ran out at 2026-11-30T08:30:00Z")
    restored = r.ClaimRestoredEvent("t", "vm-gpus", "n1", (("held", "gpu-vfio-2"),
                                                          ("vm-t-0", "gpu-vfio-3")))
    assert (restored.reason, restored.warning) == ("GPUClaimRestored", True)
    assert restored.render() == (
        "ResourceClaim t/vm-gpus of this VMI was deleted before its launcher Pod took it; made "
        "again from the binder's record (node n1, devices held=gpu-vfio-2, vm-t-0=gpu-vfio-3). "
        "Delete the VMI to release its GPUs.")
    created = r.ParameterMissingEvent("cozy-system", "gpu-settings")
    failed = r.ParameterMissingEvent("cozy-system", "gpu-settings", "Forbidden here")
    assert (created.reason, created.warning) == ("PolicyParameterMissing", True)
    assert created.render() == (
        "ConfigMap cozy-system/gpu-settings, the parameter of ValidatingAdmissionPolicies "
        "gpu-binder-raw-pods, gpu-binder-raw-vmis and gpu-binder-raw-claims, was missing, and "
        "H3 created it: until then the shipped policies denied every Pod, VMI, ResourceClaim "
        "and ResourceClaimTemplate they match (parameterNotFoundAction: Deny)")
    assert failed.detail() == (
        "missing, and H3 cannot create it: the shipped policies deny every Pod, VMI, "
        "ResourceClaim and ResourceClaimTemplate they match until it exists "
        "(parameterNotFoundAction: Deny): Forbidden here")
    assert failed.render().endswith("gpu-binder-raw-claims, " + failed.detail())
