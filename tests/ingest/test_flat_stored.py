"""What the flat form stores, column by column, against a plain-Python reading of the same random file.

The oracle below is the flat form's definition written out row by row: a step is the rows of one
(request_id, step); a step's id is the ingest's first id (one past every earlier step's) less one plus the number
of its first line (CSV's header is line 1); checked positions are 1..accepted + 1 (at most g);
beta's bounds are beta where given, else beta_lo / beta_hi, summed over the checked positions exactly and rounded
once (math.fsum; NULL when any is missing), so the order of the rows does not matter; a file numbered from 0 is
shifted to 1..g; a step without ts gets the ingest time.
"""
import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from specmon.ingest.formats import flat
from specmon.ingest.pipeline import ingest_file
from specmon.store import rollups
from specmon.store.rollups import ROLLUP_POSITIONS_SELECT, ROLLUP_REQUESTS_SELECT

STEP_COLUMNS = ("step_id", "segment_id", "request_id", "step_index", "ts", "ts_inferred", "k", "g", "accepted",
                "checked", "temperature", "target_ms", "draft_ms", "beta_lo_sum", "beta_hi_sum", "emitted_tokens",
                "pit_below", "pit_mass", "extra")
STEPS = "steps LEFT JOIN step_details USING (step_id)"  # a step's every field (store.STEP_DETAILS)
POSITION_COLUMNS = ("step_id", "segment_id", "position", "draft_token", "checked", "accepted", "beta_lo", "beta_hi",
                    "p_token", "q_token")


def random_flat(rng: np.random.Generator, n_steps: int, zero_based: bool) -> pd.DataFrame:
    """Steps of random length (1..9) and accepted prefix, from interleaved requests; beta exact on some steps,
    bounds on others, none or gaps on the rest; some steps without template or ts."""
    rows = []
    next_step: dict[str, int] = {}
    for _ in range(n_steps):
        req = f"req-{rng.integers(0, n_steps // 6 + 1)}"
        step = next_step.get(req, int(rng.integers(0, 3)))
        next_step[req] = step + 1 + int(rng.integers(0, 2))
        g = int(rng.integers(1, 10))
        a = int(rng.integers(0, g + 1))
        template = [None, "alpha", "beta", "long template name"][rng.integers(0, 4)]
        ts = None if rng.random() < 0.1 else 1.7e9 + rng.uniform(0, 3 * 86400)
        kind = rng.integers(0, 4)  # 0 exact beta, 1 bounds, 2 nothing, 3 exact with gaps
        for pos in range(1, g + 1):
            beta = float(rng.uniform(0, 1))
            lo = float(rng.uniform(0, beta))
            row = {"request_id": req, "step": step, "position": pos - zero_based,
                   "draft_token": int(rng.integers(0, 50000)), "accepted": pos <= a, "template": template,
                   "ts": None if ts is None else ts + rng.uniform(0, 0.01),
                   "beta": beta if kind == 0 or (kind == 3 and rng.random() < 0.8) else None,
                   "beta_lo": lo if kind == 1 else None, "beta_hi": beta if kind == 1 else None,
                   "p_token": None if rng.random() < 0.3 else float(rng.uniform(0, 1)),
                   "q_token": None if rng.random() < 0.3 else float(rng.uniform(0, 1))}
            rows.append(row)
    return pd.DataFrame(rows)


def value(v):
    """None for a missing cell (pandas reads some as NaN)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def epoch_to_datetime(ts: float) -> datetime:
    """DuckDB's conversion of epoch seconds: microseconds rounded to nearest (half to even)."""
    return datetime(1970, 1, 1) + timedelta(microseconds=round(ts * 1e6))


def first_id(store, ingest_id: int) -> int:
    """The ingest's first step id: one past every earlier ingest's."""
    return store.query("SELECT coalesce(max(step_id), 0) + 1 FROM steps WHERE ingest_id < ?", [ingest_id])[0][0]


def expected(df: pd.DataFrame, first_step_id: int, segments: dict[str, int], ingested_at: datetime,
             first_line: int = 1):
    """The steps and positions the definition gives; first_line: the number of df's first row in its file."""
    base = 0 if df["position"].min() == 0 else 1
    order: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(df["request_id"], df["step"], strict=True)):
        order.setdefault(key, []).append(i)
    steps, positions = [], []
    for (req, step), idx in order.items():
        rows = df.iloc[idx].sort_values("position")
        step_id = first_step_id - 1 + first_line + idx[0]
        g = len(rows)
        a = int(rows["accepted"].sum())
        templates = [t for t in rows["template"] if value(t) is not None]
        segment = segments[templates[0] if templates else ""]
        stamps = [t for t in rows["ts"] if value(t) is not None]
        sums = []
        for col in ("beta_lo", "beta_hi"):
            terms, complete = [], True
            for _, r in rows.iterrows():
                if r["position"] - base + 1 > a + 1:
                    break
                v = r["beta"] if value(r["beta"]) is not None else value(r[col])
                if v is None:
                    complete = False
                else:
                    terms.append(v)
            sums.append(math.fsum(terms) if complete else None)
        ts = min(epoch_to_datetime(t) for t in stamps) if stamps else ingested_at
        steps.append((step_id, segment, req, step, ts, not stamps, None, g, a, min(a + 1, g), None, None, None,
                      *sums, None, None, None, None))
        for _, r in rows.iterrows():
            pos = int(r["position"]) - base + 1
            lo = value(r["beta"]) if value(r["beta"]) is not None else value(r["beta_lo"])
            hi = value(r["beta"]) if value(r["beta"]) is not None else value(r["beta_hi"])
            positions.append((step_id, segment, pos, int(r["draft_token"]), pos <= a + 1, bool(r["accepted"]), lo,
                              hi, value(r["p_token"]), value(r["q_token"])))
    return steps, positions


def write(df: pd.DataFrame, path, fmt: str) -> None:
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "parquet-pieces":  # row groups of 997 rows: steps straddle them, read by DuckDB's threads in parallel
        df.to_parquet(path, row_group_size=997)
    else:
        df.to_parquet(path)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("zero_based", [False, True])
def test_every_stored_column_matches_the_definition(store, tmp_path, fmt, zero_based):
    rng = np.random.default_rng(13 + zero_based)
    first = random_flat(rng, 600, zero_based)
    suffix = "csv" if fmt == "csv" else "parquet"
    ingest_file(store, _written(first, tmp_path / f"a.{suffix}", fmt))  # a second file's ids follow the first's
    df = random_flat(rng, 1500, zero_based)
    res = ingest_file(store, _written(df, tmp_path / f"b.{suffix}", fmt), template="")
    assert (res.status, res.positions) == ("stored", len(df)), res.faults
    assert_stored_as_defined(store, df, 2 if fmt == "csv" else 1)


def assert_stored_as_defined(store, df: pd.DataFrame, first_line: int = 1) -> None:
    """The last ingest stored the definition's steps, positions and rollups of df (first_line: as for expected)."""
    ingest_id, ingested_at = store.query("SELECT max(ingest_id), max(ingested_at) FROM ingests")[0]
    segments = dict(store.query("SELECT template, segment_id FROM segments WHERE run_id = "
                                "(SELECT run_id FROM ingests WHERE ingest_id = ?)", [ingest_id]))
    want_steps, want_positions = expected(df, first_id(store, ingest_id), segments, ingested_at, first_line)
    assert store.query(f"SELECT {', '.join(STEP_COLUMNS)} FROM {STEPS} WHERE ingest_id = ? ORDER BY step_id",
                       [ingest_id]) == want_steps
    assert store.query(f"SELECT {', '.join('p.' + c for c in POSITION_COLUMNS)} FROM positions p JOIN steps "
                       "USING (step_id) WHERE ingest_id = ? ORDER BY step_id, position", [ingest_id]) \
        == sorted(want_positions)
    assert_rollups_equal_a_rebuild(store, ingest_id)


def assert_rollups_equal_a_rebuild(store, ingest_id: int) -> None:
    """The rollups appended by the ingest equal a rebuild from what it stored (the migration's SQL)."""
    for table, select in (("rollup_requests", ROLLUP_REQUESTS_SELECT), ("rollup_positions", ROLLUP_POSITIONS_SELECT)):
        rebuild = select.format(where="st.ingest_id = ?")
        with store.cursor() as cur:
            columns = ", ".join(d[0] for d in cur.execute(f"DESCRIBE {rebuild}", [ingest_id]).fetchall())
        stored = store.query(f"SELECT {columns} FROM {table} WHERE ingest_id = ? ORDER BY ALL", [ingest_id])
        rebuilt = store.query(f"SELECT * FROM ({rebuild}) ORDER BY ALL", [ingest_id])
        assert stored == rebuilt and stored


@pytest.mark.parametrize("in_time_order", [True, False])
def test_positions_rollup_equals_a_rebuild_whether_hours_interleave_or_not(store, tmp_path, in_time_order):
    """The positions' rollup appended by an ingest equals a rebuild, for a log in time order (each hour's steps one
    run of ids) and one whose hours interleave. The first file's ids come before the second's."""
    rng = np.random.default_rng(21)
    ingest_file(store, _written(random_flat(rng, 300, False), tmp_path / "first.parquet", "parquet"))
    df = random_flat(rng, 1500, False)
    first_line = ~df.duplicated(["request_id", "step"])
    order = first_line.cumsum()  # the step's rank by first line, on every row of the step
    if in_time_order:  # 12 s per step: 1500 steps cross five hours
        df["ts"] = 1.7e9 + 12.0 * order.groupby([df["request_id"], df["step"]]).transform("first")
    else:  # a step every 12 s, but every other hour's steps written first
        rank = order.groupby([df["request_id"], df["step"]]).transform("first")
        df["ts"] = 1.7e9 + 12.0 * rank + 3600.0 * (rank % 2)
    res = ingest_file(store, _written(df, tmp_path / "second.parquet", "parquet"))
    assert res.status == "stored", res.faults
    ingest_id = store.query("SELECT max(ingest_id) FROM ingests")[0][0]
    assert store.query("SELECT count(DISTINCT hour) FROM rollup_positions WHERE ingest_id = ?", [ingest_id])[0][0] >= 5
    assert_rollups_equal_a_rebuild(store, ingest_id)


def _joins_taken(monkeypatch) -> list:
    """Record each flat insert that joined its positions with their steps (flat.write_joined)."""
    taken: list = []
    write_joined = flat.write_joined

    def spy(*args, **kwargs):
        taken.append(True)
        return write_joined(*args, **kwargs)

    monkeypatch.setattr(flat, "write_joined", spy)
    return taken


@pytest.mark.parametrize("swapped", [False, True])
def test_positions_find_their_step_by_line_unless_a_step_is_out_of_order(store, tmp_path, monkeypatch, swapped):
    """A file whose every step is adjacent lines in position order gives each position its step's id from its own
    line, without a join; one step whose two rows are swapped sends the whole file through the join. Both store
    the definition's rows."""
    joins = _joins_taken(monkeypatch)
    rng = np.random.default_rng(5)
    ingest_file(store, _written(random_flat(rng, 50, False), tmp_path / "a.parquet", "parquet"))
    df = random_flat(rng, 300, False)
    if swapped:
        i = int(np.flatnonzero((df["position"] == 1).to_numpy()[:-1] & (df["position"] == 2).to_numpy()[1:])[0])
        df.iloc[[i, i + 1]] = df.iloc[[i + 1, i]].to_numpy()
    res = ingest_file(store, _written(df, tmp_path / "b.parquet", "parquet"))
    assert (res.status, res.positions) == ("stored", len(df)), res.faults
    assert joins == ([True] if swapped else [])
    assert_stored_as_defined(store, df)


def test_steps_whose_join_keys_collide_store_the_same_rows(store, tmp_path, monkeypatch):
    """Rows that are joined with their step (here a file whose rows are shuffled) meet it by a hash of
    (request_id, step); where two steps share a key (here every step of a request, by hashing request_id alone)
    the rows are written again, joined on the pair: the same rows."""
    monkeypatch.setattr(flat, "STEP_KEY", "hash(request_id)")
    joins = _joins_taken(monkeypatch)
    rng = np.random.default_rng(8)
    first = random_flat(rng, 200, False)
    ingest_file(store, _written(first, tmp_path / "a.parquet", "parquet"))
    df = random_flat(rng, 900, False).sample(frac=1, random_state=3).reset_index(drop=True)
    assert df.groupby("request_id")["step"].nunique().max() > 1  # keys do collide
    res = ingest_file(store, _written(df, tmp_path / "b.parquet", "parquet"))
    assert (res.status, res.positions) == ("stored", len(df)), res.faults
    assert_stored_as_defined(store, df)
    assert store.query("SELECT count(*) FROM positions")[0][0] == len(first) + len(df)
    assert joins == [True]


def _written(df: pd.DataFrame, path, fmt: str) -> str:
    write(df, path, fmt)
    return str(path)


def test_beta_sums_are_exact_where_adding_in_order_is_not(store, tmp_path):
    """beta's step sums are the exact sum rounded once: ten accepted positions of 0.1 store 1.0 (adding the doubles
    in order gives 0.9999999999999999), 63 positions of 1.0 store 63.0, and a bound of 0 adds nothing."""
    rows = []
    for step, betas in enumerate([[0.1] * 10, [1.0] * 63, [0.0, 0.5, 2.0**-30, 0.25]]):
        rows += [{"request_id": "r", "step": step, "position": i + 1, "draft_token": 7, "accepted": True,
                  "beta": b} for i, b in enumerate(betas)]
    pd.DataFrame(rows).to_parquet(tmp_path / "edges.parquet")
    assert sum([0.1] * 10) != 1.0
    assert ingest_file(store, str(tmp_path / "edges.parquet")).status == "stored"
    got = store.query("SELECT beta_lo_sum, beta_hi_sum FROM steps ORDER BY step_id")
    assert got == [(1.0, 1.0), (63.0, 63.0), (0.75 + 2.0**-30, 0.75 + 2.0**-30)]


@pytest.mark.parametrize("ranked", [True, False])
def test_templates_compared_by_rank_or_as_text_store_the_same_and_find_two_in_a_step(store, tmp_path, monkeypatch,
                                                                                    ranked):
    """A file of a few templates has each step's least and greatest found by rank in the file's sorted list; one of
    more templates than flat.RANKED_TEMPLATES compares them as text (here: a limit of 1 against the file's 3). Both
    store the definition's steps, and both name the step of two templates."""
    if not ranked:
        monkeypatch.setattr(flat, "RANKED_TEMPLATES", 1)
    rng = np.random.default_rng(8)
    df = random_flat(rng, 400, False)
    res = ingest_file(store, _written(df, tmp_path / "t.parquet", "parquet"))
    assert res.status == "stored", res.faults
    segments = dict(store.query("SELECT template, segment_id FROM segments"))
    want_steps, _ = expected(df, 1, segments, store.query("SELECT ingested_at FROM ingests")[0][0])
    assert store.query(f"SELECT {', '.join(STEP_COLUMNS)} FROM {STEPS} ORDER BY step_id") == want_steps
    named = df["template"].notna()
    first = df.index[named & (df["request_id"] == df.loc[named.idxmax(), "request_id"])
                     & (df["step"] == df.loc[named.idxmax(), "step"])][0]
    other = "zz" if df.loc[first, "template"] != "zz" else "aa"
    two = pd.concat([df, df.loc[[first]].assign(position=df.loc[first, "position"] + 100, template=other)])
    res = ingest_file(store, _written(two, tmp_path / "two.parquet", "parquet"))
    assert res.status == "rejected"
    assert any(f.field == "template" and "names more than one template" in f.reason for f in res.faults), res.faults


def _pieces_taken(monkeypatch) -> list:
    """Record the pieces each flat insert writes positions in (None: the whole file at once)."""
    taken: list = []
    insert = flat.insert

    def spy(cur, **kwargs):
        taken.append(kwargs["pieces"])
        return insert(cur, **kwargs)

    monkeypatch.setattr(flat, "insert", spy)
    return taken


@pytest.mark.parametrize(("shuffled", "zero_based"), [(False, False), (False, True), (True, False)])
def test_a_file_in_pieces_stores_what_it_stores_whole(store, tmp_path, monkeypatch, shuffled, zero_based):
    """A Parquet file of several pieces (here row groups of 997 rows, each a piece: steps straddle them, so cuts move
    to the next step) is aggregated and written piece by piece: the definition's steps, positions and rollups (these
    summed in ranges of 150 steps). Rows in any order: with its rows shuffled, steps lie in several pieces and need
    not be adjacent nor in position order; the whole file is aggregated at once (its row groups read in parallel),
    and stores the same steps and positions, beta's sums to the last bit."""
    monkeypatch.setattr(flat, "PIECE_ROWS", 500)
    monkeypatch.setattr(rollups, "ROLLUP_RANGE_STEPS", 150)
    taken = _pieces_taken(monkeypatch)
    rng = np.random.default_rng(31)
    ingest_file(store, _written(random_flat(rng, 100, zero_based), tmp_path / "a.parquet", "parquet-pieces"))
    df = random_flat(rng, 700, zero_based)
    if shuffled:
        df = df.sample(frac=1, random_state=2).reset_index(drop=True)
    res = ingest_file(store, _written(df, tmp_path / "b.parquet", "parquet-pieces"))
    assert (res.status, res.positions) == ("stored", len(df)), res.faults
    pieces = taken[-1]
    if shuffled:
        assert pieces is None
    else:
        assert len(pieces) >= 3 and pieces[0][0] == 1 and pieces[-1][1] == len(df)
        assert all(a == b + 1 for (_, b), (a, _) in zip(pieces, pieces[1:], strict=False))
        assert any((a - 1) % 997 for a, _ in pieces[1:])  # a cut moved off its row group's end
    assert_stored_as_defined(store, df)


def test_faults_found_in_pieces_are_those_found_whole(tmp_path, monkeypatch):
    """A faulty file gives the same messages, and with --skip-bad the same report and stored rows, in pieces as
    whole: a repeated position or a gap, an accepted position after a rejected one, a beta out of range, two
    templates in one step, a position beyond the others of its step."""
    from specmon.store.database import Store

    rng = np.random.default_rng(44)
    df = random_flat(rng, 600, False)
    df.loc[100, "position"] = df.loc[101, "position"] if df.loc[100, "step"] == df.loc[101, "step"] else 0
    df.loc[500, "beta"] = 1.5
    df.loc[900, "accepted"] = not df.loc[900, "accepted"]
    df.loc[1500, "template"] = "zz"
    df.loc[2000, "position"] = 40
    path = _written(df, tmp_path / "bad.parquet", "parquet-pieces")
    results = {}
    for piece_rows in (10**9, 500):
        monkeypatch.setattr(flat, "PIECE_ROWS", piece_rows)
        with Store(str(tmp_path / f"{piece_rows}.duckdb")) as s:
            rejected = ingest_file(s, path)
            report = tmp_path / f"{piece_rows}.jsonl"
            kept = ingest_file(s, path, skip_bad=True, report_path=str(report))
            stored = (s.query("SELECT * FROM positions ORDER BY ALL"),  # ts aside: the ingest time of each ingest
                      s.query(f"SELECT * EXCLUDE (ingest_id, ts) FROM {STEPS} ORDER BY ALL"))
            results[piece_rows] = (rejected.faults, rejected.fault_count, kept.faults, kept.rejected,
                                   report.read_text(), stored)
    assert results[10**9][0] and results[10**9][3] > 0
    assert results[500] == results[10**9]
