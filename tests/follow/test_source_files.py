"""A followed source is its file, whatever the spelling; an inbox keeps every delivery; a watcher killed outright
leaves no temporary file; a full disk is a message and the watch goes on. Real files, real processes, a real small
disk."""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from small_disk import fill, small_disk
from test_watcher import totals, v1_line
from waiting import until

from specmon.follow import polls
from specmon.follow.config import SourceConfig, WatchConfig
from specmon.follow.positions import register
from specmon.follow.watcher import Watcher
from specmon.ingest import demo
from specmon.store.database import Store


def write_lines(log: Path, first: int, count: int) -> tuple[int, int]:
    """Append `count` engine lines; returns the accepted and drafted tokens they hold."""
    acc_sum = drafted_sum = 0
    with open(log, "a") as fh:
        for i in range(first, first + count):
            line, acc, drafted = v1_line(i, 50 + i % 7, [40, 20 + i % 5, 10])
            fh.write(line)
            acc_sum, drafted_sum = acc_sum + acc, drafted_sum + drafted
    return acc_sum, drafted_sum


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_one_file_under_several_spellings_is_followed_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "a.log"
    want = write_lines(log, 0, 20)
    os.symlink(log, tmp_path / "link.log")
    os.link(log, tmp_path / "hard.log")
    spellings = ["a.log", "./a.log", str(log), str(tmp_path / "link.log"), str(tmp_path / "hard.log")]
    store = Store(str(tmp_path / "w.duckdb"))
    lines: list[str] = []
    w = Watcher(store, WatchConfig([SourceConfig("log", s, run="prod") for s in spellings], interval_s=0.1,
                                   alarm_every_s=3600),
                log=lines.append)
    assert [s.location for s in w.config.sources] == ["a.log"]
    merged = [x for x in lines if "followed once" in x]
    assert len(merged) == 4 and all(f"as log:{log}" in x for x in merged), lines
    while w.poll_once():
        pass
    w.poll_once()
    assert totals(store) == want
    assert store.query("SELECT source_key FROM watch_sources") == [(f"log:{log}",)]


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_restart_with_another_spelling_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "a.log"
    first = write_lines(log, 0, 30)
    store = Store(str(tmp_path / "w.duckdb"))
    Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod")]), log=lambda s: None).poll_once()
    assert totals(store) == first
    second = write_lines(log, 30, 30)
    Watcher(store, WatchConfig([SourceConfig("log", "./a.log", run="prod")]), log=lambda s: None).poll_once()
    assert totals(store) == (first[0] + second[0], first[1] + second[1])
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 60


def test_a_source_stored_under_its_spelling_carries_its_position_to_the_resolved_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "a.log"
    first = write_lines(log, 0, 30)
    store = Store(str(tmp_path / "w.duckdb"))
    Watcher(store, WatchConfig([SourceConfig("log", "a.log", run="prod")]), log=lambda s: None).poll_once()
    with store.transaction() as cur:  # as a database written when the key was the path as given
        cur.execute("UPDATE watch_sources SET source_key = 'log:a.log'")
    second = write_lines(log, 30, 10)
    Watcher(store, WatchConfig([SourceConfig("log", "a.log", run="prod")]), log=lambda s: None).poll_once()
    assert totals(store) == (first[0] + second[0], first[1] + second[1])
    assert store.query("SELECT source_key, rows FROM watch_sources") == [(f"log:{log}", 40)]


def steps_file(folder: Path, name: str, accepted: int) -> None:
    (folder / name).write_text(f'{{"request_id": "r{accepted}", "draft_tokens": [1, 2], "accepted": {accepted}}}\n')


def test_an_inbox_keeps_every_delivery_of_one_name(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("inbox", str(inbox), run="batch")], alarm_every_s=3600),
                log=lambda s: None)
    for accepted in (0, 1, 2):  # three different files, one after another, all named steps.jsonl
        steps_file(inbox, "steps.jsonl", accepted)
        w.poll_once()
        w.poll_once()
    steps_file(inbox, "bad.jsonl", 9)
    w.poll_once()
    w.poll_once()
    steps_file(inbox, "bad.jsonl", 8)
    w.poll_once()
    w.poll_once()
    assert store.query("SELECT count(*) FROM steps")[0][0] == 3
    done = sorted(p.name for p in (inbox / "done").iterdir())
    assert done == ["steps-1.jsonl", "steps-1.jsonl.report.json", "steps-2.jsonl", "steps-2.jsonl.report.json",
                    "steps.jsonl", "steps.jsonl.report.json"]
    kept = {(inbox / "done" / n).read_text() for n in done if not n.endswith(".report.json")}
    assert len(kept) == 3
    rejected = sorted(p.name for p in (inbox / "rejected").iterdir())
    assert rejected == ["bad-1.jsonl", "bad-1.jsonl.report.json", "bad.jsonl", "bad.jsonl.report.json"]
    assert (inbox / "rejected" / "bad.jsonl").read_text() != (inbox / "rejected" / "bad-1.jsonl").read_text()


def _poll_twice(store, source, logged, seen) -> None:
    polls.poll_inbox(store, source, logged.append, seen)  # seen once
    polls.poll_inbox(store, source, logged.append, seen)  # taken


@pytest.mark.parametrize("when", ["storing", "after the commit"])
def test_an_inbox_file_replaced_while_it_is_taken_is_stored_and_so_is_its_replacement(tmp_path, monkeypatch, when):
    """A file replaced (mv) under its inbox name while a poll reads it, or between the commit and the move to done/:
    the file taken is what is stored and what done/ keeps, and the new delivery stays in the inbox and is stored
    at a later poll, beside it in done/; nothing is lost or moved unread."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    steps_file(inbox, "steps.jsonl", 1)
    steps_file(tmp_path, "next.jsonl", 2)
    store = Store(str(tmp_path / "w.duckdb"))
    read = polls.ingest_file

    def replace_once() -> None:
        if (tmp_path / "next.jsonl").exists():
            os.replace(tmp_path / "next.jsonl", inbox / "steps.jsonl")

    def ingest_then_replace(*args, **kwargs):  # the real ingest; the inbox name replaced at `when`
        result = read(*args, **kwargs, stage=lambda what: what == when and replace_once())
        if when == "after the commit":
            replace_once()
        return result

    monkeypatch.setattr(polls, "ingest_file", ingest_then_replace)
    logged: list[str] = []
    source, seen = SourceConfig("inbox", str(inbox), run="batch"), {}
    register(store, source, 300)
    _poll_twice(store, source, logged, seen)
    assert not (tmp_path / "next.jsonl").exists()
    assert store.query("SELECT request_id, accepted FROM steps") == [("r1", 1)]
    assert '"accepted": 2' in (inbox / "steps.jsonl").read_text(), "the new delivery waits in the inbox"
    assert '"accepted": 1' in (inbox / "done" / "steps.jsonl").read_text(), "done/ keeps the file stored"
    assert any("a new file arrived under this name" in line for line in logged)
    _poll_twice(store, source, logged, seen)
    assert sorted(store.query("SELECT request_id, accepted FROM steps")) == [("r1", 1), ("r2", 2)]
    assert '"accepted": 2' in (inbox / "done" / "steps-1.jsonl").read_text()
    assert not any((inbox / "rejected").iterdir())
    assert sorted(p.name for p in inbox.iterdir()) == ["done", "rejected"], "no held name left behind"


def test_an_inbox_file_written_to_while_it_is_read_stays_and_its_final_content_is_stored(tmp_path, monkeypatch):
    """A file written to in place while a poll reads it is not bad content: it stays in the inbox, and the content
    it then holds is stored at a later poll; rejected/ holds nothing."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    steps_file(inbox, "steps.jsonl", 1)
    store = Store(str(tmp_path / "w.duckdb"))
    read = polls.ingest_file
    grown: list[bool] = []

    def ingest_appended_once(*args, **kwargs):  # the real ingest; a line appended to the file once it is hashed
        def append_once(what: str) -> None:
            if what == "storing" and not grown:
                grown.append(True)
                with open(inbox / "steps.jsonl", "a") as fh:
                    fh.write((inbox / "steps.jsonl").read_text().replace('"r1"', '"r3"'))
        return read(*args, **kwargs, stage=append_once)

    monkeypatch.setattr(polls, "ingest_file", ingest_appended_once)
    logged: list[str] = []
    source, seen = SourceConfig("inbox", str(inbox), run="batch"), {}
    register(store, source, 300)
    _poll_twice(store, source, logged, seen)
    assert (inbox / "steps.jsonl").exists() and store.query("SELECT count(*) FROM steps")[0][0] == 0
    assert any("changed while it was read" in line for line in logged)
    _poll_twice(store, source, logged, seen)
    assert sorted(store.query("SELECT request_id FROM steps")) == [("r1",), ("r3",)]
    assert sorted(p.name for p in (inbox / "done").iterdir()) == ["steps.jsonl", "steps.jsonl.report.json"]
    assert not any((inbox / "rejected").iterdir())
    assert sorted(p.name for p in inbox.iterdir()) == ["done", "rejected"]


def test_a_held_name_left_by_a_killed_watcher_is_put_back(tmp_path):
    """A watcher killed while taking a file leaves its held name: where the inbox name still names the file it is
    dropped, else (the inbox name replaced meanwhile) the held file is put back under a free name and stored."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    steps_file(inbox, "steps.jsonl", 1)
    os.link(inbox / "steps.jsonl", inbox / ".specmon-taking-steps.jsonl")  # killed while taking it
    steps_file(tmp_path, "other.jsonl", 2)
    os.link(tmp_path / "other.jsonl", inbox / ".specmon-taking-late.jsonl")  # killed after its name was replaced
    store = Store(str(tmp_path / "w.duckdb"))
    source, seen, logged = SourceConfig("inbox", str(inbox), run="batch"), {}, []
    register(store, source, 300)
    _poll_twice(store, source, logged, seen)
    assert sorted(store.query("SELECT request_id FROM steps")) == [("r1",), ("r2",)]
    assert sorted(p.name for p in (inbox / "done").iterdir() if not p.name.endswith(".json")) == \
        ["late.jsonl", "steps.jsonl"]
    assert sorted(p.name for p in inbox.iterdir()) == ["done", "rejected"]


def test_a_marker_file_named_like_the_inbox_folders_is_left_alone(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "done").write_text("finished for today\n")
    (inbox / "rejected").write_text("")
    steps_file(inbox, "steps.jsonl", 1)
    store = Store(str(tmp_path / "w.duckdb"))
    lines: list[str] = []
    w = Watcher(store, WatchConfig([SourceConfig("inbox", str(inbox))]), log=lines.append)
    w.poll_once()
    w.poll_once()
    assert store.query("SELECT status, rows FROM watch_sources") == [("ok", 1)]
    assert (inbox / "done").read_text() == "finished for today\n"  # not ingested, not moved
    assert (inbox / "specmon-done" / "steps.jsonl").exists()
    assert any(f"{inbox / 'done'} is a file, not a folder: done files go to {inbox / 'specmon-done'}" in x
               for x in lines), lines
    assert not any("failing" in x for x in lines), lines


def _watch(db: str, out: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specmon", "watch", "--db", db, "--interval", "0.2", *args],
                            stdout=open(out, "a"), stderr=subprocess.STDOUT, text=True, env=env)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_watcher_killed_outright_leaves_no_temporary_file(tmp_path):
    steps = tmp_path / "steps.jsonl"
    shutil.copyfile(demo.DEMO_LOG, steps)
    lines = len(steps.read_bytes().splitlines())
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    db, out = str(tmp_path / "w.duckdb"), tmp_path / "watch.out"
    for _ in range(10):  # a busy machine may let the piece be stored before the kill lands: then start over
        for stale in (db, db + ".wal"):
            Path(stale).unlink(missing_ok=True)
        Store(db).close()
        watcher = _watch(db, out, "--steplog", str(steps), "--run", "s", env=env)
        until(lambda: any(temp.iterdir()), every=0.001, what="a piece of the step log in a temporary file")
        watcher.send_signal(signal.SIGSTOP)  # frozen, so what is there now is what kill -9 leaves
        left = [p.name for p in temp.iterdir()]
        watcher.kill()
        watcher.wait()
        if left:
            break
    assert left and all(f"-{watcher.pid}-" in name for name in left)  # what a killed watcher leaves behind
    assert [p.name for p in temp.iterdir()] == left
    again = _watch(db, out, "--steplog", str(steps), "--run", "s", env=env)
    try:
        until(lambda: Store(db).query("SELECT count(*) FROM steps")[0][0] == lines, what="every step stored")
        assert not any(f"-{watcher.pid}-" in p.name for p in temp.iterdir())
        assert not list(tmp_path.glob(f"w.duckdb.stage-{watcher.pid}-*"))  # nor a staging file beside the database
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=60)
    assert again.returncode == 0
    assert list(temp.iterdir()) == []


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_full_disk_is_a_failing_source_and_the_watch_resumes_exactly_when_space_returns(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("")
    out = tmp_path / "watch.out"
    with small_disk(tmp_path / "disk", 20) as disk:
        db = str(disk / "w.duckdb")
        Store(db).close()
        watcher = _watch(db, out, "--log", str(log), "--run", "prod")
        try:
            acc, drafted = write_lines(log, 0, 50)
            until(lambda: totals(Store(db)) == (acc, drafted), what="the first lines stored")
            filler = fill(disk)
            more = write_lines(log, 50, 200)
            until(lambda: f"log:{log}: failing: the disk holding {db} is full" in out.read_text(),
                  what="the source failing on the full disk")
            assert watcher.poll() is None, out.read_text()  # still running
            assert "retry in" in out.read_text()
            filler.unlink()
            want = (acc + more[0], drafted + more[1])
            until(lambda: totals(Store(db)) == want, timeout=120, what="every line stored once space returned")
            assert "delivering again" in out.read_text()
            assert Store(db).query("SELECT count(*) FROM engine_windows")[0][0] == 250
        finally:
            watcher.send_signal(signal.SIGTERM)
            watcher.wait(timeout=60)
        assert watcher.returncode == 0, out.read_text()
        assert "Traceback" not in out.read_text()
