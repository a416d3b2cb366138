"""specmon as a user installs it: the wheel built from this tree, installed (not editable) into a fresh virtualenv
and run from an empty directory, so nothing can come from the checkout.

The virtualenv reuses the dependencies already installed for the tests (a .pth line naming their site-packages, which
Python adds to the path after the virtualenv's own) rather than downloading them again; that folder's editable
specmon is not activated by a plain path line, and the test checks that the specmon imported is the wheel's.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest
from paths import ROOT

pytestmark = pytest.mark.slow

# Not part of the package source: the checkout's virtualenv, build outputs and whatever the tests leave behind.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    "test-artifacts", "out", "*.duckdb", "*.duckdb.wal")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Build the wheel, install it into a new virtualenv; give the venv, its environment and an empty directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = shutil.copytree(ROOT, tmp / "src", ignore=NOT_SOURCE)  # a copy: setuptools writes build/ into the tree
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(tmp / "dist")],
                   check=True, timeout=600)
    (wheel,) = (tmp / "dist").glob("specmon-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_test_dependencies.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    empty = tmp / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECMON_DB", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {"venv": venv, "site": site, "python": python, "specmon": venv / "bin" / "specmon", "cwd": empty,
            "env": env}


def run(installed: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(installed["specmon"]), *args], cwd=installed["cwd"], env=installed["env"],
                          capture_output=True, text=True, timeout=timeout)


def test_the_installed_specmon_is_the_wheel(installed):
    code = ("import json, importlib.metadata as m, specmon, specmon.core.resources as r; "
            "print(json.dumps({'module': specmon.__file__, 'demo': str(r.DEMO_LOG), 'app': str(r.APP), "
            "'models': str(r.MODELS), 'editable': m.distribution('specmon').read_text('direct_url.json')}))")
    out = subprocess.run([str(installed["python"]), "-c", code], cwd=installed["cwd"], env=installed["env"],
                         capture_output=True, text=True, check=True).stdout
    found = json.loads(out)
    site = str(installed["site"])
    for key in ("module", "demo", "app", "models"):
        assert found[key].startswith(site), (key, found[key])
    assert found["editable"] is None or '"editable": true' not in found["editable"]
    assert (Path(found["models"]) / "target" / "model.safetensors").stat().st_size > 1_000_000


def test_demo_then_summary_from_an_empty_directory(installed):
    r = run(installed, "demo")
    assert r.returncode == 0, r.stderr
    assert (installed["cwd"] / "specmon.duckdb").is_file()  # the default database: the working directory's
    r = run(installed, "summary", "--json")
    assert r.returncode == 0, r.stderr
    segments = json.loads(r.stdout)
    assert {s["run"] for s in segments} == {"demo (synthetic)"}
    assert {s["template"] for s in segments} == {"v1", "v2"}


def test_verify_runs_the_shipped_pair_on_the_shipped_prompts(installed):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    # The default pair and a shipped prompt set by name (found in the installed package); few tokens, to be quick.
    r = run(installed, "verify", "--prompts", "open", "--max-new-tokens", "8", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for proposer in ("draft model", "n-gram"):  # the 16 open-ended prompts
        assert f"greedy, {proposer}: 16/16 prompts decode exactly as the target alone" in r.stdout
    assert "consistent with the target's distribution" in r.stdout


def test_serve_answers_and_renders_every_page(installed, tmp_path):
    from playwright.sync_api import sync_playwright
    from test_browser import CHROMIUM, PAGES, free_port, open_page  # skips where chromium is missing

    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([str(installed["specmon"]), "serve", "--port", str(port)], cwd=installed["cwd"],
                            env=installed["env"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    pytest.fail(f"specmon serve did not answer: {(tmp_path / 'serve.log').read_text()}")
                time.sleep(0.3)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            open_page(page, url, "overview")
            assert page.get_by_text("demo (synthetic)").count() > 0  # the shipped demo data, on a new database
            for path in PAGES:  # every page file resolves from the installed package and draws without a fault
                open_page(page, url, path)  # (the demo's losing segment is an error box by design: not counted)
                faults = page.locator('[data-testid="stException"], [data-testid="stDialog"]')
                assert faults.count() == 0, (path, faults.all_inner_texts())
                assert page.get_by_text("Something went wrong while drawing this page").count() == 0, path
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
