"""End to end in a real browser: Debian's chromium driven by Playwright against `streamlit run app.py`.

Uploads a step log through the upload widget, finds the new run on Overview, visits every page, saves a screenshot
of each under test-artifacts/screenshots/, and fails on any exception or error element.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from specmon import sampler
from conftest import PAPER_P, PAPER_Q

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / "test-artifacts" / "screenshots"
PAGES = {"overview": "Is speculative decoding paying off?", "acceptance": "Acceptance", "economics": "Economics",
         "drift": "Drift", "ingest": "Ingest", "live": "Live run", "losslessness": "Losslessness"}
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
def app_url(tmp_path):
    port = free_port()
    env = {**os.environ, "SPECMON_DB": str(tmp_path / "e2e.duckdb")}
    log = open(tmp_path / "streamlit.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail(f"streamlit did not start: {(tmp_path / 'streamlit.log').read_text()}")
    yield url
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


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
    page.get_by_text(path.name).first.wait_for(timeout=30_000)


def test_two_sessions_upload_then_every_page(app_url, browser, tmp_path):
    logs = []
    for seed, name in ((9, "canary-a.jsonl"), (10, "canary-b.jsonl")):
        logs.append(tmp_path / name)
        with open(logs[-1], "wb") as out:
            sampler.write_step_log(sampler.simulate_fixed_pair(
                PAPER_P, PAPER_Q, 4, 2000, np.random.default_rng(seed)), out)
    SHOTS.mkdir(parents=True, exist_ok=True)
    sessions = [browser.new_page(viewport={"width": 1400, "height": 1000}) for _ in logs]
    for page, log in zip(sessions, logs):
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
