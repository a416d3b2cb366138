"""Wall time of one drift calibration (specmon.drift.design_for on a 2,000-step reference), the cost the watcher
and the Drift page pay once per run (the result is cached):

    nice python bench/calibration_cost.py [--repeats 3]

Streams from bench/streams.py: correlation 0.2 between requests, lognormal lengths, k = 4, at a stated 2,000 and
20,000 steps per false alarm (the time grows with the stated figure: the simulated streams are 5 x as long).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import streams
from _common import machine

from specmon import drift


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3, help="references per stated figure, each timed once")
    args = ap.parse_args()
    # (version 1, before the constant existed, so the script also times an older checkout on PYTHONPATH)
    out: dict = {"machine": machine(), "calibration_version": getattr(drift, "CALIBRATION_VERSION", 1), "seconds": {}}
    for arl0 in (2000, 20_000):
        times = []
        for seed in range(args.repeats):
            a, c, r = streams.steps(np.random.default_rng(seed), drift.REFERENCE_STEPS, 0.8, 4, 0.2, "lognormal")
            drift._CALIBRATIONS.clear()  # time the calibration, not the cache
            t0 = time.perf_counter()
            drift.design_for(a, c, r, 4, 0.45, arl0)
            times.append(round(time.perf_counter() - t0, 2))
        out["seconds"][str(arl0)] = times
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
