"""`VMWaiting` while it listens (issue 40): a round reads the VMs through `VMIndex`, kept from
the VM and VMI informers' events, so its work follows the VMs that wait, not the running
fleet; and it plans, writes and tells the line exactly what a round reading every VM does.
On a `ClusterCache` fed as its watches would (`bench.housekeeping_cost`'s world), API calls
recorded by `ScriptedClient`; work counted (VMs asked `asks_gpus`), never timed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import anyio
import pytest

from bench.housekeeping_cost import _World
from fakes.kube_client import ScriptedClient
from k8s import vm_waiting as vm_waiting_module
from k8s.vm_waiting import VMWaiting
from model import vm as vm_module
from model import vm_line as vm_line_module
from tests.timing import FAKE_TIME

NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


pytestmark = pytest.mark.anyio


def _vm(name: str, *, strategy: str = "Always", conditions: list | None = None) -> dict:
    return {"metadata": {"name": name, "namespace": "t00", "uid": f"uid-{name}",
                         "resourceVersion": "1"},
            "spec": {"runStrategy": strategy, "template": {
                "metadata": {"annotations": {"gpu.cozystack.io/templates": "h100=1"}},
                "spec": {"domain": {"devices": {}}}}},
            "status": {"conditions": conditions or []}}


FAILED = [{"type": "Failure", "status": "True", "reason": "FailedCreate", "message": "denied"}]
SHOWN = [{"type": "GPUSetReady", "status": "False", "reason": "NoRoom", "message": "no room",
          "lastTransitionTime": "2026-12-06T00:00:00Z"}]


def _world(running: int) -> _World:
    """`running` VMs with their VMIs (and sets) on 40 nodes, two VMs waiting (refused at
    W1), one stopped VM still showing our condition, one that never asked for GPUs."""
    world = _World(40, "count", sets=running, idle=False, vm_templates=True)
    for vm in (_vm("wait-a", conditions=FAILED), _vm("wait-b", conditions=FAILED),
               _vm("stopped", strategy="Halted", conditions=SHOWN),
               {**_vm("plain"), "spec": {"runStrategy": "Always"}}):
        world.vms._apply("ADDED", vm)
    return world


def _waiting(world: _World) -> tuple[VMWaiting, ScriptedClient, list]:
    client, told = ScriptedClient(), []
    w = VMWaiting(client, world.cache, grace=timedelta(minutes=2), waiting=told.append)
    w.vms = world.vms  # the world's VM informer (its own would list an API server)
    return w, client, told


class _Counted:
    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = vm_module.asks_gpus

        def counted(vm):
            self.calls += 1
            return real(vm)
        for mod in (vm_module, vm_line_module, vm_waiting_module):
            monkeypatch.setattr(mod, "asks_gpus", counted)


def _outcome(client: ScriptedClient, told: list) -> tuple:
    """The round's writes and what it told the line (`gone` as a set: its order is free)."""
    calls = sorted(repr(c.args) for c in client.calls)
    return calls, [(m.entries, frozenset(m.gone)) for m in told]


async def test_a_listening_round_reads_the_waiting_vms_not_every_running_one(monkeypatch):
    counts = {}
    for running in (5, 60):
        world = _world(running)
        w, _, told = _waiting(world)
        with w.listening():
            counted = _Counted(monkeypatch)  # after the index is built (once per leadership)
            await w.round(NOW)
        counts[running] = counted.calls
        assert len(told) == 1 and len(told[0].gone) == running + 1  # every running VM, and the stopped one
    assert counts[5] == counts[60] <= 4  # the two waiting VMs, read by the plan and the line
    full = _world(60)
    w, _, _ = _waiting(full)
    counted = _Counted(monkeypatch)
    await w.round(NOW)
    assert counted.calls > 60  # without the index: every VM, more than once


async def test_a_listening_round_writes_and_tells_what_a_full_round_does_as_the_fleet_changes():
    world = _world(12)
    listening, l_client, l_told = _waiting(world)
    with listening.listening():
        for step in range(3):
            full, f_client, f_told = _waiting(world)  # a fresh one each step: no rate limits
            fresh, n_client, n_told = _waiting(world)
            with fresh.listening():
                await fresh.round(NOW)
            await full.round(NOW)
            assert _outcome(n_client, n_told) == _outcome(f_client, f_told)
            assert f_client.calls  # it did write (a nudge or a condition removed)
            # the fleet changes under the listening index: a waiting VM's VMI appears, a
            # running VM stops (its VMI goes), a VM is deleted
            if step == 0:
                world.cache.vmis._apply("ADDED", {"metadata": {
                    "name": "wait-a", "namespace": "t00", "uid": "uid-vmi-wait-a", "resourceVersion": "9"},
                    "spec": {}, "status": {}})
            elif step == 1:
                vmi, _, vm = world.sets[0]
                world.cache.vmis._apply("DELETED", vmi)
                world.vms._apply("MODIFIED", {**vm, "metadata": {**vm["metadata"], "resourceVersion": "7"},
                                              "spec": {**vm["spec"], "runStrategy": "Halted"}})
                world.vms._apply("DELETED", _vm("wait-b"))
        full, f_client, f_told = _waiting(world)
        await full.round(NOW)
        l_client.calls.clear()
        l_told.clear()
        await listening.round(NOW)
        # the long-listening index agrees with a full read after the changes (its own
        # rate limits aside: compare what it tells the line)
        assert [(m.entries, frozenset(m.gone)) for m in l_told] == \
            [(m.entries, frozenset(m.gone)) for m in f_told]
        assert listening.index is not None and listening.index.updates > 0
    assert listening.index is None
