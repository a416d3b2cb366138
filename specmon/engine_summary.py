"""Segments from what serving engines report (specmon.engines, specmon.prometheus), in the same shape as the
step-log summaries, so pages and `specmon summary` show them side by side.

Engines log counts, not distributions: beta is unknown (null) for them. Per-token alpha needs the per-position
counts (position 1 is checked on every draft, position i when i - 1 was accepted): checked = drafts +
sum_{i<k} accepted_at_i. Where an engine gives only accepted and drafted tokens (early vLLM V1, llama.cpp's
summaries), alpha stays null and its accepted/drafted rate is reported as draft_acceptance_rate. The intervals
treat each window (a log interval, a request, a scrape) as a cluster (stats.cluster_interval).
"""
from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pandas as pd

from specmon import prometheus, stats, theory
from specmon.segments import BUCKETS, CONFIDENCE, segment_status
from specmon.store import Store

_WINDOWS_SQL = """
SELECT r.name AS run, sg.template, w.segment_id, w.engine, w.source, w.end_ts, w.start_ts, w.drafts, w.draft_tokens,
       w.accepted_tokens, w.accepted_per_position, w.k, w.mean_acceptance_length, w.reported_rate, i.ingested_at
FROM engine_windows w JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) JOIN ingests i USING (ingest_id)
WHERE (? IS NULL OR r.name = ?) ORDER BY w.end_ts, w.window_id
"""
_SAMPLES_SQL = """
SELECT c.segment_id, c.metric, c.series, c.labels::VARCHAR AS labels, c.ts, c.value
FROM counter_samples c JOIN segments sg USING (segment_id) JOIN runs r USING (run_id)
WHERE (? IS NULL OR r.name = ?) ORDER BY c.segment_id, c.series, c.ts
"""
_SEGMENTS_SQL = """
SELECT sg.segment_id, r.name AS run, sg.template, max(i.ingested_at) AS ingested_at
FROM counter_samples c JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) JOIN ingests i USING (ingest_id)
WHERE (? IS NULL OR r.name = ?) GROUP BY ALL
"""


def windows(store: Store, run: str | None = None) -> pd.DataFrame:
    """Every engine window: log lines and per-request JSON as stored, Prometheus counters differenced."""
    logged = store.query_df(_WINDOWS_SQL, [run, run])
    samples = store.query_df(_SAMPLES_SQL, [run, run])
    if samples.empty:
        return logged
    counted = prometheus.counter_windows(samples)
    if counted.empty:
        return logged
    segs = store.query_df(_SEGMENTS_SQL, [run, run])
    counted = counted.merge(segs, on="segment_id").assign(engine="prometheus", source="prometheus",
                                                          mean_acceptance_length=None, reported_rate=None)
    return pd.concat([logged, counted[[c for c in logged.columns]]], ignore_index=True) if not logged.empty \
        else counted


def _has_positions(value: object) -> bool:
    return isinstance(value, (list, np.ndarray)) and len(value) > 0


def window_checks(w: pd.Series) -> tuple[float, float] | None:
    """(accepted, checked) positions of one window, where its per-position counts allow it."""
    if not _has_positions(w["accepted_per_position"]) or pd.isna(w["drafts"]):
        return None
    per_pos = list(w["accepted_per_position"])
    return float(sum(per_pos)), float(w["drafts"] + sum(per_pos[:-1]))


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def summarize_engines(store: Store, by: str = "template", c: float | None = None, *, run: str | None = None,
                      bucket: str | None = None, since: datetime | None = None,
                      declared: dict[str, float] | None = None) -> list[dict]:
    """Engine segments with the keys of summary.summarize (beta and the gap test null). Engines log no draft
    timings, so c is the one given, else the one declared for the run (summary.declared_costs), else unknown."""
    df = windows(store, run)
    if df.empty:
        return []
    if since is not None:
        df = df[df["end_ts"] >= since]
    keys = ["run"] + ([] if by == "run" else ["template"])
    df = df.assign(bucket=df["end_ts"].dt.floor(pd.Timedelta(BUCKETS[bucket])) if bucket else pd.NaT)
    out = []
    for key, part in df.groupby(keys + ["bucket"], dropna=False, sort=True):
        key = dict(zip(keys + ["bucket"], key))
        declared_c = (declared or {}).get(key["run"])
        if c is not None:
            cost, source = c, "given"
        elif declared_c is not None:
            cost, source = declared_c, "declared"
        else:
            cost, source = None, None
        out.append(_segment(key, part, cost, bucket is not None, source))
    return out


def _segment(key: dict, part: pd.DataFrame, c_given: float | None, bucketed: bool,
             c_source: str | None = None) -> dict:
    counted = part[part["drafts"].notna()]
    n_drafts = float(counted["drafts"].sum()) if len(counted) else None
    accepted_known = counted[counted["accepted_tokens"].notna()]
    tokens_per_step = 1.0 + accepted_known["accepted_tokens"].sum() / n_drafts if n_drafts else None
    gauges = part["mean_acceptance_length"].dropna()
    note = None
    if tokens_per_step is None and len(gauges):
        tokens_per_step = float(gauges.mean())
        note = "tokens per step is the unweighted mean of the engine's reported gauge"
    checks = [x for x in (window_checks(w) for _, w in part.iterrows()) if x is not None]
    alpha = alpha_lo = alpha_hi = tokens_lo = tokens_hi = None
    design_effect = dof = None
    k_values = part["k"].dropna()
    k = int(k_values.max()) if len(k_values) else None
    per_position: list[dict] = []
    if checks:
        a, n = np.array(checks).T
        iv = stats.cluster_robust_interval(a, n, CONFIDENCE)  # windows are the clusters
        alpha, alpha_lo, alpha_hi = iv.estimate, iv.lo, iv.hi
        design_effect, dof = iv.design_effect, iv.dof
        if n_drafts and len(accepted_known) >= 2:
            tokens = stats.ratio_interval(stats.ClusterSums.of(accepted_known["accepted_tokens"].to_numpy(float),
                                                               accepted_known["drafts"].to_numpy(float)),
                                          iv.dof, CONFIDENCE)
            if tokens is not None:
                tokens_lo, tokens_hi = 1 + max(tokens[0], 0.0), 1 + tokens[1]
        with_pp = part[part["accepted_per_position"].map(_has_positions) & part["drafts"].notna()]
        width = max(len(v) for v in with_pp["accepted_per_position"])
        acc = np.zeros(width)
        for v in with_pp["accepted_per_position"]:
            acc[:len(v)] += np.asarray(v, dtype=float)
        drafts_pp = float(with_pp["drafts"].sum())
        reached = np.concatenate([[drafts_pp], acc[:-1]])
        for i in range(width):
            lo = hi = None
            if reached[i]:
                # Wilson at the windows' effective sample size and degrees of freedom, as for step logs
                n_eff = reached[i] / iv.design_effect
                lo, hi = stats.wilson_interval(acc[i] / reached[i] * n_eff, n_eff, CONFIDENCE, iv.dof)
            per_position.append({
                "position": i + 1, "checked": float(reached[i]), "accepted": float(acc[i]),
                "conditional": acc[i] / reached[i] if reached[i] else None, "conditional_lo": lo,
                "conditional_hi": hi, "cumulative": acc[i] / drafts_pp if drafts_pp else None,
                "beta": None, "beta_lo": None, "beta_hi": None})
    elif note is None:
        note = "per-token alpha needs per-position counts, which this engine output does not give"
    drafted = float(part["draft_tokens"].sum()) if part["draft_tokens"].notna().any() else None
    accepted = float(part["accepted_tokens"].sum()) if part["accepted_tokens"].notna().any() else None
    be_alpha = be_tokens = s_iid = s_measured = None
    status = status_model_free = "unknown"
    if c_given is not None and k:
        be = theory.break_even_alpha(k, c_given)
        be_alpha = None if math.isnan(be) else be
        be_tokens = float(theory.break_even_tokens(k, c_given))
        if alpha is not None:
            s_iid = float(theory.speedup(alpha, k, c_given))
        if alpha_lo is not None and alpha_hi is not None:
            status = segment_status(alpha_lo, alpha_hi, be)
        if tokens_lo is not None and tokens_hi is not None:
            status_model_free = segment_status(tokens_lo, tokens_hi, be_tokens)
        if tokens_per_step is not None and n_drafts and drafted:
            s_measured = tokens_per_step / (1 + drafted / n_drafts * c_given)
    bucket = key.get("bucket")
    return {
        "run": key["run"], "template": (key.get("template") or None), "day": None,
        "bucket_start": pd.Timestamp(bucket).isoformat() if bucketed and not pd.isna(bucket) else None,
        "demo": False, "source": "engine", "engine": ", ".join(sorted(part["engine"].unique())),
        "k": k, "steps": int(round(n_drafts)) if n_drafts else 0, "requests": None,
        "drafted": _num(drafted), "checked": float(sum(x[1] for x in checks)) if checks else None,
        "accepted": _num(accepted), "alpha": alpha, "alpha_lo": alpha_lo, "alpha_hi": alpha_hi,
        "design_effect": design_effect, "interval_dof": None if dof is None or math.isinf(dof) else dof,
        "beta": None, "beta_lo": None, "beta_hi": None, "gap_z": None, "agreement": None,
        "draft_acceptance_rate": accepted / drafted if accepted is not None and drafted else None,
        "tokens_per_step": tokens_per_step, "tokens_per_step_lo": tokens_lo, "tokens_per_step_hi": tokens_hi,
        "status_model_free": status_model_free, "mean_draft_len": drafted / n_drafts if drafted and n_drafts else None,
        "c": c_given, "c_source": c_source, "break_even_alpha": be_alpha,
        "break_even_tokens": be_tokens, "speedup_iid": s_iid, "speedup_measured": s_measured, "status": status,
        "first_ts": part["end_ts"].min().isoformat(), "last_ts": part["end_ts"].max().isoformat(),
        "ts_inferred_steps": 0, "last_ingest": part["ingested_at"].max().isoformat(), "windows": len(part),
        "note": note, "per_position": per_position, "costs": None,
    }
