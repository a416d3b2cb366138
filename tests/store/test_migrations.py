"""The store's schema: migrations keep every stored row and what reads them; user text is data; the demo rule."""
import duckdb
import numpy as np
import pandas as pd
import pytest
from paper import PAPER_P, PAPER_Q

from specmon.analysis import lossless
from specmon.analysis.summary import summarize
from specmon.core import sampler, settings
from specmon.core.faults import SpecmonError
from specmon.core.resources import DEMO_LOG
from specmon.ingest.pipeline import ingest_file
from specmon.store import database, rollups, schema
from specmon.store.database import Store


def flat_rows(n_steps=2000, seed=0):
    """The fixed pair's steps, flattened to one row per drafted position."""
    rows = []
    for i, rec in enumerate(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, n_steps, np.random.default_rng(seed),
                                                        distributions="none")):
        for pos, tok in enumerate(rec["draft_tokens"], start=1):
            rows.append({"request_id": rec["request_id"], "ts": rec["ts"], "template": "flat", "step": i,
                         "position": pos, "draft_token": tok, "accepted": pos <= rec["accepted"], "beta": 0.88})
    return pd.DataFrame(rows)


def set_cell(row, column, value):
    def mutate(df):
        df = df.astype({column: object})
        df.loc[row, column] = value
        return df
    return mutate


def test_migrations_upgrade_an_older_file_and_refuse_a_newer_one(tmp_path):
    path = str(tmp_path / "old.duckdb")
    con = database.connect(path)
    schema.migrate(con, path, upto=schema.SCHEMA_VERSION - 1)
    assert schema.schema_version(con) == schema.SCHEMA_VERSION - 1
    con.close()
    with Store(path) as s, s.cursor() as con:
        assert schema.schema_version(con) == schema.SCHEMA_VERSION
    con = duckdb.connect(path)
    con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [schema.SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(SpecmonError, match=r"schema version \d+ is newer than this specmon understands"):
        Store(path)


def step_columns(store) -> list[str]:
    return [c for (c,) in store.query("SELECT column_name FROM information_schema.columns WHERE table_name = 'steps' "
                                      "ORDER BY ordinal_position")]


def _old_store_from(store, path: str, before: str, copy: list[str]) -> duckdb.DuckDBPyConnection:
    """A connection to a database at the schema before the migration that runs `before`, holding what each of the
    `copy` statements inserts from `store`'s file (attached as cur)."""
    version = next(i for i, m in enumerate(schema.MIGRATIONS) if before in m)
    con = database.connect(path)
    schema.migrate(con, path, upto=version)
    con.execute("ATTACH ? AS cur (READ_ONLY)", [store.path])
    for statement in copy:
        con.execute(statement)
    con.execute("DETACH cur")
    return con


def test_the_position_rows_migration_keeps_every_stored_position(store, tmp_path):
    df = flat_rows(n_steps=300)
    df.assign(template=np.where(df["step"] % 3 == 0, "a", "b")).to_parquet(tmp_path / "f.parquet")
    assert ingest_file(store, str(tmp_path / "f.parquet")).status == "stored"
    positions = store.query("SELECT * FROM positions ORDER BY step_id, position")
    copy = ["INSERT INTO runs SELECT * FROM cur.runs", "INSERT INTO segments SELECT * FROM cur.segments",
            "INSERT INTO steps BY NAME SELECT * FROM cur.steps", "INSERT INTO positions SELECT * FROM cur.positions"]
    old = str(tmp_path / "old.duckdb")  # the schema before positions moved to position_rows
    _old_store_from(store, old, "CREATE TABLE position_rows", copy).close()
    with Store(old) as s:
        assert s.query("SELECT * FROM positions ORDER BY step_id, position") == positions
        assert s.query("SELECT count(*) FROM position_rows")[0][0] == len(positions) == 1200
    # a stored position that its step contradicts stops the migration, naming the file; nothing changes
    bad = str(tmp_path / "bad.duckdb")
    con = _old_store_from(store, bad, "CREATE TABLE position_rows", copy)
    con.execute("UPDATE positions SET accepted = NOT accepted WHERE step_id = ? AND position = ?",
                [positions[7][0], positions[7][2]])
    con.close()
    with pytest.raises(SpecmonError, match=r"bad\.duckdb: cannot upgrade .*1 stored positions disagree .*step "):
        Store(bad)
    con = duckdb.connect(bad, read_only=True)
    assert schema.schema_version(con) < schema.SCHEMA_VERSION
    assert con.execute("SELECT count(*) FROM positions").fetchall()[0][0] == 1200
    con.close()


def test_the_position_tokens_migration_keeps_p_and_q_where_given(store, tmp_path):
    df = flat_rows(n_steps=300)
    given = df.index % 3 != 0  # a third of the rows give neither, a few only one of them
    df = df.assign(p_token=np.where(given, 0.25 + df.index / 1e4, np.nan),
                   q_token=np.where(given & (df.index % 5 != 0), 0.5 - df.index / 1e5, np.nan))
    df.to_parquet(tmp_path / "f.parquet")
    assert ingest_file(store, str(tmp_path / "f.parquet")).status == "stored"
    positions = store.query("SELECT * FROM positions ORDER BY step_id, position")
    assert store.query("SELECT count(*) FROM position_tokens")[0][0] == given.sum() == 800
    # the same rows as the schema before the migration held them: every column of a position in position_rows
    old = str(tmp_path / "old.duckdb")
    _old_store_from(store, old, "CREATE TABLE position_tokens", [
        "INSERT INTO runs SELECT * FROM cur.runs", "INSERT INTO segments SELECT * FROM cur.segments",
        "INSERT INTO steps BY NAME SELECT * FROM cur.steps",
        "INSERT INTO position_rows SELECT step_id, position, draft_token, beta_lo, beta_hi, p_token, q_token "
        "FROM cur.positions"]).close()
    with Store(old) as s:
        assert s.query("SELECT * FROM positions ORDER BY step_id, position") == positions
        assert s.query("SELECT count(*), count(p_token), count(q_token) FROM position_tokens")[0] == (800, 800, 640)
        assert [c for (c,) in s.query("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'position_rows' ORDER BY ordinal_position")] == \
            ["step_id", "position", "draft_token", "beta_lo"]  # beta_hi: position_bounds (migration 14)


def test_the_step_details_migration_keeps_every_step_and_what_reads_them(store, tmp_path):
    log = tmp_path / "demo_steplog.jsonl"  # the demo's first lines: timings, emitted tokens, PIT lists, temperature;
    log.write_text("".join(DEMO_LOG.read_text().splitlines(keepends=True)[:40])  # a field of no column (extra),
                   + '{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1, "batch": 8}\n'
                   + '{"request_id": "a", "draft_tokens": [3], "accepted": 0}\n')  # and a step that gives none
    assert ingest_file(store, str(log)).status == "stored"
    full = "SELECT * FROM steps LEFT JOIN step_details USING (step_id) ORDER BY step_id"
    steps, positions = store.query(full), store.query("SELECT * FROM positions ORDER BY step_id, position")
    assert store.query("SELECT count(*) FROM step_details")[0][0] == len(steps) - 1
    old = str(tmp_path / "old.duckdb")
    _old_store_from(store, old, "CREATE TABLE step_details", [
        *(f"INSERT INTO {t} SELECT * FROM cur.{t}" for t in ("runs", "segments", "ingests", "rollup_requests",
                                                              "rollup_positions", "position_tokens")),
        "INSERT INTO position_rows SELECT step_id, position, draft_token, beta_lo, beta_hi FROM cur.positions",
        "INSERT INTO steps BY NAME SELECT * FROM cur.steps LEFT JOIN cur.step_details USING (step_id)"]).close()
    with Store(old) as s:
        assert s.query(full) == steps
        assert s.query("SELECT * FROM positions ORDER BY step_id, position") == positions
        assert summarize(s) == summarize(store)  # the timings' medians
        pit = lossless.pit_check(s, "demo_steplog", "v1")
        assert pit is not None and (pit.u == lossless.pit_check(store, "demo_steplog", "v1").u).all()
        assert "temperature" not in step_columns(s)


def test_the_position_bounds_migration_keeps_beta_hi_where_it_differs(store, tmp_path):
    topk = tmp_path / "topk.jsonl"  # beta's bounds differ at every position
    with topk.open("wb") as out:
        sampler.write_step_log(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 200, np.random.default_rng(0),
                                                           distributions="topk", topk=3), out)
    assert ingest_file(store, str(topk)).status == "stored"
    df = flat_rows(n_steps=300)  # an exact beta (lo == hi) in half the rows, beta_lo alone (hi missing) in the rest
    df.assign(beta=np.where(df.index % 2 == 0, df["beta"], np.nan),
              beta_lo=np.where(df.index % 2 == 1, 0.8, np.nan)).to_parquet(tmp_path / "f.parquet")
    assert ingest_file(store, str(tmp_path / "f.parquet")).status == "stored"
    tables = ("runs", "segments", "ingests", "steps", "step_details", "rollup_requests", "rollup_positions",
              "position_tokens")
    full = {t: store.query(f"SELECT * FROM {t} ORDER BY ALL") for t in (*tables, "positions")}
    differ = store.query("SELECT count(*) FILTER (WHERE beta_hi IS DISTINCT FROM beta_lo), "
                         "count(*) FILTER (WHERE beta_hi IS NULL AND beta_lo IS NOT NULL) FROM positions")[0]
    assert store.query("SELECT count(*) FROM position_bounds")[0][0] == differ[0] > 600 and differ[1] == 600
    old = str(tmp_path / "old.duckdb")  # the schema before it: every position's beta_hi in position_rows
    _old_store_from(store, old, "CREATE TABLE position_bounds", [
        *(f"INSERT INTO {t} SELECT * FROM cur.{t}" for t in tables),
        "INSERT INTO position_rows SELECT step_id, position, draft_token, beta_lo, beta_hi FROM cur.positions"]).close()
    with Store(old) as s:
        assert {t: s.query(f"SELECT * FROM {t} ORDER BY ALL") for t in full} == full
        assert s.query("SELECT count(*) FROM position_bounds")[0][0] == differ[0]
        assert summarize(s) == summarize(store)
        # the rollups rebuilt from the migrated rows are those stored before
        with s.transaction() as cur:
            cur.execute("DELETE FROM rollup_positions")
            for (ingest_id,) in cur.execute("SELECT ingest_id FROM ingests").fetchall():
                cur.execute(f"INSERT INTO rollup_positions BY NAME "
                            f"{rollups.ROLLUP_POSITIONS_SELECT.format(where='st.ingest_id = ?')}", [ingest_id])
        assert s.query("SELECT * FROM rollup_positions ORDER BY ALL") == full["rollup_positions"]


def test_user_text_is_data_not_sql(store, tmp_path):
    evil = "x'; DROP TABLE steps; --"
    path = tmp_path / "e.jsonl"
    path.write_text('{"request_id": "a", "draft_tokens": [1], "accepted": 1}\n')
    res = ingest_file(store, str(path), run=evil, template=evil)
    assert res.status == "stored"
    seg = summarize(store)[0]
    assert (seg["run"], seg["template"]) == (evil, evil)
    assert store.query("SELECT count(*) FROM steps")[0][0] == 1


def test_demo_is_shown_only_until_the_user_stores_data(store, tmp_path):
    from specmon.ingest import demo
    demo.ensure_demo(store)
    assert all(s["demo"] for s in summarize(store))
    assert demo.ensure_demo(store) is None  # not loaded twice
    path = tmp_path / "mine.jsonl"
    path.write_text('{"request_id": "a", "draft_tokens": [1], "accepted": 1}\n')
    ingest_file(store, str(path))
    assert [s["run"] for s in summarize(store)] == ["mine"]


def test_every_connection_gets_the_memory_cap_of_settings_or_of_the_environment(tmp_path, monkeypatch):
    def cap(limit: str) -> str:
        con = duckdb.connect()
        con.execute("SET memory_limit = ?", [limit])
        return con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]

    path = str(tmp_path / "m.duckdb")
    monkeypatch.delenv(settings.MEMORY_LIMIT_ENV, raising=False)
    with Store(path) as s, s.cursor() as con:
        assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == cap(settings.MEMORY_LIMIT)
    monkeypatch.setenv(settings.MEMORY_LIMIT_ENV, "300MB")
    with Store(path) as s, s.cursor() as con:
        assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == cap("300MB")
    assert cap("300MB") != cap(settings.MEMORY_LIMIT)


def test_the_calibrations_migration_drops_thresholds_kept_without_their_episode_rate(tmp_path):
    # a threshold kept before the rate per alarm episode was counted has none to give: the rows go (they belong to
    # an older calibration version, never read again), and a threshold is kept with its episode rate from then on
    path = str(tmp_path / "old.duckdb")
    version = next(i for i, m in enumerate(schema.MIGRATIONS) if "episode_points" in m)
    con = database.connect(path)
    schema.migrate(con, path, upto=version)
    con.execute("INSERT INTO drift_calibrations VALUES ('k', 8.5, now()::TIMESTAMP)")
    con.close()
    with Store(path) as s:
        assert s.query("SELECT count(*) FROM drift_calibrations")[0][0] == 0
        assert [c for (c,) in s.query("SELECT column_name FROM information_schema.columns WHERE table_name = "
                                       "'drift_calibrations' ORDER BY ordinal_position")][-1] == "episode_points"
