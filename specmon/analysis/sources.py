"""The watched sources' health as the dashboard shows it: when each last delivered data, and whether it is stale;
and the watcher's outbox (specmon.follow.outbox): what waits to be sent, and what was given up."""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from specmon.core.settings import DEFAULT_STALE_AFTER_S
from specmon.core.times import utc_now
from specmon.store.database import Store


def watched_sources(store: Store):
    """Every watched source as stored (kind, location, run, template, status, last read, last data, rows, last
    error, failing since, stale_after_s, failed reads), as a DataFrame; `source_health` judges it."""
    return store.query_df(
        "SELECT kind, location, run, template, status, last_read, last_data, rows, last_error, failing_since, "
        "stale_after_s, failures FROM watch_sources ORDER BY kind, location")


def source_health(sources, now: datetime | None = None):
    """Add lag_s (seconds since the source last delivered data, else since it was last read) and mark a source
    that reads fine but has delivered nothing for longer than its stale_after_s as stale."""
    now = now or utc_now()
    df = sources.copy()
    if df.empty:
        return df.assign(lag_s=pd.Series(dtype=float))
    last = df["last_data"].fillna(df["last_read"])
    df["lag_s"] = (pd.Timestamp(now) - last).dt.total_seconds()
    stale = (df["status"] == "ok") & (df["lag_s"] > df["stale_after_s"].fillna(DEFAULT_STALE_AFTER_S))
    df.loc[stale, "status"] = "stale"
    return df


# The outbox's channels: a webhook's JSON documents, Alertmanager's alerts.
WEBHOOK, ALERTMANAGER = "webhook", "alertmanager"
CHANNELS = (WEBHOOK, ALERTMANAGER)


def outbox_counts(store: Store) -> list[tuple[str, int, int]]:
    """(channel, rows pending, rows undeliverable) for each channel."""
    got = {ch: (int(p), int(u)) for ch, p, u in store.query(
        "SELECT channel, count(*) FILTER (WHERE delivered_at IS NULL AND gave_up_at IS NULL), "
        "count(*) FILTER (WHERE gave_up_at IS NOT NULL) FROM outbox GROUP BY channel")}
    return [(ch, *got.get(ch, (0, 0))) for ch in CHANNELS]


def undeliverable(store: Store):
    """The outbox rows given up, newest first, as a DataFrame."""
    return store.query_df("SELECT channel, receiver, run, event, created_at, attempts, gave_up_at, last_error "
                          "FROM outbox WHERE gave_up_at IS NOT NULL ORDER BY gave_up_at DESC")
