"""Device mode in the pure model (DESIGN.md §3b DR2-DR4, DR6): what is free on a node by
name (DR2), the group check and its refusal naming the sizes that exist (DR3), the DR4 order,
B6 with records, re-pointing within a node, the class problem and mixed-mode refusals (DR1),
apply_decision recording `status.device`; property tests over HGX fleets (8 GPUs, partitions
from gpuModuleID as `localcluster.dra_profiles` publishes them)."""

from __future__ import annotations

from model.hold import Hold, outstanding
from model.snapshot import Snapshot
from model.types import GPUDevice
from tests.support.dra_worlds import CLASS, PARTITION_ATTRIBUTE, RES, device_class, dra_node, recorded, ref



def pending(*names: str, ns: str = "t", cls: str = CLASS) -> list[GPUDevice]:
    return [GPUDevice(ns, n, cls) for n in names]


def snap_of(nodes, devices=(), classes=None, reservations=()) -> Snapshot:
    return Snapshot.build(nodes=nodes, classes=classes or [device_class()], devices=devices,
                          reservations=reservations)


def names(*indices: int) -> frozenset[str]:
    return frozenset(f"gpu-vfio-{i}" for i in indices)


# --- DR2: free devices by name -----------------------------------------------------------------

def test_DR2_free_devices_leave_out_claims_taints_other_records_and_other_holds():
    node = dra_node("n1", taken=(1,))
    other = recorded("u", "x", "n1", 2)
    mine = recorded("t", "a", "n1", 3)
    hold = Hold("r-other", "u", "n1", devices=((("u", "y"), ref("n1", 4)),))
    own_hold = Hold("r1", "t", "n1", devices=((("t", "b"), ref("n1", 5)),))
    snap = snap_of([node], [other, mine], reservations=[hold, own_hold])
    assert snap.free_devices("n1", CLASS, "r1", {("t", "a")}) == names(0, 3, 5, 6, 7)
    assert snap.free_devices("n1", CLASS, "r2") == names(0, 6, 7)  # a's record is not r2's
    assert snap.recorded_devices("n1") == {"gpu-vfio-2": (("u", "x"),), "gpu-vfio-3": (("t", "a"),)}
    assert snap.free_devices("gone", CLASS) == frozenset()


def test_DR2_a_device_its_own_member_records_is_free_for_it_though_its_claim_allocates_it():
    snap = snap_of([dra_node("n1", taken=(3,))], [recorded("t", "a", "n1", 3)])
    assert "gpu-vfio-3" in snap.free_devices("n1", CLASS, "r1", {("t", "a")})
    assert "gpu-vfio-3" not in snap.free_devices("n1", CLASS, "r2", {("t", "b")})


def test_DR2_records_follow_with_devices_and_without_devices():
    snap = snap_of([dra_node("n1")], [recorded("t", "a", "n1", 0)])
    assert snap.free_devices("n1", CLASS) == names(1, 2, 3, 4, 5, 6, 7)
    moved = snap.with_device(recorded("t", "a", "n1", 6))
    assert moved.free_devices("n1", CLASS) == names(0, 1, 2, 3, 4, 5, 7)
    assert snap.without_device("t", "a").free_devices("n1", CLASS) == names(*range(8))
    assert snap.free_devices("n1", CLASS) == names(1, 2, 3, 4, 5, 6, 7)  # unchanged


def test_DR2_a_hold_keeps_a_device_until_the_member_records_it_on_the_node():
    hold = Hold("r1", "t", "n1", ((RES, 1),), ((RES, 1),), ((("t", "a"), RES),),
                ((("t", "a"), ref("n1", 2)), (("t", "b"), ref("n1", 3))))
    b_bound = recorded("t", "b", "n1", 0)  # Bound here, recording another device: re-pointed
    seen = {("t", "a"): GPUDevice("t", "a", CLASS), ("t", "b"): b_bound}
    assert outstanding(hold, seen.get) is hold
    seen[("t", "a")] = recorded("t", "a", "n1", 2)
    left = outstanding(hold, seen.get)
    assert left.needs == () and left.devices == ((("t", "b"), ref("n1", 3)),) and not left.empty
    seen[("t", "b")] = recorded("t", "b", "n1", 3)
    assert outstanding(hold, seen.get).empty
