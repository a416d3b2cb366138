"""The dashboard through Streamlit's AppTest: it renders, and its numbers are the CLI's numbers."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specmon import summary
from specmon.store import Store

APP = Path(__file__).resolve().parent.parent / "app.py"


@pytest.fixture
def app_db(tmp_path, monkeypatch):
    path = str(tmp_path / "app.duckdb")
    monkeypatch.setenv("SPECMON_DB", path)
    return path


def test_overview_on_the_demo_matches_the_summary(app_db):
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert any("Demo data" in w.value for w in at.warning)
    table = at.dataframe[0].value
    with Store(app_db) as store:
        expected = summary.summarize(store)
    assert list(table["template"]) == [r["template"] for r in expected]
    assert list(table["alpha"].round(6)) == [round(r["alpha"], 6) for r in expected]
    assert any("v2" in e.value and "losing" in e.value for e in at.error)


def test_overview_on_an_empty_database_explains_what_to_do(app_db, monkeypatch):
    with Store(app_db) as store:  # a database that holds no runs, and the demo switched off by one
        store.query("SELECT 1")
    monkeypatch.setattr("specmon.demo.ensure_demo", lambda store: None)
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert any("No steps stored yet" in i.value for i in at.info)
