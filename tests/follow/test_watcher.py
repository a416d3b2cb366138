"""specmon watch: sources followed like tail -F, positions committed with the data, failures contained, notices
sent. Real files, real processes (kill -9 included), a real HTTP receiver."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from engine_lines import watched_v1_line as v1_line
from paths import APP
from streamlit.testing.v1 import AppTest
from waiting import until

from specmon.analysis.sources import source_health, watched_sources
from specmon.core.faults import SpecmonError
from specmon.follow.config import SourceConfig, WatchConfig, load_config
from specmon.follow.watcher import Watcher
from specmon.store.database import Store


def totals(store: Store) -> tuple[float, float]:
    acc, drafted = store.query("SELECT coalesce(sum(accepted_tokens), 0), coalesce(sum(draft_tokens), 0) "
                               "FROM engine_windows")[0]
    return acc, drafted


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_followed_log_counts_every_line_once_through_half_lines_rotation_and_truncation(tmp_path):
    log = tmp_path / "vllm.log"
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod")], interval_s=0.1))
    want_acc = want_drafted = 0

    def write(path: Path, i: int, mode: str = "a", cut: int | None = None) -> str:
        nonlocal want_acc, want_drafted
        line, acc, drafted = v1_line(i, 100, [80, 60, 40])
        want_acc, want_drafted = want_acc + acc, want_drafted + drafted
        with open(path, mode) as fh:
            fh.write(line if cut is None else line[:cut])
        return line

    for i in range(5):
        write(log, i)
    half = write(log, 5, cut=50)  # the writer is mid-line
    w.poll_once()
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 5
    with open(log, "a") as fh:
        fh.write(half[50:])
    os.rename(log, tmp_path / "vllm.log.1")  # rotation by rename; the old file still gets a line
    write(tmp_path / "vllm.log.1", 6)
    write(log, 7, mode="w")
    w.poll_once()
    w.poll_once()
    assert totals(store) == (want_acc, want_drafted)
    write(log, 8, mode="w")  # copytruncate: the file starts again
    w.poll_once()
    assert totals(store) == (want_acc, want_drafted)
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 9
    w.poll_once()  # nothing new: nothing stored twice
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 9


def test_a_watched_log_ingested_again_whole_or_rotated_stores_each_window_once(tmp_path):
    from specmon.ingest.pipeline import ingest_file
    log = tmp_path / "vllm.log"
    lines = [v1_line(i, 100, [80, 60, 40])[0] for i in range(8)]
    log.write_text("".join(lines[:5]))
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod")], interval_s=0.1))
    w.poll_once()
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 5
    rotated = tmp_path / "vllm.log.1"  # the same five lines and three more, ingested by hand
    rotated.write_text("".join(lines))
    result = ingest_file(store, str(rotated), run="prod")
    assert result.status == "stored" and result.steps == 3
    assert any("5 of them already stored in this run" in n for n in result.notes), result.notes
    assert store.query("SELECT count(*), count(DISTINCT end_ts) FROM engine_windows")[0] == (8, 8)
    with open(log, "a") as fh:  # the watcher reads on: lines the hand ingest stored are not stored again
        fh.write("".join(lines[5:]))
    w.poll_once()
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 8
    twin = tmp_path / "other.log"  # the same text on other lines is other output: stored
    twin.write_text("\n" + "".join(lines[:2]))
    assert ingest_file(store, str(twin), run="prod").steps == 2


def test_a_followed_log_whose_lines_end_in_a_lone_cr_is_read_line_by_line(tmp_path):
    """Lines ended by a lone CR (as the ingest reads them) are taken as they come, not held until an LF; a CR that
    is the last byte written waits for the next byte, since it may be the first half of a CR LF."""
    log = tmp_path / "vllm.log"
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod")], interval_s=0.1))
    lines = [v1_line(i, 100, [80, 60, 40])[0].rstrip("\n") for i in range(4)]
    log.write_bytes(f"{lines[0]}\r{lines[1]}\r".encode())
    w.poll_once()
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 1, "the last CR may be half a CR LF"
    with open(log, "ab") as fh:
        fh.write(f"\n{lines[2]}\r{lines[3]}\r".encode())  # it was: the line ends CR LF
    w.poll_once()
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 3
    with open(log, "ab") as fh:
        fh.write(b"\r")  # a blank line after the last one: that one is complete now
    w.poll_once()
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 4


def test_a_followed_pipe_is_refused_with_a_message(tmp_path):
    fifo = tmp_path / "vllm.log"
    os.mkfifo(fifo)
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("log", str(fifo), run="prod")], interval_s=0.1), log=lambda s: None)
    w.poll_once()
    row = watched_sources(store).iloc[0]
    assert row["status"] == "failing" and "not a regular file (a pipe or a device)" in row["last_error"]


def _watch(db: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specmon", "watch", "--db", db, "--interval", "0.2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)




@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_watcher_killed_mid_stream_resumes_exactly_and_stops_cleanly_on_sigterm(tmp_path):
    db, log = str(tmp_path / "w.duckdb"), tmp_path / "vllm.log"
    log.write_text("")
    want_acc = want_drafted = 0
    watcher = _watch(db, "--log", str(log), "--run", "prod")
    for i in range(200):
        line, acc, drafted = v1_line(i, 50 + i % 7, [40, 20 + i % 5, 10])
        with open(log, "a") as fh:
            fh.write(line)
        want_acc, want_drafted = want_acc + acc, want_drafted + drafted
        if i == 100:
            watcher.kill()  # kill -9: no chance to tidy up
            watcher.wait()
            watcher = _watch(db, "--log", str(log), "--run", "prod")
        time.sleep(0.01)
    until(lambda: totals(Store(db)) == (want_acc, want_drafted), what="every line stored")
    watcher.send_signal(signal.SIGTERM)
    out, _ = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, out
    assert "SIGTERM: finishing the batch in hand" in out and "stopped" in out
    store = Store(db)
    assert totals(store) == (want_acc, want_drafted)
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 200


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_bad_line_stops_its_source_with_a_message_and_nothing_else(tmp_path):
    db = str(tmp_path / "w.duckdb")
    steps, log = tmp_path / "steps.jsonl", tmp_path / "vllm.log"
    steps.write_text('{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1}\n{"request_id": "b", "dr\n')
    line, acc, drafted = v1_line(0, 10, [5, 3, 1])
    log.write_text(line)
    store = Store(db)
    sources = [SourceConfig("steplog", str(steps), run="s"), SourceConfig("log", str(log), run="e"),
               SourceConfig("log", str(tmp_path / "missing.log"), run="m"),
               SourceConfig("prometheus", "http://127.0.0.1:9", run="p")]
    lines: list[str] = []
    w = Watcher(store, WatchConfig(sources, interval_s=0.1), log=lines.append)
    w.poll_once()
    assert totals(store) == (acc, drafted)  # the good source went on
    health = source_health(watched_sources(store)).set_index("location")
    assert health.loc[str(steps), "status"] == "stopped"
    last_error = health.loc[str(steps), "last_error"]
    assert f"{steps}:2" in last_error and "invalid JSON" in last_error
    assert health.loc[str(tmp_path / "missing.log"), "status"] == "failing"
    assert "no such file" in health.loc[str(tmp_path / "missing.log"), "last_error"]
    assert health.loc["http://127.0.0.1:9", "status"] == "failing"
    assert health.loc[str(log), "status"] == "ok"
    assert store.query("SELECT count(*) FROM steps")[0][0] == 0  # all-or-nothing per piece
    assert any("failing" in x for x in lines)
    # With skip_bad the same source stores the good line and reports the bad one.
    sources[0].skip_bad = True
    w2 = Watcher(store, WatchConfig(sources[:1], interval_s=0.1), log=lines.append)
    w2.poll_once()
    assert store.query("SELECT count(*) FROM steps")[0][0] == 1
    assert Path(f"{steps}.rejected.jsonl").exists()


def test_an_inbox_ingests_each_complete_file_once_and_files_it(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "good.jsonl").write_text('{"request_id": "a", "draft_tokens": [1, 2], "accepted": 2}\n')
    (inbox / "bad.jsonl").write_text('{"request_id": "a", "draft_tokens": [1, 2], "accepted": 7}\n')
    (inbox / "coming.jsonl.part").write_text("{")
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("inbox", str(inbox))], interval_s=0.1),
                      log=lambda s: None)
    w.poll_once()  # first look: files may still be growing
    assert store.query("SELECT count(*) FROM steps")[0][0] == 0
    w.poll_once()
    assert store.query("SELECT count(*) FROM steps")[0][0] == 1
    assert (inbox / "done" / "good.jsonl").exists() and (inbox / "done" / "good.jsonl.report.json").exists()
    assert (inbox / "rejected" / "bad.jsonl").exists()
    report = json.loads((inbox / "rejected" / "bad.jsonl.report.json").read_text())
    assert report["status"] == "rejected" and report["faults"][0]["field"] == "accepted"
    assert (inbox / "coming.jsonl.part").exists()
    (inbox / "again.jsonl").write_bytes((inbox / "done" / "good.jsonl").read_bytes())  # same content again
    w.poll_once()
    w.poll_once()
    assert store.query("SELECT count(*) FROM steps")[0][0] == 1
    assert (inbox / "done" / "again.jsonl").exists()


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    _Receiver.received = []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Receiver.received
    server.shutdown()


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_segment_turning_losing_reaches_the_webhook_once(tmp_path, receiver):
    url, received = receiver
    log = tmp_path / "vllm.log"
    store = Store(str(tmp_path / "w.duckdb"))
    config = WatchConfig([SourceConfig("log", str(log), run="prod", c=0.3)], interval_s=0.1,
                               webhook=url, dashboard_url="http://127.0.0.1:8501", alarm_every_s=0)
    w = Watcher(store, config, log=lambda s: None)
    with open(log, "w") as fh:
        for i in range(20):
            fh.write(v1_line(i, 100, [90, 80, 70])[0])
    w.poll_once()
    # acceptance collapses below break-even (1 + k c = 1.9 tokens per step) for two hours: an hour is too short to
    # call losing, with noise paired across half an hour of windows
    with open(log, "a") as fh:
        for i in range(20, 800):
            fh.write(v1_line(i, 100, [20, 5, 1])[0])
    w.poll_once()
    w.outbox.close()
    losing = [r for r in received if r["event"] == "segment_losing"]
    assert len(losing) == 1, received
    # the pages and `check` give the same verdict: the watched source's c is the run's declared cost
    from specmon.analysis import summary
    seg = summary.summarize(store, run="prod", per_position=False)[0]
    assert (seg["c"], seg["c_source"], seg["status"]) == (0.3, "declared", "losing")
    notice = losing[0]
    assert notice["run"] == "prod" and notice["status"] == "losing"
    assert notice["alpha_hi"] < notice["break_even"]
    assert notice["link"].startswith("http://127.0.0.1:8501/")
    w.poll_once()  # nothing new: nothing sent again
    restarted = Watcher(store, config, log=lambda s: None)
    with open(log, "a") as fh:
        fh.write(v1_line(800, 100, [20, 5, 1])[0])
    restarted.poll_once()
    restarted.outbox.close()
    assert len([r for r in received if r["event"] == "segment_losing"]) == 1


def test_the_config_file_names_sources_and_bad_ones_are_clear(tmp_path):
    cfg = tmp_path / "watch.toml"
    cfg.write_text('interval = 0.5\nwebhook = "http://127.0.0.1:1/x"\n[[log]]\npath = "a.log"\nrun = "prod"\n'
                   'template = "v7"\nc = 0.1\n[[prometheus]]\nurl = "http://127.0.0.1:9090"\nstep = 30\n')
    config = load_config(str(cfg))
    assert config.interval_s == 0.5 and config.webhook == "http://127.0.0.1:1/x"
    assert [(s.kind, s.location, s.run_name, s.template, s.c) for s in config.sources] == [
        ("log", "a.log", "prod", "v7", 0.1), ("prometheus", "http://127.0.0.1:9090", "prometheus", None, None)]
    cfg.write_text('[[log]]\nrun = "x"\n')
    with pytest.raises(SpecmonError, match=r"\[\[log\]\] #1: needs path"):
        load_config(str(cfg))
    cfg.write_text('[[log]]\npath = "a"\nc = "high"\n')
    with pytest.raises(SpecmonError, match="c must be a number"):
        load_config(str(cfg))
    cfg.write_text("[[log]\n")
    with pytest.raises(SpecmonError, match="not valid TOML"):
        load_config(str(cfg))


def test_the_sources_page_lists_sources_and_flags_a_stale_one(tmp_path, monkeypatch):
    db = str(tmp_path / "app.duckdb")
    monkeypatch.setenv("SPECMON_DB", db)
    log = tmp_path / "vllm.log"
    log.write_text(v1_line(0, 10, [5, 3, 1])[0])
    store = Store(db)
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod")],
                                               stale_after_s=0.5), log=lambda s: None)
    w.poll_once()
    time.sleep(1.0)
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    at.switch_page("specmon/ui/views/sources.py").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["location"]) == [str(log)] and list(table["status"]) == ["stale"]
    shown = [w.value.replace("\\", "").replace("\u2060", "") for w in at.warning]  # names arrive escaped
    assert any("Stale" in w and str(log) in w for w in shown), shown


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_serve_watch_runs_the_watcher_beside_the_dashboard_and_stops_with_it(tmp_path):
    import socket
    import urllib.request

    db, log = str(tmp_path / "w.duckdb"), tmp_path / "vllm.log"
    log.write_text("")
    cfg = tmp_path / "watch.toml"
    cfg.write_text(f'interval = 0.2\n[[log]]\npath = "{log}"\nrun = "prod"\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = subprocess.Popen([sys.executable, "-m", "specmon", "serve", "--db", db, "--port", str(port),
                              "--watch", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def healthy() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok"
            except OSError:
                return False
        until(healthy, 90, "the dashboard")
        line, acc, drafted = v1_line(0, 10, [5, 3, 1])
        with open(log, "a") as fh:
            fh.write(line)
        until(lambda: totals(Store(db)) == (acc, drafted), 60, "the watched line")
        serve.send_signal(signal.SIGTERM)
        out, _ = serve.communicate(timeout=60)
    finally:
        if serve.poll() is None:
            serve.kill()
    assert serve.returncode in (0, 128 + signal.SIGTERM), out
    assert "watching 1 source(s)" in out and "stopped" in out
    with socket.socket() as s:  # nothing listens on the port any more (closed connections may linger)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_serve_watch_with_a_bad_file_is_a_clear_error(tmp_path):
    cfg = tmp_path / "watch.toml"
    cfg.write_text("[[log]]\n")
    done = subprocess.run([sys.executable, "-m", "specmon", "serve", "--db", str(tmp_path / "w.duckdb"),
                           "--watch", str(cfg)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs path" in done.stderr and "Traceback" not in done.stderr
