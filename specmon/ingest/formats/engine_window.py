"""What engines report, as windows of counts (a log interval, a request), and how they are stored.

A window may carry the load it ran at (requests running and waiting, the engine's own throughputs) beside its
speculative counts, or the load alone: an engine without speculation (a baseline), or an interval in which nothing
was drafted. Such a window has every speculative figure None (NULL in the store).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime

import duckdb
import orjson
import pyarrow as pa

from specmon.core.faults import Fault
from specmon.ingest.formats.base import Job, Rejected
from specmon.store.database import Store
from specmon.store.rows import get_or_create_segment


@dataclass
class EngineWindow:
    engine: str  # vllm, llama.cpp or sglang
    source: str  # which of the engine's outputs
    line: int
    end_ts: datetime | None  # None: the log gave no time (the ingest time is used)
    start_ts: datetime | None = None
    drafts: float | None = None  # verification steps that drafted
    draft_tokens: float | None = None
    accepted_tokens: float | None = None  # tokens of accepted prefixes
    accepted_per_position: list[float] | None = None  # drafts whose accepted prefix reached position i (1..k)
    k: int | None = None
    mean_acceptance_length: float | None = None  # as reported (tokens per step, bonus included)
    reported_rate: float | None = None  # the engine's own rate, as a fraction, in its own definition
    labels: dict = field(default_factory=dict)
    running_requests: float | None = None  # requests in the engine's batch (at the window's end, as printed)
    waiting_requests: float | None = None  # requests queued
    generation_throughput: float | None = None  # output tokens/s over the window, as the engine computed it
    prompt_throughput: float | None = None  # prompt tokens/s over the window

    @property
    def load_only(self) -> bool:
        """The window has load figures and no speculative ones."""
        return self.draft_tokens is None and self.accepted_tokens is None and self.drafts is None \
            and self.mean_acceptance_length is None


_WINDOW_SCHEMA = pa.schema([
    ("ord", pa.int64()), ("engine", pa.string()), ("source", pa.string()), ("line", pa.int64()),
    ("start_ts", pa.timestamp("us")), ("end_ts", pa.timestamp("us")), ("ts_inferred", pa.bool_()),
    ("drafts", pa.float64()), ("draft_tokens", pa.float64()), ("accepted_tokens", pa.float64()),
    ("accepted_per_position", pa.list_(pa.float64())), ("k", pa.int64()), ("mean_acceptance_length", pa.float64()),
    ("reported_rate", pa.float64()), ("labels", pa.string()), ("running_requests", pa.float64()),
    ("waiting_requests", pa.float64()), ("generation_throughput", pa.float64()), ("prompt_throughput", pa.float64())])
_COLUMNS = ", ".join(_WINDOW_SCHEMA.names[1:])
_VALUES = ", ".join(f"{c}::JSON" if c == "labels" else c for c in _WINDOW_SCHEMA.names[1:])


def window_table(windows: list[EngineWindow], ingest_time: datetime, first: int = 0) -> pa.Table:
    """Windows as Arrow rows, numbered from `first` in their order (a window without a time of its own gets the
    ingest time)."""
    return pa.Table.from_pylist([
        {"ord": first + i, "engine": w.engine, "source": w.source, "line": w.line, "start_ts": w.start_ts,
         "end_ts": w.end_ts or ingest_time, "ts_inferred": w.end_ts is None, "drafts": w.drafts,
         "draft_tokens": w.draft_tokens, "accepted_tokens": w.accepted_tokens,
         "accepted_per_position": w.accepted_per_position, "k": w.k,
         "mean_acceptance_length": w.mean_acceptance_length, "reported_rate": w.reported_rate,
         "labels": orjson.dumps(w.labels).decode(), "running_requests": w.running_requests,
         "waiting_requests": w.waiting_requests, "generation_throughput": w.generation_throughput,
         "prompt_throughput": w.prompt_throughput} for i, w in enumerate(windows)], schema=_WINDOW_SCHEMA)


# A window the run already holds (the same line of one engine's output: its number, time and figures) is left out,
# so a log that was watched and is then ingested whole, or a rotated file ingested beside its watched original, is
# stored once. The line number keeps apart distinct lines that print alike within one second (SGLang logs a decode
# batch many times a second). A window without a time of its own cannot be told from another and is always stored.
_NEW_ONLY = """
WHERE n.ts_inferred OR NOT EXISTS (
    SELECT 1 FROM engine_windows e JOIN segments g ON g.segment_id = e.segment_id
    WHERE g.run_id = (SELECT run_id FROM segments WHERE segment_id = ?) AND NOT e.ts_inferred
      AND e.line IS NOT DISTINCT FROM n.line AND e.end_ts = n.end_ts AND e.engine = n.engine
      AND e.source = n.source AND e.labels::VARCHAR = n.labels
      AND e.drafts IS NOT DISTINCT FROM n.drafts AND e.draft_tokens IS NOT DISTINCT FROM n.draft_tokens
      AND e.accepted_tokens IS NOT DISTINCT FROM n.accepted_tokens
      AND e.running_requests IS NOT DISTINCT FROM n.running_requests
      AND e.generation_throughput IS NOT DISTINCT FROM n.generation_throughput)
"""


def _insert(cur: duckdb.DuckDBPyConnection, source: str, ingest_id: int, segment_id: int) -> int:
    """Insert the new windows of `source` (_NEW_ONLY); returns how many went in."""
    cur.execute(f"INSERT INTO engine_windows (ingest_id, segment_id, {_COLUMNS}) SELECT ?, ?, {_VALUES} "
                f"FROM {source} n {_NEW_ONLY} ORDER BY ord", [ingest_id, segment_id, segment_id])
    row = cur.fetchone()
    return int(row[0]) if row else 0


def store_windows(cur: duckdb.DuckDBPyConnection, windows: list[EngineWindow], ingest_id: int, segment_id: int,
                  ingest_time: datetime) -> int:
    """Insert engine windows inside the caller's transaction (a window without a time of its own gets the ingest
    time), those the run already holds left out (_NEW_ONLY). Returns how many went in. The rows go in as one Arrow
    table, in the windows' order: a row at a time took seconds for a day of 10-second log lines."""
    if not windows:
        return 0
    cur.register("new_windows", window_table(windows, ingest_time))
    try:
        return _insert(cur, "new_windows", ingest_id, segment_id)
    finally:
        cur.unregister("new_windows")


@dataclass
class _Tally:
    """What the notes say about the windows staged, counted as they are staged."""
    windows: int = 0
    no_time: int = 0
    load_only: int = 0
    sources: set[str] = field(default_factory=set)
    v0_from_start: bool = False

    def add(self, windows: list[EngineWindow]) -> None:
        self.windows += len(windows)
        self.no_time += sum(w.end_ts is None for w in windows)
        self.load_only += sum(w.load_only for w in windows)
        self.sources.update(w.source for w in windows)
        self.v0_from_start = self.v0_from_start or any(
            w.source == "vllm-v0-log" and w.start_ts is None and not w.load_only for w in windows)


Batch = tuple[list[EngineWindow], list[Fault], int]  # windows, faults, bytes read so far


class WindowReader:
    """An engine file is read whole before the transaction, a batch of windows at a time, into a staging file beside
    the database (Arrow batches appended to a DuckDB table: memory stays that of a batch, whatever the file's
    length); the publishing transaction, which alone holds the database's write lock, inserts them at once."""

    NOTHING = "no speculative-decoding figures in this file"

    def __init__(self, job: Job) -> None:
        self.job = job
        self.store: Store | None = None
        self.staging_path: str | None = None
        self.tally = _Tally()

    def read(self) -> tuple[list[EngineWindow], list[Fault]]:
        raise NotImplementedError

    def batches(self) -> Iterator[Batch]:
        """The file's windows and faults, in file order, a batch at a time, each with the bytes read so far (here:
        one batch, from read)."""
        yield *self.read(), os.path.getsize(self.job.path)

    def prepare(self, store: Store) -> None:
        job, tally = self.job, self.tally
        self.store = store
        shift = job.first_line - 1  # a piece of a followed file: number lines as in the whole file
        with store.staging() as (self.staging_path, cur):
            cur.register("batch", window_table([], job.ingest_time))
            cur.execute("CREATE TABLE staged_windows AS SELECT * FROM batch")
            cur.unregister("batch")
            total = os.path.getsize(job.path)
            for windows, faults, done in self.batches():
                if job.progress:
                    job.progress(min(done, total), total)
                if shift:
                    for w in windows:
                        w.line += shift
                    faults = [replace(f, line=f.line + shift) if f.line else f for f in faults]
                for fault in faults:
                    job.fault(fault)
                if job.fault_count and not job.skip_bad:
                    continue  # rejected: read on only to name its faults
                if windows:
                    table = window_table(windows, job.ingest_time, tally.windows)
                    cur.register("batch", table)
                    cur.execute("INSERT INTO staged_windows SELECT * FROM batch")
                    cur.unregister("batch")
                    tally.add(windows)
        if not tally.windows and not job.fault_count:
            raise Rejected([Fault(job.name, 0, "", self.NOTHING)])
        job.check()

    def attach(self) -> dict | None:
        return {"stage": self.staging_path} if self.staging_path and self.tally.windows else None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        job, tally = self.job, self.tally
        segment_id = get_or_create_segment(cur, run_id, job.default_template)
        stored = _insert(cur, "stage.staged_windows", ingest_id, segment_id) if tally.windows else 0
        job.no_time = tally.no_time
        job.rows_read, job.steps = tally.windows, stored
        job.notes.append(f"{tally.windows} engine windows ({', '.join(sorted(tally.sources))})")
        if stored < tally.windows:
            job.notes.append(f"{tally.windows - stored} of them already stored in this run (the same lines: a log "
                             "watched and ingested again, or a rotated copy), so left out")
        if tally.load_only:
            job.notes.append(f"load alone in {tally.load_only} of them (requests running, throughput, no speculative "
                             "figures): an engine without speculation (a baseline), or intervals in which nothing was "
                             "drafted")
        if tally.v0_from_start:
            job.notes.append("vLLM V0 prints running totals: the first line of each engine process (and the first "
                             "after a restart) is a window from the engine's start, whose time the log does not give")

    def close(self) -> None:
        if self.staging_path and self.store is not None:
            self.store.discard_staging(self.staging_path)
