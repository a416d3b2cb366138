"""Findings as alerts in a real Alertmanager (Debian's binary): a segment turning losing fires an alert with its
figures, the alert is posted again while it fires, and it resolves when data brings the segment back to healthy."""
import json
import os
import shutil
import socket
import subprocess
import urllib.request

import pytest
from engine_lines import watched_v1_line as v1_line
from waiting import until

from specmon.follow.config import SourceConfig, WatchConfig, load_config
from specmon.follow.watcher import Watcher
from specmon.store.database import Store
from specmon.verdicts import findings

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
if ALERTMANAGER is None:
    if os.environ.get("CI"):
        raise RuntimeError("alertmanager is missing: .ci/run installs Debian's prometheus-alertmanager package")
    pytest.skip("Debian's prometheus-alertmanager is not installed", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def alertmanager(tmp_path):
    config = tmp_path / "alertmanager.yml"
    config.write_text('route:\n  receiver: "null"\n  group_wait: 1s\nreceivers:\n  - name: "null"\n')
    port = free_port()
    log = open(tmp_path / "alertmanager.log", "wb")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'am'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200
        except OSError:
            return False
    try:
        until(ready, 60, "Alertmanager ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def alerts(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=5) as resp:
        return json.loads(resp.read())


def segment_alerts(url: str) -> list[dict]:
    return [a for a in alerts(url) if a["labels"]["alertname"] == "SpeculativeDecodingSegmentStatus"
            and a["labels"]["run"] == "prod"]


def poll_all(w: Watcher) -> None:
    while w.poll_once():
        pass


def write_lines(log, first: int, n: int, per_pos: list[int]) -> None:
    with open(log, "a") as fh:
        for i in range(first, first + n):
            fh.write(v1_line(i, 100, per_pos)[0])


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_losing_segment_fires_is_posted_again_and_resolves_when_it_recovers(tmp_path, alertmanager):
    log = tmp_path / "vllm.log"
    store = Store(str(tmp_path / "w.duckdb"))
    w = Watcher(store, WatchConfig([SourceConfig("log", str(log), run="prod", c=0.3)], alarm_every_s=0,
                                   alertmanager=alertmanager, dashboard_url="http://dash:8501", alert_resend_s=0.5),
                log=lambda s: None)
    write_lines(log, 0, 40, [90, 80, 70])
    write_lines(log, 40, 700, [20, 5, 1])  # below break-even (1 + k c = 1.9 tokens per step at c = 0.3)
    poll_all(w)
    until(lambda: segment_alerts(alertmanager), 30, "the losing segment's alert")
    [alert] = segment_alerts(alertmanager)
    [segment] = [f for f in findings.gather(store, run="prod").findings if f.kind == findings.SEGMENT]
    assert segment.state == "losing"
    assert alert["labels"] == {"alertname": "SpeculativeDecodingSegmentStatus", "run": "prod", "template": "-",
                               "kind": "segment", "subject": segment.subject, "severity": "critical"}
    assert alert["annotations"]["description"] == segment.headline and alert["status"]["state"] == "active"
    assert alert["generatorURL"] == "http://dash:8501/overview?run=prod"
    updated = alert["updatedAt"]
    until(lambda: (w.poll_once(), segment_alerts(alertmanager)[0]["updatedAt"] != updated)[1], 30,
          "the firing alert posted again")
    write_lines(log, 740, 1500, [90, 80, 70])  # acceptance comes back, well above break-even
    poll_all(w)
    [segment] = [f for f in findings.gather(store, run="prod").findings if f.kind == findings.SEGMENT]
    assert segment.state == "healthy"
    until(lambda: not segment_alerts(alertmanager), 30, "the alert resolved")
    w.outbox.close()
    sent = store.query("SELECT event, count(*) FROM outbox WHERE subject = ? AND delivered_at IS NOT NULL "
                       "GROUP BY event ORDER BY event", [segment.subject])
    assert dict(sent)["resolved"] == 1 and dict(sent)["firing"] >= 2


def test_the_configuration_names_the_alertmanager_and_the_outbox_settings(tmp_path):
    path = tmp_path / "watch.toml"
    path.write_text('alertmanager = "http://am:9093"\noutbox_max_age = 3600\nalert_resend = 30\n'
                    '[[log]]\npath = "a.log"\n')
    config = load_config(str(path))
    assert (config.alertmanager, config.outbox_max_age_s, config.alert_resend_s) == ("http://am:9093", 3600, 30)
