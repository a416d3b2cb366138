"""`specmon check` over hundreds of runs: the first check (every reference calibrated), a second one (thresholds and
drift states kept), and the longest a second process waits to write while each runs:

    nice python bench/check_many_runs.py [--runs 300] [--engine-runs 20] [--steps 3000] [--old PATH]

The database: --runs step-log runs of 0.8-1.5 x --steps steps each (those past 4,000 also calibrate at their
first checkpoint), requests of lognormal length (mean 20 steps) each with its own acceptance (correlation 0.2,
k = 4; one in ten runs drops to a lower acceptance at two thirds), and --engine-runs vLLM engine logs of 400
windows, all through `specmon ingest`'s own path (ingest_file). The database is built once and copied for each
checkout timed, so both check the same bytes. A second process meanwhile ingests a one-step log every 0.5 s into
the first run, after its steps (a real ingest_file in another Python, waiting for the lock as a user's would, like
a watcher following that run): its longest ingest is the longest time check kept writers out, plus the ingest's
own time.

--old PATH also times another checkout (its specmon package on PYTHONPATH) on a copy of the same database, side by
side; the JSON is printed and written beside this script.
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


def build(db: str, runs: int, engine_runs: int, steps: int) -> dict:
    from specmon.ingest.pipeline import ingest_file
    from specmon.store.database import Store

    store = Store(db)
    rng = np.random.default_rng(20260301)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            path = os.path.join(tmp, f"run{i:03d}.jsonl")
            with open(path, "w") as fh:
                fh.write(step_log(rng, int(steps * rng.uniform(0.8, 1.5)), T0 + timedelta(days=i % 30, hours=i // 30),
                                  i % 10 == 0))
            assert ingest_file(store, path, run=f"run{i:03d}").status == "stored"
        for i in range(engine_runs):
            path = os.path.join(tmp, f"engine{i:02d}.log")
            with open(path, "w") as fh:
                fh.write(engine_log(rng, 400, 40 * i))
            assert ingest_file(store, path, run=f"engine{i:02d}").status == "stored"
    return {"build_s": round(time.perf_counter() - t0, 1), "steps": store.query("SELECT count(*) FROM steps")[0][0]}


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
        base = os.path.join(tmp, "base.duckdb")
        out["database"] = build(base, args.runs, args.engine_runs, args.steps)
        print(json.dumps(out["database"]), file=sys.stderr, flush=True)
        for label, checkout in [("this", ROOT)] + ([("old", args.old)] if args.old else []):
            db = os.path.join(tmp, f"{label}.duckdb")
            shutil.copyfile(base, db)
            first = timed_check(db, checkout)
            print(label, "first", json.dumps(first), file=sys.stderr, flush=True)
            second = timed_check(db, checkout)
            print(label, "second", json.dumps(second), file=sys.stderr, flush=True)
            out[label] = {"first": first, "second": second}
    print(json.dumps(out, indent=1))
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
