"""What a person is told: one typed Finding per thing worth saying, gathered once (`gather`) and rendered by every
front: `specmon check` (its lines, its exit code and its JSON), the watcher's notices and webhook, the Overview and
the Drift page. The rule of what is a problem lives here and nowhere else.

A finding is one of
- a segment's status (run and template): a problem while losing or at risk; healthy and unknown are not problems
  (unknown is listed apart: the data cannot say, and `check` exits 2 for it);
- a drift alarm episode (specmon.drift.alarms): a problem, open or closed, within the period asked about;
- a template change or annotated rollout: a problem where it hurt acceptance or left it below break-even;
- a run's payoff at the load it serves now (specmon.analysis.load): a problem where its speedup at the current
  concurrency lies below 1 (losing at load) or its interval holds 1 (at risk at load).
The segment status is the batch-1 model's (verifying k + 1 tokens costs one target step); it says so, and says the
payoff at load where a load curve knows it.
Each has a subject (what it is about, stable while its state changes) and a state, so a watcher announces a finding
when its state changes and a restarted watcher does not repeat itself.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specmon.analysis import load, summary
from specmon.analysis.load import LoadCurve
from specmon.core.segments import IID, finite, is_problem, why_unknown
from specmon.core.settings import DEFAULT_ARL0_STEPS
from specmon.drift import alarms
from specmon.store.database import Store

SEGMENT, ALARM, TEMPLATE_CHANGE, LOAD = "segment", "alarm", "template_change", "load"
LOSING_AT_LOAD, AT_RISK_AT_LOAD, PAYING_AT_LOAD = "losing at load", "at risk at load", "paying at load"
# The states a finding moves through, as the watcher announces them (kind, state) -> event.
EVENTS = {
    (SEGMENT, "losing"): "segment_losing",
    (SEGMENT, "at risk"): "segment_at_risk",
    (SEGMENT, "recovered"): "segment_recovered",
    (ALARM, "open"): "alarm_opened",
    (ALARM, "closed"): "alarm_closed",
    (TEMPLATE_CHANGE, "hurt"): "template_change_hurt",
    (LOAD, LOSING_AT_LOAD): "losing_at_load",
    (LOAD, AT_RISK_AT_LOAD): "at_risk_at_load",
    (LOAD, "recovered"): "recovered_at_load",
}


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


@dataclass(frozen=True)
class Finding:
    """One thing worth telling a person, with the figures behind it."""

    kind: str  # SEGMENT, ALARM, TEMPLATE_CHANGE or LOAD
    subject: str  # what it is about: "status:<template>", "alarm:<change time>", "change:<template>:<time>"
    state: str  # a segment's status; an alarm's "open" / "closed"; a change's verdict, or "hurt"
    problem: bool  # `check` reports it (exit 1), the pages show it as an error
    run: str
    template: str
    tag: str  # what `check` prints before it: LOSING, AT RISK, DRIFT, TEMPLATE CHANGE, LOSING AT LOAD
    detail: str  # the finding in words, with its figures
    page: str  # the dashboard page that shows it: "overview" or "drift"
    at: datetime | None = None  # when it last held: an alarm's last alarm, a change's time
    alpha: float | None = None
    alpha_lo: float | None = None
    alpha_hi: float | None = None
    break_even: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # the figures, as `check --json` gives them

    @property
    def headline(self) -> str:
        """The one line `check` prints (and the webhook's detail)."""
        return f"{self.tag}: {self.detail}"

    @property
    def event(self) -> str | None:
        """The event this finding's state announces (None: nothing to announce, e.g. a healthy segment)."""
        return EVENTS.get((self.kind, self.state))


def _segment_finding(row: dict, curve: LoadCurve | None = None) -> Finding:
    status = row["status"]
    label = f"run {row['run']!r}, template {row['template'] or '-'!r}"
    if row.get("status_basis") == IID:  # a replay: predicted acceptance alone
        judged = (f"alpha = {_fmt(row['alpha'])} [95% CI {_fmt(row['alpha_lo'])}, {_fmt(row['alpha_hi'])}] vs "
                  f"break-even alpha* = {_fmt(row['break_even_alpha'])} (i.i.d. model)")
    else:
        judged = (f"tokens per step L = {_fmt(row['tokens_per_step'], '.2f')} [95% CI "
                  f"{_fmt(row['tokens_per_step_lo'], '.2f')}, {_fmt(row['tokens_per_step_hi'], '.2f')}] vs break-even "
                  f"1 + g c = {_fmt(row['break_even_tokens'], '.2f')} (alpha = {_fmt(row['alpha'])} [95% CI "
                  f"{_fmt(row['alpha_lo'])}, {_fmt(row['alpha_hi'])}], break-even alpha* = "
                  f"{_fmt(row['break_even_alpha'])})")
    detail = f"{label}: {judged} at k = {row['k']}, c = {_fmt(row['c'])}, at batch 1 ({at_load(curve)})"
    return Finding(SEGMENT, f"status:{row['template']}", status, is_problem(status), row["run"], row["template"],
                   status.upper(), detail, "overview", row.get("last_ts"), row.get("alpha"), row.get("alpha_lo"),
                   row.get("alpha_hi"), row.get("break_even_alpha"),
                   {k: row.get(k) for k in ("run", "template", "status", "status_basis", "tokens_per_step",
                                            "tokens_per_step_lo", "tokens_per_step_hi", "break_even_tokens", "alpha",
                                            "alpha_lo", "alpha_hi", "break_even_alpha", "c", "k", "steps")})


def at_load(curve: LoadCurve | None) -> str:
    """The payoff at load in a few words, as the batch-1 verdicts say it beside them."""
    if curve is None or not curve.known:
        return "payoff at load unknown: no throughput without speculation to compare with"
    words = curve.best.describe() if curve.best is not None else ""
    point = curve.at(curve.current) if curve.current is not None else None
    if point is None:
        return f"at load it {words}" + ("" if curve.current is None else
                                        f"; the current load, N = {curve.current:.3g}, was not measured")
    s = point.speedup
    return (f"at load it {words}; at the current N = {curve.current:.3g}: speedup {s.estimate:.2f}"
            + (f" [95% CI {s.lo:.2f}, {s.hi:.2f}]" if s.lo is not None and s.hi is not None else ""))


def _load_finding(curve: LoadCurve) -> Finding | None:
    """The run's payoff at its current load, where a load curve and a current concurrency know it."""
    point = curve.at(curve.current) if curve.current is not None else None
    if point is None or point.speedup.verdict == "unknown":
        return None
    sp = point.speedup
    verdict = sp.verdict
    state = LOSING_AT_LOAD if verdict == "loses" else AT_RISK_AT_LOAD if verdict == "even" else PAYING_AT_LOAD
    crossing = curve.crossings.get(point.k) or curve.best
    n_star = (f"break-even N* = {crossing.break_even:.3g} (pays up to {crossing.pays_up_to:g}, loses from "
              f"{crossing.loses_from:g})" if crossing is not None and crossing.crosses else
              "the measured curve " + (crossing.describe() if crossing is not None else "is unknown"))
    detail = (f"run {curve.run!r}, template {curve.template or '-'!r}: N = {curve.current:.3g} running requests, "
              f"{n_star}: S(N) = {sp.estimate:.2f} [95% CI {sp.lo:.2f}, {sp.hi:.2f}]"
              + (f" at k = {point.k}" if point.k is not None else "") + f"; baseline: {curve.baseline}")
    return Finding(LOAD, f"load:{curve.template}", state, state != PAYING_AT_LOAD, curve.run, curve.template,
                   state.upper(), detail, "load", None, point.alpha, point.alpha_lo, point.alpha_hi, None,
                   {"run": curve.run, "template": curve.template, "state": state, "concurrency": curve.current,
                    "k": point.k, "speedup": sp.estimate, "speedup_lo": sp.lo, "speedup_hi": sp.hi,
                    "break_even": crossing.break_even if crossing is not None else None,
                    "pays_up_to": crossing.pays_up_to if crossing is not None else None,
                    "loses_from": crossing.loses_from if crossing is not None else None})


def _alarm_finding(a: alarms.AlarmEvent, segment: dict) -> Finding:
    return Finding(
        ALARM, f"alarm:{a.change_ts.isoformat()}", "open" if a.open else "closed", True, a.run, a.template,
        "DRIFT", a.describe(), "drift", a.last_alarm_ts, a.alpha_after, segment.get("alpha_lo"),
        segment.get("alpha_hi"), a.break_even,
        {"run": a.run, "template": a.template, "change_ts": a.change_ts.isoformat(),
         "change_lo_ts": a.change_lo_ts.isoformat() if a.change_lo_ts else None,
         "change_hi_ts": a.change_hi_ts.isoformat() if a.change_hi_ts else None,
         "near": [e.describe() for e in a.near], "unit": a.design.unit,
         "alarm_ts": a.alarm_ts.isoformat(), "last_alarm_ts": a.last_alarm_ts.isoformat(),
         "alarms": a.alarms, "open": a.open, "alpha_before": a.alpha_before,
         "alpha_after": a.alpha_after, "p0": a.design.p0, "p1": a.design.p1, "h": a.design.h,
         "false_alarm_steps": a.design.arl0_steps, "reference_points": a.design.reference,
         "no_rate_reason": a.design.no_rate_reason()})


def _change_finding(ch: alarms.TemplateChange) -> Finding:
    c = ch.comparison
    return Finding(
        TEMPLATE_CHANGE, f"change:{ch.template}:{ch.first_ts.isoformat()}", "hurt" if ch.hurt else c.verdict,
        ch.hurt, ch.run, ch.template, "TEMPLATE CHANGE", ch.describe(), "drift", ch.first_ts, c.after.estimate,
        c.after.lo, c.after.hi, ch.break_even,
        {"run": ch.run, "template": ch.template, "previous": ch.previous, "first_ts": ch.first_ts.isoformat(),
         "verdict": c.verdict, "z": finite(c.z), "alpha_before": c.before.estimate, "alpha_after": c.after.estimate,
         "matching": c.matching, "difference": finite(c.difference), "hours": c.hours,
         "share_before": c.share_before, "share_after": c.share_after,
         "below_break_even": ch.below_break_even, "source": ch.source, "note": ch.note})


@dataclass(frozen=True)
class Verdict:
    """Everything gathered: the segments judged, every finding, the segments that cannot be judged and why."""

    since: datetime | None
    segments: list[dict]
    findings: list[Finding]
    runs: list[alarms.RunDrift]
    curves: list[LoadCurve]

    @property
    def demo_only(self) -> bool:
        """Nothing of the user's to judge: no segments, or only the demo data's."""
        return not self.segments or bool(self.segments[0]["demo"])

    @property
    def problems(self) -> list[Finding]:
        """What `check` reports, in order: segments losing or at risk (batch 1), runs losing or at risk at their
        load, alarms, changes that hurt."""
        return [f for f in self.findings if f.problem]

    @property
    def unknown(self) -> list[tuple[dict, str]]:
        """The segments whose status is unknown, with why."""
        return [(r, why_unknown(r)) for r in self.segments if r["status"] == "unknown"]

    def to_json(self) -> dict[str, Any]:
        """`specmon check --json`'s document."""
        return {
            "since": self.since.isoformat() if self.since else None,
            "problems": [f.headline for f in self.problems],
            "segments": [f.facts for f in self.findings if f.kind == SEGMENT],
            "alarms": [f.facts for f in self.findings if f.kind == ALARM],
            "template_changes": [_change_finding(ch).facts for r in self.runs for ch in r.changes],
            "load": [f.facts for f in self.findings if f.kind == LOAD],
        }


def segment_findings(rows: list[dict], curves: list[LoadCurve] | None = None) -> list[Finding]:
    """A finding per segment summary (specmon.analysis.summary): its batch-1 status, with its run's payoff at load
    where a load curve knows it (curves: specmon.analysis.load's)."""
    by_run = {c.run: c for c in curves or []}
    return [_segment_finding(r, by_run.get(r["run"])) for r in rows]


def load_findings(curves: list[LoadCurve]) -> list[Finding]:
    """A finding per run whose payoff at its current load is known."""
    return [f for f in map(_load_finding, curves) if f is not None]


def drift_findings(runs: list[alarms.RunDrift], rows: list[dict], since: datetime | None = None) -> list[Finding]:
    """The alarm episodes and template changes of analysed runs (specmon.drift.alarms), those at or after `since`;
    rows are the runs' segment summaries (an alarm carries its segment's interval)."""
    by_segment = {(r["run"], r["template"]): r for r in rows}
    out = [_alarm_finding(a, by_segment.get((a.run, a.template), {})) for r in runs for a in r.alarms
           if since is None or a.last_alarm_ts >= since]
    return out + [_change_finding(ch) for r in runs for ch in r.changes if since is None or ch.first_ts >= since]


def gather(store: Store, *, since: datetime | None = None, c: float | None = None,
           arl0_steps: int = DEFAULT_ARL0_STEPS, run: str | None = None,
           progress: Callable[[str], None] | None = None) -> Verdict:
    """Judge every segment (of one run, or all) and run the drift analysis of each run; `since` limits the steps,
    alarms and template changes looked at to those at or after it; progress(words) hears of the drift analysis's
    calibrations (alarms.analyse)."""
    rows = summary.summarize(store, by="template", c=c, since=since, per_position=False, run=run)
    if not rows or rows[0]["demo"]:
        return Verdict(since, rows, [], [], [])
    runs = alarms.analyse(store, c, arl0_steps, [run] if run else None, progress)
    curves = load.curves(store, run)
    return Verdict(since, rows, segment_findings(rows, curves) + load_findings(curves)
                   + drift_findings(runs, rows, since), runs, curves)


def announcements(findings: list[Finding], known: dict[str, str]) -> list[tuple[Finding, str]]:
    """What a watcher announces, given what it announced before (known: subject -> state): (finding, event) where a
    finding's state is new. A segment that stops being a problem announces its recovery; one first seen healthy, an
    alarm first seen already closed, and a change that did no harm announce nothing."""
    out = []
    for f in findings:
        previous = known.get(f.subject)
        if previous == f.state:
            continue
        if f.kind == SEGMENT and not f.problem:
            if f.state == "healthy" and previous is not None and is_problem(previous):
                out.append((f, EVENTS[(SEGMENT, "recovered")]))
            continue
        if f.kind == LOAD and not f.problem:
            if previous in (LOSING_AT_LOAD, AT_RISK_AT_LOAD):
                out.append((f, EVENTS[(LOAD, "recovered")]))
            continue
        if previous is None and f.kind == ALARM and f.state == "closed":
            continue
        if f.event is not None and f.problem:
            out.append((f, f.event))
    return out
