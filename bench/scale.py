"""The dashboard and the CLI at 1M, 10M and 100M drafted positions.

    python bench/scale.py [--sizes 1000000 10000000 100000000] [--workdir DIR] [--browser-upto 10000000]

Each database is built by the project's own tools: flat-form Parquet files of at most 10,000,000 positions each
(k = 4, two templates, 50 steps per request, one step every 0.05 s, so a request spans buckets now and then), each
stored by `specmon ingest` in a process of its own, as a team would store a day's logs one file at a time. Then:
the ingest rate and peak RSS per file, `specmon summary --json` cold (a fresh process, timed from outside) and
warm (best of five in one process), each page's queries cold and warm (bench/pages.py), `specmon check`, the
database's size on disk, and the time from `specmon serve` to a rendered Overview in Chromium. Databases are
removed at the end unless --keep.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _common import machine
from pages import first_page_seconds, page_queries

K = 4
FILE_POSITIONS = 10_000_000
STEPS_PER_REQUEST = 50
VOCAB = 32000

SUMMARY_WARM = """
import json, sys, time
from specmon.store import Store
from specmon.summary import summarize
s = Store(sys.argv[1])
out = {}
for by in ("template", "day"):
    runs = []
    for _ in range(5):
        t = time.perf_counter(); summarize(s, by=by); runs.append(time.perf_counter() - t)
    out[by] = min(runs)
print(json.dumps(out))
"""


def write_piece(path: str, first_step: int, steps: int, total_steps: int, seed: int) -> None:
    """Steps first_step .. first_step + steps - 1 of one long run, flattened to positions."""
    rng = np.random.default_rng(seed)
    step = np.arange(first_step, first_step + steps)
    accepted = rng.binomial(K, np.where(step < total_steps // 2, 0.7, 0.62))
    pos_step = np.repeat(step, K)
    position = np.tile(np.arange(1, K + 1), steps)
    table = pa.table({
        "request_id": pa.array(np.char.add("req-", (pos_step // STEPS_PER_REQUEST).astype(str))),
        "ts": pa.array(1.7e9 + pos_step * 0.05),
        "template": pa.array(np.where(pos_step < total_steps // 2, "v1", "v2")),
        "step": pos_step, "position": position,
        "draft_token": rng.integers(0, VOCAB, steps * K),
        "accepted": position <= np.repeat(accepted, K),
        "beta": rng.uniform(0.5, 0.9, steps * K),
    })
    pq.write_table(table, path)


def run_measured(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of a child process (its own rusage, read when it is reaped)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 1):  # check exits 1 on a problem found: an answer, not a failure
            raise RuntimeError(f"{cmd}: exit {proc.returncode}: {err.read()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, out.read()


def specmon(*args: str) -> list[str]:
    return [sys.executable, "-m", "specmon.cli", *args]


def build(db: str, positions: int, work: str) -> list[dict]:
    total_steps = positions // K
    per_file = FILE_POSITIONS // K
    files = []
    for i, first in enumerate(range(0, total_steps, per_file)):
        piece = os.path.join(work, f"piece-{i}.parquet")
        write_piece(piece, first, min(per_file, total_steps - first), total_steps, seed=i)
        wall, rss, _ = run_measured(specmon("ingest", "--db", db, "--run", "prod", piece))
        n = min(per_file, total_steps - first) * K
        files.append({"positions": n, "ingest_s": wall, "positions_per_s": n / wall, "peak_rss_mb": rss})
        os.unlink(piece)
        print(f"  file {i}: {n:,} positions in {wall:.1f} s, peak RSS {rss:.0f} MB", file=sys.stderr, flush=True)
    return files


def measure(db: str, browser: bool, repeats: int) -> dict:
    sizes = [os.path.getsize(p) for p in (db, db + ".wal") if os.path.exists(p)]
    cold, _, out = run_measured(specmon("summary", "--db", db, "--json"))
    printed = subprocess.run([sys.executable, "-c", SUMMARY_WARM, db], check=True, capture_output=True,
                             text=True).stdout
    warm = json.loads(printed[printed.index('{"template"'):])  # DuckDB's progress bar may come first
    check_s, check_rss, _ = run_measured(specmon("check", "--db", db, "--c", "0.2"))
    pages = page_queries(db, repeats)
    result = {
        "disk_mb": sum(sizes) / 2**20,
        "summary_cli_cold_s": cold,
        "summary_warm_s": warm,
        "check_cli_s": check_s,
        "check_peak_rss_mb": check_rss,
        "pages": pages,
        "all_pages_warm_s": sum(p["warm_s"] for p in pages.values()),
        "all_pages_cold_s": sum(p["cold_s"] for p in pages.values()),
        "segments": len(json.loads(out[out.index("["):])),
    }
    if browser:
        result["overview_from_serve_s"] = first_page_seconds(db)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    ap.add_argument("--workdir")
    ap.add_argument("--browser-upto", type=int, default=10_000_000,
                    help="time the Overview in Chromium for databases up to this many positions")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="specmon-scale-")
    os.makedirs(work, exist_ok=True)
    results = {"machine": machine(), "sizes": {}}
    for n in args.sizes:
        db = os.path.join(work, f"scale-{n}.duckdb")
        print(f"{n:,} positions: building {db}", file=sys.stderr, flush=True)
        fresh = not os.path.exists(db)
        files = build(db, n, work) if fresh else None
        results["sizes"][str(n)] = {"ingest": files, **measure(db, n <= args.browser_upto, 5 if n <= 10_000_000 else 2)}
        print(json.dumps({str(n): results["sizes"][str(n)]}), file=sys.stderr, flush=True)
        if not args.keep and fresh:
            for p in (db, db + ".wal"):
                if os.path.exists(p):
                    os.unlink(p)
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
