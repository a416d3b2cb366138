"""The flat form of the step log: one row per drafted position, as CSV (plain or gzip, with or without a BOM) or
Parquet.

The whole file is read, typed, checked and inserted by DuckDB inside the caller's transaction, so a large
Parquet file never passes through Python row by row. SQL here is built only from the fixed column names below,
never from the file's own text; file paths and values are bound as parameters.
"""
from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from specmon.faults import Fault
from specmon.formats import textio
from specmon.formats.base import Job, Rejected
from specmon.limits import MAX_DRAFT_LEN, MAX_TOKEN_ID
from specmon.store import Store, get_or_create_segment, next_step_id

FORMATS = ("flat-parquet", "flat-csv")
SOURCE = "steplog"
SNIFF_ORDER = 0  # Parquet's magic bytes first; CSV is told apart from the rest by its header (sniff_csv)

REQUIRED = ("request_id", "step", "position", "draft_token", "accepted")
# column -> DuckDB type it must cast to; ts is handled on its own (ISO-8601, epoch seconds, or a timestamp).
TYPES = {
    "request_id": "VARCHAR",
    "template": "VARCHAR",
    "step": "BIGINT",
    "position": "BIGINT",
    "draft_token": "BIGINT",
    "accepted": "BOOLEAN",
    "beta": "DOUBLE",
    "beta_lo": "DOUBLE",
    "beta_hi": "DOUBLE",
    "p_token": "DOUBLE",
    "q_token": "DOUBLE",
}
KNOWN = (*TYPES, "ts")
# Stored types that always cast to each type (the cast cannot fail): such a Parquet column needs no type check.
_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER")
_CASTS_TO = {
    "VARCHAR": ("VARCHAR",),
    "BIGINT": _INTEGERS,
    "BOOLEAN": ("BOOLEAN",),
    "DOUBLE": ("FLOAT", "DOUBLE", *_INTEGERS),
}
_PROBABILITY_COLUMNS = ("beta", "beta_lo", "beta_hi", "p_token", "q_token")
_CSV_LINE = re.compile(r"Line: (\d+)")


@dataclass
class FlatFile:
    columns: list[str]  # the known columns the file has
    rows: int
    ignored_columns: list[str]
    typed: frozenset[str] = frozenset()  # known columns whose stored type always casts to theirs (Parquet)


def sniff(head: bytes) -> str | None:
    """Parquet by its magic bytes; CSV by a header row naming at least one of the flat form's columns (the loader
    then names any required one that is missing)."""
    if head.startswith(b"PAR1"):
        return "flat-parquet"
    names = csv_header_names(head)
    return "flat-csv" if names and set(names) & set(KNOWN) else None


def csv_header_names(head: bytes) -> list[str] | None:
    """The names of a first line of several comma-separated names (a CSV header), else None."""
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    names = [n.strip().strip('"') for n in first.split(",")]
    return names if len(names) > 1 and all(re.fullmatch(r"[A-Za-z_][\w .-]{0,63}", n) for n in names) else None


def _csv_header(path: str) -> list[str]:
    line = textio.head(path, 1 << 16).split(b"\n", 1)[0].decode("utf-8", "replace")
    return next(csv.reader(io.StringIO(line)), [])


def load(cur: duckdb.DuckDBPyConnection, path: str, fmt: str, name: str) -> tuple[FlatFile | None, list[Fault]]:
    """Make flat_raw(line, <columns>) of the file (a temp table of CSV, a view of Parquet); report unreadable lines
    and missing columns."""
    if fmt == "flat-csv":
        header = _csv_header(path)
        columns = {h: "VARCHAR" for h in header}
        if len(columns) != len(header):
            return None, [Fault(name, 1, "", "the header names a column twice")]
        cur.execute(
            "CREATE OR REPLACE TEMP TABLE flat_read AS SELECT row_number() OVER () AS rn, * FROM read_csv(?, "
            "auto_detect = false, header = true, delim = ',', quote = '\"', escape = '\"', columns = ?, "
            "strict_mode = true, ignore_errors = true, store_rejects = true, compression = ?)",
            [path, columns, "gzip" if textio.is_gzip(path) else "none"],
        )
        rejects = cur.execute(
            "SELECT line, error_message FROM reject_errors ORDER BY line"
        ).fetchall()
        # Data row rn sits after each rejected line r_j with r_j - 2 - j < rn (j = rejects before it).
        cur.execute(
            "CREATE OR REPLACE TEMP TABLE flat_raw AS SELECT rn + 1 + (SELECT count(*) FROM ("
            "  SELECT line - 2 - (row_number() OVER (ORDER BY line) - 1) AS key FROM reject_errors) r "
            "  WHERE r.key < f.rn) AS line, f.* EXCLUDE (rn) FROM flat_read f"
        )
        faults = [Fault(name, int(line), "", f"unreadable CSV line: {msg.splitlines()[0]}") for line, msg in rejects]
    else:
        described = cur.execute("DESCRIBE SELECT * FROM read_parquet(?)", [path]).fetchall()
        header = [row[0] for row in described]
        typed = frozenset(name for name, kind, *_ in described if name in TYPES and kind in _CASTS_TO[TYPES[name]])
        # A view, not a copy: Parquet is read where it lies (its typed columns need no staging).
        cur.read_parquet(path, file_row_number=True).project(
            "file_row_number + 1 AS line, * EXCLUDE (file_row_number)").create_view("flat_raw", replace=True)
        faults = []
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        faults.append(Fault(name, 1, missing[0],
                            f"required column is missing (the flat form needs {', '.join(REQUIRED)})"))
        return None, faults
    rows = cur.execute("SELECT count(*) FROM flat_raw").fetchall()[0][0]
    return FlatFile([c for c in KNOWN if c in header], rows, [c for c in header if c not in KNOWN],
                    typed if fmt == "flat-parquet" else frozenset()), faults


def _typed_select(cols: list[str], typed: frozenset[str]) -> str:
    """Each known column cast to its type; raw_<column>, its text for messages, where the cast may fail."""
    parts = ["line"]
    for c in KNOWN:
        if c not in cols:
            parts.append(f"NULL::{'TIMESTAMP' if c == 'ts' else TYPES[c]} AS {c}")
        elif c == "ts":
            # ISO-8601 text or a timestamp type first; else epoch seconds (bounded: larger is not seconds).
            parts.append(
                "coalesce(TRY_CAST(ts AS TIMESTAMPTZ), CASE WHEN abs(TRY_CAST(ts AS DOUBLE)) < 1e11 "
                "THEN to_timestamp(TRY_CAST(ts AS DOUBLE)) END)::TIMESTAMP AS ts"
            )
        elif c in typed:
            parts.append(f"CAST({c} AS {TYPES[c]}) AS {c}")
        else:
            parts.append(f"TRY_CAST({c} AS {TYPES[c]}) AS {c}")
        if c in cols and c not in typed:
            parts.append(f"CAST({c} AS VARCHAR) AS raw_{c}")
    return ", ".join(parts)


def check(cur: duckdb.DuckDBPyConnection, flat: FlatFile, name: str) -> list[Fault]:
    """Type, range and per-step checks; every fault names its line and column. Builds temp table flat_typed."""
    cols = flat.columns
    cur.execute(f"CREATE OR REPLACE TEMP TABLE flat_typed AS SELECT {_typed_select(cols, flat.typed)} FROM flat_raw")
    min_pos = cur.execute("SELECT min(position) FROM flat_typed").fetchall()[0][0]
    base = 0 if min_pos == 0 else 1  # a file numbered from 0 (as vLLM numbers positions) is shifted to 1..g
    checks: list[str] = []
    for c in cols:
        if c in REQUIRED and c in flat.typed:
            empty = f"{c} IS NULL OR {c} = ''" if TYPES[c] == "VARCHAR" else f"{c} IS NULL"
            checks.append(f"SELECT line, '{c}', 'required value is empty' FROM flat_typed WHERE {empty}")
        elif c in REQUIRED:
            checks.append(f"SELECT line, '{c}', 'required value is empty' FROM flat_typed "
                          f"WHERE raw_{c} IS NULL OR raw_{c} = ''")
        if c in flat.typed:
            continue  # its cast cannot fail
        if c == "ts":
            checks.append(
                "SELECT line, 'ts', 'not an ISO-8601 timestamp or epoch seconds: ' || raw_ts FROM flat_typed "
                "WHERE raw_ts IS NOT NULL AND raw_ts <> '' AND ts IS NULL"
            )
            checks.append(
                "SELECT line, 'ts', raw_ts || ' in UTC falls outside the years 1 to 9999' FROM flat_typed "
                "WHERE NOT ts BETWEEN TIMESTAMP '0001-01-01' AND TIMESTAMP '9999-12-31 23:59:59.999999'"
            )
        elif TYPES[c] != "VARCHAR":
            kind = {"BIGINT": "an integer", "BOOLEAN": "true or false", "DOUBLE": "a number"}[TYPES[c]]
            checks.append(
                f"SELECT line, '{c}', 'expected {kind}, got ' || raw_{c} FROM flat_typed "
                f"WHERE raw_{c} IS NOT NULL AND raw_{c} <> '' AND {c} IS NULL"
            )
    checks += [
        f"SELECT line, 'position', 'position ' || position || ' is below {base} (positions count from 1, or from 0 "
        f"throughout a file)' FROM flat_typed WHERE position < {base}",
        f"SELECT line, 'draft_token', 'token id ' || draft_token || ' is outside 0..{MAX_TOKEN_ID}' FROM flat_typed "
        f"WHERE draft_token < 0 OR draft_token > {MAX_TOKEN_ID}",
        f"SELECT line, 'position', 'position ' || position || ' is beyond the {MAX_DRAFT_LEN} draft positions specmon "
        f"reads' FROM flat_typed WHERE position - {base} + 1 > {MAX_DRAFT_LEN}",
        "SELECT line, 'step', 'step ' || step || ' is negative' FROM flat_typed WHERE step < 0",
    ]
    for c in _PROBABILITY_COLUMNS:
        if c in cols:
            checks.append(
                f"SELECT line, '{c}', '{c} = ' || {c} || ' is outside [0, 1]' FROM flat_typed "
                f"WHERE NOT ({c} BETWEEN 0 AND 1) OR isnan({c})"
            )
    if "beta_lo" in cols and "beta_hi" in cols:
        checks.append("SELECT line, 'beta_lo', 'beta_lo exceeds beta_hi' FROM flat_typed WHERE beta_lo > beta_hi")
    # Per step, one aggregate finds the steps that may break a rule: a position outside base..63, positions that
    # are not base..g once each (a bitmask), an accepted position not below every rejected one, or an accepted
    # value missing. Only their rows are sorted to name the exact fault (no repeated position, positions
    # base..base+g-1, accepted a prefix), so a clean file never pays for the sort.
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_step_checks AS SELECT request_id, step, min(line) AS first_line, "
        "min(template) IS DISTINCT FROM max(template) AND count(template) > 0 AS two_templates, "
        "request_id IS NOT NULL AND step IS NOT NULL AND count(position) > 0 AND NOT coalesce("
        f"  min(position) >= {base} AND max(position) <= 63 AND count(accepted) = count(position) "
        f"  AND max(position) - {base} + 1 = count(position) "
        "  AND bit_count(bit_or(CASE WHEN position BETWEEN 0 AND 63 THEN 1::UBIGINT << position::INTEGER END)) "
        "      = count(position) "
        "  AND (max(position) FILTER (WHERE accepted) < min(position) FILTER (WHERE NOT accepted)) IS NOT FALSE, "
        "false) AS suspect "
        "FROM flat_typed GROUP BY request_id, step"
    )
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_order AS SELECT line, request_id, step, position, accepted, "
        "lag(position) OVER w AS prev_position, "
        "bool_and(accepted) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_ok "
        "FROM flat_typed WHERE position IS NOT NULL "
        "AND (request_id, step) IN (SELECT request_id, step FROM flat_step_checks WHERE suspect) "
        "WINDOW w AS (PARTITION BY request_id, step ORDER BY position, line)"
    )
    checks += [
        "SELECT line, 'position', 'position ' || position || ' appears twice in step ' || step || ' of request ' "
        "|| request_id FROM flat_order WHERE position = prev_position",
        f"SELECT min(line), 'position', 'positions of step ' || step || ' of request ' || request_id || ' are not "
        f"{base}..g without gaps' FROM flat_order GROUP BY request_id, step "
        f"HAVING max(position) - {base} + 1 <> count(DISTINCT position)",
        "SELECT line, 'accepted', 'accepted at position ' || position || ' after a rejected position in step ' "
        "|| step || ' (the accepted positions must be a prefix)' FROM flat_order WHERE accepted AND NOT before_ok",
    ]
    if "template" in cols:
        checks.append(
            "SELECT first_line, 'template', 'step ' || step || ' of request ' || request_id || ' names more than one "
            "template' FROM flat_step_checks WHERE two_templates"
        )
    rows = cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_faults AS "
        f"SELECT * FROM ({' UNION ALL '.join(checks)}) t(line, field, reason);"
        "SELECT line, field, reason FROM flat_faults ORDER BY line"
    ).fetchall()
    if base == 0:
        cur.execute("UPDATE flat_typed SET position = position + 1")
    return [Fault(name, int(line), field, reason) for line, field, reason in rows]


def reject_bad_steps(cur: duckdb.DuckDBPyConnection) -> list[tuple[int, str, str, str]]:
    """Drop every row of a step that has a faulty row; return (line, field, reason, row as JSON) of all dropped."""
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_bad AS SELECT DISTINCT t.line FROM flat_typed t "
        "WHERE t.line IN (SELECT line FROM flat_faults) OR t.request_id IS NULL OR t.step IS NULL "
        "OR (t.request_id, t.step) IN "
        "(SELECT request_id, step FROM flat_typed WHERE line IN (SELECT line FROM flat_faults))"
    )
    dropped = cur.execute(
        "SELECT b.line, coalesce(f.field, ''), coalesce(f.reason, 'another row of the same step was rejected'), "
        "to_json(r)::VARCHAR FROM flat_bad b JOIN flat_raw r USING (line) LEFT JOIN flat_faults f USING (line) "
        "ORDER BY b.line"
    ).fetchall()
    cur.execute("DELETE FROM flat_typed WHERE line IN (SELECT line FROM flat_bad)")
    return dropped


def insert(
    cur: duckdb.DuckDBPyConnection,
    *,
    ingest_id: int,
    default_template: str,
    first_step_id: int,
    ingest_time: str,
    segment_for: Callable[[str], int],
) -> tuple[int, int, int]:
    """Insert the checked rows of flat_typed as steps and positions. Returns (steps, positions, inferred_ts)."""
    templates = [r[0] for r in cur.execute(
        "SELECT DISTINCT coalesce(template, ?) FROM flat_typed", [default_template]
    ).fetchall()]
    cur.execute("CREATE OR REPLACE TEMP TABLE flat_segments (template VARCHAR, segment_id INTEGER)")
    for t in templates:
        cur.execute("INSERT INTO flat_segments VALUES (?, ?)", [t, segment_for(t)])
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_steps AS SELECT ? + row_number() OVER (ORDER BY min(line)) - 1 AS step_id, "
        "request_id, step, min(ts) AS ts, coalesce(any_value(template), ?) AS template, count(*) AS g, "
        "count(*) FILTER (WHERE accepted) AS accepted FROM flat_typed GROUP BY request_id, step",
        [first_step_id, default_template],
    )
    # checked = position <= accepted + 1; beta's bounds: an exact beta column wins over beta_lo/beta_hi.
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_pos AS SELECT s.step_id, sg.segment_id, t.position, t.draft_token, "
        "t.position <= s.accepted + 1 AS checked, t.accepted, coalesce(t.beta, t.beta_lo) AS beta_lo, "
        "coalesce(t.beta, t.beta_hi) AS beta_hi, t.p_token, t.q_token FROM flat_typed t "
        "JOIN flat_steps s USING (request_id, step) JOIN flat_segments sg ON sg.template = s.template"
    )
    cur.execute(
        "INSERT INTO steps (step_id, ingest_id, segment_id, request_id, step_index, ts, ts_inferred, g, accepted, "
        "checked, beta_lo_sum, beta_hi_sum) "
        "SELECT s.step_id, ?, sg.segment_id, s.request_id, s.step, coalesce(s.ts, ?::TIMESTAMP), s.ts IS NULL, s.g, "
        "s.accepted, least(s.accepted + 1, s.g), b.lo, b.hi FROM flat_steps s "
        "JOIN flat_segments sg ON sg.template = s.template LEFT JOIN (SELECT step_id, "
        "  CASE WHEN count(beta_lo) = count(*) THEN sum(beta_lo) END AS lo, "
        "  CASE WHEN count(beta_hi) = count(*) THEN sum(beta_hi) END AS hi "
        "  FROM flat_pos WHERE checked GROUP BY step_id) b USING (step_id) ORDER BY s.step_id",
        [ingest_id, ingest_time],
    )
    cur.execute("INSERT INTO positions SELECT * FROM flat_pos")
    steps, inferred = cur.execute("SELECT count(*), count(*) FILTER (WHERE ts IS NULL) FROM flat_steps").fetchall()[0]
    positions = cur.execute("SELECT count(*) FROM flat_pos").fetchall()[0][0]
    return int(steps), int(positions), int(inferred)


class Reader:
    """The flat form is read, checked and inserted by DuckDB inside the publishing transaction."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def prepare(self, store: Store) -> None:
        """Nothing to do before the transaction: DuckDB reads the file inside it."""

    def attach(self) -> dict | None:
        return None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        job = self.job
        try:
            flat, faults = load(cur, job.path, job.fmt, job.name)
        except duckdb.Error as exc:  # DuckDB's reader errors name the problem; put the file in front of it
            raise Rejected([Fault(job.name, 0, "", f"cannot read as {job.fmt}: {str(exc).splitlines()[0]}")]) \
                from None
        if flat is None:
            raise Rejected(faults)
        job.rows_read = flat.rows + len(faults)
        if flat.ignored_columns:
            job.notes.append(f"columns not in the flat form were ignored: {', '.join(flat.ignored_columns)}")
        for fault in faults:  # unreadable lines never reached a table
            job.fault(fault)
        for fault in check(cur, flat, job.name):
            job.count(fault)  # reported below with its row, by reject_bad_steps
        job.check()
        for line, field_name, reason, row in reject_bad_steps(cur):
            job.report.add(Fault(job.name, line, field_name, reason), row)
        job.steps, job.positions, job.no_time = insert(
            cur, ingest_id=ingest_id, default_template=job.default_template, first_step_id=next_step_id(cur),
            ingest_time=job.ingest_time.isoformat(), segment_for=lambda t: get_or_create_segment(cur, run_id, t))
        if job.progress:
            job.progress(1, 1)

    def close(self) -> None:
        """Nothing to release: the temp tables go with the transaction's connection."""
