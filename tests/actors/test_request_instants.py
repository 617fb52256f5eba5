"""The leader's wall instants of one request on its log lines (`bench floor`'s split of the
webhook's wait, docs/benchmarks.md), through the real router, coordinator and status pipeline
on the in-memory store, on fake time (the clock `fakes.clock.LoopClock`: EPOCH plus the
loop's time): the `decision` line's `seen_at` (the router found the request complete) and
`batch_at` (its batch started), the `writes_finished` line's `flown_at` (the decision handed
to the pipeline) and `finished_at`; in that order. A request the coordinator queued without
the router (found at its start) has no `seen_at`."""

from __future__ import annotations

import pytest

from fakes.clock import EPOCH
from fakes.memory_store import MemoryStore
from tests.support.binder import quiet_logging, running_binder, settle
from tests.support.logs import captured_logs

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def cluster() -> MemoryStore:
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 4})
    for name in ("a", "b", "c"):
        s.add_device("t", name, "h100")
    return s


def lines(logs: list[dict], event: str, rid: str) -> list[dict]:
    return [e for e in logs if e["event"] == event and e.get("request_id") == rid]


async def test_a_request_the_router_examined_carries_its_instants_in_order() -> None:
    s = cluster()
    with captured_logs() as logs:
        async with running_binder(s) as binder:
            await settle(s, binder)
            rid = s.request("t", "vm", ["a", "b"])
            await settle(s, binder)
    (decision,) = lines(logs, "decision", rid)
    (writes,) = lines(logs, "writes_finished", rid)
    assert writes["outcome"] == "done"
    instants = [decision["seen_at"], decision["batch_at"], writes["flown_at"], writes["finished_at"]]
    assert all(isinstance(t, float) and t >= EPOCH.timestamp() for t in instants)
    assert instants == sorted(instants)


async def test_a_request_found_at_the_coordinators_start_has_no_seen_at() -> None:
    s = cluster()
    rid = s.request("t", "vm", ["c"])      # complete before any replica runs: no Examine
    with captured_logs() as logs:
        async with running_binder(s) as binder:
            await settle(s, binder)
    (decision,) = lines(logs, "decision", rid)
    assert decision["seen_at"] is None and isinstance(decision["batch_at"], float)
    (writes,) = lines(logs, "writes_finished", rid)
    assert decision["batch_at"] <= writes["flown_at"] <= writes["finished_at"]


async def test_bench_floor_joins_the_lines_as_the_replica_renders_them() -> None:
    """The leader's lines rendered by the product's logging (JSON, `configure_logging`), read
    back by `bench.floor_report.log_entries` and joined by `wait_split` with a webhook line
    made from them (attached 1 ms before the router saw it, result seen 2 ms after the
    writes ended, its phase 0.5 ms longer than the instants)."""
    import io

    from actors.logging import configure_logging
    from bench import floor_report as fr

    out = io.BytesIO()
    s = cluster()
    configure_logging(stream=out)
    try:
        async with running_binder(s) as binder:
            await settle(s, binder)
            rid = s.request("t", "vm", ["a"])
            await settle(s, binder)
    finally:
        quiet_logging()
    leader = fr.log_entries(out.getvalue().decode())
    (decision,) = [e for e in leader if e["event"] == "decision"]
    (writes,) = [e for e in leader if e["event"] == "writes_finished"]
    attached, result = decision["seen_at"] - 0.001, writes["finished_at"] + 0.002
    webhook = {"event": "VMI admitted", "namespace": "t", "vmi": "vm", "request_id": rid,
               "attached_at": attached, "result_at": result,
               "wait_result_s": result - attached + 0.0005}
    got = fr.wait_split({"replica-0": leader, "replica-1": [webhook]}, "t", ["vm"])
    assert (got["joined"], got["unjoined"]) == (1, {})
    parts = {p: v["mean_ms"] for p, v in got["parts"].items()}
    assert (parts["to_leader"], parts["back"], parts["unexplained"]) == (1.0, 2.0, 0.5)
    leader_ms = 1000 * (writes["finished_at"] - decision["seen_at"])
    assert abs(parts["queue"] + parts["decision"] + parts["status_write"] - leader_ms) <= 0.03
