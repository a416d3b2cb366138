"""Overview: every segment with its status, acceptance interval, prediction and break-even."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from specmon.core import display
from specmon.core.segments import why_unknown
from specmon.ui import data
from specmon.ui.widgets import (
    EMPTY,
    STATUS_BADGE,
    STATUS_COLOURS,
    demo_banner,
    guarded,
    md_text,
    segment_label,
    sentence,
    table,
)
from specmon.verdicts import findings


def segments_frame(rows: list[dict]) -> pd.DataFrame:
    """The Overview table: one row per segment, numbers rounded for reading, nothing recomputed."""
    return pd.DataFrame([{
        "run": r["run"],
        "template": r["template"] or "(no template)",
        "status": STATUS_BADGE[r["status"]],
        "alpha": r["alpha"],
        "alpha 95% CI": display.interval(r["alpha_lo"], r["alpha_hi"], style=display.PAGE, missing=""),
        "predicted beta": display.beta(r["beta"], r["beta_lo"], r["beta_hi"], display.PAGE, missing="not logged"),
        "tokens/step L": r["tokens_per_step"],
        "k": r["k"],
        "c": r["c"],
        "break-even alpha*": r["break_even_alpha"],
        "speedup (measured)": r["speedup_measured"],
        "speedup (i.i.d. model)": r["speedup_iid"],
        "steps": r["steps"],
        "last step (UTC)": r["last_ts"],
        "last ingest (UTC)": r["last_ingest"],
    } for r in rows])


def acceptance_chart(rows: list[dict]) -> alt.Chart:
    """Each segment's alpha with its interval, and its break-even as a tick."""
    df = pd.DataFrame([{
        "segment": segment_label(r), "alpha": r["alpha"], "lo": r["alpha_lo"],
        "hi": r["alpha_hi"], "break_even": r["break_even_alpha"], "status": r["status"]} for r in rows])
    # The legend above the chart: beside it, a chart of one or two segments (40 px a row) clipped its last entries.
    colour = alt.Color("status:N", scale=alt.Scale(domain=list(STATUS_COLOURS), range=list(STATUS_COLOURS.values())),
                       legend=alt.Legend(orient="top"))
    y = alt.Y("segment:N", title=None, axis=alt.Axis(labelLimit=400))
    bars = alt.Chart(df).mark_rule(strokeWidth=3).encode(
        x=alt.X("lo:Q", title="per-token acceptance alpha (95% CI)", scale=alt.Scale(domain=[0, 1])), x2="hi:Q",
        y=y, color=colour)
    points = alt.Chart(df).mark_point(filled=True, size=80).encode(
        x="alpha:Q", y=y, color=colour, tooltip=["segment", alt.Tooltip("alpha:Q", format=".3f"),
                                                 alt.Tooltip("lo:Q", format=".3f"), alt.Tooltip("hi:Q", format=".3f"),
                                                 alt.Tooltip("break_even:Q", format=".3f", title="break-even alpha*")])
    ticks = alt.Chart(df.dropna(subset=["break_even"])).mark_tick(color="black", thickness=2, size=24).encode(
        x="break_even:Q", y=y, tooltip=[alt.Tooltip("break_even:Q", format=".3f", title="break-even alpha*")])
    return (bars + points + ticks).properties(height=alt.Step(40))


@guarded
def render() -> None:
    st.title("Is speculative decoding paying off?")
    rows = data.summaries()
    if not rows:
        st.info(EMPTY)
        return
    demo_banner(rows)
    curves = data.load_curves()
    problems = [f for f in findings.segment_findings(rows, curves) if f.problem]
    cols = st.columns(3)
    cols[0].metric("segments", len(rows))
    cols[1].metric("losing or at risk", len(problems))
    cols[2].metric("steps", f"{sum(r['steps'] for r in rows):,}")
    for f in problems:  # the words `check` prints and the webhooks send: the status is L's, alpha's a diagnostic
        st.error(f"**{sentence(f.state)}.** {md_text(f.detail)}")
    at_load = {f.run: f for f in findings.load_findings(curves)}
    for curve in curves:
        if not curve.known:
            continue
        found = at_load.get(curve.run)
        text = f"**{md_text(curve.run)}**: {md_text(findings.at_load(curve))}. See the Load page."
        (st.error if found is not None and found.state == findings.LOSING_AT_LOAD else
         st.warning if found is not None and found.problem else st.info)(text)
    if rows and not any(c.known for c in curves):
        st.caption("Statuses here are at batch 1 (verifying k + 1 tokens costs one target step). Whether speculation "
                   "pays at your load is unknown until a baseline without speculation is measured: see the Load page.")
    for r in rows:
        if r["status"] == "unknown":
            st.info(f"**{md_text(segment_label(r))}** cannot be judged: {why_unknown(r)}."
                    + (" Give c with `specmon summary --c` or `specmon watch --c`, or try one on the Economics page."
                       if r["c"] is None else ""))
    st.altair_chart(acceptance_chart(rows), width="stretch")
    st.caption("Point: per-token acceptance alpha (accepted / checked positions); bar: its 95% interval, widened "
               "for correlation within a request (engine windows: between neighbouring windows). Black tick: "
               "break-even alpha*, the acceptance at which the segment's own per-position profile, lowered alike at "
               "every position, just pays for its k and c (the i.i.d. formula where no profile is logged). Colour: "
               "the status, from the interval of tokens per step L against 1 + g c; alpha against alpha* is a "
               "diagnostic that assumes the profile keeps its shape.")
    table(segments_frame(rows), missing="unknown", hide_index=True, width="stretch", column_config={
        "alpha": st.column_config.NumberColumn(format="%.3f", help="accepted / checked draft positions"),
        "tokens/step L": st.column_config.NumberColumn(format="%.2f", help="1 + mean accepted prefix per step"),
        "c": st.column_config.NumberColumn(format="%.3f", width="small",  # wide enough for "unknown"
                                           help="draft step time / target verification time"),
        "break-even alpha*": st.column_config.NumberColumn(
            format="%.3f", help="alpha at which speedup = 1, from the measured per-position profile"),
        "speedup (measured)": st.column_config.NumberColumn(format="%.2fx", help="L / (1 + mean draft length x c)"),
        "speedup (i.i.d. model)": st.column_config.NumberColumn(
            format="%.2fx", help="(1 - alpha^(k+1)) / ((1 - alpha)(1 + k c)): what alpha predicts"),
    })


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
