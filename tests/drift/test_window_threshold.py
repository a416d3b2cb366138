"""The drift threshold on engine windows whose reference is too short to state a rate: at least ln(stated figure) x
the windows' dispersion, so one poor window among healthy ones does not alarm alone, while a drop to break-even
still alarms within a window or two."""
import math

import numpy as np
import pytest

from specmon.drift import calibration, detector

K, ARL0 = 4, 20_000
BREAK_EVEN = 0.287  # k = 4, c = 0.1: far below the windows' acceptance of about 0.81
WINDOW_US = 10_000_000


def windows(rng: np.random.Generator, count: int, mean: float, concentration: float) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, checked) of windows whose checked positions share a rate drawn from a beta (the requests a window
    holds), 80-300 checked positions each."""
    checked = rng.integers(80, 300, count).astype(float)
    rate = rng.beta(mean * concentration, (1 - mean) * concentration, count)
    return rng.binomial(checked.astype(int), rate).astype(float), checked


def test_the_dispersion_is_one_for_binomial_windows_and_the_beta_binomial_excess_otherwise():
    rng = np.random.default_rng(3)
    checked = np.full(4000, 200.0)
    binomial = rng.binomial(200, 0.8, 4000).astype(float)
    assert 1.0 <= calibration.window_dispersion(binomial, checked, 0.8) < 1.1
    rate = rng.beta(0.8 * 40, 0.2 * 40, 4000)
    shared = rng.binomial(200, rate).astype(float)
    expected = 1 + (200 - 1) / (40 + 1)  # a beta-binomial's variance over the binomial's
    assert calibration.window_dispersion(shared, checked, 0.8) / expected == pytest.approx(1.0, rel=0.1)


def test_one_poor_window_after_a_short_reference_does_not_alarm_and_a_drop_to_break_even_does():
    rng = np.random.default_rng(7)
    a, n = windows(rng, 720, 0.81, 200)  # two hours of healthy windows
    poor_at, drop_at = 400, 650
    a[poor_at], n[poor_at] = 53.0, 98.0  # one quiet window with a poor request: acceptance 0.54
    a[drop_at:] = rng.binomial(n[drop_at:].astype(int), 0.29)
    ts = np.arange(len(a), dtype=np.int64) * WINDOW_US
    blocks = ts // 600_000_000
    reference = 120
    design = calibration.design_for(a, n, blocks, K, BREAK_EVEN, ARL0, reference, unit="windows", ts_us=ts)
    assert not design.states_a_rate and design.dispersion is not None
    assert design.h == calibration.least_h(design.dispersion, ARL0) == design.dispersion * math.log(ARL0)
    assert f"h = {design.h:.2f} (the floor where no rate is stated: ln 20,000 x the reference windows' dispersion " \
        f"{design.dispersion:.1f}), calibrated on the first 120 windows" in design.threshold_words()
    wa, wr = detector.llr_weights(design.p0, design.p1)
    assert a[poor_at] * wa + (n[poor_at] - a[poor_at]) * wr > 5  # the window the bootstrap's h alarmed on
    _, found = detector.cusum(a[reference:], n[reference:], design)
    assert found and drop_at <= reference + found[0] <= drop_at + 2, found


def test_a_reference_that_states_a_rate_keeps_the_bootstraps_threshold():
    rng = np.random.default_rng(11)
    a, n = windows(rng, 900, 0.81, 200)
    ts = np.arange(len(a), dtype=np.int64) * 600_000_000  # a window every 10 minutes: over six days, a block each
    blocks = ts // 600_000_000
    design = calibration.design_for(a, n, blocks, K, BREAK_EVEN, 100, 900, unit="windows", ts_us=ts)
    assert design.states_a_rate and design.dispersion is None
