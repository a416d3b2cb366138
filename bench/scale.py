"""The dashboard and the CLI at 1M, 10M and 100M drafted positions.

    python bench/scale.py [--sizes 1000000 10000000 100000000] [--workdir DIR] [--browser-upto 10000000]
    python bench/scale.py --table bench/scale.json   # the docs' table, printed from a run's results

The run prints its results as JSON; docs/benchmarks.md's ("Scale") is bench/scale.json.

Each database is built by the project's own tools: flat-form Parquet files of at most 10,000,000 positions each
(k = 4, two templates, 50 steps per request, one step every 0.05 s, so a request spans buckets now and then), each
stored by `specmon ingest` in a process of its own, as a team would store a day's logs one file at a time. Then:
the ingest rate and peak RSS per file, `specmon summary --json` cold (a fresh process, timed from outside) and
warm (best of five in one process), `specmon check` (the first builds the drift state), each page's queries cold
and warm (bench/pages.py), the database's size on disk, and the time from `specmon serve` to a rendered Overview
in Chromium. Databases are removed at the end unless --keep.
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

import duckdb
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
from specmon.store.database import Store
from specmon.analysis.summary import summarize
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
    """(wall seconds, peak RSS in MB, stdout) of a child process. The peak is measured by /usr/bin/time, a small
    process between this one and the child: a child this (large) process started itself would report this
    process's peak as well, which Linux carries over through vfork and exec."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        t = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", peak.name, *cmd], stdout=out, stderr=err,
                              text=True)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 1):  # check exits 1 on a problem found: an answer, not a failure
            raise RuntimeError(f"{cmd}: exit {proc.returncode}: {err.read()[-2000:]}")
        return wall, int(peak.read().split()[-1]) / 1024, out.read()


def specmon(*args: str) -> list[str]:
    return [sys.executable, "-m", "specmon", *args]


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
    # the first drift analysis after a bulk load builds the run's detector state (docs/drift.md); `check` with the
    # page's design (no --c) pays it here, `check --c 0.2` once more for its own design; the pages read it after.
    # A database measured before (found in --workdir) keeps its states and thresholds: they go, so that the first
    # check is a first again.
    with duckdb.connect(db) as conn:
        conn.execute("DELETE FROM drift_states; DELETE FROM drift_calibrations")
    first_s, first_rss, _ = run_measured(specmon("check", "--db", db))
    check_s, check_rss, _ = run_measured(specmon("check", "--db", db, "--c", "0.2"))
    again_s, _, _ = run_measured(specmon("check", "--db", db, "--c", "0.2"))
    pages = page_queries(db, repeats)
    result = {
        "disk_mb": sum(sizes) / 2**20,
        "summary_cli_cold_s": cold,
        "summary_warm_s": warm,
        "first_check_cli_s": first_s,
        "first_check_peak_rss_mb": first_rss,
        "check_cli_s": check_s,
        "check_peak_rss_mb": check_rss,
        "check_again_cli_s": again_s,
        "pages": pages,
        "all_pages_warm_s": sum(p["warm_s"] for p in pages.values()),
        "all_pages_cold_s": sum(p["cold_s"] for p in pages.values()),
        "segments": len(json.loads(out[out.index("["):])),
    }
    if browser:  # three starts: the first may also read the database file from disk
        result["overview_from_serve_s"] = [first_page_seconds(db) for _ in range(3)]
    result["load_average"] = os.getloadavg()[0]
    return result


def _seconds(v: float) -> str:
    return f"{v:.3f} s" if v < 0.1 else f"{v:.2f} s"


def table(results: dict) -> str:
    """The Markdown table of docs/benchmarks.md ("Scale"), every figure from a run's printed JSON."""
    sizes = results["sizes"]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, cell) -> None:
        rows.append((label, [cell(sizes[n]) for n in sizes]))

    def ingest(r: dict) -> str:
        files = r["ingest"] or []
        if not files:
            return "(built earlier)"
        rates = [f["positions_per_s"] for f in files]
        rss = max(f["peak_rss_mb"] for f in files)
        rate = f"{rates[0]:,.0f}" if len(rates) == 1 else f"{min(rates):,.0f}-{max(rates):,.0f} over {len(rates)} files"
        return f"{rate} ({rss:,.0f} MB)"

    row("ingest, positions/s per file (peak RSS)", ingest)
    row("database on disk", lambda r: f"{r['disk_mb']:,.0f} MB")
    row("`specmon summary --json`, fresh process", lambda r: _seconds(r["summary_cli_cold_s"]))
    row("`summarize` warm, by template / by day",
        lambda r: f"{_seconds(r['summary_warm_s']['template'])} / {_seconds(r['summary_warm_s']['day'])}")
    for page in next(iter(sizes.values()))["pages"]:
        row(f"{page.capitalize()} warm / cold",
            lambda r, page=page: f"{_seconds(r['pages'][page]['warm_s'])} / {_seconds(r['pages'][page]['cold_s'])}")
    row("`specmon check`, first after the load: builds the drift state (peak RSS)",
        lambda r: f"{_seconds(r['first_check_cli_s'])} ({r['first_check_peak_rss_mb']:,.0f} MB)"
        if "first_check_cli_s" in r else "not measured")
    row("`specmon check --c 0.2`, fresh process, first with that c / again (peak RSS)",
        lambda r: f"{_seconds(r['check_cli_s'])} / {_seconds(r.get('check_again_cli_s', float('nan')))} "
                  f"({r['check_peak_rss_mb']:,.0f} MB)")
    row("`specmon serve` to a rendered Overview in Chromium (three starts)",
        lambda r: ", ".join(_seconds(v) for v in np.atleast_1d(r.get("overview_from_serve_s", []))) or "-")
    row("load average (1 min) after the measurements", lambda r: f"{r['load_average']:.1f}" if "load_average" in r
        else "not recorded")
    head = "| | " + " | ".join(f"{int(n):,}" for n in sizes) + " |"
    lines = [head, "|---" * (len(sizes) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    ap.add_argument("--workdir")
    ap.add_argument("--browser-upto", type=int, default=10_000_000,
                    help="time the Overview in Chromium for databases up to this many positions")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    ap.add_argument("--table", metavar="RESULTS", help="print the docs' table from a run's JSON output and stop")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as fh:
            print(table(json.load(fh)))
        return
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
