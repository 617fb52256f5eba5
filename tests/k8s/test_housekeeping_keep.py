"""H4's VM condition `GPUSetKept` as the leader's housekeeping writes it
(`k8s.housekeeping.kept.KeptSets.write_conditions`): True on a VM without a VMI whose set is
kept for it (node, devices, until when), removed once the keep ends, a VM with a VMI left to
virt-controller (it keeps only the VMI's conditions), nothing written when nothing changed.
The API calls go to a `fakes.kube_client.ScriptedClient`; tests/e2e/test_vm_keep.py checks
it against the real virt-controller."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.housekeeping import FIELD_MANAGER, Housekeeper
from model.housekeeping import KEPT_CONDITION, VMIRecord, VMIs, kept_for_vms
from model.housekeeping_reasons import KeptCondition
from model.types import Attachment, DeviceStatus, GPUDevice, Phase

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
UNTIL = NOW + timedelta(minutes=10)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def kept_dev(name: str, vm: str = "vm1", owner: str = "u1") -> GPUDevice:
    att = Attachment(vm, NOW - timedelta(minutes=5), "adm", "vmi-u", owner, UNTIL)
    return GPUDevice("t", name, "h100", template_for=vm,
                     status=DeviceStatus(phase=Phase.BOUND, node_name="n1", attached_to=att))


def vm(name: str, uid: str, conditions: list | None = None, rv: str = "7") -> dict:
    return {"metadata": {"namespace": "t", "name": name, "uid": uid, "resourceVersion": rv},
            "spec": {}, "status": {"conditions": conditions or []}}


def keeper(client: ScriptedClient, vms: list[dict], live: tuple[str, ...] = ()) -> Housekeeper:
    cache = SimpleNamespace(vmi_state=lambda: VMIs({("t", n): VMIRecord("t", n, f"{n}-u")
                                                    for n in live}))
    informer = SimpleNamespace(items=lambda: vms, healthy=True)
    return Housekeeper(client, cache, grace=timedelta(minutes=2),  # type: ignore[arg-type]
                       raw_policy="denied", vms=informer)  # type: ignore[arg-type]


async def test_H4_stopped_vm_gets_GPUSetKept_true_with_node_devices_and_until():
    client = ScriptedClient()
    other = {"type": "Failure", "status": "False"}
    k = keeper(client, [vm("vm1", "u1", [other])])
    await k.kept.write_conditions(kept_for_vms([kept_dev("g1"), kept_dev("g0")], NOW), NOW)
    [(res, ns, name, ops)] = [c.args[:4] for c in client.calls if c.method == "patch_status"]
    assert (res.plural, ns, name) == ("virtualmachines", "t", "vm1")
    assert client.calls[0].field_manager == FIELD_MANAGER
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1]["path"] == "/status/conditions"
    conds = ops[1]["value"]
    assert conds[0] == other                                   # others kept as they are
    assert {k: conds[1][k] for k in ("type", "status", "reason", "lastTransitionTime")} == {
        "type": KEPT_CONDITION, "status": "True", "reason": "SetKept",
        "lastTransitionTime": "2026-12-01T08:00:00Z"}
    assert conds[1]["message"] == KeptCondition(("n1",), ("g0", "g1"), UNTIL).render()
    assert k.kept.condition_writes == 1
    # the VM as written: nothing more to write
    client2 = ScriptedClient()
    k2 = keeper(client2, [vm("vm1", "u1", conds)])
    await k2.kept.write_conditions(kept_for_vms([kept_dev("g1"), kept_dev("g0")], NOW), NOW)
    assert client2.of("patch_status") == []


async def test_H4_condition_removed_when_the_keep_ended_and_left_alone_while_a_vmi_exists():
    cond = {"type": KEPT_CONDITION, "status": "True", "reason": "SetKept", "message": "m"}
    other = {"type": "Ready", "status": "False"}
    client = ScriptedClient()
    # vm1: keep ended (nothing kept); vm2: has a VMI (virt-controller's); vm3: kept for
    # another uid of the name (re-created VM): not its set
    k = keeper(client, [vm("vm1", "u1", [other, cond]), vm("vm2", "u2", [cond]),
                        vm("vm3", "new", [])], live=("vm2",))
    await k.kept.write_conditions(kept_for_vms([kept_dev("g3", "vm3", "old")], NOW), NOW)
    [(res, ns, name, ops)] = [c.args[:4] for c in client.calls if c.method == "patch_status"]
    assert name == "vm1" and ops[1] == {"op": "add", "path": "/status/conditions",
                                        "value": [other]}


async def test_H4_condition_write_refused_by_its_test_is_retried_next_round_silently():
    client = ScriptedClient()
    client.script("patch_status", errors.Invalid("patch", 422, "test failed", reason="Invalid"))
    k = keeper(client, [vm("vm1", "u1")])
    await k.kept.write_conditions(kept_for_vms([kept_dev("g0")], NOW), NOW)
    assert k.kept.condition_writes == 0 and len(client.of("patch_status")) == 1
