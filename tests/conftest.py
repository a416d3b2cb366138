import sys
from pathlib import Path

import pytest

from specmon.store.database import Store


@pytest.fixture
def store(tmp_path: Path):
    with Store(str(tmp_path / "t.duckdb")) as s:
        yield s


@pytest.fixture
def specmon_cmd():
    """The CLI as a user runs it: a separate process."""
    return [sys.executable, "-m", "specmon"]


@pytest.fixture(autouse=True)
def no_proxy_from_the_environment(monkeypatch):
    """Tests talk to servers on 127.0.0.1; a proxy set on the machine that runs them must not come between (the
    proxy tests set their own)."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def app_db(tmp_path, monkeypatch):
    """The dashboard's database for AppTest: a fresh file, named by SPECMON_DB."""
    path = str(tmp_path / "app.duckdb")
    monkeypatch.setenv("SPECMON_DB", path)
    return path
