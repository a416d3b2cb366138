"""The summary query over 10,000,000 drafted positions, cold (first query after opening) and warm.

    python bench/summary.py [--positions 10000000] [--db PATH]

It prints JSON; bench/summary.json holds the summary's figures for bench/scale.py's 10,000,000-position database.

The database is built with the flat-form ingest from bench/ingest.py's Parquet generator (k = 4, two templates,
50 steps per request), then summarised by template and by day.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from _common import machine
from ingest import write_parquet

from specmon.analysis.summary import summarize
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=10_000_000)
    ap.add_argument("--db")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="specmon-bench-")
    db = args.db or os.path.join(work, "summary.duckdb")
    if not os.path.exists(db):
        parquet = os.path.join(work, "flat.parquet")
        write_parquet(parquet, args.positions)
        with Store(db) as s:
            t = time.perf_counter()
            ingest_file(s, parquet)
            build = time.perf_counter() - t
    else:
        build = None
    with Store(db) as s:
        t = time.perf_counter()
        summarize(s)
        cold = time.perf_counter() - t
        warm = {}
        for by in ("template", "day"):
            runs = []
            for _ in range(5):
                t = time.perf_counter()
                rows = summarize(s, by=by)
                runs.append(time.perf_counter() - t)
            warm[by] = {"best_s": min(runs), "median_s": sorted(runs)[2], "segments": len(rows)}
        positions = s.query("SELECT count(*) FROM position_rows")[0][0]
    print(json.dumps({"machine": machine(), "positions": positions, "ingest_s": build, "cold_s": cold,
                      "warm": warm}, indent=2))


if __name__ == "__main__":
    main()
