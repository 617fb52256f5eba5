"""The soak's driver: the churn on a running cluster (`Soak`: its population, the
scheduled operations, the samplers of the invariants, RSS, informers' objects and heaps,
settling and the final check), `soak_on` (on a cluster already running, as
tests/e2e/test_soak.py runs it) and `run` (on a cluster of its own, writing soak.json and
soak.png). The schedule is `bench.soak.workload`'s, the report `bench.soak.report`'s; device
mode's taints and checks `bench.soak.device`'s."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter, deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import anyio

from bench.common import (DEV_GROUP, DEV_VERSION, VMI_GROUP, VMI_VERSION, VMIS, LauncherPods,
                          admin_client, commit, error_text, gpu_vmi, machine, memory_mib,
                          poll_until)
from bench.scale.population import populate
from bench.soak import device as dev
from bench.soak.report import heap_reports, plot, soak_report, summary, targets
from bench.soak.workload import (MAX_CREATE_RATE, MAX_MINUTES, Op, SoakSpec, deletion_order,
                                 schedule, schedule_digest)
from localcluster import invariants as inv
from model.line import DEFAULT_RETRY_GRACE

SOAK_ARGS = ("--lease-duration=8", "--renew-deadline=6", "--retry-period=1",
             "--attachment-grace=30", "--bind-timeout=15", "--housekeeping-period=2")


@dataclass
class Rec:
    """One create (or a VMI of the population): outcome "admitted" / "refused" / "lost" (no
    answer in time, or admitted without a launcher Pod bound on its pin) / "gave up" (every
    answer for `answer_timeout` a 503 of our webhook: waiting in line, or for its victims),
    its GPUClass, the pin, the launcher Pod's node, held devices named and how many of them
    moved; with priorities its tier, the webhook's 503s and the node a nomination named."""

    ns: str
    name: str
    size: int
    cls: str = ""
    held: tuple[str, ...] = ()
    outcome: str = ""
    refusal: str = ""
    pin: str = ""
    pod_node: str = ""
    uid: str = ""
    answer_s: float = 0.0
    moved: int = 0
    tries: int = 0
    tier: str = ""
    waited: int = 0
    """503s of our webhook answered (in line, nominated, or another) before the outcome."""
    lined: int = 0
    """Of them, the answers in line in a row (the last ones)."""
    nominated: str = ""
    """The node a `preemption_nominated` answer named ("" when none did)."""


HEAP_REPORT_WAIT = 15.0
"""Seconds the soak waits for each signalled replica's heap report to reach its log."""

_SPAWNER = None


def _spawner():
    """The process-wide spawner thread (a one-worker ThreadPoolExecutor, never shut down:
    what it starts lives as long as the process needs it)."""
    global _SPAWNER
    if _SPAWNER is None:
        from concurrent.futures import ThreadPoolExecutor

        _SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="soak-spawner")
    return _SPAWNER


def judge(snap: inv.Snapshot, before: set[tuple[str, str]], admitted: set[tuple[str, str]],
          deleted: set[tuple[str, str]], victims: dict | set,
          final: bool = False, alive: dict | None = None) -> tuple[list[inv.Violation], dict]:
    """The violations of one read `snap` and the victims seen so far: §7 (`inv.check`: the VMIs
    held as admitted before the read, `before`, and still (`admitted`), or with `final` all of
    `before`), and §3c P6: nominated room Bound for nobody else (`inv.check_nominations`), no VMI
    of `before` gone unless the soak deleted it (`deleted`) or a nomination seen, in this read
    or an earlier one (`victims`: (namespace, name) -> the latest expiry of the nominations
    naming it, `inv.victim_expiries`), named it a victim while live, judged on when the VMI
    was last read alive (`alive`, `inv.check_gone`). Returns the victims with this read's.
    Pure."""
    victims = inv.merge_expiries(victims, inv.victim_expiries([*snap.nominations,
                                                               *snap.late_nominations]))
    got = inv.check(snap, settled=before & admitted if not final else before, final=final,
                    victims=victims)
    return (got + inv.check_nominations(snap)
            + inv.check_gone(snap, before, deleted=deleted, victims=victims, alive=alive)), victims


LINE_WINDOW_S = 60.0
"""Seconds of earlier reads the soak keeps for `inv.check_line_order` (at least
`inv.LINE_LAG` plus a few sampling periods)."""


def nominated_node(text: str) -> str | None:
    """The node a `preemption_nominated` refusal's words name (`model.reasons.nomination`:
    "... stopping N lower-priority VMs on NODE to make room for it ..."), None when `text` is
    no such refusal. Pure."""
    import re

    m = re.search(r"lower-priority VMs? on (\S+) to make room for it", text)
    return m.group(1) if m else None


LINE_RETRY_GRACE_S = DEFAULT_RETRY_GRACE.total_seconds()
"""How long a bare VMI's entry stays in the binder's line without a new attempt (the soak
runs the controller with `line.retryGrace`'s default): two answers in line further apart
than this (from the first's attempt sent) may belong to two entries (`Soak._waited`)."""

WAITS_IN_LINE = "the set waits in the line for room"
"""The words our webhook's 503 carries when a bare VMI refused for room takes (or keeps) its
place in the line (`model.reasons.line.WaitsInLine`; `localcluster.upgrade` reads them so)."""


def in_line(exc: BaseException) -> bool:
    """An answer of our webhook asking the client to come back: 503 with its denial (a place
    in line, a nomination, or another retryable refusal), not kube-apiserver's own 503."""
    return getattr(exc, "status", None) == 503 and "denied the request" in error_text(exc, "create")


def _concerns_prefix(nomination: dict, prefix: str) -> bool:
    """The nomination's preemptor or a victim is in a namespace named `prefix`…."""
    return bool(inv.Snapshot([], [], {}, {}, {}, nominations=[nomination]).within(prefix).nominations)


class P6Check:
    """§3c P6 as the soak checks it across its reads (pure: no I/O, no clock; `Soak` feeds it
    every read and every GPUNomination its watch sees). `victims`: (namespace, name) of
    every victim named by a nomination seen -> the latest expiry naming it; `alive`: when
    each VMI of ours was last read alive; with `line` (the priority mix), P6's third rule
    over `window` (the earlier reads of the last LINE_WINDOW_S s) and `waiting` (the sets
    the soak knows to wait in line, `inv.Waiting`, kept by the driver), each started set
    judged once (`judged`), never a preemptor of a nomination seen (`preemptors`, the watch's
    too: one made and deleted between two reads); `nominations` ((preemptor, created) -> a
    summary) and `victims_gone` for the report."""

    def __init__(self, prefix: str, *, line: bool = False) -> None:
        self.prefix, self.line = prefix, line
        self.victims: dict[tuple[str, str], datetime | None] = {}
        self.alive: dict[tuple[str, str], datetime] = {}
        self.waiting: dict[tuple[str, str], inv.Waiting] = {}
        self.window: deque[inv.LineRead] = deque()
        self.judged: dict[tuple, int | bool | None] = {}
        self.nominations: dict[tuple[str, str], dict] = {}
        self.preemptors: set[tuple[str, str]] = set()
        self.victims_gone: set[tuple[str, str]] = set()

    def read(self, snap: inv.Snapshot, before: set[tuple[str, str]],
             admitted: set[tuple[str, str]], deleted: set[tuple[str, str]],
             final: bool = False) -> tuple[list[inv.Violation], set[tuple[str, str]]]:
        """The violations of read `snap` (`judge`, and with `line` `check_line_order`) and
        the victims of `before` (held as admitted before the read) it shows gone that the
        soak did not delete (`deleted`), each once: the caller holds them admitted no more."""
        got, self.victims = judge(snap, before, admitted, deleted, self.victims, final,
                                  alive=self.alive)
        gone = self._after_read(snap, before, deleted)
        if self.line:
            got += self._line_order(snap)
        return got, gone

    def _after_read(self, snap: inv.Snapshot, before: set[tuple[str, str]],
                    deleted: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """After judging `snap`: when each VMI of ours was last read alive (no
        `deletionTimestamp`), the nominations it lists (`note_nomination`), and the victims
        held as admitted that are gone now, returned (each once)."""
        at = snap.started or snap.at
        if at is not None:   # kept only for the VMIs there now: the next read judges no other
            alive = {}
            for v in snap.vmis:
                key = (v["metadata"]["namespace"], v["metadata"]["name"])
                if not v["metadata"].get("deletionTimestamp"):
                    alive[key] = at
                elif key in self.alive:
                    alive[key] = self.alive[key]
            self.alive = alive
        for n in [*snap.nominations, *snap.late_nominations]:
            self.note_nomination(n)
        gone = ((before & set(self.victims)) - snap.existing - set(deleted)) - self.victims_gone
        self.victims_gone |= gone
        return gone

    def note_nomination(self, obj: dict) -> None:
        """Record a GPUNomination seen (a read's or the watch's): its victims (with its
        expiry) excuse their VMIs' going (`judge`), and the report counts it
        (`nominations`: one per preemptor and creation, with its node, priority, victims)."""
        spec = obj.get("spec") or {}
        pre = spec.get("preemptor") or {}
        if not _concerns_prefix(obj, self.prefix):
            return
        self.victims = inv.merge_expiries(self.victims, inv.victim_expiries([obj]))
        self.preemptors.add((pre.get("namespace"), pre.get("vmi")))
        key = (f"{pre.get('namespace')}/{pre.get('vmi')}", str(spec.get("created")))
        victims = sorted(f"{v.get('namespace')}/{v.get('vmi')}" for v in spec.get("victims") or []
                         if isinstance(v, dict))
        self.nominations[key] = {"preemptor": key[0], "created": key[1], "node": spec.get("node"),
                                 "priority": pre.get("priority"), "victims": victims,
                                 "victim_priorities": sorted(
                                     {v.get("priority") for v in spec.get("victims") or []
                                      if isinstance(v, dict) and isinstance(v.get("priority"), int)})}

    def _line_order(self, snap: inv.Snapshot) -> list[inv.Violation]:
        """P6's third rule on `snap` (`inv.check_line_order`) over the reads of the last
        LINE_WINDOW_S s, with the sets waiting in line now (still waiting after the read)."""
        read = inv.line_read(snap)   # once: device mode builds a DRA index for it
        got = inv.check_line_order([*self.window, snap], list(self.waiting.values()), self.judged,
                                   preemptors=self.preemptors, last_read=read)
        self.window.append(read)
        while (len(self.window) > 1 and snap.started is not None and self.window[0].started is not None
               and (snap.started - self.window[0].started).total_seconds() > LINE_WINDOW_S):
            self.window.popleft()
        return got


class Soak:
    """The churn driver on a running cluster (`lc` a LocalCluster whose replicas it may kill,
    `cp` its ControlPlane, `api` an admin ApiClient). `populate()` then `run()`; `report()`."""

    def __init__(self, lc, api, spec: SoakSpec, log=print) -> None:
        from localcluster.fleet import Fleet

        self.lc, self.cp, self.api, self.spec, self.log = lc, lc.cp, api, spec, log
        self.fleet = Fleet(api)
        self.ops = schedule(spec)
        self.recs: list[Rec] = []
        self.admitted: set[tuple[str, str]] = set()          # held as admitted, not deleting
        self.deleted: set[tuple[str, str]] = set()           # VMIs the soak deleted itself (P6)
        self.p6 = P6Check(spec.prefix, line=spec.priorities)   # §3c P6 across reads
        self._last_in_line: dict[tuple[str, str], bool] = {}   # the last retried answer ours
        self._line_sent: dict[tuple[str, str], float] = {}    # when the last attempt answered in line was sent
        self.running: dict[str, deque[Rec]] = {}              # deletable, oldest first
        self.held_free: dict[tuple[str, str], set[str]] = {}   # (ns, class) -> free held
        self.held_node: dict[tuple[str, str], str] = {}
        self.population: dict = {}
        self.counts: Counter = Counter()
        self.tally = inv.Tally()
        self.events: list[dict] = []
        self.rss: list[tuple[float, int, int, float]] = []
        # (t s, replica, pid, {informer: objects}) from `gpu_binder_cache_objects`
        self.cached: list[tuple[float, int, int, dict[str, int]]] = []
        # (t s, replica, pid, {part: bytes; pymalloc_blocks a count}) from
        # `gpu_binder_heap_bytes` and `gpu_binder_heap_pymalloc_blocks` (actors.heap.heap_parts)
        self.heap_parts: list[tuple[float, int, int, dict[str, int]]] = []
        self.samples: list[tuple[float, int, int]] = []        # (t, violations so far, admitted)
        self.cordoned: set[str] = set()
        self.t0 = 0.0
        self.churning = False
        self.pods = LauncherPods(api, spec.prefix, relist=True)
        self.final: dict = {}
        # device mode: when the soak deleted each VMI (UTC), the taints it made, the device
        # budgets by tenant, the NoExecute evictions seen [{at, vmi, ref, evicted_s}]
        self.deleted_at: dict[tuple[str, str], datetime] = {}
        self.taints: dict[str, dev.Taint] = {}
        self.device_budgets: dict[str, int] = {}
        self.evictions: list[dict] = []
        # (t s, claims, of them without their VMI, the oldest of those s) per sample
        self.claims_seen: list[tuple[float, int, int, float]] = []
        # each placement's window (`dev.placement_windows`), the time of the read before,
        # and the placements on a soak-tainted device that no window can judge, by (device,
        # rule)
        self.windows: dict[tuple, dev.Window] = {}
        self.read_before: datetime | None = None
        self.taint_unsure: dict[tuple[str, str], dict] = {}

    def now(self) -> float:
        """Seconds since the churn started."""
        return time.monotonic() - self.t0

    # -- population --------------------------------------------------------------------
    async def populate(self, kv) -> dict:
        """The spec's population ("own": `populate_own`, "scale": `populate_scale`), with
        `priorities` bench contention's PriorityClasses first (`make_priority_classes`, under
        the spec's prefix; kept when there already); returns seconds per phase."""
        if self.spec.priorities:
            from bench.contention import make_priority_classes

            await make_priority_classes(self.api, self.spec.prefix, "gpu-binder bench soak",
                                        exist_ok=True)
        if self.spec.population == "scale":
            return await self.populate_scale(kv)
        return await self.populate_own(kv)

    async def populate_scale(self, kv) -> dict:
        """`bench.scale.populate` with `spec.scale_spec()` (its VMIs through the real path,
        awaited until their launcher Pods are bound), then a ResourceQuota `gpu-budget` per
        tenant (`spec.budget` of each class's resource, at least what the tenant's admitted
        VMIs hold plus two nodes' GPUs), and the churn's state from it: every
        admitted VMI running (deletable, oldest first in `deletion_order`: sizes mixed, not
        largest first; held as admitted), every held
        GPUDevice no admitted VMI names free for the churn's held creates. Returns seconds
        per phase (and keeps the population's summary in `self.population`)."""
        from localcluster.fleet import quota_key

        s, sc = self.spec, self.spec.scale_spec()
        pop = await populate(self.lc, kv, self.fleet, sc)
        t = time.monotonic()
        used: Counter = Counter()
        for v in pop.admitted:
            used[(v.namespace, sc.classes[v.cls])] += v.size
        budgets = {}
        for ns in pop.tenants:
            # never below what the population already holds (at small fleets a tenant's share
            # of it can pass budget_share), with two nodes' worth of room to churn in
            budgets[ns] = {r: max(s.budget(r), used[(ns, r)] + 2 * s.gpus_per_node)
                           for r in sc.classes.values()}
            await self.fleet.core.create_namespaced_resource_quota(ns, {
                "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-budget"},
                "spec": {"hard": {quota_key(r): str(n) for r, n in budgets[ns].items()}}})
            if s.mode == "device":
                self.device_budgets[ns] = budgets[ns][sc.classes[s.cls_name]]
            self.running[ns] = deque()
            for cls in sc.classes:
                self.held_free[(ns, cls)] = set()
        named = set()
        for v in deletion_order(pop.vmis, s.seed):
            if not v.admitted:
                continue
            rec = Rec(v.namespace, v.name, v.size, cls=v.cls, held=v.held, outcome="admitted",
                      pin=v.pin, pod_node=v.node, uid=v.uid)
            self.admitted.add((rec.ns, rec.name))
            self.running[rec.ns].append(rec)
            for h in v.held:
                named.add((v.namespace, h))
                self.held_node[(v.namespace, h)] = v.pin
        devs = await self.fleet.custom.list_cluster_custom_object(DEV_GROUP, DEV_VERSION,
                                                                  "gpudevices")
        for d in devs["items"]:
            md = d["metadata"]
            key = (md["namespace"], d["spec"].get("class", ""))
            if (key in self.held_free and inv.TEMPLATE_LABEL not in (md.get("labels") or {})
                    and (md["namespace"], md["name"]) not in named):
                self.held_free[key].add(md["name"])
        self.population = {**pop.summary(), "budgets": budgets,
                           "held_free": sum(map(len, self.held_free.values()))}
        return {**{f"{k}_s": round(v, 1) for k, v in pop.seconds.items()},
                "budgets_s": round(time.monotonic() - t, 1)}

    async def populate_own(self, kv) -> dict:
        """The class (KubeVirt permitting its resource), `nodes` KWOK nodes, the tenants
        with budgets and held devices; returns seconds per phase. Waits until the class is
        KubeVirtPermitted (TimeoutError after 90 s)."""
        s, t = self.spec, time.monotonic()
        kv.set_permitted(tuple(sorted({*kv.permitted, s.resource})))
        await self.fleet.gpu_class(s.cls, s.resource)
        sem = anyio.Semaphore(16)

        async def node(i: int) -> None:
            async with sem:
                await self.fleet.node(s.node(i), {s.resource: s.gpus_per_node}, kwok=True)

        async with anyio.create_task_group() as tg:
            for i in range(s.nodes):
                tg.start_soon(node, i)
        phases = {"nodes_s": round(time.monotonic() - t, 1)}
        t = time.monotonic()
        for k in range(s.n_tenants):
            ns = s.tenant(k)
            await self.fleet.tenant(ns, budgets={s.resource: s.budget()})
            self.held_free[(ns, s.cls)] = set()
            self.running[ns] = deque()
            for h in range(s.held):
                await self.fleet.device(ns, f"held-{h}", s.cls)
                self.held_free[(ns, s.cls)].add(f"held-{h}")

        async def permitted():
            got = await self.fleet.custom.get_cluster_custom_object(DEV_GROUP, DEV_VERSION,
                                                                    "gpuclasses", s.cls)
            return [c for c in (got.get("status") or {}).get("conditions") or []
                    if c["type"] == "KubeVirtPermitted" and c["status"] == "True"]
        if not await poll_until(permitted, 90, 0.5):
            raise TimeoutError(f"GPUClass {s.cls} not KubeVirtPermitted in 90 s")
        phases["tenants_s"] = round(time.monotonic() - t, 1)
        return phases

    # -- operations --------------------------------------------------------------------
    async def _call(self, fn, *args, what: str, deadline: float, retried=None, **kw):
        """`fn(*args)` retried on transport errors and 5xx (the API server or a replica
        restarting, a tenant's retry) and 429 until `deadline` (monotonic); ApiException 4xx
        propagate; TimeoutError at the deadline. `retried(exc, sent)`, when given, is told of
        each error retried (5xx, 429 or a transport error) before the pause, with when the
        attempt answered so was sent (monotonic)."""
        import aiohttp
        from kubernetes_asyncio.client import ApiException

        while True:
            sent = time.monotonic()
            try:
                return await fn(*args, _request_timeout=40, **kw)
            except ApiException as exc:
                if exc.status == 429 or exc.status >= 500:
                    self.counts[f"retried_{what}_{exc.status}"] += 1
                    wait = float((exc.headers or {}).get("Retry-After") or 1)
                    if retried is not None:
                        retried(exc, sent)
                else:
                    raise
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.counts[f"retried_{what}_{type(exc).__name__}"] += 1
                wait = 1.0
                if retried is not None:
                    retried(exc, sent)
            if time.monotonic() + wait > deadline:
                raise TimeoutError(what)
            await anyio.sleep(wait)

    async def create(self, op: Op) -> None:
        """Create op's VMI as its tenant (held devices from the tenant's free pool when the
        op asks and enough are free) and record it (`Rec`): admitted with its pin and the
        launcher Pod's node, refused with the API's answer, or lost (no answer within
        `answer_timeout`, or the launcher Pod not bound on its pin within `pod_timeout`)."""
        from kubernetes_asyncio.client import ApiException

        s = self.spec
        ns = s.tenant(op.tenant)
        cls = list(s.classes())[op.cls]
        rec = Rec(ns, op.name, op.size, cls=cls, tier=op.tier)
        pool = self.held_free[(ns, cls)]
        if op.held and len(pool) >= op.size:
            rec.held = tuple(sorted(pool)[:op.size])
            pool -= set(rec.held)
        self.recs.append(rec)
        before = {h: self.held_node.get((ns, h), "") for h in rec.held}
        t, deadline = time.monotonic(), time.monotonic() + s.answer_timeout
        custom = self.fleet.custom
        body = gpu_vmi(rec.name, held=rec.held, cls=rec.cls or s.cls, size=rec.size)
        if op.tier:
            from bench.contention import priority_class

            body["spec"]["priorityClassName"] = priority_class(op.tier, s.prefix)
        try:
            try:
                made = await self._call(custom.create_namespaced_custom_object, VMI_GROUP,
                                        VMI_VERSION, ns, VMIS, body, what="create",
                                        deadline=deadline,
                                        retried=lambda exc, sent: self._waited(rec, op, exc, sent))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # an earlier try's answer was lost on the way: the VMI is there
                self.counts["found_after_lost_answer"] += 1
                made = await self._call(custom.get_namespaced_custom_object, VMI_GROUP,
                                        VMI_VERSION, ns, VMIS, rec.name, what="get",
                                        deadline=deadline + 30)
        except ApiException as exc:
            rec.outcome, rec.refusal = "refused", f"{exc.status}: {error_text(exc, 'create')}"[:300]
            rec.answer_s = round(time.monotonic() - t, 3)
            self.held_free[(ns, cls)] |= set(rec.held)
            return
        except TimeoutError:
            if rec.waited and self._last_in_line.get((ns, rec.name), False):
                # every answer a place in line (or a nomination) of our webhook: no VMI made
                rec.outcome = "gave up"
                rec.refusal = f"503 in line for {s.answer_timeout:.0f} s ({rec.waited} answers)"
                self.held_free[(ns, cls)] |= set(rec.held)
                return
            rec.outcome = "lost"
            rec.refusal = f"no answer in {s.answer_timeout:.0f} s"
            self.log(f"soak: LOST {ns}/{rec.name}: {rec.refusal}")
            return
        finally:
            self.p6.waiting.pop((ns, rec.name), None)
            self._last_in_line.pop((ns, rec.name), None)
            self._line_sent.pop((ns, rec.name), None)
        rec.answer_s = round(time.monotonic() - t, 3)
        if rec.nominated:
            self.counts["preemptors_admitted"] += 1
            pin = (made["spec"].get("nodeSelector") or {}).get(inv.PIN_LABEL, "")
            self.counts["preemptors_on_nominated_node" if pin == rec.nominated
                        else "preemptors_elsewhere"] += 1
        rec.uid = made["metadata"]["uid"]
        rec.pin = (made["spec"].get("nodeSelector") or {}).get(inv.PIN_LABEL, "")
        rec.outcome = "admitted"
        rec.moved = sum(1 for h, n in before.items() if n and n != rec.pin)
        for h in rec.held:
            self.held_node[(ns, h)] = rec.pin
        self.counts["held_moves"] += rec.moved
        self.admitted.add((ns, rec.name))
        rec.pod_node = await self.pods.bound(rec.uid, s.pod_timeout)
        if rec.pod_node != rec.pin:
            rec.outcome = "lost"
            rec.refusal = f"admitted on {rec.pin}; launcher Pod on {rec.pod_node!r}"
            self.log(f"soak: LOST {ns}/{rec.name}: {rec.refusal}")
        if (ns, rec.name) in self.admitted:
            self.running[ns].append(rec)

    def _waited(self, rec: Rec, op: Op, exc: BaseException, sent: float | None = None) -> None:
        """A create of `rec` answered `exc` (5xx or 429, or a transport error), about to be
        retried: a 503 of our webhook is a wait (in line, WAITS_IN_LINE; a nomination,
        `rec.nominated` its node; or another retryable refusal); at the second answer in line
        in a row (its client retried: the binder's line holds it, `model.line.Entry.retried`)
        a set of template devices with a tier is `Waiting` for P6's third rule from now,
        until it is admitted, refused, gives up, is nominated or gets another answer or
        error: kube-apiserver's own (a 5xx, 429) or a transport error is an attempt the binder
        did not see, and a bare VMI's entry leaves the line after `line.retryGrace` without
        one (`model.line.DEFAULT_RETRY_GRACE`), so the set is known to wait again only from
        its second answer in line in a row after. Nor are two answers in line in a row when
        the second came LINE_RETRY_GRACE_S or more after the first's attempt was `sent`
        (monotonic; None: unknown, in a row): the binder's refusals may then have been that
        far apart, its entry gone and back unretried meanwhile. A transport error leaves
        `_last_in_line` as it was (no answer: "gave up" still tells a create whose answers
        were all ours)."""
        from kubernetes_asyncio.client import ApiException

        key = (rec.ns, rec.name)
        if not isinstance(exc, ApiException):
            self.p6.waiting.pop(key, None)
            rec.lined = 0
            return
        ours = in_line(exc)
        self._last_in_line[key] = ours
        if not ours:
            self.p6.waiting.pop(key, None)
            rec.lined = 0
            return
        rec.waited += 1
        text = error_text(exc, "create")
        node = nominated_node(text)
        if node is not None:
            if not rec.nominated:
                self.counts["preemptors_nominated"] += 1
            rec.nominated = node
            self.p6.waiting.pop(key, None)
            return
        if WAITS_IN_LINE not in text:   # another retryable refusal: not known to be in line
            self.counts["webhook_503_other"] += 1
            self.p6.waiting.pop(key, None)
            rec.lined = 0
            return
        self.counts["waits_in_line"] += 1
        before = self._line_sent.get(key)
        if rec.lined and before is not None and time.monotonic() - before >= LINE_RETRY_GRACE_S:
            self.p6.waiting.pop(key, None)
            rec.lined = 0
        if sent is not None:
            self._line_sent[key] = sent
        rec.lined += 1
        if rec.lined == 2 and op.tier and not rec.held and not rec.nominated:
            self.p6.waiting[key] = inv.Waiting(rec.ns, rec.name, rec.cls, rec.size, op.priority,
                                               datetime.now(timezone.utc))

    async def delete(self, op: Op) -> None:
        """Delete op's tenant's oldest running VMI (skipped while fewer than `n_live` are
        held as admitted), its held devices back in the free pool."""
        from kubernetes_asyncio.client import ApiException

        ns = self.spec.tenant(op.tenant)
        if len(self.admitted) < self.spec.n_live:   # refusals left the live set short
            self.counts["delete_skipped_below_live"] += 1
            return
        if not self.running[ns]:
            self.counts["delete_skipped"] += 1
            return
        rec = self.running[ns].popleft()
        await self._delete(rec)

    async def _delete(self, rec: Rec, what: str = "deleted") -> None:
        """Delete `rec`'s VMI (no longer held as admitted; counted under `what`), its held
        devices back in the free pool."""
        from kubernetes_asyncio.client import ApiException

        ns = rec.ns
        self.admitted.discard((ns, rec.name))
        self.deleted.add((ns, rec.name))
        self.deleted_at[(ns, rec.name)] = datetime.now(timezone.utc)
        try:
            await self._call(self.fleet.custom.delete_namespaced_custom_object, VMI_GROUP,
                             VMI_VERSION, ns, VMIS, rec.name, what="delete",
                             deadline=time.monotonic() + 120)
        except ApiException as exc:
            if exc.status != 404:
                self.counts[f"delete_{exc.status}"] += 1
        except TimeoutError:
            self.counts["delete_timeout"] += 1
        self.counts[what] += 1
        self.held_free[(ns, rec.cls)] |= set(rec.held)

    async def taint(self, op: Op) -> None:
        """Make op's DeviceTaintRule: NoSchedule on its node's GPU, or NoExecute on a GPU of
        the newest running VMI of its tenant (skipped when none runs), which the soak then
        holds as deleted: kube-controller-manager's eviction controller deletes its launcher
        Pod (the seconds until it is gone are recorded, at most `pod_timeout`), then the
        soak deletes the VMI (counted "evicted")."""
        from localcluster.dra_profiles import DRIVER

        s = self.spec
        rec = None
        if op.effect == "NoExecute":
            ns = s.tenant(op.tenant)
            if not self.running[ns]:
                self.counts["noexecute_skipped"] += 1
                return
            rec = self.running[ns].pop()
            self.admitted.discard((ns, rec.name))
            self.deleted.add((ns, rec.name))
            ref = await self._recorded(rec)
            if ref is None:
                self.counts["noexecute_no_record"] += 1
                await self._delete(rec)
                return
        else:
            ref = (DRIVER, s.node(op.node), f"gpu-vfio-{op.device}")
        await self._call(self.fleet.custom.create_cluster_custom_object, *dev.TAINT_RULES[:2],
                         dev.TAINT_RULES[2], dev.taint_rule(op.name, ref, op.effect),
                         what="taint", deadline=time.monotonic() + 60)
        # made once the API answered (the binder cannot have seen it before)
        self.taints[op.name] = dev.Taint(op.name, ref, op.effect, datetime.now(timezone.utc))
        self.counts[f"taints_{op.effect}"] += 1
        if rec is not None:
            t = time.monotonic()
            gone = await poll_until(lambda: self._launcher_gone(rec), s.pod_timeout, 1.0)
            self.evictions.append({"at": round(self.now(), 1), "vmi": f"{rec.ns}/{rec.name}",
                                   "device": "/".join(ref), "evicted": bool(gone),
                                   "evicted_s": round(time.monotonic() - t, 1)})
            await self._delete(rec, "evicted")

    async def _recorded(self, rec: Rec) -> tuple[str, str, str] | None:
        """(driver, pool, device) recorded for the first GPU `rec`'s VMI names; None when
        it or its record cannot be read."""
        try:
            vmi = await self._call(self.fleet.custom.get_namespaced_custom_object, VMI_GROUP,
                                   VMI_VERSION, rec.ns, VMIS, rec.name, what="get",
                                   deadline=time.monotonic() + 30)
            gpus = ((vmi["spec"].get("domain") or {}).get("devices") or {}).get("gpus") or []
            d = await self._call(self.fleet.custom.get_namespaced_custom_object, DEV_GROUP,
                                 DEV_VERSION, rec.ns, "gpudevices", gpus[0]["name"],
                                 what="get", deadline=time.monotonic() + 30)
        except Exception:   # noqa: BLE001 — no record to taint: counted by the caller
            return None
        rec_dev = (d.get("status") or {}).get("device") or {}
        ref = (rec_dev.get("driver"), rec_dev.get("pool"), rec_dev.get("device"))
        return ref if all(isinstance(x, str) for x in ref) else None

    async def _launcher_gone(self, rec: Rec) -> bool | None:
        """True once no launcher Pod of `rec`'s VMI exists undeleted (None: not yet, or the
        read failed)."""
        try:
            got = await self.fleet.core.list_namespaced_pod(
                rec.ns, label_selector=f"{inv.CREATED_BY}={rec.uid}", _request_timeout=20)
        except Exception:   # noqa: BLE001 — the API server restarting: asked again
            return None
        return True if not [p for p in got.items if p.metadata.deletion_timestamp is None] else None

    async def untaint(self, op: Op) -> None:
        """Delete op's DeviceTaintRule (when the soak made it; gone already is fine)."""
        from kubernetes_asyncio.client import ApiException

        t = self.taints.get(op.name)
        if t is None or t.removed is not None:
            return
        # gone from when the delete is sent: the binder may see it go (and place on the
        # device) before this client has the answer
        self.taints[op.name] = dev.Taint(t.name, t.ref, t.effect, t.made,
                                         datetime.now(timezone.utc))
        try:
            await self._call(self.fleet.custom.delete_cluster_custom_object, *dev.TAINT_RULES,
                             op.name, what="untaint", deadline=time.monotonic() + 60)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.counts["untaints"] += 1

    async def cordon(self, op: Op, on: bool) -> None:
        """Cordon (`on`) or uncordon op's node; TimeoutError after 60 s of retries."""
        name = self.spec.node(op.node)
        await self._call(self.fleet.core.patch_node, name, {"spec": {"unschedulable": on}},
                         what="cordon", deadline=time.monotonic() + 60,
                         _content_type="application/merge-patch+json")
        (self.cordoned.add if on else self.cordoned.discard)(name)
        self.counts["cordons" if on else "uncordons"] += 1

    async def _spawning(self, fn, *args):
        """Run `fn(*args)` (one that starts a process: a replica, kube-apiserver) on the
        soak's one long-lived spawner thread. The harness starts its processes with
        PR_SET_PDEATHSIG, which the kernel ties to the *thread* that forked them: started
        from an anyio worker thread (which exits when idle) they would be SIGKILLed seconds
        later."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(_spawner(), fn, *args)

    def _leader_index(self) -> int | None:
        who = self.lc.leader()
        return next((i for i, r in enumerate(self.lc.replicas) if r.identity == who), None)

    async def kill_leader(self) -> None:
        """kill -9 the Lease holder, restart it, and record the takeover (s until another
        replica holds the Lease)."""
        i = await anyio.to_thread.run_sync(self._leader_index)
        if i is None:
            self.events.append({"at": round(self.now(), 1), "kind": "kill-leader",
                                "skipped": "no leader"})
            return
        old = self.lc.replicas[i].identity
        at, t = round(self.now(), 1), time.monotonic()
        await anyio.to_thread.run_sync(self.lc.kill_replica, i)
        new = None
        while time.monotonic() - t < 120:
            new = await anyio.to_thread.run_sync(self.lc.leader)
            if new and new != old:
                break
            await anyio.sleep(0.5)
        takeover = round(time.monotonic() - t, 1)
        kill = {"at": at, "kind": "kill-leader", "killed": old, "new_leader": new,
                "takeover_s": takeover}
        self.events.append(kill)   # the takeover is the figure; the restart is its own step
        self.log(f"soak: t={at:.0f}s killed leader {old}; {new} leads after {takeover} s")
        try:
            await self._spawning(self.lc.start_replica, i)
            await anyio.to_thread.run_sync(self.lc.wait_ready, i, 180)
        except Exception as exc:   # noqa: BLE001 — reported whole: what the replica printed
            self.counts["op_error_restart-replica"] += 1
            self.events.append({"at": round(self.now(), 1), "kind": "restart-replica-error",
                                "replica": old, "error": str(exc)[-4000:]})
            self.log(f"soak: t={self.now():.0f}s replica {old} did not come back: {exc}")
            return
        kill["back_s"] = round(time.monotonic() - t, 1)

    async def restart_apiserver(self) -> None:
        """Kill and restart kube-apiserver, recording the outage."""
        at, t = round(self.now(), 1), time.monotonic()
        await self._spawning(self.cp.restart_apiserver)
        self.events.append({"at": at, "kind": "restart-apiserver",
                            "outage_s": round(time.monotonic() - t, 1)})
        self.log(f"soak: t={at:.0f}s kube-apiserver killed and restarted "
                 f"({time.monotonic() - t:.1f} s down)")

    async def _op(self, op: Op) -> None:
        try:
            if op.kind == "create":
                await self.create(op)
            elif op.kind == "delete":
                await self.delete(op)
            elif op.kind in ("cordon", "uncordon"):
                await self.cordon(op, op.kind == "cordon")
            elif op.kind == "kill-leader":
                await self.kill_leader()
            elif op.kind == "restart-apiserver":
                await self.restart_apiserver()
            elif op.kind == "taint":
                await self.taint(op)
            elif op.kind == "untaint":
                await self.untaint(op)
        except Exception as exc:   # noqa: BLE001 — an op's failure is a figure, not the end
            self.counts[f"op_error_{op.kind}"] += 1
            self.events.append({"at": round(self.now(), 1), "kind": f"{op.kind}-error",
                                "error": repr(exc)[:2000]})

    # -- sampling ----------------------------------------------------------------------
    async def _sample(self, final: bool = False) -> list[inv.Violation] | None:
        before = set(self.admitted)
        started = datetime.now(timezone.utc)
        try:
            # device mode's line order is judged on the DRA objects each read holds
            dra = self.spec.mode == "device" and self.spec.priorities
            snap = (await inv.snapshot(self.api, pods=final, dra=dra)).within(self.spec.prefix)
        except Exception:   # noqa: BLE001 — the API server restarting: no sample this time
            self.counts["samples_failed"] += 1
            return None
        got, gone = self.p6.read(snap, before, self.admitted, self.deleted, final)
        for ns, name in gone:   # stopped for a preemptor: no longer held as admitted or deletable
            # its claim's grace runs from now (the binder's delete is not ours to time; a
            # victim's claim was judged from its making: 4 orphans 4 s after their stop)
            self.deleted_at.setdefault((ns, name), started)
            self.admitted.discard((ns, name))
            self.running[ns] = deque(r for r in self.running.get(ns, ()) if r.name != name)
        if self.spec.mode == "device":
            more = await self._device_checks(snap, before & self.admitted, final, started)
            if more is None:
                return None
            got += more
        return got

    async def nomination_watch(self) -> None:
        """Watch every GPUNomination (the controller's namespace) while churning, each seen
        noted (`P6Check.note_nomination`): one made and deleted between two reads (its preemptor
        admitted within seconds of its victims going) still excuses its victims."""
        from kubernetes_asyncio.client import CustomObjectsApi

        from bench.common import watch_namespaced

        custom = CustomObjectsApi(self.api)
        while True:
            try:
                await watch_namespaced(custom.list_cluster_custom_object,
                                       (inv.GROUP, inv.VERSION, "gpunominations"),
                                       lambda kind, obj: self.p6.note_nomination(obj), "")
            except Exception:   # noqa: BLE001 — the API server restarting: listed again
                self.counts["nomination_watch_restarts"] += 1
                await anyio.sleep(1.0)

    async def _device_checks(self, snap: inv.Snapshot, settled: set[tuple[str, str]],
                             final: bool, started: datetime) -> list[inv.Violation] | None:
        """Device mode's checks on `snap` (`bench.soak.device`), a read begun at `started`:
        orphan and missing claims (the claims read after `snap`, so a claim made meanwhile is
        seen), placements on the soak's tainted devices (each judged on its window, which
        the reads' times bound), tenants' device budgets; None when the claims' read
        failed."""
        try:
            claims = await dev.read_claims(self.api, self.spec.prefix)
        except Exception:   # noqa: BLE001 — the API server restarting: no sample this time
            self.counts["samples_failed"] += 1
            return None
        now = datetime.now(timezone.utc)
        ages = dev.orphan_ages(claims, snap.vmis, self.deleted_at, now)
        self.claims_seen.append((round(self.now(), 1), len(claims), len(ages),
                                 round(max(ages, default=0.0), 1)))
        s = self.spec
        dev.placement_windows(snap.devices, self.windows, now, self.read_before)
        self.read_before = started
        tainted, unsure = dev.check_taints(snap.devices, self.taints.values(), self.windows,
                                           grace=s.taint_grace)
        for u in unsure:
            if (u["device"], u["rule"]) not in self.taint_unsure:
                self.taint_unsure[(u["device"], u["rule"])] = u
                self.log(f"soak: placement on a tainted device, unsure t={self.now():.0f}s: {u}")
        return (dev.check_claims(claims, snap.vmis, settled, self.deleted_at,
                                 datetime.now(timezone.utc), grace=s.claim_grace, final=final,
                                 stopping=self.p6.victims)
                + tainted + dev.check_budgets(snap.devices, self.device_budgets, s.cls_name))

    async def sampler(self) -> None:
        """While churning, check the invariants every `check_every` s (violations tallied
        and logged; a failed read skipped)."""
        while self.churning:
            got = await self._sample()
            if got is not None:
                for v in self.tally.add(got):
                    self.log(f"soak: VIOLATION t={self.now():.0f}s §{v.item} {v.kind} "
                             f"{'/'.join(map(str, v.obj))}: {v.message[:300]}")
                self.samples.append((round(self.now(), 1), len(self.tally.seen),
                                     len(self.admitted)))
            await anyio.sleep(self.spec.check_every)

    async def rss_sampler(self) -> None:
        """Every `rss_every` s, each live replica's RSS, the objects its informers hold
        (`gpu_binder_cache_objects` from its /metrics) and where its memory lives
        (`gpu_binder_heap_bytes` by part, `gpu_binder_heap_pymalloc_blocks`; a scrape that
        fails is skipped): what a growing RSS may follow, and which part of it grows."""
        while self.churning:
            for i, r in enumerate(self.lc.replicas):
                if r.alive:
                    mib = memory_mib(r.proc.pid).get("VmRSS")
                    if mib is not None:
                        self.rss.append((round(self.now(), 1), i, r.proc.pid, round(mib, 1)))
                    got = await replica_figures(self.lc, i)
                    if got is not None:
                        held, heap = got
                        self.cached.append((round(self.now(), 1), i, r.proc.pid, held))
                        if heap:
                            self.heap_parts.append((round(self.now(), 1), i, r.proc.pid, heap))
            await anyio.sleep(self.spec.rss_every)

    async def heap_reporter(self) -> None:
        """SIGUSR2 to every live replica at the steady stretch's start and end: each logs a
        `heap report` (actors.heap.heap_report: gc's objects; traced bytes and a tracemalloc
        snapshot when run with PYTHONTRACEMALLOC), read back by `heap_reports`."""
        for at in (self.spec.steady_from, self.spec.seconds):
            if at > self.now():
                await anyio.sleep(at - self.now())
            asked = []
            for i, r in enumerate(self.lc.replicas):
                if r.alive:
                    asked.append((i, len(heap_reports([r.log_path]))))
                    r.proc.send_signal(signal.SIGUSR2)
            # each asked replica's report is in its log before the run reads the logs (a busy
            # replica on a loaded machine wrote it after the read: one replica's pair missing)
            with anyio.move_on_after(HEAP_REPORT_WAIT):
                while any(len(heap_reports([self.lc.replicas[i].log_path])) <= n
                          for i, n in asked if self.lc.replicas[i].alive):
                    await anyio.sleep(0.2)

    # -- the whole run -----------------------------------------------------------------
    async def run(self) -> dict:
        """The churn (ops at their scheduled times; each in its own task), the samplers,
        then settling (uncordon all, every replica up, housekeeping clear, launcher Pods
        bound) and the final check. Returns the report."""
        s = self.spec
        self.log(f"soak: seed {s.seed}, {len(self.ops)} operations over {s.minutes:g} min, "
                 f"schedule {schedule_digest(self.ops)}")
        async with anyio.create_task_group() as outer:
            outer.start_soon(self.pods.watch)
            self.t0, self.churning = time.monotonic(), True
            async with anyio.create_task_group() as samplers:
                samplers.start_soon(self.sampler)
                samplers.start_soon(self.rss_sampler)
                samplers.start_soon(self.heap_reporter)
                if s.priorities:
                    outer.start_soon(self.nomination_watch)
                async with anyio.create_task_group() as tg:
                    for op in self.ops:
                        wait = op.at - self.now()
                        if wait > 0:
                            await anyio.sleep(wait)    # pacing the seeded schedule
                        tg.start_soon(self._op, op)
                    self.log(f"soak: t={self.now():.0f}s last operation started; "
                             f"waiting for answers and launcher Pods")
                self.churn_s = round(self.now(), 1)
                await self.settle()
                self.churning = False
            outer.cancel_scope.cancel()
        return self.report()

    async def settle(self) -> None:
        """Uncordon every node the churn left cordoned, wait until every replica runs and a
        leader holds the Lease, then until housekeeping has cleared what deleted VMIs left
        and every admitted VMI's launcher Pod is bound (`settle_timeout`); then the final
        check (its violations are counted whether or not settling finished)."""
        t = time.monotonic()
        for name in sorted(self.cordoned):
            await self.fleet.cordon(name, False)
        for i, r in enumerate(self.lc.replicas):
            if not r.alive:
                await self._spawning(self.lc.start_replica, i)
                await anyio.to_thread.run_sync(self.lc.wait_ready, i, 90)
        left: list = []

        async def settled():
            try:
                snap = (await inv.snapshot(self.api, pods=True)).within(self.spec.prefix)
            except Exception:   # noqa: BLE001
                return None
            left[:] = inv.leftovers(snap) + [
                v for v in inv.check(snap, settled=set(self.admitted), final=True)
                if v.kind == inv.LAUNCHER_OFF_PIN]
            if self.spec.mode == "device" and not left:
                try:
                    claims = await dev.read_claims(self.api, self.spec.prefix)
                except Exception:   # noqa: BLE001
                    return None
                left[:] = dev.check_claims(claims, snap.vmis, (), self.deleted_at,
                                           datetime.now(timezone.utc), grace=0, final=True)
            return None if left else snap
        settled_ok = await poll_until(settled, self.spec.settle_timeout, 1.0)
        got = await self._sample(final=True)
        final = (got or []) + (inv.leftovers((await inv.snapshot(self.api)).within(
            self.spec.prefix)) if not settled_ok else [])
        for v in self.tally.add(final):
            self.log(f"soak: VIOLATION (final) §{v.item} {v.kind} "
                     f"{'/'.join(map(str, v.obj))}: {v.message[:300]}")
        self.final = {"settled": settled_ok, "settle_s": round(time.monotonic() - t, 1),
                      "violations": len(final), "admitted_running": len(self.admitted)}
        for rule in [r for r in self.taints.values() if r.removed is None]:
            await self.untaint(Op(0, "untaint", name=rule.name))   # the cluster as found

    def steady(self) -> dict:
        """The steady stretch [spec.steady_from, spec.seconds]: its bounds, the operations
        scheduled in it by kind, and the VMIs held as admitted at its samples (min, max)."""
        s = self.spec
        live = [n for t, _, n in self.samples if s.steady_from <= t <= s.seconds]
        return {"from_s": s.steady_from, "to_s": s.seconds,
                "share": round(1 - s.steady_from / s.seconds, 3),
                "operations": dict(Counter(o.kind for o in self.ops
                                           if o.at >= s.steady_from)),
                "live_min": min(live) if live else None, "live_max": max(live) if live else None}

    def report(self) -> dict:
        """The run's report (`bench.soak.report.soak_report`)."""
        return soak_report(self)


async def cache_objects(lc, i: int) -> dict[str, int] | None:
    """{informer: objects held} of replica `i` from its /metrics (`gpu_binder_cache_objects`)
    and its connections under `CONNECTION_KEYS` (`gpu_binder_api_connections` in use and
    idle, `gpu_binder_webhook_connections`: each TLS connection holds ~110 KiB), None when
    the scrape fails (a replica starting or killed): `replica_figures`' first part."""
    got = await replica_figures(lc, i)
    return None if got is None else got[0]


async def replica_figures(lc, i: int) -> tuple[dict[str, int], dict[str, int]] | None:
    """One scrape of replica `i`'s /metrics: (`cache_objects`' {informer or connection key:
    n}, {part: value} of `gpu_binder_heap_bytes` by part and `pymalloc_blocks` from
    `gpu_binder_heap_pymalloc_blocks`, empty from a replica that exports neither), None when
    the scrape fails (a replica starting or killed)."""
    from localcluster.metrics_text import parse_metrics

    try:
        text = await anyio.to_thread.run_sync(lc.metrics, i)
    except OSError:
        return None
    out: dict[str, int] = {}
    heap: dict[str, int] = {}
    for (name, labels), v in parse_metrics(text).items():
        if name == "gpu_binder_cache_objects":
            out[dict(labels).get("informer", "?")] = int(v)
        elif name == "gpu_binder_heap_bytes":
            heap[dict(labels).get("part", "?")] = int(v)
        elif name == "gpu_binder_heap_pymalloc_blocks":
            heap["pymalloc_blocks"] = int(v)
        elif (key := CONNECTION_KEYS.get((name, dict(labels).get("state")))) is not None:
            out[key] = int(v)
    return out, heap


CONNECTION_KEYS = {("gpu_binder_api_connections", "in_use"): "~api connections in use",
                   ("gpu_binder_api_connections", "idle"): "~api connections idle",
                   ("gpu_binder_webhook_connections", None): "~webhook connections"}
"""The connection gauges `cache_objects` reads, and the keys it gives them (sorted after
the informers)."""


async def soak_on(lc, kv, spec: SoakSpec, log=print) -> dict:
    """Populate and soak on a running LocalCluster `lc` (its KubeVirt harness `kv`); the
    report (see `Soak.report`) with the population's phase seconds."""
    async with await admin_client(lc, 64) as api:
        soak = Soak(lc, api, spec, log)
        phases = await soak.populate(kv)
        log(f"soak: populated ({spec.population}) {spec.nodes} nodes, {spec.n_tenants} "
            f"tenants: {phases}")
        report = await soak.run()
        report["population_s"] = phases
        return report


def run(out: Path, *, nodes: int = 1000, minutes: float = 20.0, seed: int = 1,
        population: str = "scale", create_rate: float = 2.0, tracemalloc: bool = False,
        mode: str = "count", steady_share: float = 0.45, priorities: bool = False) -> dict:
    """The soak on a cluster of its own (2 replicas with SOAK_ARGS, KubeVirt), `population`
    "scale" (default) or "own", `create_rate` VMI creates per second (with the scale
    population each preceded by a delete: twice that in operations); writes soak.json and
    soak.png into `out`; returns the report. `tracemalloc`: the replicas run with
    PYTHONTRACEMALLOC=1 (slower) and the report names the source lines whose allocations grew
    over the steady stretch. `steady_share`: the steady stretch's share of the run (a longer
    one lets a replica restarted by the last kill outlive its start-up heap's turnover, issue
    41 item 5). `mode` "device": HGX boards publishing ResourceSlices
    (`LocalCluster(dra=True)`: NVIDIA's DeviceClass, kube-controller-manager's claim and
    device-taint eviction controllers, KubeVirt with `GPUsWithDRA`), DeviceTaintRules
    injected (SoakSpec). `priorities`: the churn's priority mix (SoakSpec.priorities: bench
    contention's PriorityClasses, on-demand creates preempting; the controller also run with
    `SoakSpec.controller_args()`). ValueError when `nodes` < 1, `minutes` is not in
    (0, MAX_MINUTES], `steady_share` not in [0.2, 0.8], `create_rate` is not in
    (0, MAX_CREATE_RATE], the run leaves no room for the disturbances, or `mode` is neither
    "count" nor "device"."""
    from localcluster.cluster import LocalCluster

    if nodes < 1:
        raise ValueError(f"--nodes is KWOK nodes of 8 GPUs, at least 1, got {nodes}")
    if not 0 < minutes <= MAX_MINUTES:   # also refuses nan and inf
        raise ValueError(f"--minutes is in (0, {MAX_MINUTES:g}], got {minutes}")
    if not 0.2 <= steady_share <= 0.8:
        raise ValueError(f"--steady-share is in [0.2, 0.8], got {steady_share}")
    if not 0 < create_rate <= MAX_CREATE_RATE:   # also refuses nan and inf
        raise ValueError(f"--create-rate is creates per second in (0, {MAX_CREATE_RATE:g}], "
                         f"got {create_rate}")
    spec = SoakSpec(nodes=nodes, minutes=minutes, seed=seed, population=population,
                    create_rate=create_rate, mode=mode, steady_share=steady_share,
                    priorities=priorities, tracemalloc=tracemalloc)
    ops = schedule(spec)   # the ValueError before any cluster starts
    out.mkdir(parents=True, exist_ok=True)
    print(f"soak: seed {seed}, schedule {schedule_digest(ops)}: {len(ops)} operations; "
          f"disturbances until {spec.disturb_until:.0f} s, steady stretch "
          f"{spec.steady_from:.0f}-{spec.seconds:.0f} s", flush=True)
    report_head = {"benchmark": "soak", "load_before": os.getloadavg(), "machine": machine()}
    t = time.monotonic()
    args = (*SOAK_ARGS, *spec.controller_args())
    with LocalCluster(controllers=2, controller_args=args, log_dir=out / "logs",
                      kubevirt=True, dra=mode == "device",
                      controller_env={"PYTHONTRACEMALLOC": "1"} if tracemalloc else None) as lc:
        report = {**report_head, "mode": mode, "commit": commit(),
                  "controller_args": list(args),
                  **anyio.run(soak_on, lc, lc.kubevirt, spec,
                              lambda m: print(m, flush=True))}
    report["load_after"] = os.getloadavg()
    report["wall_s"] = round(time.monotonic() - t, 1)
    report["targets"] = targets(report)
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "soak.png")
    for line in summary(report):
        print(line, flush=True)
    return report
