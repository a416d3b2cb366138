"""The calibration's likelihood of request acceptance, compared on one long reference per cell, so that only the
model's error is left (no reference luck): the threshold h calibrated on a reference of --reference steps with
specmon's likelihood (each request's per-position counts under the shifted profile, calibration.Mixing.of_steps)
and with one binomial over each request's pooled counts (what it replaced), then the plain CUSUM's steps per false
alarm at each h on --watched x the stated figure of fresh in-control steps of the same traffic.

    cd bench && nice python drift_likelihood.py --out drift_likelihood.json

Cells: position-dependent traffic (traffic_models.py, acceptance falling along the draft, requests differing most
deep in it) and two of the study's (streams.py: one acceptance per request at every position).
"""
from __future__ import annotations

import argparse

import numpy as np
import streams
import traffic_models
from _common import machine, run_cells

from specmon.drift import calibration, detector

BREAK_EVEN = 0.45
CELLS = {"position_dependent": None, "beta_0.2_lognormal": (0.2, "lognormal", "beta"),
         "two_point_0.05_lognormal": (0.05, "lognormal", "two-point")}


def steps(rng: np.random.Generator, cell: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if CELLS[cell] is None:
        return traffic_models.steps(rng, cell, n)
    rho, lengths, shape = CELLS[cell]
    return streams.steps(rng, n, 0.80, 4, rho, lengths, shape)


def pooled_binomial(accepted: np.ndarray, checked: np.ndarray, inverse: np.ndarray) -> calibration.Mixing:
    """The likelihood replaced: one binomial in each request's pooled accepted and checked positions."""
    pa, pn = np.bincount(inverse, weights=accepted), np.bincount(inverse, weights=checked)
    grid = calibration.Mixing.grid_for(pa, pn)
    return calibration.Mixing(grid, pa[:, None] * np.log(grid) + (pn - pa)[:, None] * np.log1p(-grid))


def cell_figures(cell: str, arl0: int, reference: int, watched: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    a, c, req = steps(rng, cell, reference)
    p0 = float(a.sum() / c.sum())
    p1 = calibration.target_p1(p0, BREAK_EVEN)
    specmons = calibration.Mixing.of_steps
    hs = {"profile": calibration.calibrate(a, c, req, p0, p1, arl0)}
    try:
        calibration.Mixing.of_steps = pooled_binomial  # type: ignore[method-assign]
        hs["pooled binomial"] = calibration.calibrate(a, c, req, p0, p1, arl0)
    finally:
        calibration.Mixing.of_steps = specmons  # type: ignore[method-assign]
    alarms = dict.fromkeys(hs, 0)
    total = 0
    while total < watched * arl0:
        fresh_a, fresh_c, _ = steps(rng, cell, 50 * arl0)
        for name, h in hs.items():
            alarms[name] += len(detector.cusum(fresh_a, fresh_c, detector.Design(p0, p1, h, arl0, 1.0, 4))[1])
        total += len(fresh_a)
    return {"cell": cell, "stated": arl0, "reference_steps": reference, "watched_steps": total, "p0": p0,
            "h": hs, "alarms": alarms,
            "ratio_to_stated": {name: total / n / arl0 if n else None for name, n in alarms.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=int, default=200_000)
    ap.add_argument("--watched", type=int, default=400, help="watched steps, in multiples of the stated figure")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    run_cells({"machine": machine(), "calibration_version": calibration.CALIBRATION_VERSION},
              (lambda cell=cell, arl0=arl0, i=i: cell_figures(cell, arl0, args.reference, args.watched, args.seed + i)
               for i, cell in enumerate(CELLS) for arl0 in (2000, 20000)), args.out)


if __name__ == "__main__":
    main()
