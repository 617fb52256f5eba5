"""`Metrics.heap_report` (the controller's SIGUSR2) and `Metrics.refresh_fleet` never overlap
(issue 41 item 5): a heap report taken while the scrape's worker ran `model.explain.top` held
its working set (the memo copy filled for every node, the live VMIs' keys, the counts: 1.8 MiB
of the 6.5 MiB the 20-minute device soak's young follower grew between its two tracemalloc
snapshots, 2026-12-07), so two reports of a steady replica differed by whether a scrape was in
flight."""

from __future__ import annotations

import threading

import anyio

import k8s.metrics
from k8s.metrics import Metrics
from model import explain
from tests.k8s.test_metrics_devices import two_board_metrics

GUARD_S = 10.0
"""Seconds a test waits at most for a worker it released (a hang, not a timing assertion)."""


def _metrics() -> Metrics:
    return two_board_metrics()[0]


def test_a_heap_report_waits_for_the_fleet_figures_worker(monkeypatch, tmp_path):
    metrics = _metrics()
    entered, release = threading.Event(), threading.Event()
    running: list[bool] = []
    real_top = explain.top

    def slow_top(snap, live):
        running.append(True)
        entered.set()
        release.wait(GUARD_S)
        try:
            return real_top(snap, live)
        finally:
            running.pop()

    seen: list[bool] = []

    def report(directory, n):
        seen.append(bool(running))   # was top running when the report was taken?
        return {"report": n, "directory": str(directory)}

    monkeypatch.setattr(explain, "top", slow_top)
    monkeypatch.setattr(k8s.metrics, "heap_report", report)
    got: list[dict] = []

    async def take() -> None:
        got.append(await metrics.heap_report(tmp_path, 1))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(metrics.refresh_fleet)
            await anyio.to_thread.run_sync(entered.wait, GUARD_S)   # top runs in its worker
            tg.start_soon(take)
            with anyio.fail_after(GUARD_S):
                # until the report was taken, or waits for the worker
                while not seen and not metrics._workers.statistics().tasks_waiting:
                    await anyio.sleep(0)
            release.set()

    anyio.run(main)
    assert seen == [False]
    assert got == [{"report": 1, "directory": str(tmp_path)}]
    assert metrics.fleet is not None


def test_a_scrape_during_a_heap_report_keeps_the_last_fleet_figures(monkeypatch, tmp_path):
    metrics = _metrics()
    calls: list[int] = []
    real_top = explain.top

    def counted_top(snap, live):
        calls.append(len(live))
        return real_top(snap, live)

    entered, release = threading.Event(), threading.Event()

    def report(directory, n):
        entered.set()
        release.wait(GUARD_S)
        return {"report": n}

    monkeypatch.setattr(explain, "top", counted_top)
    monkeypatch.setattr(k8s.metrics, "heap_report", report)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(metrics.heap_report, tmp_path, 1)
            await anyio.to_thread.run_sync(entered.wait, GUARD_S)   # the report is being taken
            await metrics.refresh_fleet()
            assert calls == [] and metrics.fleet is None
            release.set()
        await metrics.refresh_fleet()   # the report done: the figures are computed
        assert calls == [0] and metrics.fleet is not None

    anyio.run(main)
