"""Follow a running deployment: engine logs, step logs, an inbox folder and a Prometheus server, until stopped.

Every source is polled each interval. What a poll reads is stored through the one ingest path, and the source's
read position (byte offset, line number, the reader's carry-over state) is committed in the same transaction as
the data it covers, so a watcher killed at any moment (even kill -9) resumes where it stopped and counts every
line exactly once.

Following a file works like `tail -F`: only complete lines are read (a half-written last line waits for its
newline); a rename rotation is noticed by the inode behind the path changing (the rest of the old file is read
first, found by its inode in the same folder), a truncation by the file shrinking below the read position, and a
new file behind a reused inode by its first bytes changing. A source that fails (file gone, server down, a bad
line) is retried with back-off and shown as failing; the others go on.

After each poll that stored data, the run's drift alarms and segment statuses are recomputed; an alarm opening
or closing, and a segment turning losing or back, is logged in one line and POSTed as one JSON document to the
webhook (from a background thread, with retries, never holding up ingestion).
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import tempfile
import threading
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import orjson
import pandas as pd

from specmon.analysis import summary
from specmon.core.faults import Fault, SpecmonError
from specmon.drift import alarms
from specmon.follow import prometheus_api
from specmon.ingest.formats.engine_log import EngineLogReader
from specmon.ingest.formats.engine_window import store_windows
from specmon.ingest.pipeline import IngestResult, ingest_file, ingest_samples, utc_now
from specmon.store.database import Store
from specmon.store.rows import add_ingest, get_or_create_run, get_or_create_segment

KINDS = ("log", "steplog", "inbox", "prometheus")
DEFAULT_INTERVAL_S = 1.0
DEFAULT_STALE_AFTER_S = 300.0
DEFAULT_PROMETHEUS_LOOKBACK_S = 6 * 3600.0
DEFAULT_PROMETHEUS_STEP_S = 15.0
# Alarms and statuses are re-evaluated at most this often per run (an analysis reads the whole run).
DEFAULT_ALARM_EVERY_S = 5.0
# What a poll reads from one file: a backlog is taken in pieces of about this size, each its own transaction,
# so the database is free for the dashboard between them. A single line may be longer, up to MAX_LINE_BYTES
# (a step log with full distributions has lines of megabytes).
READ_BYTES = 1 << 20
MAX_LINE_BYTES = 64 << 20
# How long the first bytes of a file must be to identify it (a new file behind a reused inode).
_HEAD_BYTES = 64
_MAX_BACKOFF_S = 60.0
# Suffixes of files still being written into an inbox; they are left alone.
_PARTIAL_SUFFIXES = (".part", ".tmp", ".partial", ".crdownload")

Log = Callable[[str], None]


@dataclass
class SourceConfig:
    """One followed source. kind: log (an engine's log), steplog, inbox (a folder) or prometheus (a URL)."""

    kind: str
    location: str
    run: str | None = None
    template: str | None = None
    c: float | None = None
    skip_bad: bool = False
    step_s: float = DEFAULT_PROMETHEUS_STEP_S  # prometheus: sample spacing
    lookback_s: float = DEFAULT_PROMETHEUS_LOOKBACK_S  # prometheus: how far back the first pull reaches

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.location}"

    @property
    def run_name(self) -> str:
        if self.run:
            return self.run
        if self.kind == "prometheus":
            return "prometheus"
        return Path(self.location).stem or "default"


@dataclass
class WatchConfig:
    sources: list[SourceConfig] = field(default_factory=list)
    interval_s: float = DEFAULT_INTERVAL_S
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    webhook: str | None = None
    dashboard_url: str = ""  # prefixed to the link path in webhooks, e.g. http://host:8501
    alarm_every_s: float = DEFAULT_ALARM_EVERY_S


def load_config(path: str) -> WatchConfig:
    """A TOML file: top-level interval, stale_after, alarm_every (seconds), webhook, dashboard_url (all optional),
    and one table per
    source, as arrays of tables named by kind:

        [[log]]
        path = "/var/log/vllm/server.log"
        run = "prod"
        template = "v7"
        c = 0.1

    Tables: [[log]] and [[steplog]] and [[inbox]] take `path`, [[prometheus]] takes `url` (and `step`,
    `lookback` in seconds); every table takes run, template, c and skip_bad."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise SpecmonError(f"{path}: cannot read the watch configuration ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecmonError(f"{path}: not valid TOML ({exc})") from None
    config = WatchConfig()
    known = {"interval", "stale_after", "alarm_every", "webhook", "dashboard_url", *KINDS}
    unknown = set(doc) - known
    if unknown:
        raise SpecmonError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
    config.interval_s = _number(doc, "interval", DEFAULT_INTERVAL_S, path)
    config.stale_after_s = _number(doc, "stale_after", DEFAULT_STALE_AFTER_S, path)
    config.alarm_every_s = _number(doc, "alarm_every", DEFAULT_ALARM_EVERY_S, path)
    config.webhook = doc.get("webhook")
    config.dashboard_url = doc.get("dashboard_url", "")
    for kind in KINDS:
        tables = doc.get(kind, [])
        if isinstance(tables, dict):
            tables = [tables]
        for i, table in enumerate(tables, start=1):
            where = f"{path}: [[{kind}]] #{i}"
            loc_key = "url" if kind == "prometheus" else "path"
            if not isinstance(table, dict) or not isinstance(table.get(loc_key), str):
                raise SpecmonError(f"{where}: needs {loc_key} = \"...\"")
            allowed = {loc_key, "run", "template", "c", "skip_bad", "step", "lookback"}
            extra = set(table) - allowed
            if extra:
                raise SpecmonError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
            config.sources.append(SourceConfig(
                kind, table[loc_key], table.get("run"), table.get("template"),
                _optional_number(table, "c", where), bool(table.get("skip_bad", False)),
                _number(table, "step", DEFAULT_PROMETHEUS_STEP_S, where),
                _number(table, "lookback", DEFAULT_PROMETHEUS_LOOKBACK_S, where)))
    return config


def _optional_number(table: dict, key: str, where: str) -> float | None:
    value = table.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise SpecmonError(f"{where}: {key} must be a number >= 0, got {value!r}")
    return None if value is None else float(value)


def _number(table: dict, key: str, default: float, where: str) -> float:
    value = _optional_number(table, key, where)
    return default if value is None else value


# -- the read position ----------------------------------------------------------------------------------------
@dataclass
class Position:
    """Where a followed source stands, as stored in watch_sources."""

    file_id: str | None = None
    head_sha: str | None = None
    offset: int = 0
    line_no: int = 0
    state: dict = field(default_factory=dict)


def load_position(store: Store, source: SourceConfig) -> Position:
    rows = store.query("SELECT file_id, head_sha, offset_bytes, line_no, reader_state FROM watch_sources "
                       "WHERE source_key = ?", [source.key])
    if not rows:
        return Position()
    file_id, head_sha, offset, line_no, state = rows[0]
    return Position(file_id, head_sha, int(offset), int(line_no), json.loads(state) if state else {})


def _register(store: Store, source: SourceConfig, stale_after_s: float) -> None:
    with store.transaction() as cur:
        cur.execute(
            "INSERT INTO watch_sources (source_key, kind, location, run, template, c, status, stale_after_s) "
            "VALUES (?, ?, ?, ?, ?, ?, 'starting', ?) ON CONFLICT (source_key) DO UPDATE SET run = excluded.run, "
            "template = excluded.template, c = excluded.c, stale_after_s = excluded.stale_after_s",
            [source.key, source.kind, source.location, source.run_name, source.template, source.c, stale_after_s])


def _save_position(cur, source: SourceConfig, pos: Position, rows: int, now: datetime) -> None:
    """Inside the data's own transaction: the new read position, and that the source delivered."""
    cur.execute(
        "UPDATE watch_sources SET file_id = ?, head_sha = ?, offset_bytes = ?, line_no = ?, reader_state = ?, "
        "last_read = ?, last_data = CASE WHEN ? > 0 THEN ? ELSE last_data END, rows = rows + ?, status = 'ok', "
        "last_error = NULL, failing_since = NULL WHERE source_key = ?",
        [pos.file_id, pos.head_sha, pos.offset, pos.line_no, json.dumps(pos.state), now, rows, now, rows,
         source.key])


def _mark(store: Store, source: SourceConfig, status: str, error: str | None, now: datetime) -> None:
    with store.transaction() as cur:
        cur.execute(
            "UPDATE watch_sources SET status = ?, last_read = ?, last_error = ?, "
            "failing_since = CASE WHEN ? IS NULL THEN NULL ELSE coalesce(failing_since, ?) END "
            "WHERE source_key = ?", [status, now, error, error, now, source.key])


# -- following a file -----------------------------------------------------------------------------------------
def _file_id(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def _head_sha(path: str) -> str | None:
    with open(path, "rb") as fh:
        head = fh.read(_HEAD_BYTES)
    return hashlib.sha256(head).hexdigest() if len(head) == _HEAD_BYTES else None


def _find_by_inode(path: str, file_id: str) -> str | None:
    """Where a rotated file went: the entry of the same folder that has its inode (path.1, path-2026...)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        entries = os.scandir(folder)
    except OSError:
        return None
    with entries:
        for entry in entries:
            try:
                if entry.is_file() and _file_id(entry.stat()) == file_id:
                    return entry.path
            except OSError:
                continue
    return None


@dataclass
class Chunk:
    """Complete lines read from one file: bytes [start, end) of the file whose identity is file_id."""

    path: str
    file_id: str
    head_sha: str | None
    start: int
    end: int
    first_line: int
    data: bytes

    def lines(self):
        for i, raw in enumerate(self.data.splitlines(keepends=True)):
            yield self.first_line + i, raw

    def dedupe_key(self, source_key: str) -> str:
        """What makes storing this piece twice a no-op: the source, the file's identity and the byte range."""
        return f"watch:{source_key}:{self.file_id}:{self.head_sha}:{self.start}-{self.end}"

    @property
    def backlog(self) -> bool:
        """Whether the piece was cut at the read size, so more is probably waiting."""
        return self.end - self.start >= READ_BYTES // 2


def next_chunk(path: str, pos: Position) -> tuple[Chunk | None, Position]:
    """The next complete lines after pos, following rotation and truncation. Returns the chunk (None when there
    is nothing new) and the position to read from if there is nothing in it (a reset after a truncation)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        old = _find_by_inode(path, pos.file_id) if pos.file_id else None
        if old:  # rotated away and not yet re-created: finish the old file
            return _read_from(old, pos, os.stat(old)), pos
        raise SpecmonError(f"{path}: no such file (waiting for it to appear)") from None
    if os.path.isdir(path):
        raise SpecmonError(f"{path}: is a directory, not a log file")
    current = _file_id(st)
    if pos.file_id is not None and current != pos.file_id:
        old = _find_by_inode(path, pos.file_id)
        if old:
            chunk = _read_from(old, pos, os.stat(old))
            if chunk is not None:
                return chunk, pos  # drain what the old file still holds before switching
        pos = Position(state=pos.state)  # a new file: from its start, the reader's carry-over kept
    elif pos.file_id is not None and (st.st_size < pos.offset or (pos.head_sha and _head_sha(path) != pos.head_sha)):
        pos = Position(state=pos.state)  # truncated (copytruncate), or another file behind the same inode
    return _read_from(path, pos, st), pos


def _read_from(path: str, pos: Position, st: os.stat_result) -> Chunk | None:
    if st.st_size <= pos.offset:
        return None
    with open(path, "rb") as fh:
        fh.seek(pos.offset)
        data = fh.read(READ_BYTES)
        while b"\n" not in data and len(data) < MAX_LINE_BYTES:
            more = fh.read(READ_BYTES)
            if not more:
                return None  # a half-written line waits for its newline
            data += more
    cut = data.rfind(b"\n")
    if cut < 0:
        raise SpecmonError(f"{path}: line {pos.line_no + 1} is longer than {MAX_LINE_BYTES} bytes (at byte "
                           f"{pos.offset}); the source stops there")
    data = data[:cut + 1]
    return Chunk(path, _file_id(st), _head_sha(path), pos.offset, pos.offset + len(data), pos.line_no + 1, data)


def _after(chunk: Chunk, pos: Position, state: dict) -> Position:
    return Position(chunk.file_id, chunk.head_sha or pos.head_sha, chunk.end, chunk.first_line - 1
                    + chunk.data.count(b"\n"), state)


def _annotated_template(cur, run: str, ts: datetime) -> str | None:
    """The template a rollout annotation put in force for this run at time ts, if any."""
    rows = cur.execute(
        "SELECT a.template FROM annotations a JOIN runs r USING (run_id) WHERE r.name = ? AND a.starts_at <= ? "
        "ORDER BY a.starts_at DESC, a.annotation_id DESC LIMIT 1", [run, ts]).fetchall()
    return rows[0][0] if rows else None


# -- one poll per kind -----------------------------------------------------------------------------------------
class SourceStopped(SpecmonError):
    """A source that cannot go on by itself (a bad line without skip_bad): retried only after back-off."""


@dataclass
class PollResult:
    rows: int = 0  # windows, steps or samples stored
    faults: list[Fault] = field(default_factory=list)
    more: bool = False  # a backlog remains: poll again at once


def _next_piece(store: Store, source: SourceConfig) -> tuple[Chunk | None, Position]:
    return next_chunk(source.location, load_position(store, source))


def poll_log(store: Store, source: SourceConfig, log: Log) -> PollResult:
    """Read the engine log's new complete lines into engine windows, committed with the new position."""
    chunk, pos = _next_piece(store, source)
    if chunk is None:
        return PollResult()
    now = utc_now()
    reader = EngineLogReader(source.location, now, state=pos.state or None)
    for line_no, raw in chunk.lines():
        reader.feed(line_no, raw.decode("utf-8", "replace"))
    windows, faults = reader.take()
    if faults and not source.skip_bad:
        raise SourceStopped(f"{faults[0]} (the source stops here; fix the log or watch it with skip_bad)")
    for fault in faults:
        log(f"skipped {fault}")
    new_pos = _after(chunk, pos, reader.state())
    dedupe = chunk.dedupe_key(source.key)
    with store.transaction() as cur:
        if not cur.execute("SELECT 1 FROM ingests WHERE sha256 = ?", [dedupe]).fetchall():
            run_id = get_or_create_run(cur, source.run_name, "engine", False, None)
            ingest_id = add_ingest(cur, file_name=Path(source.location).name, sha256=dedupe, ingested_at=now,
                                   source_format="engine-log", run_id=run_id, rows_read=len(windows),
                                   steps=len(windows))
            by_template: dict[str, list] = {}
            for w in windows:
                template = source.template or _annotated_template(cur, source.run_name, w.end_ts or now) or ""
                by_template.setdefault(template, []).append(w)
            for template, group in by_template.items():
                store_windows(cur, group, ingest_id, get_or_create_segment(cur, run_id, template), now)
        _save_position(cur, source, new_pos, len(windows), now)
    return PollResult(len(windows), faults, more=chunk.backlog)


def poll_steplog(store: Store, source: SourceConfig, log: Log) -> PollResult:
    """Ingest the step log's new complete lines (the ingest's rules and messages), committed with the position."""
    chunk, pos = _next_piece(store, source)
    if chunk is None:
        return PollResult()
    now = utc_now()
    new_pos = _after(chunk, pos, {})
    fd, piece = tempfile.mkstemp(prefix="specmon-watch-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(chunk.data)
        with store.cursor() as cur:
            template = source.template or _annotated_template(cur, source.run_name, now)
        result = ingest_file(
            store, piece, name=source.location, run=source.run_name, template=template, fmt="steplog-jsonl",
            skip_bad=source.skip_bad, report_path=f"{source.location}.rejected.jsonl",
            dedupe_key=chunk.dedupe_key(source.key),
            first_line=chunk.first_line,
            in_transaction=lambda cur, r: _save_position(cur, source, new_pos, r.steps, now))
    finally:
        os.unlink(piece)
    if result.status == "rejected":
        raise SourceStopped(f"{result.faults[0]} ({result.fault_count} fault(s) in lines {chunk.first_line}-"
                            f"{new_pos.line_no}; the source stops here; fix the log or watch it with skip_bad)")
    if result.rejected:
        log(f"{source.location}: {result.rejected} bad line(s) skipped, see {result.report_path}")
    return PollResult(result.steps, result.faults, more=chunk.backlog)


def poll_inbox(store: Store, source: SourceConfig, log: Log, seen: dict[str, tuple[int, int]]) -> PollResult:
    """Ingest every complete file in the folder once, then move it to done/ or rejected/ with its report.

    A file is complete when its size and modification time did not change between two polls (seen holds the
    last look) and it does not end in a partial-download suffix. Ingest is deduplicated by content, so a
    watcher killed between storing a file and moving it stores nothing twice when it sees the file again."""
    folder = Path(source.location)
    if not folder.is_dir():
        raise SpecmonError(f"{folder}: no such folder")
    done_dir, rejected_dir = folder / "done", folder / "rejected"
    stored = 0
    faults: list[Fault] = []
    for entry in sorted(folder.iterdir()):
        if not entry.is_file() or entry.name.startswith(".") or entry.name.endswith(_PARTIAL_SUFFIXES):
            continue
        st = entry.stat()
        look = (st.st_size, st.st_mtime_ns)
        if seen.get(str(entry)) != look:
            seen[str(entry)] = look  # seen once: take it at the next poll if it did not change
            continue
        del seen[str(entry)]
        report = rejected_dir / f"{entry.name}.rejected.jsonl"
        rejected_dir.mkdir(exist_ok=True)
        with store.cursor() as cur:
            template = source.template or _annotated_template(cur, source.run or entry.stem, utc_now())
        result = ingest_file(store, str(entry), run=source.run, template=template, skip_bad=source.skip_bad,
                             report_path=str(report))
        target = rejected_dir if result.status == "rejected" else done_dir
        target.mkdir(exist_ok=True)
        (target / f"{entry.name}.report.json").write_bytes(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2))
        os.replace(entry, target / entry.name)
        if result.status == "rejected":
            faults += result.faults
            log(f"{entry}: rejected ({result.fault_count} fault(s), first: {result.faults[0]}); moved to {target}")
        else:
            stored += result.steps
            log(f"{entry}: {result.status} ({result.steps} rows); moved to {target}")
    now = utc_now()
    with store.transaction() as cur:
        _save_position(cur, source, Position(), stored, now)
    return PollResult(stored, faults)


def poll_prometheus(store: Store, source: SourceConfig, log: Log) -> PollResult:
    """Pull the samples since the last pull (the first reaches lookback_s back), committed with the new start."""
    pos = load_position(store, source)
    end = utc_now()
    last = pos.state.get("last_ts")
    start = datetime.fromisoformat(last) if last else end - timedelta(seconds=source.lookback_s)
    samples = prometheus_api.pull(source.location, start, end, source.step_s)
    if not samples:
        _mark(store, source, "ok", None, end)
        return PollResult()
    newest = max(s.ts for s in samples)
    new_pos = Position(state={"last_ts": newest.isoformat()})
    result: IngestResult = ingest_samples(
        store, samples, f"{source.location} {start:%Y-%m-%dT%H:%M:%S}..{end:%H:%M:%S}", source.run_name,
        source.template, in_transaction=lambda cur, r: _save_position(cur, source, new_pos, r.steps, end))
    if result.status == "already ingested":
        _mark(store, source, "ok", None, end)
        return PollResult()
    return PollResult(result.steps)


# -- alarms that reach a person ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Notice:
    """One webhook document: what changed, for which run and template, and the figures behind it."""

    event: str  # alarm_opened, alarm_closed, segment_losing, segment_recovered
    run: str
    template: str
    status: str
    alpha: float | None
    alpha_lo: float | None
    alpha_hi: float | None
    break_even: float | None
    time: str  # ISO-8601 UTC
    link: str  # path of the dashboard page that shows it
    detail: str

    def as_json(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_SERIALIZE_NUMPY)

    def line(self) -> str:
        return f"{self.event}: run {self.run!r} template {self.template or '-'!r}: {self.detail}"


def _link(page: str, run: str, base: str) -> str:
    return f"{base.rstrip('/')}/{page}?run={urllib.parse.quote(run)}"


def notices_for(store: Store, run: str, dashboard_url: str = "") -> tuple[dict[str, str], list]:
    """The run's current alarm and status facts, keyed by subject, with what each would announce. The verdicts
    are the pages' and `check`'s own (c: measured, else declared for the run's watched sources).

    Returns (facts, candidates): facts maps a subject ("alarm:<change time>", "status:<template>") to its state,
    candidates are (subject, state, Notice) for the watcher to send where the state is new."""
    segments = summary.summarize(store, by="template", run=run, per_position=False)
    drift_result = alarms.analyse_run(store, run)  # on a connection of its own, then saves its state
    now = utc_now().isoformat() + "Z"
    facts: dict[str, str] = {}
    out: list[tuple[str, str, Notice]] = []
    for seg in segments:
        subject = f"status:{seg['template']}"
        losing = seg["status"] == "losing"
        facts[subject] = "losing" if losing else "not losing"
        detail = (f"alpha {seg['alpha']:.3f} [{seg['alpha_lo']:.3f}, {seg['alpha_hi']:.3f}] against break-even "
                  f"{seg['break_even_alpha']:.3f}" if seg.get("alpha") is not None and seg.get("break_even_alpha")
                  is not None else f"status {seg['status']}")
        out.append((subject, facts[subject], Notice(
            "segment_losing" if losing else "segment_recovered", run, seg["template"], seg["status"],
            seg.get("alpha"), seg.get("alpha_lo"), seg.get("alpha_hi"), seg.get("break_even_alpha"), now,
            _link("overview", run, dashboard_url), detail)))
    for alarm in drift_result.alarms:
        subject = f"alarm:{alarm.change_ts.isoformat()}"
        facts[subject] = "open" if alarm.open else "closed"
        seg = next((s for s in segments if s["template"] == alarm.template), {})
        out.append((subject, facts[subject], Notice(
            "alarm_opened" if alarm.open else "alarm_closed", run, alarm.template, seg.get("status", "unknown"),
            alarm.alpha_after, seg.get("alpha_lo"), seg.get("alpha_hi"), alarm.break_even, now,
            _link("drift", run, dashboard_url), alarm.describe())))
    return facts, out


class Webhook:
    """POSTs notices from a background thread, with retries; never blocks the caller."""

    def __init__(self, url: str, log: Log, attempts: int = 5, timeout_s: float = 10.0):
        self.url, self.log, self.attempts, self.timeout_s = url, log, attempts, timeout_s
        self._queue: queue.Queue[Notice | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="specmon-webhook", daemon=True)
        self._thread.start()

    def send(self, notice: Notice) -> None:
        self._queue.put(notice)

    def close(self, wait_s: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(wait_s)

    def _run(self) -> None:
        while (notice := self._queue.get()) is not None:
            delay = 0.5
            for attempt in range(1, self.attempts + 1):
                try:
                    req = urllib.request.Request(self.url, data=notice.as_json(), method="POST",
                                                 headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                        resp.read()
                    break
                except Exception as exc:  # a bad receiver must not end the thread
                    if attempt == self.attempts:
                        self.log(f"webhook {self.url}: gave up on {notice.event} for run {notice.run!r} after "
                                 f"{attempt} attempts ({exc})")
                    else:
                        time.sleep(delay)
                        delay = min(delay * 2, 10.0)


# -- the watcher ---------------------------------------------------------------------------------------------
@dataclass
class _SourceState:
    failures: int = 0
    next_try: float = 0.0
    inbox_seen: dict = field(default_factory=dict)


class Watcher:
    """Polls every source each interval until stop() (or SIGTERM / Ctrl-C through run_until_signalled)."""

    def __init__(self, store: Store, config: WatchConfig, log: Log = print):
        if not config.sources:
            raise SpecmonError("nothing to watch: name a --log, --steplog, --inbox or --prometheus, or a --config")
        self.store, self.config, self.log = store, config, log
        self._stop = threading.Event()
        self._states = {s.key: _SourceState() for s in config.sources}
        self._unannounced: set[str] = set()  # runs with new data since their last evaluation
        self._announced_at: dict[str, float] = {}
        self.webhook = Webhook(config.webhook, log) if config.webhook else None
        for source in config.sources:
            _register(store, source, config.stale_after_s)

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> bool:
        """One pass over the sources that are due; returns whether any source has a backlog left. Runs that got
        data are evaluated for alarms at most every alarm_every_s."""
        more = False
        for source in self.config.sources:
            state = self._states[source.key]
            if time.monotonic() < state.next_try or self._stop.is_set():
                continue
            try:
                with self.store.writing():  # one connection for the whole poll; the file is free between polls
                    result = self._poll(source, state)
            except Exception as exc:  # one failing source must not stop the others
                self._failed(source, state, exc)
                continue
            if state.failures:
                self.log(f"{source.key}: delivering again")
            state.failures, state.next_try = 0, 0.0
            more |= result.more
            if result.rows:
                self._unannounced.add(source.run_name)
        for run in sorted(self._unannounced):
            if time.monotonic() - self._announced_at.get(run, -1e9) >= self.config.alarm_every_s:
                self._unannounced.discard(run)
                self._announced_at[run] = time.monotonic()
                self._announce(run)
        return more

    def _poll(self, source: SourceConfig, state: _SourceState) -> PollResult:
        if source.kind == "log":
            return poll_log(self.store, source, self.log)
        if source.kind == "steplog":
            return poll_steplog(self.store, source, self.log)
        if source.kind == "inbox":
            return poll_inbox(self.store, source, self.log, state.inbox_seen)
        return poll_prometheus(self.store, source, self.log)

    def _failed(self, source: SourceConfig, state: _SourceState, exc: Exception) -> None:
        state.failures += 1
        backoff = min(self.config.interval_s * 2 ** state.failures, _MAX_BACKOFF_S)
        state.next_try = time.monotonic() + backoff
        message = str(exc) if isinstance(exc, SpecmonError) else f"{type(exc).__name__}: {exc}"
        if state.failures == 1 or state.failures % 10 == 0:
            self.log(f"{source.key}: failing: {message} (retry in {backoff:.0f} s)")
        try:
            _mark(self.store, source, "stopped" if isinstance(exc, SourceStopped) else "failing", message, utc_now())
        except SpecmonError as db_exc:
            self.log(f"{source.key}: could not record the failure ({db_exc})")

    def _announce(self, run: str) -> None:
        """Send what changed since the last announcement for this run (remembered in the database, so a
        restarted watcher does not repeat itself)."""
        try:  # the analysis reads (the dashboard reads beside it), then saves the detector's state in a short write
            facts, candidates = notices_for(self.store, run, self.config.dashboard_url)
            known = dict(self.store.query("SELECT subject, state FROM watch_notices WHERE run = ?", [run]))
        except SpecmonError as exc:
            self.log(f"run {run!r}: could not evaluate alarms ({exc})")
            return
        fresh = []
        for subject, state, notice in candidates:
            previous = known.get(subject)
            if previous == state:
                continue
            # A segment first seen healthy, or an alarm first seen already closed, is nothing to announce.
            if previous is None and notice.event in ("segment_recovered", "alarm_closed"):
                continue
            fresh.append((subject, state, notice))
        if not facts:
            return
        with self.store.transaction() as cur:
            for subject, state in facts.items():
                cur.execute("INSERT INTO watch_notices VALUES (?, ?, ?, ?) ON CONFLICT (run, subject) DO UPDATE "
                            "SET state = excluded.state, changed_at = excluded.changed_at "
                            "WHERE watch_notices.state <> excluded.state", [run, subject, state, utc_now()])
        for _, _, notice in fresh:
            self.log(notice.line())
            if self.webhook:
                self.webhook.send(notice)

    def run(self) -> None:
        """Poll until stopped; a poll in hand is finished first."""
        self.log(f"watching {len(self.config.sources)} source(s) every {self.config.interval_s:g} s into "
                 f"{self.store.path}")
        while not self._stop.is_set():
            more = self.poll_once()
            if not more:
                self._stop.wait(self.config.interval_s)
        for run in sorted(self._unannounced):  # what arrived since the last evaluation
            self._announce(run)
        if self.webhook:
            self.webhook.close()
        self.log("stopped")

    def run_until_signalled(self) -> None:
        """run(), stopping cleanly on SIGTERM or SIGINT (the batch in hand is finished and committed)."""
        def stop(signum, frame):
            self.log(f"{signal.Signals(signum).name}: finishing the batch in hand")
            self.stop()
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def watched_sources(store: Store):
    """Every watched source as stored (kind, location, run, template, status, last read, last data, rows, last
    error, failing since, stale_after_s), as a DataFrame; `source_health` judges it."""
    return store.query_df(
        "SELECT kind, location, run, template, status, last_read, last_data, rows, last_error, failing_since, "
        "stale_after_s FROM watch_sources ORDER BY kind, location")


def source_health(sources, now: datetime | None = None):
    """Add lag_s (seconds since the source last delivered data, else since it was last read) and mark a source
    that reads fine but has delivered nothing for longer than its stale_after_s as stale."""
    now = now or utc_now()
    df = sources.copy()
    if df.empty:
        return df.assign(lag_s=pd.Series(dtype=float))
    last = df["last_data"].fillna(df["last_read"])
    df["lag_s"] = (pd.Timestamp(now) - last).dt.total_seconds()
    stale = (df["status"] == "ok") & (df["lag_s"] > df["stale_after_s"].fillna(DEFAULT_STALE_AFTER_S))
    df.loc[stale, "status"] = "stale"
    return df
