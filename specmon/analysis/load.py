"""Does speculation pay at the load a run serves? Speedup and break-even by concurrency, per run, from what was
measured with and without speculation (specmon.core.load has the formulas).

Two kinds of measurement feed a run's load curve:
- load points (benchmark sweeps, `vllm bench serve` results, batched live runs): one row per measurement at a fixed
  concurrency; each repeat is one observation.
- engine windows that carry their load (requests running, generation throughput), from engine logs, Prometheus or
  a watched engine: binned by running requests (1, 2, 3-4, 5-8, 9-16, ...). A request outlives a 10-second log
  window, so neighbouring windows are not independent: the observations are blocks of consecutive windows of one
  engine in one bin, each spanning up to BLOCK_SECONDS (longer than most requests last), their mean throughput one
  observation.
The baseline (throughput without speculation at the same concurrency) is, in order: the run's own k = 0
measurements; the measurements of a run declared its baseline (`--baseline-of`); the run's own windows in periods
annotated as speculation off (`specmon annotate --speculation off`). An engine merely configured for speculation
runs slower even when it drafts nothing, so only a clean engine makes a baseline; docs/math.md says more.
Where there is none, the payoff at load is unknown, and LoadCurve.note says what would answer it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from specmon.analysis import engine_segments
from specmon.core import load, stats
from specmon.core.settings import CONFIDENCE
from specmon.store.database import Store

BLOCK_SECONDS = 120.0
# The load a run serves now: the mean requests running over its last windows, within this span of its last one.
CURRENT_SPAN = timedelta(minutes=5)
# A bin needs this many observations on each side for a speedup with an interval.
MIN_OBSERVATIONS = 2

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
_PERIODS_SQL = """
SELECT r.name AS run, p.starts_at, p.speculation FROM speculation_periods p JOIN runs r USING (run_id)
ORDER BY r.name, p.starts_at, p.period_id
"""


@dataclass(frozen=True)
class LoadPoint:
    """One measured (k, concurrency): throughput with and without speculation, the speedup, and acceptance there."""

    k: int | None  # None: speculation on, its draft length unknown
    concurrency: float
    throughput: float  # output tokens/s with speculation (the mean of its observations)
    baseline_throughput: float
    speedup: load.Speedup
    observations: int
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
    observations: str  # what one observation is ("repeats", "blocks of consecutive windows of up to 120 s")
    points: list[LoadPoint]
    crossings: dict[int | None, load.Crossing]  # per k (None: length unknown)
    best: load.Crossing | None  # of the best k at each concurrency
    bands: list[load.Band]
    template: str = ""  # the template of the run's latest windows
    current: float | None = None  # the mean requests running over the run's latest windows
    note: str | None = None  # what is missing, where the payoff at load is unknown
    seen: list[float] = field(default_factory=list)  # concurrencies the run's windows ran at (no baseline needed)

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


def concurrency_bin(running: float) -> int:
    """The bin of a window's requests running: 1, 2, then powers of two (3-4 -> 4, 5-8 -> 8, ...)."""
    return 1 if running <= 1 else 2 ** math.ceil(math.log2(running))


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


def _blocks(windows: pd.DataFrame) -> pd.DataFrame:
    """Each window's observation block: consecutive windows of one engine (labels) in one bin, a block starting
    anew after BLOCK_SECONDS or wherever the run left the bin."""
    w = windows.sort_values("end_ts").reset_index(drop=True)
    w = w.assign(bin=w["running_requests"].map(concurrency_bin), engine_key=w["labels"].astype(str))
    block = np.zeros(len(w), dtype=np.int64)
    next_id, current = 0, {}
    for i, (key, b, ts) in enumerate(zip(w["engine_key"], w["bin"], w["end_ts"], strict=True)):
        open_block = current.get(key)
        if open_block is None or open_block[1] != b or (ts - open_block[2]).total_seconds() > BLOCK_SECONDS:
            next_id += 1
            open_block = (next_id, b, ts)
            current[key] = open_block
        block[i] = open_block[0]
    return w.assign(block=block)


def _window_points(spec: pd.DataFrame, base: pd.DataFrame) -> list[LoadPoint]:
    """Points of engine windows: per bin of requests running, the spec windows' blocks against the baseline's."""
    out = []
    base_obs = {b: g.groupby("block")["generation_throughput"].mean().to_numpy() for b, g in base.groupby("bin")}
    for (k, b), g in spec.groupby(["k", "bin"], dropna=False, sort=True):
        x = g.groupby("block")["generation_throughput"].mean().to_numpy()
        y = base_obs.get(b)
        if y is None or len(x) < 1 or not len(y) or y.mean() <= 0:
            continue
        checks = [engine_segments.window_checks(r) for r in engine_segments.check_rows(g)]
        alpha = None
        if all(c is not None for c in checks) and checks:
            a = np.array([c[0] for c in checks if c is not None])
            n = np.array([c[1] for c in checks if c is not None])
            iv = stats.cluster_robust_interval(*_by_block(a, n, g["block"].to_numpy()), CONFIDENCE)
            alpha = iv
        acc, drafts, drafted = g["accepted_tokens"].sum(min_count=1), g["drafts"].sum(min_count=1), \
            g["draft_tokens"].sum(min_count=1)
        rate = float(acc / drafted) if pd.notna(acc) and pd.notna(drafted) and drafted > 0 else None
        tps = 1 + float(acc / drafts) if pd.notna(acc) and pd.notna(drafts) and drafts > 0 else None
        out.append(LoadPoint(None if pd.isna(k) else int(k), float(g["running_requests"].mean()), float(x.mean()),
                             float(y.mean()), load.speedup(x, y), len(x), len(y),
                             None if alpha is None else alpha.estimate, None if alpha is None else alpha.lo,
                             None if alpha is None else alpha.hi, rate, tps))
    return out


def _by_block(a: np.ndarray, n: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _, inverse = np.unique(block, return_inverse=True)
    return np.bincount(inverse, weights=a), np.bincount(inverse, weights=n)


def _loaded(windows: pd.DataFrame) -> pd.DataFrame:
    """Windows that carry their load: requests running above 0 and a generation throughput."""
    if windows.empty or "running_requests" not in windows:
        return windows.iloc[0:0]
    w = windows[windows["running_requests"].notna() & windows["generation_throughput"].notna()
                & (windows["running_requests"] > 0)]
    return w


def _speculating(windows: pd.DataFrame) -> pd.Series:
    return windows["draft_tokens"].notna() | windows["mean_acceptance_length"].notna()


def _in_off_periods(windows: pd.DataFrame, periods: pd.DataFrame) -> pd.Series:
    """Whether each window falls in a period its run annotated as speculation off."""
    off = pd.Series(False, index=windows.index)
    if periods.empty:
        return off
    ordered = periods.sort_values("starts_at")
    state = np.searchsorted(ordered["starts_at"].to_numpy(), windows["end_ts"].to_numpy(), side="right") - 1
    speculation = ordered["speculation"].to_numpy()
    return pd.Series([i >= 0 and not speculation[i] for i in state], index=windows.index)


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


def _current(windows: pd.DataFrame) -> tuple[float | None, str]:
    """The mean requests running over the run's windows within CURRENT_SPAN of its last, and their template."""
    if windows.empty:
        return None, ""
    last = windows["end_ts"].max()
    recent = windows[windows["end_ts"] >= last - CURRENT_SPAN]
    return float(recent["running_requests"].mean()), str(recent.sort_values("end_ts")["template"].iloc[-1])


def curves(store: Store, run: str | None = None) -> list[LoadCurve]:
    """The load curve of every run that measured load (or one run), baselines and all."""
    with store.reading():
        points = store.query_df(_POINTS_SQL)
        baselines = store.query_df(_BASELINES_SQL)
        periods = store.query_df(_PERIODS_SQL)
        windows = _loaded(engine_segments.windows(store))
    baseline_of = baselines.groupby("of_run")["baseline"].apply(list).to_dict() if not baselines.empty else {}
    is_baseline = set(baselines["baseline"]) if not baselines.empty else set()
    names = sorted((set(points["run"]) | set(windows["run"] if not windows.empty else [])) - is_baseline)
    out = []
    for name in names if run is None else [n for n in names if n == run]:
        out.append(_curve(name, points, windows, periods, baseline_of.get(name, [])))
    return out


def _curve(run: str, points: pd.DataFrame, windows: pd.DataFrame, periods: pd.DataFrame,
           baseline_runs: list[str]) -> LoadCurve:
    own_points = points[points["run"] == run]
    own_windows = windows[windows["run"] == run] if not windows.empty else windows
    current, template = _current(own_windows)
    seen = sorted({float(concurrency_bin(n)) for n in own_windows["running_requests"]}) if len(own_windows) else []
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
            return LoadCurve(run, how, "repeats", measured, crossings, best, bands, template, current, None, seen)
    if not own_windows.empty:
        run_periods = periods[periods["run"] == run]
        off = _in_off_periods(own_windows, run_periods)
        spec = own_windows[_speculating(own_windows) & ~off]
        base = own_windows[off]
        how = "the run's windows in periods annotated as speculation off"
        if base.empty and baseline_runs:
            base = windows[windows["run"].isin(baseline_runs)]
            how = f"the windows of {', '.join(map(repr, baseline_runs))}, declared its baseline"
        if not spec.empty and not base.empty:
            blocked = _blocks(pd.concat([spec.assign(side="spec"), base.assign(side="base")]))
            measured = _window_points(blocked[blocked["side"] == "spec"], blocked[blocked["side"] == "base"])
            if measured:
                crossings, best, bands = _crossings(measured)
                return LoadCurve(run, how, f"blocks of consecutive windows of up to {BLOCK_SECONDS:g} s", measured,
                                 crossings, best, bands, template, current, None, seen)
    note = ("payoff at load is unknown: there is no throughput without speculation at the same concurrencies to "
            "compare with. Measure a baseline: ingest an engine without speculation with --baseline-of "
            f"{run!r}, annotate a period with `specmon annotate --run {run!r} --speculation off`, or ingest a load "
            "sweep with k = 0 rows")
    return LoadCurve(run, None, "", [], {}, None, [], template, current, note, seen)
