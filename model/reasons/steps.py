"""The webhook's steps on the API server (docs/contract.md §4 W1's live read, W3, W4;
`k8s.webhook.steps`): the VMI's name already taken or unconfirmed, a held device malformed,
deleted, refused or changing while attached, the binder's answer late or a refusal
(`BinderRefused`, its category the code the binder wrote), a device gone before the patch,
and the API server's own refusals (invalid, throttled, forbidden, unavailable).

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model.reasons.codes import Category, Code, Reason


# --- the webhook's steps on the API server (W1's live read, W3, W4) ----------------------------


@dataclass(frozen=True, slots=True)
class VmiExists(Reason):
    """W1's live read: VMI `namespace/vmi` exists already (the API server would refuse the
    duplicate name only after admission)."""
    code: ClassVar[Code] = Code.VMI_EXISTS
    namespace: str
    vmi: str

    def render(self) -> str:
        return (f"VMI {self.namespace}/{self.vmi} already exists; delete it first or choose "
                "another name")


@dataclass(frozen=True, slots=True)
class NameUnconfirmed(Reason):
    """W1's live read failed (`error`, cut to 200 characters): whether VMI
    `namespace/vmi` exists is unknown, so the webhook fails closed."""
    code: ClassVar[Code] = Code.NAME_UNCONFIRMED
    namespace: str
    vmi: str
    error: str

    def render(self) -> str:
        return (f"cannot confirm that VMI {self.namespace}/{self.vmi} does not exist yet: "
                f"{self.error[:200]}; retry")


@dataclass(frozen=True, slots=True)
class DeviceMalformed(Reason):
    """W3: the device as read from the API server does not parse (`problem`)."""
    code: ClassVar[Code] = Code.DEVICE_MALFORMED
    device: str
    problem: str

    def render(self) -> str:
        return f"GPU device {self.device} is malformed: {self.problem}"


@dataclass(frozen=True, slots=True)
class DeviceDeleted(Reason):
    """W3: a held device of the set was deleted while the webhook attached it."""
    code: ClassVar[Code] = Code.DEVICE_DELETED
    device: str

    def render(self) -> str:
        return f"GPU device {self.device} was deleted during admission"


@dataclass(frozen=True, slots=True)
class AttachmentRefused(Reason):
    """W3: the API server refused the attachment write on an unchanged device (`error`, cut
    to 300 characters): something of the VMI the GPUDevice schema does not take."""
    code: ClassVar[Code] = Code.ATTACHMENT_REFUSED
    device: str
    error: str

    def render(self) -> str:
        return (f"GPU device {self.device}: the API server refused the attachment: "
                f"{self.error[:300]}")


@dataclass(frozen=True, slots=True)
class DeviceKeptChanging(Reason):
    """W3: every read of the device was followed by a change before the attachment could be
    written (`steps.ATTACH_TRIES` tries)."""
    code: ClassVar[Code] = Code.DEVICE_KEPT_CHANGING
    device: str

    def render(self) -> str:
        return f"GPU device {self.device} kept changing while attaching it; try again"


@dataclass(frozen=True, slots=True)
class NotBoundInTime(Reason):
    """W3 (4)/W5: the binder's result for request `request_id` did not come within
    `seconds` (bindTimeout), or the request was withdrawn meanwhile."""
    code: ClassVar[Code] = Code.NOT_BOUND_IN_TIME
    namespace: str
    vmi: str
    request_id: str
    seconds: float

    def render(self) -> str:
        return (f"GPU set of VMI {self.namespace}/{self.vmi} was not bound within "
                f"{self.seconds:.0f} s (request {self.request_id}); try again")


@dataclass(frozen=True, slots=True)
class BinderRefused(Reason):
    """W3 (4): the binder refused the set. `message` is its refusal as written on a member
    (`status.bindRequest.message`; None: no member says), `refused` the code written beside
    it (`status.bindRequest.code`; None: written by a replica older than that field). The
    category is `refused`'s (so `ledgers_refused` is retryable, 503), else POLICY (403), as
    every binder refusal was answered before the code was written. `retry_after` (seconds;
    None: the default) the Retry-After of a retryable one (P4: the nomination's)."""
    code: ClassVar[Code] = Code.BINDER_REFUSED
    namespace: str
    vmi: str
    message: str | None = None
    refused: Code | None = None
    retry_after: int | None = None

    @property
    def category(self) -> Category:
        return self.refused.category if self.refused is not None else Category.POLICY

    def render(self) -> str:
        return self.message or f"GPU set of VMI {self.namespace}/{self.vmi} was refused by the binder"


@dataclass(frozen=True, slots=True)
class DeviceDisappeared(Reason):
    """W3 (4): a device of the set, or its class, is gone from the cache when the VMI is
    about to be admitted (the patch cannot be built)."""
    code: ClassVar[Code] = Code.DEVICE_DISAPPEARED
    device: str

    def render(self) -> str:
        return f"GPU device {self.device} or its class disappeared during admission; retry"


@dataclass(frozen=True, slots=True)
class ApiInvalid(Reason):
    """The API server refused a write of the steps as invalid (`error`: its message):
    something of the VMI the GPUDevice schema does not take."""
    code: ClassVar[Code] = Code.API_INVALID
    error: str

    def render(self) -> str:
        return self.error


@dataclass(frozen=True, slots=True)
class ApiThrottled(Reason):
    """The API server throttled a call of the steps (429; `error`: its message)."""
    code: ClassVar[Code] = Code.API_THROTTLED
    error: str

    def render(self) -> str:
        return f"{self.error}; retry"


@dataclass(frozen=True, slots=True)
class ApiForbidden(Reason):
    """The API server forbade a call of the steps (the webhook's own RBAC; `error`: its
    message): the operator must fix it."""
    code: ClassVar[Code] = Code.API_FORBIDDEN
    error: str

    def render(self) -> str:
        return self.error


@dataclass(frozen=True, slots=True)
class ApiUnavailable(Reason):
    """A call of the steps failed otherwise (5xx, a timeout, a broken connection, a
    conflict; `error`: what happened)."""
    code: ClassVar[Code] = Code.API_UNAVAILABLE
    error: str

    def render(self) -> str:
        return f"{self.error}; retry"
