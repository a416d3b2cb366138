"""The Prometheus metrics specmon reads, and one sample of them, for saved pages and for pulls from a server alike.

specmon keeps the raw samples of the speculative-decoding counters (vLLM's, and llama.cpp's that mirror them)
and takes differences between consecutive samples of the same series itself (specmon.analysis.engine_segments'
counter_windows), so a saved page, a series of pages and a pull from a Prometheus server all go through one piece
of code. SGLang's spec_accept_length and spec_accept_rate are gauges: kept as samples, never differenced or summed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
            "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total")
GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate")
PREFIXES = ("vllm:", "llamacpp:")


@dataclass(frozen=True)
class Sample:
    metric: str
    labels: dict
    ts: datetime
    value: float

    @property
    def series(self) -> str:
        return json.dumps(self.labels, sort_keys=True)


def wanted(metric: str) -> bool:
    return metric in GAUGES or any(metric == p + c for p in PREFIXES for c in COUNTERS)
