"""Drift alarms and template-change verdicts for any run in a store (the detector itself is specmon.drift.detector), and
rollout and speculation-period annotations.

A run is one stream in time order, across its templates: a template change is what usually moves acceptance, so
the reference window (the run's first points) stays the baseline across it. The stream is the run's verification
steps (clusters: requests) where it has a step log, else its engine windows, from engine logs or Prometheus
counter differences (each window a batch of checked/accepted positions; clusters: blocks of an engine's consecutive
windows, which requests rarely outlast). Template changes are
where a new template first appears in the data, and where an annotation (`specmon annotate`) says a rollout began.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import NoReturn

import numpy as np
import pandas as pd

from specmon.analysis import engine_segments, summary
from specmon.core import stats, theory
from specmon.core.faults import SpecmonError
from specmon.core.settings import DEFAULT_ARL0_STEPS
from specmon.drift import calibration, detector
from specmon.drift import state as drift_state
from specmon.drift.state import State
from specmon.store.database import Store
from specmon.store.processes import die_with_parent

_ANNOTATIONS_SQL = """
SELECT a.annotation_id, a.template, a.starts_at, a.note, a.created_at FROM annotations a JOIN runs r USING (run_id)
WHERE r.name = ? ORDER BY a.starts_at, a.annotation_id
"""


# What a kept template-change verdict was judged with: another method makes the kept ones stale.
VERDICTS_VERSION = 2


@dataclass(frozen=True)
class Event:
    """Something that changed at a known time: a template first seen in the data, or an annotation."""

    ts: datetime
    template: str
    source: str  # "data" or "annotation"
    note: str | None = None

    def describe(self) -> str:
        what = "annotated rollout of" if self.source == "annotation" else "first steps of"
        return (f"{what} template {self.template or '-'!r} at {self.ts:%Y-%m-%d %H:%M} UTC"
                + (f" ({self.note})" if self.note else ""))


@dataclass(frozen=True)
class AlarmEvent:
    run: str
    template: str
    change_ts: datetime  # maximum-likelihood start of the drop
    alarm_ts: datetime  # first alarm of the episode
    last_alarm_ts: datetime
    alarms: int  # alarms in the episode (the CUSUM restarts after each)
    open: bool  # still alarming at the end of the data
    alpha_before: float
    alpha_after: float
    design: detector.Design
    break_even: float | None
    change_lo_ts: datetime | None = None  # the change's likely range
    change_hi_ts: datetime | None = None
    near: tuple[Event, ...] = ()  # template changes and annotations inside the likely range

    def describe(self) -> str:
        be = f" (break-even {self.break_even:.3f})" if self.break_even is not None else ""
        if self.alpha_after < self.alpha_before:
            what = f"acceptance fell from {self.alpha_before:.3f} to {self.alpha_after:.3f}{be}"
        else:  # the CUSUM sums stretches of low acceptance, which an average from the change on can hide
            what = (f"stretches of low acceptance set off the CUSUM, though on the whole it did not fall "
                    f"({self.alpha_before:.3f} in the reference, {self.alpha_after:.3f} since){be}")
        text = (f"run {self.run!r}: {what} from about {self.change_ts:%Y-%m-%d %H:%M} UTC (template "
                f"{self.template or '-'!r}")
        if self.change_lo_ts is not None and self.change_hi_ts is not None:
            text += (f"; likely between {self.change_lo_ts:%Y-%m-%d %H:%M} and {self.change_hi_ts:%Y-%m-%d %H:%M}")
        text += ")"
        if self.near:
            text += "; it coincides with the " + " and the ".join(e.describe() for e in self.near)
        return (text + f"; CUSUM alarm at {self.alarm_ts:%Y-%m-%d %H:%M} UTC, {self.alarms} alarm(s) to "
                f"{self.last_alarm_ts:%Y-%m-%d %H:%M} UTC{' and still open' if self.open else ''}; "
                f"{self.hours_words()}; {self.design.threshold_words()}")

    def hours_words(self) -> str:
        """The hours of the day (UTC) from the change to the last alarm: a drop that keeps to the same hours day
        after day is more likely the traffic mix swinging with the clock than drift."""
        span = self.last_alarm_ts - self.change_ts
        if span.total_seconds() >= 86_400:
            return "it covers every hour of the day"
        first, last = self.change_ts.hour, self.last_alarm_ts.hour
        hours = f"{first:02d}:00-{(last + 1) % 24:02d}:00 UTC"
        return f"it covers the hours {hours}" + (" (across midnight)" if last < first or (
            last == first and span.total_seconds() > 3600) else "")


@dataclass(frozen=True)
class TemplateChange:
    run: str
    template: str
    previous: str
    first_ts: datetime  # when the change happened (first seen in the data, or the annotation's time)
    comparison: detector.Comparison
    break_even: float | None
    source: str = "data"  # "data": a new template in the data; "annotation": a recorded rollout
    note: str | None = None

    @property
    def below_break_even(self) -> bool:
        return bool(self.break_even is not None and self.comparison.after.hi < self.break_even)

    @property
    def hurt(self) -> bool:
        """A finding (`specmon check` exits 1, the Drift page shows it as an error): acceptance dropped
        significantly on matched hours, or now lies below break-even."""
        return self.comparison.verdict == "hurt" or self.below_break_even

    def describe(self) -> str:
        c = self.comparison
        how = "annotated rollout" if self.source == "annotation" else "template"
        sides = (f"alpha {c.before.estimate:.3f} [{c.before.lo:.3f}, {c.before.hi:.3f}] -> {c.after.estimate:.3f} "
                 f"[{c.after.lo:.3f}, {c.after.hi:.3f}]")
        head = f"run {self.run!r}: {how} {self.previous or '-'!r} -> {self.template or '-'!r} at " \
               f"{self.first_ts:%Y-%m-%d %H:%M} UTC"
        if c.verdict == detector.DIFFERENT_HOURS:
            text = (f"{head}: the two sides cover different hours, so the data cannot tell a change of template "
                    f"from the time of day: {sides} (each side's own)")
        elif c.verdict == detector.ONE_HOUR:
            text = (f"{head}: the two sides share one matched hour, too few to tell a change of template from that "
                    f"hour's own noise: {sides} (each side's own), a difference of {c.difference:+.3f} there")
        else:
            words = {"hurt": "hurt acceptance", "helped": "raised acceptance",
                     "no detectable change": "made no change that the data can detect"}[c.verdict]
            where = ("hour by hour, the two served side by side" if c.matching == "same hours" else
                     f"on the {c.hours} hours of day both cover")
            text = (f"{head} {words}: {sides}; compared {where} ({c.share_before:.0%} and {c.share_after:.0%} of "
                    f"the sides' positions), a difference of {c.difference:+.3f}, z = {c.z:.1f}")
        if self.note:
            text += f" ({self.note})"
        if self.below_break_even:
            text += f"; now below break-even {self.break_even:.3f}"
        return text


@dataclass(frozen=True)
class RunDrift:
    run: str
    design: detector.Design | None
    alarms: list[AlarmEvent]
    changes: list[TemplateChange]
    cusum: pd.DataFrame  # ts, W: the detector's statistic over time (at most CHART_POINTS rows)
    unit: str = "steps"  # what one stream point is: "steps" or "windows"
    note: str | None = None  # why there is no detector, where there is none
    annotations: list[Event] = field(default_factory=list)


@dataclass(frozen=True)
class Stream:
    accepted: np.ndarray
    checked: np.ndarray
    ts_us: np.ndarray
    cluster: np.ndarray
    template: np.ndarray  # the data's template at each point (object array)
    k: int
    unit: str


def annotate(store: Store, run: str, template: str, at: datetime, note: str | None = None) -> int:
    """Record a rollout of `template` in `run` from `at` (UTC); returns the annotation's id."""
    if not template:
        raise SpecmonError("annotate: --template must name the template rolled out")
    with store.transaction() as cur:
        found = cur.execute("SELECT run_id FROM runs WHERE name = ?", [run]).fetchone()
        if found is None:
            names = [r[0] for r in cur.execute("SELECT name FROM runs WHERE NOT demo ORDER BY name").fetchall()]
            raise SpecmonError(f"annotate: no run named {run!r} in {store.path}"
                               + (f" (runs: {', '.join(map(repr, names))})" if names else " (it holds no runs)"))
        created = datetime.now(timezone.utc).replace(tzinfo=None)
        return cur.execute("INSERT INTO annotations (run_id, template, starts_at, note, created_at) "
                           "VALUES (?, ?, ?, ?, ?) RETURNING annotation_id",
                           [found[0], template, at, note, created]).fetchall()[0][0]


def annotate_speculation(store: Store, run: str, speculation: bool, at: datetime, note: str | None = None) -> int:
    """Record that `run` served with speculation off (or on again) from `at` (UTC), until its next such period;
    windows of an off period are measured as the run's own baseline. Returns the period's id."""
    with store.transaction() as cur:
        found = cur.execute("SELECT run_id FROM runs WHERE name = ?", [run]).fetchone()
        if found is None:
            names = [r[0] for r in cur.execute("SELECT name FROM runs WHERE NOT demo ORDER BY name").fetchall()]
            raise SpecmonError(f"annotate: no run named {run!r} in {store.path}"
                               + (f" (runs: {', '.join(map(repr, names))})" if names else " (it holds no runs)"))
        created = datetime.now(timezone.utc).replace(tzinfo=None)
        return cur.execute("INSERT INTO speculation_periods (run_id, starts_at, speculation, note, created_at) "
                           "VALUES (?, ?, ?, ?, ?) RETURNING period_id",
                           [found[0], at, speculation, note, created]).fetchall()[0][0]


def run_annotations(store: Store, run: str) -> list[Event]:
    df = store.query_df(_ANNOTATIONS_SQL, [run])
    return [Event(r.starts_at.to_pydatetime(), r.template, "annotation", r.note if isinstance(r.note, str) else None)
            for r in df.itertuples(index=False)]


def _window_stream(store: Store, run: str) -> Stream | None:
    """Engine windows with per-position counts, as points: (accepted, checked) positions per window, each in its
    block (engine_segments.window_blocks), numbered in order of first appearance."""
    df = engine_segments.checked_windows(store, run)
    if df.empty:
        return None
    a, n = df["accepted"].to_numpy(dtype=float), df["checked"].to_numpy(dtype=float)
    ts = df["end_ts"].to_numpy(dtype="datetime64[us]").astype(np.int64)
    blocks = pd.factorize(engine_segments.window_blocks(df))[0].astype(np.int64)
    return Stream(a, n, ts, blocks, df["template"].to_numpy(dtype=object),
                  int(df["k"].max()) if df["k"].notna().any() else 1, "windows")


def _events(stream: Stream, notes: list[Event]) -> list[Event]:
    """Template changes in time order: each template's first point in the data, then the annotations."""
    _, first = np.unique(stream.template, return_index=True)
    seen = [Event(_when(stream.ts_us[i]), stream.template[i], "data") for i in sorted(first)][1:]
    # a template first seen after an annotation that rolled it out is that rollout (the watcher files data stored
    # after an annotation under its template): one event, the annotation's
    seen = [e for e in seen if not any(n.template == e.template and n.ts <= e.ts for n in notes)]
    return sorted(seen + notes, key=lambda e: e.ts)


def _when(ts_us: int) -> datetime:
    return pd.Timestamp(int(ts_us), unit="us").to_pydatetime()


def _cells(stream: Stream, mask: np.ndarray) -> detector.Cells:
    """The points in mask as cells of a comparison, in their clusters: steps by request, engine windows by their
    WINDOW_BLOCK_SECONDS blocks (never the longer blocks of long segments' intervals, which would fill whole hours,
    the strata)."""
    ts = stream.ts_us[mask]
    return detector.Cells(stream.cluster[mask], ts - ts % detector.HOUR_US, stream.accepted[mask], stream.checked[mask],
                          ts, ts)


def _changes(run: str, stream: Stream, events: list[Event], break_even: float | None) -> list[TemplateChange]:
    """A data template change compares the previous template's points with the new one's (so templates served
    side by side stay apart); an annotation compares the points between the previous change and it with those
    between it and the next."""
    out = []
    times = [np.datetime64(e.ts, "us").astype(np.int64) for e in events]
    for i, event in enumerate(events):
        t = times[i]
        prev_t = times[i - 1] if i else np.iinfo(np.int64).min
        next_t = times[i + 1] if i + 1 < len(events) else np.iinfo(np.int64).max
        previous = events[i - 1].template if i else _template_at(stream, int(t))
        if event.source == "data":
            earlier = stream.template[stream.ts_us < t]
            previous = earlier[-1] if len(earlier) else previous
            before, after = stream.template == previous, stream.template == event.template
        else:
            before = (stream.ts_us >= prev_t) & (stream.ts_us < t)
            after = (stream.ts_us >= t) & (stream.ts_us < next_t)
        if not before.any() or not after.any():
            continue
        # blocks of engine windows share long requests: the hours, not the blocks, are the observations
        comparison = detector.compare(_cells(stream, before), _cells(stream, after), stream.unit != "steps")
        out.append(TemplateChange(run, event.template, previous, event.ts, comparison, break_even, event.source,
                                  event.note))
    return out


def _template_at(stream: Stream, t: int) -> str:
    earlier = stream.template[stream.ts_us < t]
    return earlier[-1] if len(earlier) else stream.template[0]


def _chart_frame(ts_us: np.ndarray, w: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"ts": pd.to_datetime(ts_us, unit="us"), "W": w})


def break_even_alpha(store: Store, run: str, c: float | None, k: int) -> float | None:
    """The run's break-even alpha*, as its summary shows it (from the measured per-position profile of its step log,
    or else its engine windows), else from the c given and the stream's k."""
    found = summary.step_economics(store, run, c)
    if found is not None:
        if found.c is None:
            return None  # the step log's c is unknown, and so is its engine and replay rows' (given or declared)
        if found.break_even_alpha is not None:
            return found.break_even_alpha
    elif c is None and run not in summary.declared_costs(store):
        return None  # engine and replay rows take c only as given or declared: spare their summary (every window)
    rows = summary.summarize(store, by="run", c=c, run=run, per_position=False)
    for row in rows:
        if row["break_even_alpha"] is not None:
            return row["break_even_alpha"]
    if c is not None and k >= 1:  # a run whose steps drafted nothing has no break-even
        be = theory.break_even_alpha(k, c)
        return None if np.isnan(be) else be
    return None


def analyse_run(store: Store, run: str, c: float | None = None,
                arl0_steps: int = DEFAULT_ARL0_STEPS) -> RunDrift:
    """Calibrate the detector on the run's first points, run it, date each drop, and judge every template change
    and annotation. Works on step logs, engine log windows and Prometheus samples alike. A step log's detector
    advances a kept state by the steps stored since (specmon.drift.state), saved afterwards where the database is
    free; on one connection."""
    kept = Kept()
    with store.reading():
        result = analyse_unsaved(store, run, c, arl0_steps, kept)
    if kept.state is not None:
        drift_state.remember(drift_state.identity(store), run, kept.state)
    if kept.changed or kept.calibrations:
        drift_state.save(store, run, kept.state if kept.changed else None, kept.calibrations)
    return result


@dataclass
class Kept:
    """What an analysis leaves to keep: the detector's state, whether it moved, and new thresholds. known: where
    given, the thresholds the caller holds; a threshold neither there nor stored raises drift_state.Uncalibrated
    instead of being calibrated inside the reading block (analyse)."""

    state: State | None = None
    changed: bool = False
    calibrations: dict[str, calibration.Threshold] = field(default_factory=dict)
    known: dict[str, calibration.Threshold] | None = None
    stored: drift_state.StoredStates | None = None  # the kept states, read for many runs at once (analyse)

    def threshold(self, cur) -> Callable[..., calibration.Threshold]:
        if self.known is not None:
            return drift_state.known_threshold(cur, self.known)
        return drift_state.stored_threshold(cur, self.calibrations)


def analyse_unsaved(store: Store, run: str, c: float | None, arl0_steps: int, kept: Kept) -> RunDrift:
    """The analysis of analyse_run, leaving what it would save in `kept` (analyse_run saves it afterwards)."""
    notes = run_annotations(store, run)
    steps = _step_drift(store, run, c, arl0_steps, notes, kept)
    if steps is not None:
        return steps
    stream = _window_stream(store, run)
    if stream is None:
        return RunDrift(run, None, [], [], pd.DataFrame(columns=["ts", "W"]), note="the run has no step log and no "
                        "engine windows with per-position counts, so per-token acceptance (what the detector "
                        "watches) is unknown", annotations=notes)
    with store.cursor() as cur:  # the reading block's connection
        return whole_stream_drift(store, run, stream, c, arl0_steps, notes, kept.threshold(cur))


def whole_stream_drift(store: Store, run: str, stream: Stream, c: float | None, arl0_steps: int,
                       notes: list[Event], threshold: Callable[..., calibration.Threshold] | None = None) -> RunDrift:
    """The analysis of a stream held whole in memory: engine windows (few), and what a step log's kept state must
    equal (tests/drift/test_state.py). threshold: as calibration.design_for's."""
    empty = pd.DataFrame(columns=["ts", "W"])
    break_even = break_even_alpha(store, run, c, stream.k)
    events = _events(stream, notes)
    changes = _changes(run, stream, events, break_even)
    reference = detector.first_reference(stream.unit)
    design = calibration.design_for(stream.accepted, stream.checked, stream.cluster, stream.k, break_even, arl0_steps,
                              reference, unit=stream.unit, threshold=threshold, ts_us=stream.ts_us)
    if design is None:
        return RunDrift(run, None, [], changes, empty, stream.unit, "the reference window has no checked positions",
                        notes)
    # the reference grows at the checkpoints (docs/drift.md)
    grow = calibration.redesigner(lambda c: (stream.accepted, stream.checked, stream.cluster, stream.ts_us), stream.k,
                                  break_even, arl0_steps, stream.unit, threshold)
    w, raw, designs = detector.detect(stream.accepted, stream.checked, design, reference, grow)
    found = []
    for a in raw:
        lo, hi = _when(stream.ts_us[a.change_lo]), _when(stream.ts_us[a.change_hi])
        # the change began after the point before the first likely one (for a window: during it)
        after = _when(stream.ts_us[max(a.change_lo - 1, 0)])
        near = tuple(e for e in events if after < e.ts <= hi)
        # the template in force when the drop began: the last change (in the data or annotated) before it
        in_force = [e for e in events if e.ts <= _when(stream.ts_us[a.change_index])]
        template = in_force[-1].template if in_force else stream.template[a.change_index]
        found.append(AlarmEvent(run, template, _when(stream.ts_us[a.change_index]), _when(stream.ts_us[a.alarm_index]),
                                _when(stream.ts_us[a.last_alarm_index]), a.count,
                                bool(len(w) - a.last_alarm_index <= detector.EPISODE_GAP), a.alpha_before,
                                a.alpha_after, a.design, break_even, lo, hi, near))
    return RunDrift(run, designs[-1][1], found, changes, _chart_frame(*drift_state.chart_points(stream.ts_us, w)),
                    stream.unit, None, notes)


def _step_drift(store: Store, run: str, c: float | None, arl0_steps: int, notes: list[Event],
                kept: Kept) -> RunDrift | None:
    """The analysis of a run's step log from its kept state, None where the run has no steps."""
    with store.cursor() as cur:
        names = dict(cur.execute("SELECT segment_id, template FROM run_segments WHERE run = ? ORDER BY segment_id",
                                 [run]).fetchall())
        ids = list(names)
        if not ids:
            return None
        total, k = cur.execute(f"SELECT sum(steps), max(k) FROM rollup_requests WHERE segment_id IN "
                               f"({', '.join('?' * len(ids))})", ids).fetchall()[0]
        if not total:
            return None
        break_even = break_even_alpha(store, run, c, int(k))
        where = drift_state.identity(store)
        state = _current_state(cur, where, run, ids, int(total), int(k), break_even, arl0_steps, kept)
        empty = pd.DataFrame(columns=["ts", "W"])
        firsts = state.firsts if state is not None else _firsts(cur, ids)
        events = _step_events(names, firsts, notes)
        changes = _step_verdicts(cur, run, names, firsts, events, break_even, state, kept)
    if state is None:
        return RunDrift(run, None, [], changes, empty, "steps", "the reference window has no checked positions",
                        notes)
    design = state.design
    found = []
    for e in state.episodes:
        change_ts, after, hi = _when(e.ts_us["change"]), _when(e.ts_us["after"]), _when(e.ts_us["hi"])
        near = tuple(ev for ev in events if after < ev.ts <= hi)
        in_force = [ev for ev in events if ev.ts <= change_ts]
        template = in_force[-1].template if in_force else names[e.segment]
        used = state.designs[e.design][1]
        found.append(AlarmEvent(run, template, change_ts, _when(e.ts_us["alarm"]), _when(e.ts_us["last"]), e.count,
                                bool(state.points - e.last <= detector.EPISODE_GAP), used.p0, e.alpha_after, used,
                                break_even, _when(e.ts_us["lo"]), hi, near))
    chart = _chart_frame(np.array([p[0] for p in state.chart], dtype=np.int64),
                         np.array([p[1] for p in state.chart], dtype=float))
    return RunDrift(run, design, found, changes, chart, "steps", None, notes)


def _step_verdicts(cur, run: str, names: dict[int, str], firsts: list[list], events: list[Event],
                   break_even: float | None, state: State | None, kept: Kept) -> list[TemplateChange]:
    """The template-change verdicts: kept in the state while its points, the events and the break-even are the
    same (the page reruns after every write, a fresh `check` reads them back), else judged again and kept."""
    key = [[e.ts.isoformat(), e.template, e.source, e.note] for e in events] + [break_even, VERDICTS_VERSION]
    if state is not None and state.verdicts is not None and state.verdicts["key"] == key:
        return [_change_from_json(c) for c in state.verdicts["changes"]]
    changes = _step_changes(cur, run, names, firsts, events, break_even)
    if state is not None:
        state.verdicts = {"key": key, "changes": [_change_json(c) for c in changes]}
        kept.changed = True
    return changes


def _change_json(ch: TemplateChange) -> dict:
    return {**asdict(ch), "first_ts": ch.first_ts.isoformat()}


def _change_from_json(d: dict) -> TemplateChange:
    c = d["comparison"]
    comparison = detector.Comparison(**{**c, "before": stats.Interval(**c["before"]),
                                        "after": stats.Interval(**c["after"])})
    return TemplateChange(**{**d, "first_ts": datetime.fromisoformat(d["first_ts"]), "comparison": comparison})


def _current_state(cur, path: tuple, run: str, ids: list[int], total: int, k: int, break_even: float | None,
                   arl0_steps: int, kept: Kept) -> State | None:
    """The detector's state after every stored step: a kept one of this design advanced by the steps after its
    last point, where it still describes the stream, else built from every step. None if the reference has no
    checked positions."""
    # a checkpoint's thresholds are stored like the first's
    redesign = calibration.redesigner(functools.partial(_head, cur, ids), k, break_even, arl0_steps, "steps",
                                kept.threshold(cur))
    for state in drift_state.load_states(cur, path, run, kept.stored):
        # every design in force (the reference's, then each checkpoint's) must watch for the p1 asked for now
        designs = [d for _, d in state.designs]
        key = drift_state.design_key(calibration.target_p1(designs[0].p0, break_even), arl0_steps)
        if state.design_key != key or any(d.p1 != calibration.target_p1(d.p0, break_even) for d in designs):
            continue
        if state.points != total:
            # a state of fewer points than the reference would change its reference; steps that arrived before its
            # last point make the count disagree: neither describes the stream any more
            if state.points < detector.REFERENCE_STEPS or state.points + drift_state.count_after(
                    cur, ids, state.last_key) != total:
                continue
            state = _advance_all(cur, ids, state, redesign)
            kept.changed = True
        if any(d.k != k for _, d in state.designs):
            state = replace(state, designs=[[t, replace(d, k=k)] for t, d in state.designs])
            kept.changed = True
        kept.state = state
        return state
    first = drift_state.read_points(cur, ids, limit=drift_state.CHUNK_POINTS,
                                    before_us=next(drift_state.chunk_ends(cur, ids, None, drift_state.CHUNK_POINTS)))
    design = calibration.design_for(first.accepted, first.checked, first.cluster, k, break_even, arl0_steps,
                              detector.REFERENCE_STEPS, unit="steps",
                              threshold=kept.threshold(cur), ts_us=first.ts_us)
    if design is None:
        return None
    fresh = State(drift_state.design_key(design.p1, arl0_steps),
                  drift_state.reference_hash(first.take(0, detector.REFERENCE_STEPS)),
                  designs=[[detector.REFERENCE_STEPS, design]])
    kept.state = _advance_all(cur, ids, drift_state.advance(fresh, first, _never, _never, redesign), redesign)
    kept.changed = True
    return kept.state


def _never(*_: object) -> NoReturn:
    raise AssertionError("a state built from the first point has nothing taken in before")


def _head(cur, ids: list[int], c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The run's first c steps (a checkpoint's reference): accepted, checked, request and time of each."""
    head = drift_state.read_points(cur, ids, limit=c, before_us=next(drift_state.chunk_ends(cur, ids, None, c)))
    return head.accepted, head.checked, head.cluster, head.ts_us


def _advance_all(cur, ids: list[int], state: State, redesign: Callable[[int], detector.Design]) -> State:
    """The state advanced by every stored step after its last point, read about CHUNK_POINTS at a time (memory
    stays bounded however long the run)."""
    limit = drift_state.CHUNK_POINTS
    for before_us in drift_state.chunk_ends(cur, ids, state.last_key, limit):
        while True:
            new = drift_state.read_points(cur, ids, after=state.last_key, limit=limit, before_us=before_us)
            state = drift_state.advance(state, new, functools.partial(_older, cur, ids, state.last_key),
                                        functools.partial(drift_state.segment_before, cur, ids), redesign)
            if len(new) < limit:
                break
    return state


def _older(cur, ids: list[int], upto: tuple[int, int], since: int, key: tuple[int, int]) -> drift_state.Points:
    """The points taken in already, from index `since` (at `key`) to the kept state's last one."""
    return drift_state.read_points(cur, ids, start=key, upto=upto)


def _firsts(cur, ids: list[int]) -> list[list]:
    """Each segment's first step, in stream order (what a state keeps; for a run without a detector)."""
    rows = cur.execute(f"SELECT segment_id, epoch_us(ts), step_id FROM (SELECT segment_id, ts, step_id, row_number() "
                       f"OVER (PARTITION BY segment_id ORDER BY ts, step_id) AS i FROM steps WHERE segment_id IN "
                       f"({', '.join('?' * len(ids))})) WHERE i = 1 ORDER BY 2, 3", ids).fetchall()
    return [[seg, ts, step, drift_state.segment_before(cur, ids, ts)] for seg, ts, step in rows]


def _step_events(names: dict[int, str], firsts: list[list], notes: list[Event]) -> list[Event]:
    """Template changes in time order: each template's first step, then the annotations (as _events)."""
    seen = [Event(_when(ts), names[seg], "data") for seg, ts, _, _ in firsts][1:]
    seen = [e for e in seen if not any(n.template == e.template and n.ts <= e.ts for n in notes)]
    return sorted(seen + notes, key=lambda e: e.ts)


def _step_changes(cur, run: str, names: dict[int, str], firsts: list[list], events: list[Event],
                  break_even: float | None) -> list[TemplateChange]:
    """_changes for a step log, from the rollups' per-request, per-hour sums (the cut hours of an annotation's
    stretch from the steps) rather than the steps."""
    out = []
    ids = list(names)
    by_name = {name: seg for seg, name in names.items()}
    prior = {names[seg]: before for seg, _, _, before in firsts}
    first_template = names[firsts[0][0]]
    times = [int(np.datetime64(e.ts, "us").astype(np.int64)) for e in events]
    for i, event in enumerate(events):
        t = times[i]
        if event.source == "data":
            seg = prior.get(event.template)
            previous = names[seg] if seg is not None else events[i - 1].template if i else first_template
            if previous not in by_name:
                continue
            before = _step_cells(cur, [by_name[previous]])
            after = _step_cells(cur, [by_name[event.template]])
        else:
            seg = None if i else drift_state.segment_before(cur, ids, t)
            previous = events[i - 1].template if i else names[seg] if seg is not None else first_template
            before = _step_cells(cur, ids, times[i - 1] if i else None, t)
            after = _step_cells(cur, ids, t, times[i + 1] if i + 1 < len(events) else None)
        if not len(before.cluster) or not len(after.cluster):
            continue
        out.append(TemplateChange(run, event.template, previous, event.ts, detector.compare(before, after),
                                  break_even, event.source, event.note))
    return out


def _step_cells(cur, segments: list[int], lo_us: int | None = None, hi_us: int | None = None) -> detector.Cells:
    """The comparison cells (request and hour) of the segments' steps with lo_us <= ts < hi_us (None: unbounded):
    whole hours from the rollups, the cut hours' steps on the spot; requests keyed as the stream keys them."""
    marks = ", ".join("?" * len(segments))
    hour = detector.HOUR_US
    hour_lo = None if lo_us is None else -(-lo_us // hour) * hour  # the first whole hour inside
    hour_hi = None if hi_us is None else hi_us - hi_us % hour  # the end of the last whole hour inside
    parts = [f"SELECT hash(request_id) AS q, epoch_us(hour) AS h, accepted, checked, epoch_us(first_ts) AS t0, "
             f"epoch_us(last_ts) AS t1 FROM rollup_requests WHERE segment_id IN ({marks})"
             + (" AND epoch_us(hour) >= ?" if hour_lo is not None else "")
             + (" AND epoch_us(hour) < ?" if hour_hi is not None else "")]
    params: list = [*segments] + [t for t in (hour_lo, hour_hi) if t is not None]
    edges: list[tuple[int, int]] = []
    if lo_us is not None and hour_lo is not None and lo_us < hour_lo:
        edges.append((lo_us, hour_lo if hi_us is None else min(hour_lo, hi_us)))
    if hi_us is not None and hour_hi is not None and hour_hi < hi_us and (hour_lo is None or hour_hi >= hour_lo):
        edges.append((hour_hi, hi_us))
    for a, b in edges:
        parts.append(f"SELECT hash(request_id), epoch_us(ts) - epoch_us(ts) % {hour}, accepted, checked, "
                     f"epoch_us(ts), epoch_us(ts) FROM steps WHERE segment_id IN ({marks}) AND epoch_us(ts) >= ? "
                     "AND epoch_us(ts) < ?")
        params += [*segments, a, b]
    rows = cur.execute("SELECT q, h, sum(accepted)::DOUBLE AS a, sum(checked)::DOUBLE AS n, min(t0) AS t0, "
                       "max(t1) AS t1 FROM (" + " UNION ALL ".join(parts) + ") GROUP BY q, h ORDER BY q, h",
                       params).fetchnumpy()
    return detector.Cells(np.asarray(rows["q"]), np.asarray(rows["h"]), np.asarray(rows["a"], dtype=float),
                          np.asarray(rows["n"], dtype=float), np.asarray(rows["t0"]), np.asarray(rows["t1"]))


READ_SLICE_S = 1.0  # how long analyse reads on one connection before it lets waiting writers in
YIELD_S = 0.25  # how long it then leaves the database free: longer than a writer's wait between its tries (0.2 s)


def analyse(store: Store, c: float | None = None, arl0_steps: int = DEFAULT_ARL0_STEPS,
            runs: list[str] | None = None, progress: Callable[[str], None] | None = None) -> list[RunDrift]:
    """analyse_run of every run (or those named), what each gives, with the database held briefly: runs are
    analysed on one read-only connection for READ_SLICE_S at a time, then the database is left free for YIELD_S; a
    run whose reference is not calibrated yet is put aside, and the references all such runs need are calibrated
    together once the connection is closed, in parallel processes (one per core), their thresholds stored in a
    short write, and those runs analysed again (a checkpoint's reference is found when they are analysed again; a run
    whose reference changes between analyses, its first steps still arriving, is calibrated in place, as analyse_run
    does). The runs' drift states are published at the end in one transaction. progress(words) is told before each
    round of calibrations, the one wait that lasts seconds."""
    names = summary.run_names(store) if runs is None else list(runs)
    done: dict[str, tuple[RunDrift, Kept]] = {}
    known: dict[str, calibration.Threshold] = {}
    unsaved: dict[str, calibration.Threshold] = {}
    asked: dict[str, int] = {}  # the size of the reference each run waits for
    in_place: set[str] = set()
    pending = names
    calibrated = False  # whether references were calibrated already: those asked for later are checkpoints'
    while pending:
        wanted: dict[str, dict] = {}
        waiting: list[str] = []
        i = 0
        while i < len(pending):
            if i:
                time.sleep(YIELD_S)
            with store.reading(), store.cursor() as cur:
                stored = drift_state.StoredStates(cur, pending[i:])
                start = time.monotonic()
                while i < len(pending) and time.monotonic() - start < READ_SLICE_S:
                    run = pending[i]
                    kept = Kept(known=None if run in in_place else known, stored=stored)
                    i += 1
                    try:
                        done[run] = (analyse_unsaved(store, run, c, arl0_steps, kept), kept)
                        unsaved.update(kept.calibrations)
                    except drift_state.Uncalibrated as need:
                        wanted.setdefault(need.key, need.kwargs)
                        waiting.append(run)
                        # a run asks again only for a checkpoint's longer reference after a whole first one; any
                        # other request means its reference changed under the analysis (steps still arriving in
                        # it), and it is calibrated in place next time rather than chased again and again
                        size, before = len(need.kwargs["accepted"]), asked.get(run)
                        first = detector.first_reference(need.kwargs["unit"])
                        if before is not None and not (before >= first and size > before):
                            in_place.add(run)
                        asked[run] = size
        if wanted:
            found = _calibrate_all(wanted, len(set(waiting)), progress, again=calibrated)
            calibrated = True
            known.update(found)
            unsaved.update(found)
            if drift_state.save_many(store, {}, unsaved):  # kept at once: each cost seconds
                unsaved = {}
        pending = waiting
    where = drift_state.identity(store)
    states = {}
    for run, (_, kept) in done.items():
        if kept.state is not None:
            drift_state.remember(where, run, kept.state)
            if kept.changed:
                states[run] = kept.state
    if states or unsaved:
        drift_state.save_many(store, states, unsaved)
    return [done[run][0] for run in names]


def _calibrate_all(wanted: dict[str, dict], runs: int, progress: Callable[[str], None] | None,
                   again: bool = False) -> dict[str, calibration.Threshold]:
    """calibration.calibrate_threshold of each key's arguments (the references of that many runs), in processes of
    their own, in parallel where there are several; progress(words) is told first, naming the references' sizes
    (again: references grown to a checkpoint's, after a first calibration). Even one runs apart: its simulated streams
    take about 0.4 GB at the default rate, which the caller (an ingest that just read a large file, a check holding
    engine windows) would add to its own peak."""
    workers = _workers(len(wanted))
    if progress is not None:
        progress(f"calibrating the drift detector on {len(wanted)} reference(s) of {runs} run(s)"
                 f"{' grown to a checkpoint' if again else ''} ({_reference_sizes(wanted.values())}), "
                 f"{workers} at a time (a few seconds each)")
    with calibration_pool(workers) as pool:
        futures = {key: pool.submit(calibration.calibrate_threshold, **kwargs) for key, kwargs in wanted.items()}
        return {key: f.result() for key, f in futures.items()}


def _reference_sizes(references: Iterable[dict]) -> str:
    """The sizes of the references calibrate_threshold is given, in words per unit: "2,000 steps", "60-120 windows"."""
    sizes: dict[str, list[int]] = {}
    for kwargs in references:
        sizes.setdefault(kwargs["unit"], []).append(len(kwargs["accepted"]))
    return ", ".join(f"{min(n):,} {unit}" if min(n) == max(n) else f"{min(n):,}-{max(n):,} {unit}"
                     for unit, n in sorted(sizes.items()))


def calibration_pool(workers: int) -> ProcessPoolExecutor:
    """The processes calibrations run in. Spawned, not forked: the caller may be a threaded server, and a forked
    child inherits the locks its threads hold. Each ends with the caller (die_with_parent): a watcher or an ingest
    killed outright mid-calibration would otherwise leave its workers waiting for work forever."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent)


def _workers(calibrations: int) -> int:
    """Processes for that many calibrations: one per core at most."""
    return min(calibrations, len(os.sched_getaffinity(0)))
