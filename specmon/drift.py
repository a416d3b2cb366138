"""Drift: a one-sided Bernoulli CUSUM on acceptance with a calibrated false-alarm rate, and before/after tests of
template changes (math.md, "Drift").

The CUSUM adds, per step, s*ln(p1/p0) + f*ln((1-p1)/(1-p0)) for s accepted and f rejected checked positions, and
alarms when the sum reaches h. Acceptance is correlated within a request, so a threshold computed for independent
tokens would alarm far too often; h is instead calibrated by simulating streams with the same request sizes and
the same between-request spread of acceptance as the reference data (a beta-binomial model), until the expected
number of steps between false alarms (ARL0) matches the one asked for. Pure numpy; no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from specmon import stats

DEFAULT_ARL0_STEPS = 20_000  # expected steps between false alarms when nothing changed
DEFAULT_DELTA = 0.10  # the drop to watch for when break-even is unknown or already above the reference
REFERENCE_STEPS = 1_000  # the first steps of a stream set p0
CHANGE_Z = 2.576  # template change verdicts at the two-sided 1% level


@dataclass(frozen=True)
class Design:
    """A calibrated detector: watch for acceptance moving from p0 to p1; alarm at W >= h."""

    p0: float
    p1: float
    h: float
    arl0_steps: int
    concentration: float  # beta-binomial spread of per-request acceptance: larger = less overdispersed
    k: int


@dataclass(frozen=True)
class Alarm:
    """One episode: a first alarm, and the re-alarms that follow it while acceptance stays low (the CUSUM is reset
    after every alarm, so a lasting drop alarms again and again; those belong to one episode)."""

    change_index: int  # estimated start of the change: the step after W was last 0 before the first alarm
    alarm_index: int  # step index (in the stream) at which W first reached h
    last_alarm_index: int
    count: int  # alarms in the episode
    alpha_before: float  # acceptance over the reference window
    alpha_after: float  # acceptance from the estimated change to the last alarm


def llr_weights(p0: float, p1: float) -> tuple[float, float]:
    """CUSUM increments for one accepted and one rejected checked position."""
    return math.log(p1 / p0), math.log((1 - p1) / (1 - p0))


def cusum(accepted: np.ndarray, checked: np.ndarray, design: Design) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """W_t over a stream of steps, restarting after each alarm. Returns W and [(alarm_index, change_index)].

    Between alarms W_t = S_t - min(0, min_{s<=t} S_s) for the cumulative sum S since the restart, computed with
    numpy over a look-ahead block that doubles until it holds the next alarm (no Python loop per step).
    """
    wa, wr = llr_weights(design.p0, design.p1)
    x = np.asarray(accepted, dtype=float) * wa + (np.asarray(checked, dtype=float) - accepted) * wr
    n = len(x)
    w = np.zeros(n)
    alarms = []
    start, block = 0, 4096
    while start < n:
        stop = min(n, start + block)
        s = np.cumsum(x[start:stop])
        seg = s - np.minimum(np.minimum.accumulate(s), 0.0)
        hits = np.flatnonzero(seg >= design.h)
        if not hits.size and stop < n:
            block *= 2  # no alarm yet: look further ahead from the same restart
            continue
        end = hits[0] + 1 if hits.size else len(seg)
        w[start:start + end] = seg[:end]
        if hits.size:
            zeros = np.flatnonzero(seg[:end] <= 0.0)
            alarms.append((start + int(hits[0]), start + (int(zeros[-1]) + 1 if zeros.size else 0)))
        start += end
        block = 4096
    return w, alarms


def concentration(accepted: np.ndarray, checked: np.ndarray, request_ids: np.ndarray) -> float:
    """Beta concentration m of per-request acceptance, by the method of moments (m = inf: no overdispersion)."""
    _, inverse = np.unique(request_ids, return_inverse=True)
    a = np.bincount(inverse, weights=accepted)
    n = np.bincount(inverse, weights=checked)
    keep = n > 0
    a, n = a[keep], n[keep]
    if len(n) < 3 or n.sum() == 0:
        return math.inf
    p = a.sum() / n.sum()
    if p <= 0 or p >= 1:
        return math.inf
    rates = a / n
    between = np.average((rates - p) ** 2, weights=n) - p * (1 - p) * len(n) / n.sum()
    if between <= 0:
        return math.inf
    return max(p * (1 - p) / between - 1.0, 0.5)


def simulate_steps(rng: np.random.Generator, n_streams: int, n_steps: int, alpha: float, k: int,
                   concentration_m: float, steps_per_request: float) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, checked) arrays of shape (n_streams, n_steps) under the beta-binomial request model.

    Each request lasts a geometric number of steps (mean steps_per_request) and has its own acceptance drawn from
    Beta(alpha*m, (1-alpha)*m); within a step, position i is accepted with that probability while all before were.
    """
    new_request = rng.random((n_streams, n_steps)) < 1.0 / max(steps_per_request, 1.0)
    new_request[:, 0] = True
    request_index = np.cumsum(new_request, axis=1) - 1
    n_requests = int(request_index.max()) + 1
    if math.isinf(concentration_m):
        rates = np.full((n_streams, n_requests), alpha)
    else:
        rates = rng.beta(alpha * concentration_m, (1 - alpha) * concentration_m, (n_streams, n_requests))
    p = np.take_along_axis(rates, request_index, axis=1)
    accepted = np.zeros((n_streams, n_steps), dtype=np.int16)
    alive = np.ones((n_streams, n_steps), dtype=bool)
    for _ in range(k):
        alive &= rng.random((n_streams, n_steps)) < p
        accepted += alive
    checked = np.minimum(accepted + 1, k)
    return accepted, checked


def cusum_without_reset(accepted: np.ndarray, checked: np.ndarray, p0: float, p1: float) -> np.ndarray:
    """W_t for each row (stream) up to its first alarm, without a Python loop over time:
    W_t = S_t - min(0, min_{s<=t} S_s) for the cumulative sum S of the increments."""
    wa, wr = llr_weights(p0, p1)
    s = np.cumsum(accepted * np.float32(wa) + (checked - accepted) * np.float32(wr), axis=1, dtype=np.float32)
    return s - np.minimum(np.minimum.accumulate(s, axis=1), np.float32(0.0))


def first_alarm_steps(w: np.ndarray, h: float) -> np.ndarray:
    """Steps to the first W >= h in each row (the row length where none came)."""
    hit = w >= h
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, w.shape[1])


@lru_cache(maxsize=64)
def calibrate_h(p0: float, p1: float, k: int, concentration_m: float, steps_per_request: float,
                arl0_steps: int = DEFAULT_ARL0_STEPS, n_streams: int = 200, seed: int = 0) -> float:
    """The threshold h whose simulated in-control average run length is arl0_steps (bisection on h over one
    set of simulated streams). Streams run to 5 x ARL0: run lengths are near-geometric, so under 1% are cut
    short, which biases the estimated ARL0 low by about as much (the threshold errs on the quiet side)."""
    rng = np.random.default_rng(seed)
    chunks = []
    for start in range(0, n_streams, 25):  # in chunks, to bound the temporaries
        accepted, checked = simulate_steps(rng, min(25, n_streams - start), 5 * arl0_steps, p0, k,
                                           concentration_m, steps_per_request)
        chunks.append(cusum_without_reset(accepted, checked, p0, p1))
    w = np.concatenate(chunks)
    lo, hi = 0.1, 1.0
    while first_alarm_steps(w, hi).mean() < arl0_steps and hi < 1e4:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        if first_alarm_steps(w, mid).mean() < arl0_steps:
            lo = mid
        else:
            hi = mid
    return hi


def design_for(accepted: np.ndarray, checked: np.ndarray, request_ids: np.ndarray, k: int,
               break_even: float | None, arl0_steps: int = DEFAULT_ARL0_STEPS,
               reference_steps: int = REFERENCE_STEPS, delta: float = DEFAULT_DELTA) -> Design | None:
    """Calibrate a detector on the first reference_steps of a stream. None if the reference has no checks.

    p1 is break-even alpha* when it lies below p0 by more than 0.02; else p0 - delta.
    """
    ref = slice(0, min(reference_steps, len(accepted)))
    n = checked[ref].sum()
    if n == 0:
        return None
    p0 = float(np.clip(accepted[ref].sum() / n, 0.01, 0.99))
    p1 = break_even if break_even is not None and break_even < p0 - 0.02 else p0 - delta
    p1 = float(np.clip(p1, 0.005, p0 - 0.005))
    m = concentration(accepted[ref], checked[ref], request_ids[ref])
    _, sizes = np.unique(request_ids[ref], return_counts=True)
    steps_per_request = float(np.mean(sizes))
    # Rounded so that similar streams share one cached calibration.
    m_key = math.inf if math.isinf(m) else float(f"{m:.2g}")
    h = calibrate_h(round(p0, 3), round(p1, 3), int(k), m_key, round(steps_per_request, 1), arl0_steps)
    return Design(p0, p1, float(h), arl0_steps, float(m), int(k))


def detect(accepted: np.ndarray, checked: np.ndarray, design: Design,
           reference_steps: int = REFERENCE_STEPS) -> tuple[np.ndarray, list[Alarm]]:
    """Run the CUSUM after the reference window; indices are positions in the whole stream. An alarm whose
    change began within reference_steps of the previous alarm continues that episode."""
    start = min(reference_steps, len(accepted))
    w, raw = cusum(accepted[start:], checked[start:], design)
    episodes: list[list[int]] = []  # [change, first alarm, last alarm, count]
    for alarm, change in raw:
        if episodes and change - episodes[-1][2] <= reference_steps:
            episodes[-1][2] = alarm
            episodes[-1][3] += 1
        else:
            episodes.append([change, alarm, alarm, 1])
    alarms = []
    for change, first, last, count in episodes:
        a, c = accepted[start + change:start + last + 1], checked[start + change:start + last + 1]
        alarms.append(Alarm(start + change, start + first, start + last, count, design.p0,
                            float(a.sum() / max(c.sum(), 1))))
    return np.concatenate([np.zeros(start), w]), alarms


@dataclass(frozen=True)
class Comparison:
    """Acceptance before and after a template change, with cluster-robust intervals."""

    before: stats.Interval
    after: stats.Interval
    z: float
    verdict: str  # "hurt", "helped" or "no detectable change"


def compare(before_a: np.ndarray, before_n: np.ndarray, after_a: np.ndarray, after_n: np.ndarray) -> Comparison:
    """Two-sample z test of per-token acceptance; arguments are per-request sums (requests as clusters)."""
    b = stats.cluster_robust_interval(before_a, before_n)
    a = stats.cluster_robust_interval(after_a, after_n)
    se = math.sqrt(_variance(b) + _variance(a))
    z = (a.estimate - b.estimate) / se if se > 0 else 0.0
    verdict = "hurt" if z < -CHANGE_Z else "helped" if z > CHANGE_Z else "no detectable change"
    return Comparison(b, a, z, verdict)


def _variance(iv: stats.Interval) -> float:
    """Variance of a proportion at its effective sample size (what the cluster-robust interval used)."""
    if iv.n_eff <= 0 or math.isnan(iv.estimate):
        return math.inf
    return iv.estimate * (1 - iv.estimate) / iv.n_eff
