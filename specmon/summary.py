"""Per-segment acceptance summaries: DuckDB does the aggregation, specmon.stats and specmon.theory the rest.

A segment is a run and a template (optionally a day). For each it reports the four acceptance numbers of
docs/math.md kept apart: per-token alpha (with a cluster-robust interval, requests as clusters), the conditional and
cumulative rates per position, and the tokens per step L; predicted beta beside them; the draft cost c and the
break-even figures; and a status.
"""
from __future__ import annotations

import json
import math
from datetime import datetime

import pandas as pd

from specmon import engine_summary, predicted, stats
from specmon.segments import Estimate, PositionSummary, SegmentSummary, economics, finite, point_beta, position_summary
from specmon.settings import BUCKETS, CONFIDENCE, GAP_Z_LIMIT
from specmon.store import Store

GROUPINGS = ("run", "template", "day")

_NO_BUCKET = "NULL::TIMESTAMP"
# Floating-point sums in DuckDB run in parallel in no fixed order, so their last digits moved between runs of
# `summary --json` on an unchanged database. Non-integer terms are summed as fixed-point decimals at 1e-12 (exact
# and order-free: the same digits every time); integer terms are summed exactly as they are.
_EXACT = "DECIMAL(38, 12)"

_STEPS_SQL = """
WITH s AS (
    SELECT r.name AS run, {template} AS template, {bucket} AS bucket, r.demo, r.meta, i.ingested_at, st.*
    FROM steps st JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) JOIN ingests i USING (ingest_id)
    WHERE r.demo = ? AND (? IS NULL OR r.name = ?) AND (?::TIMESTAMP IS NULL OR st.ts >= ?::TIMESTAMP)
), per_request AS (
    SELECT run, template, bucket, request_id,
           count(*)::DOUBLE AS steps, sum(accepted)::DOUBLE AS accepted, sum(checked)::DOUBLE AS checked,
           sum(accepted) FILTER (WHERE beta_lo_sum IS NOT NULL)::DOUBLE AS b_accepted,
           sum(checked) FILTER (WHERE beta_lo_sum IS NOT NULL)::DOUBLE AS b_checked,
           sum(beta_lo_sum::{exact})::DOUBLE AS b_lo, sum(beta_hi_sum::{exact})::DOUBLE AS b_hi
    FROM s GROUP BY run, template, bucket, request_id
), leverage AS (
    -- CR2 weights 1 / (1 - n_j / N): for alpha n_j is checked positions, for L it is steps; a cluster holding
    -- all of N (one request) has no such weight: 1, and the statistics ignore the spread of a single cluster anyway
    SELECT *, coalesce(1 / nullif(1 - checked / nullif(sum(checked) OVER seg, 0), 0), 1) AS w_n,
              coalesce(1 / nullif(1 - steps / sum(steps) OVER seg, 0), 1) AS w_s
    FROM per_request WINDOW seg AS (PARTITION BY run, template, bucket)
), by_request AS (
    SELECT run, template, bucket, count(*) AS requests,
           sum(accepted * accepted) AS saa, sum(accepted * checked) AS san, sum(checked * checked) AS snn,
           sum(checked::HUGEINT * checked::HUGEINT * checked::HUGEINT)::DOUBLE AS sn3,
           sum(checked::HUGEINT * checked::HUGEINT * checked::HUGEINT * checked::HUGEINT)::DOUBLE AS sn4,
           sum((w_n * accepted * accepted)::{exact})::DOUBLE AS saa_l,
           sum((w_n * accepted * checked)::{exact})::DOUBLE AS san_l,
           sum((w_n * checked * checked)::{exact})::DOUBLE AS snn_l,
           sum(accepted * steps) AS sas, sum(steps * steps) AS sss,
           sum(steps::HUGEINT * steps::HUGEINT * steps::HUGEINT)::DOUBLE AS ss3,
           sum(steps::HUGEINT * steps::HUGEINT * steps::HUGEINT * steps::HUGEINT)::DOUBLE AS ss4,
           sum((w_s * accepted * accepted)::{exact})::DOUBLE AS saa_ls,
           sum((w_s * accepted * steps)::{exact})::DOUBLE AS sas_ls,
           sum((w_s * steps * steps)::{exact})::DOUBLE AS sss_ls,
           sum(b_checked) AS b_checked, sum(b_lo::{exact})::DOUBLE AS b_lo, sum(b_hi::{exact})::DOUBLE AS b_hi,
           sum((b_accepted - b_lo)::{exact})::DOUBLE AS d_lo, sum(pow(b_accepted - b_lo, 2)::{exact})::DOUBLE AS dd_lo,
           sum((b_accepted - b_hi)::{exact})::DOUBLE AS d_hi, sum(pow(b_accepted - b_hi, 2)::{exact})::DOUBLE AS dd_hi
    FROM leverage GROUP BY run, template, bucket
), by_step AS (
    SELECT run, template, bucket, any_value(demo) AS demo,
           count(*) AS steps, sum(g) AS drafted, sum(checked) AS checked, sum(accepted) AS accepted,
           max(coalesce(k, g)) AS k, avg(g) AS mean_g,
           median(draft_ms / g) FILTER (WHERE g > 0) AS draft_step_ms, median(target_ms) AS target_ms,
           min(ts) AS first_ts, max(ts) AS last_ts, count(*) FILTER (WHERE ts_inferred) AS ts_inferred,
           max(ingested_at) AS last_ingest, any_value(meta)::VARCHAR AS meta
    FROM s GROUP BY run, template, bucket
)
SELECT b.*, q.* EXCLUDE (run, template, bucket) FROM by_step b JOIN by_request q
  ON b.run = q.run AND b.template IS NOT DISTINCT FROM q.template AND b.bucket IS NOT DISTINCT FROM q.bucket
ORDER BY b.run, b.template, b.bucket
"""

_POSITIONS_SQL = """
SELECT r.name AS run, {template} AS template, {bucket} AS bucket, p.position,
       count(*) FILTER (WHERE p.checked) AS checked, count(*) FILTER (WHERE p.accepted) AS accepted,
       (sum(p.beta_lo::{exact}) FILTER (WHERE p.checked) / count(p.beta_lo) FILTER (WHERE p.checked))::DOUBLE
           AS beta_lo,
       (sum(p.beta_hi::{exact}) FILTER (WHERE p.checked) / count(p.beta_hi) FILTER (WHERE p.checked))::DOUBLE
           AS beta_hi
FROM positions p JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) {join_steps}
WHERE r.demo = ? AND (? IS NULL OR r.name = ?) AND (?::TIMESTAMP IS NULL OR {since_ts} >= ?::TIMESTAMP)
GROUP BY ALL ORDER BY 1, 2, 3, 4
"""


def _sums(row: dict, tokens: bool = False) -> stats.ClusterSums:
    """The per-request sums of a segment row: accepted over checked (alpha), or accepted over steps (L)."""
    if tokens:
        keys = ("accepted", "steps", "saa", "sas", "sss", "saa_ls", "sas_ls", "sss_ls", "ss3", "ss4")
    else:
        keys = ("accepted", "checked", "saa", "san", "snn", "saa_l", "san_l", "snn_l", "sn3", "sn4")
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
    per_position=False skips the scan of every drafted position (per_position is then empty), for timelines.
    since keeps only steps at or after that UTC time.
    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    if bucket is not None and bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {tuple(BUCKETS)}, got {bucket!r}")
    day_output = by == "day"
    if day_output:
        by, bucket = "template", "day"
    bucket_key = f"time_bucket(INTERVAL '{BUCKETS[bucket]}', st.ts)" if bucket else _NO_BUCKET
    fmt = dict(template="NULL::VARCHAR" if by == "run" else "sg.template", bucket=bucket_key, exact=_EXACT)
    demo = demo_only(store)
    params = [demo, run, run, since, since]
    step_rows = store.query_df(_STEPS_SQL.format(**fmt), params).to_dict("records")
    positions: dict[tuple, list[dict]] = {}
    if per_position:
        needs_steps = bucket is not None or since is not None
        join_steps = "JOIN steps st USING (step_id)" if needs_steps else ""
        pos_df = store.query_df(_POSITIONS_SQL.format(join_steps=join_steps, since_ts="st.ts" if needs_steps
                                                      else "NULL::TIMESTAMP", **fmt), params)
        for rec in map(_clean, pos_df.to_dict("records")):
            positions.setdefault((rec["run"], rec["template"], rec["bucket"]), []).append(rec)
    declared = declared_costs(store)
    rows = [_segment(row, positions.get((row["run"], row["template"], row["bucket"]), []), c, by, day_output,
                     declared.get(row["run"]))
            for row in (_clean(r) for r in step_rows)]
    if not demo:  # engine and replay data are the user's own: never mixed with the demo
        rows += engine_summary.summarize_engines(store, by, c, run=run, bucket=bucket, since=since,
                                                 declared=declared)
        if bucket is None:
            rows += predicted.summarize_replays(store, by, c, run=run, since=since)
    return rows


def declared_costs(store: Store) -> dict[str, float]:
    """The draft cost c each run was declared to have where it is watched (`specmon watch --c`, `c` in the watch
    configuration): used where c is neither given nor measured from the run's own timings."""
    return dict(store.query("SELECT run, max(c) FROM watch_sources WHERE c IS NOT NULL GROUP BY run"))


def _clean(row: dict) -> dict:
    """pandas gives NaN/NaT/NA for SQL NULL; make them None."""
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


def _positions(positions: list[dict], steps: int, interval: stats.Interval) -> tuple[PositionSummary, ...]:
    """The per-position rows (_POSITIONS_SQL) of one segment, widened by its alpha interval's design effect."""
    return tuple(position_summary(int(p["position"]), int(p["checked"]), int(p["accepted"]), steps, interval,
                                  p["beta_lo"], p["beta_hi"]) for p in positions)


def _segment(row: dict, positions: list[dict], c_given: float | None, by: str, day_output: bool,
             c_declared: float | None = None) -> SegmentSummary:
    """One step-log segment from its aggregated row (_STEPS_SQL) and its per-position rows (_POSITIONS_SQL)."""
    steps = int(row["steps"])
    k = int(row["k"]) if row["k"] else None
    interval = stats.cluster_interval(_sums(row), CONFIDENCE)
    alpha = Estimate(finite(interval.estimate), finite(interval.lo), finite(interval.hi))
    tokens = _tokens(row, interval.dof)
    gap_z, agreement = _gap(row)
    c, c_source = _cost(row, c_given, c_declared)
    return SegmentSummary(
        run=row["run"],
        template=(row["template"] or None) if by != "run" else None,
        day=pd.Timestamp(row["bucket"]).date().isoformat() if day_output else None,
        bucket_start=pd.Timestamp(row["bucket"]).isoformat() if row["bucket"] is not None else None,
        demo=bool(row["demo"]), k=k, steps=steps, requests=int(row["requests"]), drafted=int(row["drafted"]),
        checked=int(row["checked"]), accepted=int(row["accepted"]), alpha=alpha,
        design_effect=finite(interval.design_effect), interval_dof=finite(interval.dof), beta=_beta(row),
        gap_z=gap_z, agreement=agreement, tokens_per_step=tokens, mean_draft_len=finite(row["mean_g"]),
        economics=economics(k, c, c_source, alpha, tokens, finite(row["mean_g"])),
        first_ts=row["first_ts"].isoformat() if row["first_ts"] is not None else None,
        last_ts=row["last_ts"].isoformat() if row["last_ts"] is not None else None,
        source="steplog", costs=_live_costs(row), ts_inferred_steps=int(row["ts_inferred"]),
        last_ingest=row["last_ingest"].isoformat(), per_position=_positions(positions, steps, interval),
    )


def template_changes(store: Store, run: str | None = None):
    """When each template first appears in each run shown (a template change is an event on the timeline)."""
    return store.query_df(
        "SELECT sg.run, sg.template, min(st.ts) AS first_ts FROM steps st JOIN shown_segments sg USING (segment_id) "
        "WHERE (? IS NULL OR sg.run = ?) GROUP BY 1, 2 ORDER BY 1, 3",
        [run, run],
    )


def run_names(store: Store) -> list[str]:
    """The runs the pages show (the demo run only while nothing else is stored)."""
    return [r[0] for r in store.query("SELECT name FROM shown_runs ORDER BY name")]
