"""Ingest a file into the store: detect its format, deduplicate, publish it in one transaction, report.

Reading is the format's (specmon.ingest.formats: one module per format). A file is all-or-nothing: on any fault nothing
of it is stored, unless skip_bad is set, in which case the good rows are stored and the rejected ones are written,
with their reasons, to a report file. A file whose bytes were ingested before (same sha256) is a no-op; an empty
file is nothing to ingest (no run, no ingest recorded). Readers read and validate before the transaction where
they can (JSON Lines and engine logs stage into a file of their own), so the database is locked only to publish.
A file is one snapshot: the identity of what was hashed (device, inode, size, modification time) is checked again
once everything is read, before the commit, so a file replaced or written to meanwhile is refused rather than
stored under another content's hash.
"""
from __future__ import annotations

import errno
import hashlib
import os
import select
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

import duckdb

from specmon.core.faults import Fault, SpecmonError
from specmon.core.times import utc_now
from specmon.ingest import formats, steplog
from specmon.ingest.formats.base import MAX_FAULTS_KEPT, Job, Progress, Rejected, RejectReport
from specmon.ingest.formats.prometheus_text import write_samples
from specmon.store.database import Store
from specmon.store.locks import pid_alive
from specmon.store.rollups import refresh_rollups
from specmon.store.rows import add_ingest, declare_baseline, get_or_create_run, get_or_create_segment


@dataclass
class IngestResult:
    file: str
    status: str  # "stored", "already ingested", "rejected" or "nothing to ingest" (an empty file)
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
    kind: str = "steplog"  # what the format stores: steplog (steps), engine (windows), sweep (load measurements)

    def stored_what(self) -> str:
        """What was stored, in the words of its kind: steps, engine windows or load measurements."""
        if self.kind == "sweep":
            return f"{self.steps:,} load measurements"
        if self.kind == "engine":
            return f"{self.steps:,} engine windows"
        return f"{self.steps:,} steps ({self.positions:,} drafted positions)"

    @property
    def changed_while_read(self) -> bool:
        """Refused only because the file changed under its reader: its content was not judged (read it again)."""
        return self.status == "rejected" and any(f.reason == _CHANGED for f in self.faults)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "faults"}
        d["faults"] = [f.as_dict() for f in self.faults]
        return d


def detect_format(path: str) -> str:
    """The file's format from its content (see specmon.ingest.formats.detect); raises formats.Empty or
    formats.Unrecognised."""
    return formats.detect(path)


Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def _identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _hashed(path: str) -> tuple[str, Identity]:
    """The content's sha256 and the identity of the file it was read from, taken from the open descriptor before
    and after reading (a file written to meanwhile is not one snapshot: it is refused, see _unchanged)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        before = _identity(os.fstat(fh.fileno()))
        while chunk := fh.read(1 << 20):
            h.update(chunk)
        after = _identity(os.fstat(fh.fileno()))
    return h.hexdigest() if before == after else "", before


def _unchanged(path: str, name: str, identity: Identity) -> None:
    """Refuse (Rejected) a file that is not the one hashed any more: replaced (mv, a new upload under the same
    name), or written to, since its hash was taken. Its readers opened it by name, perhaps after the change, so
    what they read may not be the bytes the hash vouches for; checked once everything is read, before the commit."""
    try:
        now = _identity(os.stat(path))
    except OSError:
        now = None
    if now != identity:
        raise Rejected([Fault(name, 0, "", _CHANGED)])


_CHANGED = ("the file changed while it was read (replaced, or written to); nothing was stored: ingest it again once "
            "it is complete (a log still being written: specmon watch follows it)")


Stage = Callable[[str], None]  # told what an ingest is doing once its reading is done


@dataclass
class Counts:
    """What one delivery stored, as its ingest row records it."""

    rows_read: int = 0
    steps: int = 0  # steps, engine windows or samples
    positions: int = 0
    rejected: int = 0
    notes: list[str] = field(default_factory=list)


InTransaction = Callable[[duckdb.DuckDBPyConnection, Counts], None]
# writes a delivery's rows: (cursor, run id, ingest id) -> what it stored
Write = Callable[[duckdb.DuckDBPyConnection, int, int], Counts]


@dataclass(frozen=True)
class Delivery:
    """What one read delivers to the store, from any entry (a file, an upload, the demo, a live run, a watched log's
    new lines, a Prometheus pull, a replay): the key that makes storing it twice a no-op (the content's sha256, or a
    watched piece's source and byte range), the ingest's name and format, and the run it goes into."""

    key: str
    name: str
    source_format: str
    run: str
    source: str  # the run's kind: steplog, engine, live, replay
    ingested_at: datetime
    demo: bool = False
    meta: str | None = None  # the run's metadata (a live run's pair, k, temperature, prompts)
    baseline_of: str | None = None  # the run this one is the baseline of (it ran without speculation)


def already_stored(store: Store, key: str) -> bool:
    """Whether a delivery with this key was stored before (the publishing transaction checks again)."""
    return bool(store.query("SELECT 1 FROM ingests WHERE sha256 = ?", [key]))


def store_read(store: Store, delivery: Delivery, write: Write, *, attach: dict[str, str] | None = None,
               in_transaction: InTransaction | None = None, stage: Stage | None = None) -> Counts | None:
    """The one transaction that makes what was read visible, whatever read it: the duplicate check by key, the run,
    the ingest record, the rows (write), their rollups, the ingest's counts, and whatever the caller commits with
    them (in_transaction: a watched source's read position). Returns what was stored, or None when the same key was
    stored before (nothing changed). `attach`: DuckDB files the transaction reads (a load's staging file); stage(what)
    names each step ("storing", "rollups", "committing"). Raises whatever write raises, with nothing stored."""
    stage = stage or _no_stage
    with store.transaction(attach=attach) as cur:
        if cur.execute("SELECT 1 FROM ingests WHERE sha256 = ?", [delivery.key]).fetchall():
            return None  # stored before, perhaps by another process meanwhile
        run_id = get_or_create_run(cur, delivery.run, delivery.source, delivery.demo, delivery.meta)
        ingest_id = add_ingest(cur, file_name=delivery.name, sha256=delivery.key, ingested_at=delivery.ingested_at,
                               source_format=delivery.source_format, run_id=run_id)
        if delivery.baseline_of:
            declare_baseline(cur, run_id, get_or_create_run(cur, delivery.baseline_of, delivery.source, False, None))
        stage("storing")
        counts = write(cur, run_id, ingest_id)
        stage("rollups")
        refresh_rollups(cur, ingest_id)
        cur.execute(
            "UPDATE ingests SET rows_read = ?, steps = ?, positions = ?, rejected = ?, notes = ? WHERE ingest_id = ?",
            [counts.rows_read, counts.steps, counts.positions, counts.rejected, "; ".join(counts.notes) or None,
             ingest_id])
        if in_transaction:
            in_transaction(cur, counts)
        stage("committing")
    return counts


def _check_k(name: str, fmt: str, k: int | None, baseline_of: str | None) -> None:
    """A --k for a format that records its own draft length, or none specmon can use, is an error, not ignored (a
    baseline's implied 0 is not the user's)."""
    if k is not None and not baseline_of and not getattr(formats.module(fmt), "TAKES_K", False):
        raise SpecmonError(f"{name}: --k gives the draft length of `vllm bench serve` results, which do not record "
                           f"it; this {fmt} file is read with what it records (SGLang's log lines, for one, record "
                           f"tokens per step alone), so --k would be ignored: drop it")


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
    stage: Stage | None = None,
    demo: bool = False,
    run_meta: str | None = None,
    dedupe_key: str | None = None,
    first_line: int = 1,
    baseline_of: str | None = None,
    k: int | None = None,
    in_transaction: InTransaction | None = None,
) -> IngestResult:
    """Ingest one file; it becomes visible in one transaction or not at all. `name` names it in messages.

    For a watched source, which ingests a followed file piece by piece: `dedupe_key` replaces the content hash as
    what makes an ingest a no-op when repeated, `first_line` numbers the piece's lines as in the whole file, and
    `in_transaction(cur, counts)` runs inside the publishing transaction (to commit the read position with the
    data it covers); it is not called when the file is rejected or was already ingested. `baseline_of` declares
    the file's run the baseline of another (it ran without speculation on the same model, hardware and traffic);
    `k` is the draft length the run served, for results that do not record it (a baseline's is 0).

    progress(done, total) follows the reading in bytes; stage(what) names each step after it ("storing", "rollups",
    "committing"), which can take a while for a large file once every byte has been read."""
    name = name or path
    if _is_stream(path):  # a FIFO or a process substitution (<(zcat x.gz)): it can be read once, so into a spool
        with _open_pipe(path, name) as fh, spooled(fh, name) as copy:
            return ingest_file(store, copy, name=name, run=run, template=template, skip_bad=skip_bad,
                               report_path=report_path, fmt=fmt, sum_tol=sum_tol, progress=progress, stage=stage,
                               demo=demo, run_meta=run_meta, dedupe_key=dedupe_key, first_line=first_line,
                               baseline_of=baseline_of, in_transaction=in_transaction)
    _check_readable(path, name)
    result = IngestResult(file=name, status="stored", source_format=fmt or "", run=run or Path(name).stem or "default")
    if fmt is None:
        try:
            fmt = detect_format(path)
        except formats.Empty:
            result.status = "nothing to ingest"
            result.notes.append("the file is empty: nothing to ingest")
            return result
        except formats.Unrecognised as exc:
            return _rejected(result, [Fault(name, 0, "", exc.args[0])])
    if fmt not in formats.names():
        raise SpecmonError(f"{name}: unknown format {fmt!r} (known: {', '.join(formats.names())})")
    result.source_format = fmt
    _check_k(name, fmt, k, baseline_of)
    sha, identity = _hashed(path)
    if not sha:
        return _rejected(result, [Fault(name, 0, "", _CHANGED)])
    sha = dedupe_key or sha
    job = Job(path=path, name=name, fmt=fmt, ingest_time=utc_now(), default_template=template or "",
              skip_bad=skip_bad, sum_tol=sum_tol, first_line=first_line, run_given=run, progress=progress,
              k=0 if k is None and baseline_of else k,
              report=RejectReport(report_path or f"{Path(name).name}.rejected.jsonl"))
    reader = formats.module(fmt).Reader(job)
    try:
        # Checked here only to spare a reader's work before the transaction, which checks again: a reader without
        # any is spared a connection (opening one costs about a tenth of a million-row file's ingest).
        if getattr(reader, "prepares", True) and already_stored(store, sha):
            return _already(result)
        reader.prepare(store)
        if run is None and hasattr(reader, "run"):
            result.run = reader.run()
        module = formats.module(fmt)
        result.kind = module.SOURCE
        delivery = Delivery(key=sha, name=Path(name).name, source_format=fmt, run=result.run,
                            source="live" if run_meta else module.SOURCE, ingested_at=job.ingest_time, demo=demo,
                            meta=run_meta, baseline_of=baseline_of)

        def write(cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> Counts:
            reader.publish(cur, run_id, ingest_id)
            return _counts(result, job, module.SOURCE)

        def checked(cur: duckdb.DuckDBPyConnection, counts: Counts) -> None:
            _unchanged(path, name, identity)
            if in_transaction:
                in_transaction(cur, counts)

        stored = store_read(store, delivery, write, attach=reader.attach(), in_transaction=checked, stage=stage)
        return result if stored is not None else _already(result)
    except Rejected as rej:
        _fill(result, job)
        return _rejected(result, rej.args[0])
    finally:
        job.report.close()
        reader.close()


def _is_stream(path: str) -> bool:
    """Whether the path is a pipe: bytes that can be read once, not a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode)


def _open_pipe(path: str, name: str) -> IO[bytes]:
    """A pipe opened for reading once something writes to it: a named pipe that nothing writes to within
    PIPE_WRITER_WAIT_S is an error that says so, where a plain open would wait without a word."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # returns at once, writer or not
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(PIPE_WRITER_WAIT_S * 1000):  # data, or a writer that came and went (POLLHUP)
            raise SpecmonError(f"{name}: a named pipe that nothing wrote to in {PIPE_WRITER_WAIT_S:g} s; start what "
                               "writes it first, or give a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_readable(path: str, name: str) -> None:
    """Refuse, with a message naming the file, a path that is not a readable file."""
    if os.path.isdir(path):
        raise SpecmonError(f"{name}: is a directory; give the files in it (e.g. {name.rstrip('/')}/*.jsonl)")
    if not os.path.exists(path):
        raise SpecmonError(f"{name}: no such file")
    if not os.path.isfile(path):
        raise SpecmonError(f"{name}: not a regular file (a socket or a device, which may never end); give a file, "
                           "a pipe or - for standard input")
    if not os.access(path, os.R_OK):
        raise SpecmonError(f"{name}: cannot be read (permission denied)")


def _no_stage(what: str) -> None:
    """The stage callback of an ingest nobody watches."""


def _counts(result: IngestResult, job: Job, source: str) -> Counts:
    """Copy the reader's counts and notes into the result, and say what the ingest row records."""
    _fill(result, job)
    if job.no_time:
        what = "steps had no ts" if source == "steplog" else "windows had no time of their own"
        result.notes.append(f"{job.no_time} {what}; the ingest time {job.ingest_time:%Y-%m-%d %H:%M:%S} UTC "
                            "was used")
    return Counts(result.rows_read, result.steps, result.positions, result.rejected, result.notes)


def _fill(result: IngestResult, job: Job) -> None:
    """Copy what the reader counted into the result."""
    result.rows_read, result.steps, result.positions = job.rows_read, job.steps, job.positions
    result.fault_count, result.faults, result.notes = job.fault_count, job.faults, job.notes
    result.rejected = job.report.count
    result.report_path = job.report.path if job.report.count else None


def _rejected(result: IngestResult, faults: list[Fault]) -> IngestResult:
    result.status = "rejected"
    result.fault_count = max(result.fault_count, len(faults))
    result.faults = faults[:MAX_FAULTS_KEPT]
    result.steps = result.positions = result.rejected = 0
    result.report_path = None
    return result


def _already(result: IngestResult) -> IngestResult:
    result.status = "already ingested"
    result.notes.append("this exact file content was ingested before; nothing changed")
    return result


SPOOL_PREFIX = "specmon-spool-"
SPOOL_CHUNK = 8 << 20  # bytes copied between two looks at the spool's free space
# A spool stops (an error) rather than leave its file system with less free than this share of it: a stream that
# does not end (a pipe fed forever) must not fill the disk other programs need.
SPOOL_KEEP_FREE = 0.05
PIPE_WRITER_WAIT_S = 60.0  # how long a named pipe may stay silent before an ingest of it gives up


def sweep_spools() -> None:
    """Remove the spooled copies that processes killed outright (SIGKILL, power loss) left behind; each carries
    its process id in its name, and only those of processes no longer running are removed."""
    for entry in os.scandir(tempfile.gettempdir()):
        pid = entry.name[len(SPOOL_PREFIX):].split("-", 1)[0]
        if entry.name.startswith(SPOOL_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
            try:
                os.unlink(entry.path)
            except OSError:  # another process swept it first, or it is not ours to remove
                pass


@contextmanager
def spooled(stream: IO[bytes], name: str = "the stream") -> Iterator[str]:
    """The stream's bytes in a temporary file (hashing and DuckDB's readers need one), removed whatever ends the
    block (an exception, or a signal the caller turns into one, as the CLI does with SIGTERM). Copies left by killed
    processes are swept first. A stream that would leave the temporary folder's file system less than
    SPOOL_KEEP_FREE of it free, or fills it, is an error naming `name` (nothing is stored)."""
    sweep_spools()
    fd, path = tempfile.mkstemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
    try:
        with os.fdopen(fd, "wb") as out:
            _copy_keeping_free(stream, out, path, name)
        yield path
    finally:
        os.unlink(path)


def _copy_keeping_free(stream: IO[bytes], out: IO[bytes], path: str, name: str) -> None:
    copied = 0
    try:
        while chunk := stream.read(SPOOL_CHUNK):
            out.write(chunk)
            copied += len(chunk)
            disk = os.statvfs(path)
            if disk.f_bavail * disk.f_frsize < SPOOL_KEEP_FREE * disk.f_blocks * disk.f_frsize:
                raise SpecmonError(f"{name}: {copied / 2**20:,.0f} MiB read and it goes on, leaving the temporary "
                                   f"folder {os.path.dirname(path)} nearly full; nothing was stored (a stream that "
                                   "does not end? else set TMPDIR to a folder with more room)")
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise SpecmonError(f"{name}: the temporary folder {os.path.dirname(path)} is full after "
                           f"{copied / 2**20:,.0f} MiB of it; nothing was stored (set TMPDIR to a folder with more "
                           "room)") from None


def ingest_stream(store: Store, stream: IO[bytes], name: str, **options) -> IngestResult:
    """Ingest an upload or standard input: spooled (spooled), then ingested by ingest_file under `name`."""
    with spooled(stream, name) as path:
        return ingest_file(store, path, name=name, **options)


def ingest_history(store: Store):
    """Past ingests, newest first, as a DataFrame (the ingests table is their rollup: one row each)."""
    return store.query_df(
        "SELECT i.ingested_at, i.file_name, r.name AS run, r.demo, i.source_format, i.rows_read, i.steps, "
        "i.positions, i.rejected, i.notes, i.sha256 FROM ingests i JOIN runs r USING (run_id) "
        "ORDER BY i.ingested_at DESC, i.ingest_id DESC"
    )


def ingest_samples(store: Store, samples: list, name: str, run: str, template: str | None = None,
                   in_transaction: InTransaction | None = None, baseline_of: str | None = None) -> IngestResult:
    """Store samples pulled from a Prometheus server as one ingest; samples already stored are skipped, and a
    pull that brings nothing new is reported as already ingested. in_transaction: as for store_read."""
    result = IngestResult(file=name, status="stored", source_format="prometheus-api", run=run)
    digest = hashlib.sha256(b"".join(f"{s.metric}{s.series}{s.ts.isoformat()}{s.value!r}\n".encode()
                                     for s in samples)).hexdigest()

    def write(cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> Counts:
        new = write_samples(cur, samples, ingest_id, get_or_create_segment(cur, run_id, template or ""))
        return Counts(rows_read=len(samples), steps=new, notes=[f"{new} new samples of {len(samples)} pulled"])

    stored = store_read(store, Delivery(digest, name, "prometheus-api", run, "engine", utc_now(),
                                        baseline_of=baseline_of), write, in_transaction=in_transaction)
    if stored is None:
        return _already(result)
    result.rows_read, result.steps, result.notes = stored.rows_read, stored.steps, stored.notes
    return result
