"""specmon's own t and normal quantiles against scipy's, and the import they spare the command line."""
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

from specmon.core import stats

CONFIDENCES = (0.01, 0.1, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999, 0.9999, 0.999999)


def test_t_quantile_matches_scipy_from_a_fifth_of_a_degree_of_freedom_to_ten_million():
    dofs = np.exp(np.linspace(np.log(0.2), np.log(1e7), 120))
    dofs = np.concatenate([dofs, [1, 2, 3, 19, 49.9, 50, 50.1, stats.T_EXPANSION_DOF - 1, stats.T_EXPANSION_DOF,
                                  stats.T_EXPANSION_DOF + 1]])
    for dof in dofs:
        for confidence in CONFIDENCES:
            mine = stats.t_quantile(confidence, float(dof))
            theirs = float(special.stdtrit(dof, 0.5 + confidence / 2))
            assert mine == pytest.approx(theirs, rel=1e-13), (dof, confidence)


def test_t_quantile_edges():
    assert stats.t_quantile(0.95, float("inf")) == stats.normal_quantile(0.95)
    assert np.isnan(stats.t_quantile(0.95, 0.0))
    assert stats.t_quantile(0.95, 1.0) == pytest.approx(np.tan(np.pi * 0.975 - np.pi / 2), rel=1e-14)


def test_t_tail_and_density_match_scipy():
    for dof in (0.7, 1.0, 4.0, 19.0, 250.0, 2999.0):
        for t in (0.0, 0.3, 1.96, 4.0, 30.0):
            assert stats.t_upper_tail(t, dof) == pytest.approx(float(special.stdtr(dof, -t)), rel=1e-12, abs=1e-300)
            density = float(np.exp(special.gammaln((dof + 1) / 2) - special.gammaln(dof / 2))
                            / np.sqrt(dof * np.pi) * (1 + t * t / dof) ** (-(dof + 1) / 2))
            assert stats.t_density(t, dof) == pytest.approx(density, rel=1e-12)


def test_normal_quantile_matches_scipy():
    for confidence in CONFIDENCES:
        assert stats.normal_quantile(confidence) == pytest.approx(float(special.ndtri(0.5 + confidence / 2)),
                                                                  rel=1e-15, abs=1e-16)


def test_the_statistics_load_no_scipy():
    code = ("import sys, specmon.core.stats, specmon.analysis.summary; "
            "print(sorted(m for m in sys.modules if m.startswith('scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
