"""Input that is hostile by accident: a file replaced while it is read, line ends of any kind, pages of blank or
start-up lines before the first recognisable one, a series twice at one time. Nothing is lost or miscounted, and
detection and line splitting stay linear in the file's size."""
import io
import os
import random
import time

import orjson
import pytest
from paths import DATA

from specmon.ingest import formats
from specmon.ingest.formats import engine_log, textio
from specmon.ingest.pipeline import detect_format, ingest_file

ENGINES = DATA / "engines"
STEP = {"request_id": "r-1", "draft_tokens": [5, 9, 2], "accepted": 2}


def stored(store) -> tuple:
    return store.query("SELECT (SELECT count(*) FROM ingests), (SELECT count(*) FROM steps), "
                       "(SELECT count(*) FROM engine_windows)")[0]


# ---- one snapshot --------------------------------------------------------------------------------------------

def flat_csv(rows: int) -> bytes:
    lines = ["request_id,step,position,draft_token,accepted"]
    lines += [f"r,{i},1,{i},true" for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def test_a_file_replaced_while_it_is_read_is_refused_and_each_version_stores_later(store, tmp_path):
    path, old, new = tmp_path / "steps.csv", flat_csv(3), flat_csv(5)
    path.write_bytes(old)
    replacement = tmp_path / "next.csv"
    replacement.write_bytes(new)

    def replace_once(what: str) -> None:  # after the hash, before the flat form is read (inside the transaction)
        if what == "storing" and replacement.exists():
            os.replace(replacement, path)

    res = ingest_file(store, str(path), stage=replace_once)
    assert res.status == "rejected"
    assert "changed while it was read" in res.faults[0].reason and res.faults[0].file == str(path)
    assert stored(store) == (0, 0, 0)
    assert ingest_file(store, str(path)).steps == 5  # the new content, under its own hash
    path.write_bytes(old)
    assert ingest_file(store, str(path)).status == "stored"  # the old one was never taken for stored
    assert stored(store)[:2] == (2, 8)


def test_a_file_appended_to_while_it_is_read_is_refused(store, tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_bytes(orjson.dumps(STEP) + b"\n")

    def append(what: str) -> None:
        if what == "storing":
            with open(path, "ab") as fh:
                fh.write(orjson.dumps({**STEP, "request_id": "r-2"}) + b"\n")

    res = ingest_file(store, str(path), stage=append)
    assert res.status == "rejected" and "changed while it was read" in res.faults[0].reason
    assert stored(store) == (0, 0, 0)
    assert ingest_file(store, str(path)).steps == 2


# ---- line ends -----------------------------------------------------------------------------------------------

def test_lines_end_at_lf_cr_or_crlf_wherever_the_chunks_fall(monkeypatch):
    """textio's splitter against bytes.splitlines (the same three ends), with chunks of 1 to 7 bytes so that a CRLF
    or a cut line falls across every boundary."""
    rng = random.Random(7)
    for _ in range(2000):
        data = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randint(0, 60)))
        bound = rng.randint(1, 8)
        monkeypatch.setattr(textio, "_CHUNK", rng.randint(1, 7))
        expected = [(line[:bound], True) if len(line.rstrip(b"\r\n")) > bound else (line, False)
                    for line in data.splitlines(keepends=True)]
        assert list(textio._split(io.BytesIO(data), bound)) == expected, (data, bound)


def windows_of(path) -> list[tuple]:
    windows, faults = engine_log.read(str(path), path.name)
    assert faults == []
    return [(w.line, w.drafts, w.draft_tokens, w.accepted_tokens, w.running_requests) for w in windows]


@pytest.mark.parametrize("end", [b"\r", b"\r\n"])
def test_a_real_vllm_log_with_cr_line_ends_reads_the_same_windows(tmp_path, end):
    real = (ENGINES / "vllm-v1-current-1.log").read_bytes()
    (tmp_path / "lf.log").write_bytes(real)
    (tmp_path / "cr.log").write_bytes(real.replace(b"\n", end))
    expected = windows_of(tmp_path / "lf.log")
    assert len(expected) >= 4
    assert windows_of(tmp_path / "cr.log") == expected


def test_one_lone_cr_does_not_merge_a_speculative_line_into_the_next(tmp_path):
    real = (ENGINES / "vllm-v1-current-1.log").read_bytes().splitlines(keepends=True)
    spec = next(i for i, line in enumerate(real) if engine_log.V1.encode() in line)
    real[spec] = real[spec].rstrip(b"\n") + b"\r"
    (tmp_path / "one-cr.log").write_bytes(b"".join(real))
    (tmp_path / "lf.log").write_bytes(b"".join(real).replace(b"\r", b"\n"))
    assert windows_of(tmp_path / "one-cr.log") == windows_of(tmp_path / "lf.log")


@pytest.mark.parametrize("end", [b"\r", b"\r\n"])
def test_a_flat_csv_with_cr_line_ends_is_read_and_its_faults_name_their_lines(store, tmp_path, end):
    path = tmp_path / "cr.csv"
    path.write_bytes(flat_csv(4).replace(b"\n", end).replace(b"r,2,1,2,true", b"r,2,1,x,true"))
    res = ingest_file(store, str(path))
    assert [(f.line, f.field) for f in res.faults] == [(4, "draft_token")]
    path.write_bytes(flat_csv(4).replace(b"\n", end))
    assert (ingest_file(store, str(path)).steps, stored(store)[1]) == (4, 4)


# ---- detection wherever the content starts -------------------------------------------------------------------

def test_steps_after_a_mebibyte_of_blank_lines_are_found(store, tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_bytes(b"\n" * (1 << 20) + b"".join(orjson.dumps({**STEP, "request_id": f"r-{i}"}) + b"\n"
                                                 for i in range(3)))
    res = ingest_file(store, str(path))
    assert (res.status, res.steps) == ("stored", 3)
    assert store.query("SELECT min(s.step_id) FROM steps s")[0][0] is not None


def test_one_step_then_two_hundred_thousand_blank_lines(store, tmp_path):
    path = tmp_path / "sparse.jsonl"
    path.write_bytes(orjson.dumps(STEP) + b"\n" + b"\n" * 200_000)
    res = ingest_file(store, str(path))
    assert (res.status, res.steps, res.positions) == ("stored", 1, 3)


def test_a_vllm_log_whose_first_metrics_line_comes_after_megabytes_of_start_up_lines(store, tmp_path):
    """The start-up lines are the real log's own non-metrics lines, repeated past two and a half megabytes."""
    real = (ENGINES / "vllm-v1-current-1.log").read_bytes().splitlines(keepends=True)
    other = [line for line in real if not any(p.encode() in line for p in engine_log.KEY_PHRASES)]
    assert other
    start_up = b"".join(other) * (2_500_000 // len(b"".join(other)) + 1)
    path = tmp_path / "late.log"
    path.write_bytes(start_up + b"".join(real))
    assert detect_format(str(path)) == "engine-log"
    res = ingest_file(store, str(path))
    assert res.status == "stored"
    (tmp_path / "plain.log").write_bytes(b"".join(real))
    assert res.steps == ingest_file(store, str(tmp_path / "plain.log")).steps


@pytest.mark.parametrize("opening", ["comments", "other series"])
def test_a_prometheus_page_whose_first_wanted_sample_comes_after_a_mebibyte(store, tmp_path, opening):
    """A page opens with 1.5 MB of # HELP and # TYPE lines, or of series specmon does not read, before its own."""
    page = (ENGINES / "vllm-prom-1.prom").read_bytes()
    if opening == "comments":
        filler = [b"# HELP app_series_%d A series of the application.\n# TYPE app_series_%d counter\n" % (i, i)
                  for i in range(20_000)]
    else:
        filler = [b'app_requests_total{route="/r%d"} %d\n' % (i, i) for i in range(50_000)]
    opening_bytes = b"".join(filler)
    assert len(opening_bytes) > 3 << 19
    path = tmp_path / "late.prom"
    path.write_bytes(opening_bytes + page)
    assert detect_format(str(path)) == "prometheus"
    res = ingest_file(store, str(path))
    assert res.status == "stored"
    (tmp_path / "plain.prom").write_bytes(page)
    assert detect_format(str(tmp_path / "plain.prom")) == "prometheus"


def test_a_server_log_that_prints_metric_names_after_a_mebibyte_is_not_taken_for_a_page(tmp_path):
    """Only a file that opens as exposition text is read on for a sample line."""
    page = (ENGINES / "vllm-prom-1.prom").read_bytes()
    path = tmp_path / "server.log"
    path.write_bytes(b"INFO starting the server: loading weights\n" * 40_000 + page)
    with pytest.raises(formats.Unrecognised):
        detect_format(str(path))


def test_a_table_separated_by_tabs_or_semicolons_is_named_with_a_way_to_convert_it(store, tmp_path):
    for sep, name in (("\t", "tabs"), (";", "semicolons")):
        path = tmp_path / f"steps-{name}.tsv"
        path.write_text(sep.join(("request_id", "step", "position", "draft_token", "accepted")) + "\n"
                        + sep.join(("r", "0", "1", "5", "true")) + "\n")
        res = ingest_file(store, str(path))
        assert res.status == "rejected"
        assert f"a table separated by {name}" in res.faults[0].reason
        assert "to_csv" in res.faults[0].reason and res.faults[0].file == str(path)


ACCESS = next(line for line in (ENGINES / "vllm-v1-current-1.log").read_bytes().splitlines(keepends=True)
              if b"POST" in line)  # a real HTTP access line
HOSTILE = {
    "blank lines": lambda n: b"\n" * n,
    "lone CRs": lambda n: b"\r" * n,
    "CRLFs and spaces": lambda n: b" \r\n" * (n // 3),
    "partial JSON": lambda n: b'{"request_id": "r", "draft_tokens": [1,\n' * (n // 40),
    "one long line": lambda n: b"x" * n,
    "blank lines then a step": lambda n: b"\n" * n + orjson.dumps(STEP) + b"\n",
    "start-up lines": lambda n: ACCESS * (n // len(ACCESS)),
    # exposition text alone: every block is read on for a sample line
    "Prometheus comments": lambda n: b"# HELP app_series A series.\n" * (n // 28),
    "Prometheus samples of other series": lambda n: b'app_total{route="/r"} 1\n' * (n // 24),
}


def seconds(path: str) -> float:
    """The least of three runs of detection and line splitting over the file (what every ingest runs)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        try:
            formats.detect(path)
        except (formats.Empty, formats.Unrecognised):
            pass
        for _line in textio.lines(path, 1 << 16):
            pass
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.parametrize("shape", list(HOSTILE))
def test_detection_and_line_splitting_take_time_linear_in_the_size(tmp_path, shape):
    """Measured side by side at two sizes ten times apart: linear time grows tenfold, quadratic a hundredfold;
    the bound (30) leaves room for a shared machine's noise."""
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(HOSTILE[shape](100_000))
    large.write_bytes(HOSTILE[shape](1_000_000))
    ratio = seconds(str(large)) / seconds(str(small))
    assert ratio < 30, f"{shape}: ten times the bytes took {ratio:.0f} times as long"


def test_a_page_with_one_series_twice_at_one_time_is_refused_naming_both_lines(store, tmp_path):
    page = (ENGINES / "vllm-prom-1.prom").read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(page) if line.startswith("vllm:spec_decode_num_drafts_total"))
    path = tmp_path / "twice.prom"
    path.write_text("".join(page) + page[first])
    res = ingest_file(store, str(path))
    assert res.status == "rejected"
    (fault,) = res.faults
    assert (fault.line, fault.field) == (len(page) + 1, "vllm:spec_decode_num_drafts_total")
    assert f"line {first + 1}" in fault.reason and 'engine' in fault.reason
    assert stored(store) == (0, 0, 0)
