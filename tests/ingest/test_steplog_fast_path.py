"""The step log's fast path (specmon.ingest.formats.steplog_sql: the whole file read, screened and staged by DuckDB)
must store exactly what the Python path (orjson and steplog.parse_steps, line by line) stores, column by column (floats
to 1e-12), and must hand every file it cannot vouch for to the Python path, whose faults name file, line and field.
"""
import gzip
import math
import re

import numpy as np
import orjson
import pytest
from random_steps import step_envelope
from stored_rows import same, stored

from specmon.ingest.formats import steplog_sql
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

VOCAB = 40


def _topk(rng: np.random.Generator, k: int, shared: dict | None = None) -> dict:
    """k logprobs over random tokens, summing below 1; with shared, some of its tokens reused."""
    tokens = [str(t) for t in rng.choice(VOCAB, k, replace=False)]
    if shared is not None and rng.random() < 0.7:
        tokens = list(dict.fromkeys(list(shared)[: int(rng.integers(0, len(shared) + 1))] + tokens))[:k]
    probs = rng.dirichlet(np.ones(len(tokens) + 1))[:-1] * rng.uniform(0.5, 1.0)
    return {t: math.log(p) if p > 0 else -700.0 for t, p in zip(tokens, probs, strict=True)}


def _step(rng: np.random.Generator, i: int) -> dict:
    """A valid step using only what the fast path covers: top-k logprobs, the beta field, every optional field."""
    g = int(rng.integers(0, 6))
    accepted = int(rng.integers(0, g + 1))
    draft = rng.integers(0, VOCAB, g).tolist()
    obj: dict = {"request_id": f"r{i % 7}", "draft_tokens": draft, "accepted": accepted}
    step_envelope(rng, obj, g, [
        "2026-03-01T10:00:00Z", "2026-03-01T10:00:00.25+02:00", "2026-03-01 09:00:00", "2026-03-01T10:00:00.123456",
        1.7e9 + i * 0.37, 1_700_000_000 + i, 1.7e9 + 0.0000005, 0.5e-6, 0,
    ], ["a", "b", "", "é\\u00e9"])
    maybe = lambda: rng.random() < 0.5  # noqa: E731
    kind = ["topk", "topk_p_only", "topk_q_only", "beta", "topk_and_beta", "none"][int(rng.integers(6))]
    if kind in ("topk", "topk_p_only", "topk_and_beta"):
        obj["target_logprobs"] = [_topk(rng, int(rng.integers(0, 8))) for _ in range(g + int(maybe()))]
    if kind in ("topk", "topk_q_only", "topk_and_beta"):
        shared = obj.get("target_logprobs") or [None] * g
        obj["draft_logprobs"] = [_topk(rng, int(rng.integers(1, 8)), s) for s in shared[:g]]
    if kind in ("beta", "topk_and_beta"):
        obj["beta"] = rng.uniform(0, 1, g).tolist() if maybe() else [1] * g
    if maybe():
        obj["emitted_tokens"] = draft[:accepted] + ([int(rng.integers(0, VOCAB))] if maybe() else [])
    for field in ("template", "ts", "temperature", "beta"):
        if field in obj and rng.random() < 0.05:
            obj[field] = None
    return obj


def _write(path, lines: list[bytes], *, crlf: bool = False, bom: bool = False, gz: bool = False) -> str:
    data = (b"\r\n" if crlf else b"\n").join(lines) + b"\n"
    data = (b"\xef\xbb\xbf" if bom else b"") + data
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


def _recording(staged: list):
    """The fast path's stage(), noting in `staged` what each call returned (None: it handed the file over)."""
    fast_stage = steplog_sql.stage

    def recording(*args, **kwargs):
        staged.append(fast_stage(*args, **kwargs))
        return staged[-1]

    return recording


def _ingest_both(tmp_path, monkeypatch, path: str, **options) -> tuple[dict, list]:
    """The file ingested by the fast path where it vouches for it and by the Python path alone; for each, the
    result, the --skip-bad report and the stored rows. Also returns what the fast path's stage() returned."""
    staged: list = []
    results = {}
    for how, stage in (("fast", _recording(staged)), ("python", lambda *a, **k: None)):
        monkeypatch.setattr(steplog_sql, "stage", stage)
        db = str(tmp_path / f"{how}.duckdb")
        report = tmp_path / f"{how}.rejected.jsonl"
        with Store(db) as s:
            r = ingest_file(s, path, name="log.jsonl", report_path=str(report), **options)
        notes = [re.sub(r"ingest time [0-9-]+ [0-9:]+", "ingest time", n) for n in r.notes]
        results[how] = (r.status, r.rows_read, r.steps, r.positions, r.rejected, notes,
                        [f.as_dict() for f in r.faults], report.read_bytes() if report.exists() else b"",
                        stored(db))
    return results, staged


def _assert_same(results: dict) -> None:
    fast, python = results["fast"], results["python"]
    assert fast[:8] == python[:8]
    for table, rows_f, rows_p in zip(("steps", "positions"), fast[8], python[8], strict=True):
        assert len(rows_f) == len(rows_p), table
        for rf, rp in zip(rows_f, rows_p, strict=True):
            assert same(rf, rp), (table, rf, rp)


@pytest.mark.parametrize("seed", range(4))
def test_the_fast_path_stores_what_the_python_path_stores(tmp_path, monkeypatch, seed):
    rng = np.random.default_rng(seed)
    lines = [orjson.dumps(_step(rng, i)) for i in range(500)]
    if seed % 2:
        lines = [line.replace(b",", b", ").replace(b'":', b'": ') for line in lines]  # json.dumps' spacing
    lines.insert(50, b"")
    lines.insert(120, b"   ")
    path = _write(tmp_path / "log.jsonl", lines, crlf=seed in (1, 2), bom=seed in (2, 3), gz=seed == 3)
    results, staged = _ingest_both(tmp_path, monkeypatch, path, template="default")
    assert staged[0] is not None  # the fast path took the file
    _assert_same(results)
    assert results["fast"][0] == "stored" and results["fast"][2] == 500
    positions = results["fast"][8][1]
    assert any(p[6] is not None and p[6] != p[7] for p in positions)  # top-k bounds (lo < hi)
    assert any(p[8] is None for p in positions) and any(p[8] is not None for p in positions)


def test_the_fast_path_handles_the_benchmark_shapes(tmp_path, monkeypatch):
    """Many top-20 positions with the same tokens everywhere, as `simulate` writes (ISO times, emitted tokens)."""
    rng = np.random.default_rng(7)
    tokens = [str(t) for t in rng.choice(32000, 20, replace=False)]
    p = {t: math.log(v) for t, v in zip(tokens, rng.dirichlet(np.ones(21))[:20], strict=True)}
    q = {t: math.log(v) for t, v in zip(tokens, rng.dirichlet(np.ones(21))[:20], strict=True)}
    lines = []
    for i in range(3000):
        draft = [int(t) for t in rng.choice(tokens, 4)]
        acc = int(rng.integers(0, 5))
        lines.append(orjson.dumps({
            "request_id": f"sim-{i // 50}", "ts": f"2026-01-01T00:{i // 600:02d}:{i % 60:02d}.{i % 7}Z", "k": 4,
            "draft_tokens": draft, "accepted": acc, "emitted_tokens": draft[:acc] + [1],
            "target_logprobs": [p] * 5, "draft_logprobs": [q] * 4}))
    results, staged = _ingest_both(tmp_path, monkeypatch, _write(tmp_path / "sim.jsonl", lines))
    assert staged[0] == (3000, 12000, 0)
    _assert_same(results)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_the_fast_path_keeps_the_file_order_across_read_buffers(tmp_path, monkeypatch):
    """A file of several of DuckDB's JSON read buffers (16 MB), which the fast path's query reads and checks on
    every thread: steps are numbered by where the query stored them, so the stored steps must still follow the
    file's lines, each with its own positions (lines of many lengths, so buffer ends fall mid-line)."""
    rng = np.random.default_rng(11)
    lines = []
    for i in range(170_000):
        g = i % 5
        obj: dict = {"request_id": f"r{i}", "draft_tokens": [(i + j) % VOCAB for j in range(g)],
                     "accepted": i % (g + 1), "ts": 1.7e9 + i, "template": "x" * int(rng.integers(0, 200))}
        if i % 3 == 0:
            obj["target_logprobs"] = [_topk(rng, 3) for _ in range(g)]
        lines.append(orjson.dumps(obj))
    path = _write(tmp_path / "big.jsonl", lines)
    assert (tmp_path / "big.jsonl").stat().st_size > 2 * 16 * 2**20
    staged: list = []
    monkeypatch.setattr(steplog_sql, "stage", _recording(staged))
    db = str(tmp_path / "big.duckdb")
    with Store(db) as s:
        assert ingest_file(s, path).status == "stored"
        steps = s.query("SELECT request_id, g FROM steps ORDER BY step_id")
        wrong = s.query("SELECT count(*) FROM positions p JOIN steps st USING (step_id) "
                        "WHERE p.draft_token <> (CAST(st.request_id[2:] AS BIGINT) + p.position - 1) % ?",
                        [VOCAB])[0][0]
    assert staged[0] is not None  # the fast path took the file
    assert steps == [(f"r{i}", i % 5) for i in range(len(lines))]
    assert wrong == 0


# Lines the fast path must not vouch for: each differs from a good line by one thing that the Python path
# refuses or reads in its own way (the file then goes the Python path, which names the fault or stores it).
GOOD = {"request_id": "x", "draft_tokens": [1, 2], "accepted": 1, "target_logprobs": [{"1": -0.1}, {"2": -0.2}],
        "draft_logprobs": [{"1": -0.3, "5": -2.0}, {"2": -0.4}], "ts": 1.7e9}
HANDED_OVER = [
    b'{"request_id": "x", "draft_tokens": [1, 2], "accepted": 1,}',  # trailing comma (DuckDB reads it)
    b'{"request_id": "x", "draft_tokens": [1, 2,], "accepted": 1}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": -0.1,}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 1.0}',  # an integer written as a float
    b'{"request_id": "x", "draft_tokens": [1.0], "accepted": 0}',
    b'{"request_id": "x", "draft_tokens": ["1"], "accepted": 0}',  # a string that DuckDB would cast
    b'{"request_id": 5, "draft_tokens": [1], "accepted": 0}',
    b'{"request_id": "", "draft_tokens": [1], "accepted": 0}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": "0"}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": true}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 2}',
    b'{"request_id": "x", "draft_tokens": [-1], "accepted": 0}',
    b'{"request_id": "x", "draft_tokens": [2147483648], "accepted": 0}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": "-0.1"}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": false}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": null}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": NaN}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": 1e400}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": 0.5}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": -0.1, "1": -0.2}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": -0.01, "2": -0.5}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [[1]]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [null]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": []}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "draft_logprobs": [{"1": -0.1}, {"1": -0.1}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "accepted": 0}',  # a repeated field
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "engine": "v"}',  # an unknown field (extra)
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_probs": [[0.5, 0.5]]}',  # dense
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "ts": -5}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "ts": 1.7e12}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "ts": "yesterday"}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "ts": true}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "template": 3}',
    b'{"request_id": "x", "draft_tokens": [1, 2], "accepted": 0, "k": 1}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "k": 1.0}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "temperature": -1}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "temperature": "1"}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "draft_ms": [1, "2"]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "draft_ms": true}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "beta": [1.5]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "beta": [0.5, 0.5]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "beta": ["0.5"]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 1, "emitted_tokens": [2]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "emitted_tokens": [2, 3]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "emitted_tokens": [true]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "emitted_tokens": {"1": 2}}',  # no list: NULL
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "emitted_tokens": null}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": "x"}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "draft_logprobs": 5}',
    b'{"request_id": "x", "draft_tokens": 1, "accepted": 0}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0} {"request_id": "y"}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "template": "\\ud800"}',
    b'[{"request_id": "x", "draft_tokens": [1], "accepted": 0}]',
    b'null',
    b'"text"',
    b'not json',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "template": "\xff"}',
]


@pytest.mark.parametrize("bad", HANDED_OVER)
def test_a_line_the_fast_path_cannot_vouch_for_sends_the_file_to_the_python_path(tmp_path, monkeypatch, bad):
    # Both runs then take the Python path, so what is compared is that the fast path's attempt left nothing behind:
    # with --skip-bad the good lines are stored even where the odd line is a fault, so a leftover would show
    lines = [orjson.dumps(GOOD)] * 3 + [b""] + [bad] + [orjson.dumps(GOOD)] * 2
    path = _write(tmp_path / "bad.jsonl", lines, crlf=True, bom=True)
    results, staged = _ingest_both(tmp_path, monkeypatch, path, skip_bad=True)
    assert staged == [None]
    _assert_same(results)


def test_faults_name_the_line_in_gzip_with_bom_crlf_and_blank_lines(tmp_path, monkeypatch):
    lines = [b"", orjson.dumps(GOOD), b"  ", b"", orjson.dumps({**GOOD, "accepted": 7}), orjson.dumps(GOOD)]
    path = _write(tmp_path / "bad.jsonl.gz", lines, crlf=True, bom=True, gz=True)
    results, staged = _ingest_both(tmp_path, monkeypatch, path)
    assert staged == [None]
    _assert_same(results)
    status, faults = results["fast"][0], results["fast"][6]
    assert status == "rejected" and [(f["line"], f["field"]) for f in faults] == [(5, "accepted")]
    assert faults[0]["file"] == "log.jsonl"


def test_a_corrupt_gzip_stream_is_refused_as_before(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    data = gzip.compress(b"\n".join(orjson.dumps(_step(rng, i)) for i in range(3000)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    results, staged = _ingest_both(tmp_path, monkeypatch, str(path), fmt="steplog-jsonl")
    assert staged == [None]
    _assert_same(results)
    assert results["fast"][0] == "rejected"


def test_re_ingesting_a_fast_file_changes_nothing(tmp_path):
    path = _write(tmp_path / "log.jsonl", [orjson.dumps(GOOD)] * 5)
    with Store(str(tmp_path / "db.duckdb")) as s:
        first = ingest_file(s, path)
        again = ingest_file(s, path)
        assert (first.status, first.steps, first.positions) == ("stored", 5, 10)
        assert again.status == "already ingested"
        assert s.query("SELECT count(*) FROM positions")[0][0] == 10


@pytest.mark.parametrize("seed", range(40))
def test_a_mutated_line_is_stored_or_refused_as_the_python_path_does(tmp_path, monkeypatch, seed):
    """One character of one line deleted, replaced or inserted at random: whatever the fast path does, the
    result (stored rows or faults) is the Python path's."""
    rng = np.random.default_rng(100 + seed)
    lines = [orjson.dumps(_step(rng, i)) for i in range(8)]
    n = int(rng.integers(len(lines)))
    line = bytearray(lines[n])
    at = int(rng.integers(len(line)))
    char = bytes([b'0123456789-.eE,:[]{}" tfnul'[int(rng.integers(27))]])
    kind = int(rng.integers(3))
    line[at:at + (kind < 2)] = b"" if kind == 0 else char
    lines[n] = bytes(line)
    results, _ = _ingest_both(tmp_path, monkeypatch, _write(tmp_path / "m.jsonl", lines), skip_bad=True)
    _assert_same(results)
