"""`bench scale`'s window figures without a cluster (issue 40 item 3: name what grows with
the fleet): kube-apiserver's /metrics text read into per-call latency and request counts,
the quiet admissions' `inside` (the replicas' means, the webhook's phases per admission,
kube-apiserver's calls, each process's CPU) and the idle window's background per process,
from two readings made of real exposition lines and made-up values; nothing is timed."""

from __future__ import annotations

import os

import pytest

from bench.scale.measure import Reading, idle_figures, quiet_inside
from bench.scale.population import latency_between, latency_of, request_counts, requests_per_s
from bench.scale.workload import VmiRecord

DUR = "apiserver_request_duration_seconds"


def apiserver(creates: int, create_s: float, patches: int, patch_s: float, lease_puts: int,
              node_patches: int) -> str:
    """kube-apiserver's /metrics lines the figures read: the request duration of the
    GPUDevice create and status patch (and a Lease's, which `latency_of` leaves out) and
    `apiserver_request_total` of those and of KWOK's Lease renewals and node status
    patches, split over two codes as the server writes them."""
    gd = 'group="gpu.cozystack.io",resource="gpudevices",scope="resource"'
    return "\n".join([
        f'# HELP {DUR} Response latency distribution',
        f'# TYPE {DUR} histogram',
        f'{DUR}_bucket{{component="apiserver",{gd},subresource="",verb="POST",version="v1alpha1",le="0.005"}} 1',
        f'{DUR}_sum{{component="apiserver",{gd},subresource="",verb="POST",version="v1alpha1"}} {create_s}',
        f'{DUR}_count{{component="apiserver",{gd},subresource="",verb="POST",version="v1alpha1"}} {creates}',
        f'{DUR}_sum{{component="apiserver",{gd},subresource="status",verb="PATCH",version="v1alpha1"}} {patch_s}',
        f'{DUR}_count{{component="apiserver",{gd},subresource="status",verb="PATCH",version="v1alpha1"}} {patches}',
        f'{DUR}_sum{{component="apiserver",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"}} 9.5',
        f'{DUR}_count{{component="apiserver",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"}} {lease_puts}',
        '# HELP apiserver_request_total Counter of apiserver requests',
        '# TYPE apiserver_request_total counter',
        f'apiserver_request_total{{code="201",component="apiserver",dry_run="",{gd},subresource="",verb="POST",version="v1alpha1"}} {creates}',
        f'apiserver_request_total{{code="200",component="apiserver",dry_run="",{gd},subresource="status",verb="PATCH",version="v1alpha1"}} {patches - 1}',
        f'apiserver_request_total{{code="409",component="apiserver",dry_run="",{gd},subresource="status",verb="PATCH",version="v1alpha1"}} 1',
        f'apiserver_request_total{{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"}} {lease_puts}',
        f'apiserver_request_total{{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"}} {node_patches}',
        f'apiserver_request_total{{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""}} {creates // 20}',
        ""])


def test_apiserver_latency_and_requests_per_call_between_two_readings():
    before = apiserver(100, 0.4, 300, 1.5, 5000, 200)
    after = apiserver(160, 0.4 + 0.36, 480, 1.5 + 1.26, 6000, 300)
    assert latency_of(before) == {"POST gpudevices": (0.4, 100),
                                  "PATCH gpudevices/status": (1.5, 300)}
    assert latency_between(latency_of(before), latency_of(after)) == {
        "POST gpudevices": {"requests": 60, "mean_ms": 6.0},
        "PATCH gpudevices/status": {"requests": 180, "mean_ms": 7.0}}
    assert latency_between(latency_of(after), latency_of(after)) == {}
    assert request_counts(before) == {"POST gpudevices": 100, "PATCH gpudevices/status": 300,
                                      "PUT leases": 5000, "PATCH nodes/status": 200,
                                      "GET /metrics": 5}
    # 10 s of the fleet renewing its Leases and writing node status, the admissions', and
    # the /metrics reads (a request for no resource)
    assert requests_per_s(request_counts(before), request_counts(after), 10.0) == {
        "PUT leases": 100.0, "PATCH gpudevices/status": 18.0, "PATCH nodes/status": 10.0,
        "POST gpudevices": 6.0, "GET /metrics": 0.3, "total": 134.3}
    assert requests_per_s(request_counts(before), request_counts(after), 10.0, top=1) == {
        "PUT leases": 100.0, "total": 134.3}
    assert requests_per_s(request_counts(before), request_counts(after), 0.0) == {}


PHASE = "gpu_binder_admission_phase_seconds"


def replicas(n: int, phases: dict[str, float], decision: tuple[float, int]) -> dict:
    """The replicas' summed samples after `n` device-mode reviews: each phase's seconds
    summed, the admission histogram (total + 1 ms a review) and the binder's decisions."""
    out = {}
    for name, secs in phases.items():
        labels = (("mode", "device"), ("phase", name))
        out[(f"{PHASE}_sum", labels)], out[(f"{PHASE}_count", labels)] = secs, float(n)
    out[("gpu_binder_admission_seconds_sum", ())] = phases.get("total", 0.0) + 0.001 * n
    out[("gpu_binder_admission_seconds_count", ())] = float(n)
    out[("gpu_binder_decision_seconds_sum", ())] = decision[0]
    out[("gpu_binder_decision_seconds_count", ())] = float(decision[1])
    out[("gpu_binder_housekeeping_rounds_total", ())] = 3.0 * n   # the leader's, 3 a review
    return out


def rec(ms: float, admitted: bool = True) -> VmiRecord:
    r = VmiRecord("t0", "v", "sc-hgx", 1)
    r.admitted, r.admit_ms = admitted, ms
    return r


def test_quiet_inside_names_the_phases_per_admission_the_calls_and_the_cpu_per_process():
    before = Reading(replicas(40, {"attach": 0.3, "wait-result": 0.5, "total": 1.6}, (0.04, 40)),
                     latency_of(apiserver(100, 0.4, 300, 1.5, 5000, 200)), {},
                     {"kube-apiserver": 100.0, "replica-0": 10.0, "replica-1": 5.0,
                      "kwok": 20.0}, 1000.0)
    # 20 admissions over 4 s: attach 8 ms, wait-result 15 ms, total 40 ms each
    after = Reading(replicas(60, {"attach": 0.46, "wait-result": 0.8, "total": 2.4}, (0.07, 60)),
                    latency_of(apiserver(120, 0.52, 360, 1.92, 5400, 240)), {},
                    {"kube-apiserver": 101.2, "replica-0": 10.4, "replica-1": 5.02,
                     "kwok": 20.8}, 1004.0)
    recs = [rec(60.0)] * 19 + [rec(80.0), rec(5.0, admitted=False)]
    got = quiet_inside(before, after, recs, "device",
                       {"replica-0": "leader", "replica-1": "follower"})
    assert (got["webhook_mean_ms"], got["decision_mean_ms"], got["decisions"]) == (41.0, 1.5, 20)
    assert got["housekeeping_rounds"] == 60
    assert got["client_mean_ms"] == 61.0          # the 20 admitted ones: (19×60 + 80) ÷ 20
    assert got["phase_ms"] == {"attach": 8.0, "wait-result": 15.0, "total": 40.0, "own": 17.0}
    assert got["phases"]["device"]["attach"] == {"n": 20, "mean_ms": 8.0}
    assert got["apiserver"] == {"POST gpudevices": {"requests": 20, "mean_ms": 6.0},
                                "PATCH gpudevices/status": {"requests": 60, "mean_ms": 7.0}}
    cpu = got["cpu"]
    assert cpu["ms_per_admission"] == {"kube-apiserver": 60.0, "replica-0 (leader)": 20.0,
                                       "replica-1 (follower)": 1.0, "kwok": 40.0,
                                       "total": 121.0}
    assert cpu["process_cores"] == {"kube-apiserver": 0.3, "replica-0 (leader)": 0.1,
                                    "replica-1 (follower)": 0.005, "kwok": 0.2, "total": 0.605}
    assert cpu["cores"] == 0.61   # cpu_per_admission's total, 2.42 CPU s ÷ 4 s, to 0.01
    # a mode with no phase observed: no per-admission phases, not an error
    assert quiet_inside(before, after, recs, "count", {})["phase_ms"] == {}


def test_idle_window_is_each_processs_background_and_what_the_server_served():
    text0, text1 = apiserver(0, 0.0, 0, 0.0, 5000, 200), apiserver(0, 0.0, 0, 0.0, 6000, 300)
    samples = replicas(60, {"total": 2.4}, (0.07, 60))
    rounds = ("gpu_binder_housekeeping_rounds_total", ())
    before = Reading(samples, {}, request_counts(text0),
                     {"kube-apiserver": 100.0, "etcd": 30.0, "replica-0": 10.0}, 50.0)
    after = Reading({**samples, rounds: samples[rounds] + 2}, {}, request_counts(text1),
                    {"kube-apiserver": 103.0, "etcd": 30.5, "replica-0": 10.1}, 60.0)
    got = idle_figures(before, after, {"replica-0": "leader"})
    assert got["cores"] == {"kube-apiserver": 0.3, "etcd": 0.05, "replica-0 (leader)": 0.01,
                            "total": 0.36}
    assert got["seconds"] == 10.0
    assert got["apiserver_requests_per_s"] == {"PUT leases": 100.0, "PATCH nodes/status": 10.0,
                                               "total": 110.0}
    assert got["replicas"] == {"webhook_mean_ms": None, "decision_mean_ms": None,
                               "decisions": 0, "housekeeping_rounds": 2}   # the periodic ones


@pytest.mark.parametrize("quick", [False, True])
def test_the_plan_measures_an_idle_window_before_the_quiet_admissions(quick):
    from bench.scale.workload import QUICK_PLAN, Plan

    assert (QUICK_PLAN if quick else Plan()).idle_s == (5.0 if quick else 10.0)


@pytest.mark.anyio
async def test_measure_reads_an_idle_window_then_each_quiet_window_over_the_same_admissions(
        monkeypatch):
    """`Measure.idle` and `Measure.quiet` on a fake cluster (one replica, the leader, whose
    /metrics count what the fake admissions did; kube-apiserver's /metrics counting Lease
    renewals each time it is read): the idle window has each process's cores and what the
    server served, no review; the quiet window's `inside` has the phases of exactly the
    admissions made in it and the CPU per admission per process, the replica by its role."""
    from types import SimpleNamespace

    from bench.scale import measure
    from bench.scale.workload import Plan, Population, ScaleSpec
    from tests.bench.test_floor_report import replica

    state = {"n": 0, "apiserver_reads": 0}

    class Cluster:
        replicas = [SimpleNamespace(alive=True, identity="replica-0")]

        def metrics(self, i: int) -> str:
            n = state["n"]   # each admission: attach 10 ms, wait-result 20 ms, total 40 ms
            return replica(0.01 * n, n, 0.04 * n, wait_sum=0.02 * n, decision=(0.001 * n, n))

        def leader(self) -> str:
            return "replica-0"

    async def metrics_text(api) -> str:
        state["apiserver_reads"] += 1
        return apiserver(0, 0.0, 0, 0.0, 100 * state["apiserver_reads"], 0)

    async def admit(fleet, rec, counts, **kw) -> None:
        state["n"] += 1
        rec.admitted, rec.admit_ms, rec.uid = True, 55.0, f"uid-{state['n']}"

    async def bound(uid: str, timeout: float) -> str:
        return ""

    async def release(recs) -> dict:
        return {"released": len(recs), "seconds": 0.0, "timed_out": False}
    monkeypatch.setattr(measure, "apiserver_metrics", metrics_text)
    monkeypatch.setattr(measure, "admit", admit)
    monkeypatch.setattr(measure, "cluster_pids", lambda lc: {"replica-0": os.getpid()})
    fleet = SimpleNamespace(custom=SimpleNamespace(api_client=None))
    pop = Population(ScaleSpec(), tenants=["t0"])
    m = measure.Measure(Cluster(), fleet, pop, SimpleNamespace(bound=bound),
                        Plan(quiet={1: 3, 4: 2}))
    monkeypatch.setattr(m, "release", release)

    idle = await m.idle(0.01)
    assert set(idle["cores"]) == {"replica-0 (leader)", "bench", "total"}
    assert list(idle["apiserver_requests_per_s"]) == ["PUT leases", "total"]
    assert idle["replicas"]["decisions"] == 0 and idle["roles"] == {"replica-0": "leader"}
    state["n"] += 5   # admissions before the quiet window are not in it
    quiet = await m.quiet()
    assert [quiet[k]["admitted"] for k in ("1", "4")] == [3, 2]
    for k, n in (("1", 3), ("4", 2)):
        inside = quiet[k]["inside"]
        assert inside["phase_ms"] == {"attach": 10.0, "wait-result": 20.0, "total": 40.0,
                                      "own": 10.0}
        assert inside["phases"]["count"]["total"]["n"] == n
        assert (inside["decisions"], inside["client_mean_ms"]) == (n, 55.0)
        assert set(inside["cpu"]["ms_per_admission"]) == {"replica-0 (leader)", "bench", "total"}
        assert set(inside["cpu"]["process_cores"]) == {"replica-0 (leader)", "bench", "total"}
        assert quiet[k]["release"]["released"] == n
