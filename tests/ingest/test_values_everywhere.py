"""Integers and booleans mean the same in every format (specmon.core.scalars): a value the JSON step log refuses is
refused by the flat form's CSV and Parquet too, with its file, line and field; lines named are the lines an editor
shows; an integer too long for 64 bits is kept exactly."""
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specmon.ingest.pipeline import ingest_file

HEADER = "request_id,step,position,draft_token,accepted"


def stored(store) -> tuple:
    return store.query("SELECT (SELECT count(*) FROM ingests), (SELECT count(*) FROM steps)")[0]


@pytest.mark.parametrize("column,value", [
    ("draft_token", "12.7"), ("draft_token", "12.0"), ("draft_token", "0x10"), ("draft_token", "1e2"),
    ("draft_token", "1_000"), ("step", "1.5"), ("position", "1.0"), ("accepted", "2"), ("accepted", "yes"),
])
def test_a_csv_cell_that_is_no_integer_or_boolean_is_a_fault(store, tmp_path, column, value):
    row = {"request_id": "r", "step": "1", "position": "1", "draft_token": "5", "accepted": "true", column: value}
    path = tmp_path / "cells.csv"
    path.write_text(f"{HEADER}\nr,0,1,4,false\n{','.join(row[c] for c in HEADER.split(','))}\n")
    res = ingest_file(store, str(path))
    assert res.status == "rejected"
    assert [(f.file, f.line, f.field) for f in res.faults] == [(str(path), 3, column)]
    assert value in res.faults[0].reason
    assert stored(store) == (0, 0)


def parquet(path, **columns) -> str:
    table = {"request_id": pa.array(["r", "r"]), "step": pa.array([0, 1]), "position": pa.array([1, 1]),
             "draft_token": pa.array([4, 5]), "accepted": pa.array([False, True])}
    pq.write_table(pa.table({**table, **columns}), path)
    return str(path)


@pytest.mark.parametrize("column,values,lines", [
    ("draft_token", pa.array([4.0, 12.0]), [1, 2]),  # a DOUBLE column, integral or not: its values read 4.0, 12.0
    ("draft_token", pa.array([4.0, 12.7]), [1, 2]),
    ("step", pa.array([0.0, 1.5]), [1, 2]),
    ("accepted", pa.array([0, 2], pa.int64()), [2]),
    ("draft_token", pa.array(["4", "1_000"]), [2]),
])
def test_a_parquet_column_of_another_type_is_read_by_the_same_rule(store, tmp_path, column, values, lines):
    res = ingest_file(store, parquet(tmp_path / "typed.parquet", **{column: values}))
    assert res.status == "rejected"
    assert [(f.line, f.field) for f in res.faults] == [(line, column) for line in lines]
    assert stored(store) == (0, 0)


@pytest.mark.parametrize("columns", [
    {"accepted": pa.array([0, 1], pa.int8())}, {"accepted": pa.array(["false", "TRUE"])},
    {"draft_token": pa.array(["4", "+5"])}, {"draft_token": pa.array([4, 5], pa.uint64())},
    {"step": pa.array([0, 1], pa.decimal128(9, 0))},
])
def test_what_the_rule_calls_an_integer_or_a_boolean_is_stored_whatever_the_column_type(store, tmp_path, columns):
    res = ingest_file(store, parquet(tmp_path / "typed.parquet", **columns))
    assert (res.status, res.steps) == ("stored", 2)
    assert store.query("SELECT sum(accepted), sum(draft_token) FROM positions")[0] == (1, 9)


def test_json_csv_and_parquet_agree_on_an_integral_float(store, tmp_path):
    jsonl = tmp_path / "f.jsonl"
    jsonl.write_bytes(orjson.dumps({"request_id": "r", "draft_tokens": [4.0], "accepted": 0}) + b"\n")
    csv = tmp_path / "f.csv"
    csv.write_text(f"{HEADER}\nr,0,1,4.0,false\n")
    pq_path = parquet(tmp_path / "f.parquet", draft_token=pa.array([4.0, 5.0]))
    for path in (str(jsonl), str(csv), pq_path):
        res = ingest_file(store, path)
        assert res.status == "rejected" and res.faults[0].field in ("draft_tokens", "draft_token"), path


def test_a_csv_fault_names_the_line_where_its_row_starts_after_multi_line_fields(store, tmp_path):
    """Rows whose quoted request ids hold line breaks, and blank lines, come before the faulty rows: the lines named
    are those an editor shows, for a row DuckDB rejects (too many cells) and for a bad value alike."""
    text = (f"{HEADER}\n"
            '"req\nuest\n-1",0,1,5,true\n'   # lines 2-4
            "\n"                               # line 5
            "r,1,1,5,true,extra\n"             # line 6: unreadable
            '"a\nb",2,1,5,true\n'             # lines 7-8
            "r,3,1,5,maybe\n")                 # line 9: bad boolean
    path = tmp_path / "multi.csv"
    path.write_text(text)
    res = ingest_file(store, str(path))
    assert res.status == "rejected"
    assert sorted((f.line, f.field) for f in res.faults) == [(6, ""), (9, "accepted")]
    lines = text.splitlines()
    assert lines[6 - 1].endswith("extra") and lines[9 - 1].endswith("maybe")
    report = tmp_path / "multi.rejected.jsonl"
    res = ingest_file(store, str(path), skip_bad=True, report_path=str(report))
    assert (res.status, res.steps) == ("stored", 2)
    assert sorted(orjson.loads(line)["line"] for line in report.read_text().splitlines()) == [6, 9]


def test_a_thirty_digit_integer_in_an_unknown_field_is_kept_exactly(store, tmp_path):
    big = "123456789012345678901234567890"
    path = tmp_path / "big.jsonl"
    path.write_text('{"request_id": "r", "draft_tokens": [1, 2], "accepted": 1, "trace": ' + big + "}\n")
    assert ingest_file(store, str(path)).status == "stored"
    (extra,) = store.query("SELECT extra::VARCHAR FROM step_details")[0]
    assert extra == '{"trace":' + big + "}"
    assert store.query("SELECT (extra->>'$.trace')::HUGEINT::VARCHAR FROM step_details")[0][0] == big


def test_a_long_integer_where_a_count_belongs_is_a_fault_not_a_float(store, tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text('{"request_id": "r", "draft_tokens": [1, 2], "accepted": 100000000000000000000000000001}\n')
    res = ingest_file(store, str(path))
    assert res.status == "rejected"
    assert res.faults[0].field == "accepted" and "100000000000000000000000000001 is outside" in res.faults[0].reason


def test_the_load_sweep_reads_k_by_the_same_rule(store, tmp_path):
    path = tmp_path / "sweep.jsonl"
    path.write_bytes(orjson.dumps({"run": "a", "k": 4.0, "concurrency": 8, "output_tokens_per_s": 120.0}) + b"\n")
    res = ingest_file(store, str(path))
    assert res.status == "rejected" and res.faults[0].field == "k" and "4.0" in res.faults[0].reason
    path.write_bytes(orjson.dumps({"run": "a", "k": 4, "concurrency": 8, "output_tokens_per_s": 120.0}) + b"\n")
    assert ingest_file(store, str(path)).status == "stored"
