"""`gpu-binder controller`: the process, wired in start order (controller-runtime style).

1. HTTP first: `/healthz`, `/readyz`, `/metrics` (prometheus-client) and the webhook, which
   denies (fail closed) until the cache has synced;
2. the informers (wait for sync), then `/readyz` turns ok;
3. the Lease loop; while leading, the binder (supervisor, node actors, coordinator),
   housekeeping, the waiting-VM loop (`k8s.vm_waiting`), the preemption worker, the
   published waiting line (`k8s.line_status`) and the health worker (`k8s.health`,
   HL2) run in one task group, cancelled together when leadership is lost.
SIGTERM/SIGINT cancel everything in reverse order; a held Lease is released. A supervisor
escalation (restart intensity exceeded) propagates out and the process exits non-zero.
"""

from __future__ import annotations

import functools
import signal
import tempfile
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import anyio
import structlog
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from actors.coordinator_protocol import LineState, RefusedAtW1
from actors.heap import limit_tls_read_buffer, settle_heap, trim_heap_every
from actors.logging import close_logging, configure_logging
from actors.ports import SystemClock
from k8s.webhook.admission import VMIAdmission
from k8s.cache import ClusterCache
from k8s.client import KubeClient, pool_connections, resolve_environment_once, reuse_newest_first
from k8s.config import Config
from k8s.housekeeping import Housekeeper
from k8s.leader import LeaderElector, LeaseConfig
from k8s.line_status import LineStatus, ReadBack
from k8s.metrics import Metrics, Observed
from k8s.nominations import ApiNominations
from k8s.health import Health
from k8s.preemption import Preemption
from k8s.status_writer import ApiStatusWriter
from k8s.vm_waiting import VMWaiting
from k8s.webhook.fairness import TenantGate
from k8s.webhook.review import Review, reason_denial
from k8s.webhook.transport import ReloadingTLS, deny, make_app, open_connections, serve
from model.health import HealthSettings
from model.line import Entry
from model.line_memory import trust_published
from model.preemption import PreemptionSettings
from model.reasons import NotSynced
from supervisor.binder import Binder, BinderConfig
from supervisor.tree import SupervisorEscalation

log = structlog.get_logger("gpu_binder.controller")


async def make_api_client(kubeconfig: str | None) -> ApiClient:
    """An ApiClient from a kubeconfig file, or the in-cluster service account when None;
    the environment (proxy) read once (`k8s.client.resolve_environment_once`), its pool
    reusing the newest idle connection first (`k8s.client.reuse_newest_first`)."""
    from kubernetes_asyncio import config as kconfig

    if kubeconfig:
        api = await kconfig.new_client_from_config(config_file=kubeconfig)
    else:
        kconfig.load_incluster_config()
        api = ApiClient()
    return reuse_newest_first(resolve_environment_once(api))


def binder_config(cfg: Config) -> BinderConfig:
    """The binder's configuration: `BinderConfig`'s defaults with the operator's settings
    of `cfg` applied (the one path from `--write-attempts` & co. to the actors). Raises
    nothing: `cfg` was validated."""
    b = BinderConfig()
    return replace(
        b,
        supervisor=replace(b.supervisor, max_restarts=cfg.max_restarts,
                           max_seconds=cfg.max_restart_seconds),
        node=replace(b.node, prepare_ttl=cfg.prepare_ttl, commit_ttl=cfg.commit_ttl),
        coordinator=replace(b.coordinator, ask_timeout=cfg.ask_timeout,
                            resync_interval=cfg.resync_interval,
                            defrag_interval=cfg.defrag_interval,
                            defrag_max_moves=cfg.defrag_max_moves,
                            preemption=replace(
                                b.coordinator.preemption,
                                preemption=PreemptionSettings(timedelta(seconds=cfg.preemption_min_runtime)),
                                ttl=timedelta(seconds=cfg.preemption_nomination_ttl)),
                            line=replace(b.coordinator.line,
                                         reserve_after=timedelta(seconds=cfg.line_reserve_after),
                                         retry_grace=timedelta(seconds=cfg.line_retry_grace),
                                         per_namespace=cfg.line_max_per_namespace,
                                         enabled=cfg.line_enabled)),
        pipeline=replace(b.pipeline, write_timeout=cfg.write_timeout,
                         retry_attempts=cfg.write_attempts, settle_timeout=cfg.settle_timeout),
    )


def w1_line(cfg: Config, tell: Callable[[Entry], bool]) -> Callable[[Entry], bool] | None:
    """The webhook's way to the leader's line (`VMIAdmission.line`, P5): `tell` when the line
    is on (`--line-enabled`) and bare VMIs join it (`--line-bare-vmis`), else None: W1's
    refusal for room stands (403) and the set does not wait. Raises nothing."""
    return tell if cfg.line_enabled and cfg.line_bare_vmis else None


def tenant_gate(cfg: Config) -> TenantGate:
    """The webhook's fair share per tenant from the operator's settings of `cfg`
    (`--webhook-concurrency` & co.). Raises nothing: `cfg` was validated."""
    return TenantGate(cfg.webhook_concurrency, cfg.webhook_tenant_concurrency,
                      cfg.webhook_tenant_queue, cfg.webhook_tenant_wait or None)


def lease_config(cfg: Config) -> LeaseConfig:
    """The Lease loop's configuration from the operator's settings of `cfg` (seconds).
    Raises ValueError when the durations are out of order (`Config.validate` refuses that
    first)."""
    return LeaseConfig(namespace=cfg.lease_namespace, name=cfg.lease_name,
                       lease_duration=cfg.lease_duration, renew_deadline=cfg.renew_deadline,
                       retry_period=cfg.retry_period)


class Controller:
    """One replica. `run()` returns the exit code: 0 after a signal, 1 after an escalation,
    2 when no API client can be built (bad kubeconfig, not in a cluster)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.synced = False
        self.binder: Binder | None = None
        self.cache: ClusterCache | None = None
        self.elector: LeaderElector | None = None
        self.housekeeper: Housekeeper | None = None
        self.vm_waiting: VMWaiting | None = None
        self.api: ApiClient | None = None
        self.webhook_runner: web.AppRunner | None = None

    def observed(self) -> Observed:
        """What the metrics read of this replica now (`k8s.metrics.Observed`)."""
        keeper = self.housekeeper
        return Observed(self.synced, self.elector, self.binder, self.cache,
                        keeper.statistics() if keeper is not None else None,
                        pool_connections(self.api) if self.api is not None else None,
                        open_connections(self.webhook_runner))

    def refused_at_w1(self, entry: Entry) -> bool:
        """The webhook's way to the leader's line (P5, `VMIAdmission.line`): a bare VMI W1
        refused for room, told to this replica's coordinator; False when this replica does
        not lead (or its binder has no coordinator now): the webhook then sends the set on to
        the binder, the way every decision reaches the leader."""
        binder = self.binder
        return binder is not None and binder.refused_at_w1(RefusedAtW1(entry))

    def _health_app(self, metrics: Metrics) -> web.Application:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            if self.synced:
                return web.Response(text="ok")
            return web.Response(status=503, text="informers not synced")

        async def metrics_view(_: web.Request) -> web.Response:
            await metrics.refresh_fleet()
            metrics.refresh_heap()
            body, ctype = metrics.render()
            return web.Response(body=body, headers={"Content-Type": ctype})

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics_view)
        return app

    async def run(self) -> int:
        cfg = self.cfg
        configure_logging(log_dir=cfg.log_dir, cache=True)
        limit_tls_read_buffer()  # before the first connection: actors/heap.py
        log.info("starting", identity=cfg.identity, lease=cfg.lease_name,
                 webhook_port=cfg.webhook_port, metrics_port=cfg.metrics_port)
        try:
            api = await make_api_client(cfg.kubeconfig)
        except Exception as exc:  # noqa: BLE001 - ConfigException, OSError, bad YAML
            log.error("cannot build an API client", kubeconfig=cfg.kubeconfig,
                      error=f"{type(exc).__name__}: {exc}",
                      hint=None if cfg.kubeconfig else
                      "not running in a cluster: pass --kubeconfig")
            close_logging()
            return 2
        escalation: SupervisorEscalation | None = None
        try:
            return await self._run(api)
        except* SupervisorEscalation as group:  # raised through nested task groups
            escalation = group.exceptions[0]  # type: ignore[assignment]
        finally:
            with anyio.CancelScope(shield=True):
                await api.close()
            log.info("stopped", identity=cfg.identity)
            if escalation is None:
                close_logging()
        while isinstance(escalation, BaseExceptionGroup):
            escalation = escalation.exceptions[0]
        log.error("supervisor escalated; exiting", child=getattr(escalation, "child_id", None),
                  error=str(escalation))
        close_logging()
        return 1

    async def _run(self, api: ApiClient) -> int:
        cfg = self.cfg
        cache = ClusterCache(api, settings_namespace=cfg.settings_namespace)
        self.cache, self.api = cache, api
        grace = timedelta(seconds=cfg.attachment_grace)
        client = KubeClient(api, timeout=5.0)
        admission = VMIAdmission(client, cache, bind_timeout=cfg.bind_timeout, grace=grace,
                                 gate=tenant_gate(cfg), record_wait=cfg.webhook_record_wait,
                                 preemption=binder_config(cfg).coordinator.preemption,
                                 # P5: bare VMIs refused for room wait (503, Retry-After;
                                 # on unless --line-bare-vmis=false or --line-enabled=false)
                                 line=w1_line(cfg, self.refused_at_w1),
                                 line_grace=timedelta(seconds=cfg.line_retry_grace))
        self.elector = LeaderElector(client, cfg.identity, lease_config(cfg))
        metrics = Metrics(self.observed, admission)

        async def admit(review: Review) -> dict:
            if not self.synced:  # W6: fail closed until the cache is complete
                return deny(review.uid, reason_denial(NotSynced()))
            with metrics.admission_latency.time():
                return await admission.handle(review)

        async def lead() -> None:
            # a leader's call ends before its lease
            leading = client.using(timeout=min(5.0, cfg.renew_deadline / 2))
            writer = ApiStatusWriter(leading)
            nominations = ApiNominations(leading, cfg.settings_namespace)  # P4

            async def line() -> LineState | None:
                return await binder.line()
            published = LineStatus(leading, cache, line)  # P5: status.line of each class
            # P5: a starting coordinator reads those back (bare VMIs keep their places); the
            # previous leader's only when its Lease was renewed shortly before we took it
            read_back = ReadBack(cache, published, trusted=trust_published(
                self.elector.previous_renew if self.elector is not None else None,
                SystemClock().now(), timedelta(seconds=cfg.lease_duration),
                timedelta(seconds=cfg.line_retry_grace)))
            self.binder = binder = Binder(cache.view, cache.view, writer, SystemClock(), binder_config(cfg),
                                          observer=metrics, nominations=nominations, published=read_back)
            preemption = Preemption(leading, cache, nominations, period=cfg.housekeeping_period)
            waiting = VMWaiting(leading, cache, grace=grace,  # P5: the line, asked for 1 s at most
                                line=functools.partial(self.binder.line, 1.0),
                                waiting=self.binder.vms_waiting)
            health = Health(leading, cache, HealthSettings(cfg.health_failed_starts,
                                                           timedelta(seconds=cfg.health_window)),
                            on_suspected=metrics.set_suspected,
                            on_failed_start=lambda c: metrics.failed_starts.labels(c).inc(),
                            period=cfg.housekeeping_period)  # HL2
            keeper = Housekeeper(leading, cache, grace=grace, raw_policy=cfg.raw_resource_names,
                                 period=cfg.housekeeping_period,
                                 answer_window=timedelta(seconds=cfg.bind_timeout),
                                 vms=waiting.vms)  # H4: the VMs, one informer for both
            try:
                self.housekeeper, self.vm_waiting = keeper, waiting
                async with anyio.create_task_group() as tg:
                    await tg.start(self.binder.run)
                    tg.start_soon(keeper.run)
                    tg.start_soon(waiting.run)
                    tg.start_soon(preemption.run)
                    tg.start_soon(published.run)
                    tg.start_soon(health.run)
            finally:
                self.binder = self.housekeeper = self.vm_waiting = None

        async with anyio.create_task_group() as tg:
            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        log.info("signal received; shutting down", signal=signum)
                        self.synced = False          # /readyz fails: no new traffic
                        await admission.drain(timeout=5.0)
                        tg.cancel_scope.cancel()
                        return

            async def on_heap_signal() -> None:
                """SIGUSR2: one JSON line `heap report` (actors.heap.heap_report, never while
                the fleet figures are computed: `Metrics.heap_report`), with a tracemalloc
                snapshot in --log-dir (or the temp directory) while tracing."""
                where = Path(cfg.log_dir) if cfg.log_dir else Path(tempfile.gettempdir())
                with anyio.open_signal_receiver(signal.SIGUSR2) as signals:
                    n = 0
                    async for _ in signals:
                        n += 1
                        try:
                            got = await metrics.heap_report(where, n)
                        except OSError as exc:
                            log.error("heap report failed", directory=str(where),
                                      error=f"{type(exc).__name__}: {exc}")
                        else:
                            log.info("heap report", report=n, **got)

            tg.start_soon(on_signal)
            tg.start_soon(on_heap_signal)
            if cfg.metrics_port:
                await tg.start(serve, self._health_app(metrics), cfg.metrics_host,
                               cfg.metrics_port, None)
            if cfg.webhook_port:
                if cfg.webhook_insecure_skip_client_auth:
                    log.warning("webhook client authentication is OFF: anyone who reaches "
                                "the webhook port can forge AdmissionReviews",
                                webhook_port=cfg.webhook_port)
                try:
                    tls = ReloadingTLS(Path(cfg.webhook_cert), Path(cfg.webhook_key),
                                       Path(cfg.webhook_client_ca) if cfg.webhook_client_ca
                                       else None)
                except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                    log.error("cannot load the webhook certificate", cert=cfg.webhook_cert,
                              key=cfg.webhook_key, client_ca=cfg.webhook_client_ca,
                              error=f"{type(exc).__name__}: {exc}")
                    tg.cancel_scope.cancel()
                    return 2
                self.webhook_runner = await tg.start(functools.partial(
                    serve, make_app(admit, timeout=cfg.bind_timeout + 3,
                                    keepalive_reviews=cfg.webhook_keepalive_reviews), cfg.webhook_host,
                    cfg.webhook_port, tls.context, reuse_port=True))
            await tg.start(cache.run)
            settle_heap()  # the synced cache is long-lived (see actors/heap.py)
            tg.start_soon(trim_heap_every, cfg.malloc_trim_period)  # issue 41 item 5
            self.synced = True
            log.info("cache synced", devices=len(cache.view.devices()),
                     nodes=len(cache.view.nodes()))
            if cfg.leader_election:
                await tg.start(self.elector.run, lead)
            else:
                log.info("leader election off: serving the webhook only")
        return 0
