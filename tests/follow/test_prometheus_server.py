"""A real Prometheus server (Debian's package) scrapes a small exporter of vLLM-format counters whose values this
test controls; `specmon pull` reads them back through the HTTP API, and the stored figures must equal what the
exporter served, restart included."""
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None:
    if os.environ.get("CI"):
        raise RuntimeError("prometheus is missing: .ci/run installs Debian's prometheus package")
    pytest.skip("Debian's prometheus is not installed (apt-get install prometheus)", allow_module_level=True)

PAGE = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="llama"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="llama"}} {draft_tokens}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="llama"}} {accepted}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="llama",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="llama",position="1"}} {p1}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Exporter:
    """Serves the counters in self.values at /metrics."""

    def __init__(self):
        self.values = dict(drafts=0, draft_tokens=0, accepted=0, p0=0, p1=0)
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                body = PAGE.format(**exporter.values).encode()
                exporter.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_scrapes(self, n: int, timeout: float = 30) -> None:
        target = self.scrapes + n
        deadline = time.time() + timeout
        while self.scrapes < target:
            assert time.time() < deadline, "Prometheus stopped scraping the exporter"
            time.sleep(0.1)


@pytest.fixture
def prometheus_url(tmp_path):
    exporter = Exporter()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vllm\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{exporter.port}']\n")
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
            break
        except OSError:
            assert time.time() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.3)
    yield url, exporter
    proc.terminate()
    proc.wait(timeout=30)
    exporter.server.shutdown()
    log.close()


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_pull_stores_what_the_exporter_served(prometheus_url, tmp_path, specmon_cmd):
    url, exporter = prometheus_url
    served = [dict(drafts=100, draft_tokens=200, accepted=120, p0=70, p1=50),
              dict(drafts=400, draft_tokens=800, accepted=420, p0=250, p1=170),
              dict(drafts=30, draft_tokens=60, accepted=40, p0=22, p1=18)]  # the server restarted
    for values in served:
        exporter.values = values
        exporter.wait_scrapes(2)  # one whole scrape at least after the change
    time.sleep(1.5)  # let the last scrape land in the head block
    db = str(tmp_path / "p.duckdb")
    r = subprocess.run([*specmon_cmd, "pull", "--db", db, "--prometheus", url, "--since", "5m", "--step", "1s",
                        "--run", "fleet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "stored" in r.stdout
    rows = json.loads(subprocess.run([*specmon_cmd, "summary", "--db", db, "--json", "--c", "0.1"],
                                     capture_output=True, text=True).stdout)
    seg = next(s for s in rows if s["run"] == "fleet")
    # windows start at the first value Prometheus holds; after the restart the new process's counts are added
    drafts = (400 - 100) + 30
    accepted = (420 - 120) + 40
    per_pos = [(250 - 70) + 22, (170 - 50) + 18]
    assert seg["steps"] == drafts and seg["accepted"] == accepted and seg["drafted"] == (800 - 200) + 60
    assert [p["accepted"] for p in seg["per_position"]] == per_pos
    assert seg["alpha"] == pytest.approx(sum(per_pos) / (drafts + per_pos[0]))
    # c was given, but a minute of windows is too short: neighbouring windows share requests, so no interval yet
    assert seg["status"] == "unknown" and "under 30 minutes" in seg["note"]
    again = subprocess.run([*specmon_cmd, "pull", "--db", db, "--prometheus", url, "--since", "5m", "--step", "1s",
                            "--run", "fleet"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    rows = json.loads(subprocess.run([*specmon_cmd, "summary", "--db", db, "--json"], capture_output=True,
                                     text=True).stdout)
    assert next(s for s in rows if s["run"] == "fleet")["steps"] == drafts  # an overlapping pull adds nothing twice


def test_pull_from_nowhere_is_a_clear_error(specmon_cmd, tmp_path):
    r = subprocess.run([*specmon_cmd, "pull", "--db", str(tmp_path / "x.duckdb"), "--prometheus",
                        f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Prometheus query failed" in r.stderr
