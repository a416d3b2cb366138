"""The watcher's outbox: a notice is kept until its receiver accepts it, through error answers, a receiver that
hangs, a SIGTERM and a restart, and given up (and shown) after the outbox's age. Real receivers over HTTP, real
watcher processes."""
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from engine_lines import watched_v1_line as v1_line
from paths import APP
from streamlit.testing.v1 import AppTest
from waiting import until

from specmon.analysis.sources import outbox_counts
from specmon.follow import outbox
from specmon.follow.config import SourceConfig, WatchConfig
from specmon.follow.watcher import Watcher
from specmon.store.database import Store


class Receiver:
    """A webhook receiver on a port of its own: answers `failing` (an HTTP status) until told otherwise, or holds
    every request without answering while `hang` is set."""

    def __init__(self, port: int = 0, failing: int | None = None, hang: bool = False):
        self.attempts: list[dict] = []  # every document POSTed, answered or not
        self.accepted: list[dict] = []
        self.failing = failing
        self.hang = threading.Event()
        self.release = threading.Event()
        if hang:
            self.hang.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.attempts.append(doc)
                if receiver.hang.is_set():
                    receiver.release.wait(60)
                    return
                status = receiver.failing or 204
                if status < 300:
                    receiver.accepted.append(doc)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(**kw) -> Receiver:
        made.append(Receiver(**kw))
        return made[-1]
    yield make
    for r in made:
        r.close()


def write_losing(log) -> None:
    """Acceptance that starts well and collapses below break-even (1 + k c = 1.9 tokens per step at c = 0.3) for two
    hours of windows (an hour is too short to call losing, with noise paired across half an hour of windows)."""
    with open(log, "a") as fh:
        for i in range(20):
            fh.write(v1_line(i, 100, [90, 80, 70])[0])
        for i in range(20, 800):
            fh.write(v1_line(i, 100, [20, 5, 1])[0])


def losing(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["event"] == "segment_losing"]


def rows(store: Store, event: str = "segment_losing") -> list[tuple]:
    """The outbox's rows of one event (the collapse also opens a drift alarm)."""
    return store.query("SELECT id, event, attempts, delivered_at IS NOT NULL, gave_up_at IS NOT NULL, last_error "
                       "FROM outbox WHERE event = ? ORDER BY created_at", [event])


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_receiver_answering_500_for_a_while_gets_the_notice_once_it_answers(tmp_path, receivers):
    recv = receivers(failing=500)
    log = tmp_path / "vllm.log"
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod", c=0.3)], webhook=recv.url,
                                   alarm_every_s=0), log=lambda s: None)
    write_losing(log)
    w.poll_once()
    until(lambda: len(losing(recv.attempts)) >= 2, 30, "a retry after the 500")
    assert not recv.accepted and rows(store)[0][3:5] == (False, False)
    assert rows(store)[0][5] == "HTTP 500 Internal Server Error"
    recv.failing = None
    until(lambda: losing(recv.accepted), 30, "the notice accepted")
    w.outbox.close()
    [(row_id, event, attempts, delivered, gave_up, error)] = rows(store)
    assert (event, delivered, gave_up, error) == ("segment_losing", True, False, None)
    assert attempts == len(losing(recv.attempts)) >= 3
    assert {d["id"] for d in losing(recv.attempts)} == {row_id}  # one id on every attempt: a receiver can dedupe
    assert [d["run"] for d in losing(recv.accepted)] == ["prod"]


def _watch(db: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specmon", "watch", "--db", db, "--interval", "0.2",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # two watcher processes, each analysing the run (about 25 s)
def test_a_notice_held_by_a_hanging_receiver_survives_sigterm_and_arrives_after_a_restart(tmp_path, receivers):
    hanging = receivers(hang=True)
    port = hanging.server.server_port
    db, log = str(tmp_path / "w.duckdb"), tmp_path / "vllm.log"
    log.write_text("")
    args = ("--log", str(log), "--run", "prod", "--c", "0.3", "--webhook", hanging.url)
    watcher = _watch(db, *args)
    try:
        write_losing(log)
        until(lambda: losing(hanging.attempts), 90, "the notice reaching the hanging receiver")
        watcher.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        out, _ = watcher.communicate(timeout=30)
        stopped_in = time.monotonic() - signalled
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0 and "stopped" in out, out
    assert stopped_in < 10, f"SIGTERM took {stopped_in:.1f} s with a hanging receiver"
    [(row_id, event, _, delivered, gave_up, _)] = rows(Store(db))
    assert (event, delivered, gave_up) == ("segment_losing", False, False)
    hanging.close()
    working = receivers(port=port)  # the receiver is back, where it was
    watcher = _watch(db, *args)
    try:
        until(lambda: losing(working.accepted), 60, "the pending notice after the restart")
        watcher.send_signal(signal.SIGTERM)
        out, _ = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert [d["id"] for d in losing(working.accepted)] == [row_id]
    assert rows(Store(db))[0][3] is True, out


def test_a_notice_never_accepted_is_given_up_after_the_outbox_age_and_shown(tmp_path, receivers, monkeypatch):
    recv = receivers(failing=503)
    db, log = str(tmp_path / "w.duckdb"), tmp_path / "vllm.log"
    lines: list[str] = []
    store = Store(db)
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod", c=0.3)], webhook=recv.url,
                                   alarm_every_s=0, outbox_max_age_s=1.0), log=lines.append)
    write_losing(log)
    w.poll_once()
    until(lambda: all(r[0] for r in store.query("SELECT gave_up_at IS NOT NULL FROM outbox")), 30,
          "every notice given up")
    w.outbox.close()
    assert not recv.accepted and losing(recv.attempts)
    assert any("gave up on segment_losing for run 'prod'" in line and "HTTP 503" in line for line in lines), lines
    given_up = len(store.query("SELECT id FROM outbox WHERE gave_up_at IS NOT NULL"))
    assert dict((ch, (p, u)) for ch, p, u in outbox_counts(store))["webhook"] == (0, given_up)
    monkeypatch.setenv("SPECMON_DB", db)
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    at.switch_page("specmon/ui/views/sources.py").run()
    assert not at.exception, at.exception
    shown = [e.value for e in at.error]
    assert any(f"{given_up} notice(s) undeliverable" in e for e in shown), shown
    assert any(recv.url in str(t.value["receiver"].tolist()) for t in at.dataframe), [t.value for t in at.dataframe]


def test_without_a_receiver_nothing_is_queued_and_no_thread_runs(tmp_path):
    log = tmp_path / "vllm.log"
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod", c=0.3)], alarm_every_s=0),
                log=lambda s: None)
    write_losing(log)
    w.poll_once()
    assert w.outbox is None and rows(store) == []
    assert store.query("SELECT state FROM watch_notices WHERE run = 'prod' AND subject LIKE 'status:%'") == [
        ("losing",)]



def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_delivery_timeout():
    """A timeout per read would let a receiver sending a byte every half second hold one delivery for minutes;
    the delivery has one deadline for all of it, and the row stays pending for a retry."""
    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "400")
            self.end_headers()
            for _ in range(400):
                self.wfile.write(b".")
                self.wfile.flush()
                time.sleep(0.5)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    answer: list[str | None] = []
    try:
        sender = threading.Thread(target=lambda: answer.append(
            outbox.post(f"http://127.0.0.1:{server.server_port}/hook", b"{}", timeout_s=2.0)), daemon=True)
        sender.start()
        sender.join(60)  # a guard far above the deadline: the trickle alone lasts 200 s
        assert answer == ["no complete answer within 2 s (the delivery timeout)"]
    finally:
        server.shutdown()
        server.server_close()
