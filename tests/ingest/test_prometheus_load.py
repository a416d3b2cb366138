"""The engines' load series in Prometheus (saved pages, pulls): requests running and waiting as the gauges' mean
over each window, throughput from the token counters, one window per engine, and a page of load series alone read
as a baseline. The names are the engines' own (prometheus_metrics.LOAD says where each is defined)."""
import json
import os
from datetime import datetime, timedelta

import pandas as pd
import pytest
from paths import DATA

from specmon.analysis import engine_segments
from specmon.analysis.engine_segments import WINDOW_COLUMNS, counter_windows
from specmon.analysis.summary import summarize
from specmon.follow.prometheus_api import Sample
from specmon.ingest.pipeline import detect_format, ingest_file, ingest_samples

PAGE = (DATA / "engines" / "vllm-prom-load-1.prom").read_text()
T0 = datetime(2026, 3, 24, 14, 6)


def frame(samples: list[Sample]) -> pd.DataFrame:
    return pd.DataFrame([{"segment_id": 1, "metric": s.metric, "series": s.series, "labels": s.series, "ts": s.ts,
                          "value": s.value} for s in samples])


def scrapes(metric: str, labels: dict, values: list[float], step_s: int = 15) -> list[Sample]:
    return [Sample(metric, labels, T0 + timedelta(seconds=step_s * i), v) for i, v in enumerate(values)]


def test_a_page_of_load_series_alone_is_read_as_a_baseline(store, tmp_path):
    first = tmp_path / "m0.prom"
    first.write_text(PAGE)
    os.utime(first, (1774361160, 1774361160))
    assert detect_format(str(first)) == "prometheus"
    res = ingest_file(store, str(first), run="off")
    assert res.status == "stored" and res.steps == 4 and any("baseline" in note for note in res.notes)
    # the same server 30 s later: 300 more tokens generated, 60 more prompt tokens, 4 requests running
    second = tmp_path / "m1.prom"
    second.write_text(PAGE.replace("} 500.0", "} 800.0").replace("prompt_tokens_total{engine=\"0\",model_name="
                                                                 "\"Qwen/Qwen3-0.6B\"} 80.0", "prompt_tokens_total{"
                                                                 "engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 140.0")
                      .replace("num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 0.0",
                               "num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 4.0"))
    os.utime(second, (1774361190, 1774361190))
    assert ingest_file(store, str(second), run="off").status == "stored"
    w = engine_segments.windows(store, "off")
    assert list(w.columns) == list(WINDOW_COLUMNS) and len(w) == 1
    row = w.iloc[0]
    assert (row["running_requests"], row["waiting_requests"]) == (2.0, 0.0)  # the mean of 0 and 4
    assert row["generation_throughput"] == pytest.approx(10.0) and row["prompt_throughput"] == pytest.approx(2.0)
    assert json.loads(row["labels"]) == {"engine": "0", "model_name": "Qwen/Qwen3-0.6B"}
    assert pd.isna(row["drafts"]) and pd.isna(row["draft_tokens"])
    seg, = summarize(store)
    assert seg["note"] == engine_segments.LOAD_ONLY_NOTE and seg["alpha"] is None


def test_data_parallel_engines_are_separate_windows_and_restarts_count_from_zero():
    samples = []
    for engine, drafts, generated in (("0", [0, 40, 10], [0, 300, 90]), ("1", [0, 20, 60], [0, 150, 450])):
        labels = {"engine": engine, "model_name": "m"}
        samples += scrapes("vllm:spec_decode_num_drafts_total", labels, drafts)
        samples += scrapes("vllm:generation_tokens_total", labels, generated)
        samples += scrapes("vllm:num_requests_running", labels, [2, 4, 6])
    w = counter_windows(frame(samples)).sort_values(["labels", "end_ts"])
    assert [json.loads(x)["engine"] for x in w["labels"]] == ["0", "0", "1", "1"]
    # engine 0 restarted before its third scrape: its window counts what the new process did
    assert list(w["drafts"]) == [40, 10, 20, 40]
    assert list(w["generation_throughput"]) == pytest.approx([20.0, 6.0, 10.0, 20.0])
    assert list(w["running_requests"]) == [3.0, 5.0, 3.0, 5.0]


def test_sglang_gauges_and_tensorrt_llm_counters_give_the_load_of_their_windows():
    sglang = {"dp_rank": "3", "model_name": "deepseek-r1"}
    samples = (scrapes("sglang:num_running_reqs", sglang, [8, 6]) + scrapes("sglang:num_queue_reqs", sglang, [2, 0])
               + scrapes("sglang:gen_throughput", sglang, [170.0, 150.0])
               + scrapes("sglang:spec_accept_length", sglang, [2.5, 2.6]))  # a gauge never differenced
    trt = {"model_name": "nemotron"}  # tensorrt_llm/metrics/collector.py's names
    samples += (scrapes("trtllm_num_requests_running", trt, [3, 3])
                + scrapes("trtllm_num_requests_waiting", trt, [1, 3])
                + scrapes("trtllm_generation_tokens_total", trt, [1000, 1450])
                + scrapes("trtllm_prompt_tokens_total", trt, [100, 400]))
    w = counter_windows(frame(samples)).set_index("labels")
    s = w.loc[json.dumps(sglang, sort_keys=True)]
    assert (s["running_requests"], s["waiting_requests"], s["generation_throughput"]) == (7.0, 1.0, 160.0)
    t = w.loc[json.dumps(trt, sort_keys=True)]
    assert (t["running_requests"], t["waiting_requests"]) == (3.0, 2.0)
    assert (t["generation_throughput"], t["prompt_throughput"]) == pytest.approx((30.0, 20.0))


def test_a_pull_of_load_series_alone_is_stored_and_declared_a_baseline(store):
    labels = {"engine": "0", "instance": "vllm:8000", "job": "vllm", "model_name": "m"}
    samples = (scrapes("vllm:num_requests_running", labels, [8, 8, 8]) + scrapes("vllm:num_requests_waiting", labels,
                                                                              [0, 1, 0])
               + scrapes("vllm:generation_tokens_total", labels, [0, 1500, 3000]))
    res = ingest_samples(store, samples, "prometheus", "off", baseline_of="eagle")
    assert res.status == "stored" and res.steps == 9
    w = engine_segments.windows(store, "off")
    assert list(w["generation_throughput"]) == [100.0, 100.0] and list(w["running_requests"]) == [8.0, 8.0]
    assert store.query("SELECT count(*) FROM baselines") == [(1,)]


def test_log_windows_and_counter_windows_share_their_columns(store, tmp_path):
    log = DATA / "engines" / "vllm-v1-load-1.log"
    ingest_file(store, str(log), run="both")
    logged = engine_segments.windows(store)
    assert list(logged.columns) == list(WINDOW_COLUMNS)
    labels = {"engine": "0"}
    ingest_samples(store, scrapes("vllm:num_requests_running", labels, [1, 3]), "prometheus", "both")
    both = engine_segments.windows(store)
    assert list(both.columns) == list(WINDOW_COLUMNS) and len(both) == len(logged) + 1
    assert both["running_requests"].tolist()[:3] == [2.0, 3.0, 3.0] and both["running_requests"].iloc[-1] == 2.0


def test_the_windows_drift_watches_keep_each_engine_of_a_counter_series(store):
    samples = []
    for engine in ("0", "1"):
        labels = {"engine": engine, "model_name": "m"}
        samples += scrapes("vllm:spec_decode_num_drafts_total", labels, [0, 40, 80])
        samples += scrapes("vllm:spec_decode_num_accepted_tokens_total", labels, [0, 50, 100])
        for pos, counts in (("0", [0, 30, 60]), ("1", [0, 20, 40])):
            samples += scrapes("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**labels, "position": pos},
                               counts)
    ingest_samples(store, samples, "prometheus", "dp")
    checked = engine_segments.checked_windows(store, "dp")
    assert sorted(checked["engine_label"]) == ["0", "0", "1", "1"]
    assert list(checked["accepted"]) == [50.0] * 4 and list(checked["checked"]) == [70.0] * 4
