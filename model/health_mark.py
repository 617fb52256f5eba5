"""The mark of a suspected device (HL2): the DeviceTaintRule the binder writes, or, where
the API server does not serve DeviceTaintRules, the entry of its own ConfigMap
`gpu-suspects` (in the controller's namespace) that stands for it; both built and read here.

The rule is named from the device (`rule_name`: deterministic, so a new leader finds the one
its predecessor wrote), labelled `app.kubernetes.io/managed-by: gpu-binder` and
`gpu.cozystack.io/suspect: "true"`, selects exactly that device (driver, pool, device) and
carries the taint `gpu.cozystack.io/suspect=failed-starts:NoSchedule`, so kube-scheduler's
allocator and the binder (DR2) both keep off it. The evidence (node, class, when, and each
failed start: VMI, uid, time, why) is the annotation `gpu.cozystack.io/suspect` (JSON), read
back by `gpu-binder health`. The ConfigMap's entry (key: the rule's name) holds the same
JSON plus the device; only the binder reads it: kube-scheduler cannot see it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from model.device.dra import DeviceRef, DeviceTaint
from model.device.taint_rules import API_VERSION, KIND, TaintRule
from model.health import FailedStart, Suspect
from model.parse import DNS1123_SUBDOMAIN
from model.serialize import format_time

SUSPECT_KEY = "gpu.cozystack.io/suspect"
"""The taint key of a suspected device, the label of the binder's rules and the evidence
annotation."""
SUSPECT_VALUE = "failed-starts"
SUSPECT_EFFECT = "NoSchedule"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-binder")
MARKS_CONFIGMAP = "gpu-suspects"
"""The ConfigMap (controller namespace) holding the marks where DeviceTaintRules are not served."""

SUSPECT_TAINT = DeviceTaint(SUSPECT_KEY, SUSPECT_VALUE, SUSPECT_EFFECT)


def rule_name(ref: DeviceRef) -> str:
    """The DeviceTaintRule (and ConfigMap key) name of the mark of `ref`:
    "gpu-suspect-<pool>-<device>-<hash>" in DNS-subdomain characters (the hash of the whole
    ref keeps two refs that clean up alike apart), at most 253 characters."""
    digest = hashlib.sha256(str(ref).encode()).hexdigest()[:8]
    body = re.sub(r"[^a-z0-9.-]+", "-", f"{ref.pool}-{ref.device}".lower()).strip("-.") or "device"
    return f"gpu-suspect-{body[:220].rstrip('-.')}-{digest}"


@dataclass(frozen=True, slots=True)
class Mark:
    """A suspected device as marked: the mark's `name`, the `device`, its `node` and
    `class_name`, when it was `suspected_at`, the `evidence`, and `kind` ("DeviceTaintRule",
    or "ConfigMap" where rules are not served)."""

    name: str
    device: DeviceRef
    node: str
    class_name: str
    suspected_at: datetime | None
    evidence: tuple[FailedStart, ...]
    kind: str = KIND

    def taint_rule(self) -> TaintRule:
        """The taint this mark puts on its device (what the binder's placements honour)."""
        return TaintRule(f"{self.kind}:{self.name}", SUSPECT_TAINT, self.device.driver,
                         self.device.pool, self.device.device)


def _evidence_json(suspect: Suspect, now: datetime) -> dict[str, Any]:
    t = suspect.target
    return {"node": t.node, "class": t.class_name, "suspectedAt": format_time(now),
            "evidence": [{"namespace": f.namespace, "vmi": f.vmi, "uid": f.uid,
                          "at": format_time(f.at), "why": f.why} for f in suspect.evidence]}


def rule_body(suspect: Suspect, now: datetime) -> dict[str, Any]:
    """The DeviceTaintRule of device-mode suspect `suspect` (its target has a device), made
    at `now`. Raises ValueError for a count-mode target (nothing to select)."""
    ref = suspect.target.device
    if ref is None:
        raise ValueError(f"{suspect.target}: a count-mode suspect has no device to taint")
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": rule_name(ref),
                         "labels": {MANAGED_BY[0]: MANAGED_BY[1], SUSPECT_KEY: "true"},
                         "annotations": {SUSPECT_KEY: json.dumps(_evidence_json(suspect, now),
                                                                 sort_keys=True)}},
            "spec": {"deviceSelector": {"driver": ref.driver, "pool": ref.pool, "device": ref.device},
                     "taint": {"key": SUSPECT_KEY, "value": SUSPECT_VALUE, "effect": SUSPECT_EFFECT}}}


def mark_entry(suspect: Suspect, now: datetime) -> tuple[str, str]:
    """(key, value) of the ConfigMap entry standing for `suspect`'s rule where rules are not
    served. Raises ValueError for a count-mode target."""
    ref = suspect.target.device
    if ref is None:
        raise ValueError(f"{suspect.target}: a count-mode suspect has no device to mark")
    doc = {**_evidence_json(suspect, now), "driver": ref.driver, "pool": ref.pool, "device": ref.device}
    return rule_name(ref), json.dumps(doc, sort_keys=True)


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _read(name: str, ref: DeviceRef, doc: Any, kind: str) -> Mark:
    doc = doc if isinstance(doc, dict) else {}
    evidence = []
    for e in doc.get("evidence") or ():
        at = _time(e.get("at")) if isinstance(e, dict) else None
        if at is not None:
            evidence.append(FailedStart(str(e.get("namespace") or ""), str(e.get("vmi") or ""),
                                        str(e.get("uid") or ""), at, str(e.get("why") or "")))
    return Mark(name, ref, str(doc.get("node") or ""), str(doc.get("class") or ""),
                _time(doc.get("suspectedAt")), tuple(evidence), kind)


def _loads(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def parse_rule_mark(obj: Mapping[str, Any]) -> Mark | None:
    """The mark a DeviceTaintRule dict is, or None when it is not the binder's suspect rule
    (not labelled `gpu.cozystack.io/suspect`, or selecting no single device). Evidence
    that cannot be read is left out, never raised."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    sel = (obj.get("spec") or {}).get("deviceSelector") or {}
    if labels.get(SUSPECT_KEY) != "true" or not all(isinstance(sel.get(k), str) and sel.get(k)
                                                    for k in ("driver", "pool", "device")):
        return None
    doc = _loads((meta.get("annotations") or {}).get(SUSPECT_KEY))
    return _read(str(meta.get("name")), DeviceRef(sel["driver"], sel["pool"], sel["device"]), doc, KIND)


def parse_marks(configmap: Mapping[str, Any] | None) -> tuple[Mark, ...]:
    """The marks the ConfigMap `gpu-suspects` holds (entries that cannot be read left out),
    sorted by name."""
    out = []
    for key, text in sorted(((configmap or {}).get("data") or {}).items()):
        doc = _loads(text)
        if isinstance(doc, dict) and all(isinstance(doc.get(k), str) and doc.get(k)
                                         for k in ("driver", "pool", "device")):
            out.append(_read(key, DeviceRef(doc["driver"], doc["pool"], doc["device"]), doc, "ConfigMap"))
    return tuple(out)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def is_device_name(what: str) -> bool:
    """Whether `what` can name a mark as `find_mark` reads it: the rule's name (a DNS-1123
    subdomain, at most 253 characters), or "node/device", "pool/device",
    "driver/pool/device" (each part before the device a DNS-1123 subdomain of at most 253
    characters, the device a DNS-1123 label of at most 63, as DRA names devices). False for
    anything else: empty parts, more than two slashes, whitespace, capitals, too long. (A
    device of a pool whose own name has slashes, which DRA allows, is then named by
    "node/device", "pool/device" or the rule's name; the binder's pools are node names.)"""
    parts = what.split("/")
    if not 1 <= len(parts) <= 3:
        return False
    *where, last = parts
    if not where:
        return len(last) <= 253 and bool(DNS1123_SUBDOMAIN.fullmatch(last))
    return (all(len(p) <= 253 and DNS1123_SUBDOMAIN.fullmatch(p) for p in where)
            and bool(_DNS_LABEL.fullmatch(last)))


def find_mark(marks: tuple[Mark, ...], what: str) -> Mark | None:
    """The mark `what` names: its name, its device "driver/pool/device" or "pool/device", or
    "node/device" (the device's name on its node); None when none does."""
    for m in marks:
        d = m.device
        if what in (m.name, str(d), f"{d.pool}/{d.device}", f"{m.node}/{d.device}"):
            return m
    return None


__all__ = ["MANAGED_BY", "MARKS_CONFIGMAP", "Mark", "SUSPECT_EFFECT", "SUSPECT_KEY", "SUSPECT_TAINT",
           "SUSPECT_VALUE", "find_mark", "is_device_name", "mark_entry", "parse_marks", "parse_rule_mark", "rule_body",
           "rule_name"]
