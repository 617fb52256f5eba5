"""The one typed Kubernetes client of the production code: every call the binder, the
webhook, housekeeping and VM waiting make on the API server (reads, patches, creates and
deletes of GPUDevices, GPUClasses, VMIs, VMs, ResourceClaims, Events, ConfigMaps and
Leases), each bounded by the client's timeout and each failure translated once into a
`k8s.errors.ApiError` type (status, message, the API Status's `reason` and `details`,
Retry-After). Nothing outside this module and the informers sees a client exception.

The calls take one raw path (`KubeClient._request`): the kubernetes_asyncio `ApiClient`'s
aiohttp session, host, TLS and authentication, but none of its per-call machinery (request
building, serialisation, response decoding by the standard json module), which a replica's
profile showed at a quarter of its CPU (issue 40 item 5). Objects travel as plain dicts,
encoded and decoded by orjson, as the API server sends them. Writes carry the client's
field manager (B8 is checked through managedFields); `using` makes a sibling client with
another field manager or timeout over the same connection pool. The informers list and
watch through kubernetes_asyncio (`KubeClient.lister`). `resolve_environment_once` keeps
the process's ApiClient from looking the environment up on every request;
`reuse_newest_first` lets its pool shrink back after a burst (`NewestFirstConnector`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import quote

import aiohttp
import anyio
import orjson
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from k8s import errors
from model.types import GROUP, VERSION


def resolve_environment_once(api: ApiClient) -> ApiClient:
    """`api` with its HTTP session's environment read once, here, instead of on every
    request. kubernetes_asyncio's session trusts the environment, so aiohttp looks up
    ~/.netrc and the proxy variables in a worker thread on every API call: two thread hops
    per call on the admission path (seen in py-spy of a replica). The proxy the environment
    gives the API server's URL (HTTPS_PROXY and NO_PROXY, read by aiohttp's own rule) is
    kept as the client's proxy when it has none, and the session is replaced by one that
    does not trust the environment, on the same connector (its connections and TLS
    context). No netrc credentials are sent to the API server: Kubernetes authenticates
    the kubeconfig's token or certificate. Returns `api`; raises nothing of its own."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    rest = api.rest_client
    old = rest.pool_manager
    if not old.trust_env:
        return api
    if not rest.proxy:
        with contextlib.suppress(LookupError, ValueError):
            proxy, auth = get_env_proxy_for_url(URL(api.configuration.host))
            if auth is not None:
                proxy = proxy.with_user(auth.login).with_password(auth.password)
            rest.proxy = str(proxy)
    connector = old.connector
    old.detach()  # the connector goes on with the new session, open
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False,
                                              read_bufsize=2**21)  # as kubernetes_asyncio's
    return api


class NewestFirstConnector(aiohttp.TCPConnector):
    """aiohttp's TCPConnector that reuses the idle connection released last (newest first),
    so the pool shrinks back to what the traffic needs after a burst.

    aiohttp (3.14 here) hands out the idle connection released *first*: after a burst of N
    parallel calls, steady traffic of more than N calls per keep-alive period (15 s) uses
    every one of the N in turn, none stays idle that long, and the pool keeps N open for
    good. Each burst ratchets it up towards its limit (100), each TLS connection with about
    260 KiB of buffers (110 KiB since actors.heap's 64 KiB read buffer): a young replica's
    RSS rose by that for tens of minutes (the soak, issue 41 item 5). Newest first, the
    connections a burst added go unused once it is over, and aiohttp's keep-alive clean-up
    closes them.

    Reads aiohttp's private pool (`_conns`, one deque of (connection, released at) per
    host, appended on release); when its shape is another (older aiohttp: a list it pops
    newest first already) nothing is changed. tests/k8s/test_connection_metrics.py checks
    the behaviour on the installed aiohttp."""

    async def _get(self, key, *args, **kwargs):  # type: ignore[override]
        conns = self._conns.get(key)
        if isinstance(conns, deque) and len(conns) > 1:
            conns.rotate(1)       # the one released last goes first
        return await super()._get(key, *args, **kwargs)


def _connector(api: ApiClient) -> object | None:
    """The connector of `api`'s HTTP session (aiohttp's), or None."""
    return getattr(getattr(api.rest_client, "pool_manager", None), "connector", None)


def reuse_newest_first(api: ApiClient) -> ApiClient:
    """`api` with its pool's connector a `NewestFirstConnector` (the same object, its
    connections kept) when it is aiohttp's TCPConnector; else unchanged. Returns `api`;
    raises nothing."""
    connector = _connector(api)
    if type(connector) is aiohttp.TCPConnector:
        connector.__class__ = NewestFirstConnector
    return api


def pool_connections(api: ApiClient) -> dict[str, int] | None:
    """The API client's connection pool now (`gpu_binder_api_connections`): {"in_use":
    connections lent to a call or an open watch, "idle": kept alive for the next call,
    "limit": the most open at once (kubernetes_asyncio's `connection_pool_maxsize`, 100)}.
    Each TLS connection costs about 110 KiB of buffers (asyncio's SSL protocol with the
    64 KiB read buffer of actors.heap.limit_tls_read_buffer; 260 KiB before), so a
    replica's RSS follows this figure. None when the session's connector is not aiohttp's
    TCPConnector as expected (the counts are aiohttp's private fields). Raises nothing."""
    connector = _connector(api)
    acquired = getattr(connector, "_acquired", None)
    conns = getattr(connector, "_conns", None)
    if not isinstance(acquired, set) or not isinstance(conns, dict):
        return None
    return {"in_use": len(acquired), "idle": sum(len(v) for v in conns.values()),
            "limit": int(getattr(connector, "limit", 0) or 0)}


JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Resource:
    """A custom resource kind: `group`, `version`, `plural`, whether it is `namespaced`,
    and `kind` (for messages)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True


GPU_DEVICES = Resource(GROUP, VERSION, "gpudevices", "GPUDevice")
GPU_CLASSES = Resource(GROUP, VERSION, "gpuclasses", "GPUClass", namespaced=False)
VMIS = Resource("kubevirt.io", "v1", "virtualmachineinstances", "VMI")
VMS = Resource("kubevirt.io", "v1", "virtualmachines", "VM")
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
"""DRA claims (built in, served at the same paths as a custom resource's): the webhook's
claim of a device-mode set (DR5) and housekeeping's deletes (H1/H2)."""
DEVICE_TAINT_RULES = Resource("resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule",
                              namespaced=False)
"""DRA device taint rules (built in; served from Kubernetes 1.36 behind the DRADeviceTaintRules
gate): the mark of a suspected GPU (HL2)."""


def _where(res: Resource, ns: str | None, name: str | None = None) -> str:
    """`GPUDevice ns/name`, `GPUClass name`, `Event in ns`: what a call is about."""
    if name is None:
        return f"{res.kind} in {ns}"
    return f"{res.kind} {ns}/{name}" if ns else f"{res.kind} {name}"


EVENTS = Resource("", "v1", "events", "Event")
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")

_JSON = "application/json"
_AUTH = ("BearerToken",)  # the auth settings every Kubernetes API operation names


def _path(res: Resource, ns: str | None, name: str | None = None, *,
          status: bool = False) -> str:
    """The API server's path of `res` in `ns` (ignored for a cluster-scoped kind): its
    collection, or the object `name`, or that object's status subresource. The core group
    ("") is served under /api, every other under /apis. Names are percent-encoded."""
    path = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
    if res.namespaced:
        path += f"/namespaces/{quote(ns or '', safe='')}"
    path += f"/{res.plural}"
    if name is not None:
        path += f"/{quote(name, safe='')}"
    return path + "/status" if status else path


class KubeClient:
    """The API calls of the production code over one kubernetes_asyncio `ApiClient`.

    Every call goes through `_request`, the raw path: the ApiClient's own aiohttp session
    (its connector, pool and TLS), host, proxy and authentication (its Configuration's
    token, refreshed by the Configuration's hook as kubernetes_asyncio would), with bodies
    encoded and decoded by orjson and no typed models, so none of kubernetes_asyncio's
    per-call machinery runs (issue 40 item 5: it was a quarter of a replica's CPU). Only
    the informers' list and watch (`lister`) go through kubernetes_asyncio.

    `timeout` (seconds, > 0) bounds every call, on the session (aiohttp's total timeout)
    and on the loop (`anyio.fail_after`); `field_manager` is written on every create,
    patch and replace (the `fieldManager` query parameter). Every method raises
    `k8s.errors.ApiError` (translated once, by `k8s.errors.from_response`, with the API
    Status's `reason`, `details` and Retry-After; a timeout or broken connection is
    `Unavailable` with status 0), never a client exception; cancellation propagates.
    Raises ValueError for a timeout that is not positive."""

    def __init__(self, api: ApiClient, *, timeout: float = 5.0,
                 field_manager: str = "gpu-binder") -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        self._api = api
        self._custom = CustomObjectsApi(api)
        self.timeout = timeout
        self.field_manager = field_manager

    def using(self, *, field_manager: str | None = None,
              timeout: float | None = None) -> "KubeClient":
        """A copy of this client (of its class: a test's wrapper stays one) over the same
        `ApiClient`, with another field manager and/or timeout (None: this client's).
        Raises ValueError for a timeout that is not positive."""
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        other = copy.copy(self)
        other.timeout = self.timeout if timeout is None else timeout
        other.field_manager = field_manager or self.field_manager
        return other

    async def _request(self, what: str, method: str, path: str, body: Any = None, *,
                       content_type: str = _JSON, write: bool = False,
                       decode: bool = True) -> Any:
        """Send `method` `path` (from `_path`) with `body` (a dict or list encoded by
        orjson; None: no body) of `content_type`, carrying the field manager when `write`,
        within `timeout` seconds; the answer's JSON object as a dict when `decode`, else
        None (the body is read and dropped). A non-2xx answer raises its
        `errors.from_response` type; a timeout, a broken connection, an authentication
        hook's failure or an answer that is not a JSON object raises errors.Unavailable
        (status 0); all named `what`."""
        api = self._api
        rest = api.rest_client
        url = api.configuration.host + path
        if write:
            url += "?fieldManager=" + quote(self.field_manager, safe="")
        headers = {"Accept": _JSON, "Content-Type": content_type, **api.default_headers}
        if api.cookie:
            headers["Cookie"] = api.cookie
        extra: dict[str, Any] = {}
        if rest.proxy:
            extra["proxy"] = rest.proxy
            if rest.proxy_headers:
                extra["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        try:
            with anyio.fail_after(self.timeout):
                await api.update_params_for_auth(headers, None, _AUTH)
                resp = await rest.pool_manager.request(
                    method, url, headers=headers,
                    data=None if body is None else orjson.dumps(body),
                    timeout=aiohttp.ClientTimeout(total=self.timeout), **extra)
                try:
                    data = await resp.read()
                finally:
                    resp.release()
        except Exception as exc:  # noqa: BLE001 - translated; cancellation is no Exception
            raise errors.translate(exc, what) from exc
        if not 200 <= resp.status <= 299:
            raise errors.from_response(what, resp.status, str(resp.reason or ""), data,
                                       resp.headers)
        if not decode:
            return None
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as err:
            raise errors.Unavailable(what, 0, f"response is not JSON: {err}") from err
        if not isinstance(doc, dict):
            raise errors.Unavailable(what, 0, "response is not a JSON object")
        return doc

    # -- any kind ----------------------------------------------------------------------
    async def get(self, res: Resource, ns: str | None, name: str) -> dict:
        """The object `ns/name` (`ns` None or "" for a cluster-scoped kind) as the API
        server has it now. A missing one raises errors.NotFound (`err.names(name)` tells
        the object's absence from an unknown kind)."""
        return await self._request(f"read {_where(res, ns, name)}", "GET",
                                   _path(res, ns, name))

    async def get_status(self, res: Resource, ns: str, name: str) -> dict:
        """The namespaced object `ns/name` read through its status subresource."""
        return await self._request(f"read {_where(res, ns, name)}", "GET",
                                   _path(res, ns, name, status=True))

    async def patch_status(self, res: Resource, ns: str | None, name: str,
                           body: list[dict] | dict, *, what: str | None = None) -> dict:
        """Patch the status subresource of `ns/name` (`ns` None or "" for a cluster-scoped
        kind): a list `body` is a JSON Patch (RFC 6902: a failed `test` op raises
        errors.Invalid), a dict a JSON merge patch. Returns the object written. `what`
        names the call in errors (default: "patch status of <kind> <ns/name>")."""
        return await self._request(
            what or f"patch status of {_where(res, ns, name)}", "PATCH",
            _path(res, ns, name, status=True), body,
            content_type=JSON_PATCH if isinstance(body, list) else MERGE_PATCH, write=True)

    async def create(self, res: Resource, ns: str | None, body: dict, *,
                     what: str | None = None) -> dict:
        """Create the object `body` in `ns` (None or "" for a cluster-scoped kind); the
        object created. One of that name already there raises errors.AlreadyExists."""
        return await self._request(
            what or f"create {_where(res, ns, body['metadata'].get('name'))}", "POST",
            _path(res, ns), body, write=True)

    async def patch(self, res: Resource, ns: str, name: str, body: list[dict], *,
                    what: str | None = None) -> dict:
        """JSON Patch (RFC 6902; a failed `test` op raises errors.Invalid) of the namespaced
        object `ns/name` itself (not a subresource); the object written."""
        return await self._request(what or f"patch {_where(res, ns, name)}", "PATCH",
                                   _path(res, ns, name), body, content_type=JSON_PATCH,
                                   write=True)

    async def replace(self, res: Resource, ns: str | None, name: str, body: dict, *,
                      what: str | None = None) -> dict:
        """Replace the object `ns/name` by `body` (its `metadata.resourceVersion`: a stale
        one raises errors.Conflict); the object written. `what` names the call in errors
        (default: "replace <kind> <ns/name>")."""
        return await self._request(what or f"replace {_where(res, ns, name)}", "PUT",
                                   _path(res, ns, name), body, write=True)

    async def delete(self, res: Resource, ns: str | None, name: str, *, uid: str | None = None,
                     resource_version: str | None = None, what: str | None = None) -> None:
        """Delete the object `ns/name` (`ns` None or "" for a cluster-scoped kind), only while
        it still has `uid` and `resource_version` when given (preconditions: errors.Conflict
        otherwise). `what` names the call in errors (default: "delete <kind> <ns/name>")."""
        pre = {"uid": uid} if uid else {}
        if resource_version:
            pre["resourceVersion"] = resource_version
        await self._request(what or f"delete {_where(res, ns, name)}", "DELETE",
                            _path(res, ns, name), {"preconditions": pre} if pre else None,
                            decode=False)

    # -- core --------------------------------------------------------------------------
    async def create_event(self, ns: str, body: dict) -> None:
        """Create the core/v1 Event `body` in `ns` (see `k8s.events.event_body`)."""
        await self._request(f"create Event in {ns}", "POST", _path(EVENTS, ns), body,
                            write=True, decode=False)

    async def create_config_map(self, ns: str, body: dict, *, what: str | None = None) -> dict:
        """Create the ConfigMap `body` in `ns`; errors.AlreadyExists when it exists. `what`
        names the call in errors (default: "create ConfigMap <ns/name>")."""
        return await self.create(CONFIG_MAPS, ns, body, what=what)

    async def replace_config_map(self, ns: str, name: str, body: dict, *,
                                 what: str | None = None) -> dict:
        """Replace ConfigMap `ns/name` by `body` (its `metadata.resourceVersion`: a stale
        one raises errors.Conflict). `what` names the call in errors (default: "replace
        ConfigMap <ns/name>")."""
        return await self.replace(CONFIG_MAPS, ns, name, body, what=what)

    # -- leases ------------------------------------------------------------------------
    async def read_lease(self, ns: str, name: str) -> dict | None:
        """Lease `ns/name` as a dict; None when the API server answers 404."""
        try:
            return await self.get(LEASES, ns, name)
        except errors.NotFound:
            return None

    async def create_lease(self, ns: str, body: dict) -> None:
        """Create the Lease `body` in `ns`; errors.AlreadyExists when it exists."""
        await self._request(f"create {_where(LEASES, ns, body['metadata']['name'])}", "POST",
                            _path(LEASES, ns), body, write=True, decode=False)

    async def replace_lease(self, ns: str, name: str, body: dict) -> None:
        """Replace Lease `ns/name` by `body` (its `metadata.resourceVersion`: a stale one
        raises errors.Conflict)."""
        await self._request(f"replace {_where(LEASES, ns, name)}", "PUT",
                            _path(LEASES, ns, name), body, write=True, decode=False)

    # -- informers ---------------------------------------------------------------------
    def lister(self, res: Resource) -> Callable[..., Awaitable[Any]]:
        """The kubernetes_asyncio list call over every namespace of `res`, for an
        `k8s.informer.Informer`, which lists and watches with it (its errors are the
        informer's to handle, as for every informer's list call)."""
        return functools.partial(self._custom.list_cluster_custom_object, res.group,
                                 res.version, res.plural)
