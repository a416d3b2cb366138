"""Statistics specmon reports: distances, goodness of fit, the randomized PIT, and acceptance intervals.

Pure functions on numpy arrays; no I/O. Every interval says what it assumes in its docstring.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

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
    n3, n4 are sums of n_j^3, n_j^4 for the degrees of freedom.
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
                   float((w * n * n).sum()), float((n ** 3).sum()), float((n ** 4).sum()))

    def ratio_variance(self) -> float:
        """CR2 (bias-reduced) variance of the ratio a/n: sum_j (a_j - r n_j)^2 / (1 - n_j/N) / N^2."""
        r = self.a / self.n
        return max(self.aa_l - 2 * r * self.an_l + r * r * self.nn_l, 0.0) / (self.n * self.n)

    def dof(self, design_effect: float) -> float:
        """Satterthwaite degrees of freedom of the variance under the exchangeable working model: cluster j
        contributes variance proportional to s_j = n_j (1 + (n_j - 1) rho), with rho, the intra-cluster
        correlation, solved from the design effect 1 + (sum n_j^2 / N - 1) rho. df = (sum s_j)^2 / sum s_j^2,
        at most G - 1. Few clusters, or a few big ones, give few degrees of freedom (a wider t quantile)."""
        if self.clusters < 2:
            return math.inf
        mean_size = self.nn / self.n
        rho = min(max((design_effect - 1.0) / (mean_size - 1.0), 0.0), 1.0) if mean_size > 1 else 0.0
        # s_j = (1 - rho) n_j + rho n_j^2
        sum_s = (1 - rho) * self.n + rho * self.nn
        sum_ss = (1 - rho) ** 2 * self.nn + 2 * rho * (1 - rho) * self.n3 + rho * rho * self.n4
        return float(min(self.clusters - 1, sum_s * sum_s / sum_ss)) if sum_ss > 0 else float(self.clusters - 1)


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
    return float(special.ndtri(0.5 + confidence / 2))


def t_quantile(confidence: float, dof: float) -> float:
    """The two-sided t quantile with dof degrees of freedom (the normal one at dof = inf)."""
    return normal_quantile(confidence) if math.isinf(dof) else float(special.stdtrit(dof, 0.5 + confidence / 2))


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
    return max(0.0, centre - half), min(1.0, centre + half)


def cluster_interval(sums: ClusterSums, confidence: float = 0.95) -> Interval:
    """Acceptance a/n with an interval widened for correlation within clusters (requests, engine windows), built to
    hold with few clusters (docs/math.md, "Intervals").

    Variance: the bias-reduced cluster-robust (CR2) variance of the ratio estimator, whose ratio to the binomial
    variance is the design effect (floored at 1); the quantile is Student's t at the Satterthwaite degrees of
    freedom of ClusterSums.dof instead of z. Why: with 20 clusters the plain cluster-robust variance is biased low
    and z ignores its noise; both make intervals too short. Shape: the hull of two intervals, the Wilson score
    interval at n_eff = N / design effect (right near 0 and 1) and the interval on the log scale,
    alpha * exp(+-t se / alpha) (log_ratio_bounds): with few clusters of unequal acceptance the ratio estimator is
    skewed to the right (a sample short of the rare good, long requests is low *and* looks steady), which the
    Wilson interval, drawn towards 1/2, makes worse; the log scale follows it (the study in docs/drift.md measures
    both tails). Assumes clusters are independent of each other. With fewer than 2 clusters the spread between
    them cannot be estimated and the plain Wilson interval (independent tokens) is returned, which is then too
    narrow if tokens are correlated.
    """
    if sums.n <= 0:
        return Interval(math.nan, math.nan, math.nan, 0.0, sums.clusters, math.nan, 0.0)
    alpha = sums.a / sums.n
    binomial_var = alpha * (1 - alpha) / sums.n
    design_effect, dof = 1.0, math.inf
    if sums.clusters >= 2:
        if binomial_var > 0:
            design_effect = max(1.0, sums.ratio_variance() / binomial_var)
        dof = sums.dof(design_effect)
    n_eff = sums.n / design_effect
    lo, hi = wilson_interval(alpha * n_eff, n_eff, confidence, dof)
    if sums.clusters >= 2 and binomial_var > 0:
        log_lo, log_hi = log_ratio_bounds(alpha, math.sqrt(binomial_var * design_effect), t_quantile(confidence, dof))
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


def ratio_interval(sums: ClusterSums, dof: float, confidence: float = 0.95) -> tuple[float, float] | None:
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
