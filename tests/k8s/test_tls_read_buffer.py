"""`actors.heap.limit_tls_read_buffer` (issue 41 item 5): every TLS connection made after it
reads into a buffer of the given size (asyncio's own is 256 KiB a connection, which a replica
pays once per kube-apiserver connection and per webhook connection), and bodies larger than
the buffer still arrive whole on both sides."""

from __future__ import annotations

import ssl
from asyncio import sslproto

import aiohttp
import pytest
from aiohttp import web

from actors.heap import TLS_READ_BUFFER, limit_tls_read_buffer
from localcluster.controlplane import free_port
from localcluster.pki import CertificateAuthority

pytestmark = pytest.mark.anyio


ASYNCIO_OWN = 256 * 1024
"""asyncio's read buffer in CPython 3.11 (`asyncio.sslproto.SSLProtocol.max_size`)."""


@pytest.fixture
def restored():
    """asyncio's own buffer size for the test (a controller started earlier in this process
    may have limited it: the setting is process-wide), whatever was set put back after."""
    before = sslproto.SSLProtocol.max_size
    sslproto.SSLProtocol.max_size = ASYNCIO_OWN
    yield ASYNCIO_OWN
    sslproto.SSLProtocol.max_size = before


@pytest.fixture
def anyio_backend():
    return "asyncio"   # the buffer is asyncio's


def test_the_limit_replaces_asyncios_256_kib_and_says_so(restored):
    assert limit_tls_read_buffer() == ASYNCIO_OWN
    assert sslproto.SSLProtocol.max_size == TLS_READ_BUFFER == 64 * 1024
    assert limit_tls_read_buffer(32 * 1024) == TLS_READ_BUFFER


@pytest.mark.parametrize("nbytes", [0, 1, 16 * 1024 - 1])
def test_a_buffer_smaller_than_one_tls_record_is_refused(restored, nbytes):
    with pytest.raises(ValueError, match="at least one 16 KiB record"):
        limit_tls_read_buffer(nbytes)
    assert sslproto.SSLProtocol.max_size == restored


async def test_a_connection_made_after_it_reads_into_the_smaller_buffer(tmp_path, restored):
    limit_tls_read_buffer()
    ca = CertificateAuthority("test")
    pair = ca.issue_server(["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    seen: list[int] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(len(request.transport._ssl_protocol._ssl_buffer))
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_post("/", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_ctx).start()
    body = bytes(range(256)) * 4096          # 1 MiB: 16 buffers' worth each way
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"https://127.0.0.1:{port}/", data=body,
                                 ssl=client_ctx) as resp:
                client_buffer = len(resp.connection.transport._ssl_protocol._ssl_buffer)
                got = await resp.read()
    finally:
        await runner.cleanup()
    assert got == body
    assert seen == [64 * 1024]
    assert client_buffer == 64 * 1024
