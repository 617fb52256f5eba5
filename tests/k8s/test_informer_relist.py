"""A relist keeps the cached object of every listed object whose resourceVersion is unchanged
(k8s/informer.py `Informer._list`): the page's copy is not transformed and is dropped with the
page, so a relist holds the old cache plus what changed, not two caches (the soak's peak RSS
at a kube-apiserver restart, 2026-12-07)."""

from __future__ import annotations

import pytest

from k8s.informer import Informer

pytestmark = pytest.mark.anyio


def _obj(name: str, rv: str | None, value: int) -> dict:
    meta = {"name": name, "namespace": "t"}
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"metadata": meta, "spec": {"value": value}, "managedFields": []}


async def test_a_relist_keeps_unchanged_objects_and_takes_changed_ones(monkeypatch) -> None:
    lists = iter([
        [_obj("a", "1", 1), _obj("b", "5", 5), _obj("gone", "7", 7), _obj("norv", None, 1)],
        # a unchanged (a new dict from the API server, same version), b changed, c new
        [_obj("a", "1", 1), _obj("b", "6", 60), _obj("c", "2", 2), _obj("norv", None, 2)],
    ])

    class Resp:
        def __init__(self, items: list) -> None:
            self.items = items

    async def list_fn(**_: object) -> Resp:
        return Resp(next(lists))

    async def read_json(resp: Resp, what: str) -> dict:
        return {"items": resp.items, "metadata": {"resourceVersion": "9"}}
    monkeypatch.setattr("k8s.informer.read_json", read_json)
    transformed: list[str] = []

    def transform(o: dict) -> dict:
        transformed.append(o["metadata"]["name"])
        return {"metadata": o["metadata"], "spec": o["spec"]}

    informer = Informer("things", list_fn, transform=transform)
    await informer.list_once()
    first = {k[1]: informer.get(k) for k in informer.keys()}
    assert sorted(transformed) == ["a", "b", "gone", "norv"]
    transformed.clear()
    heard: list[tuple[str, object]] = []
    informer.add_listener(lambda k, o: heard.append((k[1], o)))

    await informer.list_once()
    assert sorted(transformed) == ["b", "c", "norv"]      # "a" kept, not made again
    assert informer.get(("t", "a")) is first["a"]
    assert informer.get(("t", "b"))["spec"] == {"value": 60}
    assert informer.get(("t", "c"))["spec"] == {"value": 2}
    # no resourceVersion: never taken for the same version
    assert informer.get(("t", "norv"))["spec"] == {"value": 2}
    assert informer.get(("t", "gone")) is None
    # listeners still hear every key after a relist, the kept object among them
    assert sorted(n for n, _ in heard) == ["a", "b", "c", "gone", "norv"]
    assert dict(heard)["a"] is first["a"] and dict(heard)["gone"] is None
