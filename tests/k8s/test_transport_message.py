"""k8s.errors.translate words a transport failure for an operator (one line, host, port and
the OS's words), not as a Python repr: `gpu-binder health` against an API server that is
not there printed `ClientConnectorError(ConnectionKey(host=...` (the newcomer, 2026-12-07)."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from k8s.errors import Unavailable, translate

pytestmark = pytest.mark.anyio


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_refused_connection_is_host_port_and_the_os_words():
    port = _closed_port()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await session.get(f"http://127.0.0.1:{port}/")
    err = translate(caught.value, "list DeviceTaintRules")
    assert isinstance(err, Unavailable)
    assert err.message == f"127.0.0.1:{port}: connection refused"
    assert "ConnectionKey" not in str(err)


def test_another_failure_is_its_type_and_text():
    err = translate(TimeoutError("read timed out"), "get vmi")
    assert err.message == "TimeoutError: read timed out"
