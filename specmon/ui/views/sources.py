"""Sources: every source `specmon watch` follows, with when it last delivered data and what went wrong."""
from __future__ import annotations

import streamlit as st

from specmon.ui import data
from specmon.ui.widgets import guarded, table


@guarded
def render() -> None:
    st.title("Sources")
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
        ["status", "kind", "location", "run", "template", "last_data", "lag", "last_read", "rows", "last_error",
         "failing_since"]]
    table(shown, hide_index=True, use_container_width=True, column_config={
        "last_data": st.column_config.DatetimeColumn("last data (UTC)"),
        "last_read": st.column_config.DatetimeColumn("last read (UTC)"),
        "lag": st.column_config.NumberColumn("seconds since data"),
        "rows": st.column_config.NumberColumn("rows stored"),
        "failing_since": st.column_config.DatetimeColumn("failing since (UTC)"),
    })


render()
