"""Ingest of the step log: every fault names file, line and field, and leaves the database as it was."""
import glob
import gzip
import io
import json
import math

import duckdb
import numpy as np
import orjson
import pytest
from paper import PAPER_P, PAPER_Q

from specmon.analysis.summary import summarize
from specmon.core import sampler
from specmon.core.faults import SpecmonError
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

GOOD = {"request_id": "r-17", "ts": "2026-11-29T10:00:03Z", "template": "v7", "draft_tokens": [0, 4], "accepted": 1,
        "target_probs": [[0.38, 0.22, 0.16, 0.12, 0.08, 0.04]] * 3,
        "draft_probs": [[0.30, 0.20, 0.20, 0.10, 0.14, 0.06]] * 2, "target_ms": 31.5, "draft_ms": 6.2}


def counts(store):
    return store.query("SELECT (SELECT count(*) FROM ingests), (SELECT count(*) FROM runs), "
                       "(SELECT count(*) FROM steps), (SELECT count(*) FROM positions)")[0]


def write_jsonl(path, records):
    path.write_bytes(b"".join(r if isinstance(r, bytes) else orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def test_the_contract_example_is_stored_with_exact_beta(store, tmp_path):
    path = write_jsonl(tmp_path / "ex.jsonl", [GOOD])
    res = ingest_file(store, path)
    assert (res.status, res.steps, res.positions) == ("stored", 1, 2)
    rows = store.query("SELECT position, checked, accepted, beta_lo, beta_hi, p_token, q_token FROM positions "
                       "ORDER BY 1")
    assert rows[0] == (1, True, True, pytest.approx(0.88), pytest.approx(0.88), 0.38, 0.30)
    assert rows[1][:3] == (2, True, False) and rows[1][5:] == (0.08, 0.14)
    step = store.query("SELECT g, accepted, checked, beta_lo_sum, target_ms, draft_ms, ts::VARCHAR "
                       "FROM steps LEFT JOIN step_details USING (step_id)")[0]
    assert step == (2, 1, 2, pytest.approx(1.76), 31.5, 6.2, "2026-11-29 10:00:03")


def bad(**changes):
    rec = {**GOOD, **changes}
    return {k: v for k, v in rec.items() if v is not _DROP}


_DROP = object()
FAULTS = [
    ("bad JSON", b'{"request_id": "r", "draft_tokens": [1], "accepted": 0\n', "", "invalid JSON"),
    ("not an object", b"[1, 2]\n", "", "expected a JSON object"),
    ("missing field", bad(accepted=_DROP), "accepted", "required field is missing"),
    ("accepted too big", bad(accepted=3), "accepted", "3 is outside 0..g (g = 2"),
    ("accepted negative", bad(accepted=-1), "accepted", "outside 0..g"),
    ("accepted wrong type", bad(accepted="1"), "accepted", "expected an integer, got str"),
    ("request id type", bad(request_id=17), "request_id", "expected a non-empty string"),
    ("draft token type", bad(draft_tokens=[0, "4"]), "draft_tokens", "item 1 is '4'"),
    ("bad ts", bad(ts="yesterday"), "ts", "'yesterday' is not an ISO-8601 timestamp"),
    ("ts in ms", bad(ts=1764410403000), "ts", "milliseconds"),
    ("sum not 1", bad(target_probs=[[0.38, 0.22, 0.16, 0.12, 0.08, 0.04]] * 2 + [[0.5, 0.1, 0.1, 0.1, 0.1, 0.0]]),
     "target_probs", "position 3 sums to 0.9, not 1"),
    ("negative prob", bad(draft_probs=[[0.30, 0.20, 0.20, 0.10, 0.24, -0.04], GOOD["draft_probs"][1]]),
     "draft_probs", "position 1 has a negative probability -0.04 at token 5"),
    ("NaN prob", b'{"request_id":"r","draft_tokens":[0],"accepted":0,"draft_probs":[[NaN,1.0]]}\n', "", "invalid JSON"),
    ("length mismatch", bad(draft_probs=GOOD["draft_probs"] * 2), "draft_probs",
     "has 4 positions; draft_tokens implies 2"),
    ("ragged rows", bad(draft_probs=[[0.5, 0.5], [1.0]]), "draft_probs", "one common length"),
    ("beta length", bad(target_probs=_DROP, draft_probs=_DROP, beta=[0.5]), "beta", "expected a list of 2 numbers"),
    ("beta range", bad(target_probs=_DROP, draft_probs=_DROP, beta=[0.5, 1.5]), "beta", "in [0, 1]"),
    ("logprob positive", bad(target_probs=_DROP, draft_probs=_DROP, target_logprobs=[{"0": 0.5}] * 3,
                             draft_logprobs=[{"0": -1.0}] * 2), "target_logprobs", "logprob 0.5"),
    ("emitted mismatch", bad(emitted_tokens=[3, 1]), "emitted_tokens", "must begin with the accepted draft tokens"),
    ("k too small", bad(k=1), "k", "k = 1 but 2 tokens were drafted"),
]


@pytest.mark.parametrize("label,line,field,reason", FAULTS, ids=[f[0] for f in FAULTS])
def test_each_fault_names_file_line_field_and_stores_nothing(store, tmp_path, label, line, field, reason):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, {**GOOD, "request_id": "r-18"}, line])
    before = counts(store)
    res = ingest_file(store, path)
    assert res.status == "rejected"
    fault = res.faults[0]
    assert (fault.file, fault.line, fault.field) == (path, 3, field)
    assert reason in fault.reason
    assert str(fault).startswith(f"{path}:3: ")
    assert counts(store) == before == (0, 0, 0, 0)


def test_nan_as_a_number_is_caught_by_validation(store, tmp_path):
    from specmon.core.faults import RowFault
    from specmon.ingest.steplog import parse_step
    with pytest.raises(RowFault, match="NaN"):
        parse_step({**GOOD, "draft_probs": [[math.nan, 1.0], [0.5, 0.5]]})


def test_reingesting_the_same_content_is_a_no_op(store, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [GOOD])
    assert ingest_file(store, path).status == "stored"
    before = counts(store)
    copy = tmp_path / "renamed.jsonl"
    copy.write_bytes((tmp_path / "a.jsonl").read_bytes())
    for p in (path, str(copy)):
        res = ingest_file(store, p)
        assert res.status == "already ingested"
        assert counts(store) == before


def test_skip_bad_stores_good_rows_and_reports_the_rest(store, tmp_path):
    report = tmp_path / "rejected.jsonl"
    lines = [GOOD, bad(accepted=9), b"{oops\n", {**GOOD, "request_id": "r-2"}]
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    res = ingest_file(store, path, skip_bad=True, report_path=str(report))
    assert (res.status, res.steps, res.rejected) == ("stored", 2, 2)
    rejected = [json.loads(x) for x in report.read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejected] == [(2, "accepted"), (3, "")]
    assert '"accepted":9' in rejected[0]["raw"].replace(" ", "")
    assert store.query("SELECT rejected FROM ingests")[0][0] == 2


def test_missing_ts_uses_ingest_time_and_says_so(store, tmp_path):
    path = write_jsonl(tmp_path / "nots.jsonl", [bad(ts=_DROP), bad(ts=1795946403.5)])
    res = ingest_file(store, path)
    assert any("1 steps had no ts" in n for n in res.notes)
    assert store.query("SELECT count(*) FILTER (WHERE ts_inferred) FROM steps")[0][0] == 1
    assert store.query("SELECT ts::VARCHAR FROM steps WHERE NOT ts_inferred")[0][0] == "2026-11-29 10:00:03.5"


def test_unknown_fields_are_kept(store, tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{**GOOD, "gpu": "h100", "batch": 8}])
    ingest_file(store, path)
    assert json.loads(store.query("SELECT extra FROM step_details")[0][0]) == {"batch": 8, "gpu": "h100"}


def test_topk_logprobs_give_an_interval_that_contains_beta(store, tmp_path):
    path = tmp_path / "topk.jsonl"
    with open(path, "wb") as out:
        sampler.write_step_log(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 3000, np.random.default_rng(1),
                                                           distributions="topk", topk=3), out)
    ingest_file(store, str(path))
    seg = summarize(store)[0]
    assert seg["beta"] is None  # not exact: no point estimate pretending to be one
    assert seg["beta_lo"] < 0.88 < seg["beta_hi"]
    assert seg["agreement"] == "agrees"


def test_precomputed_beta_is_used(store, tmp_path):
    path = tmp_path / "beta.jsonl"
    with open(path, "wb") as out:
        sampler.write_step_log(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 2, 2000, np.random.default_rng(2),
                                                           distributions="beta"), out)
    ingest_file(store, str(path))
    assert summarize(store)[0]["beta"] == pytest.approx(0.88)


def test_a_wrong_beta_is_flagged_as_disagreeing(store, tmp_path):
    # The pipeline bug gap_z catches (docs/math.md, "Losslessness"): beta computed from the wrong pair.
    recs = list(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 5000, np.random.default_rng(3), distributions="none"))
    path = write_jsonl(tmp_path / "wrong.jsonl", [{**r, "beta": [0.80] * 4} for r in recs])
    ingest_file(store, path)
    seg = summarize(store)[0]
    assert seg["agreement"] == "differs" and seg["gap_z"] > 3


def test_a_file_is_one_transaction_even_across_batches(store, tmp_path):
    recs = list(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 40000, np.random.default_rng(4), distributions="none"))
    recs.append({"request_id": "late", "draft_tokens": [1], "accepted": 2})
    path = write_jsonl(tmp_path / "big.jsonl", recs)
    res = ingest_file(store, path)
    assert res.status == "rejected" and res.faults[0].line == 40001
    assert counts(store) == (0, 0, 0, 0)


def test_killed_ingest_leaves_the_database_as_it_was(tmp_path, specmon_cmd):
    import subprocess
    import time
    db = str(tmp_path / "k.duckdb")
    small = write_jsonl(tmp_path / "small.jsonl", [GOOD])
    subprocess.run([*specmon_cmd, "ingest", "--db", db, small], check=True, capture_output=True)
    big = tmp_path / "big.jsonl"
    block = io.BytesIO()
    sampler.write_step_log(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 30_000, np.random.default_rng(5),
                                                       distributions="beta"), block)
    with open(big, "wb") as out:  # 300,000 steps: ten copies of the block, each under request ids of its own
        for copy in range(10):
            out.write(block.getvalue().replace(b'"request_id":"sim-', b'"request_id":"c%d-' % copy))
    proc = subprocess.Popen([*specmon_cmd, "ingest", "--db", db, str(big)], stderr=subprocess.PIPE)
    staged = f"{db}.stage-{proc.pid}-*.duckdb"
    deadline = time.monotonic() + 60
    while not glob.glob(staged) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # well into the file: batches have been written to the load's staging file
    assert proc.poll() is None, "ingest finished before it could be killed; make the file larger"
    proc.kill()
    proc.wait()
    assert glob.glob(staged), "the killed load left its staging file"
    con = duckdb.connect(db)
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM ingests").fetchone()[0] == 1
    con.close()
    with Store(db) as s:  # the next open removes what the killed load staged
        assert not glob.glob(staged)
        assert s.query("SELECT count(*) FROM positions")[0][0] == 2


def test_concurrent_ingests_in_one_process_lose_nothing_and_count_nothing_twice(store, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    paths = []
    for seed in range(3):
        path = tmp_path / f"c{seed}.jsonl"
        with open(path, "wb") as out:
            sampler.write_step_log(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 20000, np.random.default_rng(seed),
                                                               distributions="beta"), out)
        paths.append(str(path))
    with ThreadPoolExecutor(4) as pool:  # the third file twice: one of the two must see the other
        results = list(pool.map(lambda p: ingest_file(store, p), [paths[0], paths[1], paths[2], paths[2]]))
    assert sorted(r.status for r in results) == ["already ingested", "stored", "stored", "stored"]
    assert counts(store) == (3, 3, 60000, 240000)
    assert store.query("SELECT count(DISTINCT step_id) FROM steps")[0][0] == 60000
    assert not glob.glob(f"{store.path}.stage-*")


# Values no column can hold, and sizes no reader may allocate: one bad row among many good ones is a named fault;
# without --skip-bad the file stores nothing, with it the good rows are stored and the bad one reported.
HOSTILE_STEPS = [
    ("token id >= 2^31", {"draft_tokens": [2 ** 31], "accepted": 0}, "draft_tokens", "token ids"),
    ("k >= 2^31", {"k": 2 ** 31}, "k", "1 to 32767"),
    ("a draft of 32768 tokens", {"draft_tokens": [1] * 32768, "accepted": 0}, "draft_tokens", "32767"),
    ("year 1 shifted out of the calendar", {"ts": "0001-01-01T00:00:00+05:00"}, "ts", "years 1 to 9999"),
    ("year 9999 shifted out of the calendar", {"ts": "9999-12-31T23:59:59-05:00"}, "ts", "years 1 to 9999"),
    ("a large negative epoch", {"ts": -62135596801}, "ts", "years 1 to 9999"),
    ("an epoch of 1e20", {"ts": 1e20}, "ts", "not epoch seconds"),
    ("unknown fields nested 300 deep", {"deep": json.loads('{"a":' * 300 + "1" + "}" * 300)}, "deep", "nested"),
]


@pytest.mark.parametrize("label,change,field,reason", HOSTILE_STEPS, ids=[h[0] for h in HOSTILE_STEPS])
def test_hostile_step_values_are_named_faults_and_skip_bad_keeps_the_good_rows(store, tmp_path, label, change, field,
                                                                              reason):
    good = [{"request_id": f"r{i % 7}", "draft_tokens": [1, 2], "accepted": i % 3} for i in range(3000)]
    bad = {"request_id": "bad", "draft_tokens": [1], "accepted": 0, **change}
    raw_bad = json.dumps(bad).encode() + b"\n"  # orjson itself refuses to write 300 levels
    path = write_jsonl(tmp_path / "h.jsonl", good[:1500] + [raw_bad] + good[1500:])
    res = ingest_file(store, path)
    assert res.status == "rejected" and counts(store) == (0, 0, 0, 0)
    assert (res.faults[0].line, res.faults[0].field) == (1501, field) and reason in res.faults[0].reason
    res = ingest_file(store, path, skip_bad=True, report_path=str(tmp_path / "rep.jsonl"))
    assert res.status == "stored" and res.steps == 3000 and res.rejected == 1
    assert json.loads((tmp_path / "rep.jsonl").read_text())["line"] == 1501
    summarize(store)  # every stored value reads back


def test_bom_and_gzip_just_work(store, tmp_path):
    steps = [{"request_id": f"r{i}", "draft_tokens": [1, 2], "accepted": i % 3} for i in range(50)]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + b"".join(orjson.dumps(s) + b"\n" for s in steps))
    packed = tmp_path / "steps.jsonl.gz"
    packed.write_bytes(gzip.compress(b"".join(orjson.dumps({**s, "template": "gz"}) + b"\n" for s in steps)))
    unnamed = tmp_path / "steps-gzip-without-suffix"
    unnamed.write_bytes(gzip.compress(b"".join(orjson.dumps({**s, "template": "gz2"}) + b"\n" for s in steps)))
    csv_bom = tmp_path / "excel.csv"  # Excel's "CSV UTF-8"
    csv_bom.write_bytes(b"\xef\xbb\xbfrequest_id,step,position,draft_token,accepted\r\n"
                        + b"".join(f"c{i},{i},1,5,{'true' if i % 2 else 'false'}\r\n".encode() for i in range(20)))
    csv_gz = tmp_path / "flat.csv.gz"
    csv_gz.write_bytes(gzip.compress(b"request_id,step,position,draft_token,accepted\n"
                                     + b"".join(f"z{i},{i},1,5,true\n".encode() for i in range(10))))
    results = [ingest_file(store, str(p)) for p in (bom, packed, unnamed, csv_bom, csv_gz)]
    assert [(r.status, r.source_format, r.steps) for r in results] == [
        ("stored", "steplog-jsonl", 50), ("stored", "steplog-jsonl", 50), ("stored", "steplog-jsonl", 50),
        ("stored", "flat-csv", 20), ("stored", "flat-csv", 10)]


@pytest.mark.parametrize("content,seen", [
    (b'[{"request_id": "r", "draft_tokens": [1], "accepted": 1}]\n', "a JSON array"),
    (b"1\n2\n3\n", "lines of JSON values (int)"),
    (bytes(range(256)) * 8, "binary data"),
    (b"INFO 11-29 10:00:00 [api_server.py:1090] Starting vLLM API server on http://0.0.0.0:8000\n"
     b"INFO:     127.0.0.1:51234 - \"POST /v1/completions HTTP/1.1\" 200 OK\n", "without speculative-decoding lines"),
    (b"when,what,who\n1,2,3\n", "a CSV file with the columns when, what, who"),
])
def test_a_file_no_format_claims_is_named_for_what_it_looks_like(store, tmp_path, content, seen):
    path = tmp_path / "input.jsonl"
    path.write_bytes(content)
    res = ingest_file(store, str(path))
    reason = res.faults[0].reason
    assert res.status == "rejected" and seen in reason and "specmon reads step logs" in reason
    assert counts(store) == (0, 0, 0, 0)


def test_an_empty_file_is_nothing_to_ingest_and_a_directory_is_named(store, tmp_path):
    for name in ("empty.jsonl", "blank.jsonl", "other-empty.csv"):
        (tmp_path / name).write_bytes(b"\n\n" if name == "blank.jsonl" else b"")
        res = ingest_file(store, str(tmp_path / name))
        assert res.status == "nothing to ingest" and "empty" in res.notes[0]
    assert counts(store) == (0, 0, 0, 0)  # no run, no ingest: a later empty file is not "already ingested"
    with pytest.raises(SpecmonError, match="is a directory"):
        ingest_file(store, str(tmp_path))


def test_one_long_query_reports_its_progress_while_it_runs():
    """store.query_progress polls DuckDB's own estimate from a thread while the block's query runs: the fast step
    log and flat loads are one query each, and would otherwise show nothing until the end."""
    from specmon.store.database import connect, query_progress

    conn, seen = connect(":memory:"), []
    with query_progress(conn, lambda done, total: seen.append((done, total)), total=1000, every_s=0.02):
        conn.execute("SELECT i % 1000 AS g, sum(i * random()) FROM range(40000000) t(i) GROUP BY g").fetchall()
    assert seen, "no progress while a query of half a second or more ran"
    assert all(0 < done <= total == 1000 for done, total in seen)
    assert [done for done, _ in seen] == sorted({done for done, _ in seen})  # only forwards
    assert conn.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0] is False


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_the_steps_after_the_reading_are_named_in_order(store, tmp_path, kind):
    """Once every byte is read, a large file still has its rows written, its rollups added and its transaction
    committed; a progress bar at 100% would hide that, so each step is named, after the reading."""
    if kind == "jsonl":
        path = write_jsonl(tmp_path / "s.jsonl", [{**GOOD, "request_id": f"r{i}"} for i in range(50)])
    else:
        path = str(tmp_path / "s.csv")
        (tmp_path / "s.csv").write_text("request_id,step,position,draft_token,accepted\n" +
                                        "".join(f"r{i},0,1,5,1\nr{i},0,2,6,0\n" for i in range(50)))
    events: list = []
    res = ingest_file(store, path, progress=lambda done, total: events.append((done, total)), stage=events.append)
    assert res.status == "stored"
    stages = [e for e in events if isinstance(e, str)]
    assert stages == ["storing", "rollups", "committing"]
    size = tmp_path.joinpath(path).stat().st_size
    read = [e for e in events[:events.index("rollups")] if not isinstance(e, str)]
    assert read[-1] == (size, size) and not any(isinstance(e, tuple) for e in events[events.index("rollups"):])
    again: list = []
    assert ingest_file(store, path, stage=again.append).status == "already ingested" and again == []
