"""Statistics specmon reports: distances, goodness of fit, the randomized PIT, and acceptance intervals.

Pure functions on numpy arrays; no I/O. Every interval says what it assumes in its docstring.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np

# Bins whose expected count is below this are pooled before a chi-square test (Cochran's rule of thumb).
MIN_EXPECTED_PER_BIN = 5.0
# The most lag-1 correlation SerialSums' working model takes from a series' residuals: near 1 the correction it makes
# has no bound. Requests of a 40 s median give about 0.5 at a minute's bins, of 120 s 0.6-0.7.
MAX_BIN_CORRELATION = 0.5
# First differences of standardized residuals beyond this many scaled median absolute differences are clipped before
# the working model's correlation is read from them: a level shift within a segment (a rollout, a new mix) is one or
# two such differences, and the correlation is what the noise does around it.
DIFFERENCE_CLIP_MADS = 3.0
# Up to this many bins SerialSums' matrices are dense, beyond it banded sparse ones (scipy's): the two cost the same
# at 240 bins (1.2 ms), sparse ones are the faster beyond (1.6 ms at 400, against 3.2 ms dense; 1.9 against 7.8 at
# 600). One engine's grid holds at most about 241 bins (eight bandwidths of 30 bins), so a single engine never loads
# scipy; several engines side by side hold more.
DENSE_BINS = 256
# Above this many degrees of freedom the t quantile's expansion in 1/dof is exact to float rounding (4e-15 at 3,000
# for two-sided confidences up to 0.999999, against scipy); below it the quantile is solved from the CDF.
T_EXPANSION_DOF = 3000.0
# From this many clusters the degrees of freedom's working model is fitted to the clusters' residuals (how a
# cluster's variance grows with its size); with fewer, that fit is too noisy and the exchangeable model is kept.
FITTED_MODEL_MIN_CLUSTERS = 50
# From this many clusters, a variance at or below the binomial one is taken as the binomial one with the normal
# quantile (cluster_interval); with fewer it is weak evidence that clusters do not differ (3 to 5 requests of
# correlation 0.05-0.2 fall there 7-38% of the time), and the normal quantile covered 0.90-0.95 there.
BINOMIAL_FLOOR_MIN_CLUSTERS = 10


@dataclass(frozen=True)
class TestResult:
    statistic: float
    pvalue: float
    dof: int | None = None


@dataclass(frozen=True)
class Interval:
    """A proportion with its interval.

    design_effect is the variance inflation from clustering (>= 1; 1 means the clusters looked independent or
    there were too few to tell), n_eff = trials / design_effect, dof the degrees of freedom of the t quantile the
    interval used (inf: the normal quantile).
    """

    estimate: float
    lo: float
    hi: float
    trials: float
    clusters: int
    design_effect: float
    n_eff: float
    dof: float = math.inf


@dataclass(frozen=True)
class ClusterSums:
    """Per-cluster sums of successes a_j and trials n_j that the intervals need, so a database can aggregate.

    The *_l sums weight cluster j by 1 / (1 - n_j / N) (N = sum n_j), the leverage correction of the CR2 variance;
    n3, n4 are sums of n_j^3, n_j^4, and aa_n of a_j^2 / n_j (clusters with n_j > 0), for the degrees of freedom.
    """

    clusters: int
    a: float
    n: float
    aa: float
    an: float
    nn: float
    aa_l: float
    an_l: float
    nn_l: float
    n3: float
    n4: float
    aa_n: float

    @classmethod
    def of(cls, successes: np.ndarray, trials: np.ndarray) -> ClusterSums:
        a = np.asarray(successes, dtype=float)
        n = np.asarray(trials, dtype=float)
        total = n.sum()
        share = n / total if total > 0 else np.zeros_like(n)
        # a cluster holding all trials has no CR2 weight (1 - share = 0): 1, as the database form does
        w = np.where(share < 1.0, 1.0 / np.where(share < 1.0, 1.0 - share, 1.0), 1.0)
        return cls(len(a), float(a.sum()), float(total), float((a * a).sum()), float((a * n).sum()),
                   float((n * n).sum()), float((w * a * a).sum()), float((w * a * n).sum()),
                   float((w * n * n).sum()), float((n ** 3).sum()), float((n ** 4).sum()),
                   float((a[n > 0] ** 2 / n[n > 0]).sum()))

    def ratio_variance(self) -> float:
        """CR2 (bias-reduced) variance of the ratio a/n: sum_j (a_j - r n_j)^2 / (1 - n_j/N) / N^2."""
        r = self.a / self.n
        return max(self.aa_l - 2 * r * self.an_l + r * r * self.nn_l, 0.0) / (self.n * self.n)

    def intra_correlation(self, design_effect: float) -> float:
        """rho of the exchangeable working model, solved from the design effect 1 + (sum n_j^2 / N - 1) rho."""
        mean_size = self.nn / self.n
        return min(max((design_effect - 1.0) / (mean_size - 1.0), 0.0), 1.0) if mean_size > 1 else 0.0

    def dof(self, design_effect: float) -> float:
        """Satterthwaite degrees of freedom of the variance: cluster j contributes variance in proportion to
        s_j = theta1 n_j + theta2 n_j^2, and df = (sum s_j)^2 / sum s_j^2, at most G - 1. Few clusters, or a few big
        ones whose variance grows fast with their size, give few degrees of freedom (a wider t quantile).

        From FITTED_MODEL_MIN_CLUSTERS clusters, theta is fitted to the clusters' residuals e_j = a_j - r n_j: the
        least-squares line of e_j^2 / n_j on n_j (each cluster counted once), both coefficients at least 0. Where
        a request's steps are alike only over stretches (acceptance that switches state within long requests), a
        long request's variance grows like n_j, and the fit sees it. With fewer clusters the line is too noisy (it
        gave too many degrees of freedom to 20 strongly differing requests), and the exchangeable working model is
        taken: s_j = n_j (1 + (n_j - 1) rho), rho the intra-cluster correlation solved from the design effect
        1 + (sum n_j^2 / N - 1) rho, a variance that grows like n_j^2 wherever requests differ at all."""
        if self.clusters < 2:
            return math.inf
        theta = self._fitted_growth() if self.clusters >= FITTED_MODEL_MIN_CLUSTERS else None
        if theta is None:
            rho = self.intra_correlation(design_effect)
            theta = (1 - rho, rho)
        linear, square = theta
        sum_s = linear * self.n + square * self.nn
        sum_ss = linear * linear * self.nn + 2 * linear * square * self.n3 + square * square * self.n4
        return float(min(self.clusters - 1, sum_s * sum_s / sum_ss)) if sum_ss > 0 else float(self.clusters - 1)

    def _fitted_growth(self) -> tuple[float, float] | None:
        """(theta1, theta2) of s_j = theta1 n_j + theta2 n_j^2 by least squares of e_j^2 / n_j on (1, n_j), both at
        least 0 (only their ratio matters); None where every cluster has the same size (nothing to fit)."""
        g, total, r = float(self.clusters), self.n, self.a / self.n
        spread = g * self.nn - total * total
        if spread <= 1e-9 * g * self.nn:
            return None
        per_trial = self.aa_n - 2 * r * self.a + r * r * total  # sum e_j^2 / n_j
        squares = self.aa - 2 * r * self.an + r * r * self.nn  # sum e_j^2
        linear, square = (self.nn * per_trial - total * squares) / spread, (g * squares - total * per_trial) / spread
        if square <= 0:
            return 1.0, 0.0
        if linear <= 0:
            return 0.0, 1.0
        return linear, square


class RatioSums(Protocol):
    """What an interval on a ratio of summed successes over summed trials reads: the totals, how many clusters hold
    trials, the ratio's variance and the degrees of freedom of its t quantile."""

    @property
    def clusters(self) -> int: ...

    @property
    def a(self) -> float: ...

    @property
    def n(self) -> float: ...

    def ratio_variance(self) -> float: ...

    def dof(self, design_effect: float) -> float: ...


@dataclass(frozen=True)
class SerialSums:
    """Successes and trials of a series of time bins whose noise runs across neighbouring bins (engine windows: a
    request outlives a window), with the Bartlett (Newey-West) variance of the ratio a/n.

    Bins lie on a regular grid, empty bins as zeros, separate series (engines) at least `lags` empty bins apart, so
    only bins of one series within `lags` of each other are paired. Variance: sum_ij w_ij e_i e_j / N^2 with
    e_j = a_j - r n_j and Bartlett weights w = 1 - |i - j| / (lags + 1), which keeps it positive and counts the
    covariance of bins up to `lags` apart (a request shorter than the bandwidth is counted almost whole). Two
    finite-sample corrections, as CR2 and Bell-McCaffrey make for clusters, under a working model S of the bins'
    covariance: variances s_j = n_j (1 + (n_j - 1) rho) (rho from the bins' own CR2 design effect,
    ClusterSums.intra_correlation), correlated phi^|i - j| up to `lags` apart (phi: bin_persistence, from the
    residuals themselves). The estimate is scaled by 1'S1 / tr(A S) so that it is unbiased under that model: the
    residuals are centred on the estimate and the weights shrink long lags, and both take the more away the longer
    the noise persists beside the span. The degrees of freedom are Satterthwaite's for that quadratic form,
    tr(A S)^2 / tr((A S)^2), which are few where the span is not much longer than the bandwidth or the noise
    persists (the t quantile then widens the interval). Assumes noise more than `lags` bins apart is independent.
    """

    clusters: int
    a: float
    n: float
    variance: float
    degrees: float

    @classmethod
    def of(cls, successes: np.ndarray, trials: np.ndarray, lags: int, rho: float | None = None) -> SerialSums:
        """`rho`: the working model's correlation of a bin's units; None solves it from the bins' design effect
        against the binomial variance, which needs successes that are counts of trials (a proportion)."""
        a = np.asarray(successes, dtype=float)
        n = np.asarray(trials, dtype=float)
        total, held = float(n.sum()), int((n > 0).sum())
        if held < 2:
            return cls(held, float(a.sum()), total, math.nan, math.inf)
        r = a.sum() / total
        e = a - r * n
        if rho is None:
            bins = ClusterSums.of(a, n)
            binomial = r * (1 - r) / total
            rho = bins.intra_correlation(max(1.0, bins.ratio_variance() / binomial) if binomial > 0 else 1.0)
        s = n * (1 + (n - 1) * rho)
        raw, trace, square, target = _serial_forms(e, n / total, s, n > 0, min(lags, len(a) - 1))
        if trace <= 0 or square <= 0:
            return cls(held, float(a.sum()), total, math.nan, math.inf)
        return cls(held, float(a.sum()), total, raw * target / trace / (total * total),
                   min(trace * trace / square, held - 1.0))

    def ratio_variance(self) -> float:
        return self.variance

    def dof(self, design_effect: float) -> float:
        return self.degrees


def bin_persistence(z: np.ndarray, held: np.ndarray) -> float:
    """The lag-1 correlation phi of SerialSums' working model (geometric persistence), from standardized residuals
    `z` of bins on the grid (`held`: the bins with trials; no pair spans an empty one), 0 where nothing varies or it
    is negative, at most MAX_BIN_CORRELATION.

    Two readings, each biased up by something different, and the smaller is taken. The residuals' own lag-1
    correlation counts a level the series holds for hours (a rollout, a new mix within a segment) as persistence.
    Their first differences do not (a level shift is one or two differences, clipped at DIFFERENCE_CLIP_MADS scaled
    median absolute differences), and under geometric persistence their lag-1 correlation is -(1 - phi) / 2; but
    where the noise is tied over a few bins and then stops (short requests), that reading is above the lag-1
    correlation (1/3 where the correlation is 0.25 at one bin and 0 at two)."""
    valid = held[1:] & held[:-1]
    pairs = valid[1:] & valid[:-1]
    if not pairs.any():
        return 0.0
    level = float(z[held] @ z[held])
    direct = float((z[:-1] * z[1:])[valid].sum()) / level if level > 0 else 0.0
    d = np.diff(z)
    cut = DIFFERENCE_CLIP_MADS * 1.4826 * float(np.median(np.abs(d[valid])))
    d = np.clip(d, -cut, cut)
    spread = float((d[:-1] ** 2 + d[1:] ** 2)[pairs].sum()) / 2
    differenced = 1.0 + 2.0 * float((d[:-1] * d[1:])[pairs].sum()) / spread if spread > 0 else 0.0
    return min(max(min(direct, differenced), 0.0), MAX_BIN_CORRELATION)


@functools.lru_cache(maxsize=16)
def _band_lags(size: int, lags: int) -> tuple[np.ndarray, np.ndarray]:
    """The lag |i - j| of a grid of `size` bins, as lags + 1 beyond the band, and the Bartlett weights W on it (kept:
    a page asks for many intervals on grids of one size)."""
    lag = np.minimum(np.abs(np.subtract.outer(np.arange(size), np.arange(size))), lags + 1)
    weights = 1.0 - lag / (lags + 1)
    lag.flags.writeable = weights.flags.writeable = False
    return lag, weights


def _band_matrices(root: np.ndarray, phi: float, lags: int) -> tuple[Any, Any]:
    """SerialSums' Bartlett weights W (1 - |i - j| / (lags + 1)) and working covariance S (phi^|i - j| root_i root_j)
    up to `lags` apart: numpy arrays for grids up to DENSE_BINS bins (the usual engine: dense products are faster
    there, and scipy stays unloaded), else scipy sparse ones."""
    size = len(root)
    powers = np.append(phi ** np.arange(lags + 1), 0.0)
    if size <= DENSE_BINS:
        lag, w = _band_lags(size, lags)
        return w, powers[lag] * np.outer(root, root)
    from scipy import sparse

    offsets = np.arange(-lags, lags + 1)
    w = sparse.diags([np.full(size - abs(k), 1.0 - abs(k) / (lags + 1)) for k in offsets], offsets, format="csr")
    cov = sparse.diags([powers[abs(k)] * root[:size - abs(k)] * root[abs(k):] for k in offsets], offsets, format="csr")
    return w, cov


def _serial_forms(e: np.ndarray, v: np.ndarray, s: np.ndarray, held: np.ndarray,
                  lags: int) -> tuple[float, float, float, float]:
    """e'We, tr(A S), tr((A S)^2) and 1'S1 of SerialSums: A = C' W C (C = I - v 1' centres the residuals e = C a,
    W the Bartlett weights), S_ij = phi^|i - j| sqrt(s_i s_j) up to `lags` apart (phi: bin_persistence). A is kept
    as W plus its low-rank part, so everything is a banded product or a vector."""
    root = np.sqrt(s)
    z = np.divide(e, root, out=np.zeros_like(e), where=root > 0)
    w, cov = _band_matrices(root, bin_persistence(z, held), lags)
    wv = w @ v
    c = float(v @ wv)
    ones = np.ones(len(e))
    g, h, p = cov @ ones, cov @ wv, c * ones - wv
    m = w @ cov  # A S = M + p g' - 1 h', since A = W + c 11' - wv 1' - 1 wv'
    pairs = float(m.multiply(m.T).sum()) if hasattr(m, "multiply") else float((m * m.T).sum())  # tr(M M)
    trace = float(m.diagonal().sum() + p @ g - h.sum())
    square = pairs + 2 * float(g @ (m @ p)) - 2 * float(h @ (m @ ones)) + float(g @ p) ** 2 \
        - 2 * float(g.sum()) * float(h @ p) + float(h.sum()) ** 2
    return float(e @ (w @ e)), trace, square, float(g.sum())


def tv_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Total-variation distance 0.5 * sum |p - q| between two distributions (or normalised counts)."""
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


def chi_square_gof(counts: np.ndarray, p: np.ndarray) -> TestResult:
    """Pearson chi-square test that `counts` were drawn from the distribution `p`.

    Bins with an expected count under 5 are pooled into one bin first, so the chi-square approximation holds.
    """
    counts = np.asarray(counts, dtype=float)
    p = np.asarray(p, dtype=float)
    if counts.shape != p.shape:
        raise ValueError(f"counts and p must have the same shape, got {counts.shape} and {p.shape}")
    n = counts.sum()
    if n <= 0:
        raise ValueError("chi-square needs at least one observation")
    expected = p / p.sum() * n
    small = expected < MIN_EXPECTED_PER_BIN
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    keep = expected > 0
    if (counts[~keep] > 0).any():
        return TestResult(math.inf, 0.0, int(keep.sum()) - 1)
    counts, expected = counts[keep], expected[keep]
    if len(counts) < 2:
        return TestResult(0.0, 1.0, 0)
    stat = float(np.sum((counts - expected) ** 2 / expected))
    # scipy.special takes a tenth of a second to import; only the losslessness tests need it
    from scipy import special

    return TestResult(stat, float(special.chdtrc(len(counts) - 1, stat)), len(counts) - 1)


def randomized_pit(probs: np.ndarray, tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Randomized probability integral transform of tokens under per-position distributions.

    u_t = F_t(x_t - 1) + v_t * p_t(x_t), v_t ~ U(0, 1), in the vocabulary's index order. If each x_t was drawn
    from p_t, the u_t are i.i.d. U(0, 1), however much p_t changes from position to position.
    """
    probs = np.asarray(probs, dtype=float)
    tokens = np.asarray(tokens, dtype=np.int64)
    if probs.ndim != 2 or probs.shape[0] != tokens.shape[0]:
        raise ValueError(f"probs must be (n, vocab) with one row per token, got {probs.shape} for {tokens.shape}")
    rows = np.arange(len(tokens))
    below = np.cumsum(probs, axis=1)[rows, tokens] - probs[rows, tokens]
    return randomized_pit_of(below, probs[rows, tokens], rng)


def randomized_pit_of(below: np.ndarray, mass: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """randomized_pit from each token's F_t(x_t - 1) (below) and p_t(x_t) (mass), as step logs store them."""
    below = np.asarray(below, dtype=float)
    return np.clip(below + rng.random(len(below)) * np.asarray(mass, dtype=float), 0.0, 1.0)


def uniformity_ks(u: np.ndarray) -> TestResult:
    """Kolmogorov-Smirnov test of u against U(0, 1) (exact p-value for small samples, as scipy computes it)."""
    # scipy.stats takes half a second to import; only this test needs it, so the dashboard's first page need not
    from scipy import stats as sps

    res = sps.kstest(np.asarray(u, dtype=float), "uniform")
    return TestResult(float(res.statistic), float(res.pvalue))


def normal_quantile(confidence: float) -> float:
    """z such that a two-sided normal interval of this confidence is estimate +- z * se."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


@functools.lru_cache(maxsize=4096)
def t_quantile(confidence: float, dof: float) -> float:
    """The two-sided t quantile with dof degrees of freedom (the normal one at dof = inf; nan unless dof > 0).

    Computed here rather than by scipy.special, whose import costs every fresh `specmon summary` a tenth of a
    second: above T_EXPANSION_DOF by the expansion of t in powers of 1/dof (docs/math.md, "Intervals"), below it
    by safeguarded Newton steps on the CDF from that start. Agrees with scipy's stdtrit to about 1e-13 relative
    (tests/core/test_stats.py).
    """
    z = normal_quantile(confidence)
    if math.isinf(dof) or not dof > 0:
        return z if math.isinf(dof) else math.nan
    t = _t_expansion(z, dof)
    if dof > T_EXPANSION_DOF:
        return t
    tail = 1 - (0.5 + confidence / 2)  # the upper tail exactly as the two-sided confidence rounds it
    if not t > 0:
        t = z
    lo, hi = 0.0, math.inf  # t_upper_tail is decreasing: the root stays in [lo, hi]
    for _ in range(200):
        excess = t_upper_tail(t, dof) - tail
        if excess > 0:
            lo = t
        else:
            hi = t
        step = t + excess / t_density(t, dof)
        if not lo < step < hi:
            step = (lo + hi) / 2 if math.isfinite(hi) else 2 * t + 1
        if abs(step - t) <= 4e-16 * t:
            return step
        t = step
    return t


def _t_expansion(z: float, dof: float) -> float:
    """The t quantile from the normal one z in powers of 1/dof, to the fourth (Cornish-Fisher; error O(dof^-5))."""
    z2 = z * z
    g1 = (z2 + 1) * z / 4
    g2 = ((5 * z2 + 16) * z2 + 3) * z / 96
    g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384
    g4 = ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160
    return z + (g1 + (g2 + (g3 + g4 / dof) / dof) / dof) / dof


def t_upper_tail(t: float, dof: float) -> float:
    """P(T > t) for Student's t with dof degrees of freedom and t >= 0: I_x(dof / 2, 1/2) / 2, x = dof / (dof + t^2),
    the regularized incomplete beta function by its continued fraction."""
    a = dof / 2
    u = t * t / dof
    x, y = 1 / (1 + u), u / (1 + u)  # y = 1 - x without the cancellation
    if y == 0:
        return 0.5
    # log of x^a y^(1/2) / B(a, 1/2), where B(a, 1/2) = Gamma(a) Gamma(1/2) / Gamma(a + 1/2)
    log_front = -a * math.log1p(u) + 0.5 * math.log(y) + _log_gamma_half_ratio(a) - 0.5 * math.log(math.pi)
    if x < (a + 1) / (a + 2.5):  # where the fraction converges fast; else by I_x(a, b) = 1 - I_y(b, a)
        return math.exp(log_front) * _beta_fraction(x, a, 0.5) / a / 2
    return (1 - math.exp(log_front) * _beta_fraction(y, 0.5, a) / 0.5) / 2


def t_density(t: float, dof: float) -> float:
    """Student's t density with dof degrees of freedom."""
    a = dof / 2
    return math.exp(_log_gamma_half_ratio(a) - (a + 0.5) * math.log1p(t * t / dof)) / math.sqrt(dof * math.pi)


def _log_gamma_half_ratio(a: float) -> float:
    """log(Gamma(a + 1/2) / Gamma(a)); for large a by its asymptotic series, where a difference of lgamma's would
    lose digits to cancellation (its terms after these are below 1e-16 from a = 50)."""
    if a < 50:
        return math.log(math.gamma(a + 0.5) / math.gamma(a))
    a2 = a * a
    return 0.5 * math.log(a) - 1 / (8 * a) + 1 / (192 * a * a2) - 1 / (640 * a * a2 * a2) + 17 / (14336 * a * a2 ** 3)


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of the incomplete beta function I_x(a, b), by the modified Lentz method."""
    tiny = 1e-300

    def guard(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1 / guard(1 - (a + b) * x / (a + 1))
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1 / guard(1 + num * d)
            c = guard(1 + num / c)
            h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return h


def wilson_interval(successes: float, trials: float, confidence: float = 0.95,
                    dof: float = math.inf) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; trials may be an effective (non-integer) count. With a
    finite dof the normal quantile is replaced by the t quantile (for a variance estimated from few clusters)."""
    if trials <= 0:
        return math.nan, math.nan
    z = t_quantile(confidence, dof)
    phat = successes / trials
    denom = 1 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * math.sqrt(max(phat * (1 - phat) / trials + z * z / (4 * trials * trials), 0.0)) / denom
    # at phat = 0 or 1 the bound is exactly 0 or 1; centre -+ half would miss it by a rounding
    return (0.0 if phat <= 0 else max(0.0, centre - half)), (1.0 if phat >= 1 else min(1.0, centre + half))


def cluster_interval(sums: RatioSums, confidence: float = 0.95) -> Interval:
    """Acceptance a/n with an interval widened for correlation within clusters (requests; for engine windows, the
    neighbouring bins of SerialSums), built to hold with few clusters (docs/math.md, "Intervals").

    Variance: sums.ratio_variance(), for requests the bias-reduced cluster-robust (CR2) variance of the ratio
    estimator, whose ratio to the binomial variance is the design effect (floored at 1); the quantile is Student's t
    at the Satterthwaite degrees of freedom of sums.dof (ClusterSums.dof, SerialSums.dof) instead of z. Why: with 20
    clusters the plain cluster-robust variance is biased low and z ignores its noise; both make intervals too short.
    Where at least BINOMIAL_FLOOR_MIN_CLUSTERS clusters vary no more than binomial counts would (the floor holds),
    the variance taken is the binomial one, which follows from alpha and N and is not estimated from the clusters, so
    the quantile is z: the t quantile there made the interval too wide where requests do not differ (coverage
    0.981-0.992 at 20 requests in the study, 0.967-0.979 with z). The Interval's dof stays the clusters' (L's
    interval reads it with their variance).
    Shape: the hull of two intervals, the Wilson score interval at n_eff = N / design effect (right near 0 and 1)
    and the interval on the log scale, alpha * exp(+-t se / alpha) (log_ratio_bounds): with few clusters of unequal
    acceptance the ratio estimator is skewed to the right (a sample short of the rare good, long requests is low
    *and* looks steady), which the Wilson interval, drawn towards 1/2, makes worse; the log scale follows it (the
    study in docs/drift.md measures both tails). Assumes clusters are independent of each other. With fewer than 2
    clusters the spread between them cannot be estimated and the plain Wilson interval (independent tokens) is
    returned, which is then too narrow if tokens are correlated.
    """
    if sums.n <= 0:
        return Interval(math.nan, math.nan, math.nan, 0.0, sums.clusters, math.nan, 0.0)
    alpha = sums.a / sums.n
    binomial_var = alpha * (1 - alpha) / sums.n
    design_effect, dof, quantile_dof = 1.0, math.inf, math.inf
    if sums.clusters >= 2:
        variance = sums.ratio_variance()
        if binomial_var > 0:
            design_effect = max(1.0, variance / binomial_var)
        dof = sums.dof(design_effect)
        if binomial_var == 0 or variance > binomial_var or sums.clusters < BINOMIAL_FLOOR_MIN_CLUSTERS:
            quantile_dof = dof
    n_eff = sums.n / design_effect
    lo, hi = wilson_interval(alpha * n_eff, n_eff, confidence, quantile_dof)
    if sums.clusters >= 2 and binomial_var > 0:
        log_lo, log_hi = log_ratio_bounds(alpha, math.sqrt(binomial_var * design_effect),
                                          t_quantile(confidence, quantile_dof))
        lo, hi = min(lo, log_lo), min(1.0, max(hi, log_hi))
    return Interval(alpha, lo, hi, float(sums.n), int(sums.clusters), design_effect, n_eff, dof)


def log_ratio_bounds(ratio: float, se: float, quantile: float) -> tuple[float, float]:
    """ratio * exp(+-quantile * se / ratio): a normal interval for log(ratio) by the delta method, for a positive
    ratio estimator whose sampling distribution is skewed to the right."""
    spread = quantile * se / ratio
    return ratio * math.exp(-spread), ratio * math.exp(spread)


def cluster_robust_interval(successes: np.ndarray, trials: np.ndarray, confidence: float = 0.95) -> Interval:
    """cluster_interval from per-cluster successes and trials."""
    return cluster_interval(ClusterSums.of(successes, trials), confidence)


def ratio_interval(sums: RatioSums, dof: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """Interval for a positive ratio of per-cluster totals that is not a proportion (tokens per step: accepted /
    steps), with the CR2 variance and the given degrees of freedom: the hull of the normal-shape interval
    r +- t se and the log-scale one r exp(+-t se / r) (log_ratio_bounds), that is [r - t se, r exp(t se / r)].
    Why the log scale above: the estimator is skewed to the right when few clusters differ (the normal-shape
    interval alone missed high truths four times as often as low ones in the study); why the normal shape below:
    where clusters hardly differ the log scale's lower end is too high. None with under 2 clusters."""
    if sums.clusters < 2 or sums.n <= 0:
        return None
    r = sums.a / sums.n
    se = math.sqrt(sums.ratio_variance())
    q = t_quantile(confidence, dof)
    return r - q * se, (log_ratio_bounds(r, se, q)[1] if r > 0 else q * se)


def cluster_z(sum_d: float, sum_dd: float) -> float:
    """z-score of a total D = sum_j d_j of per-cluster deviations that have mean 0 under the null.

    The variance of D is estimated by sum_j d_j^2 (valid under the null without assuming anything about the
    correlation inside a cluster). nan when there is nothing to test.
    """
    if sum_dd <= 0:
        return math.nan if sum_d == 0 else math.copysign(math.inf, sum_d)
    return sum_d / math.sqrt(sum_dd)
