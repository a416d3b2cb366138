"""The drift detector: its false-alarm rate holds on streams without change, it finds a drop after a change, and
template changes get an honest before/after verdict."""
import subprocess

import numpy as np
import pytest

from specmon import alarms, drift, demo
from specmon.ingest import ingest_file

K, P0, P1, M, STEPS_PER_REQUEST, ARL0 = 4, 0.80, 0.45, 8.0, 20.0, 2000


def stream(rng, n_steps, alpha, m=M):
    a, c = drift.simulate_steps(rng, 1, n_steps, alpha, K, m, STEPS_PER_REQUEST)
    return a[0].astype(float), c[0].astype(float)


@pytest.fixture(scope="module")
def design():
    h = drift.calibrate_h(P0, P1, K, M, STEPS_PER_REQUEST, ARL0)
    return drift.Design(P0, P1, h, ARL0, M, K)


def test_false_alarm_rate_holds_on_clustered_streams_without_change(design):
    rng = np.random.default_rng(12345)  # not the calibration's seed: fresh streams
    steps = alarms_seen = 0
    for _ in range(40):
        a, c = stream(rng, 20_000, P0)
        _, raw = drift.cusum(a, c, design)
        steps += len(a)
        alarms_seen += len(raw)
    expected = steps / ARL0  # alarms per step = 1 / ARL0 when the detector restarts after each alarm
    assert abs(alarms_seen - expected) < 4 * np.sqrt(expected), (alarms_seen, expected)


def test_a_threshold_that_ignores_clustering_cries_wolf(design):
    naive_h = drift.calibrate_h(P0, P1, K, float("inf"), STEPS_PER_REQUEST, ARL0)
    assert naive_h < design.h
    rng = np.random.default_rng(777)
    a, c = stream(rng, 200_000, P0)
    _, raw = drift.cusum(a, c, drift.Design(P0, P1, naive_h, ARL0, float("inf"), K))
    assert len(raw) > 2 * len(a) / ARL0  # at least twice the stated false-alarm rate


def test_a_drop_below_break_even_is_found_after_the_change():
    design = drift.Design(P0, P1, drift.calibrate_h(P0, P1, K, M, STEPS_PER_REQUEST, 20_000), 20_000, M, K)
    rng = np.random.default_rng(99)
    before_a, before_c = stream(rng, 5000, P0)
    after_a, after_c = stream(rng, 3000, 0.35)
    a, c = np.concatenate([before_a, after_a]), np.concatenate([before_c, after_c])
    _, found = drift.detect(a, c, design)
    assert len(found) == 1  # (at one false alarm per 20,000 steps, 4,000 watched steps before the change)
    episode = found[0]
    assert 5000 <= episode.alarm_index < 5000 + 600  # found within a few hundred steps of the change
    assert abs(episode.change_index - 5000) < 300
    assert episode.alpha_after < 0.45 < episode.alpha_before


def test_design_from_data_estimates_spread_and_reference():
    rng = np.random.default_rng(5)
    a, c = stream(rng, 4000, P0)
    request_ids = np.repeat(np.arange(200), 20)  # 20 steps per request, as simulated on average
    d = drift.design_for(a, c, request_ids, K, break_even=0.45, arl0_steps=ARL0)
    assert abs(d.p0 - P0) < 0.05 and d.p1 == pytest.approx(0.45)
    assert d.h > 0


def test_template_change_on_the_demo_is_called_harmful(store):
    ingest_file(store, str(demo.DEMO_LOG), run="prod")
    result = alarms.analyse_run(store, "prod")
    assert len(result.changes) == 1
    change = result.changes[0]
    assert (change.previous, change.template, change.comparison.verdict) == ("v1", "v2", "hurt")
    assert change.below_break_even
    assert "hurt acceptance" in change.describe() and "now below break-even" in change.describe()
    assert len(result.alarms) == 1 and result.alarms[0].open
    # the alarm dates the drop to within a few hours of the template change (2026-11-25 12:34)
    assert abs((result.alarms[0].change_ts - change.first_ts).total_seconds()) < 4 * 3600


def test_check_reports_drift_and_template_change(tmp_path, specmon_cmd):
    db = str(tmp_path / "d.duckdb")
    subprocess.run([*specmon_cmd, "ingest", "--db", db, "--run", "prod", str(demo.DEMO_LOG)], check=True,
                   capture_output=True)
    r = subprocess.run([*specmon_cmd, "check", "--db", db], capture_output=True, text=True)
    assert r.returncode == 1
    assert "DRIFT: run 'prod': acceptance fell from 0.821" in r.stdout
    assert "TEMPLATE CHANGE: run 'prod': template 'v1' -> 'v2'" in r.stdout and "hurt acceptance" in r.stdout
    r = subprocess.run([*specmon_cmd, "check", "--db", db, "--json", "--since", "2026-11-27T00:00"],
                       capture_output=True, text=True)
    import json
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["alarms"][0]["open"] is True
    assert [s["template"] for s in out["segments"]] == ["v2"]  # only steps since then
    assert not any(p.startswith("TEMPLATE CHANGE") for p in out["problems"])  # the change was before --since
    r = subprocess.run([*specmon_cmd, "check", "--db", db, "--since", "yesterday"], capture_output=True, text=True)
    assert r.returncode == 2 and "--since: 'yesterday' is neither a duration" in r.stderr


def test_a_healthy_stream_passes_check(tmp_path, specmon_cmd):
    db = str(tmp_path / "h.duckdb")
    sim = subprocess.run([*specmon_cmd, "simulate", "--cycles", "3000", "--distributions", "none"],
                         capture_output=True).stdout
    subprocess.run([*specmon_cmd, "ingest", "--db", db, "-"], input=sim, check=True, capture_output=True)
    r = subprocess.run([*specmon_cmd, "check", "--db", db, "--c", "0.1"], capture_output=True, text=True)
    assert r.returncode == 0 and "no drift alarm" in r.stdout


def test_alert_rule_is_valid_prometheus(tmp_path, specmon_cmd):
    import os
    import shutil
    rule = subprocess.run([*specmon_cmd, "alert-rule", "--k", "4", "--c", "0.2"], capture_output=True, text=True)
    assert rule.returncode == 0 and "< 0.8000" in rule.stdout
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            raise RuntimeError("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    path = tmp_path / "rules.yml"
    path.write_text(rule.stdout)
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 1 rules found" in check.stdout
