"""The app's shared store and cached queries.

One Store per server process (st.cache_resource); query results are cached per (database, generation), and the
generation changes after every write, so a new ingest shows at once on every page and in every session.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from specmon import alarms, demo, ingest, lossless, summary
from specmon.store import Store, default_db_path


@st.cache_resource
def _store(path: str) -> Store:
    store = Store(path)
    demo.ensure_demo(store)
    return store


def get_store() -> Store:
    return _store(default_db_path())


@st.cache_data(max_entries=64)
def _summaries(path: str, generation: int, by: str, run: str | None, bucket: str | None) -> list[dict]:
    # Timelines (bucketed) show alpha per bucket only: skip the per-position scan.
    return summary.summarize(_store(path), by=by, run=run, bucket=bucket, per_position=bucket is None)


def summaries(by: str = "template", run: str | None = None, bucket: str | None = None) -> list[dict]:
    store = get_store()
    return _summaries(store.path, store.generation, by, run, bucket)


@st.cache_data(max_entries=4)
def _run_names(path: str, generation: int) -> list[str]:
    return summary.run_names(_store(path))


def run_names() -> list[str]:
    store = get_store()
    return _run_names(store.path, store.generation)


@st.cache_data(max_entries=16)
def _template_changes(path: str, generation: int, run: str | None) -> pd.DataFrame:
    return summary.template_changes(_store(path), run)


def template_changes(run: str | None = None) -> pd.DataFrame:
    store = get_store()
    return _template_changes(store.path, store.generation, run)


@st.cache_data(max_entries=4)
def _ingest_history(path: str, generation: int) -> pd.DataFrame:
    return ingest.ingest_history(_store(path))


def ingest_history() -> pd.DataFrame:
    store = get_store()
    return _ingest_history(store.path, store.generation)


@st.cache_data(max_entries=4)
def _lossless_segments(path: str, generation: int) -> list[tuple[str, str, int]]:
    return lossless.segments_with_distributions(_store(path))


def lossless_segments() -> list[tuple[str, str, int]]:
    store = get_store()
    return _lossless_segments(store.path, store.generation)


@st.cache_data(max_entries=16)
def _lossless_checks(path: str, generation: int, run: str, template: str):
    s = _store(path)
    return lossless.pit_check(s, run, template), lossless.fixed_target_check(s, run, template)


def lossless_checks(run: str, template: str):
    store = get_store()
    return _lossless_checks(store.path, store.generation, run, template)


@st.cache_data(max_entries=16)
def _drift(path: str, generation: int, run: str) -> alarms.RunDrift:
    return alarms.analyse_run(_store(path), run)


def drift(run: str) -> alarms.RunDrift:
    """The run's CUSUM, alarm episodes and template-change verdicts."""
    store = get_store()
    return _drift(store.path, store.generation, run)
