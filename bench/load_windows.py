"""Whether the speedup intervals of the Load page hold on engine windows: coverage of the true speedup at each
concurrency bin, over simulated days of 10-second windows of one engine whose throughput noise persists (requests
outlive a window), with specmon's intervals (analysis.load.curves: throughput summed over windows, neighbouring
minutes paired, stats.SerialSums) beside 10-minute blocks of windows taken as independent observations (as the
Load page computed them before), on the same windows.

    cd bench && nice python load_windows.py [--days 200] [--seed 3] [--out load_windows.json]

Two kinds of day (neither is the variance's own model):
- stepped: the load moves through 2, 8 and 32 running requests every 20 minutes, speculation annotated off every
  other hour; the throughput's noise an AR(1) process whose correlation falls to 1/e in 60, 300, 900 or 3,600 s, 5% in
  size.
- wandering: the load wanders between neighbouring bins (1 to 32 running requests) after lognormal stays (median
  3 minutes, sigma 1), speculation off every other hour; the noise the sum of a fast part (persistence 120 s,
  Student t innovations with 3 degrees of freedom, heavy-tailed as a few long requests make it) and a slow one
  (persistence 20 minutes, 2%).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd
from _common import machine

from specmon.analysis import load
from specmon.core import load as core_load
from specmon.store.database import Store

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from load_days import speculating, store_day  # noqa: E402 (the tests' day of windows)

WINDOWS = 8640  # a day of 10-second windows
LEVELS = np.array([1, 2, 4, 8, 16, 32])
TRUTH = {1: 1.6, 2: 1.45, 4: 1.3, 8: 1.15, 16: 1.0, 32: 0.85}


def ar1(rng: np.random.Generator, persistence_s: float, innovations: np.ndarray) -> np.ndarray:
    """An AR(1) series over the windows, correlation 1/e at persistence_s, stationary variance that of the
    innovations."""
    phi = np.exp(-10.0 / persistence_s)
    out = np.empty(len(innovations))
    out[0] = innovations[0]
    scale = np.sqrt(1 - phi ** 2)
    for t in range(1, len(out)):
        out[t] = phi * out[t - 1] + scale * innovations[t]
    return out


def stepped(rng: np.random.Generator, persistence_s: float) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(WINDOWS)
    running = np.array([2, 8, 32])[(i // 120) % 3]
    return running, 0.05 * ar1(rng, persistence_s, rng.standard_normal(WINDOWS))


def wandering(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    running = np.empty(WINDOWS, dtype=int)
    t, level = 0, int(rng.integers(len(LEVELS)))
    while t < WINDOWS:
        stay = max(1, int(round(rng.lognormal(np.log(18.0), 1.0))))  # windows: median 3 minutes
        running[t:t + stay] = LEVELS[level]
        t += stay
        level = int(np.clip(level + rng.choice([-1, 1]), 0, len(LEVELS) - 1))
    fast = ar1(rng, 120.0, rng.standard_t(3, WINDOWS) / np.sqrt(3.0))
    slow = ar1(rng, 1200.0, rng.standard_normal(WINDOWS))
    return running, 0.05 * fast + 0.02 * slow


def write_day(store: Store, running: np.ndarray, noise: np.ndarray) -> pd.DataFrame:
    """Store a day of windows with speculation annotated off every other hour; returns them for the blocks."""
    on = speculating(WINDOWS)
    truth = np.array([TRUTH[int(n)] for n in running])
    throughput = 100 * running ** 0.8 * np.where(on, truth, 1.0) * (1 + noise)
    store_day(store, running, throughput)
    return pd.DataFrame({"bin": running, "on": on, "block": np.arange(WINDOWS) // 60, "throughput": throughput})


def blocks_speedups(day: pd.DataFrame) -> dict[int, core_load.Speedup]:
    """10-minute blocks of windows at one bin, each block's mean throughput one observation."""
    means = day.groupby(["bin", "on", "block"])["throughput"].mean().reset_index()
    out = {}
    for b, g in means.groupby("bin"):
        x, y = g[g["on"]]["throughput"].to_numpy(), g[~g["on"]]["throughput"].to_numpy()
        if len(x) and len(y):
            out[int(b)] = core_load.speedup(x, y)
    return out


def cell(rng: np.random.Generator, days: int, make) -> dict:
    counts = {m: {"hits": 0, "low": 0, "high": 0, "none": 0, "total": 0} for m in ("specmon", "10-minute blocks")}
    work = tempfile.mkdtemp(prefix="specmon-load-")
    for day_index in range(days):
        path = os.path.join(work, f"{day_index}.duckdb")
        with Store(path) as store:
            day = write_day(store, *make(rng))
            [curve] = load.curves(store)
        os.remove(path)
        found = {"specmon": {round(p.concurrency): p.speedup for p in curve.points},
                 "10-minute blocks": blocks_speedups(day)}
        for method, speedups in found.items():
            for n, s in speedups.items():
                c = counts[method]
                c["total"] += 1
                truth = TRUTH[min(TRUTH, key=lambda level: abs(np.log(level / n)))]
                if s.lo is None:
                    c["none"] += 1
                    continue
                c["hits"] += s.lo <= truth <= s.hi
                c["low"] += truth < s.lo
                c["high"] += truth > s.hi
    for c in counts.values():
        judged = c["total"] - c["none"]
        c["coverage"] = round(c["hits"] / judged, 4) if judged else None
        c["se"] = round(float(np.sqrt(c["coverage"] * (1 - c["coverage"]) / judged)), 4) if judged else None
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=200)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    cells = {f"stepped, persistence {p} s": (lambda r, p=p: stepped(r, p)) for p in (60, 300, 900, 3600)}
    cells["wandering"] = wandering
    result = {"machine": machine(), "days": args.days, "seed": args.seed, "cells": {}}
    for name, make in cells.items():
        t = time.perf_counter()
        result["cells"][name] = cell(rng, args.days, make) | {"wall_s": round(time.perf_counter() - t, 1)}
        print(name, json.dumps(result["cells"][name]), flush=True)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
