"""Load: does speculation pay at the concurrency the deployment runs at? Speedup against concurrency with its
interval and the 1.0 line, throughput with and without speculation, acceptance and tokens per step by
concurrency, the break-even and the current load marked, and the policy the data supports."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from specmon.analysis.load import LoadCurve
from specmon.ui import data
from specmon.ui.widgets import DEMO_NOTICE, guarded, md_text, sentence, table
from specmon.verdicts import findings
from specmon.verdicts.recommend import recommend

_X = alt.X("concurrency:Q", title="requests running (concurrency N)", scale=alt.Scale(type="log", base=2))


def points_frame(curve: LoadCurve) -> pd.DataFrame:
    """One row per measured (k, concurrency), as the charts and the table show them."""
    return pd.DataFrame([{
        "k": "?" if p.k is None else str(p.k), "concurrency": p.concurrency, "speedup": p.speedup.estimate,
        "lo": p.speedup.lo, "hi": p.speedup.hi, "with speculation": p.throughput,
        "without": p.baseline_throughput, "alpha": p.alpha, "accepted / drafted": p.draft_acceptance_rate,
        "tokens/step L": p.tokens_per_step, "observations": p.observations,
        "baseline observations": p.baseline_observations} for p in curve.points])


def _marks(curve: LoadCurve) -> alt.Chart | None:
    """Vertical rules: the best k's break-even N* (red, dashed) and the current load (blue)."""
    rows: list[dict[str, object]] = []
    if curve.best is not None and curve.best.crosses:
        rows.append({"concurrency": curve.best.break_even, "what": "break-even N*"})
    if curve.current is not None:
        rows.append({"concurrency": curve.current, "what": "running now"})
    if not rows:
        return None
    colours = {"break-even N*": "#c62828", "running now": "#1565c0"}
    shown = [str(r["what"]) for r in rows]
    return alt.Chart(pd.DataFrame(rows)).mark_rule(strokeWidth=2, strokeDash=[6, 3]).encode(
        x=_X, color=alt.Color("what:N", scale=alt.Scale(domain=shown, range=[colours[w] for w in shown]), title=None),
        tooltip=["what", alt.Tooltip("concurrency:Q", format=".3g")])


def speedup_chart(df: pd.DataFrame, curve: LoadCurve) -> alt.LayerChart:
    colour = alt.Color("k:N", title="draft length k", scale=alt.Scale(scheme="category10"))
    band = alt.Chart(df.dropna(subset=["lo", "hi"])).mark_errorbar(ticks=True).encode(
        x=_X, y=alt.Y("lo:Q", title="speedup S(N) (95% CI)"), y2="hi:Q", color=colour)
    line = alt.Chart(df).mark_line(point=True).encode(
        x=_X, y=alt.Y("speedup:Q", title="speedup S(N) (95% CI)"), color=colour,
        tooltip=["k", alt.Tooltip("concurrency:Q", format=".3g"), alt.Tooltip("speedup:Q", format=".3f"),
                 alt.Tooltip("lo:Q", format=".3f"), alt.Tooltip("hi:Q", format=".3f"), "observations"])
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="black").encode(y="y:Q")
    measured = band + line + one
    marks = _marks(curve)
    chart = alt.layer(measured, marks).resolve_scale(color="independent") if marks is not None else measured
    return chart.properties(height=300)


def throughput_chart(df: pd.DataFrame) -> alt.Chart:
    long = df.melt(id_vars=["k", "concurrency"], value_vars=["with speculation", "without"], var_name="engine",
                   value_name="tokens/s")
    long["series"] = long.apply(lambda r: "without speculation" if r["engine"] == "without" else f"k = {r['k']}",
                                axis=1)
    return alt.Chart(long.drop_duplicates(["series", "concurrency"])).mark_line(point=True).encode(
        x=_X, y=alt.Y("tokens/s:Q", title="output tokens / s"), color=alt.Color("series:N", title=None),
        tooltip=["series", alt.Tooltip("concurrency:Q", format=".3g"), alt.Tooltip("tokens/s:Q", format=",.0f")]
    ).properties(height=260)


def acceptance_chart(df: pd.DataFrame) -> alt.Chart | None:
    """Acceptance (per-token alpha where known, else accepted / drafted) and L by concurrency: flat acceptance under
    a falling speedup is the point of this page."""
    cols = [c for c in ("alpha", "accepted / drafted", "tokens/step L") if df[c].notna().any()]
    if not cols:
        return None
    long = df.melt(id_vars=["k", "concurrency"], value_vars=cols, var_name="figure", value_name="value").dropna()
    long["series"] = long["figure"] + ", k = " + long["k"]
    return alt.Chart(long).mark_line(point=True).encode(
        x=_X, y=alt.Y("value:Q", title="acceptance / tokens per step"), color=alt.Color("series:N", title=None),
        tooltip=["series", alt.Tooltip("concurrency:Q", format=".3g"), alt.Tooltip("value:Q", format=".3f")]
    ).properties(height=240)


def _verdict(curve: LoadCurve) -> None:
    found = findings.load_findings([curve])
    if found:
        f = found[0]
        (st.success if not f.problem else st.error if f.state == findings.LOSING_AT_LOAD else st.warning)(
            f"**{sentence(f.state)}.** {md_text(f.detail)}")
    elif curve.best is not None:
        st.info(f"{md_text(sentence(curve.best.describe()))}." + (
            "" if curve.current is not None else " The current load is unknown: this run has no engine windows "
            "with their running requests (watch the engine's log or /metrics to see it)."))


@guarded
def render() -> None:
    st.title("Does speculation pay at your load?")
    st.caption("Speedup S(N) = output tokens/s with speculation over the same without it, at the same number of "
               "requests running: measured, not predicted. Acceptance can stay flat while S falls below 1 as the "
               "target's batch fills its compute.")
    curves = data.load_curves()
    if not curves:
        st.info("No run measured load yet. Ingest a load sweep (CSV with run, k, concurrency, output_tokens_per_s; "
                "k = 0 rows without speculation), `vllm bench serve --save-result` files, or engine logs with their "
                "load lines, and a baseline without speculation (`--baseline-of RUN`, or `specmon annotate "
                "--speculation off`).")
        return
    names = [c.run for c in curves]
    asked = st.query_params.get("run")
    run = st.selectbox("Run", names, index=names.index(asked) if asked in names else 0, key="load_run")
    curve = next(c for c in curves if c.run == run)
    if curve.demo:
        st.warning(DEMO_NOTICE)
    if not curve.known:
        st.warning(md_text(sentence(curve.note) if curve.note else "Payoff at load unknown."))
        if curve.seen:
            st.caption("This run's windows ran at " + ", ".join(f"{n:g}" for n in curve.seen)
                       + " requests running (bins of concurrency).")
        return
    _verdict(curve)
    df = points_frame(curve)
    st.subheader("Speedup by concurrency")
    st.altair_chart(speedup_chart(df, curve), width="stretch")
    st.caption(f"Baseline: {md_text(curve.baseline)}. Intervals: 95%, from {curve.observations}. Red dashed: "
               "break-even N* of the best k; blue dashed: the load running now.")
    st.subheader("Throughput with and without speculation")
    st.altair_chart(throughput_chart(df), width="stretch")
    chart = acceptance_chart(df)
    if chart is not None:
        st.subheader("Acceptance by concurrency")
        st.altair_chart(chart, width="stretch")
    st.subheader("What to configure")
    advice = recommend(curve)
    st.markdown(md_text(sentence(advice.words)) + ".")
    st.caption(f"Certainty: {md_text(advice.certainty)}. Assumes {md_text('; '.join(advice.assumes))}.")
    for engine, text in advice.engines.items():
        st.markdown(f"**{engine}**")
        st.code(text, language="yaml" if engine == "tensorrt-llm" else "bash")
    table(df, missing="unknown", hide_index=True, width="stretch", column_config={
        "speedup": st.column_config.NumberColumn(format="%.3f"), "lo": st.column_config.NumberColumn(format="%.3f"),
        "hi": st.column_config.NumberColumn(format="%.3f"),
        "with speculation": st.column_config.NumberColumn(format="%.0f", help="output tokens/s"),
        "without": st.column_config.NumberColumn(format="%.0f", help="output tokens/s without speculation")})


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
