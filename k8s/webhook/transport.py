"""The AdmissionReview v1 transport: a thin aiohttp view around a pure decoder and a handler
(W6).

Transport jobs only: cap the body size (413), require `application/json` (415), decode the
body with `review.decode` (a typed `Review`, or a `Rejected` answered at once), bound the
handler in time, always answer with the request's uid, and turn *anything* unexpected (a
handler crash, a timeout) into a clear denial — never a bare 500 and never an admit. The
handler is `async (Review) -> dict` returning an AdmissionResponse built by
`allow`/`deny`/`patch_response`, which always set the uid.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import orjson
import structlog
from aiohttp import web

from k8s.webhook.review import Denial, Rejected, Review, decode, reason_denial
from model.reasons import AdmissionCrashed, AdmissionTimedOut, BodyTooLarge, WrongMediaType

log = structlog.get_logger("gpu_binder.webhook")

MAX_BODY = 3 * 1024 * 1024  # bytes; a VMI CREATE review is far below this
CONTENT_TYPE = "application/json"
Handler = Callable[[Review], Awaitable[dict]]


def allow(uid: str, warning: str | None = None) -> dict:
    """An AdmissionResponse for review `uid` that admits unchanged; `warning` (≤ 500
    characters) is shown by kubectl."""
    resp: dict[str, Any] = {"uid": uid, "allowed": True}
    if warning:
        resp["warnings"] = [warning[:500]]
    return resp


def deny(uid: str, denial: Denial) -> dict:
    """An AdmissionResponse for review `uid` that refuses; its status (code, reason) comes
    from the denial's category (`review.STATUS`), its message is shown to the user."""
    return {"uid": uid, "allowed": False, "status": denial.status()}


def patch_response(uid: str, ops: list[dict]) -> dict:
    """An AdmissionResponse for review `uid` that admits with a JSONPatch (`ops`, RFC 6902)."""
    return {"uid": uid, "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(orjson.dumps(ops)).decode()}


def _answer(response: dict) -> web.Response:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return web.Response(body=orjson.dumps(body), content_type=CONTENT_TYPE)


def _rejected(rejected: Rejected) -> web.Response:
    """W1/W6: a review denied before any judgement or write, logged as one JSON line naming
    the request (uid) and, when known, the VMI, as every later denial is."""
    log.info("VMI denied", uid=rejected.uid[:64], namespace=rejected.namespace or None,
             vmi=rejected.name or None, user=rejected.user[:256] or None,
             dry_run=rejected.dry_run, code=rejected.denial.code,
             reason=rejected.denial.message[:300])
    return _answer(deny(rejected.uid, rejected.denial))


async def _decoded(request: web.Request) -> Review | Rejected:
    """The request's body decoded (`review.decode`), or Rejected for a wrong content type
    (checked first: a body of another type is never read) or a body over `MAX_BODY`."""
    if request.content_type != CONTENT_TYPE:
        return Rejected("", reason_denial(WrongMediaType(request.headers.get("Content-Type", ""),
                                                         CONTENT_TYPE)))
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return Rejected("", reason_denial(BodyTooLarge(MAX_BODY)))
    return decode(raw)


class KeepAliveLimit:
    """How many reviews one kept-alive connection carries (as nginx's `keepalive_requests` or
    Envoy's `max_requests_per_connection`): the answer to the `limit`-th review on a
    connection says `Connection: close`, so kube-apiserver closes it and opens a new one,
    which the Service places on any ready replica. Without it the API server's kept-alive
    connections stay on the replicas that were ready when they opened: a replica added by a
    scale-up or a rolling update gets no reviews until those die. The close is announced in
    an answer, never done under a request in flight, so no review fails for it. `limit` 0:
    no limit. Counts are kept per connection (its transport, weakly: nothing outlives it)."""

    def __init__(self, limit: int) -> None:
        import weakref

        self.limit = limit
        self.closed = 0                                   # connections told to close
        self._served: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def answered(self, request: web.Request, response: web.StreamResponse) -> None:
        """Count one review on `request`'s connection; mark `response` to close it when
        this is its `limit`-th."""
        transport = request.transport
        if not self.limit or transport is None:
            return
        n = self._served.get(transport, 0) + 1
        if n >= self.limit:
            self._served.pop(transport, None)
            response.force_close()
            self.closed += 1
        else:
            self._served[transport] = n


KEEPALIVE = web.AppKey("keepalive", KeepAliveLimit)  # the app's KeepAliveLimit


def make_app(handler: Handler, *, timeout: float = 25.0, path: str = "/mutate-vmi",
             keepalive_reviews: int = 0) -> web.Application:
    """The aiohttp application: POST `path` → AdmissionReview. `timeout` seconds bound the
    handler (W6: a timeout is a retryable denial, a crash an internal-error denial; neither
    admits). `keepalive_reviews` > 0: a connection is closed after that many reviews
    (`KeepAliveLimit`), so reviews spread over the replicas behind a Service."""
    limit = KeepAliveLimit(keepalive_reviews)

    async def review(request: web.Request) -> web.Response:
        response = await _review(request)
        limit.answered(request, response)
        return response

    async def _review(request: web.Request) -> web.Response:
        decoded = await _decoded(request)
        if isinstance(decoded, Rejected):
            return _rejected(decoded)
        try:
            with anyio.fail_after(timeout):
                resp = await handler(decoded)
        except TimeoutError:
            resp = deny(decoded.uid, reason_denial(AdmissionTimedOut(timeout)))
        except Exception as exc:  # noqa: BLE001 - W6: fail closed, never a crash
            log.exception("admission handler crashed", uid=decoded.uid)
            resp = deny(decoded.uid, reason_denial(AdmissionCrashed(type(exc).__name__)))
        resp["uid"] = decoded.uid
        return _answer(resp)

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(path, review)
    app[KEEPALIVE] = limit
    return app


def server_ssl_context(cert_file: Path, key_file: Path,
                       client_ca_file: Path | None = None) -> ssl.SSLContext:
    """A TLS server context for the webhook (TLS 1.2+). With `client_ca_file`, a client
    must present a certificate signed by that CA or the handshake fails (W6: only the API
    server may call the webhook). Raises OSError (ssl.SSLError) for unreadable or bad PEM."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    if client_ca_file is not None:
        ctx.load_verify_locations(cafile=str(client_ca_file))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class ReloadingTLS:
    """The webhook's server TLS context, following its files (cert-manager rotation).

    `context` is what the server listens with. At each TLS handshake (at most once per
    `check_every` seconds) the files' (inode, size, mtime) are compared with those last
    loaded; when they changed, a new context is built from them and every later handshake
    uses it (the SNI callback switches the connection's context, which OpenSSL calls with
    or without a server name). A half-written rotation (unreadable, or key and certificate
    not matching) is logged and the previous certificate is kept until the files load.
    The constructor raises OSError (ssl.SSLError) when the files cannot be loaded."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None = None,
                 *, check_every: float = 1.0) -> None:
        self._files = (Path(cert_file), Path(key_file), client_ca_file and Path(client_ca_file))
        self._check_every = check_every
        self._signature = self._stat()
        self._current = server_ssl_context(*self._files)
        self._checked = time.monotonic()
        self._failed: tuple | None = None
        self.reloads = 0
        self.context = server_ssl_context(*self._files)
        self.context.sni_callback = self._on_hello

    def _stat(self) -> tuple:
        out = []
        for f in self._files:
            if f is None:
                continue
            try:
                st = f.stat()
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def maybe_reload(self) -> bool:
        """Reload when the files changed since the last load; True when it did."""
        now = time.monotonic()
        if now - self._checked < self._check_every:
            return False
        self._checked = now
        signature = self._stat()
        if signature == self._signature or signature == self._failed:
            return False
        try:
            fresh = server_ssl_context(*self._files)
        except (OSError, ValueError) as exc:
            self._failed = signature
            log.warning("webhook certificate files changed but do not load; keeping the "
                        "previous certificate", cert=str(self._files[0]),
                        error=f"{type(exc).__name__}: {exc}")
            return False
        self._current, self._signature, self._failed = fresh, signature, None
        self.reloads += 1
        log.info("webhook certificate reloaded", cert=str(self._files[0]),
                 reloads=self.reloads)
        return True

    def _on_hello(self, conn: ssl.SSLObject, server_name: str | None,
                  _ctx: ssl.SSLContext) -> None:
        try:
            self.maybe_reload()
        except Exception:  # noqa: BLE001 - never fail a handshake over a reload check
            with contextlib.suppress(Exception):  # not even over a broken log stream
                log.exception("webhook certificate reload check failed")
        finally:
            conn.context = self._current
        return None


async def serve(app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None,
                *, reuse_port: bool = False, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` until cancelled (AppRunner + TCPSite; shutdown bounded to 5 s).
    `reuse_port` lets several replicas on one host share the port (the kernel spreads
    connections among them, as a Service would). Started with the runner (`tg.start`
    returns it: `open_connections` counts its clients' connections)."""
    runner = web.AppRunner(app, shutdown_timeout=5, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context,
                           reuse_port=reuse_port or None)
        await site.start()
        task_status.started(runner)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(6):
            await runner.cleanup()


def open_connections(runner: web.AppRunner | None) -> int | None:
    """Clients' connections open at the server `serve` started with `runner` now (the API
    server's kept-alive connections to the webhook, `gpu_binder_webhook_connections`);
    None before it serves. Raises nothing."""
    server = runner.server if runner is not None else None
    return None if server is None else len(server.connections)
