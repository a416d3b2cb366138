"""Ingest throughput and peak memory, each beside DuckDB's own bare load of the same file, in one run.

    python bench/ingest.py [--positions 1000000] [--workdir DIR]

1. JSONL step log with top-20 logprobs per position (vocabulary 32,000, k = 4) against
   CREATE TABLE AS SELECT * FROM read_json(file).
2. The flat form as Parquet against CREATE TABLE AS SELECT * FROM read_parquet(file).
3. Peak memory of the JSONL ingest at two file sizes, to show it does not grow with the file.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _common import machine, run_child
from specmon import sampler

K = 4
VOCAB = 32000


def pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, VOCAB)
    p = np.exp(logits - logits.max())
    q = np.exp(logits + rng.normal(0, 1, VOCAB) - logits.max())
    return p / p.sum(), q / q.sum()


def write_jsonl(path: str, positions: int) -> None:
    p, q = pair()
    with open(path, "wb") as out:
        sampler.write_step_log(sampler.simulate_fixed_pair(
            p, q, K, positions // K, np.random.default_rng(1), distributions="topk", topk=20), out)


def write_parquet(path: str, positions: int) -> None:
    rng = np.random.default_rng(2)
    steps = positions // K
    accepted = rng.binomial(K, 0.7, steps)
    step = np.repeat(np.arange(steps), K)
    position = np.tile(np.arange(1, K + 1), steps)
    table = pa.table({
        "request_id": pa.array(np.char.add("req-", (step // 50).astype(str))),
        "ts": pa.array(1.7e9 + step * 0.05),
        "template": pa.array(np.where(step < steps // 2, "v1", "v2")),
        "step": step, "position": position,
        "draft_token": rng.integers(0, VOCAB, positions),
        "accepted": position <= np.repeat(accepted, K),
        "beta": rng.uniform(0.5, 0.9, positions),
    })
    pq.write_table(table, path)


INGEST = """
import json, time
from specmon.store import Store
from specmon.ingest import ingest_file
s = Store({db!r}); t = time.perf_counter(); r = ingest_file(s, {path!r}); dt = time.perf_counter() - t
assert r.status == 'stored', r.faults
print(json.dumps({{'seconds': dt, 'positions': r.positions}}))
"""
BARE = """
import json, time, duckdb
c = duckdb.connect({db!r}); t = time.perf_counter()
c.execute("CREATE TABLE t AS SELECT * FROM {reader}(?)", [{path!r}]); dt = time.perf_counter() - t
print(json.dumps({{'seconds': dt, 'rows': c.execute('SELECT count(*) FROM t').fetchone()[0]}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=1_000_000)
    ap.add_argument("--workdir", default=tempfile.mkdtemp(prefix="specmon-bench-"))
    args = ap.parse_args()
    w = args.workdir
    jsonl, small, parquet = (os.path.join(w, n) for n in ("topk.jsonl", "topk-small.jsonl", "flat.parquet"))
    write_jsonl(jsonl, args.positions)
    write_jsonl(small, args.positions // 4)
    write_parquet(parquet, args.positions)
    results = {"machine": machine(), "positions": args.positions,
               "jsonl_mb": os.path.getsize(jsonl) / 2**20, "parquet_mb": os.path.getsize(parquet) / 2**20}
    for name, path, reader in (("jsonl_topk20", jsonl, "read_json"), ("flat_parquet", parquet, "read_parquet")):
        ing = run_child(INGEST.format(db=os.path.join(w, f"{name}.duckdb"), path=path))
        bare = run_child(BARE.format(db=os.path.join(w, f"{name}-bare.duckdb"), path=path, reader=reader))
        results[name] = {"specmon_s": ing["seconds"], "positions_per_s": ing["positions"] / ing["seconds"],
                         "bare_load_s": bare["seconds"], "ratio_to_bare": ing["seconds"] / bare["seconds"],
                         "specmon_peak_rss_mb": ing["peak_rss_mb"], "bare_peak_rss_mb": bare["peak_rss_mb"]}
    quarter = run_child(INGEST.format(db=os.path.join(w, "small.duckdb"), path=small))
    results["jsonl_peak_rss_mb_at_quarter_size"] = quarter["peak_rss_mb"]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
