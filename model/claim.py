"""The ResourceClaim of an admitted device-mode VMI and the VMI's wiring to it (docs/contract.md §3b
DR5, §4 W4/W5, §5 H1/H2/H4), as pure values: no I/O, no clock.

One claim per VMI, in its namespace, named `claim_name(vmi)` (`<vmi>-gpus`, shortened with a
hash past 253 characters), so a retried admission finds it (W4). It carries
`app.kubernetes.io/managed-by: gpu-binder`, the label `gpu.cozystack.io/claim-for` (the VMI's
name, shortened to a label value) and the annotation of the same key (the full name); the
admission that last made or confirmed it and when (`gpu.cozystack.io/admission`,
`gpu.cozystack.io/claimed-at`: housekeeping's clock starts there, H1).

Spec: one request per device, in the set's order (`gpu-0`, `gpu-1`, …: virt-launcher takes one
device per request), `exactly: {deviceClassName, allocationMode: ExactCount, count: 1,
selectors: [uuid == the recorded device's uuid]}` (CEL sees attributes, not device names: the
uuid, qualified by the recorded driver's domain, pins the device; the VMI's node pin picks the
node, since a passthrough GPU's uuid repeats across nodes), plus per class with a
`matchAttribute` one constraint on that class's requests with `{size}` resolved (DR3). When
the claim holds one class only, the constraint names no requests (Kubernetes: it then spans
every request of the claim; the same meaning, the shape NVIDIA's docs show).

A claim read back (the cache's informer at ingest, the webhook's live read) is parsed once
into a `Claim` (`parse_claim`), the one value every reader uses: the DRA index (its
allocation, DR2), housekeeping (H1/H2/H4) and the webhook (W4/W5).

Ownership (never adopt a claim we did not make): a claim of that name is ours only when it
carries our managed-by label and our claim-for annotation naming this VMI (`Claim.is_for`);
a tenant's claim of the name refuses the admission (`ClaimNameTaken`). Ours with the same
spec (`same_spec`) is found in place; ours with another spec (the devices were re-pointed)
is replaced, unless a Pod still holds it (`Claim.in_use`: `reservedFor`).

DR6: a live VMI the binder admitted whose claim someone deleted before its launcher Pod took
it gets the claim made again from the binder's record (`missing_claims`, `restorable_into`;
housekeeping carries it out).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Container, Iterable, Mapping, Sequence

import orjson

from model.admission import AdmissionPlan, wiring_patch
from model.device.dra import DeviceRef, qualify
from model.housekeeping import VMIRecord
from model.housekeeping_reasons import (ClaimOfReleasedKeep, ClaimUnused, HousekeepingReason,
                                        Rule)
from model.serialize import format_time
from model.reasons import DeviceUnrecorded, Reason
from model.snapshot import Snapshot
from model.device.match import MatchAttribute
from model.device.topology import resolve_attribute
from model.types import GPUClass, GPUDevice, Phase, Result

RESOURCE_API = "resource.k8s.io/v1"
CLAIM_SUFFIX = "-gpus"
MAX_NAME = 253
MAX_LABEL_VALUE = 63
VMI_CLAIM_ENTRY = "gpu-binder"
"""The name of the claim in the VMI (`spec.resourceClaims[].name`, `gpus[].claimName`); the
launcher Pod's claim entry carries it too."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-binder"
CLAIM_FOR = "gpu.cozystack.io/claim-for"
"""Label (the VMI's name as a label value) and annotation (the full name) of a claim we made."""
CLAIM_ADMISSION = "gpu.cozystack.io/admission"
"""Annotation: the admission id that last made or confirmed the claim (W4)."""
CLAIMED_AT = "gpu.cozystack.io/claimed-at"
"""Annotation: when that admission made or confirmed it (RFC 3339 UTC; H1's clock)."""
UUID_ATTRIBUTE = "uuid"
"""The attribute id pinning a device (NVIDIA's driver publishes `uuid` per GPU)."""
ALLOCATION_MODE = "ExactCount"
_SAFE_VALUE = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")


def _shorten(name: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:limit - 11].rstrip('-.')}-{digest}"


def claim_name(vmi: str) -> str:
    """The claim's deterministic name for VMI `vmi` (W4): `<vmi>-gpus`, shortened with a hash
    of it when over 253 characters."""
    return _shorten(vmi + CLAIM_SUFFIX, MAX_NAME)


def claim_for_label(vmi: str) -> str:
    """The `gpu.cozystack.io/claim-for` label value naming `vmi` (shortened with a hash past 63
    characters; the annotation carries the full name)."""
    return _shorten(vmi, MAX_LABEL_VALUE)


def request_name(index: int) -> str:
    """The claim request of the set's `index`-th device (0-based)."""
    return f"gpu-{index}"


@dataclass(frozen=True, slots=True)
class ClaimMember:
    """One device of the set in its claim: the GPUDevice's `device` name, its class, the
    recorded device (`ref`, `status.device`) and that device's `uuid` on the node."""

    device: str
    gpu_class: GPUClass
    ref: DeviceRef
    uuid: str


def uuid_selector(driver: str, uuid: str) -> str:
    """The CEL selector pinning the device whose `uuid` attribute (in `driver`'s domain) is
    `uuid`. Raises ValueError for a uuid that is not a plain token (letters, digits, `._:-`):
    it is put into CEL source."""
    if not _SAFE_VALUE.match(uuid):
        raise ValueError(f"uuid {uuid!r} is not a plain token")
    domain = qualify(driver, UUID_ATTRIBUTE).rpartition("/")[0]
    return f'device.attributes["{domain}"].{UUID_ATTRIBUTE} == "{uuid}"'


def members_of(snap: Snapshot, plan: AdmissionPlan, node: str) -> tuple[ClaimMember, ...] | Reason | None:
    """DR5: the set's members for its claim, in the plan's order, read from `snap` after the
    binder answered Succeeded on `node`: each device-mode member's recorded device
    (`status.device`, Bound on `node`) and its uuid among the node's devices of its class.
    None when no member is of a device-mode class (count mode: no claim); a `DeviceUnrecorded`
    reason when a member has no record there yet, or the record names a device the node's
    slices do not list with a uuid (retryable: the cache is behind, or the device vanished).
    A set never mixes modes (W1 refuses it), so every member is then of device mode."""
    members: list[ClaimMember] = []
    for name in plan.devices:
        dev = snap.device(plan.namespace, name)
        cls = snap.classes.get(dev.class_name) if dev is not None else None
        if cls is None or cls.name not in snap.mode.device_classes:
            continue
        st = dev.status
        ref = st.device
        if ref is None or st.phase is not Phase.BOUND or st.node_name != node:
            return DeviceUnrecorded(name, node, None)
        n = snap.nodes.get(node)
        found = next((d for d in (n.devices_of(cls.name) if n else ()) if d.ref == ref), None)
        uuid = dict(found.attributes).get(qualify(ref.driver, UUID_ATTRIBUTE)) if found else None
        if not isinstance(uuid, str) or not _SAFE_VALUE.match(uuid):
            return DeviceUnrecorded(name, node, str(ref))
        members.append(ClaimMember(name, cls, ref, uuid))
    return tuple(members) if members else None  # each device-mode member is in, or returned


def claim_spec(members: Sequence[ClaimMember]) -> dict[str, Any]:
    """The claim's `spec` for `members` (see the module docstring)."""
    requests = []
    by_class: dict[str, list[str]] = {}
    classes: dict[str, GPUClass] = {}
    for i, m in enumerate(members):
        req = request_name(i)
        requests.append({"name": req, "exactly": {
            "deviceClassName": m.gpu_class.device_class_name, "allocationMode": ALLOCATION_MODE,
            "count": 1, "selectors": [{"cel": {"expression": uuid_selector(m.ref.driver, m.uuid)}}]}})
        by_class.setdefault(m.gpu_class.name, []).append(req)
        classes[m.gpu_class.name] = m.gpu_class
    constraints = []
    for name in sorted(by_class):
        match = MatchAttribute.of(classes[name].match_attribute)
        attribute = resolve_attribute(match, len(by_class[name]))
        if attribute is None:
            continue
        c: dict[str, Any] = {"matchAttribute": attribute}
        if len(by_class) > 1:
            c = {"requests": by_class[name], **c}
        constraints.append(c)
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}


def build_claim(namespace: str, vmi: str, members: Sequence[ClaimMember], admission: str,
                now: datetime) -> dict[str, Any]:
    """The ResourceClaim (resource.k8s.io/v1) of VMI `namespace/vmi` for `members`, made or
    confirmed by `admission` at `now` (aware UTC)."""
    return {"apiVersion": RESOURCE_API, "kind": "ResourceClaim",
            "metadata": {"name": claim_name(vmi), "namespace": namespace,
                         "labels": {MANAGED_BY_LABEL: MANAGED_BY, CLAIM_FOR: claim_for_label(vmi)},
                         "annotations": {CLAIM_FOR: vmi, CLAIM_ADMISSION: admission,
                                         CLAIMED_AT: format_time(now)}},
            "spec": claim_spec(members)}


# -- a claim read back: parsed once ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim (resource.k8s.io/v1) as the binder reads it, parsed once
    (`parse_claim`): by the cache's informer at ingest, by the webhook from a live read. Any
    claim, ours or not.

    `managed`: it carries our managed-by label (a set's own claim, not a foreign consumer of
    its recorded devices: DR2; a tenant may copy the label onto a claim of its own, so a
    VMI's claim is ours only with `vmi` naming it too: `is_for`). `vmi` and `admission`: our
    claim-for and admission annotations (None when absent or empty). `since`: when it was
    made or last confirmed (the claimed-at annotation, else its creation; aware UTC; None
    when neither reads). `deleting`: a deletionTimestamp is set (a finalizer holds it).
    `in_use`: a Pod holds it (`status.reservedFor` lists one). `allocated`: the devices its
    `status.allocation` lists, in order (DR2: server-side truth, a tenant cannot write it;
    empty when not allocated); `problem`: why they cannot be read (a result lacking its
    driver, pool or device; `allocated` is then empty). `spec_digest`: the spec in canonical
    form, hashed (`same_spec`; the cache keeps no spec: the webhook reads a claim it made
    live)."""

    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    managed: bool = False
    vmi: str | None = None
    admission: str | None = None
    since: datetime | None = None
    deleting: bool = False
    in_use: bool = False
    allocated: tuple[DeviceRef, ...] = ()
    problem: str | None = None
    spec_digest: str = ""

    def is_for(self, vmi: str) -> bool:
        """Whether this is a claim the binder made for VMI `vmi`: our managed-by label and our
        claim-for annotation naming `vmi` (a tenant's claim of the same name is never
        adopted)."""
        return self.managed and self.vmi == vmi


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _since(*values: Any) -> datetime | None:
    """The first of `values` that reads as an aware RFC 3339 time, in UTC; None if none."""
    for value in values:
        if isinstance(value, str):
            try:
                when = datetime.fromisoformat(value)
            except ValueError:
                continue
            if when.tzinfo is not None:
                return when.astimezone(timezone.utc)
    return None


def _allocated(name: str, status: Mapping[str, Any]) -> tuple[tuple[DeviceRef, ...], str | None]:
    """The devices `status.allocation.devices.results[]{driver, pool, device}` lists, or
    ((), the problem) when a result lacks one of them. Results that are not objects are
    skipped."""
    results = _mapping(_mapping(status.get("allocation")).get("devices")).get("results") or ()
    refs = []
    for r in results if isinstance(results, (list, tuple)) else ():
        if not isinstance(r, Mapping):
            continue
        if not all(isinstance(r.get(k), str) and r.get(k) for k in ("driver", "pool", "device")):
            return (), (f"ResourceClaim {name}: an allocation result lacks driver, pool or "
                        f"device: {dict(r)}")
        refs.append(DeviceRef(r["driver"], r["pool"], r["device"]))
    return tuple(refs), None


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    """A `resource.k8s.io/v1` ResourceClaim dict as a `Claim`. Never raises: a field missing
    or of another type reads as absent (the API server guarantees the shapes), an unreadable
    allocation is the claim's `problem`. The one place that reads a claim's labels,
    annotations, status and spec (the managed-by test included)."""
    meta = _mapping(obj.get("metadata"))
    labels = _mapping(meta.get("labels"))
    ann = _mapping(meta.get("annotations"))
    name = str(meta.get("name") or "")
    status = _mapping(obj.get("status"))
    allocated, problem = _allocated(name or "?", status)
    return Claim(namespace=str(meta.get("namespace") or ""), name=name,
                 uid=str(meta.get("uid") or ""),
                 resource_version=str(meta.get("resourceVersion") or ""),
                 managed=labels.get(MANAGED_BY_LABEL) == MANAGED_BY,
                 vmi=_text(ann.get(CLAIM_FOR)), admission=_text(ann.get(CLAIM_ADMISSION)),
                 since=_since(ann.get(CLAIMED_AT), meta.get("creationTimestamp")),
                 deleting=bool(meta.get("deletionTimestamp")),
                 in_use=bool(status.get("reservedFor")),
                 allocated=allocated, problem=problem,
                 spec_digest=spec_digest(obj.get("spec")))


_SHARED_FIELDS = tuple(f.name for f in fields(Claim))


def shared_with(new: Claim, old: Claim | None) -> Claim:
    """`new` with each field that equals `old`'s taken from `old` (the same value, one copy:
    its strings, resourceVersion included, which a relist repeats; the claimed-at time; the
    `allocated` tuple): what was built from `old` (the DRA index keeps its devices while they
    are equal) then holds nothing `new` repeats. A field that differs stays `new`'s own
    object; the result equals `new`. `new` itself when `old` is None or no equal field is
    another object."""
    if old is None:
        return new
    same = {f: getattr(old, f) for f in _SHARED_FIELDS
            if getattr(new, f) is not getattr(old, f) and getattr(new, f) == getattr(old, f)}
    return replace(new, **same) if same else new


def stamp_ops(claim: Claim, admission: str, now: datetime) -> list[dict[str, Any]]:
    """W4: the JSON Patch confirming `claim` (ours, same spec) for `admission` at `now`: a
    `test` of its resourceVersion as read, then both annotations (H1's clock restarts)."""
    return [{"op": "test", "path": "/metadata/resourceVersion",
             "value": claim.resource_version},
            {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1admission",
             "value": admission},
            {"op": "add", "path": "/metadata/annotations/gpu.cozystack.io~1claimed-at",
             "value": format_time(now)}]


def _normal(spec: Any) -> Any:
    """`spec` with the defaults the API server fills in for an exact request (allocationMode
    ExactCount, count 1) made explicit, so a stored spec compares equal to the one built."""
    if not isinstance(spec, Mapping):
        return spec
    devices = spec.get("devices") if isinstance(spec.get("devices"), Mapping) else {}
    requests = []
    for r in devices.get("requests") or []:
        if isinstance(r, Mapping) and isinstance(r.get("exactly"), Mapping):
            ex = {"allocationMode": ALLOCATION_MODE, "count": 1, **r["exactly"]}
            r = {**r, "exactly": ex}
        requests.append(r)
    out = {**spec, "devices": {**devices, "requests": requests}}
    if not out["devices"].get("constraints"):
        out["devices"].pop("constraints", None)
    return out


def spec_digest(spec: Any) -> str:
    """A claim `spec`'s digest: SHA-256 of its canonical JSON (keys sorted) once the server's
    defaults are made explicit (`_normal`), so a stored spec and the one built for the same
    devices have the same digest. Never raises: a value JSON cannot hold reads as its
    `repr` (orjson: the cache digests every claim it ingests)."""
    normal = _normal(spec)
    try:
        text = orjson.dumps(normal, default=repr,
                            option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # e.g. an integer past 64 bits
        text = repr(normal).encode()
    return hashlib.sha256(text).hexdigest()


def same_spec(claim: Claim, spec: Mapping[str, Any]) -> bool:
    """Whether `claim`'s spec is `spec` (server defaults aside)."""
    return claim.spec_digest == spec_digest(spec)


# -- the VMI's wiring (DR5) -------------------------------------------------------------------

def gpu_entries(members: Sequence[ClaimMember]) -> list[dict[str, str]]:
    """The VMI's `spec.domain.devices.gpus` entries of the claim: one per device, named by the
    GPUDevice, taking the request of its index."""
    return [{"name": m.device, "claimName": VMI_CLAIM_ENTRY, "requestName": request_name(i)}
            for i, m in enumerate(members)]


def claim_entry(vmi: str) -> dict[str, str]:
    """The VMI's `spec.resourceClaims` entry of its claim."""
    return {"name": VMI_CLAIM_ENTRY, "resourceClaimName": claim_name(vmi)}


def claim_vmi_patch(vmi_obj: Mapping[str, Any], vmi: str, members: Sequence[ClaimMember],
                    node: str, effective_resources: Sequence[str],
                    admission: str | None = None) -> list[dict]:
    """DR5: the JSONPatch admitting a device-mode VMI on `node`: `spec.resourceClaims` gains
    the claim's entry (replacing one of that name), `gpus` one entry per device taking its
    request (replacing entries of the same device name, entries of the claim's name and
    entries naming a count-mode GPU resource of `effective_resources`; the VMI's others
    stay), the node pin and the admission annotation (as `model.admission.vmi_patch`)."""
    names = {m.device for m in members}
    effective = set(effective_resources)

    def replaced(g: Mapping) -> bool:
        return (g.get("name") in names or g.get("claimName") == VMI_CLAIM_ENTRY
                or g.get("deviceName") in effective)
    return wiring_patch(vmi_obj, gpu_entries(members), replaced, node, admission,
                        claim_entry(vmi))


# -- housekeeping (H1, H2, H4) ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim the binder made, as housekeeping judges it: where, its `uid` and
    `resource_version` (delete preconditions), the VMI it is for, since when it counts
    (`since`: its claimed-at annotation, else its creation) and the admission that last made
    or confirmed it (`admission`, its annotation; H4 matches it against a released keep)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    vmi: str
    since: datetime | None
    deleting: bool = False
    admission: str | None = None


def claim_record(claim: Claim) -> ClaimRecord | None:
    """`claim` as a ClaimRecord when it is one the binder made (managed-by label and a
    claim-for annotation), else None (never judged, never deleted)."""
    if not claim.managed or claim.vmi is None:
        return None
    return ClaimRecord(claim.namespace, claim.name, claim.uid, claim.resource_version,
                       claim.vmi, claim.since, claim.deleting, claim.admission)


@dataclass(frozen=True, slots=True)
class DeleteClaim:
    """H1/H2 (or H4: its kept set released): delete `claim` (uid and resourceVersion
    preconditions; the VMI read live first)."""

    claim: ClaimRecord
    rule: Rule
    reason: HousekeepingReason


def stale_claims(claims: Iterable[ClaimRecord], attached: Iterable[tuple[str, str]],
                 live: Iterable[tuple[str, str]], now: datetime,
                 grace: timedelta, released: Iterable[tuple[str, str]] = ()) -> list[DeleteClaim]:
    """H1/H2 for claims the binder made: a claim is deleted when no VMI of its name exists
    (`live`: (namespace, name) keys), no GPUDevice is attached to that VMI name (`attached`:
    an admission in flight, a set kept for its VM (H4), or a set housekeeping has not released
    yet keeps it) and it was made or last confirmed more than `grace` ago (H1: the VMI never
    appeared; H2: it is gone). A claim already being deleted is left alone. Sorted by
    (namespace, name). Pure; `now` is aware UTC.

    H4: the claim of a kept set stays with the set (its devices are attached, kept for the
    VM) and is confirmed in place by the VM's next VMI. Once housekeeping released that keep
    (the VM deleted, or keepSetFor ran out), the claim goes with it without the grace:
    `released` lists (namespace, admission id) of released keeps, and a claim last made or
    confirmed by one of them (`ClaimRecord.admission`) is deleted as soon as no VMI of its
    name exists and no device is attached to it. A newer admission that confirmed the claim
    since changed its annotation: the grace applies again."""
    held = set(attached) | set(live)
    done = set(released)
    out = []
    for c in sorted(claims, key=lambda c: (c.namespace, c.name)):
        if c.deleting or (c.namespace, c.vmi) in held:
            continue
        if c.admission is not None and (c.namespace, c.admission) in done:
            out.append(DeleteClaim(c, Rule.H4, ClaimOfReleasedKeep(c.vmi)))
            continue
        if c.since is None:
            continue
        age = now - c.since
        if age > grace:
            out.append(DeleteClaim(c, Rule.H1_H2, ClaimUnused(c.vmi, int(age.total_seconds()))))
    return out


# -- DR6: the claim of an admitted VMI, made again from the record -------------------------

@dataclass(frozen=True, slots=True)
class RestoreClaim:
    """DR6: VMI `namespace/vmi` (its `uid`, the `admission` that admitted it) exists, its set
    is on the binder's record (every device attached by that admission, its request Succeeded
    and the device Bound on `node`; `devices` in the request's order, which is the claim's
    request order), and no claim of its name exists: someone deleted the binder's claim
    before the launcher Pod took it. Housekeeping makes it again from the record."""

    namespace: str
    vmi: str
    uid: str
    admission: str
    node: str
    devices: tuple[str, ...]


def missing_claims(devices: Iterable[GPUDevice], live: Mapping[tuple[str, str], VMIRecord],
                   claims: Container[tuple[str, str]],
                   device_classes: Container[str]) -> list[RestoreClaim]:
    """DR6 for the live VMIs the binder admitted (`live` with an admission annotation): those
    whose set is recorded whole (see `RestoreClaim`) with a member of one of `device_classes` (names),
    and no claim named `claim_name(vmi)` in `claims` ((namespace, name) of every claim the
    cache has, ours or not: a claim of the name that is not ours is never replaced). A set
    whose attachments, request or records disagree (an admission or housekeeping half-way) is
    left out: nothing is made from a record that does not hold. Sorted by (namespace, VMI).
    A device without `status.device` (count mode, or a record not written yet) is skipped
    before anything else is read of it: a set with such a member is left out anyway (its
    members must all be recorded), and housekeeping walks every device each round. Pure."""
    by_vmi: dict[tuple[str, str], list[GPUDevice]] = {}
    for d in devices:
        st = d.status
        if st.device is None:
            continue
        att = st.attached_to
        if att is not None and att.admission:
            by_vmi.setdefault((d.namespace, att.vmi), []).append(d)
    out = []
    for key in sorted(by_vmi):
        rec = live.get(key)
        if rec is None or not rec.admission or (key[0], claim_name(key[1])) in claims:
            continue
        members = [d for d in by_vmi[key] if d.status.attached_to.admission == rec.admission]
        brs = {d.status.bind_request for d in members}
        br = next(iter(brs)) if len(brs) == 1 else None
        if br is None or br.result is not Result.SUCCEEDED or br.vmi != key[1] or not br.node \
                or set(br.devices) != {d.name for d in members} \
                or any(d.bound_node != br.node or d.status.device is None for d in members) \
                or not any(d.class_name in device_classes for d in members):
            continue
        out.append(RestoreClaim(key[0], key[1], rec.uid, rec.admission, br.node, br.devices))
    return out


def restorable_into(vmi_raw: Mapping[str, Any], restore: RestoreClaim,
                    members: Sequence[ClaimMember]) -> str | None:
    """Why VMI `vmi_raw` (read live) must not get its claim made again for `members`, None
    when it may: it is another incarnation than `restore` names, it is being deleted or has
    finished (its Pod is done with the claim), or its own wiring (`spec.resourceClaims`, the
    `gpus` entries of the claim) is not the one `members` give (DR5): a claim made then would
    not be the one the launcher Pod asks for."""
    meta = vmi_raw.get("metadata") if isinstance(vmi_raw.get("metadata"), Mapping) else {}
    if meta.get("uid") != restore.uid:
        return "another incarnation of the VMI"
    if meta.get("deletionTimestamp"):
        return "the VMI is being deleted"
    phase = (vmi_raw.get("status") or {}).get("phase") if isinstance(vmi_raw.get("status"), Mapping) else None
    if phase in ("Succeeded", "Failed"):
        return f"the VMI has finished ({phase})"
    spec = vmi_raw.get("spec") if isinstance(vmi_raw.get("spec"), Mapping) else {}
    if claim_entry(restore.vmi) not in (spec.get("resourceClaims") or []):
        return "the VMI does not name the claim"
    gpus = (((spec.get("domain") or {}).get("devices") or {}).get("gpus") or [])
    wired = sorted((g.get("name"), g.get("requestName")) for g in gpus
                   if isinstance(g, Mapping) and g.get("claimName") == VMI_CLAIM_ENTRY)
    want = sorted((g["name"], g["requestName"]) for g in gpu_entries(members))
    if wired != want:
        return "the VMI's gpus entries are not the record's"
    return None
