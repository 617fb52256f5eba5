"""Stateful chaos: a hypothesis `RuleBasedStateMachine` drives a real `Binder` on a
`MemoryStore` and a small model of what was asked of it (STYLE.md "Invariant tests").

Rules: add a node, cordon/uncordon one, write a complete request of a tenant for devices
with no unanswered request (as the webhook does), withdraw a request, kill a node actor,
the coordinator or its status pipeline (now, or right after the next placement write of a
request with more to come; either of the two restarts both), redeliver stale device events of a request, inject write faults (`fail_next`), and
`settle` (wait, bounded, until every complete request is answered and the coordinator is
idle). The binder runs in an anyio event loop on fake time (`tests.timing.FAKE_TIME`, as
every actor test) on a blocking portal's thread, the store and the binder on the loop's
clock (`LoopClock`); every read and write of the store goes through `portal.call`, so the
machine only ever sees the store between two event-loop steps. While the machine thinks the
loop is idle and its time jumps from timer to timer, as it would pass on a real clock.

Invariants (docs/contract.md §7), after every step: 1 and 4 on every placement write (live, via
`store.on_write`) and over the current state, 3 over the write history (`check_invariants`),
and the binder has not escalated. After `settle`: 2, every complete request not withdrawn
has exactly one result on every member, its members agree, and a Succeeded request is Bound
on a node matching its nodeSelector.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import CancelledError, Future

import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from actors.errors import TransientWriteError, WriteConflict
from fakes.clock import LoopClock
from fakes.memory_store import MemoryStore, WriteRecord
from model.types import OnCordon, Result
from supervisor import COORDINATOR, PIPELINE, Binder, node_child_id
from tests.support.binder import check_invariants, fast_config, kill_child, quiet_logging, settle
from tests.timing import FAKE_TIME

pytestmark = [pytest.mark.chaos]

RESOURCES = {"h100": "nvidia.com/H100", "l40s": "nvidia.com/L40S"}
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
ZONES = ("a", "b")
SETTLE_TIMEOUT = 10.0

allocs = st.fixed_dictionaries({}, optional={res: st.integers(1, 3) for res in RESOURCES.values()})


class BinderMachine(RuleBasedStateMachine):
    """The real binder beside a model of the cluster and of the requests written."""

    nodes = Bundle("nodes")
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        quiet_logging()
        self.portal_cm = None
        self.portal = None
        self.binder: Binder | None = None
        self.binder_future: Future | None = None
        self.store = MemoryStore(seed=0, clock=LoopClock())
        # The model: what exists and what was asked.
        self.alloc: dict[tuple[str, str], int] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.cordoned: set[str] = set()
        self.budget: dict[tuple[str, str], int] = {}
        self.devices: dict[str, list[str]] = {t: [] for t in TENANTS}
        self.issued: dict[str, tuple[str, tuple[str, ...], dict[str, str] | None]] = {}
        self.busy: dict[tuple[str, str], str] = {}  # device -> its request, until answered
        self.withdrawn: set[str] = set()
        self.violations: list[str] = []
        self.n_nodes = 0
        self.n_devices = 0
        self.n_requests = 0
        self.mid_kill_armed: str | None = None  # the child to kill after the next placement write
        self.mid_kills = 0

    # -- plumbing ---------------------------------------------------------------------------

    def call(self, func, *args, **kwargs):
        """Run `func` in the event loop's thread (the store is not thread safe)."""
        assert self.portal is not None
        if kwargs:
            return self.portal.call(lambda: func(*args, **kwargs))
        return self.portal.call(func, *args)

    def on_write(self, rec: WriteRecord) -> None:
        """Invariants 1 and 4 at every placement write (in the loop thread)."""
        if not rec.moved:
            return
        s = self.store
        dev = s.device(rec.key)
        res = s.classes()[dev.class_name].resource_name
        alloc = dict(s.node(rec.node).allocatable).get(res, 0) if s.node(rec.node) else 0
        if s.used(rec.node, res) > alloc:
            self.violations.append(f"inv1: bind {rec.key} of {rec.request_id} put {rec.node} over "
                                   f"{res}: {s.used(rec.node, res)} > {alloc}")
        hard = self.budget.get((dev.namespace, res))
        if hard is not None and s.tenant_bound(dev.namespace, res) > hard:
            self.violations.append(f"inv4: bind {rec.key} of {rec.request_id} put {dev.namespace} "
                                   f"over {res}: {s.tenant_bound(dev.namespace, res)} > {hard}")
        if self.mid_kill_armed and self.binder is not None:
            # Between the first and the last placement write of a request (B7).
            to_come = [m for m in s.request_members(dev.namespace, rec.request_id)
                       if m.bound_node != rec.node]
            if to_come and kill_child(self.binder, self.mid_kill_armed,
                                         "stateful chaos: between placement writes"):
                self.mid_kill_armed = None
                self.mid_kills += 1

    def release_answered(self) -> None:
        """Devices whose request is answered on every member (or gone) may be asked again."""
        def answered(t: str, rid: str) -> bool:
            members = self.store.request_members(t, rid)
            return all(m.status.bind_request.result is not None for m in members)
        for key, rid in list(self.busy.items()):
            if self.call(answered, key[0], rid):
                del self.busy[key]

    # -- setup ------------------------------------------------------------------------------

    @initialize(target=nodes, first=allocs, second=allocs,
                budgets=st.dictionaries(st.sampled_from(TENANTS), st.integers(1, 4), max_size=2))
    def start(self, first, second, budgets):
        s = self.store
        s.add_class("h100", RESOURCES["h100"], on_cordon=OnCordon.MOVE)
        s.add_class("l40s", RESOURCES["l40s"], on_cordon=OnCordon.STAY)
        for t in TENANTS:
            s.add_namespace(t)
        for t, hard in budgets.items():
            s.add_budget(t, RESOURCES["h100"], hard)
            self.budget[(t, RESOURCES["h100"])] = hard
        names = [self._add_node(first), self._add_node(second)]
        s.on_write = self.on_write
        self.portal_cm = start_blocking_portal(*FAKE_TIME)
        self.portal = self.portal_cm.__enter__()
        self.binder = Binder(s, s, s, LoopClock(), fast_config())
        self.binder_future, _ = self.portal.start_task(self.binder.run)
        return multiple(*names)

    def _add_node(self, alloc: dict[str, int]) -> str:
        name = f"node-{self.n_nodes}"
        zone = ZONES[self.n_nodes % 2]
        self.n_nodes += 1
        self.store.add_node(name, alloc, labels={"zone": zone})
        self.labels[name] = {"zone": zone}
        for res, units in alloc.items():
            self.alloc[(name, res)] = units
        return name

    def teardown(self) -> None:
        try:
            if self.binder_future is not None:
                self.binder_future.cancel()
                try:
                    self.binder_future.result(timeout=10)
                except CancelledError:
                    pass
        finally:
            if self.portal_cm is not None:
                self.portal_cm.__exit__(None, None, None)
            self.portal_cm = self.portal = self.binder = self.binder_future = None

    # -- rules ------------------------------------------------------------------------------

    @precondition(lambda self: self.n_nodes < 6)
    @rule(target=nodes, alloc=allocs)
    def add_node(self, alloc):
        name = self.call(self._add_node, alloc)
        note(f"added {name} zone {self.labels[name]['zone']} allocatable {alloc}")
        return name

    @rule(node=nodes)
    def toggle_cordon(self, node):
        on = node not in self.cordoned
        self.call(self.store.cordon, node, on)
        (self.cordoned.add if on else self.cordoned.discard)(node)
        note(f"{'cordoned' if on else 'uncordoned'} {node}")

    @rule(target=requests, tenant=st.sampled_from(TENANTS),
          new=st.lists(st.sampled_from(sorted(RESOURCES)), max_size=2),
          reuse=st.lists(st.integers(0, 7), max_size=2),
          zone=st.none() | st.sampled_from(ZONES))
    def request(self, tenant, new, reuse, zone):
        # Which devices are free depends on the binder's timing: pick them by index, so a
        # replay while shrinking draws the same data whatever the binder did.
        self.release_answered()
        free = [d for d in self.devices[tenant] if (tenant, d) not in self.busy]
        names = sorted({free[i % len(free)] for i in reuse}) if free else []
        if not names and not new:
            new = ["h100"]
        n = self.n_requests
        self.n_requests += 1
        for cls in new:
            name = f"dev-{self.n_devices}"
            self.n_devices += 1
            self.call(self.store.add_device, tenant, name, cls, template_for=f"vm-{n}")
            self.devices[tenant].append(name)
            names.append(name)
        rid = f"r{n:03d}"
        sel = {"zone": zone} if zone else None
        self.call(self.store.request, tenant, f"vm-{n}", names, request_id=rid, node_selector=sel)
        self.issued[rid] = (tenant, tuple(names), sel)
        for d in names:
            self.busy[(tenant, d)] = rid
        note(f"request {rid}: {tenant} asks {names} ({new} new) selector {sel}")
        return rid

    @rule(rid=consumes(requests))
    def withdraw(self, rid):
        tenant = self.issued[rid][0]
        n = self.call(self.store.withdraw, tenant, rid)
        note(f"withdraw {rid}: cleared {n} members")
        if n:
            self.withdrawn.add(rid)
        for d in self.issued[rid][1]:
            if self.busy.get((tenant, d)) == rid:
                del self.busy[(tenant, d)]

    @rule(node=st.sampled_from([COORDINATOR, PIPELINE]) | nodes)
    def kill(self, node):
        victim = node if node in (COORDINATOR, PIPELINE) else node_child_id(node)
        killed = self.call(kill_child, self.binder, victim, "stateful chaos")
        note(f"kill {victim}: {killed}")
        event(f"kill landed: {killed}")

    @rule(victim=st.sampled_from([COORDINATOR, PIPELINE]))
    def kill_coordinator_mid_placement(self, victim):
        self.mid_kill_armed = victim
        note(f"kill {victim} right after the next placement write with more to come")

    @rule(rid=requests)
    def redeliver(self, rid):
        tenant, names, _ = self.issued[rid]
        def emit():
            for d in names:
                self.store.emit("device", (tenant, d))
        self.call(emit)
        note(f"redeliver stale device events of {rid}")

    @rule(op=st.sampled_from([None, "answer"]),
          error=st.sampled_from([TransientWriteError, WriteConflict]),
          applied=st.booleans(), times=st.integers(1, 3))
    def fail_writes(self, op, error, applied, times):
        applied = applied and error is TransientWriteError  # a conflict is never applied
        self.call(lambda: self.store.fail_next(error, op=op, times=times, applied=applied))
        note(f"fail next {times} {op or 'any'} write(s) with {error.__name__}"
             f"{' after applying' if applied else ''}")

    @rule()
    def settle(self):
        note("settle")
        self.call(settle, self.store, self.binder, SETTLE_TIMEOUT)
        event(f"settled after a kill between placement writes: {self.mid_kills > 0}")
        self.release_answered()
        self.check_answered()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def binder_running(self):
        if self.binder_future is not None and self.binder_future.done():
            raise AssertionError(f"binder stopped: {self.binder_future.exception()!r}")

    @invariant()
    def placements_within_capacity_and_budget(self):
        assert not self.violations, self.violations[:5]

    @invariant()
    def invariants_1_3_4(self):
        if self.portal is None:
            return
        problems = self.call(check_invariants, self.store, withdrawn=self.withdrawn)
        problems = [p for p in problems if not p.startswith("inv2")]  # liveness: after settle
        assert not problems, problems[:5]

    def check_answered(self):
        """Invariant 2 after settle: exactly one result on every member of every complete
        request not withdrawn, the same on all members; Succeeded on a matching node."""
        def written():
            out: dict[tuple, set] = defaultdict(set)
            for rec in self.store.history:
                if rec.op == "answer":
                    out[(rec.key, rec.request_id)].add((rec.result, rec.node))
            return out
        problems = self.call(check_invariants, self.store, withdrawn=self.withdrawn)
        assert not problems, problems[:5]
        results_by_key = self.call(written)
        for rid, (tenant, names, sel) in self.issued.items():
            if rid in self.withdrawn:
                continue
            results = set()
            for d in names:
                seen = results_by_key.get(((tenant, d), rid), set())
                assert len(seen) == 1, f"inv2: {tenant}/{d} of {rid}: results {seen}"
                results |= seen
            assert len(results) == 1, f"inv2: request {rid}: members disagree {results}"
            (result, node), = results
            event(f"settled: a request {result.value}")
            if result is Result.SUCCEEDED and sel:
                assert self.labels[node]["zone"] == sel["zone"], f"{rid} Succeeded on {node}, selector {sel}"


BinderMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, derandomize=False, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBinderStateful = BinderMachine.TestCase
