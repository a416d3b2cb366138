"""Production-like traffic for the study (not the statistics' own models): a daily mix of request types in a step
log, and engine windows over requests that span several windows.

Daily mix: two request types, "chat" (request acceptance r from a beta with mean CHAT_MEAN) and "code" (mean
CODE_MEAN), each request's r fixed for all its steps; the chat share of arriving requests follows the clock,
chat_share(hour) (0.2 at 03:00 UTC, 0.8 at 15:00), so per-token acceptance swings over the day while each type's
acceptance stays the same. Requests arrive uniformly in time; a request's steps are STEP_S apart, position i of a
step accepted with probability r while all before it were (drafting stops at the first rejection).

Engine windows: the same requests seen by an engine that logs per-position counts every WINDOW_S seconds (vLLM's
default), each request lasting a lognormal time (median REQUEST_MEDIAN_S) and taking a step every ENGINE_STEP_S, so
a request spans several windows and neighbouring windows share requests.

A rollout at a chosen time gives requests that arrive after it template "v2" (drop: how much lower each type's mean
acceptance is there; 0 is a change that changes nothing). Generators are looked up by name (GENERATORS), so the
study can run another module's models beside these.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import streams

CHAT_MEAN, CODE_MEAN, CONCENTRATION = 0.68, 0.90, 30.0  # beta(mean * conc, (1 - mean) * conc) per request
STEP_S = 0.5  # seconds between a step-log request's steps
MEAN_STEPS = 20  # geometric request length in steps (step logs)
WINDOW_S = 10.0
REQUEST_MEDIAN_S, REQUEST_SIGMA = 40.0, 1.0
ENGINE_STEP_S = 1.0
HOUR_US = 3_600_000_000
US = 1_000_000


def chat_share(hour_of_day: np.ndarray) -> np.ndarray:
    """The chat share of arriving requests at an hour of day (UTC, fractional): 0.2 at 03:00, 0.8 at 15:00."""
    return 0.5 - 0.3 * np.cos(2 * np.pi * (hour_of_day - 3) / 24)


@dataclass(frozen=True)
class Requests:
    start_us: np.ndarray  # arrival, microseconds since the stream's start (which is midnight UTC)
    rate: np.ndarray  # the request's acceptance r
    chat: np.ndarray  # its type
    v2: np.ndarray  # whether it arrived after the rollout


def requests(rng: np.random.Generator, n: int, span_h: float, rollout_h: float | None = None, drop: float = 0.0,
             share: Callable[[np.ndarray], np.ndarray] = chat_share) -> Requests:
    """n requests arriving uniformly over span_h hours from midnight; after rollout_h (None: never) each type's mean
    acceptance is `drop` lower."""
    start_h = np.sort(rng.uniform(0, span_h, n))
    chat = rng.random(n) < share(start_h % 24)
    v2 = start_h >= rollout_h if rollout_h is not None else np.zeros(n, dtype=bool)
    mean = np.where(chat, CHAT_MEAN, CODE_MEAN) - drop * v2
    rate = rng.beta(mean * CONCENTRATION, (1 - mean) * CONCENTRATION)
    return Requests((start_h * HOUR_US).astype(np.int64), rate, chat, v2)


def _steps_of(rng: np.random.Generator, rate: np.ndarray, sizes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the request, and how many positions were accepted (the first rejection stops the draft)."""
    request = np.repeat(np.arange(len(sizes)), sizes)
    p = rate[request]
    alive = np.ones(len(request), dtype=bool)
    accepted = np.zeros(len(request), dtype=np.int64)
    for _ in range(k):
        alive &= rng.random(len(request)) < p
        accepted += alive
    return request, accepted


@dataclass(frozen=True)
class StepLog:
    request: np.ndarray
    ts_us: np.ndarray
    accepted: np.ndarray
    checked: np.ndarray
    v2: np.ndarray  # the step's request arrived after the rollout
    k: int


def daily_steps(rng: np.random.Generator, n_requests: int, span_h: float, k: int = 4,
                rollout_h: float | None = None, drop: float = 0.0,
                share: Callable[[np.ndarray], np.ndarray] = chat_share) -> StepLog:
    """A step log of n_requests under the daily mix (geometric lengths, mean MEAN_STEPS), by request."""
    req = requests(rng, n_requests, span_h, rollout_h, drop, share)
    sizes = rng.geometric(1 / MEAN_STEPS, n_requests)
    request, accepted = _steps_of(rng, req.rate, sizes, k)
    offset = np.arange(len(request)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    ts = req.start_us[request] + (offset * STEP_S * US).astype(np.int64)
    return StepLog(request, ts, accepted, np.minimum(accepted + 1, k), req.v2[request], k)


def step_log_lines(log: StepLog, start: str = "2026-03-02T00:00:00") -> list[str]:
    """The step log as JSONL lines in time order (specmon's step-log format), template v1 then v2."""
    import json
    from datetime import datetime, timedelta
    t0 = datetime.fromisoformat(start)
    order = np.argsort(log.ts_us, kind="stable")
    return [json.dumps({"request_id": f"q{log.request[i]}", "template": "v2" if log.v2[i] else "v1", "k": log.k,
                        "ts": (t0 + timedelta(microseconds=int(log.ts_us[i]))).isoformat(timespec="milliseconds")
                        + "Z", "draft_tokens": list(range(1, log.k + 1)), "accepted": int(log.accepted[i])}) + "\n"
            for i in order]


@dataclass(frozen=True)
class Windows:
    end_us: np.ndarray  # each window's end
    drafts: np.ndarray  # steps in the window
    accepted_per_position: np.ndarray  # (windows, k)
    v2: np.ndarray  # the window began after the rollout
    k: int

    @property
    def accepted(self) -> np.ndarray:
        return self.accepted_per_position.sum(axis=1)

    @property
    def checked(self) -> np.ndarray:
        return self.drafts + self.accepted_per_position[:, :-1].sum(axis=1)


def engine_windows(rng: np.random.Generator, arrivals_per_s: float, span_h: float, k: int = 4,
                   rollout_h: float | None = None, drop: float = 0.0,
                   share: Callable[[np.ndarray], np.ndarray] = chat_share, median_s: float = REQUEST_MEDIAN_S,
                   sigma: float = REQUEST_SIGMA) -> Windows:
    """WINDOW_S windows over requests arriving at arrivals_per_s, each lasting a lognormal time (median_s, sigma)
    and stepping every ENGINE_STEP_S (so it spans several windows)."""
    n = rng.poisson(arrivals_per_s * span_h * 3600)
    req = requests(rng, n, span_h, rollout_h, drop, share)
    duration = median_s * np.exp(sigma * rng.standard_normal(n))
    sizes = np.maximum(1, (duration / ENGINE_STEP_S).astype(np.int64))
    request, accepted = _steps_of(rng, req.rate, sizes, k)
    offset = np.arange(len(request)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    ts = req.start_us[request] + (offset * ENGINE_STEP_S * US).astype(np.int64)
    span_us = int(span_h * HOUR_US)
    keep = ts < span_us  # the log ends at the span's end
    window = ts[keep] // int(WINDOW_S * US)
    count = int(math.ceil(span_us / (WINDOW_S * US)))
    per_pos = np.stack([np.bincount(window, weights=accepted[keep] >= i + 1, minlength=count) for i in range(k)], 1)
    drafts = np.bincount(window, minlength=count).astype(float)
    start = np.arange(count) * int(WINDOW_S * US)
    v2 = start >= rollout_h * HOUR_US if rollout_h is not None else np.zeros(count, dtype=bool)
    has = drafts > 0
    return Windows((start + int(WINDOW_S * US))[has], drafts[has], per_pos[has], v2[has], k)


def truth(k: int, share: float) -> dict:
    """The model's exact per-token alpha, tokens per step less one (L - 1) and conditional per-position rates at a
    chat share of arriving requests (every request the same expected steps per unit of its length, lengths
    independent of acceptance): position i of a step is reached and accepted with probability r^i, whose mean over
    each type's beta request acceptance is its moment E r^i (streams.rate_moments; the beta's concentration
    CONCENTRATION is an intra-request correlation of 1 / (1 + CONCENTRATION)). Exact: a mean over 2 million
    simulated requests is off by about 1e-4, 0.05 of alpha's standard error over a day of windows, enough to tilt
    the status's two tails apart at thousands of replicates."""
    rho = 1 / (1 + CONCENTRATION)
    e = share * np.array(streams.rate_moments(CHAT_MEAN, rho, k)) + (1 - share) * np.array(
        streams.rate_moments(CODE_MEAN, rho, k))
    return {"alpha": float(e[1:].sum() / e[:k].sum()), "L_minus_1": float(e[1:].sum()),
            "conditional": [float(e[i] / e[i - 1]) for i in range(1, k + 1)]}


def day_share() -> float:
    """The chat share of a day's arrivals (the average of chat_share over the clock)."""
    return float(np.mean(chat_share(np.linspace(0, 24, 24 * 60, endpoint=False))))


# Traffic kinds by name: what the study can run. A module of other models adds its own by name (drift_study.py,
# --traffic module:name).
GENERATORS: dict[str, Callable[..., object]] = {"daily_steps": daily_steps, "engine_windows": engine_windows}
