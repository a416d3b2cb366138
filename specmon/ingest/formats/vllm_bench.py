"""`vllm bench serve --save-result` results: one benchmark, a measurement of throughput at one concurrency, per JSON
document (a saved file; `--append-result` writes one per line, JSON Lines).

The keys are those of vllm/benchmarks/serve.py: the run's settings (date, backend, model_id, num_prompts, the
`--metadata KEY=VALUE` pairs at the top level, request_rate, burstiness, max_concurrency) beside the benchmark's
result (duration, completed, failed, total_input_tokens, total_output_tokens, output_throughput = total output
tokens / duration, max_concurrent_requests = the peak, ...) and, since vLLM differences the server's spec_decode
counters around the run, spec_decode_acceptance_rate (%), spec_decode_acceptance_length, spec_decode_num_drafts,
spec_decode_draft_tokens, spec_decode_accepted_tokens and spec_decode_per_position_acceptance_rates (one per draft
position, so k is their number). Each document becomes a load point:

- concurrency = max_concurrency. Without one (requests sent at request_rate with no cap) the concurrency the server
  held is its mean, by Little's law requests x mean latency / duration: completed x mean_e2el_ms / duration, or the
  latencies' sum / duration where the result keeps them. A result with neither is a fault naming max_concurrency.
- output_tokens_per_s = output_throughput (checked against total_output_tokens / duration);
- k = the number of per-position rates, else the ingest's --k (0, or --baseline-of, for a server without
  speculation), else unknown (NULL) where the result shows speculation without its length; a result that shows
  none and comes without --k is a fault, since nothing tells a baseline from a run older than the spec_decode keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import duckdb
import orjson

from specmon.core.faults import Fault, RowFault
from specmon.core.limits import MAX_COUNT, MAX_ENGINE_K
from specmon.ingest.formats import jsonlines
from specmon.ingest.formats.base import Job, Rejected
from specmon.store.database import Store
from specmon.store.rows import get_or_create_segment

FORMATS = ("vllm-bench",)
SOURCE = "sweep"
SNIFF_ORDER = 7  # after the load sweep's own keys, before engine JSON responses
TAKES_K = True  # a result records no draft length: --k gives it
KEYS = ("output_throughput", "max_concurrency", "duration", "completed")
# vLLM computes output_throughput as total_output_tokens / duration: the two agree but for float rounding.
RATE_TOLERANCE = 0.01
MAX_CONCURRENCY = 1e7
# Settings and results kept beside each point, as the result names them.
LABELS = ("model_id", "tokenizer_id", "backend", "endpoint_type", "label", "num_prompts", "request_rate",
          "burstiness", "completed", "failed", "max_concurrent_requests", "spec_decode_num_drafts",
          "spec_decode_acceptance_length", "spec_decode_acceptance_rate", "date")


@dataclass(frozen=True)
class BenchPoint:
    line: int
    k: int | None
    concurrency: float
    concurrency_from: str
    output_tokens: float | None
    duration_s: float
    output_tokens_per_s: float
    accepted_tokens: float | None
    draft_tokens: float | None
    ts: datetime | None
    labels: dict


def sniff(head: bytes) -> str | None:
    """A JSON object with a benchmark result's keys: the first line (JSON Lines, or vLLM's one-line file), or the
    whole head (a pretty-printed result)."""
    text = head.lstrip()
    if text[:1] != b"{":
        return None
    for candidate in (text.split(b"\n", 1)[0], text):
        try:
            obj = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        return FORMATS[0] if isinstance(obj, dict) and set(KEYS) <= set(obj) else None
    return None


def _number(doc: dict, name: str, *, positive: bool = False, required: bool = True) -> float | None:
    """A finite number >= 0 (> 0 where positive), below 2^53; None where absent and not required."""
    value = doc.get(name)
    if value is None:
        if required:
            raise RowFault(name, "required, and missing (or null)")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RowFault(name, f"expected a number, got {value!r}"[:200])
    if value < 0 or (positive and value == 0) or value > MAX_COUNT:
        raise RowFault(name, f"expected a number {'above' if positive else 'at least'} 0 and below 2^53, "
                             f"got {value!r}")
    return float(value)


def _required(doc: dict, name: str, *, positive: bool = False) -> float:
    """A number the result must give (RowFault naming it where absent)."""
    value = _number(doc, name, positive=positive)
    assert value is not None  # _number raises for a required one that is missing
    return value


def _count(doc: dict, name: str) -> float | None:
    value = _number(doc, name, required=False)
    if value is not None and not value.is_integer():
        raise RowFault(name, f"expected a whole number, got {value:g}")
    return value


def _concurrency(doc: dict) -> tuple[float, str]:
    """(requests in flight, where that figure comes from)."""
    if doc.get("max_concurrency") is not None:
        value = _required(doc, "max_concurrency", positive=True)
        if value > MAX_CONCURRENCY:
            raise RowFault("max_concurrency", f"{value:g} requests in flight is beyond any engine")
        return value, "max_concurrency"
    duration = _required(doc, "duration", positive=True)
    if doc.get("mean_e2el_ms") is not None:
        completed = _count(doc, "completed") or 0.0
        return completed * _required(doc, "mean_e2el_ms") / 1000 / duration, \
            "mean: completed x mean_e2el_ms / duration"
    latencies = doc.get("latencies")
    if isinstance(latencies, list) and latencies:
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                   for x in latencies):
            raise RowFault("latencies", "expected a list of seconds >= 0")
        return sum(latencies) / duration, "mean: sum of latencies / duration"
    rate = doc.get("request_rate")
    raise RowFault("max_concurrency", f"null: requests were sent at request_rate {rate!r} with no cap on those in "
                                      "flight, and the result gives no mean (neither mean_e2el_ms nor latencies); "
                                      "benchmark with --max-concurrency N, or with --percentile-metrics including "
                                      "e2el")


def _k(doc: dict, given: int | None) -> int | None:
    """The draft length: the number of per-position rates, else the ingest's --k, else unknown where the result
    shows speculation."""
    rates = doc.get("spec_decode_per_position_acceptance_rates")
    if rates is not None and (not isinstance(rates, list) or len(rates) > MAX_ENGINE_K):
        raise RowFault("spec_decode_per_position_acceptance_rates", f"expected a list of at most {MAX_ENGINE_K} "
                                                                    "rates")
    drafted = _count(doc, "spec_decode_draft_tokens")
    recorded = len(rates) if rates else None
    if given == 0 and drafted:
        raise RowFault("spec_decode_draft_tokens", f"{drafted:g} tokens drafted: the server ran with speculation, "
                                                   "which --k 0 (or --baseline-of) says it did not")
    if given is not None and recorded is not None and given != recorded:
        raise RowFault("spec_decode_per_position_acceptance_rates", f"{recorded} draft positions where --k says "
                                                                    f"{given}")
    if given is not None:
        return given
    if recorded is not None:
        return recorded
    if drafted is not None:
        return None  # speculation on, its length unknown
    raise RowFault("k", "the result records no speculative decoding (no spec_decode_* keys) and the ingest names "
                        "no draft length: ingest it with --k K (the server's num_speculative_tokens), or with --k 0 "
                        "or --baseline-of RUN where the server ran without speculation")


def _date(doc: dict) -> datetime | None:
    """vLLM's `date`, %Y%m%d-%H%M%S on the benchmarking machine's clock."""
    text = doc.get("date")
    if text is None:
        return None
    try:
        return datetime.strptime(str(text), "%Y%m%d-%H%M%S")
    except ValueError:
        raise RowFault("date", f"expected YYYYMMDD-HHMMSS, got {text!r}"[:200]) from None


def parse_result(doc: dict, line: int, given_k: int | None) -> BenchPoint:
    """One load point from one benchmark result; raises RowFault naming the field."""
    duration = _required(doc, "duration", positive=True)
    rate = _required(doc, "output_throughput")
    tokens = _count(doc, "total_output_tokens")
    if tokens is not None and abs(tokens / duration - rate) > RATE_TOLERANCE * max(rate, 1e-9):
        raise RowFault("output_throughput", f"{rate:g} disagrees with total_output_tokens / duration = "
                                            f"{tokens / duration:g}")
    concurrency, source = _concurrency(doc)
    if concurrency <= 0:
        raise RowFault("completed", "no request completed: the result measured no load")
    k = _k(doc, given_k)
    accepted, drafted = _count(doc, "spec_decode_accepted_tokens"), _count(doc, "spec_decode_draft_tokens")
    if accepted is not None and drafted is not None and accepted > drafted:
        raise RowFault("spec_decode_accepted_tokens", f"{accepted:g} accepted of {drafted:g} drafted")
    labels = {key: doc[key] for key in LABELS if isinstance(doc.get(key), (str, int, float))
              and not isinstance(doc.get(key), bool)}
    labels["concurrency from"] = source
    return BenchPoint(line, k, concurrency, source, tokens, duration, rate, accepted, drafted, _date(doc), labels)


class Reader:
    """A result file is read and checked whole before the transaction (a document per benchmark: few)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.points: list[BenchPoint] = []

    def prepare(self, store: Store) -> None:
        job = self.job
        for no, doc, fault in jsonlines.responses(job.path, job.name):
            if fault is not None:
                job.fault(fault)
            if doc is None:
                continue
            try:
                self.points.append(parse_result(doc, no, job.k))
            except RowFault as exc:
                job.fault(Fault(job.name, no, exc.field, exc.reason), {key: doc.get(key) for key in KEYS})
        job.check()
        if not self.points:
            raise Rejected(job.faults or [Fault(job.name, 0, "", "no benchmark results in this file")])

    def attach(self) -> dict | None:
        return None

    def publish(self, cur: duckdb.DuckDBPyConnection, run_id: int, ingest_id: int) -> None:
        job = self.job
        segment_id = get_or_create_segment(cur, run_id, job.default_template)
        cur.executemany(
            "INSERT INTO load_points (ingest_id, segment_id, source, line, k, concurrency, repeat, output_tokens, "
            "duration_s, output_tokens_per_s, accepted_tokens, draft_tokens, emitted_tokens, ts, labels) "
            "VALUES (?, ?, 'vllm-bench', ?, ?, ?, NULL, ?, ?, ?, ?, ?, NULL, ?, ?)",
            [(ingest_id, segment_id, p.line, p.k, p.concurrency, p.output_tokens, p.duration_s, p.output_tokens_per_s,
              p.accepted_tokens, p.draft_tokens, p.ts, orjson.dumps(p.labels).decode()) for p in self.points])
        job.rows_read = job.steps = len(self.points)
        ks = sorted({"unknown" if p.k is None else str(p.k) for p in self.points})
        job.notes.append(f"{len(self.points)} benchmark results at concurrency "
                         f"{', '.join(f'{c:g}' for c in sorted({p.concurrency for p in self.points}))}, "
                         f"k = {', '.join(ks)}")
        means = [p for p in self.points if p.concurrency_from != "max_concurrency"]
        if means:
            job.notes.append(f"{len(means)} result(s) ran without --max-concurrency: their concurrency is the mean "
                             "requests in flight (Little's law), not a level the benchmark held")

    def close(self) -> None:
        """Nothing to release."""
