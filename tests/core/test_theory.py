"""Reference values from docs/math.md and from the literature."""
import math

import numpy as np
import pytest
from paper import PAPER_P, PAPER_Q

from specmon.core import theory


def test_beta_of_the_paper_pair():
    assert theory.beta(PAPER_P, PAPER_Q) == pytest.approx(0.88, abs=1e-12)
    assert theory.expected_tokens(0.88, 4) == pytest.approx(3.9356, abs=1e-4)


@pytest.mark.parametrize("alpha,k,expected", [(0.4, 2, 1.30), (0.4, 8, 0.93), (0.9, 8, 3.40)])
def test_speedup_reference_values_at_c_0_1(alpha, k, expected):
    assert theory.speedup(alpha, k, 0.10) == pytest.approx(expected, abs=0.005)


@pytest.mark.parametrize("c,k,expected,tol", [
    (0.10, 2, 0.171, 5e-4), (0.10, 4, 0.287, 5e-4), (0.10, 8, 0.445, 5e-4),
    (0.30, 2, 0.42, 5e-3), (0.30, 4, 0.57, 5e-3), (0.30, 8, 0.72, 5e-3),
])
def test_break_even_alpha(c, k, expected, tol):
    a = theory.break_even_alpha(k, c)
    assert a == pytest.approx(expected, abs=tol)
    assert theory.speedup(a, k, c) == pytest.approx(1.0, abs=1e-9)


def test_best_k_at_c_0_3():
    k, s = theory.best_k(0.8, 0.3)
    assert (k, round(s, 2)) == (3, 1.55)
    k, s = theory.best_k(0.9, 0.3)
    assert (k, round(s, 2)) == (5, 1.87)


def test_every_k_loses_at_alpha_0_4_c_0_5():
    k, s = theory.best_k(0.4, 0.5)
    assert k == 1 and s == pytest.approx(0.933, abs=5e-4) and s < 1


def test_break_even_edges():
    assert theory.break_even_alpha(4, 0.0) == 0.0
    assert math.isnan(theory.break_even_alpha(4, 1.5))
    assert theory.break_even_tokens(4, 0.25) == 2.0
    assert theory.expected_tokens(1.0, 4) == 5.0
    with pytest.raises(ValueError):
        theory.break_even_alpha(0, 0.1)


def test_expected_tokens_is_vectorised():
    e = theory.expected_tokens(np.array([0.0, 0.5, 1.0]), 3)
    np.testing.assert_allclose(e, [1.0, 1.875, 4.0])


def test_beta_over_rows_matches_numpy_in_float32():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(1000), size=200).astype(np.float32)
    q = rng.dirichlet(np.ones(1000), size=200).astype(np.float32)
    np.testing.assert_allclose(theory.beta(p, q), np.minimum(p, q).sum(axis=1), rtol=1e-5)


def test_topk_bounds_contain_the_exact_beta():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(50) * 0.3)
    q = rng.dirichlet(np.ones(50) * 0.3)
    exact = theory.beta(p, q)
    for k in (1, 5, 20, 50):
        top_p = {str(i): math.log(p[i]) for i in np.argsort(-p)[:k]}
        top_q = {str(i): math.log(q[i]) for i in np.argsort(-q)[:k]}
        lo, hi = theory.beta_bounds_topk(top_p, top_q)
        assert lo - 1e-12 <= exact <= hi + 1e-12
    assert lo == pytest.approx(exact) and hi == pytest.approx(exact)  # k = vocabulary: exact
    los, his = theory.beta_bounds_topk([top_p, top_p], [top_q, top_p])
    assert his[1] == pytest.approx(1.0) and los[0] == pytest.approx(exact)


def test_residual_is_a_distribution_and_falls_back_to_p():
    r = theory.residual(PAPER_P, PAPER_Q)
    assert r.sum() == pytest.approx(1.0) and (r >= 0).all()
    np.testing.assert_allclose(r, np.maximum(PAPER_P - PAPER_Q, 0) / 0.12)
    np.testing.assert_allclose(theory.residual(PAPER_P, PAPER_P), PAPER_P)


def _topk(row: np.ndarray, k: int) -> dict:
    return {int(i): float(row[i]) for i in np.argsort(-row, kind="stable")[:k]}


def _lp_sup_beta(p_top: dict, q_top: dict, vocab: int) -> float:
    """The largest beta over every pair (p, q) on `vocab` tokens consistent with the top-k logs, by linear
    programming (beta = max sum t_x with t_x <= p_x, t_x <= q_x is an LP): the brute-force answer."""
    from scipy.optimize import linprog
    n = vocab
    # variables: p (n), q (n), t (n)
    c = np.concatenate([np.zeros(2 * n), -np.ones(n)])
    a_ub, b_ub, a_eq, b_eq = [], [], [], []
    bounds = []
    for side, top in ((0, p_top), (1, q_top)):
        cap = min(top.values(), default=1.0)
        for x in range(n):
            bounds.append((top[x], top[x]) if x in top else (0.0, cap))
        row = np.zeros(3 * n)
        row[side * n:(side + 1) * n] = 1
        a_eq.append(row)
        b_eq.append(1.0)
    bounds += [(0.0, None)] * n
    for x in range(n):
        for side in (0, 1):
            row = np.zeros(3 * n)
            row[2 * n + x], row[side * n + x] = 1, -1
            a_ub.append(row)
            b_ub.append(0.0)
    res = linprog(c, A_ub=np.array(a_ub), b_ub=b_ub, A_eq=np.array(a_eq), b_eq=b_eq, bounds=bounds)
    assert res.status == 0, res.message
    return -res.fun


def test_topk_upper_bound_of_the_issue_example_is_sharp():
    # top-1 logs {A: 0.9} vs {B: 0.9}: every consistent pair has beta in [0, 0.2]
    assert theory.beta_bounds_from_topk_probs({"A": 0.9}, {"B": 0.9}) == pytest.approx((0.0, 0.2))
    assert _lp_sup_beta({0: 0.9}, {1: 0.9}, 12) == pytest.approx(0.2, abs=1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_topk_bounds_against_brute_force_on_small_vocabularies(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(3, 8))
    p = rng.dirichlet(np.ones(vocab) * rng.choice([0.2, 1.0, 3.0]))
    q = rng.dirichlet(np.ones(vocab) * rng.choice([0.2, 1.0, 3.0]))
    kp, kq = int(rng.integers(1, vocab + 1)), int(rng.integers(1, vocab + 1))
    p_top, q_top = _topk(p, kp), _topk(q, kq)
    lo, hi = theory.beta_bounds_from_topk_probs(p_top, q_top)
    # valid: the true pair, and any consistent pair on this small vocabulary, lies inside
    assert lo - 1e-12 <= theory.beta(p, q) <= hi + 1e-12
    assert _lp_sup_beta(p_top, q_top, vocab) <= hi + 1e-7  # (the LP solver's tolerance)
    # sharp: with room to spread the unlisted mass thinly (60 more tokens), a consistent pair attains hi
    assert _lp_sup_beta(p_top, q_top, vocab + 60) == pytest.approx(hi, abs=1e-7)
    # never looser than the bound that ignores the top-k caps
    both = p_top.keys() & q_top.keys()
    old_hi = lo + min(1 - sum(p_top[x] for x in both), 1 - sum(q_top[x] for x in both))
    assert hi <= old_hi + 1e-12


def test_the_profile_break_even_is_the_iid_one_on_a_geometric_profile_and_the_observed_alpha_at_break_even():
    steps = 10_000.0
    a, k, c = 0.7, 4, 0.25
    reached = a ** np.arange(k + 1)  # share of steps whose accepted prefix reaches each position
    checked, accepted = steps * reached[:-1], steps * reached[1:]
    be = theory.profile_break_even_alpha(checked, accepted, steps, float(theory.break_even_tokens(k, c)))
    assert be == pytest.approx(theory.break_even_alpha(k, c), abs=1e-9)
    # a falling profile exactly at break-even: its break-even alpha is its own alpha, below the i.i.d. alpha*
    rates = np.cumprod([0.85, 0.70, 0.55, 0.45])
    checked, accepted = steps * np.concatenate([[1.0], rates[:-1]]), steps * rates
    tokens = 1 + rates.sum()
    be = theory.profile_break_even_alpha(checked, accepted, steps, tokens)
    assert be == pytest.approx(accepted.sum() / checked.sum(), abs=1e-9)
    assert be < theory.break_even_alpha(4, (tokens - 1) / 4)
    # unreachable: even conditional rates scaled to 1 emit fewer tokens than break-even asks; nothing accepted
    assert theory.profile_break_even_alpha(checked, accepted, steps, 5.5) is None
    assert theory.profile_break_even_alpha(checked, 0 * accepted, steps, 1.5) is None
