"""One time parser: a naive ISO time means UTC wherever specmon reads it (step logs, transcripts, --since, --at),
whatever the machine's time zone."""
import json
import time
from datetime import datetime, timedelta

import pytest

from specmon.cli import main as cli
from specmon.core import times
from specmon.core.faults import SpecmonError
from specmon.ingest.pipeline import ingest_file

NAIVE = "2026-01-02T03:04:05"
UTC = datetime(2026, 1, 2, 3, 4, 5)


@pytest.fixture
def new_york(monkeypatch):
    """The process's local time zone is New York (UTC-5 in January) for the test."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    assert time.timezone == 5 * 3600
    yield
    monkeypatch.undo()
    time.tzset()


def test_naive_aware_and_epoch_times_are_utc(new_york):
    assert times.parse_iso(NAIVE) == UTC
    assert times.parse_iso(NAIVE + "Z") == UTC
    assert times.parse_iso("2026-01-01T22:04:05-05:00") == UTC
    assert times.parse_timestamp(1767323045) == UTC
    assert cli.parse_since(NAIVE) == UTC
    assert cli.parse_since("6h") == pytest.approx(times.utc_now() - timedelta(hours=6), abs=timedelta(seconds=5))
    with pytest.raises(SpecmonError, match="--since: 'yesterday'"):
        cli.parse_since("yesterday")
    with pytest.raises(TypeError):
        times.parse_timestamp(True)


def test_step_logs_and_transcripts_read_the_same_string_as_the_same_time(new_york, store, tmp_path):
    replay = pytest.importorskip("specmon.pair.replay")  # transcripts come with the live-run stack (torch)
    log = tmp_path / "s.jsonl"
    log.write_text(json.dumps({"request_id": "r", "draft_tokens": [1, 2], "accepted": 1, "ts": NAIVE}) + "\n")
    assert ingest_file(store, str(log)).status == "stored"
    assert store.query("SELECT ts FROM steps")[0][0] == UTC
    tr = tmp_path / "t.jsonl"
    tr.write_text(json.dumps({"prompt": "a", "completion": "b", "ts": NAIVE}) + "\n"
                  + json.dumps({"prompt": "a", "completion": "b", "ts": 1767323045}) + "\n")
    assert [t["ts"] for t in replay.read_transcripts(str(tr))] == [UTC, UTC]
    tr.write_text(json.dumps({"prompt": "a", "completion": "b", "ts": "noon"}) + "\n")
    with pytest.raises(SpecmonError, match=r"t\.jsonl:1.*ts.*'noon'"):
        replay.read_transcripts(str(tr))
