"""A mistyped --db, a damaged database, a full disk, a folder that cannot be written: each command says so, naming
the file and what to do (exit 2, no traceback), and leaves nothing behind."""
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from small_disk import fill, small_disk
from waiting import until

from specmon.ingest import demo
from specmon.store.database import Store


def specmon(*args, cwd=None, prefix=()):
    env = {k: v for k, v in os.environ.items() if k != "SPECMON_DB"}
    return subprocess.run([*prefix, sys.executable, "-m", "specmon", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def a_step_log(tmp_path) -> Path:
    log = tmp_path / "steps.jsonl"
    shutil.copyfile(demo.DEMO_LOG, log)
    return log


def test_read_commands_on_a_missing_database_say_so_and_create_nothing(tmp_path):
    typo = tmp_path / "typo.duckdb"
    for command in ("summary", "check", "recommend", "serve"):
        r = specmon(command, "--db", str(typo))
        assert r.returncode == 2, (command, r.stderr)
        assert f"no database at {typo}: ingest a file into it first (specmon ingest --db {typo} FILE)" in r.stderr
        assert "Traceback" not in r.stderr
        assert list(tmp_path.iterdir()) == [], command  # not the file, not its write-ahead log, not a folder
    r = specmon("summary", "--db", str(tmp_path / "no" / "such" / "folder.duckdb"))
    assert r.returncode == 2 and not (tmp_path / "no").exists()


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_damaged_database_is_a_message_for_every_command(tmp_path):
    good = tmp_path / "good.duckdb"
    assert specmon("demo", "--db", str(good)).returncode == 0
    damaged = tmp_path / "damaged.duckdb"
    damaged.write_bytes(good.read_bytes()[:4096])  # a copy cut short: its first 4 KB
    log = a_step_log(tmp_path)
    for command in (["ingest", str(log)], ["summary"], ["check"], ["recommend"], ["watch", "--steplog", str(log)],
                    ["serve"]):
        r = specmon(*command, "--db", str(damaged))
        assert r.returncode == 2, (command, r.stderr)
        assert f"{damaged}: the database file is damaged or is not a DuckDB database" in r.stderr, command
        assert "restore it from a copy" in r.stderr and "Traceback" not in r.stderr


def test_a_directory_for_the_database_is_a_message(tmp_path):
    folder = tmp_path / "db.duckdb"
    folder.mkdir()
    log = a_step_log(tmp_path)
    for command in (["ingest", str(log)], ["summary"], ["check"], ["watch", "--log", str(log)], ["serve"]):
        r = specmon(*command, "--db", str(folder))
        assert r.returncode == 2 and f"{folder}: is a directory, not a database file" in r.stderr, r.stderr


def test_a_folder_that_cannot_take_the_staging_file_is_a_message(tmp_path):
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv, to run the command without the right to write a folder it does not own")
    folder = tmp_path / "readonly"
    folder.mkdir()
    db = folder / "db.duckdb"
    Store(str(db)).close()
    log = a_step_log(tmp_path)
    os.chmod(db, 0o666)  # the database may be written, its folder not: no room for the staging file
    os.chown(folder, 65534, 65534)
    os.chmod(folder, 0o755)
    # root without its capabilities obeys the folder's permissions like any user
    r = specmon("ingest", "--db", str(db), str(log), prefix=(setpriv, "--bounding-set=-all"))
    assert r.returncode == 2, r.stderr
    assert f"{db}: cannot write the database or the files it keeps beside it in {folder}" in r.stderr
    assert "make that folder writable" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["db.duckdb"]


def test_a_full_disk_during_ingest_is_a_message_and_nothing_is_half_stored(tmp_path):
    log = a_step_log(tmp_path)
    lines = len(log.read_bytes().splitlines())
    with small_disk(tmp_path / "disk", 20) as disk:
        db = disk / "s.duckdb"
        Store(str(db)).close()
        filler = fill(disk)
        r = specmon("ingest", "--db", str(db), "--run", "mine", str(log))
        assert r.returncode == 2, r.stderr
        assert f"the disk holding {db}" in r.stderr and "is full" in r.stderr and "free space there" in r.stderr
        assert "Traceback" not in r.stderr
        filler.unlink()
        r = specmon("ingest", "--db", str(db), "--run", "mine", str(log))
        assert r.returncode == 0, r.stderr
        with Store(str(db)) as store:
            assert store.query("SELECT count(*) FROM steps")[0][0] == lines
            assert store.query("SELECT count(*) FROM ingests")[0][0] == 1


def healthy(proc: subprocess.Popen, port: int) -> bool:
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok"
    except OSError:
        return False


def test_serve_starts_on_the_default_database_and_on_a_named_new_one_with_demo(tmp_path):
    """The dashboard's own default (./specmon.duckdb, no --db, no SPECMON_DB) is started with the demo data on first
    start, as is a named new file with --demo (the app fills an empty database: tests/ui); a named new file without
    --demo is refused above."""
    for extra in ([], ["--db", str(tmp_path / "named.duckdb"), "--demo"]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "SPECMON_DB"}
        proc = subprocess.Popen([sys.executable, "-m", "specmon", "serve", *extra, "--port", str(port)], cwd=tmp_path,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            until(lambda: healthy(proc, port), what=f"specmon serve {' '.join(extra)} answering")  # noqa: B023
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_a_wait_for_the_database_that_is_not_a_number_of_seconds_is_refused(tmp_path, specmon_cmd):
    """nan, inf or a negative wait, as --lock-timeout or SPECMON_LOCK_TIMEOUT, is an error naming what takes it
    (exit 2), never a wait without end."""
    db = tmp_path / "w.duckdb"
    Store(str(db)).close()
    for bad in ("nan", "inf", "-1", "abc"):
        flag = subprocess.run([*specmon_cmd, "summary", "--db", str(db), "--lock-timeout", bad], capture_output=True,
                              text=True, timeout=60)
        assert flag.returncode == 2 and "argument --lock-timeout" in flag.stderr, (bad, flag.stderr)
        env = subprocess.run([*specmon_cmd, "summary", "--db", str(db)], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "SPECMON_LOCK_TIMEOUT": bad})
        assert env.returncode == 2 and "SPECMON_LOCK_TIMEOUT=" in env.stderr, (bad, env.stderr)
        assert "Traceback" not in flag.stderr + env.stderr
