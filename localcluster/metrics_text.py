"""Prometheus text exposition, as the harness reads it from a replica's or the API server's
/metrics: one parse (prometheus-client's parser) for the tests and the benchmarks."""

from __future__ import annotations

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Samples:
    """{(sample name, sorted label items): value} of a /metrics body. ValueError when the
    text is not the exposition format."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
