"""Load sweeps: throughput measured at several concurrencies, with and without speculation, as CSV or JSON Lines.

One row per measurement, with exactly these columns (README, "Does speculation pay at your load?"):

    run,k,concurrency,repeat,output_tokens,duration_s,output_tokens_per_s,accepted_tokens,draft_tokens,emitted_tokens

run, k and concurrency are required, and output_tokens_per_s or both output_tokens and duration_s; the rest are
optional (an empty CSV cell is a missing value). k = 0 is speculation off: those rows are the baseline the rows of
the same run and concurrency with k > 0 are compared with. A file whose k = 0 rows all belong to one run that has
no k > 0 rows of its own makes that run the baseline of the file's other runs (one sweep: same model, hardware and
traffic). Rows go into the run their `run` names (with --run, all into that one, their own name kept as a label).
The table is small (a row per measurement), so it is read in Python, every fault naming the line and the field.
"""
from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass

import duckdb
import orjson

from specmon.core import scalars
from specmon.core.faults import Fault, RowFault
from specmon.core.limits import MAX_COUNT, MAX_ENGINE_K
from specmon.ingest.formats import jsonlines, textio
from specmon.ingest.formats.base import Job, Rejected
from specmon.store.database import Store
from specmon.store.rows import declare_baseline, get_or_create_run, get_or_create_segment

FORMATS = ("load-sweep-csv", "load-sweep-jsonl")
SOURCE = "sweep"
SNIFF_ORDER = 5  # before the flat form's CSV and the JSON readers: its header and keys are its own
COLUMNS = ("run", "k", "concurrency", "repeat", "output_tokens", "duration_s", "output_tokens_per_s",
           "accepted_tokens", "draft_tokens", "emitted_tokens")
REQUIRED = ("run", "k", "concurrency")
# A row's output_tokens / duration_s and its output_tokens_per_s, where it gives all three, agree within this share.
RATE_TOLERANCE = 0.01
MAX_CONCURRENCY = 1e7
MAX_SWEEP_BYTES = 64 << 20
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class SweepRow:
    line: int
    run: str
    k: int
    concurrency: float
    repeat: int | None
    output_tokens: float | None
    duration_s: float | None
    output_tokens_per_s: float
    accepted_tokens: float | None
    draft_tokens: float | None
    emitted_tokens: float | None


def _is_sweep(names: set[str]) -> bool:
    return set(REQUIRED) <= names and ("output_tokens_per_s" in names or {"output_tokens", "duration_s"} <= names)


def sniff(head: bytes) -> str | None:
    """A CSV whose header names the sweep's columns, or JSON Lines whose first object has its keys."""
    first = next((line for line in head.splitlines() if line.strip()), b"").strip()
    if first.startswith(b"{"):
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            return None
        return "load-sweep-jsonl" if isinstance(obj, dict) and _is_sweep(set(obj)) else None
    names = {n.strip().strip('"') for n in first.decode("utf-8", "replace").split(",")}
    return "load-sweep-csv" if _is_sweep(names) else None


def _text(value: object, name: str) -> str | None:
    """A cell as text: None where it is missing (an empty CSV cell, JSON null)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise RowFault(name, f"expected a number, got {value!r}")
    return value.strip() if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


def _integer(value: object, name: str, lo: int, hi: int) -> int | None:
    """An integer in [lo, hi] (specmon.core.scalars says what an integer is: "4" or a JSON 4, not 4.0); None where
    missing."""
    if _text(value, name) is None:
        return None
    n = scalars.integer(value, name)
    if not lo <= n <= hi:
        raise RowFault(name, f"expected an integer from {lo} to {hi}, got {n}")
    return n


def _number(value: object, name: str, *, positive: bool = False) -> float | None:
    """A finite number >= 0 (> 0 where positive), below 2^53; None where missing."""
    text = _text(value, name)
    if text is None:
        return None
    if not _NUMBER.fullmatch(text) or not math.isfinite(float(text)):
        raise RowFault(name, f"expected a number, got {text[:40]!r}")
    x = float(text)
    if x < 0 or (positive and x == 0) or x > MAX_COUNT:
        raise RowFault(name, f"expected a number {'above' if positive else 'at least'} 0 and below 2^53, got {text}")
    return x


def _count(value: object, name: str) -> float | None:
    """A count of tokens: a whole number >= 0."""
    x = _number(value, name)
    if x is not None and not x.is_integer():
        raise RowFault(name, f"expected a whole number of tokens, got {x:g}")
    return x


def parse_row(record: dict, line: int) -> SweepRow:
    """One measurement from a record of the sweep's columns; raises RowFault naming the field."""
    unknown = sorted(set(record) - set(COLUMNS))
    if unknown:
        raise RowFault(unknown[0], f"not a column of the load sweep (its columns: {', '.join(COLUMNS)})")
    run = _text(record.get("run"), "run")
    if run is None:
        raise RowFault("run", "required: the run (configuration) this measurement belongs to")
    k = _integer(record.get("k"), "k", 0, MAX_ENGINE_K)
    if k is None:
        raise RowFault("k", "required: the draft length (0: speculation off)")
    concurrency = _number(record.get("concurrency"), "concurrency", positive=True)
    if concurrency is None or concurrency > MAX_CONCURRENCY:
        raise RowFault("concurrency", "required: the requests in flight, a number above 0"
                       if concurrency is None else f"{concurrency:g} requests in flight is beyond any engine")
    repeat = _integer(record.get("repeat"), "repeat", 0, 10**9)
    tokens = _count(record.get("output_tokens"), "output_tokens")
    duration = _number(record.get("duration_s"), "duration_s", positive=True)
    rate = _number(record.get("output_tokens_per_s"), "output_tokens_per_s")
    if rate is None:
        if tokens is None or duration is None:
            raise RowFault("output_tokens_per_s", "required, or both output_tokens and duration_s")
        rate = tokens / duration
    elif tokens is not None and duration is not None and abs(tokens / duration - rate) > RATE_TOLERANCE * rate:
        raise RowFault("output_tokens_per_s", f"{rate:g} disagrees with output_tokens / duration_s = "
                                              f"{tokens / duration:g}")
    accepted = _count(record.get("accepted_tokens"), "accepted_tokens")
    drafted = _count(record.get("draft_tokens"), "draft_tokens")
    emitted = _count(record.get("emitted_tokens"), "emitted_tokens")
    if k == 0 and (drafted or accepted):
        raise RowFault("draft_tokens" if drafted else "accepted_tokens",
                       "k = 0 is speculation off: nothing is drafted or accepted")
    if accepted is not None and drafted is not None and accepted > drafted:
        raise RowFault("accepted_tokens", f"{accepted:g} accepted of {drafted:g} drafted")
    return SweepRow(line, run, k, concurrency, repeat, tokens, duration, rate, accepted, drafted, emitted)


def _records(job: Job) -> tuple[list[tuple[int, dict]], list[Fault]]:
    """(line, record) per row; a CSV row's line is where it starts in the file (quoted cells may span lines)."""
    faults: list[Fault] = []
    if job.fmt == "load-sweep-jsonl":
        out = []
        for no, obj, fault in jsonlines.objects(job.path, job.name):
            if fault is not None:
                faults.append(fault)
            elif obj is not None:
                out.append((no, obj))
        return out, faults
    if textio.head(job.path, MAX_SWEEP_BYTES + 1).__len__() > MAX_SWEEP_BYTES:
        return [], [Fault(job.name, 0, "", f"a load sweep of more than {MAX_SWEEP_BYTES >> 20} MB: a row per "
                                           "measurement makes thousands of bytes, not millions")]
    text = textio.head(job.path, MAX_SWEEP_BYTES).decode("utf-8", "replace")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        return [], faults
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        return [], [Fault(job.name, 1, unknown[0], f"not a column of the load sweep (its columns: "
                                                   f"{', '.join(COLUMNS)})")]
    out, line = [], reader.line_num + 1
    for cells in reader:
        if any(c.strip() for c in cells):
            if len(cells) != len(header):
                faults.append(Fault(job.name, line, "", f"{len(cells)} cells where the header names {len(header)}"))
            else:
                out.append((line, dict(zip(header, cells, strict=True))))
        line = reader.line_num + 1
    return out, faults


def baseline_run(rows: list[SweepRow]) -> str | None:
    """The run whose k = 0 rows are the baseline of the file's other runs: the one run with k = 0 rows, where it
    has no k > 0 rows and the others have no k = 0 rows of their own (else None: each run has its own, or none)."""
    off = {r.run for r in rows if r.k == 0}
    on = {r.run for r in rows if r.k > 0}
    return next(iter(off)) if len(off) == 1 and on and not off & on else None


class Reader:
    """A sweep is read and checked whole before the transaction (a row per measurement: few)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.rows: list[SweepRow] = []

    def prepare(self, store: Store) -> None:
        job = self.job
        records, faults = _records(job)
        for fault in faults:
            job.fault(fault)
        for line, record in records:
            try:
                self.rows.append(parse_row(record, line))
            except RowFault as exc:
                job.fault(Fault(job.name, line, exc.field, exc.reason), record)
        job.check()
        if not self.rows:
            raise Rejected(job.faults or [Fault(job.name, 0, "", "no measurements in the load sweep")])

    def run(self) -> str:
        """The run the ingest belongs to where --run names none: the file's first."""
        return self.rows[0].run

    def attach(self) -> dict | None:
        return None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        """Each row into its run (the delivery's own run where --run named one), with the file's baseline run
        declared for the others."""
        job = self.job
        own = job.run_given
        segments: dict[str, int] = {}
        runs: dict[str, int] = {}
        for r in self.rows:
            name = own or r.run
            if name not in segments:
                runs[name] = run_id if own or name == self.run() else get_or_create_run(cur, name, SOURCE, False,
                                                                                          None)
                segments[name] = get_or_create_segment(cur, runs[name], job.default_template)
        cur.executemany(
            "INSERT INTO load_points (ingest_id, segment_id, source, line, k, concurrency, repeat, output_tokens, "
            "duration_s, output_tokens_per_s, accepted_tokens, draft_tokens, emitted_tokens, ts, labels) "
            "VALUES (?, ?, 'load-sweep', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
            [(ingest_id, segments[own or r.run], r.line, r.k, r.concurrency, r.repeat, r.output_tokens, r.duration_s,
              r.output_tokens_per_s, r.accepted_tokens, r.draft_tokens, r.emitted_tokens,
              orjson.dumps({"run": r.run}).decode()) for r in self.rows])
        base = None if own else baseline_run(self.rows)
        if base is not None:
            for name, rid in runs.items():
                if name != base:
                    declare_baseline(cur, runs[base], rid)
        job.rows_read = job.steps = len(self.rows)
        job.notes.append(f"{len(self.rows)} load measurements at {len({r.concurrency for r in self.rows})} "
                         f"concurrencies, k = {', '.join(str(k) for k in sorted({r.k for r in self.rows}))}"
                         + (f"; run {base!r} (k = 0) is the baseline of the others" if base else ""))

    def close(self) -> None:
        pass
