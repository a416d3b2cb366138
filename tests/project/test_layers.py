"""The layers point one way, as README's "Layout" says: import-linter checks the contracts in pyproject.toml (core
imports nothing else of specmon, the pages never import the watcher, only the pair layer loads torch)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT


def test_the_import_contracts_hold():
    tool = Path(sys.executable).with_name("lint-imports")
    if not tool.exists():
        found = shutil.which("lint-imports")
        if found is None:
            pytest.fail("lint-imports is missing: it is in the dev extra (pip install -e '.[dev]')")
        tool = Path(found)
    r = subprocess.run([str(tool)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout
