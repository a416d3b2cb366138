"""Fuzzing the readers (step log, flat form, engine logs and responses) through ingest_file, as a user's file reaches
them: whatever the bytes, the outcome is stored, rejected with named faults, or nothing to ingest; no other
exception; Python's memory stays bounded by the input (no list sized by a number in the file); a rejection leaves
the database exactly as it was. Each example also has a generous deadline, a guard against hangs (not a speed
test). About a minute in all."""
import gzip
import json
import tracemalloc

import pytest
from engine_lines import REAL_LLAMA_SERVER_3, REAL_SGLANG_NEW, REAL_V0, REAL_V1_010, REAL_V1_DEPTH_AFTER_MEAN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specmon.ingest.pipeline import ingest_file

FUZZ = settings(max_examples=40, deadline=10_000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])
MEMORY_BOUND = 16 << 20  # bytes of Python allocations for inputs of a few kilobytes

TABLES = ("ingests", "runs", "segments", "steps", "positions", "engine_windows", "counter_samples")


def snapshot(store):
    return store.query("SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES))[0]


def ingest_fuzzed(store, tmp_path, name: str, content: bytes, skip_bad: bool) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    before = snapshot(store)
    tracemalloc.start()
    try:
        res = ingest_file(store, str(path), skip_bad=skip_bad, report_path=str(tmp_path / "report.jsonl"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.status in ("stored", "rejected", "nothing to ingest", "already ingested")
    assert peak < MEMORY_BOUND, f"{peak} bytes for {len(content)} bytes of input"
    if res.status == "rejected":
        assert res.faults and all(f.file == str(path) and f.reason for f in res.faults)
    if res.status != "stored":
        assert snapshot(store) == before


huge_ints = st.sampled_from([2 ** 31 - 1, 2 ** 31, 2 ** 63, 2 ** 64 + 1, 10 ** 7, 10 ** 9, -1, -(2 ** 63) - 1, 0])
numbers = st.one_of(st.integers(-10, 40), huge_ints, st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1e20, -62135596801, 253402300800, 1795946403.5]))
texts = st.one_of(st.text(max_size=12), st.sampled_from(["2026-02-29T10:00:00", "2026-13-45T00:00:00",
                                                          "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00",
                                                          "nan", "", "\u202e", "\x00"]))
json_values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, texts),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                           max_leaves=12)


@st.composite
def step_objects(draw):
    obj = {"request_id": draw(st.one_of(st.text(max_size=6), numbers)),
           "draft_tokens": draw(st.one_of(st.lists(st.one_of(st.integers(0, 50), huge_ints), max_size=6),
                                          json_values)),
           "accepted": draw(st.one_of(st.integers(-1, 7), numbers))}
    for field in ("ts", "k", "template", "temperature", "beta", "target_probs", "draft_probs", "target_logprobs",
                  "emitted_tokens", "draft_ms"):
        if draw(st.booleans()):
            obj[field] = draw(json_values)
    if draw(st.booleans()):
        obj["unknown"] = draw(json_values)
    if draw(st.booleans()):
        del obj[draw(st.sampled_from(["request_id", "draft_tokens", "accepted"]))]
    return obj


@st.composite
def step_log_files(draw):
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["step", "step", "step", "raw", "deep"]))
        if kind == "step":
            lines.append(json.dumps(draw(step_objects())).encode())
        elif kind == "deep":
            depth = draw(st.sampled_from([60, 300, 1100]))
            lines.append(b'{"request_id": "r", "draft_tokens": [1], "accepted": 0, "x": ' + b"[" * depth
                         + b"]" * depth + b"}")
        else:
            lines.append(draw(st.binary(max_size=40)).replace(b"\n", b" "))
    content = b"\n".join(lines) + b"\n"
    prefix = draw(st.sampled_from([b"", b"\xef\xbb\xbf"]))
    return gzip.compress(prefix + content) if draw(st.booleans()) else prefix + content


@st.composite
def flat_files(draw):
    columns = draw(st.lists(st.sampled_from(["request_id", "step", "position", "draft_token", "accepted", "ts",
                                             "template", "beta", "p_token", "extra"]), min_size=1, max_size=9,
                            unique=True))
    cells = st.one_of(st.integers(-2, 40).map(str), huge_ints.map(str), st.sampled_from(
        ["true", "false", "maybe", "", "1e400", "nan", "2026-11-29T10:00:00Z", "9999-12-31T23:59:59-05:00", "\"",
         "a,b", str(2 ** 70)]))
    rows = draw(st.lists(st.lists(cells, min_size=len(columns), max_size=len(columns) + 1), max_size=8))
    text = "\n".join([",".join(columns)] + [",".join(r) for r in rows]) + "\n"
    return text.encode()


def mutate_line(draw, line: str) -> str:
    """A real engine line with one field's value replaced, a field dropped, or bytes cut out."""
    how = draw(st.sampled_from(["value", "drop", "cut", "same"]))
    parts = line.split(", ")
    i = draw(st.integers(0, len(parts) - 1))
    if how == "value" and ": " in parts[i]:
        key = parts[i].split(": ")[0]
        value = draw(st.one_of(numbers.map(str), texts, st.sampled_from(
            ["9" * 400, ", ".join(["0.5"] * 600), "0 tokens", "-5 tokens", "nan%"])))
        parts[i] = f"{key}: {value}"
    elif how == "drop":
        del parts[i]
    elif how == "cut":
        j = draw(st.integers(0, len(line)))
        return line[:j]
    return ", ".join(parts)


@st.composite
def engine_files(draw):
    kind = draw(st.sampled_from(["log", "log", "json"]))
    if kind == "json":
        spec = {"num_spec_steps": draw(numbers), "num_draft_tokens": draw(numbers),
                "num_accepted_draft_tokens": draw(numbers), "num_spec_tokens": draw(numbers)}
        if draw(st.booleans()):
            spec["per_step_accepted"] = draw(st.lists(st.one_of(st.integers(0, 8), huge_ints), max_size=5))
        if draw(st.booleans()):
            spec["acceptance_histogram"] = draw(st.lists(numbers, max_size=5))
        obj = {"id": "cmpl-1", "created": draw(numbers), "metrics": {"speculative_decoding": spec}}
        return (json.dumps(obj) + "\n").encode()
    real = [REAL_V1_DEPTH_AFTER_MEAN, REAL_V1_010, REAL_V0, REAL_SGLANG_NEW] + REAL_LLAMA_SERVER_3
    lines = [mutate_line(draw, draw(st.sampled_from(real))) for _ in range(draw(st.integers(1, 4)))]
    if draw(st.booleans()):
        lines.insert(0, "[2026-13-45 25:61:61] INFO unrelated line " + draw(st.text(max_size=20)))
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
@FUZZ
@given(content=step_log_files(), skip_bad=st.booleans())
def test_fuzzed_step_logs(store, tmp_path, content, skip_bad):
    ingest_fuzzed(store, tmp_path, "fuzz.jsonl", content, skip_bad)


@FUZZ
@given(content=flat_files(), skip_bad=st.booleans())
def test_fuzzed_flat_csv(store, tmp_path, content, skip_bad):
    ingest_fuzzed(store, tmp_path, "fuzz.csv", content, skip_bad)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
@FUZZ
@given(content=engine_files(), skip_bad=st.booleans())
def test_fuzzed_engine_output(store, tmp_path, content, skip_bad):
    ingest_fuzzed(store, tmp_path, "fuzz.log", content, skip_bad)


@pytest.mark.parametrize("spec", [{"num_spec_tokens": 10 ** 7}, {"per_step_accepted": [10 ** 7]},
                                  {"num_spec_tokens": 10 ** 9, "per_step_accepted": [10 ** 9]}])
def test_a_response_claiming_millions_of_positions_is_refused_before_allocating(store, tmp_path, spec):
    """A 186-byte upload that claims a huge size: a size claimed by the file is checked before a list of that size
    exists."""
    base = {"num_spec_steps": 1, "num_draft_tokens": 4, "num_accepted_draft_tokens": 1, "num_spec_tokens": 4}
    content = json.dumps({"id": "cmpl-1", "metrics": {"speculative_decoding": {**base, **spec}}}).encode() + b"\n"
    assert len(content) < 200
    tracemalloc.start()
    try:
        res = ingest_file(store, str(tmp_path / "r.json") if (tmp_path / "r.json").write_bytes(content) else "")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.status == "rejected" and "speculative_decoding." in res.faults[0].field
    assert peak < 16 << 20
