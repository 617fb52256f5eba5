"""The AdmissionReview decoder and the typed denials (W1, W6): pure, no I/O.

`decode(raw)` turns the bytes the API server POSTs into a `Review` (uid, operation, the VMI,
dryRun, the caller, the GPU set it asks for) or a `Rejected` (the uid when readable, and a
`Denial`); it never raises. A `Denial` is a `Category` (`model.reasons.Category`, the one
type for the model's reasons and the webhook's own denials) and a message; `STATUS` turns
the category into the HTTP status the tenant sees, in this one place (as kopf's
`AdmissionError(message, code)` and controller-runtime's `validationResponseFromStatus`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from model.admission import Refusal, unknown_annotations
from model.parse import ParseError, VMIAsk, parse_tolerations, parse_vmi_request
from model.reasons import (BodyNotJson, Category, DryRunNotBoolean, InvalidAnnotations, InvalidVmi,
                           MalformedMetadata, NoName, NotACreate, NotAReview, NotAVmi, Reason)
from model.types import Toleration

MESSAGE_LIMIT = 8192  # characters of a denial's message sent back (kubectl prints it)
API_VERSION = "admission.k8s.io/v1"
VMI_KIND = ("kubevirt.io", "VirtualMachineInstance")


STATUS: Mapping[Category, tuple[int, str]] = {
    Category.POLICY: (403, "Forbidden"),
    Category.INVALID: (422, "Invalid"),
    Category.MALFORMED: (400, "BadRequest"),
    Category.UNAVAILABLE: (503, "ServiceUnavailable"),
    Category.THROTTLED: (429, "TooManyRequests"),
    Category.TOO_LARGE: (413, "RequestEntityTooLarge"),
    Category.MEDIA_TYPE: (415, "UnsupportedMediaType"),
    Category.INTERNAL: (500, "InternalError"),
}
"""Category → (HTTP code, Kubernetes `StatusReason`) of the AdmissionResponse's `status`; the
API server hands both to the tenant's client unchanged."""

RETRYABLE = frozenset({Category.UNAVAILABLE, Category.THROTTLED})
"""Categories after which the same request may succeed; their message says to retry."""

RETRY_AFTER_CODES = frozenset({429, 503})
"""HTTP codes of a denial whose status carries `details.retryAfterSeconds`, which kube-apiserver sends as Retry-After."""
RETRY_AFTER = 1
"""Seconds a retryable denial asks the client to wait when its reason names none."""


@dataclass(frozen=True, slots=True)
class Denial:
    """A refusal to admit: `category` decides the status, `message` tells the user what to do
    (for a retryable category it says to retry); `retry_after` (seconds, None: `RETRY_AFTER`)
    is what a retryable one asks the client to wait."""

    category: Category
    message: str
    retry_after: int | None = None

    @property
    def code(self) -> int:
        """The HTTP status code (`STATUS`)."""
        return STATUS[self.category][0]

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later (`RETRYABLE`)."""
        return self.category in RETRYABLE

    def status(self) -> dict[str, Any]:
        """The AdmissionResponse `status` object: {code, reason, message} (message capped
        at `MESSAGE_LIMIT` characters), and for a code in `RETRY_AFTER_CODES` (429, 503:
        retryable) `details: {retryAfterSeconds}`.

        Why details (read in k8s.io/apiserver v0.36.3, the kube-apiserver built here): the
        mutating dispatcher (pkg/admission/plugin/webhook/mutating/dispatcher.go) turns a
        denying response's status into the request's error with
        pkg/admission/plugin/webhook/errors/statuserror.go `ToStatusErr`, which keeps code,
        reason and details and only prefixes the message; the create handler answers that
        error through `RequestScope.err` → pkg/endpoints/handlers/responsewriters/writers.go
        `ErrorNegotiated`, which sets the `Retry-After` header from
        `details.retryAfterSeconds` when it is > 0. client-go (k8s.io/client-go v0.36.3
        rest/with_retry.go `IsNextRetry`/`checkWait`) retries a 429 or 5xx answer carrying
        `Retry-After` by itself, up to 10 times: kubectl and every Go client retry these
        denials unasked (tests/e2e/test_fairness.py sees the header and kubectl's retries)."""
        code, reason = STATUS[self.category]
        out: dict[str, Any] = {"code": code, "reason": reason,
                               "message": self.message[:MESSAGE_LIMIT]}
        if code in RETRY_AFTER_CODES:
            out["details"] = {"retryAfterSeconds": max(1, self.retry_after or RETRY_AFTER)}
        return out


def reason_denial(reason: Reason) -> Denial:
    """A typed reason (`model.reasons`) as a denial: its category, its rendered text and its
    own `retry_after` (seconds) when it has one."""
    return Denial(reason.category, reason.render(), getattr(reason, "retry_after", None))


def refusal_denial(refusal: Refusal) -> Denial:
    """A model refusal as a denial, in the category its typed reason names
    (`refusal.reason.category`), with the reason's own `retry_after` when it has one."""
    return reason_denial(refusal.reason)


@dataclass(frozen=True, slots=True)
class Review:
    """A VMI CREATE AdmissionReview as the webhook acts on it. `namespace` and `name` are ""
    when absent (only a review with `ask` None may lack them); `object` is the VMI as sent
    (read, never mutated); `ask` is None when the VMI carries no GPU annotation (not the
    webhook's business: admitted unchanged), and then `tolerations` is () unread and
    `priority_class_name` None. `priority_class_name` is the VMI's `spec.priorityClassName`
    (None when absent or empty; P1 resolves it)."""

    uid: str
    operation: str
    namespace: str
    name: str
    object: Mapping[str, Any]
    dry_run: bool
    user: str
    groups: tuple[str, ...]
    ask: VMIAsk | None
    tolerations: tuple[Toleration, ...]
    priority_class_name: str | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    """A review denied before any judgement: `uid` is "" when it could not be read; `namespace`
    and `name` are what could be read of the VMI, `user` the requester's name and `dry_run`
    the request's flag (None when not a boolean), for the log line ("" when unknown)."""

    uid: str
    denial: Denial
    namespace: str = ""
    name: str = ""
    user: str = ""
    dry_run: bool | None = None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _obj(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def decode(raw: bytes) -> Review | Rejected:
    """The AdmissionReview in `raw` (the request body) → `Review`, or `Rejected` with
    MALFORMED (not JSON, not an admission.k8s.io/v1 AdmissionReview, no string uid, a review
    of another kind or operation, no object, a dryRun that is not a boolean) or INVALID (the
    VMI's metadata or annotations are not what Kubernetes allows, an unknown or malformed
    `gpu.cozystack.io/` annotation, malformed tolerations, a `spec.priorityClassName` that
    is not a string or no name on a VMI asking for GPUs). Never raises (W6)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Rejected("", reason_denial(BodyNotJson(str(exc))))
    if not isinstance(doc, dict):
        return Rejected("", reason_denial(NotAReview("object")))
    req = doc.get("request")
    uid = _text(_obj(req).get("uid"))
    if doc.get("kind") != "AdmissionReview" or doc.get("apiVersion") != API_VERSION:
        return Rejected(uid, reason_denial(NotAReview("kind", API_VERSION)))
    if not isinstance(req, dict) or not uid:
        return Rejected(uid, reason_denial(NotAReview("request")))
    return decode_request(req)


def decode_request(req: Mapping[str, Any]) -> Review | Rejected:
    """`decode` for the AdmissionRequest object (`request` of the review; `uid` a non-empty
    string, else MALFORMED)."""
    uid = _text(req.get("uid"))
    obj = req.get("object")
    meta = _obj(_obj(obj).get("metadata"))
    namespace = _text(req.get("namespace")) or _text(meta.get("namespace"))
    name = _text(meta.get("name")) or _text(req.get("name"))
    requester = _text(_obj(req.get("userInfo")).get("username"))
    flagged = req.get("dryRun") if isinstance(req.get("dryRun"), bool) else None

    def rejected(reason: Reason) -> Rejected:
        return Rejected(uid, reason_denial(reason), namespace, name, requester, flagged)

    if not uid:
        return rejected(NotAReview("uid"))
    kind = _obj(req.get("kind"))
    if (kind.get("group"), kind.get("kind")) != VMI_KIND:
        return rejected(NotAVmi(kind.get("group"), kind.get("kind")))
    operation = req.get("operation")
    if operation != "CREATE":
        return rejected(NotACreate(operation))
    dry_run = req.get("dryRun")
    if dry_run is not None and not isinstance(dry_run, bool):
        # a string "false" is truthy: read loosely it would skip the reservation (W2) and admit
        return rejected(DryRunNotBoolean(type(dry_run).__name__))
    if not isinstance(obj, dict):
        return rejected(NotAReview("vmi"))
    if not isinstance(obj.get("metadata"), dict):
        return rejected(MalformedMetadata())
    annotations = meta.get("annotations")
    if annotations is not None and not (
            isinstance(annotations, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items())):
        return rejected(MalformedMetadata(annotations=True))
    unknown = unknown_annotations(annotations)
    if unknown is not None:
        return Rejected(uid, refusal_denial(unknown), namespace, name, requester, flagged)
    try:
        ask = parse_vmi_request(annotations)
    except ParseError as exc:
        return rejected(InvalidAnnotations(namespace, name, exc.field, exc.problem))
    tolerations: tuple[Toleration, ...] = ()
    priority_class: str | None = None
    if ask is not None:
        try:
            tolerations = parse_tolerations(_obj(obj.get("spec")).get("tolerations"))
        except ParseError as exc:
            return rejected(InvalidVmi(namespace, name, exc.field, exc.problem))
        raw_class = _obj(obj.get("spec")).get("priorityClassName")
        if raw_class is not None and not isinstance(raw_class, str):
            return rejected(InvalidVmi(namespace, name, "spec.priorityClassName",
                                       f"must be a string, got {type(raw_class).__name__}"))
        priority_class = raw_class or None
        if not namespace or not name:
            return rejected(NoName())
    user = _obj(req.get("userInfo"))
    groups = user.get("groups") if isinstance(user.get("groups"), list) else []
    return Review(uid=uid, operation=operation, namespace=namespace, name=name, object=obj,
                  dry_run=bool(dry_run), user=_text(user.get("username")),
                  groups=tuple(g for g in groups if isinstance(g, str)), ask=ask,
                  tolerations=tolerations, priority_class_name=priority_class)
