"""The segment summary every source produces (step logs, engine windows and Prometheus, replays), and the one rule
that turns its counts and intervals into economics and a status.

Pure: numbers in, frozen dataclasses out (no I/O). `SegmentSummary.to_dict()` is `specmon summary --json`'s object;
its keys are the README's key table (tests/core/test_segments.py holds the two together).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from specmon.core import load, stats, theory
from specmon.core.settings import CONFIDENCE

STATUSES = ("healthy", "at risk", "losing", "unknown")
# The statuses that are a finding: `specmon check` exits 1 on them and the Overview lists them first.
PROBLEM_STATUSES = ("losing", "at risk")
# Where point and interval are closer than this, beta is known exactly (dense distributions) and shown as a point.
_EXACT_BETA_WIDTH = 1e-9


def finite(x: float | None) -> float | None:
    """None for a missing or non-finite number (JSON has no NaN): the one NaN/None rule of every summary."""
    return None if x is None or not math.isfinite(x) else float(x)


def segment_status(lo: float, hi: float, break_even: float) -> str:
    """healthy: the interval lies above break-even; losing: below it; at risk: it straddles it.

    break_even is nan where c > 1: then even perfect acceptance cannot pay for the drafts.
    """
    if math.isnan(break_even):
        return "losing"
    if lo > break_even:
        return "healthy"
    if hi < break_even:
        return "losing"
    return "at risk"


def is_problem(status: str) -> bool:
    """Whether a segment's status is a finding (check's exit code 1, the pages' warnings)."""
    return status in PROBLEM_STATUSES


def why_unknown(row: dict) -> str:
    """Why a segment's status is "unknown", as the CLI and the pages say it: what economics() lacked."""
    if row.get("c") is None:
        return "no draft/target timings in the log, so the draft cost c is unknown"
    if row.get("drafted") == 0:
        return "no step drafted a token, so there is no draft length to judge"
    if not row.get("k"):
        if row.get("drafted") is None:  # unknown, not zero: the engine printed tokens per step alone
            return ("its draft length k is unknown: the log counts no drafted tokens (SGLang's lines, for one, "
                    "print tokens per step alone)")
        return "its draft length k is unknown"
    why = "neither its tokens per step L nor its per-token acceptance alpha has an interval"
    return f"{why} ({row['note']})" if row.get("note") else why


def point_beta(lo: float | None, hi: float | None) -> float | None:
    """Predicted beta as a point where its bounds coincide (dense distributions), else None (top-k: an interval)."""
    if lo is None or hi is None or abs(hi - lo) >= _EXACT_BETA_WIDTH:
        return None
    return finite(lo)


@dataclass(frozen=True)
class Estimate:
    """A rate with its interval; any part may be unknown."""
    value: float | None = None
    lo: float | None = None
    hi: float | None = None

    @property
    def bounded(self) -> bool:
        return self.lo is not None and self.hi is not None


@dataclass(frozen=True)
class Economics:
    """What a segment's acceptance is worth at its k and c."""
    c: float | None = None
    c_source: str | None = None
    break_even_alpha: float | None = None
    break_even_alpha_basis: str | None = None  # BASES: how break_even_alpha was derived
    break_even_alpha_iid: float | None = None
    break_even_tokens: float | None = None
    speedup_iid: float | None = None
    speedup_measured: float | None = None
    status: str = "unknown"
    status_basis: str | None = None  # BASES: what the headline status compares
    status_iid: str = "unknown"


# What a break-even alpha or a status rests on: the measured tokens per step (no model of acceptance), the measured
# per-position profile, or the i.i.d. model (one acceptance probability at every checked position).
TOKENS, PROFILE, IID = "tokens per step", "per-position profile", "i.i.d."
BASES = (TOKENS, PROFILE, IID)


def economics(k: int | None, c: float | None, c_source: str | None, alpha: Estimate, tokens: Estimate,
              mean_draft_len: float | None, positions: tuple[PositionSummary, ...] = (),
              steps: float = 0) -> Economics:
    """Break-even, speedups and the statuses from a segment's k, draft cost c, per-token acceptance (observed
    alpha, or predicted beta for a replay), tokens per step L, each with its interval, and its per-position counts.

    A step emits L tokens for the cost of 1 + g c target steps (g the mean draft length, k where unknown), so the
    headline `status` is L's interval against break_even_tokens = 1 + g c: it assumes nothing about how acceptance
    varies by position or between requests (docs/math.md). Only where L has no interval (a replay predicts alpha
    alone) does it fall back to alpha against the i.i.d. alpha*, and status_basis says so. `status_iid`, alpha's
    interval against the i.i.d. alpha*, is a diagnostic: biased wherever acceptance falls with the draft position.
    break_even_alpha is derived from the measured per-position profile where every position was counted
    (theory.profile_break_even_alpha), else it is the i.i.d. alpha*.

    Unknown inputs give unknown outputs (None, status "unknown"): break-even needs k and c; the measured speedup
    L / (1 + g c) needs only c, L and g. Where no alpha breaks even (c > 1 under the i.i.d. model) the i.i.d.
    alpha* is None and the i.i.d. status, where alpha's interval is known, is "losing".
    """
    if c is None:
        return Economics(c_source=c_source)
    if mean_draft_len == 0:  # nothing drafted: no speculation ran, whatever k was configured, so nothing to judge
        return Economics(c=c, c_source=c_source)
    be_alpha = be_iid = be_tokens = s_iid = be_basis = basis = None
    status = status_iid = "unknown"
    if k:
        be_raw = theory.break_even_alpha(k, c)
        be_iid = finite(be_raw)
        g = mean_draft_len if mean_draft_len else k
        be_tokens = float(theory.break_even_tokens(g, c))
        be_alpha, be_basis = be_iid, IID
        if positions and steps and all(p.checked for p in positions):
            be_alpha = theory.profile_break_even_alpha([p.checked for p in positions],
                                                       [p.accepted for p in positions], steps, be_tokens)
            be_basis = PROFILE
        if alpha.value is not None:
            s_iid = float(theory.speedup(alpha.value, k, c))
        if alpha.bounded:
            status_iid = segment_status(alpha.lo, alpha.hi, be_raw)  # type: ignore[arg-type]
        if tokens.bounded:
            status, basis = segment_status(tokens.lo, tokens.hi, be_tokens), TOKENS  # type: ignore[arg-type]
        elif alpha.bounded:
            status, basis = status_iid, IID
    s_measured = None
    if tokens.value is not None and mean_draft_len is not None:
        s_measured = finite(tokens.value / (1.0 + mean_draft_len * c))
    return Economics(finite(c), c_source, be_alpha, be_basis, be_iid, be_tokens, s_iid, s_measured, status, basis,
                     status_iid)


def at_cost(row: dict, c: float) -> Economics:
    """A summary row (SegmentSummary.to_dict) judged at another draft cost c, by the rule its own status came from
    (economics): what the Economics page's slider asks."""
    positions = tuple(PositionSummary(**p) for p in row.get("per_position") or ())
    return economics(row.get("k"), c, "given", Estimate(row.get("alpha"), row.get("alpha_lo"), row.get("alpha_hi")),
                     Estimate(row.get("tokens_per_step"), row.get("tokens_per_step_lo"), row.get("tokens_per_step_hi")),
                     row.get("mean_draft_len"), positions, row.get("steps") or 0)


@dataclass(frozen=True)
class PositionSummary:
    """One draft position of a segment: observed conditional and cumulative acceptance, predicted beta."""
    position: int
    checked: float
    accepted: float
    conditional: float | None
    conditional_lo: float | None
    conditional_hi: float | None
    cumulative: float | None
    beta: float | None
    beta_lo: float | None
    beta_hi: float | None


def position_summary(position: int, checked: float, accepted: float, steps: float, beta_lo: float | None = None,
                     beta_hi: float | None = None, sums: stats.RatioSums | None = None) -> PositionSummary:
    """A position's rates from its counts: conditional = accepted / checked, with alpha's interval
    (stats.cluster_interval) on this position's own clusters where `sums` gives them (accepted over checked at this
    position, per request, or per bin of engine windows, stats.SerialSums), since requests differ more at some
    positions than at others (EAGLE-style drafts most deep in the draft), so a design effect borrowed from alpha
    would be too wide at some positions and too narrow at others; cumulative = accepted / steps (vLLM's and
    llama.cpp's per-position rate). Without `sums`, no interval (a timeline's buckets, engine windows spanning too
    short a time); the counts still give the profile's break-even (economics)."""
    lo = hi = None
    if checked and sums is not None:
        iv = stats.cluster_interval(sums, CONFIDENCE)
        lo, hi = iv.lo, iv.hi
    return PositionSummary(position, checked, accepted, accepted / checked if checked else None, finite(lo),
                           finite(hi), accepted / steps if steps else None, point_beta(beta_lo, beta_hi),
                           finite(beta_lo), finite(beta_hi))


# Keys that only some sources report (the README's key table says which); to_dict leaves them out elsewhere.
SOURCE_KEYS = {
    "interval_dof": ("steplog", "engine"),
    "engine": ("engine",),
    "draft_acceptance_rate": ("engine",),
    "windows": ("engine", "replay"),
    "note": ("engine", "replay"),
    "predicted_positions": ("replay",),
    "running_requests": ("engine",),
    "generation_throughput": ("engine",),
}


@dataclass(frozen=True)
class SegmentSummary:
    """One segment (a run, a template, optionally a day or time bucket) from any source; README: key table."""
    run: str
    template: str | None
    day: str | None
    bucket_start: str | None
    demo: bool
    k: int | None
    steps: int
    requests: int | None
    drafted: float | None
    checked: float | None
    accepted: float | None
    alpha: Estimate
    design_effect: float | None
    interval_dof: float | None
    beta: Estimate
    gap_z: float | None
    agreement: str | None
    tokens_per_step: Estimate
    mean_draft_len: float | None
    economics: Economics
    first_ts: str | None
    last_ts: str | None
    source: str  # steplog, engine or replay
    costs: dict | None
    ts_inferred_steps: int
    last_ingest: str | None
    per_position: tuple[PositionSummary, ...]
    engine: str | None = None
    draft_acceptance_rate: float | None = None
    windows: int | None = None
    note: str | None = None
    predicted_positions: int | None = None
    running_requests: float | None = None  # mean over the segment's windows, where the engine printed it
    generation_throughput: float | None = None  # output tokens/s, mean over the windows

    @property
    def status(self) -> str:
        return self.economics.status

    @property
    def draft_lengths(self) -> list[load.DraftLength]:
        """What each shorter draft length would have given, from the measured per-position rates (no i.i.d.
        assumption: specmon.core.load.draft_lengths), where every position's cumulative rate is known."""
        rates = [p.cumulative for p in self.per_position]
        if not rates or any(r is None for r in rates) or not self.steps:
            return []
        known = [float(r) for r in rates if r is not None]
        deff = load.tokens_design_effect(known, float(self.steps), self.tokens_per_step.lo, self.tokens_per_step.hi,
                                         self.interval_dof)
        return load.draft_lengths(known, float(self.steps), self.economics.c, deff, self.interval_dof)

    def to_dict(self) -> dict[str, Any]:
        """The `specmon summary --json` object: estimates flattened to x, x_lo, x_hi; economics inlined."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SOURCE_KEYS and self.source not in SOURCE_KEYS[f.name]:
                continue
            if isinstance(value, Estimate):
                out[f.name], out[f"{f.name}_lo"], out[f"{f.name}_hi"] = value.value, value.lo, value.hi
            elif isinstance(value, Economics):
                out.update(asdict(value))
            elif f.name == "per_position":
                out[f.name] = [asdict(p) for p in value]
            else:
                out[f.name] = value
        if self.per_position:
            out["draft_lengths"] = [asdict(d) for d in self.draft_lengths]
        return out


def json_keys() -> set[str]:
    """Every key a `specmon summary --json` object can have (per-position keys aside)."""
    names = set()
    for f in fields(SegmentSummary):
        if f.type == "Estimate":
            names |= {f.name, f"{f.name}_lo", f"{f.name}_hi"}
        elif f.type == "Economics":
            names |= {g.name for g in fields(Economics)}
        else:
            names.add(f.name)
    return names | {"draft_lengths"}


def position_keys() -> set[str]:
    return {f.name for f in fields(PositionSummary)}
