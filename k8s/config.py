"""Controller configuration: defaults, overridden by a YAML/JSON file (`--config`, e.g. a
mounted ConfigMap), then by environment variables `GPU_BINDER_<FIELD>`, then by flags.

Durations are seconds (floats). `Config.validate()` raises ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from model.settings import RAW_ALLOWED, RAW_DENIED


@dataclass(slots=True)
class Config:
    """Every setting of `gpu-binder controller` (DESIGN.md §2 "Config")."""

    kubeconfig: str | None = None            # None: in-cluster service account
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME") or os.uname().nodename)
    attachment_grace: float = 120.0          # attachmentGrace (2m)
    bind_timeout: float = 20.0               # bindTimeout (below the webhook's timeoutSeconds)
    raw_resource_names: str = RAW_ALLOWED    # allowed | denied
    settings_namespace: str = "cozy-system"
    lease_name: str = "gpu-binder"
    lease_namespace: str = "cozy-system"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    webhook_port: int = 9443                 # 0: no webhook server
    webhook_host: str = "0.0.0.0"
    webhook_cert: str | None = None
    webhook_key: str | None = None
    metrics_port: int = 8080                 # /healthz, /readyz, /metrics; 0: none
    metrics_host: str = "0.0.0.0"
    log_dir: str | None = None               # one <node>.jsonl per node when set
    housekeeping_period: float = 5.0
    leader_election: bool = True             # False: webhook and informers only (no binder)

    def validate(self) -> "Config":
        """Check ranges; return self. Raises ValueError naming the bad field."""
        if self.raw_resource_names not in (RAW_ALLOWED, RAW_DENIED):
            raise ValueError(f"raw_resource_names: must be {RAW_ALLOWED!r} or {RAW_DENIED!r}, "
                             f"got {self.raw_resource_names!r}")
        for name in ("attachment_grace", "bind_timeout", "lease_duration", "renew_deadline",
                     "retry_period", "housekeeping_period"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0 seconds, got {getattr(self, name)}")
        if not self.lease_duration > self.renew_deadline > self.retry_period:
            raise ValueError("lease_duration > renew_deadline > retry_period is required")
        if self.bind_timeout > 21:
            raise ValueError("bind_timeout: must be at most 21 s: the shipped webhook's "
                             "timeoutSeconds is 25 and a review needs ~3 s around the wait")
        if self.bind_timeout >= self.attachment_grace:
            raise ValueError("bind_timeout: must be shorter than attachment_grace")
        for name in ("webhook_port", "metrics_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name}: must be a TCP port 0-65535 (0: off), "
                                 f"got {getattr(self, name)}")
        if self.kubeconfig and not Path(self.kubeconfig).is_file():
            raise ValueError(f"kubeconfig: no such file {self.kubeconfig!r}")
        for name in ("webhook_cert", "webhook_key"):
            value = getattr(self, name)
            if self.webhook_port and value and not Path(value).is_file():
                raise ValueError(f"{name}: no such file {value!r}")
        if self.webhook_port and not (self.webhook_cert and self.webhook_key):
            raise ValueError("webhook_cert and webhook_key are required when webhook_port is set"
                             " (use webhook_port=0 to run without the webhook)")
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
                    value = str(value).lower() in ("1", "true", "yes")
                elif kind in (int, float):
                    value = kind(value)
                else:
                    value = str(value)
            except ValueError:
                raise ValueError(f"{source}: {raw_key}: not a {kind.__name__}: {value!r}") from None
            setattr(out, key, value)
        return out


def load(file: str | None = None, env: dict[str, str] | None = None,
         flags: dict[str, Any] | None = None) -> Config:
    """Defaults < file < environment (`GPU_BINDER_*`) < flags; validated."""
    cfg = Config()
    if file:
        try:
            data = yaml.safe_load(Path(file).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{file}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{file}: expected a mapping of settings")
        cfg = cfg.merged(data, file)
    env = os.environ if env is None else env
    prefix = "GPU_BINDER_"
    env_values = {k[len(prefix):].lower(): v for k, v in env.items()
                  if k.startswith(prefix) and k[len(prefix):].lower() in
                  {f.name for f in dataclasses.fields(Config)}}
    cfg = cfg.merged(env_values, "environment")
    cfg = cfg.merged({k: v for k, v in (flags or {}).items() if v is not None}, "flags")
    return cfg.validate()
