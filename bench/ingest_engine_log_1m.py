"""Engine-log ingest at a million lines: time, peak memory, and how long the database's write lock is held.

    nice python bench/ingest_engine_log_1m.py [--lines 1000000] [--workdir DIR] [--out FILE]

The log repeats the real vLLM V1 log tests/data/engines/vllm-v1-current-1.log (load lines, SpecDecoding metrics
lines and HTTP access lines of one server, as its index.json says where it comes from) with the times moving on by
the log's own span at each repeat, so the windows are a day's and more of a busy server's. One `ingest_file` in a
fresh process (as `specmon ingest` runs it), timed until it returns; the lock is held from the publishing
transaction's start (its "storing" stage, the first thing done under the lock after the run and ingest rows) to its
commit, which the stage callback marks; peak RSS is the process's VmHWM.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from _common import machine, run_child

REAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "engines" / "vllm-v1-current-1.log"
_TS = re.compile(r"\b(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})\b")


def write_log(path: str, lines: int) -> None:
    """The real log's lines, repeated with their times moved on by the log's span (plus ten seconds) each time."""
    real = REAL.read_text().splitlines()
    stamps = [datetime(2026, int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]))
              for m in (_TS.search(line) for line in real) if m]
    span = max(stamps) - min(stamps) + timedelta(seconds=10)
    def moved(shift: timedelta):
        return lambda m: (datetime(2026, int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]))
                          + shift).strftime("%m-%d %H:%M:%S")

    written, shift = 0, timedelta(0)
    with open(path, "w") as out:
        while written < lines:
            move = moved(shift)
            for line in real[:lines - written]:
                out.write(_TS.sub(move, line) + "\n")
            written += min(len(real), lines - written)
            shift += span


INGEST = """
import json, time
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store
marks = {{}}
t0 = time.perf_counter()
res = ingest_file(Store({db!r}), {path!r}, stage=lambda what: marks.setdefault(what, time.perf_counter() - t0))
wall = time.perf_counter() - t0
print(json.dumps({{"status": res.status, "windows": res.steps, "faults": res.fault_count, "seconds": wall,
                  "lock_held_s": wall - marks["storing"], "reading_s": marks["storing"]}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="specmon-bench-engine-log-")
    path, db = os.path.join(workdir, "server.log"), os.path.join(workdir, "bench.duckdb")
    write_log(path, args.lines)
    result = run_child(INGEST.format(db=db, path=path))
    result.update(lines=args.lines, bytes=os.path.getsize(path), machine=machine(),
                  load_average=os.getloadavg(), date=datetime.now().strftime("%Y-%m-%d"))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
