"""Ingest a file into the store: detect its format, validate it, and make it visible in one transaction.

Formats: specmon's step log (JSON Lines, or the flat form as CSV or Parquet), engine logs and JSON responses
(specmon.engines) and Prometheus pages (specmon.prometheus). A file is all-or-nothing: on any fault nothing of it
is stored, unless skip_bad is set, in which case the good rows are stored and the rejected ones are written, with
their reasons, to a report file. A file whose bytes were ingested before (same sha256) is a no-op. JSON Lines
stream in batches into a staging file of their own (memory stays bounded by the batch, and the main database is
not locked while a large file is read), then are published into the database in one short transaction.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import duckdb
import orjson
import pyarrow as pa

from specmon import engines, flatlog, prometheus, steplog
from specmon.formats import engine_json, engine_log, textio
from specmon.faults import Fault, RowFault, SpecmonError
from specmon.store import Store, add_ingest, get_or_create_run, get_or_create_segment, next_step_id

FORMATS = ("steplog-jsonl", "flat-csv", "flat-parquet", "engine-log", "engine-json", "prometheus")
STEP_FORMATS = ("steplog-jsonl", "flat-csv", "flat-parquet")
ENGINE_FORMATS = ("engine-log", "engine-json", "prometheus")
_SNIFF_BYTES = 1 << 20  # a server log may print a page of start-up lines before its first metrics line
MAX_FAULTS_KEPT = 20
_BATCH_STEPS = 16384

Progress = Callable[[int, int], None]


@dataclass
class IngestResult:
    file: str
    status: str  # "stored", "already ingested" or "rejected"
    source_format: str
    run: str = ""
    rows_read: int = 0
    steps: int = 0
    positions: int = 0
    rejected: int = 0
    fault_count: int = 0
    faults: list[Fault] = field(default_factory=list)  # the first MAX_FAULTS_KEPT
    notes: list[str] = field(default_factory=list)
    report_path: str | None = None

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "faults"}
        d["faults"] = [f.as_dict() for f in self.faults]
        return d


class _Rejected(Exception):
    """Raised inside the transaction to roll a faulty file back."""


def detect_format(path: str) -> str:
    """Tell the format from the file's first bytes: Parquet magic, an engine's log or JSON responses, a
    Prometheus exposition, a step log (JSON objects), or else the flat form's CSV."""
    with open(path, "rb") as fh:
        if fh.read(4) == b"PAR1":
            return "flat-parquet"
    head = textio.head(path, _SNIFF_BYTES)
    if engine_json.sniff(head):
        return "engine-json"
    if engine_log.sniff(head):
        return "engine-log"
    if prometheus.sniff(head):
        return "prometheus"
    if head.lstrip()[:1] in (b"{", b""):
        return "steplog-jsonl"
    return "flat-csv"


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


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
        ("local_step", pa.int64()), ("template", pa.string()), ("position", pa.int16()),
        ("draft_token", pa.int32()),
        ("checked", pa.bool_()), ("accepted", pa.bool_()), ("beta_lo", pa.float64()), ("beta_hi", pa.float64()),
        ("p_token", pa.float64()), ("q_token", pa.float64()),
    ])

    def __init__(self) -> None:
        self.steps = {c: [] for c in self.STEP_SCHEMA.names}
        self.pos = {c: [] for c in self.POSITION_SCHEMA.names}

    def __len__(self) -> int:
        return len(self.steps["local_step"])

    def add(self, s: steplog.Step, local_step: int, template: str, ts: datetime, inferred: bool) -> None:
        g, checked = s.g, s.checked
        lo_sum = hi_sum = None
        if s.beta_lo is not None:
            lo_sum = sum(s.beta_lo[:checked])
            hi_sum = sum(s.beta_hi[:checked])
        for col, value in zip(self.STEP_COLUMNS, (
            local_step, template, s.request_id, ts, inferred, s.k, g, s.accepted, checked,
            s.temperature, s.target_ms, s.draft_ms, lo_sum, hi_sum, s.emitted_tokens, s.pit_below, s.pit_mass,
            s.extra,
        )):
            self.steps[col].append(value)
        if not g:
            return
        none = [None] * g
        p = self.pos
        p["local_step"] += [local_step] * g
        p["template"] += [template] * g
        p["position"] += range(1, g + 1)
        p["draft_token"] += s.draft_tokens
        p["checked"] += [i < checked for i in range(g)]
        p["accepted"] += [i < s.accepted for i in range(g)]
        p["beta_lo"] += s.beta_lo if s.beta_lo is not None else none
        p["beta_hi"] += s.beta_hi if s.beta_hi is not None else none
        p["p_token"] += s.p_token if s.p_token is not None else none
        p["q_token"] += s.q_token if s.q_token is not None else none

    def flush(self, cur) -> int:
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
        self.__init__()
        return n


class _RejectReport:
    """The --skip-bad report: rejected rows with their reasons, written as they are found (JSON Lines)."""

    def __init__(self, path: str):
        self.path = path
        self.count = 0
        self._out = None

    def add(self, fault: Fault, raw: object) -> None:
        if self._out is None:
            self._out = open(self.path, "wb")
        self._out.write(orjson.dumps({**fault.as_dict(), "raw": raw}, option=orjson.OPT_APPEND_NEWLINE))
        self.count += 1

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


def _stage_jsonl(store: Store, path: str, name: str, result: IngestResult, *, default_template: str,
                 skip_bad: bool, sum_tol: float, report: _RejectReport, progress: Progress | None,
                 ingest_time: datetime, first_line: int) -> tuple[str, int]:
    """Validate a JSON Lines step log and write its steps to a staging file of their own. Returns the staging
    file's path (the caller publishes, then discards it) and the number of steps without ts."""
    total = os.path.getsize(path)
    batch = _StepBatch()
    done = inferred = local_step = 0
    writing = True
    with store.staging() as (staging_path, cur), open(path, "rb") as fh:
        try:
            for line_no, raw in enumerate(fh, start=first_line):
                done += len(raw)
                if not raw.strip():
                    continue
                result.rows_read += 1
                try:
                    try:
                        obj = orjson.loads(raw)
                    except orjson.JSONDecodeError as exc:
                        raise RowFault("", f"invalid JSON ({exc})") from None
                    step = steplog.parse_step(obj, sum_tol)
                except RowFault as row_fault:
                    fault = Fault(name, line_no, row_fault.field, row_fault.reason)
                    result.fault_count += 1
                    if len(result.faults) < MAX_FAULTS_KEPT:
                        result.faults.append(fault)
                    if skip_bad:
                        report.add(fault, raw.decode("utf-8", "replace").rstrip("\n"))
                    else:
                        writing = False  # keep validating to report more faults, but store nothing
                    continue
                if not writing:
                    continue
                template = step.template if step.template is not None else default_template
                inferred += step.ts is None
                batch.add(step, local_step, template, step.ts or ingest_time, step.ts is None)
                local_step += 1
                if len(batch) >= _BATCH_STEPS:
                    result.steps += len(batch)
                    result.positions += batch.flush(cur)
                    if progress:
                        progress(done, total)
            if writing and len(batch):
                result.steps += len(batch)
                result.positions += batch.flush(cur)
        except BaseException:
            cur.close()
            store.discard_staging(staging_path)
            raise
    if progress:
        progress(total, total)
    return staging_path, inferred


def _publish_staged(cur, run_id: int, ingest_id: int) -> None:
    """Move the staged rows (the staging file attached as `stage`) into steps and positions, inside the
    caller's transaction."""
    templates = [r[0] for r in cur.execute("SELECT DISTINCT template FROM stage.staging_steps").fetchall()]
    cur.execute("CREATE OR REPLACE TEMP TABLE load_segments (template VARCHAR, segment_id INTEGER)")
    for t in templates:
        cur.execute("INSERT INTO load_segments VALUES (?, ?)", [t, get_or_create_segment(cur, run_id, t)])
    base = next_step_id(cur)
    cols = ("request_id, ts, ts_inferred, k, g, accepted, checked, temperature, target_ms, draft_ms, beta_lo_sum, "
            "beta_hi_sum, emitted_tokens, pit_below, pit_mass, extra")
    cur.execute(
        f"INSERT INTO steps (step_id, ingest_id, segment_id, {cols}) SELECT ? + s.local_step, ?, m.segment_id, {cols} "
        "FROM stage.staging_steps s JOIN load_segments m USING (template) ORDER BY s.local_step",
        [base, ingest_id])
    cur.execute(
        "INSERT INTO positions SELECT ? + p.local_step, m.segment_id, p.position, p.draft_token, p.checked, "
        "p.accepted, p.beta_lo, p.beta_hi, p.p_token, p.q_token FROM stage.staging_positions p "
        "JOIN load_segments m USING (template) ORDER BY p.local_step, p.position",
        [base])


@dataclass
class _EngineContent:
    """What an engine file holds, read before any transaction: windows (logs, JSON responses) or samples."""
    windows: list[engines.EngineWindow] = field(default_factory=list)
    samples: list[prometheus.Sample] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    note: str = ""


def _read_engine(path: str, fmt: str, name: str, ingest_time: datetime) -> _EngineContent:
    if fmt == "prometheus":
        mtime = datetime.fromtimestamp(os.path.getmtime(path), tz=timezone.utc).replace(tzinfo=None)
        samples, faults = prometheus.parse_exposition(path, name, mtime)
        if not samples and not faults:
            faults = [Fault(name, 0, "", "no vllm:/llamacpp: spec_decode counters or sglang:spec_ gauges in this page")]
        return _EngineContent(samples=samples, faults=faults, note=(
            f"{len(samples)} samples; windows are the differences between consecutive samples of a series (a page "
            f"without sample timestamps counts as one scrape at {mtime:%Y-%m-%d %H:%M:%S} UTC, the file's "
            "modification time)"))
    if fmt == "engine-json":
        windows, faults = engines.read_json_responses(path, name)
    else:
        windows, faults = engines.read_log(path, name, now=ingest_time)
        if not windows and not faults:
            faults = [Fault(name, 0, "", "no speculative-decoding lines found (vLLM, llama.cpp or SGLang)")]
    return _EngineContent(windows=windows, faults=faults)


def store_windows(cur, windows: list[engines.EngineWindow], ingest_id: int, segment_id: int,
                  ingest_time: datetime) -> int:
    """Insert engine windows inside the caller's transaction (a window without a time of its own gets the ingest
    time). Returns how many had no time."""
    rows = [(ingest_id, segment_id, w.engine, w.source, w.line, w.start_ts, w.end_ts or ingest_time,
             w.end_ts is None, w.drafts, w.draft_tokens, w.accepted_tokens, w.accepted_per_position, w.k,
             w.mean_acceptance_length, w.reported_rate, orjson.dumps(w.labels).decode()) for w in windows]
    if rows:
        cur.executemany(
            "INSERT INTO engine_windows (ingest_id, segment_id, engine, source, line, start_ts, end_ts, ts_inferred, "
            "drafts, draft_tokens, accepted_tokens, accepted_per_position, k, mean_acceptance_length, reported_rate, "
            "labels) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return sum(w.end_ts is None for w in windows)


def _store_engine(cur, content: _EngineContent, result: IngestResult, *, ingest_id: int, segment_id: int,
                  ingest_time: datetime) -> int:
    """Store what _read_engine found inside the caller's transaction. Returns windows without a time."""
    if content.note:
        result.notes.append(content.note)
    if content.samples:
        write_samples(cur, content.samples, ingest_id, segment_id)
        result.rows_read = result.steps = len(content.samples)
        return 0
    windows = content.windows
    result.rows_read = result.steps = len(windows)
    result.notes.append(f"{len(windows)} engine windows ({', '.join(sorted({w.source for w in windows}))})")
    return store_windows(cur, windows, ingest_id, segment_id, ingest_time)


def write_samples(cur, samples: list, ingest_id: int, segment_id: int) -> int:
    """Insert Prometheus samples, skipping any (series, time) already stored: overlapping pulls add nothing twice."""
    df = pa.Table.from_pylist([{"metric": s.metric, "series": s.series, "labels": s.series, "ts": s.ts,
                                "value": s.value} for s in samples],
                              schema=pa.schema([("metric", pa.string()), ("series", pa.string()),
                                                ("labels", pa.string()), ("ts", pa.timestamp("us")),
                                                ("value", pa.float64())]))
    cur.register("new_samples", df)
    before = cur.execute("SELECT count(*) FROM counter_samples").fetchall()[0][0]
    cur.execute(
        "INSERT INTO counter_samples SELECT ?, ?, n.metric, n.series, n.labels::JSON, n.ts, n.value "
        "FROM new_samples n WHERE NOT EXISTS (SELECT 1 FROM counter_samples c WHERE c.segment_id = ? "
        "AND c.metric = n.metric AND c.series = n.series AND c.ts = n.ts)", [ingest_id, segment_id, segment_id])
    cur.unregister("new_samples")
    return cur.execute("SELECT count(*) FROM counter_samples").fetchall()[0][0] - before


def _ingest_flat(cur, path: str, fmt: str, name: str, result: IngestResult, *, ingest_id: int, run_id: int,
                 default_template: str, skip_bad: bool, report: _RejectReport, progress: Progress | None,
                 ingest_time: datetime) -> int:
    """Load, check and insert a flat-form file inside the caller's transaction. Returns steps without ts."""
    try:
        flat, faults = flatlog.load(cur, path, fmt, name)
    except Exception as exc:  # DuckDB's reader errors name the problem; put the file in front of it
        raise _Rejected([Fault(name, 0, "", f"cannot read as {fmt}: {str(exc).splitlines()[0]}")]) from None
    if flat is None:
        raise _Rejected(faults)
    result.rows_read = flat.rows + len(faults)
    if flat.ignored_columns:
        result.notes.append(f"columns not in the flat form were ignored: {', '.join(flat.ignored_columns)}")
    row_faults = flatlog.check(cur, flat, name)
    all_faults = faults + row_faults
    result.fault_count = len(all_faults)
    result.faults = all_faults[:MAX_FAULTS_KEPT]
    if all_faults and not skip_bad:
        raise _Rejected(all_faults)
    for fault in faults:  # unreadable lines never reached a table
        report.add(fault, None)
    for line, field_name, reason, row in flatlog.reject_bad_steps(cur):
        report.add(Fault(name, line, field_name, reason), row)
    steps, positions, inferred = flatlog.insert(
        cur, ingest_id=ingest_id, default_template=default_template, first_step_id=next_step_id(cur),
        ingest_time=ingest_time.isoformat(), segment_for=lambda t: get_or_create_segment(cur, run_id, t),
    )
    result.steps, result.positions = steps, positions
    if progress:
        progress(1, 1)
    return inferred


InTransaction = Callable[[duckdb.DuckDBPyConnection, "IngestResult"], None]


def ingest_file(
    store: Store,
    path: str,
    *,
    name: str | None = None,
    run: str | None = None,
    template: str | None = None,
    skip_bad: bool = False,
    report_path: str | None = None,
    fmt: str | None = None,
    sum_tol: float = steplog.DEFAULT_SUM_TOLERANCE,
    progress: Progress | None = None,
    demo: bool = False,
    run_meta: str | None = None,
    dedupe_key: str | None = None,
    first_line: int = 1,
    in_transaction: InTransaction | None = None,
) -> IngestResult:
    """Ingest one file; it becomes visible in one transaction or not at all. `name` names it in messages.

    For a watched source, which ingests a followed file piece by piece: `dedupe_key` replaces the content hash as
    what makes an ingest a no-op when repeated, `first_line` numbers the piece's lines as in the whole file, and
    `in_transaction(cur, result)` runs inside the publishing transaction (to commit the read position with the
    data it covers); it is not called when the file is rejected or was already ingested."""
    name = name or path
    if not os.path.isfile(path):
        raise SpecmonError(f"{name}: no such file")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise SpecmonError(f"{name}: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    run = run or Path(name).stem or "default"
    result = IngestResult(file=name, status="stored", source_format=fmt, run=run)
    sha = dedupe_key or file_sha256(path)
    if store.query("SELECT 1 FROM ingests WHERE sha256 = ?", [sha]):
        return _already(result)
    ingest_time = utc_now()
    default_template = template or ""
    report = _RejectReport(report_path or f"{Path(name).name}.rejected.jsonl")
    staging_path: str | None = None
    content: _EngineContent | None = None
    try:
        # Reading and validating happen before the transaction, so the database is locked only to publish.
        if fmt == "steplog-jsonl":
            staging_path, inferred = _stage_jsonl(
                store, path, name, result, default_template=default_template, skip_bad=skip_bad, sum_tol=sum_tol,
                report=report, progress=progress, ingest_time=ingest_time, first_line=first_line)
            if result.fault_count and not skip_bad:
                raise _Rejected(result.faults)
        elif fmt in ENGINE_FORMATS:
            content = _read_engine(path, fmt, name, ingest_time)
            result.fault_count = len(content.faults)
            result.faults = content.faults[:MAX_FAULTS_KEPT]
            if content.faults and not skip_bad:
                raise _Rejected(content.faults)
            for fault in content.faults:
                report.add(fault, None)
        with store.transaction(attach={"stage": staging_path} if staging_path else None) as cur:
            if cur.execute("SELECT 1 FROM ingests WHERE sha256 = ?", [sha]).fetchall():
                return _already(result)  # another process stored the same file meanwhile
            source = "live" if run_meta else "steplog" if fmt in STEP_FORMATS else "engine"
            run_id = get_or_create_run(cur, run, source, demo, run_meta)
            ingest_id = add_ingest(cur, file_name=Path(name).name, sha256=sha, ingested_at=ingest_time,
                                   source_format=fmt, run_id=run_id)
            if staging_path:
                _publish_staged(cur, run_id, ingest_id)
            elif content is not None:
                inferred = _store_engine(cur, content, result, ingest_id=ingest_id,
                                         segment_id=get_or_create_segment(cur, run_id, default_template),
                                         ingest_time=ingest_time)
            else:
                inferred = _ingest_flat(cur, path, fmt, name, result, ingest_id=ingest_id, run_id=run_id,
                                        default_template=default_template, skip_bad=skip_bad, report=report,
                                        progress=progress, ingest_time=ingest_time)
            result.rejected = report.count
            if report.count:
                result.report_path = report.path
            if inferred:
                result.notes.append(f"{inferred} steps had no ts; the ingest time {ingest_time:%Y-%m-%d %H:%M:%S} UTC was used")
            cur.execute(
                "UPDATE ingests SET rows_read = ?, steps = ?, positions = ?, rejected = ?, notes = ? WHERE ingest_id = ?",
                [result.rows_read, result.steps, result.positions, result.rejected,
                 "; ".join(result.notes) or None, ingest_id],
            )
            if in_transaction:
                in_transaction(cur, result)
    except _Rejected as rej:
        faults = rej.args[0]
        result.status = "rejected"
        result.fault_count = max(result.fault_count, len(faults))
        result.faults = faults[:MAX_FAULTS_KEPT]
        result.steps = result.positions = 0
    finally:
        report.close()
        if staging_path:
            store.discard_staging(staging_path)
    return result


def _already(result: IngestResult) -> IngestResult:
    result.status = "already ingested"
    result.notes.append("this exact file content was ingested before; nothing changed")
    return result


def ingest_stream(store: Store, stream: IO[bytes], name: str, **options) -> IngestResult:
    """Ingest an upload or standard input: spooled to a temporary file (hashing and DuckDB's readers need one),
    ingested by ingest_file under `name`, then removed."""
    fd, spooled = tempfile.mkstemp(prefix="specmon-upload-")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(stream, out)
        return ingest_file(store, spooled, name=name, **options)
    finally:
        os.unlink(spooled)


def ingest_history(store: Store):
    """Past ingests, newest first, as a DataFrame."""
    return store.query_df(
        "SELECT i.ingested_at, i.file_name, r.name AS run, r.demo, i.source_format, i.rows_read, i.steps, "
        "i.positions, i.rejected, i.notes, i.sha256 FROM ingests i JOIN runs r USING (run_id) "
        "ORDER BY i.ingested_at DESC, i.ingest_id DESC"
    )


def ingest_samples(store: Store, samples: list, name: str, run: str, template: str | None = None,
                   in_transaction: InTransaction | None = None) -> IngestResult:
    """Store samples pulled from a Prometheus server as one ingest; samples already stored are skipped, and a
    pull that brings nothing new is reported as already ingested. in_transaction: as for ingest_file."""
    result = IngestResult(file=name, status="stored", source_format="prometheus-api", run=run)
    digest = hashlib.sha256(b"".join(f"{s.metric}{s.series}{s.ts.isoformat()}{s.value!r}\n".encode()
                                     for s in samples)).hexdigest()
    with store.transaction() as cur:
        if cur.execute("SELECT 1 FROM ingests WHERE sha256 = ?", [digest]).fetchall():
            return _already(result)
        run_id = get_or_create_run(cur, run, "engine", False, None)
        ingest_id = add_ingest(cur, file_name=name, sha256=digest, ingested_at=utc_now(),
                               source_format="prometheus-api", run_id=run_id, rows_read=len(samples))
        new = write_samples(cur, samples, ingest_id, get_or_create_segment(cur, run_id, template or ""))
        cur.execute("UPDATE ingests SET steps = ? WHERE ingest_id = ?", [new, ingest_id])
        result.rows_read, result.steps = len(samples), new
        result.notes.append(f"{new} new samples of {len(samples)} pulled")
        if in_transaction:
            in_transaction(cur, result)
    return result
