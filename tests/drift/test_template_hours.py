"""Template-change verdicts compare templates, not clock times: under a daily mix of request types a rollout that
changes nothing is not called hurt, a real drop still is, and sides that cover different hours get no verdict."""
import sys
from datetime import datetime, timedelta

import numpy as np
import pytest
from engine_streams import vllm_window_lines
from paths import BENCH

from specmon.drift import alarms, detector
from specmon.ingest.pipeline import ingest_file

sys.path.insert(0, str(BENCH))
import production_study as ps  # noqa: E402  (engine windows as specmon compares them: 600 s blocks within hours)
import traffic_daily  # noqa: E402  (the study's daily-mix model, not the statistics' own)


def _judged(store, tmp_path, seed: int, span_h: float, rollout_h: float, drop: float, requests: int):
    log = traffic_daily.daily_steps(np.random.default_rng(seed), requests, span_h, 4, rollout_h, drop)
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(traffic_daily.step_log_lines(log)))
    assert ingest_file(store, str(path), run="prod").status == "stored"
    changes = alarms.analyse_run(store, "prod", c=0.05).changes
    assert [(ch.previous, ch.template) for ch in changes] == [("v1", "v2")]
    return changes[0]


@pytest.mark.slow  # three days of steps ingested and analysed
def test_a_rollout_that_changes_nothing_under_a_daily_mix_is_not_called_hurt(store, tmp_path):
    # three days; the rollout at noon of the third leaves two days and a chat-light night before it, a chat-heavy
    # afternoon after it: over the whole periods acceptance differs by about 0.03 with nothing changed
    change = _judged(store, tmp_path, 1, 72, 60, 0.0, 3000)
    c = change.comparison
    assert c.before.estimate - c.after.estimate > 0.02  # the periods do differ
    assert c.matching == "same hours of day" and c.hours == 12
    assert c.verdict == "no detectable change" and not change.hurt, change.describe()
    assert "compared on the 12 hours of day both cover" in change.describe()


@pytest.mark.slow  # three days of steps ingested and analysed
def test_a_real_drop_under_a_daily_mix_is_still_hurt(store, tmp_path):
    change = _judged(store, tmp_path, 2, 72, 60, 0.05, 3000)
    assert change.comparison.verdict == "hurt" and change.hurt, change.describe()
    assert change.comparison.difference < -0.03


def test_a_rollout_within_one_days_hours_says_the_sides_cover_different_hours(store, tmp_path):
    change = _judged(store, tmp_path, 3, 10, 5, 0.0, 600)
    assert change.comparison.verdict == detector.DIFFERENT_HOURS
    assert "the two sides cover different hours" in change.describe() and "hurt" not in change.describe()
    assert not change.hurt  # break-even (c = 0.05) lies far below the new side's interval


def _cells(rng, hours, rate, requests_per_hour, offset):
    """Requests of one template served through the given hours (cells: one request within one hour)."""
    n = requests_per_hour * len(hours)
    hour = np.repeat(np.asarray(hours) * detector.HOUR_US, requests_per_hour)
    checked = rng.integers(10, 40, n).astype(float)
    first = hour + rng.integers(0, detector.HOUR_US // 2, n)
    return detector.Cells(np.arange(n) + offset, hour, rng.binomial(checked.astype(int), rate).astype(float),
                          checked, first, first + detector.HOUR_US // 4)


def test_templates_served_side_by_side_are_compared_hour_by_hour():
    rng = np.random.default_rng(4)
    hours = list(range(30, 40))
    c = detector.compare(_cells(rng, hours, 0.8, 50, 0), _cells(rng, hours, 0.7, 50, 10_000))
    assert c.matching == "same hours" and c.hours == 10 and c.verdict == "hurt"
    assert c.difference == np.float64(c.difference) and -0.13 < c.difference < -0.07


def test_engine_window_verdicts_take_the_hours_as_the_observations():
    # long requests span many 10 s windows and so many 600 s blocks: the blocks of one hour share noise, and
    # taken as independent they call this no-op rollout (seed 3) a rise; the hours' own spread does not
    w = traffic_daily.engine_windows(np.random.default_rng(3), 0.05, 72, 4, 60, 0.0)
    before, after = ps._window_cells(w, ~w.v2), ps._window_cells(w, w.v2)
    assert detector.compare(before, after).verdict == "helped"
    c = detector.compare(before, after, by_stratum=True)
    assert c.verdict == "no detectable change" and c.hours == 12 and c.dof == c.hours - 1
    w = traffic_daily.engine_windows(np.random.default_rng(3), 0.05, 72, 4, 60, 0.05)
    c = detector.compare(ps._window_cells(w, ~w.v2), ps._window_cells(w, w.v2), by_stratum=True)
    assert c.verdict == "hurt" and c.difference < -0.03


def test_one_matched_hour_is_too_few_to_judge_by_the_hours():
    rng = np.random.default_rng(5)
    c = detector.compare(_cells(rng, [30], 0.8, 50, 0), _cells(rng, [30], 0.5, 50, 10_000), by_stratum=True)
    assert c.verdict == detector.ONE_HOUR and c.hours == 1 and c.difference < -0.2


@pytest.mark.slow  # three days of engine windows ingested and analysed twice
@pytest.mark.parametrize("drop, verdict", [(0.0, "no detectable change"), (0.05, "hurt")])
def test_an_annotated_rollout_on_a_vllm_log_is_judged_by_its_hours(store, tmp_path, drop, verdict):
    w = traffic_daily.engine_windows(np.random.default_rng(3), 0.05, 72, 4, 60, drop)
    start = datetime.combine((datetime.now() - timedelta(days=10)).date(), datetime.min.time())
    path = tmp_path / "vllm.log"
    path.write_text(vllm_window_lines(start, w.end_us, w.drafts, w.accepted_per_position, traffic_daily.WINDOW_S))
    assert ingest_file(store, str(path), run="prod").status == "stored"
    alarms.annotate(store, "prod", "v2", start + timedelta(hours=60), "new system prompt")
    [change] = alarms.analyse_run(store, "prod", c=0.05).changes
    c = change.comparison
    assert c.verdict == verdict and c.dof == c.hours - 1, change.describe()
    assert f"compared on the {c.hours} hours of day both cover" in change.describe()
