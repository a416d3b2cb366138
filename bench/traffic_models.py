"""Step logs from two kinds of production-like traffic that the drift calibration's model does not describe (it
gives a simulated request one acceptance, shifting every position's log-odds alike): for the drift traffic study
(drift_traffic.py) and the drift tests.

- position_dependent: acceptance falls with the draft position (0.85, 0.70, 0.55, 0.45 at k = 4, as EAGLE-style
  drafts show), and requests differ the more the deeper the position (a request effect z ~ N(0, 1) moving position
  i's log-odds by DEPTH_EFFECT[i] z).
- state_switching: acceptance switches state within a request: long copy-like stretches (every position accepted
  with probability COPY_ACCEPT) and hard ones (HARD_ACCEPT), each a geometric number of steps (means COPY_STEPS and
  HARD_STEPS), the first state drawn from the chain's stationary share; heavy-tailed lengths (lognormal, sigma
  SWITCH_SIGMA, mean SWITCH_MEAN_STEPS).

Both give (accepted, checked, request) per step, requests one after another (steps of one request together), within
a step position i checked while all before were accepted; as step logs with their truth for the study's interval part
(`drift_study.py --sections production --traffic traffic_models:position_dependent_log,...`).
"""
from __future__ import annotations

import math

import numpy as np
import traffic_daily as td

POSITION_ACCEPT = (0.85, 0.70, 0.55, 0.45)
DEPTH_EFFECT = (0.2, 0.4, 0.7, 1.0)
POSITION_MEAN_STEPS, POSITION_SIGMA = 20.0, 1.2

COPY_ACCEPT, HARD_ACCEPT = 0.95, 0.45
COPY_STEPS, HARD_STEPS = 30.0, 15.0
SWITCH_MEAN_STEPS, SWITCH_SIGMA = 40.0, 1.5

KINDS = ("position_dependent", "state_switching")


def _lengths(rng: np.random.Generator, n: int, mean: float, sigma: float) -> np.ndarray:
    mu = math.log(mean) - sigma ** 2 / 2
    return np.maximum(1, np.round(rng.lognormal(mu, sigma, n))).astype(np.int64)


def _requests(rng: np.random.Generator, n_steps: int, mean: float, sigma: float) -> np.ndarray:
    sizes = _lengths(rng, int(n_steps / mean * 2) + 10, mean, sigma)
    while sizes.sum() < n_steps:
        sizes = np.concatenate([sizes, _lengths(rng, int(n_steps / mean) + 10, mean, sigma)])
    return np.repeat(np.arange(len(sizes)), sizes)[:n_steps]


def _draft(rng: np.random.Generator, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """accepted and checked per step from each step's per-position acceptance (a row per step)."""
    alive = np.ones(len(q), dtype=bool)
    accepted = np.zeros(len(q), dtype=np.int64)
    for i in range(q.shape[1]):
        alive &= rng.random(len(q)) < q[:, i]
        accepted += alive
    return accepted, np.minimum(accepted + 1, q.shape[1])


def position_accept(z: np.ndarray) -> np.ndarray:
    """Per-position acceptance (a row per request effect z) of position-dependent traffic."""
    base = np.log(np.array(POSITION_ACCEPT) / (1 - np.array(POSITION_ACCEPT)))
    return 1 / (1 + np.exp(-(base[None, :] + np.array(DEPTH_EFFECT)[None, :] * z[:, None])))


def position_dependent(rng: np.random.Generator, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    request = _requests(rng, n_steps, POSITION_MEAN_STEPS, POSITION_SIGMA)
    z = rng.standard_normal(int(request.max()) + 1)[request]
    return (*_draft(rng, position_accept(z)), request)


def state_switching(rng: np.random.Generator, n_steps: int, k: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    request = _requests(rng, n_steps, SWITCH_MEAN_STEPS, SWITCH_SIGMA)
    new = np.r_[True, request[1:] != request[:-1]]
    copy_share = COPY_STEPS / (COPY_STEPS + HARD_STEPS)
    leave = rng.random(n_steps)
    start = rng.random(n_steps) < copy_share
    state = np.empty(n_steps, dtype=bool)  # True: copy-like
    for t in range(n_steps):  # a Markov chain per request: a Python step per step, affordable at study sizes
        if new[t]:
            state[t] = start[t]
        else:
            stay = 1 - 1 / (COPY_STEPS if state[t - 1] else HARD_STEPS)
            state[t] = state[t - 1] if leave[t] < stay else not state[t - 1]
    q = np.where(state, COPY_ACCEPT, HARD_ACCEPT)[:, None] * np.ones((1, k))
    return (*_draft(rng, q), request)


def steps(rng: np.random.Generator, kind: str, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return {"position_dependent": position_dependent, "state_switching": state_switching}[kind](rng, n_steps)


def _truth(reach: np.ndarray) -> dict:
    """alpha, L - 1 and the conditional rates from E P(a step accepts at least i positions), i = 0..k."""
    k = len(reach) - 1
    return {"alpha": float(reach[1:].sum() / reach[:k].sum()), "L_minus_1": float(reach[1:].sum()),
            "conditional": [float(reach[i] / reach[i - 1]) for i in range(1, k + 1)]}


def _log(request: np.ndarray, accepted: np.ndarray, checked: np.ndarray, k: int) -> td.StepLog:
    zeros = np.zeros(len(request), dtype=np.int64)
    return td.StepLog(request, zeros, accepted, checked, zeros.astype(bool), k)


def position_dependent_log(rng: np.random.Generator, n_requests: int, k: int = 4) -> tuple[td.StepLog, dict]:
    """n_requests of position-dependent traffic as a step log, with the truth (production_study.py's --traffic
    form; k is POSITION_ACCEPT's length)."""
    sizes = _lengths(rng, n_requests, POSITION_MEAN_STEPS, POSITION_SIGMA)
    request = np.repeat(np.arange(n_requests), sizes)
    accepted, checked = _draft(rng, position_accept(rng.standard_normal(n_requests)[request]))
    # lengths are independent of z, so a step's mean over the normal request effect, by Gauss-Hermite quadrature
    z, weight = np.polynomial.hermite_e.hermegauss(120)
    reach = np.concatenate([[1.0], (weight / weight.sum()) @ np.cumprod(position_accept(z), axis=1)])
    return _log(request, accepted, checked, len(POSITION_ACCEPT)), _truth(reach)


def state_switching_log(rng: np.random.Generator, n_requests: int, k: int = 4) -> tuple[td.StepLog, dict]:
    """About n_requests of state-switching traffic as a step log, with the truth: every step's state is the chain's
    stationary share, whatever its place in the request."""
    accepted, checked, request = state_switching(rng, int(n_requests * SWITCH_MEAN_STEPS), k)
    copy_share = COPY_STEPS / (COPY_STEPS + HARD_STEPS)
    reach = np.array([copy_share * COPY_ACCEPT ** i + (1 - copy_share) * HARD_ACCEPT ** i for i in range(k + 1)])
    return _log(request, accepted, checked, k), _truth(reach)
