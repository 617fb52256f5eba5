"""The fleet gauges in device mode (docs/contract.md §3b DR3; issue 32 item 4): the largest placeable
set of a device-mode class respects topology — a node with 5 free GPUs spread over Fabric
Manager partitions places at most a whole free pair — and the free figure counts the class's
free devices; the D4 gauge (defragmentation's profile) says the same."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
from prometheus_client.parser import text_string_to_metric_families

from actors.view import IndexedView
from k8s.metrics import Metrics, Observed
from model.defrag import largest_sets
from model.snapshot import Snapshot
from tests.support.dra_worlds import CLASS, RES, device_class, dra_node
from tests.k8s.test_metrics_fleet import _idle_admission


def two_board_metrics(n2_taken: tuple[int, ...] = ()) -> tuple[Metrics, IndexedView]:
    """Metrics over a view of two HGX boards of the device class (`n1` with devices 1, 5 and
    6 taken, `n2` with `n2_taken`) and no VMI, with that view."""
    snap = Snapshot.build(nodes=[dra_node("n1", taken=(1, 5, 6)), dra_node("n2", taken=n2_taken)],
                          classes=[device_class()])
    view = IndexedView()
    for n in snap.nodes.values():
        view.put_node(n)
    for c in snap.classes.values():
        view.put_class(c)
    cache = SimpleNamespace(view=view, vmi_keys=lambda: set())
    return Metrics(lambda: Observed(synced=True), _idle_admission(cache)), view


def _samples(metrics: Metrics) -> dict[str, dict[tuple, float]]:
    body, _ = metrics.render()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_DR3_largest_placeable_gauges_respect_partitions():
    # n1: GPUs 1, 5, 6 claimed: 5 free, the largest whole free partition a pair;
    # n2: GPUs 0-3 claimed: the quad of modules 5-8 whole
    metrics, view = two_board_metrics(n2_taken=(0, 1, 2, 3))
    anyio.run(metrics.refresh_fleet)
    label = (("class", CLASS), ("resource", RES))
    m = _samples(metrics)
    assert m["gpu_binder_class_free_units"][label] == 5 + 4
    assert m["gpu_binder_class_largest_placeable_set"][label] == 4
    # n2's quad taken too: 5 + 3 free GPUs, yet no set larger than a pair fits anywhere
    view.put_node(dra_node("n2", taken=(0, 1, 2, 3, 4)))
    metrics._fleet_at = float("-inf")
    anyio.run(metrics.refresh_fleet)
    m = _samples(metrics)
    assert m["gpu_binder_class_free_units"][label] == 5 + 3
    assert m["gpu_binder_class_largest_placeable_set"][label] == 2
    # the D4 gauge: what the coordinator hands `defragmented` (defrag's profile)
    metrics.defragmented(0, {x.class_name: x.size for x in largest_sets(view.snapshot())})
    assert _samples(metrics)["gpu_binder_largest_placeable_set"][(("class", CLASS),)] == 2


def test_HL3_devices_lost_gauge_by_class_and_reason():
    """`gpu_binder_devices_lost{class,reason}`: a record whose device left n1's slice and a
    GPU republished without its partitions (dra-driver-nvidia-gpu#1331); neither is free."""
    from dataclasses import replace

    from tests.support.dra_worlds import recorded

    n1 = dra_node("n1")
    devs = tuple(d for d in n1.devices_of(CLASS) if d.ref.device != "gpu-vfio-3")
    devs = tuple(replace(d, attributes=()) if d.ref.device == "gpu-vfio-5" else d for d in devs)
    n1 = replace(n1, allocatable=((RES, 7),), class_devices=((CLASS, devs),))
    view = IndexedView()
    view.put_node(n1)
    view.put_class(device_class())
    view.put_device(recorded("t", "d0", "n1", 3))
    cache = SimpleNamespace(view=view, vmi_keys=lambda: set())
    metrics = Metrics(lambda: Observed(synced=True), _idle_admission(cache))
    anyio.run(metrics.refresh_fleet)
    m = _samples(metrics)
    assert m["gpu_binder_devices_lost"] == {
        (("class", CLASS), ("reason", "attribute-lost")): 1.0,
        (("class", CLASS), ("reason", "left-slices")): 1.0}
    # 7 published: 6 free devices (gpu-vfio-5 lost), capped by 7 − 1 units (d0 keeps its unit)
    assert m["gpu_binder_class_free_units"][(("class", CLASS), ("resource", RES))] == 6


def test_the_fleet_figures_worker_never_fills_the_caches_snapshot_memo():
    """`refresh_fleet` runs `top` in a worker thread. The snapshot's device-mode memo
    (`NodeMemo`) is filled lazily by whoever reads it and shared by the snapshots the event
    loop derives (`with_node_changes` iterates it): the worker filling the cache's own memo
    while the loop derived the next snapshot raised "dictionary changed size during
    iteration" in a leader (the 1,000-node device soak, 2026-12-06), ending the replica. The
    worker must read a snapshot with a memo of its own."""
    metrics, view = two_board_metrics()
    shared = view.snapshot().memo
    anyio.run(metrics.refresh_fleet)
    label = (("class", CLASS), ("resource", RES))
    assert _samples(metrics)["gpu_binder_class_largest_placeable_set"][label] == 8
    assert view.snapshot().memo is shared
    assert (shared.groups, shared.largest, shared.ranked) == ({}, {}, {})
