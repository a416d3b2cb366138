"""One rule for what a person is told: `check` prints exactly the findings that are problems, and a watcher
announces a finding when its state changes, once, whatever restarted in between."""
import subprocess
from dataclasses import replace

from specmon.core.resources import DEMO_LOG
from specmon.ingest.pipeline import ingest_file
from specmon.verdicts import findings
from specmon.verdicts.findings import Finding


def _finding(kind: str, state: str, problem: bool, subject: str = "s") -> Finding:
    return Finding(kind, subject, state, problem, "prod", "v1", state.upper(), "detail", "overview")


def test_a_segment_is_announced_when_it_turns_losing_at_risk_and_back():
    losing = _finding(findings.SEGMENT, "losing", True)
    assert findings.announcements([losing], {}) == [(losing, "segment_losing")]
    assert findings.announcements([losing], {"s": "losing"}) == []  # said once
    at_risk = replace(losing, state="at risk")
    assert findings.announcements([at_risk], {"s": "losing"}) == [(at_risk, "segment_at_risk")]
    healthy = replace(losing, state="healthy", problem=False)
    assert findings.announcements([healthy], {"s": "at risk"}) == [(healthy, "segment_recovered")]
    assert findings.announcements([healthy], {}) == []  # first seen healthy: nothing to say
    unknown = replace(healthy, state="unknown")
    assert findings.announcements([unknown], {"s": "losing"}) == []  # c gone: no recovery to claim


def test_alarms_load_and_template_changes_are_announced_by_their_own_events():
    opened = _finding(findings.ALARM, "open", True, "alarm:t")
    closed = replace(opened, state="closed")
    assert findings.announcements([opened], {}) == [(opened, "alarm_opened")]
    assert findings.announcements([closed], {"alarm:t": "open"}) == [(closed, "alarm_closed")]
    assert findings.announcements([closed], {}) == []  # an alarm first seen already closed
    losing = _finding(findings.LOAD, findings.LOSING_AT_LOAD, True, "load:v1")
    paying = replace(losing, state=findings.PAYING_AT_LOAD, problem=False)
    assert findings.announcements([losing], {}) == [(losing, "losing_at_load")]
    assert findings.announcements([paying], {"load:v1": findings.LOSING_AT_LOAD}) == [(paying, "recovered_at_load")]
    assert findings.announcements([paying], {}) == []
    hurt = _finding(findings.TEMPLATE_CHANGE, "hurt", True, "change:v2:t")
    assert findings.announcements([hurt], {}) == [(hurt, "template_change_hurt")]
    fine = replace(hurt, state="no detectable change", problem=False)
    assert findings.announcements([fine], {}) == []


def test_check_prints_the_problems_the_findings_hold(store, tmp_path, specmon_cmd):
    """The demo log as a user run: v2 loses at batch 1, the CUSUM alarms and the change hurt; `check` prints each
    problem finding's line, in order, and the segment lines say the verdict is at batch 1."""
    ingest_file(store, str(DEMO_LOG), run="prod")
    verdict = findings.gather(store)
    lines = [f.headline for f in verdict.problems]
    assert {f.kind for f in verdict.problems} >= {findings.SEGMENT, findings.ALARM, findings.TEMPLATE_CHANGE}
    r = subprocess.run([*specmon_cmd, "check", "--db", store.path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stdout.splitlines() == lines, r.stdout
    segment = next(f for f in verdict.problems if f.kind == findings.SEGMENT)
    assert "at batch 1 (payoff at load unknown" in segment.detail
