"""The k8s adapter's own error hierarchy: client exceptions are translated here and never
leak inward. `translate(exc, what)` maps a kubernetes_asyncio ApiException (or a transport
error) to one of these, keeping the status code, the API's message, the API Status's
`reason` and `details`, and Retry-After. `k8s.client.KubeClient` calls it once per call."""

from __future__ import annotations

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


def _status(exc: ApiException) -> tuple[str, str, dict]:
    """The message (with its causes), reason and details of the API Status in `exc.body`;
    the client's reason phrase, "" and {} when the body is no Status."""
    try:
        body = orjson.loads(exc.body or b"{}")
    except (orjson.JSONDecodeError, TypeError):
        return str(exc.reason or ""), "", {}
    if not isinstance(body, dict):
        return str(exc.reason or ""), "", {}
    details = body.get("details") if isinstance(body.get("details"), dict) else {}
    message = str(body.get("message") or exc.reason or "")
    causes = [c.get("message") for c in details.get("causes") or []
              if isinstance(c, dict) and c.get("message")]
    if causes:
        message += " (" + "; ".join(str(c) for c in causes)[:500] + ")"
    return message, str(body.get("reason") or ""), details


def translate(exc: BaseException, what: str) -> ApiError:
    """Map `exc` (ApiException, OSError, TimeoutError, aiohttp errors) to an ApiError named
    `what`; an ApiError is returned as it is (never translated twice)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message, reason, details = _status(exc)
        retry_after = None
        headers = exc.headers or {}
        if headers.get("Retry-After"):
            try:
                retry_after = float(headers["Retry-After"])
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
    return Unavailable(what, 0, repr(exc)[:300])


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
