"""Issue 40: what the waiting-VM rounds ask of every VM costs no copy of its template, and the
webhook's view of the VMIs without a new VMI's name is the view itself (no copy of every
VMI). Work counted, never timed."""

from __future__ import annotations

import copy

from model import vm as vm_module
from model.housekeeping import VMIRecord, VMIs
from model.vm import asks_gpus, vmi_of_vm


def _vm(annotations: dict) -> dict:
    return {"metadata": {"name": "vm-a", "namespace": "t1", "uid": "u1"},
            "spec": {"runStrategy": "Always", "template": {
                "metadata": {"annotations": annotations, "labels": {"app": "x"}},
                "spec": {"domain": {"devices": {"disks": [{"name": "root"}]}}}}}}


def test_asks_gpus_reads_the_template_annotations_without_copying_its_spec(monkeypatch):
    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(vm_module.copy, "deepcopy", lambda x, *a: copies.append(x) or real(x, *a))
    assert asks_gpus(_vm({"gpu.cozystack.io/templates": "h100=1"})) is True
    assert asks_gpus(_vm({"other.example.com/x": "1"})) is False
    assert asks_gpus({"metadata": {"name": "bare"}, "spec": {"template": "not a mapping"}}) is False
    assert copies == []
    # the VMI itself is built as before (its spec a deep copy)
    got = vmi_of_vm(_vm({"gpu.cozystack.io/templates": "h100=1"}))
    assert got["metadata"]["annotations"] == {"gpu.cozystack.io/templates": "h100=1"}
    assert len(copies) == 1


def test_vmis_without_a_name_that_is_not_live_is_the_same_value_uncopied():
    live = {("t1", f"vm-{i}"): VMIRecord("t1", f"vm-{i}", f"u{i}", f"adm-{i}") for i in range(50)}
    vmis = VMIs(live, frozenset({("t1", "adm-old")}))
    assert vmis.without(("t1", "new-vm")) is vmis
    gone = vmis.without(("t1", "vm-3"))          # a live one: known not to exist now
    assert ("t1", "vm-3") not in gone.live and len(gone.live) == 49
    assert ("t1", "adm-3") in gone.deleted and ("t1", "u3") not in gone.uids
    assert vmis.without(("t1", "vm-3")) == gone and ("t1", "vm-3") in vmis.live


class _CountedLive(dict):
    """A live-VMI mapping that counts the passes over its values."""

    passes = 0

    def values(self):
        type(self).passes += 1
        return super().values()


def test_vmis_work_out_the_live_uids_only_when_asked():
    live = _CountedLive({("t1", f"vm-{i}"): VMIRecord("t1", f"vm-{i}", f"u{i}" if i else "")
                         for i in range(20)})
    vmis = VMIs(live)
    assert _CountedLive.passes == 0               # made after every VMI event: no pass yet
    assert ("t1", "u3") in vmis.uids and ("t1", "") not in vmis.uids and len(vmis.uids) == 19
    assert _CountedLive.passes == 1               # once, then kept
    assert vmis == VMIs(dict(live)) and "uids" not in repr(vmis)


def test_refresh_of_an_empty_line_reads_none_of_the_running_vms():
    from datetime import datetime, timezone

    from model.line import Identity, Line
    from model.line_plan import refresh

    class Gone(list):
        def __iter__(self):
            raise AssertionError("an empty line read the gone VMs")

    gone = Gone([Identity("t1", f"vm-{i}", f"u{i}") for i in range(100)])
    now = datetime(2026, 12, 7, tzinfo=timezone.utc)
    assert list(refresh(Line(()), [], gone, now)) == []
