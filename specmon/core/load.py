"""Speculation at load: the speedup at a concurrency from throughput measured with and without speculation, where
it crosses 1, the best draft length per concurrency, and the best draft length from measured per-position rates.

Pure: numbers in, numbers out (docs/math.md, "Speculation at load"). The speedup at concurrency N is measured, not
modelled: S(N) = G_spec(N) / G_0(N), output tokens per second with speculation over the same without it, at the
same N (the batch-1 formula assumes verifying k + 1 tokens costs one target step, which stops holding once the
target's batch fills its compute). Nothing here predicts an unmeasured concurrency or k.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specmon.core import stats
from specmon.core.settings import CONFIDENCE


@dataclass(frozen=True)
class Speedup:
    """S = mean(spec) / mean(base) with its interval (None where either side has one measurement or cluster)."""

    estimate: float
    lo: float | None
    hi: float | None
    dof: float | None  # the t quantile's degrees of freedom (Welch-Satterthwaite)

    @property
    def verdict(self) -> str:
        """"pays" (the interval lies above 1), "loses" (below), "even" (it holds 1), or "unknown" (no interval)."""
        if self.lo is None or self.hi is None:
            return "unknown"
        return "pays" if self.lo > 1 else "loses" if self.hi < 1 else "even"


def speedup(spec: Sequence[float], base: Sequence[float], confidence: float = CONFIDENCE) -> Speedup:
    """The ratio of mean throughputs of two independent sets of measurements (repeats: each one observation), with
    a t interval for log S by the delta method: se^2 = s_x^2 / (n_x xbar^2) + s_y^2 / (n_y ybar^2), at
    Welch-Satterthwaite's degrees of freedom. It assumes the observations of each side independent and alike (a
    repeat's noise does not carry into the next); with 2 or 3 repeats a side its interval is wide, as it should be.
    No interval with under 2 observations on a side."""
    x, y = np.asarray(spec, dtype=float), np.asarray(base, dtype=float)
    if not len(x) or not len(y) or y.mean() <= 0:
        raise ValueError("a speedup needs throughput with and without speculation, the latter above 0")
    ratio = float(x.mean() / y.mean())
    if len(x) < 2 or len(y) < 2 or ratio <= 0:
        return Speedup(ratio, None, None, None)
    return _log_interval(ratio, x.var(ddof=1) / (len(x) * x.mean() ** 2), len(x) - 1,
                         y.var(ddof=1) / (len(y) * y.mean() ** 2), len(y) - 1, confidence)


def speedup_of_means(spec: stats.RatioSums, base: stats.RatioSums, confidence: float = CONFIDENCE) -> Speedup:
    """The ratio of two mean throughputs, each a ratio of totals (engine windows: throughput summed over windows /
    windows) with its own variance and degrees of freedom (stats.SerialSums, which pairs neighbouring windows), as
    `speedup` combines them: se^2(log S) = V_x / xbar^2 + V_y / ybar^2 at Welch-Satterthwaite's degrees of freedom.
    It assumes the two sides' noise independent of each other. No interval where a side has no variance."""
    if base.n <= 0 or base.a <= 0 or spec.n <= 0:
        raise ValueError("a speedup needs throughput with and without speculation, the latter above 0")
    x, y = spec.a / spec.n, base.a / base.n
    ratio = x / y
    vx, vy = spec.ratio_variance(), base.ratio_variance()
    if ratio <= 0 or not (math.isfinite(vx) and math.isfinite(vy)):
        return Speedup(ratio, None, None, None)
    return _log_interval(ratio, vx / x ** 2, spec.dof(1.0), vy / y ** 2, base.dof(1.0), confidence)


def _log_interval(ratio: float, vx: float, dx: float, vy: float, dy: float, confidence: float) -> Speedup:
    """S exp(+-t se) with se^2 = vx + vy (each side's variance of its log mean) at Welch-Satterthwaite's degrees of
    freedom from each side's own (dx, dy)."""
    se = math.sqrt(vx + vy)
    if se == 0:
        return Speedup(ratio, ratio, ratio, math.inf)
    spread = vx ** 2 / dx + vy ** 2 / dy
    dof = (vx + vy) ** 2 / spread if spread > 0 else math.inf
    q = stats.t_quantile(confidence, dof)
    return Speedup(ratio, ratio * math.exp(-q * se), ratio * math.exp(q * se), dof)


@dataclass(frozen=True)
class Crossing:
    """Where a speedup curve over measured concurrencies crosses 1.

    pays_up_to: the largest measured concurrency below the first crossing whose speedup is above 1; loses_from: the
    smallest measured concurrency whose speedup is below 1 (both None where the curve does not cross within the
    measured range: it pays, or loses, at every one). break_even: N* interpolated between the two on log N; lo, hi:
    where N* surely lies, from the last concurrency whose interval lies above 1 before the crossing to the first
    whose interval lies below 1 after it (None where no interval says so)."""

    pays_up_to: float | None
    loses_from: float | None
    break_even: float | None
    lo: float | None
    hi: float | None
    measured_from: float
    measured_to: float

    @property
    def crosses(self) -> bool:
        return self.loses_from is not None

    def describe(self) -> str:
        span = f"N = {self.measured_from:g}..{self.measured_to:g}"
        if not self.crosses:
            return f"does not cross 1 within {span}"
        sure = (f" (surely between {self.lo:g} and {self.hi:g})" if self.lo is not None and self.hi is not None
                else "")
        return (f"pays up to {self.pays_up_to:g} running requests, loses from {self.loses_from:g}: break-even near "
                f"{self.break_even:.3g}{sure}")


def crossing(concurrency: Sequence[float], speedups: Sequence[Speedup]) -> Crossing:
    """The first crossing of 1 from above of a curve (points in increasing concurrency): where it stops paying. A
    curve that loses at its lowest concurrencies and pays further up (a baseline that batches poorly at 1) is
    judged from where it first pays."""
    n = [float(v) for v in concurrency]
    if not n:
        raise ValueError("no measured concurrency")
    first_above = next((i for i, s in enumerate(speedups) if s.estimate > 1), None)
    first_below = None if first_above is None else next(
        (i for i in range(first_above + 1, len(n)) if speedups[i].estimate < 1), None)
    if first_above is None or first_below is None:
        return Crossing(None, None, None, None, None, n[0], n[-1])
    a = max(i for i in range(first_above, first_below) if speedups[i].estimate > 1)
    b = first_below
    sa, sb = speedups[a].estimate, speedups[b].estimate
    t = math.log(sa) / (math.log(sa) - math.log(sb))  # log S linear in log N between the two
    n_star = math.exp(math.log(n[a]) + t * (math.log(n[b]) - math.log(n[a])))
    sure_lo = next((n[i] for i in range(a, -1, -1) if speedups[i].verdict == "pays"), None)
    sure_hi = next((n[i] for i in range(b, len(n)) if speedups[i].verdict == "loses"), None)
    return Crossing(n[a], n[b], n_star, sure_lo, sure_hi, n[0], n[-1])


@dataclass(frozen=True)
class Band:
    """One stretch of a policy: draft length k (0: speculation off; None: on, at a draft length the data does not
    name) up to max_concurrency running requests (None: beyond every measured one). sure: the measurements at its
    concurrencies all say so beyond noise (k > 0: its speedup's interval lies above 1 there, and above every other
    k's point where several k were measured; k = 0: every k's interval lies below 1)."""

    max_concurrency: float | None
    k: int | None
    first: float  # the smallest measured concurrency of the band
    unsure: tuple[float, ...] = ()  # its measured concurrencies where the choice is not beyond noise

    @property
    def sure(self) -> bool:
        return not self.unsure


def best_k(concurrency: Sequence[float], by_k: Mapping[int | None, Sequence[Speedup | None]]) -> list[Band]:
    """The draft length that measured best at each concurrency (0 where no k paid), merged into bands of
    neighbouring concurrencies with the same k; by_k maps each measured k > 0 to its speedup at each concurrency
    (None where that k was not measured there)."""
    bands: list[Band] = []
    for i, n in enumerate(concurrency):
        measured: dict[int | None, Speedup] = {k: sp for k, row in by_k.items() if (sp := row[i]) is not None}
        if not measured:
            continue
        k, s = max(measured.items(), key=lambda kv: kv[1].estimate)
        choice: int | None
        if s.estimate <= 1:
            choice = 0
            sure = all(v.verdict == "loses" for v in measured.values())
        else:
            others = [v for kk, v in measured.items() if kk != k]
            choice = k
            sure = s.verdict == "pays" and all(s.lo is not None and s.lo > v.estimate for v in others)
        unsure = () if sure else (float(n),)
        if bands and bands[-1].k == choice:
            bands[-1] = Band(n, choice, bands[-1].first, bands[-1].unsure + unsure)
        else:
            bands.append(Band(n, choice, n, unsure))
    return [Band(None if i == len(bands) - 1 else b.max_concurrency, b.k, b.first, b.unsure)
            for i, b in enumerate(bands)]


def describe_policy(bands: list[Band], measured_to: float) -> str:
    """A policy in plain words: "k = 2 up to 8 running requests, speculation off from 16 (between 8 and 16 not
    measured; measured up to 32, beyond that not measured)"."""
    parts = []
    for i, b in enumerate(bands):
        what = "speculation off" if b.k == 0 else "speculation on" if b.k is None else f"k = {b.k}"
        notes = []
        previous = bands[i - 1].max_concurrency if i else None
        if previous is not None and previous < b.first:
            notes.append(f"between {previous:g} and {b.first:g} not measured")
        if b.max_concurrency is None:
            notes.append(f"measured up to {measured_to:g}, beyond that not measured")
            text = f"{what} from {b.first:g}" if i else f"{what} at every measured concurrency"
        else:
            text = f"{what} up to {b.max_concurrency:g} running requests" if i == 0 else \
                f"{what} from {b.first:g} up to {b.max_concurrency:g}"
        parts.append(text + (f" ({'; '.join(notes)})" if notes else ""))
    return ", ".join(parts)


@dataclass(frozen=True)
class DraftLength:
    """What drafting k' tokens would have given, from the positions of steps that drafted k >= k' (no i.i.d.
    assumption): E[L(k')] = 1 + sum_{i <= k'} cumulative_i, with its interval, and the batch-1 speedup
    E[L(k')] / (1 + k' c) where c is known."""

    k: int
    tokens_per_step: float
    tokens_per_step_lo: float | None
    tokens_per_step_hi: float | None
    speedup: float | None
    speedup_lo: float | None
    speedup_hi: float | None
    discarded: bool  # position k' is drafted but rarely accepted: under DISCARDED_RATE of the steps reach it


# A draft position whose cumulative rate (steps whose accepted prefix reaches it) is below this is named as drafted
# and mostly discarded.
DISCARDED_RATE = 0.25


def step_variance(cumulative: Sequence[float]) -> float:
    """The per-step variance of min(A, k) from the cumulative rates P(A >= i), i = 1..k."""
    p = np.asarray(cumulative, dtype=float)
    mean = float(p.sum())
    return max(float(((2 * np.arange(1, len(p) + 1) - 1) * p).sum()) - mean ** 2, 0.0)


def tokens_design_effect(cumulative: Sequence[float], steps: float, lo: float | None, hi: float | None,
                         dof: float | None, confidence: float = CONFIDENCE) -> float:
    """How much correlation within requests inflates the variance of L: the variance L's clustered interval
    [lo, hi] implies (its width over 2 t) over the per-step one (step_variance / steps); 1 where unknown."""
    var = step_variance(cumulative)
    if lo is None or hi is None or var <= 0 or steps <= 0:
        return 1.0
    q = stats.t_quantile(confidence, dof) if dof else stats.normal_quantile(confidence)
    return max(((hi - lo) / (2 * q)) ** 2 / (var / steps), 1.0)


def draft_lengths(cumulative: Sequence[float], steps: float, c: float | None, design_effect: float = 1.0,
                  dof: float | None = None, confidence: float = CONFIDENCE) -> list[DraftLength]:
    """E[L(k')] for k' = 1..k from measured cumulative per-position rates (cumulative_i: the share of steps whose
    accepted prefix reached position i, as vLLM and llama.cpp print them), each with an interval.

    Its variance: L(k') - 1 = min(A, k') for a step's accepted prefix A, whose second moment is
    sum_{m <= k'} (2m - 1) P(A >= m), so the per-step variance follows from the rates themselves; it is inflated by
    the design effect of L at the draft length in use (its request-clustered variance over this per-step one:
    tokens_design_effect) and the interval taken at the segment's degrees of freedom (a normal quantile where none
    is given). That assumes the correlation within requests inflates every k' as it inflates k."""
    p = np.asarray(cumulative, dtype=float)
    out = []
    q = stats.t_quantile(confidence, dof) if dof else stats.normal_quantile(confidence)
    for kk in range(1, len(p) + 1):
        mean = float(p[:kk].sum())
        var = step_variance(p[:kk].tolist()) * max(design_effect, 1.0)
        half = q * math.sqrt(var / steps) if steps > 0 else None
        lo, hi = (1 + max(mean - half, 0.0), 1 + min(mean + half, kk)) if half is not None else (None, None)
        cost = None if c is None else 1 + kk * c
        out.append(DraftLength(kk, 1 + mean, lo, hi, None if cost is None else (1 + mean) / cost,
                               None if cost is None or lo is None else lo / cost,
                               None if cost is None or hi is None else hi / cost, bool(p[kk - 1] < DISCARDED_RATE)))
    return out
