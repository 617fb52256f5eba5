"""H1 and H2 decisions of model.housekeeping.plan (pure)."""

from datetime import datetime, timedelta, timezone

from model.housekeeping import ClearAttachment, DeleteTemplate, plan
from model.types import Attachment, DeviceStatus, GPUDevice, Phase

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
GRACE = timedelta(minutes=2)


def dev(name, vmi=None, since_s=0, template_for=None, created_s=0, bound=None):
    att = Attachment(vmi, NOW - timedelta(seconds=since_s)) if vmi else None
    status = DeviceStatus(phase=Phase.BOUND if bound else Phase.PENDING, node_name=bound,
                          attached_to=att)
    return GPUDevice("t1", name, "h100", template_for=template_for, status=status,
                     uid=f"uid-{name}", created_at=NOW - timedelta(seconds=created_s))


def test_H1_attachment_of_vmi_that_never_appeared_is_cleared_after_grace_only():
    young, old = dev("young", "vm-a", since_s=119), dev("old", "vm-b", since_s=121, bound="n1")
    assert plan([young, old], set(), set(), NOW, GRACE) == [
        ClearAttachment(("t1", "old"), "vm-b", "H1", "VMI vm-b has not appeared 121 s after attachment")]


def test_H1_template_of_missing_vmi_deleted_and_unattached_old_template_deleted():
    attached = dev("vm-x-0", "vm-x", since_s=300, template_for="vm-x", created_s=300)
    orphan = dev("vm-y-0", template_for="vm-y", created_s=500)
    fresh_orphan = dev("vm-z-0", template_for="vm-z", created_s=10)
    got = plan([orphan, attached, fresh_orphan], set(), set(), NOW, GRACE)
    assert got == [
        DeleteTemplate(("t1", "vm-x-0"), "uid-vm-x-0", "H1",
                       "VMI vm-x has not appeared 300 s after attachment"),
        DeleteTemplate(("t1", "vm-y-0"), "uid-vm-y-0", "H1",
                       "template device with no attachment, 500 s old"),
    ]


def test_H2_deleted_vmi_releases_held_devices_at_once_and_deletes_templates():
    held = dev("held", "vm-a", since_s=5, bound="n1")
    tmpl = dev("vm-a-0", "vm-a", since_s=5, template_for="vm-a", bound="n1")
    other = dev("other", "vm-b", since_s=5000, bound="n2")
    got = plan([held, tmpl, other], {("t1", "vm-b")}, {("t1", "vm-a")}, NOW, GRACE)
    assert got == [
        ClearAttachment(("t1", "held"), "vm-a", "H2", "VMI vm-a was deleted"),
        DeleteTemplate(("t1", "vm-a-0"), "uid-vm-a-0", "H2", "VMI vm-a was deleted"),
    ]


def test_live_vmi_protects_its_devices_however_old():
    d = dev("held", "vm-a", since_s=10_000, bound="n1")
    t = dev("vm-a-0", template_for="vm-a", created_s=10_000)
    assert plan([d, t], {("t1", "vm-a")}, set(), NOW, GRACE) == []
