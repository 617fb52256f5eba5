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
