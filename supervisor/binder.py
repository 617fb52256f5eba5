"""The binder's supervision tree and router (docs/contract.md §6).

`Binder.run` starts a NodeActor per node in the view, one-for-one, and the Coordinator with
its StatusPipeline as one group (one-for-all: a crash of either restarts both, see below)
under one `Supervisor`, then routes the change feed, level based: a node change goes to
that node's actor (starting an actor for a new node, stopping the one of a deleted node); a
device change goes, when its request is complete and lacks a result, to the coordinator as
`Examine` (partial requests are ignored; node actors need no device messages: they re-read
the view on every prepare); a class, budget or namespace change is broadcast. The feed is a
coalescing work queue (`actors.workqueue`: a key changed twice before it is routed is routed
once, one changed while being routed is routed again); every change due is routed in one
pass, device changes coalesced further (one message per request, however many members
changed). No placement logic lives here. `Binder` is also the
coordinator's and the pipeline's `NodeDirectory`.

Why the coordinator and the pipeline restart together: the pipeline's flights are
reservations the coordinator made (committed holds on node ledgers, counted in every
snapshot). A pipeline restarted alone would lose them while the ledgers keep their holds
(owned by a coordinator that no longer knows them: nobody releases them but their expiry)
and the coordinator, not knowing they are gone, would neither recover their requests (B7)
nor re-decide them. A coordinator restarted alone would adopt the ledgers (dropping the
holds of the flights still writing) and could decide again requests whose first write is
not in the view yet. Restarted as one incarnation, the new coordinator adopts every ledger
(no hold left behind) and recovers every decided request from the view (B7), as after a
leader failover.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

import anyio
import structlog
from anyio.abc import TaskStatus

from actors.coordinator import Coordinator

from actors.coordinator_protocol import (CoordinatorConfig, Examine, GetLine, LineState, RefusedAtW1, Resync,
                                         VMsWaiting)
from actors.errors import ActorStopped, AskTimeout, MailboxFull
from actors.node_actor import DevicesChanged, NodeActor, NodeActorConfig, NodeChanged
from actors.ports import (Change, ChangeFeed, Clock, ClusterView, DecisionObserver, NominationWriter,
                          StatusWriter)
from actors.runtime import ActorRef
from actors.status_pipeline import PipelineConfig, StatusPipeline
from model.line_status import ClassLine
from model.requests import find_requests
from model.types import RequestKey
from supervisor.tree import ChildSpec, Restart, Supervisor, SupervisorConfig, SupervisorStatistics

_log = structlog.get_logger("gpu_binder.binder")

COORDINATOR = "coordinator"
"""Child id of the coordinator."""

PIPELINE = "status_pipeline"
"""Child id of the coordinator's status pipeline (in the coordinator's group)."""


def node_child_id(node: str) -> str:
    """Child id of the actor of `node` (an id only: select node actors by `ChildKind.NODE`,
    never by parsing ids)."""
    return f"node:{node}"


class ChildKind(enum.Enum):
    """The kind of each child of the binder's tree (its `ChildSpec.kind`)."""

    NODE = "node"
    COORDINATOR = "coordinator"
    PIPELINE = "pipeline"


@dataclass(frozen=True, slots=True)
class BinderConfig:
    """Everything the tree needs that is not a port: each actor's configuration, the
    mailbox sizes (messages), `shutdown` (seconds a child has to stop), `route_timeout`
    (seconds the router waits on a full coordinator mailbox before leaving the request to
    the coordinator's periodic resync) and `route_batch` (the most changes the router takes
    from the feed's queue to route in one pass). Every default of the binder's knobs is
    here or in the actor configuration it nests; `k8s.controller` overrides the ones the
    operator sets (`k8s.config.Config`)."""

    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    node: NodeActorConfig = field(default_factory=NodeActorConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    node_mailbox: int = 256
    coordinator_mailbox: int = 4096
    pipeline_mailbox: int = 4096
    shutdown: float = 5.0
    route_timeout: float = 1.0
    route_batch: int = 1024


class Binder:
    """The binder part of the controller: supervisor, node actors, coordinator and its
    status pipeline, router."""

    def __init__(
        self,
        view: ClusterView,
        feed: ChangeFeed,
        writer: StatusWriter,
        clock: Clock,
        config: BinderConfig | None = None,
        observer: DecisionObserver | None = None,
        nominations: NominationWriter | None = None,
        published: Callable[[], Mapping[str, ClassLine]] | None = None,
    ) -> None:
        """`nominations` records the nominations of P4; without it the coordinator never
        nominates (preemption is off, whatever `config` says). `published` reads the waiting
        line's published summaries (P5, the GPUClasses' `status.line`), which each coordinator
        incarnation reads once as it starts (`actors.coordinator.Coordinator`); None: none."""
        self._published = published
        self._observer = observer
        self._view = view
        self._feed = feed
        self._writer = writer
        self._clock = clock
        self._nominations = nominations
        cfg = config or BinderConfig()
        if nominations is None and cfg.coordinator.preemption.enabled:
            cfg = replace(cfg, coordinator=replace(cfg.coordinator, preemption=replace(
                cfg.coordinator.preemption, enabled=False)))
        self._cfg = cfg
        self._sup: Supervisor | None = None
        self._node_of: dict[str, str] = {}  # child id -> node, for the node actors started

    # -- NodeDirectory --------------------------------------------------------------------------

    def node_actor(self, node: str) -> ActorRef | None:
        return self._sup.ref(node_child_id(node)) if self._sup is not None else None

    def node_actors(self) -> Mapping[str, ActorRef]:
        if self._sup is None:
            return {}
        out = {}
        for cid in self._sup.child_ids(ChildKind.NODE):
            ref = self._sup.ref(cid)
            if ref is not None:
                out[self._node_of[cid]] = ref
        return out

    # -- control --------------------------------------------------------------------------------

    @property
    def coordinator(self) -> ActorRef | None:
        return self._sup.ref(COORDINATOR) if self._sup is not None else None

    @property
    def pipeline(self) -> ActorRef | None:
        """The status pipeline (its `statistics().reservations` = requests in flight)."""
        return self._sup.ref(PIPELINE) if self._sup is not None else None

    @property
    def supervisor(self) -> Supervisor | None:
        """The supervision tree while `run` runs (None before): its children are the node
        actors (`node_child_id(n)`), `PIPELINE` and `COORDINATOR`, e.g. for
        `supervisor.kill(COORDINATOR)` (which restarts the pipeline with it)."""
        return self._sup

    async def line(self, timeout: float = 5.0) -> LineState | None:
        """The coordinator's waiting line (P5, `GetLine`), None while there is no coordinator
        or it did not answer within `timeout` seconds (restarting, or busy)."""
        ref = self.coordinator
        if ref is None:
            return None
        try:
            return await ref.ask(GetLine(), timeout=timeout)
        except (AskTimeout, ActorStopped):
            return None

    def vms_waiting(self, message: VMsWaiting) -> None:
        """Hand the coordinator the VMs the waiting-VM loop found waiting for room (P5);
        dropped when there is no coordinator or its mailbox is full (sent again next round)."""
        self._tell(self.coordinator, message)

    def refused_at_w1(self, message: RefusedAtW1) -> bool:
        """Hand the coordinator a bare VMI this replica's webhook refused for room at W1 (P5).
        True when there is a coordinator to tell (the message is dropped if its mailbox is
        full: the VMI's next retry tells again); False when there is none (not leading yet,
        or restarting): the webhook then lets the set go on to the binder, whose refusal
        enters the line."""
        ref = self.coordinator
        if ref is None:
            return False
        try:
            ref.tell_nowait(message)
        except MailboxFull:
            pass
        except ActorStopped:
            return False
        return True

    def child_ids(self) -> list[str]:
        return self._sup.child_ids() if self._sup is not None else []

    def statistics(self) -> SupervisorStatistics | None:
        return self._sup.statistics() if self._sup is not None else None

    # -- running --------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[Binder] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. Reports started (with itself) once every node actor, the
        pipeline and the coordinator have started. Raises `SupervisorEscalation` past the restart intensity
        (every actor is stopped first). Cancellation stops every actor."""
        async with Supervisor(self._cfg.supervisor, name="binder") as sup:
            self._sup = sup
            async with self._feed.subscribe() as changes:
                # Subscribed first: a change made while starting is routed afterwards.
                for name in sorted(self._view.nodes()):
                    await self._start_node(name)
                await sup.start_group([  # started in order, stopped in reverse
                    ChildSpec(id=PIPELINE, start=self._new_pipeline, restart=Restart.PERMANENT,
                              shutdown=self._cfg.shutdown, mailbox_size=self._cfg.pipeline_mailbox,
                              kind=ChildKind.PIPELINE),
                    ChildSpec(id=COORDINATOR, start=self._new_coordinator, restart=Restart.PERMANENT,
                              shutdown=self._cfg.shutdown, mailbox_size=self._cfg.coordinator_mailbox,
                              kind=ChildKind.COORDINATOR),
                ])
                _log.info("binder_started", nodes=len(self._view.nodes()))
                task_status.started(self)
                while True:
                    batch = [await changes.get()]
                    try:
                        while len(batch) < self._cfg.route_batch:  # what is due: one pass
                            try:
                                batch.append(changes.get_nowait())
                            except anyio.WouldBlock:
                                break
                        await self._route(batch)
                    finally:  # a key changed while routed comes again
                        for change in batch:
                            changes.done(change)

    def _new_pipeline(self) -> StatusPipeline:
        return StatusPipeline(self._view, self._writer, self, self._clock, self._cfg.pipeline,
                              nominations=self._nominations)

    def _new_coordinator(self) -> Coordinator:
        pipeline = self.pipeline
        assert pipeline is not None  # the group's cells exist before its members start
        return Coordinator(self._view, pipeline, self, self._clock, self._cfg.coordinator,
                           self._observer, self._published)

    async def _start_node(self, name: str) -> None:
        assert self._sup is not None
        view, clock, cfg = self._view, self._clock, self._cfg.node
        cid = node_child_id(name)
        self._node_of[cid] = name
        await self._sup.start_child(ChildSpec(
            id=cid,
            start=lambda: NodeActor(name, view, clock, cfg),
            restart=Restart.PERMANENT,
            shutdown=self._cfg.shutdown,
            mailbox_size=self._cfg.node_mailbox,
            kind=ChildKind.NODE,
        ))

    async def _route(self, batch: list[Change]) -> None:
        """Route a batch of changes. Node changes one by one, in order; device changes
        coalesced (level based: the view is read once per key): one `Examine` per complete
        request lacking a result; class, budget and namespace changes: one broadcast
        (`DevicesChanged` to every node actor, `Resync` to the coordinator)."""
        sup = self._sup
        assert sup is not None
        devices: dict[object, None] = {}
        broadcast = False
        for change in batch:
            if change.kind == "node":
                await self._route_node(str(change.key))
            elif change.kind == "device":
                devices[change.key] = None
            else:
                broadcast = True
        if devices:
            await self._route_devices(devices)
        if broadcast:
            # classes, budgets, namespaces: every ledger re-reads; the coordinator rescans.
            for ref in self.node_actors().values():
                self._tell(ref, DevicesChanged())
            await self._tell_coordinator(Resync())

    async def _route_node(self, name: str) -> None:
        sup = self._sup
        assert sup is not None
        cid = node_child_id(name)
        exists = self._view.node(name) is not None
        if not exists and sup.ref(cid) is not None:
            await sup.terminate_child(cid)
            self._node_of.pop(cid, None)
            _log.info("node_actor_stopped", node=name, reason="node deleted")
        elif exists and sup.ref(cid) is None:
            await self._start_node(name)
        elif exists:
            self._tell(sup.ref(cid), NodeChanged())

    async def _route_devices(self, keys: Iterable[object]) -> None:
        sup = self._sup
        assert sup is not None
        view = self._view
        requests: dict[RequestKey, None] = {}
        for key in keys:
            dev = view.device(key)  # type: ignore[arg-type]
            if dev is None:
                continue
            br = dev.status.bind_request
            if br is None or br.result is not None or br.node is not None:
                # No request, answered, or decided (a recorded node): the coordinator that
                # decided it is writing it, or its successor recovers it on start (B7).
                continue
            requests[(dev.namespace, br.id)] = None
        seen = self._clock.now().timestamp() if requests else None  # wall s: bench floor's split
        for ns, rid in requests:
            complete, _ = find_requests(view.request_members(ns, rid))
            if any(r.id == rid for r in complete):
                await self._tell_coordinator(Examine(ns, rid, seen))

    async def _tell_coordinator(self, message: object) -> None:
        ref = self.coordinator
        if ref is None:
            return
        try:
            ref.tell_nowait(message)
            return
        except MailboxFull:
            pass
        except ActorStopped:
            return
        with anyio.move_on_after(self._cfg.route_timeout):  # back-pressure, bounded
            try:
                await ref.tell(message)
            except ActorStopped:
                pass

    @staticmethod
    def _tell(ref: ActorRef | None, message: object) -> None:
        if ref is None:
            return
        try:
            ref.tell_nowait(message)
        except (MailboxFull, ActorStopped):
            pass  # level based: the actor re-reads the view on its next prepare anyway
