"""Drift: acceptance per template over time against its break-even line, with each bucket's status."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from specmon.summary import BUCKETS
from specmon.ui import data
from specmon.ui.widgets import EMPTY, STATUS_BADGE, STATUS_COLOURS, demo_banner, guarded


def buckets_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{
        "bucket": r["bucket_start"], "template": r["template"] or "(no template)", "alpha": r["alpha"],
        "lo": r["alpha_lo"], "hi": r["alpha_hi"], "break_even": r["break_even_alpha"], "status": r["status"],
        "steps": r["steps"], "requests": r["requests"]} for r in rows if r["alpha"] is not None])


def drift_chart(df: pd.DataFrame, changes: pd.DataFrame) -> alt.Chart:
    x = alt.X("bucket:T", title="time (UTC)")
    y = alt.Y("lo:Q", title="per-token acceptance alpha", scale=alt.Scale(domain=[0, 1]))
    band = alt.Chart(df).mark_area(opacity=0.15, color="#555").encode(x=x, y=y, y2="hi:Q")
    line = alt.Chart(df).mark_line(color="#555").encode(x=x, y="alpha:Q")
    points = alt.Chart(df).mark_point(filled=True, size=60).encode(
        x=x, y="alpha:Q",
        color=alt.Color("status:N", scale=alt.Scale(domain=list(STATUS_COLOURS), range=list(STATUS_COLOURS.values()))),
        tooltip=[alt.Tooltip("bucket:T"), alt.Tooltip("alpha:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f"),
                 alt.Tooltip("hi:Q", format=".3f"), alt.Tooltip("break_even:Q", format=".3f"), "status", "steps",
                 "requests"])
    be = alt.Chart(df.dropna(subset=["break_even"])).mark_line(strokeDash=[2, 2], color="#c62828").encode(
        x=x, y="break_even:Q")
    layers = band + line + be + points
    if not changes.empty:
        layers += alt.Chart(changes).mark_rule(strokeDash=[6, 3], color="black").encode(
            x="first_ts:T", tooltip=["template", alt.Tooltip("first_ts:T", title="first step")])
    return layers.properties(height=260)


@guarded
def render() -> None:
    st.title("Drift")
    st.caption("Each point is one time bucket of one template: alpha with its 95% interval (widened for "
               "correlation within requests). Red dashed line: break-even alpha* for the bucket's k and c. "
               "Healthy: the whole interval is above it; losing: below it; at risk: it straddles it.")
    runs = data.run_names()
    if not runs:
        st.info(EMPTY)
        return
    run = st.selectbox("Run", runs, key="drift_run")
    bucket = st.radio("bucket", list(BUCKETS), index=list(BUCKETS).index("6 hours"), horizontal=True,
                      key="drift_bucket")
    rows = data.summaries(run=run, bucket=bucket)
    demo_banner(rows)
    df = buckets_frame(rows)
    if df.empty:
        st.info("This run has no steps with acceptance to show.")
        return
    changes = data.template_changes(run)
    for template, part in df.groupby("template", sort=False):
        latest = part.iloc[-1]
        st.markdown(f"**Template {template}** — latest bucket: {STATUS_BADGE[latest['status']]}")
        st.altair_chart(drift_chart(part, changes), width="stretch")
    st.dataframe(df.assign(status=df["status"].map(STATUS_BADGE)), hide_index=True, width="stretch")


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
