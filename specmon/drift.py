"""Drift: a one-sided Bernoulli CUSUM on acceptance with a calibrated false-alarm rate, change dating by maximum
likelihood, and before/after tests of template changes (docs/math.md, "Drift"; docs/drift.md).

A stream is a sequence of points in time order, each a batch of checked positions of which some were accepted:
a verification step of a step log, or a window of an engine log or of Prometheus counters. Every point belongs to a
cluster (a request; for engine data, the window itself) whose points share their acceptance.

The CUSUM adds, per point, s*ln(p1/p0) + f*ln((1-p1)/(1-p0)) for s accepted and f rejected checked positions, and
alarms when the sum reaches h. Acceptance is correlated within a request, so a threshold computed for independent
tokens would alarm far too often; h is instead calibrated on simulated in-control streams built from the
reference window (calibrate): its clusters resampled for their sizes, a cluster acceptance drawn from a beta
distribution with the reference's mean and spread between clusters, and points drawn to match it (steps from the
reference's own steps, tilted; windows binomial), until the simulated expected number of points between false
alarms (ARL0, counting the re-alarms after each restart) matches the one asked for. Pure numpy; no I/O.
"""
from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specmon import stats

DEFAULT_ARL0_STEPS = 20_000  # expected points between false alarms when nothing changed
DEFAULT_DELTA = 0.10  # the drop to watch for when break-even is unknown or already above the reference
# The first points of a stream set p0 and are resampled for the threshold. The false-alarm rate depends steeply on
# how well they picture the in-control process, so more is better, at the price of watching later; docs/drift.md
# has what 2,000 steps (about 100 requests of 20 steps) give.
REFERENCE_STEPS = 2_000
# An engine window (a log interval or a scrape) already batches many drafts: 30 of them (five minutes of vLLM's
# 10-second log lines) make the reference of a run of engine windows, so a rollout soon after a start is watched.
REFERENCE_WINDOWS = 30
EPISODE_GAP = 1_000  # alarms within this many points of the previous one continue its episode
CHANGE_CONFIDENCE = 0.99  # template change verdicts at the two-sided 1% level
# A change time whose profile log-likelihood lies within this many (design-effect-scaled) units of the maximum is
# in the change's likely range (about a 95% set; the study in docs/drift.md measures how often it holds the truth).
CHANGE_RANGE_DROP = 3.0
CALIBRATION_GROUPS = 40  # x 5 streams
# Raised whenever calibrate's method changes, so thresholds kept in a database (specmon.drift_state) are calibrated
# again rather than reused.
CALIBRATION_VERSION = 1


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
    change_lo: int = 0  # the change's likely range of start points (CHANGE_RANGE_DROP)
    change_hi: int = 0


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


def _cluster_sums(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _, inverse = np.unique(clusters, return_inverse=True)
    return (np.bincount(inverse, weights=np.asarray(accepted, dtype=float)),
            np.bincount(inverse, weights=np.asarray(checked, dtype=float)))


def target_p1(p0: float, break_even: float | None, delta: float = DEFAULT_DELTA) -> float:
    """p1, the acceptance the CUSUM watches for: break-even alpha* when it lies below p0 by more than 0.02, else
    p0 - delta."""
    p1 = break_even if break_even is not None and break_even < p0 - 0.02 else p0 - delta
    return float(np.clip(p1, 0.005, p0 - 0.005))


def calibrate(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, p0: float, p1: float,
              arl0_steps: int = DEFAULT_ARL0_STEPS, groups: int = CALIBRATION_GROUPS,
              streams_per_group: int = 5, seed: int = 0) -> float:
    """The threshold h at which the CUSUM from p0 to p1 alarms once per arl0_steps in-control points, averaged
    over the in-control processes the reference window leaves plausible (for engine windows each window is its
    own cluster).

    The in-control process is known only through the reference's G clusters, and the false-alarm rate depends
    steeply on its acceptance and on how much that varies over a stretch of points. So each group is one
    plausible process: G clusters drawn with replacement from the reference (the bootstrap's picture of the
    sampling error), whose acceptance p and spread between clusters set a beta distribution of cluster acceptance
    (by moments, _beta_rates). Its streams_per_group streams are clusters drawn from the group (their sizes: request
    lengths, window sizes), each given an acceptance r from that beta distribution and points made to match r:
    an engine window gets accepted ~ Binomial(checked, r), a request gets steps drawn from the group's own steps
    exponentially tilted to acceptance r (_tilted_steps). Resampling the reference's clusters as they are, a
    hundred of them, would let the rare poor request (or window) that sets off a false alarm once in thousands of
    points be missing or over-represented by chance, and the threshold would follow that luck; the smoothing gives
    every group the tail its spread implies. The streams are watched with the reference's own p0 and p1. A group's
    alarm rate is (n - 1) / (sum of its n run lengths to the first alarm), unbiased for a geometric run length;
    h is bisected until the groups' mean rate is 1 / arl0_steps (the rate over many deployments). Streams run to
    5 x ARL0 (under 1% are cut short, which errs on the quiet side).
    """
    rng = np.random.default_rng(seed)
    a = np.asarray(accepted, dtype=float)
    n = np.asarray(checked, dtype=float)
    _, inverse = np.unique(clusters, return_inverse=True)
    n_clusters = int(inverse.max()) + 1
    wa, wr = llr_weights(p0, p1)
    single = n_clusters == len(a)  # engine windows: every point its own cluster
    w = []
    for _ in range(groups):
        pool = rng.integers(0, n_clusters, n_clusters)
        if single:
            idx = rng.choice(pool, (streams_per_group, 5 * arl0_steps))
            x = _smoothed_windows(rng, a, n, idx, pool, wa, wr)
        else:
            x = _tilted_steps(rng, a, n, inverse, pool, streams_per_group, 5 * arl0_steps, wa, wr)
        w.append(np.cumsum(x, axis=1, dtype=np.float64))

    return _bisect(w, arl0_steps)


def _bisect(s: list[np.ndarray], arl0_steps: int) -> float:
    """h at which the groups' mean alarm rate is 1 / arl0_steps, for a CUSUM restarted after every alarm as in use;
    s holds each group's cumulative increments, one stream a row.

    A group's rate from a fresh start is (n - 1) / (sum of its n run lengths to the first alarm), unbiased for a
    geometric run length; h is bisected on the mean of those. But after an alarm the points that follow are often
    the rest of the same poor request, so the next alarm comes sooner than the first did, and the rate a
    deployment sees is that of the run lengths after an alarm. Measuring those costs a pass per threshold, so at
    the bisected h and at 1.15 and 1.3 times it the fresh-start rates are multiplied by the ratio of the restarted
    to the fresh-start rate, pooled over all streams (_restart_factor), and h is read off a line through log rate
    against h (an in-control CUSUM's alarm rate falls exponentially in h)."""
    w = [g - np.minimum(np.minimum.accumulate(g, axis=1), 0.0) for g in s]

    def first_rate(h: float) -> float:
        return float(np.mean([(len(g) - 1) / first_alarm_steps(g, h).sum() for g in w]))

    lo, hi = 0.1, 1.0
    while first_rate(hi) > 1.0 / arl0_steps and hi < 1e4:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        if first_rate(mid) > 1.0 / arl0_steps:
            lo = mid
        else:
            hi = mid
    hs = np.array([hi, 1.15 * hi, 1.3 * hi])
    rates = np.array([first_rate(h) * _restart_factor(s, w, h) for h in hs])
    if (rates <= 0).any():
        return float(hi)
    slope, intercept = np.polyfit(hs, np.log(rates), 1)
    return float(hi) if slope >= 0 else float(max(hi, (math.log(1.0 / arl0_steps) - intercept) / slope))


def _restart_factor(s: list[np.ndarray], w: list[np.ndarray], h: float) -> float:
    """The alarm rate after an alarm over the rate from a fresh start, both pooled over every stream (events over
    points watched): each stream's CUSUM is restarted at its first alarm and watched to its second or its end. 1
    where no stream alarmed twice."""
    first_events = first_points = again_events = again_points = 0.0
    for g, v in zip(s, w, strict=True):
        n = g.shape[1]
        first = first_alarm_steps(v, h)
        alarmed = first < n
        first_events += alarmed.sum()
        first_points += first.sum()
        if not alarmed.any():
            continue
        g, first = g[alarmed], first[alarmed]
        at = g[np.arange(len(g)), first - 1]
        restarted = np.where(np.arange(n)[None, :] < first[:, None], at[:, None], g)
        again = restarted - np.minimum.accumulate(restarted, axis=1) >= h
        second = np.where(again.any(axis=1), again.argmax(axis=1) + 1, n)
        again_events += (second < n).sum()
        again_points += (second - first).sum()
    if again_events == 0 or first_events == 0:
        return 1.0
    return (again_events / again_points) / (first_events / first_points)


def _beta_rates(rng: np.random.Generator, pa: np.ndarray, pn: np.ndarray, weights: np.ndarray,
                size: int | tuple) -> np.ndarray:
    """Cluster acceptances r ~ Beta for a group of clusters with accepted pa of checked pn, fitted by moments to
    the clusters' own acceptances pa / pn weighted as the clusters are drawn (weights), less their binomial part
    (no spread left: r is the mean). Assumes a cluster's checked positions are Bernoulli(r) given r, which holds for
    a step log (each checked position is a trial; drafting stops at the first rejection) and for windows.

    The weights matter: a request is drawn per step, and a request with higher r checks more positions per step,
    so its acceptance must be weighted by its steps, not its checked positions (the checked-weighted mean is the
    per-token alpha, which exceeds the per-step mean of r when requests differ); a window keeps its checked count
    whatever its r, so windows are weighted by checked positions."""
    rate = pa / np.maximum(pn, 1)
    mean = float(np.clip(np.average(rate, weights=weights), 0.005, 0.995))
    between = (np.average((rate - mean) ** 2, weights=weights)
               - np.average(mean * (1 - mean) / np.maximum(pn, 1), weights=weights))
    m = mean * (1 - mean) / between - 1.0 if between > 0 else math.inf
    return np.full(size, mean) if not math.isfinite(m) or m <= 0 else rng.beta(mean * m, (1 - mean) * m, size)


def _smoothed_windows(rng: np.random.Generator, a: np.ndarray, n: np.ndarray, idx: np.ndarray, pool: np.ndarray,
                      wa: float, wr: float) -> np.ndarray:
    """Increments of resampled engine windows, smoothed: each drawn window keeps its checked count n and gets
    accepted ~ Binomial(n, r), r from _beta_rates of the group."""
    checked = n[idx]
    accepted = rng.binomial(checked.astype(np.int64), _beta_rates(rng, a[pool], n[pool], n[pool], idx.shape))
    return (accepted * wa + (checked - accepted) * wr).astype(np.float32)


TILT_GRID = np.linspace(-8.0, 8.0, 161)  # exponential tilts of a group's step mix, per accepted position


def _tilted_steps(rng: np.random.Generator, a: np.ndarray, n: np.ndarray, inverse: np.ndarray, pool: np.ndarray,
                  n_streams: int, n_points: int, wa: float, wr: float) -> np.ndarray:
    """Increments of (n_streams, n_points) steps of requests drawn from the group pool (positions among the
    reference's requests, inverse the request of each step), laid end to end. A drawn request keeps its length in
    steps and gets an acceptance r from _beta_rates; its steps are drawn independently from the group's steps
    (their (accepted, checked) kinds, as often as the group has them) tilted by exp(theta * accepted), theta (on
    TILT_GRID) the tilt whose acceptance is nearest r. So a request's steps keep the shape of real steps (the
    per-position rates of the logs) at its own acceptance, and no single reference request is replayed."""
    kinds, kind = np.unique(np.stack([a, n], axis=1), axis=0, return_inverse=True)
    kind = kind.ravel()
    n_requests = int(inverse.max()) + 1
    steps = np.bincount(inverse, minlength=n_requests)
    per_request = np.zeros((n_requests, len(kinds)))
    np.add.at(per_request, (inverse, kind), 1.0)
    freq = np.bincount(pool, minlength=n_requests) @ per_request  # the group's steps of each kind
    weight = freq * np.exp(np.outer(TILT_GRID, kinds[:, 0] - kinds[:, 0].max()))
    tilt_rate = (weight @ kinds[:, 0]) / (weight @ kinds[:, 1])  # increasing in theta
    cdf = np.cumsum(weight / weight.sum(axis=1, keepdims=True), axis=1)
    x_kind = (kinds[:, 0] * wa + (kinds[:, 1] - kinds[:, 0]) * wr).astype(np.float32)
    pa = np.bincount(inverse, weights=a, minlength=n_requests)[pool]
    pn = np.bincount(inverse, weights=n, minlength=n_requests)[pool]
    draws = int(n_points / steps[pool].mean() * 1.5) + 16
    out = np.empty((n_streams, n_points), dtype=np.float32)
    for i in range(n_streams):
        filled = 0
        while filled < n_points:
            lengths = steps[pool[rng.integers(0, len(pool), draws)]]
            grid = np.searchsorted(tilt_rate, _beta_rates(rng, pa, pn, steps[pool], draws)).clip(0, len(TILT_GRID) - 1)
            row = np.repeat(grid, lengths)[:n_points - filled]
            u = rng.random(len(row))
            picked = (u[:, None] > cdf[row]).sum(axis=1).clip(0, len(kinds) - 1)
            out[i, filled:filled + len(row)] = x_kind[picked]
            filled += len(row)
    return out


def first_alarm_steps(w: np.ndarray, h: float) -> np.ndarray:
    """Points to the first W >= h in each row (the row length where none came)."""
    hit = w >= h
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, w.shape[1])


_CALIBRATIONS: OrderedDict[bytes, float] = OrderedDict()  # the watcher re-analyses a run after every batch


def _calibrate_cached(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, p0: float, p1: float,
                      arl0_steps: int) -> float:
    key = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in (accepted, checked, clusters))
                         + repr((p0, p1, arl0_steps)).encode()).digest()
    if key not in _CALIBRATIONS:
        _CALIBRATIONS[key] = calibrate(accepted, checked, clusters, p0, p1, arl0_steps)
        if len(_CALIBRATIONS) > 64:
            _CALIBRATIONS.popitem(last=False)
    return _CALIBRATIONS[key]


def design_for(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, k: int,
               break_even: float | None, arl0_steps: int = DEFAULT_ARL0_STEPS,
               reference_steps: int = REFERENCE_STEPS, delta: float = DEFAULT_DELTA,
               unit: str = "steps", threshold: Callable[..., float] | None = None) -> Design | None:
    """Calibrate a detector on the first reference_steps points of a stream (clusters: the cluster of each of
    those points, or of every point). None if the reference has no checks. threshold(accepted, checked, clusters,
    p0, p1, arl0_steps) gives h for the reference (default: calibrate, remembered in this process; a caller that
    keeps thresholds elsewhere passes its own).

    p0 is the reference's per-token acceptance; p1 is break-even alpha* when it lies below p0 by more than 0.02,
    else p0 - delta.
    """
    ref = slice(0, min(reference_steps, len(accepted)))
    a = np.asarray(accepted[ref], dtype=float)
    n = np.asarray(checked[ref], dtype=float)
    if n.sum() == 0:
        return None
    p0 = float(np.clip(a.sum() / n.sum(), 0.01, 0.99))
    p1 = target_p1(p0, break_even, delta)
    ref_clusters = np.asarray(clusters)[ref]
    h = (threshold or _calibrate_cached)(a, n, ref_clusters, p0, p1, arl0_steps)
    per_a, per_n = _cluster_sums(a, n, ref_clusters)
    iv = stats.cluster_robust_interval(per_a, per_n)
    return Design(p0, p1, float(h), arl0_steps, float(iv.design_effect), int(k), len(per_n), unit)


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
           reference_steps: int = REFERENCE_STEPS) -> tuple[np.ndarray, list[Alarm]]:
    """Run the CUSUM after the reference window; indices are positions in the whole stream. An alarm within
    EPISODE_GAP points of the previous alarm continues that episode. Each episode's change is dated by maximum
    likelihood over the points since the previous episode (or the reference) up to its first alarm."""
    start = min(reference_steps, len(accepted))
    w, raw = cusum(accepted[start:], checked[start:], design)
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
        first, last = start + first, start + last
        # dated from the points up to the first alarm: fixed from then on, so a watcher sees one episode
        change, lo, hi = change_point(accepted, checked, design.p0, since, first + 1, design.design_effect)
        a, c = accepted[change:last + 1], checked[change:last + 1]
        alarms.append(Alarm(change, first, last, count, design.p0, float(np.sum(a) / max(np.sum(c), 1)), lo, hi))
        since = last + 1
    return np.concatenate([np.zeros(start), w]), alarms


@dataclass(frozen=True)
class Comparison:
    """Acceptance before and after a template change, with cluster-robust intervals."""

    before: stats.Interval
    after: stats.Interval
    z: float
    verdict: str  # "hurt", "helped" or "no detectable change"
    critical: float = 2.576  # the |z| beyond which the verdict is hurt or helped


def compare(before_a: np.ndarray, before_n: np.ndarray, after_a: np.ndarray, after_n: np.ndarray) -> Comparison:
    """Two-sample test of per-token acceptance; arguments are per-cluster sums (requests or windows as clusters).

    z = (after - before) / sqrt(v_before + v_after) with each side's cluster-robust (CR2) variance, against the
    t quantile at the smaller side's degrees of freedom (conservative where one side has few clusters).
    """
    b = stats.cluster_robust_interval(before_a, before_n)
    a = stats.cluster_robust_interval(after_a, after_n)
    se = math.sqrt(_variance(b) + _variance(a))
    z = (a.estimate - b.estimate) / se if se > 0 else 0.0
    critical = stats.t_quantile(CHANGE_CONFIDENCE, min(b.dof, a.dof))
    verdict = "hurt" if z < -critical else "helped" if z > critical else "no detectable change"
    return Comparison(b, a, z, verdict, critical)


def _variance(iv: stats.Interval) -> float:
    """Variance of a proportion at its effective sample size (what the cluster-robust interval used)."""
    if iv.n_eff <= 0 or math.isnan(iv.estimate):
        return math.inf
    return iv.estimate * (1 - iv.estimate) / iv.n_eff
