"""`specmon check` over hundreds of runs: the first check, a second one (thresholds and drift states kept), and the
longest a second process waits to write while each runs:

    nice python bench/check_many_runs.py [--runs 300] [--engine-runs 20] [--steps 3000] [--old PATH]

The database: --runs step-log runs of 0.8-1.5 x --steps steps each (those past 4,000 also calibrate at their
first checkpoint), requests of lognormal length (mean 20 steps) each with its own acceptance (correlation 0.2,
k = 4; one in ten runs drops to a lower acceptance at two thirds), and --engine-runs vLLM engine logs of 400
windows. It is built twice from the same files: by `specmon ingest --no-drift` (every reference is then calibrated
by the first check) and by plain `specmon ingest`, which brings each run's drift detector up to date as it stores
the run (the first check then finds every threshold kept); both builds are timed, each file through the CLI's own
code in this process. Each database is copied for every checkout timed, so they check the same bytes. A second
process meanwhile ingests a one-step log every 0.5 s into the first run, after its steps (a real ingest_file in
another Python, waiting for the lock as a user's would, like a watcher following that run): its longest ingest is
the longest time check kept writers out, plus the ingest's own time.

--old PATH also times another checkout (its specmon package on PYTHONPATH) on a copy of the database built with
--no-drift, side by side; the JSON is printed and written beside this script.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta

import numpy as np
from _common import machine

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
T0 = datetime(2026, 3, 1, 0, 0, 0)

VLLM_V1 = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, Drafted "
           "throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: %s, "
           "Avg Draft acceptance rate: %.1f%%")


def step_log(rng: np.random.Generator, steps: int, start: datetime, drop: bool) -> str:
    """A step log of about `steps` steps, requests laid end to end a second apart per step."""
    out, t, r = [], start, 0
    mu = math.log(20) - 1.2 ** 2 / 2
    while len(out) < steps:
        level = 0.45 if drop and len(out) > 2 * steps // 3 else 0.78
        rate = float(np.clip(rng.beta(level * 4, (1 - level) * 4), 0.02, 0.98))
        for _ in range(max(1, round(rng.lognormal(mu, 1.2)))):
            t += timedelta(seconds=1)
            accepted = 0
            while accepted < 4 and rng.random() < rate:
                accepted += 1
            out.append(json.dumps({"request_id": f"q{r}", "ts": t.isoformat() + "Z", "k": 4,
                                   "draft_tokens": [1, 2, 3, 4], "accepted": accepted}))
        r += 1
    return "\n".join(out) + "\n"


def engine_log(rng: np.random.Generator, windows: int, minute0: int) -> str:
    lines = []
    for i in range(windows):
        r = rng.beta(0.8 * 40, 0.2 * 40)
        drafts = int(rng.integers(40, 120))
        alive = np.ones(drafts, dtype=bool)
        per_pos = []
        for _ in range(3):
            alive &= rng.random(drafts) < r
            per_pos.append(int(alive.sum()))
        acc = sum(per_pos)
        ts = (datetime(2026, 11, 29, 8) + timedelta(minutes=minute0, seconds=5 * i)).strftime("%m-%d %H:%M:%S")
        lines.append(f"(APIServer pid=4242) INFO {ts} [metrics.py:86] " + VLLM_V1 % (
            1 + acc / drafts, acc / 5, drafts * 3 / 5, acc, drafts * 3, ", ".join(f"{a / drafts:.3f}" for a in per_pos),
            100 * acc / (drafts * 3)))
    return "\n".join(lines) + "\n"


def write_logs(folder: str, runs: int, engine_runs: int, steps: int) -> list[tuple[str, str]]:
    """The files of the database, (path, run) in ingest order."""
    rng = np.random.default_rng(20260301)
    files = []
    for i in range(runs):
        path = os.path.join(folder, f"run{i:03d}.jsonl")
        with open(path, "w") as fh:
            fh.write(step_log(rng, int(steps * rng.uniform(0.8, 1.5)), T0 + timedelta(days=i % 30, hours=i // 30),
                              i % 10 == 0))
        files.append((path, f"run{i:03d}"))
    for i in range(engine_runs):
        path = os.path.join(folder, f"engine{i:02d}.log")
        with open(path, "w") as fh:
            fh.write(engine_log(rng, 400, 40 * i))
        files.append((path, f"engine{i:02d}"))
    return files


def build(db: str, files: list[tuple[str, str]], drift: bool) -> dict:
    """One `specmon ingest` per file (the CLI's main, in this process), with or without --no-drift."""
    from specmon.cli.main import main as specmon
    from specmon.store.database import Store

    t0 = time.perf_counter()
    for path, run in files:
        assert specmon(["ingest", "--db", db, "--run", run, path] + ([] if drift else ["--no-drift"])) == 0
    with Store(db) as store:
        steps = store.query("SELECT count(*) FROM steps")[0][0]
    return {"build_s": round(time.perf_counter() - t0, 1), "steps": steps}


WRITER = r"""
import json, os, sys, time
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store
db, folder, stop = sys.argv[1], sys.argv[2], sys.argv[3]
store = Store(db, lock_timeout=600, on_wait=lambda _: None)
waits, i = [], 0
while not os.path.exists(stop):
    path = os.path.join(folder, f"w{i}.jsonl")
    with open(path, "w") as fh:
        ts = f"2026-06-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        fh.write(json.dumps({"request_id": f"w{i}", "ts": ts, "k": 4, "draft_tokens": [1, 2, 3, 4],
                             "accepted": 2}) + "\n")
    t = time.perf_counter()
    ingest_file(store, path, run="run000")
    waits.append(time.perf_counter() - t)
    i += 1
    time.sleep(0.5)
print(json.dumps({"ingests": len(waits), "longest_s": max(waits, default=0.0)}))
"""


def timed_check(db: str, pythonpath: str) -> dict:
    """One `specmon check --json` with a writer beside it: its wall time, exit code and the writer's longest ingest."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    with tempfile.TemporaryDirectory() as tmp:
        stop = os.path.join(tmp, "stop")
        writer = subprocess.Popen([sys.executable, "-c", WRITER, db, tmp, stop], env=env, stdout=subprocess.PIPE,
                                  text=True)
        time.sleep(2.0)  # the writer's imports
        t = time.perf_counter()
        check = subprocess.run([sys.executable, "-m", "specmon", "check", "--db", db, "--json", "--lock-timeout",
                                "600"], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        open(stop, "w").close()
        written = json.loads(writer.communicate()[0])
    verdict = json.loads(check.stdout) if check.stdout.startswith("{") else {}
    return {"check_s": round(wall, 2), "exit": check.returncode, "writer_ingests": written["ingests"],
            "writer_longest_wait_s": round(written["longest_s"], 2),
            "problems": len(verdict.get("problems", [])), "alarms": len(verdict.get("alarms", [])),
            "stderr_tail": check.stderr[-300:] if check.returncode not in (0, 1) else "",
            "load_1min_after": round(os.getloadavg()[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--engine-runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--old", help="another checkout to time on a copy of the same database")
    ap.add_argument("--out", default=os.path.join(HERE, "check_many_runs.json"))
    args = ap.parse_args()
    out: dict = {"machine": machine(), "runs": args.runs, "engine_runs": args.engine_runs, "steps_per_run": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        files = write_logs(tmp, args.runs, args.engine_runs, args.steps)
        builds = {"no_drift": os.path.join(tmp, "no_drift.duckdb"), "drift": os.path.join(tmp, "drift.duckdb")}
        for kind, base in builds.items():
            out[f"database_{kind}"] = build(base, files, kind == "drift")
            print(kind, json.dumps(out[f"database_{kind}"]), file=sys.stderr, flush=True)
        turns = [("this", ROOT, "drift"), ("this", ROOT, "no_drift")] + ([("old", args.old, "no_drift")]
                                                                         if args.old else [])
        for label, checkout, kind in turns:
            db = os.path.join(tmp, f"{label}_{kind}.duckdb")
            shutil.copyfile(builds[kind], db)
            first = timed_check(db, checkout)
            print(label, kind, "first", json.dumps(first), file=sys.stderr, flush=True)
            second = timed_check(db, checkout)
            print(label, kind, "second", json.dumps(second), file=sys.stderr, flush=True)
            out[f"{label}_{kind}"] = {"first": first, "second": second}
    print(json.dumps(out, indent=1))
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
