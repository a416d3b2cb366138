"""Promises that depend on few or unequal clusters (issue 11): the status at break-even, tokens per step's interval,
and the threshold calibration's picture of the reference. Data come from bench/streams.py, a request model that
is not the statistics' own; seeded, with tolerances of about two Monte-Carlo standard errors."""
import math
import sys
from pathlib import Path

import numpy as np

from specmon import drift

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
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


def test_request_acceptance_is_fitted_per_step_not_per_token():
    # per-token alpha exceeds the per-step mean of r when requests differ; requests are drawn by the step, so
    # the calibration's beta must have the per-step mean
    rng = np.random.default_rng(7)
    mean, rho, k = 0.6, 0.2, 8
    a, c, req = streams.steps(rng, 200_000, streams.per_token_alpha(mean, rho, k), k, rho, "geometric")
    pa, pn = np.bincount(req, weights=a), np.bincount(req, weights=c)
    steps = np.bincount(req).astype(float)
    per_step = drift._beta_rates(rng, pa, pn, steps, 200_000)
    per_token = drift._beta_rates(rng, pa, pn, pn, 200_000)
    assert abs(per_step.mean() - mean) < 0.01
    assert per_token.mean() > mean + 0.03
    assert abs(per_step.var() - rho * mean * (1 - mean)) < 0.15 * rho * mean * (1 - mean)  # beta variance


def test_calibration_streams_keep_the_reference_acceptance_and_spread():
    rng = np.random.default_rng(8)
    k = 4
    a, c, req = streams.steps(rng, drift.REFERENCE_STEPS, 0.8, k, 0.2, "lognormal")
    _, inverse = np.unique(req, return_inverse=True)
    pool = np.arange(inverse.max() + 1)
    accepted = drift._tilted_steps(np.random.default_rng(1), a.astype(float), c.astype(float), inverse, pool, 4,
                                   50_000, 1.0, 0.0)
    rejected = drift._tilted_steps(np.random.default_rng(1), a.astype(float), c.astype(float), inverse, pool, 4,
                                   50_000, 0.0, 1.0)
    assert abs(accepted.sum() / (accepted.sum() + rejected.sum()) - a.sum() / c.sum()) < 0.02
    # requests differ: windows of 20 steps vary far more than independent steps would
    per_window = accepted.reshape(4, -1, 20).sum(axis=2).ravel()
    iid = accepted.ravel().copy()
    np.random.default_rng(2).shuffle(iid)
    assert per_window.var() > 2 * iid.reshape(-1, 20).sum(axis=1).var()
