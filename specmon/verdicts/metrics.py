"""specmon's own /metrics: what `specmon check` finds, per run and template, and the watcher's health, as Prometheus
series (prometheus_client's exposition), read from the database when scraped.

The figures are those of `check` and the pages: the segment summaries, findings and load curves of
specmon.verdicts.findings.gather, the drift alarms among its findings, the watched sources' rows and the outbox.
A scrape reuses what the last one read for cache_s seconds, so that scraping every few seconds costs one analysis per
cache_s. Labels are bounded: only the max_runs runs with the most recent data are exported (each with its
templates); specmon_runs_not_exported says how many were left out.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator

import pandas as pd
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from specmon.analysis.load import LoadCurve
from specmon.analysis.sources import outbox_counts, source_health, watched_sources
from specmon.core.faults import SpecmonError
from specmon.core.segments import STATUSES
from specmon.store.database import Store
from specmon.verdicts import findings

DEFAULT_MAX_RUNS = 20
DEFAULT_CACHE_S = 10.0
# The values of the state-set series' status label.
LOAD_STATUSES = ("pays", "even", "loses", "unknown")
SOURCE_STATUSES = ("starting", "ok", "stale", "failing", "stopped")
SEGMENT_LABELS = ("run", "template")


def _seconds(t) -> float | None:
    """A stored UTC time (naive) as seconds since the epoch; None where there is none."""
    return None if t is None or pd.isna(t) else pd.Timestamp(t).tz_localize(None).timestamp()


def _gauge(name: str, doc: str, labels: Iterable[str], values: Iterable[tuple[tuple[str, ...], float | None]],
           cls: type = GaugeMetricFamily) -> Metric:
    family = cls(name, doc, labels=list(labels))
    for key, value in values:
        if value is not None:
            family.add_metric(list(key), float(value))
    return family


def _break_even(curve: LoadCurve, at_load: dict | None) -> float | None:
    """The run's break-even concurrency as `check` states it at the current load, else its best k's."""
    if at_load is not None:
        return at_load.get("break_even")
    return curve.best.break_even if curve.best is not None and curve.best.crosses else None


class StoreCollector(Collector):
    """Collects specmon's series from a database when scraped (cached for cache_s)."""

    def __init__(self, store: Store, max_runs: int = DEFAULT_MAX_RUNS, cache_s: float = DEFAULT_CACHE_S):
        self.store, self.max_runs, self.cache_s = store, max_runs, cache_s
        self._lock = threading.Lock()
        self._read_at = -1e18
        self._families: list[Metric] = []
        self._readable = 1.0

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: the series depend on what is stored

    def collect(self) -> Iterator[Metric]:
        with self._lock:  # concurrent scrapes share one read
            if time.monotonic() - self._read_at >= self.cache_s:
                try:
                    self._families, self._readable = self.read(), 1.0
                except SpecmonError:  # locked for longer than the wait, or unreadable: say so, keep the last
                    self._readable = 0.0
                self._read_at = time.monotonic()
            families = list(self._families)
        yield from families
        yield _gauge("specmon_store_readable", "1 if the last read of the database succeeded (else the series "
                     "are those of the read before it)", [], [((), self._readable)])

    def read(self) -> list[Metric]:
        with self.store.reading():
            sources = source_health(watched_sources(self.store))
            outbox = outbox_counts(self.store)
        verdict = findings.gather(self.store)
        out = self._runs(verdict) if not verdict.demo_only else []
        return out + self._sources(sources) + self._outbox(outbox)

    def _runs(self, verdict: findings.Verdict) -> list[Metric]:
        last: dict[str, str] = {c.run: "" for c in verdict.curves}  # a sweep's run has no time of its own
        for r in verdict.segments:
            last[r["run"]] = max(last.get(r["run"], ""), r.get("last_ts") or "")
        kept = set(sorted(last, key=lambda run: last[run], reverse=True)[:self.max_runs])
        rows = [r for r in verdict.segments if r["run"] in kept]
        segs = [((r["run"], r["template"] or ""), r) for r in rows]

        def per_segment(name: str, doc: str, key: str) -> Metric:
            return _gauge(name, doc, SEGMENT_LABELS, [(k, r.get(key)) for k, r in segs])

        curves = [c for c in verdict.curves if c.run in kept]
        at_load = {(f.run, f.template or ""): f.facts for f in verdict.findings if f.kind == findings.LOAD}
        open_alarms: dict[tuple[str, str], int] = defaultdict(int)
        for f in verdict.findings:
            if f.kind == findings.ALARM and f.state == "open" and f.run in kept:
                open_alarms[(f.run, f.template or "")] += 1
        return [
            per_segment("specmon_alpha_ratio", "Per-token acceptance rate alpha", "alpha"),
            per_segment("specmon_alpha_lower_ratio", "Lower bound of alpha's 95% interval", "alpha_lo"),
            per_segment("specmon_alpha_upper_ratio", "Upper bound of alpha's 95% interval", "alpha_hi"),
            per_segment("specmon_break_even_alpha_ratio", "The alpha below which speculation costs more than it "
                        "saves at the segment's k and c (batch 1)", "break_even_alpha"),
            per_segment("specmon_tokens_per_step", "Tokens emitted per verification step L (bonus token "
                        "included)", "tokens_per_step"),
            per_segment("specmon_tokens_per_step_lower", "Lower bound of L's 95% interval", "tokens_per_step_lo"),
            per_segment("specmon_tokens_per_step_upper", "Upper bound of L's 95% interval", "tokens_per_step_hi"),
            per_segment("specmon_batch1_speedup_ratio", "Speedup at batch 1 measured from L and the draft cost, "
                        "L / (1 + mean draft length * c)", "speedup_measured"),
            _gauge("specmon_segment_status", "The segment's status (batch 1), one series per status: 1 for the "
                   "current one", (*SEGMENT_LABELS, "status"),
                   [((*k, s), float(r["status"] == s)) for k, r in segs for s in STATUSES]),
            _gauge("specmon_drift_alarms_open", "Drift alarm episodes still open", SEGMENT_LABELS,
                   [(k, open_alarms.get(k, 0)) for k, _ in segs]),
            _gauge("specmon_speedup_ratio", "Speedup measured at the current concurrency (throughput with "
                   "speculation / without)", SEGMENT_LABELS,
                   [((run, t), f.get("speedup")) for (run, t), f in at_load.items() if run in kept]),
            _gauge("specmon_speedup_lower_ratio", "Lower bound of the measured speedup's 95% interval",
                   SEGMENT_LABELS, [(k, f.get("speedup_lo")) for k, f in at_load.items() if k[0] in kept]),
            _gauge("specmon_speedup_upper_ratio", "Upper bound of the measured speedup's 95% interval",
                   SEGMENT_LABELS, [(k, f.get("speedup_hi")) for k, f in at_load.items() if k[0] in kept]),
            _gauge("specmon_break_even_concurrency", "Concurrency (requests running) where the measured speedup "
                   "crosses 1 (of the draft length served now where the current load is known, else of the best "
                   "draft length)", SEGMENT_LABELS,
                   [(k, _break_even(c, at_load.get(k))) for c in curves if (k := (c.run, c.template or ""))]),
            _gauge("specmon_concurrency", "Requests running, on average over the run's latest engine windows",
                   SEGMENT_LABELS, [((c.run, c.template or ""), c.current) for c in curves]),
            _gauge("specmon_load_status", "The payoff at the current concurrency, one series per status: 1 for "
                   "the current one", (*SEGMENT_LABELS, "status"),
                   [((c.run, c.template or "", s), float(c.status == s)) for c in curves for s in LOAD_STATUSES]),
            _gauge("specmon_runs_not_exported", "Runs left out of these series (only the most recently active "
                   "are exported)", [], [((), len(last) - len(kept))]),
        ]

    @staticmethod
    def _sources(health) -> list[Metric]:
        rows = [((r.kind, r.location, r.run or ""), r) for r in health.itertuples()]
        labels = ("kind", "location", "run")
        return [
            _gauge("specmon_source_last_data_timestamp_seconds", "When the watched source last delivered data "
                   "(seconds since the epoch)", labels, [(k, _seconds(r.last_data)) for k, r in rows]),
            _gauge("specmon_source_rows", "Rows stored from the watched source", labels,
                   [(k, r.rows) for k, r in rows], CounterMetricFamily),
            _gauge("specmon_source_failures", "Failed reads of the watched source", labels,
                   [(k, r.failures if pd.notna(r.failures) else 0) for k, r in rows], CounterMetricFamily),
            _gauge("specmon_source_status", "The watched source's status, one series per status: 1 for the current "
                   "one", (*labels, "status"), [((*k, s), float(r.status == s)) for k, r in rows
                                                for s in SOURCE_STATUSES]),
        ]

    @staticmethod
    def _outbox(counts: list[tuple[str, int, int]]) -> list[Metric]:
        return [
            _gauge("specmon_outbox_pending_notices", "Notices waiting in the outbox to be sent", ["channel"],
                   [((ch,), p) for ch, p, _ in counts]),
            _gauge("specmon_outbox_undeliverable_notices", "Notices given up after the outbox age", ["channel"],
                   [((ch,), u) for ch, _, u in counts]),
        ]


def registry(store: Store, max_runs: int = DEFAULT_MAX_RUNS, cache_s: float = DEFAULT_CACHE_S) -> CollectorRegistry:
    """A registry holding only specmon's collector (no process or platform series)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store, max_runs, cache_s))
    return reg


def exposition(reg: CollectorRegistry) -> tuple[bytes, str]:
    """The registry's series in Prometheus' text format, and its content type."""
    return generate_latest(reg), CONTENT_TYPE_LATEST


def serve(store: Store, address: str, port: int, max_runs: int = DEFAULT_MAX_RUNS):
    """Serve /metrics from a background thread (prometheus_client's server); returns it (shutdown() stops it)."""
    server, _ = start_http_server(port, address, registry=registry(store, max_runs))
    return server
