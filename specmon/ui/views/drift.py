"""Drift: acceptance per template over time against its break-even line, with each bucket's status."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from specmon.core.settings import BUCKETS
from specmon.drift import calibration, detector
from specmon.ui import data
from specmon.ui.widgets import EMPTY, STATUS_BADGE, STATUS_COLOURS, demo_banner, guarded, md_text, table
from specmon.verdicts import findings


def buckets_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{
        "bucket": r["bucket_start"], "template": r["template"] or "(no template)", "alpha": r["alpha"],
        "lo": r["alpha_lo"], "hi": r["alpha_hi"], "break_even": r["break_even_alpha"], "status": r["status"],
        "tokens/step L": r["tokens_per_step"], "L 95% CI": (f"{r['tokens_per_step_lo']:.2f} – "
                                                            f"{r['tokens_per_step_hi']:.2f}"
                                                            if r["tokens_per_step_lo"] is not None else ""),
        "1 + g·c": r["break_even_tokens"], "status (i.i.d. alpha)": r["status_iid"],
        "steps": r["steps"], "requests": r["requests"]} for r in rows if r["alpha"] is not None])


def cusum_chart(w: pd.DataFrame, h: float) -> alt.Chart:
    line = alt.Chart(w).mark_line(color="#555").encode(
        x=alt.X("ts:T", title="time (UTC)"), y=alt.Y("W:Q", title="CUSUM statistic W"))
    threshold = alt.Chart(pd.DataFrame({"h": [h]})).mark_rule(color="#c62828", strokeDash=[4, 3]).encode(
        y="h:Q", tooltip=[alt.Tooltip("h:Q", format=".2f", title="alarm threshold h")])
    return (line + threshold).properties(height=160)


def drift_chart(df: pd.DataFrame, changes: pd.DataFrame, alarm_marks: pd.DataFrame,
                notes: pd.DataFrame) -> alt.Chart:
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
            x="first_ts:T", tooltip=["template", alt.Tooltip("first_ts:T", title="template first seen")])
    if not notes.empty:
        layers += alt.Chart(notes).mark_rule(strokeDash=[2, 4], color="#1565c0", strokeWidth=2).encode(
            x="starts_at:T", tooltip=["template", alt.Tooltip("starts_at:T", title="annotated rollout"), "note"])
    if not alarm_marks.empty:
        layers += alt.Chart(alarm_marks).mark_rect(color="#c62828", opacity=0.15).encode(
            x="change_lo_ts:T", x2="change_hi_ts:T")
        layers += alt.Chart(alarm_marks).mark_rule(color="#c62828", strokeWidth=2).encode(
            x="change_ts:T", tooltip=[alt.Tooltip("change_ts:T", title="estimated change"),
                                      alt.Tooltip("change_lo_ts:T", title="likely from"),
                                      alt.Tooltip("change_hi_ts:T", title="likely to"),
                                      alt.Tooltip("alarm_ts:T", title="alarm"), "alarms"])
        layers += alt.Chart(alarm_marks).mark_point(shape="triangle-down", size=150, filled=True,
                                                    color="#c62828").encode(x="alarm_ts:T", y=alt.value(8))
    return layers.properties(height=260)


@guarded
def render() -> None:
    st.title("Drift")
    st.caption("Each point is one time bucket of one template: alpha with its 95% interval (widened for "
               "correlation within requests, or between neighbouring engine windows). Red dashed line: the alpha at "
               "which the bucket breaks even at its k and c, from its own per-position profile (every position's "
               "rate scaled by one factor until L = 1 + g·c), or the i.i.d. alpha* where a position went uncounted. "
               "A point's colour is its status: tokens per step L's 95% interval against 1 + g·c (healthy above, "
               "losing below, at risk across), which assumes nothing about how acceptance varies along the draft; "
               "the table below has both, and alpha's status under the i.i.d. assumption.")
    runs = data.run_names()
    if not runs:
        st.info(EMPTY)
        return
    asked = st.query_params.get("run")  # links from webhooks name the run: /drift?run=NAME
    run = st.selectbox("Run", runs, index=runs.index(asked) if asked in runs else 0, key="drift_run")
    bucket = st.radio("bucket", list(BUCKETS), index=list(BUCKETS).index("6 hours"), horizontal=True,
                      key="drift_bucket")
    rows = data.summaries(run=run, bucket=bucket)
    demo_banner(rows)
    df = buckets_frame(rows)
    if df.empty:
        st.info("This run has no steps with acceptance to show.")
        return
    changes = data.template_changes(run)
    result = data.drift(run)
    st.subheader("Alarms")
    if result.design is None:
        st.info(f"No drift detector for this run: {result.note}. The per-bucket status above the break-even line "
                "still applies.")
    else:
        d = result.design
        sizes = detector.checkpoints(detector.first_reference(d.unit), d.unit)
        grown = (f" The reference grows with the run: p0, p1 and h are calibrated again on the first "
                 f"{sizes[0]:,}, {sizes[1]:,}, ... {sizes[-1]:,} {d.unit} as the run reaches them (each once no alarm "
                 f"has come for {detector.EPISODE_GAP:,} {d.unit}; the CUSUM restarts there, and the stretches before "
                 "the last one were watched against their own h).")
        resampled = (f"{d.clusters:,} requests" + (
            f" by hour of day (it covers a day; pooled where an hour of day holds fewer than "
            f"{calibration.MIN_HOUR_REQUESTS} of them)" if detector.covers_a_day(d.reference_hours) else "")
                     if d.unit == "steps" else
                     f"{d.clusters:,} 10-minute blocks of windows (by hour of day once it covers every hour), each "
                     "moved as a whole by a kernel"
                     if d.clusters >= calibration.MIN_BLOCKS else
                     f"{d.reference:,} windows one by one (they fill fewer than {calibration.MIN_BLOCKS} blocks)")
        lead = "" if d.states_a_rate else " Read an alarm as a lead to check, not a measured risk."
        st.caption(f"One-sided Bernoulli CUSUM over {d.unit} from the reference acceptance p0 = {d.p0:.3f} (the "
                   f"run's first {d.reference:,} {d.unit}) towards p1 = {d.p1:.3f}; {d.threshold_words()}.{lead} "
                   f"The dashed line below is h; its calibration resamples the reference's {resampled} (design "
                   f"effect {d.design_effect:.2f}).{grown} A drop "
                   "is dated by maximum likelihood; the shaded band is its likely range, blue dotted lines are "
                   "annotated rollouts (`specmon annotate`), black dashed lines templates first seen in the data.")
    found = findings.drift_findings([result], rows)
    for f in found:
        if f.kind == findings.ALARM:
            (st.error if f.state == "open" else st.warning)(("**Open:** " if f.state == "open" else "**Closed:** ")
                                                            + md_text(f.detail))
    if result.design is not None and not result.alarms:
        st.success("No drift alarm in this run.")
    for f in found:
        if f.kind == findings.TEMPLATE_CHANGE:
            label = "Annotated rollout" if f.facts["source"] == "annotation" else "Template change"
            (st.error if f.problem else st.info)(f"**{label}.** {md_text(f.detail)}")
    marks = pd.DataFrame([{"change_ts": a.change_ts, "change_lo_ts": a.change_lo_ts, "change_hi_ts": a.change_hi_ts,
                           "alarm_ts": a.alarm_ts, "alarms": a.alarms} for a in result.alarms],
                         columns=["change_ts", "change_lo_ts", "change_hi_ts", "alarm_ts", "alarms"])
    notes = pd.DataFrame([{"starts_at": e.ts, "template": e.template, "note": e.note or ""}
                          for e in result.annotations], columns=["starts_at", "template", "note"])
    st.subheader("Acceptance against break-even")
    for template, part in df.groupby("template", sort=False):
        latest = part.iloc[-1]
        st.markdown(f"**Template {md_text(template)}** — latest bucket: {STATUS_BADGE[latest['status']]}")
        st.altair_chart(drift_chart(part, changes, marks, notes), width="stretch")
    if result.design is not None:
        st.markdown("**Detector statistic**")
        st.altair_chart(cusum_chart(result.cusum, result.design.h), width="stretch")
    st.caption("Status: tokens per step L (with its 95% interval) against 1 + g·c (g the mean draft "
               "length), which assumes nothing about how acceptance varies along the draft. The i.i.d. status "
               "compares alpha with the i.i.d. model's alpha*, a diagnostic: where acceptance falls with the draft "
               "position it leans towards losing, the more so the more data.")
    table(df.assign(status=df["status"].map(STATUS_BADGE),
                    **{"status (i.i.d. alpha)": df["status (i.i.d. alpha)"].map(STATUS_BADGE)}),
          missing="unknown", hide_index=True, width="stretch")


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
