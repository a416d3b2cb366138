"""Losslessness: is the output still the target's? The randomized PIT, and a fixed-p chi-square test."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from specmon.analysis import lossless
from specmon.analysis.summary import demo_only
from specmon.core.settings import KS_LEVEL
from specmon.ui import data
from specmon.ui.widgets import DEMO_NOTICE, guarded, table

PIT_BINS = 20


def pit_histogram(u: np.ndarray) -> alt.Chart:
    counts, edges = np.histogram(u, bins=PIT_BINS, range=(0.0, 1.0))
    df = pd.DataFrame({"from": edges[:-1], "to": edges[1:], "tokens": counts})
    expected = len(u) / PIT_BINS
    bars = alt.Chart(df).mark_bar().encode(
        x=alt.X("from:Q", bin="binned", title="randomized PIT u"), x2="to:Q", y=alt.Y("tokens:Q", title="tokens"),
        tooltip=[alt.Tooltip("from:Q", format=".2f"), alt.Tooltip("to:Q", format=".2f"), "tokens"])
    rule = alt.Chart(pd.DataFrame({"expected": [expected]})).mark_rule(color="black", strokeDash=[4, 3]).encode(
        y="expected:Q")
    return (bars + rule).properties(height=260)


@guarded
def render() -> None:
    st.title("Losslessness")
    st.caption("Speculative decoding must emit exactly the target's distribution. For every emitted token whose "
               "target distribution was logged in full, u = F(x − 1) + v·p(x) with v ~ U(0, 1) is uniform if the "
               "token was drawn from p, whatever p was at that position (randomized probability integral "
               "transform). A KS test checks the u; a flat histogram is what lossless looks like.")
    segments = data.lossless_segments()
    if not segments:
        st.info("No segment has both full target distributions (`target_probs`) and `emitted_tokens` logged. "
                "Log them for a sample of requests (or run `specmon simulate | specmon ingest -`) to check "
                "losslessness here.")
        return
    if demo_only(data.get_store()):
        st.warning(DEMO_NOTICE)
    labels = [f"{run} / {template or '(no template)'} — {n:,} tokens" for run, template, n in segments]
    run, template, _ = segments[labels.index(st.selectbox("Segment", labels, key="lossless_segment"))]
    pit, fixed = data.lossless_checks(run, template)
    st.subheader("Randomized PIT")
    verdict = ("consistent with lossless" if lossless.consistent(pit.ks)
               else "NOT consistent with lossless: check the sampler")
    c1, c2, c3 = st.columns(3)
    c1.metric("tokens tested", f"{pit.tokens:,}")
    c2.metric("KS statistic", f"{pit.ks.statistic:.4f}")
    c3.metric("KS p-value", f"{pit.ks.pvalue:.3g}",
              help=f"below {KS_LEVEL:g}: the emitted tokens do not follow the logged p")
    st.markdown(f"**Verdict:** {verdict} (KS test against U(0, 1), {KS_LEVEL:.0%} level).")
    st.altair_chart(pit_histogram(pit.u), width="stretch")
    st.caption(f"{PIT_BINS} bins; dashed line: the count every bin expects under losslessness.")
    st.subheader("Fixed target distribution")
    if fixed is None:
        st.info("The logged target distribution changes from step to step here, so a single-p chi-square test "
                "does not apply; the PIT above covers this case.")
        return
    st.markdown(f"Every step logged the same p, so emitted-token counts ({fixed.tokens:,} tokens, "
                f"{fixed.vocabulary_seen} distinct) can be tested against p directly, beside a plain-sampling "
                "baseline: as many tokens drawn from p itself, which shows the spread that noise alone gives.")
    table(pd.DataFrame([
        {"sample": "speculative decoding (logged)", "chi-square": fixed.chi_square.statistic,
         "dof": fixed.chi_square.dof, "p-value": fixed.chi_square.pvalue, "TV distance": fixed.tv},
        {"sample": "plain sampling from p (baseline)", "chi-square": fixed.baseline_chi_square.statistic,
         "dof": fixed.baseline_chi_square.dof, "p-value": fixed.baseline_chi_square.pvalue,
         "TV distance": fixed.baseline_tv},
    ]), hide_index=True, width="stretch")


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
