"""One segment summary for every source, and one rule for its economics: the README's key table is the JSON, and
the economics follow theory.py's formulas with one None rule."""
import json
import math
import re
import subprocess

import pytest
from paths import ROOT

from specmon.core import segments, theory
from specmon.core.segments import Estimate, economics

ENGINES = ROOT / "tests" / "data" / "engines"


def _readme_keys() -> tuple[set[str], set[str]]:
    """The keys the README's `specmon summary --json` table names, and the per_position keys it lists."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## What `specmon summary --json` reports", 1)[1]
    table = section[section.index("| key |"):].split("\n\n", 1)[0]
    keys: set[str] = set()
    for line in table.splitlines()[2:]:
        first_cell = line.split("|")[1]
        keys |= set(re.findall(r"`([a-z_]+)`", first_cell))
    per_position = re.search(r"\| `per_position` \| list of `\{([^}]*)\}`", table)
    assert per_position, "the per_position row lists its keys"
    return keys, {k.strip() for k in per_position.group(1).split(",")}


def test_the_readme_key_table_is_the_dataclass():
    keys, position_keys = _readme_keys()
    assert keys == segments.json_keys(), (keys - segments.json_keys(), segments.json_keys() - keys)
    assert position_keys == segments.position_keys()


def test_source_keys_are_named_in_the_readme_with_their_sources():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for key, sources in segments.SOURCE_KEYS.items():
        row = next(line for line in text.splitlines() if line.startswith("| ") and f"`{key}`" in line.split("|")[1])
        for source in sources:
            assert source.replace("steplog", "step-log") in row, (key, source)


def test_summary_json_keys_of_every_source_are_the_readme_table(tmp_path, specmon_cmd):
    db = str(tmp_path / "s.duckdb")
    sim = subprocess.run([*specmon_cmd, "simulate", "--cycles", "300", "--distributions", "topk"],
                         capture_output=True, check=True, timeout=120).stdout
    (tmp_path / "sim.jsonl").write_bytes(sim)
    engine_logs = [str(ENGINES / n) for n in ("vllm-v1-current-1.log", "llama-server-2.log", "vllm-prom-1.prom")]
    subprocess.run([*specmon_cmd, "ingest", "--db", db, str(tmp_path / "sim.jsonl"), *engine_logs],
                   capture_output=True, check=True, timeout=300)
    r = subprocess.run([*specmon_cmd, "summary", "--json", "--db", db, "--c", "0.1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    readme, position_keys = _readme_keys()
    by_source = {row["source"]: row for row in rows}
    assert set(by_source) == {"steplog", "engine"}
    for source, row in by_source.items():
        only_elsewhere = {k for k, srcs in segments.SOURCE_KEYS.items() if source not in srcs}
        assert set(row) == readme - only_elsewhere, source
        for p in row["per_position"]:
            assert set(p) == position_keys
    # llama-server prints no k: break-even needs k, the measured speedup does not
    no_k = next(row for row in rows if row["run"] == "llama-server-2")
    assert no_k["k"] is None and no_k["break_even_alpha"] is None and no_k["status"] == "unknown"
    assert no_k["speedup_measured"] == pytest.approx(no_k["tokens_per_step"] / (1 + no_k["mean_draft_len"] * 0.1))


def test_economics_follow_the_theory():
    alpha, tokens = Estimate(0.8, 0.75, 0.85), Estimate(3.0, 2.8, 3.2)
    e = economics(4, 0.1, "given", alpha, tokens, 3.5)
    assert e.break_even_alpha == e.break_even_alpha_iid == pytest.approx(theory.break_even_alpha(4, 0.1))
    assert e.break_even_alpha_basis == segments.IID  # no per-position counts given
    assert e.break_even_tokens == pytest.approx(1.35)  # 1 + g c with the mean draft length g = 3.5
    assert e.speedup_iid == pytest.approx(float(theory.speedup(0.8, 4, 0.1)))
    assert e.speedup_measured == pytest.approx(3.0 / 1.35)
    assert (e.status, e.status_basis, e.status_iid, e.c, e.c_source) == ("healthy", segments.TOKENS, "healthy", 0.1,
                                                                         "given")


def test_economics_straddling_and_below_break_even():
    be = theory.break_even_alpha(4, 0.3)
    # no interval on L (a replay): the status falls back on alpha against the i.i.d. alpha*, and says so
    replay = economics(4, 0.3, "measured", Estimate(be, be - 0.01, be + 0.01), Estimate(), None)
    assert (replay.status, replay.status_basis) == ("at risk", segments.IID)
    losing = economics(4, 0.3, "measured", Estimate(0.1, 0.05, 0.15), Estimate(1.1, 1.0, 1.2), 4.0)
    assert (losing.status, losing.status_iid) == ("losing", "losing")


def test_economics_unknowns_give_none_and_unknown():
    assert economics(4, None, None, Estimate(0.8, 0.7, 0.9), Estimate(3.0, 2.9, 3.1), 4.0) == segments.Economics()
    no_interval = economics(4, 0.1, "given", Estimate(0.8), Estimate(3.0), 4.0)
    assert no_interval.status == no_interval.status_iid == "unknown" and no_interval.status_basis is None
    assert no_interval.speedup_iid is not None and no_interval.speedup_measured is not None
    # c > 1: no alpha breaks even, so break-even alpha is unknown and every segment loses
    dear = economics(4, 1.5, "given", Estimate(0.99, 0.98, 1.0), Estimate(), None)
    assert dear.break_even_alpha is None and dear.status == "losing" and dear.speedup_measured is None
    assert math.isfinite(dear.break_even_tokens)


def test_problem_statuses_are_the_ones_check_and_the_pages_flag():
    assert [s for s in segments.STATUSES if segments.is_problem(s)] == ["at risk", "losing"]


def test_the_demo_shows_until_the_user_has_data_through_the_views(store, tmp_path):
    """run_names, template_changes, demo_only and the summaries apply one rule (the shown_runs and shown_segments
    views): the demo run alone while nothing else is stored, never once something is."""
    from specmon.analysis import summary
    from specmon.ingest import demo
    from specmon.ingest.pipeline import ingest_file

    demo.load_demo(store)
    assert summary.demo_only(store) and summary.run_names(store) == [demo.DEMO_RUN]
    assert set(summary.template_changes(store)["run"]) == {demo.DEMO_RUN}
    assert {s.run for s in summary.segments(store, per_position=False)} == {demo.DEMO_RUN}
    log = tmp_path / "mine.jsonl"
    log.write_text(json.dumps({"request_id": "r", "draft_tokens": [1, 2], "accepted": 1, "template": "t1",
                               "ts": "2026-01-02T03:04:05"}) + "\n")
    assert ingest_file(store, str(log)).status == "stored"
    assert not summary.demo_only(store) and summary.run_names(store) == ["mine"]
    assert summary.template_changes(store)[["run", "template"]].values.tolist() == [["mine", "t1"]]
    assert [(s.run, s.demo) for s in summary.segments(store, per_position=False)] == [("mine", False)]


def test_why_a_segment_cannot_be_judged_carries_its_note():
    """check and the Overview say why a segment has no interval where the summary knows (too short a span of
    engine windows), not only that it has none."""
    short = {"c": 0.3, "k": 4, "drafted": 400.0,
             "note": "no interval yet: the windows span under 30 minutes, and requests outlive a window"}
    assert segments.why_unknown(short).endswith("(no interval yet: the windows span under 30 minutes, and requests "
                                                "outlive a window)")
    assert segments.why_unknown(short | {"note": None}) == (
        "neither its tokens per step L nor its per-token acceptance alpha has an interval")


def test_a_log_that_counts_no_drafted_tokens_is_unknown_for_its_draft_length_not_idle():
    """SGLang prints tokens per step alone: nothing says how many tokens a step drafted, which is not the same as
    no step drafting (an idle log says that)."""
    assert segments.why_unknown({"c": 0.1, "k": None, "drafted": None, "tokens_per_step": 1.95}) == (
        "its draft length k is unknown: the log counts no drafted tokens (SGLang's lines, for one, print tokens per "
        "step alone)")
    assert segments.why_unknown({"c": 0.1, "k": None, "drafted": 0.0}) == (
        "no step drafted a token, so there is no draft length to judge")
