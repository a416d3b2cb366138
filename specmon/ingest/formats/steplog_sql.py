"""The step log's fast path: a whole JSON Lines file read, screened and staged by DuckDB, with no Python per step.

DuckDB reads each line (read_ndjson_objects: plain or gzip, BOM, CRLF and blank lines skipped), decodes the
contract's fields as JSON values (json_transform) and lists the line's keys (json_keys), and one query computes what
steplog.parse_step would: the checks, p_i(x_i) and q_i(x_i) from the top-k logprobs, beta from the logged field or
its sharp top-k bounds (the formula of theory.beta_bounds_topk_flat, in list lambdas), and the rows of
staging_steps and staging_positions. Python then only parses the ISO-8601 timestamps (specmon.core.times is the one
parser) through a vectorised function.

The query is a screen, not a judge: a line it cannot vouch for (any fault, a listed mass within 1e-9 of the
tolerance, an unknown or repeated field, dense distributions, a negative or huge epoch, a repeated token in a
top-k object, a list field that is null or no list, a trailing comma, which DuckDB's parser accepts) flags the file,
and so does any error of DuckDB's reader (invalid JSON, a line over 16 MB, a corrupt gzip stream). A flagged file
is staged by the Python path instead (steplog_jsonl's Reader), which names every fault with its file, line and
field exactly as before; nothing of the fast attempt is kept. Values are JSON text checked before any cast (a
string by its quote, an integer by its digits, a number by DuckDB's cast from the text, which refuses quotes and
true/false/null), so DuckDB's lenient casts ("1" or true as a number, 1.0 as an integer) never let through what
parse_step refuses.
"""
from __future__ import annotations

from datetime import datetime

import duckdb
import pyarrow as pa

from specmon.core import scalars, times
from specmon.core.limits import MAX_DRAFT_LEN, MAX_TOKEN_ID
from specmon.ingest.formats import textio

# steplog.KNOWN_FIELDS without the dense distributions, which the fast path leaves to the Python path.
_FIELDS = ("request_id", "draft_tokens", "accepted", "ts", "template", "k", "temperature", "target_logprobs",
           "draft_logprobs", "beta", "target_ms", "draft_ms", "emitted_tokens")
_LIST_FIELDS = ("draft_tokens", "target_logprobs", "draft_logprobs", "emitted_tokens")
_STRUCTURE = "{" + ", ".join(f'"{f}": "{"JSON[]" if f in _LIST_FIELDS else "JSON"}"' for f in _FIELDS) + "}"
# Epoch seconds are screened to [0, 1e11] (steplog refuses beyond 1e11; negative ones go the Python path).
_MAX_EPOCH_SECONDS = 1e11

# JSON text (as DuckDB writes it back: no whitespace, numbers as read) to a value, or NULL where parse_step would
# refuse the value's type: a string is text starting with '"', an integer digits alone; a number is whatever
# DuckDB casts to DOUBLE from the text (quoted strings and true/false/null are refused there).
_MACROS = f"""
CREATE OR REPLACE TEMP MACRO sm_is(t, c) AS starts_with(CAST(t AS VARCHAR), c);
CREATE OR REPLACE TEMP MACRO sm_num(t) AS TRY_CAST(CAST(t AS VARCHAR) AS DOUBLE);
CREATE OR REPLACE TEMP MACRO sm_finite(t, lo) AS coalesce(isfinite(sm_num(t)) AND sm_num(t) >= lo, false);
CREATE OR REPLACE TEMP MACRO sm_int(t) AS {scalars.integer_sql("t")};
CREATE OR REPLACE TEMP MACRO sm_str(t) AS CASE WHEN sm_is(t, '"') THEN t ->> '$' END;
-- Every item true (NULL counts as false); true for an empty list.
CREATE OR REPLACE TEMP MACRO sm_all(l) AS
    coalesce(list_bool_and(list_transform(l, lambda x: coalesce(x, false))), true);
CREATE OR REPLACE TEMP MACRO sm_tokens_ok(l) AS
    sm_all(list_transform(l, lambda t: sm_int(t) BETWEEN 0 AND {MAX_TOKEN_ID}));
-- A top-k field: every position an object whose keys each stand first where they occur (no key repeated), every
-- value a logprob (finite, <= 1e-6), every position's listed mass within the limit.
CREATE OR REPLACE TEMP MACRO sm_topk_ok(objs, keys, flat, sums, mass_limit) AS
    sm_all(list_transform(objs, lambda o: sm_is(o, '{{')))
    AND sm_all(list_transform(keys, lambda k: sm_all(list_transform(k, lambda t, j: list_position(k, t) = j))))
    AND list_count(flat) = len(flat) AND coalesce(list_max(flat) <= 1e-6 AND isfinite(list_min(flat)), true)
    AND coalesce(list_max(sums) <= mass_limit, true);
"""


def _iso(texts: pa.Array) -> pa.Array:
    """ISO-8601 JSON strings to naive UTC timestamps by specmon.core.times (NULL where it refuses one)."""
    out = []
    for text in texts.to_pylist():
        try:
            out.append(times.parse_iso(text) if text is not None else None)
        except (ValueError, OverflowError):
            out.append(None)
    return pa.array(out, pa.timestamp("us"))


def _steps_sql(gzip: bool) -> str:
    """The query that reads the file and computes every step's columns, its per-position lists, and `ok`."""
    # Per step: tk/qk the target's and draft's listed tokens at each position, tv/qv their logprobs, tp/qp their
    # probabilities (tpg: the target's first g rows, without the bonus row). Lists are paired with list_zip and
    # gathered with list_select rather than indexed inside inner lambdas, which would copy a list per item.
    values = "TRY_CAST(CAST(json_extract(x, '$.*') AS VARCHAR[]) AS DOUBLE[])"
    return f"""
WITH raw AS (
    SELECT json_keys(json) AS keys, json_transform(json, '{_STRUCTURE}') AS o,
           regexp_matches(json, ',[ \\t\\r\\n]*[\\]}}]') AS trailing_comma
    FROM read_ndjson_objects($path, compression = '{"gzip" if gzip else "none"}')
), fields AS (
    SELECT keys, trailing_comma, o.*, len(o.draft_tokens) AS g,
           list_transform(o.draft_tokens, lambda t: sm_int(t)) AS d, sm_int(o.accepted) AS acc,
           list_transform(o.target_logprobs, lambda x: json_keys(x)) AS tk,
           list_transform(o.target_logprobs, lambda x: {values}) AS tv,
           list_transform(o.draft_logprobs, lambda x: json_keys(x)) AS qk,
           list_transform(o.draft_logprobs, lambda x: {values}) AS qv,
           CASE WHEN sm_is(o.beta, '[') THEN TRY_CAST(CAST(CAST(o.beta AS JSON[]) AS VARCHAR[]) AS DOUBLE[])
           END AS bf,
           CASE WHEN sm_is(o.draft_ms, '[')
                THEN TRY_CAST(CAST(CAST(o.draft_ms AS JSON[]) AS VARCHAR[]) AS DOUBLE[]) END AS dms
    FROM raw
), probs AS (
    SELECT *, least(acc + 1, g) AS chk, sm_str(request_id) AS rid, sm_str(template) AS tpl, sm_int(k) AS kk,
           CASE WHEN sm_is(ts, '"') THEN sm_iso(ts ->> '$') END AS ts_iso, sm_num(ts) AS ts_num,
           list_transform(emitted_tokens, lambda t: sm_int(t)) AS em,
           list_transform(tv, lambda v: list_transform(v, lambda x: exp(x))) AS tp,
           list_transform(qv, lambda v: list_transform(v, lambda x: exp(x))) AS qp,
           flatten(tv) AS tflat, flatten(qv) AS qflat,
           bf IS NULL AND tk IS NOT NULL AND qk IS NOT NULL AS topk_bounds
    FROM fields
), shared AS (
    -- p_i(x_i) and q_i(x_i): the probability each side lists for the drafted token (NULL where unlisted); for
    -- the bounds, where each token the target lists stands in the draft's list (0 where it does not)
    SELECT *, tp[1:g] AS tpg,
           list_transform(tp, lambda p: coalesce(list_sum(p), 0)) AS tsum,
           list_transform(qp, lambda p: coalesce(list_sum(p), 0)) AS qsum,
           list_transform(list_zip(tk, tp, d), lambda z: z[2][list_position(z[1], CAST(z[3] AS VARCHAR))]) AS pt,
           list_transform(list_zip(qk, qp, d), lambda z: z[2][list_position(z[1], CAST(z[3] AS VARCHAR))]) AS qt,
           CASE WHEN topk_bounds THEN list_transform(list_zip(tk[1:g], qk), lambda z:
               list_transform(z[1], lambda t: coalesce(list_position(z[2], t), 0))) END AS q_at
    FROM probs
), crossed AS (
    -- the draft's probability of each token the target lists (NULL where unlisted), and each side's smallest
    -- listed probability (1 where it lists none)
    SELECT *,
           list_transform(list_zip(qp, q_at), lambda z: list_select(z[1], z[2])) AS q_at_p,
           list_transform(tpg, lambda v: coalesce(list_min(v), 1)) AS mp,
           list_transform(qp, lambda v: coalesce(list_min(v), 1)) AS mq
    FROM shared
), parts AS (
    -- beta's sharp bounds (theory.beta_bounds_topk_flat): F = sum over shared tokens of min(p, q); a (b): the
    -- target's (draft's) unshared tokens, each capped by the other side's smallest listed probability (b as the
    -- sum over all the draft's tokens less that over the shared ones, which q_at_p holds: keys are distinct); U:
    -- each side's unlisted mass.
    SELECT *,
           list_transform(list_zip(tpg, q_at_p), lambda z: coalesce(list_sum(list_transform(list_zip(z[1], z[2]),
               lambda y: CASE WHEN y[2] IS NOT NULL THEN least(y[1], y[2]) END)), 0)) AS f,
           list_transform(list_zip(tpg, q_at_p, mq), lambda z: coalesce(list_sum(list_transform(
               list_zip(z[1], z[2]), lambda y: CASE WHEN y[2] IS NULL THEN least(y[1], z[3]) END)), 0)) AS a,
           list_transform(list_zip(qp, q_at_p, mp), lambda z: greatest(
               coalesce(list_sum(list_transform(z[1], lambda q: least(q, z[3]))), 0)
               - coalesce(list_sum(list_transform(z[2], lambda q: CASE WHEN q IS NOT NULL THEN least(q, z[3]) END)), 0),
               0)) AS b,
           list_transform(tsum[1:g], lambda x: greatest(1 - x, 0)) AS up,
           list_transform(qsum, lambda x: greatest(1 - x, 0)) AS uq
    FROM crossed
)
SELECT g, acc, chk, rid, tpl, kk,
       coalesce(ts_iso, CASE WHEN ts_num IS NOT NULL
           THEN make_timestamp(CAST(trunc(ts_num) AS BIGINT) * 1000000
                               + CAST(round_even((ts_num - trunc(ts_num)) * 1e6, 0) AS BIGINT)) END) AS ts,
       sm_num(temperature) AS temperature, sm_num(target_ms) AS target_ms,
       CASE WHEN dms IS NOT NULL THEN coalesce(list_sum(dms), 0) ELSE sm_num(draft_ms) END AS draft_ms,
       em, d, pt, qt,
       CASE WHEN topk_bounds THEN f ELSE bf END AS blo,
       CASE WHEN topk_bounds THEN list_transform(list_zip(f, a, b, up, uq), lambda z:
           z[1] + least(z[5] + least(z[3], z[4]), z[4] + least(z[2], z[5]))) ELSE bf END AS bhi,
       coalesce(
           NOT trailing_comma AND list_has_all($known, keys) AND len(list_distinct(keys)) = len(keys)
           -- json_transform reads a list field that is no array (or null) as NULL: such a file goes the Python path
           AND {" AND ".join(f"({f} IS NOT NULL OR NOT list_contains(keys, '{f}'))" for f in _LIST_FIELDS)}
           AND rid <> '' AND g <= {MAX_DRAFT_LEN} AND sm_tokens_ok(draft_tokens) AND acc BETWEEN 0 AND g
           AND (ts IS NULL OR ts_iso IS NOT NULL OR ts_num BETWEEN 0 AND {_MAX_EPOCH_SECONDS})
           AND (template IS NULL OR tpl IS NOT NULL)
           AND (k IS NULL OR kk BETWEEN greatest(g, 1) AND {MAX_DRAFT_LEN})
           AND (temperature IS NULL OR sm_finite(temperature, 0))
           AND (target_ms IS NULL OR sm_finite(target_ms, 0))
           AND (draft_ms IS NULL OR CASE WHEN dms IS NULL THEN sm_finite(draft_ms, 0)
                                    ELSE sm_all(list_transform(dms, lambda x: isfinite(x) AND x >= 0)) END)
           AND (beta IS NULL OR (len(bf) = g AND sm_all(list_transform(bf, lambda x: x BETWEEN 0 AND 1))))
           AND (target_logprobs IS NULL
                OR (len(tk) IN (g, g + 1) AND sm_topk_ok(target_logprobs, tk, tflat, tsum, $mass_limit)))
           AND (draft_logprobs IS NULL
                OR (len(qk) = g AND sm_topk_ok(draft_logprobs, qk, qflat, qsum, $mass_limit)))
           AND (emitted_tokens IS NULL OR (len(em) <= least(acc + 1, {MAX_DRAFT_LEN})
                AND sm_tokens_ok(emitted_tokens) AND em[1:least(acc, len(em))] = d[1:least(acc, len(em))])),
           false) AS ok
FROM parts
"""


def stage(conn: duckdb.DuckDBPyConnection, path: str, *, sum_tol: float, default_template: str,
          ingest_time: datetime) -> tuple[int, int, int] | None:
    """Stage the whole file into staging_steps and staging_positions, or nothing: None where the fast path cannot
    vouch for every line (the caller then runs the Python path). Returns (steps, positions, steps without ts)."""
    conn.execute(_MACROS)
    # DuckDB takes the UDF type by name; its stubs list only an enum that the package does not export
    conn.create_function("sm_iso", _iso, ["VARCHAR"], "TIMESTAMP", type="arrow",  # type: ignore[call-overload]
                         side_effects=False)
    # A step's number is its row's rowid in fast_steps (a committed table of its own, so rowids count from 0):
    # DuckDB keeps a scan's order in the table a query of single-table steps creates (preserve_insertion_order),
    # while numbering the lines in the query (WITH ORDINALITY, row_number) would run all of it on one thread
    # (docs/benchmarks.md, "The step log (JSON Lines): how it loads").
    conn.execute("SET preserve_insertion_order = true")
    counts = None
    in_transaction = False
    try:
        conn.execute(f"CREATE TABLE fast_steps AS {_steps_sql(textio.is_gzip(path))}",
                     {"path": path, "known": list(_FIELDS), "mass_limit": 1.0 + sum_tol - 1e-9})
        (bad,) = conn.execute("SELECT count(*) FILTER (NOT ok) FROM fast_steps").fetchone() or (0,)
        if not bad:
            conn.execute("BEGIN TRANSACTION")
            in_transaction = True
            conn.execute("""
                INSERT INTO staging_steps SELECT rowid, coalesce(tpl, $template), rid, coalesce(ts, $now),
                    ts IS NULL, kk, g, acc, chk, temperature, target_ms, draft_ms,
                    CASE WHEN blo IS NOT NULL THEN coalesce(list_sum(blo[1:chk]), 0) END,
                    CASE WHEN bhi IS NOT NULL THEN coalesce(list_sum(bhi[1:chk]), 0) END,
                    em, NULL, NULL, NULL
                FROM fast_steps""", {"template": default_template, "now": ingest_time})
            conn.execute("""
                INSERT INTO staging_positions
                SELECT n, i, d[i], blo[i], bhi[i], pt[i], qt[i]
                FROM (SELECT rowid AS n, *, unnest(range(1, g + 1)) AS i FROM fast_steps)""")
            counts = conn.execute("SELECT count(*), coalesce(sum(g), 0), count(*) FILTER (ts IS NULL) "
                                  "FROM fast_steps").fetchone()
            conn.execute("COMMIT")
    except duckdb.Error:
        if in_transaction:
            conn.execute("ROLLBACK")
        counts = None
    conn.execute("DROP TABLE IF EXISTS fast_steps")  # the Python path, if it runs, stages into the same file
    return counts
