"""Segments from replay runs (specmon.pair.replay): predicted acceptance, in the shape of the step-log summaries.

Replay stores beta per completion position; nothing was drafted, so observed alpha is unknown and beta with its
interval (transcripts as clusters) is the prediction. No torch here: summaries must not load the model stack.
"""
from __future__ import annotations

from datetime import datetime

import numpy as np
import orjson
import pandas as pd

from specmon.core import stats
from specmon.core.segments import Estimate, SegmentSummary, economics
from specmon.core.settings import CONFIDENCE
from specmon.store.database import Store

_REPLAY_SQL = """
SELECT rs.run, rs.template, rp.request_id, count(*) AS n, sum(rp.beta) AS beta_sum, min(rp.ts) AS first_ts,
       max(rp.ts) AS last_ts, any_value(rs.meta)::VARCHAR AS meta, max(i.ingested_at) AS ingested
FROM replay_positions rp JOIN run_segments rs USING (segment_id) JOIN ingests i USING (ingest_id)
WHERE (? IS NULL OR rs.run = ?) AND (?::TIMESTAMP IS NULL OR rp.ts >= ?::TIMESTAMP)
GROUP BY ALL
"""


def summarize_replays(store: Store, by: str, c: float | None, *, run: str | None = None,
                      since: datetime | None = None) -> list[SegmentSummary]:
    """Replay segments: predicted acceptance only (alpha is null: nothing was drafted)."""
    df = store.query_df(_REPLAY_SQL, [run, run, since, since])
    if df.empty:
        return []
    keys = ["run"] + ([] if by == "run" else ["template"])
    return [_segment(key if isinstance(key, tuple) else (key,), keys, part, c)
            for key, part in df.groupby(keys, sort=True)]


def _segment(key: tuple, keys: list[str], part: pd.DataFrame, c: float | None) -> SegmentSummary:
    """One replay segment: beta's interval (transcripts as clusters) stands in for alpha in the economics."""
    named = dict(zip(keys, key, strict=True))
    iv = stats.cluster_robust_interval(part["beta_sum"].to_numpy(float), part["n"].to_numpy(float), CONFIDENCE)
    meta = orjson.loads(part["meta"].iloc[0]) if part["meta"].iloc[0] else {}
    k = meta.get("k")
    beta = Estimate(iv.estimate, iv.lo, iv.hi)
    return SegmentSummary(
        run=named["run"], template=named.get("template") or None, day=None, bucket_start=None, demo=False, k=k,
        steps=0, requests=len(part), drafted=None, checked=None, accepted=None, alpha=Estimate(),
        design_effect=iv.design_effect, interval_dof=None, beta=beta, gap_z=None, agreement=None,
        tokens_per_step=Estimate(), mean_draft_len=None,
        economics=economics(k, c, "given" if c is not None else None, beta, Estimate(), None),
        first_ts=pd.Timestamp(part["first_ts"].min()).isoformat(),
        last_ts=pd.Timestamp(part["last_ts"].max()).isoformat(), source="replay", costs=None, ts_inferred_steps=0,
        last_ingest=pd.Timestamp(part["ingested"].max()).isoformat(), per_position=(), windows=None,
        note=("predicted by replay (teacher forcing, transcripts as clusters): beta and its interval are "
              "predicted per-token acceptance; nothing was drafted, so alpha is unknown"),
        predicted_positions=int(np.sum(part["n"])),
    )
