"""bench.common.watch_namespaced against a fake list/watch endpoint, without a cluster: what
a benchmark's watch cache holds after the server closed a watch and the function listed
again (issue 33: the packing harness's GPUDevice watch kept devices deleted while no watch
ran, and its release waits ran out at 60 s)."""

from __future__ import annotations

import json

import anyio
import pytest

from bench.common import watch_namespaced

pytestmark = pytest.mark.anyio


def obj(name: str, rv: int, ns: str = "pk-a95") -> dict:
    return {"kind": "GPUDevice", "metadata": {"namespace": ns, "name": name,
                                             "resourceVersion": str(rv)}}


class Resp:
    """An aiohttp-like response: `read()` for a list, `content.readline()` for a watch (an
    empty line ends the stream, as when the server closes it; `block` waits for ever
    instead, as an open watch with nothing to say)."""

    def __init__(self, body: bytes = b"", lines: list[bytes] | None = None,
                 block: bool = False) -> None:
        self.body, self.lines, self.block, self.content = body, list(lines or []), block, self

    async def read(self) -> bytes:
        return self.body

    async def readline(self) -> bytes:
        if self.lines:
            return self.lines.pop(0)
        if self.block:
            await anyio.sleep_forever()
        return b""

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class Endpoint:
    """Serves `lists` (list bodies) and `streams` (watch events) in turn; the watch after
    the last stream stays open. `served` is set once the last stream is being served."""

    def __init__(self, lists: list[list[dict]], streams: list[list[tuple[str, dict]]]) -> None:
        self.lists, self.streams, self.served = lists, streams, anyio.Event()
        self.watch_rvs: list[str] = []

    async def list_things(self, *args, **kwargs):  # no :rtype: in a docstring: raw dicts
        if kwargs.get("watch"):
            self.watch_rvs.append(kwargs.get("resource_version"))
            if not self.streams:
                self.served.set()
                return Resp(block=True)
            return Resp(lines=[json.dumps({"type": t, "object": o}).encode() + b"\n"
                               for t, o in self.streams.pop(0)])
        items = self.lists.pop(0)
        rv = max((int(o["metadata"]["resourceVersion"]) for o in items), default=1)
        return Resp(json.dumps({"items": items, "metadata": {"resourceVersion": str(rv)}}).encode())


async def run(endpoint: Endpoint) -> tuple[dict[tuple[str, str], dict], list, list]:
    """watch_namespaced over `endpoint` into a cache as the packing harness keeps it, until
    the endpoint served everything; (cache, events, lists)."""
    cache: dict[tuple[str, str], dict] = {}
    events: list[tuple[str, str]] = []
    lists: list[tuple[str, int]] = []

    def on_event(kind: str, o: dict) -> None:
        key = (o["metadata"]["namespace"], o["metadata"]["name"])
        events.append((kind, key[1]))
        if kind == "DELETED":
            cache.pop(key, None)
        else:
            cache[key] = o

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_namespaced, endpoint.list_things, (), on_event, "pk-",
                      lambda why, n: lists.append((why, n)))
        with anyio.fail_after(5):
            await endpoint.served.wait()
        tg.cancel_scope.cancel()
    return cache, events, lists


async def test_a_relist_drops_what_was_deleted_while_no_watch_ran():
    # listed: two template devices of s42; the watch sees one change, then the server
    # closes it; s42-pk-a95-1 is deleted before the next list, which no longer has it
    a, b = obj("s42-pk-a95-0", 10), obj("s42-pk-a95-1", 11)
    a2 = obj("s42-pk-a95-0", 12)
    endpoint = Endpoint(lists=[[a, b, obj("x", 1, ns="other")], [a2]],
                        streams=[[("MODIFIED", a2)]])
    cache, events, lists = await run(endpoint)
    assert list(cache) == [("pk-a95", "s42-pk-a95-0")]
    assert ("DELETED", "s42-pk-a95-1") in events
    assert lists == [("start", 2), ("stream ended", 1)]
    assert endpoint.watch_rvs == ["11", "12"]


async def test_a_relist_keeps_and_updates_what_still_exists():
    a, b = obj("h7-0", 5), obj("h7-1", 6)
    b2 = obj("h7-1", 9)
    endpoint = Endpoint(lists=[[a, b], [a, b2]], streams=[[]])
    cache, events, lists = await run(endpoint)
    assert cache == {("pk-a95", "h7-0"): a, ("pk-a95", "h7-1"): b2}
    assert [k for k, _ in events] == ["ADDED"] * 4
    assert lists == [("start", 2), ("stream ended", 2)]


async def test_an_object_deleted_in_the_stream_is_not_deleted_again_at_the_relist():
    a, b = obj("s1-pk-a95-0", 3), obj("s2-pk-a95-0", 4)
    endpoint = Endpoint(lists=[[a, b], [b]], streams=[[("DELETED", obj("s1-pk-a95-0", 7))]])
    cache, events, _ = await run(endpoint)
    assert list(cache) == [("pk-a95", "s2-pk-a95-0")]
    assert events.count(("DELETED", "s1-pk-a95-0")) == 1
