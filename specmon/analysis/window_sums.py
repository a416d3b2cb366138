"""Engine windows summed in DuckDB into what a segment's figures read: each segment's totals, and the counts of each
bin of the grid its intervals pair (core.window_grid). A month of 10-second windows is a few hundred bins, so a
summary moves those into Python instead of every window.

The same queries read the store (log lines and per-request JSON as stored, Prometheus counters differenced) and a
frame of windows (WINDOW_COLUMNS), so both give one segment the same figures.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import duckdb
import numpy as np
import pandas as pd

from specmon.analysis import engine_label
from specmon.core.segments import finite
from specmon.core.window_grid import WindowBins, bin_places, minutes_spanned, window_bin_seconds
from specmon.store.database import Store, connect

# A window's figures with DuckDB's NULL where an engine gives none (a frame from pandas writes NaN).
_NUMBERS = ("drafts", "draft_tokens", "accepted_tokens", "mean_acceptance_length", "running_requests",
            "generation_throughput")
_SOURCE = """
SELECT {run} AS run, {template} AS template, {bucket} AS bucket, engine, end_ts, ingested_at, k,
       {engine_of} AS engine_label, accepted_per_position::DOUBLE[] AS positions,
       floor(epoch(end_ts))::BIGINT AS second, {numbers}
FROM ({windows}) WHERE (?::TIMESTAMP IS NULL OR end_ts >= ?::TIMESTAMP)
"""
_STORED = """
SELECT rs.run, rs.template, w.engine, w.end_ts, w.drafts, w.draft_tokens, w.accepted_tokens,
       w.accepted_per_position, w.k, w.mean_acceptance_length, i.ingested_at, w.running_requests,
       w.generation_throughput, w.labels
FROM engine_windows w JOIN run_segments rs USING (segment_id) JOIN ingests i USING (ingest_id)
WHERE (? IS NULL OR rs.run = ?)
"""
_COUNTED = """
SELECT run, template, 'prometheus' AS engine, end_ts, drafts, draft_tokens, accepted_tokens,
       accepted_per_position, k, NULL::DOUBLE AS mean_acceptance_length, ingested_at, running_requests,
       generation_throughput, labels::JSON AS labels
FROM counted_windows
"""
# Windows with speculative figures; where a segment has none, its windows carry the load alone and are kept.
_PART = """
WITH source AS ({source}),
flagged AS (
    SELECT *, drafts IS NOT NULL OR draft_tokens IS NOT NULL OR accepted_tokens IS NOT NULL
              OR mean_acceptance_length IS NOT NULL OR coalesce(len(positions), 0) > 0 AS speculating
    FROM source
),
segments AS (
    SELECT *, row_number() OVER (ORDER BY run, template, bucket) AS segment
    FROM (SELECT run, template, bucket, bool_or(speculating) AS any_speculating FROM flagged GROUP BY ALL)
),
part AS (
    SELECT f.*, s.segment FROM flagged f JOIN segments s ON f.run IS NOT DISTINCT FROM s.run
        AND f.template IS NOT DISTINCT FROM s.template AND f.bucket IS NOT DISTINCT FROM s.bucket
    WHERE f.speculating OR NOT s.any_speculating
)
"""
# The windows whose per-position counts give alpha (checked = drafts + the counts of every position but the
# window's last), and those that count L (drafts and accepted tokens).
_CHECKS = "coalesce(len(positions), 0) > 0 AND drafts IS NOT NULL"
_TOKENS = "drafts IS NOT NULL AND accepted_tokens IS NOT NULL"
_TOTALS = """
SELECT segment, any_value(run) AS run, any_value(template) AS template, any_value(bucket) AS bucket,
       count(*) AS windows, min(end_ts) AS first_ts, max(end_ts) AS last_ts, max(ingested_at) AS last_ingest,
       list(DISTINCT engine) AS engines, max(k) AS k, bool_or(speculating) AS speculating,
       sum(drafts) AS drafts, sum(draft_tokens) AS draft_tokens, sum(accepted_tokens) AS accepted_tokens,
       sum(drafts) FILTER (WHERE {tokens}) AS counted_drafts,
       sum(accepted_tokens) FILTER (WHERE {tokens}) AS counted_accepted,
       avg(mean_acceptance_length) AS mean_acceptance_length, avg(running_requests) AS running_requests,
       avg(generation_throughput) AS generation_throughput,
       coalesce(max(len(positions)) FILTER (WHERE {checks}), 0) AS width
FROM part GROUP BY segment ORDER BY segment
"""
_SPANS = """
SELECT segment, engine_label, min(second // 60) AS first_minute, max(second // 60) AS last_minute
FROM part WHERE {subset} GROUP BY ALL
"""
_BINS = """
, widths AS (SELECT unnest(?::BIGINT[]) AS segment, unnest(?::DOUBLE[]) AS bin_seconds)
SELECT segment, engine_label, floor(second / bin_seconds)::BIGINT AS bin, {sums}
FROM part JOIN widths USING (segment) WHERE {subset} GROUP BY ALL ORDER BY segment, engine_label, bin
"""
_CHECK_SUMS = ("sum(list_sum(positions)) AS accepted, "
               "sum(drafts + list_sum(positions) - positions[len(positions)]) AS checked")
_TOKEN_SUMS = "sum(accepted_tokens) AS accepted, sum(drafts) AS drafts"


@dataclass(frozen=True)
class CheckBins:
    """The windows that count positions, summed by bin: accepted over checked positions, and at each position i
    (a column) the drafts whose accepted prefix reached it (`reached`: every draft at position 1, those accepted at
    i - 1 after it, where the window's draft has an i-th position) and those accepted there."""
    bins: WindowBins
    accepted: np.ndarray
    checked: np.ndarray
    position_accepted: np.ndarray
    position_reached: np.ndarray


@dataclass(frozen=True)
class TokenBins:
    """The windows that count drafts and accepted tokens (L), summed by bin."""
    bins: WindowBins
    accepted: np.ndarray
    drafts: np.ndarray


@dataclass(frozen=True)
class SegmentSums:
    """One segment's windows (those with speculative figures, or all where none has any): totals are None where no
    window gives the figure."""
    run: str
    template: str | None
    bucket: pd.Timestamp | None
    windows: int
    first_ts: pd.Timestamp
    last_ts: pd.Timestamp
    last_ingest: pd.Timestamp
    engines: tuple[str, ...]
    k: int | None
    speculating: bool
    drafts: float | None
    draft_tokens: float | None
    accepted_tokens: float | None
    counted_drafts: float | None  # over the windows that count L
    counted_accepted: float | None
    mean_acceptance_length: float | None  # the engine's own L gauge, unweighted mean
    running_requests: float | None
    generation_throughput: float | None
    checks: CheckBins | None
    tokens: TokenBins | None


def stored(store: Store, by: str = "template", *, run: str | None = None, bucket_seconds: float | None = None,
           since: datetime | None = None, counted: pd.DataFrame | None = None) -> list[SegmentSums]:
    """The store's segments: by run, or by run and template; within each, by buckets of `bucket_seconds` of end
    time (from the epoch) where given; windows ending at or after `since` alone. `counted`: windows differenced from
    counter samples (engine_segments.counter_windows, with run, template and ingested_at), read beside the stored
    ones."""
    windows = _STORED if counted is None else f"{_STORED} UNION ALL BY NAME {_COUNTED}"
    template = "NULL" if by == "run" else "template"
    source = _source(windows, engine_label.stored_sql("labels"), "run", template, bucket_seconds)
    with store.cursor() as cur, _registered(cur, counted, "counted_windows"):
        return _sums(cur, source, [run, run, since, since])


def of_frame(part: pd.DataFrame) -> SegmentSums | None:
    """A frame of windows (engine_segments.WINDOW_COLUMNS) as one segment; None where it holds none."""
    with _memory() as cur, _registered(cur, part, "frame_windows"):
        source = _source("SELECT * FROM frame_windows", engine_label.text_sql("labels"), "''", "NULL", None)
        found = _sums(cur, source, [None, None])
    return found[0] if found else None


def _source(windows: str, engine_of: str, run: str, template: str, bucket_seconds: float | None) -> str:
    bucket = "NULL::TIMESTAMP" if bucket_seconds is None else (
        f"make_timestamp((epoch_us(end_ts) // {int(bucket_seconds * 1e6)}) * {int(bucket_seconds * 1e6)})")
    numbers = ", ".join(f"CASE WHEN isnan({c}::DOUBLE) THEN NULL ELSE {c}::DOUBLE END AS {c}" for c in _NUMBERS)
    return _SOURCE.format(run=run, template=template, bucket=bucket, numbers=numbers, windows=windows,
                          engine_of=engine_of)


def _sums(cur: duckdb.DuckDBPyConnection, source: str, params: list) -> list[SegmentSums]:
    with _held(cur, _PART.format(source=source), params) as part:
        return _segments(cur, part)


@contextmanager
def _held(cur: duckdb.DuckDBPyConnection, query: str, params: list) -> Iterator[str]:
    """The windows of `query` (_PART) held in a temporary table for the block, read by a few aggregates."""
    name = f"engine_window_part_{uuid.uuid4().hex}"
    cur.execute(f"CREATE TEMP TABLE {name} AS {query} SELECT * FROM part", params)
    try:
        yield f"WITH part AS (FROM {name})\n"
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {name}")


def _segments(cur: duckdb.DuckDBPyConnection, part: str) -> list[SegmentSums]:
    totals = cur.execute(part + _TOTALS.format(checks=_CHECKS, tokens=_TOKENS)).df()
    if totals.empty:
        return []
    width = int(totals["width"].max())
    position_sums = [f"sum(positions[{i}]) AS accepted_{i}" for i in range(1, width + 1)] + [
        "sum(drafts) AS reached_1", *(f"sum(CASE WHEN len(positions) >= {i} THEN positions[{i - 1}] END) AS reached_{i}"
                                      for i in range(2, width + 1))]
    checks = _binned(cur, part, _CHECKS, ", ".join([_CHECK_SUMS, *position_sums]))
    tokens = _binned(cur, part, _TOKENS, _TOKEN_SUMS)
    out = []
    for row in totals.itertuples(index=False):
        own = range(1, int(row.width) + 1)
        check = checks.get(row.segment)
        token = tokens.get(row.segment)
        out.append(SegmentSums(
            run=row.run, template=None if pd.isna(row.template) else str(row.template),
            bucket=None if pd.isna(row.bucket) else row.bucket, windows=int(row.windows),
            first_ts=row.first_ts, last_ts=row.last_ts, last_ingest=row.last_ingest,
            engines=tuple(sorted(row.engines)), k=None if pd.isna(row.k) else int(row.k),
            speculating=bool(row.speculating), drafts=finite(row.drafts), draft_tokens=finite(row.draft_tokens),
            accepted_tokens=finite(row.accepted_tokens), counted_drafts=finite(row.counted_drafts),
            counted_accepted=finite(row.counted_accepted), mean_acceptance_length=finite(row.mean_acceptance_length),
            running_requests=finite(row.running_requests), generation_throughput=finite(row.generation_throughput),
            checks=None if check is None else CheckBins(
                check[0], check[1]["accepted"], check[1]["checked"],
                np.column_stack([check[1][f"accepted_{i}"] for i in own]),
                np.column_stack([check[1][f"reached_{i}"] for i in own])),
            tokens=None if token is None else TokenBins(token[0], token[1]["accepted"], token[1]["drafts"])))
    return out


def _binned(cur: duckdb.DuckDBPyConnection, part: str, subset: str,
            sums: str) -> dict[int, tuple[WindowBins, dict[str, np.ndarray]]]:
    """Each segment's windows of `subset` summed by (engine, bin) on its own grid: a bin a WINDOW_BANDWIDTH_BINS-th
    of the bandwidth of the segment's longest engine span (window_bin_seconds), and its bins placed as
    window_grid.grid_places places windows. The sums are arrays, 0 where a bin has none."""
    spans = cur.execute(part + _SPANS.format(subset=subset)).df()
    if spans.empty:
        return {}
    spans["minutes"] = minutes_spanned(spans["first_minute"].to_numpy(), spans["last_minute"].to_numpy())
    per_segment = spans.groupby("segment")["minutes"]
    longest, total = per_segment.max(), per_segment.sum()
    widths = [window_bin_seconds(float(m)) for m in longest]
    frame = cur.execute(part + _BINS.format(subset=subset, sums=sums), [longest.index.tolist(), widths]).df()
    engine, bins = pd.factorize(frame["engine_label"])[0], frame["bin"].to_numpy(np.int64)
    columns = {name: frame[name].fillna(0.0).to_numpy(float) for name in frame.columns[3:]}
    segments, starts = np.unique(frame["segment"].to_numpy(), return_index=True)  # rows are ordered by segment
    ends = np.append(starts[1:], len(frame))
    return {int(segment): (WindowBins(bin_places(engine[a:b], bins[a:b]), float(total[segment])),
                           {name: column[a:b] for name, column in columns.items()})
            for segment, a, b in zip(segments, starts, ends, strict=True)}


@contextmanager
def _registered(cur: duckdb.DuckDBPyConnection, frame: pd.DataFrame | None, name: str) -> Iterator[None]:
    """`frame` as a view of `cur` for the block."""
    if frame is None:
        yield
        return
    cur.register(name, frame)
    try:
        yield
    finally:
        cur.unregister(name)


@contextmanager
def _memory() -> Iterator[duckdb.DuckDBPyConnection]:
    conn = connect(":memory:")
    try:
        yield conn
    finally:
        conn.close()
