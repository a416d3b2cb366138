"""The flat form (CSV and Parquet): checked and loaded inside DuckDB, faults named by line and field."""
import numpy as np
import pandas as pd
import pytest
from paper import PAPER_P, PAPER_Q

from specmon.analysis.summary import summarize
from specmon.core import sampler
from specmon.ingest.pipeline import ingest_file


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
    ("bad int", set_cell(5, "step", "five"), 7, "step", "expected an integer (decimal digits, with an optional sign), "
                                                        "got five"),
    ("bad bool", set_cell(2, "accepted", "maybe"), 4, "accepted", "expected true or false (or 1 or 0), got maybe"),
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
