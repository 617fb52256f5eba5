"""The steps of one admission on the API server (docs/contract.md §4: W1's live read, W3 (1)–(4),
W4's take-over, W5's clean-up), one small function each, called in order by
`k8s.webhook.admission`.

Every write uses field manager `gpu-binder-webhook` and optimistic concurrency (a JSON Patch
`test` of what was read). A step that finds a reason to refuse raises `Denied` carrying a
typed reason (`model.reasons`, rendered there: the steps build no English of their own);
API failures surface as `k8s.errors.ApiError`, which `api_denial` types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Awaitable, Callable, Mapping, Sequence

import anyio
import structlog
from k8s import errors
from k8s.client import GPU_DEVICES, RESOURCE_CLAIMS, VMIS, KubeClient, Resource
from k8s.webhook.review import Denial, reason_denial
from k8s.webhook.waiter import ResultWaiter
from model.admission import AdmissionPlan, attachment_is_live, effective_resources, vmi_patch
from model.claim import (Claim, ClaimMember, build_claim, claim_vmi_patch, members_of,
                         parse_claim, same_spec, stamp_ops)
from model.housekeeping import VMIs
from model.nominate import nominated_refusal
from model.nomination import nomination_name
from model.line import RETRY_AFTER as LINE_RETRY_AFTER
from model.line_plan import LINE_CODES
from model.retry_after import RETRY_STEP, preemptor_retry_after
from model.parse import ParseError, parse_gpu_device
from model.serialize import device_status_to_dict, format_time
from model.reasons import (ApiForbidden, ApiInvalid, ApiThrottled, ApiUnavailable, AttachmentRefused,
                           BinderRefused, ClaimBeingDeleted, Code, ClaimInUse, ClaimNameTaken,
                           ClaimOverQuota, DeviceAttached, DeviceBeingDeleted, DeviceDeleted,
                           DeviceDisappeared, DeviceKeptChanging, DeviceMalformed, NameUnconfirmed,
                           NotBoundInTime, Reason, SameNameConflict, VmiExists)
from model.snapshot import Snapshot
from model.types import (GROUP, TEMPLATE_FOR_LABEL, VERSION, BindRequest, DeviceStatus, Labels, Phase, Result,
                         Toleration)

log = structlog.get_logger("gpu_binder.admission")

FIELD_MANAGER = "gpu-binder-webhook"
STEP_PARALLEL = 8
"""Devices of one set written at once in a step of W3 (templates, attachments, requests)."""
ATTACH_TRIES = 5
"""Reads of one device before `attach` gives up on a device that keeps changing."""
CLAIM_TRIES = 3
"""Creates of the claim before `ensure_claim` gives up on a name that keeps changing."""


class Denied(Exception):
    """A step found a reason to refuse: `Denied(reason)` with a typed `model.reasons.Reason`
    (or a `review.Denial` already made). `reason` is the reason (None when built from a
    Denial), `denial` what the user sees (the reason's category and its rendered text),
    `str()` its message."""

    def __init__(self, reason: Reason | Denial) -> None:
        self.reason = reason if isinstance(reason, Reason) else None
        self.denial = reason if isinstance(reason, Denial) else reason_denial(reason)
        super().__init__(self.denial.message)

    @classmethod
    def of(cls, denial: Denial) -> "Denied":
        """The exception carrying `denial`."""
        return cls(denial)


def api_reason(err: errors.ApiError) -> Reason:
    """Why an API call of the steps failed, typed: the API server refusing the write as
    invalid (something of the VMI the GPUDevice schema does not take) `ApiInvalid` (422),
    throttling `ApiThrottled` (429), the webhook's own RBAC `ApiForbidden` (500: the
    operator must fix it), anything else (5xx, timeouts, a broken connection, conflicts)
    `ApiUnavailable` (503)."""
    if isinstance(err, errors.Invalid):
        return ApiInvalid(str(err))
    if isinstance(err, errors.TooManyRequests):
        return ApiThrottled(str(err))
    if isinstance(err, errors.Forbidden):
        return ApiForbidden(str(err))
    return ApiUnavailable(str(err))


def api_denial(err: errors.ApiError) -> Denial:
    """The denial for an API call of the steps that failed (`api_reason`, rendered)."""
    return reason_denial(api_reason(err))


class Api:
    """The API calls of the steps, on GPUDevices (namespaced, group `gpu.cozystack.io`), VMIs
    and Events, over `client` (`k8s.client.KubeClient`, whose timeout bounds each call;
    writes carry field manager `gpu-binder-webhook`); each raises `errors.ApiError`."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client.using(field_manager=FIELD_MANAGER)
        self.timeout = client.timeout

    async def get_device(self, ns: str, name: str) -> dict | None:
        """The device as the API server has it now; None when it does not exist."""
        try:
            return await self.client.get(GPU_DEVICES, ns, name)
        except errors.NotFound:
            return None

    async def patch_status(self, ns: str, name: str, ops: list[dict]) -> None:
        """A JSON Patch (RFC 6902) of the device's status; a failed `test` op raises
        errors.Invalid."""
        await self.client.patch_status(GPU_DEVICES, ns, name, ops,
                                       what=f"patch GPUDevice {ns}/{name}")

    async def _create_if_absent(self, resource: Resource, ns: str, body: dict, what: str) -> bool:
        """Create `body` in `ns`; False when an object of its name already exists (a retried
        admission finds its own, W4)."""
        try:
            await self.client.create(resource, ns, body,
                                     what=f"create {what} {ns}/{body['metadata']['name']}")
            return True
        except errors.AlreadyExists:
            return False

    async def create_device(self, ns: str, body: dict) -> dict | None:
        """Create a GPUDevice: the object created (its resourceVersion the one a following
        write tests), or None when one of that name already exists."""
        try:
            return await self.client.create(GPU_DEVICES, ns, body,
                                            what=f"create template GPUDevice {ns}/{body['metadata']['name']}")
        except errors.AlreadyExists:
            return None

    async def delete_device(self, ns: str, name: str, uid: str, resource_version: str) -> None:
        """Delete the device if it is still the object read (uid and resourceVersion
        preconditions: a 409 otherwise)."""
        await self.client.delete(GPU_DEVICES, ns, name, uid=uid,
                                 resource_version=resource_version)

    async def vmi_exists(self, ns: str, name: str) -> bool:
        """Whether the API server has VMI `ns/name` now (a live read). Raises
        errors.ApiError when it cannot tell (a 404 that is not about this VMI included)."""
        try:
            await self.client.get(VMIS, ns, name)
            return True
        except errors.NotFound as err:
            if err.names(name):
                return False
            raise

    async def create_event(self, ns: str, body: dict) -> None:
        """Create an Event in `ns`."""
        await self.client.create_event(ns, body)

    async def get_claim(self, ns: str, name: str) -> Claim | None:
        """ResourceClaim `ns/name` as the API server has it now (`model.claim.parse_claim`);
        None when it does not exist."""
        try:
            return parse_claim(await self.client.get(RESOURCE_CLAIMS, ns, name))
        except errors.NotFound as err:
            if err.names(name):
                return None
            raise

    async def create_claim(self, ns: str, body: dict) -> bool:
        """Create a ResourceClaim; False when one of that name already exists (DR5)."""
        return await self._create_if_absent(RESOURCE_CLAIMS, ns, body, "ResourceClaim")

    async def patch_claim(self, ns: str, name: str, ops: list[dict]) -> None:
        """A JSON Patch of the claim's metadata (a failed `test` op raises errors.Invalid)."""
        await self.client.patch(RESOURCE_CLAIMS, ns, name, ops,
                                what=f"patch ResourceClaim {ns}/{name}")

    async def delete_claim(self, ns: str, name: str, uid: str, resource_version: str) -> None:
        """Delete the claim if it is still the object read (uid and resourceVersion
        preconditions: a 409 otherwise)."""
        await self.client.delete(RESOURCE_CLAIMS, ns, name, uid=uid,
                                 resource_version=resource_version,
                                 what=f"delete ResourceClaim {ns}/{name}")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One admission call: the VMI `namespace/vmi`, `admission` (this call's own id: it keys
    the attachments this call writes and is the id of its bind request), `since` (the
    attachments' time), `vmis` (the cache's VMIs, without this one), `grace`
    (attachmentGrace) and `now` (aware UTC time)."""

    namespace: str
    vmi: str
    admission: str
    since: datetime
    vmis: VMIs
    grace: timedelta
    now: Callable[[], datetime]
    owner: str | None = None
    """H4: the uid of the VirtualMachine owning the VMI (`model.admission.vm_owner`)."""
    deadline: float = math.inf
    """The review's deadline (loop time, `anyio.current_time`): every wait of the steps ends
    by it."""

    def attachment(self) -> dict[str, str]:
        """The `attachedTo` this call writes (with `owner`, H4, when the VMI has one)."""
        out = {"vmi": self.vmi, "since": format_time(self.since), "admission": self.admission}
        if self.owner:
            out["owner"] = self.owner
        return out


@dataclass
class Written:
    """What this call may have written, recorded *before* each write is awaited, so a
    cancellation after the server applied it still cleans it up (W5): the template devices
    it `created`, the devices it `attached`, the `claim` it created."""

    created: list[str] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)
    claim: str | None = None
    """The ResourceClaim this call created (DR5), set before the create is awaited."""
    made: dict[str, dict] = field(default_factory=dict)
    """The template devices this call created, by name, as the create returned them: W3 (2)
    writes each on that object (its resourceVersion tested) instead of reading it again."""


# -- W1: the live read ------------------------------------------------------------------

async def check_name_free(api: Api, ns: str, vmi: str) -> None:
    """W1: the API server refuses a duplicate name only after admission, so a create of a
    live name is denied here (POLICY), before any write could move, re-pin or strip that
    VMI's devices. UNAVAILABLE when the API server cannot tell (fail closed)."""
    try:
        exists = await api.vmi_exists(ns, vmi)
    except errors.ApiError as err:
        raise Denied(NameUnconfirmed(ns, vmi, err.message[:200])) from err
    if exists:
        raise Denied(VmiExists(ns, vmi))


# -- W4: take over an admitted set ------------------------------------------------------

async def take_over(api: Api, attempt: Attempt, plan: AdmissionPlan, snap: Snapshot) -> bool:
    """W4: every device already carries a Succeeded request for this VMI name on one node;
    re-key each attachment to this admission (compare-and-set on the request and the
    attachment as read), so housekeeping judging an older incarnation of the name cannot
    clear it afterwards. No new request, nothing moves. False (and whatever was re-keyed
    left to this admission's VMI or to housekeeping) when a device changed or a write
    failed."""
    async def one(name: str) -> None:
        dev = snap.device(attempt.namespace, name)
        att, br = dev.status.attached_to, dev.status.bind_request
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/status/bindRequest/id", "value": br.id},
            {"op": "test", "path": "/status/attachedTo/vmi", "value": attempt.vmi}]
        if att.admission:  # the attachment as read, not one written since
            ops.append({"op": "test", "path": "/status/attachedTo/admission",
                        "value": att.admission})
        else:
            ops.append({"op": "test", "path": "/status/attachedTo/since",
                        "value": format_time(att.since)})
        ops.append({"op": "replace", "path": "/status/attachedTo", "value": attempt.attachment()})
        await api.patch_status(attempt.namespace, name, ops)
    try:
        await each(one, plan.devices)
        return True
    except (Denied, errors.ApiError) as exc:
        log.info("W4 take-over failed; admitting afresh", error=str(exc)[:200])
        return False


# -- W3 (1): templates ------------------------------------------------------------------

async def create_template(api: Api, ns: str, vmi: str, name: str, class_name: str) -> dict | None:
    """W3 (1): create template device `name` of `class_name` for `vmi`; the object created,
    or None when it already existed (a retry of ours made it: found in place, W4). No wait
    for the informer: the attachment is written on the object the create returned (its
    resourceVersion tested), and the informer delivers the create before that write to every
    watcher. Raises errors.ApiError."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUDevice",
            "metadata": {"name": name, "namespace": ns, "labels": {TEMPLATE_FOR_LABEL: vmi}},
            "spec": {"class": class_name}}
    return await api.create_device(ns, body)


async def create_templates(api: Api, attempt: Attempt,
                           templates: Sequence[tuple[str, str]], written: Written) -> None:
    """W3 (1): every template (name, class) of the plan is created (AlreadyExists: found in
    place), never skipped on the cache's word: housekeeping may just have deleted an older
    incarnation's. Each is recorded in `written.created` before its write, and removed when
    it was found in place; each made is kept in `written.made` for W3 (2)."""
    written.created.extend(name for name, _ in templates)

    async def one(item: tuple[str, str]) -> None:
        made = await create_template(api, attempt.namespace, attempt.vmi, *item)
        if made is None:
            written.created.remove(item[0])
        else:
            written.made[item[0]] = made
    await each(one, list(templates))


# -- W3 (2) and (3): attachment and request in one write per device ---------------------

def request_body(attempt: Attempt, plan: AdmissionPlan, selector: Labels,
                 tolerations: tuple[Toleration, ...]) -> dict:
    """W3 (3): the one `bindRequest` every device of the set carries: id (the admission),
    vmi, devices, requestedAt (now), the VMI's launcher nodeSelector and tolerations,
    which the binder judges nodes against (B3), and the set's priority as resolved at
    admission (P1: priority, preemptionPolicy, priorityClassName; omitted when it is the
    default, as `model.serialize.device_status_to_dict` writes it). Tenants cannot write the
    status subresource, so the recorded priority is the binder's from then on."""
    br = BindRequest(attempt.admission, attempt.vmi, tuple(plan.devices), attempt.now(),
                     selector, tolerations=tolerations, priority=plan.priority)
    return device_status_to_dict(DeviceStatus(Phase.PENDING, bind_request=br))["bindRequest"]


def _judge_read(raw: dict, name: str, attempt: Attempt, request: Mapping[str, Any]) -> bool:
    """The device just read (never the possibly older cache), judged for `attach`: True when
    it carries both this admission's attachment and its request (a retry of this write: done);
    False when the write should go on (no attachment, one that no longer holds, or this
    admission's attachment beside another request: a W4 take-over that re-keyed it before
    another member changed, so the request must still go on). Raises Denied."""
    try:
        dev = parse_gpu_device(raw)
    except ParseError as exc:
        raise Denied(DeviceMalformed(name, str(exc))) from exc
    if dev.deleting:
        raise Denied(DeviceBeingDeleted(name))
    att, br = dev.status.attached_to, dev.status.bind_request
    if att is not None and att.admission == attempt.admission:
        return br is not None and br.id == request["id"]
    if att is not None and att.kept_until is not None and att.vmi == attempt.vmi \
            and attempt.owner and att.owner == attempt.owner:
        return False  # H4: kept for the VM that owns this VMI: it takes the set
    if att is not None and attachment_is_live(dev, attempt.vmis, attempt.now(), attempt.grace):
        if att.vmi == attempt.vmi:
            raise Denied(SameNameConflict(name, attempt.namespace, attempt.vmi))
        raise Denied(DeviceAttached(name, att.vmi))
    return False


def attach_ops(raw: dict, attempt: Attempt, request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The optimistic write of W3 (2) and (3) on the device `raw` as read: a `test` of its
    resourceVersion, then `attachedTo` and `bindRequest` (`add` replaces: no older field
    stays); a new template device with no status yet gets the whole status."""
    attachment = attempt.attachment()
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                  "value": raw["metadata"]["resourceVersion"]}]
    if isinstance(raw.get("status"), dict):
        ops += [{"op": "add", "path": "/status/attachedTo", "value": attachment},
                {"op": "add", "path": "/status/bindRequest", "value": dict(request)}]
    else:
        ops.append({"op": "add", "path": "/status",
                    "value": {"attachedTo": attachment, "bindRequest": dict(request)}})
    return ops


async def attach(api: Api, attempt: Attempt, request: Mapping[str, Any], name: str,
                 template_class: str | None, written: Written) -> None:
    """W3 (2) and (3) in one write on device `name`: `attachedTo` {vmi, since, admission}
    and the `bindRequest` `request`, with optimistic concurrency, judged on the object just
    read (`_judge_read`), or first on the object this call's create returned
    (`written.made`: nothing can be newer but a write since, which the resourceVersion test
    catches). A version test that failed, a conflict or a vanished object is re-read and
    re-judged, at most `ATTACH_TRIES` times; a write refused on an unchanged object is
    denied. A template device deleted meanwhile (housekeeping releasing an older incarnation
    of the name: `template_class` given) is re-created. Raises Denied, or errors.ApiError."""
    refused: tuple[str, str] | None = None  # (version, why) of a write the server refused
    raw = written.made.pop(name, None)
    for _ in range(ATTACH_TRIES):
        if raw is None:
            raw = await api.get_device(attempt.namespace, name)
        if raw is None and template_class is not None:
            raw = await create_template(api, attempt.namespace, attempt.vmi, name, template_class)
            if raw is not None and name not in written.created:
                written.created.append(name)
            continue
        if raw is None:
            raise Denied(DeviceDeleted(name))
        version = raw["metadata"]["resourceVersion"]
        if refused is not None and refused[0] == version:
            # unchanged since: not the version test but the write itself was refused
            raise Denied(AttachmentRefused(name, refused[1][:300]))
        if _judge_read(raw, name, attempt, request):
            return
        try:
            await api.patch_status(attempt.namespace, name, attach_ops(raw, attempt, request))
            return
        except errors.Invalid as err:  # the version test failed, or the write itself
            refused = (version, err.message)
        except (errors.Conflict, errors.NotFound):
            pass  # re-read and re-judge
        raw = None
    raise Denied(DeviceKeptChanging(name))


async def attach_all(api: Api, attempt: Attempt, request: Mapping[str, Any], plan: AdmissionPlan,
                     written: Written) -> None:
    """W3 (2) and (3) on every device of the plan (recorded in `written.attached` first): the
    request is complete, and acted on by the binder, only once every member carries it."""
    classes = dict(plan.templates)
    written.attached.extend(plan.devices)
    await each(lambda name: attach(api, attempt, request, name, classes.get(name), written),
               plan.devices)


# -- W3 (4): the binder's result --------------------------------------------------------

async def wait_result(waiter: ResultWaiter, attempt: Attempt, names: tuple[str, ...],
                      timeout: float, bind_timeout: float) -> str:
    """W3 (4): wait (≤ `timeout` seconds) on the informer until every device carries this
    request with a result; the node when all Succeeded on one node. Raises Denied:
    `BinderRefused` with the binder's message when it refused, in the category of the code
    written beside it (`bindRequest.code`: `ledgers_refused` is retryable, 503; so is
    `preemption_nominated` (P4), with Retry-After from its victims' grace
    (`model.retry_after.preemptor_retry_after`, the words re-rendered to say it; `RETRY_STEP` while this replica has not seen the nomination);
    so are the line's `behind_in_line` and `node_reserved` (P5), with Retry-After
    `model.line.RETRY_AFTER` (the set keeps its place while its client retries); a
    policy refusal 403; no code, from an older replica: 403 as before), `NotBoundInTime` (503) when
    no result came in time (`bind_timeout` is the configured total, named in the message) or
    the request was withdrawn meanwhile."""
    ns, vmi, request_id = attempt.namespace, attempt.vmi, attempt.admission
    devs = await waiter.wait(ns, request_id, names, timeout)
    if devs is None:                                                          # W5 timeout
        raise Denied(NotBoundInTime(ns, vmi, request_id, bind_timeout))
    nodes = {d.status.bind_request.node for d in devs}
    if all(d.status.bind_request.result is Result.SUCCEEDED for d in devs) and len(nodes) == 1:
        return nodes.pop()
    refused = next((d.status.bind_request for d in devs
                    if d.status.bind_request.result is Result.REFUSED), None)
    code = refused.code if refused else None
    retry_after, message = None, refused.message if refused else None
    if code is Code.PREEMPTION_NOMINATED:  # P4: 503, Retry-After from the victims' grace
        nomination = waiter.cache.view.nominations().get(nomination_name(ns, vmi))
        if nomination is None:  # not in this replica's cache yet: ask again soon
            retry_after = RETRY_STEP
        else:  # the words say the header's seconds
            retry_after = preemptor_retry_after(nomination, attempt.now(),
                                                lambda vns, name: waiter.cache.vmis.get((vns, name)))
            message = nominated_refusal(nomination, ns, vmi, request_id, retry_after).render()
    elif code in LINE_CODES:  # P5: 503, asked again every period while the set waits in line
        retry_after = LINE_RETRY_AFTER
    raise Denied(BinderRefused(ns, vmi, message, code, retry_after))


# -- W3 (4): admit ----------------------------------------------------------------------

def admit_patch(snap: Snapshot, obj: Mapping[str, Any], plan: AdmissionPlan, node: str,
                admission: str) -> list[dict]:
    """The JSONPatch admitting the VMI `obj` on `node` (§2 VMI: one gpus entry per device,
    the pin, the admission annotation), from the snapshot's devices and classes. Raises
    Denied (UNAVAILABLE) when a device or its class disappeared meanwhile."""
    pairs = []
    for name in plan.devices:
        dev = snap.device(plan.namespace, name)
        cls = snap.classes.get(dev.class_name) if dev else None
        if cls is None:
            raise Denied(DeviceDisappeared(name))
        pairs.append((name, cls.resource_name))
    return vmi_patch(obj, pairs, node, effective_resources(snap), admission)


# -- DR5: the claim of a device-mode set ------------------------------------------------

def claim_members(snap: Snapshot, plan: AdmissionPlan, node: str) -> tuple[ClaimMember, ...] | None:
    """DR5: the set's members for its claim (`model.claim.members_of`), None for a count-mode
    set; raises Denied (`DeviceUnrecorded`, retryable) when a record is missing."""
    got = members_of(snap, plan, node)
    if isinstance(got, Reason):
        raise Denied(got)
    return got


def _quota_refusal(err: errors.ApiError) -> bool:
    """Whether a 403 is the ResourceQuota admission refusing the claim (`exceeded quota`,
    `failed quota`), not RBAC or a policy."""
    return isinstance(err, errors.Forbidden) and ("exceeded quota" in err.message
                                                  or "failed quota" in err.message)


async def ensure_claim(api: Api, attempt: Attempt, body: dict, written: Written) -> None:
    """DR5 after the set Succeeded on one node (W3 (4)), and W4: the VMI's ResourceClaim
    `body` exists. Created (recorded in `written.claim` first, so W5 deletes it even when the
    call is cancelled after the server applied it); one of that name already there is judged
    on a fresh read: not ours (no managed-by label or claim-for annotation naming this VMI) →
    `ClaimNameTaken`, never adopted; being deleted → `ClaimBeingDeleted` (retryable); ours
    with the same spec → found in place, stamped with this admission (a `test` of the
    version read: housekeeping's clock restarts and an older plan to delete it fails its
    precondition); ours with another spec (the devices were re-pointed) → deleted (uid and
    version preconditions) and created again, unless a Pod still holds it (`ClaimInUse`,
    retryable). A quota refusal is `ClaimOverQuota` (403). Raises Denied or errors.ApiError."""
    ns, name = attempt.namespace, body["metadata"]["name"]
    for _ in range(CLAIM_TRIES):
        written.claim = name
        try:
            created = await api.create_claim(ns, body)
        except errors.ApiError as err:
            if _quota_refusal(err):
                written.claim = None  # refused by admission: nothing stored
                raise Denied(ClaimOverQuota(ns, name, err.message)) from err
            raise
        if created:
            log.info("ResourceClaim created", claim=name, admission=attempt.admission)
            return
        written.claim = None  # not ours to delete: it was there before this call
        claim = await api.get_claim(ns, name)
        if claim is None:
            continue  # deleted since: create again
        if not claim.is_for(attempt.vmi):
            raise Denied(ClaimNameTaken(ns, name, attempt.vmi))
        if claim.deleting:
            raise Denied(ClaimBeingDeleted(ns, name))
        if same_spec(claim, body["spec"]):
            try:
                await api.patch_claim(ns, name, stamp_ops(claim, attempt.admission, attempt.now()))
            except (errors.Invalid, errors.Conflict, errors.NotFound):
                continue  # changed since the read: judge it again
            log.info("ResourceClaim found in place", claim=name, admission=attempt.admission)
            return
        if claim.in_use:
            raise Denied(ClaimInUse(ns, name))
        try:
            await api.delete_claim(ns, name, claim.uid, claim.resource_version)
            log.info("ResourceClaim of other devices replaced", claim=name,
                     admission=attempt.admission)
        except (errors.Conflict, errors.NotFound):
            pass  # changed or gone since the read: judge it again
    raise Denied(ClaimBeingDeleted(ns, name))


async def wire_claim(api: Api, attempt: Attempt, obj: Mapping[str, Any], snap: Snapshot,
                     plan: AdmissionPlan, node: str, members: Sequence[ClaimMember],
                     written: Written) -> list[dict]:
    """DR5: ensure the set's claim (`ensure_claim`) and return the JSONPatch wiring the VMI
    `obj` to it on `node` (`model.claim.claim_vmi_patch`). Raises Denied or errors.ApiError."""
    body = build_claim(attempt.namespace, attempt.vmi, members, attempt.admission, attempt.now())
    await ensure_claim(api, attempt, body, written)
    return claim_vmi_patch(obj, attempt.vmi, members, node, effective_resources(snap),
                           attempt.admission)


async def delete_own_claim(api: Api, attempt: Attempt, name: str) -> None:
    """W5: delete claim `name` that this call created, unless another admission of the VMI
    has stamped it since (read fresh; uid and version preconditions). Shielded from
    cancellation, each call bounded; never raises (housekeeping deletes what is left, H1)."""
    with anyio.CancelScope(shield=True):
        try:
            with anyio.fail_after(api.timeout * 2 + 1):
                claim = await api.get_claim(attempt.namespace, name)
                if claim is None or not claim.is_for(attempt.vmi) or \
                        claim.admission != attempt.admission:
                    return
                await api.delete_claim(attempt.namespace, name, claim.uid,
                                       claim.resource_version)
                log.info("ResourceClaim deleted (W5)", claim=name, admission=attempt.admission)
        except (errors.NotFound, errors.Conflict) as exc:
            log.info("clean-up of claim moot", claim=name, reason=str(exc)[:200])
        except Exception as exc:  # noqa: BLE001
            log.warning("clean-up of claim failed", claim=name, error=repr(exc)[:200])


# -- W5: clean up what this call wrote --------------------------------------------------

def _request_of(raw: dict | None, request_id: str) -> dict:
    br = ((raw or {}).get("status") or {}).get("bindRequest") or {}
    return br if br.get("id") == request_id else {}


async def _read_attached(api: Api, attempt: Attempt,
                         names: Sequence[str]) -> dict[str, dict | None] | None:
    """Fresh reads of `names` (the cache may be behind), each bounded; None when one fails
    (judged unknown: everything is left to housekeeping, H1)."""
    fresh: dict[str, dict | None] = {}
    for name in names:
        try:
            with anyio.fail_after(api.timeout + 1):
                fresh[name] = await api.get_device(attempt.namespace, name)
        except Exception as exc:  # noqa: BLE001
            log.warning("clean-up read failed", device=name, error=repr(exc)[:200])
            return None
    return fresh


async def _clear_attachment(api: Api, attempt: Attempt, name: str, raw: dict | None) -> None:
    """Remove this call's attachment (and its request, if the device carries it) from the
    device as read, compare-and-set on both; a device changed or gone since is moot."""
    request_id = attempt.admission
    att = ((raw or {}).get("status") or {}).get("attachedTo") or {}
    if raw is None or att.get("admission") != request_id:
        return
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/status/attachedTo/admission", "value": request_id},
        {"op": "remove", "path": "/status/attachedTo"}]
    if _request_of(raw, request_id):
        ops += [{"op": "test", "path": "/status/bindRequest/id", "value": request_id},
                {"op": "remove", "path": "/status/bindRequest"}]
    try:
        with anyio.fail_after(api.timeout + 1):
            await api.patch_status(attempt.namespace, name, ops)
    except (errors.Invalid, errors.NotFound) as exc:  # changed or gone since the read
        log.info("clean-up of attachment moot: the device changed since it was read",
                 device=name, request_id=request_id, reason=str(exc)[:200])
    except Exception as exc:  # noqa: BLE001 - housekeeping (H1) retries later
        log.warning("clean-up of attachment failed", device=name, request_id=request_id,
                    error=repr(exc)[:200])


async def _delete_template(api: Api, attempt: Attempt, name: str) -> None:
    """Delete template `name` this call created, unless it is no longer this VMI's template
    or another admission of the name has attached it since (read fresh; preconditions)."""
    try:
        with anyio.fail_after(api.timeout + 1):
            raw = await api.get_device(attempt.namespace, name)
            labels = ((raw or {}).get("metadata") or {}).get("labels") or {}
            if raw is None or labels.get(TEMPLATE_FOR_LABEL) != attempt.vmi:
                return
            if (raw.get("status") or {}).get("attachedTo"):
                return  # another admission of the name attached it meanwhile
            await api.delete_device(attempt.namespace, name, raw["metadata"]["uid"],
                                    raw["metadata"]["resourceVersion"])
    except errors.NotFound as exc:  # housekeeping (H1/H3) deleted it first: nothing left to do
        log.info("clean-up of template moot", device=name, reason=str(exc)[:200])
    except Exception as exc:  # noqa: BLE001
        log.warning("clean-up of template failed", device=name, error=repr(exc)[:200])


async def clean_up(api: Api, attempt: Attempt, written: Written) -> None:
    """W5: clear what this call wrote — only attachments carrying this call's admission id,
    never another admission's of the same VMI name — judged on fresh reads and shielded from
    cancellation, each call bounded; then delete the templates it created (`_delete_template`).
    When the binder has already recorded its decision for this request (`bindRequest.node` on
    a member: the binder writes node, placement and result of a member in one write, so some
    members may carry it while others have nothing yet), nothing is touched: the binder
    finishes the placement (B7) and housekeeping clears the attachments and the request once
    the VMI has not appeared (H1). The claim this call created (DR5) is deleted first, in
    every case: the VMI it was made for is not admitted by this call. Never raises (failures
    are logged)."""
    with anyio.CancelScope(shield=True):
        if written.claim is not None:
            await delete_own_claim(api, attempt, written.claim)
        fresh = await _read_attached(api, attempt, written.attached)
        if fresh is None:
            return
        if any(_request_of(raw, attempt.admission).get("node") for raw in fresh.values()):
            log.info("request already decided; left for the binder (B7)",
                     request_id=attempt.admission)
            return
        for name, raw in fresh.items():
            await _clear_attachment(api, attempt, name, raw)
        for name in written.created:
            await _delete_template(api, attempt, name)


# -- after a denial ---------------------------------------------------------------------

async def record_event(api: Api, ns: str, vmi: str, message: str, now: datetime) -> None:
    """A Warning Event `GPUSetRefused` about the refused VMI, so `kubectl get events` shows
    why. Best effort: a failure is logged, never raised."""
    stamp = format_time(now)
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{vmi}.", "namespace": ns},
            "involvedObject": {"apiVersion": "kubevirt.io/v1",
                               "kind": "VirtualMachineInstance", "name": vmi, "namespace": ns},
            "reason": "GPUSetRefused", "message": message[:1024], "type": "Warning",
            "source": {"component": "gpu-binder"}, "firstTimestamp": stamp,
            "lastTimestamp": stamp, "count": 1, "reportingComponent": "gpu-binder",
            "reportingInstance": "webhook"}
    try:
        with anyio.fail_after(api.timeout):
            await api.create_event(ns, body)
    except Exception as exc:  # noqa: BLE001 - an Event is best effort
        log.warning("event not recorded", error=repr(exc)[:200])


# -- concurrency within a step ----------------------------------------------------------

async def each(fn: Callable[[Any], Awaitable[None]], items: Sequence[Any]) -> None:
    """`await fn(item)` for every item, at most `STEP_PARALLEL` at once. The first failure
    cancels the others and is raised as it is, a `Denied` before an `errors.ApiError`
    before anything else (what was written meanwhile is recorded by the caller for W5)."""
    if len(items) <= 1:
        for item in items:
            await fn(item)
        return
    limiter = anyio.CapacityLimiter(STEP_PARALLEL)

    async def one(item: Any) -> None:
        async with limiter:
            await fn(item)

    try:
        async with anyio.create_task_group() as tg:
            for item in items:
                tg.start_soon(one, item)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        for kind in (Denied, errors.ApiError, Exception):
            first = next((e for e in leaves if isinstance(e, kind)), None)
            if first is not None:
                raise first from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
