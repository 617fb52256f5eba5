"""P5 turned off (`line.enabled` false, `--line-enabled=false`; docs/contract.md §3c "what
the code chose where §3c is silent"): the coordinator keeps no line, so freed room goes to
whoever asks first, as before P5: a later small set takes room an earlier waiting 8-GPU set
could use (with the line on, it is refused `behind_in_line`); W1 answers a bare VMI refused
for room with its old 403, never the 503 `waits_in_line`; no line length is observed.
The whole actor system on the in-memory store, the real webhook beside it (as
tests/actors/test_line.py and tests/actors/test_line_w1.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import anyio
import pytest

from actors.coordinator_protocol import RefusedAtW1
from fakes.kube_client import ScriptedClient
from k8s.config import load
from k8s.controller import w1_line
from k8s.webhook.admission import VMIAdmission
from model.line import RETRY_AFTER, LineSettings
from model.reasons import Code
from model.types import Result
from tests.actors.test_line import ON_DEMAND, SPOT, Seen, ask, fleet, line_of, new_set
from tests.actors.test_line_w1 import review, world
from tests.support.binder import check_invariants, fast_config, quiet_logging, running_binder
from tests.support.webhook_cache import StoreCache

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def line_config(enabled: bool):
    """`fast_config` with P5 on or off (`LineSettings.enabled`, `--line-enabled`)."""
    base = fast_config()
    return replace(base, coordinator=replace(base.coordinator, line=LineSettings(enabled=enabled)))


@pytest.mark.parametrize("enabled", [True, False], ids=["line-on", "line-off"])
async def test_P5_off_a_later_small_set_takes_the_room_an_earlier_waiting_8_gpu_set_could_use(
        enabled: bool) -> None:
    s = fleet(8, busy=1)
    seen = Seen()
    async with running_binder(s, config=line_config(enabled), observer=seen) as binder:
        big, small = new_set(s, "big", 8), new_set(s, "small", 1)
        assert (await ask(s, binder, "big", big, ON_DEMAND))[0] is Result.REFUSED  # 7 free: refused
        await anyio.sleep(RETRY_AFTER)  # its client retries: with the line on, a real place
        assert (await ask(s, binder, "big", big, ON_DEMAND))[0] is Result.REFUSED
        s.delete_device(("o", "busy-0"))  # room frees: 8 free, the big set could start now
        got = await ask(s, binder, "small", small, SPOT)
        state = await line_of(binder)
        if enabled:
            assert got == (Result.REFUSED, Code.BEHIND_IN_LINE)
            assert [e.identity.vmi for e in state.line] == ["big", "small"]
        else:  # whoever asks first: the small set starts, the big one no longer fits
            assert got == (Result.SUCCEEDED, None)
            assert len(state.line) == 0 and dict(state.reservations) == {}
            assert seen.lengths == [] and seen.left == []  # no line length observed
            result, code = await ask(s, binder, "big", big, ON_DEMAND)
            assert result is Result.REFUSED and code is not Code.BEHIND_IN_LINE
            assert len((await line_of(binder)).line) == 0
    assert check_invariants(s) == []


async def test_P5_off_W1_refuses_a_bare_vmi_short_of_room_403_and_nobody_waits() -> None:
    s = world(8, busy=1)
    off = load(None, env={}, flags={"webhook_port": "0", "line_enabled": "false"})
    on = load(None, env={}, flags={"webhook_port": "0"})
    async with running_binder(s, config=line_config(False)) as binder:
        told: list = []

        def tell(e) -> bool:
            told.append(e)
            return binder.refused_at_w1(RefusedAtW1(e))

        assert w1_line(on, tell) is tell  # on: W1 tells the leader's line (test_line_w1.py)
        assert w1_line(off, tell) is None
        adm = VMIAdmission(ScriptedClient(), StoreCache(s), bind_timeout=5.0,  # type: ignore[arg-type]
                           grace=timedelta(seconds=30), line=w1_line(off, tell))
        refused = await adm.handle(review("big", 8))  # 7 free, it needs 8: W1 refuses
        assert (refused["allowed"], refused["status"]["code"]) == (False, 403)
        assert refused["status"]["reason"] != "waits_in_line" and told == []
        assert len((await line_of(binder)).line) == 0
    assert check_invariants(s) == []
