"""Speedup by concurrency from engine windows: requests outlive a 10-second window, so neighbouring windows share
their noise; the intervals, which pair neighbouring minutes of one engine, must still hold on such windows, and a
speculation-off period of the same run must serve as its baseline."""
import numpy as np
import pytest
from load_days import speculating, store_day

from specmon.analysis import load
from specmon.store.database import Store

TRUTH = {2: 1.25, 8: 1.02, 32: 0.85}


def simulate_day(store: Store, rng: np.random.Generator, persistence_s: float = 60.0) -> None:
    """A day of 10-second windows of one engine: the load moves through 2, 8 and 32 running requests every 20
    minutes, speculation is annotated off every other hour, and the throughput's noise is an AR(1) process whose
    correlation falls to 1/e in persistence_s (what requests spanning windows do), 5% in size."""
    n_windows = 8640
    i = np.arange(n_windows)
    running = np.array([2, 8, 32])[(i // 120) % 3]
    phi = np.exp(-10.0 / persistence_s)
    noise = np.empty(n_windows)
    noise[0] = rng.standard_normal()
    for t in range(1, n_windows):
        noise[t] = phi * noise[t - 1] + np.sqrt(1 - phi ** 2) * rng.standard_normal()
    speedup = np.array([TRUTH[n] for n in running])
    throughput = 100 * running ** 0.8 * np.where(speculating(n_windows), speedup, 1.0) * (1 + 0.05 * noise)
    store_day(store, running, throughput, name=f"day-{rng.integers(1 << 60)}", per_position=True, line_labels=True)


@pytest.mark.slow  # a Monte-Carlo coverage check
def test_intervals_from_windows_cover_the_true_speedup(tmp_path):
    """40 simulated days whose throughput noise persists 5 minutes, 3 concurrencies each: 120 intervals (Monte-Carlo
    error of the coverage about 0.02). bench/load_windows.py measured 0.953 over 200 such days, where 10-minute
    blocks taken as independent observations gave 0.925."""
    persistence_s = 300.0
    rng = np.random.default_rng(int(persistence_s))
    hits = total = 0
    for day in range(40):
        with Store(str(tmp_path / f"{persistence_s:g}-{day}.duckdb")) as store:
            simulate_day(store, rng, persistence_s)
            [curve] = load.curves(store)
        assert curve.baseline == "the run's windows in periods annotated as speculation off"
        for p in curve.points:
            total += 1
            hits += p.speedup.lo <= TRUTH[round(p.concurrency)] <= p.speedup.hi
    assert total == 120 and 0.9 <= hits / total <= 0.99, hits / total


def test_the_windows_of_one_engine_lie_on_one_grid_whatever_else_their_lines_carry(tmp_path):
    # a day: each concurrency holds 20 minutes in every hour, half of them with speculation on
    with Store(str(tmp_path / "day.duckdb")) as store:
        simulate_day(store, np.random.default_rng(0))
        [curve] = load.curves(store)
        with store.reading():
            frame = store.query_df(load._WINDOW_MINUTES_SQL, [None, None, None])
            minutes = load._Minutes.of(frame, store.query_df(load._PERIODS_SQL))
    assert [(p.observations, p.baseline_observations) for p in curve.points] == [(1440, 1440)] * 3
    # every line's labels differ (its own throughputs); the engine is their `engine` entry alone
    assert set(frame["engine_key"]) == {"0"} and set(frame["windows"]) == {6}
    grid = load._grid(minutes.figures.take(np.flatnonzero(minutes.bin == 8)))
    assert grid.minutes == 24 * 60 - 40  # first to last minute at 8 running: one engine's span


def test_a_bin_whose_windows_span_under_half_an_hour_has_a_speedup_but_no_interval(tmp_path):
    with Store(str(tmp_path / "short.duckdb")) as store:
        simulate_day(store, np.random.default_rng(1))
        with store.transaction() as cur:  # keep the first 20 minutes at 2 running, on and off
            cur.execute("DELETE FROM engine_windows WHERE running_requests = 2 AND minute(end_ts) >= 20 "
                        "OR running_requests = 2 AND hour(end_ts) > 1")
        [curve] = load.curves(store)
    short = [p for p in curve.points if p.concurrency == 2]
    assert len(short) == 1 and short[0].speedup.lo is None and short[0].speedup.verdict == "unknown"
    assert short[0].alpha is not None and short[0].alpha_lo is None
    assert all(p.speedup.lo is not None for p in curve.points if p.concurrency != 2)


def test_the_current_load_and_its_verdict_come_from_the_last_windows(tmp_path):
    with Store(str(tmp_path / "now.duckdb")) as store:
        simulate_day(store, np.random.default_rng(5))
        [curve] = load.curves(store)
    assert curve.current == 32  # the day ends in a stretch at 32 running requests
    assert curve.status == "loses" and curve.best.loses_from == 32 and curve.best.pays_up_to == 8
