"""A process whose background threads are inside DuckDB when its main thread ends exits cleanly: Python stops a
daemon thread by unwinding its stack, which inside DuckDB's C++ aborts the process (SIGABRT) unless the store's
connection gate has let every connection end first."""
import subprocess
import sys

import pytest

BUSY_THREADS = """
import sys, threading, time
from pathlib import Path
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

store = Store(sys.argv[1])
log = Path(sys.argv[1]).with_suffix(".jsonl")
log.write_text('{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1}\\n')

def reads():
    while True:
        store.query("SELECT count(*) FROM range(200000)")

def writes():
    while True:
        with store.transaction() as cur:
            cur.execute("SELECT count(*) FROM runs")

def ingests():  # a staging file, then the transaction that publishes it (a repeat: nothing new is stored)
    while True:
        ingest_file(store, str(log))

for work in (reads, writes, ingests):
    threading.Thread(target=work, daemon=True).start()
time.sleep(1.0)
print("main thread done", flush=True)
"""

LONG_QUERY = """
import sys, threading, time
from specmon.store.database import Store

store = Store(sys.argv[1])
started = threading.Event()

def long_query():
    started.set()
    store.query("SELECT sum(i * i) FROM range(100000000000) t(i)")  # hours

threading.Thread(target=long_query, daemon=True).start()
started.wait()
time.sleep(0.5)
print("main thread done", flush=True)
"""

LATE_EXIT_HANDLER = """
import atexit, sys
held = {}
atexit.register(lambda: print("read at exit:", held["store"].query("SELECT 42")[0][0], flush=True))  # runs last
from specmon.store.database import Store
held["store"] = Store(sys.argv[1])
"""


def run_script(script: str, db: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, db], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("attempt", range(3))
def test_a_process_ends_cleanly_while_daemon_threads_read_write_and_ingest(tmp_path, attempt):
    done = run_script(BUSY_THREADS, str(tmp_path / "busy.duckdb"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "main thread done" in done.stdout
    assert "FATAL" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-2000:]


def test_a_query_still_running_at_exit_is_interrupted_and_the_process_ends(tmp_path):
    done = run_script(LONG_QUERY, str(tmp_path / "long.duckdb"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "FATAL" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-2000:]


def test_the_main_thread_still_reads_the_database_after_the_gate_closed(tmp_path):
    done = run_script(LATE_EXIT_HANDLER, str(tmp_path / "late.duckdb"))
    assert done.returncode == 0 and "read at exit: 42" in done.stdout, done.stderr[-2000:]
