"""Engine outputs, built from the engines' own format strings (README, "Already running vLLM, llama.cpp or
SGLang?") with realistic values, mixed into noise, and malformed variants."""
import gzip
import json
import os
from datetime import datetime

import pytest
from engine_lines import (
    PREFIX,
    REAL_LLAMA_SERVER_3,
    REAL_SGLANG_NEW,
    REAL_SGLANG_OLD,
    REAL_V0,
    REAL_V1_010,
    REAL_V1_08,
    REAL_V1_09,
    REAL_V1_DEPTH_AFTER_MEAN,
    v1_line,
)

from specmon.analysis.summary import summarize
from specmon.ingest.formats import engine_log
from specmon.ingest.formats.engine_log import EngineLogReader
from specmon.ingest.pipeline import detect_format, ingest_file

VLLM_V1_EARLY = "SpecDecoding metrics: Draft acceptance rate: %.1f%%, Accepted: %d tokens, Drafted: %d tokens"
VLLM_V0 = ("Speculative metrics: Draft acceptance rate: %.3f, System efficiency: %.3f, Number of speculative tokens: "
           "%d, Number of accepted tokens: %d, Number of draft tokens: %d, Number of emitted tokens: %d.")
LLAMA_EXAMPLE = "n_draft   = %d\nn_predict = %d\nn_drafted = %d\nn_accept  = %d\naccept    = %.3f%%\n"
LLAMA_SERVER_1 = "draft acceptance rate = %0.5f (%5d accepted / %5d generated)\n"
LLAMA_SERVER_2 = ("draft acceptance = %0.5f (%5d accepted / %5d generated), mean acceptance length = %5.2f, "
                  "acceptance rate per position = (%s)\n")
LLAMA_SERVER_3 = "draft acceptance = %0.5f (%5d accepted / %5d generated), mean len = %5.2f\n"
SGLANG = ("Decode batch, #running-req: %d, #token: %d, token usage: %.2f, accept len: %.2f, accept rate: %.2f, "
          "cuda graph: True, gen throughput (token/s): %.2f, #queue-req: %d")
NOISE = ["(APIServer pid=4242) INFO 11-29 10:00:00 [api_server.py:1090] Starting vLLM API server on http://0.0.0.0:8000",
         "(APIServer pid=4242) INFO 11-29 10:00:10 [loggers.py:123] Engine 000: Avg prompt throughput: 512.3 tokens/s, "
         "Avg generation throughput: 220.1 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%",
         "INFO:     127.0.0.1:51234 - \"POST /v1/completions HTTP/1.1\" 200 OK"]


def write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def only(store):
    rows = summarize(store)
    assert len(rows) == 1
    return rows[0]


def test_vllm_v1_server_log_with_noise(store, tmp_path):
    lines = NOISE[:2] + [v1_line(0, 10, 100, [80, 60, 40]), NOISE[2], v1_line(0, 20, 200, [150, 100, 60], depth=3),
                         NOISE[1]]
    path = write(tmp_path, "vllm.log", lines)
    assert detect_format(path) == "engine-log"
    res = ingest_file(store, path)
    # the first load line goes with the speculative line after it; the last, with none after it, is a window with
    # the load alone, which the acceptance figures leave out
    assert res.status == "stored" and res.steps == 3
    seg = only(store)
    # per-token alpha = accepted / checked = (180 + 310) / ((100 + 80 + 60) + (200 + 150 + 100))
    assert seg["alpha"] == pytest.approx(490 / 690, abs=1e-9)
    assert seg["tokens_per_step"] == pytest.approx(1 + 490 / 300)
    assert seg["draft_acceptance_rate"] == pytest.approx(490 / 900)  # vLLM's "Avg Draft acceptance rate"
    assert [round(p["cumulative"], 4) for p in seg["per_position"]] == [round(230 / 300, 4), round(160 / 300, 4),
                                                                         round(100 / 300, 4)]
    assert seg["beta"] is None and seg["source"] == "engine" and seg["k"] == 3
    assert seg["first_ts"].endswith("-11-29T10:00:10")


def test_vllm_early_v1_and_v0(store, tmp_path):
    early = PREFIX % (1, 0) + VLLM_V1_EARLY % (62.5, 250, 400)
    v0 = [PREFIX % (2, s) + VLLM_V0 % (acc / dr, 0.7, 4, acc, dr, em)
          for s, (acc, dr, em) in enumerate([(100, 160, 140), (400, 640, 560), (50, 80, 70)])]  # then a restart
    path = write(tmp_path, "mixed.log", [early] + v0)
    res = ingest_file(store, path)
    assert res.status == "stored"
    rows = store.query("SELECT source, drafts, draft_tokens, accepted_tokens, mean_acceptance_length, reported_rate "
                       "FROM engine_windows ORDER BY line")
    assert rows[0] == ("vllm-v1-early-log", None, 400.0, 250.0, None, 0.625)
    # V0 totals are running sums: the first line is the window from the engine's start, the second the difference
    # of the first two lines; the third fell, so the server restarted and it counts from the new start
    assert rows[1] == ("vllm-v0-log", 40.0, 160.0, 100.0, pytest.approx(140 / 40), pytest.approx(0.625))
    assert rows[2] == ("vllm-v0-log", 120.0, 480.0, 300.0, pytest.approx(420 / 120), pytest.approx(0.625))
    assert rows[3] == ("vllm-v0-log", 20.0, 80.0, 50.0, pytest.approx(70 / 20), pytest.approx(0.625))
    assert len(rows) == 4
    seg = only(store)
    assert seg["alpha"] is None and "per-position counts" in seg["note"]


def test_llama_cpp_outputs(store, tmp_path):
    example = (LLAMA_EXAMPLE % (8, 256, 320, 200, 62.5)).splitlines()
    server = [
        "slot release: id  0 | task 12 | " + LLAMA_SERVER_1.strip() % (0.5, 50, 100),
        "slot release: id  0 | task 13 | " + LLAMA_SERVER_2.strip() % (0.6, 60, 100, 2.5, "0.700, 0.500, 0.300"),
        "slot release: id  0 | task 14 | " + LLAMA_SERVER_3.strip() % (0.75, 75, 100, 4.0),
        "     acc per pos = (0.920, 0.800, 0.680, 0.600)",
    ]
    path = write(tmp_path, "llama.log", ["main: loading model"] + example + server)
    res = ingest_file(store, path)
    assert res.status == "stored" and res.steps == 4
    rows = store.query("SELECT source, drafts, draft_tokens, accepted_tokens, accepted_per_position, k FROM "
                       "engine_windows ORDER BY line")
    # the example's n_draft is its final draft length (an adaptive run changes it): a label, not k
    assert rows[0] == ("llama-example", None, 320.0, 200.0, None, None)
    assert json.loads(store.query("SELECT labels FROM engine_windows ORDER BY line")[0][0]) == {"n_draft": 8,
                                                                                                "n_predict": 256}
    assert rows[1][:4] == ("llama-server", None, 100.0, 50.0)
    assert rows[2][1] == pytest.approx(40.0) and rows[2][4] == pytest.approx([28.0, 20.0, 12.0])
    assert rows[3][1] == pytest.approx(25.0) and rows[3][4] == pytest.approx([23.0, 20.0, 17.0, 15.0])


def test_sglang_decode_lines(store, tmp_path):
    lines = ["[2026-11-29 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 32",
             "[2026-11-29 10:00:01 TP0] " + SGLANG % (4, 900, 0.01, 3.21, 0.74, 410.5, 0),
             "[2026-11-29 10:00:02 TP0] " + SGLANG % (4, 980, 0.01, 2.79, 0.61, 380.1, 0)]
    res = ingest_file(store, write(tmp_path, "sglang.log", lines))
    assert res.status == "stored"
    seg = only(store)
    assert seg["tokens_per_step"] == pytest.approx(3.0)  # accept len includes the bonus: it is L
    assert "unweighted mean" in seg["note"] and seg["alpha"] is None


def test_json_responses(store, tmp_path):
    vllm = {"id": "cmpl-1", "created": 1796032800, "model": "llama", "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "acceptance_histogram": [2, 2, 2, 4],
        "num_spec_steps": 10, "num_accepted_draft_tokens": 18, "num_draft_tokens": 30, "num_spec_tokens": 3}}}
    detailed = {"id": "cmpl-2", "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 2.0, "draft_acceptance_rate": 1 / 3, "num_spec_steps": 3,
        "num_accepted_draft_tokens": 3, "num_draft_tokens": 9, "num_spec_tokens": 3,
        "per_step_accepted": [0, 1, 2], "per_step_drafted": [3, 3, 3]}}}
    llama = {"content": "...", "timings": {"predicted_n": 64, "draft_n": 40, "draft_n_accepted": 30}}
    llama_none = {"content": "...", "timings": {"predicted_n": 64}}  # nothing drafted: no window
    path = tmp_path / "responses.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in (vllm, detailed, llama, llama_none)) + "\n")
    assert detect_format(str(path)) == "engine-json"
    res = ingest_file(store, str(path))
    assert res.status == "stored" and res.steps == 3
    rows = store.query("SELECT source, drafts, accepted_per_position FROM engine_windows ORDER BY line")
    assert rows[0] == ("vllm-request", 10.0, [8.0, 6.0, 4.0])  # from the histogram: steps reaching 1, 2, 3
    assert rows[1] == ("vllm-request", 3.0, [2.0, 1.0, 0.0])  # from per_step_accepted
    assert rows[2][0] == "llama-timings"


@pytest.mark.parametrize("line,phrase,field", [
    (PREFIX % (0, 1) + "SpecDecoding metrics: Mean acceptance length: 2.80, Accepted: lots", "SpecDecoding",
     "Accepted"),
    (PREFIX % (0, 1) + "SpecDecoding metrics: Mean acceptance length: 2.80, Accepted: 5 tokens", "SpecDecoding",
     "Drafted"),
    ("draft acceptance = 0.5 (accepted / generated)", "llama-server", "accepted / generated"),
    ("Speculative metrics: Draft acceptance rate: 0.5, System efficiency: 0.4, Number of speculative tokens: 4, "
     "Number of accepted tokens: 5, Number of draft tokens: 8, Number of emitted tokens: x.", "V0",
     "Number of emitted tokens"),
    ("[2026-11-29 10:00:01 TP0] Decode batch, #running-req: 1, accept len: ??", "SGLang", "accept len"),
])
def test_a_malformed_line_is_reported_with_its_number(store, tmp_path, line, phrase, field):
    path = write(tmp_path, "bad.log", [NOISE[0], v1_line(0, 10, 100, [80, 60, 40]), line])
    res = ingest_file(store, path)
    assert res.status == "rejected"
    assert res.faults[0].line == 3 and phrase in res.faults[0].reason and res.faults[0].field == field
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 0
    res = ingest_file(store, path, skip_bad=True, report_path=str(tmp_path / "rep.jsonl"))
    assert res.status == "stored" and res.steps == 1 and res.rejected == 1


def test_a_log_without_metrics_says_so(store, tmp_path):
    path = write(tmp_path, "quiet.log", NOISE + ["SpecDecoding metrics: Draft acceptance rate: 50.0%, "
                                                 "Accepted: 5 tokens, Drafted: 10 tokens"])
    assert ingest_file(store, path).status == "stored"
    quiet = write(tmp_path, "none.log", ["n_drafted = 5", "hello"])
    res = ingest_file(store, quiet, fmt="engine-log")
    assert res.status == "rejected" and "no speculative-decoding lines" in res.faults[0].reason


EXPOSITION = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="llama"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="llama"}} {draft_tokens}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="llama"}} {accepted}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="llama",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="llama",position="1"}} {p1}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="llama"}} 3.0
"""


def scrape(tmp_path, n, mtime, **values):
    p = tmp_path / f"metrics-{n}.txt"
    p.write_text(EXPOSITION.format(**values))
    os.utime(p, (mtime, mtime))
    return str(p)


def test_saved_metrics_pages_become_windows_with_restarts_handled(store, tmp_path):
    t0 = 1796032800
    pages = [scrape(tmp_path, 0, t0, drafts=100, draft_tokens=200, accepted=120, p0=70, p1=50),
             scrape(tmp_path, 1, t0 + 60, drafts=300, draft_tokens=600, accepted=330, p0=190, p1=140),
             # the server restarted: counters fell, and this window counts what the new process did
             scrape(tmp_path, 2, t0 + 120, drafts=50, draft_tokens=100, accepted=60, p0=35, p1=25)]
    for page in pages:
        assert detect_format(page) == "prometheus"
        assert ingest_file(store, page, run="fleet").status == "stored"
    seg = only(store)
    # windows: (200 drafts, 400 draft tokens, 210 accepted, per-pos 120/90) and (50, 100, 60, 35/25)
    assert seg["steps"] == 250 and seg["drafted"] == 500 and seg["accepted"] == 270
    assert seg["alpha"] == pytest.approx(270 / (250 + 155), abs=1e-9)
    assert seg["tokens_per_step"] == pytest.approx(1 + 270 / 250)


def test_a_bad_sample_line_is_reported(store, tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text('vllm:spec_decode_num_drafts_total{engine="0"} 1.0\n'
                 'vllm:spec_decode_num_draft_tokens_total{engine="0" 5\n')
    res = ingest_file(store, str(p))
    assert res.status == "rejected" and res.faults[0].line == 2


def test_malformed_json_responses_and_example_blocks(store, tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps({"metrics": {"speculative_decoding": {"num_draft_tokens": 3}}}) + "\n"
                    + json.dumps({"timings": {"draft_n": "many"}}) + "\n{not json\n[1, 2]\n")
    res = ingest_file(store, str(path), fmt="engine-json")
    assert res.status == "rejected"
    assert [(f.line, f.field) for f in res.faults] == [(1, "speculative_decoding.num_spec_steps"),
                                                       (2, "timings.draft_n"), (3, ""), (4, "")]
    assert "expected a JSON object, got a JSON array" in res.faults[3].reason
    block = write(tmp_path, "example.log", ["n_draft   = 8", "accept    = 62.500%"])
    res = ingest_file(store, block, fmt="engine-log")
    assert res.status == "rejected" and res.faults[0].line == 2 and "without n_drafted" in res.faults[0].reason


def test_the_incremental_reader_resumes_at_every_line_as_if_read_in_one_go():
    v0 = "INFO 11-29 10:0%d:00 metrics.py:467] " + VLLM_V0
    lines = (NOISE + [v1_line(0, 10, 100, [80, 60, 40]),
                      "(EngineCore_1 pid=77) " + v1_line(0, 12, 50, [40, 30, 20])[len("(APIServer pid=4242) "):],
                      v1_line(0, 20, 200, [150, 100, 60], depth=3),
                      v0 % (1, 0.6, 0.7, 4, 96, 160, 140), v0 % (2, 0.6, 0.7, 4, 384, 640, 560),
                      v0 % (3, 0.6, 0.7, 4, 48, 80, 70)]
             + (LLAMA_EXAMPLE % (8, 256, 320, 200, 62.5)).splitlines()
             + ["slot release: id  0 | task 14 | " + LLAMA_SERVER_3.strip() % (0.75, 75, 100, 4.0),
                "     acc per pos = (0.920, 0.800, 0.680, 0.600)",
                "slot release: id  0 | task 15 | " + LLAMA_SERVER_3.strip() % (0.5, 50, 100, 3.0),
                "[2026-11-29 10:00:01 TP0] " + SGLANG % (4, 900, 0.01, 3.21, 0.74, 410.5, 0),
                "Speculative metrics: Draft acceptance rate: 0.5, System efficiency: x",
                "slot release: id  0 | task 16 | " + LLAMA_SERVER_1.strip() % (0.5, 50, 100)])
    now = datetime(2026, 11, 30, 12, 0)
    whole = EngineLogReader("x.log", now)
    for no, line in enumerate(lines, start=1):
        whole.feed(no, line + "\n")
    whole.finish()
    expected = whole.take()
    assert len(expected[0]) == 11 and len(expected[1]) == 1
    # V1 windows start where the same process's previous line ended; another process has its own clock
    assert [w.start_ts for w in expected[0][:3]] == [None, None, datetime(2026, 11, 29, 10, 0, 10)]
    assert expected[0][7].accepted_per_position == pytest.approx([23.0, 20.0, 17.0, 15.0])
    for cut in range(len(lines) + 1):
        first = EngineLogReader("x.log", now)
        for no, line in enumerate(lines[:cut], start=1):
            first.feed(no, line)
        got_w, got_f = first.take()
        second = EngineLogReader("x.log", now, state=json.loads(json.dumps(first.state())))
        for no, line in enumerate(lines[cut:], start=cut + 1):
            second.feed(no, line)
        second.finish()
        more_w, more_f = second.take()
        assert (got_w + more_w, got_f + more_f) == expected, f"split after line {cut}"


def test_one_v0_line_without_a_prefix_is_a_window_from_the_engine_start(store, tmp_path):
    line = ("INFO 08-14 09:12:30 metrics.py:396] " + VLLM_V0 % (0.7, 0.6, 5, 700, 1000, 960))
    res = ingest_file(store, write(tmp_path, "v0.log", [NOISE[2], line]))
    assert res.status == "stored" and res.steps == 1
    assert store.query("SELECT start_ts, drafts, draft_tokens FROM engine_windows") == [(None, 200.0, 1000.0)]


NOW = datetime(2026, 11, 30, 12, 0)


def read_lines(lines, now=NOW):
    r = EngineLogReader("x.log", now)
    for no, line in enumerate(lines, start=1):
        r.feed(no, line)
    r.finish()
    return r.take()


def test_vllm_v1_fields_are_read_by_name_in_every_release_shape():
    (depth,), _ = read_lines([REAL_V1_DEPTH_AFTER_MEAN])
    assert (depth.drafts, depth.k, depth.draft_tokens, depth.accepted_tokens) == (44, 7, 308, 256)
    assert depth.accepted_per_position == [44, 44, 44, 44, 35, 27, 18]
    assert depth.labels["current speculative depth"] == 7 and depth.reported_rate == pytest.approx(0.831)
    (w010,), _ = read_lines([REAL_V1_010])  # 'Draft acceptance rate' first, no 'Avg Draft acceptance rate'
    assert (w010.drafts, w010.k, w010.accepted_per_position) == (59, 5, [58, 56, 54, 52, 42])
    assert w010.reported_rate == pytest.approx(0.888) and w010.mean_acceptance_length == 5.44
    (w09,), _ = read_lines([REAL_V1_09])  # no throughputs
    assert (w09.drafts, w09.accepted_per_position, w09.end_ts) == (129, [70, 46, 34], datetime(2026, 6, 6, 14, 20, 34))
    (w08,), _ = read_lines([REAL_V1_08])  # V1's first per-interval line, under V0's phrase: not a running total
    assert (w08.source, w08.draft_tokens, w08.accepted_tokens, w08.drafts, w08.k) == ("vllm-v1-0.8-log", 66, 66, None,
                                                                                      None)


def test_a_depth_that_changed_within_the_interval_takes_drafts_from_the_rates():
    # Built from vLLM's format string: depth 2 printed, but 5 positions listed and 35 tokens drafted in 7 drafts
    line = ("SpecDecoding metrics: Mean acceptance length: 3.00, Current speculative depth: 2, Accepted: 14 tokens, "
            "Drafted: 35 tokens, Per-position acceptance rate: 0.714, 0.429, 0.286, 0.286, 0.286, Avg Draft "
            "acceptance rate: 40.0%")
    (w,), _ = read_lines([line])
    assert w.drafts == 7 and w.accepted_per_position == [5, 3, 2, 2, 2]


def test_vllm_v0_tokens_per_step_come_from_emitted_tokens():
    (w,), faults = read_lines(["INFO 10-16 19:06:01 metrics.py:361] Prefix cache hit rate: GPU: 94.35%, CPU: 0.00%",
                               REAL_V0][::-1])
    assert not faults and w.start_ts is None and w.end_ts == datetime(2026, 10, 16, 19, 5, 47)
    assert w.drafts == 4437 and w.k == 3
    # V0 counts accepted positions after the first rejection too (8547): tokens per step are emitted / drafts
    assert w.mean_acceptance_length == pytest.approx(10616 / 4437)
    assert w.accepted_tokens == 10616 - 4437 and w.labels == {"v0 accepted tokens (any position)": 8547}
    assert w.reported_rate == pytest.approx(8547 / 13311)


def test_vllm_v0_with_zero_speculative_tokens_is_a_named_fault():
    line = REAL_V0.replace("Number of speculative tokens: 3", "Number of speculative tokens: 0")
    windows, faults = read_lines([line])
    assert windows == [] and faults[0].field == "Number of speculative tokens" and "1 to 512" in faults[0].reason


def test_llama_server_statistics_lines_are_not_counted_twice():
    (w,), faults = read_lines(REAL_LLAMA_SERVER_3)
    assert not faults and (w.drafts, w.k, w.accepted_per_position) == (87, 3, [70, 55, 42])


def test_sglang_accept_rate_definition_is_inferred_where_only_one_fits():
    (old,), _ = read_lines([REAL_SGLANG_OLD])
    (new,), _ = read_lines([REAL_SGLANG_NEW])
    assert old.labels == {"accept rate definition": "accept len / draft tokens"}  # 2.17 / 4 = 0.54
    assert new.mean_acceptance_length == 3.08 and new.end_ts == datetime(2026, 9, 11, 23, 47, 28)
    assert engine_log.sglang_rate_definition(3.08, 0.52) == "(accept len - 1) / draft tokens"  # 2.08 / 4
    assert engine_log.sglang_rate_definition(2.0, 0.5) == "unknown"  # 2/4 and 1/2 both fit


def test_dates_in_log_lines():
    feb29 = REAL_V1_09.replace("06-06", "02-29")
    (w,), _ = read_lines([feb29], now=datetime(2027, 3, 1))  # 2027 is not a leap year: the log is from 2024
    assert w.end_ts == datetime(2024, 2, 29, 14, 20, 34)
    # an impossible date on a line without speculative figures is no concern of specmon's
    windows, faults = read_lines(["[2026-13-45 10:00:00] INFO something else", REAL_V1_09])
    assert len(windows) == 1 and not faults
    windows, faults = read_lines([REAL_SGLANG_NEW.replace("2026-09-11", "2026-13-45")])
    assert windows == [] and faults[0].field == "time" and faults[0].line == 1


def test_bounds_are_checked_before_anything_is_built():
    many = REAL_V1_09.replace("0.543, 0.357, 0.264", ", ".join(["0.5"] * 600))
    _, faults = read_lines([many])
    assert faults[0].field == "Per-position acceptance rate" and "512" in faults[0].reason
    huge = REAL_V1_09.replace("Accepted: 150", "Accepted: " + "9" * 400)
    _, faults = read_lines([huge])
    assert faults[0].field == "Accepted" and "2^53" in faults[0].reason
    long = REAL_V1_09 + " " * (1 << 17)
    _, faults = read_lines([long])
    assert "longer than" in faults[0].reason


def test_gzip_and_overlong_lines_in_a_file(tmp_path):
    p = tmp_path / "server.log.gz"
    with gzip.open(p, "wt") as fh:
        fh.write(NOISE[0] + "\n" + REAL_V1_DEPTH_AFTER_MEAN + "\n" + "x" * (1 << 17) + "\n" + REAL_V1_09 + "\n")
    assert detect_format(str(p)) == "engine-log"
    windows, faults = engine_log.read(str(p), "server.log.gz", NOW)
    assert [w.line for w in windows] == [2, 4] and not faults


@pytest.mark.parametrize("sample,field,reason", [
    ('vllm:spec_decode_num_drafts_total{engine="0"} -50', "vllm:spec_decode_num_drafts_total", "count >= 0"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} +Inf', "vllm:spec_decode_num_drafts_total", "finite"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} 5 99999999999999999999', "vllm:spec_decode_num_drafts_total",
     "years 1 to 9999"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} 5 -99999999999999', "vllm:spec_decode_num_drafts_total",
     "years 1 to 9999"),
])
def test_impossible_counter_samples_are_named_faults(store, tmp_path, sample, field, reason):
    p = tmp_path / "metrics.txt"
    p.write_text('vllm:spec_decode_num_drafts_total{engine="0"} 10 1796032800000\n' + sample + "\n")
    res = ingest_file(store, str(p))
    assert res.status == "rejected" and (res.faults[0].line, res.faults[0].field) == (2, field)
    assert reason in res.faults[0].reason
    assert ingest_file(store, str(p), skip_bad=True, report_path=str(tmp_path / "r.jsonl")).status == "stored"
    assert store.query("SELECT count(*) FROM counter_samples") == [(1,)]


def test_a_saved_pretty_printed_timings_object_is_one_response(store, tmp_path):
    # `curl ... | jq .timings` as a llama.cpp user pasted it (tests/data/engines/llama-timings-1.json)
    p = tmp_path / "timings.json"
    p.write_text('{\n  "prompt_n": 1,\n  "prompt_ms": 228.522,\n  "prompt_per_token_ms": 228.522,\n  '
                 '"prompt_per_second": 4.375946298387026,\n  "predicted_n": 200,\n  "predicted_ms": 11082.606,\n  '
                 '"predicted_per_token_ms": 55.41303,\n  "predicted_per_second": 18.0462970532382,\n  "draft_n": 347,\n'
                 '  "draft_n_accepted": 65\n}\n')
    assert detect_format(str(p)) == "engine-json"
    res = ingest_file(store, str(p))
    assert res.status == "stored"
    assert store.query("SELECT source, drafts, draft_tokens, accepted_tokens FROM engine_windows") == [
        ("llama-timings", None, 347.0, 65.0)]


REAL_LLAMA_SERVER_MTP = [  # two requests on one slot (tests/data/engines/llama-server-5.log, lines 1 and 5-7, 36-39)
    "2026-05-14 22:40:29.046 | slot print_timing: id  3 | task 0 | ",
    "2026-05-14 22:40:29.046 | draft acceptance rate = 0.98260 ( 1186 accepted /  1207 generated)",
    "2026-05-14 22:40:29.046 | statistics mtp: #calls(b,g,a) = 1 861 690, #gen drafts = 690, #acc drafts = 690, "
    "#gen tokens = 1207, #acc tokens = 1186, dur(b,g,a) = 0.006, 3112.317, 0.287 ms",
    "2026-05-14 22:40:29.046 | slot      release: id  3 | task 0 | stop processing: n_tokens = 2180, truncated = 0",
    "2026-05-14 22:40:43.119 | slot print_timing: id  3 | task 921 | ",
    "2026-05-14 22:40:43.119 | draft acceptance rate = 1.00000 (    6 accepted /     6 generated)",
    "2026-05-14 22:40:43.119 | statistics mtp: #calls(b,g,a) = 2 864 693, #gen drafts = 693, #acc drafts = 693, "
    "#gen tokens = 1213, #acc tokens = 1192, dur(b,g,a) = 0.007, 3124.913, 0.287 ms",
    "2026-05-14 22:40:43.119 | slot      release: id  3 | task 921 | stop processing: n_tokens = 20, truncated = 0"]


def test_llama_server_statistics_lines_give_the_drafts_a_request_line_lacks():
    windows, faults = read_lines(REAL_LLAMA_SERVER_MTP)
    assert not faults and [(w.drafts, w.draft_tokens, w.accepted_tokens) for w in windows] == [(690, 1207, 1186),
                                                                                               (3, 6, 6)]
    assert windows[0].end_ts == datetime(2026, 5, 14, 22, 40, 29)
    # without the first request the second one's increment is unknown: drafts stay null
    windows, _ = read_lines(REAL_LLAMA_SERVER_MTP[4:])
    assert windows[0].drafts is None
    # split anywhere, the same
    for cut in range(len(REAL_LLAMA_SERVER_MTP) + 1):
        first = EngineLogReader("x.log", NOW)
        for no, line in enumerate(REAL_LLAMA_SERVER_MTP[:cut], start=1):
            first.feed(no, line)
        got = first.take()[0]
        second = EngineLogReader("x.log", NOW, state=json.loads(json.dumps(first.state())))
        for no, line in enumerate(REAL_LLAMA_SERVER_MTP[cut:], start=cut + 1):
            second.feed(no, line)
        second.finish()
        assert [w.drafts for w in got + second.take()[0]] == [690, 3]


def test_a_response_created_in_1e20_is_a_named_fault_and_skip_bad_keeps_the_rest(store, tmp_path):
    good = {"id": "cmpl-1", "created": 1796032800, "metrics": {"speculative_decoding": {
        "num_spec_steps": 10, "num_draft_tokens": 30, "num_accepted_draft_tokens": 18, "num_spec_tokens": 3}}}
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "cmpl-2", "created": 1e20}) + "\n")
    res = ingest_file(store, str(path))
    assert res.status == "rejected" and (res.faults[0].line, res.faults[0].field) == (2, "created")
    res = ingest_file(store, str(path), skip_bad=True, report_path=str(tmp_path / "r.jsonl"))
    assert (res.status, res.steps, res.rejected) == ("stored", 1, 1)


def test_a_corrupt_gzip_log_is_named(store, tmp_path):
    path = tmp_path / "server.log.gz"
    path.write_bytes(gzip.compress(((REAL_V1_09 + "\n") * 50).encode())[:60])
    res = ingest_file(store, str(path))
    assert res.status == "rejected" and "gzip" in res.faults[0].reason
