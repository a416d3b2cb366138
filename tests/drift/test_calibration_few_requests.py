"""Promises that depend on few or unequal clusters: the status at break-even, tokens per step's interval,
and the threshold calibration's picture of the reference. Data come from bench/streams.py, a request model that
is not the statistics' own; seeded, with tolerances of about two Monte-Carlo standard errors."""
import math
import sys

import numpy as np
from paths import BENCH

from specmon.drift import calibration, detector

sys.path.insert(0, str(BENCH))
import drift_study  # noqa: E402
import streams  # noqa: E402

REPS = 1500  # a probability of 0.025 has a Monte-Carlo standard error of 0.004, a coverage of 0.95 one of 0.0056


def test_twenty_unequal_requests_at_break_even_are_rarely_called_losing():
    # the worst cell of the study before the log-scale hull: 0.043-0.050 of such segments were called losing
    cell = drift_study.interval_cell(np.random.default_rng(2611), 0.2, "geometric", 20, 8, REPS)
    assert cell["p_losing_at_break_even"] <= 0.035, cell
    assert cell["p_healthy_at_break_even"] <= 0.035, cell
    assert cell["coverage_alpha"] >= 0.94, cell


def test_tokens_per_step_interval_covers_with_twenty_strongly_differing_requests():
    # the normal-shape interval alone covered 0.925 here, its misses nearly all above
    cell = drift_study.interval_cell(np.random.default_rng(2612), 0.3, "geometric", 20, 8, REPS)
    assert cell["coverage_L"] >= 0.94 - 2 * math.sqrt(0.95 * 0.05 / REPS), cell
    assert min(cell["coverage_per_position"]) >= 0.94, cell


def test_request_acceptance_distribution_keeps_the_mean_the_spread_and_the_shape():
    # the calibration's distribution of request acceptance (nonparametric maximum likelihood) has the per-request
    # mean of r (per-token alpha exceeds it when requests differ) and its variance, and where one request in ten is
    # hard it keeps that cluster: a beta with the same mean and variance puts far less weight there (the two-point
    # cells of the study alarmed 2-3 x as often as stated with the beta fit). 2,500 requests: the tolerances are
    # about three standard errors of the estimates.
    rng = np.random.default_rng(7)
    mean, rho, k = 0.78, 0.2, 4
    for shape in ("beta", "two-point"):
        a, c, req = streams.steps(rng, 50_000, streams.per_token_alpha(mean, rho, k, shape), k, rho, "geometric",
                                  shape)
        mixing = calibration.Mixing.of_steps(a, c, req)
        grid, w = mixing.grid, mixing.start
        m = w @ grid
        assert abs(m - mean) < 0.015, shape
        assert abs(w @ (grid - m) ** 2 / (rho * mean * (1 - mean)) - 1) < 0.15, shape
    hard, easy = streams._two_point(mean, rho)  # 0.22 and 0.84
    assert abs(w[grid < hard + 0.1].sum() - streams.TWO_POINT_HARD) < 0.025
    m_beta = 1 / rho - 1
    beta_weight = (rng.beta(mean * m_beta, (1 - mean) * m_beta, 100_000) < hard + 0.1).mean()
    assert beta_weight < streams.TWO_POINT_HARD / 3  # (the beta of the same moments has about 0.02 there)


def test_calibration_streams_keep_the_reference_acceptance_and_spread():
    rng = np.random.default_rng(8)
    k = 4
    a, c, req = streams.steps(rng, detector.REFERENCE_STEPS, 0.8, k, 0.2, "lognormal")
    _, inverse = np.unique(req, return_inverse=True)
    pool = np.arange(inverse.max() + 1)
    mixing = calibration.Mixing.of_steps(a, c, inverse)
    process = calibration.StepProcess(a.astype(float), c.astype(float), inverse, pool, mixing.fit(np.ones(len(pool))))
    accepted, checked = process.draw(np.random.default_rng(1), 4, 50_000)
    # within 0.025: at correlation 0.2 with lognormal lengths the simulated streams come out about 0.02 below the
    # reference's pooled acceptance (a standard error of about 0.002 per draw of 200,000 steps)
    assert abs(accepted.sum() / checked.sum() - a.sum() / c.sum()) < 0.025
    # requests differ: windows of 20 steps vary far more than independent steps would
    per_window = accepted.astype(float).reshape(4, -1, 20).sum(axis=2).ravel()
    iid = accepted.ravel().astype(float)
    np.random.default_rng(2).shuffle(iid)
    assert per_window.var() > 2 * iid.reshape(-1, 20).sum(axis=1).var()


def test_the_kernel_on_request_acceptance_keeps_the_mean_and_adds_nothing_without_spread():
    # the drawn acceptances are the maximum-likelihood weights widened on the log-odds scale, with the weights' own
    # mean (200,000 draws: a Monte-Carlo standard error of the mean under 0.001) and a little more spread where
    # requests differ; where they do not, next to none
    rng = np.random.default_rng(11)
    for rho in (0.0, 0.3):
        a, c, req = streams.steps(rng, detector.REFERENCE_STEPS, 0.8, 4, rho, "geometric")
        rates = calibration.Mixing.of_steps(a, c, req).fit(np.ones(req.max() + 1))
        draws = rates.draw(rng, 200_000)
        mean = rates.weights @ rates.grid
        var = rates.weights @ (rates.grid - mean) ** 2
        assert abs(draws.mean() - mean) < 0.003, rho
        if rho:
            assert var < draws.var() < 1.3 * var
        else:
            assert draws.var() < var + 1e-4
