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


async def test_a_periodic_relist_brings_what_the_watch_missed_and_says_so(monkeypatch) -> None:
    """`relist_every` (the DeviceTaintRule informer's, HL1): after each watch the informer
    lists again once that long passed since its last list; listeners hear of a rule the
    watch never brought (and of one gone), `missed` counts them and one warning names them;
    a relist that finds nothing new says nothing."""
    import structlog

    def rule(name: str, rv: str) -> dict:
        return {"metadata": {"name": name, "resourceVersion": rv}}
    pages = iter([[rule("a", "1")], [rule("a", "1"), rule("b", "5")], [rule("b", "5")],
                  [rule("b", "5")]])

    class Resp:
        def __init__(self, items: list) -> None:
            self.items = items

    async def list_fn(**_: object) -> Resp:
        try:
            return Resp(next(pages))
        except StopIteration:
            raise _Stop from None

    async def read_json(resp: Resp, what: str) -> dict:
        return {"items": resp.items, "metadata": {"resourceVersion": "9"}}
    monkeypatch.setattr("k8s.informer.read_json", read_json)
    informer = Informer("devicetaintrules", list_fn, optional=True, relist_every=0.0)
    watches: list[str] = []

    async def watch(rv: str) -> str:   # a watch that ends bringing nothing
        watches.append(rv)
        return rv
    informer._watch = watch  # type: ignore[method-assign]

    async def stop(delay: float, **fields: object) -> None:   # the lists ran out
        raise _Stop
    informer._backoff = stop  # type: ignore[method-assign]
    heard: list[tuple[str, bool]] = []
    informer.add_listener(lambda k, o: heard.append((k[1], o is not None)))
    with structlog.testing.capture_logs() as logs, pytest.raises(_Stop):
        await informer.run()
    assert informer.missed == 2                                  # b new, then a gone
    assert ("b", True) in heard and ("a", False) in heard
    said = [(e["new"], e["gone"]) for e in logs if e["event"] == "relist found what the watch missed"]
    assert said == [(["b"], []), ([], ["a"])]                     # the 4th list: nothing to say
    assert watches == ["9"] * 4                                   # a list after each watch
    never = Informer("gpudevices", list_fn)
    assert never.relist_every is None and never.missed == 0
