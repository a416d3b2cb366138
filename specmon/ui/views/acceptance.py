"""Acceptance: per-position observed vs predicted acceptance for one segment, and acceptance over time."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from specmon.core import display
from specmon.core.settings import BUCKETS, GAP_Z_LIMIT, WINDOW_BANDWIDTH_SECONDS
from specmon.ui import data
from specmon.ui.widgets import EMPTY, demo_banner, fmt, guarded, md_text, pick_segment, table

OBSERVED = "observed conditional (accepted / checked)"
PREDICTED = "predicted beta = Σ min(p, q)"
CUMULATIVE = "cumulative (accepted / steps; vLLM, llama.cpp)"


def positions_frame(seg: dict) -> pd.DataFrame:
    """Per-position figures in long form: one row per (position, measure), with the interval where known."""
    rows = []
    for p in seg["per_position"]:
        rows.append({"position": p["position"], "measure": OBSERVED, "value": p["conditional"],
                     "lo": p["conditional_lo"], "hi": p["conditional_hi"], "n": p["checked"]})
        if p["beta_lo"] is not None:
            rows.append({"position": p["position"], "measure": PREDICTED,
                         "value": p["beta"] if p["beta"] is not None else (p["beta_lo"] + p["beta_hi"]) / 2,
                         "lo": p["beta_lo"], "hi": p["beta_hi"], "n": p["checked"]})
        rows.append({"position": p["position"], "measure": CUMULATIVE, "value": p["cumulative"], "lo": None,
                     "hi": None, "n": seg["steps"]})
    return pd.DataFrame(rows)


def _position_chart(df: pd.DataFrame) -> alt.Chart:
    colour = alt.Color("measure:N", title=None,
                       legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=500))
    offset = alt.XOffset("measure:N")
    x = alt.X("position:O", title="draft position i", axis=alt.Axis(labelAngle=0))
    base = alt.Chart(df)
    tip = ["measure", "position", alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f"),
           alt.Tooltip("hi:Q", format=".3f"), alt.Tooltip("n:Q", title="denominator")]
    bars = base.transform_filter(alt.datum.lo != None).mark_rule(strokeWidth=2).encode(  # noqa: E711 (Vega expression)
        x=x, xOffset=offset, y=alt.Y("lo:Q", title="acceptance", scale=alt.Scale(domain=[0, 1])), y2="hi:Q",
        color=colour)
    points = base.mark_point(filled=True, size=70).encode(x=x, xOffset=offset, y="value:Q", color=colour,
                                                          shape=alt.Shape("measure:N", legend=None), tooltip=tip)
    line = base.transform_filter(alt.datum.measure == CUMULATIVE).mark_line(strokeDash=[4, 3]).encode(
        x=x, y="value:Q", color=colour)
    return (bars + line + points).properties(height=320)


def timeline_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"bucket": r["bucket_start"], "template": r["template"] or "(no template)",
                          "alpha": r["alpha"], "lo": r["alpha_lo"], "hi": r["alpha_hi"], "steps": r["steps"],
                          "status": r["status"]} for r in rows if r["alpha"] is not None])


def timeline_chart(df: pd.DataFrame, changes: pd.DataFrame) -> alt.Chart:
    x = alt.X("bucket:T", title="time (UTC)")
    colour = alt.Color("template:N")
    band = alt.Chart(df).mark_area(opacity=0.2).encode(x=x, y=alt.Y("lo:Q", title="per-token acceptance alpha",
                                                                   scale=alt.Scale(domain=[0, 1])), y2="hi:Q",
                                                       color=colour)
    line = alt.Chart(df).mark_line(point=True).encode(
        x=x, y="alpha:Q", color=colour,
        tooltip=[alt.Tooltip("bucket:T"), "template", alt.Tooltip("alpha:Q", format=".3f"),
                 alt.Tooltip("lo:Q", format=".3f"), alt.Tooltip("hi:Q", format=".3f"), "steps", "status"])
    chart = band + line
    if not changes.empty:
        marks = changes.assign(label="template " + changes["template"].replace("", "(none)") + " starts")
        chart += alt.Chart(marks).mark_rule(strokeDash=[6, 3], color="black").encode(
            x="first_ts:T", tooltip=["label", alt.Tooltip("first_ts:T", title="first step")])
    return chart.properties(height=300)


def verdict(seg: dict) -> str:
    if seg["agreement"] is None:
        return ("No distributions or beta were logged for this segment, so there is no prediction to compare "
                "with (engine logs never have one).")
    if seg["agreement"] == "agrees":
        return (f"Observed acceptance **agrees with the prediction within noise** (z = {seg['gap_z']:.2f}, "
                f"|z| ≤ {GAP_Z_LIMIT:g}; clusters = requests).")
    return ("Observed acceptance **differs from the prediction: check the pipeline** "
            f"(z = {fmt(seg['gap_z'], '.1f')}). "
            "A gap beyond noise usually means a wrong table, a temperature applied on one side only, or positions "
            "shifted by one.")


@guarded
def render() -> None:
    st.title("Acceptance")
    rows = data.summaries()
    if not rows:
        st.info(EMPTY)
        return
    demo_banner(rows)
    seg = pick_segment(rows, key="acceptance_segment")
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("alpha (per token)", fmt(seg["alpha"]), help="accepted / checked draft positions")
    c1.caption(f"95% CI {display.interval(seg['alpha_lo'], seg['alpha_hi'], style=display.PAGE)}")
    beta = display.beta(seg["beta"], seg["beta_lo"], seg["beta_hi"], display.PAGE, missing="not logged")
    c2.metric("predicted beta", beta, help="mean of Σ min(p, q) over checked positions; an interval for top-k logs")
    c3.metric("tokens per step L", fmt(seg["tokens_per_step"], ".2f"), help="1 + mean accepted prefix")
    c4.metric("steps", f"{seg['steps']:,}",
              help=f"{seg['requests']:,} requests" if seg["requests"] is not None else "drafts the engine counted")
    if seg.get("source") == "engine":
        st.info(f"Engine-reported figures ({md_text(seg['engine'])}): counts only, so there is no predicted beta "
                "to compare with. " + md_text(seg["note"] or ""))
    st.markdown(verdict(seg))

    st.subheader("Per draft position")
    st.altair_chart(_position_chart(positions_frame(seg)), width="stretch")
    st.caption("Observed conditional: of the drafts that reached position i, the share accepted (95% interval "
               "with requests as clusters, or engine windows paired up to "
               f"{WINDOW_BANDWIDTH_SECONDS / 60:g} minutes apart or more, from this position's own counts). "
               "Predicted beta: the mean acceptance probability the logged distributions imply. Cumulative: accepted "
               "at position i / all steps — the number vLLM and llama.cpp print as 'per-position acceptance rate'; "
               "1 + their sum = L.")
    if seg["per_position"]:
        table(pd.DataFrame(seg["per_position"]), missing="unknown", hide_index=True, width="stretch")
    else:
        st.caption("No per-position counts for this segment.")

    st.subheader("Over time")
    bucket = st.radio("bucket", list(BUCKETS), index=list(BUCKETS).index("day"), horizontal=True,
                      key="acceptance_bucket")
    timeline = timeline_frame(data.summaries(run=seg["run"], bucket=bucket))
    if timeline.empty:
        st.info("No timed steps in this run yet.")
    else:
        st.altair_chart(timeline_chart(timeline, data.template_changes(seg["run"])), width="stretch")
        st.caption(f"Run {md_text(seg['run'])}: one line per template, band = 95% interval; dashed rules mark where a "
                   "template first appears.")


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
