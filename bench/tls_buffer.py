"""What a kept-alive TLS connection costs a replica's heap, by asyncio's read buffer (issue 41
item 5): the young follower's RSS rose as kube-apiserver's webhook connections and its own API
connections arrived, each holding asyncio's 256 KiB read buffer for its whole life
(docs/benchmarks.md, Soak); the controller now reads into `actors.heap.TLS_READ_BUFFER`.

Run `python -m bench.tls_buffer [--connections 16] [--buffers 262144,65536] [--out FILE]`.
Not a test; no cluster. For each buffer size a child process serves HTTPS with aiohttp (a
certificate from `localcluster.pki`), as the webhook does, with that size set
(`limit_tls_read_buffer`); this process opens `connections` kept-alive clients one by one,
each posting five AdmissionReview-sized bodies (9 KiB), and reads the server's
`actors.heap.heap_parts` after each: glibc's in-use bytes, its main heap's resident bytes
and pymalloc's blocks above what one warm connection held. Then it times the server sending
a 20 MiB body to one client (CPU of the client's process, best of five), the read a relist
page makes. Prints one line per size; `--out` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import at_least, commit, file_path, machine

BODY = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "request": {"uid": "u", "object": {"spec": {"x": "y" * 9000}}}}).encode()
BIG = 20 * 2**20
MIB = 2**20


def _serve(port: int, cert: str, key: str, nbytes: int) -> None:
    """The child: HTTPS on 127.0.0.1:`port` with a `nbytes` TLS read buffer; POST / answers
    2 KB, GET /parts the server's `heap_parts` after a collection, GET /big 20 MiB."""
    import gc

    from aiohttp import web

    from actors.heap import heap_parts, limit_tls_read_buffer

    limit_tls_read_buffer(nbytes)

    async def post(request: web.Request) -> web.Response:
        return web.Response(body=(await request.read())[:2000])

    async def parts(_: web.Request) -> web.Response:
        gc.collect()
        return web.json_response(heap_parts())

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"x" * BIG)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/", post)
        app.router.add_get("/parts", parts)
        app.router.add_get("/big", big)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())


async def _measure(port: int, ca_pem: bytes, connections: int, nbytes: int) -> dict:
    """The client side of one size (module docstring)."""
    import aiohttp

    from actors.heap import limit_tls_read_buffer

    limit_tls_read_buffer(nbytes)   # the client's own connections read the same way
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    url = f"https://127.0.0.1:{port}"
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1))
                for _ in range(connections + 1)]
    try:
        async def post(s: aiohttp.ClientSession) -> None:
            async with s.post(url + "/", data=BODY) as r:
                await r.read()

        async def parts() -> dict:
            async with sessions[0].get(url + "/parts") as r:
                return await r.json()

        for _ in range(3):
            await post(sessions[0])
        base = await parts()
        rows = []
        for k in range(1, connections + 1):
            for _ in range(5):
                await post(sessions[k])
            p = await parts()
            rows.append({"connections": k,
                         "malloc_in_use_mib": round((p.get("malloc_in_use", 0)
                                                     - base.get("malloc_in_use", 0)) / MIB, 3),
                         "rss_heap_mib": round((p.get("rss_heap", 0)
                                                - base.get("rss_heap", 0)) / MIB, 3),
                         "pymalloc_blocks": p["pymalloc_blocks"] - base["pymalloc_blocks"]})
        cpu = []
        for _ in range(5):
            t = time.process_time()
            async with sessions[0].get(url + "/big") as r:
                got = await r.read()
            cpu.append(time.process_time() - t)
            assert len(got) == BIG
    finally:
        for s in sessions:
            await s.close()
    last = rows[-1]
    return {"buffer_bytes": nbytes, "rows": rows,
            "per_connection_mib": round(last["malloc_in_use_mib"] / connections, 3),
            "read_20mib_cpu_ms": round(min(cpu) * 1e3, 1)}


def run(connections: int, buffers: list[int]) -> dict:
    """Each size of `buffers` measured with a fresh server child; the report dict."""
    from localcluster.controlplane import free_port
    from localcluster.pki import CertificateAuthority

    ca = CertificateAuthority("bench-tls-buffer")
    pair = ca.issue_server(["127.0.0.1"])
    out = {"benchmark": "tls_buffer", "commit": commit(), "machine": machine(),
           "load_before": list(os.getloadavg()), "connections": connections, "sizes": []}
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d, "tls.crt"), Path(d, "tls.key")
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        for nbytes in buffers:
            port = free_port()
            child = subprocess.Popen(
                [sys.executable, "-m", "bench.tls_buffer", "--serve", str(port), str(cert),
                 str(key), str(nbytes)], stdout=subprocess.PIPE, text=True)
            try:
                if child.stdout is None or child.stdout.readline().strip() != "ready":
                    raise RuntimeError("the TLS server child did not start")
                got = asyncio.run(_measure(port, ca.cert_pem, connections, nbytes))
            finally:
                child.terminate()
                child.wait(10)
            out["sizes"].append(got)
            print(f"read buffer {nbytes // 1024} KiB: {connections} kept-alive connections "
                  f"+{got['rows'][-1]['malloc_in_use_mib']} MiB in use on the server "
                  f"({got['per_connection_mib']} MiB each), reading 20 MiB "
                  f"{got['read_20mib_cpu_ms']} ms CPU", flush=True)
    out["load_after"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); exit 2 for a bad argument."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"] and len(argv) == 5:
        _serve(int(argv[1]), argv[2], argv[3], int(argv[4]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.tls_buffer", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--connections", type=at_least(1), default=16,
                    help="kept-alive connections opened one by one (default %(default)s)")
    ap.add_argument("--buffers", default="262144,65536",
                    help="TLS read buffer sizes in bytes, comma separated, each >= 16384 "
                         "(default %(default)s: asyncio's and the controller's)")
    ap.add_argument("--out", type=file_path, help="also write the figures to this JSON file")
    a = ap.parse_args(argv)
    try:
        buffers = [int(x) for x in a.buffers.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--buffers takes byte counts, comma separated, got {a.buffers!r}")
    if not buffers or min(buffers) < 16 * 1024:
        ap.error(f"--buffers takes sizes of at least 16384 bytes, got {a.buffers!r}")
    report = run(a.connections, buffers)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
