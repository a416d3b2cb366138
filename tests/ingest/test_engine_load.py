"""The load engine logs print beside their speculative figures (requests running and waiting, throughput): vLLM's
load line paired with the speculative line of its engine and interval, a load line alone as a window without
speculation, SGLang's Decode batch lines, faults, and the reader resumed from its state."""
import json
from datetime import datetime

import pytest
from engine_lines import (
    REAL_SGLANG_LOAD,
    REAL_SGLANG_OLD,
    REAL_V0_LOAD,
    REAL_V1_DP,
    REAL_V1_LOAD_ALONE,
)

from specmon.analysis import engine_label, engine_segments
from specmon.analysis.summary import summarize
from specmon.drift import alarms
from specmon.ingest.formats.engine_log import EngineLogReader, vllm_load
from specmon.ingest.pipeline import detect_format, ingest_file

NOW = datetime(2026, 11, 30, 12, 0)
# an access line of the same server log (tests/data/engines/vllm-v1-current-1.log)
NOISE_START = '(APIServer pid=1) INFO:     172.18.0.3:59734 - "POST /v1/chat/completions HTTP/1.1" 200 OK'


def read(lines: list[str]):
    r = EngineLogReader("x.log", NOW)
    for no, line in enumerate(lines, start=1):
        r.feed(no, line)
    r.finish()
    return r.take()


def write(tmp_path, name: str, lines: list[str]) -> str:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def later(line: str, seconds: int) -> str:
    """The same line ten seconds on (the next interval of the same engine)."""
    return line.replace("14:28:09", f"14:28:{9 + seconds:02d}")


def test_data_parallel_engines_pair_each_speculative_line_with_its_own_load_line():
    lines = REAL_V1_DP + [later(line, 10) for line in REAL_V1_DP]
    windows, faults = read(lines)
    assert not faults and len(windows) == 4
    first, second = windows[:2]
    assert (first.labels["engine"], first.drafts, first.generation_throughput, first.prompt_throughput) == \
        ("000", 22, 16.0, 0.4)
    assert (second.labels["engine"], second.drafts, second.generation_throughput) == ("001", 15, 15.9)
    assert first.running_requests == 0 and first.waiting_requests == 0
    # each engine keeps its own clock: engine 1's window does not start at engine 0's line of the same second
    at = datetime(2026, 9, 1, 14, 28, 9)
    assert [w.start_ts for w in windows] == [None, None, at, at]
    assert [w.labels["engine"] for w in windows] == ["000", "001", "000", "001"]


def test_the_windows_frames_keep_data_parallel_engines_apart(store, tmp_path):
    path = write(tmp_path, "dp.log", REAL_V1_DP + [later(line, 10) for line in REAL_V1_DP])
    assert ingest_file(store, path, run="dp").status == "stored"
    assert sorted(engine_label.of_labels(engine_segments.windows(store, "dp")["labels"])) == ["000", "000", "001",
                                                                                            "001"]
    assert sorted(engine_segments.checked_windows(store, "dp")["engine_label"]) == ["000", "000", "001", "001"]


def test_a_load_line_without_a_speculative_line_is_a_window_with_the_load_alone(store, tmp_path):
    path = write(tmp_path, "baseline.log", [NOISE_START, REAL_V1_LOAD_ALONE])
    assert detect_format(path) == "engine-log"  # a log of load lines alone is read
    res = ingest_file(store, path, run="off")
    assert res.status == "stored" and res.steps == 1
    assert any("load alone in 1" in note for note in res.notes)
    row = store.query("SELECT drafts, draft_tokens, accepted_tokens, mean_acceptance_length, running_requests, "
                      "waiting_requests, generation_throughput, prompt_throughput, labels->>'engine' "
                      "FROM engine_windows")
    assert row == [(None, None, None, None, 2.0, 8.0, 0.1, 6400.2, "000")]
    seg, = summarize(store)
    assert seg["steps"] == 0 and seg["alpha"] is None and seg["tokens_per_step"] is None
    assert seg["note"] == engine_segments.LOAD_ONLY_NOTE
    # the detector has nothing to watch in it
    assert alarms.analyse_run(store, "off").design is None


def test_windows_with_the_load_alone_leave_the_acceptance_figures_as_they_were(store, tmp_path):
    spec = write(tmp_path, "on.log", REAL_V1_DP[:2])
    mixed = write(tmp_path, "mixed.log", REAL_V1_DP[:2] + [REAL_V1_LOAD_ALONE])
    ingest_file(store, spec, run="on")
    ingest_file(store, mixed, run="mixed")
    rows = {r["run"]: r for r in summarize(store, by="run")}
    on, with_load = rows["on"], rows["mixed"]
    keys = ("alpha", "tokens_per_step", "steps", "drafted", "accepted", "windows", "k")
    assert {k: on[k] for k in keys} == {k: with_load[k] for k in keys}


def test_a_speculative_line_that_is_a_fault_takes_its_load_line_with_it(store, tmp_path):
    bad = REAL_V1_DP[1].replace("Accepted: 17 tokens", "Accepted: lots")
    path = write(tmp_path, "bad.log", [REAL_V1_DP[0], bad])
    res = ingest_file(store, path)
    assert res.status == "rejected" and (res.faults[0].line, res.faults[0].field) == (2, "Accepted")
    res = ingest_file(store, path, skip_bad=True, report_path=str(tmp_path / "r.jsonl"))
    # no window with the load alone, which would pass for an interval without speculation
    assert res.status == "stored" and res.steps == 0


@pytest.mark.parametrize("change,field", [("Running: 0 reqs", "Running: many reqs"),
                                          ("Avg generation throughput: 16.0", "Avg generation throughput: -1.0")])
def test_a_load_line_with_a_bad_field_is_a_fault_naming_it(store, tmp_path, change, field):
    path = write(tmp_path, "bad.log", [NOISE_START, REAL_V1_DP[0].replace(change, field)])
    res = ingest_file(store, path)
    assert res.status == "rejected" and res.faults[0].line == 2
    assert res.faults[0].field == field.split(":")[0] and "load line" in res.faults[0].reason


def test_load_fields_are_read_by_name_in_every_release_shape():
    # n/a where a figure is not available, fields added after Waiting, the aggregated logger's label
    line = REAL_V1_DP[0].replace("Waiting: 0 reqs", "Waiting: n/a, Deferred: 1 reqs, Preemptions: 2")
    assert vllm_load(line) == ("000", 0.0, None, 16.0, 0.4, "vllm-v1-log")
    aggregated = REAL_V1_DP[0].replace("Engine 000:", "2 Engines Aggregated:")
    assert vllm_load(aggregated)[0] == "2 engines aggregated"
    early = REAL_V1_DP[0].split("Engine 000: ", 1)[1]  # the first V1 releases printed no engine label
    assert vllm_load(early)[:2] == ("", 0.0)


def test_vllm_v0_load_lines_pair_with_the_speculative_metrics_after_them():
    (w,), faults = read(REAL_V0_LOAD)
    assert not faults
    # 'Number of draft tokens tokens' (vLLM 0.5): 42272 / 16 drafts, every step emitted one token
    assert (w.source, w.drafts, w.accepted_tokens, w.k) == ("vllm-v0-log", 2642, 0, 16)
    assert (w.running_requests, w.waiting_requests, w.generation_throughput, w.prompt_throughput) == \
        (2, 0, 127.4, 558.7)  # Pending is V0's waiting


def test_sglang_decode_lines_carry_their_load_with_or_without_accept_len():
    (alone, spec), faults = read([REAL_SGLANG_LOAD, REAL_SGLANG_OLD])
    assert not faults
    assert alone.load_only and (alone.running_requests, alone.waiting_requests, alone.generation_throughput) == \
        (8, 0, 186.64)
    assert spec.mean_acceptance_length == 2.17 and spec.generation_throughput == 0.39
    ranked, = read([REAL_SGLANG_LOAD.replace("TP0]", "DP3 TP3]")])[0]
    assert ranked.labels["engine"] == "DP3"


def test_a_load_line_waits_for_its_speculative_line_across_a_resumed_read():
    lines = [REAL_V1_LOAD_ALONE.replace("12:32:37", "12:32:27"), REAL_V1_DP[0], REAL_V1_DP[1]]
    expected = read(lines)
    for cut in range(len(lines) + 1):
        first = EngineLogReader("x.log", NOW)
        for no, line in enumerate(lines[:cut], start=1):
            first.feed(no, line)
        got = first.take()
        second = EngineLogReader("x.log", NOW, state=json.loads(json.dumps(first.state())))
        for no, line in enumerate(lines[cut:], start=cut + 1):
            second.feed(no, line)
        second.finish()
        more = second.take()
        assert (got[0] + more[0], got[1] + more[1]) == expected, f"split after line {cut}"


def test_a_baseline_log_is_declared_the_baseline_of_its_run(store, tmp_path):
    path = write(tmp_path, "off.log", [REAL_V1_LOAD_ALONE])
    assert ingest_file(store, path, run="off", baseline_of="prod").status == "stored"
    assert store.query("SELECT r.name, o.name FROM baselines b JOIN runs r ON r.run_id = b.run_id "
                       "JOIN runs o ON o.run_id = b.of_run_id") == [("off", "prod")]
    assert ingest_file(store, path, run="off", baseline_of="prod").status == "already ingested"
    assert store.query("SELECT count(*) FROM baselines") == [(1,)]
