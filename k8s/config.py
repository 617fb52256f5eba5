"""Controller configuration: defaults, overridden by a YAML/JSON file (`--config`, e.g. a
mounted ConfigMap), then by environment variables `GPU_BINDER_<FIELD>`, then by flags.

Durations are seconds (floats). `Config.validate()` raises ValueError naming the field. The
settings that tune the binder take their defaults from `supervisor.binder.BinderConfig` (and
the actor configurations it nests), the only place those defaults are written;
`k8s.controller.binder_config` hands the operator's values to the actors. The webhook's
waits on its cache take theirs from `k8s.webhook.waiter` likewise.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from actors.heap import MALLOC_TRIM_PERIOD
from model.health import DEFAULT_FAILED_STARTS, DEFAULT_WINDOW
from model.line import RETRY_AFTER as LINE_RETRY_AFTER
from model.settings import RAW_ALLOWED, RAW_DENIED
from k8s.webhook.waiter import RECORD_WAIT, TEMPLATE_WAIT
from supervisor.binder import BinderConfig

_BINDER = BinderConfig()
"""The binder's defaults, read by the settings that tune it."""


def flag(name: str) -> str:
    """The command-line flag of setting `name`: "bind_timeout" → "--bind-timeout"."""
    return "--" + name.replace("_", "-")


FIELD_HELP: dict[str, str] = {
    "kubeconfig": "kubeconfig file to reach the API server",
    "identity": "this replica's name in the leader Lease",
    "attachment_grace": "seconds an attachment whose VMI has not appeared still counts as "
                        "live (W1) before housekeeping clears it (H1)",
    "bind_timeout": "seconds the webhook waits for the binder's result; at most 21 (the "
                    "shipped webhook's timeoutSeconds is 25) and below --attachment-grace",
    "raw_resource_names": "'allowed' or 'denied': whether tenant VMIs and Pods may request "
                          "the GPU resource names directly, bypassing the binder (written to "
                          "the gpu-settings ConfigMap for the shipped policies)",
    "settings_namespace": "namespace of the gpu-settings ConfigMap",
    "lease_name": "name of the leader-election Lease",
    "lease_namespace": "namespace of the leader-election Lease",
    "lease_duration": "seconds a Lease stays valid without renewal; above --renew-deadline",
    "renew_deadline": "seconds the leader keeps trying to renew before it stops leading; "
                      "above --retry-period",
    "retry_period": "seconds between Lease acquire/renew attempts",
    "webhook_port": "TCP port of the admission webhook (HTTPS); 0: no webhook",
    "webhook_host": "address the webhook listens on",
    "webhook_cert": "PEM certificate file of the webhook's TLS server; required with "
                    "--webhook-port; reloaded when the file changes (no restart)",
    "webhook_key": "PEM private-key file of --webhook-cert; reloaded with it",
    "webhook_client_ca": "PEM CA bundle: the webhook accepts only TLS clients presenting a "
                         "certificate it signed (the client certificate kube-apiserver "
                         "presents, from its --admission-control-config-file); required with "
                         "--webhook-port unless --webhook-insecure-skip-client-auth; reloaded "
                         "when the file changes",
    "webhook_insecure_skip_client_auth": "true: accept AdmissionReviews from any TLS client "
                                         "(anyone who reaches the port can forge reviews "
                                         "that write devices and Events); single-tenant "
                                         "test clusters only",
    "webhook_concurrency": "admissions one replica's webhook carries out at once past W1's "
                           "checks on its cache (a fair share of them per tenant)",
    "webhook_tenant_concurrency": "a tenant's (namespace's) share of one replica's "
                                  "admissions: binding only while another tenant waits (a "
                                  "tenant alone may use all --webhook-concurrency); freed "
                                  "turns go round-robin over the tenants waiting; at most "
                                  "--webhook-concurrency",
    "webhook_tenant_queue": "admissions of one tenant that may wait for a turn at one "
                            "replica; one more is denied at once, 429 TooManyRequests "
                            "(retryable, reason tenant_busy); 0: no limit (the review's "
                            "deadline bounds the wait)",
    "webhook_tenant_wait": "seconds an admission waits for its tenant's turn at most before "
                           "it is denied 429 (retryable); below --bind-timeout; 0: no cap of "
                           "its own (a turn is waited for during the first three quarters "
                           "of --bind-timeout)",
    "webhook_template_wait": "deprecated, no effect: an admission no longer waits for its "
                             "informer to show a template device it created (W3 (2) writes "
                             "the object the create returned); still accepted (> 0) so "
                             "existing flags and environments keep working",
    "webhook_record_wait": "seconds an admission in device mode waits at most, once the "
                           "binder answered, for its informer to show the set's device "
                           "records (DR5; woken by the informer's events) before it is "
                           "denied 503 (retryable); 0: until the review's deadline "
                           "(--bind-timeout from its start)",
    "webhook_keepalive_reviews": "reviews one kept-alive connection of the API server "
                                 "carries; the answer to the last says Connection: close, so "
                                 "the API server reconnects and the Service places the new "
                                 "connection on any ready replica (reviews reach a replica "
                                 "added by a scale-up or rolling update); 0: no limit",
    "metrics_port": "TCP port of /metrics, /healthz and /readyz (HTTP); 0: none",
    "metrics_host": "address the metrics server listens on",
    "log_dir": "directory for one <node>.jsonl decision log per node, besides stdout",
    "housekeeping_period": "seconds between housekeeping passes (H1-H3)",
    "malloc_trim_period": "seconds between two returns of the C heap's free pages to the "
                          "kernel (glibc malloc_trim), so that RSS follows what is in use "
                          "rather than the high-water mark of past bursts; 0: off",
    "leader_election": "true or false: take part in leader election; false runs the webhook "
                       "and informers only, no binder",
    "ask_timeout": "seconds the coordinator waits for one prepare/commit round with the node "
                   "actors (and for one answer of its status pipeline); below --prepare-ttl",
    "resync_interval": "seconds between the coordinator's full scans for complete requests "
                       "lacking a result (the safety net of the change feed)",
    "write_timeout": "seconds one batch of status writes may take before it counts as failed",
    "write_attempts": "tries of a request's status writes, the first included, before they "
                      "give up (the reservation is kept and the request examined again later)",
    "settle_timeout": "seconds a written request keeps its reservation at most while waiting "
                      "for the informers to show its writes",
    "prepare_ttl": "seconds a node actor's prepared (not yet committed) reservation lasts",
    "commit_ttl": "seconds a committed reservation nobody released lasts (safety net)",
    "max_restarts": "restart intensity: crashes of the binder's actors tolerated within "
                    "--max-restart-seconds; one more stops the binder and exits the process",
    "max_restart_seconds": "restart intensity: the window of --max-restarts, in seconds",
    "defrag_interval": "seconds between the binder's defragmentation rounds, which move idle "
                       "held devices of Move classes so that larger sets fit (docs/contract.md §3a, "
                       "D1-D5); 0: off",
    "defrag_max_moves": "most devices one defragmentation round moves (D3); at least 1",
    "preemption_min_runtime": "seconds a running set must have run before it may be stopped "
                              "for a set of higher priority (preemption.minRuntime, P2); >= 0",
    "preemption_nomination_ttl": "seconds a nomination holds the room freed for its preemptor "
                                 "(preemption.nominationTTL, P4): past it the hold is released "
                                 "and the nomination deleted; > 0",
    "line_reserve_after": "seconds the head of a class's waiting line (a set refused for room), "
                          "and the set next behind it, each wait before the node where it would "
                          "start soonest is reserved for it (line.reserveAfter, P5): that node "
                          "takes no set behind it until it starts; >= 0",
    "line_enabled": "true or false: the waiting line (line.enabled, P5). false: no line, "
                    "freed room goes to whoever asks first (no order by priority and first "
                    "refusal, no protection against backfill, no reserved node); a set refused "
                    "for room is refused 403 and does not wait; preemption (P2-P4) is unchanged",
    "line_bare_vmis": "true or false: a bare VMI (no VirtualMachine) the webhook refuses "
                      "for room takes a place in the leader's line (P5), is answered 503 with "
                      "Retry-After (2 s; kubectl and client-go retry it by themselves) and "
                      "keeps the place while its client retries within --line-retry-grace. "
                      "false: such a set is refused (403) and does not wait",
    "line_retry_grace": "seconds a bare VMI's place in the leader's line is kept without a new "
                        "attempt (line.retryGrace, P5): its 503 asks the client to retry every "
                        "2 s (Retry-After), so a client silent this long has stopped and its "
                        "place goes; >= 2 (one Retry-After)",
    "line_max_per_namespace": "most sets of one namespace (tenant) waiting in the leader's line "
                              "at once (line.maxPerNamespace, P5): past it a tenant's further "
                              "sets refused for room are refused without a place in line (its "
                              "first ones in line order keep theirs); at least 1",
    "health_failed_starts": "different VMIs that must fail to start on one GPU (launcher Pod or "
                            "VMI Failed before Running) within --health-window before the "
                            "leader suspects it (health.failedStarts, HL2): a DeviceTaintRule "
                            "gpu.cozystack.io/suspect in device mode, reported in count mode; "
                            "at least 1",
    "health_window": "seconds a failed start counts as evidence against its GPU "
                     "(health.window, HL2); > 0",
}
"""Meaning and unit of each setting (`field_help` adds the default)."""

_DEFAULT_TEXT = {"kubeconfig": "the in-cluster service account",
                 "identity": "$POD_NAME, else the host name"}


def default(name: str) -> Any:
    """The default value of setting `name` (e.g. 120.0 for "attachment_grace"), for tools that
    take the same setting. Raises KeyError for an unknown name or one whose default is
    computed at start ("identity")."""
    value = Config.__dataclass_fields__[name].default
    if value is dataclasses.MISSING:
        raise KeyError(f"setting {name!r} has no fixed default")
    return value


def field_help(name: str) -> str:
    """The help of setting `name`'s flag: meaning, unit and default, e.g. "seconds the
    webhook waits … (default: 20)". A setting missing from FIELD_HELP says so."""
    text = FIELD_HELP.get(name, "undocumented setting")
    if name in _DEFAULT_TEXT:
        shown = _DEFAULT_TEXT[name]
    else:
        value = default(name)
        shown = ("none" if value is None else str(value).lower() if isinstance(value, bool)
                 else f"{value:g}" if isinstance(value, float) else str(value))
    return f"{text} (default: {shown})"


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _boolean(value: Any) -> bool:
    """A setting's true or false (a YAML boolean, or 1/true/yes/on and 0/false/no/off in any
    case); raises ValueError for anything else (a typo must not turn a switch off)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(value)

MAX_SECONDS = 1e9
"""The largest duration setting accepted (about 31 years): larger ones, `inf` and `nan`
would overflow or poison the timedeltas and deadlines they become."""


@dataclass(slots=True)
class Config:
    """Every setting of `gpu-binder controller` (docs/contract.md §2 "Config")."""

    kubeconfig: str | None = None            # None: in-cluster service account
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME") or os.uname().nodename)
    attachment_grace: float = 120.0          # attachmentGrace (2m)
    bind_timeout: float = 20.0               # bindTimeout (below the webhook's timeoutSeconds)
    raw_resource_names: str = RAW_ALLOWED    # allowed | denied
    settings_namespace: str = "cozy-system"
    lease_name: str = "gpu-binder"
    lease_namespace: str = "cozy-system"
    # Shorter than client-go's 15/10/2: the webhook answers only while a leader binds, so a
    # killed leader's Lease must expire fast (a takeover 9-11 s after kill -9; the soak's
    # failover < 15 s). Costs one Lease write per second.
    lease_duration: float = 10.0
    renew_deadline: float = 7.0
    retry_period: float = 1.0
    webhook_port: int = 9443                 # 0: no webhook server
    webhook_host: str = "0.0.0.0"
    webhook_cert: str | None = None
    webhook_key: str | None = None
    webhook_client_ca: str | None = None     # CA of the API server's client cert (required)
    webhook_insecure_skip_client_auth: bool = False  # explicit opt-out of the above
    webhook_concurrency: int = 64            # admissions in progress per replica
    webhook_tenant_concurrency: int = 4      # of them, per tenant (namespace)
    webhook_tenant_queue: int = 0            # waiting for a turn, per tenant (0: no limit)
    webhook_tenant_wait: float = 0.0         # seconds a turn is waited for (0: the deadline)
    webhook_template_wait: float = TEMPLATE_WAIT  # deprecated: no effect (W3 (1) waits no more)
    webhook_record_wait: float = RECORD_WAIT  # DR5 (0: the review's deadline)
    webhook_keepalive_reviews: int = 100     # per connection, then Connection: close
    metrics_port: int = 8080                 # /healthz, /readyz, /metrics; 0: none
    metrics_host: str = "0.0.0.0"
    log_dir: str | None = None               # one <node>.jsonl per node when set
    housekeeping_period: float = 5.0
    malloc_trim_period: float = MALLOC_TRIM_PERIOD   # issue 41 item 5; 0: off
    leader_election: bool = True             # False: webhook and informers only (no binder)
    # The binder's knobs; their defaults are BinderConfig's (see the module docstring).
    ask_timeout: float = _BINDER.coordinator.ask_timeout
    resync_interval: float = _BINDER.coordinator.resync_interval
    write_timeout: float = _BINDER.pipeline.write_timeout
    write_attempts: int = _BINDER.pipeline.retry_attempts
    settle_timeout: float = _BINDER.pipeline.settle_timeout
    prepare_ttl: float = _BINDER.node.prepare_ttl
    commit_ttl: float = _BINDER.node.commit_ttl
    max_restarts: int = _BINDER.supervisor.max_restarts
    max_restart_seconds: float = _BINDER.supervisor.max_seconds
    defrag_interval: float = _BINDER.coordinator.defrag_interval  # 0: off (D3)
    defrag_max_moves: int = _BINDER.coordinator.defrag_max_moves
    preemption_min_runtime: float = _BINDER.coordinator.preemption.preemption.min_runtime.total_seconds()
    preemption_nomination_ttl: float = _BINDER.coordinator.preemption.ttl.total_seconds()
    line_reserve_after: float = _BINDER.coordinator.line.reserve_after.total_seconds()
    line_max_per_namespace: int = _BINDER.coordinator.line.per_namespace
    line_enabled: bool = True
    line_bare_vmis: bool = True
    line_retry_grace: float = _BINDER.coordinator.line.retry_grace.total_seconds()
    health_failed_starts: int = DEFAULT_FAILED_STARTS
    health_window: float = DEFAULT_WINDOW.total_seconds()

    def validate(self) -> "Config":
        """Check ranges; return self. Raises ValueError naming the bad setting by its flag
        ("--bind-timeout"; the same name, dashes or underscores, works in the file and as
        GPU_BINDER_BIND_TIMEOUT)."""
        f = flag
        for fld in dataclasses.fields(self):   # durations: inf, nan and absurd values never pass
            value = getattr(self, fld.name)
            if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= MAX_SECONDS):
                raise ValueError(f"{f(fld.name)}: must be a finite number of seconds of at most "
                                 f"{MAX_SECONDS:g}, got {value}")
        if self.raw_resource_names not in (RAW_ALLOWED, RAW_DENIED):
            raise ValueError(f"--raw-resource-names: must be {RAW_ALLOWED!r} or {RAW_DENIED!r}, "
                             f"got {self.raw_resource_names!r}")
        for name in ("attachment_grace", "bind_timeout", "lease_duration", "renew_deadline",
                     "retry_period", "housekeeping_period", "ask_timeout", "resync_interval",
                     "write_timeout", "settle_timeout", "prepare_ttl", "commit_ttl",
                     "max_restart_seconds", "webhook_template_wait", "preemption_nomination_ttl",
                     "health_window"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{f(name)}: must be > 0 seconds, got {getattr(self, name)}")
        if self.write_attempts < 1:
            raise ValueError(f"--write-attempts: must be at least 1, got {self.write_attempts}")
        if self.malloc_trim_period < 0:
            raise ValueError(f"--malloc-trim-period: must be >= 0 seconds (0: off), "
                             f"got {self.malloc_trim_period}")
        if self.defrag_interval < 0:
            raise ValueError(f"--defrag-interval: must be >= 0 seconds (0: off), "
                             f"got {self.defrag_interval}")
        if self.defrag_max_moves < 1:
            raise ValueError(f"--defrag-max-moves: must be at least 1, got {self.defrag_max_moves}")
        if self.preemption_min_runtime < 0:
            raise ValueError(f"--preemption-min-runtime: must be >= 0 seconds, "
                             f"got {self.preemption_min_runtime}")
        if not self.line_reserve_after >= 0:  # NaN too
            raise ValueError(f"--line-reserve-after: must be >= 0 seconds, "
                             f"got {self.line_reserve_after}")
        if not self.line_retry_grace >= LINE_RETRY_AFTER:  # NaN too
            raise ValueError(f"--line-retry-grace: must be >= {LINE_RETRY_AFTER} seconds (one "
                             f"Retry-After), got {self.line_retry_grace}")
        if self.line_max_per_namespace < 1:
            raise ValueError(f"--line-max-per-namespace: must be at least 1, "
                             f"got {self.line_max_per_namespace}")
        if self.health_failed_starts < 1:
            raise ValueError(f"--health-failed-starts: must be at least 1, "
                             f"got {self.health_failed_starts}")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts: must be at least 0, got {self.max_restarts}")
        if self.prepare_ttl <= self.ask_timeout:
            raise ValueError("--prepare-ttl: must be longer than --ask-timeout (a reservation "
                             "expiring within the round that prepared it is refused at commit)")
        if not self.lease_duration > self.renew_deadline > self.retry_period:
            raise ValueError("--lease-duration > --renew-deadline > --retry-period is required, "
                             f"got {self.lease_duration} > {self.renew_deadline} > "
                             f"{self.retry_period}")
        if self.bind_timeout > 21:
            raise ValueError("--bind-timeout: must be at most 21 s: the shipped webhook's "
                             "timeoutSeconds is 25 and a review needs ~3 s around the wait")
        if not 1 <= self.webhook_tenant_concurrency <= self.webhook_concurrency:
            raise ValueError("--webhook-tenant-concurrency: must be at least 1 and at most "
                             f"--webhook-concurrency ({self.webhook_concurrency}), got "
                             f"{self.webhook_tenant_concurrency}")
        if self.webhook_tenant_queue < 0:
            raise ValueError("--webhook-tenant-queue: must be at least 0, got "
                             f"{self.webhook_tenant_queue}")
        if self.webhook_keepalive_reviews < 0:
            raise ValueError("--webhook-keepalive-reviews: must be at least 0 (0: no limit), "
                             f"got {self.webhook_keepalive_reviews}")
        if self.webhook_tenant_wait < 0:
            raise ValueError(f"--webhook-tenant-wait: must be >= 0 seconds (0: no cap of its "
                             f"own), got {self.webhook_tenant_wait}")
        if self.webhook_record_wait < 0:
            raise ValueError(f"--webhook-record-wait: must be >= 0 seconds (0: until the "
                             f"review's deadline), got {self.webhook_record_wait}")
        if self.webhook_tenant_wait >= self.bind_timeout:
            raise ValueError("--webhook-tenant-wait: must be shorter than --bind-timeout (the "
                             "wait for a turn counts against it)")
        if self.bind_timeout >= self.attachment_grace:
            raise ValueError("--bind-timeout: must be shorter than --attachment-grace")
        for name in ("webhook_port", "metrics_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{f(name)}: must be a TCP port 0-65535 (0: off), "
                                 f"got {getattr(self, name)}")
        if self.kubeconfig and not Path(self.kubeconfig).is_file():
            raise ValueError(f"--kubeconfig: no such file {self.kubeconfig!r}")
        for name in ("webhook_cert", "webhook_key", "webhook_client_ca"):
            value = getattr(self, name)
            if self.webhook_port and value and not Path(value).is_file():
                raise ValueError(f"{f(name)}: no such file {value!r}")
        if self.webhook_port and not (self.webhook_cert and self.webhook_key):
            raise ValueError("--webhook-cert and --webhook-key are required when --webhook-port "
                             "is set (use --webhook-port=0 to run without the webhook)")
        if self.webhook_port and self.webhook_client_ca and \
                self.webhook_insecure_skip_client_auth:
            raise ValueError("--webhook-client-ca and --webhook-insecure-skip-client-auth=true "
                             "contradict each other: set one")
        if self.webhook_port and not (self.webhook_client_ca or
                                      self.webhook_insecure_skip_client_auth):
            raise ValueError(
                "--webhook-client-ca is required when --webhook-port is set: the CA that signed "
                "the client certificate kube-apiserver presents to webhooks (its "
                "--admission-control-config-file); without it anyone who reaches the port "
                "can forge AdmissionReviews. --webhook-insecure-skip-client-auth=true accepts "
                "unauthenticated reviews (single-tenant test clusters only)")
        return self

    def merged(self, values: dict[str, Any], source: str) -> "Config":
        """A copy with `values` applied (keys are field names, dashes allowed)."""
        known = {f.name: f for f in dataclasses.fields(self)}
        out = dataclasses.replace(self)
        for raw_key, value in values.items():
            key = raw_key.replace("-", "_")
            if key not in known:
                raise ValueError(f"{source}: unknown setting {raw_key!r}")
            if value is None:
                continue
            current = getattr(self, key)
            kind = type(current) if current is not None else str
            try:
                if kind is bool:
                    value = _boolean(value)
                elif kind in (int, float):
                    value = kind(value)
                else:
                    value = str(value)
            except ValueError:
                shown = flag(key) if source == "flags" else (
                    "GPU_BINDER_" + key.upper() if source == "environment" else raw_key)
                what = {int: "a whole number", float: "a number",
                        bool: "true or false"}.get(kind, kind.__name__)
                where = "" if source == "flags" else f"{source}: "  # a flag names itself
                raise ValueError(f"{where}{shown}: not {what}: {value!r}") from None
            setattr(out, key, value)
        return out


def yaml_problem(exc: BaseException) -> str:
    """A file that would not read as YAML, in one line: for a YAML error, what the parser
    found wrong and where ("mapping values are not allowed here (line 3, column 27)"; not its
    first line, which may only say what it was reading: "while parsing a flow sequence");
    otherwise the error's first line (an OSError, a UnicodeDecodeError)."""
    where = getattr(exc, "problem_mark", None)
    first = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
    return f"{first}{at}"


def load(file: str | None = None, env: dict[str, str] | None = None,
         flags: dict[str, Any] | None = None) -> Config:
    """Defaults < file < environment (`GPU_BINDER_*`) < flags; validated. Raises ValueError
    naming the bad setting; a range error on a setting that came from the file or the
    environment also says where it came from (the key in the file, the variable)."""
    cfg = Config()
    origin: dict[str, str] = {}          # field -> where its value came from, unless a flag
    if file:
        try:
            data = yaml.safe_load(Path(file).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{file}: not valid YAML: {yaml_problem(exc)}") from None
        except OSError as exc:
            raise ValueError(f"--config {file}: cannot be read: {exc.strerror or exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{file}: expected a mapping of settings")
        cfg = cfg.merged(data, file)
        origin.update({str(k).replace("-", "_"): f"key {k!r} of {file}" for k in data})
    env = os.environ if env is None else env
    prefix = "GPU_BINDER_"
    env_values = {k[len(prefix):].lower(): v for k, v in env.items()
                  if k.startswith(prefix) and k[len(prefix):].lower() in
                  {f.name for f in dataclasses.fields(Config)}}
    cfg = cfg.merged(env_values, "environment")
    origin.update({k: f"environment variable {prefix}{k.upper()}" for k in env_values})
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    cfg = cfg.merged(given, "flags")
    for k in given:
        origin.pop(k.replace("-", "_"), None)
    try:
        return cfg.validate()
    except ValueError as exc:
        named = dict.fromkeys(m.replace("-", "_") for m in re.findall(r"--([a-z][a-z-]*)",
                                                                         str(exc)))
        came = [f"{flag(k)} is {origin[k]}" for k in named if k in origin]
        if not came:
            raise
        raise ValueError(f"{exc} ({'; '.join(came)})") from None
