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
