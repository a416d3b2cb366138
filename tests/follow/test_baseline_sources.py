"""Watched sources that run without speculation: `baseline_of` in the watch configuration and --baseline-of on the
command line declare their run the baseline of another, through every kind of poll; their load windows are kept."""
import subprocess
from datetime import datetime

import pytest
from engine_lines import REAL_V1_LOAD_ALONE
from paths import DATA

from specmon.core.faults import SpecmonError
from specmon.follow import polls, prometheus_api
from specmon.follow.config import SourceConfig, load_config
from specmon.follow.positions import register
from specmon.follow.prometheus_api import Sample
from specmon.ingest.formats.prometheus_metrics import LOAD

BASELINES = ("SELECT r.name, o.name FROM baselines b JOIN runs r ON r.run_id = b.run_id "
             "JOIN runs o ON o.run_id = b.of_run_id")


def test_the_configuration_names_the_run_a_source_is_the_baseline_of(tmp_path):
    path = tmp_path / "watch.toml"
    path.write_text('[[log]]\npath = "/var/log/off.log"\nrun = "off"\nbaseline_of = "prod"\n\n'
                    '[[prometheus]]\nurl = "http://prometheus:9090"\nrun = "off-prom"\nbaseline_of = "prod"\n\n'
                    '[[log]]\npath = "/var/log/prod.log"\nrun = "prod"\n')
    sources = load_config(str(path)).sources
    assert [(s.kind, s.run, s.baseline_of) for s in sources] == [("log", "off", "prod"), ("log", "prod", None),
                                                                 ("prometheus", "off-prom", "prod")]
    for bad, reason in (('baseline_of = 3', "must name a run"), ('baseline_of = "off"', "its own baseline_of")):
        path.write_text(f'[[log]]\npath = "/var/log/off.log"\nrun = "off"\n{bad}\n')
        with pytest.raises(SpecmonError, match=reason):
            load_config(str(path))


def test_a_watched_log_of_a_baseline_engine_keeps_its_load_and_declares_the_baseline(store, tmp_path):
    lines = (DATA / "engines" / "vllm-v1-load-1.log").read_text().splitlines()  # load, load, its SpecDecoding line
    log = tmp_path / "off.log"
    log.write_text(lines[0] + "\n" + lines[1] + "\n")
    source = SourceConfig("log", str(log), "off", baseline_of="prod")
    register(store, source, 300)
    polls.poll_log(store, source, print)
    # the first load line is released by the second; the second waits for a speculative line that may still come
    assert store.query("SELECT running_requests, generation_throughput, drafts FROM engine_windows") == \
        [(2.0, 0.1, None)]
    assert store.query(BASELINES) == [("off", "prod")]
    with log.open("a") as fh:
        fh.write(lines[2] + "\n")
    polls.poll_log(store, source, print)
    assert store.query("SELECT running_requests, drafts FROM engine_windows ORDER BY line") == [(2.0, None),
                                                                                                 (3.0, 7.0)]


def test_pulled_and_inboxed_baselines_are_declared_too(store, tmp_path, monkeypatch):
    labels = {"engine": "0", "model_name": "m"}
    pulled = [Sample(metric, labels, datetime(2026, 3, 1, 0, i), float(i)) for metric in LOAD
              if metric.startswith("vllm:") for i in (0, 1)]
    monkeypatch.setattr(prometheus_api, "pull", lambda *a, **kw: pulled)
    source = SourceConfig("prometheus", "http://prometheus:9090", "off-prom", baseline_of="prod")
    register(store, source, 300)
    assert polls.poll_prometheus(store, source, print).rows == len(pulled)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "off.log").write_text(REAL_V1_LOAD_ALONE + "\n")
    box = SourceConfig("inbox", str(inbox), "off-box", baseline_of="prod")
    register(store, box, 300)
    seen: dict = {}
    polls.poll_inbox(store, box, print, seen)  # seen once
    polls.poll_inbox(store, box, print, seen)  # unchanged: taken
    assert sorted(store.query(BASELINES)) == [("off-box", "prod"), ("off-prom", "prod")]


def test_the_command_line_refuses_a_run_as_its_own_baseline(tmp_path, specmon_cmd):
    r = subprocess.run([*specmon_cmd, "watch", "--db", str(tmp_path / "w.duckdb"), "--log", str(tmp_path / "x.log"),
                        "--run", "prod", "--baseline-of", "prod"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "its own baseline" in r.stderr and "Traceback" not in r.stderr
