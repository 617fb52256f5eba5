"""Kubernetes Events the binder records about its objects (best effort: an Event that cannot
be written is logged, never raised), one body shape for every writer."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import structlog

from k8s.client import KubeClient
from model.serialize import format_time

log = structlog.get_logger("gpu_binder.events")


def event_body(involved: dict[str, Any], *, reason: str, message: str, warning: bool,
               instance: str, when: datetime | None) -> dict:
    """A core/v1 Event about `involved` (apiVersion, kind, name, namespace, uid), named
    `<name>.<random>`, reported by component `gpu-binder` instance `instance`, message cut to
    1024 characters, first and last timestamp `when` (None: unset), count 1."""
    stamp = format_time(when) if when is not None else None
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.",
                         "namespace": involved["namespace"]},
            "involvedObject": dict(involved), "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal", "source": {"component": "gpu-binder"},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": "gpu-binder", "reportingInstance": instance}


async def record(client: KubeClient, body: dict, **context: Any) -> None:
    """Create the Event `body` (`event_body`) through `client` (bounded by its timeout).
    Best effort: a failure is logged with `context`, never raised."""
    ns = body["metadata"]["namespace"]
    try:
        await client.create_event(ns, body)
    except Exception as exc:  # noqa: BLE001 - an Event is best effort
        log.warning("event not recorded", error=repr(exc)[:200], **context)
