"""Per-segment acceptance summaries: DuckDB does the aggregation, specmon.core.stats and specmon.core.theory the rest.

A segment is a run and a template (optionally a day). For each it reports the four acceptance numbers of
docs/math.md kept apart: per-token alpha (with a cluster-robust interval, requests as clusters), the conditional and
cumulative rates per position, and the tokens per step L; predicted beta beside them; the draft cost c and the
break-even figures; and a status.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from typing import TYPE_CHECKING

from specmon.core import stats
from specmon.core.segments import (
    Economics,
    Estimate,
    PositionSummary,
    SegmentSummary,
    economics,
    finite,
    point_beta,
    position_summary,
)
from specmon.core.settings import BUCKETS, CONFIDENCE, GAP_Z_LIMIT, GROUPINGS
from specmon.store.database import Store
from specmon.store.rollups import (
    HOUR_OF_STEP,
    ROLLUP_EXACT,
    ROLLUP_POSITIONS_SELECT,
    ROLLUP_REQUEST_POSITIONS_SELECT,
    ROLLUP_REQUESTS_SELECT,
)

if TYPE_CHECKING:
    import duckdb
    import pandas as pd

_NO_BUCKET = "NULL::TIMESTAMP"
# Floating-point sums in DuckDB run in parallel in no fixed order, so their last digits moved between runs of
# `summary --json` on an unchanged database. Non-integer terms are summed as fixed-point decimals at 1e-12 (exact
# and order-free: the same digits every time); integer terms are summed exactly as they are.
_EXACT = ROLLUP_EXACT

# The rollup rows a summary reads from `since` on: whole hours at or after it from the rollups, and the steps of the
# hour that `since` cuts (at or after it) summed on the spot, so `since` is exact to the microsecond.
_ROLLUP_ROWS = """
SELECT * FROM {table} WHERE hour >= ?::TIMESTAMP
UNION ALL BY NAME
{edge}
"""
_EDGE = "st.ts >= ?::TIMESTAMP AND " + HOUR_OF_STEP + " < ?::TIMESTAMP"


def _rows(table: str, select: str, since: datetime | None) -> tuple[str, list]:
    """The SQL of a rollup's rows a summary reads, and its parameters: the whole table without `since` (no scan of
    the steps for an edge there is none of), else _ROLLUP_ROWS, select giving the edge's rollup of the steps."""
    if since is None:
        return f"SELECT * FROM {table}", []
    return _ROLLUP_ROWS.format(table=table, edge=select.format(where=_EDGE)), [since, since, since]


# The per-request sums of an interval on accepted over checked positions (stats.ClusterSums; _sums reads them), w_n
# each request's CR2 leverage weight: alpha's, over a segment's requests, and each position's, over its requests.
_CLUSTER_SUMS = """
           sum(accepted * accepted) AS saa, sum(accepted * checked) AS san, sum(checked * checked) AS snn,
           sum(checked::HUGEINT * checked::HUGEINT * checked::HUGEINT)::DOUBLE AS sn3,
           sum(checked::HUGEINT * checked::HUGEINT * checked::HUGEINT * checked::HUGEINT)::DOUBLE AS sn4,
           sum((w_n * accepted * accepted)::{exact})::DOUBLE AS saa_l,
           sum((w_n * accepted * checked)::{exact})::DOUBLE AS san_l,
           sum((w_n * checked * checked)::{exact})::DOUBLE AS snn_l,
           sum((accepted * accepted / nullif(checked, 0))::{exact})::DOUBLE AS saa_n"""

_STEPS_SQL = """
WITH rq AS ({rq_rows}
), s AS NOT MATERIALIZED (
    -- grouped by number (segment or run id), named at the end: fewer bytes to hash per rollup row; read three
    -- times (sole requests, the others, the totals), each a plain scan of the rollups, rather than materialised
    SELECT ss.{key} AS key, {bucket} AS bucket, i.ingested_at, rq.*
    FROM rq JOIN shown_segments ss USING (segment_id) JOIN ingests i USING (ingest_id)
    WHERE ? IS NULL OR ss.run = ?
), per_request AS (
    -- per-request totals: a sole rollup row is one already (store.py); the rest are added up per request
    SELECT key, bucket, steps::DOUBLE AS steps, accepted::DOUBLE AS accepted, checked::DOUBLE AS checked,
           b_accepted::DOUBLE AS b_accepted, b_checked::DOUBLE AS b_checked, b_lo::DOUBLE AS b_lo, b_hi::DOUBLE AS b_hi
    FROM s WHERE sole
    UNION ALL
    SELECT key, bucket,
           sum(steps)::DOUBLE AS steps, sum(accepted)::DOUBLE AS accepted, sum(checked)::DOUBLE AS checked,
           sum(b_accepted)::DOUBLE AS b_accepted, sum(b_checked)::DOUBLE AS b_checked,
           sum(b_lo)::DOUBLE AS b_lo, sum(b_hi)::DOUBLE AS b_hi
    FROM s WHERE sole IS NOT TRUE GROUP BY key, bucket, request_id
), by_step AS (
    SELECT key, bucket,
           sum(steps) AS steps, sum(drafted) AS drafted, sum(checked) AS checked, sum(accepted) AS accepted,
           max(k) AS k, sum(drafted) / sum(steps) AS mean_g, sum(timed) AS timed,
           min(first_ts) AS first_ts, max(last_ts) AS last_ts, sum(ts_inferred) AS ts_inferred,
           max(ingested_at) AS last_ingest
    FROM s GROUP BY key, bucket
), leverage AS (
    -- CR2 weights 1 / (1 - n_j / N): for alpha n_j is checked positions, for L it is steps; a cluster holding
    -- all of N (one request) has no such weight: 1, and the statistics ignore the spread of a single cluster anyway
    SELECT r.*, coalesce(1 / nullif(1 - r.checked / nullif(t.checked, 0), 0), 1) AS w_n,
                coalesce(1 / nullif(1 - r.steps / t.steps, 0), 1) AS w_s
    FROM per_request r JOIN by_step t ON r.key = t.key AND r.bucket IS NOT DISTINCT FROM t.bucket
), by_request AS (
    SELECT key, bucket, count(*) AS requests,""" + _CLUSTER_SUMS + """,
           sum(accepted * steps) AS sas, sum(steps * steps) AS sss,
           sum(steps::HUGEINT * steps::HUGEINT * steps::HUGEINT)::DOUBLE AS ss3,
           sum(steps::HUGEINT * steps::HUGEINT * steps::HUGEINT * steps::HUGEINT)::DOUBLE AS ss4,
           sum((w_s * accepted * accepted)::{exact})::DOUBLE AS saa_ls,
           sum((w_s * accepted * steps)::{exact})::DOUBLE AS sas_ls,
           sum((w_s * steps * steps)::{exact})::DOUBLE AS sss_ls,
           sum((accepted * accepted / nullif(steps, 0))::{exact})::DOUBLE AS saa_s,
           sum(b_checked) AS b_checked, sum(b_lo::{exact})::DOUBLE AS b_lo, sum(b_hi::{exact})::DOUBLE AS b_hi,
           sum((b_accepted - b_lo)::{exact})::DOUBLE AS d_lo, sum(pow(b_accepted - b_lo, 2)::{exact})::DOUBLE AS dd_lo,
           sum((b_accepted - b_hi)::{exact})::DOUBLE AS d_hi, sum(pow(b_accepted - b_hi, 2)::{exact})::DOUBLE AS dd_hi
    FROM leverage GROUP BY key, bucket
), named AS (
    SELECT {key} AS key, any_value(run) AS run, any_value({template}) AS template, any_value(demo) AS demo,
           any_value(meta)::VARCHAR AS meta
    FROM shown_segments ss GROUP BY {key}
)
SELECT n.* EXCLUDE (key), b.* EXCLUDE (key), q.* EXCLUDE (key, bucket)
FROM by_step b JOIN by_request q ON b.key = q.key AND b.bucket IS NOT DISTINCT FROM q.bucket
JOIN named n ON n.key = b.key
ORDER BY n.run, n.template, b.bucket
"""

# Medians are not sums: they are read from the steps that carry timings, in the segments that have any.
_TIMINGS_SQL = """
SELECT ss.run, {template} AS template, {bucket} AS bucket,
       median(d.draft_ms / st.g) FILTER (WHERE st.g > 0) AS draft_step_ms, median(d.target_ms) AS target_ms
FROM steps st JOIN step_details d USING (step_id) JOIN shown_segments ss USING (segment_id)
WHERE st.segment_id IN (SELECT segment_id FROM rollup_requests WHERE timed > 0)
  AND (d.draft_ms IS NOT NULL OR d.target_ms IS NOT NULL)
  AND (? IS NULL OR ss.run = ?) AND (?::TIMESTAMP IS NULL OR st.ts >= ?::TIMESTAMP)
GROUP BY ALL
"""

# Per segment and position: the positions' counts and beta's bounds (rollup_positions), named.
_POSITION_COUNTS = """positions AS (
    SELECT ss.{key} AS key, {bucket} AS bucket, rp.position,
           sum(rp.checked) AS checked, sum(rp.accepted) AS accepted,
           (sum(rp.beta_lo_sum) / sum(rp.beta_lo_n))::DOUBLE AS beta_lo,
           (sum(rp.beta_hi_sum) / sum(rp.beta_hi_n))::DOUBLE AS beta_hi
    FROM rp JOIN shown_segments ss USING (segment_id)
    WHERE ? IS NULL OR ss.run = ?
    GROUP BY ALL
), named AS (
    SELECT {key} AS key, any_value(run) AS run, any_value({template}) AS template
    FROM shown_segments ss GROUP BY {key}
)"""
# The counts alone (a timeline's buckets: the profile's break-even needs no interval).
_POSITION_COUNTS_SQL = """
WITH rp AS ({rp_rows}
), """ + _POSITION_COUNTS + """
SELECT n.run, n.template, p.* EXCLUDE (key) FROM positions p JOIN named n USING (key) ORDER BY 1, 2, 3, 4
"""
# The counts with the per-request sums of each position's interval (rollup_request_positions: each request a
# cluster, as for alpha, with its CR2 leverage weight 1 / (1 - n_j / N) within the segment's position).
_POSITIONS_SQL = """
WITH rp AS ({rp_rows}
), rc AS ({rc_rows}
), s AS NOT MATERIALIZED (
    -- grouped by number (segment or run id), named at the end, as in the steps' query
    SELECT ss.{key} AS key, {bucket} AS bucket, rc.*
    FROM rc JOIN shown_segments ss USING (segment_id)
    WHERE ? IS NULL OR ss.run = ?
), per_request AS NOT MATERIALIZED (
    -- a sole row is a request's total at its position already (rollup_requests.sole); the rest are added up
    SELECT key, bucket, position, checked::DOUBLE AS checked, accepted::DOUBLE AS accepted FROM s WHERE sole
    UNION ALL
    SELECT key, bucket, position, sum(checked)::DOUBLE AS checked, sum(accepted)::DOUBLE AS accepted
    FROM s WHERE sole IS NOT TRUE GROUP BY key, bucket, position, request_id
), position_totals AS (
    SELECT key, bucket, position, sum(checked) AS total FROM s GROUP BY ALL
), leverage AS (
    -- each request's CR2 leverage weight within its position
    SELECT r.*, coalesce(1 / nullif(1 - r.checked / nullif(t.total, 0), 0), 1) AS w_n
    FROM per_request r JOIN position_totals t
      ON r.key = t.key AND r.bucket IS NOT DISTINCT FROM t.bucket AND r.position = t.position
), clusters AS (
    SELECT key, bucket, position, count(*) AS requests,""" + _CLUSTER_SUMS + """
    FROM leverage GROUP BY ALL
), """ + _POSITION_COUNTS + """
SELECT n.run, n.template, p.* EXCLUDE (key), c.* EXCLUDE (key, bucket, position, requests),
       coalesce(c.requests, 0) AS requests  -- a position drafted and never checked has none
FROM positions p JOIN named n USING (key)
LEFT JOIN clusters c ON p.key = c.key AND p.bucket IS NOT DISTINCT FROM c.bucket AND p.position = c.position
ORDER BY 1, 2, 3, 4
"""


def _sums(row: dict, tokens: bool = False) -> stats.ClusterSums:
    """The per-request sums of a segment row (_STEPS_SQL): accepted over checked (alpha), or accepted over steps (L);
    of a position row (_POSITIONS_SQL): accepted over checked at that position."""
    if tokens:
        keys = ("accepted", "steps", "saa", "sas", "sss", "saa_ls", "sas_ls", "sss_ls", "ss3", "ss4", "saa_s")
    else:
        keys = ("accepted", "checked", "saa", "san", "snn", "saa_l", "san_l", "snn_l", "sn3", "sn4", "saa_n")
    return stats.ClusterSums(int(row["requests"]), *(float(row[key] or 0.0) for key in keys))


def tokens_interval(row: dict, dof: float) -> tuple[float | None, float | None]:
    """95% interval for tokens per step L = 1 + accepted / steps, cluster-robust over requests: the CR2 variance
    of the ratio with the t quantile at alpha's degrees of freedom (the same requests; stats.cluster_interval).
    Needs 2 requests or more."""
    iv = stats.ratio_interval(_sums(row, tokens=True), dof, CONFIDENCE)
    if iv is None or not row["steps"]:
        return None, None
    return 1 + max(iv[0], 0.0), 1 + iv[1]


def _gap(row: dict) -> tuple[float | None, str | None]:
    """z of observed acceptance against predicted beta's interval (0 inside it); cluster-robust."""
    if not row["b_checked"]:
        return None, None
    z_lo = stats.cluster_z(row["d_lo"], row["dd_lo"])
    z_hi = stats.cluster_z(row["d_hi"], row["dd_hi"])
    z = z_lo if z_lo < 0 else (z_hi if z_hi > 0 else 0.0)
    if math.isnan(z):
        return None, None
    return finite(z), "agrees" if abs(z) <= GAP_Z_LIMIT else "differs"


def demo_only(store: Store) -> bool:
    """Whether the runs shown are the demo's: the shown_runs view (schema) shows demo data only while the user has
    stored nothing of their own."""
    return bool(store.query("SELECT coalesce(bool_and(demo), true) FROM shown_runs")[0][0])


def summarize(store: Store, by: str = "template", c: float | None = None, *, run: str | None = None,
              bucket: str | None = None, per_position: bool = True, since: datetime | None = None) -> list[dict]:
    """segments() as the dicts of `specmon summary --json` (keys in the README)."""
    return [s.to_dict() for s in segments(store, by, c, run=run, bucket=bucket, per_position=per_position,
                                          since=since)]


def segments(store: Store, by: str = "template", c: float | None = None, *, run: str | None = None,
             bucket: str | None = None, per_position: bool = True, since: datetime | None = None
             ) -> list[SegmentSummary]:
    """One summary per segment, from every source: step logs, then engine windows, then replays.

    by: "run", "template" (run and template) or "day" (run, template and UTC day). bucket (a key of BUCKETS)
    splits each run/template segment into time buckets instead, for timelines; run restricts to one run.
    per_position=False gives each position's counts without its interval, which needs the request-level sums, for
    timelines: the counts still give the break-even alpha of the per-position profile.
    since keeps only steps at or after that UTC time.
    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    if bucket is not None and bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {tuple(BUCKETS)}, got {bucket!r}")
    with store.reading():  # one connection for the half-dozen queries (opening one costs ~15 ms)
        return _segments(store, by, c, run, bucket, per_position, since)


def _segments(store: Store, by: str, c: float | None, run: str | None, bucket: str | None, per_position: bool,
              since: datetime | None) -> list[SegmentSummary]:
    day_output = by == "day"
    if day_output:
        by, bucket = "template", "day"
    fmt = dict(template="NULL::VARCHAR" if by == "run" else "ss.template", exact=_EXACT,
               key="run_id" if by == "run" else "segment_id")
    bucket_of = f"time_bucket(INTERVAL '{BUCKETS[bucket]}', {{}})" if bucket else _NO_BUCKET
    demo = demo_only(store)
    # rollup rows: the whole hours at or after since, then the cut hour's steps at or after since
    rq_rows, rq_params = _rows("rollup_requests", ROLLUP_REQUESTS_SELECT, since)
    with store.cursor() as cur:
        step_rows = _records(cur, _STEPS_SQL.format(bucket=bucket_of.format("hour"), rq_rows=rq_rows, **fmt),
                             [*rq_params, run, run])
        timings: dict[tuple, tuple] = {}
        if any(r["timed"] for r in step_rows):
            for rec in _records(cur, _TIMINGS_SQL.format(bucket=bucket_of.format("st.ts"), **fmt),
                                [run, run, since, since]):
                timings[(rec["run"], rec["template"], rec["bucket"])] = (rec["draft_step_ms"], rec["target_ms"])
        positions: dict[tuple, list[dict]] = {}
        rp_rows, rp_params = _rows("rollup_positions", ROLLUP_POSITIONS_SELECT, since)
        if per_position:
            rc_rows, rc_params = _rows("rollup_request_positions", ROLLUP_REQUEST_POSITIONS_SELECT, since)
            sql = _POSITIONS_SQL.format(bucket=bucket_of.format("hour"), rp_rows=rp_rows, rc_rows=rc_rows, **fmt)
            params = [*rp_params, *rc_params, run, run, run, run]
        else:
            sql = _POSITION_COUNTS_SQL.format(bucket=bucket_of.format("hour"), rp_rows=rp_rows, **fmt)
            params = [*rp_params, run, run]
        for rec in _records(cur, sql, params):
            positions.setdefault((rec["run"], rec["template"], rec["bucket"]), []).append(rec)
        others = _records(cur, _OTHER_SOURCES_SQL, [])[0] if not demo else {"engines": False, "replays": False}
    declared = declared_costs(store)
    rows: list[SegmentSummary] = []
    for row in step_rows:
        key = (row["run"], row["template"], row["bucket"])
        row["draft_step_ms"], row["target_ms"] = timings.get(key, (None, None))
        rows.append(segment_of(row, positions.get(key, []), c, by, day_output, declared.get(row["run"]),
                               intervals=per_position))
    # Engine and replay data are the user's own, never mixed with the demo. Their summaries use pandas, which a
    # database of step logs alone never loads (a third of `specmon summary`'s time).
    if others["engines"]:
        from specmon.analysis import engine_segments

        rows += engine_segments.summarize_engines(store, by, c, run=run, bucket=bucket, since=since,
                                                 declared=declared, position_intervals=per_position)
    if others["replays"] and bucket is None:
        from specmon.analysis import replay_segments

        rows += replay_segments.summarize_replays(store, by, c, run=run, since=since)
    return rows


# Whether any engine windows (logged or counted) or replays are stored: the sources summarized apart from steps.
_OTHER_SOURCES_SQL = ("SELECT EXISTS (FROM engine_windows) OR EXISTS (FROM counter_samples) AS engines, "
                      "EXISTS (FROM replay_positions) AS replays")


def _records(cur: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    """A query's rows as dicts by column name, SQL NULL as None."""
    result = cur.execute(sql, params)
    names = [d[0] for d in result.description]
    return [clean_row(dict(zip(names, row, strict=True))) for row in result.fetchall()]


_RUN_COST_SQL = """
SELECT max(rq.k) AS k, sum(rq.timed) AS timed, any_value(ss.meta)::VARCHAR AS meta, sum(rq.steps) AS steps,
       sum(rq.drafted) AS drafted
FROM rollup_requests rq JOIN shown_segments ss USING (segment_id) WHERE ss.run = ?
"""


def step_economics(store: Store, run: str, c: float | None = None) -> Economics | None:
    """The economics of a run's step log as summarize(by="run") has them, by the same rules (_cost, and core
    economics on its per-position counts), without the intervals it computes: the drift analysis needs only its
    break-even, for every run a `check` reads. None where no such row is shown."""
    fmt = dict(template="NULL::VARCHAR", bucket=_NO_BUCKET)
    with store.cursor() as cur:
        row = _records(cur, _RUN_COST_SQL, [run])[0]
        if row["k"] is None:
            return None
        row["draft_step_ms"] = row["target_ms"] = None
        if row["timed"]:
            for rec in _records(cur, _TIMINGS_SQL.format(**fmt), [run, run, None, None]):
                row["draft_step_ms"], row["target_ms"] = rec["draft_step_ms"], rec["target_ms"]
        rp_rows, _ = _rows("rollup_positions", ROLLUP_POSITIONS_SELECT, None)
        counts = _records(cur, _POSITION_COUNTS_SQL.format(rp_rows=rp_rows, key="run_id", **fmt), [run, run])
    steps = int(row["steps"])
    cost, source = _cost(row, c, declared_costs(store).get(run))
    return economics(int(row["k"]), cost, source, Estimate(), Estimate(), row["drafted"] / steps if steps else None,
                     _positions(counts, steps, intervals=False), steps)


def declared_costs(store: Store) -> dict[str, float]:
    """The draft cost c each run was declared to have where it is watched (`specmon watch --c`, `c` in the watch
    configuration): used where c is neither given nor measured from the run's own timings."""
    return dict(store.query("SELECT run, max(c) FROM watch_sources WHERE c IS NOT NULL GROUP BY run"))


def clean_row(row: dict) -> dict:
    """SQL NULL as None, and so a NaN (a float of nothing) and pandas' NaT and NA (a frame's rows: the tests'
    full-scan oracle)."""
    out = {}
    for key, value in row.items():
        try:
            missing = value is None or value != value  # NaN, NaT and pd.NA are not equal to themselves
        except TypeError:
            missing = True
        out[key] = None if missing else value
    return out


def _cost(row: dict, c_given: float | None, c_declared: float | None) -> tuple[float | None, str | None]:
    """The draft cost c and where it came from: given (--c), else measured by a live run's decode steps, else
    measured from the log's timings, else declared for the run where it is watched."""
    if c_given is not None:
        return c_given, "given"
    costs = _live_costs(row)
    if costs:
        return costs["c"], "measured decode steps"
    if row["draft_step_ms"] is not None and row["target_ms"]:
        return row["draft_step_ms"] / row["target_ms"], "measured"
    if c_declared is not None:
        return c_declared, "declared"
    return None, None


def _live_costs(row: dict) -> dict | None:
    """The decode-step costs a live run measured and stored in its meta, if any."""
    return json.loads(row["meta"]).get("costs") if row["meta"] else None


def _beta(row: dict) -> Estimate:
    """Predicted beta over the positions that logged it: a point for dense distributions, else only bounds."""
    b_checked = row["b_checked"] or 0
    if not b_checked:
        return Estimate()
    lo, hi = row["b_lo"] / b_checked, row["b_hi"] / b_checked
    return Estimate(point_beta(lo, hi), finite(lo), finite(hi))


def _tokens(row: dict, dof: float) -> Estimate:
    """Tokens per step L = 1 + accepted / steps, with its interval (tokens_interval)."""
    steps, accepted = int(row["steps"]), int(row["accepted"])
    lo, hi = tokens_interval(row, dof)
    return Estimate(1.0 + accepted / steps if steps else None, lo, hi)


def _positions(positions: list[dict], steps: int, intervals: bool) -> tuple[PositionSummary, ...]:
    """The per-position rows of one segment: with its own interval, requests as clusters (_POSITIONS_SQL), or their
    counts alone (_POSITION_COUNTS_SQL)."""
    return tuple(position_summary(int(p["position"]), float(p["checked"] or 0.0), float(p["accepted"] or 0.0), steps,
                                  p["beta_lo"], p["beta_hi"], sums=_sums(p) if intervals else None)
                 for p in positions)


def segment_of(row: dict, positions: list[dict], c_given: float | None, by: str, day_output: bool,
             c_declared: float | None = None, intervals: bool = True) -> SegmentSummary:
    """One step-log segment from its aggregated row (_STEPS_SQL) and its per-position rows (_POSITIONS_SQL, or
    _POSITION_COUNTS_SQL where intervals=False)."""
    steps = int(row["steps"])
    k = int(row["k"]) if row["k"] else None
    interval = stats.cluster_interval(_sums(row), CONFIDENCE)
    alpha = Estimate(finite(interval.estimate), finite(interval.lo), finite(interval.hi))
    tokens = _tokens(row, interval.dof)
    gap_z, agreement = _gap(row)
    c, c_source = _cost(row, c_given, c_declared)
    per_position = _positions(positions, steps, intervals)
    return SegmentSummary(
        run=row["run"],
        template=(row["template"] or None) if by != "run" else None,
        day=row["bucket"].date().isoformat() if day_output else None,
        bucket_start=row["bucket"].isoformat() if row["bucket"] is not None else None,
        demo=bool(row["demo"]), k=k, steps=steps, requests=int(row["requests"]), drafted=int(row["drafted"]),
        checked=int(row["checked"]), accepted=int(row["accepted"]), alpha=alpha,
        design_effect=finite(interval.design_effect), interval_dof=finite(interval.dof), beta=_beta(row),
        gap_z=gap_z, agreement=agreement, tokens_per_step=tokens, mean_draft_len=finite(row["mean_g"]),
        economics=economics(k, c, c_source, alpha, tokens, finite(row["mean_g"]), per_position, steps),
        first_ts=row["first_ts"].isoformat() if row["first_ts"] is not None else None,
        last_ts=row["last_ts"].isoformat() if row["last_ts"] is not None else None,
        source="steplog", costs=_live_costs(row), ts_inferred_steps=int(row["ts_inferred"]),
        last_ingest=row["last_ingest"].isoformat(), per_position=per_position,
    )


def template_changes(store: Store, run: str | None = None) -> pd.DataFrame:
    """When each template first appears in each run shown (a template change is an event on the timeline)."""
    return store.query_df(
        "SELECT ss.run, ss.template, min(rq.first_ts) AS first_ts FROM rollup_requests rq "
        "JOIN shown_segments ss USING (segment_id) WHERE ? IS NULL OR ss.run = ? GROUP BY 1, 2 ORDER BY 1, 3",
        [run, run],
    )


def run_names(store: Store) -> list[str]:
    """The runs the pages show (the demo run only while nothing else is stored)."""
    return [r[0] for r in store.query("SELECT name FROM shown_runs ORDER BY name")]
