"""Notices: what the watcher tells a person when a finding opens or closes, logged and POSTed to a webhook (through
the outbox, specmon.follow.outbox)."""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

import orjson

from specmon.analysis.sources import WEBHOOK
from specmon.core.times import utc_now
from specmon.follow.outbox import Message, new_id
from specmon.verdicts.findings import Finding


@dataclass(frozen=True)
class Notice:
    """One webhook document: what changed (a finding's new state), for which run and template, and the figures;
    id is the same on every attempt to send it, so a receiver can drop a repeat."""

    id: str
    event: str  # specmon.verdicts.findings.EVENTS: segment_losing, segment_at_risk, segment_recovered, ...
    run: str
    template: str
    status: str  # the segment's status
    alpha: float | None
    alpha_lo: float | None
    alpha_hi: float | None
    break_even: float | None
    time: str  # ISO-8601 UTC
    link: str  # the dashboard page that shows it
    detail: str  # the finding in words, as `specmon check` prints it

    @staticmethod
    def of(finding: Finding, event: str, status: str, dashboard_url: str = "") -> Notice:
        link = f"{dashboard_url.rstrip('/')}/{finding.page}?run={urllib.parse.quote(finding.run)}"
        return Notice(new_id(), event, finding.run, finding.template, status, finding.alpha, finding.alpha_lo,
                      finding.alpha_hi, finding.break_even, utc_now().isoformat() + "Z", link, finding.headline)

    def as_json(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_SERIALIZE_NUMPY)

    def line(self) -> str:
        return f"{self.event}: run {self.run!r} template {self.template or '-'!r}: {self.detail}"


def webhook_message(notice: Notice, url: str, subject: str) -> Message:
    """The outbox row that POSTs the notice to the webhook (its id is the notice's)."""
    return Message(notice.id, notice.run, subject, notice.event, WEBHOOK, url, notice.as_json())
