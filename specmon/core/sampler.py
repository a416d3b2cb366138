"""Leviathan et al.'s Algorithm 1 on numpy arrays, and a simulator that writes a step log.

The simulator is how specmon checks itself: with one fixed (p, q) pair every quantity in docs/math.md has a known
value (beta, alpha, tokens per step, the distribution of emitted tokens), so the whole pipeline from step log
to summary can be tested against theory.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import IO

import numpy as np
import orjson

from specmon.core import theory
from specmon.core.settings import DISTRIBUTION_MODES


@dataclass(frozen=True)
class StepResult:
    draft_tokens: list[int]
    accepted: int
    emitted_tokens: list[int]


def _draw(cdf: np.ndarray, total: float, rng: np.random.Generator) -> int:
    """One token from a row's cumulative sums, total their last (inverse-CDF, one uniform draw)."""
    return min(int(cdf.searchsorted(rng.random() * total, side="right")), len(cdf) - 1)


class StepCdfs:
    """The cumulative sums of the rows a step draws from (the draft's, the target's and the residuals'), each
    computed the first time it is needed: a simulation of one fixed pair reuses them for every step, where summing
    every row again took most of its time (the draws are the same either way)."""

    def __init__(self, p_rows: np.ndarray, q_rows: np.ndarray):
        self.p_rows, self.q_rows = p_rows, q_rows
        self._kept: dict[tuple[str, int], tuple[np.ndarray, float]] = {}

    def draw(self, kind: str, i: int, rng: np.random.Generator) -> int:
        kept = self._kept.get((kind, i))
        if kept is None:
            row = (self.q_rows[i] if kind == "draft" else self.p_rows[i] if kind == "target"
                   else theory.residual(self.p_rows[i], self.q_rows[i]))
            cdf = np.cumsum(row)
            kept = self._kept[(kind, i)] = (cdf, float(cdf[-1]))
        return _draw(*kept, rng)


def verify(draft: list[int], p_rows: np.ndarray, q_rows: np.ndarray, rng: np.random.Generator,
           cdfs: StepCdfs | None = None) -> StepResult:
    """The target's check of g drafted tokens (Algorithm 1, lines after the parallel target pass).

    p_rows has g + 1 rows (the last one for the bonus token), q_rows has g rows. Position i is accepted while
    r_i <= p_i(x_i) / q_i(x_i); the first rejected position is resampled from norm(max(0, p_i - q_i)). cdfs: the
    rows' cumulative sums kept from earlier steps on the same rows (the same draws, without summing again).
    """
    g = len(draft)
    if p_rows.shape[0] < g + 1 or q_rows.shape[0] < g:
        raise ValueError(f"need {g + 1} target rows and {g} draft rows, got {p_rows.shape[0]} and {q_rows.shape[0]}")
    cdfs = cdfs or StepCdfs(p_rows, q_rows)
    for i, tok in enumerate(draft):
        if rng.random() * q_rows[i, tok] > p_rows[i, tok]:
            return StepResult(list(draft), i, list(draft[:i]) + [cdfs.draw("residual", i, rng)])
    return StepResult(list(draft), g, list(draft) + [cdfs.draw("target", g, rng)])


def speculative_step(p_rows: np.ndarray, q_rows: np.ndarray, rng: np.random.Generator,
                     cdfs: StepCdfs | None = None) -> StepResult:
    """Draft one token per q row from the draft distribution, then verify them against p (cdfs: as for verify)."""
    cdfs = cdfs or StepCdfs(p_rows, q_rows)
    draft = [cdfs.draw("draft", i, rng) for i in range(len(q_rows))]
    return verify(draft, p_rows, q_rows, rng, cdfs)


def _topk_logprobs(row: np.ndarray, k: int) -> dict[str, float]:
    idx = np.argsort(-row, kind="stable")[:k]
    return {str(int(i)): math.log(row[i]) for i in idx if row[i] > 0}


def simulate_fixed_pair(
    p: np.ndarray,
    q: np.ndarray,
    k: int,
    cycles: int,
    rng: np.random.Generator,
    *,
    steps_per_request: int = 50,
    template: str | None = "sim",
    distributions: str = "dense",
    topk: int = 20,
    start: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc),
    step_seconds: float = 0.05,
) -> Iterator[dict]:
    """Run `cycles` speculative steps of one fixed (p, q) pair with draft length k; yield step-log records.

    distributions: "dense" logs the full p (k + 1 rows) and q (k rows), "topk" their top-`topk` logprobs,
    "beta" only the per-position beta, "none" nothing beyond tokens and acceptance.
    """
    if distributions not in DISTRIBUTION_MODES:
        raise ValueError(f"distributions must be one of {DISTRIBUTION_MODES}, got {distributions!r}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    p_rows = np.tile(p, (k + 1, 1))
    q_rows = np.tile(q, (k, 1))
    extra: dict = {}
    if distributions == "dense":
        extra = {"target_probs": p_rows.tolist(), "draft_probs": q_rows.tolist()}
    elif distributions == "topk":
        extra = {
            "target_logprobs": [_topk_logprobs(p, topk)] * (k + 1),
            "draft_logprobs": [_topk_logprobs(q, topk)] * k,
        }
    elif distributions == "beta":
        extra = {"beta": [theory.beta(p, q)] * k}
    cdfs = StepCdfs(p_rows, q_rows)
    for i in range(cycles):
        step = speculative_step(p_rows, q_rows, rng, cdfs)
        ts = start + timedelta(seconds=i * step_seconds)
        record = {
            "request_id": f"sim-{i // steps_per_request}",
            "ts": ts.isoformat().replace("+00:00", "Z"),
            "k": k,
            "draft_tokens": step.draft_tokens,
            "accepted": step.accepted,
            "emitted_tokens": step.emitted_tokens,
            **extra,
        }
        if template is not None:
            record["template"] = template
        yield record


def write_step_log(records: Iterator[dict], out: IO[bytes]) -> int:
    """Write records as JSON Lines; returns how many were written."""
    n = 0
    for rec in records:
        out.write(orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE))
        n += 1
    return n
