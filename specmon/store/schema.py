"""The database's schema: the migrations that build it, one transaction each, and the staging tables of a load.

Each migration upgrades the schema from version i to i + 1. Append; never edit a released migration: one that reads
rollup SQL keeps the text it was released with (the *_V8 selects below).
"""
from __future__ import annotations

import duckdb

from specmon.core.faults import SpecmonError
from specmon.store.rollups import (
    ACCEPTED,
    BETA_HI,
    CHECKED,
    HOUR_OF_STEP,
    REQUEST_POSITIONS_SOLE_UPDATE,
    ROLLUP_EXACT,
    ROLLUP_REQUEST_POSITIONS_SELECT,
    SOLE_UPDATE,
    bounds_differ,
    rollup_position_sums,
    rollup_requests_select,
)

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

# Migration 8's text, as released (the steps then held their timings and PIT lists).
_ROLLUP_REQUESTS_SELECT_V8 = rollup_requests_select("steps st", "st")
# Migration 8's text, as released (it reads the later positions view as it read the table).
_ROLLUP_POSITIONS_SELECT_V8 = f"""
SELECT st.ingest_id, p.segment_id, {HOUR_OF_STEP} AS hour, p.position,
       {rollup_position_sums("p.checked", "p.accepted")}
FROM positions p JOIN steps st USING (step_id) WHERE {{where}} GROUP BY st.ingest_id, p.segment_id, hour, p.position
"""
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
MIGRATIONS.append(
    # 9: rollup_requests.sole, computed from the rollup rows already stored.
    "ALTER TABLE rollup_requests ADD COLUMN sole BOOLEAN NOT NULL DEFAULT false;"
    + SOLE_UPDATE.format(where="") + ";"
)
MIGRATIONS.append(
    # 10: the drift detector's state per run and design, and calibrated thresholds, so an analysis reads only the
    # steps stored since the previous one and a fresh process does not calibrate again (specmon.drift.state).
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
    WHERE st.step_id IS NULL OR p.segment_id <> st.segment_id OR p.checked <> ({CHECKED})
       OR p.accepted <> ({ACCEPTED});
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
        SELECT p.step_id, st.segment_id, p.position, p.draft_token, {CHECKED} AS checked, {ACCEPTED} AS accepted,
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
        SELECT p.step_id, st.segment_id, p.position, p.draft_token, {CHECKED} AS checked, {ACCEPTED} AS accepted,
               p.beta_lo, p.beta_hi, t.p_token, t.q_token
        FROM position_rows p JOIN steps st USING (step_id) LEFT JOIN position_tokens t USING (step_id, position);
    """
)


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
        SELECT p.step_id, st.segment_id, p.position, p.draft_token, {CHECKED} AS checked, {ACCEPTED} AS accepted,
               p.beta_lo, {BETA_HI} AS beta_hi, t.p_token, t.q_token
        FROM position_rows p JOIN steps st USING (step_id) LEFT JOIN position_tokens t USING (step_id, position)
        LEFT JOIN position_bounds h USING (step_id, position);
    """
)
MIGRATIONS.append(
    # 15: load beside acceptance. An engine window keeps the load it ran at (requests running and waiting, the
    # engine's own throughputs), from the engine's load lines or series; a window with load and no speculative
    # counts (an engine without speculation) has its counts NULL. Benchmark sweeps are load points, one per
    # measurement (k = 0: speculation off). A run may be declared the baseline of another (same model, hardware and
    # traffic, speculation off), and periods of one run annotated as speculation off or on.
    """
    ALTER TABLE engine_windows ADD COLUMN running_requests DOUBLE;   -- requests running (the engine's batch)
    ALTER TABLE engine_windows ADD COLUMN waiting_requests DOUBLE;   -- requests queued
    ALTER TABLE engine_windows ADD COLUMN generation_throughput DOUBLE;  -- output tokens/s over the window
    ALTER TABLE engine_windows ADD COLUMN prompt_throughput DOUBLE;      -- prompt tokens/s over the window
    CREATE TABLE load_points (
        ingest_id     INTEGER NOT NULL,
        segment_id    INTEGER NOT NULL,
        source        VARCHAR NOT NULL,        -- load-sweep, vllm-bench, ...
        line          INTEGER,                 -- the row's line (a JSON file: its record)
        k             INTEGER,                 -- draft length; 0: speculation off; NULL: on, length unknown
        concurrency   DOUBLE NOT NULL,         -- requests in flight the measurement held
        repeat        INTEGER,
        output_tokens DOUBLE,
        duration_s    DOUBLE,
        output_tokens_per_s DOUBLE NOT NULL,
        accepted_tokens DOUBLE,
        draft_tokens  DOUBLE,
        emitted_tokens DOUBLE,
        ts            TIMESTAMP,               -- when it was measured, where the file says
        labels        JSON
    );
    CREATE TABLE baselines (
        run_id      INTEGER NOT NULL REFERENCES runs (run_id),   -- the run without speculation
        of_run_id   INTEGER NOT NULL REFERENCES runs (run_id),   -- the run it is the baseline of
        declared_at TIMESTAMP NOT NULL,
        PRIMARY KEY (run_id, of_run_id)
    );
    CREATE SEQUENCE speculation_period_ids START 1;
    CREATE TABLE speculation_periods (
        period_id   INTEGER PRIMARY KEY DEFAULT nextval('speculation_period_ids'),
        run_id      INTEGER NOT NULL REFERENCES runs (run_id),
        starts_at   TIMESTAMP NOT NULL,        -- UTC; in force until the run's next period
        speculation BOOLEAN NOT NULL,          -- false: the engine ran without speculation from then on
        note        VARCHAR,
        created_at  TIMESTAMP NOT NULL
    );
    """
)
MIGRATIONS.append(
    # 16: the watcher's outbox. Every notice to send (a webhook document, an Alertmanager alert) is written here in
    # the transaction that records the finding's new state, and sent from it until the receiver accepts, across
    # restarts; a row older than the watcher's outbox age is given up and kept, to be reported. A watched source
    # counts its failures, for specmon's own /metrics.
    """
    CREATE TABLE outbox (
        id              VARCHAR PRIMARY KEY,   -- the document's stable id: a receiver dedupes on it
        run             VARCHAR NOT NULL,
        subject         VARCHAR NOT NULL,      -- the finding's subject (watch_notices)
        event           VARCHAR NOT NULL,      -- segment_losing, ...; an alert: firing or resolved
        channel         VARCHAR NOT NULL,      -- webhook or alertmanager
        receiver        VARCHAR NOT NULL,      -- the URL it goes to
        body            JSON NOT NULL,         -- what is POSTed, as it is POSTed
        created_at      TIMESTAMP NOT NULL,
        attempts        INTEGER NOT NULL DEFAULT 0,
        next_attempt_at TIMESTAMP NOT NULL,
        delivered_at    TIMESTAMP,
        gave_up_at      TIMESTAMP,
        last_error      VARCHAR
    );
    ALTER TABLE watch_sources ADD COLUMN failures BIGINT DEFAULT 0;
    """
)
MIGRATIONS.append(
    # 17: a calibrated threshold keeps the points per alarm episode its simulation gave at h, which the alarms state
    # beside the points per alarm. Thresholds are a cache keyed by the calibration's version, which moved with this,
    # so the old rows are of no use and go.
    """
    DROP TABLE drift_calibrations;
    CREATE TABLE drift_calibrations (
        calibration_key VARCHAR PRIMARY KEY,   -- sha256 of the reference's points, p0, p1, arl0, CALIBRATION_VERSION
        h               DOUBLE NOT NULL,
        created_at      TIMESTAMP NOT NULL,
        episode_points  DOUBLE NOT NULL        -- simulated points per alarm episode at h (Infinity: none)
    );
    """
)
MIGRATIONS.append(
    # 18: checked and accepted positions per request and position, the clusters of the per-position intervals, built
    # from the steps already stored.
    f"""
    CREATE TABLE rollup_request_positions (
        ingest_id INTEGER NOT NULL, segment_id INTEGER NOT NULL, hour TIMESTAMP NOT NULL, request_id VARCHAR NOT NULL,
        position SMALLINT NOT NULL, checked BIGINT NOT NULL, accepted BIGINT NOT NULL,
        sole BOOLEAN NOT NULL DEFAULT false
    );
    INSERT INTO rollup_request_positions BY NAME {ROLLUP_REQUEST_POSITIONS_SELECT.format(where="true")};
    {REQUEST_POSITIONS_SOLE_UPDATE.format(where="")};
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
