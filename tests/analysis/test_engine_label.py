"""A window's engine is its labels' `engine` entry, the same in DuckDB over stored JSON, over text, and in pandas."""
import duckdb
import pandas as pd

from specmon.analysis import engine_label

LABELS = [
    '{"accepted throughput": "16.40 tokens/s", "engine": "001"}',  # a data-parallel vLLM line
    '{"accepted throughput": "44.00 tokens/s", "engine": "001"}',
    '{"engine": "0", "model_name": "Qwen/Qwen3-0.6B"}',  # a Prometheus series
    '{"engine": 3}',
    '{"model_name": "Qwen/Qwen3-0.6B"}',
    "{}",
    "not json",
    None,
]
WANT = ["001", "001", "0", "3", "", "", "", ""]


def test_the_sql_and_the_pandas_rule_agree():
    assert list(engine_label.of_labels(pd.Series(LABELS, dtype=object))) == WANT
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER, text VARCHAR, stored JSON)")
    for i, text in enumerate(LABELS):
        con.execute("INSERT INTO t VALUES (?, ?, ?)", [i, text, text if i < 6 else None])
    text = con.execute(f"SELECT {engine_label.text_sql('text')} FROM t ORDER BY i").fetchall()
    stored = con.execute(f"SELECT {engine_label.stored_sql('stored')} FROM t ORDER BY i").fetchall()
    assert [r[0] for r in text] == WANT
    assert [r[0] for r in stored] == WANT
