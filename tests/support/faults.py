"""Fault points in a controller replica for the e2e tests (`tests/support/fault_site`):
`armed` restarts one replica of a `LocalCluster` with a fault point armed, so a test can kill
it at a named step instead of after a guessed delay."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from localcluster.paths import REPO_ROOT

FAULT_SITE = Path(__file__).resolve().parent / "fault_site"


def armed_hang_after_claim(system, i: int, namespace: str, vmi: str, mark: Path) -> None:
    """Restart replica `i` of `system` (SIGTERM: it gives up the Lease if it held it) with
    the fault point `GPU_BINDER_TEST_HANG_AFTER_CLAIM` armed for VMI `namespace/vmi`: once its
    webhook has made that VMI's claim (DR5) it writes `mark` and hangs before answering.
    Blocks until the replica is ready. Later (re)starts of any replica run unarmed."""
    before = dict(system.controller_env)
    system.controller_env.update({
        "PYTHONPATH": os.pathsep.join((str(FAULT_SITE), str(REPO_ROOT))),
        "GPU_BINDER_TEST_HANG_AFTER_CLAIM": f"{namespace}/{vmi}",
        "GPU_BINDER_TEST_MARK": str(mark)})
    try:
        system.kill_replica(i, signal.SIGTERM)
        system.start_replica(i)
    finally:
        system.controller_env = before
    system.wait_ready(i)
