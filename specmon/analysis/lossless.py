"""Is the output still the target's? Distributional checks on stored steps (docs/math.md, "Losslessness").

Ingest keeps, for every emitted token whose target distribution was logged in full, F_t(x_t - 1) and p_t(x_t).
From those: the randomized PIT (uniform under losslessness, whatever p_t is) and, where the data show one fixed
target distribution, a chi-square and TV test of emitted-token counts beside a plain-sampling baseline of the same
size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmon.core import stats
from specmon.core.settings import KS_LEVEL
from specmon.store.database import Store

# Two logged probabilities of the same token count as equal (the same fixed p) within this.
_SAME_P = 1e-9

# In step order, as the steps were stored (the PIT's random draws are taken in this order).
_EMITTED_SQL = """
SELECT unnest(pit_below) AS below, unnest(pit_mass) AS mass, unnest(emitted_tokens[1:len(pit_mass)]) AS token
FROM (SELECT d.* FROM steps st JOIN step_details d USING (step_id) JOIN run_segments rs USING (segment_id)
      WHERE rs.run = ? AND rs.template = ? AND d.pit_mass IS NOT NULL ORDER BY d.step_id)
"""


@dataclass(frozen=True)
class PitCheck:
    tokens: int
    u: np.ndarray
    ks: stats.TestResult


@dataclass(frozen=True)
class FixedTargetCheck:
    tokens: int
    vocabulary_seen: int
    chi_square: stats.TestResult
    tv: float
    baseline_chi_square: stats.TestResult  # the same test on as many tokens sampled from p directly
    baseline_tv: float


def segments_with_distributions(store: Store) -> list[tuple[str, str, int]]:
    """(run, template, emitted tokens with a logged target distribution), for segments that have any."""
    return [tuple(r) for r in store.query(
        "SELECT ss.run, ss.template, sum(rq.pit_tokens) FROM rollup_requests rq JOIN shown_segments ss "
        "USING (segment_id) WHERE rq.pit_tokens IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2")]


def _emitted(store: Store, run: str, template: str):
    return store.query_df(_EMITTED_SQL, [run, template])


def consistent(ks: stats.TestResult, level: float = KS_LEVEL) -> bool:
    """The losslessness verdict: a KS test of the PIT against U(0, 1) passes unless its p-value is below level."""
    return ks.pvalue >= level


def pit_check(store: Store, run: str, template: str, seed: int = 0) -> PitCheck | None:
    """Randomized PIT of the segment's emitted tokens, and its KS test against U(0, 1)."""
    df = _emitted(store, run, template)
    if df.empty:
        return None
    rng = np.random.default_rng(seed)
    u = stats.randomized_pit_of(df["below"].to_numpy(), df["mass"].to_numpy(), rng)
    return PitCheck(len(u), u, stats.uniformity_ks(u))


def fixed_target_check(store: Store, run: str, template: str, seed: int = 0) -> FixedTargetCheck | None:
    """Chi-square and TV of emitted-token counts against p, where every step logged the same p.

    p is read off the logged probabilities of the tokens that were emitted; tokens never emitted share the
    remaining mass as one bin. None where the logged p differs between steps (then only the PIT applies).
    """
    df = _emitted(store, run, template)
    if df.empty:
        return None
    per_token = df.groupby("token").agg(n=("mass", "size"), p=("mass", "first"),
                                        spread=("mass", lambda m: m.max() - m.min()),
                                        below_spread=("below", lambda b: b.max() - b.min()))
    if (per_token["spread"] > _SAME_P).any() or (per_token["below_spread"] > _SAME_P).any():
        return None
    rest = max(0.0, 1.0 - per_token["p"].sum())
    p = np.append(per_token["p"].to_numpy(), rest)
    counts = np.append(per_token["n"].to_numpy(), 0)
    n = int(counts.sum())
    baseline = np.bincount(np.random.default_rng(seed).choice(len(p), size=n, p=p / p.sum()), minlength=len(p))
    return FixedTargetCheck(n, len(per_token), stats.chi_square_gof(counts, p), stats.tv_distance(counts, p),
                            stats.chi_square_gof(baseline, p), stats.tv_distance(baseline, p))
