"""The drift detector of a step-log run, kept up to date instead of recomputed: its state is stored in the database
per run and design, so an analysis reads only the steps stored after the last one it took in (docs/drift.md,
"Keeping up with the data").

A state holds what the whole-stream analysis (detector.detect over every step in (ts, step_id) order) would know after
its last point: the CUSUM's W there, every design in force so far (the first reference's and each checkpoint's of the
self-starting design, detector.run_cusum) with the next checkpoint, the alarm episodes with their dates, each template's
first step, running sums, and the downsampled W chart. Advancing it by the steps after that point gives what the whole
stream gives, to float rounding (W is summed from the point it was kept at). It is used only while it still describes
the stored stream: the run holds exactly the points it took in plus those after its last one (else steps arrived earlier
than that point, and the state is built again from every step), and its design is the one asked for (false-alarm rate,
p1, calibration and state versions; the first reference is fixed once 2,000 steps are in, each checkpoint's once its
steps are, and an earlier step changes the count). Calibrated thresholds are stored too, keyed by the reference's
points, p0, p1, the false-alarm rate and calibration.CALIBRATION_VERSION, so a fresh process does not calibrate again (a
checkpoint's reference is one more key).

States are saved after an analysis, in a short write that is skipped when another process holds the database (the
state is a cache: the next analysis advances from the older one), and kept in this process meanwhile.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta

import duckdb
import numpy as np

from specmon.core.faults import SpecmonError
from specmon.drift import calibration, detector
from specmon.store.database import Store

STATE_VERSION = 4  # raised when what a state holds or means changes: older states are then rebuilt
SAVE_TIMEOUT_S = 0.2  # how long saving a state may wait for the database before it is skipped
# how long publishing the states and thresholds of many runs may wait: each costs up to seconds to compute again
PUBLISH_TIMEOUT_S = 5.0
STATES_PER_RUN = 4  # designs kept per run (another c or false-alarm rate is another design)
CHART_POINTS = 2000  # the W chart's rows at most
CHUNK_POINTS = 1_000_000  # points read at a time (about 60 MB of columns)
_EPOCH = datetime(1970, 1, 1)
_HOUR_US = 3_600_000_000

_POINT_COLUMNS = ("accepted", "checked", "k", "ts_us", "step_id", "segment_id", "cluster")
_POINTS_SQL = """
SELECT accepted, checked, coalesce(k, g) AS k, epoch_us(ts) AS ts_us, step_id, segment_id, hash(request_id) AS cluster
FROM steps WHERE segment_id IN ({segments}) {where} ORDER BY ts, step_id {limit}
"""


@dataclass
class Points:
    """Stream points in (ts, step_id) order, one array per column."""

    accepted: np.ndarray
    checked: np.ndarray
    k: np.ndarray
    ts_us: np.ndarray
    step_id: np.ndarray
    segment_id: np.ndarray
    cluster: np.ndarray

    def __len__(self) -> int:
        return len(self.ts_us)

    def key(self, i: int) -> tuple[int, int]:
        return int(self.ts_us[i]), int(self.step_id[i])

    def take(self, lo: int, hi: int) -> Points:
        return Points(*(getattr(self, c)[lo:hi] for c in _POINT_COLUMNS))

    @staticmethod
    def join(a: Points, b: Points) -> Points:
        return Points(*(np.concatenate([getattr(a, c), getattr(b, c)]) for c in _POINT_COLUMNS))


@dataclass
class Episode:
    """One alarm episode as detector.detect dates it, in stream indices, with what AlarmEvent needs kept beside."""

    first: int
    last: int
    count: int
    change: int
    lo: int
    hi: int
    before_change: tuple[float, float]  # accepted, checked summed over the points before `change`
    through_last: tuple[float, float]  # ... through `last`
    ts_us: dict[str, int]  # change, alarm, last, lo, hi, after (the point before lo)
    segment: int  # the segment of the point at `change`
    design: int = 0  # the design in force (an index into State.designs)

    @property
    def alpha_after(self) -> float:
        return (self.through_last[0] - self.before_change[0]) / max(self.through_last[1] - self.before_change[1], 1)


@dataclass
class State:
    design_key: str
    reference: str  # sha256 of the reference's points
    points: int = 0
    last_key: tuple[int, int] = (0, 0)  # (ts in epoch microseconds, step_id) of the last point taken in
    last_segment: int = 0
    totals: tuple[float, float] = (0.0, 0.0)  # accepted, checked over every point taken in
    # per segment in order of first appearance: [segment, ts_us, step_id, segment of the last earlier point or None]
    firsts: list[list] = field(default_factory=list)
    carry: float = 0.0  # W to continue from (0 after an alarm or a checkpoint)
    last_alarm: int = -detector.EPISODE_GAP - 1  # the latest alarm's index
    checkpoint: int | None = None  # the next reference size the threshold is calibrated again at (detector.run_cusum)
    # every design in force so far, [the index of its first point, design]: the reference's, then the checkpoints'
    # (the last is the one in force)
    designs: list[list] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    # where the next episode's change is dated from: its index, key (None: the next point), the sums before it and
    # the time of the point before it
    since: int = 0
    since_key: tuple[int, int] | None = None
    since_sums: tuple[float, float] = (0.0, 0.0)
    since_prev_ts: int = 0
    chart_stride: int = 1
    chart: list[list] = field(default_factory=list)  # [ts_us of the stretch's first point, max W, points]
    # the template-change verdicts at these points, with what else they depend on (alarms keeps them: reading every
    # per-request sum of the templates compared costs O(requests)); None until computed, and after every advance
    verdicts: dict | None = None

    @property
    def design(self) -> detector.Design:
        """The design in force."""
        return self.designs[-1][1]

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=lambda v: v.item())  # numpy scalars

    @staticmethod
    def from_json(text: str) -> State:
        d = json.loads(text)
        d["designs"] = [[t, detector.Design(**x)] for t, x in d["designs"]]
        d["episodes"] = [Episode(**{**e, "before_change": tuple(e["before_change"]),
                                    "through_last": tuple(e["through_last"])}) for e in d["episodes"]]
        for name in ("last_key", "totals", "since_sums"):
            d[name] = tuple(d[name])
        d["since_key"] = tuple(d["since_key"]) if d["since_key"] is not None else None
        return State(**d)


def design_key(p1: float, arl0_steps: int) -> str:
    return json.dumps([STATE_VERSION, calibration.CALIBRATION_VERSION, arl0_steps, p1])


# -- reading points ------------------------------------------------------------------------------------------------
def _at(ts_us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(ts_us))


def read_points(cur: duckdb.DuckDBPyConnection, segments: Sequence[int], after: tuple[int, int] | None = None,
                start: tuple[int, int] | None = None, upto: tuple[int, int] | None = None,
                limit: int | None = None, before_us: int | None = None) -> Points:
    """The run's points strictly after `after`, from `start` and up to `upto` (keys, inclusive), before the time
    before_us, in stream order. Each bound is also given as a plain time range, which DuckDB's zone maps use to skip
    the rest of the table."""
    where: list[str] = []
    params: list = list(segments)
    if before_us is not None:
        where.append("AND ts < ?")
        params.append(_at(before_us))
    if after is not None:
        where.append("AND ts >= ? AND (ts > ? OR step_id > ?)")
        params += [_at(after[0]), _at(after[0]), after[1]]
    if start is not None:
        where.append("AND ts >= ? AND (ts > ? OR step_id >= ?)")
        params += [_at(start[0]), _at(start[0]), start[1]]
    if upto is not None:
        where.append("AND ts <= ? AND (ts < ? OR step_id <= ?)")
        params += [_at(upto[0]), _at(upto[0]), upto[1]]
    sql = _POINTS_SQL.format(segments=", ".join("?" * len(segments)), where=" ".join(where),
                             limit=f"LIMIT {int(limit)}" if limit is not None else "")
    s = cur.execute(sql, params).fetchnumpy()
    return Points(np.asarray(s["accepted"], dtype=float), np.asarray(s["checked"], dtype=float),
                  np.asarray(s["k"], dtype=np.int64), np.asarray(s["ts_us"], dtype=np.int64),
                  np.asarray(s["step_id"], dtype=np.int64), np.asarray(s["segment_id"], dtype=np.int64),
                  np.asarray(s["cluster"]))


def chunk_ends(cur: duckdb.DuckDBPyConnection, segments: Sequence[int], after: tuple[int, int] | None,
               points: int) -> Iterator[int | None]:
    """Where to cut the run's points after `after` into reads of about `points` each, in stream order: the times
    to read up to (read_points' before_us), the last None (no end). Each is the end of an hour, found from the
    rollups' step counts, so that a read scans and sorts only its own stretch of the table: reads cut by their
    limit alone would each sort everything after them, a run's reading growing with the square of its length.
    A read of `points` that comes back full has not reached its end: the next read starts at its last point and
    keeps the same end."""
    marks = ", ".join("?" * len(segments))
    lo = None if after is None else _at(after[0] - after[0] % _HOUR_US)
    rows = cur.execute(f"SELECT epoch_us(hour), sum(steps) FROM rollup_requests WHERE segment_id IN ({marks})"
                       + (" AND hour >= ?" if lo is not None else "") + " GROUP BY hour ORDER BY hour",
                       [*segments, *([lo] if lo is not None else [])]).fetchall()
    held = 0
    for hour_us, steps in rows:
        held += int(steps)
        if held >= points:
            yield hour_us + _HOUR_US
            held = 0
    yield None


def count_after(cur: duckdb.DuckDBPyConnection, segments: Sequence[int], after: tuple[int, int]) -> int:
    """How many of the run's points follow the key `after` in stream order."""
    return int(cur.execute(f"SELECT count(*) FROM steps WHERE segment_id IN ({', '.join('?' * len(segments))}) "
                           "AND ts >= ? AND (ts > ? OR step_id > ?)",
                           [*segments, _at(after[0]), _at(after[0]), after[1]]).fetchall()[0][0])


def segment_before(cur: duckdb.DuckDBPyConnection, segments: Sequence[int], ts_us: int) -> int | None:
    """The segment of the run's last point before time ts_us, None if there is none. The rollups bound the search:
    the latest request-hour that ended before it, or the hour ts_us falls in (a request-hour that straddles it)."""
    marks = ", ".join("?" * len(segments))
    ended = cur.execute(f"SELECT epoch_us(max(last_ts)) FROM rollup_requests WHERE segment_id IN ({marks}) "
                        "AND last_ts < ?", [*segments, _at(ts_us)]).fetchall()[0][0]
    lo = ts_us - ts_us % _HOUR_US
    lo = min(lo, ended) if ended is not None else lo
    found = cur.execute(f"SELECT segment_id FROM steps WHERE segment_id IN ({marks}) AND ts >= ? AND ts < ? "
                        "ORDER BY ts DESC, step_id DESC LIMIT 1", [*segments, _at(lo), _at(ts_us)]).fetchall()
    return int(found[0][0]) if found else None


# -- advancing -----------------------------------------------------------------------------------------------------
def advance(state: State, new: Points, older: Callable[[int, tuple[int, int]], Points],
            before: Callable[[int], int | None], redesign: Callable[[int], detector.Design]) -> State:
    """The state after the points `new`, which follow the state's last point in stream order. older(since, key)
    gives the points taken in already from index `since` (at `key`) on, for dating a change that began before `new`;
    before(ts) the segment of the last point before ts; redesign(c) the design calibrated on the stream's first c points
    (a checkpoint, detector.run_cusum). A state with fewer points than the reference takes new points only from scratch
    (the reference, and with it the design, would change)."""
    base, m = state.points, len(new)
    if not m:
        return state
    if 0 < base < detector.REFERENCE_STEPS:
        raise ValueError("a state with an incomplete reference is rebuilt, not advanced")
    s = replace(state, firsts=[list(f) for f in state.firsts], episodes=list(state.episodes),
                chart=[list(c) for c in state.chart], designs=[list(d) for d in state.designs], verdicts=None)
    _take_firsts(s, new, before)
    cum_a = s.totals[0] + np.cumsum(new.accepted)
    cum_n = s.totals[1] + np.cumsum(new.checked)
    reference = detector.REFERENCE_STEPS
    skip = max(reference - base, 0)  # the reference's points, not watched
    w = np.zeros(m)
    if base < reference <= base + m:
        s.since, s.since_key = reference, new.key(skip) if skip < m else None
        s.since_sums = (float(cum_a[skip - 1]), float(cum_n[skip - 1]))
        s.since_prev_ts = int(new.ts_us[skip - 1])
        s.checkpoint = detector.CusumState.start(s.design).checkpoint
    if skip < m:
        at = detector.CusumState(s.design, s.carry, s.last_alarm, s.checkpoint, reference)
        w_tail, raw, at, taken = detector.run_cusum(new.accepted[skip:], new.checked[skip:], base + skip, at, redesign)
        w[skip:] = w_tail
        for alarm in raw:
            # the design in force: the last one taken at or before the alarm
            in_force = len(s.designs) - 1 + sum(t <= alarm for t, _ in taken)
            _take_alarm(s, alarm, new, base, cum_a, cum_n, older, in_force, (s.designs + taken)[in_force][1])
        s.designs += [[t, d] for t, d in taken]
        s.carry, s.last_alarm, s.checkpoint = at.w, at.last_alarm, at.checkpoint
    _chart_add(s, new.ts_us, w)
    s.points = base + m
    s.last_key, s.last_segment = new.key(m - 1), int(new.segment_id[-1])
    s.totals = (float(cum_a[-1]), float(cum_n[-1]))
    return s


def _take_firsts(s: State, new: Points, before: Callable[[int], int | None]) -> None:
    known = {f[0] for f in s.firsts}
    found = []
    for seg in np.unique(new.segment_id):
        if int(seg) in known:
            continue
        i = int(np.argmax(new.segment_id == seg))
        t = int(new.ts_us[i])
        j = int(np.searchsorted(new.ts_us, t, "left")) - 1
        if j >= 0:
            previous: int | None = int(new.segment_id[j])
        elif s.points and s.last_key[0] < t:
            previous = s.last_segment
        elif s.points:  # the last point taken in has the same time: look further back
            previous = before(t)
        else:
            previous = None
        found.append((i, [int(seg), t, int(new.step_id[i]), previous]))
    s.firsts += [f for _, f in sorted(found, key=lambda x: x[0])]


def _take_alarm(s: State, g: int, new: Points, base: int, cum_a: np.ndarray, cum_n: np.ndarray,
                older: Callable[[int, tuple[int, int]], Points], index: int, design: detector.Design) -> None:
    """Alarm at stream index g (in `new`): it continues the last episode or opens one, dated as detector.detect does."""
    i = g - base
    through = (float(cum_a[i]), float(cum_n[i]))
    if s.episodes and g - s.episodes[-1].last <= detector.EPISODE_GAP:
        e = s.episodes[-1]
        s.episodes[-1] = replace(e, last=g, count=e.count + 1, through_last=through,
                                 ts_us={**e.ts_us, "last": int(new.ts_us[i])})
    else:
        if s.since < base:
            assert s.since_key is not None
            span = Points.join(older(s.since, s.since_key), new.take(0, i + 1))
        else:
            span = new.take(s.since - base, i + 1)
        change, lo, hi = (s.since + v for v in detector.change_point(span.accepted, span.checked, design.p0, 0,
                                                                   len(span), design.design_effect))
        ts = span.ts_us
        prior = change - s.since
        before_change = (s.since_sums[0] + float(np.sum(span.accepted[:prior])),
                         s.since_sums[1] + float(np.sum(span.checked[:prior])))
        after_ts = s.since_prev_ts if lo - 1 < s.since else int(ts[lo - 1 - s.since])
        s.episodes.append(Episode(g, g, 1, change, lo, hi, before_change, through, {
            "change": int(ts[change - s.since]), "alarm": int(new.ts_us[i]), "last": int(new.ts_us[i]),
            "lo": int(ts[lo - s.since]), "hi": int(ts[hi - s.since]), "after": after_ts},
            int(span.segment_id[change - s.since]), index))
    s.since = g + 1
    s.since_key = new.key(i + 1) if i + 1 < len(new) else None
    s.since_sums = through
    s.since_prev_ts = int(new.ts_us[i])


def _chart_add(s: State, ts_us: np.ndarray, w: np.ndarray) -> None:
    """Add points to the W chart: stretches of chart_stride points, each its first point's time and its maximum
    (so peaks that crossed the threshold stay visible); the stride is the smallest power of two that keeps the
    chart at most CHART_POINTS rows, so doubling it merges pairs of stretches, as a chart drawn from scratch has."""
    total = s.points + len(w)
    stride = s.chart_stride
    while -(-total // stride) > CHART_POINTS:
        stride *= 2
    while s.chart_stride < stride:  # merge pairs; an odd last full stretch absorbs the partial one
        merged = []
        for j in range(0, len(s.chart), 2):
            pair = s.chart[j:j + 2]
            merged.append([pair[0][0], max(p[1] for p in pair), sum(p[2] for p in pair)])
        s.chart, s.chart_stride = merged, s.chart_stride * 2
    rest = 0
    if s.chart and s.chart[-1][2] < stride:  # fill the partial stretch
        take = min(stride - s.chart[-1][2], len(w))
        last = s.chart[-1]
        s.chart[-1] = [last[0], max(last[1], float(np.max(w[:take]))), last[2] + take]
        rest = take
    if rest < len(w):
        starts = np.arange(rest, len(w), stride)
        peaks = np.maximum.reduceat(w[rest:], starts - rest)
        sizes = np.diff(np.append(starts, len(w)))
        s.chart += [[int(t), float(p), int(n)] for t, p, n in zip(ts_us[starts], peaks, sizes, strict=True)]


def chart_points(ts_us: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The W chart of a whole stream, drawn at once: what a state's chart holds after the same points."""
    s = State("", "")
    _chart_add(s, np.asarray(ts_us), np.asarray(w, dtype=float))
    return np.array([c[0] for c in s.chart], dtype=np.int64), np.array([c[1] for c in s.chart], dtype=float)


# -- kept in the database and in this process ----------------------------------------------------------------------
_MEMO: OrderedDict[tuple[tuple, str, str], State] = OrderedDict()
_MEMO_GUARD = threading.Lock()


def identity(store: Store) -> tuple:
    """Which database a state in this process's memory belongs to: the file (a file removed and created again
    under the same name is another), or the in-memory store."""
    try:
        st = os.stat(store.path)
        return store.path, st.st_dev, st.st_ino
    except OSError:
        return store.path, id(store)


class StoredStates:
    """The kept states (design key, JSON text) of a list of runs, read from one connection a batch of runs at a
    time: a state's text is tens of kilobytes, and reading one run's rows scans the whole column of them, so a query
    per run made analysing many runs quadratic in their number (11 s of a 21 s check over 320 runs)."""

    BATCH = 64

    def __init__(self, cur: duckdb.DuckDBPyConnection, runs: Sequence[str]):
        self.cur, self.runs = cur, list(runs)
        self.place = {run: i for i, run in enumerate(self.runs)}
        self.rows: dict[str, list[tuple[str, str]]] = {}

    def of(self, run: str) -> list[tuple[str, str]]:
        if run not in self.rows:
            start = self.place.get(run)
            batch = [run] if start is None else self.runs[start:start + self.BATCH]
            for name in batch:
                self.rows.setdefault(name, [])
            found = self.cur.execute("SELECT run, design_key, state FROM drift_states WHERE run IN (SELECT unnest(?))",
                                     [batch]).fetchall()
            for name, key, text in found:
                self.rows[name].append((key, text))
        return self.rows[run]


def load_states(cur: duckdb.DuckDBPyConnection, path: tuple, run: str,
                stored: StoredStates | None = None) -> list[State]:
    """The run's kept states, the furthest first: the database's (read through `stored` where given), and this
    process's that descend from one of them (same design and reference; a file created again under a reused name and
    inode has none of them)."""
    rows = (stored or StoredStates(cur, [run])).of(run)
    # a state of another STATE_VERSION may hold other fields: its design key differs, so it is never used
    found = [State.from_json(text) for key, text in rows if json.loads(key)[0] == STATE_VERSION]
    known = {(st.design_key, st.reference) for st in found}
    with _MEMO_GUARD:
        found += [st for (p, r, _), st in _MEMO.items()
                  if p == path and r == run and (st.design_key, st.reference) in known]
    return sorted(found, key=lambda st: -st.points)


def remember(path: tuple, run: str, state: State) -> None:
    with _MEMO_GUARD:
        _MEMO[(path, run, state.design_key)] = state
        _MEMO.move_to_end((path, run, state.design_key))
        while len(_MEMO) > 64:
            _MEMO.popitem(last=False)


def save(store: Store, run: str, state: State | None, calibrations: dict[str, calibration.Threshold]) -> bool:
    """Store the state and new thresholds in one short write; skipped (False) when the database stays busy for
    SAVE_TIMEOUT_S or is read-only here."""
    return save_many(store, {run: state} if state is not None else {}, calibrations, SAVE_TIMEOUT_S)


def save_many(store: Store, states: dict[str, State], calibrations: dict[str, calibration.Threshold],
              timeout: float = PUBLISH_TIMEOUT_S) -> bool:
    """Store states of many runs (run -> state) and new thresholds in one write, built beforehand so that the
    transaction only publishes them; skipped (False) when the database stays busy for `timeout` seconds or is
    read-only here."""
    try:
        with store.transaction(timeout=timeout) as cur:
            if calibrations:
                cur.executemany("INSERT OR IGNORE INTO drift_calibrations VALUES (?, ?, now()::TIMESTAMP, ?)",
                                [[key, t.h, t.episode_points] for key, t in calibrations.items()])
            for run, state in states.items():
                # states of another reference (the stream was rebuilt) describe nothing stored any more
                cur.execute("DELETE FROM drift_states WHERE run = ? AND reference <> ?", [run, state.reference])
                cur.execute("INSERT OR REPLACE INTO drift_states VALUES (?, ?, ?, ?, ?, now()::TIMESTAMP)",
                            [run, state.design_key, state.reference, state.points, state.to_json()])
                cur.execute("DELETE FROM drift_states WHERE run = ? AND design_key NOT IN (SELECT design_key FROM "
                            "drift_states WHERE run = ? ORDER BY updated_at DESC LIMIT ?)", [run, run, STATES_PER_RUN])
        return True
    except (SpecmonError, duckdb.Error, RuntimeError):  # RuntimeError: called inside the caller's reading block
        return False


def reference_hash(points: Points) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in
                                   (points.accepted, points.checked, points.cluster, points.ts_us))).hexdigest()


def stored_threshold(cur: duckdb.DuckDBPyConnection,
                     found: dict[str, calibration.Threshold]) -> Callable[..., calibration.Threshold]:
    """A threshold function for calibration.design_for: a stored calibration, else calibrate (and note it in `found`, to
    be saved)."""
    def threshold(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, p0: float, p1: float,
                  arl0_steps: int, hours: np.ndarray | None = None, unit: str = "steps") -> calibration.Threshold:
        key = calibration.reference_key(accepted, checked, clusters, p0, p1, arl0_steps, hours, unit)
        row = cur.execute("SELECT h, episode_points FROM drift_calibrations WHERE calibration_key = ?",
                          [key]).fetchall()
        if row:
            return calibration.Threshold(float(row[0][0]), float(row[0][1]))
        # through drift's in-process memory: a process that opens several databases calibrates a reference once
        found[key] = calibration.calibrate_cached(accepted, checked, clusters, p0, p1, arl0_steps, hours, unit)
        return found[key]
    return threshold


class Uncalibrated(Exception):
    """A threshold neither stored nor calibrated yet (known_threshold): its key and calibration.calibrate_threshold's
    arguments by name, for the caller to calibrate outside its reading block."""

    def __init__(self, key: str, kwargs: dict):
        super().__init__(key)
        self.key, self.kwargs = key, kwargs


def known_threshold(cur: duckdb.DuckDBPyConnection,
                    known: dict[str, calibration.Threshold]) -> Callable[..., calibration.Threshold]:
    """A threshold function for calibration.design_for: one in `known` (thresholds the caller holds) or stored,
    else Uncalibrated (no simulation runs while the database is held)."""
    def threshold(accepted: np.ndarray, checked: np.ndarray, clusters: np.ndarray, p0: float, p1: float,
                  arl0_steps: int, hours: np.ndarray | None = None, unit: str = "steps") -> calibration.Threshold:
        key = calibration.reference_key(accepted, checked, clusters, p0, p1, arl0_steps, hours, unit)
        if key in known:
            return known[key]
        row = cur.execute("SELECT h, episode_points FROM drift_calibrations WHERE calibration_key = ?",
                          [key]).fetchall()
        if row:
            return calibration.Threshold(float(row[0][0]), float(row[0][1]))
        raise Uncalibrated(key, {"accepted": np.array(accepted), "checked": np.array(checked),
                                 "clusters": np.array(clusters), "p0": p0, "p1": p1, "arl0_steps": arl0_steps,
                                 "hours": None if hours is None else np.array(hours), "unit": unit})
    return threshold
