"""The self-starting drift design (detector.run_cusum): the reference grows at the checkpoints, each taken only outside
an alarm episode, a lasting drop never joins it, and the watch cut into pieces is the watch over the whole stream. One
seeded stream, calibrated for real (a 500-step first reference and a stated 1,000 steps per false alarm keep it under a
second or two)."""
import sys
from dataclasses import replace

import numpy as np
import pytest
from paths import BENCH

from specmon.drift import calibration, detector

sys.path.insert(0, str(BENCH))
import streams  # noqa: E402  (the study's request models, which are not the detector's own)

K, BREAK_EVEN, ARL0, FIRST, DROP = 4, 0.45, 1000, 500, 7000


def stream() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """7,000 in-control steps at per-token acceptance 0.80 (correlation 0.2 within requests), then a lasting drop
    to 0.35, below break-even."""
    rng = np.random.default_rng(0)
    a0, c0, r0 = streams.steps(rng, DROP, 0.80, K, 0.2, "geometric")
    a1, c1, r1 = streams.steps(rng, 3000, 0.35, K, 0.2, "geometric")
    return np.concatenate([a0, a1]), np.concatenate([c0, c1]), np.concatenate([r0, r1 + r0.max() + 1])


def test_the_reference_grows_outside_alarm_episodes_and_a_lasting_drop_never_joins_it():
    a, c, req = stream()
    first = calibration.design_for(a, c, req, K, BREAK_EVEN, ARL0, FIRST)
    redesign = calibration.redesigner(lambda _: (a, c, req), K, BREAK_EVEN, ARL0)
    assert detector.checkpoints(FIRST) == [1000, 2000, 4000, 8000]
    w, found, designs = detector.detect(a, c, first, FIRST, redesign)
    _, raw, _, _ = detector.run_cusum(a[FIRST:], c[FIRST:], FIRST, detector.CusumState.start(first), redesign)
    # every checkpoint before the drop is taken (at its size, or later where an episode was open), none after it:
    # from the drop on the CUSUM keeps alarming, so the 8,000-step checkpoint waits for an episode's end
    assert [d.reference for _, d in designs] == [500, 1000, 2000, 4000]
    for t, d in designs[1:]:
        assert d.reference <= t < DROP and not any(t - detector.EPISODE_GAP <= x < t for x in raw)
        assert d.p0 == a[:d.reference].sum() / c[:d.reference].sum()  # p0 from every step before the checkpoint
        assert w[t] <= max(0.0, float(a[t] * np.log(d.p1 / d.p0) + (c[t] - a[t]) * np.log((1 - d.p1) / (1 - d.p0))))
    # the grown reference pictures the process better: its p0 within 0.035 of the truth, about 3 standard errors of
    # a 4,000-step (200-request) reference at this correlation (design effect about 9)
    assert abs(designs[-1][1].p0 - 0.80) < 0.035
    # the drop is found within a few hundred steps, under the last design, and dated against its p0
    drop = [e for e in found if e.last_alarm_index >= DROP]
    assert len(drop) == 1 and DROP <= drop[0].alarm_index < DROP + 600 and drop[0].design == designs[-1][1]
    assert drop[0].alpha_before == designs[-1][1].p0 and abs(drop[0].change_index - DROP) < 150


def test_the_watch_cut_into_pieces_is_the_watch_over_the_whole_stream():
    a, c, req = stream()
    first = calibration.design_for(a, c, req, K, BREAK_EVEN, ARL0, FIRST)
    redesign = calibration.redesigner(lambda _: (a, c, req), K, BREAK_EVEN, ARL0)
    whole = detector.run_cusum(a[FIRST:], c[FIRST:], FIRST, detector.CusumState.start(first), redesign)
    taken = [t for t, _ in whole[3]]
    # cuts at, just before and just after each checkpoint taken, at a nominal one, and inside the drop's episode
    cuts = sorted({FIRST, *(t + d for t in taken for d in (-1, 0, 1)), 1000, 4000, DROP + 301, len(a)})
    state, w, raw, designs = detector.CusumState.start(first), [], [], []
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        piece = detector.run_cusum(a[lo:hi], c[lo:hi], lo, state, redesign)
        w.append(piece[0])
        raw += piece[1]
        state = piece[2]
        designs += piece[3]
    np.testing.assert_allclose(np.concatenate(w), whole[0], rtol=1e-12, atol=1e-9)
    assert raw == whole[1] and designs == whole[3]
    # W is summed piece by piece: equal but for the order of floating-point additions
    assert replace(state, w=0.0) == replace(whole[2], w=0.0) and state.w == pytest.approx(whole[2].w, rel=1e-12)


def test_the_design_states_its_rate_per_alarm_episode_from_its_own_calibration():
    # the calibration counts alarm episodes on its own simulated streams at h; the design carries the figure and
    # its words state it beside the rate per alarm (re-alarms of one episode make it the rarer of the two)
    a, c, req = stream()
    design = calibration.design_for(a, c, req, K, BREAK_EVEN, ARL0, FIRST)
    assert design is not None and design.episode_points is not None and design.episode_points > ARL0
    words = design.threshold_words()
    assert f"one false alarm per {ARL0:,} steps" in words
    assert f"one alarm episode, alarms within {detector.EPISODE_GAP:,} steps of each other, per " \
           f"{round(design.episode_points, -2):,.0f} steps" in words
    kept_h_only = calibration.design_for(a, c, req, K, BREAK_EVEN, ARL0, FIRST, threshold=lambda *_, **__: design.h)
    assert kept_h_only is not None and "per alarm episode: unknown" in kept_h_only.threshold_words()


def test_no_rate_is_stated_until_the_reference_holds_a_full_day():
    # a reference shorter than a day pictures only its own hours of a traffic mix that swings with the clock: no
    # false-alarm rate is stated, and the words say why; one that spans a day states its rate
    a, c, req = stream()
    for hours, states in ((2.0, False), (30.0, True)):
        ts_us = np.linspace(0, hours * 3.6e9, FIRST).astype(np.int64)
        design = calibration.design_for(a, c, req, K, BREAK_EVEN, ARL0, FIRST, ts_us=ts_us)
        assert design is not None and design.states_a_rate is states
        assert abs(design.reference_hours - hours) < 1e-6
        words = design.threshold_words()
        assert ("one false alarm per" in words) is states
        assert ("less than a full day" in words) is not states, words
