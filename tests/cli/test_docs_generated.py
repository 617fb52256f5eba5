"""docs/metrics.md's table of reason codes is the one tools/reason-codes.py generates from
model/reasons/: adding or rewording a code without regenerating it fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_reason_code_table_in_the_metrics_page_is_up_to_date():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, str(REPO / "tools" / "reason-codes.py"), "--check"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, f"run `python3 tools/reason-codes.py`:\n{out.stdout}{out.stderr}"
