"""Capturing the binder's log lines in a test, whatever an earlier test configured.

`structlog.testing.capture_logs` swaps the processors only: after a test that configured the
binder's logging to discard INFO (`tests.support.binder.quiet_logging`), the filtering wrapper
still drops INFO lines before they reach the capture. `captured_logs` lets every level
through for its duration and restores the configuration after."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import structlog
from structlog.testing import capture_logs


@contextmanager
def captured_logs() -> Iterator[list[dict]]:
    """The log lines (event dicts with `log_level`) emitted inside the block, every level."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**saved)
