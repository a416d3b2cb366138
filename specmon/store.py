"""The DuckDB store: schema, migrations, one shared connection, and transactions.

One process holds one Store (one DuckDB connection). Readers take a cursor per query; writers go through
`transaction()`, which serialises them under a lock so two ingests in one process never interleave.
Every query is parameterised: nothing from user input is pasted into SQL.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from specmon.faults import SpecmonError

DEFAULT_DB = "specmon.duckdb"
DB_ENV = "SPECMON_DB"
# DuckDB's own default is 80% of RAM; a dashboard shares the machine, so cap it (queries spill to disk beyond it).
DEFAULT_MEMORY_LIMIT = "2GB"
MEMORY_ENV = "SPECMON_MEMORY_LIMIT"

# Each entry upgrades the schema from version i to i + 1. Append; never edit a released migration.
MIGRATIONS: list[str] = [
    """
    CREATE SEQUENCE run_ids START 1;
    CREATE SEQUENCE segment_ids START 1;
    CREATE SEQUENCE ingest_ids START 1;
    CREATE TABLE runs (
        run_id      INTEGER PRIMARY KEY DEFAULT nextval('run_ids'),
        name        VARCHAR NOT NULL UNIQUE,
        source      VARCHAR NOT NULL,          -- steplog, live, replay, or an engine name
        demo        BOOLEAN NOT NULL DEFAULT false,
        created_at  TIMESTAMP NOT NULL,
        meta        JSON                       -- pair, k, temperature, prompts for live runs
    );
    CREATE TABLE segments (
        segment_id  INTEGER PRIMARY KEY DEFAULT nextval('segment_ids'),
        run_id      INTEGER NOT NULL REFERENCES runs (run_id),
        template    VARCHAR NOT NULL,          -- '' when the log names no template
        UNIQUE (run_id, template)
    );
    CREATE TABLE ingests (
        ingest_id     INTEGER PRIMARY KEY DEFAULT nextval('ingest_ids'),
        file_name     VARCHAR NOT NULL,
        sha256        VARCHAR NOT NULL UNIQUE,
        ingested_at   TIMESTAMP NOT NULL,
        source_format VARCHAR NOT NULL,
        run_id        INTEGER NOT NULL REFERENCES runs (run_id),
        rows_read     BIGINT NOT NULL,
        steps         BIGINT NOT NULL,
        positions     BIGINT NOT NULL,
        rejected      BIGINT NOT NULL,
        notes         VARCHAR
    );
    -- One row per verification step. checked = min(accepted + 1, g); beta_lo_sum / beta_hi_sum add beta's
    -- bounds over the checked positions (equal where beta is exact, NULL where no distributions were logged),
    -- so segment summaries and the observed-vs-predicted test need only this table.
    CREATE TABLE steps (
        step_id       BIGINT NOT NULL,
        ingest_id     INTEGER NOT NULL,
        segment_id    INTEGER NOT NULL,
        request_id    VARCHAR NOT NULL,
        step_index    BIGINT,                  -- the flat form's step number; JSON Lines: NULL (step_id order)
        ts            TIMESTAMP NOT NULL,      -- UTC
        ts_inferred   BOOLEAN NOT NULL,        -- true where the log had no ts and ingest time was used
        k             INTEGER,
        g             INTEGER NOT NULL,
        accepted      INTEGER NOT NULL,
        checked       INTEGER NOT NULL,
        temperature   DOUBLE,
        target_ms     DOUBLE,
        draft_ms      DOUBLE,
        beta_lo_sum   DOUBLE,
        beta_hi_sum   DOUBLE,
        emitted_tokens INTEGER[],
        pit_below     DOUBLE[],                -- F_t(x_t - 1) per emitted token, where p was logged in full
        pit_mass      DOUBLE[],                -- p_t(x_t) per emitted token
        extra         JSON
    );
    -- One row per drafted position (1-based, as in math.md).
    CREATE TABLE positions (
        step_id     BIGINT NOT NULL,
        segment_id  INTEGER NOT NULL,
        position    SMALLINT NOT NULL,
        draft_token INTEGER,
        checked     BOOLEAN NOT NULL,
        accepted    BOOLEAN NOT NULL,
        beta_lo     DOUBLE,
        beta_hi     DOUBLE,
        p_token     DOUBLE,
        q_token     DOUBLE
    );
    """,
    # 2: staging tables. A JSON Lines ingest appends its batches here, each committed on its own so memory stays
    # bounded (DuckDB keeps a transaction's appends in memory), then moves them into steps and positions in one
    # transaction. Rows of a load that never finished are deleted when the database is next opened.
    """
    CREATE TABLE staging_steps (
        load_id VARCHAR NOT NULL, local_step BIGINT NOT NULL, template VARCHAR NOT NULL, request_id VARCHAR NOT NULL,
        ts TIMESTAMP NOT NULL, ts_inferred BOOLEAN NOT NULL, k INTEGER, g INTEGER NOT NULL, accepted INTEGER NOT NULL,
        checked INTEGER NOT NULL, temperature DOUBLE, target_ms DOUBLE, draft_ms DOUBLE, beta_lo_sum DOUBLE,
        beta_hi_sum DOUBLE, emitted_tokens INTEGER[], pit_below DOUBLE[], pit_mass DOUBLE[], extra JSON
    );
    CREATE TABLE staging_positions (
        load_id VARCHAR NOT NULL, local_step BIGINT NOT NULL, template VARCHAR NOT NULL, position SMALLINT NOT NULL,
        draft_token INTEGER, checked BOOLEAN NOT NULL, accepted BOOLEAN NOT NULL, beta_lo DOUBLE, beta_hi DOUBLE,
        p_token DOUBLE, q_token DOUBLE
    );
    """,
    # 3: what serving engines report: windows of counts (log lines, per-request JSON) and raw Prometheus samples.
    """
    CREATE SEQUENCE window_ids START 1;
    CREATE TABLE engine_windows (
        window_id     BIGINT PRIMARY KEY DEFAULT nextval('window_ids'),
        ingest_id     INTEGER NOT NULL,
        segment_id    INTEGER NOT NULL,
        engine        VARCHAR NOT NULL,        -- vllm, llama.cpp, sglang
        source        VARCHAR NOT NULL,        -- which output: vllm-v1-log, llama-server, prometheus, ...
        line          INTEGER,
        start_ts      TIMESTAMP,
        end_ts        TIMESTAMP NOT NULL,      -- UTC
        ts_inferred   BOOLEAN NOT NULL,
        drafts        DOUBLE,                  -- verification steps that drafted
        draft_tokens  DOUBLE,
        accepted_tokens DOUBLE,
        accepted_per_position DOUBLE[],        -- drafts whose accepted prefix reached position i (cumulative counts)
        k             INTEGER,
        mean_acceptance_length DOUBLE,         -- as reported (bonus token included)
        reported_rate DOUBLE,                  -- the engine's own acceptance rate, in its own definition
        labels        JSON
    );
    CREATE TABLE counter_samples (
        ingest_id   INTEGER NOT NULL,
        segment_id  INTEGER NOT NULL,
        metric      VARCHAR NOT NULL,          -- e.g. vllm:spec_decode_num_drafts_total
        series      VARCHAR NOT NULL,          -- the label set, canonical JSON (one counter per series)
        labels      JSON,
        ts          TIMESTAMP NOT NULL,
        value       DOUBLE NOT NULL
    );
    """,
    # 4: replay (teacher forcing) stores predicted acceptance per completion position: nothing was drafted.
    """
    CREATE TABLE replay_positions (
        ingest_id   INTEGER NOT NULL,
        segment_id  INTEGER NOT NULL,
        request_id  VARCHAR NOT NULL,          -- the transcript
        ts          TIMESTAMP NOT NULL,
        position    INTEGER NOT NULL,          -- index in the completion, from 1
        token       INTEGER NOT NULL,
        beta        DOUBLE NOT NULL,
        p_token     DOUBLE,
        q_token     DOUBLE
    );
    """,
    # 5: watching a deployment. Rollout annotations (a template change for sources that carry no template), and
    # the followed sources with their read position, committed in the same transaction as the data it covers.
    """
    CREATE SEQUENCE annotation_ids START 1;
    CREATE TABLE annotations (
        annotation_id INTEGER PRIMARY KEY DEFAULT nextval('annotation_ids'),
        run_id      INTEGER NOT NULL REFERENCES runs (run_id),
        template    VARCHAR NOT NULL,          -- the template in force from starts_at on
        starts_at   TIMESTAMP NOT NULL,        -- UTC
        note        VARCHAR,
        created_at  TIMESTAMP NOT NULL
    );
    CREATE TABLE watch_sources (
        source_key    VARCHAR PRIMARY KEY,     -- kind:location
        kind          VARCHAR NOT NULL,        -- log, steplog, inbox, prometheus
        location      VARCHAR NOT NULL,        -- path or URL
        run           VARCHAR,
        template      VARCHAR,
        c             DOUBLE,
        file_id       VARCHAR,                 -- device:inode of the file being followed
        head_sha      VARCHAR,                 -- sha256 of its first bytes: a new file behind a reused inode
        offset_bytes  BIGINT NOT NULL DEFAULT 0,
        line_no       BIGINT NOT NULL DEFAULT 0,
        reader_state  JSON,                    -- what a reader carries between reads (V0 running totals, ...)
        last_read     TIMESTAMP,
        last_data     TIMESTAMP,
        rows          BIGINT NOT NULL DEFAULT 0,
        status        VARCHAR,                 -- ok, failing, stale
        last_error    VARCHAR,
        failing_since TIMESTAMP
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def default_db_path() -> str:
    """`SPECMON_DB` if set, else specmon.duckdb in the current directory."""
    return os.environ.get(DB_ENV) or DEFAULT_DB


def schema_version(conn: duckdb.DuckDBPyConnection) -> int:
    exists = conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
    ).fetchall()[0][0]
    if not exists:
        return 0
    return int(conn.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] or 0)


def migrate(conn: duckdb.DuckDBPyConnection, path: str, upto: int = SCHEMA_VERSION) -> None:
    """Bring the schema up to `upto`, one transaction per migration; refuse a newer schema."""
    current = schema_version(conn)
    if current > SCHEMA_VERSION:
        raise SpecmonError(
            f"{path}: database schema version {current} is newer than this specmon understands "
            f"(up to {SCHEMA_VERSION}); upgrade specmon to open it"
        )
    for version in range(current, upto):
        conn.execute("BEGIN TRANSACTION")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP)")
            conn.execute(MIGRATIONS[version])
            conn.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [version + 1])
            conn.execute("COMMIT")
        except Exception:
            conn.execute("ROLLBACK")
            raise


def connect(path: str) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB file with specmon's session settings (UTC timestamps)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = duckdb.connect(path)
    except duckdb.IOException as exc:
        raise SpecmonError(f"{path}: cannot open the database ({exc}). Is another specmon process writing it?") from None
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET memory_limit = ?", [os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY_LIMIT])
    return conn


class Store:
    """A specmon database: one DuckDB connection, a cursor per reader, writers serialised."""

    def __init__(self, path: str | None = None):
        self.path = path or default_db_path()
        self._conn = connect(self.path)
        self._write_lock = threading.Lock()
        migrate(self._conn, self.path)
        # No other process can hold this file open for writing, so staged rows are leftovers of a killed ingest.
        self._conn.execute("DELETE FROM staging_steps; DELETE FROM staging_positions")
        self._generation = 0

    @property
    def generation(self) -> int:
        """A counter that changes after every committed write; a cache key for query results."""
        return self._generation

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self._conn.cursor()
        cur.execute("SET TimeZone = 'UTC'")
        return cur

    def query_df(self, sql: str, params: list | None = None):
        """Run one read query on its own cursor and return a pandas DataFrame."""
        with self.cursor() as cur:
            return cur.execute(sql, params or []).df()

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self.cursor() as cur:
            return cur.execute(sql, params or []).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write transaction: everything inside commits together or not at all."""
        with self._write_lock:
            cur = self.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
                cur.execute("COMMIT")
                self._generation += 1
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            finally:
                cur.close()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def has_user_data(self) -> bool:
        return bool(self.query("SELECT count(*) FROM runs WHERE NOT demo")[0][0])

    def is_empty(self) -> bool:
        return not self.query("SELECT count(*) FROM runs")[0][0]


def get_or_create_run(cur: duckdb.DuckDBPyConnection, name: str, source: str, demo: bool, meta: str | None) -> int:
    rows = cur.execute("SELECT run_id, demo FROM runs WHERE name = ?", [name]).fetchall()
    if rows:
        row = rows[0]
        if row[1] != demo:
            kind = "demo" if row[1] else "user"
            raise SpecmonError(f"run name {name!r} belongs to {kind} data; choose another --run")
        return row[0]
    return cur.execute(
        "INSERT INTO runs (name, source, demo, created_at, meta) VALUES (?, ?, ?, now()::TIMESTAMP, ?) RETURNING run_id",
        [name, source, demo, meta],
    ).fetchall()[0][0]


def get_or_create_segment(cur: duckdb.DuckDBPyConnection, run_id: int, template: str) -> int:
    rows = cur.execute("SELECT segment_id FROM segments WHERE run_id = ? AND template = ?", [run_id, template]).fetchall()
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
