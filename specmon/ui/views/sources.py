"""Sources: every source `specmon watch` follows, with when it last delivered data and what went wrong."""
from __future__ import annotations

import streamlit as st

from specmon.ui import data
from specmon.ui.widgets import guarded, table


def outbox_state() -> None:
    """What the watcher could not deliver (given up after its outbox age), and what waits to be sent."""
    counts, given_up = data.outbox()
    waiting = ", ".join(f"{p} to {ch}" for ch, p, _ in counts if p)
    if waiting:
        st.caption(f"Notices waiting to be sent (retried with back-off until the receiver accepts): {waiting}.")
    if given_up.empty:
        return
    st.error(f"{len(given_up)} notice(s) undeliverable: the receiver did not accept them within the outbox age "
             "(`outbox_max_age` in the watch configuration, default 24 h).")
    table(given_up, hide_index=True, use_container_width=True, column_config={
        "created_at": st.column_config.DatetimeColumn("written (UTC)"),
        "gave_up_at": st.column_config.DatetimeColumn("given up (UTC)"),
        "last_error": st.column_config.TextColumn("last error"),
    })


@guarded
def render() -> None:
    st.title("Sources")
    outbox_state()
    health = data.sources()
    if health.empty:
        st.info("No source is watched yet. Follow a running deployment with `specmon watch --log "
                "/var/log/vllm/server.log --c 0.1` (or `--steplog`, `--inbox DIR`, `--prometheus URL`, or a "
                "`--config` file), or start the dashboard with `specmon serve --watch FILE`; its sources appear "
                "here with when each last delivered data.")
        return
    st.caption("A source is **stale** when it has delivered no data for longer than its stale_after "
               "(`specmon watch --stale-after`, default 300 s); **failing** when reading it fails (it is retried "
               "with back-off); **stopped** at a bad line (watch it with `--skip-bad` to skip such lines).")
    shown = health.assign(lag=health["lag_s"].round(1))[
        ["status", "kind", "location", "run", "template", "last_data", "lag", "last_read", "rows", "failures",
         "last_error", "failing_since"]]
    table(shown, hide_index=True, use_container_width=True, column_config={
        "last_data": st.column_config.DatetimeColumn("last data (UTC)"),
        "last_read": st.column_config.DatetimeColumn("last read (UTC)"),
        "lag": st.column_config.NumberColumn("seconds since data"),
        "rows": st.column_config.NumberColumn("rows stored"),
        "failures": st.column_config.NumberColumn("failed reads"),
        "failing_since": st.column_config.DatetimeColumn("failing since (UTC)"),
    })


render()
