"""Throughput of the engine-log reader on a server log: lines per second, read in one go and resumed line by line.

    python bench/readers.py [--lines 200000] [--workdir DIR] [--without-load-lines]
    # prints JSON; the docs' is bench/readers.json

The log repeats real vLLM V1 lines (one metrics line every ten lines, between throughput and HTTP access lines, as a
busy server prints them), with their times moving on by ten seconds each. Measured in a fresh process each: the
whole file through specmon.ingest.formats.engine_log.read, and the same lines fed to an EngineLogReader that is
recreated from its state every 1,000 lines (what the watcher does between polls). --without-load-lines writes HTTP
access lines where the engine's load lines would be, to measure what reading the load lines costs.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from datetime import datetime, timedelta

from _common import machine, run_child

METRICS = ("(APIServer pid=1) INFO {ts} [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 3.03, Accepted "
           "throughput: 3.87 tokens/s, Drafted throughput: 5.72 tokens/s, Accepted: 337 tokens, Drafted: 498 tokens, "
           "Per-position acceptance rate: 0.837, 0.669, 0.524, Avg Draft acceptance rate: 67.7%")
ENGINE = ("(APIServer pid=1) INFO {ts} [loggers.py:271] Engine 000: Avg prompt throughput: 1503.9 tokens/s, Avg "
          "generation throughput: 50.3 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix "
          "cache hit rate: 0.0%")
ACCESS = '(APIServer pid=1) INFO:     172.18.0.3:59734 - "POST /v1/chat/completions HTTP/1.1" 200 OK'


def write_log(path: str, lines: int, load_lines: bool = True) -> None:
    t = datetime(2026, 5, 21, 0, 0, 0)
    with open(path, "w") as out:
        for i in range(lines):
            if i % 10 == 9:
                t += timedelta(seconds=10)
                out.write(METRICS.format(ts=t.strftime("%m-%d %H:%M:%S")) + "\n")
            elif i % 10 == 8 and load_lines:
                out.write(ENGINE.format(ts=t.strftime("%m-%d %H:%M:%S")) + "\n")
            else:
                out.write(ACCESS + "\n")


WHOLE = """
import json, time
from datetime import datetime
from specmon.ingest.formats import engine_log
t0 = time.perf_counter()
windows, faults = engine_log.read({path!r}, "bench.log", datetime(2026, 11, 30))
print(json.dumps({{"seconds": time.perf_counter() - t0, "windows": len(windows), "faults": len(faults)}}))
"""

RESUMED = """
import json, time
from datetime import datetime
from specmon.ingest.formats.engine_log import EngineLogReader
now = datetime(2026, 11, 30)
t0 = time.perf_counter()
reader, windows, state = EngineLogReader("bench.log", now), 0, None
with open({path!r}, encoding="utf-8") as fh:
    for no, line in enumerate(fh, start=1):
        reader.feed(no, line)
        if no % 1000 == 0:
            windows += len(reader.take()[0])
            reader = EngineLogReader("bench.log", now, state=json.loads(json.dumps(reader.state())))
reader.finish()
windows += len(reader.take()[0])
print(json.dumps({{"seconds": time.perf_counter() - t0, "windows": windows}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--without-load-lines", action="store_true")
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="specmon-bench-readers-")
    path = os.path.join(workdir, "server.log")
    write_log(path, args.lines, not args.without_load_lines)
    out = {"machine": machine(), "lines": args.lines, "bytes": os.path.getsize(path),
           "load_lines": not args.without_load_lines}
    for label, code in (("whole", WHOLE), ("resumed_every_1000", RESUMED)):
        r = run_child(code.format(path=path))
        r["lines_per_s"] = args.lines / r["seconds"]
        out[label] = r
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
