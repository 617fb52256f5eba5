"""bench.health's pure parts, without a cluster: the seeded schedule (same seed, same
schedule; the injections where the spec puts them) and the report's arithmetic (restart
figures, placements on a marked device, suspects found, the targets)."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.common import targets_lines
from bench.health import (INJECTIONS, HealthSpec, on_marked, pick, restart_figures, schedule,
                          summary, suspect_figures, targets)
from bench.soak.workload import schedule_digest


def test_same_seed_same_schedule_and_another_seed_another():
    a, b = schedule(HealthSpec(seed=7)), schedule(HealthSpec(seed=7))
    assert a == b and schedule_digest(a) == schedule_digest(b)
    assert schedule_digest(schedule(HealthSpec(seed=8))) != schedule_digest(a)
    assert [o.at for o in a] == sorted(o.at for o in a)


def test_the_default_schedule_has_its_vms_churn_and_injections_where_the_spec_puts_them():
    spec = HealthSpec()
    ops = schedule(spec)
    kinds = Counter(o.kind for o in ops)
    assert (spec.nodes, spec.n_vms, spec.n_tenants, spec.seconds) == (100, 20, 4, 240.0)
    assert {k: kinds[k] for k in INJECTIONS} == {"noexecute": 8, "noschedule": 4, "lose": 2,
                                                  "broken": 3}
    assert kinds["vm"] == 20 and kinds["create"] == 51 and kinds["delete"] == 43
    # the VMs come first, within vm_within, each tenant's in turn
    vms = [o for o in ops if o.kind == "vm"]
    assert max(o.at for o in vms) <= spec.vm_within
    assert sorted(o.name for o in vms) == [f"hl-vm{k:03d}" for k in range(20)]
    assert all(o.tenant == int(o.name[-3:]) % 4 and o.size in (1, 2, 4, 8) for o in vms)
    # broken sequences every broken_every s from inject_from; the rest before the last minute
    assert [(o.at, o.name, o.tenant) for o in ops if o.kind == "broken"] == [
        (60.0, "hl-broken0", 0), (80.0, "hl-broken1", 1), (100.0, "hl-broken2", 2)]
    rest = [o for o in ops if o.kind in ("noexecute", "noschedule", "lose")]
    assert all(60.0 <= o.at <= 180.0 and 0 <= o.pick < 1 for o in rest)
    # every churn delete follows its create, by vmi_life
    made = {o.name: o.at for o in ops if o.kind == "create"}
    for o in ops:
        if o.kind == "delete":
            assert 20.0 <= round(o.at - made[o.name], 1) <= 60.0
    # the population: one background VMI per two nodes, no problem nodes, no idle devices
    sc = spec.scale_spec()
    assert (sc.mode, sc.nodes, sc.vmis, sc.tenants, sc.devices) == ("device", 100, 50, 4, 0)
    assert (sc.cordoned, sc.tainted, sc.not_ready) == (0, 0, 0)
    assert list(sc.classes) == [spec.cls] == ["hl-hgx"]


def test_a_schedule_whose_injections_do_not_fit_is_refused():
    with pytest.raises(ValueError, match="no room for injections"):
        schedule(HealthSpec(minutes=2))          # 60 s from, 60 s before a 120 s end
    with pytest.raises(ValueError, match="3 VMs for 14 injections"):
        schedule(HealthSpec(vms=3))


def test_pick_chooses_by_the_seeded_fraction():
    assert pick(["a", "b", "c", "d"], 0.0) == "a"
    assert pick(["a", "b", "c", "d"], 0.5) == "c"
    assert pick(["a", "b", "c", "d"], 0.999) == "d"
    assert pick([], 0.3) is None


def test_restart_figures_take_the_eviction_controllers_delay_apart():
    samples = [{"eviction_s": 2.0, "running_s": 10.0}, {"eviction_s": 4.0, "running_s": 9.0},
               {"eviction_s": 1.0, "running_s": 31.0}, {"eviction_s": 3.0, "running_s": None},
               {"eviction_s": None, "running_s": None}]
    got = restart_figures(samples)
    assert (got["injected"], got["evicted"], got["ran_again"]) == (5, 4, 3)
    assert got["running_s"] == {"p50": 10.0, "p99": 31.0, "max": 31.0}
    assert got["eviction_s"] == {"p50": 2.0, "p99": 4.0, "max": 4.0}
    assert got["beyond_s"] == {"p50": 8.0, "p99": 30.0, "max": 30.0}   # 8, 5, 30
    assert restart_figures([])["beyond_s"] == {"p50": None, "p99": None, "max": None}


def test_a_claim_made_after_a_mark_on_its_device_is_a_placement_on_it():
    marks = [{"pool": "n1", "device": "gpu-vfio-3", "since": 100.0, "kind": "NoExecute"},
             {"pool": "n2", "device": "gpu-vfio-0", "since": 200.0, "kind": "suspect"}]
    claims = [
        # the set the taint landed on (made before): not a placement
        {"ns": "t", "name": "old", "created": 90.0, "devices": [["n1", "gpu-vfio-3"], ["n1", "gpu-vfio-2"]]},
        # made in the mark's second: raced, reported apart
        {"ns": "t", "name": "same", "created": 100.0, "devices": [["n1", "gpu-vfio-3"]]},
        # made after: a placement on a tainted and on a suspected device
        {"ns": "t", "name": "late", "created": 105.0, "devices": [["n1", "gpu-vfio-3"]]},
        {"ns": "u", "name": "sus", "created": 230.5, "devices": [["n2", "gpu-vfio-0"], ["n2", "gpu-vfio-1"]]},
        # another device of the node, or the same name on another node: fine
        {"ns": "t", "name": "ok", "created": 300.0, "devices": [["n1", "gpu-vfio-2"], ["n2", "gpu-vfio-3"]]}]
    got = on_marked(claims, marks)
    assert got["placed"] == [
        {"claim": "t/late", "device": "n1/gpu-vfio-3", "kind": "NoExecute", "after_s": 5.0},
        {"claim": "u/sus", "device": "n2/gpu-vfio-0", "kind": "suspect", "after_s": 30.5}]
    assert got["raced"] == [{"claim": "t/same", "device": "n1/gpu-vfio-3", "kind": "NoExecute",
                             "after_s": 0.0}]
    # after a mark on its node: late, sus and ok (n1's mark; n2's is before ok's 300 s too)
    assert got["exposed"] == 4
    assert on_marked(claims, []) == {"placed": [], "raced": [], "exposed": 0}


def test_suspects_found_on_time_and_healthy_suspects():
    broken = [{"pool": "n1", "device": "gpu-vfio-0", "suspected_after": 3},
              {"pool": "n2", "device": "gpu-vfio-5", "suspected_after": 2},     # too early
              {"pool": "n3", "device": "gpu-vfio-1", "suspected_after": None},  # never
              {"pool": "", "device": "", "suspected_after": None}]              # never placed
    suspected = [["n1", "gpu-vfio-0"], ["n2", "gpu-vfio-5"], ["n9", "gpu-vfio-7"]]
    got = suspect_figures(broken, suspected, 3)
    assert got == {"injected": 3, "found": 2, "on_time": 1, "suspected_after": [3, 2, None, None],
                   "healthy_suspected": ["n9/gpu-vfio-7"]}


def _report(**over) -> dict:
    report = {"spec": {"failed_starts": 3},
              "restart": restart_figures([{"eviction_s": 2.0, "running_s": 12.0},
                                          {"eviction_s": 3.0, "running_s": 20.0}]),
              "suspects": suspect_figures([{"pool": "n1", "device": "d0", "suspected_after": 3}],
                                          [["n1", "d0"]], 3),
              "placements": {"placed": [], "raced": []},
              "lost": {"injected": 2, "reported": 2}, "noschedule": {"injected": 1, "vm_kept": 1},
              "broken": [{"mark_s": 0.4}], "seed": 1, "schedule": "abc", "nodes": 100,
              "counts": {}, "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 1.0, 1.0],
              "commit": "532750e"}
    report.update(over)
    return report


def test_targets_met_and_not_met():
    report = _report()
    t = targets(report)
    assert t["restart_beyond_eviction_p99_s"] == {"value": 17.0, "target": "<= 30 s, all 2 ran again",
                                                  "met": True}
    assert all(v["met"] for v in t.values()), t
    report["targets"] = t
    assert targets_lines(report)[0] == ("target restart_beyond_eviction_p99_s: 17.0 "
                                        "(<= 30 s, all 2 ran again): met")
    bad = targets(_report(
        restart=restart_figures([{"eviction_s": 2.0, "running_s": 40.0},
                                 {"eviction_s": 2.0, "running_s": None}]),
        suspects=suspect_figures([{"pool": "n1", "device": "d0", "suspected_after": 2}],
                                 [["n1", "d0"], ["n2", "d1"]], 3),
        placements={"placed": [{"claim": "t/x"}], "raced": []},
        lost={"injected": 2, "reported": 1}))
    assert {k: v["met"] for k, v in bad.items()} == {
        "restart_beyond_eviction_p99_s": False, "broken_suspected_after_failed_start_n": False,
        "healthy_suspected": False, "placements_on_marked": False, "lost_reported": False}
    # a restart under 30 s beyond the eviction still fails when a VM never ran again
    one_lost = targets(_report(restart=restart_figures([{"eviction_s": 2.0, "running_s": 5.0},
                                                       {"eviction_s": 2.0, "running_s": None}])))
    assert one_lost["restart_beyond_eviction_p99_s"]["met"] is False
    assert summary(report)[2] == ("broken devices: 1/1 suspected, after failed starts [3] "
                                  "(marked [0.4] s after the last); healthy suspected 0")
    nothing = targets(_report(restart=restart_figures([]), lost={"injected": 0, "reported": 0}))
    assert nothing["restart_beyond_eviction_p99_s"]["met"] is None
    assert nothing["lost_reported"]["met"] is None
