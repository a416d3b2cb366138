"""Drift alarms and template-change verdicts for the runs in a store (the detector itself is specmon.drift).

Each run is one stream of steps in time order, across its templates: a template change is what usually moves
acceptance, so the reference window (the run's first steps) stays the baseline across it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd

from specmon import drift, summary, theory
from specmon.store import Store

# The whole stream as numbers only (strings for millions of steps are what makes a query slow); the request ids
# are read for the reference window alone, and per-request sums for template comparisons are done in SQL.
_STREAM_SQL = """
SELECT st.accepted, st.checked, coalesce(st.k, st.g) AS k, epoch_us(st.ts) AS ts_us, st.segment_id
FROM steps st JOIN segments sg USING (segment_id) JOIN runs r USING (run_id)
WHERE r.name = ? ORDER BY st.ts, st.step_id
"""
_REFERENCE_SQL = """
SELECT st.request_id FROM steps st JOIN segments sg USING (segment_id) JOIN runs r USING (run_id)
WHERE r.name = ? ORDER BY st.ts, st.step_id LIMIT ?
"""
_TEMPLATES_SQL = """
SELECT sg.segment_id, sg.template, min(st.ts) AS first_ts FROM steps st JOIN segments sg USING (segment_id)
JOIN runs r USING (run_id) WHERE r.name = ? GROUP BY ALL ORDER BY first_ts
"""
_PER_REQUEST_SQL = """
SELECT sum(st.accepted)::DOUBLE AS accepted, sum(st.checked)::DOUBLE AS checked FROM steps st
WHERE st.segment_id = ? GROUP BY st.request_id
"""
# The detector's statistic is kept at most this many points for charts (the maximum of each stretch, so peaks
# that crossed the threshold stay visible).
CHART_POINTS = 2000


@dataclass(frozen=True)
class AlarmEvent:
    run: str
    template: str
    change_ts: datetime  # estimated start of the drop
    alarm_ts: datetime  # first alarm of the episode
    last_alarm_ts: datetime
    alarms: int  # alarms in the episode (the CUSUM restarts after each)
    open: bool  # still alarming at the end of the data
    alpha_before: float
    alpha_after: float
    design: drift.Design
    break_even: float | None

    def describe(self) -> str:
        be = f" (break-even {self.break_even:.3f})" if self.break_even is not None else ""
        return (f"run {self.run!r}: acceptance fell from {self.alpha_before:.3f} to {self.alpha_after:.3f}{be} "
                f"from about {self.change_ts:%Y-%m-%d %H:%M} UTC (template {self.template or '-'!r}); CUSUM "
                f"alarm at {self.alarm_ts:%Y-%m-%d %H:%M} UTC, {self.alarms} alarm(s) to "
                f"{self.last_alarm_ts:%Y-%m-%d %H:%M} UTC{' and still open' if self.open else ''}; threshold "
                f"h = {self.design.h:.2f} for one false alarm per {self.design.arl0_steps:,} steps")


@dataclass(frozen=True)
class TemplateChange:
    run: str
    template: str
    previous: str
    first_ts: datetime
    comparison: drift.Comparison
    break_even: float | None

    @property
    def below_break_even(self) -> bool:
        return bool(self.break_even is not None and self.comparison.after.hi < self.break_even)

    def describe(self) -> str:
        c = self.comparison
        words = {"hurt": "hurt acceptance", "helped": "raised acceptance",
                 "no detectable change": "made no change that the data can detect"}[c.verdict]
        text = (f"run {self.run!r}: template {self.previous or '-'!r} -> {self.template or '-'!r} at "
                f"{self.first_ts:%Y-%m-%d %H:%M} UTC {words}: alpha {c.before.estimate:.3f} "
                f"[{c.before.lo:.3f}, {c.before.hi:.3f}] -> {c.after.estimate:.3f} [{c.after.lo:.3f}, "
                f"{c.after.hi:.3f}], z = {c.z:.1f}")
        if self.below_break_even:
            text += f"; now below break-even {self.break_even:.3f}"
        return text


@dataclass(frozen=True)
class RunDrift:
    run: str
    design: drift.Design | None
    alarms: list[AlarmEvent]
    changes: list[TemplateChange]
    cusum: pd.DataFrame  # ts, W: the detector's statistic over time (at most CHART_POINTS rows)


def _per_request(store: Store, segment_id: int) -> tuple[np.ndarray, np.ndarray]:
    df = store.query_df(_PER_REQUEST_SQL, [segment_id])
    return df["accepted"].to_numpy(float), df["checked"].to_numpy(float)


def _chart_points(ts_us: np.ndarray, w: np.ndarray) -> pd.DataFrame:
    stride = max(1, -(-len(w) // CHART_POINTS))
    starts = np.arange(0, len(w), stride)
    return pd.DataFrame({"ts": pd.to_datetime(ts_us[starts], unit="us"), "W": np.maximum.reduceat(w, starts)})


def analyse_run(store: Store, run: str, c: float | None = None,
                arl0_steps: int = drift.DEFAULT_ARL0_STEPS) -> RunDrift:
    """Calibrate the detector on the run's first steps, run it, and compare every template change."""
    with store.cursor() as cur:
        stream = cur.execute(_STREAM_SQL, [run]).fetchnumpy()
    if not len(stream["accepted"]):
        return RunDrift(run, None, [], [], pd.DataFrame(columns=["ts", "W"]))
    seg = summary.summarize(store, by="run", c=c, run=run, per_position=False)[0]
    break_even = seg["break_even_alpha"]
    accepted = np.asarray(stream["accepted"], dtype=float)
    checked = np.asarray(stream["checked"], dtype=float)
    ts_us = np.asarray(stream["ts_us"], dtype=np.int64)
    templates = store.query_df(_TEMPLATES_SQL, [run])
    name_of = dict(zip(templates["segment_id"], templates["template"]))
    reference = store.query_df(_REFERENCE_SQL, [run, drift.REFERENCE_STEPS])["request_id"].to_numpy()
    design = drift.design_for(accepted, checked, reference, int(np.max(stream["k"])), break_even, arl0_steps)
    alarms: list[AlarmEvent] = []
    w = np.zeros(len(accepted))
    if design is not None:
        w, raw = drift.detect(accepted, checked, design)

        def when(i: int) -> datetime:
            return pd.Timestamp(int(ts_us[i]), unit="us").to_pydatetime()

        alarms = [AlarmEvent(run, name_of[stream["segment_id"][a.change_index]], when(a.change_index),
                             when(a.alarm_index), when(a.last_alarm_index), a.count,
                             bool(len(w) - a.last_alarm_index <= drift.REFERENCE_STEPS), a.alpha_before,
                             a.alpha_after, design, break_even) for a in raw]
    changes = []
    rows = list(templates.itertuples(index=False))
    for previous, current in zip(rows[:-1], rows[1:]):
        comparison = drift.compare(*_per_request(store, previous.segment_id), *_per_request(store, current.segment_id))
        changes.append(TemplateChange(run, current.template, previous.template, current.first_ts.to_pydatetime(),
                                      comparison, break_even))
    return RunDrift(run, design, alarms, changes, _chart_points(ts_us, w))


def analyse(store: Store, c: float | None = None, arl0_steps: int = drift.DEFAULT_ARL0_STEPS) -> list[RunDrift]:
    return [analyse_run(store, run, c, arl0_steps) for run in summary.run_names(store)]


def prometheus_alert_rule(k: int, c: float, window: str = "15m", for_: str = "30m",
                          metric_prefix: str = "vllm") -> str:
    """A Prometheus alerting rule that fires while mean acceptance length over `window` is below 1 + k*c.

    This is the model-free break-even (math.md): a step emits 1 + accepted/drafts tokens on average and costs
    1 + k*c target steps, so accepted/drafts < k*c means speculation is slower than plain decoding.
    """
    threshold = float(theory.break_even_tokens(k, c)) - 1.0
    alpha_star = theory.break_even_alpha(k, c)
    p = metric_prefix
    return f"""groups:
  - name: specmon-speculative-decoding
    rules:
      - alert: SpeculativeDecodingBelowBreakEven
        # Mean acceptance length 1 + accepted/drafts below the break-even 1 + k*c = {threshold + 1:.3f}
        # (k = {k}, c = {c:g}; per-token break-even alpha* = {alpha_star:.3f} under the i.i.d. model).
        expr: |
          sum by (model_name) (rate({p}:spec_decode_num_accepted_tokens_total[{window}]))
            / sum by (model_name) (rate({p}:spec_decode_num_drafts_total[{window}]))
          < {threshold:.4f}
        for: {for_}
        labels:
          severity: warning
        annotations:
          summary: "Speculative decoding on {{{{ $labels.model_name }}}} costs more than it saves"
          description: "Accepted tokens per draft is {{{{ $value | printf \\"%.3f\\" }}}} over {window}, below the break-even {threshold:.3f} for k = {k}, c = {c:g}: turn speculation off or retune k."
"""
