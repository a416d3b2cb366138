"""Drift: a one-sided Bernoulli CUSUM on acceptance with a calibrated false-alarm rate, change dating by maximum
likelihood, and before/after tests of template changes (docs/math.md, "Drift"; docs/drift.md).

A stream is a sequence of points in time order, each a batch of checked positions of which some were accepted:
a verification step of a step log, or a window of an engine log or of Prometheus counters. Every point belongs to a
cluster (a request; for engine data, the window itself) whose points share their acceptance.

The CUSUM adds, per point, s*ln(p1/p0) + f*ln((1-p1)/(1-p0)) for s accepted and f rejected checked positions, and
alarms when the sum reaches h. Acceptance is correlated within a request, so a threshold computed for independent
tokens would alarm far too often; h is instead calibrated on streams built by resampling the reference window's own
clusters (with their points, in their order), until the simulated expected number of points between false alarms
(ARL0) matches the one asked for. The resampled streams have the reference's per-token acceptance, its spread between
requests and its request lengths, whatever their distribution. Pure numpy; no I/O.
"""
from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
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


def cusum_increments(x: np.ndarray, h: float) -> tuple[np.ndarray, list[int]]:
    """The CUSUM with restarts over its increments x. Between alarms W_t = S_t - min(0, min_{s<=t} S_s) for the
    cumulative sum S since the restart, computed with numpy over a look-ahead block that doubles until it holds
    the next alarm (no Python loop per point)."""
    n = len(x)
    w = np.zeros(n)
    alarms = []
    start, block = 0, 4096
    while start < n:
        stop = min(n, start + block)
        s = np.cumsum(x[start:stop])
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


def resampled_indices(rng: np.random.Generator, clusters: np.ndarray, n_streams: int, n_points: int,
                      pool: np.ndarray | None = None) -> np.ndarray:
    """(n_streams, n_points) indices into the reference points: whole clusters drawn with replacement (from pool,
    positions in the sorted list of distinct clusters; default all of them) and laid end to end, each cluster's
    points kept together and in their order (the cluster bootstrap)."""
    order = np.argsort(clusters, kind="stable")
    _, starts, sizes = np.unique(clusters[order], return_index=True, return_counts=True)
    pool = np.arange(len(sizes)) if pool is None else pool
    # enough draws that every stream is filled, with room for an unlucky run of short clusters
    draws = int(n_points / sizes[pool].mean() * 1.5) + 16
    out = np.empty((n_streams, n_points), dtype=np.int64)
    for i in range(n_streams):
        filled = 0
        while filled < n_points:
            pick = pool[rng.integers(0, len(pool), draws)]
            lengths = sizes[pick]
            offsets = np.repeat(starts[pick] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
            idx = order[offsets + np.arange(lengths.sum())]
            take = min(len(idx), n_points - filled)
            out[i, filled:filled + take] = idx[:take]
            filled += take
    return out


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
    own cluster, so windows are resampled one by one).

    The in-control process is known only through the reference's G clusters, and the false-alarm rate depends
    steeply on its acceptance and on how much that varies over a stretch of points: calibrating on the reference
    alone lets a reference that happens to be quiet set a threshold that alarms several times as often as stated
    on the process itself. So each group is one plausible process, G clusters drawn with replacement from the
    reference (the bootstrap's picture of the sampling error), and its streams_per_group streams are clusters drawn
    from that group, watched with the reference's own p0 and p1. A group's alarm rate is estimated as
    (n - 1) / (sum of its n run lengths to the first alarm), unbiased for a geometric run length; h is bisected
    until the groups' mean rate is 1 / arl0_steps (the rate over many deployments). Streams run to 5 x ARL0
    (under 1% are cut short, which errs on the quiet side).
    """
    rng = np.random.default_rng(seed)
    a = np.asarray(accepted, dtype=float)
    n = np.asarray(checked, dtype=float)
    n_clusters = len(np.unique(clusters))
    wa, wr = llr_weights(p0, p1)
    x_ref = (a * wa + (n - a) * wr).astype(np.float32)
    single = n_clusters == len(a)  # engine windows: every point its own cluster
    w = []
    for _ in range(groups):
        pool = rng.integers(0, n_clusters, n_clusters)
        idx = resampled_indices(rng, clusters, streams_per_group, 5 * arl0_steps, pool)
        if single:
            x = _smoothed_windows(rng, a, n, idx, pool, wa, wr)
        else:
            x = x_ref[idx]
        s = np.cumsum(x, axis=1, dtype=np.float32)
        w.append(s - np.minimum(np.minimum.accumulate(s, axis=1), np.float32(0.0)))

    return _bisect(w, arl0_steps)


def _bisect(w: list[np.ndarray], arl0_steps: int) -> float:
    """h at which the groups' mean alarm rate, (n - 1) / (sum of run lengths) per group, is 1 / arl0_steps."""
    def rate(h: float) -> float:
        return float(np.mean([(len(g) - 1) / first_alarm_steps(g, h).sum() for g in w]))

    lo, hi = 0.1, 1.0
    while rate(hi) > 1.0 / arl0_steps and hi < 1e4:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        if rate(mid) > 1.0 / arl0_steps:
            lo = mid
        else:
            hi = mid
    return hi


def _smoothed_windows(rng: np.random.Generator, a: np.ndarray, n: np.ndarray, idx: np.ndarray, pool: np.ndarray,
                      wa: float, wr: float) -> np.ndarray:
    """Increments of resampled engine windows, smoothed: each drawn window keeps its checked count n and gets
    accepted ~ Binomial(n, r) with r ~ Beta around the group's acceptance, with the spread between its windows (by
    moments). A few dozen windows never show the rare poor window that sets off a false alarm once in thousands;
    resampled as they are, they would say that none ever comes (and set h as low as it goes)."""
    pa, pn = a[pool], n[pool]
    p = float(np.clip(pa.sum() / max(pn.sum(), 1.0), 0.005, 0.995))
    between = np.average((pa / np.maximum(pn, 1) - p) ** 2, weights=pn) - p * (1 - p) * len(pn) / pn.sum()
    m = p * (1 - p) / between - 1.0 if between > 0 else math.inf
    checked = n[idx]
    rate = np.full(idx.shape, p) if not math.isfinite(m) or m <= 0 else rng.beta(p * m, (1 - p) * m, idx.shape)
    accepted = rng.binomial(checked.astype(np.int64), rate)
    return (accepted * wa + (checked - accepted) * wr).astype(np.float32)


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
               unit: str = "steps") -> Design | None:
    """Calibrate a detector on the first reference_steps points of a stream (clusters: the cluster of each of
    those points, or of every point). None if the reference has no checks.

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
    h = _calibrate_cached(a, n, ref_clusters, p0, p1, arl0_steps)
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
