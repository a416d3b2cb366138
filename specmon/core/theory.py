"""The acceptance and economics formulas of speculative decoding (docs/math.md).

Pure functions on numbers and numpy arrays; no I/O. Sources: Leviathan, Kalman & Matias (arXiv:2211.17192),
Chen et al. (arXiv:2302.01318).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from specmon.core.settings import THEORY_K_MAX

ArrayLike = float | np.ndarray

# Rows of a dense distribution are summed in blocks of this many rows, so the elementwise minimum never
# materialises a full (rows x vocab) temporary: 64 rows of a 32k vocabulary stay in cache.
_BETA_BLOCK_ROWS = 64


def expected_tokens(alpha: ArrayLike, k: ArrayLike) -> ArrayLike:
    """Tokens emitted per verification step under the i.i.d. model: (1 - alpha^(k+1)) / (1 - alpha).

    At alpha = 1 every draft survives and the step emits k + 1 tokens.
    """
    a = np.asarray(alpha, dtype=float)
    kk = np.asarray(k, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(a >= 1.0, kk + 1.0, (1.0 - a ** (kk + 1.0)) / (1.0 - a))
    return e.item() if e.ndim == 0 else e


def speedup(alpha: ArrayLike, k: ArrayLike, c: ArrayLike) -> ArrayLike:
    """Walltime speedup over plain decoding: expected_tokens(alpha, k) / (1 + k*c)."""
    s = np.asarray(expected_tokens(alpha, k)) / (1.0 + np.asarray(k, dtype=float) * np.asarray(c, dtype=float))
    return s.item() if s.ndim == 0 else s


def best_k(alpha: float, c: float, k_max: int = THEORY_K_MAX) -> tuple[int, float]:
    """The draft length in 1..k_max with the highest speedup, and that speedup (which may be below 1)."""
    if k_max < 1:
        raise ValueError(f"k_max must be at least 1, got {k_max}")
    ks = np.arange(1, k_max + 1)
    s = np.asarray(speedup(alpha, ks, c))
    i = int(np.argmax(s))
    return int(ks[i]), float(s[i])


def break_even_tokens(k: ArrayLike, c: ArrayLike) -> ArrayLike:
    """Model-free break-even: a step must emit more than 1 + k*c tokens on average to pay for itself."""
    t = 1.0 + np.asarray(k, dtype=float) * np.asarray(c, dtype=float)
    return t.item() if t.ndim == 0 else t


def break_even_alpha(k: int, c: float) -> float:
    """The per-token acceptance alpha* at which speedup(alpha*, k, c) = 1.

    0 at c = 0 (any acceptance wins); nan when even alpha = 1 loses (c > 1), since no alpha breaks even.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if c < 0 or not math.isfinite(c):
        raise ValueError(f"c must be a finite cost ratio >= 0, got {c}")
    if c == 0:
        return 0.0
    if speedup(1.0, k, c) < 1.0:
        return math.nan
    # S is increasing in alpha with S(0) = 1/(1+kc) < 1, so the root in (0, 1] is unique and bisection finds it
    # to the last bit (64 halvings of [0, 1] pass double precision). The tokens are summed as 1 + a + ... + a^k:
    # the closed form cancels near a = 1 and would put a root at c = 1 (exactly alpha* = 1) below 1.
    powers = np.arange(k + 1)
    lo, hi = 0.0, 1.0
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if float(np.sum(mid ** powers)) < 1.0 + k * c:
            lo = mid
        else:
            hi = mid
    return hi


def profile_break_even_alpha(checked: Sequence[float], accepted: Sequence[float], steps: float,
                             tokens_break_even: float) -> float | None:
    """The per-token acceptance at break-even for a measured per-position profile, not the i.i.d. model.

    checked[i] and accepted[i] count position i + 1 over `steps` steps. Acceptance is lowered (or raised) by one
    factor lam at every position, keeping the profile's shape: position i's cumulative rate accepted[i] / steps
    becomes that times lam^(i+1) and its checked share checked[i] / steps times lam^i. lam* solves
    L(lam) = 1 + sum_i accepted[i] / steps * lam^(i+1) = tokens_break_even, and the answer is the per-token
    acceptance accepted / checked of that profile (at lam = 1, the observed alpha). None where no factor reaches
    break-even (no conditional rate may exceed 1) or nothing was accepted."""
    n = np.asarray(checked, dtype=float) / steps if steps else np.zeros(0)
    r = np.asarray(accepted, dtype=float) / steps if steps else np.zeros(0)
    if not len(r) or r.sum() <= 0:
        return None
    conditional = np.divide(r, n, out=np.zeros_like(r), where=n > 0)
    lam_max = 1.0 / float(conditional.max())
    powers = np.arange(1, len(r) + 1)

    def tokens(lam: float) -> float:
        return 1.0 + float(np.sum(r * lam ** powers))

    if tokens(lam_max) < tokens_break_even:
        return None
    lo, hi = 0.0, lam_max  # L rises with lam from 1 at lam = 0
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if tokens(mid) < tokens_break_even:
            lo = mid
        else:
            hi = mid
    return float(np.sum(r * hi ** powers) / np.sum(n * hi ** (powers - 1)))


def beta(p: np.ndarray, q: np.ndarray) -> np.ndarray | float:
    """Probability that a token drawn from q is accepted against p: sum_x min(p(x), q(x)), per row."""
    p = np.asarray(p)
    q = np.asarray(q)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    if p.ndim == 1:
        return float(np.minimum(p, q).sum())
    rows = p.reshape(-1, p.shape[-1])
    qrows = q.reshape(-1, q.shape[-1])
    out = np.empty(rows.shape[0], dtype=np.result_type(rows.dtype, np.float32))
    buf = np.empty((min(_BETA_BLOCK_ROWS, rows.shape[0]), rows.shape[1]), dtype=np.result_type(rows, qrows))
    for start in range(0, rows.shape[0], _BETA_BLOCK_ROWS):
        stop = min(start + _BETA_BLOCK_ROWS, rows.shape[0])
        block = buf[: stop - start]
        np.minimum(rows[start:stop], qrows[start:stop], out=block)
        block.sum(axis=1, out=out[start:stop])
    return out.reshape(p.shape[:-1])


def beta_bounds_from_topk_probs(p_top: Mapping, q_top: Mapping) -> tuple[float, float]:
    """The sharp bounds on beta = sum_x min(p(x), q(x)) from top-k *probabilities* {token: p} of one position
    (beta_bounds_topk_flat holds the formula and its assumptions)."""
    p = np.fromiter(p_top.values(), dtype=np.float64, count=len(p_top))
    q = np.fromiter(q_top.values(), dtype=np.float64, count=len(q_top))
    q_at_p = np.fromiter((q_top.get(tok, math.nan) for tok in p_top), dtype=np.float64, count=len(p_top))
    p_at_q = np.fromiter((p_top.get(tok, math.nan) for tok in q_top), dtype=np.float64, count=len(q_top))
    lo, hi = beta_bounds_topk_flat(p, q_at_p, np.array([len(p)]), q, p_at_q, np.array([len(q)]))
    return float(lo[0]), float(hi[0])


def beta_bounds_topk_flat(
    p: np.ndarray, q_at_p: np.ndarray, p_counts: np.ndarray, q: np.ndarray, p_at_q: np.ndarray, q_counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The sharp bounds on beta = sum_x min(p(x), q(x)) at many positions at once, from top-k *probabilities*
    (docs/math.md, "beta from top-k logs").

    The listed probabilities of p lie position after position in `p` (p_counts[i] of them at position i), with
    q_at_p the probability q lists for the same token (NaN where q does not list it); q, p_at_q and q_counts the
    same the other way round. Known: p on its listed set P, q on Q. Every unlisted token of a side has at most
    that side's smallest listed probability (m_p, m_q; 1 where nothing is listed), and a side's unlisted tokens
    share its unlisted mass U_p = 1 - sum_P p (U_q alike; 0 where the listed mass exceeds 1 by rounding). With
    F = sum_{P and Q} min(p, q), a = sum_{P not Q} min(p, m_q) and b = sum_{Q not P} min(q, m_p):

        F  <=  beta  <=  F + min(U_q + min(b, U_p), U_p + min(a, U_q)).

    Both ends are attained by some pair of distributions consistent with the logs when the vocabulary is large
    enough to spread unlisted mass thinly (real vocabularies are); for a known small vocabulary they stay valid.
    """
    n = len(p_counts)
    p_pos = np.repeat(np.arange(n), p_counts)
    q_pos = np.repeat(np.arange(n), q_counts)
    p_shared = ~np.isnan(q_at_p)
    q_shared = ~np.isnan(p_at_q)
    lo = np.bincount(p_pos, weights=np.where(p_shared, np.fmin(p, q_at_p), 0.0), minlength=n)
    u_p = np.maximum(1.0 - np.bincount(p_pos, weights=p, minlength=n), 0.0)
    u_q = np.maximum(1.0 - np.bincount(q_pos, weights=q, minlength=n), 0.0)
    m_p = _segment_min(p, p_counts)
    m_q = _segment_min(q, q_counts)
    a = np.bincount(p_pos, weights=np.where(p_shared, 0.0, np.minimum(p, m_q[p_pos])), minlength=n)
    b = np.bincount(q_pos, weights=np.where(q_shared, 0.0, np.minimum(q, m_p[q_pos])), minlength=n)
    return lo, lo + np.minimum(u_q + np.minimum(b, u_p), u_p + np.minimum(a, u_q))


def _segment_min(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The minimum of each run of counts[i] values of x; 1 for an empty run (no listed probability caps it)."""
    out = np.ones(len(counts))
    filled = counts > 0
    if filled.any():
        out[filled] = np.minimum.reduceat(x, (np.cumsum(counts) - counts)[filled])
    return out


def _probs(logprobs: Mapping) -> dict:
    return {tok: math.exp(lp) for tok, lp in logprobs.items()}


def beta_bounds_topk(
    p_top: Mapping | Sequence[Mapping], q_top: Mapping | Sequence[Mapping]
) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
    """The sharp bounds on beta when only the top-k log-probabilities of p and q are known (see
    beta_bounds_from_topk_probs). Arguments are {token: logprob} mappings, or sequences of them
    (one per position), which give arrays.
    """
    if isinstance(p_top, Mapping) != isinstance(q_top, Mapping):
        raise TypeError("p_top and q_top must both be mappings or both sequences of them")
    if isinstance(p_top, Mapping) and isinstance(q_top, Mapping):
        return beta_bounds_from_topk_probs(_probs(p_top), _probs(q_top))
    if len(p_top) != len(q_top):
        raise ValueError(f"p_top and q_top must have the same length, got {len(p_top)} and {len(q_top)}")
    pairs = [beta_bounds_from_topk_probs(_probs(a), _probs(b)) for a, b in zip(p_top, q_top, strict=True)]
    arr = np.array(pairs, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The distribution a rejected position resamples from: norm(max(0, p - q)), per row.

    Where p <= q everywhere (so rejection has probability 0) the residual is undefined; p is returned there,
    which is what a sampler needs if rounding ever lands it in that branch.
    """
    p = np.asarray(p, dtype=float)
    d = np.maximum(p - np.asarray(q, dtype=float), 0.0)
    total = d.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, d / np.where(total > 0, total, 1.0), p)
