"""Speedup at load (specmon.core.load): the interval of S = mean(spec) / mean(base) holds its level on noise that is
not the normal its delta method assumes; the crossing and the best-k policy read a measured curve as the README's
JSON promises; E[L(k')] from measured per-position rates, with its interval, on steps whose acceptance falls with
the position and varies between requests (not the i.i.d. model)."""
import math

import numpy as np
import pytest

from specmon.core import load, stats, theory


def _noise(rng: np.random.Generator, kind: str, n: int, cv: float) -> np.ndarray:
    """Multiplicative measurement noise with mean 1 and coefficient of variation cv, of a few shapes."""
    if kind == "lognormal":
        return np.exp(cv * rng.standard_normal(n) - cv ** 2 / 2)
    if kind == "heavy":  # Student's t with 3 degrees of freedom: rare large outliers
        return 1 + cv / math.sqrt(3) * rng.standard_t(3, n)
    if kind == "gamma":
        shape = 1 / cv ** 2
        return rng.gamma(shape, 1 / shape, n)
    return 1 + cv * rng.standard_normal(n)


def test_a_mean_of_windows_without_pairing_gives_the_repeats_interval():
    """With one window a bin and nothing paired (lags 0), SerialSums' variance of the mean is s^2 / n at n - 1
    degrees of freedom, so the speedup of two such means is the repeats' speedup exactly."""
    rng = np.random.default_rng(4)
    x, y = 120 * _noise(rng, "gamma", 12, 0.1), 100 * _noise(rng, "gamma", 9, 0.1)
    sums = [stats.SerialSums.of(v, np.ones(len(v)), 0, rho=0.0) for v in (x, y)]
    assert [s.dof(1.0) for s in sums] == pytest.approx([11, 8])
    paired, repeats = load.speedup_of_means(*sums), load.speedup(x, y)
    assert (paired.estimate, paired.lo, paired.hi, paired.dof) == pytest.approx(
        (repeats.estimate, repeats.lo, repeats.hi, repeats.dof), rel=1e-12)


@pytest.mark.parametrize("kind", ["normal", "lognormal", "heavy", "gamma"])
@pytest.mark.parametrize("repeats", [3, 5, 10])
def test_the_speedup_interval_covers_the_true_speedup(kind, repeats):
    """4,000 simulated sweeps a cell (Monte-Carlo error of the coverage about 0.0035), the two sides measured with
    different noise and counts."""
    rng = np.random.default_rng(repeats * 31 + len(kind))
    true = 1.2
    hits = 0
    for _ in range(4000):
        s = load.speedup(1200 * _noise(rng, kind, repeats, 0.04), 1000 * _noise(rng, kind, repeats + 1, 0.02))
        hits += s.lo <= true <= s.hi
    assert 0.93 <= hits / 4000 <= 0.975, hits / 4000


def test_one_measurement_a_side_has_no_interval_and_says_so():
    s = load.speedup([120.0], [100.0, 101.0])
    assert s.estimate == pytest.approx(120 / 100.5) and s.lo is None and s.verdict == "unknown"
    with pytest.raises(ValueError):
        load.speedup([1.0], [])


def _curve(points: list[tuple[float, float, float]]) -> tuple[list[float], list[load.Speedup]]:
    return [n for n, _, _ in points], [load.Speedup(s, s - h, s + h, 10.0) for _, s, h in points]


def test_a_curve_that_crosses_gives_the_last_paying_and_first_losing_concurrency():
    """The public paired runs' shape (vLLM 0.6.3, Qwen2.5-7B with its AWQ copy as draft, k = 1): +23%, +13%, +3%, -9%,
    -16%, -16% at batch 1, 4, 8, 16, 24, 32."""
    n, s = _curve([(1, 1.23, 0.02), (4, 1.13, 0.02), (8, 1.03, 0.05), (16, 0.91, 0.02), (24, 0.84, 0.02),
                   (32, 0.84, 0.02)])
    c = load.crossing(n, s)
    assert (c.pays_up_to, c.loses_from) == (8, 16) and 8 < c.break_even < 16
    assert (c.lo, c.hi) == (4, 16)  # at 8 the interval holds 1: N* is surely above 4 only
    assert "loses from 16" in c.describe()


def test_a_curve_that_loses_at_batch_1_and_pays_above_crosses_where_it_stops_paying():
    n, s = _curve([(1, 0.95, 0.02), (2, 1.2, 0.02), (4, 1.1, 0.02), (16, 0.8, 0.02)])
    c = load.crossing(n, s)
    assert (c.pays_up_to, c.loses_from) == (4, 16)


@pytest.mark.parametrize("points, words", [
    ([(1, 1.3, 0.01), (8, 1.2, 0.01), (32, 1.05, 0.01)], "does not cross 1 within N = 1..32"),
    ([(1, 0.9, 0.01), (8, 0.8, 0.01)], "does not cross 1 within N = 1..8"),
])
def test_a_curve_that_does_not_cross_says_so(points, words):
    c = load.crossing(*_curve(points))
    assert c.pays_up_to is None and c.loses_from is None and c.describe() == words


def test_the_best_k_by_concurrency_makes_bands_and_says_how_sure_they_are():
    levels = [1, 8, 16, 32]
    by_k = {2: [load.Speedup(1.8, 1.7, 1.9, 9), load.Speedup(1.7, 1.65, 1.75, 9), load.Speedup(1.1, 1.05, 1.15, 9),
                load.Speedup(0.8, 0.75, 0.85, 9)],
            4: [load.Speedup(2.2, 2.1, 2.3, 9), load.Speedup(1.5, 1.45, 1.55, 9), None,
                load.Speedup(0.6, 0.55, 0.65, 9)]}
    bands = load.best_k(levels, by_k)
    assert [(b.first, b.max_concurrency, b.k, b.sure) for b in bands] == [
        (1, 1, 4, True), (8, 16, 2, True), (32, None, 0, True)]
    words = load.describe_policy(bands, 32)
    assert words.startswith("k = 4 up to 1 running requests, k = 2 from 8 up to 16") and "off from 32" in words
    unsure = load.best_k([1], {2: [load.Speedup(1.02, 0.98, 1.06, 9)]})
    assert unsure[0].k == 2 and not unsure[0].sure


def _steps(rng: np.random.Generator, requests: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Accepted prefixes of steps drafting k: acceptance falls with the position (0.9, 0.75, 0.6, 0.5) and each
    request scales it by its own factor, so positions and steps are neither alike nor independent."""
    base = np.array([0.9, 0.75, 0.6, 0.5])[:k]
    out, req = [], []
    for r in range(requests):
        scale = rng.uniform(0.6, 1.1)
        for _ in range(rng.integers(5, 40)):
            accept = rng.random(k) < np.clip(base * scale, 0, 1)
            out.append(int(np.argmin(accept)) if not accept.all() else k)
            req.append(r)
    return np.array(out), np.array(req)


@pytest.mark.slow  # a Monte-Carlo coverage check
def test_tokens_per_step_of_a_shorter_draft_from_the_rates_covers_its_truth():
    """E[L(k')] = 1 + sum of the cumulative rates up to k' equals the mean of 1 + min(A, k') of the same steps, and
    its interval, widened by the design effect of L's request-clustered interval, covers the true value in about 95%
    of 400 logs of 60 requests."""
    rng = np.random.default_rng(7)
    k = 4
    truth_a, _ = _steps(np.random.default_rng(99), 20_000, k)
    truth = [1 + np.minimum(truth_a, kk).mean() for kk in range(1, k + 1)]
    hits = np.zeros(k)
    for _ in range(400):
        a, req = _steps(rng, 60, k)
        cumulative = [(a >= i).mean() for i in range(1, k + 1)]
        _, inverse = np.unique(req, return_inverse=True)
        # L's interval clustered by request, as the summaries give it (CR2, Satterthwaite's degrees of freedom)
        sums = stats.ClusterSums.of(np.bincount(inverse, weights=a), np.bincount(inverse).astype(float))
        dof = stats.cluster_interval(sums).dof
        lo, hi = stats.ratio_interval(sums, dof)
        deff = load.tokens_design_effect(cumulative, len(a), 1 + lo, 1 + hi, dof)
        lengths = load.draft_lengths(cumulative, len(a), 0.1, deff, dof)
        assert lengths[-1].tokens_per_step == pytest.approx(1 + a.mean())
        hits += [d.tokens_per_step_lo <= t <= d.tokens_per_step_hi for d, t in zip(lengths, truth, strict=True)]
    assert all(0.92 <= h / 400 <= 0.98 for h in hits), hits / 400


def test_the_best_draft_length_from_the_rates_differs_from_the_iid_models_and_discarded_positions_are_named():
    """Rates that fall steeply with the position (0.95, 0.70, 0.35, 0.10): at c = 0.2 the measured
    E[L(k')] / (1 + k' c) is best at k' = 2, while the i.i.d. model at the same per-token alpha (accepted / checked,
    0.70) puts the best k at 3. A position that under a quarter of the steps reach is named as drafted and mostly
    discarded."""
    rates = [0.95, 0.70, 0.35, 0.10]
    lengths = load.draft_lengths(rates, 10_000, 0.2)
    assert max(lengths, key=lambda d: d.speedup).k == 2
    alpha = sum(rates) / (1 + sum(rates[:-1]))
    assert theory.best_k(alpha, 0.2)[0] == 3
    assert [d.discarded for d in lengths] == [False, False, False, True]
