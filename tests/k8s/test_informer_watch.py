"""The informer's watch on a canned stream of watch lines (k8s/informer.py, `OrjsonWatch`):
each line decoded once with orjson (the stock Watch's stdlib json is never called), the
cache and resourceVersion following ADDED/MODIFIED/DELETED and BOOKMARK, a watch resumed
from the last resourceVersion seen, and ERROR 410 Gone answered by a relist without backoff."""

from __future__ import annotations

import anyio
import orjson
import pytest
from kubernetes_asyncio.client import ApiException
from kubernetes_asyncio.watch import watch as stock_watch

from k8s.informer import Informer, OrjsonWatch
from tests.timing import FAKE_TIME, eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return FAKE_TIME


def obj(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": "t", "resourceVersion": rv,
                         "managedFields": [{"manager": "x"}]}, "spec": {"n": name}}


def line(kind: str, o: dict) -> bytes:
    return orjson.dumps({"type": kind, "object": o}) + b"\n"


class _Lines:
    """A watch response: its lines, then the end of the stream ("" when `hang` is False),
    or a wait without end (a watch still open)."""

    def __init__(self, lines: list[bytes], hang: bool = False) -> None:
        self.lines, self.hang = list(lines), hang
        self.content = self

    async def readline(self) -> bytes:
        if self.lines:
            return self.lines.pop(0)
        if self.hang:
            await anyio.sleep(3600)
        return b""

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Page:
    """A list response (what `k8s.errors.read_json` reads)."""

    status, reason, headers = 200, "OK", {}

    def __init__(self, items: list[dict], rv: str) -> None:
        self.body = orjson.dumps({"items": items, "metadata": {"resourceVersion": rv}})

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass


class _Server:
    """A list call serving `answers` in order and recording each call's arguments."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls: list[dict] = []

    async def __call__(self, **kw):
        self.calls.append(kw)
        return self.answers.pop(0)


async def test_watch_lines_decoded_once_bookmarks_tracked_and_410_relisted(monkeypatch):
    class _NoStdlibJson:
        def __getattr__(self, name):
            raise AssertionError(f"the watch used stdlib json.{name}")
    monkeypatch.setattr(stock_watch, "json", _NoStdlibJson())
    gone = {"kind": "Status", "code": 410, "reason": "Expired",
            "message": "too old resource version: 12 (40)"}
    server = _Server(
        _Page([obj("a", "1")], "10"),
        _Lines([line("ADDED", obj("b", "11")), line("MODIFIED", obj("a", "12")),
                line("BOOKMARK", {"kind": "GPUDevice", "metadata": {"resourceVersion": "15"}}),
                line("ERROR", gone)]),
        _Page([obj("a", "12"), obj("c", "30")], "40"),
        _Lines([line("DELETED", obj("c", "41"))]),          # ends: resumed from 41
        _Lines([line("BOOKMARK", {"metadata": {"resourceVersion": "50"}})], hang=True))
    informer = Informer("gpudevices", server, watch_timeout=60)
    seen: list[tuple[tuple[str, str], str | None]] = []
    informer.add_listener(lambda key, o: seen.append(
        (key, o and o["metadata"]["resourceVersion"])))
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await eventually(lambda: informer.resource_version == "50", what="the last bookmark")
        tg.cancel_scope.cancel()
    assert sorted(informer.keys()) == [("t", "a")]
    assert informer.get(("t", "a")) == {"metadata": {"name": "a", "namespace": "t",
                                                     "resourceVersion": "12"},
                                        "spec": {"n": "a"}}     # transformed at ingest
    assert (informer.relists, informer.errors, informer.healthy) == (2, 0, True)
    assert seen == [(("t", "a"), "1"), (("t", "b"), "11"), (("t", "a"), "12"),
                    (("t", "b"), None), (("t", "a"), "12"), (("t", "c"), "30"),
                    (("t", "c"), None)]
    lists = [c for c in server.calls if not c.get("watch")]
    watches = [c for c in server.calls if c.get("watch")]
    assert [c.get("_continue") for c in lists] == [None, None]
    assert [(c["resource_version"], c["allow_watch_bookmarks"], c["timeout_seconds"],
             c["_request_timeout"], c["_preload_content"]) for c in watches] == [
        ("10", True, 60, 90, False), ("40", True, 60, 90, False), ("41", True, 60, 90, False)]


async def test_an_event_is_one_decoded_dict_and_errors_keep_the_stock_contract():
    async with OrjsonWatch(return_type="object") as w:
        _unmarshal(w)


async def test_a_watch_makes_no_api_client_so_no_tls_context(monkeypatch):
    """The stock `Watch` makes an ApiClient (a new TLS context, the CA bundle loaded) per
    watch only to decode models; `OrjsonWatch` decodes with orjson and makes none."""
    import ssl

    made: list[object] = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context",
                        lambda *a, **k: made.append(1) or real(*a, **k))
    async with OrjsonWatch(return_type="object") as w:
        _unmarshal(w)
        assert w.get_return_type(None) == "object" and w.resp is None
    assert made == []
    from kubernetes_asyncio.watch import Watch

    async with Watch():  # the stock one does make one: the probe above can see it
        pass
    assert made == [1]


def _unmarshal(w: OrjsonWatch) -> None:
    event = w.unmarshal_event(line("MODIFIED", obj("a", "7")).decode(), "object")
    assert event["object"] is event["raw_object"] and w.resource_version == "7"
    with pytest.raises(ApiException) as gone:
        w.unmarshal_event(line("ERROR", {"code": 410, "reason": "Expired",
                                         "message": "too old"}), "object")
    assert (gone.value.status, gone.value.reason) == (410, "Expired: too old")
    with pytest.raises(ValueError, match="BOOKMARK without"):
        w.unmarshal_event(line("BOOKMARK", {"metadata": {}}), "object")
    assert w.unmarshal_event("not json", "object") == "not json"
    with pytest.raises(ApiException) as status:
        w.unmarshal_event(orjson.dumps({"code": 500, "reason": "x", "message": "y"}), "object")
    assert status.value.status == 500 and w.resource_version == "7"


async def test_each_listed_or_watched_object_is_transformed_once():
    """The ingest transform runs once per object (a ResourceSlice's is a whole parse); the
    watch handed `_apply` an object it had already transformed, and `_apply` ran it again."""
    server = _Server(
        _Page([obj("a", "1")], "10"),
        _Lines([line("ADDED", obj("b", "11")), line("MODIFIED", obj("a", "12")),
                line("DELETED", obj("b", "13"))], hang=True))
    calls: list[tuple[str, str]] = []

    def transform(o: dict) -> dict:
        calls.append((o["metadata"]["name"], o["metadata"]["resourceVersion"]))
        o["metadata"].pop("managedFields", None)
        return o
    informer = Informer("gpudevices", server, watch_timeout=60, transform=transform)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        await eventually(lambda: informer.resource_version == "13", what="the deletion")
        tg.cancel_scope.cancel()
    assert calls == [("a", "1"), ("b", "11"), ("a", "12"), ("b", "13")]
    assert informer.get(("t", "a")) == {"metadata": {"name": "a", "namespace": "t",
                                                     "resourceVersion": "12"},
                                        "spec": {"n": "a"}}
