"""The CLI as a user meets it: separate processes, exit codes, messages on stderr."""
import json
import subprocess
import sys
from dataclasses import replace

import jsonschema
import orjson
import pytest
from csv_lines import MULTI_LINE_CSV, MULTI_LINE_REJECTED

from specmon.cli import main as cli
from specmon.core import resources
from specmon.core.settings import LIVE_DEFAULTS
from specmon.ingest import demo
from specmon.store.database import Store

SUMMARY_KEYS = {"run", "template", "k", "steps", "drafted", "checked", "accepted", "alpha", "alpha_lo", "alpha_hi",
                "beta", "beta_lo", "beta_hi", "tokens_per_step", "c", "break_even_alpha", "break_even_tokens",
                "status", "per_position"}
POSITION_KEYS = {"position", "checked", "accepted", "conditional", "cumulative", "beta"}


def run(cmd, *args, stdin=None):
    return subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=300)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_simulate_pipe_ingest_reproduces_beta_and_tokens_per_step(tmp_path, specmon_cmd):
    db = str(tmp_path / "s.duckdb")
    sim = run(specmon_cmd, "simulate", "--cycles", "50000", "--seed", "3")
    assert sim.returncode == 0 and b"beta = 0.8800" in sim.stderr
    ing = run(specmon_cmd, "ingest", "--db", db, "-", stdin=sim.stdout)
    assert ing.returncode == 0, ing.stderr
    assert b"<stdin>: stored 50,000 steps (200,000 drafted positions)" in ing.stdout
    out = run(specmon_cmd, "summary", "--db", db, "--json")
    rows = json.loads(out.stdout)
    assert len(rows) == 1 and SUMMARY_KEYS <= rows[0].keys()
    seg = rows[0]
    assert seg["beta"] == pytest.approx(0.88, abs=1e-9)
    assert seg["tokens_per_step"] == pytest.approx(3.9356, abs=0.03)
    assert seg["alpha_lo"] < 0.88 < seg["alpha_hi"] or abs(seg["alpha"] - 0.88) < 0.005
    assert [p["position"] for p in seg["per_position"]] == [1, 2, 3, 4]
    assert POSITION_KEYS <= seg["per_position"][0].keys()
    # L = 1 + sum of cumulative rates, exactly
    assert seg["tokens_per_step"] == pytest.approx(1 + sum(p["cumulative"] for p in seg["per_position"]))
    assert seg["status"] == "unknown" and seg["c"] is None
    again = run(specmon_cmd, "ingest", "--db", db, "-", stdin=sim.stdout)
    assert again.returncode == 0 and b"already ingested" in again.stdout


def test_ingest_exit_codes_and_messages(tmp_path, specmon_cmd):
    db = str(tmp_path / "e.duckdb")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "a", "draft_tokens": [1, 2], "accepted": 5}\n')
    r = run(specmon_cmd, "ingest", "--db", db, str(bad))
    assert r.returncode == 1
    assert f"{bad}:1: field 'accepted': 5 is outside 0..g (g = 2".encode() in r.stderr
    assert b"nothing stored" in r.stderr and b"Traceback" not in r.stderr
    r = run(specmon_cmd, "ingest", "--db", db, str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and b"missing.jsonl: no such file" in r.stderr
    r = run(specmon_cmd, "ingest", "--db", db, "--skip-bad", "--report", str(tmp_path / "rep.jsonl"), str(bad))
    assert r.returncode == 0 and b"1 rows rejected" in r.stdout


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_check_exit_codes(tmp_path, specmon_cmd):
    db = str(tmp_path / "c.duckdb")
    r = run(specmon_cmd, "check", "--db", db)
    assert r.returncode == 2 and b"no database at" in r.stderr
    Store(db).close()
    r = run(specmon_cmd, "check", "--db", db)
    assert r.returncode == 2 and b"holds no steps of your own" in r.stderr
    sim = run(specmon_cmd, "simulate", "--cycles", "2000", "--distributions", "none").stdout
    run(specmon_cmd, "ingest", "--db", db, "-", stdin=sim)
    r = run(specmon_cmd, "check", "--db", db)
    assert r.returncode == 2 and b"c is unknown; pass --c" in r.stderr
    r = run(specmon_cmd, "check", "--db", db, "--c", "0.1")
    assert r.returncode == 0 and b"healthy" in r.stdout
    r = run(specmon_cmd, "check", "--db", db, "--c", "0.5")  # alpha* at k = 4, c = 0.5 is about 0.74 < 0.88
    assert r.returncode == 0
    r = run(specmon_cmd, "check", "--db", db, "--c", "0.9")  # alpha* about 0.94: losing
    assert r.returncode == 1 and b"LOSING: run 'stdin'" in r.stdout
    for bad in ("-1", "nan", "inf"):
        r = run(specmon_cmd, "check", "--db", db, "--c", bad)
        assert r.returncode == 2 and b"c is a cost ratio >= 0" in r.stderr, bad


def test_check_on_the_demo_template_change(tmp_path, specmon_cmd):
    db = str(tmp_path / "d.duckdb")
    r = run(specmon_cmd, "ingest", "--db", db, "--run", "prod", str(demo.DEMO_LOG))
    assert r.returncode == 0
    r = run(specmon_cmd, "check", "--db", db)
    assert r.returncode == 1
    assert b"LOSING: run 'prod', template 'v2'" in r.stdout and b"template 'v1': alpha" not in r.stdout



def test_demo_twice_says_the_second_time_changed_nothing(tmp_path, specmon_cmd):
    db = str(tmp_path / "d.duckdb")
    first = run(specmon_cmd, "demo", "--db", db)
    assert first.returncode == 0 and b"demo data stored" in first.stdout and b" 0 steps" not in first.stdout
    again = run(specmon_cmd, "demo", "--db", db)
    assert again.returncode == 0 and b"already there" in again.stdout and b"nothing changed" in again.stdout
    assert b"steps" not in again.stdout


def test_summary_loads_the_demo_into_an_empty_database(tmp_path, specmon_cmd):
    db = str(tmp_path / "new.duckdb")
    Store(db).close()  # a database with nothing in it yet
    r = run(specmon_cmd, "summary", "--db", db)
    assert r.returncode == 0 and b"loaded the demo data" in r.stderr and b"demo (synthetic)" in r.stdout
    rows = json.loads(run(specmon_cmd, "summary", "--db", db, "--json").stdout)
    assert {(s["template"], s["status"]) for s in rows} == {("v1", "healthy"), ("v2", "losing")}
    assert all(s["demo"] for s in rows)
    Store(str(tmp_path / "empty.duckdb")).close()
    r = run(specmon_cmd, "summary", "--db", str(tmp_path / "empty.duckdb"), "--no-demo")
    assert r.returncode == 0 and b"no data: ingest a step log first" in r.stdout


def test_theory_table(specmon_cmd):
    r = run(specmon_cmd, "theory", "--c", "0.1")
    assert r.returncode == 0
    assert b"k=2: alpha* = 0.171" in r.stdout and b"k=8: alpha* = 0.445" in r.stdout
    assert b" 0.40  1.27    1.30" in r.stdout
    r = run(specmon_cmd, "theory", "--c", "0.5", "--k-max", "3")
    assert b"0.40  0.93" in r.stdout and b"every k loses" in r.stdout


def test_every_command_has_help(specmon_cmd):
    for command in ("ingest", "summary", "check", "theory", "simulate", "demo", "serve"):
        r = run(specmon_cmd, command, "--help")
        assert r.returncode == 0 and b"usage: specmon " + command.encode() in r.stdout
    r = run(specmon_cmd, "simulate", "--k", "0")
    assert r.returncode == 2 and b"must be at least 1" in r.stderr


def test_demo_log_is_reproducible_and_valid(tmp_path, specmon_cmd):
    out = tmp_path / "demo.jsonl"
    r = run(specmon_cmd, "demo", "--write-log", str(out))
    assert r.returncode == 0
    assert out.read_bytes() == demo.DEMO_LOG.read_bytes()
    schema = json.loads(resources.STEPLOG_SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    lines = out.read_bytes().splitlines()
    for line in lines[:: max(1, len(lines) // 300)]:
        validator.validate(orjson.loads(line))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"request_id": "a", "draft_tokens": ["x"], "accepted": 0})


def test_serve_starts_the_dashboard_on_loopback(tmp_path, specmon_cmd):
    import socket
    import time
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*specmon_cmd, "serve", "--db", str(tmp_path / "serve.duckdb"), "--demo",
                             "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read()
                break
            except OSError:
                time.sleep(0.3)
        assert body == b"ok"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_model_free_status_agrees_on_the_demo(tmp_path, specmon_cmd):
    assert run(specmon_cmd, "demo", "--db", str(tmp_path / "m.duckdb")).returncode == 0
    rows = json.loads(run(specmon_cmd, "summary", "--db", str(tmp_path / "m.duckdb"), "--json").stdout)
    by_template = {r["template"]: r for r in rows}
    for r in rows:
        assert r["tokens_per_step_lo"] < r["tokens_per_step"] < r["tokens_per_step_hi"]
    assert by_template["v1"]["status_iid"] == "healthy"
    assert by_template["v2"]["status_iid"] == "losing"
    assert by_template["v2"]["tokens_per_step_hi"] < by_template["v2"]["break_even_tokens"]


def test_names_cannot_drive_the_terminal(tmp_path, specmon_cmd):
    db = str(tmp_path / "n.duckdb")
    log = tmp_path / "evil\x1b[2Jname.jsonl"
    log.write_bytes(b'{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1}\n')
    run_name = "prod\x1b[31mRED\x1b[0m\u202e"
    r = run(specmon_cmd, "ingest", "--db", db, "--run", run_name, "--template", "t\nFAKE LINE", str(log))
    assert r.returncode == 0, r.stderr
    assert b"\x1b" not in r.stdout + r.stderr and b"evil\\x1b[2Jname.jsonl: stored" in r.stdout
    r = run(specmon_cmd, "summary", "--db", db)
    assert b"\x1b" not in r.stdout and "\u202e".encode() not in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith(b"prod"))
    assert row.startswith(b"prod\\x1b[31mRED\\x1b[0m\\u202e  t\\nFAKE LINE  ")  # one line, columns still aligned
    assert b"\nFAKE LINE" not in r.stdout
    rows = json.loads(run(specmon_cmd, "summary", "--db", db, "--json").stdout)
    assert rows[0]["run"] == run_name  # JSON carries the name exactly (escaped by JSON itself)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_demo_figures_are_never_presented_as_the_users(tmp_path, specmon_cmd):
    db = str(tmp_path / "d.duckdb")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "a", "draft_tokens": [1, 2], "accepted": 5}\n')
    assert run(specmon_cmd, "ingest", "--db", db, str(bad)).returncode == 1  # rejected: nothing of the user's
    r = run(specmon_cmd, "summary", "--db", db)
    assert r.stdout.startswith(b"DEMO DATA, not yours: ") and b"demo (synthetic)" in r.stdout
    rows = json.loads(run(specmon_cmd, "summary", "--db", db, "--json").stdout)
    assert rows and all(s["demo"] is True for s in rows)
    r = run(specmon_cmd, "check", "--db", db)
    assert r.returncode == 2 and b"nothing of yours to judge" in r.stderr and b"only the demo data" in r.stderr
    assert r.stdout == b""
    good = tmp_path / "mine.jsonl"
    good.write_text('{"request_id": "a", "draft_tokens": [1, 2], "accepted": 1}\n')
    assert run(specmon_cmd, "ingest", "--db", db, str(good)).returncode == 0
    r = run(specmon_cmd, "summary", "--db", db)
    assert b"DEMO" not in r.stdout and b"demo (synthetic)" not in r.stdout
    rows = json.loads(run(specmon_cmd, "summary", "--db", db, "--json").stdout)
    assert [s["run"] for s in rows] == ["mine"] and rows[0]["demo"] is False


def test_ingest_of_an_empty_file_says_so_and_changes_nothing(tmp_path, specmon_cmd):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    done = subprocess.run([*specmon_cmd, "ingest", "--db", str(tmp_path / "e.duckdb"), str(empty)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "empty, nothing to ingest; nothing changed" in done.stdout


def test_live_defaults_are_the_shared_settings():
    """`specmon live` starts from settings.LIVE_DEFAULTS, as the Live run page does (tests/ui/test_pages.py)."""
    args = cli.build_parser().parse_args(["live"])
    assert cli.live_settings(args) == LIVE_DEFAULTS
    args = cli.build_parser().parse_args(["live", "--ngram", "--k", "3", "--top-p", "0.9", "--seed", "7"])
    assert cli.live_settings(args) == replace(LIVE_DEFAULTS, ngram=True, k=3, top_p=0.9, seed=7)
    assert cli.live_settings(args).proposer == "ngram"


def test_serve_starts_without_loading_numpy_duckdb_or_the_readers():
    """`specmon serve` only starts Streamlit: the CLI imports what the other commands need when they run, which
    keeps the time from `specmon serve` to the first page short (docs/benchmarks.md)."""
    code = "import sys, specmon.cli.main as cli; cli.build_parser().parse_args(['serve']); print(sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for heavy in ("numpy", "duckdb", "pandas", "scipy.special", "specmon.analysis.summary", "specmon.ingest.pipeline",
                  "specmon.drift.alarms", "torch"):
        assert f"'{heavy}'" not in loaded, heavy


def test_summary_of_step_logs_loads_neither_pandas_nor_the_readers(tmp_path):
    """`specmon summary` in a cron job: on a database of step logs it imports only what the step-log summary needs
    (engine and replay summaries, which use pandas, load only where such data is stored)."""
    from specmon.ingest.pipeline import ingest_file
    from specmon.store.database import Store

    db = str(tmp_path / "s.duckdb")
    with Store(db) as store:
        ingest_file(store, str(resources.DEMO_LOG), run="mine")
    code = ("import io, sys, contextlib; from specmon.cli import main as cli\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out: code = cli.main(['summary', '--json', '--db', "
            f"{db!r}])\n"
            "print(code, len(out.getvalue()) > 0, sorted(sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.startswith("0 True"), loaded[:200]
    for heavy in ("pandas", "specmon.ingest.pipeline", "specmon.analysis.engine_segments",
                  "specmon.analysis.replay_segments", "torch"):
        assert f"'{heavy}'" not in loaded, heavy


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_the_skip_bad_report_names_the_line_an_editor_shows(tmp_path, specmon_cmd, eol):
    path = tmp_path / "multi.csv"
    path.write_bytes(eol.join(line.format(eol=eol) for line in MULTI_LINE_CSV).encode() + eol.encode())
    editor_lines = path.read_bytes().decode().splitlines()  # LF, CRLF and CR each end a line, as in an editor
    report = tmp_path / "rejected.jsonl"
    done = run(specmon_cmd, "ingest", "--db", str(tmp_path / "db.duckdb"), "--skip-bad", "--report", str(report),
               str(path))
    assert done.returncode == 0, done.stderr
    rows = [orjson.loads(line) for line in report.read_bytes().splitlines()]
    assert [(r["line"], r["field"]) for r in rows] == [(line, field) for line, field, _ in MULTI_LINE_REJECTED]
    for line, _, step in MULTI_LINE_REJECTED:
        assert editor_lines[line - 1].startswith(f"r,{step},")


def test_check_on_a_log_where_no_step_drafted_is_unknown_whether_or_not_k_is_logged(tmp_path, specmon_cmd):
    """Every step drafted nothing: no speculation ran, so there is nothing to judge (exit 2, saying so), the same
    with k logged as without; a configured k is no draft length."""
    for with_k in (False, True):
        log = tmp_path / f"idle{with_k}.jsonl"
        log.write_text("".join(json.dumps({"request_id": f"r{i // 5}", "draft_tokens": [], "accepted": 0,
                                           **({"k": 4} if with_k else {})}) + "\n" for i in range(40)))
        db = str(tmp_path / f"idle{with_k}.duckdb")
        assert run(specmon_cmd, "ingest", "--db", db, str(log)).returncode == 0
        done = run(specmon_cmd, "check", "--db", db, "--c", "0.1")
        assert done.returncode == 2, (with_k, done.stdout, done.stderr)
        assert b"no step drafted a token" in done.stderr and b"LOSING" not in done.stdout
