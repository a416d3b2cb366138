"""How high the drift threshold on engine windows must be, and how high the floor of a reference that states no rate
puts it (calibration.least_h), on days of healthy windows over overlapping requests (bench/traffic_daily.py: 10-second
windows at a constant mix, requests of a 40 s median spanning several windows) whose acceptance is known exactly.

For each p1 the CUSUM watches for, the restarted CUSUM from the true acceptance runs over every day at each h of a
grid and the windows per false alarm are counted (one false alarm per --arl0 windows is what the floor aims at);
beside them, the floor's h on each day's first --references windows (median over days), and the h of the floor's
earlier form, ln(arl0) x the windows' Pearson dispersion about the true acceptance. Then --runs healthy 3-hour runs
of windows whose acceptance holds for runs of a few windows (tests/persistent_windows.py), watched from their first
window as in use with the floor alone as threshold, the CUSUM watching for a drop of 0.10, at each --confidence of
the bound on the reference's acceptance: the runs with a false alarm (one false alarm per 20,000 windows would give
one in 5.4% of runs). Prints both; --out keeps the JSON.

    cd bench && nice python window_floor.py --days 200 --runs 40 --out window_floor.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import production_study as ps
import traffic_daily as td
from _common import machine
from drift_windows import ARRIVALS_PER_S, K, points

from specmon.drift import calibration, detector

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from persistent_windows import (  # noqa: E402 (the tests' model)
    pearson_dispersion,
    persistent_windows,
    watched_with_the_floor_alone,
)

GRID = [10, 20, 40, 60, 80, 120, 160, 240, 320, 480]


def day(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, n, _, ts = points(td.engine_windows(np.random.default_rng(seed), ARRIVALS_PER_S, 24, K, share=ps._flat))
    return a, n, ts


def false_alarms(increments: list[np.ndarray], h: float) -> int:
    """Alarms of the restarted CUSUM at h over each day's increments."""
    return sum(len(detector.cusum_increments(x, h)[1]) for x in increments)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=40)
    ap.add_argument("--arl0", type=int, default=20_000)
    ap.add_argument("--p1", type=float, nargs="+", default=[-0.1, 0.625, 0.55, 0.287],
                    help="acceptance watched for (negative: that far below the true acceptance)")
    ap.add_argument("--references", type=int, nargs="+", default=[30, 960, 8640])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--confidence", type=float, nargs="+", default=[0.8, calibration.FLOOR_CONFIDENCE],
                    help="two-sided confidence of the interval whose lower end the floor takes the drift at")
    ap.add_argument("--out")
    args = ap.parse_args()
    t0 = time.perf_counter()
    alpha = td.truth(K, float(ps._flat(np.zeros(1))[0]))["alpha"]
    days = [day(100 + s) for s in range(args.days)]
    windows = sum(len(a) for a, _, _ in days)
    rows = []
    for target in args.p1:
        p1 = alpha + target if target < 0 else target
        wa, wr = detector.llr_weights(alpha, p1)
        increments = [a * wa + (n - a) * wr for a, n, _ in days]
        per_alarm = {}
        for h in GRID:
            alarms = false_alarms(increments, h)
            per_alarm[h] = windows / alarms if alarms else None
        floors = {m: float(np.median([calibration.least_h(a[:m], n[:m], t[:m], a[:m].sum() / n[:m].sum(), p1,
                                                          args.arl0).h for a, n, t in days]))
                  for m in args.references}
        earlier = float(np.median([pearson_dispersion(a, n, alpha) for a, n, _ in days])) * math.log(args.arl0)
        rows.append({"p1": p1, "windows_per_false_alarm_at_h": per_alarm, "floor_h_median": floors,
                     "pearson_floor_h": earlier,
                     "windows_per_false_alarm_at_pearson_floor": windows / max(1, false_alarms(increments, earlier))})
    persistent = []
    for confidence in args.confidence:
        calibration.FLOOR_CONFIDENCE, kept = confidence, calibration.FLOOR_CONFIDENCE
        alarmed = sum(bool(watched_with_the_floor_alone(*persistent_windows(np.random.default_rng(seed), 1080))[0])
                      for seed in range(args.runs))
        calibration.FLOOR_CONFIDENCE = kept
        persistent.append({"confidence": confidence, "runs": args.runs, "runs_with_a_false_alarm": alarmed})
    result = {"machine": machine(), "alpha": alpha, "days": args.days, "windows": windows, "arl0": args.arl0,
              "rows": rows, "persistent": persistent, "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"acceptance {alpha:.3f}, {windows:,} windows; windows per false alarm at h (none: no alarm):")
    for r in rows:
        cells = ", ".join(f"{h}: {'none' if v is None else f'{v:,.0f}'}"
                          for h, v in r["windows_per_false_alarm_at_h"].items())
        floors = ", ".join(f"{m:,} windows {v:.0f}" for m, v in r["floor_h_median"].items())
        print(f"p1 {r['p1']:.3f}: {cells}\n  floor h (median) on a reference of {floors}; Pearson's floor h "
              f"{r['pearson_floor_h']:.0f}, one false alarm per {r['windows_per_false_alarm_at_pearson_floor']:,.0f}")
    for r in persistent:
        print(f"acceptance held for runs of windows, bound at confidence {r['confidence']}: "
              f"{r['runs_with_a_false_alarm']} of {r['runs']} healthy 3-hour runs with a false alarm")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
