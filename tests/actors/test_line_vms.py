"""P5 for VMs W1 refuses (docs/contract.md §3c P5): the webhook refuses a VM's VMI for room
before the coordinator sees it, so the waiting-VM loop hands the coordinator the entries of
the VMs it finds waiting for room (`VMsWaiting`, `Binder.vms_waiting`); they then wait in the
line as if the coordinator had refused them: a small set that would take the room such a VM
could use now is refused `behind_in_line`; a VM found running or stopped leaves the line."""

from __future__ import annotations

from datetime import timedelta

import pytest

from actors.coordinator_protocol import VMsWaiting
from fakes.clock import LoopClock
from model.line import Identity, Shape, entry
from model.reasons import Code
from model.types import Result
from tests.actors.test_line import ON_DEMAND, SPOT, ask, fleet, line_of, new_set
from tests.support.binder import check_invariants, quiet_logging, running_binder
from tests.timing import eventually

pytestmark = pytest.mark.anyio


async def test_P5_a_vm_refused_at_W1_waits_in_line_and_a_small_set_cannot_take_its_room() -> None:
    quiet_logging()
    s = fleet(8, busy=1)
    async with running_binder(s) as binder:
        vm = Identity("t", "big", "vm-uid")
        big = entry(vm, Shape((), (("h100", 8),)), ON_DEMAND, LoopClock().now() - timedelta(minutes=1))
        binder.vms_waiting(VMsWaiting((big,)))          # W1 refused it: 7 free, it needs 8

        async def waits() -> bool:
            return [e.identity for e in (await line_of(binder)).line] == [vm]
        await eventually(waits, timeout=5, what="the VM in line")
        s.delete_device(("o", "busy-0"))                 # room frees: the VM could start now
        small = new_set(s, "small", 1)
        assert await ask(s, binder, "small", small, SPOT) == (Result.REFUSED, Code.BEHIND_IN_LINE)
        msg = s.device(("t", "small-h100-0")).status.bind_request.message
        assert "t/big (priority 1000 on-demand" in msg
        binder.vms_waiting(VMsWaiting((), gone=(vm,)))   # its VMI runs, or it stopped

        async def left() -> bool:
            return [e.identity.vmi for e in (await line_of(binder)).line] == ["small"]
        await eventually(left, timeout=5, what="the VM out of the line")
        assert await ask(s, binder, "small", small, SPOT) == (Result.SUCCEEDED, None)
    assert check_invariants(s) == []

