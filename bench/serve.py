"""`specmon serve` to a drawn Overview in Chromium, for one checkout or several side by side.

    python bench/serve.py --starts 6 CHECKOUT=DB [CHECKOUT=DB ...] [--out bench/serve.json]

Each start is a fresh server (`python -m specmon.cli.main serve`, the checkout first on the path) and a fresh browser;
the checkouts take turns, in reverse order every other round, so that a machine getting busier or quieter weighs
on each alike. Two times per start, from launching the server: until its health endpoint answers, and until the
Overview's first metric is drawn (bench/pages.py's first_page_seconds is the latter, for this checkout). Each
checkout gets its own
database, so a checkout at an older schema can be timed on a copy it has not migrated.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from _common import machine, wait_healthy


def launch_browser(playwright):
    """Debian's chromium, headless, as every start here meets it."""
    return playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                      args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])


def start_times(checkout: str, db: str, browser) -> tuple[float, float]:
    """Seconds to a healthy server and to the Overview's first metric, for one start."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    page = browser.new_page()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "specmon", "serve", "--db", db, "--port", str(port)],
                            cwd=checkout, env=dict(os.environ, PYTHONPATH=checkout),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        healthy = time.perf_counter() - t0
        page.goto(f"http://127.0.0.1:{port}/")
        page.locator('[data-testid="stMetricValue"]').first.wait_for(timeout=120_000)
        return healthy, time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait()
        page.close()


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser()
    ap.add_argument("pairs", nargs="+", metavar="CHECKOUT=DB")
    ap.add_argument("--starts", type=int, default=6)
    ap.add_argument("--out")
    args = ap.parse_args()
    pairs = [tuple(p.split("=", 1)) for p in args.pairs]
    times: dict[str, list] = {checkout: [] for checkout, _ in pairs}
    with sync_playwright() as p:
        for i in range(args.starts):
            for checkout, db in (pairs if i % 2 == 0 else pairs[::-1]):
                browser = launch_browser(p)
                try:
                    times[checkout].append(start_times(checkout, db, browser))
                finally:
                    browser.close()
    result = {"machine": machine(), "load_average_after": os.getloadavg(), "dbs": dict(pairs), "checkouts": {
        c: {"healthy_s": [round(h, 3) for h, _ in t], "overview_s": [round(m, 3) for _, m in t],
            "overview_median_s": round(statistics.median(m for _, m in t), 3)} for c, t in times.items()}}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
