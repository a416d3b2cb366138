"""Prometheus pages, saved or scraped: the text exposition format of vLLM's, SGLang's, llama.cpp's /metrics and
TensorRT-LLM's /prometheus/metrics (plain or gzip when saved). One parser (parse_lines) reads a file and an HTTP body.

Only the speculative-decoding counters (and the speculative gauges of SGLang and TensorRT-LLM) and the engines' load
series (requests running and waiting, tokens generated: prometheus_metrics.LOAD) are kept, as raw samples; windows
are made later from the differences between consecutive samples of a series
(specmon.analysis.engine_segments.counter_windows). A page with load series alone is an engine without speculation,
a baseline. A counter is a finite count >= 0, and so is a load gauge; a sample's own timestamp must fall within the
years 1 to 9999.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

import duckdb
import pyarrow as pa

from specmon.core import times
from specmon.core.faults import Fault, RowFault
from specmon.core.limits import MAX_ENGINE_LINE_BYTES
from specmon.ingest.formats import textio
from specmon.ingest.formats.base import Job, Rejected
from specmon.ingest.formats.prometheus_metrics import GAUGES, LOAD, Sample, is_counter, metrics, speculative, wanted
from specmon.store.database import Store
from specmon.store.rows import get_or_create_segment

FORMATS = ("prometheus",)
SOURCE = "engine"
SNIFF_ORDER = 30
# What a page without any wanted metric lacks, for the messages that say so.
NOTHING_WANTED = ("no vllm:/llamacpp:/trtllm_ spec_decode counters, speculative gauges (sglang:spec_accept_*, "
                  f"trtllm_spec_decode_acceptance_length) or load series ({', '.join(LOAD)})")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _labels(text: str | None) -> dict | None:
    if not text:
        return {}
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            return None
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\\\", "\\")
        pos = m.end()
    return out


# Sample timestamps (milliseconds) that fall within the years 1 to 9999.
_MIN_MS, _MAX_MS = -62135596800000, 253402300799999


def _sample(line: str, scrape_ts: datetime) -> Sample | None:
    """One wanted sample of a line, None for other metrics; raises RowFault naming the metric."""
    m = _SAMPLE.match(line.strip())
    metric = m.group(1) if m else line.split("{")[0].split()[0]
    if not wanted(metric):
        return None
    labels = _labels(m.group(2)) if m else None
    if m is None or labels is None:
        raise RowFault(metric, "a speculative-decoding or load sample that does not parse")
    try:
        value = float(m.group(3))
    except ValueError:
        raise RowFault(metric, f"value {m.group(3)[:40]!r} is not a number") from None
    if not math.isfinite(value) or (metric not in GAUGES and value < 0):
        raise RowFault(metric, f"value {value:g}: a counter is a finite count >= 0" if is_counter(metric) else
                       f"value {value:g}: a load gauge (requests, tokens/s) is a finite number >= 0")
    if m.group(4) is None:
        return Sample(metric, labels, scrape_ts, value)
    ms = int(m.group(4)) if len(m.group(4)) <= 16 else _MAX_MS + 1
    if not _MIN_MS <= ms <= _MAX_MS:
        raise RowFault(metric, f"timestamp {m.group(4)[:24]} ms is outside the years 1 to 9999")
    return Sample(metric, labels, datetime(1970, 1, 1) + timedelta(milliseconds=ms), value)


def parse_lines(lines: Iterable[tuple[int, bytes, bool]], name: str,
                scrape_ts: datetime) -> tuple[list[Sample], list[Fault]]:
    """The speculative-decoding and load samples of a page's lines (line number, bytes, cut for being too long), for
    a saved page and a scraped one alike. Samples without their own timestamp get scrape_ts; faults name `name`,
    the line and the metric."""
    samples, faults = [], []
    seen: dict[tuple[str, str, datetime], int] = {}  # (metric, series, time) -> the line of its sample
    for no, raw, too_long in lines:
        line = raw.decode("utf-8", "replace")
        if not line.strip() or line.startswith("#"):
            continue
        if too_long:
            if wanted(line.split("{")[0].split()[0]):
                faults.append(Fault(name, no, "", f"line longer than {MAX_ENGINE_LINE_BYTES} bytes"))
            continue
        try:
            sample = _sample(line, scrape_ts)
        except RowFault as exc:
            faults.append(Fault(name, no, exc.field, exc.reason))
            continue
        if sample is not None:
            key = (sample.metric, sample.series, sample.ts)
            if key in seen:  # two values of one series at one time: which one holds is not known
                faults.append(Fault(name, no, sample.metric, f"series {sample.metric}{sample.series} is on "
                                                             f"line {seen[key]} too, at the same time"))
                continue
            seen[key] = no
            samples.append(sample)
    return samples, faults


def parse_exposition(path: str, name: str, scrape_ts: datetime) -> tuple[list[Sample], list[Fault]]:
    """The speculative-decoding and load samples of a text exposition file (plain or gzip). Samples without their
    own timestamp get scrape_ts (the file's modification time, for a saved page); with timestamps, one file can
    hold a series."""
    try:
        return parse_lines(textio.lines(path, MAX_ENGINE_LINE_BYTES), name, scrape_ts)
    except textio.Unreadable as exc:
        return [], [Fault(name, 0, "", str(exc))]


def parse_body(body: bytes, name: str, scrape_ts: datetime) -> tuple[list[Sample], list[Fault]]:
    """The same for a page received over HTTP (an engine's /metrics), lines bounded as in a file."""
    return parse_lines(_body_lines(body), name, scrape_ts)


def _body_lines(body: bytes) -> Iterator[tuple[int, bytes, bool]]:
    if body.startswith(textio.BOM):
        body = body[len(textio.BOM):]
    for no, raw in enumerate(body.splitlines(), start=1):
        yield no, raw[:MAX_ENGINE_LINE_BYTES], len(raw) > MAX_ENGINE_LINE_BYTES


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def scan_after(head: bytes) -> bool:
    """Whether detection reads on past the first block for a sample line (sniff): where every line of it is
    exposition text (a comment, or a sample of some series), since a page may open with any number of # HELP and
    # TYPE lines or of series specmon does not read. String operations only: linear in the block."""
    for line in head.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line and line[0] != "#" and not _sample_like(line):
            return False
    return True


def _sample_like(line: str) -> bool:
    """name[{labels}] value [timestamp], the value a number."""
    name = line.split("{", 1)[0].split(" ", 1)[0]
    if not _METRIC_NAME.fullmatch(name):
        return False
    rest = line.rsplit("}", 1)[1] if line[len(name):].startswith("{") and "}" in line else line[len(name):]
    fields = rest.split()
    if not 1 <= len(fields) <= 2:
        return False
    try:
        float(fields[0])
    except ValueError:
        return False
    return True


def sniff(head: bytes) -> str | None:
    """A sample line of a wanted metric: a speculative-decoding counter or gauge, or a load series."""
    text = head.decode("utf-8", "replace")
    if not any(metric in text for metric in metrics()):  # most files: no line to look at
        return None
    for line in text.splitlines():
        if line and line[0] != "#" and wanted(line.split("{", 1)[0].split(" ", 1)[0].strip()):
            return FORMATS[0]
    return None


def write_samples(cur: duckdb.DuckDBPyConnection, samples: list[Sample], ingest_id: int, segment_id: int) -> int:
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


class Reader:
    """A page is read whole before the transaction; a page without sample timestamps is one scrape at the file's
    modification time."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.samples: list[Sample] = []

    def prepare(self, store: Store) -> None:
        job = self.job
        mtime = times.from_epoch(os.path.getmtime(job.path))
        samples, faults = parse_exposition(job.path, job.name, mtime)
        if not samples and not faults:
            raise Rejected([Fault(job.name, 0, "", f"{NOTHING_WANTED} in this page")])
        for fault in faults:
            job.fault(fault)
        job.check()
        self.samples = samples
        job.notes.append(f"{len(samples)} samples; windows are the differences between consecutive samples of a "
                         "series (a page without sample timestamps counts as one scrape at "
                         f"{mtime:%Y-%m-%d %H:%M:%S} UTC, the file's modification time)")
        if samples and not any(speculative(s.metric) for s in samples):
            job.notes.append("load series only, no speculative-decoding counters: an engine without speculation "
                             "(a baseline; declare it with --baseline-of RUN)")

    def attach(self) -> dict | None:
        return None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        write_samples(cur, self.samples, ingest_id, get_or_create_segment(cur, run_id, self.job.default_template))
        self.job.rows_read = self.job.steps = len(self.samples)

    def close(self) -> None:
        """Nothing to release."""
