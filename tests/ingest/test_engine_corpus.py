"""Real engine output (tests/data/engines/, pasted by users in public issues, pull requests and docs) ingested as a
user would ingest it, and compared with the figures worked out by hand from each engine's own definitions
(index.json says where each file comes from and how each figure follows). A figure the format cannot carry is
null in the index: the reader must store NULL for it, not a guess. `windows` counts the windows with speculative
figures; `load` lists, per window in line order, the load it carries (line, requests running, requests waiting,
generation and prompt tokens/s, engine label), those with the load alone included."""
import json
from pathlib import Path

import pytest
from paths import DATA

from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

CORPUS = DATA / "engines"
INDEX = json.loads((CORPUS / "index.json").read_text(encoding="utf-8"))
SNIPPETS = INDEX["snippets"]
EXACT = 1e-6  # counts are integers; drafts and L derived from integers are exact up to float error


def _tol(entry: dict, figure: str) -> float:
    return entry["tolerance"].get(figure, EXACT)


def _ingest(entry: dict, store: Store, tmp_path: Path) -> None:
    result = ingest_file(store, str(CORPUS / entry["file"]), name=entry["file"],
                         report_path=str(tmp_path / "rejected.jsonl"), **entry.get("options", {}))
    faults = [f.as_dict() for f in result.faults]
    if "rejected" in entry["expected"]:  # a file the format's rules refuse, for the reason the index gives
        assert result.status == "rejected", f"{entry['file']}: {result.status}"
        assert [(f.line, f.field) for f in result.faults] == [tuple(x) for x in entry["expected"]["rejected"]], faults
        return
    assert result.status == "stored", f"{entry['file']}: {result.status}: {faults}"
    assert result.fault_count == 0, f"{entry['file']}: faults {faults}"


def _check_sum(rows: list, col: int, expected, tol: float, what: str) -> None:
    values = [r[col] for r in rows]
    if expected is None:
        assert all(v is None for v in values), f"{what}: the format does not carry it, stored {values}"
    else:
        assert None not in values, f"{what}: some windows have none: {values}"
        assert sum(values) == pytest.approx(expected, abs=tol), f"{what}: stored {values}"


def _check_windows(entry: dict, store: Store) -> None:
    exp = entry["expected"]
    rows = store.query("SELECT line, drafts, draft_tokens, accepted_tokens, accepted_per_position, k, "
                       "mean_acceptance_length FROM engine_windows WHERE NOT (drafts IS NULL AND draft_tokens IS NULL "
                       "AND accepted_tokens IS NULL AND mean_acceptance_length IS NULL) ORDER BY line")
    assert len(rows) == exp["windows"], f"windows: stored lines {[r[0] for r in rows]}"
    _check_sum(rows, 1, exp["drafts"], _tol(entry, "drafts"), "drafts")
    _check_sum(rows, 2, exp["draft_tokens"], EXACT, "draft_tokens")
    _check_sum(rows, 3, exp["accepted_tokens"], EXACT, "accepted_tokens")

    per_pos = [r[4] for r in rows]
    if exp["accepted_per_position"] is None:
        assert all(p is None for p in per_pos), f"accepted_per_position: not in this format, stored {per_pos}"
    else:
        assert None not in per_pos, f"accepted_per_position: some windows have none: {per_pos}"
        width = max(len(p) for p in per_pos)
        totals = [sum(p[i] for p in per_pos if i < len(p)) for i in range(width)]
        assert totals == pytest.approx(exp["accepted_per_position"], abs=_tol(entry, "per_position")), \
            f"accepted_per_position: stored {totals}"

    ks = [r[5] for r in rows]
    want_k = exp["k"] if isinstance(exp["k"], list) else [exp["k"]] * len(rows)
    assert ks == want_k, f"k: stored {ks}"

    lengths = [r[6] for r in rows]
    if "L_per_window" in exp:
        assert None not in lengths, f"L per window: stored {lengths}"
        assert lengths == pytest.approx(exp["L_per_window"], abs=_tol(entry, "L"))
    elif exp["L"] is None:
        assert all(v is None for v in lengths), f"L: not knowable from this format, stored {lengths}"
    if exp["L"] is not None:
        drafts = [r[1] for r in rows]
        assert None not in lengths and None not in drafts, f"L: stored {lengths} over drafts {drafts}"
        # tokens per step over the file
        weighted = sum(v * d for v, d in zip(lengths, drafts, strict=True)) / sum(drafts)
        assert weighted == pytest.approx(exp["L"], abs=_tol(entry, "L")), f"L: stored {lengths}"


def _check_load(entry: dict, store: Store) -> None:
    rows = store.query("SELECT line, running_requests, waiting_requests, generation_throughput, prompt_throughput, "
                       "labels->>'engine' FROM engine_windows ORDER BY line")
    expected = entry["expected"].get("load")
    if expected is None:
        assert all(r[1:5] == (None,) * 4 for r in rows), f"load: not in this format, stored {rows}"
    else:
        assert len(rows) == len(expected), f"load: stored lines {[r[0] for r in rows]}"
        for got, want in zip(rows, expected, strict=True):
            assert all(g == w if w is None or isinstance(w, str) else g == pytest.approx(w, abs=EXACT)
                       for g, w in zip(got, want, strict=True)), f"load: stored {got}, expected {want}"


def _check_samples(entry: dict, store: Store) -> None:
    exp = entry["expected"]
    rows = store.query("SELECT metric, sum(value), count(*) FROM counter_samples GROUP BY metric ORDER BY metric")
    assert sum(r[2] for r in rows) == exp["samples"], f"samples: stored {rows}"
    assert {r[0]: r[1] for r in rows} == pytest.approx(exp["values"], abs=EXACT)


@pytest.mark.parametrize("entry", SNIPPETS, ids=[e["file"] for e in SNIPPETS])
def test_real_engine_output(entry: dict, tmp_path: Path) -> None:
    store = Store(str(tmp_path / "t.duckdb"))
    try:
        _ingest(entry, store, tmp_path)
        if "rejected" in entry["expected"]:
            return
        if entry["format"] == "prometheus":
            _check_samples(entry, store)
        else:
            _check_windows(entry, store)
            _check_load(entry, store)
    finally:
        store.close()


def test_index_names_every_file_once() -> None:
    """Every snippet in the folder has exactly one index entry with its source, and every entry has its file."""
    files = sorted(p.name for p in CORPUS.iterdir() if p.name != "index.json")
    listed = [e["file"] for e in SNIPPETS]
    assert sorted(listed) == files
    for e in SNIPPETS:
        assert e["source"].get("url") or e["source"].get("index_id"), e["file"]
        assert e["how"] and e["engine"] and e["shape"], e["file"]
