"""The fleet metrics (`gpu-binder top`'s figures per class and tenant budget) and the shipped
Grafana dashboard: every metric the dashboard queries is exported by `k8s.metrics`."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import anyio

from prometheus_client.parser import text_string_to_metric_families

from actors.view import IndexedView
from k8s.housekeeping import HousekeepingStats
from k8s.metrics import Metrics, Observed
from k8s.webhook.fairness import EventBudget, TenantGate
from localcluster.paths import MANIFESTS
from model.reasons import Code
from model.types import Budget
from supervisor import ChildKind, SupervisorStatistics
from tests.support.world import LIVE, what_if_cluster

DASHBOARD = MANIFESTS / "dashboards" / "gpu-binder.json"


def _idle_admission(cache=None) -> SimpleNamespace:
    """What `Metrics` reads of a `VMIAdmission` that has answered nothing yet."""
    return SimpleNamespace(admitted=0, denied=0, cache=cache, gate=None, events=EventBudget(),
                           rejected={})


def _metrics(synced: bool = True) -> dict[str, dict[tuple, float]]:
    view = IndexedView()
    snap = what_if_cluster()
    for n in snap.nodes.values():
        view.put_node(n)
    for c in snap.classes.values():
        view.put_class(c)
    for d in snap.devices.values():
        view.put_device(d)
    view.set_budgets("tenant-a", [Budget("tenant-a", "nvidia.com/H100", 3)])
    cache = SimpleNamespace(view=view, vmi_keys=lambda: set(LIVE))
    gate = TenantGate(capacity=4, per_tenant=2, queue=1, max_wait=1)
    gate.enter_nowait("tenant-a")
    admission = SimpleNamespace(admitted=2, denied=1, cache=cache, gate=gate,
                                events=EventBudget(),
                                rejected={("tenant-a", Code.TENANT_BUSY): 5,
                                          ("tenant-b", Code.BUDGET_EXHAUSTED): 1})
    metrics = Metrics(lambda: Observed(synced=synced), admission)
    anyio.run(metrics.refresh_fleet)
    body, _ = metrics.render()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        out.setdefault(fam.name, {})  # a labelled family with no sample yet counts too
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_fleet_metrics_per_class_and_tenant():
    m = _metrics()
    h100 = (("class", "h100"), ("resource", "nvidia.com/H100"))
    assert m["gpu_binder_class_bound_devices"][h100] == 3
    assert m["gpu_binder_class_attached_devices"][h100] == 2
    assert m["gpu_binder_class_idle_devices"][h100] == 1
    assert m["gpu_binder_class_awaiting_devices"][h100] == 0
    assert m["gpu_binder_class_free_units"][h100] == 1 + 2 + 1
    assert m["gpu_binder_class_largest_placeable_set"][h100] == 2
    a = (("namespace", "tenant-a"), ("resource", "nvidia.com/H100"))
    assert m["gpu_binder_tenant_budget_used_devices"][a] == 2
    assert m["gpu_binder_tenant_budget_hard_devices"] == {a: 3}


def test_per_tenant_rejections_and_the_fair_share_in_use():
    m = _metrics()
    assert m["gpu_binder_admission_rejections_total"] == {
        (("namespace", "tenant-a"), ("reason", "tenant_busy")): 5,
        (("namespace", "tenant-b"), ("reason", "budget_exhausted")): 1}
    assert m["gpu_binder_admissions_in_progress"] == {(): 1}
    assert m["gpu_binder_admissions_waiting"] == {(): 0}
    assert m["gpu_binder_admissions_tenant_peak"] == {(): 1}
    assert m["gpu_binder_denial_events_dropped_total"] == {(): 0}


def test_fleet_metrics_wait_for_the_synced_cache():
    m = _metrics(synced=False)
    assert m["gpu_binder_class_bound_devices"] == {}  # declared, no sample


def test_dashboard_queries_only_exported_metrics():
    dash = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "definition") and isinstance(v, str):
                    exprs.append(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dash)
    queried = {re.sub(r"_(total|bucket|sum|count)$", "", name)
               for e in exprs for name in re.findall(r"gpu_binder_[a-z_]+", e)}
    exported = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in _metrics()}
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, sorted(queried - exported)
    # and the dashboard shows every per-class and per-tenant figure
    assert {n for n in exported if n.startswith(("gpu_binder_class_", "gpu_binder_tenant_"))} \
        <= queried


def test_informer_versions_and_housekeeping_rounds_are_exported():
    """What e2e tests wait on (tests/e2e/helpers.py): the last resourceVersion each informer
    applied (none for an informer that has not listed yet), and the leader's rounds."""
    informers = (SimpleNamespace(name="gpudevices", resource_version="1234", keys=lambda: [1, 2]),
                 SimpleNamespace(name="nodes", resource_version=None, keys=lambda: []))
    seen = Observed(cache=SimpleNamespace(informers=informers),  # type: ignore[arg-type]
                    housekeeping=HousekeepingStats(rounds=7, settings_present=None,
                                                   settings_recreated=0))
    body, _ = Metrics(lambda: seen, _idle_admission()).render()
    got = {(s.name, tuple(s.labels.items())): s.value
           for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
    assert got[("gpu_binder_informer_resource_version", (("informer", "gpudevices"),))] == 1234
    assert ("gpu_binder_informer_resource_version", (("informer", "nodes"),)) not in got
    assert got[("gpu_binder_cache_objects", (("informer", "gpudevices"),))] == 2
    assert got[("gpu_binder_housekeeping_rounds_total", ())] == 7
    assert ("gpu_binder_policy_parameter_present", ()) not in got   # H3 has not looked yet
    seen = Observed(cache=seen.cache)  # not leading: no housekeeping
    body, _ = Metrics(lambda: seen, _idle_admission()).render()
    assert "gpu_binder_housekeeping_rounds_total 0.0" in body.decode()


def test_policy_parameter_present_and_recreated_are_exported_by_the_leader():
    """H3's view of ConfigMap gpu-settings, the shipped policies' parameter (kubernetes#133827)."""
    seen = [Observed(housekeeping=HousekeepingStats(rounds=3, settings_present=False,
                                                    settings_recreated=2))]

    def got():
        body, _ = Metrics(lambda: seen[0], _idle_admission()).render()
        return {(s.name, tuple(s.labels.items())): s.value
                for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
    assert got()[("gpu_binder_policy_parameter_present", ())] == 0
    assert got()[("gpu_binder_policy_parameter_recreated_total", ())] == 2
    seen[0] = Observed(housekeeping=HousekeepingStats(rounds=3, settings_present=True,
                                                      settings_recreated=2))
    assert got()[("gpu_binder_policy_parameter_present", ())] == 1


def test_kept_sets_and_their_releases_are_exported_by_the_leader():
    """H4: `gpu_binder_kept_sets` (sets kept now, as the last round found them; absent before
    a round and off the leader) and `gpu_binder_kept_sets_released_total{reason}` (both
    reasons always present, 0 off the leader)."""
    keeper = HousekeepingStats(rounds=3, settings_present=True, settings_recreated=0,
                               kept_now=None, released_by={"vm_deleted": 0, "expired": 0})
    seen = [Observed(housekeeping=keeper)]

    def got():
        body, _ = Metrics(lambda: seen[0], _idle_admission()).render()
        return {(s.name, tuple(s.labels.items())): s.value
                for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
    assert ("gpu_binder_kept_sets", ()) not in got()
    seen[0] = Observed(housekeeping=HousekeepingStats(
        rounds=3, settings_present=True, kept_now=3, released_by={"vm_deleted": 2, "expired": 5}))
    assert got()[("gpu_binder_kept_sets", ())] == 3
    assert got()[("gpu_binder_kept_sets_released_total", (("reason", "vm_deleted"),))] == 2
    assert got()[("gpu_binder_kept_sets_released_total", (("reason", "expired"),))] == 5
    seen[0] = Observed()  # not leading
    assert ("gpu_binder_kept_sets", ()) not in got()
    assert got()[("gpu_binder_kept_sets_released_total", (("reason", "expired"),))] == 0


def test_decisions_are_labelled_by_the_refusals_code():
    """`gpu_binder_decisions_total{reason}` is the refusal's `model.reasons.Code` (a bounded
    label, read from the decision, never from its message); "" when Succeeded."""
    from model.decide import Request, decide
    from model.reasons import Code
    from model.types import Result
    from tests.support.world import NS, dev, node, world

    cache = SimpleNamespace(view=IndexedView(), vmi_keys=set)
    metrics = Metrics(lambda: Observed(), _idle_admission(cache))
    full = decide(world([node("n1", 1)], [dev("a"), dev("b")]), Request("r1", NS, "vm", ("a", "b")))
    metrics.decided(full.rule, full.result, full.reason.code, 0.01)
    metrics.decided("ledgers", Result.REFUSED, Code.LEDGERS_REFUSED, 0.01)
    metrics.decided("B1", Result.SUCCEEDED, None, 0.01)
    body = metrics.render()[0].decode()
    samples = {tuple(sorted(s.labels.items())): s.value
               for fam in text_string_to_metric_families(body) if fam.name == "gpu_binder_decisions"
               for s in fam.samples if s.name == "gpu_binder_decisions_total"}
    assert samples == {
        (("reason", "no_eligible_node"), ("result", "Refused"), ("rule", "refused")): 1.0,
        (("reason", "ledgers_refused"), ("result", "Refused"), ("rule", "ledgers")): 1.0,
        (("reason", ""), ("result", "Succeeded"), ("rule", "B1")): 1.0,
    }


def test_D4_defragmentation_rounds_count_moves_and_set_the_largest_set_per_class():
    view = IndexedView()
    cache = SimpleNamespace(view=view, vmi_keys=lambda: set())
    metrics = Metrics(lambda: Observed(synced=True), _idle_admission(cache))
    metrics.defragmented(0, {"h100": 2, "l40s": 1})
    metrics.defragmented(2, {"h100": 4, "l40s": 1})
    out = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(metrics.render()[0].decode())
           for s in fam.samples}
    assert out[("gpu_binder_defrag_moves_total", ())] == 2
    assert out[("gpu_binder_defrag_rounds_total", ())] == 2
    assert out[("gpu_binder_largest_placeable_set", (("class", "h100"),))] == 4
    assert out[("gpu_binder_largest_placeable_set", (("class", "l40s"),))] == 1


def test_reservations_are_split_by_the_childs_kind_not_its_id():
    """`gpu_binder_reservations_in_flight` sums the node actors' holds and
    `gpu_binder_requests_in_flight` the rest (the pipeline's flights), chosen by each
    child's `ChildKind`: an id is only a name."""
    from actors.runtime import ActorStatistics

    def actor(name: str, reservations: int) -> ActorStatistics:
        return ActorStatistics(name, 0, 8, 0, 0, 0, reservations, True, 1, None)

    stats = SupervisorStatistics(
        children={"gpu-1": actor("gpu-1", 2), "node:x": actor("node:x", 3),
                  "pipe": actor("pipe", 5), "coord": actor("coord", 0)},
        kinds={"gpu-1": ChildKind.NODE, "node:x": ChildKind.NODE,
               "pipe": ChildKind.PIPELINE, "coord": ChildKind.COORDINATOR},
        restarts=1, escalated=False)
    binder = SimpleNamespace(statistics=lambda: stats)
    metrics = Metrics(lambda: Observed(binder=binder),  # type: ignore[arg-type]
                      _idle_admission(SimpleNamespace(view=IndexedView(), vmi_keys=set)))
    samples = {s.name: s.value for fam in text_string_to_metric_families(metrics.render()[0].decode())
               for s in fam.samples}
    assert samples["gpu_binder_reservations_in_flight"] == 5
    assert samples["gpu_binder_requests_in_flight"] == 5
    assert samples["gpu_binder_actors"] == 4


def test_P5_the_line_length_per_class_and_the_wait_of_a_set_that_started():
    """`gpu_binder_line_length{class}` follows the coordinator's line (a class whose line
    emptied reads 0); `gpu_binder_line_wait_seconds{priority,class}` observes a set leaving
    the line by starting, once per class it waited in."""
    from model.priority import Priority

    cache = SimpleNamespace(view=IndexedView(), vmi_keys=set)
    metrics = Metrics(lambda: Observed(synced=True), _idle_admission(cache))
    metrics.line_changed({"h100": 2, "l40s": 1})
    metrics.line_changed({"h100": 1})
    metrics.left_line(Priority(1000, class_name="on-demand"), ("h100",), 42.0)
    out = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(metrics.render()[0].decode())
           for s in fam.samples}
    assert out[("gpu_binder_line_length", (("class", "h100"),))] == 1
    assert out[("gpu_binder_line_length", (("class", "l40s"),))] == 0
    # the priority label is the PriorityClass's name (bounded, stable), not its value
    assert out[("gpu_binder_line_wait_seconds_count", (("class", "h100"), ("priority", "on-demand")))] == 1
    assert out[("gpu_binder_line_wait_seconds_sum", (("class", "h100"), ("priority", "on-demand")))] == 42.0


def test_P5_a_set_of_no_priority_class_waits_under_priority_none_and_P4_preemptions_and_victims_count():
    """`gpu_binder_line_wait_seconds{priority="none"}` for a set with no PriorityClass;
    `gpu_binder_preemptions_total{class}` and `gpu_binder_preemption_victims_total{class}`
    count the nominations the leader made and their victims, per class of the preemptor."""
    from model.priority import Priority

    cache = SimpleNamespace(view=IndexedView(), vmi_keys=set)
    metrics = Metrics(lambda: Observed(synced=True), _idle_admission(cache))
    metrics.left_line(Priority(), ("h100", "l40s"), 5.0)
    metrics.preempted(("h100",), 2)
    metrics.preempted(("h100",), 1)
    metrics.preempted(("h100", "l40s"), 3)
    out = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(metrics.render()[0].decode())
           for s in fam.samples}
    assert out[("gpu_binder_line_wait_seconds_count", (("class", "l40s"), ("priority", "none")))] == 1
    assert out[("gpu_binder_preemptions_total", (("class", "h100"),))] == 3
    assert out[("gpu_binder_preemptions_total", (("class", "l40s"),))] == 1
    assert out[("gpu_binder_preemption_victims_total", (("class", "h100"),))] == 6
    assert out[("gpu_binder_preemption_victims_total", (("class", "l40s"),))] == 3
