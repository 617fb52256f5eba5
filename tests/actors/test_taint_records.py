"""HL1 on records in the actors (docs/contract.md §3b DR2/DR4, HL1), through the real
coordinator, node actors and status pipeline on the in-memory store, on fake time: an idle
held set one of whose recorded GPUs a DeviceTaintRule taints is re-pointed within its node
(status writes, no move) to a whole pair, never "already placed" on the tainted GPU, with one
log line per record naming the node, the device, the taint and its rule; where no pair is
left on its node the set is moved (the line says so); a running VM's record on a GPU tainted
after it started is never written, by a placement or a defragmentation round.

HGX H100 pairs (partition2, by gpuModuleID): {0,3} {1,2} {4,6} {5,7}."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fakes.memory_store import MemoryStore
from model.device.dra import DeviceTaint
from model.device.taint_rules import TaintRule
from model.types import Result
from tests.support.binder import quiet_logging, running_binder, settle
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node, ref
from tests.support.logs import captured_logs

pytestmark = pytest.mark.anyio

XID = TaintRule("xid-79", DeviceTaint("example.com/xid", "79", "NoSchedule")).taint


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logging()


def tainted_by_rule(node, *indices: int, recorded_at: tuple[int, ...] = ()):
    """`node` with DeviceTaintRule xid-79's taint on its GPUs `indices`, as the DRA index
    builds it (taken; foreign unless a record names it)."""
    names = {f"gpu-vfio-{i}" for i in indices}
    n = replace(node, class_devices=tuple(
        (c, tuple(replace(d, taints=(XID,)) if d.ref.device in names else d for d in devs))
        for c, devs in node.class_devices))
    taken = n.taken_devices | names
    foreign = len(taken - {f"gpu-vfio-{i}" for i in recorded_at})
    return replace(n, taken_devices=frozenset(taken), foreign=((RES, foreign),) if foreign else ())


def store_of(nodes) -> MemoryStore:
    s = MemoryStore(seed=0)
    s.put_class(device_class())
    for t in ("t1", "t2"):
        s.add_namespace(t)
    for n in nodes:
        s.put_node(n)
    return s


def off_taint_lines(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "record_off_tainted_device"]


async def test_HL1_an_idle_held_set_on_a_gpu_a_rule_taints_is_re_pointed_on_its_node_and_logged() -> None:
    s = store_of([tainted_by_rule(dra_node("n1"), 0, recorded_at=(0,)), dra_node("n2")])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 3))
    s.add_device("t1", "b", CLASS, node="n1", device=ref("n1", 0))
    with captured_logs() as logs:
        async with running_binder(s) as binder:
            rid = s.request("t1", "vm", ["a", "b"])
            await settle(s, binder)
            members = s.request_members("t1", rid)
            assert {(m.status.bind_request.result, m.bound_node) for m in members} == {(Result.SUCCEEDED, "n1")}
            assert "already placed" not in members[0].status.bind_request.message
            assert sorted(m.status.device.device for m in members) == ["gpu-vfio-1", "gpu-vfio-2"]
            assert not [r for r in s.history if r.op == "answer" and r.moved]
            [line] = off_taint_lines(logs)
            assert {k: line[k] for k in ("member", "node", "device", "taint", "rule", "to_node", "repoint")} == {
                "member": "b", "node": "n1", "device": "gpu-vfio-0", "taint": "example.com/xid:NoSchedule",
                "rule": "xid-79", "to_node": "n1", "repoint": True}
            assert line["to_device"] in ("gpu-vfio-1", "gpu-vfio-2") and line["request_id"] == rid
            # the next request of the set: its new records hold (B6), nothing re-pointed again
            s.withdraw("t1", rid)
            rid2 = s.request("t1", "vm", ["a", "b"])
            await settle(s, binder)
            assert "already placed" in s.request_members("t1", rid2)[0].status.bind_request.message
            assert len(off_taint_lines(logs)) == 1


async def test_HL1_no_pair_left_on_its_node_the_set_is_moved_and_the_line_says_so() -> None:
    # n1: GPU 0 (b's) tainted, 1, 4, 5 an administrator's: free 2, 3 (a's), 6, 7 form no pair
    n1 = tainted_by_rule(dra_node("n1", taken=(1, 4, 5)), 0, recorded_at=(0,))
    s = store_of([n1, dra_node("n2")])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 3))
    s.add_device("t1", "b", CLASS, node="n1", device=ref("n1", 0))
    with captured_logs() as logs:
        async with running_binder(s) as binder:
            rid = s.request("t1", "vm", ["a", "b"])
            await settle(s, binder)
            members = s.request_members("t1", rid)
            assert {(m.status.bind_request.result, m.bound_node) for m in members} == {(Result.SUCCEEDED, "n2")}
            assert all(m.status.device.pool == "n2" for m in members)
            [line] = off_taint_lines(logs)
            assert (line["member"], line["node"], line["device"], line["to_node"], line["repoint"]) == (
                "b", "n1", "gpu-vfio-0", "n2", False)


async def test_HL1_a_running_vms_record_on_a_gpu_tainted_after_it_started_is_never_written() -> None:
    """The set of a running VMI (attached) is placed on n1 recording the pair {0,3}; then a
    DeviceTaintRule taints GPU 0. Neither another set's placement on n1 nor defragmentation
    rounds write its records (NoExecute eviction is kube-controller-manager's, not ours)."""
    from dataclasses import replace as _replace

    from tests.support.binder import fast_config
    from tests.timing import advance
    c = fast_config()
    config = _replace(c, coordinator=_replace(c.coordinator, defrag_interval=10.0, defrag_max_moves=4))
    s = store_of([dra_node("n1")])
    s.add_device("t1", "a", CLASS, node="n1", device=ref("n1", 3))
    s.add_device("t1", "b", CLASS, node="n1", device=ref("n1", 0))
    s.add_device("t1", "idle", CLASS, node="n1", device=ref("n1", 5))
    with captured_logs() as logs:
        async with running_binder(s, config) as binder:
            rid = s.request("t1", "vm-running", ["a", "b"])
            s.add_vmi("t1", "vm-running")
            await settle(s, binder)
            assert {m.status.bind_request.result for m in s.request_members("t1", rid)} == {Result.SUCCEEDED}
            before = {k: s.device(("t1", k)).status for k in ("a", "b")}
            written = len(s.history)
            s.put_node(tainted_by_rule(dra_node("n1"), 0, recorded_at=(0,)))
            for i in range(2):
                s.add_device("t2", f"p{i}", CLASS)
            other = s.request("t2", "vm-other", ["p0", "p1"])
            await settle(s, binder)
            assert {m.status.bind_request.result for m in s.request_members("t2", other)} == {Result.SUCCEEDED}
            await advance(25.0)   # two defragmentation rounds
            await settle(s, binder)
            assert {k: s.device(("t1", k)).status for k in ("a", "b")} == before
            assert not [r for r in s.history[written:] if r.key in {("t1", "a"), ("t1", "b")}]
            assert off_taint_lines(logs) == []
