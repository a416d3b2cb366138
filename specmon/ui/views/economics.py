"""Economics: the speedup surface, break-even curves, and the segment's own operating point on them."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from specmon.core import display, economics, segments, theory
from specmon.core.settings import DEFAULT_K, EXAMPLE_C, REFERENCE_KS, SURFACE_K_MAX
from specmon.ui import data
from specmon.ui.widgets import demo_banner, fmt, guarded, pick_segment

_SPEEDUP_SCALE = alt.Scale(scheme="redyellowgreen", domainMid=1.0, type="log")


def _heatmap(df: pd.DataFrame, y: str, y_title: str, point: dict | None) -> alt.Chart:
    """The surface, and the segment's operating point (point: alpha, k, c) drawn on the cell that holds it, a black
    diamond, its exact values in the tooltip."""
    x_enc = alt.X("alpha:O", title="per-token acceptance alpha", axis=alt.Axis(values=[0.0, 0.2, 0.4, 0.6, 0.8]))
    y_enc = alt.Y(f"{y}:O", title=y_title, sort="descending" if y == "c" else "ascending",
                  axis=alt.Axis(values=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0]) if y == "c" else alt.Axis())
    cells = alt.Chart(df).mark_rect().encode(
        x=x_enc, y=y_enc,
        color=alt.Color("speedup:Q", scale=_SPEEDUP_SCALE, title="speedup (x)"),
        stroke=alt.condition(alt.datum.wins, alt.value(None), alt.value("#7f0000")),
        tooltip=[alt.Tooltip("alpha:Q", format=".2f"), alt.Tooltip(f"{y}:Q"), alt.Tooltip("speedup:Q", format=".2f")],
    )
    if point is None:
        return cells.properties(height=320)
    at = pd.DataFrame([{"alpha": _nearest(economics.ALPHAS, point["alpha"]),
                        y: point[y] if y == "k" else _nearest(economics.COSTS, point[y]),
                        "segment": point["label"], "its alpha": point["alpha"]}])
    dot = alt.Chart(at).mark_point(shape="diamond", size=160, filled=True, color="black", stroke="white",
                                   strokeWidth=1).encode(
        x=x_enc, y=y_enc, tooltip=["segment", alt.Tooltip("its alpha:Q", format=".3f"), alt.Tooltip(f"{y}:Q")])
    return (cells + dot).properties(height=320)


def _nearest(grid, value: float) -> float:
    """The grid value whose cell holds value (the grid's values are evenly spaced)."""
    return float(grid[abs(grid - value).argmin()])


def _break_even_chart(curves: pd.DataFrame, point: pd.DataFrame | None) -> alt.Chart:
    lines = alt.Chart(curves).mark_line().encode(
        x=alt.X("c:Q", title="draft cost c (draft step / target step)", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("break_even_alpha:Q", title="break-even alpha*", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("k:N", title="k"),
        tooltip=["k", alt.Tooltip("c:Q", format=".2f"), alt.Tooltip("break_even_alpha:Q", format=".3f")])
    if point is None:
        return lines.properties(height=340)
    dot = alt.Chart(point).mark_point(shape="diamond", size=200, filled=True, color="black").encode(
        x="c:Q", y="alpha:Q", tooltip=["label", alt.Tooltip("alpha:Q", format=".3f"), alt.Tooltip("c:Q", format=".3f")])
    text = alt.Chart(point).mark_text(dx=10, align="left").encode(x="c:Q", y="alpha:Q", text="label")
    return (lines + dot + text).properties(height=340)


def _costs(costs: dict) -> None:
    """The live run's measured costs: what c and the verification pass really cost on this machine."""
    st.markdown(f"**Measured on this machine (live run).** Draft decode step {costs['draft_step_ms']:.2f} ms, target "
                f"decode step {costs['target_step_ms']:.2f} ms, so c = {costs['c']:.3f}. The i.i.d. model assumes "
                "verifying k + 1 tokens costs one target step; the line shows what it costs here.")
    df = pd.DataFrame([{"tokens verified": int(n), "ms": ms} for n, ms in costs["verify_ms"].items()])
    line = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("tokens verified:O", axis=alt.Axis(labelAngle=0)), y=alt.Y("ms:Q", title="verification pass (ms)"),
        tooltip=["tokens verified", alt.Tooltip("ms:Q", format=".2f")])
    step = alt.Chart(pd.DataFrame({"ms": [costs["target_step_ms"]]})).mark_rule(strokeDash=[4, 3]).encode(y="ms:Q")
    st.altair_chart((line + step).properties(height=220), width="stretch")


@guarded
def render() -> None:
    st.title("Economics")
    st.caption("Speedup under the i.i.d. model: S = (1 − α^(k+1)) / ((1 − α)(1 + k·c)). Speculation loses where "
               "S < 1 (red, outlined). c = cost of one draft step / cost of one target step on your hardware.")
    rows = data.summaries()
    seg = None
    if rows:
        demo_banner(rows)
        seg = pick_segment(rows, key="economics_segment")
    seg_c = seg["c"] if seg and seg["c"] is not None else EXAMPLE_C
    seg_k = seg["k"] if seg and seg["k"] else DEFAULT_K
    left, right = st.columns(2)
    c = left.slider("draft cost c", 0.0, 1.0, float(round(seg_c, 2)), 0.01, key="economics_c",
                    help="defaults to the segment's measured c")
    k = right.slider("draft length k", 1, SURFACE_K_MAX, int(min(seg_k, SURFACE_K_MAX)), key="economics_k")

    mine = ({"alpha": seg["alpha"], "k": k, "c": c, "label": "your segment"}
            if seg is not None and seg["alpha"] is not None else None)
    a, b = st.columns(2)
    a.markdown(f"**Speedup over (alpha, k) at c = {c:.2f}**")
    a.altair_chart(_heatmap(economics.surface_alpha_k(c), "k", "draft length k", mine), width="stretch")
    b.markdown(f"**Speedup over (alpha, c) at k = {k}**")
    b.altair_chart(_heatmap(economics.surface_alpha_c(k), "c", "draft cost c", mine), width="stretch")
    if mine is not None:
        st.caption(f"◆ your segment: alpha = {mine['alpha']:.3f} at the chosen k and c.")

    st.markdown("**Break-even alpha\\*(c) under the i.i.d. model**: above its curve, a draft length pays for itself "
                "where every position accepts alike (the Overview's alpha\\* is the segment's own profile's)")
    ks = tuple(sorted(set(REFERENCE_KS) | {k}))
    point = pd.DataFrame([mine]) if mine is not None else None
    st.altair_chart(_break_even_chart(economics.break_even_curves(ks), point), width="stretch")

    if seg is None or seg["alpha"] is None:
        st.info("Ingest a step log to see your own operating point on these charts.")
        return
    op = economics.operating_point(seg["alpha"], k, c, seg["tokens_per_step"], seg["alpha_hi"])
    st.subheader("Your operating point")
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("speedup at this k", f"{op.speedup_iid:.2f}x", help="i.i.d. model, measured alpha, chosen c")
    m2.metric("best k", op.best_k, help="argmax over k = 1..12 of S(alpha, k, c)")
    m3.metric("speedup at best k", f"{op.best_speedup:.2f}x", delta=f"{(op.gain_from_best_k - 1) * 100:+.0f}%")
    m4.metric("break-even tokens 1 + k·c", f"{op.tokens_break_even:.2f}")
    if op.best_speedup_hi is not None and op.best_speedup_hi < 1:
        st.error(f"Under the i.i.d. model every k from 1 to {SURFACE_K_MAX} loses at c = {c:.2f}, even at the top "
                 f"of alpha's 95% interval ({seg['alpha_hi']:.3f}): turn speculation off for this segment, or find "
                 "a cheaper or better-matched draft.")
    elif op.best_speedup < 1:
        st.warning(f"Under the i.i.d. model every k from 1 to {SURFACE_K_MAX} loses at alpha = {seg['alpha']:.3f} "
                   f"and c = {c:.2f}, " + ("but some k pays at the top of alpha's 95% interval "
                                           f"({seg['alpha_hi']:.3f}): the data cannot tell yet."
                                           if op.best_speedup_hi is not None else
                                           "but alpha has no interval yet, so the data cannot tell."))
    if seg.get("costs"):
        _costs(seg["costs"])
    if seg["k"] == k and op.tokens_measured is not None:
        judged = segments.at_cost(seg, c)
        st.markdown(
            f"**Measured against the model.** Measured tokens per step L = {op.tokens_measured:.2f} (95% CI "
            f"{display.interval(seg['tokens_per_step_lo'], seg['tokens_per_step_hi'], '.2f', display.PAGE)}) "
            f"against the model-free break-even 1 + g·c = {fmt(judged.break_even_tokens, '.2f')} (g, the mean "
            f"draft length, {fmt(seg['mean_draft_len'], '.2f')}): at this c, {_PAYS[judged.status]}. "
            f"The i.i.d. model predicts L = {op.tokens_iid:.2f} from alpha, "
            f"{fmt(op.iid_error * 100 if op.iid_error is not None else None, '+.1f')}% from the measurement "
            "(acceptance that varies by request or position makes the i.i.d. model err).")
    else:
        st.caption(f"The segment ran at k = {seg['k']}; set k to {seg['k']} to compare with its measured L.")
    _draft_lengths(seg, c)


# A segment's status at the chosen c (core.segments.economics: L's interval against 1 + g c), in words.
_PAYS = {"healthy": "speculation pays, its whole interval above it",
         "losing": "speculation does not pay, its whole interval below it",
         "at risk": "the interval straddles it, so the data cannot tell whether speculation pays",
         "unknown": "whether speculation pays is unknown without an interval of L"}


def draft_lengths_frame(seg: dict, c: float) -> pd.DataFrame:
    """Measured E[L(k')] / (1 + k' c) for k' up to the segment's k (its draft_lengths, from the per-position rates,
    re-priced at the chosen c) beside the i.i.d. model's S(alpha, k', c)."""
    rows = []
    for d in seg.get("draft_lengths") or []:
        cost = 1 + d["k"] * c
        rows.append({"k": d["k"], "measured": d["tokens_per_step"] / cost,
                     "lo": d["tokens_per_step_lo"] / cost if d["tokens_per_step_lo"] is not None else None,
                     "hi": d["tokens_per_step_hi"] / cost if d["tokens_per_step_hi"] is not None else None,
                     "i.i.d. model": float(theory.speedup(seg["alpha"], d["k"], c)), "discarded": d["discarded"]})
    return pd.DataFrame(rows)


def _draft_lengths(seg: dict, c: float) -> None:
    df = draft_lengths_frame(seg, c)
    if df.empty:
        return
    st.subheader("Best k from the measured per-position rates")
    best = df.loc[df["measured"].idxmax()]
    st.markdown(f"From this segment's own steps (no i.i.d. assumption), drafting **k = {int(best['k'])}** would have "
                f"paid most at c = {c:.2f}: {best['measured']:.2f}x at batch 1"
                + (f" (95% CI {best['lo']:.2f}–{best['hi']:.2f})" if best["lo"] == best["lo"] else "") + ".")
    discarded = [int(k) for k in df.loc[df["discarded"], "k"]]
    if discarded:
        st.warning(f"Draft position{'s' if len(discarded) > 1 else ''} {', '.join(map(str, discarded))} "
                   "{} drafted and mostly discarded: under a quarter of the steps reach {}.".format(
                       "are" if len(discarded) > 1 else "is", "them" if len(discarded) > 1 else "it"))
    long = df.melt(id_vars=["k"], value_vars=["measured", "i.i.d. model"], var_name="from", value_name="speedup")
    x = alt.X("k:O", title="draft length k'", axis=alt.Axis(labelAngle=0))
    lines = alt.Chart(long).mark_line(point=True).encode(
        x=x, y=alt.Y("speedup:Q", title="speedup at batch 1"), color=alt.Color("from:N", title=None),
        tooltip=["k", "from", alt.Tooltip("speedup:Q", format=".3f")])
    bars = alt.Chart(df.dropna(subset=["lo", "hi"])).mark_errorbar(ticks=True).encode(x=x, y="lo:Q", y2="hi:Q")
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="black", strokeDash=[4, 3]).encode(y="y:Q")
    st.altair_chart((lines + bars + one).properties(height=260), width="stretch")
    st.caption("Measured: E[L(k')] = 1 + the sum of the cumulative per-position rates up to k' over 1 + k'·c, with its "
               "95% interval (L's spread between requests, or engine windows' minutes). i.i.d. model: what the "
               "segment's alpha predicts if every position had the same acceptance. Both at batch 1: see the Load "
               "page for the payoff at load.")


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
