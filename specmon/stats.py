"""Statistics specmon reports: distances, goodness of fit, the randomized PIT, and acceptance intervals.

Pure functions on numpy arrays; no I/O. Every interval says what it assumes in its docstring.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

# Bins whose expected count is below this are pooled before a chi-square test (Cochran's rule of thumb).
MIN_EXPECTED_PER_BIN = 5.0


@dataclass(frozen=True)
class TestResult:
    statistic: float
    pvalue: float
    dof: int | None = None


@dataclass(frozen=True)
class Interval:
    """A proportion with its interval.

    design_effect is the variance inflation from clustering (>= 1; 1 means the clusters looked independent or
    there were too few to tell), n_eff = trials / design_effect.
    """

    estimate: float
    lo: float
    hi: float
    trials: float
    clusters: int
    design_effect: float
    n_eff: float


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
    stat, pvalue = sps.chisquare(counts, expected)
    return TestResult(float(stat), float(pvalue), len(counts) - 1)


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
    return np.clip(below + rng.random(len(tokens)) * probs[rows, tokens], 0.0, 1.0)


def uniformity_ks(u: np.ndarray) -> TestResult:
    """Kolmogorov-Smirnov test of u against U(0, 1)."""
    res = sps.kstest(np.asarray(u, dtype=float), "uniform")
    return TestResult(float(res.statistic), float(res.pvalue))


def normal_quantile(confidence: float) -> float:
    """z such that a two-sided normal interval of this confidence is estimate +- z * se."""
    return float(sps.norm.ppf(0.5 + confidence / 2))


def wilson_interval(successes: float, trials: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; trials may be an effective (non-integer) count."""
    if trials <= 0:
        return math.nan, math.nan
    z = normal_quantile(confidence)
    phat = successes / trials
    denom = 1 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * math.sqrt(max(phat * (1 - phat) / trials + z * z / (4 * trials * trials), 0.0)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def cluster_robust_interval_from_sums(
    clusters: int,
    sum_a: float,
    sum_n: float,
    sum_aa: float,
    sum_an: float,
    sum_nn: float,
    confidence: float = 0.95,
) -> Interval:
    """The cluster-robust interval from per-cluster sums, so a database can do the aggregation.

    For clusters j with a_j successes in n_j trials: sum_a = sum a_j, sum_aa = sum a_j^2, sum_an = sum a_j*n_j,
    sum_nn = sum n_j^2. See cluster_robust_interval for what the interval assumes.
    """
    if sum_n <= 0:
        return Interval(math.nan, math.nan, math.nan, 0.0, clusters, math.nan, 0.0)
    alpha = sum_a / sum_n
    binomial_var = alpha * (1 - alpha) / sum_n
    design_effect = 1.0
    if clusters >= 2 and binomial_var > 0:
        resid_ss = max(sum_aa - 2 * alpha * sum_an + alpha * alpha * sum_nn, 0.0)
        robust_var = clusters / (clusters - 1) * resid_ss / (sum_n * sum_n)
        design_effect = max(1.0, robust_var / binomial_var)
    n_eff = sum_n / design_effect
    lo, hi = wilson_interval(alpha * n_eff, n_eff, confidence)
    return Interval(alpha, lo, hi, float(sum_n), int(clusters), design_effect, n_eff)


def cluster_robust_interval(successes: np.ndarray, trials: np.ndarray, confidence: float = 0.95) -> Interval:
    """Acceptance with a Wilson interval widened for correlation within clusters (requests).

    The ratio estimator alpha = sum a_j / sum n_j gets the cluster-robust (linearised) variance
    G/(G-1) * sum (a_j - alpha n_j)^2 / (sum n_j)^2; its ratio to the binomial variance is the design effect,
    and the Wilson interval is computed at n_eff = N / design_effect. Assumes clusters are independent of each
    other; with fewer than 2 clusters the spread between them cannot be estimated and the plain Wilson interval
    (independent tokens) is returned, which is then too narrow if tokens are correlated.
    """
    a = np.asarray(successes, dtype=float)
    n = np.asarray(trials, dtype=float)
    return cluster_robust_interval_from_sums(
        len(a), a.sum(), n.sum(), (a * a).sum(), (a * n).sum(), (n * n).sum(), confidence
    )


def cluster_z(sum_d: float, sum_dd: float) -> float:
    """z-score of a total D = sum_j d_j of per-cluster deviations that have mean 0 under the null.

    The variance of D is estimated by sum_j d_j^2 (valid under the null without assuming anything about the
    correlation inside a cluster). nan when there is nothing to test.
    """
    if sum_dd <= 0:
        return math.nan if sum_d == 0 else math.copysign(math.inf, sum_d)
    return sum_d / math.sqrt(sum_dd)
