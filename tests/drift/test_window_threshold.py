"""The drift threshold on engine windows whose reference is too short to state a rate: at least ln(stated figure) x
the variance of the CUSUM's increments over the span an alarm builds up in, relative to binomial counts' and to their
drift at the lower bound of the reference's acceptance; so one poor window among healthy ones does not alarm alone,
nor a run of them, nor a reference that read acceptance a little high, while a drop to break-even still alarms
within a few windows."""
import math
from dataclasses import replace

import numpy as np
import pytest
from persistent_windows import pearson_dispersion, persistent_windows, watched_with_the_floor_alone

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


def test_on_independent_binomial_windows_with_a_long_reference_the_floor_is_about_ln_of_the_figure():
    rng = np.random.default_rng(3)
    checked = np.full(4000, 200.0)
    accepted = rng.binomial(200, 0.8, 4000).astype(float)
    ts = np.arange(4000, dtype=np.int64) * WINDOW_US
    floor = calibration.least_h(accepted, checked, ts, accepted.sum() / checked.sum(), 0.7, ARL0)
    assert floor.margin < 0.002
    assert floor.dispersion == pytest.approx(1.0, abs=0.1)
    assert floor.h == pytest.approx(floor.dispersion * math.log(ARL0))


def test_windows_that_stay_alike_for_a_while_raise_the_floor_over_the_same_windows_in_another_order():
    """Requests that span windows: a window's acceptance persists over about ten windows. The same windows shuffled
    have the same one-window dispersion, but no runs of poor windows, and a smaller floor."""
    rng = np.random.default_rng(5)
    count = 2000
    level = np.repeat(rng.beta(0.81 * 60, 0.19 * 60, count // 10), 10)
    checked = rng.integers(80, 300, count).astype(float)
    accepted = rng.binomial(checked.astype(int), level).astype(float)
    ts = np.arange(count, dtype=np.int64) * WINDOW_US
    p0 = accepted.sum() / checked.sum()
    persistent = calibration.least_h(accepted, checked, ts, p0, p0 - 0.1, ARL0)
    order = rng.permutation(count)
    shuffled = calibration.least_h(accepted[order], checked[order], ts, p0, p0 - 0.1, ARL0)
    assert persistent.windows > 5 and shuffled.windows < persistent.windows
    assert persistent.h > 3 * shuffled.h, (persistent, shuffled)


def test_a_short_references_uncertain_acceptance_raises_the_floor():
    """The in-control drift is taken at the reference acceptance's lower bound: 30 windows leave it much further below
    their acceptance than 3,000 of the same process do."""
    rng = np.random.default_rng(9)
    a, n = windows(rng, 3000, 0.81, 200)
    ts = np.arange(3000, dtype=np.int64) * WINDOW_US
    short = calibration.least_h(a[:30], n[:30], ts[:30], a[:30].sum() / n[:30].sum(), 0.71, ARL0)
    long = calibration.least_h(a, n, ts, a.sum() / n.sum(), 0.71, ARL0)
    assert short.margin > 3 * long.margin > 0


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
    ts_ref = ts[:reference]
    floor = calibration.least_h(a[:reference], n[:reference], ts_ref, design.p0, design.p1, ARL0)
    assert design.h == floor.h == pytest.approx(design.dispersion * math.log(ARL0))
    assert f"h = {design.h:.2f} (the floor where no rate is stated: ln 20,000 x {design.dispersion:.1f}, the " \
        f"variance of the reference's CUSUM increments over the {floor.windows} windows an alarm builds up in, " \
        f"relative to binomial counts' and to their drift were acceptance {floor.margin:.3f} lower, its one-sided " \
        "99% bound), calibrated on the first 120 windows" in design.threshold_words()
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


def test_healthy_windows_that_stay_alike_for_a_while_do_not_alarm_from_a_growing_reference():
    """Three hours of such windows: no alarm in any of eight runs, where a floor of one window's dispersion, ln
    20,000 x Pearson's dispersion of the whole run, alarms in most of them."""
    first, count, pearson_alarmed = detector.REFERENCE_WINDOWS, 1080, 0
    for seed in range(8):
        a, n = persistent_windows(np.random.default_rng(seed), count)
        alarms, designs = watched_with_the_floor_alone(a, n)
        assert not alarms, (seed, [d.h for _, d in designs])
        one_window = replace(designs[-1][1], h=pearson_dispersion(a, n, a.sum() / n.sum()) * math.log(ARL0))
        pearson_alarmed += bool(detector.cusum(a[first:], n[first:], one_window)[1])
    assert pearson_alarmed >= 5
