"""Watching a deployment: from a line written to the number visible on the open page, the watcher's CPU, and the
dashboard's refresh as the database grows.

    python bench/watch.py [--seconds 40] [--steps-per-s 1000] [--engine-lines-per-s 10] [--sizes 1000000,10000000]

It prints JSON; docs/benchmarks.md's is bench/watch.json.

1. Latency and CPU. A fresh database; `streamlit run app.py` and `specmon watch` (default settings: poll every
   1 s, the page looks for new data every 2 s) on it; a writer appends step-log lines (k = 4) at --steps-per-s and
   another appends vLLM V1 `SpecDecoding metrics` lines at --engine-lines-per-s, each logging (time, lines written
   so far). Chromium stays on the Overview page without reloading; the caption every page carries ("N rows stored
   from them") is read every 100 ms. For each new N shown, latency = the time it was seen - the time the N-th
   line was written. The watcher's CPU is its user + system time over the steady part of the run, per wall second.
2. Refresh against size. For databases of --sizes drafted positions (flat-form Parquet through the ingest), the
   cost of the check an open page makes every 2 s (the database's generation: a stat of its files, plus the
   watched sources' health) and of the page's rerun when the data changed (the Overview's summary, warm).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import machine, wait_healthy

ROOT = Path(__file__).resolve().parent.parent

STEP_WRITER = r"""
import json, sys, time
import numpy as np
path, per_s, seconds, log = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(3)
batch = max(1, int(per_s / 20))
n, t0 = 0, time.time()
with open(path, "a") as fh, open(log, "w") as out:
    while time.time() - t0 < seconds:
        for _ in range(batch):
            fh.write(json.dumps({"request_id": f"r{n // 16}",
                                 "draft_tokens": [int(x) for x in rng.integers(0, 4096, 4)],
                                 "accepted": int(min(rng.geometric(0.25) - 1, 4)), "template": "v1",
                                 "draft_ms": 4.0, "target_ms": 20.0}) + "\n")
            n += 1
        fh.flush()
        out.write(f"{time.time()} {n}\n")
        out.flush()
        time.sleep(max(0.0, t0 + n / per_s - time.time()))
"""

ENGINE_WRITER = r"""
import sys, time
path, per_s, seconds, log = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
n, t0 = 0, time.time()
with open(path, "a") as fh, open(log, "w") as out:
    while time.time() - t0 < seconds:
        t = time.gmtime()
        fh.write(f"(APIServer pid=1) INFO {t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} "
                 "[metrics.py:101] SpecDecoding metrics: Mean acceptance length: 3.03, Accepted throughput: 3.87 "
                 "tokens/s, Drafted throughput: 5.72 tokens/s, Accepted: 337 tokens, Drafted: 498 tokens, "
                 "Per-position acceptance rate: 0.837, 0.669, 0.524, Avg Draft acceptance rate: 67.7%\n")
        fh.flush()
        n += 1
        out.write(f"{time.time()} {n}\n")
        out.flush()
        time.sleep(max(0.0, t0 + n / per_s - time.time()))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lines_written(work: Path) -> int:
    """Lines both writers have flushed so far."""
    total = 0
    for name in ("steps.times", "engine.times"):
        try:
            last = (work / name).read_text().split()
        except OSError:
            continue
        total += int(last[-1]) if last else 0
    return total


def _written(log: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [line.split() for line in open(log) if line.strip()]
    return np.array([float(r[0]) for r in rows]), np.array([int(r[1]) for r in rows])


def latency_and_cpu(seconds: float, steps_per_s: float, engine_per_s: float) -> dict:
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="specmon-bench-watch-"))
    db, steps, log = work / "w.duckdb", work / "steps.jsonl", work / "vllm.log"
    steps.touch()
    log.touch()
    env = {**os.environ, "SPECMON_DB": str(db)}
    subprocess.run([sys.executable, "-m", "specmon", "demo", "--db", str(db)], check=True, capture_output=True)
    port = _port()
    dashboard = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                                  "--server.headless", "true", "--server.fileWatcherType", "none"],
                                 cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = subprocess.Popen([sys.executable, "-m", "specmon", "watch", "--db", str(db), "--steplog",
                                str(steps), "--log", str(log), "--run", "bench"],
                               stdout=open(work / "watch.log", "w"), stderr=subprocess.STDOUT)
    seen: list[tuple[float, int]] = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(url)
            page.locator('[data-testid="stMetricValue"]').first.wait_for(timeout=120_000)
            writers = [
                subprocess.Popen([sys.executable, "-c", STEP_WRITER, str(steps), str(steps_per_s), str(seconds),
                                  str(work / "steps.times")]),
                subprocess.Popen([sys.executable, "-c", ENGINE_WRITER, str(log), str(engine_per_s), str(seconds),
                                  str(work / "engine.times")])]
            # The caption is read all along; the watcher's CPU is sampled over the middle half (the steady part).
            start = time.time()
            cpu_marks: dict[str, tuple[float, float]] = {}
            caption = page.get_by_text("rows stored from them")
            while time.time() - start < seconds + 30:
                elapsed = time.time() - start
                if "from" not in cpu_marks and elapsed >= seconds / 4:
                    cpu_marks["from"] = (_cpu_seconds(watcher.pid), time.time())
                if "to" not in cpu_marks and elapsed >= 3 * seconds / 4:
                    cpu_marks["to"] = (_cpu_seconds(watcher.pid), time.time())
                try:
                    text = caption.first.inner_text(timeout=1000)
                    n = int(text.split(" rows stored")[0].split("·")[-1].strip().replace(",", ""))
                    if not seen or n != seen[-1][1]:
                        seen.append((time.time(), n))
                except Exception:  # the page is between two renders
                    pass
                if all(w.poll() is not None for w in writers) and seen and seen[-1][1] >= _lines_written(work):
                    break
                time.sleep(0.1)
            (cpu0, wall0), (cpu1, wall1) = cpu_marks["from"], cpu_marks["to"]
            browser.close()
    finally:
        for p in (watcher, dashboard):
            p.terminate()
            p.wait()
    ts_s, n_s = _written(str(work / "steps.times"))
    ts_e, n_e = _written(str(work / "engine.times"))
    # lines written by time t, both writers together: when did the total first reach N?
    events = sorted([(t, "s", n) for t, n in zip(ts_s, n_s, strict=True)]
                    + [(t, "e", n) for t, n in zip(ts_e, n_e, strict=True)])
    totals, cur = [], {"s": 0, "e": 0}
    for t, kind, n in events:
        cur[kind] = n
        totals.append((t, cur["s"] + cur["e"]))
    n_arr = np.array([n for _, n in totals])
    # Every line's latency: from its writing to the first time the page showed a count that includes it.
    shown_t = np.array([t for t, _ in seen])
    shown_n = np.maximum.accumulate(np.array([n for _, n in seen])) if seen else np.array([], dtype=int)
    lat = []
    for t_written, n in totals:
        j = np.searchsorted(shown_n, n)
        if j < len(shown_t):
            lat.append(shown_t[j] - t_written)
    lat = np.array(lat)
    return {"steps_per_s": steps_per_s, "engine_lines_per_s": engine_per_s, "seconds": seconds,
            "lines_written": int(n_arr[-1]), "last_shown": seen[-1][1] if seen else None,
            "latency_s": {"median": float(np.median(lat)), "p95": float(np.percentile(lat, 95)),
                          "max": float(lat.max()), "lines": int(len(lat)),
                          "page_updates_seen": len(seen)} if len(lat) else None,
            "watch_cpu_fraction_of_one_core": (cpu1 - cpu0) / (wall1 - wall0)}


REFRESH = r"""
import json, sys, time
from specmon.analysis import summary
from specmon.analysis.sources import source_health, watched_sources
from specmon.store.database import Store
s = Store(sys.argv[1])
def best(fn, n=7):
    out = []
    for _ in range(n):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return min(out)
check = best(lambda: (s.generation, source_health(watched_sources(s))))
generation = best(lambda: s.generation, 50)
overview = best(lambda: summary.summarize(s), 3)
print(json.dumps({"positions": s.query("SELECT count(*) FROM position_rows")[0][0], "generation_check_s": generation,
                  "refresh_check_s": check, "overview_rerun_warm_s": overview}))
"""


def refresh_by_size(sizes: list[int]) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).parent))
    from ingest import write_parquet

    out = []
    for n in sizes:
        work = tempfile.mkdtemp(prefix="specmon-bench-size-")
        db, parquet = os.path.join(work, "s.duckdb"), os.path.join(work, "flat.parquet")
        write_parquet(parquet, n)
        subprocess.run([sys.executable, "-m", "specmon", "ingest", "--db", db, parquet], check=True,
                       capture_output=True)
        os.unlink(parquet)
        out.append(json.loads(subprocess.run([sys.executable, "-c", REFRESH, db], check=True, capture_output=True,
                                             text=True).stdout))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--steps-per-s", type=float, default=1000)
    ap.add_argument("--engine-lines-per-s", type=float, default=10)
    ap.add_argument("--sizes", default="1000000,10000000")
    args = ap.parse_args()
    result = {"machine": machine(),
              "latency_and_cpu": latency_and_cpu(args.seconds, args.steps_per_s, args.engine_lines_per_s),
              "refresh_by_size": refresh_by_size([int(x) for x in args.sizes.split(",") if x])}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
