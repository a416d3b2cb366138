"""specmon's own t and normal quantiles against scipy's, and the import they spare the command line."""
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

from specmon.core import stats

CONFIDENCES = (0.01, 0.1, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999, 0.9999, 0.999999)


def test_t_quantile_matches_scipy_from_a_fifth_of_a_degree_of_freedom_to_ten_million():
    dofs = np.exp(np.linspace(np.log(0.2), np.log(1e7), 120))
    dofs = np.concatenate([dofs, [1, 2, 3, 19, 49.9, 50, 50.1, stats.T_EXPANSION_DOF - 1, stats.T_EXPANSION_DOF,
                                  stats.T_EXPANSION_DOF + 1]])
    for dof in dofs:
        for confidence in CONFIDENCES:
            mine = stats.t_quantile(confidence, float(dof))
            theirs = float(special.stdtrit(dof, 0.5 + confidence / 2))
            assert mine == pytest.approx(theirs, rel=1e-13), (dof, confidence)


def test_t_quantile_edges():
    assert stats.t_quantile(0.95, float("inf")) == stats.normal_quantile(0.95)
    assert np.isnan(stats.t_quantile(0.95, 0.0))
    assert stats.t_quantile(0.95, 1.0) == pytest.approx(np.tan(np.pi * 0.975 - np.pi / 2), rel=1e-14)


def test_t_tail_and_density_match_scipy():
    for dof in (0.7, 1.0, 4.0, 19.0, 250.0, 2999.0):
        for t in (0.0, 0.3, 1.96, 4.0, 30.0):
            assert stats.t_upper_tail(t, dof) == pytest.approx(float(special.stdtr(dof, -t)), rel=1e-12, abs=1e-300)
            density = float(np.exp(special.gammaln((dof + 1) / 2) - special.gammaln(dof / 2))
                            / np.sqrt(dof * np.pi) * (1 + t * t / dof) ** (-(dof + 1) / 2))
            assert stats.t_density(t, dof) == pytest.approx(density, rel=1e-12)


def test_normal_quantile_matches_scipy():
    for confidence in CONFIDENCES:
        assert stats.normal_quantile(confidence) == pytest.approx(float(special.ndtri(0.5 + confidence / 2)),
                                                                  rel=1e-15, abs=1e-16)


def test_the_statistics_load_no_scipy():
    code = ("import sys, specmon.core.stats, specmon.analysis.summary; "
            "print(sorted(m for m in sys.modules if m.startswith('scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _sums_with_residuals(sizes: np.ndarray, residuals: np.ndarray, rate: float = 0.6) -> stats.ClusterSums:
    """Clusters of the given sizes whose successes lie `residuals` from rate x size (residuals summing to 0)."""
    return stats.ClusterSums.of(rate * sizes + residuals, sizes.astype(float))


def _exchangeable_dof(sizes: np.ndarray, rho: float) -> float:
    """Satterthwaite's df with s_j = n_j (1 + (n_j - 1) rho), at most G - 1."""
    s = sizes * (1 + (sizes - 1) * rho)
    return min(len(sizes) - 1.0, s.sum() ** 2 / (s * s).sum())


def test_degrees_of_freedom_follow_how_a_cluster_s_variance_grows_with_its_size():
    sizes = np.repeat(np.geomspace(2, 500, 40).round(), 2)  # 80 clusters, in pairs so signs can alternate
    signs = np.tile([1.0, -1.0], 40)
    # squared residuals that grow like the size: the fitted variance grows like n_j
    linear = _sums_with_residuals(sizes, signs * np.sqrt(0.2 * sizes))
    assert linear.dof(3.0) == pytest.approx(sizes.sum() ** 2 / (sizes ** 2).sum())
    # like the size squared, as where requests differ: n_j^2
    square = _sums_with_residuals(sizes, signs * 0.2 * sizes)
    assert square.dof(3.0) == pytest.approx((sizes ** 2).sum() ** 2 / (sizes ** 4).sum())
    # the exchangeable model, at the rho the design effect gives, would have read the first as the second
    exchangeable = _exchangeable_dof(sizes, linear.intra_correlation(3.0))
    assert linear.dof(3.0) > 1.5 * exchangeable
    # under 50 clusters the exchangeable model is kept, whatever the residuals say
    few = _sums_with_residuals(sizes[:40], (signs * np.sqrt(0.2 * sizes))[:40])
    assert few.clusters < stats.FITTED_MODEL_MIN_CLUSTERS
    assert few.dof(3.0) == pytest.approx(_exchangeable_dof(sizes[:40], few.intra_correlation(3.0)))


def _state_switching(rng: np.random.Generator, requests: int, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Per request accepted and checked positions where acceptance switches state within a request: copy-like
    stretches (each position accepted 0.9) and hard ones (0.4), a switch after a step with probability 1/20, each
    request starting in either at random; lognormal lengths (mean 40 steps, sigma 1.5: a few requests hold most
    steps)."""
    sizes = np.maximum(1, np.round(rng.lognormal(np.log(40.0) - 1.5 ** 2 / 2, 1.5, requests))).astype(np.int64)
    request = np.repeat(np.arange(requests), sizes)
    flips = np.cumsum(rng.random(len(request)) < 1 / 20)
    flips -= np.repeat(flips[np.cumsum(sizes) - sizes], sizes)
    copy = np.repeat(rng.random(requests) < 0.5, sizes) ^ (flips % 2 == 1)
    alive, accepted = np.ones(len(request), dtype=bool), []
    for _ in range(k):
        alive &= rng.random(len(request)) < np.where(copy, 0.9, 0.4)
        accepted.append(np.bincount(request, weights=alive, minlength=requests))
    return np.sum(accepted, axis=0), sizes + np.sum(accepted[:-1], axis=0)


def test_alpha_covers_where_acceptance_switches_state_within_long_requests(monkeypatch):
    """A long request's variance grows like its length there, not its square: the fitted working model's degrees
    of freedom bring the interval into 0.94-0.97, where the exchangeable model's few made it too wide."""
    reach = np.array([0.5 * 0.9 ** i + 0.5 * 0.4 ** i for i in range(5)])
    truth = reach[1:].sum() / reach[:4].sum()

    def coverage() -> float:
        rng = np.random.default_rng(1)
        intervals = [stats.cluster_robust_interval(*_state_switching(rng, 200)) for _ in range(4000)]
        return float(np.mean([iv.lo <= truth <= iv.hi for iv in intervals]))

    assert 0.94 <= coverage() <= 0.97  # Monte-Carlo standard error 0.0035
    monkeypatch.setattr(stats, "FITTED_MODEL_MIN_CLUSTERS", 10 ** 9)  # the exchangeable model at every size
    assert coverage() > 0.97
