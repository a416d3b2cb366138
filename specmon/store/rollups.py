"""The rollups: what every summary, page and `specmon check` reads instead of scanning steps and positions.

One row per ingest, segment, hour (the base time bucket: every timeline bucket, 6 hours, a day, a 7-day week, is a
whole number of hours on the same origin) and request; one per ingest, segment, hour and drafted position; and one
per ingest, segment, hour, request and checked position. Rows are only ever appended, in the transaction that
publishes the ingest they sum (refresh_rollups), so a request that spans hours or watched pieces has several rows,
added up when read: every figure a reader needs is a sum, a count, a min or a max of them. Non-integer sums are
fixed-point DECIMAL(38, 12) (exact and order-free, so summaries keep their digits from run to run). The medians of
the step timings are not sums; they are read from the steps that carry timings (`timed` says which segments have
any). docs/rollups.md describes the tables.
"""
from __future__ import annotations

import duckdb

ROLLUP_EXACT = "DECIMAL(38, 12)"
ROLLUP_BUCKET = "1 hour"
HOUR_OF_STEP = f"time_bucket(INTERVAL '{ROLLUP_BUCKET}', st.ts)"


def rollup_requests_select(source: str, d: str) -> str:
    """The per-request rollup of the steps matching {where} (steps aliased st), from `source`, where d names what
    holds a step's timings and PIT lists (steps itself before migration 13, step_details after)."""
    return f"""
SELECT st.ingest_id, st.segment_id, {HOUR_OF_STEP} AS hour, st.request_id,
       count(*) AS steps, sum(st.g) AS drafted, sum(st.accepted) AS accepted, sum(st.checked) AS checked,
       max(coalesce(st.k, st.g)) AS k,
       sum(st.accepted) FILTER (WHERE st.beta_lo_sum IS NOT NULL) AS b_accepted,
       sum(st.checked) FILTER (WHERE st.beta_lo_sum IS NOT NULL) AS b_checked,
       sum(st.beta_lo_sum::{ROLLUP_EXACT}) AS b_lo, sum(st.beta_hi_sum::{ROLLUP_EXACT}) AS b_hi,
       min(st.ts) AS first_ts, max(st.ts) AS last_ts, count(*) FILTER (WHERE st.ts_inferred) AS ts_inferred,
       count(*) FILTER (WHERE {d}.draft_ms IS NOT NULL OR {d}.target_ms IS NOT NULL) AS timed,
       sum(len({d}.pit_mass)) AS pit_tokens
FROM {source} WHERE {{where}} GROUP BY st.ingest_id, st.segment_id, hour, st.request_id
"""



ROLLUP_REQUESTS_SELECT = rollup_requests_select("steps st LEFT JOIN step_details d USING (step_id)", "d")
# The per-position rollup of the positions of the steps matching {where}; beta's bounds summed over checked
# positions, with their counts (a bound is NULL where no distributions were logged). checked, accepted: SQL of
# whether position p was checked, accepted; hi: SQL of its beta_hi.
def rollup_position_sums(checked: str, accepted: str, hi: str = "p.beta_hi") -> str:
    return f"""
       count(*) FILTER (WHERE {checked}) AS checked, count(*) FILTER (WHERE {accepted}) AS accepted,
       sum(p.beta_lo::{ROLLUP_EXACT}) FILTER (WHERE {checked}) AS beta_lo_sum,
       count(p.beta_lo) FILTER (WHERE {checked}) AS beta_lo_n,
       sum(({hi})::{ROLLUP_EXACT}) FILTER (WHERE {checked}) AS beta_hi_sum,
       count({hi}) FILTER (WHERE {checked}) AS beta_hi_n"""



# A position's segment is its step's, and so is whether it was checked or accepted: the accepted positions of a step
# are 1..accepted and the checked ones 1..checked. position_rows stores only what is the position's own (fewer
# columns to write: 2.7 against 4.2 CPU s for a 10M-position flat ingest's positions); the positions view joins
# the rest back.
CHECKED, ACCEPTED = "p.position <= st.checked", "p.position <= st.accepted"
# A position's beta_hi: its own in position_bounds where it has a row there (migration 14), else its beta_lo.
BETA_HI = "CASE WHEN h.position IS NULL THEN p.beta_lo ELSE h.beta_hi END"


def rollup_positions_select(bounds: bool = True) -> str:
    """The per-position rollup of the positions of the steps matching {where}, from position_rows. bounds=False:
    for steps none of whose positions has a row in position_bounds (their beta_hi is their beta_lo), which then
    is neither joined nor summed twice (DuckDB computes a repeated aggregate once)."""
    hi, join = (BETA_HI, "LEFT JOIN position_bounds h USING (step_id, position)") if bounds else ("p.beta_lo", "")
    return f"""
SELECT st.ingest_id, st.segment_id, st.hour, p.position, {rollup_position_sums(CHECKED, ACCEPTED, hi)}
FROM position_rows p JOIN (SELECT st.step_id, st.ingest_id, st.segment_id, {HOUR_OF_STEP} AS hour, st.checked,
                                  st.accepted FROM steps st WHERE {{where}}) st USING (step_id) {join}
GROUP BY st.ingest_id, st.segment_id, st.hour, p.position
"""


ROLLUP_POSITIONS_SELECT = rollup_positions_select()
# The per-request, per-position rollup of the steps matching {where}: checked and accepted positions, each request a
# cluster of every per-position interval (docs/math.md, "Intervals"). Position p of a step is checked when
# p <= checked and accepted when p <= accepted, so the steps are first counted by request and (accepted, checked),
# then each such count is spread over its checked positions: no positions table read, and few rows to expand.
ROLLUP_REQUEST_POSITIONS_SELECT = f"""
SELECT ingest_id, segment_id, hour, request_id, position::SMALLINT AS position, sum(n) AS checked,
       coalesce(sum(n) FILTER (WHERE position <= accepted), 0) AS accepted
FROM (SELECT *, unnest(range(1, checked + 1)) AS position
      FROM (SELECT st.ingest_id, st.segment_id, {HOUR_OF_STEP} AS hour, st.request_id, st.accepted, st.checked,
                   count(*) AS n
            FROM steps st WHERE {{where}} GROUP BY ALL))
GROUP BY ingest_id, segment_id, hour, request_id, position
"""
# Which requests have one rollup row in their run: sole rows are already per-request totals, so a summary reads them
# as they are and groups only the others (a request across hours or watched pieces), by far the fewer.
# {where} picks the (run, request) pairs to recount (r is rollup_requests, sg its segment).
SOLE_UPDATE = """
UPDATE rollup_requests rq SET sole = c.n = 1
FROM (SELECT sg.run_id, r.request_id, count(*) AS n FROM rollup_requests r JOIN segments sg USING (segment_id)
      {where} GROUP BY ALL) c, segments sg
WHERE sg.segment_id = rq.segment_id AND c.run_id = sg.run_id AND c.request_id = rq.request_id
"""

# A request's per-position rows are sole exactly where its rollup_requests row is (the same ingest, segment, hour and
# request), so a summary reads them as they are too. {where} narrows the requests whose flag is copied.
REQUEST_POSITIONS_SOLE_UPDATE = """
UPDATE rollup_request_positions rp SET sole = rq.sole
FROM rollup_requests rq
WHERE rq.ingest_id = rp.ingest_id AND rq.segment_id = rp.segment_id AND rq.hour = rp.hour
  AND rq.request_id = rp.request_id {where}
"""


def bounds_differ(lo: str, hi: str) -> str:
    """SQL: a position's bounds (SQL lo and hi) differ, so it has a row in position_bounds (migration 14). Compared
    as DuckDB compares doubles (-0.0 equals 0.0, NaN equals NaN): what a reader sums is the same either way."""
    return f"{hi} IS DISTINCT FROM {lo}"


# The positions' rollup of a large ingest is summed in ranges of this many steps, then the ranges' sums are added: each
# range's join of positions with their steps stays small (0.62 against 0.93-1.11 CPU s for 10M positions, 2.5M steps, in
# ranges of 500,000; docs/benchmarks.md, "The flat form (CSV, Parquet): how it loads"). Sums and counts add exactly (the
# sums are fixed-point decimals), so the rows are those of one pass.
ROLLUP_RANGE_STEPS = 500_000
_ROLLUP_POSITIONS_ADD = """
SELECT ingest_id, segment_id, hour, position, sum(checked) AS checked, sum(accepted) AS accepted,
       sum(beta_lo_sum) AS beta_lo_sum, sum(beta_lo_n) AS beta_lo_n, sum(beta_hi_sum) AS beta_hi_sum,
       sum(beta_hi_n) AS beta_hi_n
FROM rollup_positions_parts GROUP BY ingest_id, segment_id, hour, position
"""


def refresh_rollups(cur: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Add the rollup rows of the steps and positions one ingest published, inside its transaction. An ingest's
    steps hold the ids from its least to its greatest (with gaps, for a flat file), so its positions are found by
    step id range (the table's zone maps skip the rest)."""
    lo, hi, steps = cur.execute("SELECT min(step_id), max(step_id), count(*) FROM steps WHERE ingest_id = ?",
                                [ingest_id]).fetchall()[0]
    if lo is None:  # engine windows, Prometheus samples: no steps
        return
    for table, select in (("rollup_requests", ROLLUP_REQUESTS_SELECT),
                          ("rollup_request_positions", ROLLUP_REQUEST_POSITIONS_SELECT)):
        cur.execute(f"INSERT INTO {table} BY NAME {select.format(where='st.ingest_id = ?')}", [ingest_id])
    # the requests this ingest touched: one row now, or more (rows from earlier ingests of the same run)
    cur.execute(SOLE_UPDATE.format(where="SEMI JOIN (SELECT sg2.run_id, r2.request_id FROM rollup_requests r2 "
                                          "JOIN segments sg2 USING (segment_id) WHERE r2.ingest_id = ?) t "
                                          "ON t.run_id = sg.run_id AND t.request_id = r.request_id"), [ingest_id])
    cur.execute(REQUEST_POSITIONS_SOLE_UPDATE.format(
        where="AND rq.request_id IN (SELECT request_id FROM rollup_requests WHERE ingest_id = ?)"), [ingest_id])
    # The steps' id range as literals: DuckDB plans the join knowing the ids' bounds on both sides.
    select = rollup_positions_select(bool(cur.execute(
        "SELECT count(*) FROM position_bounds WHERE step_id BETWEEN ? AND ?", [lo, hi]).fetchall()[0][0]))
    parts = -(-int(steps) // ROLLUP_RANGE_STEPS)
    width = -(-(int(hi) - int(lo) + 1) // parts)  # ids that hold about ROLLUP_RANGE_STEPS steps
    ranges = [(a, min(a + width - 1, int(hi))) for a in range(int(lo), int(hi) + 1, width)]
    for n, (a, b) in enumerate(ranges):
        where = f"st.step_id BETWEEN {a} AND {b} AND st.ingest_id = ?"  # integers read above
        into = ("INSERT INTO rollup_positions BY NAME" if len(ranges) == 1 else
                "INSERT INTO rollup_positions_parts" if n else "CREATE OR REPLACE TEMP TABLE rollup_positions_parts AS")
        cur.execute(f"{into} {select.format(where=where)}", [ingest_id])
    if len(ranges) > 1:
        cur.execute(f"INSERT INTO rollup_positions BY NAME {_ROLLUP_POSITIONS_ADD}; DROP TABLE rollup_positions_parts")
