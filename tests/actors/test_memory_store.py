"""The in-memory store's writes keep every field they do not write (they build values with
the constructors, not `dataclasses.replace`, for speed)."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timezone

import pytest

from fakes.memory_store import MemoryStore
from actors.ports import StatusWrite
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result

H100 = "nvidia.com/H100"
T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_value_types_have_the_fields_the_store_copies() -> None:
    """A new field on one of these types must be copied by the store's `_with_status` too
    (an answer copies the BindRequest with `dataclasses.replace`): update it, then this
    list."""
    assert [f.name for f in fields(GPUDevice) if f.init] == [
        "namespace", "name", "class_name", "template_for", "status", "resource_version", "uid",
        "created_at", "deleting"]
    assert [f.name for f in fields(DeviceStatus)] == [
        "phase", "node_name", "bound_at", "attached_to", "bind_request", "device"]
    assert [f.name for f in fields(BindRequest)] == [
        "id", "vmi", "devices", "requested_at", "node_selector", "result", "message", "node",
        "tolerations", "code", "priority"]


@pytest.mark.anyio
async def test_memory_store_copies_every_field() -> None:
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 2})
    key = s.add_device("t", "a", "h100", template_for="vm")
    base = s.device(key)
    assert base is not None
    s._devices[key] = GPUDevice("t", "a", "h100", "vm", base.status, "rv-7", "uid-1", T0)

    rid = s.request("t", "vm", ["a"], request_id="r1", node_selector={"zone": "z1"})
    dev = s.device(key)
    assert (dev.template_for, dev.resource_version, dev.uid, dev.created_at) == ("vm", "rv-7", "uid-1", T0)
    br = dev.status.bind_request
    assert (br.id, br.vmi, br.devices, br.node_selector) == (rid, "vm", ("a",), (("zone", "z1"),))
    assert dev.status.attached_to.vmi == "vm"

    await s.answer(StatusWrite(key, rid, Result.SUCCEEDED, "placed", node="n1", bound_at=T0))
    dev = s.device(key)
    assert (dev.namespace, dev.name, dev.class_name, dev.template_for, dev.resource_version,
            dev.uid, dev.created_at) == ("t", "a", "h100", "vm", "rv-7", "uid-1", T0)
    st = dev.status
    assert (st.phase, st.node_name, st.bound_at) == (Phase.BOUND, "n1", T0)
    assert isinstance(st.attached_to, Attachment) and st.attached_to.vmi == "vm"
    br = st.bind_request
    assert (br.id, br.vmi, br.devices, br.requested_at, br.node_selector, br.result, br.message,
            br.node) == (rid, "vm", ("a",), br.requested_at, (("zone", "z1"),), Result.SUCCEEDED,
                         "placed", "n1")
    assert br.requested_at is not None

    assert s.withdraw("t", rid) == 1
    dev = s.device(key)
    assert dev.status.bind_request is None and dev.status.attached_to is None
    assert (dev.status.phase, dev.status.node_name, dev.status.bound_at) == (Phase.BOUND, "n1", T0)
    assert (dev.resource_version, dev.uid, dev.created_at) == ("rv-7", "uid-1", T0)
    assert [r.seq for r in s.history] == list(range(1, len(s.history) + 1))


@pytest.mark.anyio
async def test_without_history_writes_are_still_observed_in_order() -> None:
    s = MemoryStore(keep_history=False)
    seen = []
    s.on_write = seen.append
    s.add_namespace("t")
    s.add_class("h100", H100)
    key = s.add_device("t", "a", "h100")
    rid = s.request("t", "vm", ["a"])
    await s.answer(StatusWrite(key, rid, Result.SUCCEEDED, "placed", node="n1", bound_at=T0))
    assert s.history == []
    assert [(r.seq, r.op, r.moved) for r in seen] == [(1, "request", False), (2, "answer", True)]


def test_vmis_are_deleted_only_with_their_uid_and_each_delete_is_recorded() -> None:
    """§3c P4: the leader deletes a victim's VMI with its uid as precondition; the store plays
    that and records each delete (op `vmi-deleted`), which the chaos test checks (P6)."""
    s = MemoryStore()
    seen = []
    s.on_write = seen.append
    first = s.add_vmi("t", "vm-1", admission="adm-1")
    assert s.vmi("t", "vm-1") == (first, "adm-1")
    again = s.add_vmi("t", "vm-1", admission="adm-2")  # created again: another incarnation
    assert again != first and s.vmi("t", "vm-1") == (again, "adm-2")
    assert not s.delete_vmi("t", "vm-1", first)  # the old uid: the precondition fails
    assert s.delete_vmi("t", "vm-1", again, by="preemption:x")
    assert s.vmi("t", "vm-1") is None and not s.delete_vmi("t", "vm-1", again)
    assert s.deleted_vmis == [("t", "vm-1", again, "adm-2", "preemption:x")]
    assert [(r.op, r.key, r.request_id, r.message) for r in seen] == [
        ("vmi-deleted", "t/vm-1", again, "preemption:x")]
