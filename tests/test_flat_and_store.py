"""The flat form (CSV, Parquet), the schema's migrations, and queries that never paste user text into SQL."""
import duckdb
import numpy as np
import pandas as pd
import pytest
from conftest import PAPER_P, PAPER_Q

from specmon.analysis import lossless
from specmon.analysis.summary import summarize
from specmon.core import sampler, settings
from specmon.core.faults import SpecmonError
from specmon.core.resources import DEMO_LOG
from specmon.ingest.pipeline import ingest_file
from specmon.store import database as store_mod
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


def counts(store):
    return store.query("SELECT (SELECT count(*) FROM ingests), (SELECT count(*) FROM steps), "
                       "(SELECT count(*) FROM positions)")[0]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_flat_form_round_trips_to_the_same_summary_as_jsonl(store, tmp_path, fmt):
    df = flat_rows()
    path = tmp_path / f"flat.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
    res = ingest_file(store, str(path))
    assert (res.status, res.source_format, res.steps, res.positions) == ("stored", f"flat-{fmt}", 2000, 8000)
    seg = summarize(store)[0]
    accepted = df.groupby("step")["accepted"].sum()
    assert seg["accepted"] == accepted.sum()
    assert seg["checked"] == np.minimum(accepted + 1, 4).sum()
    assert seg["beta"] == pytest.approx(0.88)
    assert seg["tokens_per_step"] == pytest.approx(1 + accepted.mean())


def test_zero_based_positions_are_shifted(store, tmp_path):
    df = flat_rows(50)
    df["position"] -= 1
    df.to_csv(tmp_path / "zero.csv", index=False)
    ingest_file(store, str(tmp_path / "zero.csv"))
    assert store.query("SELECT min(position), max(position) FROM positions")[0] == (1, 4)


def set_cell(row, column, value):
    def mutate(df):
        df = df.astype({column: object})
        df.loc[row, column] = value
        return df
    return mutate


# (label, mutation, CSV line of the fault: data row + 2 for the header, field, reason)
CSV_FAULTS = [
    ("bad int", set_cell(5, "step", "five"), 7, "step", "expected an integer, got five"),
    ("bad bool", set_cell(2, "accepted", "maybe"), 4, "accepted", "expected true or false, got maybe"),
    ("beta range", set_cell(3, "beta", 1.5), 5, "beta", "outside [0, 1]"),
    ("not a prefix", set_cell(3, "accepted", True), 5, "accepted", "must be a prefix"),
    ("bad ts", set_cell(9, "ts", "soon"), 11, "ts", "soon"),
    ("duplicate position", set_cell(1, "position", 1), 3, "position", "appears twice"),
    ("gap", set_cell(2, "position", 6), 2, "position", "are not 1..g without gaps"),
    ("two templates", set_cell(1, "template", "other"), 2, "template", "names more than one template"),
    # position 3 twice, rejected on line 4 and then accepted on line 5: both rules are broken on line 5
    ("accepted after a rejected twin", lambda df: set_cell(3, "accepted", True)(set_cell(3, "position", 3)(df)), 5,
     "accepted", "must be a prefix"),
]


@pytest.mark.parametrize("label,mutate,line,field,reason", CSV_FAULTS, ids=[f[0] for f in CSV_FAULTS])
def test_csv_faults_name_the_line_and_field(store, tmp_path, label, mutate, line, field, reason):
    df = flat_rows(20)
    df.loc[0:3, "accepted"] = [True, True, False, False]  # a step whose prefix the mutations can break
    df = mutate(df)
    path = tmp_path / "bad.csv"
    df.to_csv(path, index=False)
    res = ingest_file(store, str(path))
    assert res.status == "rejected"
    # A fault may cause others (a bad step number leaves a gap in its step): the direct one must be among them.
    assert any((f.line, f.field) == (line, field) and reason in f.reason for f in res.faults), res.faults
    assert str(res.faults[0]).startswith(f"{path}:")
    assert counts(store) == (0, 0, 0)


def test_a_step_beyond_63_positions_is_checked_and_stored(store, tmp_path):
    df = pd.DataFrame({"request_id": "r", "step": 0, "position": np.arange(1, 71), "draft_token": 7,
                       "accepted": np.arange(1, 71) <= 40})
    df.to_parquet(tmp_path / "long.parquet")
    res = ingest_file(store, str(tmp_path / "long.parquet"))
    assert (res.status, res.steps, res.positions) == ("stored", 1, 70)
    df.loc[69, "position"] = 69
    df.to_parquet(tmp_path / "long-dup.parquet")
    res = ingest_file(store, str(tmp_path / "long-dup.parquet"))
    assert res.status == "rejected" and [(f.line, f.field) for f in res.faults] == [(70, "position")]
    assert "appears twice" in res.faults[0].reason


def test_parquet_typed_columns_name_empty_required_values(store, tmp_path):
    df = flat_rows(5)
    df["position"] = df["position"].astype("Int64")
    df.loc[2, "request_id"] = None
    df.loc[6, "position"] = None
    df.to_parquet(tmp_path / "nulls.parquet")
    res = ingest_file(store, str(tmp_path / "nulls.parquet"))
    assert res.status == "rejected"
    assert {(f.line, f.field, f.reason) for f in res.faults} >= {
        (3, "request_id", "required value is empty"), (7, "position", "required value is empty")}


def test_csv_missing_column_and_unreadable_line(store, tmp_path):
    (tmp_path / "nocol.csv").write_text("request_id,step,position,accepted\nr,0,1,true\n")
    res = ingest_file(store, str(tmp_path / "nocol.csv"))
    assert res.status == "rejected" and res.faults[0].field == "draft_token"
    (tmp_path / "ragged.csv").write_text(
        "request_id,step,position,draft_token,accepted\nr,0,1,5,true\nr,0,2,5,false,extra\nr,1,1,3,false\n")
    res = ingest_file(store, str(tmp_path / "ragged.csv"))
    assert res.status == "rejected" and res.faults[0].line == 3 and "unreadable CSV line" in res.faults[0].reason
    res = ingest_file(store, str(tmp_path / "ragged.csv"), skip_bad=True, report_path=str(tmp_path / "rep.jsonl"))
    # line 3 is unreadable; line 2 belongs to the same step and cannot stand alone? It can: step 0 is then g = 1.
    assert res.status == "stored" and res.steps == 2 and res.rejected == 1
    assert store.query("SELECT ts_inferred FROM steps LIMIT 1")[0][0] is True


def test_skip_bad_drops_the_whole_step_of_a_bad_row(store, tmp_path):
    df = flat_rows(10)
    df.loc[5, "draft_token"] = -3
    df.to_parquet(tmp_path / "bad.parquet")
    report = tmp_path / "rep.jsonl"
    res = ingest_file(store, str(tmp_path / "bad.parquet"), skip_bad=True, report_path=str(report))
    assert (res.steps, res.rejected) == (9, 4)
    lines = report.read_text().splitlines()
    assert '"line":6' in lines[1] and "outside 0.." in lines[1]  # Parquet: line = row number, from 1


def test_migrations_upgrade_an_older_file_and_refuse_a_newer_one(tmp_path):
    path = str(tmp_path / "old.duckdb")
    con = store_mod.connect(path)
    store_mod.migrate(con, path, upto=store_mod.SCHEMA_VERSION - 1)
    assert store_mod.schema_version(con) == store_mod.SCHEMA_VERSION - 1
    con.close()
    with Store(path) as s, s.cursor() as con:
        assert store_mod.schema_version(con) == store_mod.SCHEMA_VERSION
    con = duckdb.connect(path)
    con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [store_mod.SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(SpecmonError, match=r"schema version \d+ is newer than this specmon understands"):
        Store(path)


def step_columns(store) -> list[str]:
    return [c for (c,) in store.query("SELECT column_name FROM information_schema.columns WHERE table_name = 'steps' "
                                      "ORDER BY ordinal_position")]


def _old_store_from(store, path: str, before: str, copy: list[str]) -> duckdb.DuckDBPyConnection:
    """A connection to a database at the schema before the migration that runs `before`, holding what each of the
    `copy` statements inserts from `store`'s file (attached as cur)."""
    version = next(i for i, m in enumerate(store_mod.MIGRATIONS) if before in m)
    con = store_mod.connect(path)
    store_mod.migrate(con, path, upto=version)
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
    assert store_mod.schema_version(con) < store_mod.SCHEMA_VERSION
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
                            f"{store_mod.ROLLUP_POSITIONS_SELECT.format(where='st.ingest_id = ?')}", [ingest_id])
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


HOSTILE_ROWS = [
    ("token id >= 2^31", {"draft_token": 2 ** 31}, "draft_token", "outside 0..2147483647"),
    ("position beyond 32767", {"position": 40000}, "position", "32767"),
    ("position at BIGINT's least", {"position": -2 ** 63}, "position", "is below 1"),
    ("position at BIGINT's greatest", {"position": 2 ** 63 - 1}, "position", "32767"),
    ("step beyond BIGINT", {"step": str(2 ** 70)}, "step", "expected an integer"),
    ("year 9999 shifted out of the calendar", {"ts": "9999-12-31T23:59:59-05:00"}, "ts", "years 1 to 9999"),
    ("year 1 shifted out of the calendar", {"ts": "0001-01-01T00:00:00+05:00"}, "ts", "years 1 to 9999"),
]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("label,change,field,reason", HOSTILE_ROWS, ids=[h[0] for h in HOSTILE_ROWS])
def test_hostile_flat_values_are_named_faults_and_skip_bad_keeps_the_good_steps(store, tmp_path, fmt, label, change,
                                                                               field, reason):
    df = flat_rows(500).astype({"step": object, "ts": object, "draft_token": "int64"})
    bad = {"request_id": "bad", "ts": "2026-11-29T10:00:00Z", "template": "flat", "step": 10 ** 6, "position": 1,
           "draft_token": 1, "accepted": True, "beta": 0.5, **change}
    df = pd.concat([df.iloc[:300], pd.DataFrame([bad]).astype(df.dtypes.to_dict() | {"step": object}), df.iloc[300:]],
                   ignore_index=True)
    df["step"] = df["step"].astype(str)
    df["ts"] = df["ts"].astype(str)
    path = tmp_path / f"h.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
    res = ingest_file(store, str(path))
    assert res.status == "rejected" and counts(store) == (0, 0, 0)
    first = res.faults[0]
    assert (first.line, first.field) == ((302 if fmt == "csv" else 301), field) and reason in first.reason
    res = ingest_file(store, str(path), skip_bad=True, report_path=str(tmp_path / "rep.jsonl"))
    assert res.status == "stored" and res.steps == 500
    summarize(store)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_position_at_bigints_greatest_in_a_file_numbered_from_0_is_a_named_fault(store, tmp_path, fmt):
    """Numbered from 0, a position is shifted up by one: at 2^63 - 1 that shift would overflow, so the rules compare
    without it."""
    df = pd.DataFrame({"request_id": ["r", "r"], "step": [0, 0], "position": [0, 2 ** 63 - 1],
                       "draft_token": [1, 2], "accepted": [True, False]})
    path = tmp_path / f"z.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
    res = ingest_file(store, str(path))
    assert res.status == "rejected" and counts(store) == (0, 0, 0)
    assert any(f.field == "position" and "beyond the 32767 draft positions" in f.reason for f in res.faults)


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
