"""Statistical levels, defaults and the database's memory cap, defined once; the CLI, the pages and the summaries import
them from here.

Pure constants and one settings dataclass: no I/O, nothing imported from the rest of specmon. specmon.drift keeps its
detector's own tuning (reference sizes, change-verdict level) beside the detector; the false-alarm rate a user
may change is here.
"""
from __future__ import annotations

from dataclasses import dataclass

# Every interval specmon reports (alpha, beta, L, per-position rates) is a two-sided 95% interval.
CONFIDENCE = 0.95
# Where engine windows are the units of a comparison (the load curve's concurrency bins, template comparisons, drift's
# block bootstrap), they are summed into blocks of this many seconds of one engine: a request outlives a 10-second
# log window or a 15-second scrape, so neighbouring windows share its noise, and a block this much longer than most
# requests makes neighbouring blocks all but independent (tests/analysis/test_load_windows.py: coverage 0.93-0.95
# for throughput noise that persists 30 to 120 s, where 120-second blocks gave 0.86).
WINDOW_BLOCK_SECONDS = 600.0
# Intervals on engine windows pair the windows of one engine up to a bandwidth apart in a Bartlett (Newey-West)
# variance (stats.SerialSums): a request's noise runs across every window it spans. A pair `lag` apart is weighed
# 1 - lag / bandwidth, so a request of duration D loses about D / (3 x bandwidth) of its share; where durations are
# heavy-tailed the longest requests carry most of the variance (lognormal, median 40 s, sigma 1: 9% lost at 30
# minutes). The bandwidth is WINDOW_BANDWIDTH_SECONDS, or WINDOW_BANDWIDTH_SPAN_SHARE of an engine's span where that
# is longer: a long span has the degrees of freedom to spare (about 12 at an eighth). Windows are summed into bins of
# a WINDOW_BANDWIDTH_BINS-th of the bandwidth (a minute at 30 minutes), which keeps the cost of a day's or a month's
# variance that of an hour's.
WINDOW_BANDWIDTH_SECONDS = 1800.0
WINDOW_BANDWIDTH_SPAN_SHARE = 1 / 8
WINDOW_BANDWIDTH_BINS = 30
# Under this span (the shortest bandwidth) an engine segment gets no interval: requests lasting minutes leave too few
# of them to show how much they differ.
MIN_WINDOW_SPAN_SECONDS = 1800.0
# |z| above this says observed and predicted acceptance differ beyond sampling noise (two-sided p ~ 0.003).
GAP_Z_LIMIT = 3.0
# The level of the losslessness KS tests (`specmon verify`, the Losslessness page): p below it fails.
KS_LEVEL = 0.01
# The drift detector's stated rate: expected points (steps or engine windows) between false alarms when nothing
# changed (`--false-alarm-steps`, the watch configuration).
DEFAULT_ARL0_STEPS = 20_000
# How summaries segment the data: by run, by run and template, or by run, template and UTC day.
GROUPINGS = ("run", "template", "day")
# Time buckets for timelines: name -> interval (a fixed list, so no user text reaches the SQL).
BUCKETS = {"hour": "1 hour", "6 hours": "6 hours", "day": "1 day", "week": "7 days"}
# Largest draft length `specmon theory` tabulates and a live run's cost measurement times (verification passes of
# up to k + 1 tokens); the Economics page's surfaces and its best k reach further, as its k slider does.
THEORY_K_MAX = 8
SURFACE_K_MAX = 12
# Draft lengths the break-even curves always show beside the segment's own.
REFERENCE_KS = (2, 4, 8)
# Where a segment has no k or no c of its own, the Economics page starts from these.
DEFAULT_K = 4
EXAMPLE_C = 0.10
# DuckDB's memory cap for every specmon connection (DuckDB's own default is 80% of RAM); beyond it, a query spills
# to a temp folder beside the database (DB.tmp). Chosen so that ingesting a file of any size in any format stays
# under 1 GB of resident memory, Python included (docs/benchmarks.md, "Memory"). SPECMON_MEMORY_LIMIT overrides it,
# in DuckDB's notation ("2GB", "50%"): more memory makes a large ingest or page spill less.
MEMORY_LIMIT = "512MB"
MEMORY_LIMIT_ENV = "SPECMON_MEMORY_LIMIT"


# The database: SPECMON_DB names it where --db does not; how long a process waits for another's write lock.
DEFAULT_DB = "specmon.duckdb"
DB_ENV = "SPECMON_DB"
LOCK_TIMEOUT_ENV = "SPECMON_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 60.0
# How often an open dashboard page looks for new data (seconds; one stat of the database file per look).
REFRESH_ENV = "SPECMON_REFRESH_S"
# specmon's own /metrics exports the runs with the most recent data, this many (`--metrics-runs`), so that its
# label values stay bounded however many runs the database holds.
DEFAULT_METRICS_RUNS = 20
METRICS_RUNS_ENV = "SPECMON_METRICS_RUNS"
# A watched source that reads fine but delivers no new data for this long is shown stale (`stale_after`).
DEFAULT_STALE_AFTER_S = 300.0
# How far a logged distribution may sum from 1 before a step is rejected (`ingest --sum-tol`; a float32 softmax
# over a 150k vocabulary stays well inside).
DEFAULT_SUM_TOLERANCE = 1e-3
# What `simulate` logs of each step's distributions.
DISTRIBUTION_MODES = ("dense", "topk", "beta", "none")

# A Prometheus pull (`specmon pull`, watched Prometheus sources): the limit on one HTTP request, and on the whole
# pull (a query_range split into many requests).
PULL_REQUEST_TIMEOUT_S = 30.0
PULL_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LiveSettings:
    """How a live run decodes: one set of defaults for `specmon live` and the Live run page."""
    k: int = DEFAULT_K
    max_new_tokens: int = 64
    temperature: float = 0.7
    top_p: float | None = None
    seed: int = 0
    ngram: bool = False  # propose by n-gram prompt lookup instead of a draft model
    ngram_min: int = 1
    ngram_max: int = 3

    @property
    def proposer(self) -> str:
        """The proposer's name as stored in a run's meta and shown on the pages."""
        return PROPOSER_NGRAM if self.ngram else PROPOSER_DRAFT


PROPOSER_DRAFT = "draft model"
PROPOSER_NGRAM = "ngram"
# How the pages and help texts call the proposers.
PROPOSER_LABELS = {PROPOSER_DRAFT: "draft model", PROPOSER_NGRAM: "n-gram prompt lookup"}
LIVE_DEFAULTS = LiveSettings()


@dataclass(frozen=True)
class SweepSettings:
    """A live load sweep (`specmon live --concurrency`, the Live run page): the batch sizes, the draft lengths and
    the repeats of each; the decoding itself follows LiveSettings."""
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    ks: tuple[int, ...] = (1, 2, 4)
    repeats: int = 3


SWEEP_DEFAULTS = SweepSettings()
