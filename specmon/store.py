"""The DuckDB store: schema, migrations, short-lived connections, and transactions.

No process holds the database file longer than one operation. DuckDB lets one process write a file, or several
read it, at a time; a dashboard that kept its connection open would lock every other specmon process out. So each
read opens a read-only connection, runs, and closes it; each write opens a read-write connection for one
transaction and closes it. An operation that finds the file locked by another process waits, a bounded and
configurable time (`SPECMON_LOCK_TIMEOUT`, default 60 s), saying once that it is waiting. Inside one process a
readers-writer lock keeps read-only and read-write connections from overlapping (DuckDB refuses mixed
configurations in one process). Long work (staging a large step log) happens in a separate staging file, so the
main file is locked only for the short transaction that publishes it.
Every query is parameterised: nothing from user input is pasted into SQL.
"""
from __future__ import annotations

import glob
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from specmon import settings
from specmon.faults import SpecmonError
from specmon.settings import DB_ENV, DEFAULT_DB, DEFAULT_LOCK_TIMEOUT_S, LOCK_TIMEOUT_ENV

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
    -- One row per drafted position (1-based, as in docs/math.md).
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
    # 6: staging moved to a file of its own per load (Store.staging), so the main file is not held while a large
    # step log is read; the staging tables of migration 2 are no longer used.
    # Also: how long a watched source may go without data before it is shown stale, and what the watcher last
    # announced per run and subject (an alarm, a segment's status), so a restarted watcher does not repeat itself.
    """
    DROP TABLE staging_steps;
    DROP TABLE staging_positions;
    ALTER TABLE watch_sources ADD COLUMN stale_after_s DOUBLE;
    CREATE TABLE watch_notices (
        run         VARCHAR NOT NULL,
        subject     VARCHAR NOT NULL,          -- alarm:<estimated change time> or status:<template>
        state       VARCHAR NOT NULL,          -- open / closed, losing / not losing
        changed_at  TIMESTAMP NOT NULL,
        PRIMARY KEY (run, subject)
    );
    """,
    # 7: the run/segment join and the rule "show the demo only while the user has stored nothing of their own",
    # written once: every query that lists what the pages and summaries show reads these views.
    """
    CREATE VIEW run_segments AS
        SELECT sg.segment_id, sg.template, r.run_id, r.name AS run, r.source, r.demo, r.meta
        FROM segments sg JOIN runs r USING (run_id);
    CREATE VIEW shown_runs AS
        SELECT * FROM runs WHERE demo = NOT EXISTS (SELECT 1 FROM runs WHERE NOT demo);
    CREATE VIEW shown_segments AS
        SELECT * FROM run_segments WHERE demo = NOT EXISTS (SELECT 1 FROM runs WHERE NOT demo);
    """,
]

# Rollups: what every summary, page and `specmon check` reads instead of scanning steps and positions. One row per
# ingest, segment, hour (the base time bucket: every timeline bucket, 6 hours, a day, a 7-day week, is a whole number
# of hours on the same origin) and request; and one per ingest, segment, hour and drafted position. Rows are only
# ever appended, in the transaction that publishes the ingest they sum (refresh_rollups), so a request that spans
# hours or watched pieces has several rows, added up when read: every figure a reader needs is a sum, a count, a
# min or a max of them. Non-integer sums are fixed-point DECIMAL(38, 12) (exact and order-free, so summaries keep
# their digits from run to run). The medians of the step timings are not sums; they are read from the steps that
# carry timings (`timed` says which segments have any).
ROLLUP_EXACT = "DECIMAL(38, 12)"
ROLLUP_BUCKET = "1 hour"
_HOUR_OF_STEP = f"time_bucket(INTERVAL '{ROLLUP_BUCKET}', st.ts)"


def _rollup_requests_select(source: str, d: str) -> str:
    """The per-request rollup of the steps matching {where} (steps aliased st), from `source`, where d names what
    holds a step's timings and PIT lists (steps itself before migration 13, step_details after)."""
    return f"""
SELECT st.ingest_id, st.segment_id, {_HOUR_OF_STEP} AS hour, st.request_id,
       count(*) AS steps, sum(st.g) AS drafted, sum(st.accepted) AS accepted, sum(st.checked) AS checked,
       max(coalesce(st.k, st.g)) AS k,
       sum(st.accepted) FILTER (WHERE st.beta_lo_sum IS NOT NULL) AS b_accepted,
       sum(st.checked) FILTER (WHERE st.beta_lo_sum IS NOT NULL) AS b_checked,
       sum(st.beta_lo_sum::{ROLLUP_EXACT}) AS b_lo, sum(st.beta_hi_sum::{ROLLUP_EXACT}) AS b_hi,
       min(st.ts) AS first_ts, max(st.ts) AS last_ts, count(*) FILTER (WHERE st.ts_inferred) AS ts_inferred,
       count(*) FILTER (WHERE {d}.draft_ms IS NOT NULL OR {d}.target_ms IS NOT NULL) AS timed,
       sum(len({d}.pit_mass)) AS pit_tokens
FROM {source} WHERE {{where}} GROUP BY st.ingest_id, st.segment_id, hour, st.request_id
"""


# Migration 8's text, as released (the steps then held their timings and PIT lists).
_ROLLUP_REQUESTS_SELECT_V8 = _rollup_requests_select("steps st", "st")
ROLLUP_REQUESTS_SELECT = _rollup_requests_select("steps st LEFT JOIN step_details d USING (step_id)", "d")
# The per-position rollup of the positions of the steps matching {where}; beta's bounds summed over checked
# positions, with their counts (a bound is NULL where no distributions were logged). checked, accepted: SQL of
# whether position p was checked, accepted; hi: SQL of its beta_hi.
def _rollup_position_sums(checked: str, accepted: str, hi: str = "p.beta_hi") -> str:
    return f"""
       count(*) FILTER (WHERE {checked}) AS checked, count(*) FILTER (WHERE {accepted}) AS accepted,
       sum(p.beta_lo::{ROLLUP_EXACT}) FILTER (WHERE {checked}) AS beta_lo_sum,
       count(p.beta_lo) FILTER (WHERE {checked}) AS beta_lo_n,
       sum(({hi})::{ROLLUP_EXACT}) FILTER (WHERE {checked}) AS beta_hi_sum,
       count({hi}) FILTER (WHERE {checked}) AS beta_hi_n"""


# Migration 8's text, as released (it reads the later positions view as it read the table).
_ROLLUP_POSITIONS_SELECT_V8 = f"""
SELECT st.ingest_id, p.segment_id, {_HOUR_OF_STEP} AS hour, p.position,
       {_rollup_position_sums("p.checked", "p.accepted")}
FROM positions p JOIN steps st USING (step_id) WHERE {{where}} GROUP BY st.ingest_id, p.segment_id, hour, p.position
"""
# A position's segment is its step's, and so is whether it was checked or accepted: the accepted positions of a step
# are 1..accepted and the checked ones 1..checked. position_rows stores only what is the position's own (fewer
# columns to write: 2.7 against 4.2 CPU s for a 10M-position flat ingest's positions); the positions view joins
# the rest back.
_CHECKED, _ACCEPTED = "p.position <= st.checked", "p.position <= st.accepted"
# A position's beta_hi: its own in position_bounds where it has a row there (migration 14), else its beta_lo.
_BETA_HI = "CASE WHEN h.position IS NULL THEN p.beta_lo ELSE h.beta_hi END"


def rollup_positions_select(bounds: bool = True) -> str:
    """The per-position rollup of the positions of the steps matching {where}, from position_rows. bounds=False:
    for steps none of whose positions has a row in position_bounds (their beta_hi is their beta_lo), which then
    is neither joined nor summed twice (DuckDB computes a repeated aggregate once)."""
    hi, join = (_BETA_HI, "LEFT JOIN position_bounds h USING (step_id, position)") if bounds else ("p.beta_lo", "")
    return f"""
SELECT st.ingest_id, st.segment_id, st.hour, p.position, {_rollup_position_sums(_CHECKED, _ACCEPTED, hi)}
FROM position_rows p JOIN (SELECT st.step_id, st.ingest_id, st.segment_id, {_HOUR_OF_STEP} AS hour, st.checked,
                                  st.accepted FROM steps st WHERE {{where}}) st USING (step_id) {join}
GROUP BY st.ingest_id, st.segment_id, st.hour, p.position
"""


ROLLUP_POSITIONS_SELECT = rollup_positions_select()
MIGRATIONS.append(
    # 8: the rollups, rebuilt from the steps and positions already stored.
    f"""
    CREATE TABLE rollup_requests (
        ingest_id INTEGER NOT NULL, segment_id INTEGER NOT NULL, hour TIMESTAMP NOT NULL, request_id VARCHAR NOT NULL,
        steps BIGINT NOT NULL, drafted BIGINT NOT NULL, accepted BIGINT NOT NULL, checked BIGINT NOT NULL,
        k INTEGER, b_accepted BIGINT, b_checked BIGINT, b_lo {ROLLUP_EXACT}, b_hi {ROLLUP_EXACT},
        first_ts TIMESTAMP NOT NULL, last_ts TIMESTAMP NOT NULL, ts_inferred BIGINT NOT NULL, timed BIGINT NOT NULL,
        pit_tokens BIGINT
    );
    INSERT INTO rollup_requests BY NAME {_ROLLUP_REQUESTS_SELECT_V8.format(where="true")};
    CREATE TABLE rollup_positions (
        ingest_id INTEGER NOT NULL, segment_id INTEGER NOT NULL, hour TIMESTAMP NOT NULL, position SMALLINT NOT NULL,
        checked BIGINT NOT NULL, accepted BIGINT NOT NULL, beta_lo_sum {ROLLUP_EXACT}, beta_lo_n BIGINT NOT NULL,
        beta_hi_sum {ROLLUP_EXACT}, beta_hi_n BIGINT NOT NULL
    );
    INSERT INTO rollup_positions BY NAME {_ROLLUP_POSITIONS_SELECT_V8.format(where="true")};
    """
)
# Which requests have one rollup row in their run: sole rows are already per-request totals, so a summary reads them
# as they are and groups only the others (a request across hours or watched pieces), by far the fewer.
# {where} picks the (run, request) pairs to recount (r is rollup_requests, sg its segment).
_SOLE_UPDATE = """
UPDATE rollup_requests rq SET sole = c.n = 1
FROM (SELECT sg.run_id, r.request_id, count(*) AS n FROM rollup_requests r JOIN segments sg USING (segment_id)
      {where} GROUP BY ALL) c, segments sg
WHERE sg.segment_id = rq.segment_id AND c.run_id = sg.run_id AND c.request_id = rq.request_id
"""
MIGRATIONS.append(
    # 9: rollup_requests.sole, computed from the rollup rows already stored.
    "ALTER TABLE rollup_requests ADD COLUMN sole BOOLEAN NOT NULL DEFAULT false;"
    + _SOLE_UPDATE.format(where="") + ";"
)
MIGRATIONS.append(
    # 10: the drift detector's state per run and design, and calibrated thresholds, so an analysis reads only the
    # steps stored since the previous one and a fresh process does not calibrate again (specmon.drift_state).
    """
    CREATE TABLE drift_states (
        run         VARCHAR NOT NULL,
        design_key  VARCHAR NOT NULL,          -- false-alarm rate, p1, calibration and state versions
        reference   VARCHAR NOT NULL,          -- sha256 of the reference's points
        points      BIGINT NOT NULL,           -- stream points the state has taken in
        state       VARCHAR NOT NULL,          -- JSON text (Python's: an infinite float as Infinity)
        updated_at  TIMESTAMP NOT NULL,
        PRIMARY KEY (run, design_key)
    );
    CREATE TABLE drift_calibrations (
        calibration_key VARCHAR PRIMARY KEY,   -- sha256 of the reference's points, p0, p1, arl0, CALIBRATION_VERSION
        h               DOUBLE NOT NULL,
        created_at      TIMESTAMP NOT NULL
    );
    """
)
MIGRATIONS.append(
    # 11: positions keep only what is their own (position_rows); their segment, checked and accepted are their
    # step's, joined back by the positions view, which has the table's columns in its order. A stored position that
    # disagrees with its step (none is written so) stops the migration rather than being changed.
    f"""
    SELECT CASE WHEN count(*) > 0 THEN error(count(*) || ' stored positions disagree with their step''s segment, '
        || 'checked or accepted count, or have no step (first: step ' || min(p.step_id) || ')') END
    FROM positions p LEFT JOIN steps st USING (step_id)
    WHERE st.step_id IS NULL OR p.segment_id <> st.segment_id OR p.checked <> ({_CHECKED})
       OR p.accepted <> ({_ACCEPTED});
    CREATE TABLE position_rows (
        step_id     BIGINT NOT NULL,
        position    SMALLINT NOT NULL,         -- 1-based, as in docs/math.md
        draft_token INTEGER,
        beta_lo     DOUBLE,
        beta_hi     DOUBLE,
        p_token     DOUBLE,
        q_token     DOUBLE
    );
    INSERT INTO position_rows SELECT step_id, position, draft_token, beta_lo, beta_hi, p_token, q_token
        FROM positions;  -- in the table's order (an ingest's rows together), without a sort
    DROP TABLE positions;
    CREATE VIEW positions AS
        SELECT p.step_id, st.segment_id, p.position, p.draft_token, {_CHECKED} AS checked, {_ACCEPTED} AS accepted,
               p.beta_lo, p.beta_hi, p.p_token, p.q_token
        FROM position_rows p JOIN steps st USING (step_id);
    """
)
MIGRATIONS.append(
    # 12: p_token and q_token (p_i(x_i), q_i(x_i)) only where a log gives them, in position_tokens: most logs give
    # neither, and an empty column costs a write what a full one does (0.5 CPU s of a 10M-position flat ingest).
    # No specmon reader reads them; the positions view joins them back, so it shows what it showed.
    f"""
    DROP VIEW positions;
    CREATE TABLE position_tokens (
        step_id     BIGINT NOT NULL,
        position    SMALLINT NOT NULL,
        p_token     DOUBLE,
        q_token     DOUBLE
    );
    INSERT INTO position_tokens SELECT step_id, position, p_token, q_token FROM position_rows
        WHERE p_token IS NOT NULL OR q_token IS NOT NULL;
    ALTER TABLE position_rows DROP COLUMN p_token;
    ALTER TABLE position_rows DROP COLUMN q_token;
    CREATE VIEW positions AS
        SELECT p.step_id, st.segment_id, p.position, p.draft_token, {_CHECKED} AS checked, {_ACCEPTED} AS accepted,
               p.beta_lo, p.beta_hi, t.p_token, t.q_token
        FROM position_rows p JOIN steps st USING (step_id) LEFT JOIN position_tokens t USING (step_id, position);
    """
)


def bounds_differ(lo: str, hi: str) -> str:
    """SQL: a position's bounds (SQL lo and hi) differ, so it has a row in position_bounds (migration 14). Compared
    as DuckDB compares doubles (-0.0 equals 0.0, NaN equals NaN): what a reader sums is the same either way."""
    return f"{hi} IS DISTINCT FROM {lo}"


# A step's optional fields (none of which a flat file gives), apart from k, which the CUSUM reads with every step.
# Migration 13 moves exactly these: another field needs a migration of its own, not an edit here.
STEP_DETAILS = ("temperature", "target_ms", "draft_ms", "emitted_tokens", "pit_below", "pit_mass", "extra")
# SQL: the step gives at least one of them (it then has a row in step_details)
STEP_DETAILS_GIVEN = " OR ".join(f"{c} IS NOT NULL" for c in STEP_DETAILS)
MIGRATIONS.append(
    # 13: a step's optional fields in step_details, only for the steps that give one: seven empty columns cost a
    # 10M-position flat ingest's steps insert about 0.45 of its 1.2 CPU s. Their readers (the timings' medians,
    # the PIT lists, the rollups' timed and pit_tokens) join them by step_id.
    f"""
    CREATE TABLE step_details (
        step_id        BIGINT NOT NULL,
        temperature    DOUBLE,
        target_ms      DOUBLE,
        draft_ms       DOUBLE,
        emitted_tokens INTEGER[],
        pit_below      DOUBLE[],                -- F_t(x_t - 1) per emitted token, where p was logged in full
        pit_mass       DOUBLE[],                -- p_t(x_t) per emitted token
        extra          JSON
    );
    INSERT INTO step_details SELECT step_id, {', '.join(STEP_DETAILS)} FROM steps WHERE {STEP_DETAILS_GIVEN};
    {' '.join(f'ALTER TABLE steps DROP COLUMN {c};' for c in STEP_DETAILS)}
    """
)
MIGRATIONS.append(
    # 14: a position's beta_hi in position_bounds, only where it differs from its beta_lo (a log of top-k
    # logprobs, or one bound alone): an exact beta, from dense distributions or given, has lo == hi, and the
    # column cost a 10M-position flat ingest's positions write about 0.25 CPU s. The positions view and the
    # positions' rollup take beta_lo where a position has no row there.
    f"""
    DROP VIEW positions;
    CREATE TABLE position_bounds (
        step_id     BIGINT NOT NULL,
        position    SMALLINT NOT NULL,
        beta_hi     DOUBLE
    );
    INSERT INTO position_bounds SELECT step_id, position, beta_hi FROM position_rows
        WHERE {bounds_differ("beta_lo", "beta_hi")};
    ALTER TABLE position_rows DROP COLUMN beta_hi;
    CREATE VIEW positions AS
        SELECT p.step_id, st.segment_id, p.position, p.draft_token, {_CHECKED} AS checked, {_ACCEPTED} AS accepted,
               p.beta_lo, {_BETA_HI} AS beta_hi, t.p_token, t.q_token
        FROM position_rows p JOIN steps st USING (step_id) LEFT JOIN position_tokens t USING (step_id, position)
        LEFT JOIN position_bounds h USING (step_id, position);
    """
)
SCHEMA_VERSION = len(MIGRATIONS)

# What a load stages, in its own DuckDB file (one per load, removed when the load ends).
STAGING_DDL = """
CREATE TABLE staging_steps (
    local_step BIGINT NOT NULL, template VARCHAR NOT NULL, request_id VARCHAR NOT NULL,
    ts TIMESTAMP NOT NULL, ts_inferred BOOLEAN NOT NULL, k INTEGER, g INTEGER NOT NULL, accepted INTEGER NOT NULL,
    checked INTEGER NOT NULL, temperature DOUBLE, target_ms DOUBLE, draft_ms DOUBLE, beta_lo_sum DOUBLE,
    beta_hi_sum DOUBLE, emitted_tokens INTEGER[], pit_below DOUBLE[], pit_mass DOUBLE[], extra JSON
);
CREATE TABLE staging_positions (
    local_step BIGINT NOT NULL, position SMALLINT NOT NULL, draft_token INTEGER, beta_lo DOUBLE, beta_hi DOUBLE,
    p_token DOUBLE, q_token DOUBLE
);
"""


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
        except duckdb.Error as exc:  # a migration that refuses the stored data says why (the file is unchanged)
            conn.execute("ROLLBACK")
            raise SpecmonError(f"{path}: cannot upgrade the database to schema version {version + 1}: "
                               f"{str(exc).splitlines()[0]}") from None
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def connect(path: str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB file with specmon's session settings (UTC timestamps, a memory cap). Raises DuckDB's
    IOException when another process holds a conflicting lock (Store waits and retries)."""
    if path != ":memory:" and not read_only:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = duckdb.connect(path, read_only=read_only)
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET memory_limit = ?", [os.environ.get(settings.MEMORY_LIMIT_ENV) or settings.MEMORY_LIMIT])
    # DuckDB draws a progress bar on stdout for queries over two seconds, into `--json` output and pipes
    conn.execute("SET enable_progress_bar = false")
    return conn


@contextmanager
def query_progress(conn: duckdb.DuckDBPyConnection, progress: Callable[[int, int], None] | None, total: int,
                   every_s: float = 0.5) -> Iterator[None]:
    """While the block runs its queries on `conn`, report DuckDB's own estimate of how far the running query has
    got, as a share of `total` (progress(done, total), from a polling thread, never moving backwards), so that a
    load done by one long query still shows progress. The estimate is DuckDB's: for a file scan, the share of the
    file read."""
    if progress is None:
        yield
        return
    conn.execute("SET enable_progress_bar = true")  # DuckDB tracks progress only with its bar on;
    conn.execute("SET enable_progress_bar_print = false")  # the bar itself is never drawn (see connect)
    stop = threading.Event()

    def poll() -> None:
        best = 0
        while not stop.wait(every_s):
            share = conn.query_progress()  # percent; -1 while no query runs or it cannot tell
            done = int(total * min(share, 100.0) / 100) if share > 0 else 0
            if done > best:
                best = done
                progress(best, total)

    poller = threading.Thread(target=poll, name="specmon-query-progress", daemon=True)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join()
        conn.execute("SET enable_progress_bar = false")


def _is_lock_conflict(exc: Exception) -> bool:
    return "lock" in str(exc).lower()


def pid_alive(pid: int) -> bool:
    """Whether a process runs (a leftover file named after a dead one can be removed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return True
    return True


class _ReadersWriterLock:
    """Many readers or one writer, within this process (DuckDB refuses read-only and read-write connections to
    one file side by side in a process)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writer)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self, timeout: float | None = None) -> Iterator[None]:
        with self._cond:
            if not self._cond.wait_for(lambda: not self._writer and not self._readers, timeout):
                raise SpecmonError("the database is busy in this process")
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


_LOCKS: dict[str, _ReadersWriterLock] = {}
_LOCKS_GUARD = threading.Lock()


def _process_lock(path: str) -> _ReadersWriterLock:
    key = os.path.abspath(path) if path != ":memory:" else path
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, _ReadersWriterLock())


def _say_waiting(message: str) -> None:
    print(f"specmon: {message}", file=sys.stderr, flush=True)


class Store:
    """A specmon database file. Holds no connection between operations: reads and writes each open one.

    lock_timeout: how long an operation waits for another process's lock (default $SPECMON_LOCK_TIMEOUT or 60 s);
    on_wait: told once per operation that it is waiting (default: one line on stderr).
    """

    def __init__(self, path: str | None = None, *, lock_timeout: float | None = None,
                 on_wait: Callable[[str], None] | None = None):
        self.path = path or default_db_path()
        if lock_timeout is None:
            lock_timeout = float(os.environ.get(LOCK_TIMEOUT_ENV) or DEFAULT_LOCK_TIMEOUT_S)
        self.lock_timeout = lock_timeout
        self.on_wait = on_wait or _say_waiting
        self._lock = _process_lock(self.path)
        self._memory = duckdb.connect(":memory:") if self.path == ":memory:" else None
        self._writes = 0
        self._local = threading.local()
        if os.path.isdir(self.path):
            raise SpecmonError(f"{self.path}: is a directory, not a database file")
        if self._memory is not None or not self._schema_is_current():
            with self._connection(read_only=False) as conn:
                migrate(conn, self.path)
        self._sweep_staging()

    def _schema_is_current(self) -> bool:
        """Whether the file exists at this specmon's schema, read on a read-only connection: opening the file
        for writing only to find nothing to migrate would cost every command a write lock and a connection."""
        if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            return False
        with self._connection(read_only=True) as conn:
            return schema_version(conn) == SCHEMA_VERSION

    # -- connections ---------------------------------------------------------------------------------------
    def _open(self, read_only: bool, timeout: float | None = None) -> duckdb.DuckDBPyConnection:
        """Connect, waiting while another process holds a conflicting lock (timeout: this long and silently, for
        a write that may be skipped; default lock_timeout, saying so)."""
        if self._memory is not None:
            return self._memory.cursor()
        read_only = read_only and os.path.exists(self.path)
        deadline = time.monotonic() + (self.lock_timeout if timeout is None else timeout)
        delay, told = 0.01, False
        while True:
            try:
                return connect(self.path, read_only=read_only)
            except duckdb.IOException as exc:
                if not _is_lock_conflict(exc):
                    raise SpecmonError(f"{self.path}: cannot open the database ({exc})") from None
                if time.monotonic() >= deadline:
                    raise SpecmonError(
                        f"{self.path}: still locked by another process after {self.lock_timeout:g} s "
                        f"({str(exc).splitlines()[0]}); raise {LOCK_TIMEOUT_ENV} or --lock-timeout to wait longer"
                    ) from None
                if not told and timeout is None:
                    self.on_wait(f"waiting for the database {self.path} (another process is writing it; "
                                 f"up to {self.lock_timeout:g} s)")
                    told = True
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except duckdb.Error as exc:
                raise SpecmonError(f"{self.path}: cannot open the database ({str(exc).splitlines()[0]})") from None

    @contextmanager
    def _connection(self, read_only: bool, timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        with (self._lock.read() if read_only else self._lock.write(timeout)):
            conn = self._open(read_only, timeout)
            try:
                yield conn
            finally:
                conn.close()

    @property
    def generation(self) -> tuple:
        """Changes after every committed write, by any process: a cache key for query results (the file's and
        its write-ahead log's modification times and sizes, and this process's write count)."""
        stamp: list[int] = [self._writes]
        for p in (self.path, self.path + ".wal"):
            try:
                st = os.stat(p)
                stamp += [st.st_mtime_ns, st.st_size]
            except OSError:
                stamp += [0, 0]
        return tuple(stamp)

    @contextmanager
    def _shared(self, read_only: bool, timeout: float | None = None) -> Iterator[None]:
        """Operations inside the block, on this thread, share one connection (opening one costs tens of
        milliseconds, and a page, an analysis or a watcher's poll makes a dozen). A read-write block may read; a
        read-only block may not write."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            if not read_only and self._local.read_only:
                raise RuntimeError("a write inside Store.reading(): end the reading block first")
            yield
            return
        with self._connection(read_only, timeout) as conn:
            self._local.conn, self._local.read_only = conn, read_only
            try:
                yield
            finally:
                self._local.conn = None

    def reading(self):
        """A block of reads on one read-only connection (the file is shared with other readers meanwhile)."""
        return self._shared(read_only=True)

    def writing(self):
        """A block of reads and transactions on one read-write connection: the file is this process's until
        the block ends, so keep it short (a watcher's poll)."""
        return self._shared(read_only=False)

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for a few read queries; closed (and the file released) on leaving the block, unless it
        is the one of an enclosing `reading()` or `writing()` block."""
        shared = getattr(self._local, "conn", None)
        if shared is not None:
            yield shared
            return
        with self._connection(read_only=True) as conn:
            yield conn

    def query_df(self, sql: str, params: list | None = None):
        """Run one read query and return a pandas DataFrame."""
        with self.cursor() as cur:
            return cur.execute(sql, params or []).df()

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self.cursor() as cur:
            return cur.execute(sql, params or []).fetchall()

    @contextmanager
    def transaction(self, attach: dict[str, str] | None = None,
                    timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write transaction: everything inside commits together or not at all. `attach` maps an alias to a
        DuckDB file opened read-only beside the database for the transaction (a load's staging file). timeout:
        give up (SpecmonError) after this many seconds without saying so, for a write that may be skipped (a cache);
        default: wait lock_timeout, saying so."""
        with self._shared(read_only=False, timeout=timeout):
            cur = self._local.conn
            for alias, path in (attach or {}).items():
                cur.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [path])
            try:
                cur.execute("BEGIN TRANSACTION")
                try:
                    yield cur
                    cur.execute("COMMIT")
                    self._writes += 1
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
            finally:
                for alias in attach or {}:
                    cur.execute(f"DETACH {alias}")

    # -- staging files -------------------------------------------------------------------------------------
    def _staging_pattern(self, pid: int | str) -> str:
        return f"{self.path}.stage-{pid}-*.duckdb"

    @contextmanager
    def staging(self) -> Iterator[tuple[str, duckdb.DuckDBPyConnection]]:
        """A fresh staging file of this process with the staging tables, as (path, connection). The connection
        closes when the block ends; the file stays until `discard_staging` (publish it with transaction(attach=))."""
        base = self.path if self._memory is None else os.path.join(os.environ.get("TMPDIR", "/tmp"), "specmon")
        path = f"{base}.stage-{os.getpid()}-{uuid.uuid4().hex}.duckdb"
        conn = connect(path)
        try:
            conn.execute(STAGING_DDL)
            yield path, conn
        finally:
            conn.close()

    @staticmethod
    def discard_staging(path: str) -> None:
        for p in (path, path + ".wal"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def _sweep_staging(self) -> None:
        """Remove staging files left by loads whose process died (kill -9): they were never published."""
        for p in glob.glob(self._staging_pattern("*")):
            pid = p[len(self.path) + len(".stage-"):].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                self.discard_staging(p)

    def close(self) -> None:
        """Nothing is held between operations; kept so `with Store(...)` reads naturally."""
        if self._memory is not None:
            self._memory.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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


# The positions' rollup of a large ingest is summed in ranges of this many steps, then the ranges' sums are added:
# each range's join of positions with their steps stays small (0.62 against 0.93-1.11 CPU s for 10M positions, 2.5M
# steps, in ranges of 500,000; docs/benchmarks.md, "Ingest", sixth round). Sums and counts add exactly (the sums are
# fixed-point decimals), so the rows are those of one pass.
ROLLUP_RANGE_STEPS = 500_000
_ROLLUP_POSITIONS_ADD = """
SELECT ingest_id, segment_id, hour, position, sum(checked) AS checked, sum(accepted) AS accepted,
       sum(beta_lo_sum) AS beta_lo_sum, sum(beta_lo_n) AS beta_lo_n, sum(beta_hi_sum) AS beta_hi_sum,
       sum(beta_hi_n) AS beta_hi_n
FROM rollup_positions_parts GROUP BY ingest_id, segment_id, hour, position
"""


def refresh_rollups(cur: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Add the rollup rows of the steps and positions one ingest published, inside its transaction. An ingest's
    steps hold the ids from its least to its greatest (with gaps, for a flat file), so its positions are found by
    step id range (the table's zone maps skip the rest)."""
    lo, hi, steps = cur.execute("SELECT min(step_id), max(step_id), count(*) FROM steps WHERE ingest_id = ?",
                                [ingest_id]).fetchall()[0]
    if lo is None:  # engine windows, Prometheus samples: no steps
        return
    cur.execute(f"INSERT INTO rollup_requests BY NAME {ROLLUP_REQUESTS_SELECT.format(where='st.ingest_id = ?')}",
                [ingest_id])
    # the requests this ingest touched: one row now, or more (rows from earlier ingests of the same run)
    cur.execute(_SOLE_UPDATE.format(where="SEMI JOIN (SELECT sg2.run_id, r2.request_id FROM rollup_requests r2 "
                                          "JOIN segments sg2 USING (segment_id) WHERE r2.ingest_id = ?) t "
                                          "ON t.run_id = sg.run_id AND t.request_id = r.request_id"), [ingest_id])
    # The steps' id range as literals: DuckDB plans the join knowing the ids' bounds on both sides.
    select = rollup_positions_select(bool(cur.execute(
        "SELECT count(*) FROM position_bounds WHERE step_id BETWEEN ? AND ?", [lo, hi]).fetchall()[0][0]))
    parts = -(-int(steps) // ROLLUP_RANGE_STEPS)
    width = -(-(int(hi) - int(lo) + 1) // parts)  # ids that hold about ROLLUP_RANGE_STEPS steps
    ranges = [(a, min(a + width - 1, int(hi))) for a in range(int(lo), int(hi) + 1, width)]
    for n, (a, b) in enumerate(ranges):
        where = f"st.step_id BETWEEN {a} AND {b} AND st.ingest_id = ?"  # integers read above
        into = ("INSERT INTO rollup_positions BY NAME" if len(ranges) == 1 else
                "INSERT INTO rollup_positions_parts" if n else "CREATE OR REPLACE TEMP TABLE rollup_positions_parts AS")
        cur.execute(f"{into} {select.format(where=where)}", [ingest_id])
    if len(ranges) > 1:
        cur.execute(f"INSERT INTO rollup_positions BY NAME {_ROLLUP_POSITIONS_ADD}; DROP TABLE rollup_positions_parts")
