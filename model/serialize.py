"""Value types back to the API's shape: the inverse of `model.parse` where the binder and the
webhook write (`status` of a GPUDevice as `device_status_to_dict` gives it, the VMI's
tolerations copied into `bindRequest`, times as RFC 3339 in UTC). Pure.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from model.priority import DEFAULT_PRIORITY
from model.types import DeviceStatus, Toleration


def tolerations_to_list(tolerations: tuple[Toleration, ...]) -> list[dict]:
    """Tolerations as the API's list of dicts (empty fields omitted; the inverse of
    `parse_tolerations`)."""
    out = []
    for t in tolerations:
        d = {"operator": t.operator}
        if t.key:
            d["key"] = t.key
        if t.value:
            d["value"] = t.value
        if t.effect:
            d["effect"] = t.effect
        out.append(d)
    return out


def format_time(when: datetime) -> str:
    """An aware datetime as RFC 3339 in UTC with a 'Z' ("2026-01-02T03:04:05Z"; microseconds
    only when non-zero). Raises ValueError for a naive datetime."""
    if when.tzinfo is None:
        raise ValueError("naive datetime")
    when = when.astimezone(timezone.utc)
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if when.microsecond else "%Y-%m-%dT%H:%M:%SZ"
    return when.strftime(fmt)


def parse_time(value: Any) -> datetime | None:
    """The inverse of `format_time` as read from an object the API server or a tenant wrote:
    an RFC 3339 string with its offset ('Z' or "+hh:mm") as an aware datetime; None for
    anything else (not a string, empty, unparsable, or without an offset). Never raises."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def device_status_to_dict(status: DeviceStatus) -> dict:
    """`status` as the API's camelCase dict (the inverse of the status part of
    `parse_gpu_device`): RFC 3339 'Z' times, None fields and empty nodeSelectors omitted. A
    merge-patch writer that must clear a field sends null for it itself."""
    out: dict[str, Any] = {"phase": status.phase.value}
    if status.node_name is not None:
        out["nodeName"] = status.node_name
    if status.bound_at is not None:
        out["boundAt"] = format_time(status.bound_at)
    if status.attached_to is not None:
        att = status.attached_to
        out["attachedTo"] = {"vmi": att.vmi, "since": format_time(att.since)}
        if att.admission is not None:
            out["attachedTo"]["admission"] = att.admission
        if att.uid is not None:
            out["attachedTo"]["uid"] = att.uid
        if att.owner is not None:
            out["attachedTo"]["owner"] = att.owner
        if att.kept_until is not None:
            out["attachedTo"]["keptUntil"] = format_time(att.kept_until)
    br = status.bind_request
    if br is not None:
        b: dict[str, Any] = {"id": br.id, "vmi": br.vmi, "devices": list(br.devices)}
        if br.requested_at is not None:
            b["requestedAt"] = format_time(br.requested_at)
        if br.node_selector:
            b["nodeSelector"] = dict(br.node_selector)
        if br.result is not None:
            b["result"] = br.result.value
        if br.message is not None:
            b["message"] = br.message
        if br.code is not None:
            b["code"] = br.code.value
        if br.node is not None:
            b["node"] = br.node
        if br.tolerations:
            b["tolerations"] = tolerations_to_list(br.tolerations)
        if br.priority != DEFAULT_PRIORITY:
            b["priority"] = br.priority.value
            b["preemptionPolicy"] = br.priority.policy.value
            if br.priority.class_name is not None:
                b["priorityClassName"] = br.priority.class_name
        out["bindRequest"] = b
    if status.device is not None:
        out["device"] = {"driver": status.device.driver, "pool": status.device.pool,
                         "device": status.device.device}
    return out


__all__ = ["device_status_to_dict", "format_time", "tolerations_to_list"]
