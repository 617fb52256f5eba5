"""How `k8s.housekeeping.Housekeeper` carries out a round's plan (H1, H2): a device's own
actions in plan order, different devices concurrently and bounded. The API calls are
replaced by a recorder here; tests/e2e carry them out against the real API server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import anyio
import pytest

from fakes.kube_client import ScriptedClient
from k8s.housekeeping import Housekeeper
from model.housekeeping import ClearAttachment, DeleteTemplate, LinkAttachment
from tests.timing import FAKE_TIME

pytestmark = pytest.mark.anyio
SINCE = datetime(2026, 12, 1, tzinfo=timezone.utc)
CALL = 0.01


@pytest.fixture
def anyio_backend():
    return FAKE_TIME  # each recorded API call takes 10 ms of fake time


class _Recorder(Housekeeper):
    """A Housekeeper whose `_do` (one action's API calls) only records and takes `CALL`."""

    def __init__(self, concurrency: int) -> None:
        super().__init__(ScriptedClient(), SimpleNamespace(),  # type: ignore[arg-type]
                         grace=timedelta(minutes=2), raw_policy="denied",
                         concurrency=concurrency)
        self.log: list[tuple[str, tuple[str, str], str]] = []
        self.running = 0
        self.peak = 0

    async def _do(self, action) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.log.append(("start", action.device, type(action).__name__))
        await anyio.sleep(CALL)  # the API call's latency
        self.log.append(("end", action.device, type(action).__name__))
        self.running -= 1


async def test_H2_a_rounds_actions_run_per_device_in_order_and_devices_at_once_bounded():
    links = [LinkAttachment(("t", f"gpu-{i}"), "vm", "uid-1", "adm", SINCE) for i in range(40)]
    clear = ClearAttachment(("t", "tmpl"), "old", "H2", "VMI deleted", SINCE, "adm-0")
    delete = DeleteTemplate(("t", "tmpl"), None, "H2", "VMI deleted")
    keeper = _Recorder(concurrency=8)
    t0 = anyio.current_time()
    await keeper._carry_out([clear, *links, delete])
    # 42 calls, 8 at a time: six rounds of calls, the template's two among them
    assert anyio.current_time() - t0 == pytest.approx(6 * CALL)
    starts = [e for e in keeper.log if e[0] == "start"]
    assert len(starts) == 42                                  # every action, once
    assert keeper.peak == 8                                   # devices at once, bounded
    tmpl = [e for e in keeper.log if e[1] == ("t", "tmpl")]   # one device: in plan order
    assert tmpl == [("start", ("t", "tmpl"), "ClearAttachment"), ("end", ("t", "tmpl"), "ClearAttachment"),
                    ("start", ("t", "tmpl"), "DeleteTemplate"), ("end", ("t", "tmpl"), "DeleteTemplate")]
