"""Each dashboard page's queries over a database of 10,000,000 drafted positions, cold and warm, and the time
from `specmon serve` to a rendered first page.

    python bench/pages.py [--db PATH]     # PATH: a database from bench/summary.py; built here when missing

It prints JSON; bench/pages.json holds these figures for bench/scale.py's 10,000,000-position database.

Cold: the first run of a page's queries in a fresh process (DuckDB has read nothing yet). Warm: the best of five
repeats. These are the raw queries; the app caches their results per database generation on top.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import machine

ROOT = Path(__file__).resolve().parent.parent

PAGE_QUERIES = """
import json, sys, time
from specmon.drift import alarms
from specmon.ingest import pipeline
from specmon.analysis import lossless, summary
from specmon.store.database import Store
s = Store(sys.argv[1])
run = summary.run_names(s)[0]
pages = {
    "overview": lambda: summary.summarize(s),
    "acceptance": lambda: (summary.summarize(s), summary.summarize(s, run=run, bucket="day", per_position=False),
                           summary.template_changes(s, run)),
    "economics": lambda: summary.summarize(s),
    "drift": lambda: (summary.run_names(s), summary.summarize(s, run=run, bucket="6 hours", per_position=False),
                      summary.template_changes(s, run), alarms.analyse_run(s, run)),
    "ingest": lambda: pipeline.ingest_history(s),
    "losslessness": lambda: lossless.segments_with_distributions(s),
}
out = {}
for name, fn in pages.items():
    t = time.perf_counter(); fn(); cold = time.perf_counter() - t
    warm = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter(); fn(); warm.append(time.perf_counter() - t)
    out[name] = {"cold_s": cold, "warm_s": min(warm)}
print(json.dumps(out))
"""


def page_queries(db: str, repeats: int = 5) -> dict:
    """Each page's queries in a fresh process: {page: {cold_s, warm_s}}, warm the best of `repeats`."""
    out = subprocess.run([sys.executable, "-c", PAGE_QUERIES, db, str(repeats)], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out[out.index('{"overview"'):])  # DuckDB's progress bar may precede it on long queries


def first_page_seconds(db: str) -> float:
    """Seconds from starting `specmon serve` (this checkout) to the Overview page rendered in chromium."""
    from playwright.sync_api import sync_playwright
    from serve import launch_browser, start_times

    with sync_playwright() as p:
        browser = launch_browser(p)
        try:
            return start_times(str(ROOT), db, browser)[1]
        finally:
            browser.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db")
    args = ap.parse_args()
    db = args.db or os.path.join(tempfile.mkdtemp(prefix="specmon-bench-"), "pages.duckdb")
    if not os.path.exists(db):
        subprocess.run([sys.executable, str(Path(__file__).parent / "summary.py"), "--db", db], check=True,
                       stdout=subprocess.DEVNULL)
    pages = page_queries(db)
    total_warm = sum(p["warm_s"] for p in pages.values())
    total_cold = sum(p["cold_s"] for p in pages.values())
    print(json.dumps({"machine": machine(), "pages": pages, "all_pages_warm_s": total_warm,
                      "all_pages_cold_s": total_cold, "first_page_s": first_page_seconds(db)}, indent=2))


if __name__ == "__main__":
    main()
