"""Drift on counts: CUSUM alarms and template-change verdicts on engine log windows, rollout annotations."""
import json
import subprocess
from datetime import timedelta

import numpy as np
import pytest
from engine_streams import DROP_AT, START, vllm_log

from specmon.core.faults import SpecmonError
from specmon.drift import alarms, detector
from specmon.ingest.pipeline import ingest_file


@pytest.fixture
def engine_store(store, tmp_path):
    res = ingest_file(store, vllm_log(tmp_path / "vllm.log"), run="vllm-prod")
    assert res.status == "stored"
    return store


def test_engine_windows_get_a_calibrated_detector_and_a_dated_alarm(engine_store):
    result = alarms.analyse_run(engine_store, "vllm-prod", c=0.3)
    assert result.unit == "windows" and result.design is not None and result.design.unit == "windows"
    # the reference grew at the checkpoints before the drop (100 minutes of 5-second lines: 4 blocks by 40 minutes)
    assert 0.75 < result.design.p0 < 0.85 and result.design.reference == 16 * detector.REFERENCE_WINDOWS
    assert result.design.clusters == 4 and not result.design.states_a_rate
    assert len(result.alarms) == 1, [a.describe() for a in result.alarms]
    alarm = result.alarms[0]
    drop = START + timedelta(seconds=5 * DROP_AT)
    assert drop <= alarm.alarm_ts <= drop + timedelta(minutes=2)
    assert alarm.change_lo_ts <= drop + timedelta(seconds=5) and alarm.change_hi_ts >= drop - timedelta(seconds=5)
    assert ("no false-alarm rate is stated: the reference's 480 windows are fewer than 8 x the stated 20,000"
            in alarm.describe()) and alarm.open


def test_annotation_splits_an_engine_run_and_is_named_near_the_change(engine_store):
    drop = START + timedelta(seconds=5 * DROP_AT)
    alarms.annotate(engine_store, "vllm-prod", "v2", drop - timedelta(seconds=2), "new system prompt")
    result = alarms.analyse_run(engine_store, "vllm-prod", c=0.3)
    assert len(result.changes) == 1
    change = result.changes[0]
    # 100 minutes of one morning: before and after cover different hours, so no verdict on the template, but the
    # after-side's own interval still lies below break-even, a finding
    assert change.comparison.verdict == detector.DIFFERENT_HOURS and "cover different hours" in change.describe()
    assert change.source == "annotation" and change.template == "v2" and change.below_break_even and change.hurt
    assert "annotated rollout" in change.describe() and "new system prompt" in change.describe()
    alarm = result.alarms[0]
    assert alarm.template == "v2" and [e.source for e in alarm.near] == ["annotation"]
    assert "annotated rollout of template 'v2'" in alarm.describe()


def test_annotating_a_missing_run_is_a_clear_error(store):
    with pytest.raises(SpecmonError, match="no run named 'nope'"):
        alarms.annotate(store, "nope", "v2", START)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_annotate_and_check_from_the_command_line(tmp_path, specmon_cmd):
    db = str(tmp_path / "e.duckdb")
    subprocess.run([*specmon_cmd, "ingest", "--db", db, "--run", "vllm-prod", vllm_log(tmp_path / "vllm.log")],
                   check=True, capture_output=True)
    drop = START + timedelta(seconds=5 * DROP_AT)
    r = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "vllm-prod", "--template", "v2", "--at",
                        drop.isoformat(), "--note", "rollout 42"], capture_output=True, text=True)
    assert r.returncode == 0 and "annotation 1: run 'vllm-prod' rolled out template 'v2'" in r.stdout, r.stderr
    r = subprocess.run([*specmon_cmd, "check", "--db", db, "--c", "0.3", "--json"], capture_output=True, text=True)
    out = json.loads(r.stdout)
    assert r.returncode == 1
    assert any(p.startswith("DRIFT: run 'vllm-prod'") for p in out["problems"])
    assert any(p.startswith("TEMPLATE CHANGE: run 'vllm-prod': annotated rollout") for p in out["problems"])
    assert out["template_changes"][0]["source"] == "annotation" and out["alarms"][0]["unit"] == "windows"
    r = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "nope", "--template", "v2"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no run named 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "vllm-prod", "--template", "v3", "--at",
                        "tomorrow"], capture_output=True, text=True)
    assert r.returncode == 2 and "--at: 'tomorrow' is neither a duration" in r.stderr


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_prometheus_counter_samples_are_watched_as_windows(store):
    # vLLM's spec_decode counters as Prometheus keeps them (cumulative, one sample per scrape), 15 s apart
    from datetime import timezone

    from specmon.follow.prometheus_api import Sample
    from specmon.ingest.pipeline import ingest_samples

    rng = np.random.default_rng(3)
    labels = {"engine": "0", "model_name": "llama"}
    totals = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "p0": 0, "p1": 0}
    samples = []
    for i in range(500):
        mean = 0.8 if i < 380 else 0.3
        r = rng.beta(mean * 40, (1 - mean) * 40)
        drafts = int(rng.integers(40, 120))
        first = rng.random(drafts) < r
        second = first & (rng.random(drafts) < r)
        totals["drafts"] += drafts
        totals["draft_tokens"] += 2 * drafts
        totals["p0"] += int(first.sum())
        totals["p1"] += int(second.sum())
        totals["accepted"] += int(first.sum() + second.sum())
        ts = (START + timedelta(seconds=15 * i)).replace(tzinfo=timezone.utc)
        for name, key in (("drafts", "drafts"), ("draft_tokens", "draft_tokens"), ("accepted_tokens", "accepted")):
            samples.append(Sample(f"vllm:spec_decode_num_{name}_total", labels, ts, float(totals[key])))
        for pos in (0, 1):
            samples.append(Sample("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                  {**labels, "position": str(pos)}, ts, float(totals[f"p{pos}"])))
    assert ingest_samples(store, samples, "prometheus", "prom").status == "stored"
    result = alarms.analyse_run(store, "prom", c=0.3)
    assert result.unit == "windows" and result.design is not None and 0.75 < result.design.p0 < 0.85
    drop = START + timedelta(seconds=15 * 379)  # the first window with the new rate ends at scrape 380
    after = [a for a in result.alarms if a.last_alarm_ts >= drop]
    assert len(after) == 1 and len(result.alarms) == 1
    assert drop <= after[0].alarm_ts <= drop + timedelta(minutes=5) and after[0].open


@pytest.mark.slow  # many draws: run by CI with the slow checks
def test_a_day_of_engine_windows_over_overlapping_requests_keeps_the_stated_rate():
    # 10-second windows over requests lasting tens of seconds to minutes, so neighbouring windows share requests
    # (not the calibration's own model); once a checkpoint's reference holds a day of blocks the rate is stated, and
    # the windows per false alarm after it are near the stated figure. Windows drawn as independent clusters, as
    # before blocks, alarmed many times too often here; bench/drift_windows.py measures it over more streams.
    import sys

    from paths import BENCH
    sys.path.insert(0, str(BENCH))
    import drift_windows

    rng = np.random.default_rng(11)
    runs = [drift_windows.stream_figures(rng, "constant", 2_000) for _ in range(6)]
    assert all(r["stated_at"] is not None and r["last_reference_hours"] >= 24 for r in runs)
    ratio = sum(r["watched"] for r in runs) / max(sum(r["alarms"] for r in runs), 1) / 2_000
    assert 0.5 < ratio < 2.0, [(r["watched"], r["alarms"]) for r in runs]
