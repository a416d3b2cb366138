"""End to end in a real browser: Debian's chromium driven by Playwright against `specmon serve`.

Uploads a step log through the upload widget, finds the new run on Overview, visits every page, saves a screenshot
of each under test-artifacts/screenshots/, and fails on any exception or error element. Uploads a real vLLM log
and finds its segment on Overview. Shows run, template and file names full of Markdown as text, with no fetch.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest
from csv_lines import MULTI_LINE_CSV, MULTI_LINE_REJECTED
from paper import PAPER_P, PAPER_Q
from paths import ROOT

from specmon.core import sampler
from specmon.ingest import demo
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / "test-artifacts" / "screenshots"
PAGES = {"overview": "Is speculative decoding paying off?", "load": "Does speculation pay at your load?",
         "acceptance": "Acceptance", "economics": "Economics", "drift": "Drift", "ingest": "Ingest", "live": "Live run",
         "losslessness": "Losslessness"}
ERRORS = '[data-testid="stException"], [data-testid="stAlertContentError"], [data-testid="stDialog"]'

if not os.path.exists(CHROMIUM):
    if os.environ.get("CI"):
        raise RuntimeError("chromium is missing: .ci/run installs it (apt-get install chromium)")
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_app(tmp_path):
    """Start the app on a database (prepared by the test, or new) and give its URL; stopped after the test."""
    running = []

    def start(db: str) -> str:
        port = free_port()
        log = open(tmp_path / "streamlit.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "specmon", "serve", "--db", db, "--demo",
                                 "--port", str(port)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        running.append((proc, log))
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    return url
            except OSError:
                time.sleep(0.3)
        pytest.fail(f"streamlit did not start: {(tmp_path / 'streamlit.log').read_text()}")

    yield start
    for proc, log in running:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.fixture
def app_url(start_app, tmp_path):
    return start_app(str(tmp_path / "e2e.duckdb"))


@pytest.fixture
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def open_page(page, url: str, path: str) -> None:
    page.goto(f"{url}/{'' if path == 'overview' else path}")
    page.get_by_role("heading", name=PAGES[path]).first.wait_for(timeout=60_000)
    # Wait until the script run has finished (the status widget shows "Running" while it works).
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    page.wait_for_timeout(500)


def upload(page, url: str, path: Path) -> None:
    open_page(page, url, "ingest")
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    # The file's size shows once it is uploaded (its name may be shortened in the middle, so not the name).
    page.locator('[data-testid="stFileUploader"]').get_by_text(re.compile(r"^[\d.]+\s?[KMG]?B$")).first.wait_for(
        timeout=30_000)


@pytest.mark.slow  # two uploads and every page in a real browser (about 18 s)
def test_two_sessions_upload_then_every_page(app_url, browser, tmp_path):
    logs = []
    for seed, name in ((9, "canary-a.jsonl"), (10, "canary-b.jsonl")):
        logs.append(tmp_path / name)
        with open(logs[-1], "wb") as out:
            sampler.write_step_log(sampler.simulate_fixed_pair(
                PAPER_P, PAPER_Q, 4, 2000, np.random.default_rng(seed)), out)
    SHOTS.mkdir(parents=True, exist_ok=True)
    sessions = [browser.new_page(viewport={"width": 1400, "height": 1000}) for _ in logs]
    for page, log in zip(sessions, logs, strict=True):
        upload(page, app_url, log)
    for page in sessions:  # both sessions submit before either has finished
        page.get_by_role("button", name="Ingest").click()
    for page in sessions:
        page.get_by_text("stored 2,000 steps").wait_for(timeout=120_000)

    page = sessions[0]
    open_page(page, app_url, "overview")
    for run in ("canary-a", "canary-b"):
        page.get_by_text(run, exact=True).first.wait_for(state="attached", timeout=30_000)  # a grid cell
    assert page.get_by_text("Demo data").count() == 0  # the user's own data replaced the demo
    steps = page.locator('[data-testid="stMetric"]').filter(has_text="steps")
    assert steps.locator('[data-testid="stMetricValue"]').inner_text() == "4,000"  # nothing lost or doubled

    for path in PAGES:
        open_page(page, app_url, path)
        page.screenshot(path=str(SHOTS / f"{path}.png"), full_page=True)
        errors = page.locator(ERRORS)
        assert errors.count() == 0, f"{path}: {errors.first.inner_text()}"


# Names that Markdown would turn into an image fetch, bold, a coloured span, an icon or a link.
EVIL_RUN = "![p](http://127.0.0.1:9/p.png) **x** -- :red[y] :material/home:"
EVIL_TEMPLATE = "**t** ![t](http://127.0.0.1:9/t.png) <img src=http://127.0.0.1:9/i.png>"
EVIL_FILE = "**up** ![u](u.png) --.jsonl"  # a relative image would be fetched from the app's own server
FETCHED = ("127.0.0.1:9", "p.png", "t.png", "i.png", "u.png")


@pytest.mark.slow  # a second app and browser
def test_names_show_as_text_and_fetch_nothing(start_app, browser, tmp_path):
    db = str(tmp_path / "names.duckdb")
    steps = tmp_path / "steps.jsonl"
    with open(steps, "wb") as out:
        sampler.write_step_log(sampler.simulate_fixed_pair(
            PAPER_P, PAPER_Q, 4, 500, np.random.default_rng(5), template=EVIL_TEMPLATE), out)
    with Store(db) as store:  # the demo log as a user run: v2 is losing, so Overview names the run in an alert
        assert ingest_file(store, str(demo.DEMO_LOG), run=EVIL_RUN).status == "stored"
        assert ingest_file(store, str(steps), run=EVIL_RUN).status == "stored"
    url = start_app(db)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    for path in PAGES:
        open_page(page, url, path)
        main = page.locator('[data-testid="stMain"]')
        assert main.locator("img").count() == 0, path
        assert main.locator("strong").filter(has_text=re.compile(r"^[xt]$")).count() == 0, path  # no **x** bold
        if path == "overview":
            # what the reader sees; U+2060 is the invisible word joiner markdown_literal puts in
            alert = page.locator('[data-testid="stAlertContentError"]').first.inner_text().replace("\u2060", "")
            assert alert.startswith(f"Losing. run {EVIL_RUN!r}, template 'v2': tokens per step L"), alert
        if path == "drift":
            heading = page.locator("strong").filter(has_text="Template **").first.inner_text().replace("\u2060", "")
            assert heading == f"Template {EVIL_TEMPLATE}", heading
    upload(page, url, _named(tmp_path, EVIL_FILE))
    page.get_by_role("button", name="Ingest").click()
    page.get_by_text("stored 300 steps").wait_for(timeout=120_000)
    message = page.locator('[data-testid="stAlertContentSuccess"]').first.inner_text().replace("\u2060", "")
    assert message.startswith(f"{EVIL_FILE}: stored 300 steps"), message
    assert page.locator('[data-testid="stMain"] img').count() == 0
    assert [r for r in requests if any(f in r for f in FETCHED)] == []


def _named(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "upload" / name
    path.parent.mkdir()
    with open(path, "wb") as out:
        sampler.write_step_log(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 300, np.random.default_rng(6)), out)
    return path


VLLM_LOG = ROOT / "tests" / "data" / "engines" / "vllm-v1-current-1.log"  # verbatim, from the engine corpus


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_real_vllm_log_uploads_and_shows_on_overview(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    open_page(page, app_url, "ingest")
    assert not page.locator('[data-testid="stFileUploaderDropzoneInput"]').get_attribute("accept")  # no filter
    page.get_by_text(".log, .txt, .out").first.wait_for()
    upload(page, app_url, VLLM_LOG)
    page.get_by_role("button", name="Ingest").click()
    page.get_by_text(f"{VLLM_LOG.name}: stored 5 engine windows").wait_for(timeout=120_000)
    open_page(page, app_url, "overview")
    page.get_by_text(VLLM_LOG.stem, exact=True).first.wait_for(state="attached", timeout=30_000)  # a grid cell
    assert page.get_by_text("Demo data").count() == 0
    steps = page.locator('[data-testid="stMetric"]').filter(has_text="steps")
    assert steps.locator('[data-testid="stMetricValue"]').inner_text() == "507"  # the drafts of its 4 windows


@pytest.mark.slow  # an upload and the Load page in a real browser
def test_a_load_sweep_uploads_and_the_load_page_shows_its_break_even(app_url, browser, tmp_path):
    """The public paired runs' payoff (vLLM 0.6.3, Qwen2.5-7B with its AWQ copy, k = 1: +23% at batch 1 to -16% at
    32) as a sweep with three repeats: the Load page draws the curve and says where speculation stops paying."""
    rows = ["run,k,concurrency,repeat,output_tokens_per_s"]
    for n, s in {1: 1.23, 4: 1.13, 8: 1.03, 16: 0.91, 24: 0.84, 32: 0.84}.items():
        for r, e in enumerate((1.0, 1.01, 0.99), start=1):
            g0 = 100 * n ** 0.8
            rows += [f"qwen7b,0,{n},{r},{g0 * e:.2f}", f"qwen7b,1,{n},{r},{g0 * s * (2 - e):.2f}"]
    sweep = tmp_path / "qwen7b-sweep.csv"
    sweep.write_text("\n".join(rows) + "\n")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    upload(page, app_url, sweep)
    page.get_by_role("button", name="Ingest").click()
    page.get_by_text(f"{sweep.name}: stored 36 load measurements").wait_for(timeout=120_000)
    open_page(page, app_url, "load")
    # the navigation names the pages by their titles (a folder Streamlit lists by itself would show file names)
    nav = page.locator('[data-testid="stSidebarNav"]').inner_text().split("\n")
    assert [n for n in nav if n.strip()] == ["Overview", "Load", "Acceptance", "Economics", "Drift", "Ingest",
                                              "Live run", "Losslessness", "Sources"], nav
    page.get_by_text("pays up to 8 running requests, loses from 16").first.wait_for(timeout=30_000)
    page.get_by_text("k = 1 up to 8 running requests, speculation off from 16").first.wait_for(timeout=30_000)
    charts = page.locator('[data-testid="stVegaLiteChart"]')
    charts.nth(1).wait_for(timeout=30_000)  # speedup and throughput (the sweep gives no acceptance)
    # the speedup chart draws the measured points, not only the 1.0 line and the break-even mark
    charts.first.locator("path.mark-symbol, path.mark-line, g.mark-symbol path").first.wait_for(
        state="attached", timeout=30_000)
    page.get_by_text("disable_by_batch_size").first.wait_for(state="attached", timeout=30_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "load-sweep.png"), full_page=True)
    errors = page.locator(ERRORS)
    assert errors.count() == 0, errors.first.inner_text()


@pytest.mark.slow  # an upload and a download in a real browser
def test_the_rejected_rows_download_names_the_lines_an_editor_shows(app_url, browser, tmp_path):
    """A CSV whose quoted fields hold line breaks before its bad rows, uploaded with "store the good rows": the
    downloaded rows are named by the line where each starts (as `specmon ingest --skip-bad` names them)."""
    path = tmp_path / "multi.csv"
    path.write_text("\n".join(line.format(eol="\n") for line in MULTI_LINE_CSV) + "\n")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    upload(page, app_url, path)
    page.get_by_text("Store the good rows and list the rejected ones").click()
    page.get_by_role("button", name="Ingest").click()
    button = page.get_by_role("button", name=re.compile("Rejected rows of multi.csv"))
    button.wait_for(timeout=120_000)
    with page.expect_download(timeout=60_000) as download:
        button.click()
    rows = [orjson.loads(line) for line in Path(download.value.path()).read_bytes().splitlines()]
    assert [(r["line"], r["field"]) for r in rows] == [(line, field) for line, field, _ in MULTI_LINE_REJECTED]
