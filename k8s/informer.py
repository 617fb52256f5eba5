"""Informers: list + watch one resource into a shared read-only cache (controller style).

An `Informer` lists, then watches from the list's resourceVersion with bookmarks and both
timeouts set, each watch line decoded once, by orjson (`OrjsonWatch`); a watch that times
out resumes from the last resourceVersion seen, and a 410 Gone (or any watch error) leads
to a fresh list. Lists are paginated (`limit` +
`continue`), and every object passes a `transform` at ingest that keeps only what the code
reads (bounded memory: no managedFields, no foreign annotations; see `slim`). Consumers read
the cache (`get`, `items`) and learn *which keys changed* through listeners, called
synchronously on every change; a listener that has work to do queues the key in a
coalescing work queue of its own (`actors.workqueue.WorkQueue`): level-based, so a slow
consumer never makes the informer buffer events without bound.
"""

from __future__ import annotations

import math
from typing import Any, Awaitable, Callable, Iterable

import anyio
import orjson
import structlog
from anyio.abc import TaskStatus
from kubernetes_asyncio.client import ApiException
from kubernetes_asyncio.watch import Watch

from k8s.errors import read_json, translate

log = structlog.get_logger("gpu_binder.informer")

Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""


OUR_PREFIX = "gpu.cozystack.io/"
PAGE_SIZE = 250
"""Objects per list page: bounds the raw bytes held at once during a (re)list."""


def _ours(mapping: Any) -> dict:
    if not isinstance(mapping, dict):
        return {}
    return {k: v for k, v in mapping.items() if isinstance(k, str) and k.startswith(OUR_PREFIX)}


def slim(obj: dict, *, foreign_labels: bool = True) -> dict:
    """The default ingest transform: `obj` without `metadata.managedFields` and with only
    our annotations (prefix `gpu.cozystack.io/`); with `foreign_labels=False` also only our
    labels (for tenant-owned kinds whose labels no rule reads). Mutates and returns `obj`."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        if "annotations" in meta:
            meta["annotations"] = _ours(meta["annotations"])
        if not foreign_labels and "labels" in meta:
            meta["labels"] = _ours(meta["labels"])
    return obj


def keep_all(obj: dict) -> dict:
    """An ingest transform that only drops `metadata.managedFields` (small objects whose
    every field is read, e.g. the settings ConfigMap that housekeeping replaces)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def key_of(obj: dict) -> Key:
    """The cache key of an API object dict."""
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def share_strings(new: Any, old: Any) -> None:
    """Make every string of `new` that equals the string at the same place in `old` (same
    keys, same list index) that very object of `old`'s; mutates `new`, reads `old`.

    A watch event replacing a cached object decodes fresh strings, while what was built from
    the cached one keeps the old, equal ones: dict keys (a dict assignment keeps the key it
    has), the view's values kept when equal (`VMIRecord`, `Node`). Listed objects share
    their strings with all of that; without this, each replaced object's name, namespace,
    uid, node name and the like would be held twice for as long as it lives (issue 41
    item 5: +10 % blocks per watched object over a listed one)."""
    if type(new) is dict:
        if type(old) is not dict:
            return
        for k, v in new.items():
            t = type(v)
            if t is str:
                o = old.get(k)
                if type(o) is str and o == v:
                    new[k] = o
            elif t is dict or t is list:
                share_strings(v, old.get(k))
    elif type(new) is list and type(old) is list:
        for i, (v, o) in enumerate(zip(new, old)):
            t = type(v)
            if t is str:
                if type(o) is str and o == v:
                    new[i] = o
            elif t is dict or t is list:
                share_strings(v, o)


def _same_version(cached: dict, listed: dict) -> bool:
    """Whether `listed` (raw, from a list) is the version `cached` holds: both carry the
    same non-empty metadata.resourceVersion (an object's every change gets a new one)."""
    rv = (listed.get("metadata") or {}).get("resourceVersion")
    return bool(rv) and (cached.get("metadata") or {}).get("resourceVersion") == rv


class _NoApiClient:
    """What `OrjsonWatch` holds as its `_api_client`: the stock `Watch.close` closes it;
    nothing to close, nothing to decode with."""

    async def close(self) -> None:
        return None


_NO_API_CLIENT = _NoApiClient()


class OrjsonWatch(Watch):
    """kubernetes_asyncio's `Watch` with each event line decoded once, by orjson: the
    event's `object` is the dict decoded (also as `raw_object`), never encoded and decoded
    again into a model (the stock `Watch` decodes with stdlib json and, for
    `return_type="object"`, dumps and loads each object a second time). The rest is the
    stock contract: `resource_version` follows every event carrying one and every BOOKMARK
    (a BOOKMARK without one raises ValueError), an ERROR event raises ApiException with its
    Status `code` (410 Gone: the caller relists), a line that is not JSON is returned as
    it is, and a JSON line that is no event raises ApiException (it carries a `code`) or
    ValueError.

    No `ApiClient` of its own: the stock `Watch` makes one per watch only to decode models,
    which this class never does, and each is a new TLS context with the CA bundle loaded
    (tens of ms of CPU per watch started, every informer's at a replica's start)."""

    def __init__(self, return_type: str | None = None) -> None:
        # the stock __init__'s attributes, `_api_client` a no-op (see the class docstring)
        self._raw_return_type = return_type
        self._stop = False
        self._api_client = _NO_API_CLIENT
        self.resource_version = None
        self.resp = None

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        try:
            js = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(js, dict) or "object" not in js or "type" not in js:
            if isinstance(js, dict) and "code" in js:
                raise ApiException(status=js["code"],
                                   reason=f"{js.get('reason')}: {js.get('message')}")
            raise ValueError(f"watch: not an event: {str(data)[:300]}")
        obj = js["raw_object"] = js["object"]
        kind = str(js["type"]).lower()
        if kind == "error":
            raise ApiException(status=obj["code"], reason=f"{obj['reason']}: {obj['message']}")
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and "resourceVersion" in meta:
            self.resource_version = meta["resourceVersion"]
        elif kind == "bookmark":
            raise ValueError(f"watch: a BOOKMARK without metadata.resourceVersion: "
                             f"{str(data)[:300]}")
        return js


class Informer:
    """list+watch of one resource into a cache of plain dicts.

    `list_fn` is a kubernetes_asyncio list call (e.g. `CoreV1Api.list_node`, or a
    `functools.partial` of `CustomObjectsApi.list_cluster_custom_object` with group,
    version and plural). Run it with `await task_group.start(informer.run)`: start returns
    after the first list (the cache has synced). Errors other than cancellation are logged
    and retried with capped exponential backoff (at least the server's Retry-After, capped
    too); `run` only returns when cancelled. `transform(obj) -> obj` is applied to every
    listed or watched object before it is cached or shown to listeners (default `slim`).
    `relist_every` (seconds, None: never): list again that often besides the watch (each
    watch then ends by then), and log what the watch had missed (`missed` counts the
    objects): for small resources a placement must never read stale (DeviceTaintRules,
    HL1), since a kube-apiserver restarting under load was seen to leave a rule made while
    it came up out of the watches of the binder and of kube-scheduler alike (bench soak
    --mode device, 2026-12-06), while a list has it.
    """

    def __init__(self, name: str, list_fn: Callable[..., Awaitable[Any]], *,
                 watch_timeout: int = 240, backoff_max: float = 10.0,
                 transform: Callable[[dict], dict] = slim, page_size: int = PAGE_SIZE,
                 optional: bool = False, absent_retry: float = 60.0,
                 relist_every: float | None = None) -> None:
        self.name = name
        self._transform = transform  # what the cache keeps of each object (e.g. trimmed Pods)
        self._list_fn = list_fn
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff_max = backoff_max
        self._cache: dict[Key, dict] = {}
        self._listeners: list[Callable[[Key, dict | None], None]] = []
        self._synced: list[Callable[[], None]] = []
        self.resource_version: str | None = None
        self.relists = 0
        self.events = 0
        self.pages = 0
        self.errors = 0
        self._healthy = False
        self.optional = optional
        self.absent_retry = absent_retry
        self.absent = False
        self.relist_every = relist_every
        self.missed = 0
        self._listed_at: float | None = None

    @property
    def healthy(self) -> bool:
        """True once a list succeeded and no list or watch has failed since: the cache
        follows the API server. False before the first list and from a failure until the
        next successful list (meanwhile the cache may be behind: destructive consumers,
        such as housekeeping, pause)."""
        return self._healthy

    # -- reading ---------------------------------------------------------------------
    def get(self, key: Key) -> dict | None:
        """The cached object at `key`, or None when it does not exist (or was deleted)."""
        return self._cache.get(key)

    def items(self) -> Iterable[dict]:
        """A snapshot list of every cached object."""
        return list(self._cache.values())

    def keys(self) -> set[Key]:
        """The keys of every cached object."""
        return set(self._cache)

    def add_listener(self, fn: Callable[[Key, dict | None], None]) -> None:
        """Call `fn(key, obj)` synchronously on every change (`obj` None: deleted). After a
        relist it is called for every key listed and every key that vanished."""
        self._listeners.append(fn)

    def add_synced_listener(self, fn: Callable[[], None]) -> None:
        """Call `fn()` after every successful list, once the listeners were told of each key,
        and when an optional API reads as not served: the cache follows the API server now,
        which no per-key call says when the list was empty."""
        self._synced.append(fn)

    def remove_listener(self, fn: Callable[[Key, dict | None], None]) -> None:
        """Stop calling `fn` (a consumer going away); no-op when it is not a listener."""
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _tell(self, key: Key, obj: dict | None) -> None:
        for fn in self._listeners:
            fn(key, obj)

    # -- running ---------------------------------------------------------------------
    async def _list(self, *, periodic: bool = False) -> str:
        """List every page into a fresh cache, telling listeners; `periodic` (a relist the
        watch did not ask for, `relist_every`): say what the watch had missed. Returns the
        list's resourceVersion.

        A listed object whose resourceVersion equals the cached one's is the same object:
        the cached one is kept (not transformed again) and the page's copy is dropped with
        the page. So a relist holds the old cache plus one raw page plus what changed, not
        two caches: after a kube-apiserver restart the leader's informers relisted while
        holding their old objects, 255 -> 306 MiB at 1,000 nodes (bench soak, 2026-12-07)."""
        fresh: dict[Key, dict] = {}
        cache = self._cache
        token: str | None = None
        pages = 0
        while True:  # one consistent snapshot, page by page (410: the token expired; relist)
            extra = {"_continue": token} if token else {}
            resp = await self._list_fn(_preload_content=False, _request_timeout=60,
                                       limit=self._page_size, **extra)
            body = await read_json(resp, f"list {self.name}")
            for o in body.get("items") or []:
                k = key_of(o)
                same = cache.get(k)
                if same is None:
                    same = self._transform(o)
                else:   # the key of the strings kept (`share_strings`), not of the page's
                    if not _same_version(same, o):
                        old, same = same, self._transform(o)
                        share_strings(same, old)
                    k = key_of(same)
                fresh[k] = same
            pages += 1
            meta = body.get("metadata") or {}
            rv = meta.get("resourceVersion") or ""  # the snapshot's, the same on every page
            token = meta.get("continue") or None
            del resp, body  # the page's raw items are garbage now; only slim objects stay
            if token is None:
                break
        self.pages = pages
        self.absent = False
        gone = set(self._cache) - set(fresh)
        if periodic:
            self._say_missed(gone, fresh)
        self._listed_at = anyio.current_time()
        self._cache = fresh
        self.relists += 1
        self._healthy = True
        for k in gone:
            self._tell(k, None)
        for k, o in fresh.items():
            self._tell(k, o)
        for fn in self._synced:
            fn()
        return rv

    def _say_missed(self, gone: set[Key], fresh: dict[Key, dict]) -> None:
        """A periodic relist (`relist_every`): one JSON line naming what the watch had not
        brought (objects new, changed or gone since the cache's last state), if anything."""
        def rv(o: dict | None) -> str | None:
            return ((o or {}).get("metadata") or {}).get("resourceVersion")
        new = [k for k, o in fresh.items() if k not in self._cache]
        changed = [k for k, o in fresh.items() if k in self._cache and rv(o) != rv(self._cache[k])]
        if not (new or changed or gone):
            return
        self.missed += len(new) + len(changed) + len(gone)
        log.warning("relist found what the watch missed", informer=self.name,
                    new=[k[1] for k in sorted(new)][:5], changed=[k[1] for k in sorted(changed)][:5],
                    gone=[k[1] for k in sorted(gone)][:5], missed_total=self.missed)

    def _apply(self, kind: str, obj: dict) -> None:
        if self._transform is not None:
            obj = self._transform(obj)
        k = key_of(obj)
        if kind == "DELETED":
            self._cache.pop(k, None)
        else:
            old = self._cache.get(k)
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if old is not None and (old.get("metadata") or {}).get("resourceVersion") == new_rv:
                return
            if old is not None:
                share_strings(obj, old)
                k = key_of(obj)   # of the strings kept: what listeners store holds no others
            self._cache[k] = obj
        self.events += 1
        self._tell(k, self._cache.get(k))

    async def list_once(self) -> None:
        """One list into the cache, telling listeners, and no watch (the operator's tools
        read the cluster once). Raises `k8s.errors.ApiError` (translated) or the transport
        error as it is."""
        try:
            self.resource_version = await self._list()
        except ApiException as exc:
            raise translate(exc, f"list {self.name}") from None

    async def _watch(self, rv: str) -> str:
        """Watch from `rv` until the server ends the watch; return the last rv seen."""
        async with OrjsonWatch(return_type="object") as w:
            timeout = self._watch_timeout
            if self.relist_every is not None:
                timeout = max(1, min(timeout, math.ceil(self.relist_every)))
            stream = w.stream(self._list_fn, resource_version=rv, allow_watch_bookmarks=True,
                              timeout_seconds=timeout, _request_timeout=timeout + 30)
            async for event in stream:
                kind = event["type"]
                if kind != "BOOKMARK":
                    self._apply(kind, event["raw_object"])   # _apply transforms it
                rv = w.resource_version or rv
                self.resource_version = rv
        return rv

    async def run(self, *, task_status: TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """List and watch forever; reports started after the first successful list."""
        backoff = 0.2
        started = False
        rv: str | None = None
        periodic = False    # the next list is `relist_every`'s, not one after a failure
        while True:
            try:
                if rv is None:
                    rv = await self._list(periodic=periodic)
                    periodic = False
                    self.resource_version = rv
                    if not started:
                        started = True
                        task_status.started()
                    log.debug("informer listed", informer=self.name, items=len(self._cache),
                              resource_version=rv)
                rv = await self._watch(rv)
                backoff = 0.2
                if (self.relist_every is not None and self._listed_at is not None
                        and anyio.current_time() - self._listed_at >= self.relist_every):
                    rv, periodic = None, True   # the periodic relist (`relist_every`)
            except ApiException as exc:
                periodic = False    # a list after a failure catches up; nothing was missed
                if exc.status == 410:
                    log.info("watch expired (410 Gone); relisting", informer=self.name)
                    rv = None
                    continue
                if exc.status == 404 and self.optional and rv is None:
                    self._not_served()
                    if not started:
                        started = True
                        task_status.started()
                    await anyio.sleep(self.absent_retry)
                    continue
                err = translate(exc, f"list/watch {self.name}")
                delay = backoff  # a throttled call (429) waits at least what the server asks
                if err.retry_after is not None:
                    delay = max(backoff, min(err.retry_after, self._backoff_max))
                await self._backoff(delay, status=exc.status, error=err.message[:300])
                rv, backoff = None, min(backoff * 2, self._backoff_max)
            except Exception as exc:  # connection refused, aiohttp errors, timeouts, bad JSON
                periodic = False
                await self._backoff(backoff, error=repr(exc)[:200])
                rv, backoff = None, min(backoff * 2, self._backoff_max)

    def _not_served(self) -> None:
        """An optional API the server does not serve: the cache is empty and follows it."""
        if not self.absent:
            log.info("API not served; reading it as empty", informer=self.name,
                     retry_s=self.absent_retry)
        self.absent = True
        gone, self._cache = set(self._cache), {}
        self._healthy = True
        for k in gone:
            self._tell(k, None)
        for fn in self._synced:
            fn()

    async def _backoff(self, delay: float, **fields: object) -> None:
        self._healthy = False
        self.errors += 1
        log.warning("informer error; relisting after backoff", informer=self.name,
                    backoff_s=round(delay, 2), **fields)
        await anyio.sleep(delay)
