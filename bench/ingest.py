"""Ingest throughput and peak memory, each beside DuckDB's own bare load of the same file, in one run.

    nice python bench/ingest.py [--positions 1000000] [--repeat 3] [--workdir DIR] [--out FILE]
                                [--only flat_parquet ...] [--reuse]

The runs behind docs/benchmarks.md ("Ingest") are in bench/ingest.json, one output per set of runs.

Each load runs in a fresh process, specmon and the bare load alternating, `--repeat` times; the figures are the
median and the range, of wall time and of CPU time (all threads; less moved by other jobs on a shared machine).
Both are timed until the data is in the database file: specmon's ingest until it returns (its store commits and
closes its connections), the bare load through its connection's close (which checkpoints the table).
The JSONL files are also ingested by the step log's Python path alone (the fast path made to hand the file over),
which is what a file with a fault, dense distributions or unknown fields costs.
Files (k = 4, vocabulary 32,000):
1. JSONL with top-20 logprobs per position, the same 20 tokens at every position (what `specmon simulate
   --distributions topk` writes: one fixed pair), against CREATE TABLE AS SELECT * FROM read_json(file).
2. JSONL with top-20 logprobs whose tokens change from position to position, as in real engine logs, against the
   same bare read_json (DuckDB then infers a MAP per position instead of a STRUCT of 20 fixed fields).
3. The flat form as Parquet against CREATE TABLE AS SELECT * FROM read_parquet(file).
4. Peak memory of the JSONL ingest at a quarter of the size, to show it does not grow with the file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from _common import machine, run_child

from specmon.core import sampler

K = 4
VOCAB = 32000
TOPK = 20


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
            p, q, K, positions // K, np.random.default_rng(1), distributions="topk", topk=TOPK), out)


def _varying_topk(rng: np.random.Generator, rows: int) -> list[dict]:
    """rows top-20 logprob objects over random tokens (a new set at every position), each summing below 0.6."""
    tokens = rng.integers(0, VOCAB, (rows, TOPK))
    logprobs = np.minimum(np.sort(rng.normal(-5.0, 1.0, (rows, TOPK)), axis=1)[:, ::-1], -3.5)
    return [dict(zip(map(str, t), lp, strict=True)) for t, lp in zip(tokens.tolist(), logprobs.tolist(), strict=True)]


def write_jsonl_varying(path: str, positions: int) -> None:
    """Top-20 sets that differ per position; the draft's set shares half its tokens with the target's."""
    rng = np.random.default_rng(3)
    with open(path, "wb") as out:
        for i in range(positions // K):
            accepted = int(rng.binomial(K, 0.7))
            draft = rng.integers(0, VOCAB, K).tolist()
            target = _varying_topk(rng, K + 1)
            own = _varying_topk(rng, K)
            draft_lp = [dict(list(t.items())[:10] + list(o.items())[:10])
                        for t, o in zip(target, own, strict=False)]  # the target has one row more
            out.write(orjson.dumps({
                "request_id": f"req-{i // 50}", "ts": 1.7e9 + i * 0.05, "k": K, "template": "real",
                "draft_tokens": draft, "accepted": accepted,
                "emitted_tokens": draft[:accepted] + [int(rng.integers(0, VOCAB))] if accepted < K else draft,
                "target_logprobs": target, "draft_logprobs": draft_lp,
            }, option=orjson.OPT_APPEND_NEWLINE))


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
from specmon.store.database import Store
from specmon.ingest.pipeline import ingest_file
from specmon.ingest.formats import steplog_sql
if {python_path!r}:
    steplog_sql.stage = lambda *args, **kwargs: None  # as if the fast path refused the file: the Python path
s = Store({db!r}); t = time.perf_counter(); c = time.process_time(); r = ingest_file(s, {path!r})
dt, cpu = time.perf_counter() - t, time.process_time() - c
assert r.status == 'stored', r.faults
print(json.dumps({{'seconds': dt, 'cpu_seconds': cpu, 'positions': r.positions}}))
"""
# Timed to the connection's close, as specmon's ingest is (its store closes each connection it opens): closing
# checkpoints the table into the database file, the last step of a load.
BARE = """
import json, time, duckdb
c = duckdb.connect({db!r}); t = time.perf_counter(); cpu = time.process_time()
c.execute("CREATE TABLE t AS SELECT * FROM {reader}(?)", [{path!r}])
c.close()
dt, cpu = time.perf_counter() - t, time.process_time() - cpu
rows = duckdb.connect({db!r}, read_only=True).execute('SELECT count(*) FROM t').fetchone()[0]
print(json.dumps({{'seconds': dt, 'cpu_seconds': cpu, 'rows': rows}}))
"""


def _fresh(path: str) -> str:
    for p in (path, path + ".wal"):
        if os.path.exists(p):
            os.remove(p)
    return path


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _ingest(workdir: str, name: str, path: str, python_path: bool = False) -> dict:
    return run_child(INGEST.format(db=_fresh(os.path.join(workdir, f"{name}.duckdb")), path=path,
                                   python_path=python_path))


def compare(workdir: str, name: str, path: str, reader: str, repeat: int, python_path: bool) -> dict:
    """specmon's ingest and the bare load of one file, alternating, each in a fresh process; with python_path,
    also the step log's Python path alone (what a file the fast path hands over costs)."""
    ours, bare, ratios, python = [], [], [], []
    for _ in range(repeat):
        ing = _ingest(workdir, name, path)
        raw = run_child(BARE.format(db=_fresh(os.path.join(workdir, f"{name}-bare.duckdb")), path=path, reader=reader))
        if python_path:
            python.append(_ingest(workdir, name, path, python_path=True))
        ours.append(ing)
        bare.append(raw)
        ratios.append(ing["seconds"] / raw["seconds"])
    positions = ours[0]["positions"]
    extra = {"python_path_s": _spread([r["seconds"] for r in python]),
             "python_path_positions_per_s": _spread([positions / r["seconds"] for r in python])} if python else {}
    return {
        "file_mb": os.path.getsize(path) / 2**20,
        "specmon_s": _spread([r["seconds"] for r in ours]),
        "positions_per_s": _spread([positions / r["seconds"] for r in ours]),
        "bare_load_s": _spread([r["seconds"] for r in bare]),
        "ratio_to_bare": _spread(ratios),
        # CPU seconds (all threads) of the load itself: what a busy machine changes least
        "specmon_cpu_s": _spread([r["cpu_seconds"] for r in ours]),
        "bare_load_cpu_s": _spread([r["cpu_seconds"] for r in bare]),
        "cpu_ratio_to_bare": _spread([o["cpu_seconds"] / b["cpu_seconds"] for o, b in zip(ours, bare, strict=True)]),
        "specmon_peak_rss_mb": _spread([r["peak_rss_mb"] for r in ours]),
        "bare_peak_rss_mb": _spread([r["peak_rss_mb"] for r in bare]),
        **extra,
    }


COMPARISONS = {  # name -> (file, DuckDB's reader)
    "jsonl_topk20_same_tokens": ("topk.jsonl", "read_json"),
    "jsonl_topk20_varying_tokens": ("topk-varying.jsonl", "read_json"),
    "flat_parquet": ("flat.parquet", "read_parquet"),
}
WRITERS = {"topk.jsonl": write_jsonl, "topk-varying.jsonl": write_jsonl_varying, "flat.parquet": write_parquet}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=None, help="also write the results here (JSON)")
    ap.add_argument("--only", nargs="+", choices=sorted(COMPARISONS), default=sorted(COMPARISONS),
                    help="run only these comparisons (e.g. flat_parquet at 10M, without 10M-position JSON Lines)")
    ap.add_argument("--reuse", action="store_true", help="keep the input files already in --workdir")
    args = ap.parse_args()
    w = args.workdir or tempfile.mkdtemp(prefix="specmon-bench-")
    os.makedirs(w, exist_ok=True)
    results: dict = {"machine": machine(), "positions": args.positions, "repeat": args.repeat,
                     "load_average_at_start": os.getloadavg()[0]}
    for name in (n for n in COMPARISONS if n in args.only):
        file, reader = COMPARISONS[name]
        path = os.path.join(w, file)
        if not (args.reuse and os.path.exists(path)):
            WRITERS[file](path, args.positions)
        results[name] = compare(w, name, path, reader, args.repeat, python_path=reader == "read_json")
    if "jsonl_topk20_same_tokens" in args.only:
        small = os.path.join(w, "topk-small.jsonl")
        if not (args.reuse and os.path.exists(small)):
            write_jsonl(small, args.positions // 4)
        quarter = _ingest(w, "small", small)
        results["jsonl_peak_rss_mb_at_quarter_size"] = quarter["peak_rss_mb"]
    results["load_average_at_end"] = os.getloadavg()[0]
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
