"""The code is lint-clean (ruff: the package, its benchmarks and its tests) and the package type-clean (mypy),
with the settings in pyproject.toml."""
import importlib.util
import os
import subprocess
import sys

import pytest
from paths import ROOT


def _tool(module: str) -> list[str]:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            raise RuntimeError(f"{module} is missing: the test command installs .[dev]")
        pytest.skip(f"{module} is not installed (it is in the dev extra: pip install -e '.[dev]')")
    return [sys.executable, "-m", module]


def test_ruff_finds_nothing_in_the_code():
    r = subprocess.run([*_tool("ruff"), "check", "specmon", "bench", "tests"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_package():
    r = subprocess.run([*_tool("mypy"), "specmon"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
