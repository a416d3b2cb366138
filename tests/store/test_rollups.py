"""Rollup-based figures against a full scan of steps and positions, on random data.

The oracle is the summary SQL as it was before the rollups (every figure computed from steps and positions on each
call); it lives here, not in the package. The data: random runs, templates and requests whose steps cross hour and
day edges, step logs as JSON Lines and the flat form as Parquet, one file ingested twice, the demo's file under a
user run (full target distributions: the PIT list), and a watched step log read piece by piece as it grows.
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from specmon.analysis import lossless, summary
from specmon.core import resources, stats
from specmon.core.settings import BUCKETS
from specmon.follow.config import SourceConfig, WatchConfig
from specmon.follow.watcher import Watcher
from specmon.ingest import demo
from specmon.ingest.pipeline import ingest_file
from specmon.store import database, schema
from specmon.store.database import Store

_EXACT = "DECIMAL(38, 12)"

ORACLE_STEPS_SQL = """
WITH s AS (
    SELECT r.name AS run, {template} AS template, {bucket} AS bucket, r.demo, r.meta, i.ingested_at, st.*,
           d.* EXCLUDE (step_id)
    FROM steps st LEFT JOIN step_details d USING (step_id) JOIN segments sg USING (segment_id)
    JOIN runs r USING (run_id) JOIN ingests i USING (ingest_id)
    WHERE r.demo = ? AND (? IS NULL OR r.name = ?) AND (?::TIMESTAMP IS NULL OR st.ts >= ?::TIMESTAMP)
), per_request AS (
    SELECT run, template, bucket, request_id,
           count(*)::DOUBLE AS steps, sum(accepted)::DOUBLE AS accepted, sum(checked)::DOUBLE AS checked,
           sum(accepted) FILTER (WHERE beta_lo_sum IS NOT NULL)::DOUBLE AS b_accepted,
           sum(checked) FILTER (WHERE beta_lo_sum IS NOT NULL)::DOUBLE AS b_checked,
           sum(beta_lo_sum::{exact})::DOUBLE AS b_lo, sum(beta_hi_sum::{exact})::DOUBLE AS b_hi
    FROM s GROUP BY run, template, bucket, request_id
), leverage AS (
    SELECT *, coalesce(1 / nullif(1 - checked / nullif(sum(checked) OVER seg, 0), 0), 1) AS w_n,
              coalesce(1 / nullif(1 - steps / sum(steps) OVER seg, 0), 1) AS w_s
    FROM per_request WINDOW seg AS (PARTITION BY run, template, bucket)
), by_request AS (
    SELECT run, template, bucket, count(*) AS requests,
           sum(accepted * accepted) AS saa, sum(accepted * checked) AS san, sum(checked * checked) AS snn,
           sum(checked::HUGEINT * checked::HUGEINT * checked::HUGEINT)::DOUBLE AS sn3,
           sum(checked::HUGEINT * checked::HUGEINT * checked::HUGEINT * checked::HUGEINT)::DOUBLE AS sn4,
           sum((w_n * accepted * accepted)::{exact})::DOUBLE AS saa_l,
           sum((w_n * accepted * checked)::{exact})::DOUBLE AS san_l,
           sum((w_n * checked * checked)::{exact})::DOUBLE AS snn_l,
           sum((accepted * accepted / nullif(checked, 0))::{exact})::DOUBLE AS saa_n,
           sum(accepted * steps) AS sas, sum(steps * steps) AS sss,
           sum(steps::HUGEINT * steps::HUGEINT * steps::HUGEINT)::DOUBLE AS ss3,
           sum(steps::HUGEINT * steps::HUGEINT * steps::HUGEINT * steps::HUGEINT)::DOUBLE AS ss4,
           sum((w_s * accepted * accepted)::{exact})::DOUBLE AS saa_ls,
           sum((w_s * accepted * steps)::{exact})::DOUBLE AS sas_ls,
           sum((w_s * steps * steps)::{exact})::DOUBLE AS sss_ls,
           sum((accepted * accepted / nullif(steps, 0))::{exact})::DOUBLE AS saa_s,
           sum(b_checked) AS b_checked, sum(b_lo::{exact})::DOUBLE AS b_lo, sum(b_hi::{exact})::DOUBLE AS b_hi,
           sum((b_accepted - b_lo)::{exact})::DOUBLE AS d_lo, sum(pow(b_accepted - b_lo, 2)::{exact})::DOUBLE AS dd_lo,
           sum((b_accepted - b_hi)::{exact})::DOUBLE AS d_hi, sum(pow(b_accepted - b_hi, 2)::{exact})::DOUBLE AS dd_hi
    FROM leverage GROUP BY run, template, bucket
), by_step AS (
    SELECT run, template, bucket, any_value(demo) AS demo,
           count(*) AS steps, sum(g) AS drafted, sum(checked) AS checked, sum(accepted) AS accepted,
           max(coalesce(k, g)) AS k, avg(g) AS mean_g,
           median(draft_ms / g) FILTER (WHERE g > 0) AS draft_step_ms, median(target_ms) AS target_ms,
           min(ts) AS first_ts, max(ts) AS last_ts, count(*) FILTER (WHERE ts_inferred) AS ts_inferred,
           max(ingested_at) AS last_ingest, any_value(meta)::VARCHAR AS meta
    FROM s GROUP BY run, template, bucket
)
SELECT b.*, q.* EXCLUDE (run, template, bucket) FROM by_step b JOIN by_request q
  ON b.run = q.run AND b.template IS NOT DISTINCT FROM q.template AND b.bucket IS NOT DISTINCT FROM q.bucket
ORDER BY b.run, b.template, b.bucket
"""

ORACLE_POSITIONS_SQL = """
SELECT r.name AS run, {template} AS template, {bucket} AS bucket, p.position,
       count(*) FILTER (WHERE p.checked) AS checked, count(*) FILTER (WHERE p.accepted) AS accepted,
       (sum(p.beta_lo::{exact}) FILTER (WHERE p.checked) / count(p.beta_lo) FILTER (WHERE p.checked))::DOUBLE
           AS beta_lo,
       (sum(p.beta_hi::{exact}) FILTER (WHERE p.checked) / count(p.beta_hi) FILTER (WHERE p.checked))::DOUBLE
           AS beta_hi
FROM positions p JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) JOIN steps st USING (step_id)
WHERE r.demo = ? AND (? IS NULL OR r.name = ?) AND (?::TIMESTAMP IS NULL OR st.ts >= ?::TIMESTAMP)
GROUP BY ALL ORDER BY 1, 2, 3, 4
"""

# Each request's checked and accepted positions at each position: the clusters of the position's interval.
ORACLE_REQUEST_POSITIONS_SQL = """
SELECT r.name AS run, {template} AS template, {bucket} AS bucket, p.position, st.request_id,
       count(*) FILTER (WHERE p.checked) AS checked, count(*) FILTER (WHERE p.accepted) AS accepted
FROM positions p JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) JOIN steps st USING (step_id)
WHERE r.demo = ? AND (? IS NULL OR r.name = ?) AND (?::TIMESTAMP IS NULL OR st.ts >= ?::TIMESTAMP)
GROUP BY ALL HAVING count(*) FILTER (WHERE p.checked) > 0
"""


def cluster_columns(per_request: pd.DataFrame) -> dict:
    """The per-request sums of one position's interval, computed in numpy (stats.ClusterSums.of)."""
    s = stats.ClusterSums.of(per_request["accepted"].to_numpy(float), per_request["checked"].to_numpy(float))
    return {"requests": s.clusters, "saa": s.aa, "san": s.an, "snn": s.nn, "saa_l": s.aa_l, "san_l": s.an_l,
            "snn_l": s.nn_l, "sn3": s.n3, "sn4": s.n4, "saa_n": s.aa_n}


def oracle(store: Store, by: str = "template", *, run: str | None = None, bucket: str | None = None,
           since: datetime | None = None) -> list[dict]:
    """summary.summarize as it was: every figure from a scan of steps and positions."""
    day_output = by == "day"
    if day_output:
        by, bucket = "template", "day"
    fmt = dict(template="NULL::VARCHAR" if by == "run" else "sg.template", exact=_EXACT,
               bucket=f"time_bucket(INTERVAL '{BUCKETS[bucket]}', st.ts)" if bucket else "NULL::TIMESTAMP")
    params = [summary.demo_only(store), run, run, since, since]
    step_rows = store.query_df(ORACLE_STEPS_SQL.format(**fmt), params).to_dict("records")
    per_request = store.query_df(ORACLE_REQUEST_POSITIONS_SQL.format(**fmt), params)
    clusters = {tuple(None if pd.isna(v) else v for v in key): cluster_columns(part) for key, part in
                per_request.groupby(["run", "template", "bucket", "position"], dropna=False)}
    never_checked = cluster_columns(per_request.iloc[:0])
    positions: dict[tuple, list[dict]] = {}
    for rec in map(summary.clean_row, store.query_df(ORACLE_POSITIONS_SQL.format(**fmt), params).to_dict("records")):
        rec |= clusters.get((rec["run"], rec["template"], rec["bucket"], rec["position"]), never_checked)
        positions.setdefault((rec["run"], rec["template"], rec["bucket"]), []).append(rec)
    declared = summary.declared_costs(store)
    return [summary.segment_of(row, positions.get((row["run"], row["template"], row["bucket"]), []), None, by,
                             day_output, declared.get(row["run"])).to_dict()
            for row in map(summary.clean_row, step_rows)]


def assert_same(got, want, where: str = "") -> None:
    """Equal, floats to rounding (1e-9 relative)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {len(got)} rows, want {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


T0 = datetime(2026, 3, 1, 22, 40, tzinfo=timezone.utc)


def random_steplog(rng: np.random.Generator, path, *, n_requests: int, templates: list[str], start: datetime,
                   prefix: str) -> None:
    """Steps of interleaved requests; each request runs for up to a few hours, so it spans hour buckets (and the
    day edge near midnight). Some steps carry beta, timings, or no ts at all."""
    lines = []
    for r in range(n_requests):
        t = start + timedelta(minutes=float(rng.uniform(0, 300)))
        k = int(rng.integers(1, 6))
        template = templates[int(rng.integers(len(templates)))]
        for _ in range(int(rng.integers(1, 40))):
            t += timedelta(seconds=float(rng.exponential(400)))
            g = int(rng.integers(0, k + 1))
            rec: dict = {"request_id": f"{prefix}{r}", "draft_tokens": rng.integers(0, 50, g).tolist(),
                         "accepted": int(rng.integers(0, g + 1)), "k": k, "template": template}
            if rng.random() < 0.95:
                rec["ts"] = t.isoformat().replace("+00:00", "Z")
            if g and rng.random() < 0.6:
                rec["beta"] = np.round(rng.uniform(0.2, 0.95, g), 6).tolist()
            if rng.random() < 0.3:
                rec["target_ms"] = round(float(rng.uniform(20, 40)), 3)
                rec["draft_ms"] = round(float(rng.uniform(1, 9)), 3)
            lines.append((t, json.dumps(rec)))
    lines.sort()
    path.write_text("".join(line + "\n" for _, line in lines))


def random_flat(rng: np.random.Generator, path, *, n_requests: int, start: datetime) -> None:
    rows = []
    step = 0
    for r in range(n_requests):
        t = start.timestamp() + rng.uniform(0, 20000)
        template = ["a", "b"][int(rng.integers(2))]
        for _ in range(int(rng.integers(1, 30))):
            t += rng.exponential(300)
            g = int(rng.integers(1, 5))
            acc = int(rng.integers(0, g + 1))
            for pos in range(1, g + 1):
                rows.append({"request_id": f"f{r}", "ts": t, "template": template, "step": step, "position": pos,
                             "draft_token": int(rng.integers(0, 100)), "accepted": pos <= acc,
                             "beta": round(float(rng.uniform(0.3, 0.9)), 6)})
            step += 1
    pd.DataFrame(rows).to_parquet(path)


def compare_everything(store: Store) -> None:
    runs = summary.run_names(store)
    cuts = [None, T0 + timedelta(hours=3, minutes=17, seconds=3.25), T0 + timedelta(hours=5)]  # mid-hour, on an hour
    for since in cuts:
        since_naive = since.replace(tzinfo=None) if since else None
        for by in summary.GROUPINGS:
            want = oracle(store, by, since=since_naive)
            assert want, "the data must give rows to compare"
            assert_same(summary.summarize(store, by=by, since=since_naive), want, f"by={by} since={since}")
        for bucket in BUCKETS:
            want = oracle(store, "template", run=runs[0], bucket=bucket, since=since_naive)
            assert_same(summary.summarize(store, run=runs[0], bucket=bucket, since=since_naive), want,
                        f"bucket={bucket} since={since}")
    demo_rule = summary.demo_only(store)
    want_changes = store.query_df(
        "SELECT r.name AS run, sg.template, min(st.ts) AS first_ts FROM steps st JOIN segments sg USING (segment_id) "
        "JOIN runs r USING (run_id) WHERE r.demo = ? GROUP BY 1, 2 ORDER BY 1, 3", [demo_rule])
    pd.testing.assert_frame_equal(summary.template_changes(store), want_changes, check_dtype=False)
    want_pit = [tuple(r) for r in store.query(
        "SELECT r.name, sg.template, sum(len(d.pit_mass)) FROM steps st JOIN step_details d USING (step_id) "
        "JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) WHERE d.pit_mass IS NOT NULL AND r.demo = ? "
        "GROUP BY 1, 2 ORDER BY 1, 2",
        [demo_rule])]
    assert lossless.segments_with_distributions(store) == want_pit
    assert runs == [r[0] for r in store.query("SELECT name FROM runs WHERE demo = ? ORDER BY name", [demo_rule])]


def rollup_rows(store: Store) -> tuple[list, list, list]:
    return (store.query("SELECT * FROM rollup_requests ORDER BY ALL"),
            store.query("SELECT * FROM rollup_positions ORDER BY ALL"),
            store.query("SELECT * FROM rollup_request_positions ORDER BY ALL"))


@pytest.mark.slow  # random data at several sizes against full scans
def test_rollups_give_the_full_scan_figures_on_random_data(store, tmp_path):
    rng = np.random.default_rng(7)
    demo.ensure_demo(store)
    compare_everything(store)  # the demo alone: shown while nothing else is stored

    first = tmp_path / "first.jsonl"
    random_steplog(rng, first, n_requests=30, templates=["v1", "v2", ""], start=T0, prefix="q")
    assert ingest_file(store, str(first), run="alpha").status == "stored"
    assert ingest_file(store, str(first), run="alpha").status == "already ingested"  # the same bytes again
    second = tmp_path / "second.jsonl"  # the same requests continue in a second file
    random_steplog(rng, second, n_requests=30, templates=["v2", "v3"], start=T0 + timedelta(hours=2), prefix="q")
    assert ingest_file(store, str(second), run="alpha").status == "stored"
    flat = tmp_path / "flat.parquet"
    random_flat(rng, flat, n_requests=25, start=T0)
    assert ingest_file(store, str(flat), run="beta").status == "stored"
    with_p = tmp_path / "with_p.jsonl"  # the demo's steps with full target distributions (bytes of its own)
    with_p.write_text("".join(open(resources.DEMO_LOG).readlines()[:300]))
    assert ingest_file(store, str(with_p), run="pit").status == "stored"

    # a watched step log, read piece by piece while it grows; its requests span the pieces
    whole = tmp_path / "whole.jsonl"
    random_steplog(rng, whole, n_requests=20, templates=["w"], start=T0 + timedelta(hours=1), prefix="w")
    lines = whole.read_text().splitlines(keepends=True)
    followed = tmp_path / "followed.jsonl"
    followed.write_text("")
    watcher = Watcher(store, WatchConfig([SourceConfig("steplog", str(followed), run="watched")],
                                                     interval_s=0.1), log=lambda _: None)
    for cut in (len(lines) // 3, 2 * len(lines) // 3, len(lines)):
        with followed.open("a") as out:
            out.write("".join(lines[len(followed.read_text().splitlines()):cut]))
        while watcher.poll_once():
            pass
    assert store.query("SELECT count(*) FROM steps JOIN runs r ON r.name = 'watched' JOIN segments sg "
                       "ON sg.run_id = r.run_id AND sg.segment_id = steps.segment_id")[0][0] == len(lines)
    assert store.query("SELECT count(*) FROM ingests JOIN runs USING (run_id) WHERE name = 'watched'")[0][0] >= 3
    spanning = store.query("SELECT count(*) FROM (SELECT segment_id, request_id FROM rollup_requests "
                           "GROUP BY ALL HAVING count(*) > 1)")[0][0]
    assert spanning > 10, "requests must span hours and ingests for the test to mean anything"
    wrong = store.query("SELECT count(*) FROM (SELECT sole, count(*) OVER (PARTITION BY sg.run_id, rq.request_id) AS n "
                        "FROM rollup_requests rq JOIN segments sg USING (segment_id)) WHERE sole <> (n = 1)")
    assert wrong == [(0,)], "a request's rows are sole exactly when it has one rollup row in its run"
    wrong = store.query("SELECT count(*) FROM rollup_request_positions rp JOIN rollup_requests rq "
                        "USING (ingest_id, segment_id, hour, request_id) WHERE rp.sole <> rq.sole")
    assert wrong == [(0,)], "a request's per-position rows are sole exactly where its request row is"
    compare_everything(store)


def test_the_migration_rebuilds_the_rollups_exactly_from_stored_rows(store, tmp_path):
    rng = np.random.default_rng(11)
    log = tmp_path / "log.jsonl"
    random_steplog(rng, log, n_requests=25, templates=["x", "y"], start=T0, prefix="m")
    ingest_file(store, str(log), run="m")
    flat = tmp_path / "flat.parquet"
    random_flat(rng, flat, n_requests=10, start=T0)
    ingest_file(store, str(flat), run="f")
    before, summaries = rollup_rows(store), summary.summarize(store, by="day")
    old = str(tmp_path / "old.duckdb")  # the same rows in a file stored before the rollups existed
    con = database.connect(old)
    schema.migrate(con, old, upto=next(i for i, m in enumerate(schema.MIGRATIONS)
                                          if "CREATE TABLE rollup_requests" in m))
    con.execute("ATTACH ? AS cur (READ_ONLY)", [store.path])
    con.execute("INSERT INTO runs SELECT * FROM cur.runs; INSERT INTO segments SELECT * FROM cur.segments; "
                "INSERT INTO ingests SELECT * FROM cur.ingests; INSERT INTO positions SELECT * FROM cur.positions; "
                "INSERT INTO steps BY NAME SELECT * FROM cur.steps LEFT JOIN cur.step_details USING (step_id)")
    con.close()
    with Store(old) as s:  # every migration from the rollups' on
        assert rollup_rows(s) == before
        assert before[0] and before[1] and before[2]
        assert_same(summary.summarize(s, by="day"), summaries)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_rejected_file_leaves_no_rollup_rows(store, tmp_path, fmt):
    rng = np.random.default_rng(3)
    path = tmp_path / f"bad.{fmt}"
    if fmt == "jsonl":
        random_steplog(rng, path, n_requests=5, templates=["t"], start=T0, prefix="b")
        path.write_text(path.read_text() + '{"request_id": "b0", "draft_tokens": [1], "accepted": 3}\n')
    else:
        random_flat(rng, path, n_requests=5, start=T0)
        df = pd.read_parquet(path)
        df.loc[3, "position"] = -4
        df.to_parquet(path)
    assert ingest_file(store, str(path)).status == "rejected"
    assert rollup_rows(store) == ([], [], [])
