"""What engines report, as windows of counts (a log interval, a request), and how they are stored."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

import duckdb
import orjson

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


def store_windows(cur: duckdb.DuckDBPyConnection, windows: list[EngineWindow], ingest_id: int, segment_id: int,
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


class WindowReader:
    """An engine file is read whole before the transaction (its windows are few and small), then stored."""

    NOTHING = "no speculative-decoding figures in this file"

    def __init__(self, job: Job) -> None:
        self.job = job
        self.windows: list[EngineWindow] = []

    def read(self) -> tuple[list[EngineWindow], list[Fault]]:
        raise NotImplementedError

    def prepare(self, store: Store) -> None:
        windows, faults = self.read()
        shift = self.job.first_line - 1  # a piece of a followed file: number lines as in the whole file
        if shift:
            for w in windows:
                w.line += shift
            faults = [replace(f, line=f.line + shift) if f.line else f for f in faults]
        if not windows and not faults:
            raise Rejected([Fault(self.job.name, 0, "", self.NOTHING)])
        for fault in faults:
            self.job.fault(fault)
        self.job.check()
        self.windows = windows

    def attach(self) -> dict | None:
        return None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        job = self.job
        segment_id = get_or_create_segment(cur, run_id, job.default_template)
        job.no_time = store_windows(cur, self.windows, ingest_id, segment_id, job.ingest_time)
        job.rows_read = job.steps = len(self.windows)
        job.notes.append(f"{len(self.windows)} engine windows "
                         f"({', '.join(sorted({w.source for w in self.windows}))})")
        if any(w.source == "vllm-v0-log" and w.start_ts is None for w in self.windows):
            job.notes.append("vLLM V0 prints running totals: the first line of each engine process (and the first "
                             "after a restart) is a window from the engine's start, whose time the log does not give")

    def close(self) -> None:
        """Nothing to release."""
