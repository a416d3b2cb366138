"""What is not a file: a named pipe is read once through a spool (a silent one is an error, not a wait), a device
such as /dev/zero is refused at once, and a stream that would fill the temporary folder stops with a message and
leaves nothing behind. Real pipes, real processes, a real small disk."""
import os
import subprocess
import sys

import pytest
from small_disk import small_disk

from specmon.ingest import pipeline
from specmon.store.database import Store

LINE = '{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1}\n'


def run(cmd, timeout=60, **kwargs):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def test_a_named_pipe_is_read_once_while_its_writer_writes(tmp_path, specmon_cmd):
    fifo = tmp_path / "steps.jsonl"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(1); open({str(fifo)!r}, 'w')"
                               f".write({LINE!r} * 3)"])
    done = run([*specmon_cmd, "ingest", "--db", str(tmp_path / "p.duckdb"), str(fifo)])
    writer.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    assert "stored 3 steps" in done.stdout and "in run 'steps'" in done.stdout


def test_a_named_pipe_nothing_writes_to_is_an_error_not_a_silent_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "PIPE_WRITER_WAIT_S", 0.5)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    fifo = tmp_path / "silent.jsonl"
    os.mkfifo(fifo)
    with Store(str(tmp_path / "s.duckdb")) as store:
        with pytest.raises(pipeline.SpecmonError, match="silent.jsonl: a named pipe that nothing wrote to in 0.5 s"):
            pipeline.ingest_file(store, str(fifo))
        assert store.query("SELECT count(*) FROM ingests")[0][0] == 0
    assert not list(tmp_path.glob(f"{pipeline.SPOOL_PREFIX}*"))


def test_a_device_is_refused_at_once(tmp_path, specmon_cmd):
    done = run([*specmon_cmd, "ingest", "--db", str(tmp_path / "d.duckdb"), "/dev/zero"], timeout=30)
    assert done.returncode == 2
    assert "/dev/zero: not a regular file (a socket or a device, which may never end)" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_stream_that_would_fill_the_temporary_folder_stops_and_leaves_nothing(tmp_path, specmon_cmd):
    """A pipe fed without end (`yes`) into `specmon ingest` with its temporary folder on a 16 MB disk: an error
    that names the stream, exit 2, and neither a spooled copy nor an ingest left."""
    with small_disk(tmp_path / "small", 16) as folder:
        db = str(tmp_path / "e.duckdb")
        feed = subprocess.Popen(["yes", LINE.strip()], stdout=subprocess.PIPE)
        done = run([*specmon_cmd, "ingest", "--db", db, "-"], stdin=feed.stdout,
                   env={**os.environ, "TMPDIR": str(folder)})
        feed.kill()
        feed.wait()
        assert done.returncode == 2, done.stderr
        assert "<stdin>: " in done.stderr and "nothing was stored" in done.stderr
        assert "Traceback" not in done.stderr
        assert os.listdir(folder) == []
    assert Store(db).query("SELECT count(*) FROM steps")[0][0] == 0
