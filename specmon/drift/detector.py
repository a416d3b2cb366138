"""The drift detector: a one-sided Bernoulli CUSUM on acceptance, self-starting (its reference grows at checkpoints),
change dating by maximum likelihood, and before/after tests of template changes (docs/math.md, "Drift";
docs/drift.md). Its threshold comes from specmon.drift.calibration.

A stream is a sequence of points in time order, each a batch of checked positions of which some were accepted:
a verification step of a step log, or a window of an engine log or of Prometheus counters. Every point belongs to a
cluster (a request; for engine data, the window itself) whose points share their acceptance.

The CUSUM adds, per point, s*ln(p1/p0) + f*ln((1-p1)/(1-p0)) for s accepted and f rejected checked positions, and
alarms when the sum reaches h. A threshold follows the luck of its reference, and the alarm rate is convex in h, so
for a step log the reference grows (run_cusum): p0, p1 and h are calibrated again on the first 2, 4, 8 and 16 x
REFERENCE_STEPS points at checkpoints taken outside alarm episodes. Pure numpy; no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specmon.core import stats
from specmon.core.settings import WINDOW_BLOCK_SECONDS

# The first points of a stream set p0 and are resampled for the threshold. The false-alarm rate depends steeply on
# how well they picture the in-control process, so more is better, at the price of watching later; docs/drift.md
# has what 2,000 steps (about 100 requests of 20 steps) give.
REFERENCE_STEPS = 2_000

# The reference then grows (a self-starting design): the threshold is calibrated again on the first 2, 4, 8 and 16 x
# REFERENCE_STEPS points (docs/math.md, "Drift", "Self-starting"), so the luck of one short reference fades as the
# run grows.
CHECKPOINT_GROWTH = 16

# An engine window (a log interval or a scrape) already batches many drafts: 30 of them (five minutes of vLLM's
# 10-second log lines) make the first reference of a run of engine windows, so a rollout soon after a start is watched.
REFERENCE_WINDOWS = 30

# Engine windows' reference grows further, to 8,192 x its first (245,760 windows: four weeks of 10-second log lines),
# since a false-alarm rate is stated only once it holds a full day of blocks and WINDOW_REFERENCE_MULTIPLE x the
# stated windows per false alarm.
WINDOW_CHECKPOINT_GROWTH = 8_192

# A window reference must hold at least this many blocks (calibration.BlockProcess) to state a false-alarm rate: a
# day of 10-minute blocks of one engine. Fewer cannot show how low a block's acceptance goes while nothing changes.
WINDOW_REFERENCE_BLOCKS = 144

# ... and at least this many times the stated windows per false alarm. A window pools many drafts, so a false alarm
# is a rare run of a few poor windows, and replayed blocks picture runs only as rare as their reference shows: one
# threshold kept, calibrated on 3 x the stated 20,000, gave 0.55 x the stated windows per false alarm (too low), on
# 7.7-15 x the stated 2,000 0.97-1.00 x (docs/drift.md, "Engine windows").
WINDOW_REFERENCE_MULTIPLE = 8

# A step log's traffic mix swings with the clock (chat by day, batch jobs by night), and a reference that does not
# hold a whole day pictures only its own hours: no false-alarm rate is stated on a shorter one (Design.states_a_rate),
# and one that does is calibrated by hour of day (calibration.StepDay).
FULL_CYCLE_HOURS = 24.0

EPISODE_GAP = 1_000  # alarms within this many points of the previous one continue its episode

# The calibration draws a request's steps independently given its acceptance. Where the reference's consecutive
# steps within requests are more alike than that allows (runs of easy and hard steps), the test of it
# (calibration.runs_z) is below -RUNS_Z and no rate is stated: on such traffic the threshold came out far too high (4 x
# the stated steps per false alarm at 2,000, no alarm at all at 20,000). At -3 the test flagged at most 1% of the
# study's own references in any cell, and 86% of state-switching ones at 2,000 steps, 98-100% from 4,000 on
# (docs/drift.md, "Runs within requests").
RUNS_Z = 3.0

# Engine windows whose reference states no rate: calibration.least_h takes the in-control drift at the lower end of
# the reference acceptance's interval of this two-sided confidence (a one-sided 99% bound). Each checkpoint's
# reference is another chance for the bound to lie above the truth: at a one-sided 90% bound, 13 of 40 healthy
# 3-hour runs of windows whose acceptance holds for runs of a few windows alarmed, most on a reference read a few
# hundredths high; at 99%, 1 of 40 (bench/window_floor.py; docs/drift.md, "Engine windows").
FLOOR_CONFIDENCE = 0.98

CHANGE_CONFIDENCE = 0.99  # template change verdicts at the two-sided 1% level

# A change time whose profile log-likelihood lies within this many (design-effect-scaled) units of the maximum is
# in the change's likely range (about a 95% set; the study in docs/drift.md measures how often it holds the truth).
CHANGE_RANGE_DROP = 3.0


@dataclass(frozen=True)
class Design:
    """A calibrated detector: watch for acceptance moving from p0 to p1; alarm at W >= h.

    unit names a stream point ("steps" or "windows"); arl0_steps is the stated points between false alarms;
    design_effect and clusters describe the reference window the threshold was calibrated on.
    """

    p0: float
    p1: float
    h: float
    arl0_steps: int
    design_effect: float
    k: int
    clusters: int = 0
    unit: str = "steps"
    reference: int = 0  # points it was calibrated on (the first of the stream)
    # simulated points per alarm episode at h (alarms within EPISODE_GAP points form one), from the calibration's own
    # streams; None where unknown (a threshold kept without it)
    episode_points: float | None = None
    # hours from the reference's first point to its last; None where the stream's times were not given
    reference_hours: float | None = None
    # the reference's test for runs of alike steps within requests (calibration.runs_z); None for engine windows
    runs_z: float | None = None
    # engine windows with no stated rate, where calibration.least_h set h: h / ln(arl0_steps), the windows its span
    # takes and how far below p0 the in-control drift was taken
    dispersion: float | None = None
    floor_windows: int | None = None
    floor_margin: float | None = None

    @property
    def states_a_rate(self) -> bool:
        """Whether the reference can support a stated false-alarm rate (docs/drift.md, "The study", "Engine
        windows")."""
        return self.no_rate_reason() is None

    def no_rate_reason(self) -> str | None:
        """Why no false-alarm rate is stated (None where one is): not on fewer engine windows than
        WINDOW_REFERENCE_MULTIPLE x the stated figure, nor in fewer than WINDOW_REFERENCE_BLOCKS blocks (a few hours
        of windows do not show how low a block's acceptance goes while nothing changes), nor on a reference shorter
        than a day, which cannot show the daily swing of the traffic mix (the measured rate under such a swing was
        0.59 x the stated one, and most alarms fell in the busiest hours), nor on one whose requests' steps come in
        runs (RUNS_Z)."""
        if self.unit != "steps" and self.reference < WINDOW_REFERENCE_MULTIPLE * self.arl0_steps:
            return (f"the reference's {self.reference:,} {self.unit} are fewer than {WINDOW_REFERENCE_MULTIPLE} x the "
                    f"stated {self.arl0_steps:,}, too few to show how often a run of poor windows comes")
        if self.unit != "steps" and self.clusters < WINDOW_REFERENCE_BLOCKS:
            blocks = "block" if self.clusters == 1 else "blocks"
            return (f"the reference's {self.reference:,} {self.unit} fill {self.clusters:,} {blocks} of "
                    f"{WINDOW_BLOCK_SECONDS / 60:g} minutes, "
                    f"fewer than the {WINDOW_REFERENCE_BLOCKS} (a day of one engine's) that show how low acceptance "
                    "goes while nothing changes")
        if self.runs_z is not None and self.runs_z < -RUNS_Z:
            return (f"within requests, consecutive steps of the reference are more alike than their request's "
                    f"acceptance explains (runs of easy and hard steps; test z = {self.runs_z:.1f}), which the "
                    "calibration does not picture")
        if self.reference_hours is not None and not covers_a_day(self.reference_hours):
            return (f"the reference covers {self.reference_hours:.1f} hours, less than a full day, so it cannot show "
                    "how the traffic mix swings with the hour (a rate is stated once a checkpoint's reference holds "
                    f"{FULL_CYCLE_HOURS:.0f} hours)")
        return None

    def rate_words(self) -> str:
        """The stated false-alarm rate, per alarm and per alarm episode (what a person on call sees)."""
        per_alarm = f"one false alarm per {self.arl0_steps:,} {self.unit}"
        if self.episode_points is None:
            return per_alarm + " (per alarm episode: unknown)"
        return (f"{per_alarm} (re-alarms counted; one alarm episode, alarms within {EPISODE_GAP:,} {self.unit} of "
                f"each other, per {round(self.episode_points, -2):,.0f} {self.unit})")

    def threshold_words(self) -> str:
        """The threshold and what it promises, in the words of the alarm, `check` and the Drift page."""
        calibrated = f"calibrated on the first {self.reference:,} {self.unit}"
        if self.states_a_rate:
            return f"threshold h = {self.h:.2f} for {self.rate_words()}, {calibrated}"
        floor = (f" (the floor where no rate is stated: ln {self.arl0_steps:,} x {self.dispersion:.1f}, the variance "
                 f"of the reference's CUSUM increments over the {self.floor_windows:,} {self.unit} an alarm builds up "
                 f"in, relative to binomial counts' and to their drift were acceptance {self.floor_margin:.3f} lower, "
                 f"its one-sided {(1 + FLOOR_CONFIDENCE) / 2:.0%} bound)"
                 if self.dispersion is not None else "")
        return (f"threshold h = {self.h:.2f}{floor}, {calibrated}; no false-alarm rate is stated: "
                f"{self.no_rate_reason()}")


@dataclass(frozen=True)
class Alarm:
    """One episode: a first alarm, and the re-alarms that follow it while acceptance stays low (the CUSUM is reset
    after every alarm, so a lasting drop alarms again and again; those belong to one episode)."""

    change_index: int  # maximum-likelihood start of the change
    alarm_index: int  # point index (in the stream) at which W first reached h
    last_alarm_index: int
    count: int  # alarms in the episode
    alpha_before: float  # acceptance over the reference window
    alpha_after: float  # acceptance from the estimated change to the last alarm
    change_lo: int  # the change's likely range of start points (CHANGE_RANGE_DROP)
    change_hi: int
    design: Design  # the design in force at the alarm


def llr_weights(p0: float, p1: float) -> tuple[float, float]:
    """CUSUM increments for one accepted and one rejected checked position."""
    return math.log(p1 / p0), math.log((1 - p1) / (1 - p0))


def cusum(accepted: np.ndarray, checked: np.ndarray, design: Design) -> tuple[np.ndarray, list[int]]:
    """W_t over a stream of points, restarting after each alarm. Returns W and the alarm indices."""
    wa, wr = llr_weights(design.p0, design.p1)
    x = np.asarray(accepted, dtype=float) * wa + (np.asarray(checked, dtype=float) - accepted) * wr
    return cusum_increments(x, design.h)


def cusum_increments(x: np.ndarray, h: float, w0: float = 0.0) -> tuple[np.ndarray, list[int]]:
    """The CUSUM with restarts over its increments x, continuing from W = w0 before the first point (0: a fresh
    start; a kept state passes the W it ended on). Between alarms W_t = S_t - min(0, min_{s<=t} S_s) for the
    cumulative sum S since the restart (S starting at w0), computed with numpy over a look-ahead block that doubles
    until it holds the next alarm (no Python loop per point)."""
    n = len(x)
    w = np.zeros(n)
    alarms = []
    start, block = 0, 4096
    while start < n:
        stop = min(n, start + block)
        s = np.cumsum(x[start:stop])
        if start == 0 and w0:
            s += w0
        seg = s - np.minimum(np.minimum.accumulate(s), 0.0)
        hits = np.flatnonzero(seg >= h)
        if not hits.size and stop < n:
            block *= 2  # no alarm yet: look further ahead from the same restart
            continue
        end = hits[0] + 1 if hits.size else len(seg)
        w[start:start + end] = seg[:end]
        if hits.size:
            alarms.append(start + int(hits[0]))
        start += end
        block = 4096
    return w, alarms


def covers_a_day(reference_hours: float | None) -> bool:
    """Whether a reference spanning that many hours from its first point to its last (None: its times unknown)
    holds a whole daily cycle."""
    return reference_hours is not None and reference_hours >= FULL_CYCLE_HOURS


def first_reference(unit: str) -> int:
    """The points of a stream's first reference: REFERENCE_STEPS steps, or REFERENCE_WINDOWS engine windows."""
    return REFERENCE_STEPS if unit == "steps" else REFERENCE_WINDOWS


def checkpoints(first: int, unit: str = "steps") -> list[int]:
    """The reference sizes at which the threshold is calibrated again: 2, 4, ... CHECKPOINT_GROWTH x the first
    (WINDOW_CHECKPOINT_GROWTH x for engine windows)."""
    growth = CHECKPOINT_GROWTH if unit == "steps" else WINDOW_CHECKPOINT_GROWTH
    return [first * 2 ** j for j in range(1, growth.bit_length())]


@dataclass(frozen=True)
class CusumState:
    """Where a self-starting CUSUM stands after a point: the design in force, W there, the latest alarm's index,
    the next checkpoint (a reference size; None once the reference has stopped growing) and the first reference's
    size (which sets the checkpoints)."""

    design: Design
    w: float = 0.0
    last_alarm: int = -EPISODE_GAP - 1
    checkpoint: int | None = None
    first: int = REFERENCE_STEPS

    @staticmethod
    def start(design: Design, self_starting: bool = True) -> CusumState:
        """The watch right after the reference: the first checkpoint ahead where the reference grows."""
        ahead = checkpoints(design.reference, design.unit) if self_starting else []
        return CusumState(design, checkpoint=ahead[0] if ahead else None, first=design.reference)


def run_cusum(accepted: np.ndarray, checked: np.ndarray, base: int, state: CusumState,
          redesign: Callable[[int], Design]) -> tuple[np.ndarray, list[int], CusumState, list[tuple[int, Design]]]:
    """The self-starting CUSUM over points base, base + 1, ... (accepted and checked of those points), from
    `state`: W, the alarm indices, the state after the last point, and the checkpoints taken as (index, design).

    The CUSUM restarts after every alarm. A checkpoint c is taken at the first point t >= c that lies outside any
    alarm episode (no alarm among the EPISODE_GAP points before it): from t on the design is redesign(c'), calibrated
    on the first c' points, c' the largest checkpoint <= t, and W restarts at 0. So every in-control point joins the
    reference (which points come in does not depend on the alarms, so the reference is not selected for calm
    stretches), while a drop that keeps alarming never does: a lasting drop defers the checkpoint for as long as it
    lasts. Cutting the points anywhere and calling this on the pieces in turn gives what one call gives."""
    m = len(accepted)
    w = np.zeros(m)
    alarms: list[int] = []
    taken: list[tuple[int, Design]] = []
    design, carry, last, ahead = state.design, state.w, state.last_alarm, state.checkpoint
    pos = 0  # relative to base
    while True:
        target = None if ahead is None else max(ahead, last + EPISODE_GAP + 1) - base
        stop = m if target is None else min(m, target)
        if stop > pos:
            wa, wr = llr_weights(design.p0, design.p1)
            a = np.asarray(accepted[pos:stop], dtype=float)
            x = a * wa + (np.asarray(checked[pos:stop], dtype=float) - a) * wr
            seg, raw = cusum_increments(x, design.h, carry)
            w[pos:stop] = seg
            carry = 0.0 if raw and raw[-1] == len(x) - 1 else float(seg[-1])
            alarms += [int(base + pos + r) for r in raw]
            if raw:
                last = alarms[-1]
            pos = stop
            continue  # an alarm may have moved the checkpoint on
        if target is None or pos < target:
            break
        grown = [c for c in checkpoints(state.first, design.unit) if c <= base + pos]
        design = redesign(grown[-1])
        taken.append((int(base + pos), design))
        carry = 0.0
        later = [c for c in checkpoints(state.first, design.unit) if c > base + pos]
        ahead = later[0] if later else None
    return w, alarms, CusumState(design, carry, last, ahead, state.first), taken


def change_point(accepted: np.ndarray, checked: np.ndarray, p0: float, start: int, end: int,
                 design_effect: float = 1.0) -> tuple[int, int, int]:
    """Maximum-likelihood start of a drop from p0 among points start..end-1, and its likely range.

    For each candidate tau the points tau..end-1 are taken to have acceptance p = A/N (their own, capped below
    p0), and the profile log-likelihood ratio l(tau) = A ln(p/p0) + (N - A) ln((1-p)/(1-p0)) against "no change"
    is maximised. The likely range is every tau with l(tau) within CHANGE_RANGE_DROP * design_effect of the
    maximum (a quasi-likelihood: correlation within requests flattens the likelihood by the design effect).
    """
    a = np.asarray(accepted[start:end], dtype=float)
    n = np.asarray(checked[start:end], dtype=float)
    if not len(a):
        return start, start, start
    suffix_a = np.cumsum(a[::-1])[::-1]
    suffix_n = np.cumsum(n[::-1])[::-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.minimum(np.where(suffix_n > 0, suffix_a / suffix_n, p0), p0)
        ll = (np.where(suffix_a > 0, suffix_a * np.log(p / p0), 0.0)
              + np.where(suffix_n > suffix_a, (suffix_n - suffix_a) * np.log((1 - p) / (1 - p0)), 0.0))
    ll = np.nan_to_num(ll, nan=0.0)
    best = int(np.argmax(ll))
    likely = np.flatnonzero(ll >= ll[best] - CHANGE_RANGE_DROP * max(design_effect, 1.0))
    return start + best, start + int(likely[0]), start + int(likely[-1])


def detect(accepted: np.ndarray, checked: np.ndarray, design: Design,
           reference_steps: int = REFERENCE_STEPS,
           redesign: Callable[[int], Design] | None = None
           ) -> tuple[np.ndarray, list[Alarm], list[tuple[int, Design]]]:
    """Run the CUSUM after the reference window; indices are positions in the whole stream. With redesign (the
    design calibrated on the first c points, e.g. redesigner's) the reference grows at the checkpoints (watch);
    without, the first design watches the whole stream. An alarm within EPISODE_GAP points of the previous alarm
    continues that episode. Each episode's change is dated by maximum likelihood over the points since the previous
    episode (or the reference) up to its first alarm, against the p0 of the design in force. Returns W, the
    episodes and every design in force as (its first point, design): the first, then each checkpoint's."""
    start = min(reference_steps, len(accepted))
    state = CusumState.start(design, redesign is not None)
    w, raw, _, taken = run_cusum(accepted[start:], checked[start:], start, state, redesign or (lambda c: design))
    episodes: list[list[int]] = []  # [first alarm, last alarm, count]
    for alarm in raw:
        if episodes and alarm - episodes[-1][1] <= EPISODE_GAP:
            episodes[-1][1] = alarm
            episodes[-1][2] += 1
        else:
            episodes.append([alarm, alarm, 1])
    alarms = []
    since = start
    for first, last, count in episodes:
        # a checkpoint lies outside every episode, so one design holds through each
        used = next((d for t, d in reversed(taken) if t <= first), design)
        # dated from the points up to the first alarm: fixed from then on, so a watcher sees one episode
        change, lo, hi = change_point(accepted, checked, used.p0, since, first + 1, used.design_effect)
        a, c = accepted[change:last + 1], checked[change:last + 1]
        alarms.append(Alarm(change, first, last, count, used.p0, float(np.sum(a) / max(np.sum(c), 1)), lo, hi,
                            used))
        since = last + 1
    return np.concatenate([np.zeros(start), w]), alarms, [(start, design), *taken]


@dataclass(frozen=True)
class Cells:
    """One side of a template change: per-cluster, per-hour sums. cluster: a key per cell (a request id, a block of
    engine windows), the same on both sides where a cluster spans the change; hour_us: the start of the cell's hour
    (microseconds since the epoch, UTC); first_us, last_us: the cell's first and last point."""

    cluster: np.ndarray
    hour_us: np.ndarray
    accepted: np.ndarray
    checked: np.ndarray
    first_us: np.ndarray
    last_us: np.ndarray

    def take(self, keep: np.ndarray) -> Cells:
        return Cells(*(getattr(self, f)[keep] for f in ("cluster", "hour_us", "accepted", "checked", "first_us",
                                                        "last_us")))

    def interval(self) -> stats.Interval:
        """The side's own interval, its cells summed per cluster."""
        _, inverse = np.unique(self.cluster, return_inverse=True)
        return stats.cluster_robust_interval(np.bincount(inverse, weights=self.accepted),
                                             np.bincount(inverse, weights=self.checked))


HOUR_US = 3_600_000_000

# The hours a verdict rests on must hold at least this share of each side's checked positions: below it the
# comparison would speak of a slice of the day, not of the templates.
MATCH_SHARE = 0.2

DIFFERENT_HOURS = "different hours"
ONE_HOUR = "one matched hour"  # strata as the observations (compare's by_stratum), and only one of them


@dataclass(frozen=True)
class Comparison:
    """Acceptance before and after a template change: each side's own cluster-robust interval, and the test on
    matched hours. matching: "same hours" (the sides served side by side, compared hour by hour), "same hours of
    day" (compared on the clock hours both cover, other days' data matched to them) or "different hours" (too
    little overlap to match: no test). difference: after minus before on the matched hours, se its standard error,
    dof the t quantile's degrees of freedom; hours: the matched strata; share_before, share_after: the share of each
    side's checked positions in them."""

    before: stats.Interval
    after: stats.Interval
    z: float
    verdict: str  # "hurt", "helped", "no detectable change", DIFFERENT_HOURS or ONE_HOUR
    critical: float = 2.576  # the |z| beyond which the verdict is hurt or helped
    matching: str = "same hours of day"
    difference: float = math.nan
    se: float = math.nan
    dof: float = math.nan
    hours: int = 0
    share_before: float = 0.0
    share_after: float = 0.0


def compare(before: Cells, after: Cells, by_stratum: bool = False) -> Comparison:
    """Two-sample test of per-token acceptance on matched hours (docs/math.md, "Template changes").

    Acceptance follows the clock where the mix of requests does, so before and after are compared within strata of
    time both cover: the hour itself where the two sides ran side by side in the hours holding at least MATCH_SHARE
    of each, else the hour of day (UTC), leaving out an hour where one side ended as the other began. Each stratum's
    difference of ratios is weighted by its share of both sides' checked positions; the variance sums each
    cluster's squared linearised residual (a cluster on both sides counted once), divided by one minus its share
    of its stratum's side (CR2-style), and Satterthwaite's degrees of freedom are those of that sum. Where the
    strata hold less than MATCH_SHARE of either side, the verdict is DIFFERENT_HOURS.

    by_stratum: the strata's differences are the independent observations instead of the clusters, for cells
    whose clusters share noise (blocks of engine windows, which long requests span): the variance is the spread of
    the strata's weighted differences about the estimate, H / (H - 1) sum w_h^2 (d_h - d)^2 over H strata, with
    H - 1 degrees of freedom (ONE_HOUR where H is 1). It holds wherever the hours are independent of each other and
    each hour's difference has mean zero when nothing changed, which matching gives; it asks nothing of the cells
    within an hour."""
    b_iv, a_iv = before.interval(), after.interval()
    strata = _strata(before, after)
    if strata is None:
        return Comparison(b_iv, a_iv, math.nan, DIFFERENT_HOURS, math.nan, DIFFERENT_HOURS)
    matching, kb, ka, share_b, share_a = strata
    keys = np.intersect1d(kb, ka)
    sb, sa = np.isin(kb, keys), np.isin(ka, keys)
    b, a, kb, ka = before.take(sb), after.take(sa), kb[sb], ka[sa]
    ib, ia = np.searchsorted(keys, kb), np.searchsorted(keys, ka)
    nb, na = np.bincount(ib, b.checked, len(keys)), np.bincount(ia, a.checked, len(keys))
    rb, ra = np.bincount(ib, b.accepted, len(keys)) / nb, np.bincount(ia, a.accepted, len(keys)) / na
    w = (nb + na) / (nb.sum() + na.sum())
    after_minus = float(np.sum(w * (ra - rb)))
    if by_stratum:
        if len(keys) < 2:
            return Comparison(b_iv, a_iv, math.nan, ONE_HOUR, math.nan, matching, after_minus, hours=1,
                              share_before=share_b, share_after=share_a)
        var = len(keys) / (len(keys) - 1) * float(np.sum(w ** 2 * (ra - rb - after_minus) ** 2))
        return _verdict(b_iv, a_iv, matching, after_minus, var, len(keys) - 1.0, len(keys), share_b, share_a)
    # each cell's contribution to the linearised estimate, and its leverage: its share of its stratum's side, by
    # which a residual about that side's own ratio falls short (a stratum of six engine-window blocks: by a sixth)
    resid = np.concatenate([w[ia] * (a.accepted - ra[ia] * a.checked) / na[ia],
                            -w[ib] * (b.accepted - rb[ib] * b.checked) / nb[ib]])
    clusters, inverse = np.unique(np.concatenate([a.cluster, b.cluster]).astype(str), return_inverse=True)
    e = np.bincount(inverse, resid, len(clusters))
    # a cluster's share of each stratum's side it is in (however finely its cells cut it), those shares averaged
    # by the weight each has in the estimate
    side = np.concatenate([np.zeros(len(ia), dtype=np.int64), np.ones(len(ib), dtype=np.int64)])
    stratum = np.concatenate([ia, ib])
    part, where = np.unique(np.stack([inverse, side, stratum]), axis=1, return_inverse=True)
    share = np.bincount(where.reshape(-1), np.concatenate([a.checked / na[ia], b.checked / nb[ib]]), part.shape[1])
    pull = share * w[part[2]]
    lev = np.minimum(np.bincount(part[0], pull * share, len(clusters)) / np.bincount(part[0], pull, len(clusters)),
                     0.5)
    u = e ** 2 / (1 - lev)
    var = float(u.sum())
    dof = max(1.0, min(var ** 2 / float(np.sum(u ** 2)), len(clusters) - 1.0)) if var > 0 else 1.0
    return _verdict(b_iv, a_iv, matching, after_minus, var, dof, len(keys), share_b, share_a)


def _verdict(before: stats.Interval, after: stats.Interval, matching: str, after_minus: float, var: float,
             dof: float, hours: int, share_b: float, share_a: float) -> Comparison:
    se = math.sqrt(var)
    z = after_minus / se if se > 0 else 0.0
    critical = stats.t_quantile(CHANGE_CONFIDENCE, dof)
    verdict = "hurt" if z < -critical else "helped" if z > critical else "no detectable change"
    return Comparison(before, after, z, verdict, critical, matching, after_minus, se, dof, hours, share_b, share_a)


def _strata(before: Cells, after: Cells) -> tuple[str, np.ndarray, np.ndarray, float, float] | None:
    """The matching and each cell's stratum on both sides, with each side's share of checked positions in the
    strata both hold; None where those shares fall below MATCH_SHARE."""
    hours = np.intersect1d(before.hour_us, after.hour_us)
    together = np.array([_side_by_side(before, after, h) for h in hours], dtype=bool)
    shared, cut = hours[together], hours[~together]
    share_b, share_a = _share(before, np.isin(before.hour_us, shared)), _share(after, np.isin(after.hour_us, shared))
    if min(share_b, share_a) >= MATCH_SHARE:
        return "same hours", before.hour_us, after.hour_us, share_b, share_a
    # by the clock: an hour where one side ended as the other began compares early minutes with late ones
    kb = np.where(np.isin(before.hour_us, cut), -1, before.hour_us // HOUR_US % 24)
    ka = np.where(np.isin(after.hour_us, cut), -2, after.hour_us // HOUR_US % 24)
    both = np.intersect1d(kb, ka)
    share_b, share_a = _share(before, np.isin(kb, both)), _share(after, np.isin(ka, both))
    if min(share_b, share_a) < MATCH_SHARE:
        return None
    return "same hours of day", kb, ka, share_b, share_a


def _side_by_side(before: Cells, after: Cells, hour: int) -> bool:
    """Whether the two sides ran at the same time within an hour: their spans there overlap by at least half the
    shorter one (a switch, with a few requests still running across it, overlaps by far less)."""
    mb, ma = before.hour_us == hour, after.hour_us == hour
    b0, b1 = before.first_us[mb].min(), before.last_us[mb].max()
    a0, a1 = after.first_us[ma].min(), after.last_us[ma].max()
    overlap = min(b1, a1) - max(b0, a0)
    return bool(overlap > 0 and overlap >= 0.5 * min(b1 - b0, a1 - a0))


def _share(side: Cells, mask: np.ndarray) -> float:
    total = float(side.checked.sum())
    return float(side.checked[mask].sum()) / total if total > 0 else 0.0
