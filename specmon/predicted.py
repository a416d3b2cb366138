"""Segments from replay runs (specmon.replay): predicted acceptance, in the shape of the step-log summaries.

Replay stores beta per completion position; nothing was drafted, so observed alpha is unknown and beta with its
interval (transcripts as clusters) is the prediction. No torch here: summaries must not load the model stack.
"""
from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import orjson
import pandas as pd

from specmon import stats, theory
from specmon.segments import CONFIDENCE, segment_status
from specmon.store import Store

_REPLAY_SQL = """
SELECT r.name AS run, sg.template, rp.request_id, count(*) AS n, sum(rp.beta) AS beta_sum,
       min(rp.ts) AS first_ts, max(rp.ts) AS last_ts, any_value(r.meta)::VARCHAR AS meta, max(i.ingested_at) AS ingested
FROM replay_positions rp JOIN segments sg USING (segment_id) JOIN runs r USING (run_id) JOIN ingests i USING (ingest_id)
WHERE (? IS NULL OR r.name = ?) AND (?::TIMESTAMP IS NULL OR rp.ts >= ?::TIMESTAMP)
GROUP BY ALL
"""


def summarize_replays(store: Store, by: str, c: float | None, *, run: str | None = None,
                      since: datetime | None = None) -> list[dict]:
    """Replay segments: predicted acceptance only (alpha is null: nothing was drafted)."""
    df = store.query_df(_REPLAY_SQL, [run, run, since, since])
    if df.empty:
        return []
    keys = ["run"] + ([] if by == "run" else ["template"])
    out = []
    for key, part in df.groupby(keys, sort=True):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        iv = stats.cluster_robust_interval(part["beta_sum"].to_numpy(float), part["n"].to_numpy(float), CONFIDENCE)
        meta = orjson.loads(part["meta"].iloc[0]) if part["meta"].iloc[0] else {}
        k = meta.get("k")
        be = theory.break_even_alpha(k, c) if c is not None and k else None
        status = segment_status(iv.lo, iv.hi, be) if be is not None else "unknown"
        out.append({
            "run": key["run"], "template": key.get("template") or None, "day": None, "bucket_start": None,
            "demo": False, "source": "replay", "k": k, "steps": 0, "requests": len(part), "drafted": None,
            "checked": None, "accepted": None, "alpha": None, "alpha_lo": None, "alpha_hi": None,
            "design_effect": iv.design_effect, "beta": iv.estimate, "beta_lo": iv.lo, "beta_hi": iv.hi,
            "gap_z": None, "agreement": None, "tokens_per_step": None, "tokens_per_step_lo": None,
            "tokens_per_step_hi": None, "mean_draft_len": None, "c": c, "c_source": "given" if c is not None else None,
            "break_even_alpha": None if be is None or math.isnan(be) else be,
            "break_even_tokens": float(theory.break_even_tokens(k, c)) if c is not None and k else None,
            "speedup_iid": float(theory.speedup(iv.estimate, k, c)) if c is not None and k else None,
            "speedup_measured": None, "status": status,
            "status_model_free": "unknown", "first_ts": pd.Timestamp(part["first_ts"].min()).isoformat(),
            "last_ts": pd.Timestamp(part["last_ts"].max()).isoformat(), "ts_inferred_steps": 0,
            "last_ingest": pd.Timestamp(part["ingested"].max()).isoformat(), "windows": None,
            "note": ("predicted by replay (teacher forcing, transcripts as clusters): beta and its interval are "
                     "predicted per-token acceptance; nothing was drafted, so alpha is unknown"),
            "per_position": [], "predicted_positions": int(np.sum(part["n"])), "costs": None,
        })
    return out
