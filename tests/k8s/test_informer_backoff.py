"""The informer's retry delays (k8s/informer.py): capped exponential backoff that waits at
least the API server's Retry-After on a throttled (429) list."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiException

from k8s.informer import Informer

pytestmark = pytest.mark.anyio


class _Stop(Exception):
    pass


def _error(status: int, retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="throttled" if status == 429 else "boom")
    exc.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return exc


async def test_list_errors_back_off_and_a_throttled_list_waits_at_least_retry_after() -> None:
    errors = iter([_error(429, "3"), _error(500), _error(429, "60"), _error(429, "soon")])

    async def list_fn(**_: object) -> None:
        raise next(errors)

    informer = Informer("gpudevices", list_fn, backoff_max=10.0)
    delays: list[float] = []

    async def record(delay: float, **fields: object) -> None:
        delays.append(delay)
        if len(delays) == 4:
            raise _Stop

    informer._backoff = record  # type: ignore[method-assign]
    with pytest.raises(_Stop):
        await informer.run()
    # 429 + Retry-After 3 s: 3 (not the 0.2 s backoff); 500: the backoff (0.4 s);
    # Retry-After 60 s: capped at backoff_max; an unparsable Retry-After: the backoff (1.6 s)
    assert delays == [3.0, 0.4, 10.0, 1.6]


async def test_an_optional_api_the_cluster_does_not_serve_reads_as_empty_and_is_retried() -> None:
    """resource.k8s.io/v1 before Kubernetes 1.34 (docs/install.md supports 1.30): the DRA
    informers (`optional=True`) read a 404 as an empty, synced, healthy cache instead of
    never syncing (which kept every replica unready), forget what they held, and list again
    every `absent_retry` seconds; a non-optional informer backs off as before."""
    calls: list[int] = []

    async def list_fn(**_: object) -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ApiException(status=404, reason="Not Found")
        raise _error(500)

    informer = Informer("resourceslices", list_fn, optional=True, absent_retry=0.01)
    informer._cache[("", "old")] = {"metadata": {"name": "old"}}
    seen: list[tuple] = []
    informer.add_listener(lambda k, o: seen.append((k, o)))

    async def stop(delay: float, **fields: object) -> None:
        raise _Stop

    informer._backoff = stop  # type: ignore[method-assign]
    with pytest.raises(_Stop):
        await informer.run()
    assert len(calls) == 3                         # 404, 404 after absent_retry, then a 500
    assert (informer.healthy, informer.absent, informer.keys(), seen) == (
        True, True, set(), [(("", "old"), None)])

    plain = Informer("gpudevices", lambda **_: _raise(ApiException(status=404)))
    plain._backoff = stop  # type: ignore[method-assign]
    with pytest.raises(_Stop):
        await plain.run()
    assert not plain.absent


async def _raise(exc: Exception) -> None:
    raise exc
