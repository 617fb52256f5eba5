"""Every async test here runs on fake loop time (tests/timing.py)."""

import pytest

from tests.timing import FAKE_TIME


@pytest.fixture
def anyio_backend():
    return FAKE_TIME
