"""The webhook's transport and decoder (docs/contract.md §4 W6, `k8s.webhook.transport` and
`k8s.webhook.review`), and its own availability: a body of the wrong media type, too large,
not JSON or not an AdmissionReview of a VMI CREATE it serves, malformed metadata or GPU
annotations, a VMI without a name; the replica not synced or shutting down, an admission
that timed out or crashed.

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Code, Reason


# --- the webhook's transport and decoder (W6), and its own availability ------------------------


@dataclass(frozen=True, slots=True)
class WrongMediaType(Reason):
    """The review's body is of `content_type`, not `expected` (checked before it is read)."""
    code: ClassVar[Code] = Code.WRONG_MEDIA_TYPE
    content_type: str
    expected: str

    def render(self) -> str:
        return f"unsupported content type {self.content_type!r}; expected {self.expected}"


@dataclass(frozen=True, slots=True)
class BodyTooLarge(Reason):
    """The review's body is over `limit` bytes (checked before it is parsed)."""
    code: ClassVar[Code] = Code.BODY_TOO_LARGE
    limit: int

    def render(self) -> str:
        return f"AdmissionReview larger than {self.limit} bytes"


@dataclass(frozen=True, slots=True)
class BodyNotJson(Reason):
    """The review's body does not parse as JSON (`error`: the parser's message)."""
    code: ClassVar[Code] = Code.BODY_NOT_JSON
    error: str

    def render(self) -> str:
        return f"request body is not valid JSON: {self.error}"


_NOT_A_REVIEW = {
    "object": "AdmissionReview must be a JSON object",
    "request": "AdmissionReview.request with a string uid is required",
    "uid": "AdmissionRequest.uid must be a non-empty string",
    "vmi": "request.object must be an object",
}


@dataclass(frozen=True, slots=True)
class NotAReview(Reason):
    """The body is not an AdmissionReview this webhook serves: `part` names what is wrong —
    "object" (not a JSON object), "kind" (not an `api_version` AdmissionReview), "request"
    (no request with a string uid), "uid" (an empty uid), "vmi" (request.object is not an
    object)."""
    code: ClassVar[Code] = Code.NOT_A_REVIEW
    part: str
    api_version: str = ""

    def render(self) -> str:
        if self.part == "kind":
            return f"expected an {self.api_version} AdmissionReview"
        return _NOT_A_REVIEW[self.part]


@dataclass(frozen=True, slots=True)
class NotAVmi(Reason):
    """The review is about a `group`/`kind` other than kubevirt.io VirtualMachineInstance."""
    code: ClassVar[Code] = Code.NOT_A_VMI
    group: object
    kind: object

    def render(self) -> str:
        return (f"gpu-binder admits only kubevirt.io VirtualMachineInstances, got "
                f"{self.group!r}/{self.kind!r}")


@dataclass(frozen=True, slots=True)
class NotACreate(Reason):
    """The review's `operation` is not CREATE."""
    code: ClassVar[Code] = Code.NOT_A_CREATE
    operation: object

    def render(self) -> str:
        return f"gpu-binder handles CREATE only, got {self.operation!r}"


@dataclass(frozen=True, slots=True)
class DryRunNotBoolean(Reason):
    """The review's dryRun is of type `type_name`, not a boolean (read loosely, a string
    "false" would skip the reservation, W2, and admit)."""
    code: ClassVar[Code] = Code.DRY_RUN_NOT_BOOLEAN
    type_name: str

    def render(self) -> str:
        return f"AdmissionRequest.dryRun must be a boolean, got {self.type_name}"


@dataclass(frozen=True, slots=True)
class MalformedMetadata(Reason):
    """The VMI's metadata is not an object (`annotations` False), or its annotations do not
    map strings to strings (`annotations` True)."""
    code: ClassVar[Code] = Code.MALFORMED_METADATA
    annotations: bool = False

    def render(self) -> str:
        return ("metadata.annotations must map strings to strings" if self.annotations
                else "request.object.metadata must be an object")


@dataclass(frozen=True, slots=True)
class InvalidAnnotations(Reason):
    """A `gpu.cozystack.io/` annotation of VMI `namespace/name` does not parse: `field` and
    `problem` (`model.parse.ParseError`'s)."""
    code: ClassVar[Code] = Code.INVALID_ANNOTATIONS
    namespace: str
    name: str
    field: str
    problem: str

    def render(self) -> str:
        return (f"invalid GPU annotations on VMI {self.namespace}/{self.name}: "
                f"{self.field}: {self.problem}")


@dataclass(frozen=True, slots=True)
class InvalidVmi(Reason):
    """VMI `namespace/name` asking for GPUs has a field the binder must read that does not
    parse (its tolerations): `field` and `problem` (`model.parse.ParseError`'s)."""
    code: ClassVar[Code] = Code.INVALID_VMI
    namespace: str
    name: str
    field: str
    problem: str

    def render(self) -> str:
        return f"invalid VMI {self.namespace}/{self.name}: {self.field}: {self.problem}"


@dataclass(frozen=True, slots=True)
class NoName(Reason):
    """A VMI asking for GPUs lacks metadata.name (generateName) or a namespace."""
    code: ClassVar[Code] = Code.NO_NAME

    def render(self) -> str:
        return ("a VMI asking for GPUs needs metadata.name and a namespace "
                "(generateName is not supported)")


@dataclass(frozen=True, slots=True)
class NotSynced(Reason):
    """The replica's informers have not synced yet: it cannot judge (fail closed). With
    `relisting`, an informer relists after an outage and W1 found a device or class missing
    that may only not be seen yet: no 403 for it (W1 on a lagging view)."""
    code: ClassVar[Code] = Code.NOT_SYNCED
    relisting: bool = False

    def render(self) -> str:
        if self.relisting:
            return ("gpu-binder's cache is catching up with the API server (an informer "
                    "relists after an outage); retry")
        return "gpu-binder is starting (cache not synced); retry"


@dataclass(frozen=True, slots=True)
class ShuttingDown(Reason):
    """The replica is shutting down: it takes no new review (`while_admitting` False), or
    it cancelled this one in flight after cleaning up what it wrote (True)."""
    code: ClassVar[Code] = Code.SHUTTING_DOWN
    while_admitting: bool = False

    def render(self) -> str:
        return ("gpu-binder replica shut down while admitting; retry" if self.while_admitting
                else "gpu-binder replica is shutting down; retry")


@dataclass(frozen=True, slots=True)
class AdmissionTimedOut(Reason):
    """The handler did not answer within `seconds` (the transport's bound, W6)."""
    code: ClassVar[Code] = Code.ADMISSION_TIMED_OUT
    seconds: float

    def render(self) -> str:
        return f"gpu-binder admission did not finish within {self.seconds:.0f} s; retry"


@dataclass(frozen=True, slots=True)
class AdmissionCrashed(Reason):
    """The handler raised `error_type` (a bug): denied, never admitted (W6)."""
    code: ClassVar[Code] = Code.ADMISSION_CRASHED
    error_type: str

    def render(self) -> str:
        return f"gpu-binder admission failed internally: {self.error_type}"
