"""The k8s adapter's own error hierarchy: client exceptions are translated here and never
leak inward. `translate(exc, what)` maps a kubernetes_asyncio ApiException (or a transport
error) to one of these, keeping the status code, the API's message, the API Status's
`reason` and `details`, and Retry-After; `from_response` is that mapping for an HTTP
answer, which `k8s.client`'s raw path reads itself. `k8s.client.KubeClient` translates
once per call."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from kubernetes_asyncio.client import ApiException


class ApiError(Exception):
    """A Kubernetes API call failed. `status` is the HTTP status (0: no response);
    `message` the API's message (with its causes); `reason` the API Status's `reason`
    ("NotFound", "AlreadyExists", "Conflict", …; "" when the answer carried no Status) and
    `details` its `details` (`name`, `group`, `kind`, `causes`…; {} when absent);
    `retry_after` the Retry-After header in seconds, if any."""

    def __init__(self, what: str, status: int, message: str, retry_after: float | None = None,
                 *, reason: str = "", details: dict | None = None):
        super().__init__(f"{what}: {status} {message}".strip())
        self.what, self.status, self.message, self.retry_after = what, status, message, retry_after
        self.reason = reason
        self.details: dict = details if details is not None else {}

    def names(self, name: str) -> bool:
        """True when this is a 404 about the object `name` itself (the Status's
        `details.name`), not about its resource type or version being unknown to the
        server: only then does a 404 prove the object does not exist."""
        return self.status == 404 and self.details.get("name") == name


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409 Conflict: stale resourceVersion on an update."""


class AlreadyExists(ApiError):
    """409 AlreadyExists on create (never retried)."""


class Invalid(ApiError):
    """422: the object or patch was rejected (a failed JSON Patch `test` lands here)."""


class Forbidden(ApiError):
    """403: RBAC denies the call."""


class TooManyRequests(ApiError):
    """429: throttled by API priority and fairness; `retry_after` in seconds if given."""


class Unavailable(ApiError):
    """5xx, a timeout or a broken connection: worth retrying."""


def _status(body: bytes | str | None, phrase: str) -> tuple[str, str, dict]:
    """The message (with its causes), reason and details of the API Status in `body`;
    the HTTP reason phrase `phrase`, "" and {} when the body is no Status."""
    try:
        doc = orjson.loads(body or b"{}")
    except (orjson.JSONDecodeError, TypeError):
        return phrase, "", {}
    if not isinstance(doc, dict):
        return phrase, "", {}
    details = doc.get("details") if isinstance(doc.get("details"), dict) else {}
    message = str(doc.get("message") or phrase)
    causes = [c.get("message") for c in details.get("causes") or []
              if isinstance(c, dict) and c.get("message")]
    if causes:
        message += " (" + "; ".join(str(c) for c in causes)[:500] + ")"
    return message, str(doc.get("reason") or ""), details


def from_response(what: str, status: int, phrase: str, body: bytes | str | None,
                  headers: Mapping[str, str] | None) -> ApiError:
    """The ApiError named `what` for an answer of HTTP `status` (>= 400; 0: no answer):
    its type by the status (404 NotFound, 409 AlreadyExists when the Status's reason says
    so else Conflict, 422 Invalid, 403 Forbidden, 429 TooManyRequests, 5xx and 0
    Unavailable, any other ApiError), the message, reason and details of the API Status
    in `body` (JSON bytes or text; `phrase`, the HTTP reason phrase, when it is none) and
    `retry_after` from the Retry-After header of `headers` (seconds; None when absent or
    not a number). The one mapping of both the raw path (`k8s.client`) and `translate`.
    Raises nothing."""
    message, reason, details = _status(body, phrase)
    retry_after = None
    value = (headers or {}).get("Retry-After")
    if value:
        try:
            retry_after = float(value)
        except ValueError:
            retry_after = None
    cls: type[ApiError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 422:
        cls = Invalid
    elif status == 403:
        cls = Forbidden
    elif status == 429:
        cls = TooManyRequests
    elif status >= 500 or status == 0:
        cls = Unavailable
    else:
        cls = ApiError
    return cls(what, status, message, retry_after, reason=reason, details=details)


def translate(exc: BaseException, what: str) -> ApiError:
    """Map `exc` (ApiException, OSError, TimeoutError, aiohttp errors) to an ApiError named
    `what`; an ApiError is returned as it is (never translated twice)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ApiException):
        return from_response(what, int(exc.status or 0), str(exc.reason or ""), exc.body,
                             exc.headers)
    return Unavailable(what, 0, transport_message(exc)[:300])


def transport_message(exc: BaseException) -> str:
    """A transport failure in one line for an operator: aiohttp's connector errors as
    "<host>:<port>: <the OS's words>" ("127.0.0.1:6443: connection refused"), anything else
    as its type and text ("TimeoutError: ..."). Raises nothing."""
    import os

    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        why = os.strerror(err.errno).lower() if err is not None and err.errno else str(err or exc)
        return f"{exc.host}:{exc.port}: {why}"
    return f"{type(exc).__name__}: {exc}"


async def read_json(resp, what: str) -> dict:
    """Body of a raw (`_preload_content=False`) response as a dict. kubernetes_asyncio does
    not raise for error statuses in that mode, so this raises the ApiException it would
    have raised (status, reason, body), and ApiException(status=0) for a non-JSON body."""
    try:
        body = await resp.read()
    finally:
        resp.release()
    if resp.status >= 400:
        exc = ApiException(status=resp.status, reason=str(resp.reason or what))
        exc.body = body
        exc.headers = dict(resp.headers or {})
        raise exc
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ApiException(status=0, reason=f"{what}: response is not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise ApiException(status=0, reason=f"{what}: response is not a JSON object")
    return doc
