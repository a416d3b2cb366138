"""Several specmon processes on one database: nobody holds the file longer than one operation."""
import subprocess

import pytest
from holding import hold_database

from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

GOOD = '{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1}\n'


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_an_open_store_locks_nobody_out(tmp_path, specmon_cmd):
    db = str(tmp_path / "x.duckdb")
    log = tmp_path / "a.jsonl"
    log.write_text(GOOD)
    with Store(db) as dashboard:  # the dashboard's Store, kept for the life of its process
        dashboard.query("SELECT count(*) FROM runs")
        for args in (["ingest", str(log)], ["summary", "--no-demo"], ["check", "--c", "0.1"]):
            done = subprocess.run([*specmon_cmd, *args, "--db", db], capture_output=True, text=True, timeout=120)
            assert "Conflicting lock" not in done.stderr and "waiting" not in done.stderr, done.stderr
            assert done.returncode in (0, 1), done.stderr
        assert dashboard.query("SELECT count(*) FROM steps")[0][0] == 1


def test_a_writer_waits_for_another_process_and_says_so(tmp_path, specmon_cmd):
    db = str(tmp_path / "x.duckdb")
    Store(db)
    log = tmp_path / "a.jsonl"
    log.write_text(GOOD)
    holder = hold_database(db, 120.0)
    ingest = subprocess.Popen([*specmon_cmd, "ingest", str(log), "--db", db], stderr=subprocess.PIPE, text=True)
    first = ingest.stderr.readline()  # it waits, says so once, and goes on when the lock is released
    assert "waiting for the database" in first
    holder.communicate("release\n")
    _, rest = ingest.communicate(timeout=120)
    assert ingest.returncode == 0, first + rest
    assert Store(db).query("SELECT count(*) FROM steps")[0][0] == 1


def test_the_wait_is_bounded(tmp_path, specmon_cmd):
    db = str(tmp_path / "x.duckdb")
    Store(db)
    holder = hold_database(db, 8.0)
    done = subprocess.run([*specmon_cmd, "summary", "--db", db, "--lock-timeout", "1"], capture_output=True,
                          text=True, timeout=120)
    holder.kill()
    assert done.returncode == 2
    assert "still locked by another process after 1 s" in done.stderr
    assert "Traceback" not in done.stderr


def test_readers_and_a_writer_in_one_process_do_not_collide(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    db = str(tmp_path / "x.duckdb")
    store = Store(db)
    paths = []
    for i in range(6):
        p = tmp_path / f"f{i}.jsonl"
        p.write_text(GOOD.replace('"a"', f'"r{i}"'))
        paths.append(str(p))

    def work(i: int):
        if i % 2:
            return ingest_file(store, paths[i // 2]).status
        return store.query("SELECT count(*) FROM steps")[0][0]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(12)))
    assert store.query("SELECT count(*) FROM steps")[0][0] == 6
