"""The webhook's TLS (k8s/webhook/transport.py `ReloadingTLS`) on a real loopback aiohttp server:
client certificates are required and verified (W6: only the API server may call), and the
serving certificate follows its files without a restart."""

from __future__ import annotations

import os
import socket
import ssl
from pathlib import Path

import anyio
import pytest

from localcluster.controlplane import free_port
from localcluster.pki import CertificateAuthority, KeyPair
from k8s.webhook.transport import ReloadingTLS, allow, make_app, serve

pytestmark = pytest.mark.anyio
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u-1", "operation": "CREATE", "namespace": "t",
                      "kind": {"group": "kubevirt.io", "kind": "VirtualMachineInstance"},
                      "object": {"metadata": {"name": "no-gpus"}}}}


def _write(d: Path, name: str, pair: KeyPair) -> None:
    (d / f"{name}.crt").write_bytes(pair.cert_pem)
    (d / f"{name}.key").write_bytes(pair.key_pem)


class _Site:
    def __init__(self, d: Path) -> None:
        self.dir = d
        self.serving_ca = CertificateAuthority("serving")
        self.client_ca = CertificateAuthority("apiserver-clients")
        _write(d, "tls", self.serving_ca.issue_server(["127.0.0.1"]))
        (d / "client-ca.crt").write_bytes(self.client_ca.cert_pem)
        self.tls = ReloadingTLS(d / "tls.crt", d / "tls.key", d / "client-ca.crt",
                                check_every=0.0)
        self.port = free_port()

    def client(self, pair: KeyPair | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        ctx.load_verify_locations(cadata=self.serving_ca.cert_pem.decode())
        if pair is not None:
            _write(self.dir, "caller", pair)
            ctx.load_cert_chain(str(self.dir / "caller.crt"), str(self.dir / "caller.key"))
        return ctx

    def served(self, pair: KeyPair) -> bytes:
        """DER of the certificate a new connection is served (blocking)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            with self.client(pair).wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                return tls.getpeercert(binary_form=True)


@pytest.fixture
async def site(tmp_path):
    s = _Site(tmp_path)

    async def handler(review) -> dict:
        return allow(review.uid)
    async with anyio.create_task_group() as tg:
        await tg.start(serve, make_app(handler), "127.0.0.1", s.port, s.tls.context)
        yield s
        tg.cancel_scope.cancel()


async def _post(site: _Site, pair: KeyPair | None) -> object:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"https://127.0.0.1:{site.port}/mutate-vmi", json=REVIEW,
                                 ssl=site.client(pair)) as resp:
                return (await resp.json())["response"]
    except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
        return type(exc).__name__


async def test_W6_only_a_client_certificate_of_the_configured_ca_is_served(site):
    api_server = site.client_ca.issue_client("kube-apiserver-webhook-client")
    assert await _post(site, api_server) == {"uid": "u-1", "allowed": True}
    assert not isinstance(await _post(site, None), dict)
    other = CertificateAuthority("attacker").issue_client("kube-apiserver-webhook-client")
    assert not isinstance(await _post(site, other), dict)
    serving_as_client = site.serving_ca.issue_client("kube-apiserver-webhook-client")
    assert not isinstance(await _post(site, serving_as_client), dict)


async def test_rotated_serving_certificate_is_served_and_a_half_written_one_is_not(site):
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    caller = site.client_ca.issue_client("kube-apiserver-webhook-client")
    first = await anyio.to_thread.run_sync(site.served, caller)
    fresh = site.serving_ca.issue_server(["127.0.0.1"])
    # half-written: the new key beside the old certificate does not load; the old one stays
    (site.dir / "tls.key").write_bytes(fresh.key_pem)
    assert await anyio.to_thread.run_sync(site.served, caller) == first
    assert site.tls.reloads == 0
    tmp = site.dir / ".tls.crt.new"
    tmp.write_bytes(fresh.cert_pem)
    os.replace(tmp, site.dir / "tls.crt")
    want = x509.load_pem_x509_certificate(fresh.cert_pem).public_bytes(Encoding.DER)
    assert await anyio.to_thread.run_sync(site.served, caller) == want
    assert site.tls.reloads == 1
    # the client check survives the reload
    assert not isinstance(await _post(site, None), dict)
    assert await _post(site, caller) == {"uid": "u-1", "allowed": True}
