"""`vllm bench serve --save-result` results as load points: concurrency, throughput and the draft length, from a real
result (tests/data/engines/vllm-bench-1.json) with the keys vLLM writes under --max-concurrency and with a
speculative server (vllm/benchmarks/serve.py: max_concurrency, spec_decode_*)."""
import json
import subprocess
from datetime import datetime

import pytest
from paths import DATA

from specmon.ingest.pipeline import detect_format, ingest_file

REAL = json.loads((DATA / "engines" / "vllm-bench-1.json").read_text())
# what vLLM adds for a server with speculation: the spec_decode counters differenced around the run (100 drafts of
# k = 3 whose accepted prefix reached positions 1, 2, 3 80, 60 and 40 times)
SPEC = {"spec_decode_acceptance_rate": 60.0, "spec_decode_acceptance_length": 2.8, "spec_decode_num_drafts": 100,
        "spec_decode_draft_tokens": 300, "spec_decode_accepted_tokens": 180,
        "spec_decode_per_position_acceptance_rates": [0.8, 0.6, 0.4]}


def result(tmp_path, name="bench.json", *docs: dict) -> str:
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    return str(p)


def points(store):
    return store.query("SELECT k, concurrency, output_tokens, duration_s, output_tokens_per_s, accepted_tokens, "
                       "draft_tokens, ts, labels->>'concurrency from' FROM load_points ORDER BY line")


def test_a_result_with_speculation_is_a_load_point_with_its_draft_length(store, tmp_path):
    path = result(tmp_path, "bench.json", {**REAL, "max_concurrency": 8, **SPEC})
    assert detect_format(path) == "vllm-bench"
    res = ingest_file(store, path, run="eagle")
    assert res.status == "stored" and res.steps == 1 and res.kind == "sweep"
    (k, n, tokens, duration, rate, accepted, drafted, ts, how), = points(store)
    assert (k, n, tokens, accepted, drafted, how) == (3, 8.0, 25472.0, 180.0, 300.0, "max_concurrency")
    assert rate == pytest.approx(124.58542994370372) and duration == pytest.approx(204.45408433000557)
    assert ts == datetime(2026, 7, 22, 6, 1, 14)


def test_the_draft_length_given_must_agree_with_the_result(store, tmp_path):
    path = result(tmp_path, "bench.json", {**REAL, "max_concurrency": 8, **SPEC})
    res = ingest_file(store, path, k=4)
    assert res.status == "rejected" and res.faults[0].field == "spec_decode_per_position_acceptance_rates"
    res = ingest_file(store, path, baseline_of="prod")  # a baseline drafts nothing
    assert res.status == "rejected" and res.faults[0].field == "spec_decode_draft_tokens"


def test_a_result_without_speculative_figures_needs_its_draft_length(store, tmp_path):
    path = result(tmp_path, "off.json", {**REAL, "max_concurrency": 8})
    res = ingest_file(store, path)
    assert res.status == "rejected" and res.faults[0].field == "k" and "--k" in res.faults[0].reason
    assert ingest_file(store, path, run="off", baseline_of="eagle").status == "stored"
    assert points(store)[0][:2] == (0, 8.0)
    assert store.query("SELECT r.name, o.name FROM baselines b JOIN runs r ON r.run_id = b.run_id "
                       "JOIN runs o ON o.run_id = b.of_run_id") == [("off", "eagle")]


def test_without_a_concurrency_cap_the_mean_in_flight_is_taken_where_the_result_gives_it(store, tmp_path):
    # the real result: 1 request/s and no cap; with --percentile-metrics e2el vLLM also writes mean_e2el_ms
    path = result(tmp_path, "rate.json", {**REAL, "mean_e2el_ms": 9000.0})
    assert ingest_file(store, path, k=0).status == "stored"
    k, n, *_, how = points(store)[0]
    assert n == pytest.approx(199 * 9.0 / 204.45408433000557) and how.startswith("mean")
    refused = ingest_file(store, str(DATA / "engines" / "vllm-bench-1.json"), k=0)
    assert refused.status == "rejected" and refused.faults[0].field == "max_concurrency"


def test_a_bad_result_among_several_is_named_by_its_line(store, tmp_path):
    good = {**REAL, "max_concurrency": 8}
    bad = {**REAL, "max_concurrency": 16, "output_throughput": 500.0}  # not total_output_tokens / duration
    path = result(tmp_path, "sweep.jsonl", good, bad)
    res = ingest_file(store, path, k=0)
    assert res.status == "rejected" and (res.faults[0].line, res.faults[0].field) == (2, "output_throughput")
    res = ingest_file(store, path, k=0, skip_bad=True, report_path=str(tmp_path / "r.jsonl"))
    assert res.status == "stored" and res.steps == 1 and points(store)[0][1] == 8.0


def test_the_command_line_takes_the_draft_length_or_the_baseline(tmp_path, specmon_cmd):
    db = str(tmp_path / "c.duckdb")
    path = result(tmp_path, "off.json", {**REAL, "max_concurrency": 4})
    r = subprocess.run([*specmon_cmd, "ingest", "--db", db, "--run", "off", "--k", "0", path], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "stored 1 load measurements in run 'off'" in r.stdout
    r = subprocess.run([*specmon_cmd, "ingest", "--db", db, "--k", "3", "--baseline-of", "eagle", path],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "give one of them" in r.stderr and "Traceback" not in r.stderr


def test_k_is_refused_for_a_file_that_does_not_take_it(store):
    """--k names the draft length of results that do not record it; an SGLang log records tokens per step alone,
    and a --k given with it would be dropped without a word: it is an error, and nothing is stored."""
    from specmon.core.faults import SpecmonError

    with pytest.raises(SpecmonError, match=r"sglang-decode-1\.log: --k gives the draft length of `vllm bench serve` "
                                           r"results.*this engine-log file.*drop it"):
        ingest_file(store, str(DATA / "engines" / "sglang-decode-1.log"), k=4)
    assert store.query("SELECT count(*) FROM engine_windows")[0][0] == 0
