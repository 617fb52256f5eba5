"""Housekeeping rounds while listening (`Housekeeper.listening`, as `run` does): a round
judges what changed since the last one, and every set at least every `sweep_every`; a VMI
deleted is released within the next round however few other rounds judged its set (H2).
The cache is a real `ClusterCache` fed as its watches would feed it; the API calls are
recorded (`ScriptedClient`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from fakes.kube_client import ScriptedClient
from k8s import errors
from k8s.cache import ClusterCache
from k8s.client import GPU_DEVICES, VMIS
from k8s.housekeeping import Housekeeper
from model.types import ADMISSION_ANNOTATION, GROUP, VERSION

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _device(name: str, vmi: str, adm: str, uid: str | None = None) -> dict:
    att = {"vmi": vmi, "since": "2026-12-06T11:00:00Z", "admission": adm}
    if uid:
        att["uid"] = uid
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
            "metadata": {"name": name, "namespace": "t", "resourceVersion": "1", "uid": f"u-{name}"},
            "spec": {"class": "h100"},
            "status": {"phase": "Bound", "nodeName": "n1", "attachedTo": att}}


def _vmi(name: str, uid: str, adm: str) -> dict:
    return {"metadata": {"name": name, "namespace": "t", "uid": uid, "resourceVersion": "1",
                         "annotations": {ADMISSION_ANNOTATION: adm}}}


def _world() -> tuple[ClusterCache, ScriptedClient, Housekeeper]:
    cache = ClusterCache(object())
    for i in range(3):
        cache.devices._apply("ADDED", _device(f"g{i}", f"vm{i}", f"a{i}", f"vmi-u{i}"))
        cache.vmis._apply("ADDED", _vmi(f"vm{i}", f"vmi-u{i}", f"a{i}"))
    for informer in cache.informers:
        informer._healthy = True
    client = ScriptedClient()
    keeper = Housekeeper(client, cache, grace=timedelta(minutes=2), raw_policy="denied",
                         sweep_every=timedelta(seconds=60))
    return cache, client, keeper


async def test_H2_a_vmi_deleted_between_incremental_rounds_is_released_in_the_next():
    cache, client, keeper = _world()
    with keeper.listening():
        await keeper.round(NOW)                     # a leader's first round: every set
        assert keeper.full_rounds == 1 and not client.of("patch_status")
        await keeper.round(NOW + timedelta(seconds=5))
        assert keeper.full_rounds == 1              # nothing changed: nothing judged
        cache.vmis._apply("DELETED", _vmi("vm1", "vmi-u1", "a1"))
        client.script("get", errors.NotFound("read VMI t/vm1", 404,
                                             'virtualmachineinstances "vm1" not found',
                                             details={"name": "vm1"}))
        await keeper.round(NOW + timedelta(seconds=6))
        assert keeper.full_rounds == 1
        assert client.of("get") == [(VMIS, "t", "vm1")]               # confirmed live first
        [(res, ns, name, ops)] = [c[:4] for c in client.of("patch_status") if c[0] == GPU_DEVICES]
        assert (ns, name) == ("t", "g1") and ops[-1] == {"op": "remove", "path": "/status/attachedTo"}


async def test_an_action_not_carried_out_is_planned_again_and_a_sweep_comes_at_least_every_minute():
    cache, client, keeper = _world()
    with keeper.listening():
        await keeper.round(NOW)
        cache.vmis._apply("DELETED", _vmi("vm2", "vmi-u2", "a2"))
        client.script("get", errors.ApiError("read VMI t/vm2", 500, "etcd timeout"))
        await keeper.round(NOW + timedelta(seconds=1))   # the live read fails: not done
        assert client.of("get") == [(VMIS, "t", "vm2")] and not client.of("patch_status")
        client.script("get", errors.NotFound("read VMI t/vm2", 404,
                                             'virtualmachineinstances "vm2" not found',
                                             details={"name": "vm2"}))
        await keeper.round(NOW + timedelta(seconds=2))   # no change since: planned again
        assert [c[2] for c in client.of("patch_status")] == ["g2"]
        await keeper.round(NOW + timedelta(seconds=61))
        assert keeper.full_rounds == 2                    # the safety net's sweep
    await keeper.round(NOW + timedelta(seconds=62))       # not listening: every set
    assert keeper.full_rounds == 3
