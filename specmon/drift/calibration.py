"""The drift detector's threshold, calibrated by simulation to a stated false-alarm rate (docs/math.md, "Drift").

Acceptance is correlated within a request, so a threshold computed for independent tokens would alarm far too
often; h is instead calibrated on simulated in-control streams built from the reference window (calibrate): its
clusters resampled for their sizes, a cluster acceptance drawn from the distribution of cluster acceptance the
reference implies (nonparametric maximum likelihood, smoothed), and steps drawn from the reference's per-position
profile shifted to that acceptance; engine windows as whole blocks of the reference's windows, by hour of day. h is
where the simulated number of points per false alarm of the restarted CUSUM (every re-alarm counted) is the one asked
for. Pure numpy; no I/O.
"""
from __future__ import annotations

import copy
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from specmon.core import stats, window_grid
from specmon.core.settings import DEFAULT_ARL0_STEPS
from specmon.drift.detector import EPISODE_GAP, FLOOR_CONFIDENCE, REFERENCE_STEPS, Design, covers_a_day, llr_weights

DEFAULT_DELTA = 0.10  # the drop to watch for when break-even is unknown or already above the reference

CALIBRATION_GROUPS = 40  # x 5 streams

TAIL_SHARE = 0.2  # the longest fifth of a group's requests fit the tail of request lengths (RequestLengths)

TAIL_MIN = 10  # with fewer requests above the threshold, an exponential tail (xi = 0) is fitted

MIN_BLOCKS = 12  # engine windows: the fewest blocks a reference is replayed in as blocks (BlockProcess)

MIN_HOUR_REQUESTS = 10  # step logs: the fewest requests each hour of day must hold to be drawn by hour (StepDay)

MIXING_GRID = 100  # points of the grid of cluster acceptance (Mixing)

MIXING_ITERATIONS = 40  # EM iterations per group, from the whole reference's fit (10 x as many)

# Requests are simulated alike (no spread between them) where the reference's score test for a spread between
# requests (spread_z) is below SPREAD_Z, once the reference holds at least SPREAD_TEST_STEPS steps: on the first
# 2,000 the test misses a one-in-ten kind of hard request at correlation 0.05 in 4% of references, on 4,000 and more
# in none of 160, its least z there 5.1 (docs/drift.md, "Where requests do not differ"), and a spread missed costs
# more false alarms than one simulated where there is none.
SPREAD_Z = 2.0

SPREAD_TEST_STEPS = 2 * REFERENCE_STEPS

# Raised whenever calibrate, or the floor design_for puts under it (least_h), gives another threshold for the same
# input, so thresholds kept in a database (specmon.drift.state) are calibrated again rather than reused.
CALIBRATION_VERSION = 15

# least_h takes the in-control drift at least at MIN_DRIFT_SHARE of the drift at the reference's acceptance, and solves
# h and the span it builds up over in at most FLOOR_ITERATIONS steps.
MIN_DRIFT_SHARE = 0.1
FLOOR_ITERATIONS = 60


def first_seen(clusters: np.ndarray) -> np.ndarray:
    """Each point's cluster as its rank in order of first appearance (0 for the first point's): the calibration
    draws clusters by these indices, so the threshold depends on the points and their order in time, not on the
    names (a request id's hash would order them by name, and move h by a few percent under a renaming)."""
    _, first, inverse = np.unique(clusters, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def cluster_sums(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
              streams_per_group: int = 5, seed: int = 0, hours: np.ndarray | None = None,
              unit: str = "steps") -> float:
    """The threshold h of calibrate_threshold (its arguments), alone."""
    return calibrate_threshold(accepted, checked, clusters, p0, p1, arl0_steps, groups, streams_per_group, seed,
                               hours, unit).h


def calibrate_threshold(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, p0: float, p1: float,
                        arl0_steps: int = DEFAULT_ARL0_STEPS, groups: int = CALIBRATION_GROUPS,
                        streams_per_group: int = 5, seed: int = 0, hours: np.ndarray | None = None,
                        unit: str = "steps") -> Threshold:
    """The threshold h at which the CUSUM from p0 to p1, restarted after every alarm, alarms once per arl0_steps
    in-control points, averaged over the in-control processes the reference window leaves plausible.

    hours, where given, is each point's hour since the epoch (UTC). Engine windows (unit "windows"; clusters: a
    window's block of consecutive windows of one engine) are simulated by BlockProcess, a bootstrap of whole blocks
    by hour of day. What follows is a step log's (clusters: requests).

    The in-control process is known only through the reference's G requests, and the false-alarm rate depends steeply on
    its acceptance and on how much that varies over a stretch of points. So each group is one plausible process: G
    requests drawn with replacement from the reference (the bootstrap's picture of the sampling error). Its
    streams_per_group streams of 5 x arl0_steps points are requests drawn from the group, each given an acceptance r
    from the group's distribution of request acceptance (its nonparametric maximum-likelihood estimate, Mixing): a
    length from the group's lengths, its tail past the longest fifth generalized Pareto with the shape those show
    (RequestLengths), and steps drawn from the group's per-position profile shifted to r (StepProcess).
    Resampling the reference's requests as they are, a hundred of them, would let the rare poor request that
    sets off a false alarm once in thousands of points be missing or over-represented by chance, and the threshold
    follow that luck; drawing r from the estimated distribution instead gives every group the tail its clusters imply.
    The streams are watched with the reference's own p0 and p1, and h is solved for where the groups' mean rate of the
    restarted CUSUM (every alarm, re-alarms included, over the points watched: the figure the stated rate promises) is 1
    / arl0_steps (solve_threshold). A step log's reference of at least SPREAD_TEST_STEPS steps whose spread test
    (spread_z) is below SPREAD_Z has its requests simulated alike instead, each group's at the group's pooled
    acceptance: the fitted distribution never comes out a single point, and the spread it keeps where requests do not
    differ made h too high. The points per alarm episode are counted on the same streams at that h (Threshold).
    Clusters are drawn by their order of first appearance (first_seen), so renaming them leaves h as it is. Where
    the reference spans every hour of the day (hours given), the groups and streams are drawn by hour of day instead
    (StepDay): a daily swing of the request mix is then part of the in-control process the threshold is set for.
    """
    rng = np.random.default_rng(seed)
    a = np.asarray(accepted, dtype=float)
    n = np.asarray(checked, dtype=float)
    inverse = first_seen(np.asarray(clusters))
    if unit != "steps":
        assert hours is not None, "engine windows are calibrated by hour of day"
        blocks = BlockProcess(a, n, inverse, np.asarray(hours))
        return solve_threshold([cumulative_increments(*blocks.draw(rng, blocks.group(rng), streams_per_group,
                                                                   5 * arl0_steps), p0, p1)
                                for _ in range(groups)], arl0_steps)
    n_clusters = int(inverse.max()) + 1
    per_a, per_n = np.bincount(inverse, weights=a), np.bincount(inverse, weights=n)
    alike = len(a) >= SPREAD_TEST_STEPS and request_spread_z(per_a, per_n, np.bincount(inverse)) < SPREAD_Z
    # its EM is the costly part of the set-up: only where used
    mixing = None if alike else Mixing.of_steps(a, n, inverse)
    day = (StepDay.of(inverse, np.asarray(hours), per_a / np.maximum(per_n, 1) if mixing is None
                      else mixing.posterior_means(), max(int(n.max()), 1)) if hours is not None else None)
    if day is not None:
        return solve_threshold([cumulative_increments(*day.draw(rng, day.group(rng, a, n, inverse, mixing),
                                                                streams_per_group, 5 * arl0_steps), p0, p1)
                                for _ in range(groups)], arl0_steps)
    points = []
    for _ in range(groups):
        pool = rng.integers(0, n_clusters, n_clusters)
        counts = np.bincount(pool, minlength=n_clusters)
        rates = Rates.single(float(counts @ per_a) / float(counts @ per_n)) if mixing is None else mixing.fit(counts)
        points.append(StepProcess(a, n, inverse, pool, rates).draw(rng, streams_per_group, 5 * arl0_steps))
    return solve_threshold([cumulative_increments(pa, pn, p0, p1) for pa, pn in points], arl0_steps)


def spread_z(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray) -> float:
    """The spread test of a stream of steps (accepted and checked per step, clusters its request): request_spread_z of
    the requests' sums."""
    _, inverse = np.unique(clusters, return_inverse=True)
    return request_spread_z(np.bincount(inverse, weights=np.asarray(accepted, dtype=float)),
                     np.bincount(inverse, weights=np.asarray(checked, dtype=float)), np.bincount(inverse))


def request_spread_z(accepted: np.ndarray, checked: np.ndarray, steps: np.ndarray) -> float:
    """A score test of a spread of acceptance between requests (a request's accepted of checked positions over its
    steps): z = sum_j t_j / sqrt(2 sum_j (p (1 - p) n_j / s_j)^2), t_j = ((a_j - p n_j)^2 - p (1 - p) n_j) / s_j, p
    the pooled acceptance (Tarone's statistic for extra-binomial variation, each request's term divided by its s_j
    steps). Where every request shares one acceptance, a_j - p n_j is a sum of mean-zero terms over the checked
    positions whether or not drafting stopped at a rejection (the stopping rule depends only on outcomes already
    seen), so E (a_j - p n_j)^2 = p (1 - p) E n_j and z is about standard normal; a spread makes it large. Dividing
    by s_j gives every request a term of about the same variance: unweighted, a single long request (lognormal
    lengths) could make up most of the denominator and hide a spread (z 0.5 at correlation 0.2 in one study reference).
    Measured (docs/drift.md, "Where requests do not differ"): without a spread 96-100% of references below 2 at
    every size from 2,000 to 32,000 steps (80 each), median -0.2 to 0.3; one-in-ten hard requests at correlation
    0.05 below 2 in 4% of 2,000-step references, and at least 5.1 from 4,000 steps on."""
    p = accepted.sum() / max(checked.sum(), 1.0)
    v = p * (1 - p)
    s = np.maximum(steps, 1)
    scale = math.sqrt(2 * float(((v * checked / s) ** 2).sum()))
    return float(((((accepted - p * checked) ** 2 - v * checked) / s).sum()) / scale) if scale > 0 else 0.0


def runs_z(accepted: np.ndarray, clusters: np.ndarray) -> float:
    """A test of the calibration's picture of a request, that given its acceptance its steps are independent: z of
    sum_j w_j d_j against its own spread, sqrt(sum_j (w_j d_j)^2), over the requests j of at least 3 steps, where
    d_j = (mean squared difference of consecutive steps' accepted counts) - 2 (their sample variance) and w_j =
    sqrt(m_j - 1) for m_j steps (in stream order). Where a request's steps are exchangeable, as independent draws
    given its acceptance are, both terms of d_j estimate twice the steps' variance, so E d_j = 0 exactly whatever the
    request's acceptance, and requests are independent; runs of alike steps (a copy-like stretch, then a hard one)
    make consecutive steps closer than any two, and z negative. The square root keeps a few long requests (lognormal
    lengths) from making up the sum. Measured (docs/drift.md, "Runs within requests"): on the study's references,
    spread between requests or not, mean -0.1 to 0.2 and sd 0.9-1.1, below -3 in at most 1% of any cell; on
    state-switching traffic below -3 in 86% of 2,000-step references and 98-100% from 4,000 steps on."""
    y = np.asarray(accepted, dtype=float)
    request = first_seen(np.asarray(clusters))
    order = np.argsort(request, kind="stable")  # each request's steps together, in stream order
    request, y = request[order], y[order]
    m = np.bincount(request).astype(float)
    total, squares = np.bincount(request, weights=y), np.bincount(request, weights=y * y)
    same = request[1:] == request[:-1]
    step_diff = np.bincount(request[1:][same], weights=(y[1:][same] - y[:-1][same]) ** 2, minlength=len(m))
    kept = m >= 3
    m, total, squares, step_diff = m[kept], total[kept], squares[kept], step_diff[kept]
    d = step_diff / (m - 1) - 2 * (squares - total ** 2 / m) / (m - 1)
    wd = np.sqrt(m - 1) * d
    spread = math.sqrt(float((wd ** 2).sum()))
    return float(wd.sum() / spread) if spread > 0 else 0.0


def cumulative_increments(accepted: np.ndarray, checked: np.ndarray, p0: float, p1: float) -> np.ndarray:
    """Cumulative CUSUM increments of simulated streams (one a row) watched with p0 and p1."""
    wa, wr = llr_weights(p0, p1)
    x = (accepted * np.float32(wa - wr) + checked * np.float32(wr)).astype(np.float32)
    return np.cumsum(x, axis=1, dtype=np.float64)


@dataclass(frozen=True)
class Threshold:
    """A calibrated threshold h and, on the same simulated streams at h, the points per alarm episode (alarms within
    EPISODE_GAP points of the previous one form one, as the alarms, webhooks and the Drift page count them): what a
    person on call experiences, the stated figure being points per alarm, every re-alarm counted."""

    h: float
    episode_points: float


def solve_threshold(s: list[np.ndarray], arl0_steps: int) -> Threshold:
    """h at which the groups' mean alarm rate of the restarted CUSUM is 1 / arl0_steps, with the points per alarm
    episode there (Threshold); s holds each group's cumulative increments, one stream a row.

    A start: h is bisected on the rate from a fresh start, (n - 1) / (sum of the n streams' run lengths to the
    first alarm) per group (one vectorised pass per h). The restarted CUSUM usually alarms more often (after an
    alarm the points that follow are often the rest of the same poor request), so from there h is moved in
    steps of 25% until the restarted rate, counted exactly (restarted_rates), brackets the stated one, and found
    inside that bracket by false position on log rate against h (an in-control CUSUM's alarm rate falls about
    exponentially in h), to within 1% of the stated rate or 0.5% of h; where it stops short, the quieter end."""
    target = math.log(1.0 / arl0_steps)
    hi = fresh_start_threshold(s, arl0_steps)
    episodes: dict[float, float] = {}  # episode rate at each h tried: every h returned has been tried

    def log_rate(h: float) -> float:
        rate, episodes[h] = restarted_rates(s, h, arl0_steps)
        return math.log(max(rate, 1e-3 / arl0_steps))

    def found(h: float) -> Threshold:
        return Threshold(float(h), 1 / episodes[h] if episodes[h] > 0 else math.inf)

    # bracket [lo, hi]: too many alarms at lo, few enough at hi, found in steps of 25% from the fresh-start h
    # (usually upwards; downwards where the fresh-start estimate, from few streams per group, came out high)
    h0, r0 = hi, log_rate(hi)
    lo, r_lo, hi, r_hi = h0, r0, h0, r0
    if r0 > target:
        while r_hi > target and hi < 1e4:
            lo, r_lo = hi, r_hi
            hi *= 1.25
            r_hi = log_rate(hi)
    else:
        while r_lo <= target and lo > 0.05:
            hi, r_hi = lo, r_lo
            lo /= 1.25
            r_lo = log_rate(lo)
        if r_lo <= target:
            return found(hi)
    side = 0
    for _ in range(8):
        if hi - lo < 5e-3 * hi or r_lo - r_hi < 0.02:
            break
        h = hi - (target - r_hi) * (hi - lo) / (r_lo - r_hi)
        r = log_rate(h)
        if abs(r - target) < 0.01:
            return found(h)
        if r > target:
            lo, r_lo = h, r
            if side == -1:
                r_hi = (r_hi + target) / 2  # Illinois: keep the stale end from stalling the search
            side = -1
        else:
            hi, r_hi = h, r
            if side == 1:
                r_lo = (r_lo + target) / 2
            side = 1
    return found(hi)


def fresh_start_threshold(s: list[np.ndarray], arl0_steps: int) -> float:
    """h (to 1%) at which the groups' mean rate from a fresh start, (n - 1) / (sum of the n streams' run lengths to
    the first alarm) per group, is 1 / arl0_steps: one vectorised pass per h."""
    w = [g - np.minimum(np.minimum.accumulate(g, axis=1), 0.0) for g in s]

    def first_rate(h: float) -> float:
        return float(np.mean([(len(g) - 1) / first_alarm_steps(g, h).sum() for g in w]))

    lo, hi = 0.1, 1.0
    while first_rate(hi) > 1.0 / arl0_steps and hi < 1e4:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-2 * hi:
        mid = (lo + hi) / 2
        if first_rate(mid) > 1.0 / arl0_steps:
            lo = mid
        else:
            hi = mid
    return hi


def restarted_rates(s: list[np.ndarray], h: float, arl0_steps: int) -> tuple[float, float]:
    """The groups' mean rates of alarms and of alarm episodes per point of the CUSUM restarted after every alarm, as
    in use: after a restart at point r, W_t = S_t - min(S_r, min_{r<u<=t} S_u) for the cumulative increments S; an
    alarm within EPISODE_GAP points of the previous one in its stream continues that one's episode. Scanned in blocks
    (a Python step per block and per alarm, not per point), the running minimum carried from block to block."""
    block = max(256, arl0_steps // 4)
    rates, episode_rates = [], []
    for g in s:
        alarms = episodes = 0
        for row in g:
            n, start, floor, last = len(row), 0, 0.0, -EPISODE_GAP - 1
            while start < n:
                seg = row[start:start + block]
                low = np.minimum(np.minimum.accumulate(seg), floor)
                hit = np.flatnonzero(seg - low >= h)
                if hit.size:
                    alarms += 1
                    at = start + int(hit[0])
                    episodes += at - last > EPISODE_GAP
                    last = at
                    floor = float(seg[hit[0]])
                    start = at + 1
                else:
                    floor = float(low[-1])
                    start += len(seg)
        rates.append(alarms / g.size)
        episode_rates.append(episodes / g.size)
    return float(np.mean(rates)), float(np.mean(episode_rates))


class Mixing:
    """The distribution of cluster acceptance r, estimated by nonparametric maximum likelihood (Kiefer and
    Wolfowitz) on a grid of r: the weights on the grid maximise the likelihood of the clusters (EM), each cluster's
    likelihood at each grid point given by the model the calibration simulates it with (the shifted per-position
    profile of a request: of_steps). Unlike a beta fitted by moments it keeps the
    shape the data show (a cluster of hard requests one in ten), and where clusters do not differ beyond chance it
    comes out nearly a single point instead of a spread the chance variation leaves."""

    def __init__(self, grid: np.ndarray, loglik: np.ndarray):
        self.grid = grid
        self.lik = np.exp(loglik - loglik.max(axis=1, keepdims=True))  # (clusters, grid)
        self.start = self._em(np.ones(len(loglik)), np.full(len(grid), 1 / len(grid)), MIXING_ITERATIONS * 10)

    @staticmethod
    def grid_for(pa: np.ndarray, pn: np.ndarray) -> np.ndarray:
        """MIXING_GRID points over the clusters' own rates (pa accepted of pn checked positions), widened by their
        chance variation."""
        rate = pa / np.maximum(pn, 1)
        slack = 4 * np.sqrt(0.25 / np.maximum(pn, 1))
        return np.linspace(max(1e-3, float((rate - slack).min())), min(1 - 1e-3, float((rate + slack).max())),
                           MIXING_GRID)

    @classmethod
    def of_steps(cls, accepted: np.ndarray, checked: np.ndarray, inverse: np.ndarray) -> Mixing:
        """Requests, from their steps (accepted and checked positions of each, inverse its request) counted by
        position (the steps that accepted position i, the steps that reached it): given r, position i is accepted
        with probability logistic(logit q_i + theta(r)), q_i the reference's profile (Profile), as StepProcess draws
        the request's steps. The likelihood is exact whatever the stopping rule (drafting ends at the first
        rejection, a rule that depends only on outcomes already seen). One binomial over a request's pooled
        positions, which this replaced, is that model only where every position has one rate: where rates fall
        along the draft, a request's pooled count varies less than a binomial's, so the fit took chance for more of
        the differences between requests than it is and simulated requests too alike (a threshold too low: 0.43 x
        the stated steps per false alarm at 20,000 on a 200,000-step reference of traffic whose requests differ
        most deep in the draft, 0.98 x with this likelihood; docs/drift.md, "Production-like traffic the
        calibration does not model")."""
        passed, reached = _position_counts(accepted, checked, inverse, max(int(checked.max()), 1))
        profile = Profile.of_counts(passed.sum(axis=0), reached.sum(axis=0))
        grid = cls.grid_for(passed.sum(axis=1), reached.sum(axis=1))
        q = profile.accept(profile.theta(grid))  # (positions, grid)
        return cls(grid, passed @ np.log(q) + (reached - passed) @ np.log1p(-q))

    def fit(self, counts: np.ndarray) -> Rates:
        """The distribution for a group holding each reference cluster counts times (EM from the whole reference's
        fit), smoothed (Rates)."""
        return self.smoothed(self.weights(counts), float(counts.sum()))

    def weights(self, counts: np.ndarray) -> np.ndarray:
        """The grid's weights for a group holding each reference cluster counts times (EM from the whole
        reference's fit)."""
        return self._em(counts.astype(float), self.start, MIXING_ITERATIONS)

    def within(self, w: np.ndarray, counts: np.ndarray, share: float, clusters: float) -> Rates:
        """The distribution of a part of a group's clusters (counts: how often the part holds each) under the
        group's weights w, fitted on that many clusters: the part's posteriors over the grid averaged (one EM step
        from w), mixed with w itself in the proportions share : 1 - share, smoothed with the group's bandwidth (the
        weights lie on the group's fit; a part's own, from its fewer clusters, made a constant mix's hours 1.48 x
        the stated steps per false alarm at 20,000, docs/math.md, "Drift").
        At share 1, summed over parts in proportion to their clusters, this gives back the group's fit."""
        return self.smoothed(share * self._em(counts.astype(float), w, 1) + (1 - share) * w, clusters)

    def posterior_means(self) -> np.ndarray:
        """Each cluster's expected acceptance under the whole reference's fit."""
        post = self.lik * self.start
        return (post @ self.grid) / post.sum(axis=1)

    def smoothed(self, w: np.ndarray, clusters: float) -> Rates:
        """Draws from the grid's weights w, fitted on that many clusters, smoothed by a kernel (Rates)."""
        logit = np.log(self.grid / (1 - self.grid))
        mean = float(w @ logit)
        cdf = np.cumsum(w)
        iqr = logit[np.searchsorted(cdf, 0.75)] - logit[np.searchsorted(cdf, 0.25)]
        var = max(float(w @ (logit - mean) ** 2), 0.0)
        sd = math.sqrt(var)
        spread = min(sd, iqr / 1.34) if iqr > 0 else sd
        b = 0.9 * spread * clusters ** -0.2
        if b <= 0:
            return Rates(self.grid, w, 0.0, mean, 1.0, 0.0)
        # shrink towards the weights' mean so that the kernel keeps their variance on the log-odds scale (Silverman
        # 1986, 6.4.1): a widening alone would add b^2, simulated requests differing more than the data's
        scale = 1 / math.sqrt(1 + b * b / var)
        # the log-odds scale's mean is kept, that of r not quite (the logistic is curved); shift it back (Newton, on
        # 20 Gauss-Hermite nodes), since the false-alarm rate is steep in the mean acceptance
        nodes, node_w = np.polynomial.hermite_e.hermegauss(20)
        node_w = node_w / node_w.sum()
        target = w @ self.grid
        base = mean + scale * (logit[:, None] - mean + b * nodes[None, :])
        shift = 0.0
        for _ in range(8):
            e = 1 / (1 + np.exp(-(base + shift)))
            shift += (target - w @ e @ node_w) / (w @ (e * (1 - e)) @ node_w)
        return Rates(self.grid, w, b, mean, scale, shift)

    def _em(self, counts: np.ndarray, w: np.ndarray, iterations: int) -> np.ndarray:
        held = counts > 0  # only the clusters held count (a group's hour holds a few)
        lik, counts = self.lik[held], counts[held]
        for _ in range(iterations):
            w = w * (lik.T @ (counts / np.maximum(lik @ w, 1e-300))) / counts.sum()
        return w / w.sum()


@dataclass(frozen=True)
class Rates:
    """Draws of cluster acceptance: a grid value g with its weight, moved on the log-odds scale to
    center + scale (logit g - center + b z) + shift, z standard normal: a kernel with Silverman's bandwidth b from the
    weights' own spread on that scale and the number of clusters, shrunk towards the weights' mean `center` by
    scale = 1 / sqrt(1 + b^2 / s^2) (s^2 the weights' variance there) so that the draws keep that variance, and
    shift keeping the mean of r. The maximum-likelihood weights sit on a few points inside the range of the
    clusters' own rates; the kernel fills the gaps between them and beyond, without making the clusters differ more
    than the weights say, and adds nothing where they do not differ (b = 0)."""

    grid: np.ndarray
    weights: np.ndarray
    b: float
    center: float
    scale: float
    shift: float

    @classmethod
    def single(cls, rate: float) -> Rates:
        """Every cluster at one acceptance."""
        return cls(np.array([rate]), np.array([1.0]), 0.0, 0.0, 1.0, 0.0)

    def draw(self, rng: np.random.Generator, size: int | tuple) -> np.ndarray:
        r = rng.choice(self.grid, size=size, p=self.weights)
        if self.b <= 0:
            return r
        logit = np.log(r / (1 - r))
        z = rng.standard_normal(size)
        return 1 / (1 + np.exp(-(self.center + self.scale * (logit - self.center + self.b * z) + self.shift)))


class BlockProcess:
    """The in-control process of engine windows, drawn as whole blocks of consecutive windows (a block: one engine's
    windows over WINDOW_BLOCK_SECONDS, clusters) by hour of day: a smoothed block bootstrap that walks the clock.

    Requests outlast a window, so neighbouring windows share them and are not independent; a block far longer than a
    request keeps that dependence inside it. Traffic whose mix follows the clock moves acceptance with the hour, so
    where the reference covers every hour of the day a simulated stream walks the clock from a random hour, each hour
    of day getting the reference's blocks per clock hour there, drawn from the group's blocks of that hour of day
    (elsewhere one stratum). A group (group) is each stratum's blocks drawn with replacement: the bootstrap's picture
    of the reference's sampling error, over which calibrate_threshold averages the false-alarm rate. Each drawn block
    is moved as a whole on the log-odds scale by a kernel (kernel: Silverman's bandwidth from the blocks' spread about
    their hour's mean, shrunk to keep that spread), its windows with it: replayed as they were, the blocks would
    leave out a rare poor block the reference happened to miss, and a short reference whose every window lies above
    the level the CUSUM watches for would give a threshold that alarms at the first window below it. In a reference
    of fewer than MIN_BLOCKS blocks (its first hour or two) each window is a block of its own, independent of its
    neighbours: too few blocks to smooth, and windows alike in a few blocks would show next to no variation. That
    understates how alike neighbouring windows are, which is one reason no rate is stated on fewer than a day's blocks
    (detector.WINDOW_REFERENCE_BLOCKS)."""

    def __init__(self, a: np.ndarray, n: np.ndarray, blocks: np.ndarray, hours: np.ndarray):
        if int(blocks.max()) + 1 < MIN_BLOCKS:  # a short reference: each window a block of its own
            blocks = np.arange(len(a))
        order = np.argsort(blocks, kind="stable")  # each block's windows together, in time order
        self.a, self.n = a[order], n[order]  # counts, fractional where an engine's drafts were inferred
        self.size = np.bincount(blocks)
        self.first = np.cumsum(self.size) - self.size
        hour = hours[order][self.first]  # a block's hour since the epoch: its first window's
        whole_day = len(np.unique(hour % 24)) == 24
        strata = 24 if whole_day else 1
        stratum = hour % strata
        spans = np.bincount(np.unique(hour) % strata, minlength=strata)  # clock hours of each hour of day
        self.per_hour = np.maximum(np.rint(np.bincount(stratum, minlength=strata) / spans), 1).astype(np.int64)
        self.members = [np.flatnonzero(stratum == s) for s in range(strata)]
        block_a, block_n = np.add.reduceat(self.a, self.first), np.add.reduceat(self.n, self.first)
        self.level = np.log((block_a + 0.5) / (block_n - block_a + 0.5))  # a block's acceptance, log-odds
        self.rate = self.a / np.maximum(self.n, 1)

    def kernel(self, pools: list[np.ndarray]) -> tuple[np.ndarray, float, float]:
        """The smoothing of a group's blocks: each stratum's mean block level (log-odds), Silverman's bandwidth b
        from the blocks' spread about their stratum's mean, and the shrink 1 / sqrt(1 + b^2 / s^2) that keeps that
        spread (as Rates does for requests)."""
        centers = np.array([self.level[p].mean() for p in pools])
        resid = np.concatenate([self.level[p] - c for p, c in zip(pools, centers, strict=True)])
        var = float(resid.var())
        if var <= 0 or len(resid) < 2:
            return centers, 0.0, 1.0
        q75, q25 = np.percentile(resid, [75, 25])
        spread = min(math.sqrt(var), (q75 - q25) / 1.34) if q75 > q25 else math.sqrt(var)
        b = 0.9 * spread * len(resid) ** -0.2
        return centers, b, 1 / math.sqrt(1 + b * b / var)

    def group(self, rng: np.random.Generator) -> list[np.ndarray]:
        """One plausible process: each stratum's blocks drawn with replacement."""
        return [m[rng.integers(0, len(m), len(m))] for m in self.members]

    def draw(self, rng: np.random.Generator, pools: list[np.ndarray], n_streams: int,
             n_points: int) -> tuple[np.ndarray, np.ndarray]:
        """(accepted, checked) of n_streams streams of n_points windows, one a row, from a group's pools."""
        strata = len(pools)
        per_day = sum(self.per_hour[s] * self.size[pools[s]].mean() for s in range(strata))
        hours = int(1.25 * strata * n_points / per_day) + strata
        accepted = np.empty((n_streams, n_points), dtype=np.float32)
        checked = np.empty((n_streams, n_points), dtype=np.float32)
        centers, width, scale = self.kernel(pools)
        for i in range(n_streams):
            start = int(rng.integers(strata))
            while True:  # the clock's hours from a random one, each with its blocks; more hours where they fall short
                clock = (start + np.arange(hours)) % strata
                slot = np.repeat(clock, self.per_hour[clock])
                b = np.empty(len(slot), dtype=np.int64)
                for s in range(strata):
                    mine = slot == s
                    b[mine] = pools[s][rng.integers(0, len(pools[s]), int(mine.sum()))]
                ends = np.cumsum(self.size[b])
                if ends[-1] >= n_points:
                    break
                hours *= 2
            used = int(np.searchsorted(ends, n_points)) + 1
            b, ends, slot = b[:used], ends[:used], slot[:used]
            at = (np.repeat(self.first[b] - (ends - self.size[b]), self.size[b]) + np.arange(ends[-1]))[:n_points]
            if width > 0:
                # each drawn block moved on the log-odds scale, its windows with it (exactly: r -> r e^s / (1 - r
                # + r e^s) keeps 0 and 1), the kernel filling in the blocks the reference did not happen to hold
                shift = (scale - 1) * (self.level[b] - centers[slot]) + scale * width * rng.standard_normal(used)
                e = np.exp(np.repeat(shift, self.size[b])[:n_points])
                r = self.rate[at]
                accepted[i] = self.n[at] * (r * e / (1 - r + r * e))
            else:
                accepted[i] = self.a[at]
            checked[i] = self.n[at]
        return accepted, checked


TILT_GRID = np.linspace(-8.0, 8.0, 161)  # shifts of the per-position log-odds of acceptance, for interpolation


def _position_counts(accepted: np.ndarray, checked: np.ndarray, inverse: np.ndarray,
                    k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request (inverse: each step's) and position i = 1..k: the steps that accepted position i and the steps
    that reached it (a row per request)."""
    n_requests = int(inverse.max()) + 1
    return (np.stack([np.bincount(inverse, accepted >= i, minlength=n_requests) for i in range(1, k + 1)], axis=1),
            np.stack([np.bincount(inverse, checked >= i, minlength=n_requests) for i in range(1, k + 1)], axis=1))


class Profile:
    """The calibration's model of a request's steps: position i of a step is checked while all before were
    accepted, and accepted with probability logistic(logodds_i + theta), theta the request's shift; a request of
    per-token acceptance r has the theta whose expected accepted over checked positions is r."""

    def __init__(self, logodds: np.ndarray):
        self.logodds = logodds
        self.tilt_rate = self._acceptance(TILT_GRID)[0]  # increasing in theta

    @classmethod
    def of_counts(cls, passed: np.ndarray, reached: np.ndarray) -> Profile:
        """From the steps that accepted and that reached each position (1/2 added to each side)."""
        return cls(np.log((passed + 0.5) / (reached - passed + 0.5)))

    def accept(self, theta: np.ndarray) -> np.ndarray:
        """The chance of accepting position i when all before were: a row per position, a column per theta (so the
        products over positions run down short columns, vectorised across thetas)."""
        return 1 / (1 + np.exp(-(self.logodds[:, None] + theta[None, :])))

    def _acceptance(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-token acceptance of a step at each theta, and its derivative in theta."""
        q = self.accept(theta)
        reach = np.cumprod(q, axis=0)  # P(a step accepts at least j positions), j = 1..k
        # E accepted = sum_{j>=1} P(accept >= j), E checked = 1 + sum_{1<=j<k} P(accept >= j), and
        # d/dtheta P(accept >= j) = P(accept >= j) sum_{i<=j} (1 - q_i)
        slope = reach * np.cumsum(1 - q, axis=0)
        acc, chk = reach.sum(axis=0), 1 + reach[:-1].sum(axis=0)
        d_acc, d_chk = slope.sum(axis=0), slope[:-1].sum(axis=0)
        return acc / chk, (d_acc * chk - acc * d_chk) / chk ** 2

    def theta(self, rates: np.ndarray) -> np.ndarray:
        """The theta whose per-token acceptance is each r: interpolated on TILT_GRID, then one Newton step (the rate
        is smooth in theta, so the interpolation's error of about 1e-4 falls to about 1e-8)."""
        theta = np.interp(rates, self.tilt_rate, TILT_GRID)
        rate, slope = self._acceptance(theta)
        return np.clip(theta + (rates - rate) / np.maximum(slope, 1e-12), TILT_GRID[0], TILT_GRID[-1])


class StepProcess:
    """The in-control process of one group of requests (pool: positions among the reference's requests, inverse
    the request of each reference step), drawn as requests laid end to end.

    A drawn request gets a length in steps from the group's lengths, with a generalized Pareto tail past its longest
    fifth (RequestLengths), and an acceptance r from the group's distribution of request acceptance (Mixing). Its steps
    are drawn independently from the group's per-position profile shifted to r (Profile): position i of a step is
    checked while all before were accepted, and accepted with probability logistic(logit q_i + theta), q_i the
    group's own rate at position i (accepted / checked there), theta the shift whose per-token acceptance is r
    (Profile.theta; a draw at the grid point at or above r, which that replaced, made every request a little easier
    than its r). So steps keep
    the shape of real steps (position 1 easier or harder than position 4, as the logs have it) at the request's own
    acceptance; within a request whose positions share one rate this is exactly the truncated geometric step. (A
    tilt of the group's mix of steps, which this replaced, matched r but, at an r far below the mix, kept too many
    fully accepted steps from the easy requests in it: fewer rejections per step, a CUSUM drifting up more slowly
    than in a poor request.)"""

    def __init__(self, a: np.ndarray, n: np.ndarray, inverse: np.ndarray, pool: np.ndarray, rates: Rates):
        self.rates = rates
        n_requests = int(inverse.max()) + 1
        k = max(int(n.max()), 1)
        self.kinds = self.kinds_up_to(k)
        times = np.bincount(pool, minlength=n_requests)[inverse]  # how often the group holds each reference step
        reached = np.array([times[n >= i].sum() for i in range(1, k + 1)])
        passed = np.array([times[a >= i].sum() for i in range(1, k + 1)])
        self.profile = Profile.of_counts(passed, reached)
        self.steps = np.bincount(inverse, minlength=n_requests)[pool]
        self.lengths = RequestLengths(self.steps)

    @staticmethod
    def kinds_up_to(k: int) -> np.ndarray:
        """The steps a draft of k positions can take, a row each: (accepted, checked)."""
        return np.array([(j, min(j + 1, k)) for j in range(k + 1)], dtype=np.int8)

    def at(self, rates: Rates) -> StepProcess:
        """The same group's lengths and profile, its requests' acceptance drawn from rates."""
        other = copy.copy(self)
        other.rates = rates
        return other

    def tilt(self, rates: np.ndarray) -> np.ndarray:
        """P(a step accepts at most j positions), j = 0..k-1 (a row each, a column per r), at each r's theta."""
        return 1 - np.cumprod(self.profile.accept(self.profile.theta(rates)), axis=0)

    def draw(self, rng: np.random.Generator, n_streams: int, n_points: int) -> tuple[np.ndarray, np.ndarray]:
        """(accepted, checked) of n_streams streams of n_points steps, one a row."""
        picked = np.stack([self.requests(rng, n_points, n_points)[0][:n_points] for _ in range(n_streams)])
        return self.kinds[picked, 0], self.kinds[picked, 1]

    def requests(self, rng: np.random.Generator, n_steps: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
        """Whole requests laid end to end, at least n_steps steps in all, none longer than cap: each step's kind
        (its row of kinds: accepted, checked) and each request's length."""
        draws = int(n_steps / self.steps.mean() * 1.5) + 16
        kinds, sizes, filled = [], [], 0
        while filled < n_steps:
            lengths = self.lengths.draw(rng, draws, cap)
            rates = self.rates.draw(rng, draws)
            used = min(int(np.searchsorted(np.cumsum(lengths), n_steps - filled)) + 1, draws)  # enough to fill
            cdf = self.tilt(rates[:used])
            row = np.repeat(np.arange(used), lengths[:used])
            u = rng.random(len(row))
            kind = np.zeros(len(row), dtype=np.int8)
            for column in cdf:
                kind += u > column[row]
            kinds.append(kind)
            sizes.append(lengths[:used])
            filled += len(row)
        return np.concatenate(kinds), np.concatenate(sizes)


class StepDay:
    """A step log's reference by hour of day, where it spans every hour of the day: a request belongs to the hour of
    day (UTC) of its first step, and each hour of day takes its reference steps per clock hour there (quota).

    Traffic whose mix follows the clock (chat by day, batch jobs by night) moves acceptance with the hour while
    nothing is wrong, and the CUSUM alarms more often in a poor hour than a day's average of requests pictures. So a
    group is each hour's requests drawn with replacement (a stratified bootstrap); its distribution of request
    acceptance is fitted on all of them (Mixing), and each hour's is the hour's requests' posteriors under that fit
    (Mixing.within) shrunk towards the group's by how much the reference's hours really differ (share). Lengths and
    the per-position profile are the group's. A simulated stream walks the clock from a random hour, each clock hour
    taking the requests that start within its quota of steps, whole (a long request runs on into the next hours, as
    it would).

    Why shrunk: an hour of day holds a 24th of the requests, so its estimated acceptance is off by chance, and the
    simulation repeats that hour's error every simulated day, where the traffic's own hours only vary by chance
    from day to day. Unshrunk (and with each hour's own lengths and profile), that read a constant mix as a swing:
    1.22 x the stated steps per false alarm at a stated 2,000 and 2.91 x at 20,000, against 0.99 x and 1.16 x
    pooled (docs/math.md, "Drift"). share_s = sqrt(tau^2 / (tau^2 + v_s)), v_s the chance variance of hour s's mean
    request acceptance (their variance over its n_s requests, / n_s) and tau^2 the variance of the hours' means
    beyond it (method of moments, at least 0): 0 where the hours differ no more than chance, near 1 where the mix
    swings far more. The square root keeps the shrunk hours' means as spread as tau^2 says (a constrained Bayes
    estimate, Louis 1984): the posterior mean's tau^2 / (tau^2 + v_s) spreads them less than the hours differ, and
    gave 0.78 x the stated steps per false alarm at 20,000 under the daily mix, against 0.85 x with it."""

    def __init__(self, request_hour: np.ndarray, steps: np.ndarray, clock_hours: np.ndarray, level: np.ndarray,
                 k: int):
        self.k = k
        stratum = request_hour % 24
        self.members = [np.flatnonzero(stratum == s) for s in range(24)]
        # not rounded: a sparse log's hours hold less than a step each
        self.quota = np.bincount(stratum, weights=steps, minlength=24) / clock_hours
        kept = [m for m in self.members if len(m) >= 2]
        means = np.array([level[m].mean() for m in kept])
        noise = np.array([level[m].var(ddof=1) / len(m) for m in kept])
        tau2 = max(float(means.var(ddof=1)) - float(noise.mean()), 0.0) if len(kept) >= 2 else 0.0
        self.share = np.zeros(24)
        for m, v in zip(kept, noise, strict=True):
            self.share[stratum[m[0]]] = math.sqrt(tau2 / (tau2 + v)) if tau2 + v > 0 else 0.0

    @classmethod
    def of(cls, inverse: np.ndarray, hours: np.ndarray, level: np.ndarray, k: int) -> StepDay | None:
        """The reference's hours of day (inverse: each step's request, by first appearance; hours: each step's hour
        since the epoch; level: each request's estimated acceptance; k the most positions a step checks), or None
        where it spans fewer than 24 clock hours or an hour of day holds fewer than MIN_HOUR_REQUESTS requests (too
        few to tell that hour from the rest of the day)."""
        lo, hi = int(hours.min()), int(hours.max())
        if hi - lo + 1 < 24:
            return None
        first = np.unique(inverse, return_index=True)[1]
        if np.bincount(hours[first] % 24, minlength=24).min() < MIN_HOUR_REQUESTS:
            return None
        return cls(hours[first], np.bincount(inverse), np.bincount(np.arange(lo, hi + 1) % 24, minlength=24), level,
                   k)

    def group(self, rng: np.random.Generator, a: np.ndarray, n: np.ndarray, inverse: np.ndarray,
              mixing: Mixing | None) -> list[StepProcess | None]:
        """One plausible process: each hour's requests drawn with replacement, and each hour's StepProcess (None
        for an hour without requests). mixing None: requests alike, each hour's at its pooled acceptance (shrunk
        as the distributions are)."""
        n_clusters = int(inverse.max()) + 1
        pools = [m[rng.integers(0, len(m), len(m))] for m in self.members]
        counts = [np.bincount(p, minlength=n_clusters) for p in pools]
        whole = np.sum(counts, axis=0)
        if mixing is None:
            per_a, per_n = np.bincount(inverse, weights=a), np.bincount(inverse, weights=n)
            overall = float(whole @ per_a) / float(whole @ per_n)
            base = StepProcess(a, n, inverse, np.concatenate(pools), Rates.single(overall))
            hourly = [Rates.single(share * float(held @ per_a) / max(float(held @ per_n), 1.0)
                                   + (1 - share) * overall) for held, share in zip(counts, self.share, strict=True)]
        else:
            w = mixing.weights(whole)
            base = StepProcess(a, n, inverse, np.concatenate(pools), mixing.smoothed(w, float(whole.sum())))
            hourly = [mixing.within(w, held, share, float(whole.sum())) if held.any() else base.rates
                      for held, share in zip(counts, self.share, strict=True)]
        return [base.at(r) if len(pool) else None for pool, r in zip(pools, hourly, strict=True)]

    def draw(self, rng: np.random.Generator, processes: list[StepProcess | None], n_streams: int,
             n_points: int) -> tuple[np.ndarray, np.ndarray]:
        """(accepted, checked) of n_streams streams of n_points steps, one a row, from a group's hours: each stream
        the clock's hours from a random one, an hour's visit j to hour of day s taking the requests that start in
        [j quota_s, (j + 1) quota_s) of the steps drawn for s (vectorised: a sparse log's hours are many and hold
        less than a step each)."""
        live = [s for s in range(24) if processes[s] is not None and self.quota[s] > 0]
        hours = int(1.25 * 24 * n_points / self.quota[live].sum()) + 24
        while True:  # more hours where they fall short
            clock = ((rng.integers(0, 24, n_streams)[:, None] + np.arange(hours)) % 24).ravel()
            hour_first = np.zeros(len(clock), dtype=np.int64)  # each hour's first step in `drawn`, and its steps
            hour_size = np.zeros(len(clock), dtype=np.int64)
            drawn, offset = [], 0
            for s in live:
                process = processes[s]
                assert process is not None
                visits = np.flatnonzero(clock == s)  # in stream order, then the clock's
                kinds, sizes = process.requests(rng, math.ceil(len(visits) * self.quota[s]), n_points)
                starts = np.append(np.cumsum(sizes) - sizes, len(kinds))
                cut = starts[np.searchsorted(starts[:-1], np.arange(len(visits) + 1) * self.quota[s])]
                hour_first[visits], hour_size[visits] = offset + cut[:-1], np.diff(cut)
                drawn.append(kinds)
                offset += len(kinds)
            first, size = hour_first.reshape(n_streams, hours), hour_size.reshape(n_streams, hours)
            if (size.sum(axis=1) >= n_points).all():
                break
            hours *= 2
        steps = np.concatenate(drawn)
        picked = np.empty((n_streams, n_points), dtype=np.int8)
        for i in range(n_streams):
            ends = np.cumsum(size[i])
            used = int(np.searchsorted(ends, n_points)) + 1
            at = np.repeat(first[i, :used] - (ends[:used] - size[i, :used]), size[i, :used]) + np.arange(ends[used - 1])
            picked[i] = steps[at[:n_points]]
        kinds = StepProcess.kinds_up_to(self.k)
        return kinds[picked, 0], kinds[picked, 1]


class RequestLengths:
    """Request lengths of a group: a length at or below u (the group's lengths' (1 - TAIL_SHARE) quantile) drawn
    from the group's own lengths as they are, one above u as u plus a generalized Pareto excess (math.md, "Drift",
    step 3). A reference of a hundred requests holds none of the few longest requests the stated rate depends
    on, so the tail past its longest is an extrapolation, and by the Pickands-Balkema-de Haan theorem excesses
    over a high threshold are about generalized Pareto whatever the distribution: shape xi = 0 for an exponential
    tail (a geometric length's, exactly), xi > 0 for a heavier one. Estimating xi lets the group's own longest
    requests say how heavy the tail is; a fixed kernel on the log scale (what this replaced) gave every tail a
    lognormal's, 2.6 x a geometric's at five times the mean length (tests/drift/test_calibration.py)."""

    def __init__(self, lengths: np.ndarray):
        ordered = np.sort(lengths)
        self.lengths = lengths
        self.u = int(ordered[max(math.ceil((1 - TAIL_SHARE) * len(ordered)) - 1, 0)])
        # an excess e = L - u >= 1 counts whole steps; e - 1/2 is the continuous excess it rounds up from
        over = ordered[ordered > self.u] - self.u - 0.5
        self.xi, self.sigma = (gpd_fit(over) if len(over) >= TAIL_MIN
                               else (0.0, float(over.mean()) if len(over) else 0.0))

    def draw(self, rng: np.random.Generator, size: int, cap: int) -> np.ndarray:
        """size lengths, each at most cap (a longer request fills a stream of cap points all the same)."""
        out = self.lengths[rng.integers(0, len(self.lengths), size)].astype(np.int64)
        tail = np.flatnonzero(out > self.u)
        if self.sigma > 0 and tail.size:
            v = 1 - rng.random(tail.size)  # in (0, 1]
            excess = (-self.sigma * np.log(v) if abs(self.xi) < 1e-9
                      else self.sigma / self.xi * np.expm1(-self.xi * np.log(v)))
            out[tail] = self.u + np.ceil(np.minimum(excess, cap)).astype(np.int64)
        return np.clip(out, 1, cap)


def gpd_fit(excess: np.ndarray) -> tuple[float, float]:
    """(xi, sigma) of a generalized Pareto distribution, P(X > x) = (1 + xi x / sigma)^(-1/xi), fitted to positive
    excesses by Zhang and Stephens' (2009) method: the profile likelihood in theta = -xi / sigma averaged over a
    grid of theta by its own weights (a posterior mean), then xi = mean log(1 - theta x) and sigma = -xi / theta
    there. Unlike the maximum-likelihood estimate it always exists and is stable with a few dozen excesses; it
    assumes them independent. xi < 0 is a bounded tail, its end beyond the largest excess."""
    x = np.sort(np.asarray(excess, dtype=float))
    n = len(x)
    m = 20 + int(math.sqrt(n))
    theta = 1 / x[-1] + (1 - np.sqrt(m / (np.arange(1, m + 1) - 0.5))) / (3 * x[max(int(n / 4 + 0.5) - 1, 0)])
    shape = np.log1p(-theta[:, None] * x[None, :]).mean(axis=1)  # the xi that maximises the likelihood at theta
    # -theta / shape tends to 1 / mean(x) as theta -> 0 (the exponential's likelihood); a grid point can be exactly
    # 0 (theta_j = 0 when x_(n) = 3 x_(q) and m / (j - 1/2) = 4, e.g. 200 excesses), where 0 / 0 would make every
    # weight NaN
    zero = theta == 0
    rate = np.where(zero, 1 / x.mean(), -theta / np.where(zero, 1.0, shape))
    loglik = n * (np.log(rate) - shape - 1)
    weight = 1 / np.exp(np.clip(loglik[None, :] - loglik[:, None], -700, 700)).sum(axis=1)
    th = float(weight @ theta)
    if abs(th) * x[-1] < 1e-12:  # theta 0: the exponential tail
        return 0.0, float(x.mean())
    xi = float(np.log1p(-th * x).mean())
    return xi, -xi / th


def first_alarm_steps(w: np.ndarray, h: float) -> np.ndarray:
    """Points to the first W >= h in each row (the row length where none came)."""
    hit = w >= h
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, w.shape[1])

_CALIBRATIONS: OrderedDict[str, Threshold] = OrderedDict()  # the watcher re-analyses a run after every batch


def reference_key(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, p0: float, p1: float,
                  arl0_steps: int, hours: np.ndarray | None = None, unit: str = "steps") -> str:
    """What names a calibration (calibrate_threshold's input and CALIBRATION_VERSION), in this process's memory and
    in a database's drift_calibrations alike: sha256 of the reference's points, p0, p1 and the stated figure."""
    return hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes()
                                   for v in (accepted, checked, clusters, () if hours is None else hours))
                          + repr((p0, p1, arl0_steps, unit, CALIBRATION_VERSION)).encode()).hexdigest()


def calibrate_cached(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, p0: float, p1: float,
                      arl0_steps: int, hours: np.ndarray | None = None, unit: str = "steps") -> Threshold:
    key = reference_key(accepted, checked, clusters, p0, p1, arl0_steps, hours, unit)
    if key not in _CALIBRATIONS:
        _CALIBRATIONS[key] = calibrate_threshold(accepted, checked, clusters, p0, p1, arl0_steps, hours=hours,
                                                 unit=unit)
        if len(_CALIBRATIONS) > 64:
            _CALIBRATIONS.popitem(last=False)
    return _CALIBRATIONS[key]


def design_for(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, k: int,
               break_even: float | None, arl0_steps: int = DEFAULT_ARL0_STEPS,
               reference_steps: int = REFERENCE_STEPS, delta: float = DEFAULT_DELTA,
               unit: str = "steps", threshold: Callable[..., Threshold | float] | None = None,
               ts_us: np.ndarray | None = None) -> Design | None:
    """Calibrate a detector on the first reference_steps points of a stream (clusters: the cluster of each of
    those points, or of every point: a request, or for engine windows a block). None if the reference has no checks.
    threshold(accepted, checked, clusters, p0, p1, arl0_steps, hours=..., unit=...) gives the Threshold for the
    reference (default: calibrate_threshold, remembered in this process; a caller that keeps thresholds elsewhere
    passes its own; one that gives h alone leaves the points per alarm episode unknown); hours is each point's hour
    since the epoch, from ts_us (each point's time, microseconds), which also gives the hours the reference covers,
    on which stating a false-alarm rate depends (Design.states_a_rate); engine windows need it.

    p0 is the reference's per-token acceptance; p1 is break-even alpha* when it lies below p0 by more than 0.02,
    else p0 - delta. Engine windows whose reference states no rate get h at least least_h.
    """
    ref = slice(0, min(reference_steps, len(accepted)))
    a = np.asarray(accepted[ref], dtype=float)
    n = np.asarray(checked[ref], dtype=float)
    if n.sum() == 0:
        return None
    p0 = float(np.clip(a.sum() / n.sum(), 0.01, 0.99))
    p1 = target_p1(p0, break_even, delta)
    ref_clusters = np.asarray(clusters)[ref]
    assert unit == "steps" or ts_us is not None, "engine windows are calibrated by hour of day"
    hours = None if ts_us is None else float(np.ptp(np.asarray(ts_us)[ref])) / 3.6e9
    # each point's hour since the epoch: engine windows are drawn by hour of day, a step log's requests once the
    # reference covers a day (a rate is stated from then on)
    clock = (np.asarray(ts_us)[ref] // 3_600_000_000
             if ts_us is not None and (unit != "steps" or covers_a_day(hours)) else None)
    found = (threshold or calibrate_cached)(a, n, ref_clusters, p0, p1, arl0_steps, hours=clock, unit=unit)
    h, episodes = (found.h, found.episode_points) if isinstance(found, Threshold) else (float(found), None)
    per_a, per_n = cluster_sums(a, n, ref_clusters)
    iv = stats.cluster_robust_interval(per_a, per_n)
    design = Design(p0, p1, float(h), arl0_steps, float(iv.design_effect), int(k), len(per_n), unit, len(a),
                    None if episodes is None or not math.isfinite(episodes) else float(episodes), hours,
                    runs_z(a, ref_clusters) if unit == "steps" else None)
    if unit != "steps" and not design.states_a_rate:
        floor = least_h(a, n, np.asarray(ts_us)[ref], p0, p1, arl0_steps)
        if floor.h > design.h:
            design = replace(design, h=floor.h, episode_points=None, dispersion=floor.dispersion,
                             floor_windows=floor.windows, floor_margin=floor.margin)
    return design


@dataclass(frozen=True)
class Floor:
    """calibration.least_h's threshold and what sized it."""

    h: float
    dispersion: float  # h / ln(arl0_steps)
    windows: int  # the span an alarm builds up in (T), in windows
    margin: float  # how far below the reference's acceptance the in-control drift is taken (its lower bound)


def least_h(accepted: np.ndarray, checked: np.ndarray, ts_us: np.ndarray, p0: float, p1: float,
            arl0_steps: int) -> Floor:
    """The least threshold for engine windows whose reference cannot state a rate.

    The block bootstrap sees only the windows its reference holds; where none of them lies as low as the level
    halfway to p1 its streams never alarm, h comes out near 0, and in use the first such window (a quiet minute with
    one poor request) alarms alone. A CUSUM whose increments drift by -mu per window, with variance V over the span it
    takes to climb, alarms in control about once per e^(h 2 mu / V) windows (a Brownian motion's excursions), and the
    log-likelihood ratios of independent binomial counts alarm at most once per e^h (Lorden's bound); so h =
    ln(arl0_steps) x V / V_binomial x mu_p0 / mu, the increments' variance relative to binomial counts' and the drift
    at p0 relative to the drift in control. The reference knows both only roughly. Its acceptance is off by a few
    hundredths on a short reference, and in control the increments drift by mu_p0 only at p0 (at p0 - e by about
    mu_p0 (1 - 2 e / (p0 - p1))); so mu is taken at the lower end of the reference acceptance's FLOOR_CONFIDENCE
    interval (the variance of engine-window intervals, stats.SerialSums, the reference's windows as one series). And
    a request spans several windows, so a run of poor windows climbs further than one window's variance says; so V is
    the Bartlett variance of the reference's increments over T = h / mu windows, h and T solved together. At T = 1
    and the bound at p0 this is the windows' Pearson dispersion. On healthy engine windows whose acceptance is known
    it lies 3 or more times above the h that one false alarm per arl0_steps needs, the more the further p1 lies below
    p0: it errs towards quiet (docs/drift.md, "Engine windows")."""
    held = np.asarray(checked, dtype=float) > 0
    a = np.asarray(accepted, dtype=float)[held]
    n = np.asarray(checked, dtype=float)[held]
    grid = window_grid.grid_places(np.zeros(len(a), dtype=np.int64), np.asarray(ts_us)[held] // 1_000_000)
    low = stats.cluster_interval(window_grid.serial_sums(grid, a, n), FLOOR_CONFIDENCE).lo
    margin = p0 - low if math.isfinite(low) and low < p0 else 0.0
    wa, wr = llr_weights(p0, p1)
    per_window = float(n.mean())

    def drift_at(p: float) -> float:  # how fast the CUSUM falls per window where acceptance is p
        return -per_window * (p * wa + (1 - p) * wr)

    # where the bound lies as low as the CUSUM's own balance point, the reference cannot tell a drop to p1 from its
    # own error: the drift is kept at MIN_DRIFT_SHARE of the drift at p0, so a drop far past p1 still alarms
    drift_at_p0 = drift_at(p0)
    drift = max(drift_at(p0 - margin), MIN_DRIFT_SHARE * drift_at_p0)
    binomial = per_window * p0 * (1 - p0) * (wa - wr) ** 2
    x = a * wa + (n - a) * wr
    bartlett = _bartlett_variances(x)

    def dispersion(span: int) -> float:
        """The Bartlett variance over `span` windows relative to binomial counts' variance, over the share of the
        drift at p0 left at the lower bound."""
        return float(bartlett[min(span, len(x)) - 1]) / binomial * drift_at_p0 / drift

    span, log_rate = 1, math.log(arl0_steps)
    for _ in range(FLOOR_ITERATIONS):
        h = log_rate * dispersion(span)
        following = max(1, math.ceil(h / drift))
        if following == span:
            break
        span = following
    return Floor(h, h / log_rate, span, margin)


def _bartlett_variances(x: np.ndarray) -> np.ndarray:
    """gamma_0 + 2 sum_{k<T} (1 - k / T) gamma_k for T = 1 ... len(x), the autocovariances gamma_k of x divided by its
    length (which keeps each sum positive), as a running maximum: centred on its own mean, a short series' sum
    falls back towards 0 as T nears its length, which says nothing about longer spans."""
    m = len(x)
    c = x - x.mean()
    size = 1 << (2 * m - 1).bit_length()
    spectrum = np.fft.rfft(c, size)
    gamma = np.fft.irfft(spectrum * np.conj(spectrum), size)[:m] / m
    span = np.arange(1, m + 1)
    lag_sum, lag_moment = np.cumsum(gamma), np.cumsum(np.arange(m) * gamma)
    return np.maximum.accumulate(np.maximum(2 * lag_sum - gamma[0] - 2 * lag_moment / span, 0.0))


def redesigner(head: Callable[[int], tuple[np.ndarray, ...]], k: int,
               break_even: float | None, arl0_steps: int = DEFAULT_ARL0_STEPS, unit: str = "steps",
               threshold: Callable[..., Threshold | float] | None = None) -> Callable[[int], Design]:
    """watch's redesign: the design calibrated on a stream's first c points (a checkpoint), head(c) giving accepted,
    checked and clusters of at least those, and optionally their times (a stream held whole gives all of it; a kept
    state reads them back)."""
    def redesign(c: int) -> Design:
        held = head(c)
        design = design_for(held[0], held[1], held[2], k, break_even, arl0_steps, c, unit=unit, threshold=threshold,
                            ts_us=held[3] if len(held) > 3 else None)
        assert design is not None, "a reference that holds the first one has checked positions"
        return design
    return redesign
