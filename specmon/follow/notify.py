"""Notices: what the watcher tells a person when a finding opens or closes, logged and POSTed to a webhook."""
from __future__ import annotations

import queue
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

import orjson

from specmon.analysis import summary
from specmon.core.times import utc_now
from specmon.drift import alarms
from specmon.follow.config import Log
from specmon.store.database import Store


@dataclass(frozen=True)
class Notice:
    """One webhook document: what changed, for which run and template, and the figures behind it."""

    event: str  # alarm_opened, alarm_closed, segment_losing, segment_recovered
    run: str
    template: str
    status: str
    alpha: float | None
    alpha_lo: float | None
    alpha_hi: float | None
    break_even: float | None
    time: str  # ISO-8601 UTC
    link: str  # path of the dashboard page that shows it
    detail: str

    def as_json(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_SERIALIZE_NUMPY)

    def line(self) -> str:
        return f"{self.event}: run {self.run!r} template {self.template or '-'!r}: {self.detail}"


def _link(page: str, run: str, base: str) -> str:
    return f"{base.rstrip('/')}/{page}?run={urllib.parse.quote(run)}"


def notices_for(store: Store, run: str, dashboard_url: str = "") -> tuple[dict[str, str], list]:
    """The run's current alarm and status facts, keyed by subject, with what each would announce. The verdicts
    are the pages' and `check`'s own (c: measured, else declared for the run's watched sources).

    Returns (facts, candidates): facts maps a subject ("alarm:<change time>", "status:<template>") to its state,
    candidates are (subject, state, Notice) for the watcher to send where the state is new."""
    segments = summary.summarize(store, by="template", run=run, per_position=False)
    drift_result = alarms.analyse_run(store, run)  # on a connection of its own, then saves its state
    now = utc_now().isoformat() + "Z"
    facts: dict[str, str] = {}
    out: list[tuple[str, str, Notice]] = []
    for seg in segments:
        subject = f"status:{seg['template']}"
        losing = seg["status"] == "losing"
        facts[subject] = "losing" if losing else "not losing"
        detail = (f"alpha {seg['alpha']:.3f} [{seg['alpha_lo']:.3f}, {seg['alpha_hi']:.3f}] against break-even "
                  f"{seg['break_even_alpha']:.3f}" if seg.get("alpha") is not None and seg.get("break_even_alpha")
                  is not None else f"status {seg['status']}")
        out.append((subject, facts[subject], Notice(
            "segment_losing" if losing else "segment_recovered", run, seg["template"], seg["status"],
            seg.get("alpha"), seg.get("alpha_lo"), seg.get("alpha_hi"), seg.get("break_even_alpha"), now,
            _link("overview", run, dashboard_url), detail)))
    for alarm in drift_result.alarms:
        subject = f"alarm:{alarm.change_ts.isoformat()}"
        facts[subject] = "open" if alarm.open else "closed"
        seg = next((s for s in segments if s["template"] == alarm.template), {})
        out.append((subject, facts[subject], Notice(
            "alarm_opened" if alarm.open else "alarm_closed", run, alarm.template, seg.get("status", "unknown"),
            alarm.alpha_after, seg.get("alpha_lo"), seg.get("alpha_hi"), alarm.break_even, now,
            _link("drift", run, dashboard_url), alarm.describe())))
    return facts, out


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
