"""Notices: what the watcher tells a person when a finding opens or closes, logged and POSTed to a webhook."""
from __future__ import annotations

import queue
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

import orjson

from specmon.core.times import utc_now
from specmon.follow.config import Log
from specmon.verdicts.findings import Finding


@dataclass(frozen=True)
class Notice:
    """One webhook document: what changed (a finding's new state), for which run and template, and the figures."""

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
        return Notice(event, finding.run, finding.template, status, finding.alpha, finding.alpha_lo,
                      finding.alpha_hi, finding.break_even, utc_now().isoformat() + "Z", link, finding.headline)

    def as_json(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_SERIALIZE_NUMPY)

    def line(self) -> str:
        return f"{self.event}: run {self.run!r} template {self.template or '-'!r}: {self.detail}"


class Webhook:
    """POSTs notices from a background thread, with retries; never blocks the caller."""

    def __init__(self, url: str, log: Log, attempts: int = 5, timeout_s: float = 10.0):
        self.url, self.log, self.attempts, self.timeout_s = url, log, attempts, timeout_s
        self._queue: queue.Queue[Notice | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="specmon-webhook", daemon=True)
        self._thread.start()

    def send(self, notice: Notice) -> None:
        self._queue.put(notice)

    def close(self, wait_s: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(wait_s)

    def _run(self) -> None:
        while (notice := self._queue.get()) is not None:
            delay = 0.5
            for attempt in range(1, self.attempts + 1):
                try:
                    req = urllib.request.Request(self.url, data=notice.as_json(), method="POST",
                                                 headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                        resp.read()
                    break
                except Exception as exc:  # a bad receiver must not end the thread
                    if attempt == self.attempts:
                        self.log(f"webhook {self.url}: gave up on {notice.event} for run {notice.run!r} after "
                                 f"{attempt} attempts ({exc})")
                    else:
                        time.sleep(delay)
                        delay = min(delay * 2, 10.0)
