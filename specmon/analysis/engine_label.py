"""A window's engine instance: its labels' `engine` entry (a data-parallel rank in a log, the `engine` label of a
Prometheus series), "" where there is none.

Never the whole label set: a log window's labels also hold the line's own figures (vLLM's throughputs), which would
make every window an engine of its own. Two instances that share the entry fall into one series, which only pairs
more bins. The one rule, written for the store's JSON labels and a frame's text labels in DuckDB, and for pandas.
"""
from __future__ import annotations

import json

import pandas as pd

KEY = "engine"


def stored_sql(labels: str) -> str:
    """SQL for the engine of a column of JSON labels (engine_windows.labels)."""
    return f"coalesce({labels}->>'{KEY}', '')"


def text_sql(labels: str) -> str:
    """SQL for the engine of a column of labels as text, JSON or not (a frame's, a counter series')."""
    return f"coalesce(CASE WHEN json_valid({labels}::VARCHAR) THEN {labels}::VARCHAR::JSON->>'{KEY}' END, '')"


def of_labels(labels: pd.Series) -> pd.Series:
    """The engine of each of a frame's labels (JSON text, or anything else: no engine)."""
    texts = labels.fillna("").astype(str)
    found = {t: str(json.loads(t).get(KEY, "")) if t.startswith("{") else "" for t in texts.unique()}
    return texts.map(found)
