"""The flat form of the step log: one row per drafted position, as CSV (plain or gzip, with or without a BOM) or
Parquet.

The whole file is read, typed, checked and inserted by DuckDB inside the caller's transaction, so a large
Parquet file never passes through Python row by row; one of more than PIECE_ROWS rows is aggregated (and, where
its steps' rows are not in order, its positions joined with their steps) in pieces of whole row groups, in the same
transaction, so that its per-step aggregate and joins fit the memory cap.
SQL here is built only from the fixed column names below and integers, never from the file's own text; file paths
and values are bound as parameters.
"""
from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import duckdb

from specmon.core import scalars
from specmon.core.faults import Fault
from specmon.core.limits import MAX_DRAFT_LEN, MAX_TOKEN_ID
from specmon.ingest.formats import textio
from specmon.ingest.formats.base import Job, Progress, Rejected
from specmon.store.database import Store, query_progress
from specmon.store.rollups import bounds_differ
from specmon.store.rows import get_or_create_segment, next_step_id

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


@dataclass
class FlatFile:
    columns: list[str]  # the known columns the file has
    rows: int
    ignored_columns: list[str]
    typed: frozenset[str] = frozenset()  # known columns whose stored type always casts to theirs (Parquet)
    kinds: dict[str, str] = field(default_factory=dict)  # column -> its stored type (CSV: all VARCHAR)
    templates: list[str] | None = None  # the templates it names, in order, where at most RANKED_TEMPLATES (screen)
    row_groups: list[int] = field(default_factory=list)  # rows per Parquet row group, in file order (CSV: none)
    pieces: list[tuple[int, int]] | None = None  # the line ranges it is aggregated and written in (screen)
    shift: str = "0"  # SQL over flat_read f: how far data row f.rn's line moves past rejected lines (CSV)


def sniff(head: bytes) -> str | None:
    """Parquet by its magic bytes; CSV by a header row naming at least one of the flat form's columns (the loader
    then names any required one that is missing)."""
    if head.startswith(b"PAR1"):
        return "flat-parquet"
    names = csv_header_names(head)
    return "flat-csv" if names and set(names) & set(KNOWN) else None


def csv_header_names(head: bytes) -> list[str] | None:
    """The names of a first line of several comma-separated names (a CSV header), else None."""
    first = _first_line(head).decode("utf-8", "replace").strip()
    names = [n.strip().strip('"') for n in first.split(",")]
    return names if len(names) > 1 and all(re.fullmatch(r"[A-Za-z_][\w .-]{0,63}", n) for n in names) else None


def _first_line(head: bytes) -> bytes:
    """The first line, ended by LF, CR or CRLF."""
    return _LINE_END.split(head, maxsplit=1)[0]


_LINE_END = re.compile(rb"\r\n?|\n")


def _csv_header(path: str) -> list[str]:
    line = _first_line(textio.head(path, 1 << 16)).decode("utf-8", "replace")
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
        shift = ("(SELECT count(*) FROM (SELECT line - 2 - (row_number() OVER (ORDER BY line) - 1) AS key "
                 "FROM reject_errors) r WHERE r.key < f.rn)") if rejects else "0"
        cur.execute(f"CREATE OR REPLACE TEMP TABLE flat_raw AS SELECT rn + 1 + {shift} AS line, f.* EXCLUDE (rn) "
                    "FROM flat_read f")
        faults = [Fault(name, int(line), "", f"unreadable CSV line: {msg.splitlines()[0]}") for line, msg in rejects]
        typed: frozenset[str] = frozenset()
        kinds = columns
    else:
        described = cur.execute("DESCRIBE SELECT * FROM read_parquet(?)", [path]).fetchall()
        header = [row[0] for row in described]
        typed = frozenset(name for name, kind, *_ in described if name in TYPES and kind in _CASTS_TO[TYPES[name]])
        kinds = {name: kind for name, kind, *_ in described}
        shift = "0"
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
    # Read only where the file may be cut in pieces (screen): a few milliseconds a file otherwise spent.
    row_groups: list[int] = []
    if fmt == "flat-parquet" and rows > PIECE_ROWS:
        row_groups = [n for _, n in cur.execute("SELECT DISTINCT row_group_id, row_group_num_rows "
                                                "FROM parquet_metadata(?) ORDER BY 1", [path]).fetchall()]
    known = [c for c in KNOWN if c in header]
    return FlatFile(known, rows, [c for c in header if c not in KNOWN], typed, kinds, row_groups=row_groups,
                    shift=shift), faults


class PhysicalLines:
    """Where CSV rows start in the file, as an editor numbers its lines: a quoted field may hold line breaks, and
    blank lines are skipped, so flat_raw's line (which counts records, one line each) and the lines DuckDB names
    for the records it rejects (which count blank lines too) are moved to the line where each record starts. The
    file is read for it (Python's csv reader) only where there are faults to name."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, flat: FlatFile, path: str, rejected: list[int]) -> None:
        self.cur, self.flat, self.path, self.rejected = cur, flat, path, set(rejected)
        self._starts: list[tuple[int, bool]] | None = None
        self._data: list[int] = []

    def _read(self) -> list[tuple[int, bool]]:
        """(the line where it starts, whether it is blank) for each record, indexed as DuckDB numbers lines (from
        1, the header)."""
        if self._starts is None:
            starts = [(0, True)]
            with textio.open_binary(self.path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace",
                                                                        newline="") as text:
                reader = csv.reader(text)
                end = 0
                for record in reader:
                    starts.append((end + 1, not record))
                    end = reader.line_num
            self._starts = starts
            self._data = [start for n, (start, blank) in enumerate(starts)
                          if n >= 2 and not blank and n not in self.rejected]
        return self._starts

    def rejected_line(self, line: int) -> int:
        """The start of a record DuckDB rejected, named by its line as DuckDB numbers them."""
        starts = self._read()
        return starts[line][0] if line < len(starts) else line

    def rows(self, lines: set[int]) -> dict[int, int]:
        """The start of each row of flat_raw named by its line."""
        self._read()
        found = self.cur.execute(
            f"SELECT line, rn FROM (SELECT f.rn + 1 + {self.flat.shift} AS line, f.rn FROM flat_read f) "
            "WHERE line IN (SELECT unnest(?::BIGINT[]))", [sorted(lines)]).fetchall()
        return {int(line): self._data[rn - 1] for line, rn in found if rn <= len(self._data)}


# Stored types whose every value has a text form that is not empty: a NULL test says whether a value was given.
_NUMBERS = (*_INTEGERS, "UBIGINT", "HUGEINT", "FLOAT", "DOUBLE")
_NEVER_EMPTY = (*_NUMBERS, "BOOLEAN", "DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMP_S", "TIMESTAMP_MS",
                "TIMESTAMP_NS")
_TS_RANGE = "TIMESTAMP '0001-01-01' AND TIMESTAMP '9999-12-31 23:59:59.999999'"


def _ts_expr(kind: str) -> str:
    """ts as TIMESTAMP (UTC): ISO-8601 text or a timestamp type first, else epoch seconds (bounded: larger is not
    seconds). A column stored as numbers is read as epoch seconds directly: the same microseconds (rounded to
    nearest) as to_timestamp, without text parsing or a time-zone conversion."""
    if kind in _NUMBERS or kind.startswith("DECIMAL"):
        return "CASE WHEN abs(ts::DOUBLE) < 1e11 THEN make_timestamp((ts::DOUBLE * 1000000)::BIGINT) END"
    return ("coalesce(TRY_CAST(ts AS TIMESTAMPTZ), CASE WHEN abs(TRY_CAST(ts AS DOUBLE)) < 1e11 "
            "THEN to_timestamp(TRY_CAST(ts AS DOUBLE)) END)::TIMESTAMP")


def _cast_view(cur: duckdb.DuckDBPyConnection, flat: FlatFile) -> None:
    """View flat_cast over flat_raw: each known column cast to its type; where the cast may fail, raw_<column> (its
    text, for messages) and has_<column> (a value was given). A view, so each query computes only what it reads."""
    parts = ["line"]
    for c in KNOWN:
        kind = flat.kinds.get(c, "")
        if c not in flat.columns:
            parts.append(f"NULL::{'TIMESTAMP' if c == 'ts' else TYPES[c]} AS {c}")
            continue
        if c == "ts":
            parts.append(f"{_ts_expr(kind)} AS ts")
        elif c in flat.typed:
            parts.append(f"CAST({c} AS {TYPES[c]}) AS {c}")
            continue
        elif TYPES[c] == "BIGINT":
            parts.append(f"{scalars.integer_sql(c)} AS {c}")
        elif TYPES[c] == "BOOLEAN":
            parts.append(f"{scalars.boolean_sql(c)} AS {c}")
        else:
            parts.append(f"TRY_CAST({c} AS {TYPES[c]}) AS {c}")
        parts.append(f"CAST({c} AS VARCHAR) AS raw_{c}")
        parts.append(f"{c} IS NOT NULL AS has_{c}" if kind in _NEVER_EMPTY
                     else f"CAST({c} AS VARCHAR) IS NOT NULL AND CAST({c} AS VARCHAR) <> '' AS has_{c}")
    cur.execute(f"CREATE OR REPLACE TEMP VIEW flat_cast AS SELECT {', '.join(parts)} FROM flat_raw")


def _row_rules(flat: FlatFile, base: int) -> list[tuple[str, str, str]]:
    """The rules each row must keep, as (field, SQL condition that breaks it, SQL text of the reason), over
    flat_cast. A row whose condition is NULL keeps the rule (its value is missing: another rule says so)."""
    cols = flat.columns
    rules: list[tuple[str, str, str]] = []
    for c in cols:
        if c in REQUIRED:
            typed_empty = f"{c} IS NULL OR {c} = ''" if TYPES[c] == "VARCHAR" else f"{c} IS NULL"
            rules.append((c, typed_empty if c in flat.typed else f"NOT has_{c}", "'required value is empty'"))
        if c in flat.typed:
            continue  # its cast cannot fail
        if c == "ts":
            rules.append(("ts", "has_ts AND ts IS NULL", "'not an ISO-8601 timestamp or epoch seconds: ' || raw_ts"))
            rules.append(("ts", f"NOT ts BETWEEN {_TS_RANGE}", "raw_ts || ' in UTC falls outside the years 1 to 9999'"))
        elif TYPES[c] != "VARCHAR":
            kind = {"BIGINT": scalars.INTEGER_EXPECTED, "BOOLEAN": scalars.BOOLEAN_EXPECTED,
                    "DOUBLE": "a number"}[TYPES[c]]
            rules.append((c, f"has_{c} AND {c} IS NULL", f"'expected {kind}, got ' || raw_{c}"))
    rules += [
        ("position", f"position < {base}", f"'position ' || position || ' is below {base} (positions count from 1, "
                                           "or from 0 throughout a file)'"),
        ("draft_token", f"draft_token < 0 OR draft_token > {MAX_TOKEN_ID}",
         f"'token id ' || draft_token || ' is outside 0..{MAX_TOKEN_ID}'"),
        ("position", f"position > {MAX_DRAFT_LEN + base - 1}",  # not position - base + 1: it may overflow
         f"'position ' || position || ' is beyond the {MAX_DRAFT_LEN} draft positions specmon reads'"),
        ("step", "step < 0", "'step ' || step || ' is negative'"),
    ]
    rules += [(c, f"NOT ({c} BETWEEN 0 AND 1) OR isnan({c})", f"'{c} = ' || {c} || ' is outside [0, 1]'")
              for c in _PROBABILITY_COLUMNS if c in cols]
    if "beta_lo" in cols and "beta_hi" in cols:
        rules.append(("beta_lo", "beta_lo > beta_hi", "'beta_lo exceeds beta_hi'"))
    return rules


def _bound(cols: list[str], b: str) -> str | None:
    """beta's lower (b = "lo") or upper bound at a position as SQL: an exact beta wins over beta_lo / beta_hi."""
    given = [c for c in ("beta", f"beta_{b}") if c in cols]
    return f"coalesce({', '.join(given)})" if given else None


# beta's bounds are summed as integers in units of 2^-90 (FIXED): an integer sum does not depend on the order of
# its terms, so the aggregate runs on every thread and a re-ingest stores the same bits. A bound of at least 2^-37
# is a whole number of units (a double has 53 significant bits), smaller ones move by at most 2^-91 when rounded to
# one; so the stored sum is the exact sum (to within g * 2^-91), rounded once to a double: at least as close as
# adding the doubles one by one. A HUGEINT holds the sum of 2^37 - 1 bounds of 1 (a step of so many rows is
# rejected anyway). A bound outside [0, 1] (or NaN) is left out of the sum: a row rule rejects its step.
FIXED = "1237940039285380274899124224.0"  # 2^90, a power of two: scaling by it is exact


def _fixed(value: str) -> str:
    return f"CASE WHEN {value} BETWEEN 0 AND 1 THEN ({value} * {FIXED})::HUGEINT END"


# The bound at a step's first rejected position, as the least of position * 2^96 + the bound in fixed point (2^95
# where it is missing) over its rejected positions: one min of a HUGEINT, several times cheaper than arg_min_null.
# Positions outside 0..63 are left out (the step is suspect).
_LOW96 = "79228162514264337593543950335"  # 2^96 - 1
_MISSING = "39614081257132168796771975168"  # 2^95, above any bound in fixed point (2^90 at most)


def _first_rejected(value: str) -> str:
    return (f"min(CASE WHEN position BETWEEN 0 AND 63 THEN (position::HUGEINT << 96) + coalesce({_fixed(value)}, "
            f"{_MISSING}::HUGEINT) END) FILTER (WHERE NOT accepted)")


def _first_bits(n: str, base: int) -> str:
    """SQL: the UBIGINT with bits base..base+n-1 set (NULL when they would pass bit 63)."""
    return (f"CASE WHEN {n} = 0 THEN 0::UBIGINT WHEN {n} <= {64 - base} "
            f"THEN (18446744073709551615::UBIGINT >> (64 - {n})::INTEGER) << {base} END")


# A file naming at most this many templates has each step's least and greatest template found as ranks in the
# file's sorted list of them (integers; exact, as the list is in the order min and max use): at 1M positions the
# aggregate took 0.228 against 0.256 CPU s with the text's min and max.
RANKED_TEMPLATES = 32


# A step's id is the ingest's first id (next_step_id) less one plus its first line's number. Ids so follow the
# file's order, as every format's do, with gaps (a step of g rows leaves g - 1 unused): a row of a step whose rows
# are adjacent lines in position order then finds its step's id from its own line and position, and the positions
# are written in one pass over the file, without joining them with their steps (insert). Nothing reads meaning
# into the gaps: step ids order steps and tie positions to them.
def _aggregate_steps(cur: duckdb.DuckDBPyConnection, source: str, cols: list[str], base: int,
                     rules: list[tuple[str, str, str]], first_step_id: int, templates: list[str] | None,
                     append: bool = False) -> None:
    """Temp table flat_step_agg (append: rows added to it): one row per (request_id, step) of `source`, its step_id
    first_step_id - 1 + its first line (see above), with what a step stores and what screens it.
    `broken`: a row breaks a rule; `suspect`: the step may break a per-step rule (positions that are not base..g
    once each, the accepted positions not base..base+a-1, both by bitmasks; an accepted value missing);
    `two_templates`. Only such steps are looked at row by row (check),
    so a clean file pays for one aggregate. beta_lo_sum and beta_hi_sum: beta's bounds summed over the checked
    positions (the accepted prefix and the first rejected position), NULL where one is missing. templates: the
    file's templates in order (FlatFile.templates), or None to compare them as text. `in_order`: the step's rows
    are adjacent lines in position order (every row's line less its position the same), so each row finds its step
    id from its own line and position (insert)."""
    broken = " OR ".join(f"({where})" for _, where, _ in rules) or "false"
    # A row's line less its position, for positions a step may hold (any other breaks a row rule, and cannot
    # overflow the subtraction here).
    offset = f"CASE WHEN position BETWEEN {base} AND {MAX_DRAFT_LEN} THEN line - position END"
    # A bit per position in base..63: the step's positions are base..g once each exactly when their bits are the
    # first n from base (n positions given), and its accepted ones a prefix when theirs are the first a.
    bit = f"CASE WHEN position BETWEEN {base} AND 63 THEN 1::UBIGINT << position::UBIGINT END"
    # Per bound: the fixed-point sum and count over the accepted positions and the bound at the first rejected
    # one (aggregates); the sum over the checked positions from them, or the other bound's, or NULL (outer).
    sums, outer = [], []
    for b in ("lo", "hi"):
        value = _bound(cols, b)
        if value is None:
            outer.append(f"NULL::DOUBLE AS beta_{b}_sum")
        elif b == "hi" and value == _bound(cols, "lo"):  # an exact beta only: one sum serves both bounds
            outer.append("beta_lo_sum AS beta_hi_sum")
        else:
            sums.append(f"sum({_fixed(value)}) FILTER (WHERE accepted) AS {b}_accepted, "
                        f"count({value}) FILTER (WHERE accepted) AS {b}_accepted_n, "
                        f"{_first_rejected(value)} AS {b}_next, ")
            outer.append(f"CASE WHEN accepted = g THEN CASE WHEN {b}_accepted_n = g "
                         f"THEN {b}_accepted::DOUBLE / {FIXED} END "
                         f"WHEN {b}_accepted_n = accepted AND {b}_next & {_LOW96} <> {_MISSING} "
                         f"THEN (coalesce({b}_accepted, 0) + ({b}_next & {_LOW96}))::DOUBLE / {FIXED} END "
                         f"AS beta_{b}_sum")
    # The step's least template (a NULL one aside) and whether its greatest differs: by rank ($2: the file's templates
    # in order) or as text. template_rank: the rank, n + 1 for none (insert finds the step's segment by it, and needs
    # no text then: 0.05 CPU s less at 10M positions than carrying each step's name).
    rank = "list_position($2::VARCHAR[], template)"
    least, greatest, template, template_rank = (
        ("min(template)", "max(template)", "least_template", "NULL::INTEGER") if templates is None else
        (f"min({rank})", f"max({rank})", "NULL::VARCHAR", "coalesce(least_template, len($2::VARCHAR[]) + 1)"))
    cur.execute(
        # Sorted by first line, so that the steps are stored in the order of their ids.
        f"{'INSERT INTO flat_step_agg' if append else 'CREATE OR REPLACE TEMP TABLE flat_step_agg AS'} "
        "SELECT $1 - 1 + first_line AS step_id, request_id, step, first_line, g, accepted, ts, "
        f"{template} AS template, {template_rank} AS template_rank, "
        f"two_templates, suspect, broken, in_order, {', '.join(outer)} FROM ("
        "SELECT request_id, step, min(line) AS first_line, count(*)::INTEGER AS g, "
        f"min({offset}) IS NOT DISTINCT FROM max({offset}) AS in_order, "
        "(count(*) FILTER (WHERE accepted))::INTEGER AS accepted, "
        f"min(ts) AS ts, {least} AS least_template, {''.join(sums)}"
        f"{least} IS DISTINCT FROM {greatest} AS two_templates, "
        "request_id IS NOT NULL AND step IS NOT NULL AND count(position) > 0 AND NOT coalesce("
        "  count(accepted) = count(position) "
        f"  AND bit_or({bit}) = {_first_bits('count(position)', base)} "
        f"  AND coalesce(bit_or({bit}) FILTER (WHERE accepted), 0) "
        f"      = {_first_bits('count(*) FILTER (WHERE accepted)', base)}, "
        f"false) AS suspect, coalesce(bool_or({broken}), false) AS broken "
        f"FROM {source} GROUP BY request_id, step) ORDER BY first_line",
        [first_step_id] if templates is None else [first_step_id, templates],
    )


# A Parquet file of more rows than this is screened (and its positions joined with their steps, where they must be) in
# pieces of whole row groups of at least this many rows, so that no per-step aggregate or join outgrows the memory cap
# and spills, and each works on a table that fits the caches (docs/benchmarks.md, "The flat form (CSV, Parquet): how it
# loads"). Two of pyarrow's row groups (2^20 rows each) make a piece, which DuckDB reads on two threads.
PIECE_ROWS = 2_000_000
# A step that passes the screen has at most 64 rows (positions base..63, once each), so a step that a cut would split
# ends within this many lines after it, or the screen flags it.
_STEP_ROWS = 64


def pieces(cur: duckdb.DuckDBPyConnection, flat: FlatFile) -> list[tuple[int, int]] | None:
    """Line ranges (first, last) covering a Parquet file in order, each whole row groups of at least PIECE_ROWS rows;
    a cut that would split the rows of a step (two adjacent lines of one (request_id, step)) is moved on to the next
    line of another step (none is made where none is found within _STEP_ROWS lines). None for one piece: a smaller
    file, or CSV. A step whose rows are not adjacent may still lie in two pieces: screen checks for that."""
    cuts, rows = [1], 0
    for n in flat.row_groups[:-1]:
        rows += n
        if rows + 1 - cuts[-1] < PIECE_ROWS:
            continue
        cut = cur.execute(
            "SELECT min(f.line) FROM flat_cast f, (SELECT request_id, step FROM flat_cast WHERE line = $1 - 1) p "
            "WHERE f.line BETWEEN $1 AND $1 + $2 - 1 "
            "AND (f.request_id IS DISTINCT FROM p.request_id OR f.step IS DISTINCT FROM p.step)",
            [rows + 1, _STEP_ROWS]).fetchall()[0][0]
        if cut is not None:
            cuts.append(int(cut))
    if len(cuts) == 1:
        return None
    cuts.append(flat.rows + 1)
    return list(zip(cuts[:-1], [c - 1 for c in cuts[1:]], strict=True))


def _piece_progress(progress: Progress | None, n: int, count: int) -> Progress | None:
    """progress of the n-th of `count` pieces' queries as progress of them all (each piece a like share)."""
    return None if progress is None else lambda done, total: progress((n * total + done) // count, total)


def _piece(source: str, piece: tuple[int, int] | None) -> str:
    """SQL of the rows of `source` on the piece's lines (all of them for None); the lines are integers."""
    return source if piece is None else f"(SELECT * FROM {source} WHERE line BETWEEN {piece[0]} AND {piece[1]})"


def screen(cur: duckdb.DuckDBPyConnection, flat: FlatFile, first_step_id: int,
           progress: Progress | None = None, size: int = 0) -> tuple[int, list[tuple[str, str, str]], bool]:
    """Cast the file (view flat_cast) and aggregate its steps (flat_step_agg), piece by piece where it has pieces
    (flat.pieces; None when a step lies in two of them: the whole file is aggregated at once then, so the table is
    the same either way). Returns (base, the row rules, whether any step may hold a fault). base: 0 for a file
    numbered from 0 (as vLLM numbers positions), stored shifted to 1..g; else 1. progress: told how far the
    aggregate has got, as a share of size (DuckDB's estimate, piece by piece)."""
    _cast_view(cur, flat)
    min_pos = cur.execute("SELECT min(position) FROM flat_cast").fetchall()[0][0]
    base = 0 if min_pos == 0 else 1
    rules = _row_rules(flat, base)
    named = [r[0] for r in cur.execute("SELECT DISTINCT template FROM flat_cast WHERE template IS NOT NULL "
                                       f"ORDER BY template LIMIT {RANKED_TEMPLATES + 1}").fetchall()]
    flat.templates = named if len(named) <= RANKED_TEMPLATES else None
    flat.pieces = pieces(cur, flat)
    whole: list[tuple[int, int] | None] = [None]  # one pass over the whole file
    ranges = flat.pieces or whole
    for n, piece in enumerate(ranges):
        with query_progress(cur, _piece_progress(progress, n, len(ranges)), size):
            _aggregate_steps(cur, _piece("flat_cast", piece), flat.columns, base, rules, first_step_id,
                             flat.templates, append=n > 0)
    # No step in two pieces: no request's steps in one piece (the piece of their first lines) overlap its steps in
    # another (a step without its key is not compared so: the whole file is aggregated at once then, as it is where
    # steps do overlap).
    if flat.pieces and cur.execute(
            "WITH r AS (SELECT piece, request_id, min(step) AS lo, max(step) AS hi, "
            "bool_or(request_id IS NULL OR step IS NULL) AS no_key FROM (SELECT CASE "
            + " ".join(f"WHEN first_line <= {last} THEN {n}" for n, (_, last) in enumerate(flat.pieces))
            + " END AS piece, request_id, step FROM flat_step_agg) GROUP BY piece, request_id) "
            "SELECT (SELECT bool_or(no_key) FROM r) OR EXISTS (SELECT 1 FROM r a JOIN r b "
            "ON a.request_id = b.request_id AND a.piece < b.piece AND a.lo <= b.hi AND b.lo <= a.hi)").fetchall()[0][0]:
        flat.pieces = None
        with query_progress(cur, progress, size):
            _aggregate_steps(cur, "flat_cast", flat.columns, base, rules, first_step_id, flat.templates)
    flagged = cur.execute("SELECT count(*) FILTER (WHERE broken OR suspect OR two_templates) "
                          "FROM flat_step_agg").fetchall()[0][0]
    return base, rules, flagged > 0


def check(cur: duckdb.DuckDBPyConnection, flat: FlatFile, base: int, rules: list[tuple[str, str, str]],
          name: str) -> list[Fault]:
    """Every fault of the file's rows, naming its line and column (temp table flat_faults). Per-step rules are
    checked row by row only in the steps the screen flagged: their rows are sorted to name the exact fault (a
    repeated position, a gap, accepted not a prefix)."""
    checks = [f"SELECT line, '{field}', {reason} FROM flat_cast WHERE {where}" for field, where, reason in rules]
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_order AS SELECT line, request_id, step, position, accepted, "
        "lag(position) OVER w AS prev_position, "
        "bool_and(accepted) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_ok "
        "FROM flat_cast WHERE position IS NOT NULL "
        "AND (request_id, step) IN (SELECT request_id, step FROM flat_step_agg WHERE suspect) "
        "WINDOW w AS (PARTITION BY request_id, step ORDER BY position, line)"
    )
    checks += [
        "SELECT line, 'position', 'position ' || position || ' appears twice in step ' || step || ' of request ' "
        "|| request_id FROM flat_order WHERE position = prev_position",
        f"SELECT min(line), 'position', 'positions of step ' || step || ' of request ' || request_id || ' are not "
        f"{base}..g without gaps' FROM flat_order GROUP BY request_id, step "
        f"HAVING max(position) <> count(DISTINCT position) + {base - 1}",
        "SELECT line, 'accepted', 'accepted at position ' || position || ' after a rejected position in step ' "
        "|| step || ' (the accepted positions must be a prefix)' FROM flat_order WHERE accepted AND NOT before_ok",
    ]
    if "template" in flat.columns:
        checks.append(
            "SELECT first_line, 'template', 'step ' || step || ' of request ' || request_id || ' names more than one "
            "template' FROM flat_step_agg WHERE two_templates"
        )
    rows = cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_faults AS "
        f"SELECT * FROM ({' UNION ALL '.join(checks)}) t(line, field, reason);"
        "SELECT line, field, reason FROM flat_faults ORDER BY line"
    ).fetchall()
    return [Fault(name, int(line), field, reason) for line, field, reason in rows]


def reject_bad_steps(cur: duckdb.DuckDBPyConnection, flat: FlatFile, base: int,
                     first_step_id: int) -> list[tuple[int, str, str, str]]:
    """Keep the rows of the steps without a faulty row in temp table flat_typed (and its steps in flat_step_agg);
    return (line, field, reason, row as JSON) of every row dropped."""
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE flat_bad AS SELECT DISTINCT t.line FROM flat_cast t "
        "WHERE t.line IN (SELECT line FROM flat_faults) OR t.request_id IS NULL OR t.step IS NULL "
        "OR (t.request_id, t.step) IN "
        "(SELECT request_id, step FROM flat_cast WHERE line IN (SELECT line FROM flat_faults))"
    )
    dropped = cur.execute(
        "SELECT b.line, coalesce(f.field, ''), coalesce(f.reason, 'another row of the same step was rejected'), "
        "to_json(r)::VARCHAR FROM flat_bad b JOIN flat_raw r USING (line) LEFT JOIN flat_faults f USING (line) "
        "ORDER BY b.line"
    ).fetchall()
    cur.execute("CREATE OR REPLACE TEMP TABLE flat_typed AS SELECT * FROM flat_cast "
                "WHERE line NOT IN (SELECT line FROM flat_bad)")
    _aggregate_steps(cur, "flat_typed", flat.columns, base, [], first_step_id, flat.templates)
    return dropped


# How a row finds its step when positions are written: a hash of the pair, checked afterwards (insert).
STEP_KEY = "hash(request_id, step)"


def insert(
    cur: duckdb.DuckDBPyConnection,
    *,
    source: str,
    base: int,
    ingest_id: int,
    default_template: str,
    ingest_time: str,
    segment_for: Callable[[str], int],
    templates: list[str] | None,
    first_step_id: int,
    tokens: bool = False,
    bounds: bool = False,
    pieces: list[tuple[int, int]] | None = None,
    progress: Progress | None = None,
    size: int = 0,
) -> tuple[int, int, int]:
    """Insert the checked rows of `source` (flat_cast or flat_typed; its steps, with their ids, in flat_step_agg) as
    steps and positions. Where every step's rows are adjacent lines in position order (`in_order`, the way every
    logger writes them), each position's step id follows from its line; else the positions are joined with their
    steps piece by piece (each step's rows lie in one piece). templates, first_step_id: as for _aggregate_steps.
    tokens: the file has p_token or q_token; bounds: beta_hi may differ from beta_lo (the file has beta_lo or
    beta_hi, as well as or instead of beta). progress: as for screen, for the steps' and positions'
    writes. Returns (steps, positions, inferred_ts)."""
    steps, inferred, positions, in_order = cur.execute(
        "SELECT count(*), count(*) FILTER (WHERE ts IS NULL), sum(g), coalesce(bool_and(in_order), true) "
        "FROM flat_step_agg").fetchall()[0]
    # The segment of each template the steps name (the default for none), created in the templates' order, found by
    # the steps' template rank where they have one (an integer join: 0.01 CPU s less for each insert at 1M than
    # joining on the text), else by text.
    cur.execute("CREATE OR REPLACE TEMP TABLE flat_segments (template VARCHAR, template_rank INTEGER, "
                "segment_id INTEGER)")
    if templates is None:
        named = [(t, None) for (t,) in cur.execute(
            "SELECT DISTINCT coalesce(template, ?) FROM flat_step_agg ORDER BY 1", [default_template]).fetchall()]
        on, on_params = "sg.template = coalesce(s.template, ?)", [default_template]
    else:
        names = [*templates, default_template]
        named = [(names[r - 1], r) for (r,) in cur.execute(
            "SELECT DISTINCT template_rank FROM flat_step_agg ORDER BY 1").fetchall()]
        on, on_params = "sg.template_rank = s.template_rank", []
    for t, r in named:
        cur.execute("INSERT INTO flat_segments VALUES (?, ?, ?)", [t, r, segment_for(t)])
    # A file in order is written in one pass, without a join; else piece by piece (None: the whole file at once).
    ranges: list[tuple[int, int] | None] = [None] if in_order or not pieces else list(pieces)
    # The steps' insert is told as one more share, before the positions' (the bar moves while it runs).
    with query_progress(cur, _piece_progress(progress, 0, len(ranges) + 1), size):
        cur.execute(
            "INSERT INTO steps (step_id, ingest_id, segment_id, request_id, step_index, ts, ts_inferred, g, accepted, "
            "checked, beta_lo_sum, beta_hi_sum) "
            "SELECT s.step_id, ?, sg.segment_id, s.request_id, s.step, coalesce(s.ts, ?::TIMESTAMP), s.ts IS NULL, "
            "s.g, s.accepted, least(s.accepted + 1, s.g), s.beta_lo_sum, s.beta_hi_sum "
            f"FROM flat_step_agg s JOIN flat_segments sg ON {on}",
            [ingest_id, ingest_time, *on_params],
        )
    # Positions are read back by their step's id, never by where they lie: DuckDB may write them in any order, which
    # a large insert needs less memory for. Their segment, checked and accepted are their step's (store.py,
    # position_rows); an exact beta column wins over its bounds.
    # p_token and q_token go to position_tokens, only where given (store.py, migration 12), and beta_hi to
    # position_bounds, only where it differs from beta_lo (migration 14).
    lo, hi = (f"coalesce(t.beta, t.beta_{b})" for b in ("lo", "hi"))
    tables = {"position_rows": (f"t.draft_token, {lo}", ""),
              "position_tokens": ("t.p_token, t.q_token", "WHERE t.p_token IS NOT NULL OR t.q_token IS NOT NULL"),
              "position_bounds": (hi, f"WHERE {bounds_differ(lo, hi)}")}
    into_tables = ["position_rows", *(["position_tokens"] if tokens else []), *(["position_bounds"] if bounds else [])]
    position = f"t.position - {base} + 1"  # as stored: 1..g
    cur.execute("SET preserve_insertion_order = false")
    try:
        if in_order:  # the step's first line is the row's line less its stored position plus one
            with query_progress(cur, _piece_progress(progress, 1, 2), size):
                for into in into_tables:
                    values, given = tables[into]
                    cur.execute(f"INSERT INTO {into} SELECT {first_step_id} + t.line - ({position}), {position}, "
                                f"{values} FROM {source} t {given}")
        else:
            write_joined(cur, source, position, tables, into_tables, ranges, progress, size)
    finally:
        cur.execute("RESET preserve_insertion_order")
    return int(steps), int(positions or 0), int(inferred)


def write_joined(cur: duckdb.DuckDBPyConnection, source: str, position: str, tables: dict[str, tuple[str, str]],
                  into_tables: list[str], ranges: list[tuple[int, int] | None], progress: Progress | None,
                  size: int) -> None:
    """Write the positions of a file whose steps' rows are not all adjacent lines in position order, piece by
    piece: rows meet their step by a 64-bit hash of (request_id, step) (STEP_KEY), a cheaper join than on the
    pair; two steps of the piece with one hash would give a row two steps, so the rows written are counted and, on
    a mismatch, written again joined on the pair. A piece's steps are those whose first line is in it, their ids
    one range (given as literals: the join knows its bounds and reads only those rows of flat_step_agg).
    position: SQL of a row's stored position."""

    def write(key: str, piece: tuple[int, int] | None, first_id: int, last_id: int, into: str) -> int:
        values, given = tables[into]
        return int(cur.execute(
            f"INSERT INTO {into} SELECT s.step_id, {position}, {values} "
            f"FROM (SELECT {key} AS key, * FROM {_piece(source, piece)}) t "
            f"JOIN (SELECT {key} AS key, step_id FROM flat_step_agg "
            f"WHERE step_id BETWEEN {first_id} AND {last_id}) s USING (key) {given}").fetchall()[0][0])

    for n, piece in enumerate(ranges):
        where = "" if piece is None else f"WHERE first_line BETWEEN {piece[0]} AND {piece[1]}"
        first_id, last_id, rows = cur.execute(
            f"SELECT min(step_id), max(step_id), sum(g) FROM flat_step_agg {where}").fetchall()[0]
        if first_id is None:  # every step of the piece was rejected
            continue
        with query_progress(cur, _piece_progress(progress, n + 1, len(ranges) + 1), size):
            key = STEP_KEY
            if write(key, piece, first_id, last_id, "position_rows") != rows:
                key = "(request_id, step)"
                cur.execute("DELETE FROM position_rows WHERE step_id BETWEEN ? AND ?", [first_id, last_id])
                write(key, piece, first_id, last_id, "position_rows")
            for into in into_tables[1:]:
                write(key, piece, first_id, last_id, into)


class Reader:
    """The flat form is read, checked and inserted by DuckDB inside the publishing transaction."""

    prepares = False  # nothing is read before the transaction (ingest need not look for the file beforehand)

    def __init__(self, job: Job) -> None:
        self.job = job

    def prepare(self, store: Store) -> None:
        """Nothing to do before the transaction: DuckDB reads the file inside it."""

    def attach(self) -> dict | None:
        return None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        job = self.job
        size = os.path.getsize(job.path)

        def half(offset: int) -> Progress | None:  # the screen's pass is the first half, the writes the second
            progress = job.progress
            return None if progress is None else lambda done, total: progress(offset + done // 2, size)

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
        first_step_id = next_step_id(cur)
        base, rules, suspect = screen(cur, flat, first_step_id, half(0), size)
        row_faults = check(cur, flat, base, rules, job.name) if suspect else []
        physical = PhysicalLines(cur, flat, job.path, [f.line for f in faults]) if job.fmt == "flat-csv" else None
        if physical is not None and (faults or row_faults):
            faults = [replace(f, line=physical.rejected_line(f.line)) for f in faults]
            moved = physical.rows({f.line for f in row_faults})
            row_faults = [replace(f, line=moved.get(f.line, f.line)) for f in row_faults]
        for fault in faults:  # unreadable lines never reached a table
            job.fault(fault)
        for fault in row_faults:
            job.count(fault)  # reported below with its row, by reject_bad_steps
        job.check()
        source = "flat_cast"
        if row_faults:
            dropped = reject_bad_steps(cur, flat, base, first_step_id)
            moved = physical.rows({line for line, *_ in dropped}) if physical is not None else {}
            for line, field_name, reason, row in dropped:
                job.report.add(Fault(job.name, moved.get(line, line), field_name, reason), row)
            source = "flat_typed"
        job.steps, job.positions, job.no_time = insert(
            cur, source=source, base=base, ingest_id=ingest_id, default_template=job.default_template,
            ingest_time=job.ingest_time.isoformat(), segment_for=lambda t: get_or_create_segment(cur, run_id, t),
            templates=flat.templates, first_step_id=first_step_id,
            tokens=bool({"p_token", "q_token"} & set(flat.columns)),
            bounds=_bound(flat.columns, "lo") != _bound(flat.columns, "hi"), pieces=flat.pieces,
            progress=half(size // 2), size=size)
        if job.progress:
            job.progress(size, size)

    def close(self) -> None:
        """Nothing to release: the temp tables go with the transaction's connection."""
