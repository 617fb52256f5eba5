"""The waiting line published (leader only, docs/contract.md §3c P5): each GPUClass's
`status.line` is the summary of its line (`model.line_status`: length, oldest wait, the first
`model.line_status.SHOWN` sets), so that `gpu-binder top` and `explain`, which read the
cluster, can show the line that lives in the leader's coordinator.

Every `period` seconds it asks the coordinator for its line (`GetLine`, bounded by
`ask_timeout`), summarises it per class, and merge-patches the status subresource of each
class whose summary differs from what it last wrote (at the start of a leadership: from what
the cache shows, so a summary an earlier leader left is cleared or replaced): at most one
write per class per period, none while nothing changes (the summary holds times, never
ages). A class whose line emptied gets `status.line: null`. A failed write is logged and
tried again next period.

`ReadBack` is the other way (P5, failover): what a coordinator starting on this leader reads
of those summaries, so that the bare VMIs they list keep their places (`model.line_memory`).
The status subresource of a GPUClass is written by the leader only (the controller's
ServiceAccount; no tenant role reaches the cluster-scoped GPUClasses), so what it says can be
trusted as the leader's own record.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import anyio
import structlog

from actors.coordinator_protocol import LineState
from k8s import errors
from k8s.cache import ClusterCache
from k8s.client import GPU_CLASSES, KubeClient
from model.line_status import ClassLine, line_to_status, parse_line_status, published_lines, summarize

log = structlog.get_logger("gpu_binder.line_status")

FIELD_MANAGER = "gpu-binder-line"

PERIOD = 5.0
"""Seconds between two looks at the coordinator's line: the most often a class's
`status.line` is written."""

_UNKNOWN = object()


class LineStatus:
    """Publishes the line (module docstring). `line` answers the coordinator's `LineState`
    (None while there is no coordinator, or it did not answer); `client` is the leader's.
    Counters: `rounds`, `writes`, `write_errors`."""

    def __init__(self, client: KubeClient, cache: ClusterCache,
                 line: Callable[[], Awaitable[LineState | None]], *, period: float = PERIOD) -> None:
        self._client = client.using(field_manager=FIELD_MANAGER)
        self.cache = cache
        self._line = line
        self.period = period
        self._written: dict[str, Any] = {}  # class -> status.line last written (None: cleared)
        self.rounds = self.writes = self.write_errors = 0

    async def run(self) -> None:
        """A round every `period` seconds until cancelled."""
        while True:
            await self.round()
            await anyio.sleep(self.period)

    async def round(self) -> None:
        """One look: write each class's summary that changed (module docstring)."""
        state = await self._line()
        if state is None:
            return
        wanted = {c: line_to_status(s) for c, s in summarize(state.line, state.reservations).items()}
        for raw in self.cache.classes.items():
            name = (raw.get("metadata") or {}).get("name")
            if not isinstance(name, str):
                continue
            have = self._written.get(name, _UNKNOWN)
            if have is _UNKNOWN:
                status = raw.get("status") if isinstance(raw.get("status"), dict) else {}
                have = status.get("line")
            new = wanted.get(name)
            if new == have:
                continue
            try:
                await self._client.patch_status(GPU_CLASSES, None, name, {"status": {"line": new}},
                                                what=f"write the waiting line of GPUClass {name}")
            except errors.ApiError as err:  # tried again next round
                self.write_errors += 1
                log.warning("GPUClass line not written", gpu_class=name, error=str(err)[:300])
                continue
            self._written[name] = new
            self.writes += 1
            log.info("GPUClass line written", gpu_class=name, length=new["length"] if new else 0)
        self.rounds += 1

    def written(self) -> dict[str, Any]:
        """The `status.line` this publisher last wrote to each class it wrote (None: cleared)."""
        return dict(self._written)


class ReadBack:
    """The published summaries as a coordinator starting on this leader reads them back (P5,
    `supervisor.binder.Binder`'s `published`), by class: what `publisher` (this leader's
    `LineStatus`) last wrote to a class it wrote (its own record, ahead of the cache), else
    what the GPUClass in `cache` shows, left by the previous leader, only when `trusted`
    (`model.line_memory.trust_published` at the start of the leadership: it renewed its
    Lease shortly before): a stale summary of another leadership is never read. Raises
    nothing (a malformed summary reads as none)."""

    def __init__(self, cache: ClusterCache, publisher: LineStatus, *, trusted: bool) -> None:
        self.cache = cache
        self.publisher = publisher
        self.trusted = trusted

    def __call__(self) -> dict[str, ClassLine]:
        lines = published_lines(self.cache.classes.items()) if self.trusted else {}
        for name, raw in self.publisher.written().items():
            got = parse_line_status(name, raw)
            if got is None:
                lines.pop(name, None)
            else:
                lines[name] = got
        return lines


__all__ = ["FIELD_MANAGER", "LineStatus", "PERIOD", "ReadBack"]
