"""`gpu-binder bench packing` (issue 21): the trace and the bound are pure and checked here
without a cluster; one smoke replay of the quick plan through the real system (our webhook and
binder, KubeVirt's virt-api and virt-controller, kube-scheduler with two profiles, KWOK) checks
the structure of the report and the relations that hold whatever the machine's load: the same
trace replayed by every system, every share in [0, 1], nothing over capacity, every admitted
VMI's launcher Pod bound on its pin. Not the issue's targets: those are the benchmark's."""

from __future__ import annotations

import json
import uuid

import pytest

from bench import packing, packing_trace as pt


def _shares(fig: dict) -> list[float]:
    vals = [fig["demand_started"], fig["mean_utilisation"], fig["mean_held_idle"],
            fig["time_8_placeable"], *[v for v in fig["sets_started"].values() if v is not None]]
    return vals


def test_trace_is_a_function_of_its_seed_and_has_the_asked_mix():
    a = pt.make_trace(seed=3, nodes=20, load=0.85, arrivals=4000)
    b = pt.make_trace(seed=3, nodes=20, load=0.85, arrivals=4000)
    c = pt.make_trace(seed=4, nodes=20, load=0.85, arrivals=4000)
    assert packing.trace_digest(a) == packing.trace_digest(b) != packing.trace_digest(c)
    scored = [s for s in a.sets if s.scored]
    assert len(scored) == 4000 and all(s.arrive >= a.warmup for s in scored)
    for size, weight in zip(pt.SIZES, pt.SIZE_WEIGHTS):
        share = sum(s.size == size for s in a.sets) / len(a.sets)
        assert abs(share - weight) < 0.03, (size, share)
    held = [s for s in a.sets if s.held]
    assert abs(len(held) / len(a.sets) - 0.3) < 0.03
    assert abs(sum(s.idle for s in held) / len(held) - 0.5) < 0.05
    assert all(s.arrive <= s.stop <= s.release for s in a.sets)
    assert all(s.release == s.stop for s in a.sets if not s.held)
    # offered GPU time (idle holds included) over the fleet's, within sampling noise
    offered = sum(s.size * (s.release - s.arrive) for s in a.sets) / (a.gpus * a.end)
    assert 0.78 < offered < 0.92, offered


def test_bound_refuses_exactly_when_the_live_sets_and_the_new_one_exceed_the_fleet():
    tr = pt.make_trace(seed=1, nodes=5, load=0.95, arrivals=600)
    bound = pt.simulate(tr, "repack")
    live: dict[int, int] = {}
    refused = 0
    for _, _, kind, s in tr.events():
        if kind == "arrive":
            fits = sum(live.values()) + s.size <= tr.gpus
            assert (s.id in bound.started) == fits, s
            refused += not fits
            if fits:
                live[s.id] = s.size
        elif kind == "release" or not s.idle:
            live.pop(s.id, None)
    assert refused > 0  # the trace does reach the fleet's limit


@pytest.mark.parametrize("policy", pt.POLICIES)
def test_no_policy_places_more_than_the_fleet_and_every_figure_is_a_share(policy):
    tr = pt.make_trace(seed=2, nodes=6, load=0.95, arrivals=400)
    out = pt.simulate(tr, policy)
    assert all(u + h <= tr.gpus for _, u, h in pt.usage_timeline(tr, out.started))
    assert all(0 <= big <= 8 for *_, big in out.timeline)
    fig = pt.score(tr, out)
    assert all(0 <= v <= 1 for v in _shares(fig)), fig


def test_on_100_nodes_the_simulation_orders_the_policies_as_issue_21_reports():
    tr = pt.make_trace(seed=1, nodes=100, load=0.95, arrivals=2000, held_share=0.0)
    sim = pt.simulate_all(tr)
    assert sim["spread"]["sets_started"]["8"] < 0.2 < 0.8 < sim["tightest"]["sets_started"]["8"]
    assert sim["repack"]["demand_started"] >= sim["tightest"]["demand_started"] > sim["spread"]["demand_started"]


@pytest.mark.e2e
@pytest.mark.kubevirt
def _quick(system, tmp_path, plan, **replay) -> tuple[dict, dict, dict, pt.Trace]:
    """Replay `plan`'s one load on the session's control plane (`replay`: replay_on's
    keywords); (the saved report, its load entry, its systems, the trace) once the JSON and
    the PNG are written."""
    hgx = replay.get("hgx", False)
    traces, report = packing.prepare(plan, seed=1, quick=True, hgx=hgx)
    packing.replay_on(system, plan, traces, report, log_dir=tmp_path / "logs",
                      prefix=f"pk{uuid.uuid4().hex[:5]}-", **replay)
    packing.finish(report, tmp_path)
    stem = packing.out_stem(report)
    saved = json.loads((tmp_path / f"{stem}.json").read_text())
    assert (tmp_path / f"{stem}.png").stat().st_size > 10_000
    (load, entry), = saved["loads"].items()
    return saved, entry, entry["systems"], traces[float(load)]


def test_quick_replay_same_trace_for_every_system_and_structural_relations(system, tmp_path):
    plan = packing.QUICK
    saved, entry, systems, tr = _quick(system, tmp_path, plan)
    assert entry["trace"]["arrivals_digest"] == packing.arrivals_digest(tr)
    measured = {k: v for k, v in systems.items() if k in "abc"}
    assert set(measured) == {"a", "b", "c"}
    for key, fig in measured.items():
        # every arrival of the one trace was sent, in trace order, to every system
        assert fig["replayed_digest"] == entry["trace"]["arrivals_digest"], key
        assert fig["scored_sets"] == plan.arrivals and fig["scored_gpus"] == systems["d"]["scored_gpus"]
        assert all(0 <= v <= 1 for v in _shares(fig)), (key, fig)
        assert all(u is None or u + h <= tr.gpus for _, u, h, _b in fig["timeline"])
        assert fig["counts"].get("release_timeout", 0) == 0, (key, fig["counts"])
        assert fig["counts"].get("pod_gone_timeout", 0) == 0, (key, fig["counts"])
        # the bound (d) started at least the GPU demand every system started, on this trace
        assert systems["d"]["demand_started"] >= fig["demand_started"], key
    a = measured["a"]["counts"]
    # every VMI gpu-binder admitted had its launcher Pod bound by kube-scheduler on its pin (B3)
    assert a.get("admitted_not_bound", 0) == 0 and a.get("no_launcher_pod", 0) == 0, a
    assert a.get("pin_agrees", 0) == measured["a"]["started_sets"] > 0, a
    if "available" in systems["e"]:
        assert systems["e"]["available"] is False and "defrag" in systems["e"]["why"]
        assert saved["targets"]["defrag closes >= half the 8-GPU gap"]["met"] is None
    else:
        assert systems["e"]["replayed_digest"] == entry["trace"]["arrivals_digest"]


# -- the HGX pools in device mode (issue 33): the pure half --------------------------------

def test_hgx_board_partitions_follow_module_ids_not_pci_order():
    from bench import packing_hgx as ph

    assert ph.partition_of((0, 1)) is None          # modules 2 and 4: different pairs
    assert ph.partition_of((0, 3)) is not None      # modules 2 and 1: one pair
    assert ph.partition_of(tuple(range(8))) == 0
    # the allocator's walk in slice order takes the partition of the lowest free index
    assert ph.dra_choice(frozenset(range(8)), 2) == (0, 3)
    assert ph.dra_choice(frozenset({1, 2, 4, 5, 6, 7}), 4) == (4, 5, 6, 7)
    assert ph.dra_choice(frozenset({0, 1, 2, 4, 5, 6}), 4) is None
    # a device plugin's pick without a preference: the lowest indices, whatever the partition
    assert ph.lowest_free(frozenset(range(8)), 2) == (0, 1)
    # DR4: a 2-GPU set on a board with one broken pair completes that pair's 4-block
    got = ph.binder_choice(frozenset({1, 2, 3, 4, 5, 6, 7}), 1)
    assert got is not None and got.devices == ("gpu-vfio-3",)


def test_hgx_simulation_on_100_nodes_device_mode_keeps_partitions_and_whole_boards():
    from bench import packing_hgx as ph

    raw = pt.make_trace(seed=1, nodes=100, load=0.95, arrivals=1500)
    tr = pt.quantize(raw, 6 * raw.end / len(raw.sets))
    sim = ph.simulate_hgx_all(tr)
    a, b, c, d = (sim[p] for p in ph.HGX_POLICIES)
    assert a["valid_partition"] == b["valid_partition"] == 1.0 and a["invalid_partition_sets"] == 0
    assert c["invalid_partition_sets"] > 0 and c["valid_partition"] < 0.8
    assert d["demand_started"] >= a["demand_started"] > b["demand_started"]
    assert a["sets_started"]["8"] > 1.5 * b["sets_started"]["8"]
    for fig in (a, b, c):
        assert all(0 <= v <= 1 for v in _shares(fig)), fig


@pytest.mark.e2e
@pytest.mark.kubevirt
def test_quick_hgx_replay_device_mode_and_the_dra_allocator_form_partitions_count_mode_is_measured(
        system, kubevirt_shared, tmp_path):
    """The HGX pools' quick form (issue 33) on the session's KubeVirt (`GPUsWithDRA` on):
    one trace replayed by (a) gpu-binder in device mode, (b) kube-scheduler's DRA allocator
    alone and (c) gpu-binder in count mode; every admitted multi-GPU set of (a) and (b) is a
    valid partition (anything less is a bug), its claim allocated on its Pod's node with one
    device per GPU; (c)'s share is measured. Shares are the benchmark's, not asserted."""
    system.start_dra()
    plan = packing.QUICK_HGX
    saved, entry, systems, tr = _quick(system, tmp_path, plan, hgx=True, kubevirt=kubevirt_shared)
    assert set(systems) == {"a", "b", "c", "d"} and saved["mode"] == "hgx"
    for key in "abc":
        fig = systems[key]
        assert fig["replayed_digest"] == entry["trace"]["arrivals_digest"], key
        assert fig["scored_sets"] == plan.arrivals and fig["scored_gpus"] == systems["d"]["scored_gpus"]
        assert all(0 <= v <= 1 for v in _shares(fig)), (key, fig)
        assert all(u is None or u + h <= tr.gpus for _, u, h, _b in fig["timeline"])
        for bad in ("release_timeout", "pod_gone_timeout", "claim_free_timeout",
                    "claim_not_allocated", "allocation_off_node", "allocated_other_size"):
            assert fig["counts"].get(bad, 0) == 0, (key, bad, fig["counts"])
        assert systems["d"]["demand_started"] >= fig["demand_started"], key
        assert fig["multi_gpu_started"] > 0, key
    assert systems["a"]["valid_partition"] == systems["b"]["valid_partition"] == 1.0
    assert systems["c"]["valid_partition"] is not None
    for key in "ac":  # every VMI gpu-binder admitted bound on its pin (B3)
        counts = systems[key]["counts"]
        assert counts.get("admitted_not_bound", 0) == 0 and counts.get("no_launcher_pod", 0) == 0
        assert counts.get("pin_agrees", 0) == systems[key]["started_sets"] > 0, (key, counts)
    assert saved["targets"]["(a) every admitted multi-GPU set a valid partition"]["met"] is True
