"""Steps per false alarm of the self-starting drift detector against the stated figure, on the traffic of
traffic_models.py (position-dependent acceptance; acceptance switching state within requests) and on cells of the
drift study (streams.py), each window a fresh stream as in drift_study.py's false-alarm part: the detector
calibrated on its first REFERENCE_STEPS steps, then 10 x the stated figure of in-control steps watched, the reference
growing at the checkpoints. Prints JSON; the 95% interval resamples the windows.

    nice python drift_traffic.py --cells position_dependent state_switching --windows 20 --arl0 2000 --out A.json
    python drift_traffic.py --merge A.json B.json --out drift_traffic.json
    python drift_traffic.py --table drift_traffic.json
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import streams
import traffic_models
from _common import episode_starts, machine, merge_cells, run_cells

from specmon.drift import calibration, detector

BREAK_EVEN = 0.45
STUDY_CELLS = {"beta_0.2_lognormal": (0.2, "lognormal", "beta"), "beta_0_geometric": (0.0, "geometric", "beta"),
               "two_point_0.05_lognormal": (0.05, "lognormal", "two-point")}
CELLS = (*traffic_models.KINDS, *STUDY_CELLS)  # each cell's seed is --seed plus its place here, however run


def stream(rng: np.random.Generator, cell: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if cell in traffic_models.KINDS:
        return traffic_models.steps(rng, cell, n)
    rho, lengths, shape = STUDY_CELLS[cell]
    return streams.steps(rng, n, 0.80, 4, rho, lengths, shape)


def cell_figures(cell: str, windows: int, arl0: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    watched = 10 * arl0
    alarms, episodes, hs, p0s = [], [], [], []
    for _ in range(windows):
        a, c, req = stream(rng, cell, detector.REFERENCE_STEPS + watched)
        d = calibration.design_for(a, c, req, 4, BREAK_EVEN, arl0)
        grow = calibration.redesigner(lambda _, held=(a, c, req): held, 4, BREAK_EVEN, arl0)
        ref = detector.REFERENCE_STEPS
        _, raw, _, taken = detector.run_cusum(a[ref:], c[ref:], ref, detector.CusumState.start(d), grow)
        alarms.append(len(raw))
        episodes.append(len(episode_starts(raw, detector.EPISODE_GAP)))
        hs.append(([d] + [x for _, x in taken])[-1].h)
        p0s.append(d.p0)
    n = np.array(alarms)
    total = windows * watched
    if n.sum():
        boot = n[rng.integers(0, windows, (2000, windows))].sum(axis=1)
        # a resample without an alarm has no finite ratio: it counts as above every other
        lo, hi = np.quantile(np.where(boot > 0, total / np.maximum(boot, 1) / arl0, np.inf), [0.025, 0.975])
        ratio, ci = total / n.sum() / arl0, [float(lo), float(hi)]
    else:  # no alarm: only a lower bound, from the 95% upper bound of 3 alarms on a Poisson count of 0
        ratio, ci = None, [total / 3 / arl0, math.inf]
    return {"cell": cell, "stated": arl0, "windows": windows, "watched_steps_per_window": watched,
            "alarms": int(n.sum()), "ratio_to_stated": ratio, "ci95": ci,
            "steps_per_episode": total / sum(episodes) if sum(episodes) else None,
            "median_last_h": float(np.median(hs)), "median_p0": float(np.median(p0s))}


def table(r: dict) -> str:
    """The docs' table: a row per cell and stated figure."""
    rows = ["| traffic | stated | windows | alarms | steps per false alarm over the stated figure [95% CI] | steps per "
            "episode over the stated figure | median h (last design) |", "|---|---|---|---|---|---|---|"]
    for c in sorted(r["cells"], key=lambda c: (c["cell"], c["stated"])):
        ratio = (f"{c['ratio_to_stated']:.2f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]" if c["alarms"]
                 else f"no alarm: above {c['ci95'][0]:.0f}")
        episode = f"{c['steps_per_episode'] / c['stated']:.2f}" if c["steps_per_episode"] else "-"
        rows.append(f"| {c['cell'].replace('_', '-')} | {c['stated']:,} | {c['windows']} | {c['alarms']} | {ratio} | "
                    f"{episode} | {c['median_last_h']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", nargs="+", choices=CELLS, default=list(CELLS))
    ap.add_argument("--windows", type=int, default=30)
    ap.add_argument("--arl0", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--merge", nargs="+", help="join these JSON files (to --out) instead of running")
    ap.add_argument("--table", help="print the docs' table from this JSON instead of running")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return
    if args.merge:
        merge_cells(args.merge, args.out)
        return
    out = run_cells({"machine": machine(), "calibration_version": calibration.CALIBRATION_VERSION},
                    (lambda cell=cell: cell_figures(cell, args.windows, args.arl0, args.seed + CELLS.index(cell))
                     for cell in args.cells), args.out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
