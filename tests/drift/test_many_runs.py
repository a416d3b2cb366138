"""Drift analysis of many runs at once (alarms.analyse, what `specmon check` runs): the same verdicts as each run
analysed on its own, with the calibrations done outside the reading block (in parallel processes), and the database
free for another process's writes meanwhile."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from engine_streams import vllm_log
from test_state import assert_same, random_lines

from specmon.drift import alarms
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

ARL0 = 2000  # a stated figure whose calibrations take a fraction of a second each


@pytest.mark.slow  # a dozen calibrations, twice
def test_many_runs_analysed_together_give_what_each_gives_on_its_own(tmp_path):
    db = tmp_path / "together.duckdb"
    store = Store(str(db))
    sizes = {"short": 150, "one-checkpoint": 250, "two-checkpoints": 420, "drops": 300}
    for seed, (run, n_requests) in enumerate(sizes.items()):
        path = tmp_path / f"{run}.jsonl"
        path.write_text("".join(random_lines(np.random.default_rng(seed), n_requests)))
        assert ingest_file(store, str(path), run=run).status == "stored"
    # the same steps under another run (a blank line more: another file): one reference, calibrated once
    again = tmp_path / "short-again.jsonl"
    again.write_text((tmp_path / "short.jsonl").read_text() + "\n")
    assert ingest_file(store, str(again), run="short-again").status == "stored"
    assert ingest_file(store, vllm_log(tmp_path / "engine.log"), run="engine").status == "stored"
    alone = tmp_path / "alone.duckdb"
    shutil.copyfile(db, alone)

    together = alarms.analyse(store, arl0_steps=ARL0)
    assert sorted(r.run for r in together) == sorted([*sizes, "engine", "short-again"])
    one_by_one = Store(str(alone))
    for got in together:
        assert_same(got, alarms.analyse_run(one_by_one, got.run, arl0_steps=ARL0), got.run)
    assert any(r.alarms for r in together) and any(len(r.cusum) for r in together)
    # every step-log run's state and every threshold published, so the next analysis calibrates nothing
    assert store.query("SELECT count(DISTINCT run) FROM drift_states")[0][0] == len(sizes) + 1
    assert store.query("SELECT count(*) FROM drift_calibrations")[0][0] == \
        one_by_one.query("SELECT count(*) FROM drift_calibrations")[0][0]
    for got, again in zip(together, alarms.analyse(store, arl0_steps=ARL0), strict=True):
        assert_same(again, got, f"{got.run}, from the kept states")


WRITE = """
import json, sys, time
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store
store = Store(sys.argv[1], lock_timeout=float(sys.argv[3]), on_wait=lambda _: None)
print(json.dumps(ingest_file(store, sys.argv[2], run=sys.argv[4]).status))
"""


@pytest.mark.slow  # four calibrations at the default false-alarm rate
def test_another_process_writes_while_check_calibrates(tmp_path, specmon_cmd):
    """A run of 16,000 steps calibrates four references (the first and three checkpoints), seconds of work that
    once held the database for reading throughout; a writer beside it, waiting at most 5 s each time (a generous
    guard, not a timing figure), stores its file every time while check runs."""
    db = str(tmp_path / "db.duckdb")
    log = tmp_path / "long.jsonl"
    log.write_text("".join(random_lines(np.random.default_rng(7), 800, span_s=60 * 3600)))
    assert ingest_file(Store(db), str(log), run="long").status == "stored"
    check = subprocess.Popen([*specmon_cmd, "check", "--db", db, "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    written = 0
    while check.poll() is None:
        piece = tmp_path / f"w{written}.jsonl"
        piece.write_text(json.dumps({"request_id": f"w{written}", "draft_tokens": [1, 2], "accepted": 1}) + "\n")
        # steps stored now, after the run's own: they change none of its references
        done = subprocess.run([sys.executable, "-c", WRITE, db, str(piece), "5", "long"], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == "stored"
        if check.poll() is None:
            written += 1
    out, err = check.communicate()
    assert check.returncode in (0, 1, 2), err
    assert written >= 1, "check ended before a write beside it finished"
    assert "Traceback" not in err
    assert Store(db).query("SELECT count(*) FROM steps WHERE request_id LIKE 'w%'")[0][0] >= written


def test_ingest_prepares_the_drift_detector_so_check_calibrates_nothing(tmp_path, specmon_cmd):
    """`specmon ingest` calibrates the references its files fill (two step logs' and an engine log's) and keeps the
    step logs' drift states, so a check with the same design reads them (no calibration, the same verdicts as a
    check that calibrated everything itself); --no-drift leaves it all to the check, and a check with another design
    calibrates its own."""
    files = []
    for seed, n_requests in enumerate((250, 420)):
        path = tmp_path / f"run{seed}.jsonl"
        path.write_text("".join(random_lines(np.random.default_rng(seed), n_requests)))
        files.append(str(path))
    files.append(vllm_log(tmp_path / "engine.log"))
    design = ["--false-alarm-steps", str(ARL0), "--c", "0.1"]
    prepared, deferred = str(tmp_path / "prepared.duckdb"), str(tmp_path / "deferred.duckdb")

    ingest = subprocess.run([*specmon_cmd, "ingest", "--db", prepared, *files, *design], capture_output=True,
                            text=True, timeout=300)
    assert ingest.returncode == 0, ingest.stderr
    words = [line for line in ingest.stderr.splitlines() if "calibrating" in line]
    # the first calibration names every reference's size; each later one the checkpoints' grown references
    assert words[0].startswith("specmon: calibrating the drift detector on 3 reference(s) of 3 run(s) "
                               "(2,000 steps, 30 windows), "), words
    assert all(" grown to a checkpoint (" in line for line in words[1:]), words
    assert Store(prepared).query("SELECT count(DISTINCT run) FROM drift_states")[0][0] == 2  # engine windows: none
    ingest = subprocess.run([*specmon_cmd, "ingest", "--db", deferred, "--no-drift", *files], capture_output=True,
                            text=True, timeout=300)
    assert ingest.returncode == 0 and "calibrating" not in ingest.stderr, ingest.stderr
    assert Store(deferred).query("SELECT count(*) FROM drift_calibrations")[0][0] == 0

    def check(db: str, *options: str) -> subprocess.CompletedProcess:
        done = subprocess.run([*specmon_cmd, "check", "--db", db, "--json", *options], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode in (0, 1), done.stderr
        return done

    reads, calibrates = check(prepared, *design), check(deferred, *design)
    assert "calibrating" not in reads.stderr
    assert "calibrating the drift detector on 3 reference(s) of 3 run(s)" in calibrates.stderr
    assert json.loads(reads.stdout) == json.loads(calibrates.stdout)
    assert json.loads(reads.stdout)["alarms"], "the runs' drops are found"
    assert "calibrating" in check(prepared, "--false-alarm-steps", str(2 * ARL0), "--c", "0.1").stderr
