"""`specmon watch`: follow a running deployment's sources, polling each every interval, until stopped.

A source that fails (file gone, server down, a bad line) is retried with back-off and shown as failing; the others
go on. After each poll that stored data, the run's findings (specmon.verdicts) are gathered again and what changed
is announced (specmon.follow.notify, specmon.follow.alertmanager) through the outbox (specmon.follow.outbox).
"""
from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field

from specmon.core.faults import SpecmonError
from specmon.core.times import utc_now
from specmon.follow import alertmanager, outbox
from specmon.follow.config import Log, SourceConfig, WatchConfig, distinct_sources
from specmon.follow.notify import Notice, webhook_message
from specmon.follow.polls import PollResult, SourceStopped, poll_inbox, poll_log, poll_prometheus, poll_steplog
from specmon.follow.positions import mark, register
from specmon.follow.scrape import poll_scrape
from specmon.store.database import Store
from specmon.verdicts import findings

_MAX_BACKOFF_S = 60.0


@dataclass
class _SourceState:
    failures: int = 0
    next_try: float = 0.0
    inbox_seen: dict = field(default_factory=dict)


class Watcher:
    """Polls every source each interval until stop() (or SIGTERM / Ctrl-C through run_until_signalled)."""

    def __init__(self, store: Store, config: WatchConfig, log: Log = print):
        if not config.sources:
            raise SpecmonError("nothing to watch: name a --log, --steplog, --inbox, --prometheus or --scrape, or a "
                               "--config")
        self.store, self.config, self.log = store, config, log
        config.sources = distinct_sources(config.sources, log)
        self._stop = threading.Event()
        self._states = {s.key: _SourceState() for s in config.sources}
        self._unannounced: set[str] = set()  # runs with new data since their last evaluation
        self._announced_at: dict[str, float] = {}
        self._firing: dict[str, list[findings.Finding]] = {}  # per run, its findings firing as alerts
        self._reposted_at: dict[str, float] = {}
        for source in config.sources:
            register(store, source, config.stale_after_s)
        # Notices go out through the outbox; it also runs where an earlier watcher left rows undelivered.
        self.outbox = (outbox.Outbox(store, log, config.outbox_max_age_s)
                       if config.webhook or config.alertmanager or outbox.pending(store) else None)
        if config.alertmanager:  # what fires is posted again from the start (Alertmanager forgets it otherwise)
            self._unannounced |= {s.run_name for s in config.sources}

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> bool:
        """One pass over the sources that are due; returns whether any source has a backlog left. Runs that got
        data are evaluated for alarms at most every alarm_every_s."""
        more = False
        for source in self.config.sources:
            state = self._states[source.key]
            if time.monotonic() < state.next_try or self._stop.is_set():
                continue
            try:
                with self.store.writing():  # one connection for the whole poll; the file is free between polls
                    result = self._poll(source, state)
            except Exception as exc:  # one failing source must not stop the others
                self._failed(source, state, exc)
                continue
            if state.failures:
                self.log(f"{source.key}: delivering again")
            state.failures, state.next_try = 0, 0.0
            more |= result.more
            if result.rows:
                self._unannounced.add(source.run_name)
        for run in sorted(self._unannounced):
            if time.monotonic() - self._announced_at.get(run, -1e9) >= self.config.alarm_every_s:
                self._unannounced.discard(run)
                self._announced_at[run] = time.monotonic()
                try:
                    self._announce(run)
                except SpecmonError as exc:  # a full disk while saving what was announced: said, and the watch goes on
                    self.log(f"run {run!r}: could not save the notices ({exc})")
        self._repost_firing()
        return more

    def _poll(self, source: SourceConfig, state: _SourceState) -> PollResult:
        if source.kind == "log":
            return poll_log(self.store, source, self.log)
        if source.kind == "steplog":
            return poll_steplog(self.store, source, self.log)
        if source.kind == "inbox":
            return poll_inbox(self.store, source, self.log, state.inbox_seen)
        if source.kind == "scrape":
            return poll_scrape(self.store, source, self.log)
        return poll_prometheus(self.store, source, self.log)

    def _failed(self, source: SourceConfig, state: _SourceState, exc: Exception) -> None:
        state.failures += 1
        backoff = min(self.config.interval_s * 2 ** state.failures, _MAX_BACKOFF_S)
        state.next_try = time.monotonic() + backoff
        message = str(exc) if isinstance(exc, SpecmonError) else f"{type(exc).__name__}: {exc}"
        if state.failures == 1 or state.failures % 10 == 0:
            self.log(f"{source.key}: failing: {message} (retry in {backoff:.0f} s)")
        try:
            mark(self.store, source, "stopped" if isinstance(exc, SourceStopped) else "failing", message, utc_now())
        except SpecmonError as db_exc:
            self.log(f"{source.key}: could not record the failure ({db_exc})")

    def _announce(self, run: str) -> None:
        """Send what changed since the last announcement for this run (remembered in the database, so a
        restarted watcher does not repeat itself). The findings are `specmon check`'s own (c: measured, else
        declared for the run's watched sources). The notices are written to the outbox in the transaction that
        records the findings' new states: a notice is sent if and only if its state change is recorded."""
        try:  # the analysis reads (the dashboard reads beside it), then saves the detector's state in a short write
            verdict = findings.gather(self.store, run=run)
            known = dict(self.store.query("SELECT subject, state FROM watch_notices WHERE run = ?", [run]))
        except SpecmonError as exc:
            self.log(f"run {run!r}: could not evaluate alarms ({exc})")
            return
        self._firing[run] = [f for f in verdict.findings if alertmanager.fires(f.kind, f.state)]
        if not verdict.findings:
            return
        status = {r["template"]: r["status"] for r in verdict.segments}
        fresh = [(f, Notice.of(f, event, status.get(f.template, "unknown"), self.config.dashboard_url))
                 for f, event in findings.announcements(verdict.findings, known)]
        now = utc_now()
        messages = [webhook_message(n, self.config.webhook, f.subject) for f, n in fresh] if self.config.webhook else []
        if self.config.alertmanager:
            messages += alertmanager.changes(verdict.findings, known, self.config.alertmanager,
                                             self.config.dashboard_url, now)
        with self.store.transaction() as cur:
            for f in verdict.findings:
                cur.execute("INSERT INTO watch_notices VALUES (?, ?, ?, ?) ON CONFLICT (run, subject) DO UPDATE "
                            "SET state = excluded.state, changed_at = excluded.changed_at "
                            "WHERE watch_notices.state <> excluded.state", [run, f.subject, f.state, now])
            outbox.put(cur, messages, now)
        if messages:
            self._reposted_at[run] = time.monotonic()
        for _, notice in fresh:
            self.log(notice.line())
        if self.outbox and messages:
            self.outbox.wake()

    def _repost_firing(self) -> None:
        """Post every run's firing alerts again every alert_resend_s (one already waiting in the outbox is not
        queued twice)."""
        if not self.config.alertmanager or not self.outbox:
            return
        for run, found in self._firing.items():
            if not found or time.monotonic() - self._reposted_at.get(run, -1e9) < self.config.alert_resend_s:
                continue
            self._reposted_at[run] = time.monotonic()
            now = utc_now()
            try:
                with self.store.transaction() as cur:
                    outbox.put(cur, alertmanager.firing(found, self.config.alertmanager, self.config.dashboard_url,
                                                        now), now, unless_pending=True)
            except SpecmonError as exc:
                self.log(f"run {run!r}: could not queue its firing alerts ({exc})")
                continue
            self.outbox.wake()

    def run(self) -> None:
        """Poll until stopped; a poll in hand is finished first."""
        self.log(f"watching {len(self.config.sources)} source(s) every {self.config.interval_s:g} s into "
                 f"{self.store.path}")
        while not self._stop.is_set():
            more = self.poll_once()
            if not more:
                self._stop.wait(self.config.interval_s)
        for run in sorted(self._unannounced):  # what arrived since the last evaluation
            self._announce(run)
        if self.outbox:  # what is not sent within a few seconds stays pending for the next start
            self.outbox.close()
        self.log("stopped")

    def run_until_signalled(self) -> None:
        """run(), stopping cleanly on SIGTERM or SIGINT (the batch in hand is finished and committed)."""
        def stop(signum, frame):
            self.log(f"{signal.Signals(signum).name}: finishing the batch in hand")
            self.stop()
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
