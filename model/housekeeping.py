"""Housekeeping decisions (DESIGN.md §5, H1–H2) as a pure function of the cache.

`plan(devices, live_vmis, deleted_vmis, now, grace)` returns the actions the leader should
take; the k8s adapter carries them out with a JSON Patch `test` on the attachment, so an
action planned from a stale view can never clear a newer attachment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable

from model.types import GPUDevice

VMIKey = tuple[str, str]
"""(namespace, VMI name)."""


@dataclass(frozen=True, slots=True)
class ClearAttachment:
    """Clear `status.attachedTo` (and a `bindRequest` for the same VMI) of `device`, provided
    it is still attached to `vmi`."""

    device: tuple[str, str]
    vmi: str
    rule: str
    reason: str
    since: datetime | None = field(default=None, compare=False)
    """`attachedTo.since` as planned: the executor acts only on that same attachment."""


@dataclass(frozen=True, slots=True)
class DeleteTemplate:
    """Delete template device `device` (uid-preconditioned by the adapter when known)."""

    device: tuple[str, str]
    uid: str | None
    rule: str
    reason: str


Action = ClearAttachment | DeleteTemplate


def plan(devices: Iterable[GPUDevice], live_vmis: set[VMIKey], deleted_vmis: set[VMIKey],
         now: datetime, grace: timedelta) -> list[Action]:
    """Actions for H1 and H2, sorted by device key.

    - H2: a device attached to a VMI that was seen and then deleted (`deleted_vmis`) is
      released at once; a template device of it is deleted. Held devices keep their node.
    - H1: an attachment (and its request) whose VMI does not exist and whose `since` is older
      than `grace` is cleared; a template device for such a VMI is deleted, and so is a
      template device with no attachment created more than `grace` ago.
    A VMI in `live_vmis` protects its devices. `now` is timezone-aware UTC.
    """
    actions: list[Action] = []
    for d in sorted(devices, key=lambda d: d.key):
        att = d.status.attached_to
        if att is not None:
            vmi_key = (d.namespace, att.vmi)
            if vmi_key in live_vmis:
                continue
            if vmi_key in deleted_vmis:
                rule, why = "H2", f"VMI {att.vmi} was deleted"
            elif now - att.since > grace:
                age = int((now - att.since).total_seconds())
                rule, why = "H1", f"VMI {att.vmi} has not appeared {age} s after attachment"
            else:
                continue
            if d.template_for is not None:
                actions.append(DeleteTemplate(d.key, d.uid, rule, why))
            else:
                actions.append(ClearAttachment(d.key, att.vmi, rule, why, att.since))
        elif d.template_for is not None:
            owner = (d.namespace, d.template_for)
            if owner in live_vmis:
                continue
            if owner in deleted_vmis:
                actions.append(DeleteTemplate(d.key, d.uid, "H2",
                                              f"VMI {d.template_for} was deleted"))
            elif d.created_at is not None and now - d.created_at > grace:
                age = int((now - d.created_at).total_seconds())
                actions.append(DeleteTemplate(
                    d.key, d.uid, "H1", f"template device with no attachment, {age} s old"))
    return actions
