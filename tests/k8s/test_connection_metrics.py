"""The replica's connections as metrics (`gpu_binder_api_connections`,
`gpu_binder_webhook_connections`): read from a real kubernetes_asyncio client's aiohttp pool
and a real aiohttp server started by `k8s.webhook.transport.serve`, on loopback. A soak's
young replica grows its RSS by about 110 KiB per TLS connection it opens (260 before the
64 KiB read buffer; issue 41 item 5),
so these are what a growing RSS is checked against."""

from __future__ import annotations

import functools

import aiohttp
import anyio
import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration
from prometheus_client.parser import text_string_to_metric_families

from k8s.client import (NewestFirstConnector, pool_connections, resolve_environment_once,
                        reuse_newest_first)
from k8s.metrics import Metrics, Observed
from k8s.webhook.transport import open_connections, serve
from tests.k8s.test_metrics_fleet import _idle_admission
from localcluster.controlplane import free_port

pytestmark = pytest.mark.anyio


def _app_holding_until(finish: anyio.Event, held: list[int]) -> web.Application:
    """GET / answers its headers at once and its body ("ok") once `finish` is set, so each
    connection stays lent until then; `held[0]` counts the requests held so."""
    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        if not finish.is_set():
            held[0] += 1
            await finish.wait()
        await resp.write(b"ok")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", slow)
    return app


async def test_pool_and_server_connections_are_counted_as_they_open_and_close():
    finish = anyio.Event()
    app = _app_holding_until(finish, [0])
    port = free_port()
    async with anyio.create_task_group() as tg:
        runner = await tg.start(functools.partial(serve, app, "127.0.0.1", port, None))
        assert open_connections(runner) == 0
        api = resolve_environment_once(ApiClient(Configuration(host=f"http://127.0.0.1:{port}")))
        try:
            assert pool_connections(api) == {"in_use": 0, "idle": 0, "limit": 100}
            session = api.rest_client.pool_manager
            held = [await session.get(f"http://127.0.0.1:{port}/") for _ in range(3)]
            # three responses not read yet: three connections lent, the server has three
            assert pool_connections(api) == {"in_use": 3, "idle": 0, "limit": 100}
            assert open_connections(runner) == 3
            finish.set()
            for r in held:
                assert await r.text() == "ok"    # read to the end: back to the pool
            assert pool_connections(api) == {"in_use": 0, "idle": 3, "limit": 100}
            with anyio.fail_after(5):
                await session.connector.close()  # the client closes them: the server sees it
                while open_connections(runner):
                    await anyio.sleep(0.01)
            assert pool_connections(api) == {"in_use": 0, "idle": 0, "limit": 100}
        finally:
            await api.close()
        tg.cancel_scope.cancel()
    assert open_connections(None) is None


def test_pool_of_another_kind_is_not_counted():
    """A session whose connector is not aiohttp's TCPConnector as expected: None, no error."""
    class Odd:
        rest_client = type("R", (), {"pool_manager": type("S", (), {"connector": object()})()})()
    assert pool_connections(Odd()) is None     # type: ignore[arg-type]


def test_the_gauges_are_exported_only_when_known():
    def render(seen: Observed) -> dict:
        body, _ = Metrics(lambda: seen, _idle_admission()).render()
        return {(s.name, tuple(s.labels.items())): s.value
                for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}

    got = render(Observed(api_pool={"in_use": 17, "idle": 5, "limit": 100},
                          webhook_connections=4))
    assert got[("gpu_binder_api_connections", (("state", "in_use"),))] == 17
    assert got[("gpu_binder_api_connections", (("state", "idle"),))] == 5
    assert got[("gpu_binder_api_connections_limit", ())] == 100
    assert got[("gpu_binder_webhook_connections", ())] == 4
    got = render(Observed())
    assert not [k for k in got if k[0].startswith(("gpu_binder_api_connections",
                                                   "gpu_binder_webhook_connections"))]


async def test_after_a_burst_the_pool_shrinks_back_to_what_steady_traffic_needs():
    """`NewestFirstConnector`: a burst opens 20 connections; one call at a time then reuses
    the newest idle one, the 19 others stay idle past the keep-alive (0.3 s here) and the
    clean-up closes them. With aiohttp's own TCPConnector (oldest idle first) the calls
    go round all 20 and keep every one alive: the pool ratchets up burst by burst."""
    finish = anyio.Event()
    held = [0]
    app = _app_holding_until(finish, held)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    async with anyio.create_task_group() as tg:
        runner = await tg.start(functools.partial(serve, app, "127.0.0.1", port, None))
        api = ApiClient(Configuration(host=f"http://127.0.0.1:{port}"))
        old = api.rest_client.pool_manager
        api.rest_client.pool_manager = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=0.3))
        await old.close()
        reuse_newest_first(api)
        session = api.rest_client.pool_manager
        assert type(session.connector) is NewestFirstConnector
        try:
            burst = [await session.get(url) for _ in range(20)]   # 20 open at once
            assert pool_connections(api)["in_use"] == 20 and held == [20]
            finish.set()
            for r in burst:
                assert await r.text() == "ok"
            assert pool_connections(api) == {"in_use": 0, "idle": 20, "limit": 100}
            with anyio.fail_after(10):
                while pool_connections(api)["idle"] > 1:   # steady traffic, one call at a time
                    async with session.get(url) as r:
                        assert await r.text() == "ok"
                    await anyio.sleep(0.02)
                while open_connections(runner) > 1:   # the server sees them closed too
                    await anyio.sleep(0.02)
        finally:
            await api.close()
        tg.cancel_scope.cancel()
