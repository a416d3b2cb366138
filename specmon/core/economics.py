"""The speedup surface, break-even curves and a segment's operating point, as tables for charts.

Pure: numbers in, DataFrames out. The formulas are specmon.core.theory's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specmon.core import theory
from specmon.core.settings import SURFACE_K_MAX

ALPHAS = np.round(np.arange(0.0, 1.0, 0.02), 2)
COSTS = np.round(np.arange(0.0, 1.01, 0.02), 2)


def surface_alpha_k(c: float, k_max: int = SURFACE_K_MAX, alphas: np.ndarray = ALPHAS) -> pd.DataFrame:
    """Speedup S(alpha, k, c) for a fixed c, one row per (alpha, k)."""
    a, k = np.meshgrid(alphas, np.arange(1, k_max + 1), indexing="ij")
    s = np.asarray(theory.speedup(a, k, c))
    return pd.DataFrame({"alpha": a.ravel(), "k": k.ravel(), "speedup": s.ravel(), "wins": s.ravel() > 1})


def surface_alpha_c(k: int, alphas: np.ndarray = ALPHAS, costs: np.ndarray = COSTS) -> pd.DataFrame:
    """Speedup S(alpha, k, c) for a fixed k, one row per (alpha, c)."""
    a, c = np.meshgrid(alphas, costs, indexing="ij")
    s = np.asarray(theory.speedup(a, k, c))
    return pd.DataFrame({"alpha": a.ravel(), "c": c.ravel(), "speedup": s.ravel(), "wins": s.ravel() > 1})


def break_even_curves(ks: tuple[int, ...], costs: np.ndarray = COSTS) -> pd.DataFrame:
    """alpha*(c) for each k; rows where no alpha breaks even (c > 1) are left out."""
    rows = [{"k": k, "c": float(c), "break_even_alpha": theory.break_even_alpha(k, float(c))}
            for k in ks for c in costs]
    df = pd.DataFrame(rows)
    return df[df["break_even_alpha"].notna()].reset_index(drop=True)


@dataclass(frozen=True)
class OperatingPoint:
    alpha: float
    k: int
    c: float
    speedup_iid: float          # S(alpha, k, c)
    best_k: int
    best_speedup: float
    gain_from_best_k: float     # best_speedup / speedup_iid
    best_speedup_hi: float | None  # the best k's S at the top of alpha's interval (None: no interval)
    tokens_measured: float | None
    tokens_iid: float           # expected_tokens(alpha, k)
    tokens_break_even: float    # 1 + k c
    iid_error: float | None     # (tokens_iid - tokens_measured) / tokens_measured


def operating_point(alpha: float, k: int, c: float, tokens_measured: float | None, alpha_hi: float | None = None,
                    k_max: int = SURFACE_K_MAX) -> OperatingPoint:
    """Where a segment stands, what the best k would give (at alpha and at the top of its interval, `alpha_hi`),
    and how far the i.i.d. model is from measured L."""
    s = float(theory.speedup(alpha, k, c))
    kb, sb = theory.best_k(alpha, c, k_max)
    sb_hi = float(theory.best_k(alpha_hi, c, k_max)[1]) if alpha_hi is not None else None
    e = float(theory.expected_tokens(alpha, k))
    err = (e - tokens_measured) / tokens_measured if tokens_measured else None
    return OperatingPoint(alpha, k, c, s, kb, sb, sb / s if s > 0 else math.inf, sb_hi, tokens_measured, e,
                          float(theory.break_even_tokens(k, c)), err)
