"""Whatever ends a process, it leaves nothing behind: `specmon ingest -` removes its spooled copy on SIGTERM, SIGINT
or an exception, and the next ingest sweeps the copy of one killed outright; `specmon serve` ends on a signal with
its status and leaves no bound port, and beside a watcher (where Streamlit runs as its child) forwards the signal,
waits for the child and takes it along when killed outright. All with real processes."""
import contextlib
import ctypes
import errno
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from waiting import running, until

from specmon.ingest import pipeline
from specmon.store.database import Store

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and uses PR_SET_PDEATHSIG")
LINE = b'{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1}\n'


@pytest.fixture
def started():
    """Popen for the test's processes: whatever the test's outcome, each one still running at its end is killed,
    with its children (a failed assertion would otherwise leave a dashboard serving and a watcher polling)."""
    procs: list[subprocess.Popen] = []

    def start(*args, **kwargs) -> subprocess.Popen:
        procs.append(subprocess.Popen(*args, **kwargs))
        return procs[-1]

    yield start
    for proc in procs:
        kids: list[int] = []
        if proc.poll() is None:
            with contextlib.suppress(FileNotFoundError):  # it may end in between
                kids = children(proc.pid)
            proc.kill()
            for kid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(kid, signal.SIGKILL)
        proc.communicate()


def as_from_a_terminal() -> None:
    """Run in the child before exec: SIGINT as a terminal's Ctrl-C delivers it, even when the test run itself was
    started in the background (which makes its children ignore SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spools(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{pipeline.SPOOL_PREFIX}*"))


def start_ingest(started, specmon_cmd, tmp_path):
    """`specmon ingest -` with its temp folder in tmp_path, fed a little and then kept waiting for more."""
    folder = tmp_path / "tmp"
    folder.mkdir(exist_ok=True)
    proc = started([*specmon_cmd, "ingest", "--db", str(tmp_path / "s.duckdb"), "-"],
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   env={**os.environ, "TMPDIR": str(folder)}, preexec_fn=as_from_a_terminal)
    proc.stdin.write(LINE * 1000)
    proc.stdin.flush()
    until(lambda: spools(folder), what="the spooled copy")
    return proc, folder


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signalled_ingest_removes_its_spooled_copy(started, specmon_cmd, tmp_path, sig, code):
    proc, folder = start_ingest(started, specmon_cmd, tmp_path)
    assert spools(folder)[0].name.startswith(f"{pipeline.SPOOL_PREFIX}{proc.pid}-")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert b"rolled back" in err and b"Traceback" not in err
    assert spools(folder) == []


def test_the_spool_of_a_killed_ingest_is_swept_by_the_next(started, specmon_cmd, tmp_path):
    proc, folder = start_ingest(started, specmon_cmd, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    left = spools(folder)
    assert len(left) == 1  # SIGKILL cannot be caught
    # A spool of a process that is still running (this one) must survive the sweep.
    alive = folder / f"{pipeline.SPOOL_PREFIX}{os.getpid()}-busy"
    alive.write_bytes(b"in use")
    r = subprocess.run([*specmon_cmd, "ingest", "--db", str(tmp_path / "s.duckdb"), "-"], input=LINE,
                       capture_output=True, timeout=120, env={**os.environ, "TMPDIR": str(folder)})
    assert r.returncode == 0, r.stderr
    assert spools(folder) == [alive]


def test_an_ingest_that_fails_removes_its_spooled_copy(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    class Failing:
        """A stream that breaks after its first piece, as a dropped upload does."""
        def __init__(self):
            self.calls = 0

        def read(self, n=-1):
            self.calls += 1
            if self.calls > 1:
                raise ConnectionResetError("the client went away")
            return LINE

    with Store(str(tmp_path / "f.duckdb")) as store:
        with pytest.raises(ConnectionResetError):
            pipeline.ingest_stream(store, Failing(), "upload.jsonl")
    assert spools(tmp_path) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def port_free(port: int) -> bool:
    """Nothing listens on the port any more (a bind could still meet the closed connections' TIME_WAIT)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def start_serve(started, specmon_cmd, tmp_path, watch: bool):
    """`specmon serve`, with a watcher or without; returns the process, its child (the Streamlit server, which
    runs in a child only beside a watcher) or None, and the port."""
    port = free_port()
    extra = []
    if watch:
        (tmp_path / "empty.log").write_text("")
        (tmp_path / "watch.toml").write_text(f'interval = 0.2\n[[log]]\npath = "{tmp_path / "empty.log"}"\n')
        extra = ["--watch", str(tmp_path / "watch.toml")]
    proc = started([*specmon_cmd, "serve", "--db", str(tmp_path / "serve.duckdb"), "--demo", "--port", str(port),
                    *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal)

    def healthy():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok"
        except OSError:
            return False

    until(healthy, what="the dashboard")
    kids = children(proc.pid)
    assert len(kids) == (1 if watch else 0), kids
    return proc, kids[0] if watch else None, port


@pytest.mark.parametrize("watch", [False, True], ids=["serve", "serve --watch"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_ends_on_a_signal_and_leaves_no_child(started, specmon_cmd, tmp_path, sig, watch):
    proc, child, port = start_serve(started, specmon_cmd, tmp_path, watch)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err, err
    assert proc.returncode == 128 + sig, err
    assert child is None or not running(child)
    until(lambda: port_free(port), timeout=10, what="the port to be free")


_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())  # the syscall's number


@pytest.mark.skipif(not sys.platform.startswith("linux") or _TGKILL is None, reason="tgkill is Linux's")
def test_serve_watch_ends_when_the_signal_lands_on_the_watcher_thread(started, specmon_cmd, tmp_path):
    # The kernel may hand a process's signal to any of its threads; one taken by the watcher's thread must still
    # end serve (it once hung in a blocking wait for its child until a second signal came)
    proc, child, port = start_serve(started, specmon_cmd, tmp_path, watch=True)
    def takes_sigterm(task: Path) -> bool:  # not blocked there (allocators' own threads block every signal)
        try:
            status = (task / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):  # a short-lived thread that ended since the listing
            return False
        blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
        return not int(blocked.split()[1], 16) >> (signal.SIGTERM - 1) & 1

    threads: list[int] = []

    def listed() -> bool:
        threads[:] = [int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir()
                      if int(t.name) != proc.pid and takes_sigterm(t)]
        return bool(threads)

    # the watcher starts threads at every poll (DuckDB's), and a thread being started, or starting one, has every
    # signal blocked for a moment: a listing caught in such a moment on a loaded machine is taken again
    until(listed, timeout=10, what="a thread besides the main one that takes SIGTERM (the watcher's)")
    libc = ctypes.CDLL(None, use_errno=True)
    for tid in threads:  # one signal, to the first of them still running (ESRCH: a thread that ended since)
        if libc.syscall(_TGKILL, proc.pid, tid, int(signal.SIGTERM)) == 0:
            break
        assert ctypes.get_errno() == errno.ESRCH, ctypes.get_errno()
    else:
        pytest.fail("every thread that takes SIGTERM ended before the signal was sent")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert not running(child)
    until(lambda: port_free(port), timeout=10, what="the port to be free")


def test_serve_killed_outright_takes_its_child_along(started, specmon_cmd, tmp_path):
    proc, child, port = start_serve(started, specmon_cmd, tmp_path, watch=True)
    proc.kill()
    proc.communicate(timeout=60)
    try:
        until(lambda: not running(child), timeout=30, what="the orphaned child to end")
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)
    until(lambda: port_free(port), timeout=10, what="the port to be free")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_duckdb_query_ends_cleanly(started, specmon_cmd, tmp_path, sig, code):
    """A flat file is loaded by DuckDB itself, so the signal lands inside a query, where DuckDB turns the
    handler's exception into its own error: the exit status, the message and the rollback must not change."""
    big = tmp_path / "big.csv"
    duckdb.connect().execute(
        f"COPY (SELECT 'r' || (i // 200) AS request_id, i // 4 AS step, (i % 4) + 1 AS position, "
        f"i % 997 AS draft_token,"
        f" (i % 4) < 2 AS accepted FROM range(6000000) t(i)) TO '{big}' (HEADER)")
    db = tmp_path / "s.duckdb"
    proc = started([*specmon_cmd, "ingest", "--db", str(db), str(big)], stderr=subprocess.PIPE,
                   preexec_fn=as_from_a_terminal)
    until(lambda: db.exists(), what="the database")
    time.sleep(1.5)  # the load is under way in DuckDB by now
    assert proc.poll() is None, "the load ended before the signal; make the file larger"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert b"rolled back" in err and b"Traceback" not in err
    with Store(str(db)) as s:
        assert s.query("SELECT count(*) FROM ingests")[0][0] == 0
