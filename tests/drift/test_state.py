"""The kept drift state (specmon.drift.state) gives what a from-scratch analysis of the whole stream gives.

The oracle reads every step of the run in (ts, step_id) order and runs alarms.whole_stream_drift on it (the
analysis held whole in memory: detector.detect, the template events and comparisons over per-step arrays), as
analyse_run did before the state existed. The data: random step logs whose acceptance drops, recovers and drops
again (several alarm episodes, one dated from steps taken in by an earlier analysis), whose requests interleave
and span hours, with two templates side by side and a third rolled out later, steps sharing a time, and an
annotation at a time inside an hour. They are ingested in pieces, in order and out of order, one file twice, and
as a watched log that grows; after every piece the analysis is compared, field by field, with the oracle's.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import subprocess
import sys
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from engine_streams import vllm_log
from holding import hold_database

from specmon.analysis import summary
from specmon.core.settings import DEFAULT_ARL0_STEPS
from specmon.drift import alarms, calibration, detector
from specmon.drift import state as drift_state
from specmon.follow.config import SourceConfig, WatchConfig
from specmon.follow.watcher import Watcher
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

T0 = datetime(2026, 3, 1, 22, 17, 3)
_STREAM_SQL = """
SELECT st.accepted, st.checked, coalesce(st.k, st.g) AS k, epoch_us(st.ts) AS ts_us, rs.template,
       hash(st.request_id) AS cluster
FROM steps st JOIN run_segments rs USING (segment_id) WHERE rs.run = ? ORDER BY st.ts, st.step_id
"""


def scratch(store: Store, run: str, c: float | None = None) -> alarms.RunDrift:
    """The analysis from every step of the run, held in memory (no state)."""
    s = store.query_df(_STREAM_SQL, [run])
    stream = alarms.Stream(s["accepted"].to_numpy(float), s["checked"].to_numpy(float), s["ts_us"].to_numpy(np.int64),
                           s["cluster"].to_numpy(), s["template"].to_numpy(object), int(s["k"].max()), "steps")
    notes = alarms.run_annotations(store, run)
    return alarms.whole_stream_drift(store, run, stream, c, DEFAULT_ARL0_STEPS, notes)


def assert_same(got, want, where: str) -> None:
    if dataclasses.is_dataclass(got) and not isinstance(got, type):
        assert type(got) is type(want), where
        for f in dataclasses.fields(got):
            assert_same(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    elif isinstance(got, list | tuple):
        assert len(got) == len(want), (where, len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(got, pd.DataFrame):  # the W chart: the same stretches; W summed from a kept point (rounding)
        assert list(got["ts"]) == list(want["ts"]), where
        np.testing.assert_allclose(got["W"].to_numpy(float), want["W"].to_numpy(float), rtol=1e-9, atol=1e-9,
                                   err_msg=where)
    elif isinstance(got, float) and isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12) or (math.isnan(got) and math.isnan(want)), where
    else:
        assert got == want, (where, got, want)


def compare(store: Store, run: str, c: float | None = None) -> alarms.RunDrift:
    got = alarms.analyse_run(store, run, c)
    assert_same(got, scratch(store, run, c), f"{run} c={c}")
    return got


def random_lines(rng: np.random.Generator, n_requests: int = 420, span_s: int = 30 * 3600) -> list[str]:
    """Step log lines in time order. Requests of about 20 steps, each with its own acceptance; the level drops at a
    third of the way, recovers, and drops again at two thirds; template 'b' runs beside 'a', 'c' replaces both at
    60%. Times are whole seconds, so steps share them."""
    records = []
    for r in range(n_requests):
        t = T0 + timedelta(seconds=int(span_s * r / n_requests))
        frac = r / n_requests
        level = 0.82 if frac < 0.35 else 0.45 if frac < 0.45 else 0.82 if frac < 0.7 else 0.4
        rate = float(np.clip(rng.beta(level * 12, (1 - level) * 12), 0.02, 0.98))
        template = "c" if frac >= 0.6 else ("a" if rng.random() < 0.7 else "b")
        for _ in range(int(rng.integers(8, 32))):
            t += timedelta(seconds=int(rng.integers(0, 40)))
            accepted = 0
            while accepted < 4 and rng.random() < rate:
                accepted += 1
            records.append((t, json.dumps({"request_id": f"q{r}", "ts": t.isoformat() + "Z", "k": 4, "template":
                                           template, "draft_tokens": [1, 2, 3, 4], "accepted": accepted})))
    records.sort(key=lambda x: x[0])
    return [line + "\n" for _, line in records]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return random_lines(np.random.default_rng(20261130))


def kept_points(store: Store, run: str) -> list[int]:
    return [r[0] for r in store.query("SELECT points FROM drift_states WHERE run = ? ORDER BY points", [run])]


@pytest.mark.slow  # long streams cut into many pieces
def test_pieces_in_order_advance_the_kept_state_and_match_the_whole_stream(store, tmp_path, lines, monkeypatch):
    monkeypatch.setattr(drift_state, "CHUNK_POINTS", 2100)  # long pieces are read in several chunks
    cuts = [0, 1500, 2600, 4100, 5000, 6400, 7300, len(lines)]  # the first piece is shorter than the reference
    total = 0
    for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        piece = tmp_path / f"piece{i}.jsonl"
        piece.write_text("".join(lines[lo:hi]))
        assert ingest_file(store, str(piece), run="prod").status == "stored"
        total = hi
        if i == 3:
            compare(store, "prod", c=0.2)  # another design, kept beside the first from here on
        result = compare(store, "prod")
        # saved, and advanced rather than duplicated
        assert kept_points(store, "prod") == ([total] if i < 3 else [cuts[4], total] if i > 3 else [total, total])
    assert total > 2 * detector.REFERENCE_STEPS and len(result.alarms) >= 2, [a.describe() for a in result.alarms]
    # the reference grew at the 4,000-step checkpoint (taken at step 4,708, once the first episode was over, inside
    # the piece 4,100-5,000): the second drop alarms under that design; the 8,000-step one waits behind its alarms
    assert [a.design.reference for a in result.alarms] == [detector.REFERENCE_STEPS, 2 * detector.REFERENCE_STEPS]
    assert result.design.reference == 2 * detector.REFERENCE_STEPS
    assert any(ch.template == "c" for ch in result.changes)
    compare(store, "prod", c=0.2)  # the second design advances over three pieces at once

    # the same file again changes nothing
    assert ingest_file(store, str(tmp_path / "piece2.jsonl"), run="prod").status == "already ingested"
    before = store.query("SELECT design_key, state FROM drift_states ORDER BY 1")
    compare(store, "prod")
    assert store.query("SELECT design_key, state FROM drift_states ORDER BY 1") == before

    # an annotation inside an hour: judged from the rollups' whole hours and the cut hours' steps
    alarms.annotate(store, "prod", "c", T0 + timedelta(hours=14, minutes=21, seconds=7), "new prompt")
    result = compare(store, "prod")
    assert any(ch.source == "annotation" for ch in result.changes)


@pytest.mark.slow  # long streams cut into many pieces
def test_pieces_out_of_order_rebuild_where_steps_arrive_before_the_last_one(store, tmp_path, lines, monkeypatch):
    monkeypatch.setattr(drift_state, "CHUNK_POINTS", 3000)
    cuts = [0, 2500, 3300, 5200, 6100, len(lines)]
    pieces = []
    for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        pieces.append(tmp_path / f"p{i}.jsonl")
        pieces[-1].write_text("".join(lines[lo:hi]))
    for i in (0, 2, 1, 4, 3):
        assert ingest_file(store, str(pieces[i]), run="late").status == "stored"
        compare(store, "late")
    # a piece whose steps interleave with those already stored (every third line of a stretch, then the rest)
    mixed = lines[:1000]
    (tmp_path / "m1.jsonl").write_text("".join(mixed[::3]))
    (tmp_path / "m2.jsonl").write_text("".join(line for i, line in enumerate(mixed) if i % 3))
    for name in ("m1", "m2"):
        assert ingest_file(store, str(tmp_path / f"{name}.jsonl"), run="mixed").status == "stored"
        compare(store, "mixed")  # m1 alone is shorter than the reference: no detector yet, as from scratch
    (tmp_path / "m3.jsonl").write_text("".join(lines[1000:4000]))
    assert ingest_file(store, str(tmp_path / "m3.jsonl"), run="mixed").status == "stored"
    compare(store, "mixed")


def test_hours_holding_more_points_than_one_read_are_read_in_several(store, tmp_path, monkeypatch):
    # reads are cut at the ends of hours (drift_state.chunks); an hour of more steps than a read is read in pieces
    monkeypatch.setattr(drift_state, "CHUNK_POINTS", 2100)
    dense = tmp_path / "dense.jsonl"
    dense.write_text("".join(random_lines(np.random.default_rng(7), n_requests=420, span_s=1500)))
    assert ingest_file(store, str(dense), run="dense").status == "stored"
    per_hour = store.query("SELECT max(n) FROM (SELECT count(*) AS n FROM steps GROUP BY date_trunc('hour', ts))")
    assert per_hour[0][0] > 3 * drift_state.CHUNK_POINTS
    assert len(compare(store, "dense").alarms) >= 1


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_watched_log_growing_advances_the_state_in_the_watcher(store, tmp_path, lines):
    followed = tmp_path / "followed.jsonl"
    followed.write_text("")
    watcher = Watcher(store, WatchConfig([SourceConfig("steplog", str(followed), run="watched")],
                                                     interval_s=0.1, alarm_every_s=0), log=lambda _: None)
    done = 0
    for cut in (2300, 3100, 5800, len(lines)):
        with followed.open("a") as out:
            out.write("".join(lines[done:cut]))
        done = cut
        while watcher.poll_once():
            pass
        assert kept_points(store, "watched") == [cut]  # the watcher's own analysis advanced and saved it
        compare(store, "watched")


def test_engine_windows_beside_a_step_log(store, tmp_path, lines):
    (tmp_path / "steps.jsonl").write_text("".join(lines[:3000]))
    assert ingest_file(store, str(tmp_path / "steps.jsonl"), run="steps").status == "stored"
    assert ingest_file(store, vllm_log(tmp_path / "vllm.log"), run="vllm").status == "stored"
    compare(store, "steps")
    windows = alarms.analyse_run(store, "vllm", c=0.3)
    assert windows.unit == "windows" and len(windows.alarms) == 1 and kept_points(store, "vllm") == []
    # engine windows are analysed whole (few), but their thresholds (the first 30 windows' and the checkpoints' at
    # 60 ... 480 windows, before the drop) are kept beside the step log's first reference's
    assert windows.design.reference == 480
    assert store.query("SELECT count(*) FROM drift_calibrations")[0][0] == 1 + 5


FRESH_PROCESS = """
import sys
from specmon.drift import alarms, calibration, detector
from specmon.store.database import Store
calls = []
calibrate = calibration.calibrate_threshold
calibration.calibrate_threshold = lambda *a, **k: calls.append(1) or calibrate(*a, **k)
result = alarms.analyse_run(Store(sys.argv[1]), "prod")
print(len(calls), len(result.alarms), result.design.h, repr(result.changes).replace(" ", ""))
"""


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_fresh_process_does_not_calibrate_again(tmp_path, lines):
    db = str(tmp_path / "fresh.duckdb")
    (tmp_path / "log.jsonl").write_text("".join(lines[:4000]))
    with Store(db) as s:
        assert ingest_file(s, str(tmp_path / "log.jsonl"), run="prod").status == "stored"

    def run() -> list[str]:
        return subprocess.run([sys.executable, "-c", FRESH_PROCESS, db], capture_output=True, text=True,
                              check=True).stdout.split()

    first, second = run(), run()
    # the second reads the threshold, the state and the template-change verdicts back from the database
    assert first[0] == "1" and second[0] == "0" and first[1:] == second[1:] and "TemplateChange" in first[3]
    with Store(db) as s:
        assert s.query("SELECT count(*) FROM drift_calibrations")[0][0] == 1
        with s.transaction() as cur:
            cur.execute("DELETE FROM drift_states")
    assert run()[0] == "0"  # the state rebuilt from every step, the threshold from the database
    with Store(db) as s, s.transaction() as cur:
        cur.execute("DELETE FROM drift_calibrations")
    assert run()[0] == "0"  # the kept state holds its design


def test_a_template_first_seen_at_the_time_of_the_last_step_taken_in(store, tmp_path, lines):
    """The new template's first step shares its time with the last step of the state (the template before it is
    looked up in the database), and an annotation is the first event (the template before it, too)."""
    records = [json.loads(line) for line in lines[:3200]]
    for i, rec in enumerate(records):
        rec["template"] = "a" if i < 2500 else "c"
    records[2499]["ts"] = records[2500]["ts"] = records[2498]["ts"]  # two steps at that time before it
    (tmp_path / "e1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2500]))
    (tmp_path / "e2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[2500:]))
    assert ingest_file(store, str(tmp_path / "e1.jsonl"), run="edge").status == "stored"
    compare(store, "edge")
    assert ingest_file(store, str(tmp_path / "e2.jsonl"), run="edge").status == "stored"
    result = compare(store, "edge")
    assert [(ch.previous, ch.template) for ch in result.changes] == [("a", "c")]
    at = datetime.fromisoformat(records[1200]["ts"].rstrip("Z")) + timedelta(milliseconds=500)
    alarms.annotate(store, "edge", "b", at, "first event")
    result = compare(store, "edge")
    assert result.changes[0].source == "annotation" and result.changes[0].previous == "a"


def test_the_break_even_the_detector_uses_is_the_summary_s(store, tmp_path, lines):
    """The break-even the detector watches for and its alarms show is the run's summary's: on a step log the measured
    per-position profile's, as summarize(by="run") reports it (alarms reads it through summary.step_economics,
    its rollups without the intervals, since `check` asks for every run), with c measured from timings, declared
    for a watched run, given, or unknown."""
    timed = [json.loads(line) for line in lines[:600]]
    for i, rec in enumerate(timed):
        rec.update(target_ms=30.0 + i % 7, draft_ms=4.0 + i % 5)
    (tmp_path / "timed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timed))
    (tmp_path / "plain.jsonl").write_text("".join(lines[:600]))
    assert ingest_file(store, str(tmp_path / "timed.jsonl"), run="timed").status == "stored"
    assert ingest_file(store, str(tmp_path / "plain.jsonl"), run="plain").status == "stored"
    with store.transaction() as cur:
        cur.execute("INSERT INTO watch_sources (source_key, kind, location, run, c) VALUES "
                    "('steplog:x', 'steplog', 'x', 'declared', 0.15)")
    (tmp_path / "declared.jsonl").write_text("".join(lines[600:900]))
    assert ingest_file(store, str(tmp_path / "declared.jsonl"), run="declared").status == "stored"
    seen = set()
    for run in ("timed", "plain", "declared"):
        for c in (None, 0.2):
            rows = summary.summarize(store, by="run", c=c, run=run, per_position=False)
            assert alarms.break_even_alpha(store, run, c, 4) == rows[0]["break_even_alpha"]
            seen.add(rows[0]["break_even_alpha_basis"])
            if rows[0]["break_even_alpha"] is not None:  # near the i.i.d. alpha* on this i.i.d. log, but not it
                assert rows[0]["break_even_alpha"] != rows[0]["break_even_alpha_iid"]
    assert seen == {None, "per-position profile"}


def test_a_database_created_again_under_the_same_name_is_not_mistaken_for_the_old_one(tmp_path, lines):
    """This process keeps states in memory beside the database's; a new file of the same name and the same step
    count must not inherit them."""
    db = tmp_path / "again.duckdb"
    for lo in (0, 500):
        (tmp_path / f"l{lo}.jsonl").write_text("".join(lines[lo:lo + 3000]))
        with Store(str(db)) as s:
            assert ingest_file(s, str(tmp_path / f"l{lo}.jsonl"), run="prod").status == "stored"
            compare(s, "prod")
        db.unlink()


def test_saving_a_state_gives_way_to_another_process_holding_the_database(tmp_path, lines):
    """The save after an analysis is a cache write: while another process holds the file it is skipped after
    SAVE_TIMEOUT_S, quietly, and the analysis is kept in this process and saved by the next one."""
    db = str(tmp_path / "busy.duckdb")
    (tmp_path / "log.jsonl").write_text("".join(lines[:2400]))
    with Store(db, on_wait=lambda _: pytest.fail("the save must not announce a wait")) as s:
        assert ingest_file(s, str(tmp_path / "log.jsonl"), run="prod").status == "stored"
        with s.reading():
            kept = alarms.Kept()
            alarms.analyse_unsaved(s, "prod", None, DEFAULT_ARL0_STEPS, kept)  # the analysis, before its save
        holder = hold_database(db, 60)
        try:
            assert drift_state.save(s, "prod", kept.state, kept.calibrations) is False
        finally:
            holder.stdin.write("done\n")
            holder.stdin.flush()
            holder.wait(timeout=60)
        assert kept_points(s, "prod") == []
        drift_state.remember(drift_state.identity(s), "prod", kept.state)
        compare(s, "prod")  # nothing kept in the database: built again, and saved
        assert kept_points(s, "prod") == [2400]


def test_a_state_kept_by_another_state_version_is_passed_over_unread(store):
    # a state stored by an older specmon may hold fields this one does not (STATE_VERSION 2 kept the design in force
    # beside the list of designs): its design key names its version, so it is skipped before it is parsed
    old_key = json.dumps([drift_state.STATE_VERSION - 1, calibration.CALIBRATION_VERSION, 20_000, 0.45])
    with store.transaction() as cur:
        cur.execute("INSERT INTO drift_states VALUES ('prod', ?, 'ref', 5000, ?, now()::TIMESTAMP)",
                    [old_key, json.dumps({"design_key": old_key, "design": {}, "a field of its own": 1})])
    with store.cursor() as cur:
        assert drift_state.load_states(cur, drift_state.identity(store), "prod") == []
