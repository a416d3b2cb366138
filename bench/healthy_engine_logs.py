"""`specmon check` on healthy engine logs, as a cron job runs it: how often a log in which nothing changed fails.

    nice python bench/healthy_engine_logs.py [--logs 9] [--hours 3] [--c none 0.1 0.35] [--out FILE]

Each log is --hours of 10-second vLLM V1 lines (tests/engine_streams.vllm_window_lines, the engine's own format)
over overlapping requests at a constant mix (traffic_daily.engine_windows: chat and code requests half and half,
acceptance from each type's beta, lognormal durations of median 40 s), seeds 0, 1, ..., stored by `specmon ingest`
into a fresh DuckDB file and checked by `specmon check` once per --c (`none`: no --c, so break-even is unknown and
the drift detector watches for a drop of 0.10 from the reference). Prints, and writes as JSON, each check's exit
code (0 healthy, 1 a problem, 2 c unknown), whether it raised DRIFT, and the first line it printed (where it printed
none, its last line on stderr: why it cannot judge).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

import numpy as np
import production_study as ps
import traffic_daily as td
from _common import machine

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from engine_streams import vllm_window_lines  # noqa: E402 (the tests' writer of vLLM lines)


def write_log(path: str, seed: int, hours: float) -> int:
    w = td.engine_windows(np.random.default_rng(seed), 0.2, hours, share=ps._flat)
    with open(path, "w") as fh:
        fh.write(vllm_window_lines(datetime(2026, 3, 2), w.end_us, w.drafts, w.accepted_per_position, td.WINDOW_S))
    return len(w.drafts)


def specmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specmon", *args], capture_output=True, text=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", type=int, default=9)
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--c", nargs="+", default=["none", "0.1", "0.35"])
    ap.add_argument("--out")
    args = ap.parse_args()
    checks = []
    with tempfile.TemporaryDirectory() as work:
        for seed in range(args.logs):
            log, db = os.path.join(work, f"vllm-{seed}.log"), os.path.join(work, f"{seed}.duckdb")
            windows = write_log(log, seed, args.hours)
            specmon("ingest", log, "--db", db, "--run", "prod").check_returncode()
            for c in args.c:
                done = specmon("check", "--db", db, *([] if c == "none" else ["--c", c]))
                first = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines()[-1:] or [""])[0]
                checks.append({"seed": seed, "windows": windows, "c": c, "exit": done.returncode,
                               "drift": "DRIFT" in done.stdout, "first_line": first})
                print(f"seed {seed} c {c}: exit {done.returncode}: {first[:150]}", flush=True)
    failed = {c: sum(x["exit"] == 1 for x in checks if x["c"] == c) for c in args.c}
    drift = {c: sum(x["drift"] for x in checks if x["c"] == c) for c in args.c}
    print("checks that found a problem (exit 1), by c:", failed, "; with DRIFT:", drift)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": machine(), "logs": args.logs, "hours": args.hours, "failed": failed,
                       "drift": drift, "checks": checks}, fh, indent=1)


if __name__ == "__main__":
    main()
