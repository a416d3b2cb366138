"""Segments from what serving engines report (specmon.ingest.formats.engine_log, specmon.follow.prometheus_api), in the
same shape as the step-log summaries, so pages and `specmon summary` show them side by side.

Engines log counts, not distributions: beta is unknown (null) for them. Per-token alpha needs the per-position
counts (position 1 is checked on every draft, position i when i - 1 was accepted): checked = drafts +
sum_{i<k} accepted_at_i. Where an engine gives only accepted and drafted tokens (early vLLM V1, llama.cpp's
summaries), alpha stays null and its accepted/drafted rate is reported as draft_acceptance_rate. A request spans
neighbouring windows, so windows are not independent: the intervals sum them into bins of one engine (a minute up to
four hours of windows; DuckDB sums them, window_sums) and take the Bartlett (Newey-West) variance with a bandwidth of
30 minutes or an eighth of the span (stats.SerialSums), and give none where the windows span under
MIN_WINDOW_SPAN_SECONDS.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from typing import NamedTuple

import numpy as np
import pandas as pd

from specmon.analysis import engine_label, window_sums
from specmon.core import stats
from specmon.core.segments import Estimate, PositionSummary, SegmentSummary, economics, position_summary
from specmon.core.settings import (
    BUCKETS,
    CONFIDENCE,
    MIN_WINDOW_SPAN_SECONDS,
    WINDOW_BLOCK_SECONDS,
)
from specmon.core.window_grid import serial_sums
from specmon.ingest.formats.prometheus_metrics import (
    COUNTERS,
    GAUGES,
    GENERATED,
    GENERATION_RATE,
    POSITION_LABELS,
    PROMPT,
    RUNNING,
    WAITING,
    is_counter,
    position,
    role,
)
from specmon.store.database import Store

LOAD_COLUMNS = ("running_requests", "waiting_requests", "generation_throughput", "prompt_throughput")
# What windows() returns, for log lines, JSON responses and Prometheus counters alike.
WINDOW_COLUMNS = ("run", "template", "segment_id", "engine", "source", "end_ts", "start_ts", "drafts", "draft_tokens",
                  "accepted_tokens", "accepted_per_position", "k", "mean_acceptance_length", "reported_rate",
                  "ingested_at", *LOAD_COLUMNS, "labels")
# Of a stored window's labels only the `engine` entry (engine_label) is read; a vLLM line's labels also hold its own
# throughputs, a different text on every line, which at a million lines cost seconds to parse and most of the
# frame's memory.
_ENGINE_LABEL = (f"CASE WHEN w.labels->>'{engine_label.KEY}' IS NULL THEN '{{}}' "
                 f"ELSE json_object('{engine_label.KEY}', w.labels->>'{engine_label.KEY}')::VARCHAR END")
_WINDOWS_SQL = f"""
SELECT rs.run, rs.template, w.segment_id, w.engine, w.source, w.end_ts, w.start_ts, w.drafts, w.draft_tokens,
       w.accepted_tokens, w.accepted_per_position, w.k, w.mean_acceptance_length, w.reported_rate, i.ingested_at,
       w.running_requests, w.waiting_requests, w.generation_throughput, w.prompt_throughput, {_ENGINE_LABEL} AS labels
FROM engine_windows w JOIN run_segments rs USING (segment_id) JOIN ingests i USING (ingest_id)
WHERE (? IS NULL OR rs.run = ?) ORDER BY w.end_ts, w.window_id
"""
# The windows the drift detector watches (PositionCounts.checks, in SQL): a million-line log's whole windows frame,
# lists and load columns included, held about 0.6 GB where these columns hold a tenth of that.
_CHECKED_WINDOWS_SQL = f"""
SELECT rs.template, w.end_ts, w.k, {engine_label.stored_sql('w.labels')} AS engine_label,
       list_sum(w.accepted_per_position) AS accepted,
       w.drafts + coalesce(list_sum(w.accepted_per_position[1:len(w.accepted_per_position) - 1]), 0) AS checked
FROM engine_windows w JOIN run_segments rs USING (segment_id)
WHERE rs.run = ? AND len(w.accepted_per_position) > 0 AND w.drafts IS NOT NULL AND NOT isnan(w.drafts)
ORDER BY w.end_ts, w.window_id
"""
_SAMPLES_SQL = """
SELECT c.segment_id, c.metric, c.series, c.labels::VARCHAR AS labels, c.ts, c.value
FROM counter_samples c JOIN run_segments rs USING (segment_id)
WHERE (? IS NULL OR rs.run = ?) ORDER BY c.segment_id, c.series, c.ts
"""
_SEGMENTS_SQL = """
SELECT rs.segment_id, rs.run, rs.template, max(i.ingested_at) AS ingested_at
FROM counter_samples c JOIN run_segments rs USING (segment_id) JOIN ingests i USING (ingest_id)
WHERE (? IS NULL OR rs.run = ?) GROUP BY ALL
"""


def _key(labels: str | None) -> str:
    """The engine a series belongs to: its label set without the per-position counter's own label (`position`;
    TensorRT-LLM's `token_position`)."""
    found = json.loads(labels) if labels else {}
    for name in POSITION_LABELS:
        found.pop(name, None)
    return json.dumps(found, sort_keys=True)


def counter_windows(samples: pd.DataFrame) -> pd.DataFrame:
    """Windows from raw samples (columns segment_id, metric, series, labels, ts, value): the speculative-decoding
    counters and the load series (prometheus_metrics.LOAD); the speculative gauges (SGLang's spec_accept,
    TensorRT-LLM's acceptance_length and draft_overhead) are left out.

    Per series, each sample after the first ends a window (previous ts, ts]. A counter's window counts value -
    previous, or value where the counter fell (a restart). Series of one engine (the same labels but for
    `position`: vLLM's data-parallel `engine` label, model_name, Prometheus' instance) make one window per scrape
    time, different engines separate windows; per-position series go into accepted_per_position. The load of a
    window: running_requests and waiting_requests are the gauges' mean over the window's two ends (the time
    average, were the gauge to move in a straight line between the scrapes); generation_throughput and
    prompt_throughput are the token counters' increase over the window's seconds, or, for SGLang, which exports
    no token counter, the mean of its gen_throughput gauge over the two ends. Returns one row per (segment_id,
    labels, end_ts).
    """
    cols = ["segment_id", "start_ts", "end_ts", "drafts", "draft_tokens", "accepted_tokens",
            "accepted_per_position", "k", "labels", *LOAD_COLUMNS]
    kept = samples[~samples["metric"].isin(GAUGES)]
    if kept.empty:
        return pd.DataFrame(columns=cols)
    kept = kept.sort_values(["segment_id", "metric", "series", "ts"])
    g = kept.groupby(["segment_id", "metric", "series"], sort=False)
    kept = kept.assign(prev=g["value"].shift(), start_ts=g["ts"].shift())
    d = kept[kept["prev"].notna()].copy()
    if d.empty:
        return pd.DataFrame(columns=cols)
    counter = d["metric"].map(is_counter)
    # a counter's window counts its increase (everything, after a restart); a gauge's is its mean over the two ends
    d["delta"] = (d["value"] - d["prev"]).where(d["value"] >= d["prev"], d["value"]).where(counter,
                                                                                         (d["value"] + d["prev"]) / 2)
    seconds = (d["ts"] - d["start_ts"]).dt.total_seconds()
    d["rate"] = (d["delta"] / seconds).where(counter & (seconds > 0))
    d["kind"] = d["metric"].map(role)
    keys = {s: _key(s) for s in d["labels"].unique()}
    d["key"] = d["labels"].map(keys)
    d["position"] = d["labels"].map(lambda s: position(json.loads(s)) if s else None)
    rows = []
    for (segment_id, key, end_ts), w in d.groupby(["segment_id", "key", "ts"], sort=True):
        totals = w.groupby("kind")["delta"].sum()
        rates = w.groupby("kind")["rate"].sum(min_count=1)
        per_pos = w[w["kind"] == COUNTERS[3]].groupby("position")["delta"].sum()
        per_pos = per_pos.sort_index(key=lambda idx: idx.astype(int))
        generation = rates.get(GENERATED)
        rows.append({
            "segment_id": segment_id, "start_ts": w["start_ts"].min(), "end_ts": end_ts,
            "drafts": totals.get(COUNTERS[0]), "draft_tokens": totals.get(COUNTERS[1]),
            "accepted_tokens": totals.get(COUNTERS[2]),
            "accepted_per_position": per_pos.tolist() if len(per_pos) else None,
            "k": len(per_pos) or None, "labels": key,
            "running_requests": totals.get(RUNNING), "waiting_requests": totals.get(WAITING),
            "generation_throughput": totals.get(GENERATION_RATE) if generation is None or pd.isna(generation)
            else generation,
            "prompt_throughput": rates.get(PROMPT)})
    return pd.DataFrame(rows, columns=cols)


def counted_windows(store: Store, run: str | None = None) -> pd.DataFrame:
    """The windows of Prometheus counter samples (counter_windows) with their segment's run, template and latest
    ingest time; empty where none is stored."""
    samples = store.query_df(_SAMPLES_SQL, [run, run])
    counted = counter_windows(samples) if not samples.empty else pd.DataFrame()
    return counted if counted.empty else counted.merge(store.query_df(_SEGMENTS_SQL, [run, run]), on="segment_id")


def windows(store: Store, run: str | None = None) -> pd.DataFrame:
    """Every engine window: log lines and per-request JSON as stored, Prometheus counters differenced. Columns:
    WINDOW_COLUMNS (the load columns are NULL where a source gives no load; a window with load and no speculative
    figures is an engine without speculation, or an interval that drafted nothing)."""
    logged = store.query_df(_WINDOWS_SQL, [run, run])
    counted = counted_windows(store, run)
    if counted.empty:
        return logged[list(WINDOW_COLUMNS)]
    counted = counted.assign(engine="prometheus", source="prometheus", mean_acceptance_length=None,
                             reported_rate=None)
    counted = counted[list(WINDOW_COLUMNS)]
    if logged.empty:
        return counted.reset_index(drop=True)
    return pd.concat([logged[list(WINDOW_COLUMNS)], counted], ignore_index=True)


def checked_windows(store: Store, run: str) -> pd.DataFrame:
    """A run's windows whose per-position counts give their accepted and checked positions (PositionCounts), in time
    order (log windows before counter windows at the same time, as windows() has them): columns template, end_ts,
    k, engine_label, accepted, checked."""
    cols = ["template", "end_ts", "k", "engine_label", "accepted", "checked"]
    logged = store.query_df(_CHECKED_WINDOWS_SQL, [run])
    counted = counted_windows(store, run)
    if counted.empty:
        return logged[cols]
    counts = position_counts(counted)
    if not len(counts.rows):
        return logged[cols]
    accepted, checked = counts.checks()
    counted = counted.iloc[counts.rows].assign(accepted=accepted, checked=checked)
    counted["engine_label"] = engine_label.of_labels(counted["labels"])
    both = pd.concat([logged[cols], counted[cols]], ignore_index=True) if not logged.empty else counted[cols]
    return both.sort_values("end_ts", kind="stable").reset_index(drop=True)


def _has_positions(value: object) -> bool:
    return isinstance(value, (list, np.ndarray)) and len(value) > 0


def summarize_engines(store: Store, by: str = "template", c: float | None = None, *, run: str | None = None,
                      bucket: str | None = None, since: datetime | None = None,
                      declared: dict[str, float] | None = None,
                      position_intervals: bool = True) -> list[SegmentSummary]:
    """Engine segments with the keys of summary.summarize (beta and the gap test null), summed in DuckDB
    (window_sums). Engines log no draft timings, so c is the one given, else the one declared for the run
    (summary.declared_costs), else unknown. position_intervals=False: each position's counts without its interval
    (a timeline's buckets)."""
    counted = counted_windows(store, run)
    bucket_seconds = pd.Timedelta(BUCKETS[bucket]).total_seconds() if bucket else None
    out = []
    for sums in window_sums.stored(store, by, run=run, bucket_seconds=bucket_seconds, since=since,
                                   counted=None if counted.empty else counted):
        key = {"run": sums.run, "template": sums.template, "bucket": sums.bucket}
        declared_c = (declared or {}).get(sums.run)
        if c is not None:
            cost, source = c, "given"
        elif declared_c is not None:
            cost, source = declared_c, "declared"
        else:
            cost, source = None, None
        out.append(segment_of_sums(key, sums, cost, bucket is not None, source, position_intervals))
    return out


LOAD_ONLY_NOTE = ("no acceptance figures: these windows carry the engine's load (requests running, throughput) and "
                  "no speculative-decoding figures; the engine ran without speculation (a baseline: declare it with "
                  "--baseline-of RUN) or drafted nothing")


def position_lengths(windows: pd.DataFrame) -> np.ndarray:
    """How many per-position counts each window holds (0 where none)."""
    return np.fromiter((len(v) if _has_positions(v) else 0 for v in windows["accepted_per_position"]),
                       dtype=np.int64, count=len(windows))


class PositionCounts(NamedTuple):
    rows: np.ndarray  # the windows (places in the frame) that give per-position counts and drafts
    accepted: np.ndarray  # their accepted counts by position, a row per window, zeros past a window's own k
    lengths: np.ndarray  # each window's own number of positions
    drafts: np.ndarray

    def checks(self) -> tuple[np.ndarray, np.ndarray]:
        """Accepted and checked positions per window: checked = drafts + the accepted counts of every position but
        the window's last."""
        accepted = self.accepted.sum(axis=1)
        last = self.accepted[np.arange(len(self.rows)), self.lengths - 1]
        return accepted, self.drafts + accepted - last


def position_counts(part: pd.DataFrame) -> PositionCounts:
    """The per-position counts of the windows that give them and their drafts, as one matrix (a Python loop per
    window cost seconds at a million windows)."""
    lengths = position_lengths(part)
    rows = np.flatnonzero((lengths > 0) & part["drafts"].notna().to_numpy())
    lengths = lengths[rows]
    values = part["accepted_per_position"].to_numpy(object)[rows]
    width = int(lengths.max()) if len(rows) else 0
    if len(rows) and (lengths == width).all():
        accepted = np.array([np.asarray(v, dtype=float) for v in values]).reshape(len(rows), width)
    else:
        accepted = np.zeros((len(rows), width))
        for row, v in enumerate(values):
            accepted[row, :len(v)] = np.asarray(v, dtype=float)
    return PositionCounts(rows, accepted, lengths, part["drafts"].to_numpy(float)[rows])


def _tokens_per_step(sums: window_sums.SegmentSums) -> tuple[float | None, str | None]:
    """L = 1 + accepted / drafts over the windows that count both (as its interval, _tokens_interval); else the
    mean of the engine's own L gauge."""
    if sums.drafts and sums.counted_drafts and sums.counted_accepted is not None:
        return 1.0 + sums.counted_accepted / sums.counted_drafts, None
    if sums.mean_acceptance_length is not None:
        return sums.mean_acceptance_length, "tokens per step is the unweighted mean of the engine's reported gauge"
    return None, None


SHORT_SPAN_NOTE = (f"no interval yet: the windows span under {MIN_WINDOW_SPAN_SECONDS / 60:g} minutes, and requests "
                   "outlive a window, so windows are not independent observations and so short a span cannot show "
                   "how much requests differ")


def window_blocks(part: pd.DataFrame, seconds: float = WINDOW_BLOCK_SECONDS) -> pd.Series:
    """Each window's block: its engine (engine_label) and the bucket of `seconds` it ends in, the cluster of drift's
    block bootstrap and of template comparisons on engine windows."""
    bucket = part["end_ts"].dt.floor(pd.Timedelta(seconds=seconds)).astype(str)
    return part["engine_label"] + "@" + bucket


def _tokens_interval(tokens: window_sums.TokenBins, alpha: stats.Interval) -> tuple[float | None, float | None]:
    """L's interval from the windows that count both drafts and accepted tokens (stats.SerialSums), at alpha's
    degrees of freedom."""
    iv = stats.ratio_interval(serial_sums(tokens.bins, tokens.accepted, tokens.drafts), alpha.dof, CONFIDENCE)
    return (None, None) if iv is None else (1 + max(iv[0], 0.0), 1 + iv[1])


def _positions(checks: window_sums.CheckBins, interval: bool) -> tuple[PositionSummary, ...]:
    """Per-position rates summed over the windows that give per-position counts: position 1 is reached by every
    draft, position i by the drafts accepted at i - 1, in the windows whose draft has an i-th position (k can change
    within a segment); each position's interval its own stats.SerialSums, or none (interval=False)."""
    accepted, reached = checks.position_accepted, checks.position_reached
    drafts = float(reached[:, 0].sum())
    return tuple(position_summary(i + 1, float(reached[:, i].sum()), float(accepted[:, i].sum()), drafts,
                                  sums=serial_sums(checks.bins, accepted[:, i], reached[:, i]) if interval else None)
                 for i in range(accepted.shape[1]))


def segment_of_windows(key: dict, part: pd.DataFrame, c: float | None, bucketed: bool = False,
                       c_source: str | None = None) -> SegmentSummary:
    """One engine segment (key: run, and template and bucket where grouped) from a frame of its windows
    (WINDOW_COLUMNS), summed as the store's are (window_sums)."""
    sums = window_sums.of_frame(part)
    if sums is None:
        raise ValueError("no windows to summarize")
    return segment_of_sums(key, sums, c, bucketed, c_source)


def segment_of_sums(key: dict, sums: window_sums.SegmentSums, c: float | None, bucketed: bool = False,
                    c_source: str | None = None, position_intervals: bool = True) -> SegmentSummary:
    """One engine segment from its windows' sums, with intervals whose variance pairs neighbouring windows
    (stats.SerialSums) where they span MIN_WINDOW_SPAN_SECONDS; each position's too, unless position_intervals is
    False."""
    tokens_per_step, note = _tokens_per_step(sums)
    checks = sums.checks
    alpha, tokens = Estimate(), Estimate(tokens_per_step)
    iv = None
    if checks is not None:
        a, n = float(checks.accepted.sum()), float(checks.checked.sum())
        if checks.bins.minutes * 60 < MIN_WINDOW_SPAN_SECONDS:
            alpha = Estimate(a / n if n else None)
            note = note or SHORT_SPAN_NOTE
        else:
            iv = stats.cluster_interval(serial_sums(checks.bins, checks.accepted, checks.checked), CONFIDENCE)
            alpha = Estimate(iv.estimate, iv.lo, iv.hi)
            tokens = Estimate(tokens_per_step, *(_tokens_interval(sums.tokens, iv) if sums.drafts and sums.tokens
                                                 else (None, None)))
    elif note is None:
        note = "per-token alpha needs per-position counts, which this engine output does not give"
    if not sums.speculating:
        note = LOAD_ONLY_NOTE
    n_drafts, drafted, accepted = sums.drafts, sums.draft_tokens, sums.accepted_tokens
    mean_draft_len = drafted / n_drafts if drafted and n_drafts else None
    bucket = key.get("bucket")
    per_position = _positions(checks, iv is not None and position_intervals) if checks is not None else ()
    return SegmentSummary(
        run=key["run"], template=key.get("template") or None, day=None,
        bucket_start=pd.Timestamp(bucket).isoformat() if bucketed and not pd.isna(bucket) else None,
        demo=False, k=sums.k, steps=int(round(n_drafts)) if n_drafts else 0, requests=None, drafted=drafted,
        checked=float(checks.checked.sum()) if checks is not None else None, accepted=accepted, alpha=alpha,
        design_effect=iv.design_effect if iv else None,
        interval_dof=None if iv is None or math.isinf(iv.dof) else iv.dof, beta=Estimate(), gap_z=None,
        agreement=None, tokens_per_step=tokens, mean_draft_len=mean_draft_len,
        economics=economics(sums.k, c, c_source, alpha, tokens, mean_draft_len, per_position, n_drafts or 0),
        first_ts=sums.first_ts.isoformat(), last_ts=sums.last_ts.isoformat(),
        source="engine", costs=None, ts_inferred_steps=0, last_ingest=sums.last_ingest.isoformat(),
        per_position=per_position, engine=", ".join(sums.engines),
        draft_acceptance_rate=accepted / drafted if accepted is not None and drafted else None,
        windows=sums.windows, note=note, running_requests=sums.running_requests,
        generation_throughput=sums.generation_throughput,
    )
