"""The leader publishes its waiting line in each GPUClass's `status.line` (`k8s.line_status`,
docs/contract.md §3c P5): through the status subresource, only when a class's summary changed
and at most once per class per round (writes counted), cleared when the line empties, and an
earlier leader's summary replaced or cleared; and read back by a starting coordinator
(`ReadBack`), an earlier leader's only when trusted."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from actors.coordinator_protocol import LineState
from k8s import errors
from k8s.client import GPU_CLASSES
from k8s.line_status import FIELD_MANAGER, LineStatus, ReadBack
from model.line import Identity, Line, Shape, entry
from model.priority import Priority

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 12, 4, 10, tzinfo=timezone.utc)


def waiting(vmi: str, n: int = 1, cls: str = "h100", at: int = 0) -> object:
    return entry(Identity("t", vmi), Shape((), ((cls, n),)), Priority(0), T0 + timedelta(minutes=at))


class Client:
    """Records status patches; `fail` makes the next ones raise."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict]] = []
        self.field_manager = None
        self.fail = False

    def using(self, *, field_manager=None, timeout=None):
        self.field_manager = field_manager
        return self

    async def patch_status(self, res, ns, name, body, *, what=None):
        assert res is GPU_CLASSES and ns is None and isinstance(body, dict)  # a merge patch
        if self.fail:
            raise errors.ApiError("patch", 500, "boom")
        self.patches.append((name, body))
        return {}


class Classes:
    def __init__(self, *objs: dict) -> None:
        self.objs = list(objs)

    def items(self):
        return list(self.objs)


def publisher(*classes: dict) -> tuple[LineStatus, Client, dict]:
    client = Client()
    state: dict = {"line": Line(), "reserved": {}}

    async def line() -> LineState:
        return LineState(state["line"], state["reserved"])

    cache = SimpleNamespace(classes=Classes(*classes))
    return LineStatus(client, cache, line), client, state  # type: ignore[arg-type]


async def test_P5_each_class_gets_its_summary_once_and_nothing_while_it_does_not_change():
    pub, client, state = publisher({"metadata": {"name": "h100"}}, {"metadata": {"name": "l40s"}})
    assert client.field_manager == FIELD_MANAGER
    await pub.round()
    assert client.patches == []                                   # nobody waits, nothing shown
    state["line"] = Line([waiting("a"), waiting("b", at=1)])
    await pub.round()
    ((name, body),) = client.patches
    assert name == "h100" and body["status"]["line"]["length"] == 2
    assert [e["name"] for e in body["status"]["line"]["entries"]] == ["a", "b"]
    for _ in range(10):
        await pub.round()
    assert len(client.patches) == 1 and pub.writes == 1 and pub.rounds == 12


async def test_P5_writes_are_bounded_by_one_per_class_per_round_however_often_the_line_changes():
    """A storm of line changes between two rounds costs one write per class per round."""
    pub, client, state = publisher({"metadata": {"name": "h100"}}, {"metadata": {"name": "l40s"}})
    entries = []
    for r in range(20):
        for i in range(10):  # ten changes between two rounds
            entries.append(waiting(f"vm-{r}-{i}", cls="h100" if i % 2 else "l40s", at=r))
            state["line"] = Line(entries)
        await pub.round()
    assert pub.writes == len(client.patches) <= 2 * 20
    assert {name for name, _ in client.patches} == {"h100", "l40s"}
    last = {name: body for name, body in client.patches}
    assert last["h100"]["status"]["line"]["length"] == 100
    assert len(last["h100"]["status"]["line"]["entries"]) == 20         # bounded


async def test_P5_an_emptied_line_is_cleared_and_an_earlier_leaders_summary_replaced():
    left = {"length": 1, "oldestSince": "2026-12-04T09:00:00Z", "entries": []}
    pub, client, state = publisher({"metadata": {"name": "h100"}, "status": {"line": left}},
                                   {"metadata": {"name": "l40s"}, "status": {"conditions": []}})
    await pub.round()
    assert client.patches == [("h100", {"status": {"line": None}})]      # an earlier leader's
    state["line"] = Line([waiting("a", cls="l40s")])
    await pub.round()
    state["line"] = Line()
    await pub.round()
    await pub.round()
    assert [(n, b["status"]["line"] is None) for n, b in client.patches[1:]] == [
        ("l40s", False), ("l40s", True)]


async def test_P5_a_failed_write_is_tried_again_next_round_and_no_coordinator_writes_nothing():
    pub, client, state = publisher({"metadata": {"name": "h100"}})
    state["line"] = Line([waiting("a")])
    client.fail = True
    await pub.round()
    assert pub.write_errors == 1 and client.patches == []
    client.fail = False
    await pub.round()
    assert len(client.patches) == 1

    async def none() -> None:
        return None

    quiet = LineStatus(Client(), SimpleNamespace(classes=Classes({"metadata": {"name": "h100"}})),  # type: ignore[arg-type]
                       none)
    await quiet.round()
    assert quiet.writes == 0


async def test_P5_read_back_gives_the_published_lines_and_an_untrusted_earlier_leaders_none():
    """A starting coordinator reads the summaries back (`ReadBack`, P5 across a failover): the
    previous leader's only when its Lease was renewed recently (`trusted`), and what this
    leader has published since, from its own record (ahead of its cache): a stale summary of
    long ago is never read, nor one this leader has cleared."""
    left = {"length": 1, "oldestSince": "2026-12-04T09:00:00Z", "entries": [
        {"position": 1, "namespace": "t", "name": "old", "kind": "VirtualMachineInstance",
         "priority": 0, "gpus": 1, "since": "2026-12-04T09:00:00Z"}]}
    pub, client, state = publisher({"metadata": {"name": "h100"}, "status": {"line": left}},
                                   {"metadata": {"name": "l40s"}})
    trusted = ReadBack(pub.cache, pub, trusted=True)  # type: ignore[arg-type]
    untrusted = ReadBack(pub.cache, pub, trusted=False)  # type: ignore[arg-type]
    assert [s.name for s in trusted()["h100"].shown] == ["old"]
    assert untrusted() == {}
    state["line"] = Line([waiting("mine", cls="l40s")])
    await pub.round()                       # this leader clears h100, publishes l40s (its cache: not yet)
    assert sorted(n for n, _ in client.patches) == ["h100", "l40s"]
    for read in (trusted, untrusted):
        assert sorted(read()) == ["l40s"] and [s.name for s in read()["l40s"].shown] == ["mine"]
