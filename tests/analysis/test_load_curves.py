"""Speedup by concurrency from load sweeps: the sweep table read by content (faults by file, line and field, all or
nothing), the baseline found three ways, the break-even and the policy, `specmon recommend` and its JSON, and the
policy parsed back as each engine's own configuration."""
import json
import shlex
import subprocess

import pytest
import yaml

from specmon.analysis import load
from specmon.ingest.pipeline import ingest_file
from specmon.verdicts.recommend import recommend

HEADER = ("run,k,concurrency,repeat,output_tokens,duration_s,output_tokens_per_s,accepted_tokens,draft_tokens,"
          "emitted_tokens")
# The public paired runs' payoff (vLLM 0.6.3, Qwen2.5-7B target, its AWQ copy as draft, one A40, k = 1): +23%, +13%,
# +3%, -9%, -16%, -16% at batch 1, 4, 8, 16, 24, 32, with three repeats of 1% noise around it.
PAYOFF = {1: 1.23, 4: 1.13, 8: 1.03, 16: 0.91, 24: 0.84, 32: 0.84}
NOISE = (1.0, 1.01, 0.99)


def sweep_rows(run: str = "qwen7b", spec_run: str | None = None, base: float = 100.0) -> list[str]:
    """A sweep's rows: k = 0 (baseline) and k = 1 at each concurrency, throughput about base * N^0.8 without
    speculation; the k = 1 rows in spec_run where given (else the same run)."""
    rows = []
    for n, s in PAYOFF.items():
        for r, e in enumerate(NOISE, start=1):
            g0 = base * n ** 0.8
            rows.append(f"{run},0,{n},{r},,,{g0 * e:.2f},,,")
            rows.append(f"{spec_run or run},1,{n},{r},,,{g0 * s * (2 - e):.2f},{880 * r},{1000 * r},")
    return rows


def write(tmp_path, name: str, rows: list[str], header: str = HEADER) -> str:
    path = tmp_path / name
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(path)


def test_a_sweep_that_crosses_gives_its_break_even_and_a_policy(store, tmp_path):
    r = ingest_file(store, write(tmp_path, "sweep.csv", sweep_rows()))
    assert (r.status, r.run, r.steps, r.source_format) == ("stored", "qwen7b", 36, "load-sweep-csv")
    [curve] = load.curves(store)
    assert curve.baseline == "the run's own measurements with k = 0" and curve.observations == load.REPEAT_OBSERVATIONS
    assert [p.concurrency for p in curve.points] == list(PAYOFF)
    for p in curve.points:
        assert p.speedup.lo < PAYOFF[int(p.concurrency)] < p.speedup.hi  # the truth inside each interval
        assert p.draft_acceptance_rate == pytest.approx(0.88) and p.tokens_per_step == pytest.approx(1.88)
    c = curve.crossings[1]
    assert (c.pays_up_to, c.loses_from) == (8, 16) and 8 < c.break_even < 16
    assert curve.policy() == [{"max_concurrency": 8.0, "k": 1}, {"max_concurrency": None, "k": 0}]
    assert curve.status == "unknown"  # no current load: a sweep is not a deployment


def test_recommend_json_and_the_engines_configuration_parsed_back(tmp_path, specmon_cmd):
    db = str(tmp_path / "r.duckdb")
    sweep = write(tmp_path, "sweep.csv", sweep_rows())
    assert subprocess.run([*specmon_cmd, "ingest", "--db", db, sweep], capture_output=True).returncode == 0
    out = subprocess.run([*specmon_cmd, "recommend", "--db", db, "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    [doc] = json.loads(out.stdout)
    assert doc["run"] == "qwen7b" and doc["baseline"] == "the run's own measurements with k = 0"
    assert {"k", "concurrency", "speedup", "speedup_lo", "speedup_hi", "throughput", "baseline_throughput", "alpha",
            "tokens_per_step"} <= set(doc["points"][0])
    per_k = [b for b in doc["break_even"] if b["k"] == 1]
    assert per_k and (per_k[0]["pays_up_to"], per_k[0]["loses_from"]) == (8, 16)
    assert any(b["k"] is None for b in doc["break_even"])  # the best k at each concurrency
    assert doc["policy"] == [{"max_concurrency": 8, "k": 1}, {"max_concurrency": None, "k": 0}]
    vllm = shlex.split(doc["engines"]["vllm"].splitlines()[-1])
    assert vllm[0] == "--speculative-config"
    assert json.loads(vllm[1]) == {"num_speculative_tokens": 1, "disable_by_batch_size": 8}
    trt = yaml.safe_load(doc["engines"]["tensorrt-llm"])
    assert trt == {"speculative_config": {"max_draft_len": 1, "max_concurrency": 8}}
    assert doc["engines"]["sglang"].splitlines()[-1] == "--max-running-requests 8"
    text = subprocess.run([*specmon_cmd, "recommend", "--db", db], capture_output=True, text=True).stdout
    assert "k = 1 up to 8 running requests, speculation off from 16" in text
    assert "N = 16: speedup 0.91" in text


def test_a_run_without_a_baseline_says_payoff_at_load_is_unknown(store, tmp_path):
    spec_only = [r for r in sweep_rows() if r.split(",")[1] == "1"]
    ingest_file(store, write(tmp_path, "spec.csv", spec_only))
    [curve] = load.curves(store)
    assert not curve.known and "payoff at load is unknown" in curve.note and "--baseline-of 'qwen7b'" in curve.note
    advice = recommend(curve)
    assert advice.policy == [] and advice.words.startswith("nothing to recommend") and not advice.engines


def test_a_baseline_run_declared_with_baseline_of(store, tmp_path):
    rows = sweep_rows()
    ingest_file(store, write(tmp_path, "spec.csv", [r for r in rows if r.split(",")[1] == "1"]))
    ingest_file(store, write(tmp_path, "base.csv", [r.replace("qwen7b", "qwen7b-plain") for r in rows
                                                    if r.split(",")[1] == "0"]), baseline_of="qwen7b")
    [curve] = load.curves(store)  # the baseline run is no curve of its own
    assert curve.run == "qwen7b" and "'qwen7b-plain', declared its baseline" in curve.baseline
    assert (curve.crossings[1].pays_up_to, curve.crossings[1].loses_from) == (8, 16)


def test_one_file_whose_k0_rows_are_another_run_makes_that_run_the_baseline(store, tmp_path):
    ingest_file(store, write(tmp_path, "both.csv", sweep_rows("plain", spec_run="eagle")))
    [curve] = load.curves(store)
    assert curve.run == "eagle" and "'plain', declared its baseline" in curve.baseline


def test_a_point_that_cannot_tell_stops_the_recommendation(store, tmp_path):
    """At N = 8 the k = 1 repeats spread by 10% around +3%: that point's interval holds 1, so no policy."""
    g0 = 100 * 8 ** 0.8
    rows = [r for r in sweep_rows() if not r.startswith("qwen7b,1,8,")]
    rows += [f"qwen7b,1,8,{r},,,{g0 * 1.03 * f:.2f},,," for r, f in ((1, 0.9), (2, 1.0), (3, 1.1))]
    ingest_file(store, write(tmp_path, "noisy.csv", rows))
    [curve] = load.curves(store)
    assert next(p for p in curve.points if p.concurrency == 8).speedup.verdict == "even"
    advice = recommend(curve)
    assert advice.policy == [] and "at 8 running requests" in advice.words and advice.certainty == "not enough data"


@pytest.mark.parametrize("row, line, field, reason", [
    ("qwen,1,x,1,,,120,,,", 3, "concurrency", "expected a number"),
    ("qwen,1.5,8,1,,,120,,,", 3, "k", "expected an integer"),
    ("qwen,1,8,1,,,-3,,,", 3, "output_tokens_per_s", "at least 0"),
    ("qwen,0,8,1,,,120,5,10,", 3, "draft_tokens", "k = 0 is speculation off"),
    ("qwen,1,8,1,1000,10,120,,,", 3, "output_tokens_per_s", "disagrees with output_tokens / duration_s"),
    ("qwen,1,8,1,,,,,,", 3, "output_tokens_per_s", "required, or both output_tokens and duration_s"),
    (",1,8,1,,,120,,,", 3, "run", "required"),
    ("qwen,1,8,1,,,120,90,60,", 3, "accepted_tokens", "90 accepted of 60 drafted"),
])
def test_a_bad_row_is_named_by_line_and_field_and_nothing_is_stored(store, tmp_path, row, line, field, reason):
    path = write(tmp_path, "bad.csv", ["qwen,0,8,1,,,100,,,", row])
    r = ingest_file(store, path)
    assert r.status == "rejected" and r.faults[0].line == line and r.faults[0].field == field, r.faults
    assert reason in r.faults[0].reason
    assert store.query("SELECT count(*) FROM load_points")[0][0] == 0
    kept = ingest_file(store, path, skip_bad=True, report_path=str(tmp_path / "rejected.jsonl"))
    assert kept.status == "stored" and kept.steps == 1 and kept.rejected == 1


def test_a_quoted_cell_over_two_lines_names_the_line_the_row_starts_on(store, tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_text(HEADER + '\n"qwen\nv2",0,1,1,,,100,,,\nqwen,1,1,1,,,bad,,,\n')
    r = ingest_file(store, str(path))
    assert r.status == "rejected" and (r.faults[0].line, r.faults[0].field) == (4, "output_tokens_per_s")


def test_an_unknown_column_is_named_and_json_lines_sweeps_read_alike(store, tmp_path):
    r = ingest_file(store, write(tmp_path, "extra.csv", ["qwen,0,1,1,,,100,,,,x"], HEADER + ",gpu"))
    assert r.status == "rejected" and r.faults[0].field == "gpu" and "not a column" in r.faults[0].reason
    lines = [json.dumps({"run": "q", "k": k, "concurrency": n, "repeat": rep, "output_tokens_per_s": 100 * n * f})
             for n, f in ((1, 1.2), (16, 0.9)) for k, f in ((0, 1.0), (1, f)) for rep in (1, 2)]
    (tmp_path / "sweep.jsonl").write_text("\n".join(lines) + "\n")
    r = ingest_file(store, str(tmp_path / "sweep.jsonl"))
    assert (r.status, r.source_format, r.steps) == ("stored", "load-sweep-jsonl", 8)
    again = ingest_file(store, str(tmp_path / "sweep.jsonl"))
    assert again.status == "already ingested"
    [curve] = load.curves(store)
    assert [round(p.speedup.estimate, 6) for p in curve.points] == [1.2, 0.9]
