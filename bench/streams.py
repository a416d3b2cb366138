"""Streams of verification steps from request models that are *not* the detector's own (it calibrates on the
reference's own request lengths and steps): for the drift study and the drift tests.

A request has its own acceptance r, drawn so that the intra-request correlation of accept/reject outcomes is rho (a
Beta(a m, (1 - a) m) with m = 1/rho - 1; rho = 0: every request has r = a), and a length in steps, geometric (mean 20)
or heavy-tailed (lognormal, sigma 1.2, mean 20). shape="two-point" replaces the beta distribution by two kinds of
request with the same mean and correlation: one in TWO_POINT_HARD is hard (low acceptance), the rest easy; it is outside
the beta family (a beta fit to the requests, which the calibration no longer uses, cannot picture it). Within a step,
position i is accepted with probability r while all before were. Requests follow one another (steps of one request
together).
"""
from __future__ import annotations

import math

import numpy as np

MEAN_STEPS = 20.0
LOGNORMAL_SIGMA = 1.2
TWO_POINT_HARD = 0.1  # share of hard requests in the two-point model


def request_lengths(rng: np.random.Generator, n: int, lengths: str) -> np.ndarray:
    if lengths == "geometric":
        return rng.geometric(1 / MEAN_STEPS, n)
    if lengths == "lognormal":
        mu = math.log(MEAN_STEPS) - LOGNORMAL_SIGMA ** 2 / 2
        return np.maximum(1, np.round(rng.lognormal(mu, LOGNORMAL_SIGMA, n))).astype(np.int64)
    raise ValueError(f"lengths must be geometric or lognormal, got {lengths!r}")


def request_counts(rng: np.random.Generator, requests: int, mean: float, rho: float, k: int,
                   lengths: str) -> tuple[np.ndarray, np.ndarray]:
    """That many requests' lengths in steps and, per position i = 1..k (a row each), their steps that accepted
    position i: each request with its own acceptance (request_rates, beta)."""
    sizes = request_lengths(rng, requests, lengths)
    request = np.repeat(np.arange(requests), sizes)
    p = request_rates(rng, requests, mean, rho)[request]
    alive = np.ones(len(request), dtype=bool)
    passed = []
    for _ in range(k):
        alive &= rng.random(len(request)) < p
        passed.append(np.bincount(request, weights=alive, minlength=requests))
    return sizes, np.array(passed)


def _two_point(mean: float, rho: float) -> tuple[float, float]:
    """(hard, easy) acceptance with share TWO_POINT_HARD of hard requests, mean `mean` and variance rho m (1 - m)."""
    q = TWO_POINT_HARD
    d = math.sqrt(rho * mean * (1 - mean) / (q * (1 - q)))
    return max(mean - (1 - q) * d, 0.0), min(mean + q * d, 1.0)


def request_rates(rng: np.random.Generator, n: int, mean: float, rho: float, shape: str = "beta") -> np.ndarray:
    if rho <= 0:
        return np.full(n, mean)
    if shape == "two-point":
        hard, easy = _two_point(mean, rho)
        return np.where(rng.random(n) < TWO_POINT_HARD, hard, easy)
    if shape != "beta":
        raise ValueError(f"shape must be beta or two-point, got {shape!r}")
    m = 1 / rho - 1
    return rng.beta(mean * m, (1 - mean) * m, n)


def rate_moments(mean: float, rho: float, k: int, shape: str = "beta") -> list[float]:
    """E r^i, i = 0..k, of per-request acceptance r with this mean and intra-request correlation rho."""
    if rho <= 0:
        return [mean ** i for i in range(k + 1)]
    if shape == "two-point":
        hard, easy = _two_point(mean, rho)
        return [TWO_POINT_HARD * hard ** i + (1 - TWO_POINT_HARD) * easy ** i for i in range(k + 1)]
    m = 1 / rho - 1
    a, b = mean * m, (1 - mean) * m
    out = [1.0]
    for i in range(1, k + 1):
        out.append(out[-1] * (a + i - 1) / (a + b + i - 1))
    return out


def per_token_alpha(mean: float, rho: float, k: int, shape: str = "beta") -> float:
    """The per-token acceptance (accepted / checked, in expectation over requests) of requests whose acceptance
    has this mean: sum_{i=1..k} E r^i / sum_{i=0..k-1} E r^i, which exceeds the mean when rho > 0 (good
    requests check more positions). Request lengths are independent of r, so they do not enter."""
    e = rate_moments(mean, rho, k, shape)
    return sum(e[1:]) / sum(e[:-1])


def mean_for_alpha(alpha: float, rho: float, k: int, shape: str = "beta") -> float:
    """The mean of r whose per-token alpha is alpha (bisection)."""
    lo, hi = 1e-6, 1 - 1e-6
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if per_token_alpha(mid, rho, k, shape) < alpha else (lo, mid)
    return (lo + hi) / 2


def steps(rng: np.random.Generator, n_steps: int, alpha: float, k: int, rho: float,
          lengths: str, shape: str = "beta") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(accepted, checked, request) per step for n_steps steps with per-token acceptance alpha."""
    mean = mean_for_alpha(alpha, rho, k, shape)
    n_req = int(n_steps / MEAN_STEPS * 2) + 10
    sizes = request_lengths(rng, n_req, lengths)
    while sizes.sum() < n_steps:
        sizes = np.concatenate([sizes, request_lengths(rng, n_req, lengths)])
    request = np.repeat(np.arange(len(sizes)), sizes)[:n_steps]
    p = request_rates(rng, len(sizes), mean, rho, shape)[request]
    alive = np.ones(n_steps, dtype=bool)
    accepted = np.zeros(n_steps, dtype=np.int64)
    for _ in range(k):
        alive &= rng.random(n_steps) < p
        accepted += alive
    return accepted, np.minimum(accepted + 1, k), request
