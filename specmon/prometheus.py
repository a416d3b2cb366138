"""Prometheus: the speculative-decoding metrics, their samples, and the HTTP API (`specmon pull`); saved pages
(the text exposition format) are read by specmon.formats.prometheus_text.

specmon keeps the raw samples of the speculative-decoding counters (vLLM's, and llama.cpp's that mirror them)
and takes differences between consecutive samples of the same series itself, so a saved page, a series of
pages and a pull from a Prometheus server all go through one piece of code (counter_windows). A value below
the previous one is a restart: the counter began again from zero, so the window counts the new value.
SGLang's spec_accept_length and spec_accept_rate are gauges: kept as samples, never differenced or summed.
"""
from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd

from specmon.faults import SpecmonError

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


def counter_windows(samples: pd.DataFrame) -> pd.DataFrame:
    """Windows of counts from raw counter samples (columns segment_id, metric, series, labels, ts, value).

    Per series, each sample after the first gives a window (previous ts, ts] with delta = value - previous, or
    value where the counter fell (a restart). Series that differ only in labels are summed per scrape time;
    per-position series go into accepted_per_position. Returns one row per (segment_id, end_ts).
    """
    cols = ["segment_id", "start_ts", "end_ts", "drafts", "draft_tokens", "accepted_tokens",
            "accepted_per_position", "k", "labels"]
    counters = samples[~samples["metric"].isin(GAUGES)].sort_values(["segment_id", "metric", "series", "ts"])
    if counters.empty:
        return pd.DataFrame(columns=cols)
    g = counters.groupby(["segment_id", "metric", "series"], sort=False)
    counters = counters.assign(prev=g["value"].shift(), start_ts=g["ts"].shift())
    d = counters[counters["prev"].notna()].copy()
    d["delta"] = (d["value"] - d["prev"]).where(d["value"] >= d["prev"], d["value"])
    d["kind"] = d["metric"].str.split(":").str[1]
    d["position"] = d["labels"].map(lambda s: json.loads(s).get("position") if s else None)
    rows = []
    for (segment_id, end_ts), w in d.groupby(["segment_id", "ts"]):
        totals = w.groupby("kind")["delta"].sum()
        per_pos = w[w["kind"] == COUNTERS[3]].groupby("position")["delta"].sum()
        per_pos = per_pos.sort_index(key=lambda idx: idx.astype(int))
        label_sets = [json.loads(s) for s in w["labels"].unique() if s]
        common = {k: v for k, v in (label_sets[0].items() if label_sets else []) if k != "position"
                  and all(ls.get(k) == v for ls in label_sets)}
        rows.append({
            "segment_id": segment_id, "start_ts": w["start_ts"].min(), "end_ts": end_ts,
            "drafts": totals.get(COUNTERS[0]), "draft_tokens": totals.get(COUNTERS[1]),
            "accepted_tokens": totals.get(COUNTERS[2]),
            "accepted_per_position": per_pos.tolist() if len(per_pos) else None,
            "k": len(per_pos) or None, "labels": json.dumps(common)})
    return pd.DataFrame(rows, columns=cols)


def query_range(url: str, query: str, start: datetime, end: datetime, step_s: float, timeout: float = 30.0) -> list[dict]:
    """Prometheus /api/v1/query_range; returns its result list (one entry per series)."""
    params = urllib.parse.urlencode({"query": query, "start": start.replace(tzinfo=timezone.utc).timestamp(),
                                     "end": end.replace(tzinfo=timezone.utc).timestamp(), "step": step_s})
    full = f"{url.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(full, timeout=timeout) as resp:
            body = json.load(resp)
    except (OSError, ValueError) as exc:
        raise SpecmonError(f"{url}: Prometheus query failed ({exc})") from None
    if body.get("status") != "success":
        raise SpecmonError(f"{url}: Prometheus answered {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def pull(url: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
    """The raw speculative-decoding samples Prometheus holds between start and end, every step_s seconds."""
    samples = []
    for metric in [p + c for p in PREFIXES for c in COUNTERS] + list(GAUGES):
        for series in query_range(url, metric, start, end, step_s):
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            for ts, value in series["values"]:
                samples.append(Sample(metric, labels, datetime.fromtimestamp(float(ts), tz=timezone.utc)
                                      .replace(tzinfo=None), float(value)))
    return samples
