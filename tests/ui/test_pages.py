"""Every dashboard page through Streamlit's AppTest: it renders on the demo data and on an empty database, and the
numbers it shows are the ones `specmon summary --json` gives for the same database."""
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from paths import APP
from streamlit.testing.v1 import AppTest

from specmon.analysis import load, lossless, summary
from specmon.core import segments, theory
from specmon.core.settings import LIVE_DEFAULTS, PROPOSER_LABELS
from specmon.store.database import Store
from specmon.ui.views import economics as economics_view
from specmon.ui.widgets import md_text, sentence
from specmon.verdicts import findings

PAGES = ["overview", "load", "acceptance", "economics", "drift", "ingest", "live", "losslessness"]


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    if page != "overview":
        at.switch_page(f"specmon/ui/views/{page}.py").run()
    assert not at.exception, at.exception
    return at


def expected(db: str, **kw) -> list[dict]:
    with Store(db) as store:
        return summary.summarize(store, **kw)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_on_an_empty_database(app_db, monkeypatch, page):
    monkeypatch.setattr("specmon.ingest.demo.ensure_demo", lambda store: None)
    at = open_page(page)
    assert not at.error, [e.value for e in at.error]
    if page in ("overview", "acceptance", "drift"):
        assert any("No steps stored yet" in i.value for i in at.info)
    if page == "losslessness":
        assert any("No segment has both full target distributions" in i.value for i in at.info)


def test_overview_shows_the_summary(app_db):
    at = open_page("overview")
    assert any("Demo data" in w.value for w in at.warning)
    rows = expected(app_db)
    table = at.dataframe[0].value
    assert list(table["template"]) == [r["template"] for r in rows]
    assert list(table["alpha"].round(9)) == [round(r["alpha"], 9) for r in rows]
    assert list(table["break-even alpha*"].round(9)) == [round(r["break_even_alpha"], 9) for r in rows]
    # the status is L's, in the words `check` prints for the same segment
    with Store(app_db) as store:
        said = [f for f in findings.segment_findings(rows, load.curves(store)) if f.problem]
    assert [f.state for f in said] == ["losing"]
    assert f"**Losing.** {md_text(said[0].detail)}" in [e.value for e in at.error]
    assert "tokens per step L" in said[0].detail
    assert not any("cannot be judged" in i.value for i in at.info)  # the demo's c is measured


def test_acceptance_shows_the_segment_and_its_positions(app_db):
    at = open_page("acceptance")
    seg = expected(app_db)[0]
    assert at.metric[0].value == f"{seg['alpha']:.3f}"
    assert at.metric[1].value == f"{seg['beta']:.3f}"
    positions = at.dataframe[0].value
    assert list(positions["conditional"].round(9)) == [round(p["conditional"], 9) for p in seg["per_position"]]
    assert any("agrees with the prediction" in m.value for m in at.markdown)
    at.selectbox[0].select("demo (synthetic) / v2").run()
    seg2 = expected(app_db)[1]
    assert at.metric[0].value == f"{seg2['alpha']:.3f}"


def test_economics_uses_the_segment_operating_point(app_db):
    at = open_page("economics")
    seg = expected(app_db)[0]
    c = round(seg["c"], 2)
    assert at.slider[0].value == pytest.approx(c)
    assert at.metric[0].value == f"{theory.speedup(seg['alpha'], seg['k'], c):.2f}x"
    k_best, s_best = theory.best_k(seg["alpha"], c, 12)
    assert at.metric[1].value == str(k_best) and at.metric[2].value == f"{s_best:.2f}x"
    # the operating point on both surfaces, on the cell that holds it (the grids step by 0.02)
    charts = [e.proto for e in at.main if type(e).__name__ == "UnknownElement" and hasattr(e.proto, "spec")]
    marked = [row for chart in charts for d in chart.datasets
              for row in pa.ipc.open_stream(d.data.data).read_all().to_pylist() if row.get("segment") == "your segment"]
    cell = round(round(seg["alpha"] / 0.02) * 0.02, 2)
    assert [(r["alpha"], r.get("k"), r.get("c")) for r in marked] == [(cell, seg["k"], None), (cell, None, c)]
    # measured L against 1 + g c, judged as the summary judges it at the chosen c
    said = next(m.value for m in at.markdown if m.value.startswith("**Measured against the model.**"))
    assert "(95% CI " in said and economics_view._PAYS[segments.at_cost(seg, c).status] in said
    at.slider[0].set_value(0.9).run()  # expensive draft: everything loses, even at the top of alpha's interval
    assert any("every k from 1 to 12 loses at c = 0.90, even at the top" in e.value for e in at.error)
    said = next(m.value for m in at.markdown if m.value.startswith("**Measured against the model.**"))
    assert economics_view._PAYS["losing"] in said


def test_drift_buckets_match_the_summary(app_db):
    at = open_page("drift")
    rows = expected(app_db, run="demo (synthetic)", bucket="6 hours")
    table = at.dataframe[0].value
    assert len(table) == len(rows)
    assert list(table["alpha"].round(9)) == [round(r["alpha"], 9) for r in rows]
    assert table["status"].str.contains("losing").any() and table["status"].str.contains("healthy").any()


def test_ingest_page_lists_past_ingests(app_db):
    at = open_page("ingest")
    history = at.dataframe[0].value
    assert list(history["file_name"]) == ["demo_sweep.csv", "demo_steplog.jsonl"]  # newest first


def test_losslessness_shows_the_pit_test(app_db):
    at = open_page("losslessness")
    with Store(app_db) as store:
        run, template, n = lossless.segments_with_distributions(store)[0]
        pit = lossless.pit_check(store, run, template)
    assert at.metric[0].value == f"{n:,}" and at.metric[2].value == f"{pit.ks.pvalue:.3g}"
    assert any("consistent with lossless" in m.value for m in at.markdown)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_every_page_renders_with_engine_data(app_db, tmp_path):
    from engine_lines import v1_line

    from specmon.ingest.pipeline import ingest_file
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(v1_line(m, 0, 100 + m, [80, 60, 40]) for m in range(30)) + "\n")
    with Store(app_db) as store:
        assert ingest_file(store, str(log), run="vllm-prod").status == "stored"
    for page in PAGES:
        at = open_page(page)
        assert not at.error, (page, [e.value for e in at.error])
        if page == "overview":
            assert list(at.dataframe[0].value["run"]) == ["vllm-prod"]
            # engine counters carry no timings: the page says why the status is unknown, as `check` does
            assert any(md_text("vllm-prod") in i.value and "cannot be judged" in i.value and "draft cost c is unknown"
                       in i.value for i in at.info)
            table = at.dataframe[0]
            assert table.value["c"].isna().all() and table.proto.placeholder == "unknown"  # not "None"
        if page == "acceptance":
            assert any("Engine-reported figures" in i.value for i in at.info)


def test_live_page_runs_the_shipped_pair_and_lands_on_its_acceptance(app_db):
    pytest.importorskip("torch")
    at = open_page("live")
    at.radio[0].set_value("n-gram prompt lookup")
    at.slider[0].set_value(2)  # k
    at.slider[1].set_value(0.0)  # greedy
    at.slider[2].set_value(8)  # new tokens per prompt
    at.text_input[2].input("ui-live")
    at.button[0].click().run()
    assert not at.exception, at.exception
    job = at.session_state["live_job"]  # the run goes on in its own thread; the page shows its progress
    assert any(p.proto.text.startswith(("loading", "prompt")) for p in at.get("progress"))
    job.thread.join(timeout=600)
    at.run()  # the page sees the run has ended and lands on its acceptance
    assert not at.exception, at.exception
    with Store(app_db) as store:
        rows = [r for r in summary.summarize(store) if r["run"] == "ui-live"]
    assert len(rows) == 1 and rows[0]["template"] == "copy" and rows[0]["steps"] > 0
    assert rows[0]["c_source"] == "measured decode steps" and rows[0]["c"] == rows[0]["costs"]["c"]
    with Store(app_db) as store:
        meta = json.loads(store.query("SELECT meta FROM runs WHERE name = 'ui-live'")[0][0])
    # the run's meta is the CLI's: the same proposer name and every setting, seed and top-p included
    assert {k: meta[k] for k in ("proposer", "k", "temperature", "max_new_tokens", "seed", "top_p")} == {
        "proposer": "ngram", "k": 2, "temperature": 0.0, "max_new_tokens": 8, "seed": LIVE_DEFAULTS.seed,
        "top_p": None}
    at = open_page("economics")
    at.selectbox[0].select("ui-live / copy").run()
    assert any("Measured on this machine (live run)" in m.value for m in at.markdown)


def test_live_page_offers_the_cli_defaults(app_db):
    """The page's form starts at `specmon live`'s defaults (settings.LIVE_DEFAULTS), seed and top-p included."""
    at = open_page("live")
    assert at.radio[0].value == PROPOSER_LABELS[LIVE_DEFAULTS.proposer]
    assert [s.value for s in at.slider] == [LIVE_DEFAULTS.k, LIVE_DEFAULTS.temperature, LIVE_DEFAULTS.max_new_tokens]
    assert [n.value for n in at.number_input] == [LIVE_DEFAULTS.top_p or 1.0, LIVE_DEFAULTS.seed]


def test_live_page_cancels_a_run_and_stores_nothing(app_db):
    pytest.importorskip("torch")
    at = open_page("live")
    at.radio[0].set_value("n-gram prompt lookup")
    at.text_input[2].input("ui-cancelled")
    at.button[0].click().run()
    job = at.session_state["live_job"]
    at.button[0].click().run()  # Cancel, shown while the run goes on
    assert job.cancel.is_set()
    job.thread.join(timeout=600)
    at.run()
    assert [e.value for e in at.error] == ["Cancelled: nothing was stored."]
    with Store(app_db) as store:
        assert not [r for r in summary.summarize(store) if r["run"] == "ui-cancelled"]


def test_live_page_renders_without_loading_torch(tmp_path):
    """torch loads when a run starts, not when the page is drawn (a fresh process: the tests' own has torch)."""
    code = ("import sys; from streamlit.testing.v1 import AppTest; "
            f"at = AppTest.from_file({str(APP)!r}, default_timeout=90).run(); "
            "at.switch_page('specmon/ui/views/live.py').run(); "
            "assert not at.exception, at.exception; assert at.title[0].value == 'Live run'; "
            "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "SPECMON_DB": str(tmp_path / "t.duckdb")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "torch not loaded"


def test_the_servers_head_start_leaves_the_first_page_nothing_to_compute(app_db, monkeypatch):
    """`specmon serve`'s start-up hook runs the Overview's queries into the app's cache (with Streamlit's and Altair's
    first uses, which leave nothing to check here), so the first page finds them done."""
    from specmon.ui import dashboard_server, data

    dashboard_server.prepare_first_page()

    def no_query(*args, **kwargs):
        raise AssertionError("the summary query ran again")

    monkeypatch.setattr(summary, "summarize", no_query)
    assert data.summaries(), "the head start left no rows"


def test_a_sentence_keeps_the_symbol_it_opens_with():
    assert sentence("losing at load") == "Losing at load"
    assert sentence("k = 1 up to 8 running requests") == "k = 1 up to 8 running requests"  # k, the draft length
    assert sentence("N* = 9.45") == "N* = 9.45"
