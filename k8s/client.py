"""The one typed Kubernetes client of the production code: every call the binder, the
webhook, housekeeping and VM waiting make on the API server (reads, patches, creates and
deletes of GPUDevices, GPUClasses, VMIs, VMs, ResourceClaims, Events, ConfigMaps and Leases), each bounded by the
client's timeout and each translating kubernetes_asyncio's exceptions once into
`k8s.errors.ApiError` types (status, message, the API Status's `reason` and `details`,
Retry-After). Nothing outside this module and the informers sees a client exception.

Objects travel as plain dicts, as the API server sends them. Writes carry the client's
field manager (B8 is checked through managedFields); `using` makes a sibling client with
another field manager or timeout over the same connection pool. `resolve_environment_once`
keeps the process's ApiClient from looking the environment up on every request;
`reuse_newest_first` lets its pool shrink back after a burst (`NewestFirstConnector`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp
import anyio
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api, CoreV1Api, CustomObjectsApi

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
    260 KiB of buffers: a young replica's RSS rose by that for tens of minutes (the soak,
    issue 41 item 5). Newest first, the connections a burst added go unused once it is
    over, and aiohttp's keep-alive clean-up closes them.

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
    Each TLS connection costs about 260 KiB of buffers (asyncio's SSL protocol), so a
    replica's RSS follows this figure. None when the session's connector is not aiohttp's
    TCPConnector as expected (the counts are aiohttp's private fields). Raises nothing."""
    connector = _connector(api)
    acquired = getattr(connector, "_acquired", None)
    conns = getattr(connector, "_conns", None)
    if not isinstance(acquired, set) or not isinstance(conns, dict):
        return None
    return {"in_use": len(acquired), "idle": sum(len(v) for v in conns.values()),
            "limit": int(getattr(connector, "limit", 0) or 0)}


T = TypeVar("T")

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


class KubeClient:
    """The API calls of the production code over one kubernetes_asyncio `ApiClient`.

    `timeout` (seconds, > 0) bounds every call, on the client (`_request_timeout`) and on
    the loop (`anyio.fail_after`); `field_manager` is written on every create, patch and
    replace. Every method raises `k8s.errors.ApiError` (translated once, with the API
    Status's `reason` and `details`; a timeout or broken connection is `Unavailable`),
    never a client exception; cancellation propagates. Raises ValueError for a timeout
    that is not positive."""

    def __init__(self, api: ApiClient, *, timeout: float = 5.0,
                 field_manager: str = "gpu-binder") -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        self._api = api
        self._custom = CustomObjectsApi(api)
        self._core = CoreV1Api(api)
        self._coordination = CoordinationV1Api(api)
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

    async def _call(self, what: str, call: Callable[..., Awaitable[T]], *args: Any,
                    **kwargs: Any) -> T:
        """`await call(*args, **kwargs, _request_timeout=timeout)` within `timeout` seconds;
        any failure raised as the translated ApiError named `what`."""
        try:
            with anyio.fail_after(self.timeout):
                return await call(*args, _request_timeout=self.timeout, **kwargs)
        except Exception as exc:  # noqa: BLE001 - translated; cancellation is no Exception
            raise errors.translate(exc, what) from exc

    # -- custom resources --------------------------------------------------------------
    async def get(self, res: Resource, ns: str | None, name: str) -> dict:
        """The object `ns/name` (`ns` None or "" for a cluster-scoped kind) as the API
        server has it now. A missing one raises errors.NotFound (`err.names(name)` tells
        the object's absence from an unknown kind)."""
        what = f"read {_where(res, ns, name)}"
        if res.namespaced:
            return await self._call(what, self._custom.get_namespaced_custom_object,
                                    res.group, res.version, ns, res.plural, name)
        return await self._call(what, self._custom.get_cluster_custom_object,
                                res.group, res.version, res.plural, name)

    async def get_status(self, res: Resource, ns: str, name: str) -> dict:
        """The namespaced object `ns/name` read through its status subresource."""
        return await self._call(f"read {_where(res, ns, name)}",
                                self._custom.get_namespaced_custom_object_status,
                                res.group, res.version, ns, res.plural, name)

    async def patch_status(self, res: Resource, ns: str | None, name: str,
                           body: list[dict] | dict, *, what: str | None = None) -> dict:
        """Patch the status subresource of `ns/name` (`ns` None or "" for a cluster-scoped
        kind): a list `body` is a JSON Patch (RFC 6902: a failed `test` op raises
        errors.Invalid), a dict a JSON merge patch. Returns the object written. `what`
        names the call in errors (default: "patch status of <kind> <ns/name>")."""
        what = what or f"patch status of {_where(res, ns, name)}"
        ctype = JSON_PATCH if isinstance(body, list) else MERGE_PATCH
        if res.namespaced:
            return await self._call(what, self._custom.patch_namespaced_custom_object_status,
                                    res.group, res.version, ns, res.plural, name, body,
                                    _content_type=ctype, field_manager=self.field_manager)
        return await self._call(what, self._custom.patch_cluster_custom_object_status,
                                res.group, res.version, res.plural, name, body,
                                _content_type=ctype, field_manager=self.field_manager)

    async def create(self, res: Resource, ns: str | None, body: dict, *,
                     what: str | None = None) -> dict:
        """Create the object `body` in `ns` (None or "" for a cluster-scoped kind); the
        object created. One of that name already there raises errors.AlreadyExists."""
        what = what or f"create {_where(res, ns, body['metadata'].get('name'))}"
        if not res.namespaced:
            return await self._call(what, self._custom.create_cluster_custom_object,
                                    res.group, res.version, res.plural, body,
                                    field_manager=self.field_manager)
        return await self._call(what, self._custom.create_namespaced_custom_object,
                                res.group, res.version, ns, res.plural, body,
                                field_manager=self.field_manager)

    async def patch(self, res: Resource, ns: str, name: str, body: list[dict], *,
                    what: str | None = None) -> dict:
        """JSON Patch (RFC 6902; a failed `test` op raises errors.Invalid) of the namespaced
        object `ns/name` itself (not a subresource); the object written."""
        return await self._call(what or f"patch {_where(res, ns, name)}",
                                self._custom.patch_namespaced_custom_object,
                                res.group, res.version, ns, res.plural, name, body,
                                _content_type=JSON_PATCH, field_manager=self.field_manager)

    async def delete(self, res: Resource, ns: str | None, name: str, *, uid: str | None = None,
                     resource_version: str | None = None, what: str | None = None) -> None:
        """Delete the object `ns/name` (`ns` None or "" for a cluster-scoped kind), only while
        it still has `uid` and `resource_version` when given (preconditions: errors.Conflict
        otherwise). `what` names the call in errors (default: "delete <kind> <ns/name>")."""
        pre = {"uid": uid} if uid else {}
        if resource_version:
            pre["resourceVersion"] = resource_version
        if not res.namespaced:
            await self._call(what or f"delete {_where(res, ns, name)}",
                             self._custom.delete_cluster_custom_object,
                             res.group, res.version, res.plural, name,
                             body={"preconditions": pre} if pre else {})
            return
        await self._call(what or f"delete {_where(res, ns, name)}",
                         self._custom.delete_namespaced_custom_object,
                         res.group, res.version, ns, res.plural, name,
                         body={"preconditions": pre} if pre else {})

    # -- core --------------------------------------------------------------------------
    async def create_event(self, ns: str, body: dict) -> None:
        """Create the core/v1 Event `body` in `ns` (see `k8s.events.event_body`)."""
        await self._call(f"create Event in {ns}", self._core.create_namespaced_event, ns, body)

    async def create_config_map(self, ns: str, body: dict, *, what: str | None = None) -> dict:
        """Create the ConfigMap `body` in `ns`; errors.AlreadyExists when it exists. `what`
        names the call in errors (default: "create ConfigMap <ns/name>")."""
        return await self._call(what or f"create ConfigMap {ns}/{body['metadata']['name']}",
                                self._core.create_namespaced_config_map, ns, body,
                                field_manager=self.field_manager)

    async def replace_config_map(self, ns: str, name: str, body: dict, *,
                                 what: str | None = None) -> dict:
        """Replace ConfigMap `ns/name` by `body` (its `metadata.resourceVersion`: a stale
        one raises errors.Conflict). `what` names the call in errors (default: "replace
        ConfigMap <ns/name>")."""
        return await self._call(what or f"replace ConfigMap {ns}/{name}",
                                self._core.replace_namespaced_config_map, name, ns, body,
                                field_manager=self.field_manager)

    # -- leases ------------------------------------------------------------------------
    async def read_lease(self, ns: str, name: str) -> dict | None:
        """Lease `ns/name` as a dict (decoded by orjson, not into a model); None when the
        API server answers 404."""
        what = f"read Lease {ns}/{name}"

        async def read(**kw: Any) -> dict:
            resp = await self._coordination.read_namespaced_lease(
                name, ns, _preload_content=False, **kw)
            return await errors.read_json(resp, what)
        try:
            return await self._call(what, read)
        except errors.NotFound:
            return None

    async def create_lease(self, ns: str, body: dict) -> None:
        """Create the Lease `body` in `ns`; errors.AlreadyExists when it exists."""
        await self._call(f"create Lease {ns}/{body['metadata']['name']}",
                         self._coordination.create_namespaced_lease, ns, body)

    async def replace_lease(self, ns: str, name: str, body: dict) -> None:
        """Replace Lease `ns/name` by `body` (its `metadata.resourceVersion`: a stale one
        raises errors.Conflict)."""
        await self._call(f"replace Lease {ns}/{name}",
                         self._coordination.replace_namespaced_lease, name, ns, body)

    # -- informers ---------------------------------------------------------------------
    def lister(self, res: Resource) -> Callable[..., Awaitable[Any]]:
        """The kubernetes_asyncio list call over every namespace of `res`, for an
        `k8s.informer.Informer`, which lists and watches with it (its errors are the
        informer's to handle, as for every informer's list call)."""
        return functools.partial(self._custom.list_cluster_custom_object, res.group,
                                 res.version, res.plural)
