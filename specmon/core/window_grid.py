"""The grid on which engine windows' intervals pair their noise (stats.SerialSums): windows summed into bins of one
engine, a bin a WINDOW_BANDWIDTH_BINS-th of the bandwidth. A request outlives a window, so neighbouring windows are
not independent; the bandwidth (WINDOW_BANDWIDTH_SECONDS, or WINDOW_BANDWIDTH_SPAN_SHARE of the span where that is
longer) is what the variance pairs. Pure numpy.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specmon.core import stats
from specmon.core.settings import WINDOW_BANDWIDTH_BINS, WINDOW_BANDWIDTH_SECONDS, WINDOW_BANDWIDTH_SPAN_SHARE


class WindowBins(NamedTuple):
    place: np.ndarray  # each window's bin on the grid of stats.SerialSums
    minutes: float  # the minutes the engines' windows span, summed over engines


def grid_places(engine: np.ndarray, seconds: np.ndarray) -> WindowBins:
    """The places on the grid of stats.SerialSums of points of time (`seconds` since the epoch) of engines numbered
    0, 1, ..., and the minutes they span.

    A bin is a WINDOW_BANDWIDTH_BINS-th of the bandwidth (window_bin_seconds; a minute up to four hours of windows) of
    one engine; bins of one engine keep their order and distance, a gap longer than the bandwidth shrinks to just
    over it (nothing pairs across it either way), and engines lie a bandwidth apart (requests do not move between
    engines). An engine's span is its first to last clock minute, inclusive."""
    engine = np.asarray(engine, dtype=np.int64)
    seconds = np.asarray(seconds, dtype=np.int64)
    if not len(seconds):
        return WindowBins(np.zeros(0, dtype=np.int64), 0.0)
    minute = seconds // 60
    engines = int(engine.max()) + 1
    first = np.full(engines, np.iinfo(np.int64).max)
    last = np.full(engines, np.iinfo(np.int64).min)
    np.minimum.at(first, engine, minute)
    np.maximum.at(last, engine, minute)
    seen = last >= first
    minutes = minutes_spanned(first[seen], last[seen])
    bin_index = seconds // window_bin_seconds(float(minutes.max()))
    return WindowBins(bin_places(engine, bin_index), float(minutes.sum()))


def minutes_spanned(first_minute: np.ndarray, last_minute: np.ndarray) -> np.ndarray:
    """An engine's span: its first to last clock minute (minutes since the epoch), inclusive."""
    return np.asarray(last_minute) - np.asarray(first_minute) + 1


def bin_places(engine: np.ndarray, bin_index: np.ndarray) -> np.ndarray:
    """The places on the grid of bins `bin_index` (points of time over a bin's seconds) of engines numbered 0, 1,
    ...: bins of one engine keep their order and distance, a gap longer than the bandwidth shrinks to just over it,
    and engines lie a bandwidth apart."""
    engine = np.asarray(engine, dtype=np.int64)
    order = np.lexsort((bin_index, engine))
    gap = WINDOW_BANDWIDTH_BINS + 1
    step = np.where(np.diff(engine[order]) != 0, gap, np.minimum(np.diff(bin_index[order]), gap))
    place = np.empty(len(engine), dtype=np.int64)
    place[order] = np.concatenate([[0], np.cumsum(step)]).astype(np.int64)
    return place


def window_bin_seconds(longest_minutes: float) -> float:
    """The bin of engine-window intervals for an engine whose windows span `longest_minutes`: a
    WINDOW_BANDWIDTH_BINS-th of the bandwidth, WINDOW_BANDWIDTH_SECONDS or WINDOW_BANDWIDTH_SPAN_SHARE of the span
    where that is longer (so the variance costs the same on a day as on an hour)."""
    bandwidth = max(WINDOW_BANDWIDTH_SECONDS, longest_minutes * 60 * WINDOW_BANDWIDTH_SPAN_SHARE)
    return bandwidth / WINDOW_BANDWIDTH_BINS


def serial_sums(bins: WindowBins, a: np.ndarray, n: np.ndarray, rho: float | None = None) -> stats.SerialSums:
    """The totals a / n of windows summed into their bins, paired up to the bandwidth (stats.SerialSums; `rho` as
    there)."""
    size = int(bins.place.max()) + 1 if len(bins.place) else 0
    return stats.SerialSums.of(np.bincount(bins.place, weights=a, minlength=size),
                               np.bincount(bins.place, weights=n, minlength=size), WINDOW_BANDWIDTH_BINS, rho)
