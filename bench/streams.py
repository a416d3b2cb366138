"""Streams of verification steps from request models that are *not* the detector's own (it resamples the
reference's requests): for the drift study and the drift tests.

A request has its own acceptance r, drawn so that the intra-request correlation of accept/reject outcomes is rho
(a Beta(a m, (1 - a) m) with m = 1/rho - 1; rho = 0: every request has r = a), and a length in steps, geometric
(mean 20) or heavy-tailed (lognormal, sigma 1.2, mean 20). Within a step, position i is accepted with probability r
while all before were. Requests follow one another (steps of one request together).
"""
from __future__ import annotations

import math

import numpy as np

MEAN_STEPS = 20.0
LOGNORMAL_SIGMA = 1.2


def request_lengths(rng: np.random.Generator, n: int, lengths: str) -> np.ndarray:
    if lengths == "geometric":
        return rng.geometric(1 / MEAN_STEPS, n)
    if lengths == "lognormal":
        mu = math.log(MEAN_STEPS) - LOGNORMAL_SIGMA ** 2 / 2
        return np.maximum(1, np.round(rng.lognormal(mu, LOGNORMAL_SIGMA, n))).astype(np.int64)
    raise ValueError(f"lengths must be geometric or lognormal, got {lengths!r}")


def request_rates(rng: np.random.Generator, n: int, mean: float, rho: float) -> np.ndarray:
    if rho <= 0:
        return np.full(n, mean)
    m = 1 / rho - 1
    return rng.beta(mean * m, (1 - mean) * m, n)


def per_token_alpha(mean: float, rho: float, k: int) -> float:
    """The per-token acceptance (accepted / checked, in expectation over requests) of requests whose acceptance
    has this Beta mean: sum_{i=1..k} E r^i / sum_{i=0..k-1} E r^i, which exceeds the mean when rho > 0 (good
    requests check more positions). Request lengths are independent of r, so they do not enter."""
    if rho <= 0:
        return mean
    m = 1 / rho - 1
    a, b = mean * m, (1 - mean) * m
    moments = [1.0]
    for i in range(1, k + 1):
        moments.append(moments[-1] * (a + i - 1) / (a + b + i - 1))
    return sum(moments[1:]) / sum(moments[:-1])


def mean_for_alpha(alpha: float, rho: float, k: int) -> float:
    """The Beta mean whose per-token alpha is alpha (bisection)."""
    lo, hi = 1e-6, 1 - 1e-6
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if per_token_alpha(mid, rho, k) < alpha else (lo, mid)
    return (lo + hi) / 2


def steps(rng: np.random.Generator, n_steps: int, alpha: float, k: int, rho: float,
          lengths: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(accepted, checked, request) per step for n_steps steps with per-token acceptance alpha."""
    mean = mean_for_alpha(alpha, rho, k)
    n_req = int(n_steps / MEAN_STEPS * 2) + 10
    sizes = request_lengths(rng, n_req, lengths)
    while sizes.sum() < n_steps:
        sizes = np.concatenate([sizes, request_lengths(rng, n_req, lengths)])
    request = np.repeat(np.arange(len(sizes)), sizes)[:n_steps]
    p = request_rates(rng, len(sizes), mean, rho)[request]
    alive = np.ones(n_steps, dtype=bool)
    accepted = np.zeros(n_steps, dtype=np.int64)
    for _ in range(k):
        alive &= rng.random(n_steps) < p
        accepted += alive
    return accepted, np.minimum(accepted + 1, k), request
