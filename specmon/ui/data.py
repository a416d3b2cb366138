"""The app's shared store, cached queries, and following the database while it changes.

One Store per server process (st.cache_resource); it holds no connection between queries, so other specmon
processes (an ingest, `specmon watch`) write the same file while the dashboard is open. Query results are cached
per (database, generation); the generation is read from the file itself and moves with every write by any
process, so `follow_updates` reruns the page when data arrives, without a reload.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from specmon.analysis import load, lossless, summary
from specmon.analysis.sources import outbox_counts, source_health, undeliverable, watched_sources
from specmon.core import environment
from specmon.core.faults import SpecmonError
from specmon.core.settings import REFRESH_ENV
from specmon.drift import alarms
from specmon.drift.detector import REFERENCE_STEPS, REFERENCE_WINDOWS
from specmon.ingest import demo, pipeline
from specmon.store.database import Store, default_db_path
from specmon.ui.widgets import md_text

# What the Drift page's first visit of a run waits for: the detector's threshold is calibrated by simulation.
DRIFT_SPINNER = (f"Calibrating the drift detector on the run's first {REFERENCE_STEPS:,} steps (or "
                 f"{REFERENCE_WINDOWS} engine windows), and again as its reference grows, and running it over the "
                 "run ...")


@st.cache_resource(show_spinner="Opening the database (and loading the demo data into an empty one) ...")
def _store(path: str) -> Store:
    store = Store(path)
    demo.ensure_demo(store)
    return store


def get_store() -> Store:
    return _store(default_db_path())


@st.cache_data(max_entries=64, show_spinner="Summarising acceptance per segment ...")
def _summaries(path: str, generation: tuple, by: str, run: str | None, bucket: str | None) -> list[dict]:
    # Timelines (bucketed) show alpha per bucket only: skip the per-position scan.
    with _store(path).reading():
        return summary.summarize(_store(path), by=by, run=run, bucket=bucket, per_position=bucket is None)


def summaries(by: str = "template", run: str | None = None, bucket: str | None = None) -> list[dict]:
    store = get_store()
    return _summaries(store.path, store.generation, by, run, bucket)


@st.cache_data(max_entries=4, show_spinner="Listing the runs ...")
def _run_names(path: str, generation: tuple) -> list[str]:
    return summary.run_names(_store(path))


def run_names() -> list[str]:
    store = get_store()
    return _run_names(store.path, store.generation)


@st.cache_data(max_entries=16, show_spinner="Finding where templates changed ...")
def _template_changes(path: str, generation: tuple, run: str | None) -> pd.DataFrame:
    return summary.template_changes(_store(path), run)


def template_changes(run: str | None = None) -> pd.DataFrame:
    store = get_store()
    return _template_changes(store.path, store.generation, run)


@st.cache_data(max_entries=4, show_spinner="Reading the past ingests ...")
def _ingest_history(path: str, generation: tuple) -> pd.DataFrame:
    return pipeline.ingest_history(_store(path))


def ingest_history() -> pd.DataFrame:
    store = get_store()
    return _ingest_history(store.path, store.generation)


@st.cache_data(max_entries=4, show_spinner="Finding the segments whose full distributions were logged ...")
def _lossless_segments(path: str, generation: tuple) -> list[tuple[str, str, int]]:
    return lossless.segments_with_distributions(_store(path))


def lossless_segments() -> list[tuple[str, str, int]]:
    store = get_store()
    return _lossless_segments(store.path, store.generation)


@st.cache_data(max_entries=16,
               show_spinner="Testing that the output is still the target's (randomized PIT, chi-square) ...")
def _lossless_checks(path: str, generation: tuple, run: str, template: str):
    s = _store(path)
    with s.reading():
        return lossless.pit_check(s, run, template), lossless.fixed_target_check(s, run, template)


def lossless_checks(run: str, template: str):
    store = get_store()
    return _lossless_checks(store.path, store.generation, run, template)


@st.cache_data(max_entries=16, show_spinner=DRIFT_SPINNER)
def _drift(path: str, generation: tuple, run: str) -> alarms.RunDrift:
    # not inside a reading block: the analysis reads on one connection of its own, then saves its state
    return alarms.analyse_run(_store(path), run)


def drift(run: str) -> alarms.RunDrift:
    """The run's CUSUM, alarm episodes and template-change verdicts."""
    store = get_store()
    return _drift(store.path, store.generation, run)


@st.cache_data(max_entries=4, show_spinner="Measuring speedup at each concurrency against the baseline ...")
def _load_curves(path: str, generation: tuple) -> list[load.LoadCurve]:
    return load.curves(_store(path))


def load_curves() -> list[load.LoadCurve]:
    """Every run's speedup by concurrency (specmon.analysis.load)."""
    store = get_store()
    return _load_curves(store.path, store.generation)


@st.cache_data(max_entries=4, show_spinner="Reading the watched sources' health ...")
def _sources(path: str, generation: tuple) -> pd.DataFrame:
    return watched_sources(_store(path))


def sources() -> pd.DataFrame:
    """Every watched source with its health now (lag and staleness move with the clock, not with the data)."""
    store = get_store()
    return source_health(_sources(store.path, store.generation))


@st.cache_data(max_entries=4, show_spinner=False)
def _outbox(path: str, generation: tuple) -> tuple[list[tuple[str, int, int]], pd.DataFrame]:
    store = _store(path)
    return outbox_counts(store), undeliverable(store)


def outbox() -> tuple[list[tuple[str, int, int]], pd.DataFrame]:
    """The watcher's outbox: (channel, pending, undeliverable) per channel, and the rows given up."""
    store = get_store()
    return _outbox(store.path, store.generation)


# The outcomes of the last upload, kept in the session: a page reruns every few seconds to follow new data, and what
# an upload said (its rejected rows and their download) must stay until the user leaves the Ingest page.
UPLOAD_OUTCOMES = "upload_outcomes"


def _refresh_s() -> tuple[float, str | None]:
    """How often an open page looks for new data, and what was wrong with SPECMON_REFRESH_S where it was."""
    try:
        return float(environment.value(REFRESH_ENV)), None  # type: ignore[arg-type]
    except SpecmonError as exc:
        return float(environment.VARIABLES[REFRESH_ENV].default), str(exc)  # type: ignore[arg-type]


REFRESH_S, _REFRESH_ERROR = _refresh_s()


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


@st.fragment(run_every=REFRESH_S)
def follow_updates() -> None:
    """Rerun the page when the database changed (any process wrote it), and say how fresh watched sources are."""
    if _REFRESH_ERROR:
        st.warning(f"{md_text(_REFRESH_ERROR)}: pages look for new data every {REFRESH_S:g} s meanwhile.")
    generation = get_store().generation
    seen = st.session_state.setdefault("seen_generation", generation)
    if generation != seen:
        st.session_state["seen_generation"] = generation
        st.rerun(scope="app")
    health = sources()
    if health.empty:
        return
    latest = health["lag_s"].min()
    newest = f"newest data {_ago(latest)}" if latest == latest else "no data yet"  # NaN: nothing read so far
    st.caption(f"Watching {len(health)} source(s) · {int(health['rows'].sum()):,} rows stored from them · {newest} "
               f"· checked {datetime.now():%H:%M:%S} (see Sources)")
    for row in health[health["status"].isin(["failing", "stopped", "stale"])].itertuples():
        what = f"{row.kind} {md_text(row.location)} (run {md_text(row.run)})"
        if row.status == "stale":
            st.warning(f"Stale: {what} has delivered no data for {_ago(row.lag_s)[:-4]}.", icon="⏸")
        else:
            st.error(f"{row.status.capitalize()}: {what}: {md_text(row.last_error)}", icon="⚠")
