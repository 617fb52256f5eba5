"""Prometheus metrics of one replica (prometheus-client, a registry per process).

Counters and histograms are updated where things happen (admissions, decisions); the actor
tree's figures (restarts, reservations in flight, mailbox depth) and leadership are read on
scrape from the frozen `statistics()` values, so nothing reaches inside an actor; the fleet's
figures per class and tenant (`gpu-binder top`'s) are computed from the cache by the scrape
(`refresh_fleet`, in a worker thread, at most every FLEET_MAX_AGE seconds, never while a
heap report is being taken: `heap_report`); where the
process's memory lives (`refresh_heap`: `actors.heap.heap_parts`, on the event loop, at most
every HEAP_MAX_AGE seconds).
`k8s/manifests/dashboards/gpu-binder.json` is the Grafana dashboard over these names.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import anyio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from actors.heap import heap_parts, heap_report
from supervisor.binder import ChildKind

if TYPE_CHECKING:
    from k8s.cache import ClusterCache
    from k8s.housekeeping import HousekeepingStats
    from k8s.leader import LeaderElector
    from k8s.webhook.admission import VMIAdmission
    from k8s.webhook.phases import Recorded
    from model.explain import Top
    from model.reasons import Code
    from supervisor.binder import Binder


@dataclass(frozen=True, slots=True)
class Observed:
    """What the metrics read of the running process at one scrape
    (`k8s.controller.Controller.observed()` makes it): whether the informer cache has
    synced, the Lease elector once built, the binder while leading, the cache once built,
    and housekeeping's figures while leading (None otherwise)."""

    synced: bool = False
    elector: "LeaderElector | None" = None
    binder: "Binder | None" = None
    cache: "ClusterCache | None" = None
    housekeeping: "HousekeepingStats | None" = None
    api_pool: dict[str, int] | None = None
    """The API client's pool (`k8s.client.pool_connections`: in_use, idle, limit)."""
    webhook_connections: int | None = None
    """The API server's connections open to this replica's webhook (None: not serving)."""

FLEET_MAX_AGE = 10.0
"""Seconds a computation of the fleet figures is reused by later scrapes."""

HEAP_MAX_AGE = 5.0
"""Seconds a reading of the heap's parts (`Metrics.refresh_heap`) is reused by later scrapes:
one reading costs a few milliseconds (docs/metrics.md), so however often the replica is
scraped it spends under a thousandth of a core on them."""


class _TreeCollector:
    def __init__(self, observe: Callable[[], Observed], admission: "VMIAdmission") -> None:
        self.observe = observe
        self.admission = admission

    def collect(self) -> Iterator:
        state = self.observe()
        elector = state.elector
        leader = GaugeMetricFamily("gpu_binder_leader", "1 while this replica holds the Lease")
        leader.add_metric([], 1.0 if elector is not None and elector.is_leader else 0.0)
        yield leader
        transitions = CounterMetricFamily("gpu_binder_leader_transitions",
                                          "times this replica became leader")
        transitions.add_metric([], float(elector.transitions if elector else 0))
        yield transitions
        adm = CounterMetricFamily("gpu_binder_admissions", "VMI admissions by outcome",
                                  labels=["outcome"])
        adm.add_metric(["admitted"], float(self.admission.admitted))
        adm.add_metric(["denied"], float(self.admission.denied))
        yield adm
        rejected = CounterMetricFamily(
            "gpu_binder_admission_rejections",
            "webhook refusals by tenant and reason code: W1's checks and turns refused",
            labels=["namespace", "reason"])
        for (namespace, code), n in sorted(self.admission.rejected.items()):
            rejected.add_metric([namespace, code.value], float(n))
        yield rejected
        gate = self.admission.gate
        stats = gate.statistics() if gate is not None else None
        for name, help_, value in (
                ("gpu_binder_admissions_in_progress",
                 "admissions holding a turn of the webhook's fair share", stats and stats.in_flight),
                ("gpu_binder_admissions_waiting",
                 "admissions waiting for their tenant's turn", stats and stats.waiting),
                ("gpu_binder_admissions_tenant_peak",
                 "the most admissions of one tenant in progress at once since the start "
                 "(up to --webhook-concurrency: a tenant alone borrows idle turns)",
                 stats and stats.peak_per_tenant),
                ("gpu_binder_admissions_tenant_peak_contended",
                 "the most admissions of one tenant in progress just after a turn given while "
                 "another tenant waited (above --webhook-tenant-concurrency only when every "
                 "tenant waiting held its share: a turn lent, not left idle)",
                 stats and stats.peak_contended)):
            fam = GaugeMetricFamily(name, help_)
            fam.add_metric([], float(value or 0))
            yield fam
        lent = CounterMetricFamily("gpu_binder_admission_turns_lent",
                                   "turns given to a tenant past its share (--webhook-tenant-"
                                   "concurrency) while no other tenant under its share waited: "
                                   "idle capacity lent")
        lent.add_metric([], float(stats.lent if stats is not None else 0))
        yield lent
        dropped = CounterMetricFamily("gpu_binder_denial_events_dropped",
                                      "denial Events not written: the tenant's Event budget "
                                      "was spent")
        dropped.add_metric([], float(self.admission.events.dropped))
        yield dropped
        binder = state.binder
        stats = binder.statistics() if binder is not None else None
        restarts = CounterMetricFamily("gpu_binder_actor_restarts",
                                       "actor restarts by the supervisor")
        reservations = GaugeMetricFamily("gpu_binder_reservations_in_flight",
                                         "capacity reservations held by node actors")
        inflight = GaugeMetricFamily("gpu_binder_requests_in_flight",
                                     "requests decided whose writes are not yet visible")
        depth = GaugeMetricFamily("gpu_binder_mailbox_depth", "messages queued, all actors")
        actors = GaugeMetricFamily("gpu_binder_actors", "running actors")
        if stats is not None:
            children = stats.children.values()
            restarts.add_metric([], float(stats.restarts))
            reservations.add_metric([], float(sum(
                c.reservations for cid, c in stats.children.items()
                if stats.kinds[cid] is ChildKind.NODE)))
            inflight.add_metric([], float(sum(
                c.reservations for cid, c in stats.children.items()
                if stats.kinds[cid] is not ChildKind.NODE)))
            depth.add_metric([], float(sum(c.mailbox_depth for c in children)))
            actors.add_metric([], float(sum(1 for c in children if c.running)))
        else:
            for fam in (restarts, reservations, inflight, depth, actors):
                fam.add_metric([], 0.0)
        yield from (restarts, reservations, inflight, depth, actors)
        cached = GaugeMetricFamily("gpu_binder_cache_objects", "objects held by each informer",
                                   labels=["informer"])
        seen = GaugeMetricFamily("gpu_binder_informer_resource_version",
                                 "the last resourceVersion each informer has applied (an etcd "
                                 "revision: a write at or below it is in the cache)",
                                 labels=["informer"])
        for informer in (state.cache.informers if state.cache is not None else ()):
            cached.add_metric([informer.name], float(len(informer.keys())))
            if (informer.resource_version or "").isdigit():
                seen.add_metric([informer.name], float(informer.resource_version))
        yield cached
        yield seen
        if state.api_pool is not None:
            pool = GaugeMetricFamily(
                "gpu_binder_api_connections", "this replica's connections to kube-apiserver "
                "(its client's pool): in_use (a call or an open watch), idle (kept alive)",
                labels=["state"])
            pool.add_metric(["in_use"], float(state.api_pool["in_use"]))
            pool.add_metric(["idle"], float(state.api_pool["idle"]))
            yield pool
            limit = GaugeMetricFamily("gpu_binder_api_connections_limit",
                                      "the most connections the client's pool opens at once")
            limit.add_metric([], float(state.api_pool["limit"]))
            yield limit
        if state.webhook_connections is not None:
            hooked = GaugeMetricFamily("gpu_binder_webhook_connections",
                                       "connections open to this replica's webhook (kube-apiserver's)")
            hooked.add_metric([], float(state.webhook_connections))
            yield hooked
        keeper = state.housekeeping
        rounds = CounterMetricFamily("gpu_binder_housekeeping_rounds",
                                     "housekeeping rounds completed while leading (H1-H3)")
        rounds.add_metric([], float(keeper.rounds if keeper is not None else 0))
        yield rounds
        present = GaugeMetricFamily(
            "gpu_binder_policy_parameter_present",
            "1 while ConfigMap gpu-settings, the shipped policies' parameter, exists as H3 "
            "last found it, 0 while missing (the policies then deny every Pod, VMI, ResourceClaim "
            "and ResourceClaimTemplate they match); the leader only, after its first H3 look")
        if keeper is not None and keeper.settings_present is not None:
            present.add_metric([], 1.0 if keeper.settings_present else 0.0)
        yield present
        recreated = CounterMetricFamily(
            "gpu_binder_policy_parameter_recreated",
            "times H3 found ConfigMap gpu-settings missing and created it (while leading)")
        recreated.add_metric([], float(keeper.settings_recreated if keeper is not None else 0))
        yield recreated
        kept = GaugeMetricFamily(
            "gpu_binder_kept_sets",
            "GPU sets kept for a stopped VirtualMachine now (H4: attachedTo.keptUntil ahead), "
            "as the last housekeeping round found them; the leader only")
        if keeper is not None and keeper.kept_now is not None:
            kept.add_metric([], float(keeper.kept_now))
        yield kept
        released = CounterMetricFamily(
            "gpu_binder_kept_sets_released",
            "kept GPU sets housekeeping released (H4), by reason: vm_deleted (the VM deleted, "
            "being deleted or re-created) or expired (keepSetFor ran out); while leading",
            labels=["reason"])
        by = keeper.released_by if keeper is not None else {}
        for reason in ("vm_deleted", "expired"):
            released.add_metric([reason], float(by.get(reason, 0)))
        yield released


class _FleetCollector:
    """The figures of `gpu-binder top` per class and per tenant budget, as last computed by
    `Metrics.refresh_fleet` (nothing until then, i.e. until the cache has synced)."""

    def __init__(self, metrics: "Metrics") -> None:
        self.metrics = metrics

    def collect(self) -> Iterator:
        labels = ["class", "resource"]
        fams = {
            "bound": GaugeMetricFamily("gpu_binder_class_bound_devices",
                                       "GPUDevices of the class Bound to a node", labels=labels),
            "attached": GaugeMetricFamily(
                "gpu_binder_class_attached_devices",
                "Bound devices of the class attached to a VMI that exists", labels=labels),
            "awaiting": GaugeMetricFamily(
                "gpu_binder_class_awaiting_devices",
                "Bound devices of the class attached to a VMI not seen yet (an admission in "
                "progress, or a failed create: H1 frees them after the attachment grace)",
                labels=labels),
            "idle": GaugeMetricFamily(
                "gpu_binder_class_idle_devices",
                "Bound devices of the class attached to no existing VMI (held idle)",
                labels=labels),
            "free": GaugeMetricFamily(
                "gpu_binder_class_free_units",
                "free units of the class's resource on schedulable nodes serving it",
                labels=labels),
            "largest": GaugeMetricFamily(
                "gpu_binder_class_largest_placeable_set",
                "largest set of new devices of the class the binder would place on one node "
                "now (devices; below free units means fragmentation)", labels=labels),
        }
        used = GaugeMetricFamily("gpu_binder_tenant_budget_used_devices",
                                 "a tenant's Bound plus reserved devices of a resource",
                                 labels=["namespace", "resource"])
        hard = GaugeMetricFamily("gpu_binder_tenant_budget_hard_devices",
                                 "a tenant's budget of a resource (smallest ResourceQuota "
                                 "requests.<resource>)", labels=["namespace", "resource"])
        lost = GaugeMetricFamily(
            "gpu_binder_devices_lost",
            "devices of the device-mode class that are lost (HL3): recorded but no longer "
            "published (reason left-slices), or published without the class's topology "
            "attribute (attribute-lost); never counted free", labels=["class", "reason"])
        figures = self.metrics.fleet
        if figures is not None:
            for d in figures.devices:
                for reason, n in d.lost_by:
                    lost.add_metric([d.class_name, reason], float(n))
            for c in figures.classes:
                values = {"bound": c.bound, "attached": c.attached, "awaiting": c.awaiting,
                          "idle": c.idle,
                          "free": c.free, "largest": c.largest}
                for key, fam in fams.items():
                    fam.add_metric([c.class_name, c.resource], float(values[key]))
            for t in figures.tenants:
                used.add_metric([t.namespace, t.resource], float(t.used))
                if t.hard is not None:
                    hard.add_metric([t.namespace, t.resource], float(t.hard))
        yield from fams.values()
        yield lost
        yield used
        yield hard


class _HeapCollector:
    """Where the replica's memory lives, as `Metrics.refresh_heap` last read it (nothing
    until then): `gpu_binder_heap_bytes` by part and `gpu_binder_heap_pymalloc_blocks`."""

    def __init__(self, metrics: "Metrics") -> None:
        self.metrics = metrics

    def collect(self) -> Iterator:
        parts = self.metrics.heap or {}
        fam = GaugeMetricFamily(
            "gpu_binder_heap_bytes",
            "where this replica's memory lives (actors.heap.heap_parts): resident bytes by "
            "mapping (rss_heap glibc's main arena, rss_thread_arenas worker threads' malloc "
            "arenas, rss_anon other anonymous memory: pymalloc's arenas and mmap'd chunks, "
            "rss_stacks, rss_file, rss_other; they add up to the RSS) and glibc's mallinfo2 "
            "(malloc_arena, malloc_mmap, malloc_in_use, malloc_free, malloc_releasable; "
            "absent off glibc)", labels=["part"])
        for part, n in sorted(parts.items()):
            if part != "pymalloc_blocks":
                fam.add_metric([part], float(n))
        yield fam
        blocks = GaugeMetricFamily("gpu_binder_heap_pymalloc_blocks",
                                   "memory blocks Python's object allocator has handed out "
                                   "and not freed (sys.getallocatedblocks)")
        if "pymalloc_blocks" in parts:
            blocks.add_metric([], float(parts["pymalloc_blocks"]))
        yield blocks


class Metrics:
    """The replica's registry. `render()` gives (body bytes, content type) for /metrics.
    `observe` gives what a scrape reads of the process (`Observed`); `admission` is the
    webhook, whose counters are read as they are, and whose admitted reviews' phases this
    observes (it sets itself as `admission.phase_observer`: `admission_phases`)."""

    def __init__(self, observe: Callable[[], Observed], admission: "VMIAdmission") -> None:
        self.registry = CollectorRegistry()
        self.admission_latency = Histogram(
            "gpu_binder_admission_seconds", "VMI admission latency (webhook, seconds)",
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30))
        self.admission_phase = Histogram(
            "gpu_binder_admission_phase_seconds", "seconds of each phase of an admitted VMI's "
            "webhook review (k8s/webhook/phases.py: precheck, turn, live-read, judge, "
            "take-over, template-create, attach, wait-result, record-wait, claim, patch-build; "
            "total: the whole review), by mode (count, device)",
            ["phase", "mode"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                     5, 10, 30))
        self.decisions = Counter("gpu_binder_decisions",
                                 "binder decisions by result, rule and refusal reason",
                                 ["result", "rule", "reason"], registry=self.registry)
        self.decision_latency = Histogram(
            "gpu_binder_decision_seconds", "binder decision latency (seconds)",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
        self.defrag_moves = Counter(
            "gpu_binder_defrag_moves", "idle held devices moved by defragmentation rounds "
            "(D2; handed to the status pipeline)", registry=self.registry)
        self.defrag_rounds = Counter(
            "gpu_binder_defrag_rounds", "defragmentation rounds run (with or without moves)",
            registry=self.registry)
        self.largest_set = Gauge(
            "gpu_binder_largest_placeable_set", "largest set of new devices of the class "
            "placeable on one node, as the last defragmentation round left it (D4)",
            ["class"], registry=self.registry)
        self.line_length = Gauge(
            "gpu_binder_line_length", "GPU sets waiting for room in the line of the class (P5: "
            "refused for room or held back by the line, not started yet), as the leader's "
            "coordinator last changed it; a set of several classes waits in each",
            ["class"], registry=self.registry)
        self.line_wait = Histogram(
            "gpu_binder_line_wait_seconds", "how long a GPU set waited in the line, from its "
            "first refusal for room to its placement (P5; observed when it leaves by starting), "
            "by the PriorityClass it recorded (its name; none: no class) and class",
            ["priority", "class"], registry=self.registry,
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600))
        self.preemptions = Counter(
            "gpu_binder_preemptions", "preemptions the leader decided (P4: nominations made, "
            "each for a set refused for room), by class of the preemptor's set",
            ["class"], registry=self.registry)
        self.preemption_victims = Counter(
            "gpu_binder_preemption_victims", "sets the leader's nominations name to stop (P4), "
            "by class of the preemptor's set", ["class"], registry=self.registry)
        self._line_classes: set[str] = set()
        self.devices_suspected = Gauge(
            "gpu_binder_devices_suspected", "devices the leader suspects broken (HL2: "
            "health.failedStarts different VMIs failed to start on each within health.window): "
            "in device mode those marked (a DeviceTaintRule, or the gpu-suspects ConfigMap), in "
            "count mode the nodes (the device plugin's pick is unknown)", ["class"],
            registry=self.registry)
        self._suspected_classes: set[str] = set()
        self.failed_starts = Counter(
            "gpu_binder_failed_starts", "failed starts the leader counted as evidence against a "
            "GPU of the class (HL2: a VMI's launcher Pod or the VMI Failed before it ran, not "
            "for an image pull, a deletion or a kubelet refusal; each VMI once)", ["class"],
            registry=self.registry)
        self.registry.register(_TreeCollector(observe, admission))
        self.observe = observe
        self.admission = admission
        admission.phase_observer = self
        self.fleet: "Top | None" = None
        self._fleet_at = -math.inf
        self._workers = anyio.Lock()
        """Held by the worker computing the fleet figures and by a heap report's: one never
        runs while the other does (`heap_report`)."""
        self.registry.register(_FleetCollector(self))
        self.heap: dict[str, int] | None = None
        self._heap_at = -math.inf
        self.registry.register(_HeapCollector(self))

    def refresh_heap(self, max_age: float = HEAP_MAX_AGE) -> None:
        """Read where the process's memory lives (`actors.heap.heap_parts`: {part: bytes},
        pymalloc_blocks a count) when the last reading is older than `max_age`
        seconds (monotonic). Called by each scrape before `render`; on the calling thread
        (the event loop), since the reading takes a few milliseconds and a worker thread
        would get a malloc arena of its own, the very thing measured. Never raises for a
        missing /proc or C library (`heap_parts` leaves those parts out)."""
        now = time.monotonic()
        if now - self._heap_at < max_age:
            return
        self._heap_at = now
        self.heap = heap_parts()

    async def refresh_fleet(self, max_age: float = FLEET_MAX_AGE) -> None:
        """Recompute the fleet figures (`model.explain.top` on the cache's snapshot: the
        binder's own judgement of eligible nodes) when older than `max_age` seconds and the
        cache has synced. The work is O(nodes + devices) — about 0.1-0.5 s for 5,000 nodes
        and 20,000 devices — so it runs in a worker thread on the immutable snapshot (with a
        device-mode memo of its own: `Snapshot.with_own_memo`), and a scrape never stalls
        admissions on this replica's event loop."""
        from model.explain import top

        if not self.observe().synced or self._workers.locked():
            return   # a heap report is being taken (`heap_report`): the last figures stay
        now = anyio.current_time()
        if now - self._fleet_at < max_age:
            return
        self._fleet_at = now
        cache = self.admission.cache
        # the worker fills a memo of its own: the cache's is shared with the snapshots the
        # event loop derives meanwhile, which iterate it
        snap, live = cache.view.snapshot().with_own_memo(), cache.vmi_keys()
        async with self._workers:
            self.fleet = await anyio.to_thread.run_sync(top, snap, live)

    async def heap_report(self, directory, n: int) -> dict:
        """`actors.heap.heap_report(directory, n)` (the controller's SIGUSR2) in a worker
        thread, once no fleet figures are being computed: it waits for `refresh_fleet`'s worker
        to finish, and scrapes meanwhile keep the last figures. A report taken while `top` ran
        held its working set (the memo copy filled for every node, the live VMIs' keys, the
        counts: 1.8 MiB traced at 1,000 device-mode nodes), so two reports of a steady replica
        differed by whether a scrape was in flight (the 20-minute device soak's young follower,
        2026-12-07, issue 41 item 5). Returns the report; OSError as `heap_report` raises it."""
        async with self._workers:
            return await anyio.to_thread.run_sync(heap_report, directory, n)

    def admission_phases(self, recorded: "Recorded") -> None:
        """`k8s.webhook.phases.PhaseObserver`: one observation per phase the admitted
        review met (seconds, labelled with the phase and the set's mode: both bounded, from
        `k8s.webhook.phases.PHASES` and `MODES`), and one of its `total`."""
        for name, seconds in recorded.seconds:
            self.admission_phase.labels(name, recorded.mode).observe(seconds)
        self.admission_phase.labels("total", recorded.mode).observe(recorded.total)

    def decided(self, rule: str, result, code: Code | None, seconds: float) -> None:
        """`actors.ports.DecisionObserver`: count by result, rule and refusal reason (the
        refusal's `model.reasons.Code` value, a bounded label: never a request id or a
        node name; "" when Succeeded)."""
        self.decisions.labels(result=result.value, rule=rule,
                              reason=code.value if code is not None and result.value == "Refused"
                              else "").inc()
        self.decision_latency.observe(seconds)

    def defragmented(self, moves: int, largest) -> None:
        """`actors.ports.DefragObserver`: count the round and its moves; set the largest
        placeable set per class (a class name is a bounded label: GPUClasses are few)."""
        self.defrag_rounds.inc()
        self.defrag_moves.inc(moves)
        for class_name, size in largest.items():
            self.largest_set.labels(class_name).set(size)

    def line_changed(self, lengths) -> None:
        """The coordinator's line changed (P5): `lengths` the sets waiting per class name; a
        class whose line emptied is set to 0 (a class name is a bounded label)."""
        for class_name in self._line_classes - set(lengths):
            self.line_length.labels(class_name).set(0)
        for class_name, n in lengths.items():
            self.line_length.labels(class_name).set(n)
        self._line_classes |= set(lengths)

    def left_line(self, priority, classes, seconds: float) -> None:
        """A set left the line by starting after `seconds` (P5): one observation per class it
        waited in, labelled with its PriorityClass's name (`model.priority.Priority.class_name`,
        "none" without one: bounded by the PriorityClasses that exist, and stable when a
        class's value changes)."""
        for class_name in classes:
            self.line_wait.labels(priority.class_name or "none", class_name).observe(max(0.0, seconds))

    def preempted(self, classes, victims: int) -> None:
        """A nomination made (P4): one preemption, and `victims` sets to stop, per class of the
        preemptor's set (`classes`; a class name is a bounded label)."""
        for class_name in classes:
            self.preemptions.labels(class_name).inc()
            self.preemption_victims.labels(class_name).inc(victims)

    def set_suspected(self, per_class: dict[str, int]) -> None:
        """`gpu_binder_devices_suspected` per class (HL2; a class no longer listed reads 0)."""
        for cls in self._suspected_classes | set(per_class):
            self.devices_suspected.labels(cls).set(per_class.get(cls, 0))
        self._suspected_classes |= set(per_class)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
