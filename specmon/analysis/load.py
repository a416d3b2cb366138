"""Does speculation pay at the load a run serves? Speedup and break-even by concurrency, per run, from what was
measured with and without speculation (specmon.core.load has the formulas).

Two kinds of measurement feed a run's load curve:
- load points (benchmark sweeps, `vllm bench serve` results, batched live runs): one row per measurement at a fixed
  concurrency; each repeat is one observation.
- engine windows that carry their load (requests running, generation throughput), from engine logs, Prometheus or
  a watched engine: binned by running requests (1, 2, 3-4, 5-8, 9-16, ...). A request outlives a 10-second log
  window, so neighbouring windows are not independent: the mean throughput of a side at a bin is a ratio of totals
  over time bins of one engine, with the variance of engine segments' intervals, which pairs bins up to the
  bandwidth (stats.SerialSums; window_grid.grid_places), and so is its acceptance.
The baseline (throughput without speculation at the same concurrency) is, in order: the run's own k = 0
measurements; the measurements of a run declared its baseline (`--baseline-of`); the run's own windows in periods
annotated as speculation off (`specmon annotate --speculation off`). An engine merely configured for speculation
runs slower even when it drafts nothing, so only a clean engine makes a baseline; docs/math.md says more.
Where there is none, the payoff at load is unknown, and LoadCurve.note says what would answer it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from specmon.analysis import engine_label
from specmon.core import load, stats
from specmon.core.settings import CONFIDENCE, MIN_WINDOW_SPAN_SECONDS
from specmon.core.window_grid import WindowBins, grid_places, serial_sums
from specmon.store.database import Store

# The load a run serves now: the mean requests running over its last windows, within this span of its last one.
CURRENT_SPAN = timedelta(minutes=5)
# Engine windows are summed by the minute (of one engine, run, draft length and bin) before the variance's own bins.
_MINUTE = 60
# What a curve's intervals take as observations, in words for its renderers.
REPEAT_OBSERVATIONS = "repeats, each an independent observation"
WINDOW_OBSERVATIONS = ("engine windows, their noise paired across neighbouring minutes of one engine up to 30 "
                       "minutes apart (an eighth of the span on longer logs), as requests outlive a window")

_POINTS_SQL = """
SELECT rs.run, rs.template, rs.demo, lp.k, lp.concurrency, lp.repeat, lp.output_tokens_per_s, lp.accepted_tokens,
       lp.draft_tokens, lp.emitted_tokens, lp.source
FROM load_points lp JOIN shown_segments rs USING (segment_id)
ORDER BY rs.run, lp.concurrency, lp.k
"""
_BASELINES_SQL = """
SELECT o.name AS of_run, r.name AS baseline FROM baselines b JOIN runs r ON r.run_id = b.run_id
JOIN runs o ON o.run_id = b.of_run_id ORDER BY o.name, r.name
"""


@dataclass(frozen=True)
class LoadPoint:
    """One measured (k, concurrency): throughput with and without speculation, the speedup, and acceptance there."""

    k: int | None  # None: speculation on, its draft length unknown
    concurrency: float
    throughput: float  # output tokens/s with speculation (the mean of its observations)
    baseline_throughput: float
    speedup: load.Speedup
    observations: int  # repeats, or engine windows
    baseline_observations: int
    alpha: float | None = None  # per-token acceptance, where the windows give per-position counts
    alpha_lo: float | None = None
    alpha_hi: float | None = None
    draft_acceptance_rate: float | None = None  # accepted / drafted tokens, as engines print it
    tokens_per_step: float | None = None  # L, the bonus token included

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "concurrency": self.concurrency, "speedup": self.speedup.estimate,
                "speedup_lo": self.speedup.lo, "speedup_hi": self.speedup.hi, "throughput": self.throughput,
                "baseline_throughput": self.baseline_throughput, "alpha": self.alpha, "alpha_lo": self.alpha_lo,
                "alpha_hi": self.alpha_hi, "draft_acceptance_rate": self.draft_acceptance_rate,
                "tokens_per_step": self.tokens_per_step, "observations": self.observations,
                "baseline_observations": self.baseline_observations}


@dataclass(frozen=True)
class LoadCurve:
    """A run's speedup by concurrency, its break-even per k and for the best k, and what that says at its load."""

    run: str
    baseline: str | None  # how the baseline was obtained, in words; None: there is none
    observations: str  # what the intervals take as observations, in words
    points: list[LoadPoint]
    crossings: dict[int | None, load.Crossing]  # per k (None: length unknown)
    best: load.Crossing | None  # of the best k at each concurrency
    bands: list[load.Band]
    template: str = ""  # the template of the run's latest windows
    current: float | None = None  # the mean requests running over the run's latest windows
    note: str | None = None  # what is missing, where the payoff at load is unknown
    seen: list[float] = field(default_factory=list)  # concurrencies the run's windows ran at (no baseline needed)
    demo: bool = False  # the demo's, shown only while nothing of the user's is stored

    @property
    def known(self) -> bool:
        return bool(self.points)

    def at(self, concurrency: float) -> LoadPoint | None:
        """The best measured point at the concurrency nearest this one on log N, within a factor of 1.5 (else None:
        not measured near it)."""
        if not self.points or concurrency <= 0:
            return None
        near = min({p.concurrency for p in self.points}, key=lambda n: abs(math.log(n / concurrency)))
        if abs(math.log(near / concurrency)) > math.log(1.5):
            return None
        return max((p for p in self.points if p.concurrency == near), key=lambda p: p.speedup.estimate)

    @property
    def status(self) -> str:
        """At the current load: "pays", "loses", "even" (the interval holds 1) or "unknown"."""
        point = self.at(self.current) if self.current is not None else None
        return "unknown" if point is None else point.speedup.verdict

    def policy(self) -> list[dict[str, Any]]:
        """`specmon recommend --json`'s policy: [{max_concurrency, k}], k = 0 off, where every band is sure; else []
        (the data cannot support a policy, recommend says why)."""
        if not self.bands or not all(b.sure for b in self.bands):
            return []
        return [{"max_concurrency": b.max_concurrency, "k": b.k} for b in self.bands]

    def to_dict(self) -> dict[str, Any]:
        """`specmon recommend --json`'s object for the run."""
        def crossing(k: int | None, c: load.Crossing) -> dict[str, Any]:
            return {"k": k, "pays_up_to": c.pays_up_to, "loses_from": c.loses_from, "break_even": c.break_even,
                    "break_even_lo": c.lo, "break_even_hi": c.hi, "measured_from": c.measured_from,
                    "measured_to": c.measured_to}
        return {
            "run": self.run, "template": self.template, "baseline": self.baseline, "observations": self.observations,
            "points": [p.to_dict() for p in self.points],
            "break_even": [crossing(k, c) for k, c in self.crossings.items()]
                          + ([crossing(None, self.best)] if self.best is not None else []),
            "policy": self.policy(), "current_concurrency": self.current, "status_at_load": self.status,
            "note": self.note,
        }


def _sweep_points(spec: pd.DataFrame, base: pd.DataFrame) -> list[LoadPoint]:
    """Points of load measurements: at each (k, concurrency) the spec rows' repeats against the baseline's at the
    same concurrency."""
    out = []
    base_at = {n: g["output_tokens_per_s"].to_numpy() for n, g in base.groupby("concurrency")}
    for (k, n), g in spec.groupby(["k", "concurrency"], dropna=False, sort=True):
        y = base_at.get(n)
        if y is None or not len(y) or y.mean() <= 0:
            continue
        x = g["output_tokens_per_s"].to_numpy()
        acc, drafted = g["accepted_tokens"].sum(min_count=1), g["draft_tokens"].sum(min_count=1)
        rate = float(acc / drafted) if pd.notna(acc) and pd.notna(drafted) and drafted > 0 else None
        kk = None if pd.isna(k) else int(k)
        tps = 1 + float(acc) / (float(drafted) / kk) if rate is not None and kk else None
        out.append(LoadPoint(kk, float(n), float(x.mean()), float(y.mean()), load.speedup(x, y), len(x), len(y),
                             draft_acceptance_rate=rate, tokens_per_step=tps))
    return out


_BIN = "CASE WHEN {n} <= 1 THEN 1 ELSE (2 ** ceil(log2({n})))::INTEGER END"
# The windows that carry their load (requests running above 0 and a generation throughput) are summed by the minute:
# one engine (engine_label: a log line's labels also hold its own figures),
# one run, one draft length, one concurrency bin. Each minute's speculation period (specmon annotate --speculation)
# is found afterwards (_periods).
_WINDOW_MINUTES_SQL = f"""
WITH w AS (
    SELECT rs.run_id, w.k, {engine_label.stored_sql('w.labels')} AS engine_key, w.end_ts, w.running_requests,
           w.generation_throughput, w.accepted_tokens, w.draft_tokens, w.drafts, w.accepted_per_position,
           (w.draft_tokens IS NOT NULL OR w.mean_acceptance_length IS NOT NULL) AS speculating
    FROM engine_windows w JOIN shown_segments rs USING (segment_id)
    WHERE w.running_requests > 0 AND w.generation_throughput IS NOT NULL AND (? IS NULL OR rs.run = ? OR rs.run IN (
        SELECT r.name FROM baselines b JOIN runs r ON r.run_id = b.run_id JOIN runs o ON o.run_id = b.of_run_id
        WHERE o.name = ?))
)
SELECT w.run_id, w.k, w.engine_key, {_BIN.format(n="w.running_requests")} AS bin, w.speculating,
       epoch(time_bucket(INTERVAL '{_MINUTE} seconds', w.end_ts))::BIGINT AS minute_s,
       min(w.end_ts) AS first_ts, max(w.end_ts) AS last_ts,
       sum(w.generation_throughput) AS throughput, sum(w.running_requests) AS running, count(*) AS windows,
       sum(w.accepted_tokens) AS accepted_tokens, sum(w.draft_tokens) AS draft_tokens, sum(w.drafts) AS drafts,
       sum(list_sum(w.accepted_per_position)) AS pos_accepted,
       sum(w.drafts + list_sum(w.accepted_per_position) - w.accepted_per_position[-1]) AS pos_checked,
       bool_and(len(w.accepted_per_position) > 0 AND w.drafts IS NOT NULL) AS counted
FROM w GROUP BY w.run_id, w.k, w.engine_key, bin, w.speculating, minute_s
"""
_RUNS_SQL = "SELECT run_id, name, demo FROM runs"
_PERIODS_SQL = "SELECT run_id, starts_at, speculation FROM speculation_periods ORDER BY run_id, starts_at, period_id"


def _periods(minutes: pd.DataFrame, periods: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each minute's `off` (its run had annotated speculation off when its windows ran) and `keep`: a minute whose
    first and last windows fall in different periods straddles a switch and is left out, as an engine changing its
    configuration is not steady."""
    off = np.zeros(len(minutes), dtype=bool)
    keep = np.ones(len(minutes), dtype=bool)
    for run_id, mine in periods.groupby("run_id"):
        rows = np.flatnonzero((minutes["run_id"] == run_id).to_numpy())
        if not len(rows):
            continue
        starts = mine["starts_at"].to_numpy()
        first = np.searchsorted(starts, minutes["first_ts"].to_numpy()[rows], side="right") - 1
        last = np.searchsorted(starts, minutes["last_ts"].to_numpy()[rows], side="right") - 1
        speculation = mine["speculation"].to_numpy(dtype=bool)
        off[rows] = (first >= 0) & ~speculation[np.maximum(first, 0)]
        keep[rows] = first == last
    return off, keep


_CURRENT_SQL = """
WITH w AS (
    SELECT rs.run, rs.template, w.end_ts, w.running_requests FROM engine_windows w JOIN shown_segments rs
    USING (segment_id) WHERE w.running_requests IS NOT NULL AND (? IS NULL OR rs.run = ?)
), last AS (SELECT run, max(end_ts) AS last_ts, arg_max(template, end_ts) AS template FROM w GROUP BY run)
SELECT w.run, avg(w.running_requests) AS running, any_value(last.template) AS template,
       list(DISTINCT {bin} ORDER BY {bin}) AS seen
FROM w JOIN last USING (run) WHERE w.end_ts >= last.last_ts - ?::INTERVAL GROUP BY w.run
"""


class _Side(NamedTuple):
    """Minutes of engine windows as arrays, the figures of a side of a load point: each side and group takes its
    rows from them, and only these columns."""

    engine: np.ndarray  # the engine_key's code
    minute_s: np.ndarray
    throughput: np.ndarray
    windows: np.ndarray
    running: np.ndarray
    accepted_tokens: np.ndarray
    draft_tokens: np.ndarray
    drafts: np.ndarray
    pos_accepted: np.ndarray
    pos_checked: np.ndarray
    counted: np.ndarray  # every window of the minute counts its positions (NULL, as pandas' all() skips it, is True)

    def take(self, rows: np.ndarray) -> _Side:
        return _Side(*(column[rows] for column in self))


class _Minutes(NamedTuple):
    """The minutes of engine windows (_WINDOW_MINUTES_SQL's rows): what picks the rows of a side (_curve) and of
    its groups (_window_points), and their figures."""

    run: np.ndarray  # run_id
    k: np.ndarray  # NaN: the draft length unknown
    bin: np.ndarray
    speculating: np.ndarray
    off: np.ndarray  # the run had annotated speculation off
    figures: _Side

    @classmethod
    def of(cls, frame: pd.DataFrame, periods: pd.DataFrame) -> _Minutes:
        """The query's minutes, those that straddle a switch of speculation left out (_periods)."""
        off, keep = _periods(frame, periods)
        if not keep.all():
            frame, off = frame[keep], off[keep]

        def number(column: str) -> np.ndarray:
            return frame[column].to_numpy(float, na_value=np.nan)

        figures = _Side(pd.factorize(frame["engine_key"])[0], frame["minute_s"].to_numpy(np.int64),
                        number("throughput"), number("windows"), number("running"), number("accepted_tokens"),
                        number("draft_tokens"), number("drafts"), number("pos_accepted"), number("pos_checked"),
                        frame["counted"].fillna(True).to_numpy(bool))
        return cls(frame["run_id"].to_numpy(np.int64), number("k"), number("bin"),
                   frame["speculating"].to_numpy(bool), off, figures)


def _groups(rows: np.ndarray, *keys: np.ndarray) -> list[tuple[tuple, np.ndarray]]:
    """`rows` by the values of `keys` there, in ascending order of the keys, a missing (NaN) key last."""
    if not len(rows):
        return []
    values = [np.where(np.isnan(key[rows]), np.inf, key[rows]) for key in keys]
    order = np.lexsort(values[::-1])
    sorted_values = [v[order] for v in values]
    starts = np.flatnonzero(np.concatenate([[True], np.any([np.diff(v) != 0 for v in sorted_values], axis=0)]))
    ends = np.append(starts[1:], len(order))
    return [(tuple(key[rows[order[a]]] for key in keys), rows[order[a:b]]) for a, b in zip(starts, ends, strict=True)]


def _total(values: np.ndarray) -> float | None:
    """The sum of the known values, None where none is known."""
    known = values[~np.isnan(values)]
    return float(known.sum()) if len(known) else None


def _window_points(minutes: _Minutes, spec: np.ndarray, base: np.ndarray) -> list[LoadPoint]:
    """Points of engine windows: per draft length and bin, the speculative windows' mean throughput (the rows
    `spec` of `minutes`) against the baseline's windows' (`base`) in the same bin, each mean with the variance that
    pairs neighbouring windows (_mean_sums). A side whose windows span under MIN_WINDOW_SPAN_SECONDS gives no
    interval, as engine segments do."""
    out = []
    base_at = {}
    for (b,), rows in _groups(base, minutes.bin):
        side = minutes.figures.take(rows)
        base_at[b] = (side, _grid(side))
    for (k, b), rows in _groups(spec, minutes.k, minutes.bin):
        if b not in base_at or np.nansum(base_at[b][0].throughput) <= 0:
            continue
        g = minutes.figures.take(rows)
        (y, y_grid), x_grid = base_at[b], _grid(g)
        x_sums, y_sums = _mean_sums(g, x_grid), _mean_sums(y, y_grid)
        speedup = load.speedup_of_means(x_sums, y_sums)
        if min(x_grid.minutes, y_grid.minutes) * 60 < MIN_WINDOW_SPAN_SECONDS:  # too short to show how noise persists
            speedup = replace(speedup, lo=None, hi=None, dof=None)
        alpha = alpha_lo = alpha_hi = None
        if g.counted.all() and np.nansum(g.pos_checked) > 0:
            iv = stats.cluster_interval(serial_sums(x_grid, g.pos_accepted, g.pos_checked), CONFIDENCE)
            alpha = iv.estimate
            if x_grid.minutes * 60 >= MIN_WINDOW_SPAN_SECONDS:
                alpha_lo, alpha_hi = iv.lo, iv.hi
        acc, drafts, drafted = _total(g.accepted_tokens), _total(g.drafts), _total(g.draft_tokens)
        rate = acc / drafted if acc is not None and drafted is not None and drafted > 0 else None
        tps = 1 + acc / drafts if acc is not None and drafts is not None and drafts > 0 else None
        windows = int(g.windows.sum())
        out.append(LoadPoint(None if np.isnan(k) else int(k), float(g.running.sum() / windows),
                             x_sums.a / x_sums.n, y_sums.a / y_sums.n, speedup, windows, int(y.windows.sum()),
                             alpha, alpha_lo, alpha_hi, rate, tps))
    return out


def _grid(minutes: _Side) -> WindowBins:
    """The minutes' places on the grid of engine-window intervals (window_grid.grid_places), their engines numbered
    in order of appearance."""
    return grid_places(pd.factorize(minutes.engine)[0], minutes.minute_s)


def _mean_sums(minutes: _Side, grid: WindowBins) -> stats.SerialSums:
    """A side's mean throughput over its windows, as throughput summed over windows / windows, with the variance
    that pairs neighbouring bins. Its working model for the finite-sample corrections: a bin's windows independent
    and alike (rho 0), since a throughput is no proportion whose binomial variance could measure their correlation;
    bins correlated as the residuals show (stats.bin_persistence)."""
    return serial_sums(grid, minutes.throughput, minutes.windows, rho=0.0)


def _crossings(points: list[LoadPoint]) -> tuple[dict[int | None, load.Crossing], load.Crossing | None,
                                                 list[load.Band]]:
    by_k: dict[int | None, list[LoadPoint]] = {}
    for p in points:
        by_k.setdefault(p.k, []).append(p)
    crossings = {k: load.crossing([p.concurrency for p in ps], [p.speedup for p in ps])
                 for k, ps in sorted(by_k.items(), key=lambda kv: -1 if kv[0] is None else kv[0])}
    levels = sorted({p.concurrency for p in points})
    table = {k: [next((p.speedup for p in ps if p.concurrency == n), None) for n in levels] for k, ps in by_k.items()}
    bands = load.best_k(levels, table)
    best_speedups = [max((p.speedup for p in points if p.concurrency == n), key=lambda s: s.estimate) for n in levels]
    best = load.crossing(levels, best_speedups) if levels else None
    return crossings, best, bands


def curves(store: Store, run: str | None = None) -> list[LoadCurve]:
    """The load curve of every run that measured load (or of one run), baselines and all."""
    with store.reading():
        points = store.query_df(_POINTS_SQL)
        baselines = store.query_df(_BASELINES_SQL)
        runs = store.query(_RUNS_SQL)
        minutes = _Minutes.of(store.query_df(_WINDOW_MINUTES_SQL, [run, run, run]), store.query_df(_PERIODS_SQL))
        current = store.query_df(_CURRENT_SQL.format(bin=_BIN.format(n="w.running_requests")),
                                 [run, run, f"{CURRENT_SPAN.total_seconds():g} seconds"])
    demo = {name for _, name, is_demo in runs if is_demo}
    baseline_of = baselines.groupby("of_run")["baseline"].apply(list).to_dict() if not baselines.empty else {}
    is_baseline = set(baselines["baseline"]) if not baselines.empty else set()
    ids = {name: run_id for run_id, name, _ in runs}
    seen_ids = set(pd.unique(minutes.run))
    windowed = {name for name, i in ids.items() if i in seen_ids}
    names = sorted((set(points["run"].unique()) | windowed) - is_baseline)
    now = {r.run: r for r in current.itertuples()}
    return [replace(_curve(name, points, minutes, ids, baseline_of.get(name, []), now.get(name)),
                    demo=name in demo)
            for name in (names if run is None else [n for n in names if n == run])]


def _curve(run: str, points: pd.DataFrame, minutes: _Minutes, ids: dict[str, int], baseline_runs: list[str],
           now) -> LoadCurve:
    current = None if now is None else float(now.running)
    template = "" if now is None else str(now.template)
    seen = [] if now is None else [float(b) for b in now.seen]
    own_points = points[points["run"] == run]
    spec_points = own_points[own_points["k"].isna() | (own_points["k"] > 0)]
    if not spec_points.empty:
        base = own_points[own_points["k"] == 0]
        how = "the run's own measurements with k = 0"
        if base.empty and baseline_runs:
            base = points[points["run"].isin(baseline_runs) & ((points["k"] == 0) | points["k"].isna())]
            how = f"the run{'s' if len(baseline_runs) > 1 else ''} {', '.join(map(repr, baseline_runs))}, declared " \
                  "its baseline"
        measured = _sweep_points(spec_points, base) if not base.empty else []
        if measured:
            crossings, best, bands = _crossings(measured)
            return LoadCurve(run, how, REPEAT_OBSERVATIONS, measured, crossings, best, bands, template, current, None,
                             seen)
    own = np.flatnonzero(minutes.run == ids.get(run, -1))
    if len(own):
        spec, base = own[minutes.speculating[own] & ~minutes.off[own]], own[minutes.off[own]]
        how = "the run's windows in periods annotated as speculation off"
        if not len(base) and baseline_runs:
            base = np.flatnonzero(np.isin(minutes.run, [ids[b] for b in baseline_runs if b in ids]))
            how = f"the windows of {', '.join(map(repr, baseline_runs))}, declared its baseline"
        measured = _window_points(minutes, spec, base) if len(spec) and len(base) else []
        if measured:
            crossings, best, bands = _crossings(measured)
            return LoadCurve(run, how, WINDOW_OBSERVATIONS, measured, crossings, best, bands, template, current,
                             None, seen)
    note = ("payoff at load is unknown: there is no throughput without speculation at the same concurrencies to "
            "compare with. Measure a baseline: ingest an engine without speculation with --baseline-of "
            f"{run!r}, annotate a period with `specmon annotate --run {run!r} --speculation off`, or ingest a load "
            "sweep with k = 0 rows")
    return LoadCurve(run, None, "", [], {}, None, [], template, current, note, seen)
