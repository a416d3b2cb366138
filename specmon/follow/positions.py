"""Where each watched source stands, kept in the database (watch_sources): its read position is committed in the
same transaction as the data it covers, so a watcher killed at any moment (even kill -9) resumes where it stopped
and counts every line exactly once."""
from __future__ import annotations

import json
import os
from datetime import datetime

from specmon.follow.config import SourceConfig
from specmon.follow.tail import Position
from specmon.store.database import Store


def load_position(store: Store, source: SourceConfig) -> Position:
    rows = store.query("SELECT file_id, head_sha, offset_bytes, line_no, reader_state FROM watch_sources "
                       "WHERE source_key = ?", [source.key])
    if not rows:
        return Position()
    file_id, head_sha, offset, line_no, state = rows[0]
    return Position(file_id, head_sha, int(offset), int(line_no), json.loads(state) if state else {})


def register(store: Store, source: SourceConfig, stale_after_s: float) -> None:
    """Add the source, or update the settings of the one already there. A source stored under a key of its
    path as spelled then (before keys were resolved paths: ./a.log, a relative path) that names the same file
    now is carried over to its resolved key, position and counts with it, in the same transaction."""
    with store.transaction() as cur:
        if source.key != f"{source.kind}:{source.location}" and not cur.execute(
                "SELECT 1 FROM watch_sources WHERE source_key = ?", [source.key]).fetchall():
            same_file = [key for key, location in cur.execute(
                "SELECT source_key, location FROM watch_sources WHERE kind = ? ORDER BY last_read DESC NULLS LAST",
                [source.kind]).fetchall()
                if os.path.realpath(location) == os.path.realpath(source.location) and key != source.key]
            if same_file:
                cur.execute("UPDATE watch_sources SET source_key = ?, location = ? WHERE source_key = ?",
                            [source.key, source.location, same_file[0]])
        cur.execute(
            "INSERT INTO watch_sources (source_key, kind, location, run, template, c, status, stale_after_s) "
            "VALUES (?, ?, ?, ?, ?, ?, 'starting', ?) ON CONFLICT (source_key) DO UPDATE SET run = excluded.run, "
            "template = excluded.template, c = excluded.c, stale_after_s = excluded.stale_after_s",
            [source.key, source.kind, source.location, source.run_name, source.template, source.c, stale_after_s])


def save_position(cur, source: SourceConfig, pos: Position, rows: int, now: datetime) -> None:
    """Inside the data's own transaction: the new read position, and that the source delivered."""
    cur.execute(
        "UPDATE watch_sources SET file_id = ?, head_sha = ?, offset_bytes = ?, line_no = ?, reader_state = ?, "
        "last_read = ?, last_data = CASE WHEN ? > 0 THEN ? ELSE last_data END, rows = rows + ?, status = 'ok', "
        "last_error = NULL, failing_since = NULL WHERE source_key = ?",
        [pos.file_id, pos.head_sha, pos.offset, pos.line_no, json.dumps(pos.state), now, rows, now, rows,
         source.key])


def mark(store: Store, source: SourceConfig, status: str, error: str | None, now: datetime) -> None:
    with store.transaction() as cur:
        cur.execute(
            "UPDATE watch_sources SET status = ?, last_read = ?, last_error = ?, "
            "failing_since = CASE WHEN ? IS NULL THEN NULL ELSE coalesce(failing_since, ?) END, "
            "failures = coalesce(failures, 0) + CASE WHEN ? IS NULL THEN 0 ELSE 1 END "
            "WHERE source_key = ?", [status, now, error, error, now, error, source.key])
