"""The rows every ingest writes besides its data: the run, the segment (run and template) and the ingest record.

Each runs inside the caller's transaction.
"""
from __future__ import annotations

import duckdb

from specmon.core.faults import SpecmonError


def get_or_create_run(cur: duckdb.DuckDBPyConnection, name: str, source: str, demo: bool, meta: str | None) -> int:
    rows = cur.execute("SELECT run_id, demo FROM runs WHERE name = ?", [name]).fetchall()
    if rows:
        row = rows[0]
        if row[1] != demo:
            kind = "demo" if row[1] else "user"
            raise SpecmonError(f"run name {name!r} belongs to {kind} data; choose another --run")
        return row[0]
    return cur.execute(
        "INSERT INTO runs (name, source, demo, created_at, meta) VALUES (?, ?, ?, now()::TIMESTAMP, ?) "
        "RETURNING run_id",
        [name, source, demo, meta],
    ).fetchall()[0][0]


def get_or_create_segment(cur: duckdb.DuckDBPyConnection, run_id: int, template: str) -> int:
    rows = cur.execute("SELECT segment_id FROM segments WHERE run_id = ? AND template = ?",
                       [run_id, template]).fetchall()
    if rows:
        return rows[0][0]
    return cur.execute(
        "INSERT INTO segments (run_id, template) VALUES (?, ?) RETURNING segment_id", [run_id, template]
    ).fetchall()[0][0]


def add_ingest(cur: duckdb.DuckDBPyConnection, *, file_name: str, sha256: str, ingested_at, source_format: str,
               run_id: int, rows_read: int = 0, steps: int = 0, positions: int = 0) -> int:
    """Record an ingest (inside the caller's transaction) and return its id."""
    return cur.execute(
        "INSERT INTO ingests (file_name, sha256, ingested_at, source_format, run_id, rows_read, steps, positions, "
        "rejected) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0) RETURNING ingest_id",
        [file_name, sha256, ingested_at, source_format, run_id, rows_read, steps, positions],
    ).fetchall()[0][0]


def next_step_id(cur: duckdb.DuckDBPyConnection) -> int:
    return int(cur.execute("SELECT coalesce(max(step_id), 0) + 1 FROM steps").fetchall()[0][0])


def declare_baseline(cur: duckdb.DuckDBPyConnection, baseline_run_id: int, of_run_id: int) -> None:
    """Record that a run ran without speculation on the same model, hardware and traffic as another, so that the
    other's speedup at each concurrency is measured against it (a second declaration changes nothing)."""
    if baseline_run_id == of_run_id:
        raise SpecmonError("a run cannot be its own baseline: name the run that ran without speculation")
    cur.execute("INSERT INTO baselines VALUES (?, ?, now()::TIMESTAMP) ON CONFLICT DO NOTHING",
                [baseline_run_id, of_run_id])
