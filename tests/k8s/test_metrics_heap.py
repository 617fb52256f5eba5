"""`gpu_binder_heap_bytes{part}` and `gpu_binder_heap_pymalloc_blocks` (k8s/metrics.py over
actors.heap.heap_parts; issue 41 item 5): exported once read, read again only after
HEAP_MAX_AGE seconds."""

from __future__ import annotations

import platform
from types import SimpleNamespace

import pytest

from prometheus_client.parser import text_string_to_metric_families

from actors.heap import RSS_PARTS, mallinfo_reader
from k8s.metrics import HEAP_MAX_AGE, Metrics, Observed
from k8s.webhook.fairness import EventBudget


def _samples(metrics: Metrics) -> dict[tuple, float]:
    body, _ = metrics.render()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def _metrics() -> Metrics:
    admission = SimpleNamespace(admitted=0, denied=0, cache=None, gate=None,
                                events=EventBudget(), rejected={})
    return Metrics(lambda: Observed(), admission)


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/smaps")
def test_the_heap_parts_are_exported_by_part_and_add_up_to_the_rss() -> None:
    metrics = _metrics()
    assert not any(name.startswith("gpu_binder_heap_") for name, _ in _samples(metrics))
    metrics.refresh_heap()
    got = _samples(metrics)
    parts = {dict(labels)["part"]: v for (name, labels), v in got.items()
             if name == "gpu_binder_heap_bytes"}
    assert {f"rss_{p}" for p in RSS_PARTS} <= set(parts)
    if mallinfo_reader() is not None:
        assert {"malloc_arena", "malloc_mmap", "malloc_in_use", "malloc_free",
                "malloc_releasable"} <= set(parts)
        assert parts["malloc_in_use"] > 0
    with open("/proc/self/status") as f:
        rss = int(f.read().split("VmRSS:")[1].split()[0]) * 1024
    assert abs(sum(parts[f"rss_{p}"] for p in RSS_PARTS) - rss) < 0.1 * rss
    assert parts["rss_file"] > 0 and parts["rss_anon"] + parts["rss_heap"] > 0
    assert got[("gpu_binder_heap_pymalloc_blocks", ())] > 1000


def test_a_reading_is_reused_until_it_is_older_than_the_max_age() -> None:
    metrics = _metrics()
    metrics.refresh_heap()
    first = metrics.heap
    assert first is not None and first["pymalloc_blocks"] > 0
    keep = [object() for _ in range(10_000)]      # blocks pymalloc hands out meanwhile
    metrics.refresh_heap()
    assert metrics.heap is first                  # within HEAP_MAX_AGE: not read again
    metrics.refresh_heap(max_age=0.0)
    assert metrics.heap is not first
    assert metrics.heap["pymalloc_blocks"] >= first["pymalloc_blocks"] + len(keep) // 2
    assert HEAP_MAX_AGE > 0


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/smaps")
def test_the_controllers_metrics_view_reads_the_heap_before_it_renders() -> None:
    """GET /metrics of a replica (`Controller._health_app`) carries the parts without any
    other caller having read them."""
    import anyio
    from aiohttp.test_utils import TestClient, TestServer

    from k8s.config import Config
    from k8s.controller import Controller

    controller = Controller(Config())
    admission = SimpleNamespace(admitted=0, denied=0, cache=None, gate=None,
                                events=EventBudget(), rejected={})
    metrics = Metrics(controller.observed, admission)

    async def scrape() -> str:
        async with TestClient(TestServer(controller._health_app(metrics))) as client:
            got = await client.get("/metrics")
            assert got.status == 200
            return await got.text()

    text = anyio.run(scrape)
    assert 'gpu_binder_heap_bytes{part="rss_anon"}' in text
    assert "\ngpu_binder_heap_pymalloc_blocks " in text
    assert metrics.heap is not None and metrics.heap["rss_file"] > 0
