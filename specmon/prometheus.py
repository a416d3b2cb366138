"""Prometheus: the text exposition format (a saved /metrics page) and the HTTP API (`specmon pull`).

specmon keeps the raw samples of the speculative-decoding counters (vLLM's, and llama.cpp's that mirror them)
and takes differences between consecutive samples of the same series itself, so a saved page, a series of
pages and a pull from a Prometheus server all go through one piece of code (counter_windows). A value below
the previous one is a restart: the counter began again from zero, so the window counts the new value.
SGLang's spec_accept_length and spec_accept_rate are gauges: kept as samples, never differenced or summed.
"""
from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pandas as pd

from specmon.faults import Fault, RowFault, SpecmonError
from specmon.formats import textio
from specmon.limits import MAX_ENGINE_LINE_BYTES

COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
            "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total")
GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate")
PREFIXES = ("vllm:", "llamacpp:")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


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


def _labels(text: str | None) -> dict | None:
    if not text:
        return {}
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            return None
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\\\", "\\")
        pos = m.end()
    return out


# Sample timestamps (milliseconds) that fall within the years 1 to 9999.
_MIN_MS, _MAX_MS = -62135596800000, 253402300799999


def _sample(line: str, scrape_ts: datetime) -> Sample | None:
    """One wanted sample of a line, None for other metrics; raises RowFault naming the metric."""
    m = _SAMPLE.match(line.strip())
    metric = m.group(1) if m else line.split("{")[0].split()[0]
    if not wanted(metric):
        return None
    labels = _labels(m.group(2)) if m else None
    if labels is None:
        raise RowFault(metric, "a speculative-decoding sample that does not parse")
    try:
        value = float(m.group(3))
    except ValueError:
        raise RowFault(metric, f"value {m.group(3)[:40]!r} is not a number") from None
    if not math.isfinite(value) or (metric not in GAUGES and value < 0):
        raise RowFault(metric, f"value {value:g}: a counter is a finite count >= 0")
    if m.group(4) is None:
        return Sample(metric, labels, scrape_ts, value)
    ms = int(m.group(4)) if len(m.group(4)) <= 16 else _MAX_MS + 1
    if not _MIN_MS <= ms <= _MAX_MS:
        raise RowFault(metric, f"timestamp {m.group(4)[:24]} ms is outside the years 1 to 9999")
    return Sample(metric, labels, datetime(1970, 1, 1) + timedelta(milliseconds=ms), value)


def parse_exposition(path: str, name: str, scrape_ts: datetime) -> tuple[list[Sample], list[Fault]]:
    """The speculative-decoding samples of a text exposition (plain or gzip). Samples without their own timestamp
    get scrape_ts (the file's modification time, for a saved page); with timestamps, one file can hold a series."""
    samples, faults = [], []
    try:
        for no, raw, too_long in textio.lines(path, MAX_ENGINE_LINE_BYTES):
            line = raw.decode("utf-8", "replace")
            if not line.strip() or line.startswith("#"):
                continue
            if too_long:
                if any(line.startswith(p) for p in PREFIXES + ("sglang:",)):
                    faults.append(Fault(name, no, "", f"line longer than {MAX_ENGINE_LINE_BYTES} bytes"))
                continue
            try:
                sample = _sample(line, scrape_ts)
            except RowFault as exc:
                faults.append(Fault(name, no, exc.field, exc.reason))
                continue
            if sample is not None:
                samples.append(sample)
    except textio.Unreadable as exc:
        return [], [Fault(name, 0, "", str(exc))]
    return samples, faults


def sniff(head: bytes) -> bool:
    text = head.decode("utf-8", "replace")
    return any(f"{p}{c}" in text for p in PREFIXES for c in COUNTERS) or any(g in text for g in GAUGES)


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
