"""The step-log reader parses lines in batches (steplog.parse_steps: top-k logprobs checked and turned into
p_token, q_token and beta's bounds in numpy passes). The same random step logs, ingested through it and through
parse_step one line at a time, must store the same thing, column by column (floats to 1e-12), and reject the same
lines with the same messages."""
import math

import numpy as np
import orjson
import pytest
from random_steps import step_envelope
from stored_rows import same, stored

from specmon.core.faults import RowFault
from specmon.ingest import steplog
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

VOCAB = 12


def _dist(rng: np.random.Generator) -> np.ndarray:
    return rng.dirichlet(np.ones(VOCAB) * rng.choice([0.3, 1.0]))


def _topk(row: np.ndarray, k: int, rng: np.random.Generator, shared_with: dict | None) -> dict:
    """Top-k logprobs of row; with shared_with, reuse some of its tokens (as real target and draft top-k do)."""
    if shared_with is not None and rng.random() < 0.5:
        tokens = list(shared_with)[: max(1, k // 2)] + [str(t) for t in rng.choice(VOCAB, k, replace=False)]
        tokens = list(dict.fromkeys(tokens))[:k]
    else:
        tokens = [str(t) for t in np.argsort(-row)[:k]] if rng.random() < 0.5 else \
            [str(t) for t in rng.choice(VOCAB, k, replace=False)]
    return {t: math.log(row[int(t)]) for t in tokens}


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(len(options)))]


def _step(rng: np.random.Generator, i: int) -> dict:
    g = int(rng.integers(0, 6))
    accepted = int(rng.integers(0, g + 1))
    draft = rng.integers(0, VOCAB, g).tolist()
    obj: dict = {"request_id": f"r{i % 7}", "draft_tokens": draft, "accepted": accepted}
    maybe = lambda: rng.random() < 0.5  # noqa: E731
    step_envelope(rng, obj, g, ["2026-03-01T10:00:00Z", "2026-03-01T10:00:00.25+02:00", "2026-03-01 09:00:00",
                                1.7e9 + i * 0.37, 1_700_000_000 + i], ["a", "b"])
    p_rows = [_dist(rng) for _ in range(g + 1)]
    q_rows = [_dist(rng) for _ in range(g)]
    kind = _pick(rng, ["dense", "dense_p_topk_q", "topk", "topk_p_only", "topk_q_only", "beta", "none"])
    if kind in ("dense", "dense_p_topk_q"):
        obj["target_probs"] = [r.tolist() for r in p_rows[: g + int(maybe())]]
    if kind == "dense":
        obj["draft_probs"] = [r.tolist() for r in q_rows]
    if kind in ("topk", "topk_p_only"):
        obj["target_logprobs"] = [_topk(r, int(rng.integers(1, 6)), rng, None) for r in p_rows[: g + int(maybe())]]
    if kind in ("topk", "topk_q_only", "dense_p_topk_q"):
        shared = obj.get("target_logprobs") or [None] * g
        obj["draft_logprobs"] = [_topk(r, int(rng.integers(1, 6)), rng, s)
                                 for r, s in zip(q_rows, shared, strict=False)]
    if kind == "beta" or (kind == "topk" and rng.random() < 0.2):
        obj["beta"] = rng.uniform(0, 1, g).tolist()
    if maybe():
        corr = int(rng.integers(0, VOCAB))
        obj["emitted_tokens"] = draft[:accepted] + ([corr] if maybe() else [])
    if maybe():
        obj["engine"] = {"name": "x", "n": [1, 2.5, None]}
    for field in ("template", "ts", "temperature"):
        if field in obj and rng.random() < 0.05:
            obj[field] = None
    return obj


# Lines the reader must reject, each with a fault of its own (first fault by parse_step's order).
BAD_LINES = [
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": 0.5}], '
    b'"draft_logprobs": [{"1": -0.1}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": -0.01, "2": -0.02}], '
    b'"draft_logprobs": [{"1": "-0.1", "3": null}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": -0.01, "2": -0.5}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "target_logprobs": [{"1": -0.1}], '
    b'"draft_logprobs": [[1]]}',
    b'{"request_id": "x", "draft_tokens": [1, 2], "accepted": 3, "target_logprobs": [{"1": 1.5}]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 1, "draft_logprobs": [{"1": -0.1}], '
    b'"emitted_tokens": [2]}',
    b'{"request_id": "x", "draft_tokens": [1], "accepted": 0, "draft_logprobs": [{"1": true}]}',
    b'not json',
    b'[1, 2]',
]


def _file(tmp_path, seed: int, bad: bool) -> str:
    rng = np.random.default_rng(seed)
    lines = [orjson.dumps(_step(rng, i)) for i in range(600)]
    if bad:
        for n, line in enumerate(BAD_LINES):
            lines.insert(37 * n + 5, line)
        lines.insert(100, b"")  # a blank line still counts for the line numbers
    path = tmp_path / f"log-{seed}-{bad}.jsonl"
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    return str(path)


def _one_by_one(objs, sum_tol=steplog.DEFAULT_SUM_TOLERANCE):
    out = []
    for obj in objs:
        try:
            out.append(steplog.parse_step(obj, sum_tol))
        except RowFault as fault:
            out.append(fault)
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("bad", [False, True])
def test_batch_and_line_by_line_parsing_store_the_same(tmp_path, monkeypatch, seed, bad):
    path = _file(tmp_path, seed, bad)
    results = {}
    for how in ("batch", "one_by_one"):
        if how == "one_by_one":
            monkeypatch.setattr(steplog, "parse_steps", _one_by_one)
        db = str(tmp_path / f"{how}.duckdb")
        with Store(db) as s:
            r = ingest_file(s, path, skip_bad=True, report_path=str(tmp_path / f"{how}.rejected.jsonl"))
        assert r.status == "stored"
        report = (tmp_path / f"{how}.rejected.jsonl").read_bytes() if r.rejected else b""
        results[how] = (r.rows_read, r.steps, r.positions, r.rejected, [f.as_dict() for f in r.faults], report,
                        stored(db))
    batch, single = results["batch"], results["one_by_one"]
    assert batch[:6] == single[:6]
    assert batch[1] > 500 and batch[2] > 1000
    if bad:
        assert batch[3] == len(BAD_LINES) and len({f["reason"] for f in batch[4]}) == len(BAD_LINES)
    for table, rows_b, rows_s in zip(("steps", "positions"), batch[6], single[6], strict=True):
        assert len(rows_b) == len(rows_s), table
        for rb, rs in zip(rows_b, rows_s, strict=True):
            assert same(rb, rs), (table, rb, rs)
    positions = batch[6][1]
    assert any(p[6] is not None and p[6] != p[7] for p in positions)  # top-k bounds (lo < hi) were computed
    assert any(p[8] is None for p in positions) and any(p[8] is not None for p in positions)


def test_a_mass_at_the_tolerance_is_decided_by_parse_steps_exactly_as_by_parse_step():
    tol = steplog.DEFAULT_SUM_TOLERANCE
    objs = []
    for extra in (-1e-12, 0.0, 1e-12, 1e-6):
        half = math.log((1.0 + tol + extra) / 2)
        objs.append({"request_id": "x", "draft_tokens": [1], "accepted": 0,
                     "target_logprobs": [{"1": half, "2": half}], "draft_logprobs": [{"1": -0.5}]})
    batch, single = steplog.parse_steps(objs), _one_by_one(objs)
    assert [type(x) for x in batch] == [type(x) for x in single]
    assert [str(x) for x in batch if isinstance(x, RowFault)] == [str(x) for x in single if isinstance(x, RowFault)]
    assert isinstance(single[-1], RowFault) and isinstance(single[0], steplog.Step)
