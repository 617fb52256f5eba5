"""bench.defrag_round at a small size: the count-mode twin has the same held devices on the
same nodes, rounds grow the largest set towards the bound of perfect repacking and never past
it, and the report's figures relate as documented. Timings are the bench's (docs/benchmarks.md),
not this test's."""

from __future__ import annotations

import random

from bench.defrag_round import COUNT_CLASS, bound, count_twin, rounds, with_running
from bench.device_decide import fleet
from model.defrag import largest_sets, movable


def test_twin_rounds_and_bound_relate_as_documented():
    device = with_running(fleet(30, 0.6, random.Random(3)), 0.3, random.Random(4))
    count = count_twin(device)
    assert {d.key: d.bound_node for d in count.devices.values()} == \
        {d.key: d.bound_node for d in device.devices.values()}
    assert {d.key for d in count.devices.values() if d.status.attached_to} == \
        {d.key for d in device.devices.values() if d.status.attached_to}
    assert {d.class_name for d in count.devices.values()} == {COUNT_CLASS}
    assert sum(movable(d, device) for d in device.devices.values()) == \
        sum(movable(d, count) for d in count.devices.values()) > 0
    for snap in (device, count):
        (before,) = largest_sets(snap)
        top, nodes = bound(snap)
        assert before.size <= top <= 8 and nodes >= 1
        got = rounds(snap, 3, 4, 1)
        assert 1 <= len(got) <= 3 and all(r["moves"] <= 4 and r["cpu_ms"] >= 0 for r in got)
        sizes = [before.size] + [r["largest"] for r in got]
        assert sizes == sorted(sizes) and sizes[-1] <= top
        if got[0]["moves"]:
            assert (got[0]["largest"], got[0]["nodes"]) > (before.size, before.nodes)
