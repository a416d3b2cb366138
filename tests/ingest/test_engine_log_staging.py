"""An engine log is parsed into a staging file, a batch of windows at a time, before the publishing transaction:
the database stays open to other processes while it is read, and what is stored is what the whole-file reader
finds."""
import subprocess

from paths import DATA

from specmon.ingest.formats import engine_log
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

REAL = (DATA / "engines" / "vllm-v1-current-1.log").read_bytes()


def test_another_process_reads_the_database_while_an_engine_log_is_parsed(tmp_path, specmon_cmd, monkeypatch):
    monkeypatch.setattr(engine_log, "BATCH_LINES", 200)
    db = str(tmp_path / "t.duckdb")
    store = Store(db)
    log = tmp_path / "server.log"
    log.write_bytes(REAL * 100)
    summaries: list[subprocess.CompletedProcess] = []

    def while_reading(done: int, total: int) -> None:
        if done < total and not summaries:  # mid-file: a real second process asks for the summary
            summaries.append(subprocess.run([*specmon_cmd, "summary", "--db", db, "--lock-timeout", "5"],
                                            capture_output=True, text=True, timeout=120))

    res = ingest_file(store, str(log), progress=while_reading)
    assert res.status == "stored"
    (summary,) = summaries
    assert summary.returncode == 0, summary.stderr
    assert "still locked" not in summary.stderr


def test_batches_store_what_the_whole_file_reader_finds(store, tmp_path, monkeypatch):
    """Batches of 7 lines fall inside the pairs of load and speculative lines: a pair split across two batches is
    still one window."""
    log = tmp_path / "server.log"
    log.write_bytes(REAL * 3)
    whole, faults = engine_log.read(str(log), "server.log")
    assert faults == [] and len(whole) > 10
    monkeypatch.setattr(engine_log, "BATCH_LINES", 7)
    assert ingest_file(store, str(log)).steps == len(whole)
    stored = store.query("SELECT line, drafts, draft_tokens, accepted_tokens, running_requests FROM engine_windows "
                         "ORDER BY window_id")
    assert stored == [(w.line, w.drafts, w.draft_tokens, w.accepted_tokens, w.running_requests) for w in whole]
    assert not list(tmp_path.glob("*.stage-*"))  # the staging file is gone once published
