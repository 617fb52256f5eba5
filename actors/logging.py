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
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, BinaryIO

import orjson
import structlog

_SAFE = re.compile(r"[^A-Za-z0-9._-]")

MAX_OPEN_NODE_FILES = 64
"""Per-node log files kept open at once (`_NodeFiles`): the nodes a replica logs in bursts
(an admission's candidates, a round's moves) stay open; a node logged again after 64 others
costs one open()."""


class _NodeFiles:
    """Appends rendered lines to one file per node, each line written whole before `write`
    returns (so `tail -f` sees it at once). At most `max_open` files stay open, the nodes
    logged most recently (`MAX_OPEN_NODE_FILES`); another node's file is opened on its next
    line and the least recent closed. Unbuffered: a line is one write to the file (a buffer
    of 8 KiB per open file, kept for every node ever logged, grew a replica's heap by up to
    8 MiB and its descriptors by one per node at 1,000 nodes: issue 41 item 5)."""

    def __init__(self, log_dir: Path, max_open: int | None = None) -> None:
        self.log_dir = log_dir
        self.max_open = MAX_OPEN_NODE_FILES if max_open is None else max_open
        self._files: OrderedDict[str, BinaryIO] = OrderedDict()

    def write(self, node: str, line: bytes) -> None:
        f = self._files.get(node)
        if f is None:
            while len(self._files) >= self.max_open:
                self._files.popitem(last=False)[1].close()
            name = _SAFE.sub("_", node) or "_"
            f = open(self.log_dir / f"{name}.jsonl", "ab", buffering=0)  # noqa: SIM115
            self._files[node] = f
        else:
            self._files.move_to_end(node)
        data = memoryview(line + b"\n")
        while data:
            n = f.write(data)
            if not n:   # a regular file writes something or raises; never spin
                raise OSError(f"could not write to the log file of node {node!r}")
            data = data[n:]

    def open_files(self) -> int:
        """How many node files are open now (at most `max_open`)."""
        return len(self._files)

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
