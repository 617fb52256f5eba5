"""The chart's generated parts (CRDs, dashboards, policies) are those of the kustomize base
(tools/sync-chart.py); the rest is compared with the base by tests/e2e/test_helm.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_chart_copies_of_the_kustomize_base_are_up_to_date():
    out = subprocess.run([sys.executable, str(REPO / "tools" / "sync-chart.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"run `python3 tools/sync-chart.py`:\n{out.stdout}{out.stderr}"
