"""The Prometheus metrics specmon reads, and one sample of them, for saved pages and for pulls from a server alike.

specmon keeps the raw samples of the speculative-decoding counters (vLLM's, and llama.cpp's that mirror them)
and takes differences between consecutive samples of the same series itself (specmon.analysis.engine_segments'
counter_windows), so a saved page, a series of pages and a pull from a Prometheus server all go through one piece
of code. SGLang's spec_accept_length and spec_accept_rate are gauges: kept as samples, never differenced or summed.

Beside them, the load series each engine exports (LOAD: metric -> what it measures), checked against each engine's
source: vLLM's vllm/v1/metrics/loggers.py (num_requests_running and num_requests_waiting are gauges,
generation_tokens and prompt_tokens counters that prometheus_client exposes with `_total`), SGLang's
metrics_collector.py (num_running_reqs, num_queue_reqs and gen_throughput, all gauges), llama.cpp's
tools/server (requests_processing and requests_deferred gauges, tokens_predicted_total and prompt_tokens_total
counters) and TensorRT-LLM's tensorrt_llm/metrics/collector.py (trtllm_num_requests_running and
trtllm_num_requests_waiting gauges, trtllm_generation_tokens_total and trtllm_prompt_tokens_total counters; its
server exposes them at /prometheus/metrics).

TensorRT-LLM's speculative-decoding series (the same collector.py) are named apart from vLLM's and llama.cpp's:
trtllm_spec_decode_num_draft_tokens_total and trtllm_spec_decode_num_accepted_tokens_total are counters of every
iteration's draft and accepted tokens, trtllm_spec_decode_accepted_tokens_total{token_position} counts accepted
tokens per draft position (added when a request finishes), and trtllm_spec_decode_acceptance_length and
trtllm_spec_decode_draft_overhead are gauges of the last iteration (kept as samples, never differenced). It exports
no count of drafts (verification steps), so its windows carry draft and accepted tokens but no drafts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
            "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total")
# Speculative-decoding gauges: kept as samples, never differenced or summed into windows.
GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate", "trtllm_spec_decode_acceptance_length",
          "trtllm_spec_decode_draft_overhead")
PREFIXES = ("vllm:", "llamacpp:")
# TensorRT-LLM's counters, by the role (one of COUNTERS) each plays in a window.
TRTLLM_COUNTERS = {
    "trtllm_spec_decode_num_draft_tokens_total": COUNTERS[1],
    "trtllm_spec_decode_num_accepted_tokens_total": COUNTERS[2],
    "trtllm_spec_decode_accepted_tokens_total": COUNTERS[3],
}
# The label naming a per-position counter's draft position: vLLM's and llama.cpp's, then TensorRT-LLM's.
POSITION_LABELS = ("position", "token_position")

# What each load series measures: requests running or waiting (gauges), tokens generated or prompt tokens processed
# (counters), or the engine's own generation rate in tokens/s (a gauge).
RUNNING, WAITING, GENERATED, PROMPT, GENERATION_RATE = "running", "waiting", "generated", "prompt", "generation rate"
LOAD = {
    "vllm:num_requests_running": RUNNING, "vllm:num_requests_waiting": WAITING,
    "vllm:generation_tokens_total": GENERATED, "vllm:prompt_tokens_total": PROMPT,
    "sglang:num_running_reqs": RUNNING, "sglang:num_queue_reqs": WAITING, "sglang:gen_throughput": GENERATION_RATE,
    "llamacpp:requests_processing": RUNNING, "llamacpp:requests_deferred": WAITING,
    "llamacpp:tokens_predicted_total": GENERATED, "llamacpp:prompt_tokens_total": PROMPT,
    "trtllm_num_requests_running": RUNNING, "trtllm_num_requests_waiting": WAITING,
    "trtllm_generation_tokens_total": GENERATED, "trtllm_prompt_tokens_total": PROMPT,
}
LOAD_COUNTERS = frozenset(m for m, role in LOAD.items() if role in (GENERATED, PROMPT))


@dataclass(frozen=True)
class Sample:
    metric: str
    labels: dict
    ts: datetime
    value: float

    @property
    def series(self) -> str:
        return json.dumps(self.labels, sort_keys=True)


def speculative(metric: str) -> bool:
    """A speculative-decoding counter or gauge."""
    return metric in GAUGES or metric in TRTLLM_COUNTERS or any(metric == p + c for p in PREFIXES for c in COUNTERS)


def role(metric: str) -> str:
    """What a wanted metric measures in a window: its LOAD role, its COUNTERS name (whichever engine's naming), or,
    for a gauge, its own name."""
    if metric in LOAD:
        return LOAD[metric]
    return TRTLLM_COUNTERS.get(metric) or metric.split(":", 1)[-1]


def position(labels: dict) -> str | None:
    """The draft position a per-position counter's labels name (None for every other series)."""
    return next((labels[name] for name in POSITION_LABELS if name in labels), None)


def wanted(metric: str) -> bool:
    return speculative(metric) or metric in LOAD


def is_counter(metric: str) -> bool:
    """A counter (only counts up; a fall is a restart), as opposed to a gauge."""
    return metric not in GAUGES and (metric in LOAD_COUNTERS or metric not in LOAD)


def metrics() -> list[str]:
    """Every metric a pull asks Prometheus for."""
    return [p + c for p in PREFIXES for c in COUNTERS] + list(TRTLLM_COUNTERS) + list(GAUGES) + list(LOAD)
