"""What every format reader shares: the file being ingested (Job), a rejection, and the --skip-bad report.

A format module defines FORMATS (the names it reads), SOURCE ("steplog" or "engine": the kind of run it makes),
SNIFF_ORDER (detection tries lower numbers first), TAKES_K (optional, default False: whether its files take their
draft length from --k, since they do not record it), sniff(head) -> the format name or None (tried on every block
after the first too where SCAN_ANYWHERE is True, or where scan_after(first block) says so), and Reader(job) with
    prepare(store)            read and validate before any transaction (raise Rejected to store nothing);
    prepares                  optional, default True; False where prepare does nothing (then a file ingested
                              before is found by the publishing transaction alone);
    run() -> str              optional: the run the file names itself (a load sweep's), used where --run is not
                              given, after prepare;
    attach() -> dict | None   DuckDB files the publishing transaction attaches (a staging file);
    publish(cur, run_id, ingest_id)   write into the store inside the publishing transaction;
    close()                   release what prepare made (always called).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO

import orjson

from specmon.core.faults import Fault

MAX_FAULTS_KEPT = 20

Progress = Callable[[int, int], None]


class Rejected(Exception):
    """The file is rejected: nothing of it is stored. args[0]: its faults (the first MAX_FAULTS_KEPT or more)."""


class RejectReport:
    """The --skip-bad report: rejected rows with their reasons, written as they are found (JSON Lines)."""

    def __init__(self, path: str):
        self.path = path
        self.count = 0
        self._out: IO[bytes] | None = None  # opened at the first rejected row

    def add(self, fault: Fault, raw: object) -> None:
        if self._out is None:
            self._out = open(self.path, "wb")
        self._out.write(orjson.dumps({**fault.as_dict(), "raw": raw}, option=orjson.OPT_APPEND_NEWLINE))
        self.count += 1

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


@dataclass
class Job:
    """One file being ingested: what its reader needs, and the counts and faults it reports back."""
    path: str
    name: str  # the file's name in messages
    fmt: str
    ingest_time: datetime
    default_template: str
    skip_bad: bool
    sum_tol: float
    report: RejectReport
    first_line: int = 1
    run_given: str | None = None  # the run --run named (a reader whose rows name their own runs keeps them apart)
    k: int | None = None  # the draft length the ingest names (--k), for results that do not record it; 0: off
    progress: Progress | None = None
    rows_read: int = 0
    steps: int = 0
    positions: int = 0
    no_time: int = 0  # steps or windows without a time of their own (the ingest time is used)
    fault_count: int = 0
    faults: list[Fault] = field(default_factory=list)  # the first MAX_FAULTS_KEPT
    notes: list[str] = field(default_factory=list)

    def count(self, fault: Fault) -> None:
        """Count a fault (its row is reported by the reader itself)."""
        self.fault_count += 1
        if len(self.faults) < MAX_FAULTS_KEPT:
            self.faults.append(fault)

    def fault(self, fault: Fault, raw: object = None) -> None:
        """Count a fault; with skip_bad, report it with its raw row (the row is then left out)."""
        self.count(fault)
        if self.skip_bad:
            self.report.add(fault, raw)

    def check(self) -> None:
        """Reject the file if it had faults and skip_bad is not set."""
        if self.fault_count and not self.skip_bad:
            raise Rejected(self.faults)
