"""Structured logs of the binder: one JSON line per event (structlog + orjson).

`configure_logging` sends every line to a binary stream (stdout by default) and, with a
log directory, also appends lines that carry a `node` to `<log_dir>/<node>.jsonl`, so
`tail -f logs/<node>.jsonl` follows one node actor. Actors bind their context (`node=`,
`actor=`) with `structlog.contextvars` at the top of their task; every logger here merges it.
"""

from __future__ import annotations

import logging as _stdlib_logging
import os
import re
import sys
from pathlib import Path
from typing import IO, Any, BinaryIO

import orjson
import structlog

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class _NodeFiles:
    """Appends rendered lines to one file per node; files stay open and are flushed per
    line (so `tail -f` sees them at once)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._files: dict[str, BinaryIO] = {}

    def write(self, node: str, line: bytes) -> None:
        f = self._files.get(node)
        if f is None:
            name = _SAFE.sub("_", node) or "_"
            f = open(self.log_dir / f"{name}.jsonl", "ab")  # noqa: SIM115 - kept open
            self._files[node] = f
        f.write(line + b"\n")
        f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class _RenderAndTee:
    """`JSONRenderer(serializer=orjson.dumps)`, plus a copy to the node's file."""

    def __init__(self, files: _NodeFiles | None) -> None:
        self._render = structlog.processors.JSONRenderer(serializer=orjson.dumps, default=_default)
        self._files = files

    def __call__(self, logger: Any, name: str, event_dict: dict[str, Any]) -> bytes:
        node = event_dict.get("node")
        line = self._render(logger, name, event_dict)
        if isinstance(line, str):
            line = line.encode()
        if self._files is not None and isinstance(node, str):
            self._files.write(node, line)
        return line


_node_files: _NodeFiles | None = None


def _default(value: Any) -> Any:
    """orjson fallback for values it does not know (sets, exceptions, …)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return repr(value)


def configure_logging(
    stream: IO[bytes] | IO[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    *,
    level: int = _stdlib_logging.INFO,
    cache: bool = False,
) -> None:
    """Configure structlog for the binder: JSON lines on `stream` (a binary stream, or a
    text stream with a `.buffer`; default stdout) and, with `log_dir`, one file per node.

    Safe to call again (tests do): files of a previous configuration are closed. Unless
    `cache` is True, loggers are not cached on first use, so a reconfiguration applies to
    existing loggers too; a process that configures once (the controller, bench/) passes
    `cache=True`: a log call then skips building a logger each time.
    Raises OSError when `log_dir` cannot be created.
    """
    global _node_files
    if _node_files is not None:
        _node_files.close()
        _node_files = None
    if log_dir is not None:
        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        _node_files = _NodeFiles(path)
    out = stream if stream is not None else sys.stdout
    binary = getattr(out, "buffer", out)
    renderer = _RenderAndTee(_node_files)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.BytesLoggerFactory(file=binary),
        cache_logger_on_first_use=cache,
    )


def close_logging() -> None:
    """Close per-node files (the stream is the caller's)."""
    global _node_files
    if _node_files is not None:
        _node_files.close()
        _node_files = None
