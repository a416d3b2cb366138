"""The watcher's outbox: every document to send (a webhook notice, an Alertmanager alert) is a row of the `outbox`
table, written in the transaction that records the finding's new state, and sent from there by a delivery thread
until its receiver accepts it (any 2xx answer).

A failed attempt (an error answer, a refused connection, no answer within the request timeout) is retried after a
back-off that doubles from first_retry_s up to max_retry_s. Rows stay in the database, so a watcher stopped or
killed before a row went out sends it after its restart: delivery is at least once, and each row keeps its id
(a webhook document carries it) so that a receiver can drop a repeat. A row still undelivered max_age_s after it
was written is given up: marked undeliverable, logged, and counted on the Sources page and in /metrics.
The thread holds no database connection while it waits on a receiver, so a receiver that hangs delays neither the
polls nor a shutdown; the row it was sending stays pending.
"""
from __future__ import annotations

import http.client
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import duckdb

from specmon.core.faults import SpecmonError
from specmon.core.times import utc_now
from specmon.follow.config import DEFAULT_OUTBOX_MAX_AGE_S, Log
from specmon.follow.http_client import http_request
from specmon.store.database import Store

DEFAULT_REQUEST_TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 1 << 20  # a receiver's answer is read (and dropped) up to this size
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 300.0
# The thread looks at the table at least this often (another watcher process may have left rows), and a pass
# sends at most this many rows before it looks again.
_IDLE_S = 30.0
_BATCH = 100


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Message:
    """One document to POST: to which receiver, about which run and finding, and its bytes as sent."""

    id: str
    run: str
    subject: str
    event: str
    channel: str  # WEBHOOK or ALERTMANAGER
    receiver: str  # the URL POSTed to
    body: bytes  # JSON


def put(cur: duckdb.DuckDBPyConnection, messages: list[Message], now: datetime, unless_pending: bool = False) -> None:
    """Inside the caller's transaction: queue messages for delivery now. unless_pending: skip a message where one
    of the same receiver, run, subject and event is still waiting (a re-post of a state already on its way)."""
    for m in messages:
        if unless_pending and cur.execute(
                "SELECT count(*) FROM outbox WHERE receiver = ? AND run = ? AND subject = ? AND event = ? "
                "AND delivered_at IS NULL AND gave_up_at IS NULL", [m.receiver, m.run, m.subject, m.event]
        ).fetchall()[0][0]:
            continue
        cur.execute("INSERT INTO outbox (id, run, subject, event, channel, receiver, body, created_at, "
                    "next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [m.id, m.run, m.subject, m.event, m.channel, m.receiver, m.body.decode(), now, now])


def pending(store: Store) -> bool:
    return bool(store.query("SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND gave_up_at IS NULL")[0][0])


def post(url: str, body: bytes, timeout_s: float) -> str | None:
    """POST a JSON body, all of it (connecting, sending, the answer) within timeout_s; None where the receiver
    accepted it (2xx), else what went wrong."""
    try:
        status, _ = http_request(url, timeout_s, url, MAX_ANSWER_BYTES, "a receiver should answer briefly",
                                 asked="delivery", deadline="the delivery timeout", json_body=body)
    except SpecmonError as exc:  # refused, reset, no complete answer in time, a malformed URL, a huge answer
        return str(exc).removeprefix(f"{url}: ")
    return None if 200 <= status < 300 else f"HTTP {status} {http.client.responses.get(status, '')}".rstrip()


class Outbox:
    """Sends the outbox's pending rows from a background thread until close()."""

    def __init__(self, store: Store, log: Log, max_age_s: float = DEFAULT_OUTBOX_MAX_AGE_S,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, first_retry_s: float = FIRST_RETRY_S,
                 max_retry_s: float = MAX_RETRY_S):
        self.store, self.log, self.max_age_s = store, log, max_age_s
        self.request_timeout_s, self.first_retry_s, self.max_retry_s = request_timeout_s, first_retry_s, max_retry_s
        self._wake, self._closing = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="specmon-outbox", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New rows were committed: send them now."""
        self._wake.set()

    def close(self, wait_s: float = 3.0) -> None:
        """One last pass over what is due, for at most wait_s; whatever is not sent by then stays pending (the
        thread is a daemon: a receiver that hangs does not hold the process)."""
        self._closing.set()
        self._wake.set()
        self._thread.join(wait_s)

    def _run(self) -> None:
        failing = False
        while True:
            closing = self._closing.is_set()  # seen before the pass: the pass then sends what close() left
            try:
                wait = self.deliver_due()
                failing = False
            except SpecmonError as exc:  # the database is locked or gone for now: try again later
                if not failing:
                    self.log(f"outbox: cannot read the pending notices ({exc})")
                failing, wait = True, 5.0
            if closing:
                return
            self._wake.wait(wait)
            self._wake.clear()

    def deliver_due(self) -> float:
        """Send every row that is due (oldest first); returns the seconds until the next one is."""
        now = utc_now()
        rows = self.store.query(
            "SELECT id, run, event, channel, receiver, body, created_at, attempts FROM outbox WHERE delivered_at IS "
            "NULL AND gave_up_at IS NULL AND next_attempt_at <= ? ORDER BY created_at, id LIMIT ?", [now, _BATCH])
        for row_id, run, event, channel, receiver, body, created_at, attempts in rows:
            if self._closing.is_set() and utc_now() - now > timedelta(seconds=1):
                break  # closing: what is left waits for the next start
            age_s = (utc_now() - created_at).total_seconds()
            if age_s > self.max_age_s:
                self._give_up(row_id, run, event, channel, receiver, attempts)
                continue
            error = post(receiver, body.encode(), self.request_timeout_s)
            self._record(row_id, attempts + 1, error)
        with self.store.transaction() as cur:  # delivered rows are kept for as long as pending ones may be
            cur.execute("DELETE FROM outbox WHERE delivered_at < ?", [now - timedelta(seconds=self.max_age_s)])
        if len(rows) == _BATCH:
            return 0.0
        due = self.store.query("SELECT min(next_attempt_at) FROM outbox WHERE delivered_at IS NULL AND gave_up_at "
                               "IS NULL")[0][0]
        if due is None:
            return _IDLE_S
        return min(max((due - utc_now()).total_seconds(), 0.0), _IDLE_S)

    def _record(self, row_id: str, attempts: int, error: str | None) -> None:
        now = utc_now()
        with self.store.transaction() as cur:
            if error is None:
                cur.execute("UPDATE outbox SET attempts = ?, delivered_at = ?, last_error = NULL WHERE id = ?",
                            [attempts, now, row_id])
                return
            backoff = min(self.first_retry_s * 2 ** (attempts - 1), self.max_retry_s)
            cur.execute("UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                        [attempts, now + timedelta(seconds=backoff), error, row_id])

    def _give_up(self, row_id: str, run: str, event: str, channel: str, receiver: str, attempts: int) -> None:
        with self.store.transaction() as cur:
            cur.execute("UPDATE outbox SET gave_up_at = ? WHERE id = ?", [utc_now(), row_id])
            error = cur.execute("SELECT last_error FROM outbox WHERE id = ?", [row_id]).fetchall()[0][0]
        self.log(f"{channel} {receiver}: gave up on {event} for run {run!r} ({row_id}) after {attempts} attempt(s) "
                 f"over {self.max_age_s:g} s (last: {error or 'never sent'}); it is shown as undeliverable")
