"""The Load page's queries and the Overview's summary over a database of 1,000,000 engine windows beside 10,000,000
drafted positions, cold and warm, the engine segments by hour and the Drift page's 6-hour timeline, and `specmon
summary` and `specmon recommend` over it end to end.

    python bench/load_page.py [--windows 1000000] [--positions 10000000] [--db PATH]

It prints JSON; bench/load_page.json holds the figures. The positions come from bench/ingest.py's Parquet generator
through the flat-form ingest; the windows are written straight into engine_windows (a vLLM V1 engine at 10-second
intervals, its load stepping through 1 to 64 running requests, half of them in periods annotated as speculation off),
since what is measured is reading them, not ingesting them. Cold: the first run in a fresh process; warm: the best of
five repeats. The page caches its results per database generation on top of these.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from _common import machine
from ingest import write_parquet

from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store
from specmon.store.rows import add_ingest, get_or_create_run, get_or_create_segment

# A day is 8,640 windows of 10 s; the load moves through the levels every 20 windows, speculation off every other hour.
_WINDOWS_SQL = """
INSERT INTO engine_windows (ingest_id, segment_id, engine, source, line, start_ts, end_ts, ts_inferred, drafts,
    draft_tokens, accepted_tokens, accepted_per_position, k, mean_acceptance_length, reported_rate, labels,
    running_requests, waiting_requests, generation_throughput, prompt_throughput)
SELECT ?, ?, 'vllm', 'vllm-v1-log', i, ts - INTERVAL 10 SECOND, ts, false,
       CASE WHEN spec THEN 40.0 * n END, CASE WHEN spec THEN 120.0 * n END, CASE WHEN spec THEN 90.0 * n END,
       CASE WHEN spec THEN [34.0 * n, 30.0 * n, 26.0 * n] END, CASE WHEN spec THEN 3 END,
       CASE WHEN spec THEN 3.25 END, NULL, '{"engine": "0"}', n, 0.0,
       (CASE WHEN spec THEN 1.4 * pow(n, -0.15) ELSE 1.0 END) * 100 * pow(n, 0.8) * (0.97 + 0.06 * random()), 0.0
FROM (SELECT i, TIMESTAMP '2026-11-01' + i * INTERVAL 10 SECOND AS ts, [1, 2, 4, 8, 16, 32, 64][1 + (i // 20) % 7] AS n,
             (i // 360) % 2 = 0 AS spec FROM range(?) t(i))
"""
_PERIODS_SQL = """
INSERT INTO speculation_periods (run_id, starts_at, speculation, note, created_at)
SELECT ?, TIMESTAMP '2026-11-01' + h * INTERVAL 1 HOUR, h % 2 = 0, NULL, now()::TIMESTAMP
FROM range(?) t(h)
"""

QUERIES = """
import json, sys, time
from specmon.analysis import engine_segments, load, summary
from specmon.verdicts import findings
from specmon.verdicts.recommend import recommend
from specmon.store.database import Store
s = Store(sys.argv[1])
def page():
    curves = load.curves(s)
    return curves, [recommend(c) for c in curves], findings.load_findings(curves)
out = {}
timeline = lambda: summary.summarize(s, run="prod", bucket="6 hours", per_position=False)  # as the Drift page asks
for name, fn in {"load page": page, "overview's summary": lambda: summary.summarize(s),
                 "engine segments by hour": lambda: engine_segments.summarize_engines(s, bucket="hour"),
                 "drift page's 6-hour timeline": timeline}.items():
    t = time.perf_counter(); fn(); cold = time.perf_counter() - t
    warm = []
    for _ in range(5):
        t = time.perf_counter(); fn(); warm.append(time.perf_counter() - t)
    out[name] = {"cold_s": cold, "warm_s": min(warm)}
print(json.dumps(out))
"""


def build(db: str, windows: int, positions: int, work: str) -> dict:
    timings = {}
    parquet = os.path.join(work, "flat.parquet")
    t = time.perf_counter()
    write_parquet(parquet, positions)
    with Store(db) as s:
        ingest_file(s, parquet, run="steps")
        timings["positions_ingest_s"] = time.perf_counter() - t
        t = time.perf_counter()
        with s.transaction() as cur:
            run_id = get_or_create_run(cur, "prod", "engine", False, None)
            segment = get_or_create_segment(cur, run_id, "")
            ingest = add_ingest(cur, file_name="windows", sha256="bench-windows", ingested_at="2026-12-01",
                                source_format="engine-log", run_id=run_id, steps=windows)
            cur.execute(_WINDOWS_SQL, [ingest, segment, windows])
            cur.execute(_PERIODS_SQL, [run_id, windows // 360 + 1])
        timings["windows_write_s"] = time.perf_counter() - t
    return timings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=1_000_000)
    ap.add_argument("--positions", type=int, default=10_000_000)
    ap.add_argument("--db")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="specmon-bench-")
    db = args.db or os.path.join(work, "load.duckdb")
    built = build(db, args.windows, args.positions, work) if not os.path.exists(db) else {}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specmon", "summary", "--db", db, "--no-demo"], check=True,
                   capture_output=True)
    summary_s = time.perf_counter() - t
    summary_peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the only child so far
    out = subprocess.run([sys.executable, "-c", QUERIES, db], check=True, capture_output=True, text=True).stdout
    t = time.perf_counter()
    rec = subprocess.run([sys.executable, "-m", "specmon", "recommend", "--db", db, "--json"], check=True,
                         capture_output=True, text=True)
    recommend_s = time.perf_counter() - t
    [curve] = [c for c in json.loads(rec.stdout) if c["run"] == "prod"]
    print(json.dumps({"machine": machine(), "windows": args.windows, "positions": args.positions, "build": built,
                      "queries": json.loads(out), "summary_cli_s": summary_s, "summary_cli_peak_mb": summary_peak_mb,
                      "recommend_cli_s": recommend_s,
                      "points": len(curve["points"]), "policy": curve["policy"]}, indent=2))


if __name__ == "__main__":
    main()
