"""Findings as Alertmanager alerts (API v2, `POST /api/v2/alerts`), sent through the outbox.

A finding fires while it is a problem that still holds: a segment losing or at risk, a run losing or at risk at its
load, a drift alarm open, a template change that hurt. Alertmanager resolves an alert that is not posted again
within its resolve_timeout (5 minutes by default), so the watcher posts every firing alert again every
alert_resend seconds (default 60; specmon.follow.config); when the finding stops firing it posts the alert once
more with endsAt, which resolves it.
An alert is known to Alertmanager by its labels (alertname, run, template, kind, subject, severity): a finding that
moves from at risk to losing changes its severity, so the at-risk alert is resolved and the losing one fires.
"""
from __future__ import annotations

import urllib.parse
from datetime import datetime

import orjson

from specmon.analysis.sources import ALERTMANAGER
from specmon.core.segments import is_problem
from specmon.follow.outbox import Message, new_id
from specmon.verdicts import findings
from specmon.verdicts.findings import Finding

FIRING, RESOLVED = "firing", "resolved"
ALERT_NAMES = {
    findings.SEGMENT: "SpeculativeDecodingSegmentStatus",
    findings.LOAD: "SpeculativeDecodingPayoffAtLoad",
    findings.ALARM: "SpeculativeDecodingAcceptanceDrift",
    findings.TEMPLATE_CHANGE: "SpeculativeDecodingTemplateChange",
}


def fires(kind: str, state: str) -> bool:
    """Whether a finding of this kind in this state is a firing alert."""
    if kind == findings.SEGMENT:
        return is_problem(state)
    if kind == findings.LOAD:
        return state in (findings.LOSING_AT_LOAD, findings.AT_RISK_AT_LOAD)
    if kind == findings.ALARM:
        return state == "open"
    return kind == findings.TEMPLATE_CHANGE and state == "hurt"


def severity(state: str) -> str:
    """critical where speculation is measured to cost more than it saves, warning where it may."""
    return "critical" if state in ("losing", findings.LOSING_AT_LOAD) else "warning"


def alerts_url(base: str) -> str:
    """The API v2 alerts endpoint under an Alertmanager's base URL (http://host:9093)."""
    return urllib.parse.urljoin(base.rstrip("/") + "/", "api/v2/alerts")


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds") + "Z"


def _message(f: Finding, state: str, event: str, url: str, dashboard_url: str, now: datetime) -> Message:
    labels = {"alertname": ALERT_NAMES[f.kind], "run": f.run, "template": f.template or "-", "kind": f.kind,
              "subject": f.subject, "severity": severity(state)}
    alert: dict[str, object] = {
        "labels": labels,
        "annotations": {"summary": f"{f.tag}: run {f.run!r}, template {f.template or '-'!r}",
                        "description": f.headline},
    }
    if dashboard_url:
        alert["generatorURL"] = f"{dashboard_url.rstrip('/')}/{f.page}?run={urllib.parse.quote(f.run)}"
    if event == RESOLVED:
        alert["endsAt"] = _iso(now)
    return Message(new_id(), f.run, f.subject, event, ALERTMANAGER, alerts_url(url),
                   orjson.dumps([alert], option=orjson.OPT_SERIALIZE_NUMPY))


def changes(found: list[Finding], known: dict[str, str], url: str, dashboard_url: str,
            now: datetime) -> list[Message]:
    """The alerts to post for findings whose state changed since the last evaluation (known: subject -> state):
    the previous state's alert resolved where it fired and now does not or fires at another severity, and the new
    state's alert where it fires."""
    out = []
    for f in found:
        previous = known.get(f.subject)
        if previous == f.state:
            continue
        if previous is not None and fires(f.kind, previous) and (
                not fires(f.kind, f.state) or severity(previous) != severity(f.state)):
            out.append(_message(f, previous, RESOLVED, url, dashboard_url, now))
        if fires(f.kind, f.state):
            out.append(_message(f, f.state, FIRING, url, dashboard_url, now))
    return out


def firing(found: list[Finding], url: str, dashboard_url: str, now: datetime) -> list[Message]:
    """Every firing alert again (posted every alert_resend seconds, so that Alertmanager keeps it open)."""
    return [_message(f, f.state, FIRING, url, dashboard_url, now) for f in found if fires(f.kind, f.state)]
