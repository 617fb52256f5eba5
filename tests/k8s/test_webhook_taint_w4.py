"""HL1 at the webhook (docs/contract.md §4 W4, §5 H4; docs/device-mode.md "A held device on a
tainted GPU"): the next VMI of a VM whose set is kept (H4) takes W4's short cut (the set
re-keyed to it, no new request) only while its records hold; when one records a GPU now
under a NoSchedule device taint (a DeviceTaintRule's) the admission writes a new request
instead (`_reserve`: the binder re-points or moves the set), so the VMI is never admitted
onto the tainted GPU. `VMIAdmission._admit` with its steps replaced by recorders."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import anyio
import pytest

from fakes.kube_client import ScriptedClient
from k8s.webhook import steps
from k8s.webhook.admission import VMIAdmission, _Judged
from k8s.webhook.steps import Attempt
from model.admission import AdmissionPlan
from model.device.dra import DeviceTaint
from model.device.taint_rules import TaintRule
from model.housekeeping import VMIs
from model.snapshot import Snapshot
from model.types import Attachment, BindRequest, DeviceStatus, GPUDevice, Phase, Result
from tests.k8s.test_admission_claim import _Cache
from tests.support.dra_worlds import CLASS, device_class, dra_node, ref
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 6, 15, tzinfo=timezone.utc)
GRACE = timedelta(seconds=30)
XID = TaintRule("xid-79", DeviceTaint("example.com/xid", "79", "NoSchedule")).taint


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def kept_pair() -> list[GPUDevice]:
    """a and b kept for VM vm1 (uid vm-uid), its VMI gone: Bound on n1 recording {3, 0}."""
    att = Attachment("vm1", NOW - timedelta(minutes=5), "adm-1", "vmi-u1", "vm-uid", NOW + timedelta(hours=1))
    br = BindRequest("adm-1", "vm1", ("a", "b"), result=Result.SUCCEEDED, node="n1")
    return [GPUDevice("t1", name, CLASS, status=DeviceStatus(Phase.BOUND, "n1", NOW - timedelta(hours=1),
                                                             att, br, ref("n1", i)))
            for name, i in (("a", 3), ("b", 0))]


def fleet(tainted: bool) -> Snapshot:
    n1 = dra_node("n1")
    if tainted:
        n1 = replace(n1, class_devices=tuple(
            (c, tuple(replace(d, taints=(XID,)) if d.ref.device == "gpu-vfio-0" else d for d in devs))
            for c, devs in n1.class_devices), taken_devices=frozenset({"gpu-vfio-0"}))
    return Snapshot.build(nodes=[n1, dra_node("n2")], classes=[device_class()], devices=kept_pair())


async def admitted_through(snap: Snapshot, monkeypatch) -> list[str]:
    """Which way `_admit` went for vm1's next VMI (owned by vm-uid): "take_over" (W4) or
    "reserve" (W3: a new request)."""
    went: list[str] = []
    adm = VMIAdmission(ScriptedClient(), _Cache(snap), bind_timeout=5.0, grace=GRACE,  # type: ignore[arg-type]
                       clock=lambda: NOW)
    attempt = Attempt("t1", "vm1", "adm-2", NOW, VMIs(), GRACE, lambda: NOW, "vm-uid")

    async def judge(review, deadline):
        return _Judged(AdmissionPlan("t1", "vm1", ("a", "b"), (), "n1"), (), snap, attempt)

    async def take_over(*a, **kw):
        went.append("take_over")
        return True

    async def wire(*a, **kw):
        return []

    async def reserve(review, judged, deadline):
        went.append("reserve")
        return "n1", []
    monkeypatch.setattr(adm, "_judge", judge)
    monkeypatch.setattr(adm, "_wire", wire)
    monkeypatch.setattr(adm, "_reserve", reserve)
    monkeypatch.setattr(steps, "take_over", take_over)
    review = SimpleNamespace(uid="u", namespace="t1", name="vm1", dry_run=False,
                             object={"metadata": {"name": "vm1"}, "spec": {}}, tolerations=())
    await adm._admit(review, anyio.current_time() + 5)
    return went


async def test_W4_a_kept_set_whose_records_hold_is_taken_over_without_a_new_request(monkeypatch):
    assert await admitted_through(fleet(tainted=False), monkeypatch) == ["take_over"]


async def test_HL1_a_kept_set_recording_a_tainted_gpu_goes_to_the_binder_with_a_new_request(monkeypatch):
    assert await admitted_through(fleet(tainted=True), monkeypatch) == ["reserve"]
