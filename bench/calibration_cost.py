"""Wall time of one drift calibration (specmon.drift.calibration.design_for on the first 2,000 steps, and at each
checkpoint of the self-starting design on the first 4,000 ... 32,000), the cost the watcher and the Drift page pay once
per reference (the threshold is kept in the database):

    nice python bench/calibration_cost.py [--repeats 3] [--checkpoints]

Streams from bench/streams.py: correlation 0.2 between requests, lognormal lengths, k = 4, at a stated 2,000 and
20,000 steps per false alarm (the time grows with the stated figure: the simulated streams are 5 x as long).
--checkpoints also times the references of the checkpoints (detector.checkpoints). --by-hour times each reference
again with times spread over 38.4 hours, so that it covers a day and is calibrated by hour of day
(calibration.StepDay).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import streams
from _common import machine

from specmon.drift import calibration, detector


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3, help="references per stated figure, each timed once")
    ap.add_argument("--checkpoints", action="store_true", help="also time the checkpoints' longer references")
    ap.add_argument("--by-hour", action="store_true", help="also time each reference spread over 38.4 hours")
    args = ap.parse_args()
    # (version 1, before the constant existed, so the script also times an older checkout on PYTHONPATH)
    out: dict = {"machine": machine(), "calibration_version": getattr(calibration, "CALIBRATION_VERSION", 1),
                 "seconds": {}}
    sizes = [detector.REFERENCE_STEPS] + (detector.checkpoints(detector.REFERENCE_STEPS) if args.checkpoints else [])
    for arl0 in (2000, 20_000):
        for size in sizes:
            for by_hour in (False, True) if args.by_hour else (False,):
                times = []
                for seed in range(args.repeats):
                    a, c, r = streams.steps(np.random.default_rng(seed), size, 0.8, 4, 0.2, "lognormal")
                    ts = np.linspace(0, 38.4 * 3.6e9, size).astype(np.int64) if by_hour else None
                    calibration._CALIBRATIONS.clear()  # time the calibration, not the cache
                    t0 = time.perf_counter()
                    calibration.design_for(a, c, r, 4, 0.45, arl0, size, ts_us=ts)
                    times.append(round(time.perf_counter() - t0, 2))
                name = str(arl0) if size == detector.REFERENCE_STEPS else f"{arl0} on {size:,} steps"
                out["seconds"][name + (" by hour of day" if by_hour else "")] = times
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
