"""Engine windows summed in DuckDB (window_sums) against the same sums taken window by window in numpy: the grid of
core.window_grid placed per window, then summed per bin, which is what the intervals read."""
from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd
import pytest
from engine_streams import vllm_log

from specmon.analysis import window_sums
from specmon.analysis.engine_segments import WINDOW_COLUMNS, segment_of_windows, summarize_engines, windows
from specmon.core import stats
from specmon.core.window_grid import grid_places, serial_sums
from specmon.ingest.pipeline import ingest_file


def _frame(rng: np.random.Generator, hours: float) -> pd.DataFrame:
    """Two engines' 10-second windows over `hours` with an hour's gap, k 3 or 4, and windows without per-position
    counts, without drafts or without accepted totals (NaN, as a frame from pandas holds them)."""
    per_engine = int(hours * 360)
    frames = []
    for engine in ("0", "1"):
        seconds = np.arange(per_engine) * 10.0 + rng.integers(0, 10)
        seconds[per_engine // 2:] += 3600  # a gap longer than the bandwidth
        k = rng.choice([3, 4], per_engine)
        drafts = rng.poisson(40, per_engine).astype(float)
        accepted = [rng.binomial(int(d), 0.8 ** np.arange(1, kk + 1)).astype(float)
                    for d, kk in zip(drafts, k, strict=True)]
        drafts[rng.random(per_engine) < 0.03] = np.nan
        positions = [None if rng.random() < 0.03 else a for a in accepted]
        totals = np.array([a.sum() for a in accepted])
        totals[rng.random(per_engine) < 0.03] = np.nan
        end = pd.Timestamp("2026-12-01T00:00:00Z") + pd.to_timedelta(seconds, unit="s")
        frames.append(pd.DataFrame({c: [None] * per_engine for c in WINDOW_COLUMNS}).assign(
            run="r", template="", engine="vllm", source="log", end_ts=end, drafts=drafts, draft_tokens=k * drafts,
            accepted_tokens=totals, accepted_per_position=positions, k=k, ingested_at=end[0],
            labels=f'{{"engine": "{engine}", "accepted throughput": "{rng.uniform(1, 99):.2f} tokens/s"}}'))
    return pd.concat(frames, ignore_index=True).sort_values("end_ts", kind="stable").reset_index(drop=True)


def _per_window(frame: pd.DataFrame) -> tuple[stats.SerialSums, stats.SerialSums, list[stats.SerialSums]]:
    """alpha's, L's and each position's sums, placed window by window on the grid (grid_places)."""
    engine = pd.factorize(frame["labels"].str.extract(r'"engine": "(\d)"')[0])[0]
    seconds = pd.DatetimeIndex(frame["end_ts"]).as_unit("s").asi8
    has = np.array([v is not None for v in frame["accepted_per_position"]]) & frame["drafts"].notna().to_numpy()
    width = max(len(v) for v in frame["accepted_per_position"][has])
    acc = np.array([np.pad(v, (0, width - len(v))) for v in frame["accepted_per_position"][has]])
    lengths = np.array([len(v) for v in frame["accepted_per_position"][has]])
    drafts = frame["drafts"].to_numpy()[has]
    checked = drafts + acc.sum(axis=1) - acc[np.arange(len(acc)), lengths - 1]
    bins = grid_places(engine[has], seconds[has])
    drafted = np.arange(width)[None, :] < lengths[:, None]
    reached = np.column_stack([drafts, acc[:, :-1]]) * drafted
    counted = (frame["drafts"].notna() & frame["accepted_tokens"].notna()).to_numpy()
    tokens = serial_sums(grid_places(engine[counted], seconds[counted]), frame["accepted_tokens"].to_numpy()[counted],
                         frame["drafts"].to_numpy()[counted])
    return (serial_sums(bins, acc.sum(axis=1), checked), tokens,
            [serial_sums(bins, acc[:, i], reached[:, i]) for i in range(width)])


def _same(a: stats.SerialSums, b: stats.SerialSums) -> None:
    assert (a.clusters, a.a, a.n) == (b.clusters, pytest.approx(b.a), pytest.approx(b.n))
    assert a.variance == pytest.approx(b.variance, rel=1e-9) and a.degrees == pytest.approx(b.degrees, rel=1e-9)


@pytest.mark.parametrize("hours", [1.0, 9.0])  # a minute's bins, and longer ones where the span sets the bandwidth
def test_windows_summed_in_duckdb_give_the_variances_of_windows_placed_one_by_one(hours):
    frame = _frame(np.random.default_rng(int(hours)), hours)
    sums = window_sums.of_frame(frame)
    alpha, tokens, positions = _per_window(frame)
    _same(serial_sums(sums.checks.bins, sums.checks.accepted, sums.checks.checked), alpha)
    _same(serial_sums(sums.tokens.bins, sums.tokens.accepted, sums.tokens.drafts), tokens)
    assert sums.checks.position_accepted.shape[1] == len(positions) == 4
    for i, expected in enumerate(positions):
        _same(serial_sums(sums.checks.bins, sums.checks.position_accepted[:, i], sums.checks.position_reached[:, i]),
              expected)
    # a window without any speculative figure (no drafts, positions or accepted total) is load alone
    load_alone = (frame["drafts"].isna() & frame["accepted_tokens"].isna()
                  & frame["accepted_per_position"].isna()).sum()
    assert sums.windows == len(frame) - load_alone and sums.drafts == pytest.approx(frame["drafts"].sum())
    assert sums.counted_drafts == pytest.approx(frame["drafts"][frame["accepted_tokens"].notna()].sum())
    assert sums.k == 4 and sums.engines == ("vllm",)


def test_a_stored_log_and_its_windows_as_a_frame_give_one_segment(store, tmp_path):
    path = tmp_path / "vllm.log"
    vllm_log(path)
    assert ingest_file(store, str(path), run="r").status == "stored"
    stored = summarize_engines(store, "run", 0.3)[0]
    framed = segment_of_windows({"run": "r"}, windows(store, "r"), 0.3, c_source="given")
    assert stored.to_dict() == framed.to_dict()
    since = datetime.fromisoformat(stored.first_ts) + (datetime.fromisoformat(stored.last_ts)
                                                        - datetime.fromisoformat(stored.first_ts)) / 2
    later = summarize_engines(store, "run", 0.3, since=since)[0]
    frame = windows(store, "r")
    framed_later = segment_of_windows({"run": "r"}, frame[frame["end_ts"] >= since], 0.3, c_source="given")
    assert later.to_dict() == framed_later.to_dict()
    assert later.windows < stored.windows
    # a timeline's buckets: each position's counts without its interval, enough for the profile's break-even
    counts = summarize_engines(store, "run", 0.3, position_intervals=False)[0]
    assert [(p.checked, p.accepted) for p in counts.per_position] == [(p.checked, p.accepted)
                                                                       for p in stored.per_position]
    assert all(p.conditional_lo is None for p in counts.per_position)
    assert counts.economics.break_even_alpha == stored.economics.break_even_alpha
    assert counts.economics.break_even_alpha_basis == "per-position profile"
