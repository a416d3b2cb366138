"""The app's shared store and cached queries.

One Store per server process (st.cache_resource); query results are cached per (database, generation), and the
generation changes after every write, so a new ingest shows at once on every page and in every session.
"""
from __future__ import annotations

import streamlit as st

from specmon import demo, summary
from specmon.store import Store, default_db_path


@st.cache_resource
def _store(path: str) -> Store:
    store = Store(path)
    demo.ensure_demo(store)
    return store


def get_store() -> Store:
    return _store(default_db_path())


@st.cache_data(max_entries=64)
def _summaries(path: str, generation: int, by: str) -> list[dict]:
    return summary.summarize(_store(path), by=by)


def summaries(by: str = "template") -> list[dict]:
    store = get_store()
    return _summaries(store.path, store.generation, by)
