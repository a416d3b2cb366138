"""Watching a running deployment, end to end, with real processes only.

The dashboard (`streamlit run app.py`) and `specmon watch` share one database. Two writer processes play the
deployment: one appends vLLM V1 `SpecDecoding metrics` lines (the shape of a real line, figures from a simulation)
whose acceptance drops below break-even after the 200 windows the detector takes as its reference, and rotates
its log mid-stream; the other appends step-log lines
whose template changes from v1 to v2 with a drop. While they run: an unrelated `specmon ingest` and `specmon check`
succeed from other processes, the watcher is kill -9'd and restarted once, a local HTTP receiver collects the
webhooks, and Chromium, left on the Drift page without reloading, must come to show the alarm.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from paths import ROOT
from waiting import until

from specmon.store.database import Store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / "test-artifacts" / "screenshots"

ENGINE_WRITER = r"""
import json, os, sys, time
import numpy as np
path, out = sys.argv[1], sys.argv[6]
lines, drop_at, rotate_at, pause = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rng = np.random.default_rng(7)
k, acc_total, drafted_total = 3, 0, 0
fh = open(path, "a")
for i in range(lines):
    if i == rotate_at:
        fh.close()
        os.rename(path, path + ".1")  # rotation by rename, as logrotate does
        fh = open(path, "a")
    alpha = 0.85 if i < drop_at else 0.2
    drafts = int(rng.integers(40, 80))
    # accepted prefix lengths of i.i.d. acceptance at alpha, capped at k
    prefix = np.minimum(rng.geometric(1 - alpha, drafts) - 1, k)
    per_pos = [int((prefix >= j).sum()) for j in range(1, k + 1)]
    acc, drafted = sum(per_pos), drafts * k
    acc_total, drafted_total = acc_total + acc, drafted_total + drafted
    rates = ", ".join(f"{n / drafts:.3f}" for n in per_pos)
    t = time.gmtime()
    fh.write(f"(APIServer pid=1) INFO {t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} "
             f"[metrics.py:101] SpecDecoding metrics: Mean acceptance length: {1 + acc / drafts:.2f}, Accepted "
             f"throughput: 3.87 tokens/s, Drafted throughput: 5.72 tokens/s, Accepted: {acc} tokens, Drafted: "
             f"{drafted} tokens, Per-position acceptance rate: {rates}, Avg Draft acceptance rate: "
             f"{100 * acc / drafted:.1f}%\n")
    fh.flush()
    time.sleep(pause)
fh.close()
json.dump({"accepted": acc_total, "drafted": drafted_total}, open(out, "w"))
"""

STEP_WRITER = r"""
import datetime, json, sys, time
import numpy as np
path, steps, change_at, per_second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rng = np.random.default_rng(11)
with open(path, "a") as fh:
    for i in range(steps):
        template, alpha = ("v1", 0.85) if i < change_at else ("v2", 0.3)
        accepted = int(min(rng.geometric(1 - alpha) - 1, 4))
        ts = datetime.datetime.now(datetime.timezone.utc).isoformat()
        fh.write(json.dumps({"request_id": f"r{i // 8}", "draft_tokens": [int(x) for x in rng.integers(0, 4096, 4)],
                             "accepted": accepted, "template": template, "ts": ts, "draft_ms": 16.0,
                             "target_ms": 20.0}) + "\n")
        if i % 20 == 19:
            fh.flush()
            time.sleep(20 / per_second)
"""


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        type(self).received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specmon", *args], capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_dashboard_watcher_writers_and_other_processes_share_one_database(tmp_path):
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            raise RuntimeError("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("Debian's chromium is not installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    db, log, steps = str(tmp_path / "live.duckdb"), tmp_path / "vllm.log", tmp_path / "steps.jsonl"
    log.write_text("")
    steps.write_text("")
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path / "watch.toml"
    config.write_text(
        f'interval = 0.5\nwebhook = "http://127.0.0.1:{server.server_port}/hook"\n'
        f'[[log]]\npath = "{log}"\nrun = "vllm-prod"\nc = 0.3\n'
        f'[[steplog]]\npath = "{steps}"\nrun = "chat"\n'
        f'[[log]]\npath = "{tmp_path / "not-there.log"}"\nrun = "ghost"\n'
        f'[[prometheus]]\nurl = "http://127.0.0.1:{_free_port()}"\nrun = "prom-down"\n')

    port = _free_port()
    env = {**os.environ, "SPECMON_DB": db, "SPECMON_REFRESH_S": "1"}
    dash_log = open(tmp_path / "streamlit.log", "wb")
    dashboard = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                                  "--server.address", "127.0.0.1", "--server.headless", "true",
                                  "--server.fileWatcherType", "none"],
                                 cwd=ROOT, env=env, stdout=dash_log, stderr=subprocess.STDOUT)
    watch_out = open(tmp_path / "watch.log", "a")

    def start_watcher() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "specmon", "watch", "--db", db, "--config", str(config)],
                                stdout=watch_out, stderr=subprocess.STDOUT)

    watcher = start_watcher()
    procs = [dashboard, watcher]
    try:
        url = f"http://127.0.0.1:{port}"
        until(lambda: _health(url), 90, "the dashboard")
        totals_file = tmp_path / "engine-totals.json"
        engine = subprocess.Popen([sys.executable, "-c", ENGINE_WRITER, str(log), "400", "250", "150", "0.05",
                                   str(totals_file)])
        stepper = subprocess.Popen([sys.executable, "-c", STEP_WRITER, str(steps), "6000", "3000", "400"])
        procs += [engine, stepper]
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(f"{url}/drift?run=chat")
            page.wait_for_selector("text=Drift", timeout=90_000)

            time.sleep(4)
            watcher.send_signal(signal.SIGKILL)  # kill -9 mid-stream, then restart
            watcher.wait()
            watcher = start_watcher()
            procs.append(watcher)

            other = tmp_path / "other.jsonl"
            other.write_text('{"request_id": "x", "draft_tokens": [1, 2], "accepted": 1}\n')
            ingest = _cli("ingest", str(other), "--db", db, "--run", "other")
            assert ingest.returncode == 0, ingest.stderr
            summary = _cli("summary", "--db", db, "--json", "--no-demo")
            assert summary.returncode == 0, summary.stderr

            engine.wait(timeout=120)
            stepper.wait(timeout=120)
            want = json.loads(totals_file.read_text())
            until(lambda: _engine_totals(db) == (want["accepted"], want["drafted"]), 120,
                   f"the stored engine totals to equal the writer's {want}")
            until(lambda: _steps(db) == 6000, 120, "every step-log line")
            check = _cli("check", "--db", db, "--c", "0.3")
            assert check.returncode == 1, check.stdout + check.stderr
            assert "vllm-prod" in check.stdout

            # The page was never reloaded: the alarm must come to it.
            page.wait_for_selector('[data-testid="stAlertContentError"] >> text=Open', timeout=120_000)
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "drift-live.png"), full_page=True)
            page.goto(f"{url}/sources")
            page.wait_for_selector("text=not-there.log", timeout=60_000)
            page.screenshot(path=str(SHOTS / "sources.png"), full_page=True)
            browser.close()

        for run in ("vllm-prod", "chat"):  # drift on engine counts and on step logs alike
            until(lambda run=run: any(r["event"] == "alarm_opened" and r["run"] == run for r in _Receiver.received), 60,
                   f"the alarm webhook for {run}")
        alarm = next(r for r in _Receiver.received if r["event"] == "alarm_opened" and r["run"] == "chat")
        assert alarm["link"].endswith("/drift?run=chat") and alarm["break_even"] is not None
        store = Store(db)
        health = dict(store.query("SELECT location, status FROM watch_sources"))
        assert health[str(tmp_path / "not-there.log")] == "failing"
        assert health[str(log)] == "ok" and health[str(steps)] == "ok"
        assert _engine_totals(db) == (want["accepted"], want["drafted"])  # exactly once, across kill and rotation
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        server.shutdown()
        watch_out.close()
        dash_log.close()


def _health(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok"
    except OSError:
        return False


def _engine_totals(db: str) -> tuple[float, float]:
    return tuple(Store(db).query("SELECT coalesce(sum(accepted_tokens), 0), coalesce(sum(draft_tokens), 0) "
                                 "FROM engine_windows")[0])


def _steps(db: str) -> int:
    return Store(db).query("SELECT count(*) FROM steps JOIN segments USING (segment_id) JOIN runs USING (run_id) "
                           "WHERE runs.name = 'chat'")[0][0]
