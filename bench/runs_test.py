"""The runs test of a drift reference (specmon.drift.calibration.runs_z): how often it withholds the stated rate
(z below -detector.RUNS_Z) on the drift study's own traffic, where a request's steps are independent given its
acceptance (streams.py: correlation 0-0.3, geometric or lognormal lengths, beta-shaped or two kinds of request), on
the production-like traffic of traffic_models.py and the daily mix of traffic_daily.py, at the first reference's
2,000 steps and at each checkpoint's 4,000 to 32,000. Prints JSON (mean and sd of z, the share below -RUNS_Z with its
binomial standard error) and writes it beside this script:

    nice python runs_test.py [--references 200] [--seed 0] [--out runs_test.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import streams
import traffic_daily
import traffic_models
from _common import machine

from specmon.drift import calibration, detector

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = (2000, 4000, 8000, 16000, 32000)  # the first reference and every checkpoint's
STUDY = [(rho, lengths, shape) for rho in (0.0, 0.05, 0.2, 0.3) for lengths in ("geometric", "lognormal")
         for shape in (("beta", "two-point") if rho in (0.05, 0.2) else ("beta",))]


def reference(rng: np.random.Generator, cell: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, request) of a reference of `size` steps in stream order."""
    if cell in traffic_models.KINDS:
        a, _, req = traffic_models.steps(rng, cell, size)
        return a, req
    if cell == "daily_mix":
        log = traffic_daily.daily_steps(rng, size // traffic_daily.MEAN_STEPS + 50, 72.0)
        order = np.lexsort((np.arange(len(log.ts_us)), log.ts_us))[:size]  # interleaved by time, as logged
        return log.accepted[order], log.request[order]
    rho, lengths, shape = cell.split("|")
    a, _, req = streams.steps(rng, size, 0.8, 4, float(rho), lengths, shape)
    return a, req


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--references", type=int, default=200, help="references per cell and size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(HERE, "runs_test.json"))
    args = ap.parse_args()
    cells = [f"{rho}|{lengths}|{shape}" for rho, lengths, shape in STUDY] + [*traffic_models.KINDS, "daily_mix"]
    out: dict = {"machine": machine(), "runs_z_limit": detector.RUNS_Z, "references": args.references, "cells": {}}
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for cell in cells:
        for size in SIZES:
            z = np.array([calibration.runs_z(*reference(rng, cell, size)) for _ in range(args.references)])
            below = float(np.mean(z < -detector.RUNS_Z))
            out["cells"][f"{cell} @ {size}"] = {
                "mean": round(float(z.mean()), 3), "sd": round(float(z.std(ddof=1)), 3),
                "below_limit": below, "below_limit_se": round(math.sqrt(below * (1 - below) / len(z)), 4),
                "min": round(float(z.min()), 2), "max": round(float(z.max()), 2)}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1))
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
