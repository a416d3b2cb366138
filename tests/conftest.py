import sys
from pathlib import Path

import numpy as np
import pytest

from specmon.store import Store

PAPER_P = np.array([0.38, 0.22, 0.16, 0.12, 0.08, 0.04])
PAPER_Q = np.array([0.30, 0.20, 0.20, 0.10, 0.14, 0.06])


@pytest.fixture
def store(tmp_path: Path):
    with Store(str(tmp_path / "t.duckdb")) as s:
        yield s


@pytest.fixture
def specmon_cmd():
    """The CLI as a user runs it: a separate process."""
    return [sys.executable, "-m", "specmon.cli"]
