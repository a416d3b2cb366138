"""specmon's own /metrics: the series are `check`'s figures, read from the database when scraped, bounded to the
most recent runs; a real Prometheus scrapes the watcher's endpoint and the dashboard's, and evaluates rules on them."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from engine_lines import watched_v1_line as v1_line
from prometheus_client.parser import text_string_to_metric_families
from waiting import until

from specmon.analysis import load
from specmon.core.segments import STATUSES
from specmon.follow.config import SourceConfig, WatchConfig
from specmon.follow.watcher import Watcher
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store
from specmon.verdicts import findings, metrics

PROMETHEUS = shutil.which("prometheus")
# A load sweep that crosses: speedup with k = 1 over k = 0 at each concurrency, three repeats with 1% noise.
PAYOFF = {1: 1.23, 4: 1.13, 8: 1.03, 16: 0.91, 24: 0.84, 32: 0.84}


def write_sweep(tmp_path) -> str:
    rows = ["run,k,concurrency,repeat,output_tokens_per_s"]
    for n, speedup in PAYOFF.items():
        for r, noise in enumerate((1.0, 1.01, 0.99), start=1):
            rows += [f"qwen7b,0,{n},{r},{100 * n ** 0.8 * noise:.2f}",
                     f"qwen7b,1,{n},{r},{100 * n ** 0.8 * speedup * (2 - noise):.2f}"]
    path = tmp_path / "sweep.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def scrape(reg) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items: value}, parsed back with prometheus_client's own parser."""
    body, content_type = metrics.exposition(reg)
    assert content_type.startswith("text/plain; version=")
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def write_lines(log, first: int, n: int, per_pos: list[int]) -> None:
    with open(log, "a") as fh:
        for i in range(first, first + n):
            fh.write(v1_line(i, 100, per_pos)[0])


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """(Shared by this module's tests: an analysis takes a while.) A store with run prod turning losing (latest
    data), run old healthy (earlier data), a load sweep of run qwen7b (no time of its own), and a Prometheus source
    that refuses connections; the watcher's log lines."""
    tmp_path = tmp_path_factory.mktemp("watched")
    store = Store(str(tmp_path / "m.duckdb"))
    prod, old = tmp_path / "prod.log", tmp_path / "old.log"
    write_lines(old, 0, 40, [90, 80, 70])
    write_lines(prod, 0, 40, [90, 80, 70])  # the same start: the drift detector's calibration is done once
    write_lines(prod, 40, 700, [20, 5, 1])
    assert ingest_file(store, write_sweep(tmp_path)).status == "stored"
    lines: list[str] = []
    w = Watcher(store, WatchConfig([SourceConfig("log", str(prod), run="prod", c=0.3),
                                    SourceConfig("log", str(old), run="old", c=0.3),
                                    SourceConfig("prometheus", "http://127.0.0.1:1", run="down")],
                                   webhook="http://127.0.0.1:1/hook", alarm_every_s=0), log=lines.append)
    w.poll_once()
    w.outbox.close(0)
    return store, w, lines, prod


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_the_series_are_checks_figures_and_the_watchers_health(watched):
    store, _, lines, _ = watched
    got = scrape(metrics.registry(store, max_runs=10, cache_s=0))
    verdict = findings.gather(store)
    for row in verdict.segments:
        seg = (("run", row["run"]), ("template", row["template"] or ""))
        for name, key in (("specmon_alpha_ratio", "alpha"), ("specmon_alpha_lower_ratio", "alpha_lo"),
                          ("specmon_alpha_upper_ratio", "alpha_hi"),
                          ("specmon_break_even_alpha_ratio", "break_even_alpha"),
                          ("specmon_tokens_per_step", "tokens_per_step"),
                          ("specmon_tokens_per_step_lower", "tokens_per_step_lo"),
                          ("specmon_tokens_per_step_upper", "tokens_per_step_hi"),
                          ("specmon_batch1_speedup_ratio", "speedup_measured")):
            if row[key] is None:  # unknown (run old's 400 s of windows are too short for an interval) is no series
                assert seg not in got.get(name, {}), (name, row["run"])
            else:
                assert got[name][seg] == pytest.approx(row[key]), (name, row["run"])
        status = {dict(k)["status"]: v for k, v in got["specmon_segment_status"].items()
                  if k[0] == seg[0] and dict(k)["template"] == seg[1][1]}
        assert set(status) == set(STATUSES) and status[row["status"]] == 1 and sum(status.values()) == 1
        opened = sum(1 for f in verdict.findings if f.kind == findings.ALARM and f.state == "open"
                     and f.run == row["run"])
        assert got["specmon_drift_alarms_open"][seg] == opened
    losing = got["specmon_segment_status"][(("run", "prod"), ("status", "losing"), ("template", ""))]
    assert losing == 1 and got["specmon_drift_alarms_open"][(("run", "prod"), ("template", ""))] >= 1
    [curve] = load.curves(store)
    assert got["specmon_break_even_concurrency"][(("run", "qwen7b"), ("template", curve.template))] == \
        pytest.approx(curve.best.break_even)
    by_source = {dict(k)["run"]: v for k, v in got["specmon_source_rows_total"].items()}
    assert by_source == {"prod": 740, "old": 40, "down": 0}
    failures = {dict(k)["run"]: v for k, v in got["specmon_source_failures_total"].items()}
    assert failures == {"prod": 0, "old": 0, "down": 1}
    failing = [dict(k) for k, v in got["specmon_source_status"].items() if v == 1]
    assert sorted((s["run"], s["status"]) for s in failing) == [("down", "failing"), ("old", "ok"), ("prod", "ok")]
    last = got["specmon_source_last_data_timestamp_seconds"]
    assert {dict(k)["run"] for k in last} == {"prod", "old"} and all(abs(v - time.time()) < 600 for v in last.values())
    announced = [line for line in lines if line.split(":")[0] in set(findings.EVENTS.values())]
    assert got["specmon_outbox_pending_notices"][(("channel", "webhook"),)] == len(announced) >= 1
    assert got["specmon_outbox_undeliverable_notices"][(("channel", "webhook"),)] == 0
    assert got["specmon_store_readable"][()] == 1


def test_only_the_most_recently_active_runs_are_exported(watched):
    store = watched[0]
    got = scrape(metrics.registry(store, max_runs=1, cache_s=0))
    assert {dict(k)["run"] for k in got["specmon_alpha_ratio"]} == {"prod"}
    assert "specmon_break_even_concurrency" not in got  # qwen7b's sweep is left out with old
    assert got["specmon_runs_not_exported"][()] == 2
    got = scrape(metrics.registry(store, max_runs=2, cache_s=0))
    assert {dict(k)["run"] for k in got["specmon_alpha_ratio"]} == {"prod", "old"}


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_scrape_within_the_cache_time_reuses_the_last_read(watched):  # last: it adds data
    store, w, _, prod = watched
    reg = metrics.registry(store, cache_s=3600)
    rows = "specmon_source_rows_total"
    before = scrape(reg)[rows]
    write_lines(prod, 740, 5, [20, 5, 1])
    w.poll_once()
    w.outbox.close(0)
    assert scrape(reg)[rows] == before
    fresh = {dict(k)["run"]: v for k, v in scrape(metrics.registry(store, cache_s=0))[rows].items()}
    assert fresh["prod"] == 745


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def answering(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


RULES = """groups:
  - name: specmon
    interval: 1s
    rules:
      - record: run:specmon_alpha_margin:ratio
        expr: specmon_alpha_upper_ratio - specmon_break_even_alpha_ratio
      - alert: SpeculationLosing
        expr: specmon_segment_status{status="losing"} == 1
        labels:
          severity: critical
"""


@pytest.mark.slow  # a watcher, a dashboard and Prometheus, each process analysing the run (about a minute)
@pytest.mark.skipif(PROMETHEUS is None and not os.environ.get("CI"), reason="Debian's prometheus is not installed")
def test_prometheus_scrapes_the_watcher_and_the_dashboard_and_evaluates_rules_on_the_series(tmp_path):
    db, log = str(tmp_path / "w.duckdb"), tmp_path / "prod.log"
    log.write_text("")
    watch_port, dash_port, prom_port = free_port(), free_port(), free_port()
    (tmp_path / "rules.yml").write_text(RULES)
    (tmp_path / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {tmp_path / 'rules.yml'}\n"
        f"scrape_configs:\n  - job_name: specmon-watch\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{watch_port}']\n"
        f"  - job_name: specmon-dashboard\n    static_configs:\n      - targets: ['127.0.0.1:{dash_port}']\n")
    procs = []
    out = open(tmp_path / "processes.log", "wb")
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "specmon", "watch", "--db", db, "--interval", "0.2", "--log", str(log), "--run",
             "prod", "--c", "0.3", "--metrics-port", str(watch_port)], stdout=out, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen([sys.executable, "-m", "specmon", "serve", "--db", db, "--port",
                                       str(dash_port)], stdout=out, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=out, stderr=subprocess.STDOUT))
        write_lines(log, 0, 20, [90, 80, 70])
        write_lines(log, 20, 780, [20, 5, 1])  # two hours of collapse: an hour is too short to call losing
        until(lambda: Store(db).query("SELECT count(*) FROM engine_windows")[0][0] == 800, 60, "every line stored")
        row = findings.gather(Store(db), run="prod").segments[0]
        want = row["alpha_hi"] - row["break_even_alpha"]
        assert want < 0  # losing: even alpha's upper bound lies below break-even
        prom = f"http://127.0.0.1:{prom_port}"

        def query(q: str) -> dict[str, float]:
            try:
                got = get_json(f"{prom}/api/v1/query?query={urllib.parse.quote(q)}")["data"]["result"]
            except OSError:
                return {}
            return {r["metric"]["job"]: float(r["value"][1]) for r in got if r["metric"]["run"] == "prod"}
        until(lambda: query("run:specmon_alpha_margin:ratio") == pytest.approx(
            {"specmon-watch": want, "specmon-dashboard": want}, rel=1e-9), 120,
            f"the recorded rule from both endpoints ({(tmp_path / 'processes.log').read_text()[-2000:]})")
        until(lambda: any(a["labels"]["alertname"] == "SpeculationLosing"
                          for a in get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]), 60, "the alert")
        alerts = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
        assert answering(f"http://127.0.0.1:{dash_port}/metrics")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        out.close()
    [alert] = [a for a in alerts if a["labels"]["alertname"] == "SpeculationLosing" and
               a["labels"]["job"] == "specmon-watch"]
    assert alert["labels"]["run"] == "prod" and alert["state"] == "firing"
