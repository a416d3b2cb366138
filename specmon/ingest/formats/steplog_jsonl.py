"""specmon's step log as JSON Lines (plain or gzip, with or without a BOM): one step per line (specmon.ingest.steplog).

A file is first offered to the fast path (steplog_sql: DuckDB reads, checks and stages the whole file, with no
Python per step). Where it cannot vouch for every line (a fault, dense distributions, unknown fields, anything
DuckDB reads more leniently than orjson), the file is read by the Python path below instead: lines decoded by
orjson and validated a chunk at a time by steplog.parse_steps (which vouches for the common case in numpy passes and
leaves every fault to parse_step, so messages name the line and field exactly as before). Either way the steps go
into a staging file of their own, so the main database is not locked while a large file is read; the publishing
transaction moves them in at once, by a plain scan in file order.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

import duckdb
import orjson
import pyarrow as pa

from specmon.core.faults import Fault, RowFault
from specmon.core.limits import MAX_JSON_LINE_BYTES
from specmon.ingest import steplog
from specmon.ingest.formats import steplog_sql, textio
from specmon.ingest.formats.base import Job
from specmon.store.database import Store, query_progress
from specmon.store.rollups import bounds_differ
from specmon.store.rows import get_or_create_segment, next_step_id
from specmon.store.schema import STEP_DETAILS, STEP_DETAILS_GIVEN

FORMATS = ("steplog-jsonl",)
SOURCE = "steplog"
SNIFF_ORDER = 40
_BATCH_STEPS = 16384
# Lines parsed together: enough for parse_steps' numpy passes to pay off, few enough to keep memory small.
_PARSE_LINES = 2048
_LONG_DIGITS = re.compile(rb"[0-9]{19}")  # an integer that may be beyond 64 bits (or a long digit string)


def _chunks(lines: Iterator[tuple[int, bytes, bool]]) -> Iterator[list[tuple[int, bytes, bool]]]:
    """The lines in lists of _PARSE_LINES; where the file turns unreadable, the lines before it come first."""
    chunk: list[tuple[int, bytes, bool]] = []
    try:
        for line in lines:
            chunk.append(line)
            if len(chunk) == _PARSE_LINES:
                yield chunk
                chunk = []
    except textio.Unreadable:
        if chunk:
            yield chunk
        raise
    if chunk:
        yield chunk


def sniff(head: bytes) -> str | None:
    """A step log's first non-blank line is a JSON object."""
    first = next((line for line in head.splitlines() if line.strip()), b"")
    return FORMATS[0] if first.lstrip()[:1] == b"{" else None


def _exact(raw: bytes, obj: object) -> object:
    """The line's value with its integers exact: orjson reads one beyond 64 bits as a float, Python's json keeps it
    (read again only where the line has a long run of digits)."""
    if not _LONG_DIGITS.search(raw):
        return obj
    try:
        return json.loads(raw)
    except (RecursionError, ValueError):  # nested deeper than Python's parser goes: orjson's reading stands
        return obj


class _StepBatch:
    """Columns of steps and positions gathered in Python and appended to DuckDB as Arrow tables."""

    STEP_COLUMNS = (
        "local_step", "template", "request_id", "ts", "ts_inferred", "k", "g", "accepted", "checked",
        "temperature", "target_ms", "draft_ms", "beta_lo_sum", "beta_hi_sum", "emitted_tokens", "pit_below",
        "pit_mass", "extra",
    )
    STEP_SCHEMA = pa.schema([
        ("local_step", pa.int64()), ("template", pa.string()), ("request_id", pa.string()),
        ("ts", pa.timestamp("us")), ("ts_inferred", pa.bool_()), ("k", pa.int32()), ("g", pa.int32()),
        ("accepted", pa.int32()), ("checked", pa.int32()), ("temperature", pa.float64()),
        ("target_ms", pa.float64()), ("draft_ms", pa.float64()), ("beta_lo_sum", pa.float64()),
        ("beta_hi_sum", pa.float64()), ("emitted_tokens", pa.list_(pa.int32())),
        ("pit_below", pa.list_(pa.float64())), ("pit_mass", pa.list_(pa.float64())), ("extra", pa.string()),
    ])
    POSITION_SCHEMA = pa.schema([
        ("local_step", pa.int64()), ("position", pa.int16()), ("draft_token", pa.int32()),
        ("beta_lo", pa.float64()), ("beta_hi", pa.float64()), ("p_token", pa.float64()), ("q_token", pa.float64()),
    ])

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.steps: dict[str, list] = {c: [] for c in self.STEP_SCHEMA.names}
        self.pos: dict[str, list] = {c: [] for c in self.POSITION_SCHEMA.names}

    def __len__(self) -> int:
        return len(self.steps["local_step"])

    def add(self, s: steplog.Step, local_step: int, template: str, ts, inferred: bool) -> None:
        g, checked = s.g, s.checked
        lo_sum = hi_sum = None
        if s.beta_lo is not None and s.beta_hi is not None:
            lo_sum = sum(s.beta_lo[:checked])
            hi_sum = sum(s.beta_hi[:checked])
        for col, value in zip(self.STEP_COLUMNS, (
            local_step, template, s.request_id, ts, inferred, s.k, g, s.accepted, checked,
            s.temperature, s.target_ms, s.draft_ms, lo_sum, hi_sum, s.emitted_tokens, s.pit_below, s.pit_mass,
            s.extra,
        ), strict=True):
            self.steps[col].append(value)
        if not g:
            return
        none = [None] * g
        p = self.pos
        p["local_step"] += [local_step] * g
        p["position"] += range(1, g + 1)
        p["draft_token"] += s.draft_tokens
        p["beta_lo"] += s.beta_lo if s.beta_lo is not None else none
        p["beta_hi"] += s.beta_hi if s.beta_hi is not None else none
        p["p_token"] += s.p_token if s.p_token is not None else none
        p["q_token"] += s.q_token if s.q_token is not None else none

    def flush(self, cur: duckdb.DuckDBPyConnection) -> int:
        """Append the gathered rows to the staging tables; returns the positions written."""
        steps = pa.Table.from_pydict(self.steps, schema=self.STEP_SCHEMA)
        positions = pa.Table.from_pydict(self.pos, schema=self.POSITION_SCHEMA)
        cur.register("batch_steps", steps)
        cur.register("batch_positions", positions)
        cols = ", ".join(self.STEP_COLUMNS)
        cur.execute(f"INSERT INTO staging_steps ({cols}) SELECT {cols} FROM batch_steps")
        cur.execute("INSERT INTO staging_positions SELECT * FROM batch_positions")
        cur.unregister("batch_steps")
        cur.unregister("batch_positions")
        n = positions.num_rows
        self._clear()
        return n


class Reader:
    """Validates every line and stages the good steps; publish moves them into steps and positions."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.store: Store | None = None
        self.staging_path: str | None = None
        self.local_step = 0

    def prepare(self, store: Store) -> None:
        job = self.job
        self.store = store
        total = os.path.getsize(job.path)
        with store.staging() as (self.staging_path, cur):
            with query_progress(cur, job.progress, total):
                staged = steplog_sql.stage(cur, job.path, sum_tol=job.sum_tol, default_template=job.default_template,
                                           ingest_time=job.ingest_time)
            if staged is not None:
                steps, positions, no_time = staged
                job.rows_read, job.steps, job.positions, job.no_time = steps, steps, positions, no_time
                self.local_step = steps
            else:
                self._stage_lines(cur, total)
        if job.progress:
            job.progress(total, total)
        job.check()

    def _stage_lines(self, cur: duckdb.DuckDBPyConnection, total: int) -> None:
        """The Python path: every line decoded by orjson and parsed by steplog.parse_steps, faults named."""
        job = self.job
        batch = _StepBatch()
        done = 0
        try:
            for chunk in _chunks(textio.lines(job.path, MAX_JSON_LINE_BYTES)):
                done += sum(len(raw) for _, raw, _ in chunk)
                self._stage(chunk, batch)
                if len(batch) >= _BATCH_STEPS:
                    self._flush(batch, cur)
                    if job.progress:
                        job.progress(min(done, total), total)
            if len(batch) and not (job.fault_count and not job.skip_bad):
                self._flush(batch, cur)
        except textio.Unreadable as exc:
            job.fault(Fault(job.name, 0, "", str(exc)))

    def _stage(self, chunk: list[tuple[int, bytes, bool]], batch: _StepBatch) -> None:
        """Parse a chunk of lines (steplog.parse_steps) and add its good steps to the batch, in file order."""
        job = self.job
        chunk = [line for line in chunk if line[1].strip() or line[2]]
        job.rows_read += len(chunk)
        decoded: list[object] = []
        for _, raw, too_long in chunk:
            if too_long:
                decoded.append(RowFault("", f"line longer than {MAX_JSON_LINE_BYTES} bytes (dense distributions "
                                            "belong in the flat form's Parquet)"))
                continue
            try:
                decoded.append(_exact(raw, orjson.loads(raw)))
            except orjson.JSONDecodeError as exc:
                decoded.append(RowFault("", f"invalid JSON ({exc})"))
        objs = [d for d in decoded if not isinstance(d, RowFault)]
        parsed = iter(steplog.parse_steps(objs, job.sum_tol))
        for (no, raw, _), item in zip(chunk, decoded, strict=True):
            step = item if isinstance(item, RowFault) else next(parsed)
            if isinstance(step, RowFault):
                job.fault(Fault(job.name, no + job.first_line - 1, step.field, step.reason),
                          raw[:4096].decode("utf-8", "replace").rstrip("\n"))
                continue
            if job.fault_count and not job.skip_bad:
                continue  # keep validating to report more faults, but store nothing
            template = step.template if step.template is not None else job.default_template
            job.no_time += step.ts is None
            batch.add(step, self.local_step, template, step.ts or job.ingest_time, step.ts is None)
            self.local_step += 1

    def _flush(self, batch: _StepBatch, cur: duckdb.DuckDBPyConnection) -> None:
        self.job.steps += len(batch)
        self.job.positions += batch.flush(cur)

    def attach(self) -> dict | None:
        return {"stage": self.staging_path} if self.staging_path else None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        """Move the staged rows (the staging file attached as `stage`) into steps and positions.

        The rows are staged in file order and moved in that order by a plain scan (no join, no sort), so the
        move streams: its memory does not grow with the file."""
        # Segments are made in the order their templates first appear in the file, whichever path staged it.
        templates = [r[0] for r in cur.execute(
            "SELECT template FROM stage.staging_steps GROUP BY template ORDER BY min(local_step)").fetchall()]
        segments = [get_or_create_segment(cur, run_id, t) for t in templates]
        segment_of = "map(?::VARCHAR[], ?::INTEGER[])[template]"
        base = next_step_id(cur)
        cols = "request_id, ts, ts_inferred, k, g, accepted, checked, beta_lo_sum, beta_hi_sum"
        cur.execute(
            f"INSERT INTO steps (step_id, ingest_id, segment_id, {cols}) SELECT ? + local_step, ?, {segment_of}, "
            f"{cols} FROM stage.staging_steps",
            [base, ingest_id, templates, segments])
        cur.execute(  # the optional fields only for the steps that give one (store.STEP_DETAILS)
            f"INSERT INTO step_details SELECT ? + local_step, {', '.join(STEP_DETAILS)} FROM stage.staging_steps "
            f"WHERE {STEP_DETAILS_GIVEN}", [base])
        cur.execute("INSERT INTO position_rows SELECT ? + local_step, position, draft_token, beta_lo "
                    "FROM stage.staging_positions", [base])
        cur.execute("INSERT INTO position_bounds SELECT ? + local_step, position, beta_hi FROM stage.staging_positions "
                    f"WHERE {bounds_differ('beta_lo', 'beta_hi')}", [base])
        cur.execute("INSERT INTO position_tokens SELECT ? + local_step, position, p_token, q_token "
                    "FROM stage.staging_positions WHERE p_token IS NOT NULL OR q_token IS NOT NULL", [base])

    def close(self) -> None:
        if self.staging_path and self.store is not None:
            self.store.discard_staging(self.staging_path)
