"""`k8s.client.resolve_environment_once`: the process's ApiClient reads the proxy
environment once instead of on every request (aiohttp's trust_env costs two worker-thread
hops per API call), keeping what that environment says for the API server's URL."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from k8s.client import resolve_environment_once

pytestmark = pytest.mark.anyio

HOST = "https://10.96.0.1:443"


@pytest.fixture
def anyio_backend():
    return "asyncio"  # aiohttp's session


def _api() -> ApiClient:
    cfg = Configuration()
    cfg.host = HOST
    return ApiClient(configuration=cfg)


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_the_session_no_longer_trusts_the_environment_and_keeps_its_connector():
    api = _api()
    connector = api.rest_client.pool_manager.connector
    assert api.rest_client.pool_manager.trust_env  # kubernetes_asyncio's default
    assert resolve_environment_once(api) is api
    session = api.rest_client.pool_manager
    assert (session.trust_env, session.connector, api.rest_client.proxy) == (False, connector, None)
    assert not connector.closed
    await api.close()
    assert connector.closed


async def test_the_environments_proxy_for_the_api_server_is_kept(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    api = resolve_environment_once(_api())
    assert api.rest_client.proxy == "http://user:secret@proxy.example:3128"
    await api.close()


async def test_no_proxy_for_the_api_server_host_is_honoured(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "10.96.0.1")
    api = resolve_environment_once(_api())
    assert api.rest_client.proxy is None
    await api.close()


async def test_a_proxy_already_configured_is_left_and_a_second_call_changes_nothing(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy.example:3128")
    api = _api()
    api.rest_client.proxy = "http://kubeconfig-proxy.example:8080"
    resolve_environment_once(api)
    session = api.rest_client.pool_manager
    assert resolve_environment_once(api).rest_client.pool_manager is session
    assert api.rest_client.proxy == "http://kubeconfig-proxy.example:8080"
    await api.close()
